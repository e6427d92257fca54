"""The Taylor path's chain step: pay per step only for the rows' residuals.

:class:`TaylorPenaltyMetropolis` is :class:`~pymc_penalty.sampling.step.PenaltyMetropolis`
whose compiled likelihood subtracts each row's clipped Taylor model at a public point ``t``
(:class:`~pymc_penalty.model.likelihood.RowControl`) and whose release adds back the released
model's difference ``M_rel(w') - M_rel(w)`` (public, from the one-shot release of
:func:`pymc_penalty.warmstart.taylor.taylor_oneshot`). The clipped residual sum's bound is
``B = r max(||u||, ||u'||, 1)^order ||u' - u||`` (``u``: the coordinates the rows'
log-likelihood depends on, whitened at ``t``; :meth:`TaylorModel.residual_length`),
symmetric in the two points, so the penalty test stays exact for the chain's target: the
posterior tilted by the one-shot noise, ``p(x) exp(sum_i l_i(x) + xi_G . w + w' Xi_H w / 2)``,
where no residual is clipped (``docs/algorithm.md``, "Taylor control variates").
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.linalg import solve_triangular
from scipy.stats import norm

from pymc_penalty.accounting.gdp import likelihood_mu2
from pymc_penalty.model.likelihood import RowControl
from pymc_penalty.privacy import taylor as tl
from pymc_penalty.sampling.kernel import PenaltyState, Release
from pymc_penalty.sampling.options import group_step_options
from pymc_penalty.sampling.step import PenaltyMetropolis

__all__ = [
    "INDEPENDENT_DF",
    "MoveChoice",
    "compare_moves",
    "draw_move",
    "INDEPENDENT_SHARE",
    "RESIDUAL_FLOOR",
    "RESIDUAL_NOISE_CAP",
    "RESIDUAL_NOISE_SD",
    "TaylorModel",
    "TaylorPenaltyMetropolis",
    "noise_limited_clip",
    "with_chains_clip",
]

#: Public floor of the residual bound's radius (whitened units, :func:`residual_bound`).
RESIDUAL_FLOOR = 1.0

#: The per-step noise sd, at a typical move, up to which :func:`noise_limited_clip` raises the
#: residual clip. A residual clipped at every step biases the chain's target (the logistic
#: regression of the README clipped 1-2% of its rows, the misclassified rows with large
#: covariates, and overestimated its effects by 1-1.5 sd); the noise only slows the chain
#: (the penalty test stays exact), and a noise sd near 1 costs it little.
RESIDUAL_NOISE_SD = 1.0

#: The largest per-step noise sd, at a typical move, to which the released residual clip may
#: raise the chains' clip (:func:`noise_limited_clip`; read at the call). No cap by default: a
#: cap of 2 let the logistic regression's chains converge at epsilon 1 in 4 of 4 runs (4 of 8
#: without it), but it clips the rows above it at every step, and the errors of the means did
#: not fall (``benchmarks/model_suite.py``, method ``taylor_cap2``, 4 data sets of fresh
#: noise: differences within their noise; docs/benchmarks/model-suite-variants.md).
RESIDUAL_NOISE_CAP = math.inf


#: After tuning, the share of the Taylor step's moves drawn independently from the released
#: model's Gaussian approximation (a multivariate t, :meth:`TaylorModel.independent_proposal`)
#: instead of the random walk, where :func:`independent_share` finds them the better move.
#: A state-independent mixture of two kernels that each leave the target invariant leaves it
#: invariant; the independent moves' Hastings term is public.
INDEPENDENT_SHARE = 0.8

#: Public probe pairs :func:`independent_share` draws to compare the two moves' noise.
_SHARE_PROBES = 64
#: The largest median noise sd of the independent moves at which they are used.
_SHARE_MAX_NOISE_SD = 2.0

#: Degrees of freedom of the independent proposal's multivariate t: tails heavier than the
#: Gaussian approximation's, so that a target wider than it is still explored.
INDEPENDENT_DF = 7.0


def _log_t(e: np.ndarray, chol: np.ndarray) -> float:
    """The log density, up to its constant, of the independent moves' multivariate t at the
    offset ``e`` from its centre (scale ``chol chol'``)."""
    z = solve_triangular(chol, np.asarray(e, dtype=np.float64), lower=True)
    return -0.5 * (INDEPENDENT_DF + z.size) * math.log1p(float(z @ z) / INDEPENDENT_DF)


@dataclass(frozen=True)
class TaylorModel:
    """The released Taylor model and what the chains need from it.

    Public: everything but ``control`` (the rows' clipped coefficients, private like the data;
    it stays inside the compiled likelihood).

    Attributes
    ----------
    t, L : ndarray
        Expansion point (every coordinate) and whitening factor (the warm start's point, and
        its covariance's Cholesky factor on ``index``).
    release : TaylorRelease
        The released sums ``G``, ``H`` and their noise sds.
    order : int
        1 or 2.
    clip_g, clip_H : float
        The one-shot clips (``clip_H`` NaN at first order).
    residual_clip : float
        The residual bound's constant ``r``: ``B = r`` times :meth:`residual_length`.
    mu : float
        Gaussian-DP ``mu`` of the one-shot releases together (histograms included).
    releases : int
        Number of releases made.
    point, covariance : ndarray
        The chains' start and proposal metric: one Newton step on the released model and the
        exact prior from ``t``.
    control : RowControl or None
        The rows' clipped coefficients (private); None where the rows are on shards, which
        keep them (:meth:`~pymc_penalty.distributed.shards.ShardPool.taylor_control`).
    index : ndarray of int, optional
        The coordinates the rows' log-likelihood depends on
        (:func:`~pymc_penalty.model.likelihood.likelihood_coordinates`): the Taylor model,
        its noise and the residual bound live there, ``u = L^-1 (x - t)[index]`` (a
        hyperparameter only the prior sees gets no noise, and its moves cost nothing).
        None: every coordinate.
    probe_length : float
        The median :meth:`residual_length` of the public probe moves ``r`` was measured at.
    noise_length : float
        The move length :func:`noise_limited_clip` sets the noise floor at: the longer of
        ``probe_length`` and the median length of independent moves
        (:meth:`independent_proposal`) from the same probe points. NaN: ``probe_length``.
    start_offset : float
        The chains' start's distance from ``t`` over the released mode search's reach
        (:func:`pymc_penalty.planning.taylor_forecast.start_offset`; 1: on its bound).
    """

    t: np.ndarray
    L: np.ndarray
    release: tl.TaylorRelease
    order: int
    clip_g: float
    clip_H: float
    residual_clip: float
    mu: float
    releases: int
    point: np.ndarray
    covariance: np.ndarray
    control: RowControl | None
    index: np.ndarray | None = None
    probe_length: float = float("nan")
    noise_length: float = float("nan")
    start_offset: float = 0.0

    def model_value(self, x: np.ndarray) -> float:
        """The released model ``M_rel(w)`` at the raveled point ``x`` (public)."""
        return self.release.model(self.whiten(x))

    def whiten(self, x: np.ndarray) -> np.ndarray:
        """``u = L^-1 (x - t)[index]`` (every coordinate without ``index``)."""
        diff = np.asarray(x, dtype=np.float64) - self.t
        if self.index is not None:
            diff = diff[self.index]
        return solve_triangular(self.L, diff, lower=True, check_finite=False)

    def residual_length(self, x0: np.ndarray, x1: np.ndarray) -> float:
        """``max(||u||, ||u'||, 1)^order ||u' - u||`` (:meth:`whiten`; public: the two points,
        ``t`` and ``L``). The residual bound is the residual clip times this; symmetric in
        the two points."""
        return self.residual_length_of(self.whiten(x0), self.whiten(x1))

    def residual_length_of(self, u0: np.ndarray, u1: np.ndarray) -> float:
        """:meth:`residual_length` of two points already whitened."""
        return tl.residual_bound(u0, u1, 1.0, self.order, RESIDUAL_FLOOR)

    def independent_proposal(
        self, rng: np.random.Generator, x0: np.ndarray
    ) -> tuple[np.ndarray, float]:
        """A move of the coordinates the rows read (``index``; the others stay) to a draw
        from the multivariate t (:data:`INDEPENDENT_DF`) centred at the released model's
        mode ``point`` with scale ``covariance`` on them, and the Hastings term
        ``log q(x0) - log q(x1)``. Public: the released model's values and ``rng``.

        Only the rows' coordinates: the released model describes them (with the data's
        weight), while a hyperparameter that only the prior sees has no Gaussian shape to
        rely on; the step's free moves (:meth:`PenaltyMetropolis._free_moves`) move those.
        An independent proposal of one block given the rest leaves the conditional, hence
        the target, invariant."""
        chol, centre, index = self._proposal_block()
        z = rng.standard_normal(centre.size)
        w = rng.chisquare(INDEPENDENT_DF) / INDEPENDENT_DF
        x0 = np.asarray(x0, dtype=np.float64)
        x1 = x0.copy()
        x1[index] = centre + chol @ z / math.sqrt(w)
        return x1, _log_t(x0[index] - centre, chol) - _log_t(x1[index] - centre, chol)

    def _proposal_block(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(chol, centre, index)`` of the independent proposal (cached: public values)."""
        kept = getattr(self, "_proposal_cache", None)
        if kept is None:
            index = np.arange(self.point.size) if self.index is None else self.index
            cov = np.asarray(self.covariance, dtype=np.float64)[np.ix_(index, index)]
            kept = (np.linalg.cholesky(cov), np.asarray(self.point, np.float64)[index], index)
            object.__setattr__(self, "_proposal_cache", kept)  # frozen: a derived cache
        return kept

    def describe_bound(self) -> str:
        """The residual bound in words, for the report's ``dp_sensitivity`` (no data)."""
        return (
            f"Taylor residual (order {self.order}): B = r * max(||u||, ||u'||, 1)^order "
            "* ||u' - u||_2 (u: the likelihood's coordinates whitened at the warm start's "
            "point; r released: dp_taylor_residual_clip)"
        )

    def model_difference(self, u0: np.ndarray, u1: np.ndarray) -> float:
        """The released model's difference ``M_rel(u') - M_rel(u)`` of a move between two
        whitened points (:meth:`whiten`; public), which a Taylor step adds to its released
        residual sum."""
        return self.release.model(u1) - self.release.model(u0)

    def report(self) -> dict[str, Any]:
        """The report's ``dp_taylor_*`` keys (public values)."""
        return {
            "dp_method": "taylor",
            "dp_taylor_order": int(self.order),
            "dp_taylor_mu": float(self.mu),
            "dp_taylor_releases": int(self.releases),
            "dp_taylor_clip_g": float(self.clip_g),
            "dp_taylor_clip_h": float(self.clip_H),
            "dp_taylor_residual_clip": float(self.residual_clip),
            "dp_taylor_noise_sd_g": float(self.release.sd_G),
            "dp_taylor_noise_sd_h": float(self.release.sd_H),
            # The G noise's error of the means in the released posterior's sds (noise_sd_g
            # is in whitened units: the same only where the whitening is the posterior's).
            "dp_taylor_mean_noise_sd": tl.tilt_mean_sd(
                self.covariance, self.L, self.release.sd_G, self.index
            ),
        }


def noise_limited_clip(
    taylor: TaylorModel, likelihood_mu: float, relation: str, noise_sd: float | None = None
) -> float:
    """The residual clip to run with: the released ``r``, raised until a typical move's noise
    sd reaches ``noise_sd`` (default :data:`RESIDUAL_NOISE_SD`, read at the call).

    A step's noise sd is ``k B / mu`` with ``B = clip * residual_length`` (``k`` = 2
    substitute-one, 1 add/remove-one) and ``mu`` the step's likelihood ``mu``; at the
    typical move's length ``L`` (``taylor.noise_length``: the longer of the walk's and the
    independent moves' probe medians) that is ``noise_sd`` for ``clip = noise_sd mu / (k
    L)``. Calibrated at the walk alone, an independent move's noise sd was 2.2 on a
    hierarchical model's eight intercepts (their residual is zero: a Gaussian likelihood),
    above the 2 at which those moves are used, and the walk alone mixed slowly. Public
    inputs only (the plan's ``mu``, the probes' points), so no privacy cost. A clip clips
    fewer rows the larger it is: below the noise the chain can carry, a larger one removes
    clipping bias for free.
    """
    length = taylor.noise_length if np.isfinite(taylor.noise_length) else taylor.probe_length
    if not (np.isfinite(length) and length > 0.0):
        return float(taylor.residual_clip)
    noise_sd = RESIDUAL_NOISE_SD if noise_sd is None else noise_sd  # read at call time
    k = 2.0 if relation == "substitute" else 1.0
    by_noise = float(noise_sd) * float(likelihood_mu) / (k * float(length))
    clip = max(float(taylor.residual_clip), by_noise)
    if math.isfinite(RESIDUAL_NOISE_CAP):  # read at call time; never below by_noise
        clip = min(clip, by_noise * max(RESIDUAL_NOISE_CAP / float(noise_sd), 1.0))
    return clip


def with_chains_clip(
    taylor: TaylorModel, step_mu: float, count_share: float, relation: str
) -> TaylorModel:
    """The released model with the residual clip its chains run with under ``clip="auto"``:
    :func:`noise_limited_clip` at the step's likelihood ``mu`` (the per-step ``step_mu``
    less the clip count's ``count_share``). Public inputs only. ``pymc_penalty.sample``,
    a budgeted step (``pymc_penalty.budgeted.taylor_step_settings``) and the sharded
    Taylor path all set it here."""
    lik_mu = math.sqrt(likelihood_mu2(float(step_mu), 1.0, float(count_share)))
    return replace(taylor, residual_clip=noise_limited_clip(taylor, lik_mu, relation))


@dataclass(frozen=True)
class MoveChoice:
    """What :func:`compare_moves` found (public values).

    Attributes
    ----------
    share : float
        The independent moves' share after tuning: :data:`INDEPENDENT_SHARE` or 0.
    independent_per_draw, walk_factor : float
        An independent move's effective draws per step, ``a / (2 - a)``, and the walk's
        noise factor, the mean of ``2 Phi(-sigma / 2)`` (its effective draws per step are
        about ``0.3 / d`` times that).
    """

    share: float
    independent_per_draw: float
    walk_factor: float


def compare_moves(
    taylor: TaylorModel, walk_chol: np.ndarray, sigma_of: Any, probes: int = _SHARE_PROBES
) -> MoveChoice:
    """Compare the walk (proposal factor ``walk_chol``) with the independent moves on
    ``probes`` public pairs (a fixed generator; points from the released model's
    approximation): ``sigma_of(length)`` is a move's noise sd for its bound's length. See
    :meth:`TaylorPenaltyMetropolis._independent_share` for the rule; the step and the
    forecast (:mod:`pymc_penalty.planning.taylor_forecast`) both use it."""
    probe = np.random.default_rng([0x1D, taylor.point.size])  # public: fixed probes
    chol = np.linalg.cholesky(np.asarray(taylor.covariance, dtype=np.float64))
    sigma_walk, sigma_ind = np.empty(int(probes)), np.empty(int(probes))
    for j in range(int(probes)):
        x0 = taylor.point + chol @ probe.standard_normal(taylor.point.size)
        x_walk = x0 + walk_chol @ probe.standard_normal(x0.size)
        x_ind, _ = taylor.independent_proposal(probe, x0)
        sigma_walk[j] = sigma_of(taylor.residual_length(x0, x_walk))
        sigma_ind[j] = sigma_of(taylor.residual_length(x0, x_ind))
    d = taylor.point.size if taylor.index is None else taylor.index.size
    # A penalty test with noise sd sigma accepts about 2 Phi(-sigma / 2) as often.
    walk_factor = float(np.mean(2.0 * norm.cdf(-0.5 * sigma_walk)))
    a = 0.8 * float(np.mean(2.0 * norm.cdf(-0.5 * sigma_ind)))
    per_draw = a / (2.0 - a)
    # An independent move stays where its noise is large (a state far out gives every
    # proposal a long bound): beyond a median noise sd of 2 it is not used.
    calm = float(np.median(sigma_ind)) <= _SHARE_MAX_NOISE_SD
    share = INDEPENDENT_SHARE if calm and per_draw > 0.3 / d * walk_factor else 0.0
    return MoveChoice(share, per_draw, walk_factor)


def draw_move(
    taylor: TaylorModel,
    rng: np.random.Generator,
    x0: np.ndarray,
    share: float,
    walk: Callable[[], np.ndarray],
) -> tuple[np.ndarray, float]:
    """A Taylor chain's move after tuning, and its Hastings term: with probability ``share``
    (one uniform of the chain's generator ``rng``, drawn first) an independent move
    (:meth:`TaylorModel.independent_proposal`), else the random walk's ``walk()`` (Hastings
    term 0). Public: the chain's generator and released values. The in-process step
    (:meth:`TaylorPenaltyMetropolis._draw`) and the sharded driver
    (:func:`pymc_penalty.distributed._driver.run_chains`) both draw their moves here."""
    if rng.random() >= share:
        return walk(), 0.0
    return taylor.independent_proposal(rng, x0)


class TaylorPenaltyMetropolis(PenaltyMetropolis):
    """Penalty Metropolis on the rows' residuals after a released Taylor model.

    Parameters
    ----------
    vars : list, optional
        As for :class:`~pymc_penalty.PenaltyMetropolis`.
    taylor : TaylorModel
        The one-shot release (:func:`pymc_penalty.warmstart.taylor.taylor_oneshot`).
    **kwargs
        :class:`~pymc_penalty.PenaltyMetropolis` arguments. ``clip`` defaults to the released
        residual clip ``r`` (measured at public probe moves: ``"auto"`` is not supported
        here), its mode is ``"metric"`` (the bound is the clip times
        :meth:`TaylorModel.residual_length`), ``S`` defaults to the model's covariance.
    """

    #: The released model (None: the plain penalty step, as a budgeted step that runs no
    #: one-shot release is).
    taylor: TaylorModel | None = None
    #: Share of the moves after tuning drawn from the released model's approximation; None:
    #: chosen at the first step after tuning (:meth:`_independent_share`).
    independent_share: float | None = None
    #: This step's Hastings term ``log q(x) - log q(x')`` (0 but for an independent move).
    _hastings: float = 0.0

    def __init__(
        self, vars: list | None = None, *, taylor: TaylorModel | None, **kwargs: Any
    ) -> None:
        if taylor is None:  # the plain step (pymc_penalty.PenaltyMetropolis without a model)
            super().__init__(vars, **kwargs)
            return
        if not isinstance(taylor, TaylorModel):
            raise TypeError("`taylor` must be a TaylorModel (pymc_penalty.warmstart.taylor)")
        kwargs.setdefault("clip", taylor.residual_clip)
        kwargs = group_step_options(kwargs)  # the old keywords (FutureWarning), grouped
        clip = kwargs["clip"]
        if clip.mode not in (None, "metric"):
            raise ValueError("TaylorPenaltyMetropolis sets ClipPolicy.mode='metric' itself.")
        if isinstance(clip.value, str):
            raise ValueError(
                "TaylorPenaltyMetropolis takes a numeric clip (default: the released residual "
                "clip); clip='auto' is not supported on the Taylor path."
            )
        kwargs["clip"] = replace(clip, mode="metric")
        kwargs.setdefault("S", taylor.covariance)
        self.taylor = taylor
        self._row_control = taylor.control
        super().__init__(vars, **kwargs)

    def describe_sensitivity(self) -> str | None:
        """The bound in words, for the report (no data); None for the plain step."""
        return None if self.taylor is None else self.taylor.describe_bound()

    def _draw(self, x0: np.ndarray) -> np.ndarray:
        """After tuning, :attr:`independent_share` of the moves are drawn independently from
        the released model's approximation (:meth:`TaylorModel.independent_proposal`); the
        others, and every tuning move (whose acceptance tunes the walk's scaling), are the
        random walk's. The choice uses the chain's generator: public. The independent move's
        Hastings term is kept for the release (:meth:`_release_sum`)."""
        self._hastings = 0.0
        if self.taylor is None or self.tune:
            return super()._draw(x0)
        walk = functools.partial(PenaltyMetropolis._draw, self, x0)
        x1, self._hastings = draw_move(self.taylor, self.rng, x0, self._independent_share(), walk)
        return x1

    def _independent_share(self) -> float:
        """:attr:`independent_share`, or where it is None :data:`INDEPENDENT_SHARE` when an
        independent move is expected to give more effective draws per step than the tuned
        walk's, else 0 (chosen once, at the first step after tuning; public inputs only).

        Both moves pay noise of sd ``sigma`` from their bound's length, and a penalty test
        with noise ``sigma`` accepts about ``2 Phi(-sigma / 2)`` as often as an exact one.
        On :data:`_SHARE_PROBES` public pairs (a fixed generator; points drawn from the
        released model's approximation), the walk's draws per effective draw are taken as
        ``d / 0.3`` (an optimally scaled walk in ``d`` dimensions) over that factor, an
        independent move's as ``(2 - a) / a`` with ``a = 0.8 * 2 Phi(-sigma / 2)`` (0.8:
        the released model is an approximation), and independent moves whose median noise
        sd is above 2 are not used (their noise depends on the state: a chain at a point
        far out sticks there). Measured: on a 2-dimensional logistic
        regression the independent moves' noise sd was 0.2-0.9 and they decorrelated the
        chain 2-5x faster; on 8 group intercepts (second order, ||u'-u|| about 4) their
        noise sd was 3.6-4.3 and the chains with them mixed half as fast.
        """
        if self.independent_share is not None:
            return float(self.independent_share)
        share = getattr(self, "_auto_share", None)
        if share is None:
            share = self._auto_share = self._compare_moves()
        return share

    def _compare_moves(self) -> float:
        walk = self.adapter.scaling * self.adapter.chol
        choice = compare_moves(
            self.taylor, walk, lambda length: self._sensitivity_and_noise(length)[2]
        )
        return choice.share

    def _bound_length(self, x0: np.ndarray, x1: np.ndarray) -> float:
        """The residual length ``max(||u||, ||u'||, 1)^order ||u' - u||`` (public: the two
        points and the public ``t``, ``L``)."""
        if self.taylor is None:
            return super()._bound_length(x0, x1)
        return self.taylor.residual_length_of(*self._whitened(x0, x1))

    def _whitened(self, x0: np.ndarray, x1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(u, u')`` of a move, whitened once per step: the bound and the release read the
        same two points (kept by identity; any other pair is whitened afresh)."""
        kept = getattr(self, "_last_move", None)
        if kept is not None and kept[0] is x0 and kept[1] is x1:
            return kept[2], kept[3]
        u0, u1 = self.taylor.whiten(x0), self.taylor.whiten(x1)
        self._last_move = (x0, x1, u0, u1)
        return u0, u1

    def _release_sum(
        self, state: PenaltyState, x1: np.ndarray, bound: float, sigma: float, count_sd: float
    ) -> Release:
        """The clipped residual sum with noise, plus the released model's difference."""
        out = super()._release_sum(state, x1, bound, sigma, count_sd)
        if self.taylor is None:
            return out
        public = self.taylor.model_difference(*self._whitened(state.position, x1))
        public += self._hastings
        return out._replace(d_hat=out.d_hat + public)
