"""The private warm start's arithmetic (pure NumPy): its budget schedule, its clips and the
Fisher-scoring loop on released statistics.

:func:`fisher_scoring` reads the data only through a
:class:`~pymc_penalty.warmstart.statistics.RowStatistics` (four sums of per-row terms at a
point; per-row gradients as a function are wrapped in one) and takes the ledger's ``commit``
as a callback, so it touches no model: :func:`pymc_penalty.warmstart.private_warm_start`
is the PyMC adapter around it (see that module's docstring for the mechanism and the figures
measured). The statistics and their sensitivities are in :mod:`pymc_penalty.warmstart.releases`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from scipy import special, stats

from pymc_penalty.accounting.gdp import split_step_mu
from pymc_penalty.accounting.sensitivity import Neighbours
from pymc_penalty.privacy.precision import gaussian_release, snap_count
from pymc_penalty.sampling.adaptation.clip import (
    CLIP_EVIDENCE_SES,
    clip_target_fraction,
    tail_factor,
)
from pymc_penalty.warmstart.releases import (
    LOG_CLIP,
    gradient_sensitivity,
    log_scale_sensitivity,
    outer_sensitivity,
)
from pymc_penalty.warmstart.statistics import RowGradients, RowStatistics

__all__ = [
    "WARM_START_STEPS",
    "Scoring",
    "fisher_scoring",
    "settled_clip",
    "warm_start_clips",
    "warm_start_schedule",
]

#: Fisher-scoring steps by default. More steps let an anisotropic metric converge from the
#: pilot's (each curvature release corrects an overestimated direction by about the inverse of
#: its eigenvalue floor, 3 times at small budgets) at less ``mu`` per gradient. Measured
#: (``private_warm_start`` alone, a 20% warm start, 12-24 noise seeds, RMS over seeds of the RMS
#: error in posterior sd, with the pooled curvature): gauss (d = 10, condition number 1e4)
#: n = 1e4 at epsilon 2: 7.9 for 8 steps, 4.6 for 10, 2.3 for 12, 1.6 for 16; logistic
#: (d = 5) n = 1e4 at epsilon 1: 1.8-2.0 for 8-12, 2.6 for 16 (heavier tails).
WARM_START_STEPS = 12
#: Each step's ``mu^2`` is this many times the previous step's: late steps, near the mode,
#: need the small noise; early ones only need to point the right way.
_GROWTH = 1.6
#: Share of the warm start's ``mu^2`` spent on the curvature releases (the metric). Measured on
#: the anisotropic Gaussian of ``benchmarks/gauss.py`` (d = 10, n = 1e5, a 20% warm start,
#: four noise seeds, error of the estimated mode in posterior sd): 0.1 gave 1.0-3.4 at
#: epsilon = 1, 0.2-0.4 gave 0.25-0.47; at epsilon = 2, 0.12-0.21 for 0.1 and 0.13-0.23 for 0.3.
_CURVATURE_SHARE = 0.3
#: ``clip="auto"``: the tail probability of a gradient's length in the metric at the mode that
#: gives the starting clip (exact for Gaussian scores; the released counts then move it).
_AUTO_CLIP_TAIL = 1e-3
#: ``clip="auto"``: share of each gradient release's ``mu^2`` (from the second step on) spent
#: on its clipped count, the sampler's default ``clip_count_share``. At epsilon = 1, a 20% warm
#: start, n = 1e5 (the utility benchmark) the count's noise sd is 295 rows in the second step
#: and 72 in the last (0.2% is 200 rows; the chi^2 clip cut 4000 there); the gradient's noise
#: grows by 2.6%. Measured against 0.1 (80 seeds, benchmarks' workloads, error in posterior sd):
#: RMS 0.242 and 0.248 on gauss, 0.564 and 0.575 on the logistic regression.
_COUNT_SHARE = 0.05
#: ``clip="auto"``: a count moves the clip only where the rows' released mean, whitened (the
#: distance to the mode in the per-datapoint metric, about), is within this of zero: farther
#: away the counts describe the rows there, not at the mode (measured on the gauss benchmark:
#: the second step, still far from the mode, counted most rows clipped and grew the clip 4
#: times, which the curvature noise, growing as its square, turned into errors of 4-12 sd).
_NEAR_MODE = 1.0
#: The first metric (from the rows' spread at a data-independent start) is multiplied by this:
#: far from the mode the spread of the scores can underestimate the curvature many times (a
#: scale parameter started 5 times too large: 25 times), and an underestimated metric sends
#: the first step far away, while an overestimate only shortens it and the next curvature
#: release corrects it. Measured (private_warm_start on N(m, s), s started at 5, n = 2e4; and
#: the gauss benchmark's posterior at epsilon = 1 and 2): 1 diverged (|m| > 100), 3 and 5
#: stopped short (m 0.49-0.76 for 0.49), 10 landed (m 0.48, s 0.97-1.0); gauss error 0.16-0.32
#: sd at epsilon = 2 for 10 against 0.13-0.23 for 1.
_PILOT_SAFETY = 10.0
#: Eigenvalue floor of a released curvature, in ``sqrt(d)`` noise sds. A direction whose
#: metric overestimates the curvature is corrected by at most the floor's factor per step, so a
#: low floor converges faster; too low and noise passes for curvature. Measured (gauss
#: workload, exact gradients, 20% warm start; error of the mode in posterior sd, 2 or 4 seeds):
#: 2 gave 3.6-3.9 at n = 1e4, epsilon = 6 and 0.4-2.7 at n = 1e5, epsilon = 1; 0.5 gave
#: 0.43-0.56 and 0.35-0.58; 0.25 gave 0.51-0.53 and 0.34-0.51; epsilon = 2: 0.10-0.24 for 0.5.
_FLOOR = 0.5
#: Far from the mode (in per-datapoint sds) every row's gradient is clipped in the same
#: direction, so the released sum is about ``n C`` and a Fisher step moves at most ``C``
#: per-datapoint sds (``C sqrt(n)`` posterior sds): 8 steps from a start 6600 posterior sds
#: away (a Normal mean started at 50 for 3, n = 2e4) ended 3070-3810 sds short. A step is
#: "far" when the released whitened mean of the clipped gradients, less two ``sqrt(d)`` of its
#: noise sds, is at least this share of the clip used (near the mode it is about ``1 / sqrt(n)``
#: of a per-datapoint sd, so this never fires there and the warm start is unchanged, bit for
#: bit): the next step's gradient clip (only the gradient's: the curvature's noise grows as its
#: clip's square) is then ``_TRAVEL_GROWTH`` times the last one, so the step it allows grows
#: geometrically until the rows are no longer all clipped, and the Fisher step from there is
#: no longer short. The clip is a function of releases only and the noise grows with it, so
#: this costs no privacy; the noise relative to the step stays ``2 / (mu n)``. Set to
#: ``math.inf`` to turn travelling off. Far starts read 0.99-1.0 (Normal mean from 50, heights
#: from 0); 0.9 also fired on the gauss workload (d = 10, n = 1e4, epsilon = 1, 1 seed of 4:
#: 0.92, 0.92, 0.93 while the metric's eigenvalue floor shortened its steps), 0.95 in none of
#: 48 (epsilon 0.5, 1, 2, 6, 12 seeds each).
_FAR_SHARE = 0.95
#: Growth of the gradient clip per far step (the found clip's largest move, 4).
_TRAVEL_GROWTH = 16.0
#: After travelling, an iterate is averaged only once the steps are within this many noise
#: sds (the step's length in the posterior metric against ``sqrt(d / n)`` noise sds).
_SETTLED = 3.0
#: Consecutive far steps (the first, in the pilot metric, not counted) before the clip grows.
_FAR_STEPS = 3
#: The secant stretch (:func:`_stretch`), for models with a transformed coordinate only. Below
#: its mode a scale's log-scale scores ``(y - m)^2 / s^2 - 1`` spread ``(s_mode / s)^2`` times as
#: at the mode, so the metric (the rows' spread) overestimates the curvature ``(s_mode / s)^4``
#: times and each Fisher step is that much too short: ``s ~ HalfNormal(1)`` for data of sd 10,
#: n = 1e5, moved ``log s`` 0.005 a step and ended 711 posterior sds short. A step fell short
#: when the released slope along it at its end kept more than ``_SHORT_KEPT`` of the slope at
#: its start, both above ``_SHORT_SES`` noise sds; after two such steps in a row (a lone one is
#: the metric catching up after the pilot) the next Fisher step is multiplied by the secant's
#: factor, at most ``_STRETCH_GROWTH`` times the last (and ``_STRETCH_MAX`` in all), until a
#: step's slopes are noise or it overshoots. Releases only: no privacy cost. Measured
#: (``private_warm_start``, epsilon 2, a 20% share, RMS over coordinates in posterior sd): that
#: model at n = 1e5, 711 -> 0.73 RMS over 6 seeds; at n = 1e4, 224 -> 8.9 over 8 (median 3.2;
#: growth 16: 37, 64 kept); the peer_probe models at n = 1e4, epsilon 6 (8 seeds) bit-identical.
#: Not handled: a location far too (``y ~ N(170, 10)`` from 0): 306, as before (the clip's
#: travel and the stretch do not run together).
_SHORT_KEPT = 0.5
_SHORT_SES = 5.0
_STRETCH_GROWTH = 64.0
_STRETCH_MAX = 1e4
#: A guess (a stretched step, or one capped at a grown radius) goes back when its released
#: slope reversed beyond this many noise sds and beyond :data:`_GUESS_REVERSAL` of the slope
#: at its start (:func:`_backtrack`). The case: the suite's linear regression (data set 0,
#: ``mu = 0.22``, noise seed 1), where a slope that kept 97% of itself along a step (the 3%
#: within the noise) stretched the next step 36 times; it overshot from 58 to 212 posterior
#: sds with a reversal of 94% of its slope, within :func:`_overshot`'s bar, and the warm start
#: ended 147 sds off. Measured (``scripts/warm_start_trace.py``, see docs/benchmarks.md,
#: eighth session): a bar of 3 noise sds alone went back on the scale starts' useful guesses
#: (``small_scale`` median 1.43 -> 2.15 sds, ``heights_far`` 0.62 -> 0.92); with half the
#: slope as well those are bit-identical and the linear case ends 48 sds off.
_GUESS_SES = 3.0
_GUESS_REVERSAL = 0.5
#: Largest move of a transformed coordinate (``log``, ``logodds``, ...: a scale or a bounded
#: parameter) in one step, in its unconstrained units; a longer Fisher step is scaled down as a
#: whole. Far from the mode the rows' spread underestimates a scale's curvature: with the scale
#: ``s`` too large, the log-scale scores ``-1 + (y - m)^2 / s^2`` are all near -1, their spread
#: is ``(s_mode / s)^2`` times the mode's, and an unbounded step in ``log s`` reached -30
#: (heights, n = 1e4, from ``mu = 0, sigma = 50``, noise-free). Fisher scoring with the expected
#: information of a Normal's log scale (2 per row) moves it by ``(r - 1) / 2 > -0.5`` for a
#: variance ratio ``r``, hence 0.5. Measured (heights, 4 seeds, RMS error in posterior sd at
#: epsilon 1 / 2 / noise-free, before :data:`_CAPPED_SPLIT`): 0.25 gave 63 / 64 / -, 0.35
#: 21-25 / 22-25 / -, 0.5 5-10 / 5-14 / 0.6-1.2, 1.0 31-422 / 10-1277 / 164-210.
#: ``math.inf`` turns it off.
_SCALE_STEP = 0.5
#: The cap above grows by this factor after a capped step that fell short (:func:`_short`), up
#: to ``_RADIUS_MAX``, and returns to ``_SCALE_STEP`` after any other step: a bounded
#: coordinate far from its mode with a right metric (a Bernoulli's log odds from 0 for p =
#: 0.05, 3 units) otherwise crawls at 0.5 a step. Measured (``private_warm_start``, 20% share,
#: 8 seeds, RMS error in posterior sd, growth 1 -> 2): Beta-Bernoulli n = 1e4, epsilon 1,
#: p = 0.05: 7.1 -> 0.96; p = 0.01: 9.4 -> 8.6 (rare events stay hard); the far heights case
#: (``tests/test_warmstart_scale.py``) epsilon 1: 1.78 -> 1.36, epsilon 2: 0.76 -> 0.93; the
#: peer_probe models at n = 1e4, epsilon 6: heights 0.355 -> 0.383, poisson_reg 0.380 ->
#: 0.369, the others bit-identical.
_RADIUS_GROWTH = 2.0
_RADIUS_MAX = 8.0
#: After a capped step the next step of the schedule runs as this many steps, each with its
#: share of the step's ``mu^2`` (a piece is not split again): a scale far from its mode needs
#: several capped steps (heights: up 1 unit while the mean is far, down 2.6), and far steps
#: need little precision. Measured (as :data:`_SCALE_STEP`, 6 seeds, epsilon 1 / 2 /
#: noise-free): 1 (no split) gave RMS 11.7 / 11.7 / 6.8, 2 gave 1.7 / 1.6 / 0.49, 3 gave 3.8 /
#: 2.0 / 0.44.
_CAPPED_SPLIT = 2

#: Levenberg-Marquardt damping of each Fisher step, ``(P + lambda diag(P))^-1 ascent``
#: (read at the call). 0, the default, takes the Fisher step itself. A comparison hook: on a
#: Gamma regression whose warm start ends 103-191 posterior sds from the mode (the rows'
#: score covariance nearly singular there, the moves nearly across the slope), 1 brought it
#: to 0.06 sds at ``mu = 100`` but only to 52 at ``mu = 0.22``
#: (``benchmarks/results/warm_start_trace_gamma1_damping.txt``); over 8 models it is mixed
#: (``benchmarks/results/warm_start_trace_damping.txt``; docs/benchmarks.md, seventh session).
DAMPING = 0.0
#: The next metric is released as a pilot's (scale-free, in the last metric) only when the
#: capped step was more than this many times :data:`_SCALE_STEP`: a step a little over the cap
#: is a metric that is right but far from the mode (a Poisson log rate from 2 for 40: its
#: scores' spread does not depend on the rate), and a pilot's tenfold safety factor would only
#: shorten the next step. Measured (6 seeds, epsilon 1 / 2, RMS sd): heights 1.7 / 1.6 for 1,
#: 2.1 / 1.1 for 2; that Poisson (Gamma(2, 1) prior, n = 1e4) 48 / 56 for 1, 1.6 / 0.40 for 2,
#: against 1.9 / 0.47 with no cap at all.
_REPILOT_STEPS = 2.0
#: The curvature releases after the pilot are pooled (weighted by their precision) while each
#: new one is within this many times the spectral norm their noise alone would give (``sqrt(d)``
#: noise sds, about, for the difference of two); a larger gap starts a new pool.
_POOL_GAP = 3.0


class Scoring(NamedTuple):
    """Result of :func:`fisher_scoring` (post-processing of its releases)."""

    #: The estimated mode.
    mode: np.ndarray
    #: The estimated posterior precision.
    precision: np.ndarray
    #: The gradient clip a further step would use (in the per-datapoint Fisher metric).
    clip: float
    #: The last released clipped fraction, None when no count was released.
    clipped_fraction: float | None
    #: Each step's gradient clip, then ``clip``.
    clip_history: tuple[float, ...]
    #: ``n`` (substitute-one) or its released count (add/remove-one).
    n_rows: float


def warm_start_schedule(mu: float, steps: int) -> list[tuple[float, float]]:
    """Per-step ``(mu_gradient, mu_curvature)`` whose squares sum to ``mu^2``.

    The curvature releases get 30% of ``mu^2`` in equal parts; the gradient release of step
    ``k`` gets a share of the rest proportional to ``1.6^k``.

    Parameters
    ----------
    mu : float
        Total Gaussian-DP ``mu`` of the warm start, ``> 0``.
    steps : int
        Number of Fisher-scoring steps, ``>= 1``.

    Returns
    -------
    list of (float, float)
    """
    weights = _GROWTH ** np.arange(steps, dtype=np.float64)
    grad_mu2 = mu**2 * (1.0 - _CURVATURE_SHARE) * weights / weights.sum()
    curv_mu = math.sqrt(mu**2 * _CURVATURE_SHARE / steps)
    return [(math.sqrt(m2), curv_mu) for m2 in grad_mu2]


def _release_outer(outer: np.ndarray, sd: float, noise: np.random.Generator) -> np.ndarray:
    """Release a symmetric matrix with noise sd ``sd`` on its Frobenius-isometric vector
    (the upper triangle, off-diagonal entries scaled by ``sqrt(2)``): the diagonal with sd
    ``sd``, each off-diagonal entry with ``sd / sqrt(2)``, each on its grid
    (:func:`pymc_penalty.privacy.precision.gaussian_release`)."""
    d = outer.shape[0]
    iu = np.triu_indices(d, 1)
    diag = gaussian_release(np.diag(outer), sd, noise)
    off = gaussian_release(outer[iu], sd / math.sqrt(2.0), noise)
    released = np.diag(diag)
    released[iu] = off
    released[(iu[1], iu[0])] = off
    return released


def _floor_eigenvalues(sym: np.ndarray, noise_sd: float) -> np.ndarray:
    """A released symmetric matrix made positive definite: eigenvalues floored at
    ``_FLOOR sqrt(d)`` noise sds (the noise matrix's spectral norm is about ``2 sqrt(d)`` of
    them: below that an eigenvalue is mostly noise, and a near-zero one would send a scoring
    step far away)."""
    vals, vecs = np.linalg.eigh(0.5 * (sym + sym.T))
    floor = max(_FLOOR * math.sqrt(sym.shape[0]) * noise_sd, 1e-12 * float(np.max(np.abs(vals))))
    return (vecs * np.maximum(vals, floor)) @ vecs.T


class _Release(NamedTuple):
    """One curvature release, per pair: its estimate of the per-datapoint Fisher information
    (in the model's coordinates), its noise sd in the metric it was clipped in, that metric."""

    mean: np.ndarray
    sd: float
    chol: np.ndarray


def _pooled_curvature(pool: list[_Release], chol: np.ndarray) -> tuple[np.ndarray, float]:
    """The curvature releases in ``pool`` whitened in ``chol`` and averaged by precision, and
    the pooled noise sd there. A release clipped in the metric ``L`` has its noise multiplied by
    at most ``||chol^-1 L||^2`` in ``chol``'s whitening; that bound sets its weight, so a
    release from a metric far from this one counts little. Post-processing of releases."""
    inv = np.linalg.inv(chol)
    total, weight = np.zeros_like(chol), 0.0
    for release in pool:
        w = 1.0 / (release.sd * np.linalg.norm(inv @ release.chol, 2) ** 2) ** 2
        total += w * (inv @ release.mean @ inv.T)
        weight += w
    white = total / weight
    return 0.5 * (white + white.T), 1.0 / math.sqrt(weight)


def _pool_curvature(
    pool: list[_Release], release: _Release, chol: np.ndarray
) -> tuple[list[_Release], np.ndarray, float]:
    """``release`` added to ``pool``, or a new pool when the two differ, in ``chol``'s
    whitening, by more than ``_POOL_GAP`` times the spectral norm their noise alone would give
    (``sqrt(d)`` noise sds, about): the information changed (a curvature that varies, far from
    the mode). Returns the pool and its :func:`_pooled_curvature` in ``chol``."""
    if pool:
        white, sd = _pooled_curvature(pool, chol)
        new, new_sd = _pooled_curvature([release], chol)
        gap = float(np.linalg.norm(new - white, 2))
        if gap <= _POOL_GAP * math.sqrt(chol.shape[0] * (sd**2 + new_sd**2)):
            pool = [*pool, release]
            return (pool, *_pooled_curvature(pool, chol))
    return ([release], *_pooled_curvature([release], chol))


def _prior_precision(prior_hess: np.ndarray) -> np.ndarray:
    """The positive semi-definite part of minus the prior's Hessian."""
    vals, vecs = np.linalg.eigh(-0.5 * (prior_hess + prior_hess.T))
    return (vecs * np.maximum(vals, 0.0)) @ vecs.T


def _slopes(
    ascent: np.ndarray, step: np.ndarray, last_slope: float, noise_dir: np.ndarray
) -> tuple[float, float] | None:
    """The released slope along the last step at its end and at its start, when both exceed
    :data:`_SHORT_SES` of the slope's noise sd (``noise_dir``); None otherwise (near the mode
    the slopes are noise)."""
    slope = float(ascent @ step)
    noise = _SHORT_SES * float(np.linalg.norm(noise_dir))
    return (slope, last_slope) if slope > noise and last_slope > noise else None


def _short(slopes: tuple[float, float] | None) -> bool:
    """Whether the last step fell short: its significant slope (:func:`_slopes`) kept over
    :data:`_SHORT_KEPT` of its size."""
    return slopes is not None and slopes[0] > _SHORT_KEPT * slopes[1]


def _stretch(slopes: tuple[float, float] | None, last: float) -> float:
    """The factor on the next Fisher step from the secant along the last one (which was
    ``last`` times its Fisher step): a step whose slope fell from ``s0`` to ``s1`` used a
    metric ``last / (1 - s1 / s0)`` times the curvature along it (1 for a Newton step on a
    quadratic). Used only when both slopes are significant (:func:`_slopes`) and, unless
    already stretching (``last > 1``), the step fell short (:func:`_short`); at most
    :data:`_STRETCH_GROWTH` times ``last`` and :data:`_STRETCH_MAX` in all, never below 1;
    otherwise 1."""
    if slopes is None or not (last > 1.0 or _short(slopes)):
        return 1.0
    kept = min(slopes[0] / slopes[1], 1.0 - 1.0 / _STRETCH_GROWTH)
    return min(max(last / (1.0 - kept), 1.0), _STRETCH_MAX)


def _overshot(
    ascent: np.ndarray, step: np.ndarray, last_slope: float, noise_dir: np.ndarray
) -> bool:
    """Whether the slope along the last step reversed by more than the last slope plus three
    noise sds (``noise_dir``: the release noise's sd times the step's whitened image)."""
    slope = float(ascent @ step)
    return slope < -(abs(last_slope) + 3.0 * float(np.linalg.norm(noise_dir)))


def _backtrack(
    ascent: np.ndarray, step: np.ndarray, last_slope: float, noise_dir: np.ndarray, guess: bool
) -> float | None:
    """The share of the last step to go back to, or None to keep it (releases only).

    A step that overshot (:func:`_overshot`) goes back to a quarter of itself. A step that
    was a guess (``guess``: stretched by :func:`_stretch`, or capped at a grown radius) also
    goes back when its slope reversed beyond :data:`_GUESS_SES` noise sds (``noise_dir``, as
    :func:`_overshot`'s) and beyond :data:`_GUESS_REVERSAL` of its slope at the start
    (``last_slope``), to the secant's zero of the slope along it, ``s0 / (s0 - s1)``, at most
    a half: the clipped slopes understate a far point's (its rows clipped), so the reversal
    of a guess that went much too far can stay within the last slope, which
    :func:`_overshot` asks for."""
    if _overshot(ascent, step, last_slope, noise_dir):
        return 0.25
    slope = float(ascent @ step)
    bar = max(_GUESS_SES * float(np.linalg.norm(noise_dir)), _GUESS_REVERSAL * last_slope)
    if guess and last_slope > 0.0 and slope < -bar:
        return min(last_slope / (last_slope - slope), 0.5)
    return None


def settled_clip(d: int, target: float = _AUTO_CLIP_TAIL) -> float:
    """Where ``clip="auto"``'s gradient clip settles on Gaussian scores aiming at clipped
    fraction ``target``: the length in the per-datapoint Fisher metric that ``target`` of
    ``chi_d``-distributed lengths exceed, never below the start (``target`` 0.1%, the default,
    which is the start itself: the found clip only moves down to its start)."""
    return math.sqrt(float(stats.chi2.isf(min(target, _AUTO_CLIP_TAIL), d)))


def warm_start_clips(clip: float | str, d: int) -> tuple[float, float]:
    """Clips ``(C_gradient, C_difference)`` in the metric of the estimated per-datapoint
    Fisher information.

    There a gradient near the mode has squared length about ``chi^2_d`` and a difference of
    two rows twice that; ``"auto"`` clips at the 99.9% quantile (about 0.1% of the rows are
    clipped when the metric is right), a number ``C`` at ``(C, sqrt(2) C)``.

    Parameters
    ----------
    clip : float or "auto"
    d : int
        Number of unconstrained parameters.

    Returns
    -------
    (float, float)
    """
    c = settled_clip(d) if clip == "auto" else float(clip)
    return c, math.sqrt(2.0) * c


def fisher_scoring(
    row_grads: Callable[[np.ndarray], np.ndarray] | RowStatistics,
    prior: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
    x: np.ndarray,
    n: int | None,
    *,
    schedule: list[tuple[float, float]],
    neighbours: Neighbours,
    clip: float | str,
    noise: np.random.Generator,
    commit: Callable[[float], None],
    transformed: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Private Fisher scoring with every per-datapoint bound stated in a released metric.

    Step 0 starts with no metric: it releases the spatial-sign shape of the row differences
    (normalised, so scale-free) and the mean log length of the differences in that shape
    (bounded in log units), which give the first metric. Every later step releases the
    outer-product sum of the differences clipped in the previous step's metric; the releases
    since the last pilot are pooled, each weighted by its noise in the current metric
    (:func:`_pooled_curvature`; a release that disagrees with the pool beyond its noise starts a
    new one), which gives the next metric. Each step then releases the sum of the gradients
    clipped in the new metric and moves to
    ``x + (n P + prior precision)^-1 (sum g + prior gradient)``. The metric is public: a
    function of earlier releases only. See :mod:`pymc_penalty.warmstart.releases` for the
    statistics and their sensitivities.

    Parameters
    ----------
    row_grads : callable or RowStatistics
        ``row_grads(x) -> (n, d)`` per-datapoint gradients at ``x``, every row finite (a data
        access), or the data's sums directly
        (:class:`~pymc_penalty.warmstart.statistics.RowStatistics`: the only way the loop reads
        the data; a callable is wrapped in a
        :class:`~pymc_penalty.warmstart.statistics.RowGradients`, which computes the gradients
        once per step and drops them after the step's releases).
    prior : callable
        ``prior(x) -> (gradient, Hessian)`` of the log prior (no data).
    x : ndarray, shape (d,)
        Data-independent start.
    n : int or None
        Number of rows (used as such only under substitute-one, where it is public; under
        add/remove-one a noisy count is released). With a ``RowStatistics`` it is ignored:
        its :meth:`~pymc_penalty.warmstart.statistics.RowStatistics.rows` says it.
    schedule : list of (float, float)
        :func:`warm_start_schedule`.
    neighbours : Neighbours
    clip : float or "auto"
        :func:`warm_start_clips`. With ``"auto"`` that is the first step's clip; from the
        second step on each gradient release also releases a noisy count of the rows it
        clipped (5% of the step's gradient ``mu^2``, split as the sampler splits
        its step, :func:`pymc_penalty.accounting.gdp.split_step_mu`), and when the released
        fraction (over ``n``, or over the released count under add/remove-one) differs from
        the target by more than two of its noise sds the next step's clip moves by the
        sampler's Gaussian-tail rule (:func:`pymc_penalty.sampling.adaptation.clip.tail_factor`):
        up by
        at most 4 times, down by at most its factor for half the target (about 6%) and never
        below the start. Too small a clip biases the mode (several posterior sd), too large
        a one only adds noise in proportion, and the rule's own floor (halve the clip when the
        count is near zero) fired on the counts' noise in 3 of 20 seeds of the logistic
        regression below, costing up to 4.8 sd. Counts move the clip only near the mode (the
        released whitened mean within ``_NEAR_MODE``); they are of the rows centred on their
        released mean. The first step's gradient is not counted: it is measured in the
        pilot metric (inflated on purpose) at the data-independent start.

        Far from the mode every row is clipped in one direction and a step moves at most
        about the clip in per-datapoint sds. After ``_FAR_STEPS`` (3) consecutive far steps
        (the released whitened mean, less its noise, at least ``_FAR_SHARE`` (0.95) of the clip
        used; the first step, in the pilot metric, not counted) the next gradient release
        clips at ``_TRAVEL_GROWTH`` (16) times that clip, and again while far; the step that
        is no longer far returns to the found clip. The clip is a function of releases only,
        the noise sd grows with it and nothing more is released, so the privacy cost is
        unchanged. Iterates before and during travelling are not averaged, nor, after it,
        those before a step longer than ``_SETTLED`` (3) of its noise sds. A start that is
        never far three times running (gauss from its initial point: twice) runs exactly as
        before.
    transformed : ndarray of bool, shape (d,), optional
        The coordinates of transformed value variables (model structure, public). A step that
        would move one of them by more than ``_SCALE_STEP`` (0.5 unconstrained units: a scale
        started far from its mode, where the rows' spread underestimates its curvature many
        times) is scaled down as a whole to that; when it was over twice that, the next step's
        metric is released as
        the first one's (spatial-sign shape and mean log length, which no clip bounds), in the
        last metric's whitening, and the next step of the schedule runs as ``_CAPPED_SPLIT``
        (2) steps with its ``mu^2`` shared equally (a piece is not split again). Same releases'
        total ``mu^2``: one curvature release becomes two parts and one step two, so the
        privacy cost is unchanged. Iterates from capped steps are not averaged. None (or no
        step longer than the bound) runs exactly as before.
        With such a coordinate, two steps in a row whose released slope along them kept over
        half its size (beyond noise; not after a pilot, not while travelling) stretch the next
        Fisher step by the secant's factor (:func:`_stretch`: a scale started far too small,
        where the rows' spread overestimates the curvature), until the slopes are noise or a
        step overshoots; iterates from stretched steps are not averaged. A guessed step
        (stretched, or capped at a grown radius) whose released slope reversed beyond
        ``_GUESS_SES`` (3) noise sds and half its slope at the start goes back to the
        secant's zero along it
        (:func:`_backtrack`). Models without a transformed coordinate never guess.
    noise : numpy.random.Generator
    commit : callable
        ``commit(mu)`` charges one release before the data are evaluated (it raises to stop).

    Returns
    -------
    Scoring
        The estimated mode and posterior precision (averaged, weighted by ``mu_grad^2``, over
        the last half of the iterates: near the mode their errors are independent), the clip
        found, the last released clipped fraction and the clips used.
    """
    d = x.size
    c_grad, c_diff = warm_start_clips(clip, d)
    found = isinstance(clip, str)  # "auto": the clip moves with the released counts
    clips, fraction = [c_grad], None
    adds = neighbours is Neighbours.ADD_REMOVE
    data = (
        row_grads
        if isinstance(row_grads, RowStatistics)
        else RowGradients(row_grads, int(n), neighbours)
    )
    if data.neighbours is not neighbours:
        raise ValueError("`row_grads` forms its pairs for another neighbour relation.")
    sum_w, sum_wx, sum_wprec = 0.0, np.zeros(d), np.zeros((d, d))
    # n is public under substitute-one; under add/remove-one only its noisy count is used.
    n_hat, chol = (math.nan if adds else float(data.rows())), None
    step = last_slope = x_prev = precision = None
    travel = c_grad  # this step's gradient clip: c_grad, or larger while far from the mode
    travelled: dict[int, float] = {}
    streak = 0  # consecutive far steps (after the first)
    stretch = 1.0  # factor on the Fisher step after steps that fell far short
    from_pilot = True  # the last step was taken in a pilot's metric (or none was taken)
    armed = False  # the last step fell short: the next short one stretches
    capped, radius = False, _SCALE_STEP  # the last step was capped; the cap
    repilot = False  # the last step was capped 2 times over: this step's metric is a pilot's
    split = False  # the last step was capped: this step of the schedule runs in pieces
    has_scale = transformed is not None and bool(np.any(transformed))
    plan, pieces = list(schedule), [False] * len(schedule)
    total_mu = math.sqrt(sum(g**2 + c**2 for g, c in schedule))
    pool: list[_Release] = []  # the curvature releases since the last pilot, pooled
    k = -1
    while k + 1 < len(plan):
        k += 1
        if split and not pieces[k]:  # after a capped step: this step in pieces
            piece = tuple(m / math.sqrt(_CAPPED_SPLIT) for m in plan[k])
            plan[k : k + 1] = [piece] * _CAPPED_SPLIT
            pieces[k : k + 1] = [True] * _CAPPED_SPLIT
        mu_grad, mu_curv = plan[k]
        # Step 0 splits its curvature mu^2 over the shape, the scale (and the noisy count); so
        # does a step after a capped one (a pilot again, in the last metric: scale-free).
        pilot = k == 0 or repilot
        parts = 1 if not pilot else (3 if adds and k == 0 else 2)
        mu_parts = [mu_curv / math.sqrt(parts)] * parts
        # From the second step the found clip's count takes a share of the gradient's mu^2.
        mu_count = 0.0
        if found and k:
            mu_grad, mu_count = split_step_mu(mu_grad, _COUNT_SHARE)
        for release_mu in (*mu_parts, mu_grad, mu_count):  # this step's releases, before data
            if release_mu > 0:
                commit(release_mu)
        # The data are read from here on, through `data` only (charged above).
        if pilot:
            pool = []  # a pilot's metric is not pooled with later releases
            if adds and k == 0:  # n is private under add/remove-one: a noisy count (sensitivity 1)
                n_hat = max(snap_count(data.rows() + noise.standard_normal() / mu_parts[2]), 2.0)
            sd = outer_sensitivity(None, neighbours) / mu_parts[0]
            base = chol if k else None
            shape = _floor_eigenvalues(_release_outer(data.outer(x, base, None), sd, noise), sd)
            pairs = data.pairs(n_hat)
            shape /= np.trace(shape)
            shape_chol = np.linalg.cholesky(shape)
            if k:
                shape_chol = chol @ shape_chol
                shape = shape_chol @ shape_chol.T
            sd = log_scale_sensitivity(neighbours) / mu_parts[1]
            mean_log = gaussian_release(data.log_scale(x, shape_chol), sd, noise) / pairs
            # A Gaussian difference with covariance s * shape has E log(|w|^2/d) =
            # log s + digamma(d/2) + log(2/d); the difference's covariance is twice F's.
            # Each row's log length is clipped to [-LOG_CLIP, LOG_CLIP], so the true mean is
            # too: clip the released one to the same range (at a tiny budget its noise alone
            # could reach -800 and underflow the metric to a singular 0).
            mean_log = min(max(mean_log, -LOG_CLIP), LOG_CLIP)
            log_s = mean_log - special.digamma(d / 2.0) - math.log(2.0 / d)
            fisher = _PILOT_SAFETY * 0.5 * math.exp(log_s) * shape
        else:
            sd = outer_sensitivity(c_diff, neighbours) / mu_curv
            white = _release_outer(data.outer(x, chol, c_diff), sd, noise)
            # Per pair: an estimate of the per-datapoint Fisher information, pooled with the
            # releases before it since the last pilot, then floored in this metric.
            release = _Release(chol @ white @ chol.T / (2.0 * pairs), sd / (2.0 * pairs), chol)
            pool, pooled, pooled_sd = _pool_curvature(pool, release, chol)
            fisher = chol @ _floor_eigenvalues(pooled, pooled_sd) @ chol.T
        fisher = 0.5 * (fisher + fisher.T)
        new_chol = np.linalg.cholesky(fisher)
        used = max(travel, c_grad)
        if used > c_grad:
            travelled[k] = used
        sd = gradient_sensitivity(used, neighbours) / mu_grad
        released_sum = gaussian_release(data.gradient(x, new_chol, used), sd, noise)  # its grid
        if mu_count > 0:
            # The clipped count, sensitivity 1 and noise sd 1 / mu (as the sampler's), of the
            # rows centred on their released mean: away from the mode the rows' common mean
            # would otherwise pass for a heavy tail.
            centre = released_sum / n_hat
            count_sd = 1.0 / mu_count
            count = data.count(x, new_chol, c_grad, centre)
            count = snap_count(count + count_sd * noise.standard_normal())  # its grid
        data.forget()  # exact per-datapoint values: not kept past the releases
        if mu_count > 0:  # the next step's clip, from released values only (never the true n)
            fraction, se = count / n_hat, count_sd / n_hat
            near = float(np.linalg.norm(centre)) <= _NEAR_MODE
            target = clip_target_fraction(n_hat, mu=total_mu)
            if near and abs(fraction - target) > CLIP_EVIDENCE_SES * se:
                # Down by at most the factor for half the target, never below the start.
                factor = tail_factor(target, max(fraction, 0.5 * target))
                c_grad = max(c_grad * factor, clips[0])
                c_diff = math.sqrt(2.0) * c_grad
            clips.append(c_grad)
        prior_grad, prior_hess = prior(x)
        ascent = new_chol @ released_sum + prior_grad
        # The last step was a guess: stretched, or capped at a grown radius.
        guess = stretch > 1.0 or capped and radius > _SCALE_STEP
        noise_dir = back = None
        if step is not None:
            noise_dir = sd * new_chol.T @ step
            back = _backtrack(ascent, step, last_slope, noise_dir, guess)
        if back is not None:
            # The released slope along the last step reversed beyond its noise: the step
            # overshot (the metric, the rows' spread, underestimates the curvature far from
            # the mode, e.g. of a scale parameter), or a guess went too far. Go back to a
            # share of it (:func:`_backtrack`); this point's releases only told us so (the
            # metric keeps its last value).
            step, last_slope = back * step, back * last_slope
            x = x_prev + step
            sum_w, sum_wx, sum_wprec = 0.0, np.zeros(d), np.zeros((d, d))  # average anew
            travel, streak, stretch = c_grad, 0, 1.0
            capped, radius = False, _SCALE_STEP
        else:
            # The last step fell far short (its slope barely changed, beyond noise): the metric
            # overestimates the curvature along it (a scale started too small: the scores'
            # spread, and so the metric, is (mode / scale)^4 times too large). Not while the
            # clip travels (streak), which lengthens far steps by itself.
            # Not after a pilot's step: its metric is inflated on purpose (_PILOT_SAFETY).
            slopes = None if step is None else _slopes(ascent, step, last_slope, noise_dir)
            short = _short(slopes)
            if has_scale and not from_pilot and streak == 0:
                factor = _stretch(slopes, stretch)
                # The first short step only arms it: a lone one is the metric catching up.
                armed, stretch = factor > 1.0, factor if armed or stretch > 1.0 else 1.0
            else:
                armed, stretch = False, 1.0
            chol = new_chol
            repilot = split = False
            precision = n_hat * fisher + _prior_precision(prior_hess)
            damped = precision
            if DAMPING > 0.0:  # a comparison hook (default off: the Fisher step itself)
                damped = precision + DAMPING * np.diag(np.diag(precision))
            step = stretch * np.linalg.solve(damped, ascent)
            # A transformed coordinate moving more than _SCALE_STEP: the metric is not to be
            # trusted that far (a scale far from the mode). Scale the step down as a whole, and
            # (over twice the bound) release the next metric as the first one, scale-free.
            longest = float(np.max(np.abs(step[transformed]), initial=0.0)) if has_scale else 0.0
            # The cap grows while capped steps fall short (the slope kept, beyond noise), and
            # returns to _SCALE_STEP otherwise.
            radius = min(_RADIUS_GROWTH * radius, _RADIUS_MAX) if capped and short else _SCALE_STEP
            capped = split = longest > radius
            # The metric itself is suspect (its own step, before any stretch, is that long).
            repilot = longest > _REPILOT_STEPS * radius * stretch
            if capped:
                step = (radius / longest) * step
            last_slope, x_prev, from_pilot = float(ascent @ step), x, pilot
            x = x + step
            # Far: the rows' released whitened mean (less its noise) near the clip used.
            mean_len = float(np.linalg.norm(released_sum)) - 2.0 * math.sqrt(d) * sd
            far = k > 0 and mean_len >= _FAR_SHARE * used * n_hat
            streak = streak + 1 if far else 0
            if streak >= _FAR_STEPS or k in travelled or capped or stretch > 1.0:
                # Still far (the next clip grows), or the step that landed (its noise is the
                # larger clip's; the next clip is the found one): average anew from here.
                travel = _TRAVEL_GROWTH * used if streak >= _FAR_STEPS else c_grad
                sum_w, sum_wx, sum_wprec = 0.0, np.zeros(d), np.zeros((d, d))
                if k < len(plan) - 1:
                    continue
            elif travelled and float(step @ precision @ step) > _SETTLED**2 * sd**2 * d / n_hat:
                # After travelling, a step longer than its noise means the iterates before it
                # were not at the mode yet: average anew from this one.
                sum_w, sum_wx, sum_wprec = 0.0, np.zeros(d), np.zeros((d, d))
        if k >= len(plan) // 2 or sum_w == 0.0 and k == len(plan) - 1:
            sum_w += mu_grad**2
            sum_wx += mu_grad**2 * x
            sum_wprec += mu_grad**2 * precision
    if len(clips) == 1:
        clips *= len(plan) + 1
    else:
        clips.insert(0, clips[0])  # the first two steps used the starting clip
    for k, used in travelled.items():  # far steps used a larger gradient clip
        clips[k] = used
    return Scoring(sum_wx / sum_w, sum_wprec / sum_w, c_grad, fraction, tuple(clips), n_hat)
