"""The Taylor path's one-shot release: the rows' Taylor sums at the warm start's point, once.

After the private warm start (public point ``t`` and covariance ``L L'``), each row's
log-likelihood is expanded at ``t`` in whitened coordinates ``x = t + L w``: gradient ``g_i``
and, for a second-order model, Hessian ``H_i`` (central finite differences of the row's own
log-likelihood: row-local, like the row). Three noisy histograms give the clips (gradient
norm, Hessian Frobenius norm, residual ratio at public probe moves); the clipped sums ``G``
and ``H`` are released once (:mod:`pymc_penalty.privacy.taylor`). Every release is charged to
the ledger before the data are read for it.

The chains then pay per step only for the clipped sum of the rows' residuals
(:class:`pymc_penalty.sampling.taylor.TaylorPenaltyMetropolis`); their start and proposal
metric come from one Newton step on the released model and the exact prior (public values).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from pymc_penalty.accounting.sensitivity import Neighbours
from pymc_penalty.errors import WarmStartRefused
from pymc_penalty.privacy import taylor as tl
from pymc_penalty.privacy.taylor import clips as tc
from pymc_penalty.sampling.taylor import TaylorModel
from pymc_penalty.warmstart import WarmStart, WarmStartTarget
from pymc_penalty.warmstart.taylor_terms import Expansion, RowTaylorTerms, TaylorStatistics

__all__ = [
    "FIRST_STAGE_SHARES",
    "MAX_MOVES_PER_DRAW",
    "MAX_SECOND_ORDER_DIM",
    "NEWTON_RADIUS",
    "ONESHOT_SHARES",
    "TAYLOR_DRAWS",
    "TAYLOR_SHARE",
    "TAYLOR_FIRST_STAGE",
    "TAYLOR_LATER_STAGES",
    "balance_rows",
    "FarTest",
    "far_from_expansion",
    "far_test",
    "TAYLOR_TUNE",
    "stage_edges",
    "taylor_moves_per_draw",
    "taylor_oneshot",
    "taylor_oneshot_on",
    "staged_oneshot",
]

#: Share of what the screen and the warm start leave (``mu^2``) spent on the one-shot
#: release; the chains' residual steps get the rest. The prototype's split
#: (``benchmarks/taylor_prototype.py``: 67% one-shot, 18% residual steps after a 15% warm
#: start), where the residual steps cost almost nothing and the one-shot noise decides the
#: error.
TAYLOR_SHARE = 0.8

#: Share of the one-shot ``mu^2`` spent on a first expansion at the warm start's point. The
#: rest goes to later stages (:data:`TAYLOR_LATER_STAGES`), each at the model so far's
#: released mode, in its covariance, where that mode or metric is far from its expansion's
#: (:func:`far_from_expansion`), otherwise at the same point and clips, combined with it (as
#: one release of their summed share). A warm start many posterior sds off, or with a
#: covariance several times too small (seen on a negative binomial and a hierarchical model:
#: ``scripts/taylor_start_diagnostics.py``), gives a quadratic model that is wrong where the
#: posterior is.
TAYLOR_FIRST_STAGE = 0.3

#: The stages after the first (:func:`staged_oneshot`), splitting the rest of the
#: one-shot ``mu^2`` equally: 2 (30%, 35%, 35%). With one (30%, 70%) a noisy first stage
#: could send the second far from the mode, or a combined release point far from its
#: expansion, and the chains then ran where the quadratic model is wrong (loud residual
#: steps, "not converged"): at epsilon 1, n = 1e4, paired by seeded noise, 16 of 24 runs
#: converged on the suite's logistic, linear and hierarchical models with one later stage
#: and 21 of 24 with two, and 9 against 12 of 12 on a gamma and a probit regression the
#: suite does not have (docs/benchmarks.md, fifth session).
TAYLOR_LATER_STAGES = 2

#: :func:`far_from_expansion`'s thresholds: the released mode more than this many whitened
#: units per coordinate (RMS) from the expansion point, or a released sd outside this
#: factor of the expansion's.
FAR_DISTANCE = 1.5
FAR_SCALE = 2.0
#: ... and the move more than this many times the move the stage's ``G`` noise alone gives
#: (at epsilon 1 a first stage's noise moved the mode past 1.5 units in most runs of the
#: README's logistic regression, and the second stage then expanded where the noise
#: pointed, with 70% of the budget: errors of 1-2.3 sds against 0.3-1.6 for one stage).
FAR_NOISE = 3.0
#: ... the same for the last stage's decision (:func:`staged_oneshot`). A lower bar there
#: (1) was measured and rejected: at epsilon 1, n = 1e4, 8 data sets per model paired by
#: seeded noise, 39 of 40 runs converged against 37, but the last stage then re-expanded
#: with 35% of the one-shot's budget alone and the RMS error rose (logistic 1.24 -> 1.74,
#: linear 1.07 -> 1.29, robust 0.69 -> 0.95; ``benchmarks/results/
#: model_suite_issue27_last_bar_summary.txt``).
FAR_NOISE_LAST = FAR_NOISE

#: Tuning steps per chain on the Taylor path with ``tune="auto"`` (full covariance adapted
#: from the released model's covariance).
TAYLOR_TUNE = 500

#: Draws per chain on the Taylor path with ``draws="auto"``.
TAYLOR_DRAWS = 4000


#: At most this many moves per draw (:func:`taylor_moves_per_draw`): a short run asked for
#: (``draws=60``) stays short.
MAX_MOVES_PER_DRAW = 10


def taylor_moves_per_draw(draws: int) -> int:
    """Moves per draw of a budgeted step on the Taylor path with ``pm.sample``'s ``draws``:
    ``ceil(TAYLOR_DRAWS / draws)`` up to :data:`MAX_MOVES_PER_DRAW`, so each chain of 400
    draws or more makes at least as many moves as ``pymc_penalty.sample``'s (1 for ``draws
    >= TAYLOR_DRAWS`` or 0). The residual steps cost little, and at ``pm.sample``'s 1000
    draws of 2 chains a random walk in 10 dimensions gave a bulk ESS of 94-354 (8 group
    intercepts: "not converged" in 4 of 4 data sets,
    ``benchmarks/results/model_suite_card_final.csv``)."""
    if draws <= 0:
        return 1
    return min(MAX_MOVES_PER_DRAW, max(1, math.ceil(TAYLOR_DRAWS / draws)))


#: Second-order models up to this many parameters (each row keeps ``d + d(d+1)/2``
#: coefficients and its Hessian costs ``2 d^2`` likelihood evaluations); first order above.
MAX_SECOND_ORDER_DIM = 12

#: Shares of the one-shot ``mu^2``: the three clip histograms, then ``G`` and ``H`` (the
#: prototype's split, ``benchmarks/taylor_prototype.py``; first order gives ``G`` the
#: Hessian's shares).
ONESHOT_SHARES = {"hist_g": 0.03, "hist_h": 0.03, "hist_r": 0.03, "G": 0.82, "H": 0.09}

#: A first stage's shares (no residual histogram). Far from the mode the released mode's
#: error is mostly the Hessian noise times the distance (``|dH| |t - mode|``), so the first
#: stage spends more on ``H`` than a stage at the mode does.
FIRST_STAGE_SHARES = {"hist_g": 0.03, "hist_h": 0.03, "G": 0.47, "H": 0.47}

#: The released mode's search stays within ``NEWTON_RADIUS * sqrt(d)`` whitened units of the
#: expansion point (``_released_mode``); a start on that bound is not the released model's
#: mode (:mod:`pymc_penalty.planning.taylor_forecast` reads it). A guard only: the search's
#: model is strictly concave. It was 10, and a warm start whose covariance was several times
#: too small in sd put the mode beyond it (half the hierarchical and negative binomial runs
#: of ``scripts/taylor_start_diagnostics.py`` stopped on it, 3-8 sds off; none now).
NEWTON_RADIUS = 100.0

_CLIP_Q = 0.9  # clips: extrapolated from the noisy 90% quantile of the norms and one above
#: A clip is never below this factor times that 90% quantile: 2 for gradients (a guard
#: against a tail the counts cannot see), 1 for Hessians. It was 3 for Hessians, and on the
#: hierarchical model (rows that share one Hessian per group: no tail) that tripled the
#: Hessian's noise; at epsilon 1 its released curvature then came out flat or upturned in
#: some direction, and the chains, which target the tilted posterior, sat 2 to 89 whitened
#: units from the released mode (``scripts/taylor_chain_distance.py``; bulk ESS 4 to 29,
#: "not converged" in 8 of 8 runs of ``benchmarks/model_suite.py``).
_FACTOR_G, _FACTOR_H = 2.0, 1.0
_RESIDUAL_TAIL = 1e-3  # the residual clip aims at this fraction of the rows at the probes
_RESIDUAL_FACTOR = 2.0  # times the noisy tail edge (the chain's moves differ from the probes)
_PROBES = 8
#: A quantile is read as resolvable where its tail holds this many noise sds of its count.
_RESOLVED_SDS = 3.0
#: The one-shot clips aim at this many times the rows the noise-bias balance gives: a row
#: the one-shot clips keeps its leftover in its residual, which the chains' residual bound
#: carries wherever it covers it, so only part of the leftover is lost. On the suite at
#: n = 1e4 (``benchmarks/model_suite.py``, 8 data sets, 2026-11-28) aiming at 4 times the
#: rows gave RMS errors 0.48-0.57 at epsilon 2 and 0.84-0.99 at epsilon 1 on the linear,
#: logistic and Poisson regressions, against 0.48-0.69 and 0.96-1.42 aiming at the balance
#: itself (``benchmarks/results/model_suite_issue27_recapture4_*.csv`` and ``_clips_*``).
_RECAPTURE = 4.0


def balance_rows(dim: int, mu_sum: float, relation: str) -> float:
    """Rows above a one-shot clip where raising it adds as much to the noise's expected norm
    as it removes from the clipped sum: ``k sqrt(dim) / mu_sum`` (``k``
    :attr:`~pymc_penalty.accounting.sensitivity.Neighbours.factor`, 2 substitute-one, 1
    add/remove-one; ``dim`` the released sum's dimension, ``mu_sum`` its ``mu``). Public."""
    return Neighbours.parse(relation).factor * math.sqrt(dim) / float(mu_sum)


def _oneshot_clip(
    edges: np.ndarray,
    counts: np.ndarray,
    sd: float,
    mu_sum: float,
    dim: int,
    relation: str,
    rows: float,
    factor: float,
) -> float:
    """A one-shot clip from a noisy histogram of the rows' norms (post-processing).

    A row the one-shot clips keeps a leftover in its residual, which the residual's small
    bound clips at every step: its clipped part is lost to the chain's target, a bias that
    the noise-aware draws do not cover (the README's logistic regression: 97 rows above
    twice the 90% quantile, leftovers summing to 3.5 noise sds, means 1-1.5 sd off). The
    clip therefore aims where about ``R`` times :func:`balance_rows` rows lie above it
    (:data:`_RECAPTURE` ``R`` = 4 counts the part of a leftover the chains' residual
    carries).

    The counts above an edge are read from the top of the data down
    (:class:`~pymc_penalty.privacy.taylor.clips.TailCounts`), with the noise of the bins they
    sum. That aimed tail is below the noise at ``n = 1e4``, so its edge is extrapolated
    along an exponential tail, ``c`` linear in the log of the tail fraction, from two
    resolvable quantiles: the 90% quantile and the one above which ``max(1% of the rows,
    3 noise sds of the count above the 90% quantile)`` lie (:data:`_RESOLVED_SDS`); where
    that is not a third of the 90% quantile's tail (small budgets), the 70% and the 90%
    quantiles; where the 90% quantile's own tail is below its noise sd, the 10% and the 70%.
    On the suite's gradients at epsilon 0.5 to 2 (``benchmarks/clip_reading.py``; medians)
    the clip came out 0.54 to 0.88 times the balance's edge on the linear, logistic and
    Poisson regressions (it aims at :data:`_RECAPTURE` times the balance's rows) and 1.0 to
    1.19 on bounded tails (robust regression, group intercepts); a power-law tail
    (``log c`` linear) overshot the README's logistic scores by 1.6 times and a linear
    regression's more, tripling the noise. Heavier tails than exponential (the Poisson
    regression's Hessians, 0.18 to 0.35 times the balance's edge) leave rows clipped: the
    report's ``dp_clipped_fraction`` shows them. Never below ``factor`` times the 90% quantile (the
    70% where that is not resolvable; :data:`_FACTOR_G`, :data:`_FACTOR_H`), nor below the
    aimed tail's edge where the counts resolve it. ``python benchmarks/clip_reading.py``
    compares this reading with the one before 2026-11-28 (bins below their own noise read
    as empty) on the suite's histograms.
    """
    aim = _RECAPTURE * balance_rows(dim, mu_sum, relation)  # rows above the clip

    tails = tc.TailCounts.of(counts, sd)

    def read(share: float) -> tuple[float, float]:  # (edge, noise sd of the count above it)
        edge = tails.edge(edges, share * rows)
        return edge, tails.noise_sd(int(np.searchsorted(edges, edge)))

    tail90 = (1.0 - _CLIP_Q) * rows
    q90, noise = read(1.0 - _CLIP_Q)
    hi_rows = max(0.01 * rows, _RESOLVED_SDS * noise)
    if hi_rows < tail90 / 3.0:  # a resolvable quantile above the 90% one
        (lo, lo_rows), (hi, _) = (q90, tail90), read(hi_rows / rows)
    elif tail90 >= noise:  # small budgets: the 70% and the 90% quantiles
        (lo, _), lo_rows, hi, hi_rows = read(3.0 * (1.0 - _CLIP_Q)), 3.0 * tail90, q90, tail90
    else:  # not even the 90% quantile: the 10% and the 70%
        (lo, _), lo_rows = read(0.9), 0.9 * rows
        (hi, noise), hi_rows = read(0.3), 0.3 * rows
        q90 = hi
    clip = factor * q90
    if hi > lo and aim < hi_rows:
        per_decade = (hi - lo) / math.log(lo_rows / hi_rows)
        clip = max(clip, hi + per_decade * math.log(hi_rows / aim))
    resolved = tails.edge(edges, max(aim, _RESOLVED_SDS * noise))
    return min(max(clip, hi, resolved), float(edges[-1]))


def stage_edges(k: int, rows: float) -> tuple[np.ndarray, np.ndarray]:
    """The public bins of the one-shot's gradient and Hessian norm histograms: geometric,
    four per octave, around the typical whitened norm ``sqrt(k / rows)`` (and its square)."""
    scale = math.sqrt(k / max(rows, 1.0))
    return tc.geometric_edges(scale, -24, 56, 4), tc.geometric_edges(scale**2, -24, 56, 4)


def _stage_clips(data, e, mu_hist_g, mu_hist_h, mus, noise, relation, rows):
    """The one-shot clips ``(c_g, c_H)`` from noisy histograms of the rows' gradient and
    Hessian norms (``c_H`` None for a first-order model), each charged before the call."""
    k = e.L.shape[0]
    e_g, e_h = stage_edges(k, rows)
    cnt, sd = tc.noisy_counts(data.norm_counts(e, "g", e_g), mu_hist_g, noise, relation)
    c_g = _oneshot_clip(e_g, cnt, sd, mus["G"], k, relation, rows, _FACTOR_G)
    if e.order == 1:
        return c_g, None
    cnt, sd = tc.noisy_counts(data.norm_counts(e, "H", e_h), mu_hist_h, noise, relation)
    c_H = _oneshot_clip(e_h, cnt, sd, mus["H"], k * (k + 1) // 2, relation, rows, _FACTOR_H)
    return c_g, c_H


def _released_mode(release: tl.TaylorRelease, prior: Any, t, L_full, embed, order):
    """The mode of the exact prior times the released model, by damped Newton from ``t``, and
    the inverse of the negative Hessian there: ``(point, covariance)`` (public values only).

    In ``x = t + L_full v`` the released model reads ``u = embed v``. Its quadratic form is
    ``H`` (second order) or ``-I`` (first order: the warm start's metric). The precision's
    eigenvalues are floored at three noise sds of the released Hessian's spectrum (a
    direction the noise can cancel is not trusted to be that flat); so are the released
    curvature's own in the searched objective, which is therefore strictly concave. The
    iterate stays within ``NEWTON_RADIUS sqrt(d)`` whitened units of ``t`` (a guard).
    """
    d, k = t.size, embed.shape[0]
    quad = release.H if order == 2 and release.H is not None else -np.eye(k)
    # The search's model is strictly concave: a released curvature within three noise sds of
    # flat (or turned upward by the noise) is read as that noise level, the least curvature
    # the release can tell from none, so the search has a mode to find near t.
    lam_q, V_q = np.linalg.eigh(0.5 * (quad + quad.T))
    least = tl.curvature_floor(release.sd_H, k) if order == 2 else 0.0
    quad = (V_q * np.minimum(lam_q, -least)) @ V_q.T
    cap = NEWTON_RADIUS * math.sqrt(d)
    quad_v = embed.T @ quad @ embed

    def objective(v: np.ndarray) -> float:
        u = embed @ v
        return prior.value(t + L_full @ v) + float(release.G @ u) + 0.5 * float(u @ quad @ u)

    def precision(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        grad, hess = prior(t + L_full @ v)
        P = -L_full.T @ hess @ L_full - quad_v
        lam, V = np.linalg.eigh(0.5 * (P + P.T))
        floor = max(float(lam.max()) * 1e-3, tl.curvature_floor(release.sd_H, k), 1e-12)
        slope = L_full.T @ grad + embed.T @ (release.G + quad @ (embed @ v))
        return (V * np.maximum(lam, floor)) @ V.T, slope

    v = np.zeros(d)
    f = objective(v)
    for _ in range(100):
        P, slope = precision(v)
        step = np.linalg.solve(P, slope)
        for _ in range(40):  # backtracking: the objective must not fall
            cand = v + step
            norm = float(np.linalg.norm(cand))
            if norm > cap:
                cand *= cap / norm
            f_cand = objective(cand)
            if np.isfinite(f_cand) and f_cand >= f - 1e-10 * abs(f):
                break
            step = step / 2.0
        else:
            break
        moved = float(np.linalg.norm(cand - v))
        v, f = cand, f_cand
        if moved < 1e-8:
            break
    P, _ = precision(v)
    cov = L_full @ np.linalg.inv(P) @ L_full.T
    return t + L_full @ v, 0.5 * (cov + cov.T)


@dataclasses.dataclass(frozen=True)
class FarTest:
    """:func:`far_from_expansion`'s figures (public values).

    Attributes
    ----------
    move : float
        The released mode's distance from the expansion point, in whitened units.
    reach : float
        The move beyond which it is far: the larger of :data:`FAR_DISTANCE` ``sqrt(d)`` and
        the bar times the move the stage's ``G`` noise alone gives.
    chi2 : float
        ``|C^-1 v|^2 / sd_G^2`` (``v`` the move, ``C`` the released covariance, both
        whitened): chi-square with ``d`` degrees of freedom where the move is the ``G``
        noise alone (a diagnosis; the decision does not read it).
    scale_min, scale_max : float
        The released covariance's smallest and largest eigenvalue in the expansion's metric.
    """

    move: float
    reach: float
    chi2: float
    scale_min: float
    scale_max: float

    @property
    def far(self) -> bool:
        """The decision: a move beyond ``reach`` or a released sd along some direction
        outside :data:`FAR_SCALE` times the expansion's."""
        return (
            self.move > self.reach
            or self.scale_min < FAR_SCALE**-2
            or self.scale_max > FAR_SCALE**2
        )


def far_test(model: TaylorModel, covariance: np.ndarray, noise: float | None = None) -> FarTest:
    """The figures :func:`far_from_expansion` decides on (its arguments)."""
    L_full = np.linalg.cholesky(np.asarray(covariance, dtype=np.float64))
    v = np.linalg.solve(L_full, np.asarray(model.point, np.float64) - np.asarray(model.t))
    inner = np.linalg.solve(L_full, np.linalg.solve(L_full, model.covariance).T)
    inner = 0.5 * (inner + inner.T)
    # The move the G noise alone gives the mode, about sd_G^2 tr(C^2) in squared norm: a
    # move within ``noise`` times it is not evidence that the expansion was far.
    sd_g = float(model.release.sd_G)
    noise_move = sd_g * math.sqrt(float(np.sum(inner * inner)))
    noise = FAR_NOISE if noise is None else float(noise)
    reach = max(FAR_DISTANCE * math.sqrt(v.size), noise * noise_move)
    lam, vecs = np.linalg.eigh(inner)
    # chi2 = |C^-1 v|^2 / sd_G^2 in C's eigenbasis (infinite where C or sd_G is degenerate: a
    # diagnosis only, and the scale rule decides there)
    with np.errstate(divide="ignore", invalid="ignore"):
        chi2 = float(np.sum((vecs.T @ v) ** 2 / lam**2)) / sd_g**2
    if not (lam.min() > 0.0 and sd_g > 0.0 and math.isfinite(chi2)):
        chi2 = math.inf
    return FarTest(float(np.linalg.norm(v)), reach, chi2, float(lam.min()), float(lam.max()))


def far_from_expansion(
    model: TaylorModel, covariance: np.ndarray, noise: float | None = None
) -> bool:
    """Whether a stage's released mode and covariance are far from its expansion point and
    metric (``covariance``, the one it whitened with): the mode more than
    :data:`FAR_DISTANCE` whitened units per coordinate (RMS) away and more than ``noise``
    (default :data:`FAR_NOISE`) times the move its ``G`` noise alone gives, or a released sd
    along some direction outside :data:`FAR_SCALE` times the expansion's
    (:func:`far_test`'s figures). Public values only."""
    return far_test(model, covariance, noise).far


def staged_oneshot(
    oneshot: Callable[..., TaylorModel],
    warm: WarmStart,
    oneshot_mu2: float,
    first_stage: float = TAYLOR_FIRST_STAGE,
    later_stages: int | None = None,
) -> tuple[TaylorModel, WarmStart]:
    """The one-shot in stages (docs/algorithm.md, "Stages"): the released model, its
    ``mu`` and release count covering every stage, and the expansion its last stage used.

    ``oneshot(warm, mu=..., **stage)`` is one stage (:func:`taylor_oneshot` on the rows, with
    the caller's ledger and noise; ``stage``: its ``previous``, ``residual``, ``clip_mu`` and
    ``shares``). The first spends ``first_stage`` (:data:`TAYLOR_FIRST_STAGE`) of
    ``oneshot_mu2`` at the warm start; ``later_stages`` (:data:`TAYLOR_LATER_STAGES`) split
    the rest equally. Each later stage expands at the model so far's released mode and
    covariance where they are far from its expansion's (:func:`far_from_expansion`), else at
    the same point and clips, combined with it (a re-expanded stage's predecessors have
    chosen its point; their sums are not used again). Only the last releases the residual
    clip's histogram.
    """
    later = TAYLOR_LATER_STAGES if later_stages is None else int(later_stages)
    if later < 1:
        raise ValueError("staged_oneshot needs at least one later stage")
    rest = oneshot_mu2 * (1.0 - first_stage) / later
    model = oneshot(
        warm,
        mu=math.sqrt(oneshot_mu2 * first_stage),
        residual=False,
        clip_mu=math.sqrt(oneshot_mu2),  # its clips may serve the combined release
        shares=FIRST_STAGE_SHARES,
    )
    expand_at, mu2, releases = warm, model.mu**2, model.releases
    for left in range(later - 1, -1, -1):  # stages after this one
        stage: dict[str, Any] = {"mu": math.sqrt(rest)}
        if left:  # not the last: no residual histogram, clips aimed at what may join them
            stage.update(residual=False, clip_mu=math.sqrt(rest * (left + 1)))
        noise = FAR_NOISE if left else FAR_NOISE_LAST
        if far_from_expansion(model, expand_at.covariance, noise):  # expand where it points
            expand_at = dataclasses.replace(warm, point=model.point, covariance=model.covariance)
            if left:
                stage["shares"] = FIRST_STAGE_SHARES
            model = oneshot(expand_at, **stage)
        else:  # the same sums again, combined with the model so far
            stage.pop("clip_mu", None)
            model = oneshot(expand_at, previous=model, **stage)
        mu2, releases = mu2 + model.mu**2, releases + model.releases
    return dataclasses.replace(model, mu=math.sqrt(mu2), releases=releases), expand_at


def taylor_oneshot(
    target: WarmStartTarget,
    warm: WarmStart,
    *,
    mu: float,
    ledger: Any,
    order: int | str = "auto",
    noise_rng: np.random.Generator | None = None,
    previous: TaylorModel | None = None,
    residual: bool = True,
    clip_mu: float | None = None,
    shares: dict[str, float] | None = None,
) -> TaylorModel:
    """Release the rows' Taylor sums at the warm start's point once, spending ``mu``.

    Parameters
    ----------
    target : WarmStartTarget
        The model gated and compiled (:func:`pymc_penalty.warmstart.prepare_warm_start`).
    warm : WarmStart
        The private warm start: its point is the expansion point, its covariance's Cholesky
        factor the whitening (public).
    mu : float
        Gaussian-DP ``mu`` of the whole one-shot release (:data:`ONESHOT_SHARES`).
    ledger : object
        ``try_spend(mu2) -> bool``; each release is charged before its data are read.
    order : {1, 2, "auto"}
        ``"auto"``: 2 up to :data:`MAX_SECOND_ORDER_DIM` parameters, else 1.
    noise_rng : numpy.random.Generator, optional
        Privacy noise (OS entropy by default; seed only for reproducible, non-private runs).
    previous : TaylorModel, optional
        An earlier stage expanded at the same point in the same metric: its order and clips
        are reused (no clip histograms), and the new sums are combined with its release
        (:func:`pymc_penalty.privacy.taylor.combine_releases`).
    residual : bool, default True
        Release the residual clip's histogram (the chains' clip); a first stage skips it and
        gives its share to ``G``.
    clip_mu : float, optional
        The ``mu`` the clips are chosen for (default ``mu``, in ``shares``): a first stage
        whose sums a second may join aims them as a one-stage release of ``clip_mu`` would
        (:data:`ONESHOT_SHARES`): aimed at the first stage's own ``G`` share (47% of 30%)
        they would clip more rows, whose leftovers bias the released mode.
    shares : dict, optional
        Shares of ``mu^2`` by release (default :data:`ONESHOT_SHARES`; a first stage's
        :data:`FIRST_STAGE_SHARES`); those not released are spread over the others.

    Returns
    -------
    TaylorModel

    Raises
    ------
    WarmStartRefused
        If the ledger refuses a release.
    """
    return taylor_oneshot_on(
        RowTaylorTerms(target.likelihood, target.n),
        warm,
        reads=target.likelihood.reads,
        prior=target.prior,
        relation=target.relation,
        mu=mu,
        ledger=ledger,
        order=order,
        noise_rng=noise_rng,
        previous=previous,
        residual=residual,
        clip_mu=clip_mu,
        shares=shares,
    )


def taylor_oneshot_on(
    data: TaylorStatistics,
    warm: WarmStart,
    *,
    reads: np.ndarray,
    prior: Any,
    relation: Neighbours,
    mu: float,
    ledger: Any,
    order: int | str = "auto",
    noise_rng: np.random.Generator | None = None,
    previous: TaylorModel | None = None,
    residual: bool = True,
    clip_mu: float | None = None,
    shares: dict[str, float] | None = None,
) -> TaylorModel:
    """:func:`taylor_oneshot` reading the rows only through ``data``'s sums.

    Parameters
    ----------
    data : TaylorStatistics
        The rows' sums (:class:`~pymc_penalty.warmstart.taylor_terms.RowTaylorTerms` here,
        :class:`~pymc_penalty.warmstart.taylor_terms.SummedTaylorTerms` over shards); each
        asked after the release it feeds is charged.
    warm : WarmStart
        As :func:`taylor_oneshot`; its ``n_rows`` (``n``, or the released count under
        add/remove-one) is the only row count used.
    reads : ndarray of bool
        Which raveled coordinates the rows read
        (:func:`~pymc_penalty.model.likelihood.likelihood_coordinates`: model structure).
    prior : LogPrior
        The exact log prior (the released mode search).
    relation : Neighbours
    mu, ledger, order, noise_rng, previous, residual, clip_mu, shares
        As :func:`taylor_oneshot`.

    Returns
    -------
    TaylorModel
        Its ``control`` is ``data.control(...)``: the rows' clipped coefficients where they
        are in this process, else None (they stay with the rows).
    """
    noise = np.random.default_rng() if noise_rng is None else noise_rng
    t = np.asarray(warm.point, dtype=np.float64)
    d = t.size
    # The Taylor model lives on the coordinates the rows read (a hyperparameter only the
    # prior sees gets neither Taylor terms nor their noise).
    index = np.flatnonzero(reads)
    if index.size == 0:
        index = np.arange(d)
    k = index.size
    L_full = np.linalg.cholesky(warm.covariance)
    L = np.linalg.cholesky(warm.covariance[np.ix_(index, index)])
    if previous is not None:
        same = np.array_equal(previous.t, t) and np.array_equal(previous.index, index)
        if not (same and np.array_equal(previous.L, L)):
            raise ValueError("`previous` must be expanded at the same point and coordinates")
        order = previous.order
    if order == "auto":
        order = 2 if k <= MAX_SECOND_ORDER_DIM else 1
    if order not in (1, 2):
        raise ValueError(f"order must be 1, 2 or 'auto', got {order!r}")
    e = Expansion(t, L, index, int(order))
    relation = "add_remove" if relation is Neighbours.ADD_REMOVE else "substitute"
    rows = float(warm.n_rows)  # public: n, or the released count under add/remove-one
    shares = dict(ONESHOT_SHARES if shares is None else shares)
    if order == 1:
        shares["G"] += shares.pop("H") + shares.pop("hist_h")
    dropped = (["hist_r"] if not residual else []) + (
        [name for name in ("hist_g", "hist_h") if name in shares] if previous is not None else []
    )
    for name in dropped:  # what is not released goes to G and H in their proportion
        shares.pop(name, None)
    total = sum(shares.values())
    shares = {name: v / total for name, v in shares.items()}
    mus = {name: math.sqrt(v * float(mu) ** 2) for name, v in shares.items()}
    spent = [0.0, 0]

    def charge(name: str) -> float:
        if not ledger.try_spend(mus[name] ** 2):
            raise WarmStartRefused(
                "The privacy ledger refused a Taylor one-shot release; lower the budget's "
                "other uses or raise epsilon."
            )
        spent[0] += mus[name] ** 2
        spent[1] += 1
        return mus[name]

    # Every sum of the data is asked after the releases it feeds are charged.
    scale = math.sqrt(k / max(rows, 1.0))
    if previous is not None:  # the same rows' terms: the earlier stage's clips
        c_g = previous.clip_g
        c_H = None if order == 1 else previous.clip_H
    else:
        mu_hist_g = charge("hist_g")
        mu_hist_h = charge("hist_h") if order == 2 else 0.0
        aim = mus
        if clip_mu is not None:  # as a one-stage release of clip_mu would aim them
            full = dict(ONESHOT_SHARES)
            if order == 1:
                full["G"] += full.pop("H") + full.pop("hist_h")
            aim = {
                name: math.sqrt(full[name]) * float(clip_mu) for name in ("G", "H") if name in full
            }
        c_g, c_H = _stage_clips(data, e, mu_hist_g, mu_hist_h, aim, noise, relation, rows)
    mu_G = charge("G")
    mu_H = charge("H") if order == 2 else 0.0
    sums = data.clipped_sums(e, c_g, c_H)
    release = tl.release_packed(sums, k, c_g, c_H, mu_G, mu_H, noise, relation)
    if previous is not None:
        release = tl.combine_releases(previous.release, release)
    embed = np.linalg.solve(L, L_full[index, :])  # u = embed v where x = t + L_full v
    point, cov = _released_mode(release, prior, t, L_full, embed, order)
    model = TaylorModel(
        t=t,
        L=L,
        release=release,
        order=int(order),
        clip_g=float(c_g),
        clip_H=math.nan if c_H is None else float(c_H),
        residual_clip=math.nan,
        mu=math.nan,
        releases=0,
        point=point,
        covariance=cov,
        control=data.control(e, c_g, c_H),
        index=index,
    )

    if not residual:
        return dataclasses.replace(model, mu=math.sqrt(spent[0]), releases=int(spent[1]))
    # The residual clip r: a noisy histogram of each row's largest residual ratio over
    # public probe moves around the start, in the chains' own proposal scale.
    mu_hist_r = charge("hist_r")
    probes, lengths, independent = _residual_probes(model)
    e_r = tc.geometric_edges(scale ** (order + 1), -16, 32)
    counts = data.residual_counts(e, c_g, c_H, probes, e_r)
    cnt, sd = tc.noisy_counts(counts, mu_hist_r, noise, relation)
    r = _RESIDUAL_FACTOR * tc.clip_by_visible_tail(e_r, cnt, sd, tail=_RESIDUAL_TAIL * rows)
    return dataclasses.replace(
        model,
        residual_clip=float(r),
        mu=math.sqrt(spent[0]),
        releases=int(spent[1]),
        probe_length=float(np.median(lengths)),
        noise_length=float(max(np.median(lengths), np.median(independent))),
    )


def _residual_probes(model: TaylorModel) -> tuple[tuple, list[float], list[float]]:
    """The residual clip's public probe moves around the released start, in the chains' own
    proposal scale: ``((x0s, x1s, u0s, u1s, lengths), lengths, independent lengths)``
    (``u``: the points whitened; the independent moves' lengths from the same starts)."""
    point, d = model.point, model.point.size
    probe = np.random.default_rng([27, d])  # public: fixed probes
    probe_ind = np.random.default_rng([28, d])  # public: the independent moves' probes
    chol = np.linalg.cholesky(model.covariance)
    x0s, x1s, lengths, independent = [], [], [], []
    for _ in range(_PROBES):
        x0 = point + chol @ probe.standard_normal(d)
        x1 = x0 + (2.38 / math.sqrt(d)) * (chol @ probe.standard_normal(d))
        independent.append(model.residual_length(x0, model.independent_proposal(probe_ind, x0)[0]))
        lengths.append(model.residual_length(x0, x1))
        x0s.append(x0)
        x1s.append(x1)
    x0s, x1s = np.array(x0s), np.array(x1s)
    u0s = np.array([model.whiten(x) for x in x0s])
    u1s = np.array([model.whiten(x) for x in x1s])
    return (x0s, x1s, u0s, u1s, np.array(lengths)), lengths, independent
