"""The clip constant found during tuning from the released noisy clipped counts.

Split out of :mod:`pymc_penalty.sampling.adaptation` (which re-exports every name here): the clip's
starting value (:func:`starting_clip`, :func:`starting_sd`), the fraction it aims at
(:func:`clip_target_fraction`) and :class:`ClipAdapter`. Adapting the clip reads released
counts only, so it is post-processing and costs no privacy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from pymc.step_methods.state import equal_dataclass_values
from scipy.special import ndtri

__all__ = [
    "CLIP_EVIDENCE_SES",
    "CLIP_TARGET_FRACTION",
    "ClipAdapter",
    "clip_target_fraction",
    "starting_clip",
    "starting_sd",
    "tail_factor",
]


class _FieldwiseEq:
    """Equality field by field, arrays by value: PyMC compares sampling states with ``==``
    (``equal_dataclass_values``), which a dataclass holding arrays cannot answer."""

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(
            equal_dataclass_values(getattr(self, f.name), getattr(other, f.name))
            for f in fields(self)
        )

    __hash__ = None  # mutable


#: Largest clipped fraction the clip adaptation aims at (0.2% of the rows per release).
CLIP_TARGET_FRACTION = 0.002
# Clipping biases the posterior mean by about (clipped fraction) * sqrt(n) posterior sds times
# a model constant (measured on a logistic regression with n = 1e5: 0.9, 4.8 and 13.8 sds at
# 0.2%, 1% and 3% clipped; within Monte Carlo error at 0.02%), so the target shrinks as
# 1 / sqrt(n): 0.06 / sqrt(n), about 0.02% of the rows at n = 1e5.
_CLIP_BIAS_CONSTANT = 0.06
# The warm start's gradient clip (``clip_target_fraction(n, mu=...)``) aims at 0.2%
# (CLIP_TARGET_FRACTION) at ``mu n`` of _TARGET_MU_N. Clipping biases the mode by about ``0.5 f
# sqrt(n)`` posterior sds at clipped fraction ``f`` (logistic regression, n = 1e5, d = 5, exact
# Fisher metric at the mode: 4.1% clipped by the chi^2 clip gave 6.3 sd, 1% 1.4, 0.3% 0.45, 0.1%
# 0.15): 0.2% is about 0.3 sd there, the size of the release noise. That 0.2% is for a warm start
# with ``mu n`` about _TARGET_MU_N (the logistic regression above: n = 1e5, epsilon 1, mu 0.12);
# above it, it is scaled by ``1 / (mu n)``, down to ``_TARGET_RANGE[0]``, never up. The clipping
# bias grows as ``sqrt(n)`` times the clipped tail and the noise as the clip over ``mu sqrt(n)``,
# so a larger ``mu n`` wants a smaller clipped fraction; a skewed score (a Normal's log scale,
# ``(y - m)^2 / s^2 - 1``) is clipped on one side only and biased at once. Measured (the warm
# start alone, 8-12 seeds): heights (``peer_probe``) n = 1e5, epsilon 6 (mu n = 5.9e4), the
# log-scale's mean error -0.80 sd at 0.2%, -0.18 at 0.05%, -0.02 at 0.01%; logistic n = 1e4,
# epsilon 1 (mu n = 1.4e3), RMS error 1.98 at 0.2%, 1.63 at 0.5%, 1.50 at 1%; logistic n = 1e5,
# epsilon 1: 0.62 at 0.2%, 0.69 at 0.05%, 0.75 at 0.01%. Scaling up below ``mu n = 1.2e4`` helped
# the logistic regression but not the gauss workload (Gaussian scores), where the clip then stayed
# low: ``pp.sample`` at n = 1e4, epsilon 6 (8 paired noise seeds) gave warm start 0.33 sd RMS and
# result 0.52 against 0.20 and 0.32; so the target only goes down.
_TARGET_MU_N = 1.2e4
_TARGET_RANGE = (1e-4, CLIP_TARGET_FRACTION)
# Per-window factor by which a clip is shrunk when almost nothing was clipped.
_CLIP_SHRINK = 0.5
#: A window's estimate moves the clip only when it differs from the target by this many of its
# standard errors (the counts carry the release's noise).
CLIP_EVIDENCE_SES = 2.0
# Largest per-window growth of the clip (the Gaussian-tail rule overshoots from far below).
_CLIP_GROW = 4.0
# A probe aims at this many standard errors of a window's mean count when the target is below
# that: far enough from zero that a window which clipped nothing disagrees with the aim.
_CLIP_PROBE_SES = 4.0
# Windows in a row that must agree with the probe's aim before it is extrapolated.
_CLIP_PROBE_AGREEMENT = 2


def clip_target_fraction(n_rows: float | None, mu: float | None = None) -> float:
    """Clipped fraction a found clip aims at: the one rule for the sampler's and the warm
    start's clips.

    Clipping biases a posterior mean by about the clipped fraction times ``sqrt(n)``
    posterior sds (times a model constant), so the target shrinks with n.

    - The sampler's clip of the rows' log-likelihood ratios (``mu`` None):
      ``min(0.002, 0.06 / sqrt(n))``. Without a public n (add/remove-one) it is
      :data:`CLIP_TARGET_FRACTION`, which :class:`ClipAdapter` then reads as one clipped row
      per release.
    - The private warm start's clip of the rows' gradients, given its total Gaussian-DP ``mu``
      and ``n`` (public, or its released count): ``0.002 * 1.2e4 / (mu n)`` within
      ``[0.0001, 0.002]``. Its error from the noise is the clip over ``mu sqrt(n)``, so the
      bias is weighed against that; the sampler's ``sqrt(n)`` rule there cost the logistic
      regression at n = 1e5, epsilon 1 (0.019%: 0.69-0.75 sd against 0.62 at 0.2%; the
      measurements are beside ``_TARGET_MU_N`` in this module).
    """
    if mu is not None:
        low, high = _TARGET_RANGE
        return min(max(CLIP_TARGET_FRACTION * _TARGET_MU_N / (mu * n_rows), low), high)
    if n_rows is None:
        return CLIP_TARGET_FRACTION
    return min(CLIP_TARGET_FRACTION, _CLIP_BIAS_CONSTANT / math.sqrt(n_rows))


def starting_clip(n_rows: float | None, target_fraction: float = CLIP_TARGET_FRACTION) -> float:
    """Starting constant of a metric clip found by :class:`ClipAdapter`.

    In the metric of a proposal shaped like the posterior covariance, a row's log-likelihood
    ratio per unit of whitened step is about its whitened score, whose sd is ``1 / sqrt(n)``
    (the rows' scores add up to the posterior precision); a Gaussian tail then clips
    ``target_fraction`` at ``Phi^-1(1 - target / 2) / sqrt(n)``. ``n`` is public only under
    substitute-one neighbours: without it (``None``) the start is 1.
    """
    if n_rows is None:
        return 1.0
    return float(-ndtri(target_fraction / 2.0) / math.sqrt(n_rows))


def starting_sd(n_rows: float | None) -> float:
    """Starting proposal sd of every coordinate when a clip is found (``clip="auto"``):
    ``1 / sqrt(n)``, or 1 without a public n (add/remove-one).

    :func:`starting_clip` assumes a proposal shaped like the posterior, whose sds scale as
    ``1 / sqrt(n)`` for a model whose rows each inform the parameters; starting at sd 1
    instead left the first windows clipping nearly every row (on a logistic regression with
    n = 2e5 the clip climbed 4x a window to a constant 100 times its final value) while the
    scaling shrank by the same factor.
    """
    if n_rows is None:
        return 1.0
    return 1.0 / math.sqrt(float(n_rows))


@dataclass(eq=False)
class ClipAdapter(_FieldwiseEq):
    """The clip constant found from the noisy clipped counts released during tuning.

    Every penalty step releases a noisy count of the rows it clipped (``dp_clipped_count``,
    charged to the ledger), so adapting the clip from those counts is post-processing and
    costs nothing more. At the end of each window (of ``window`` releases, each ``growth``
    times longer than the last) the window's mean count estimates the clipped fraction ``f``;
    modelling a row's ratio over the bound as Gaussian, ``f = 2 Phi(-c / tau)``, the clip moves
    to the constant that clips the aimed fraction ``a``, ``c Phi^-1(a / 2) / Phi^-1(f / 2)``,
    moving by a factor between 1/2 and 4 per window; a window whose estimate lies within two
    standard errors of the aim leaves the clip alone.

    When the counts are too noisy to resolve the target (four standard errors of a window's
    mean above it), the clip is found in two phases. It first *probes*: it aims at that
    resolvable fraction, where a window that clipped nothing is told apart from the aim and
    moves the clip down (aiming at the unresolvable target itself would leave any clip that
    clips nothing where it is, however large: measured 6-9 times the right constant on a
    logistic regression, n = 1e5, which costs the square of that in effective samples). After
    two windows in a row agree with the probe's aim, the clip is extrapolated along the same
    Gaussian tail to the target, ``c Phi^-1(target / 2) / Phi^-1(aim / 2)``, and *holds*: a
    window that clipped more than the target by two standard errors (tails heavier than
    Gaussian) moves it up by the rule above, still holding; windows pooled since the clip
    last moved that say, by two of their standard errors, that it clips less than half the
    target send it back to probing. Without a public n (add/remove-one) the clip doubles or
    halves toward one clipped row per release, and the step halves (on the log scale) each
    time the direction reverses, a bisection that settles between two doublings.

    Parameters
    ----------
    clip : float
        Starting clip constant (``> 0``).
    n_rows : float or None
        Number of rows, public under substitute-one neighbours. Under add/remove-one it is
        private: pass None, and the target is one clipped row per release on average
        instead of a fraction of n.
    count_noise_sd : float
        Standard deviation of one release's count noise (``>= 0``, ``inf`` when counts are not
        released; the clip then never moves).
    window : int
        Length of the first window (``>= 1``).
    target_fraction : float
        Clipped fraction to aim at, in ``(0, 0.5)``.
    growth : int
        Factor by which each window is longer than the last (1: fixed windows).
    probe : bool, default True
        (:meth:`create`.) False starts in the hold phase and never probes: the starting clip
        is taken as extrapolated to the target already (its Gaussian-tail constant in a metric
        shaped like the posterior, e.g. a warm start's covariance) and moves only up, on counts
        of heavier tails. Probing clips the resolvable fraction on purpose, and that bias
        moves noise-limited chains: on a logistic regression (n = 1e5, ``||x|| <= 1``,
        epsilon = 1, a warm start) a probe window halved the clip, 4.3% of the rows were
        clipped for 150 tuning steps and a chain drifted 2 posterior sd from the warm start's
        estimate.
    """

    log_clip: float
    n_rows: float | None
    count_noise_sd: float
    window: int
    target_fraction: float = CLIP_TARGET_FRACTION
    growth: int = 2
    t_window: int = 0
    sum_counts: float = 0.0
    log_step: float = math.log(2.0)
    last_direction: int = 0
    history: list = field(default_factory=list)
    # "probe" (aim at a fraction the counts resolve) or "hold" (extrapolated to the target);
    # windows in a row that agreed with the probe's aim; counts and releases since the hold began.
    phase: str = "probe"
    agreed: int = 0
    hold_counts: float = 0.0
    hold_releases: int = 0
    # False: the clip never probes (it starts holding and never returns to probing).
    probes: bool = True

    @classmethod
    def create(
        cls,
        clip: float,
        n_rows: float | None,
        count_noise_sd: float,
        window: int,
        target_fraction: float = CLIP_TARGET_FRACTION,
        growth: int = 2,
        probe: bool = True,
    ) -> ClipAdapter:
        """Build the adapter (arguments as in the class docstring)."""
        if not (math.isfinite(clip) and clip > 0):
            raise ValueError("`clip` must be a finite positive number.")
        if not 0.0 < target_fraction < 0.5:
            raise ValueError("`target_fraction` must lie in (0, 0.5).")
        if int(growth) < 1:
            raise ValueError("`growth` must be a positive integer.")
        return cls(
            math.log(clip),
            n_rows,
            float(count_noise_sd),
            int(window),
            target_fraction,
            int(growth),
            phase="probe" if probe else "hold",
            probes=bool(probe),
        )

    @property
    def clip(self) -> float:
        """Current clip constant."""
        return math.exp(self.log_clip)

    def rescale(self, factor: float) -> None:
        """Multiply the clip by ``factor`` (the proposal's metric changed by that scale) and
        restart the window: its counts were made under the old metric."""
        if math.isfinite(factor) and factor > 0:
            self.log_clip += math.log(factor)
        self.t_window = 0
        self.sum_counts = 0.0
        self.agreed = 0
        self.hold_counts = 0.0
        self.hold_releases = 0

    def update(self, noisy_count: float, count_noise_sd: float | None = None) -> None:
        """Record one tuning release's noisy clipped count (and its noise sd if it changed)."""
        if count_noise_sd is not None:
            self.count_noise_sd = float(count_noise_sd)
        self.t_window += 1
        self.sum_counts += float(noisy_count)
        if self.t_window >= self.window:
            self._end_window()

    def _end_window(self) -> None:
        m = self.t_window
        scale = self.n_rows if self.n_rows is not None else 1.0 / self.target_fraction
        estimate = self.sum_counts / m / scale
        se = self.count_noise_sd / math.sqrt(m) / scale
        target = self.target_fraction
        self.window *= self.growth
        self.t_window = 0
        self.sum_counts = 0.0
        if not math.isfinite(se):
            self.history.append(self.clip)
            return
        if self.n_rows is None:
            if abs(estimate - target) <= CLIP_EVIDENCE_SES * se:
                self.history.append(self.clip)
                return
            # Without n the fraction is unknown: bisect (on the log scale) toward one row per
            # release, halving the step whenever the direction reverses.
            direction = 1 if estimate > target else -1
            if self.last_direction and direction != self.last_direction:
                self.log_step /= 2.0
            self.last_direction = direction
            factor = math.exp(direction * self.log_step)
        else:
            factor = self._public_n_factor(estimate, se, m, scale)
        self.log_clip += math.log(factor)
        self.history.append(self.clip)

    def _public_n_factor(self, estimate: float, se: float, m: int, scale: float) -> float:
        """The clip's factor at the end of a window when n is public (see the class doc)."""
        target = self.target_fraction
        if self.phase == "hold":
            self.hold_counts += estimate * m * scale
            self.hold_releases += m
            if estimate - target > CLIP_EVIDENCE_SES * se:
                self._restart_hold()  # still held, at a larger clip
                return tail_factor(target, estimate)
            pooled = self.hold_counts / self.hold_releases / scale
            pooled_se = self.count_noise_sd / math.sqrt(self.hold_releases) / scale
            if self.probes and pooled + CLIP_EVIDENCE_SES * pooled_se < 0.5 * target:
                self._restart_hold()
                self.phase = "probe"
            return 1.0
        # Probe: aim at the target or, when the counts cannot resolve it, at the smallest
        # fraction they tell apart from zero with margin (a window that clipped nothing then
        # lies outside the band around the aim and moves the clip down).
        aim = min(max(target, _CLIP_PROBE_SES * se), 0.25)
        if CLIP_EVIDENCE_SES * se >= aim:
            return 1.0  # the counts cannot tell even the largest aim from zero
        if abs(estimate - aim) > CLIP_EVIDENCE_SES * se:
            self.agreed = 0
            return tail_factor(aim, estimate)
        self.agreed += 1
        if aim <= target or self.agreed < _CLIP_PROBE_AGREEMENT:
            return 1.0
        self.phase = "hold"
        self.agreed = 0
        return float(ndtri(target / 2.0) / ndtri(aim / 2.0))

    def _restart_hold(self) -> None:
        self.hold_counts = 0.0
        self.hold_releases = 0


def tail_factor(aim: float, estimate: float) -> float:
    """Factor taking a clip that clipped ``estimate`` to one that clips ``aim`` under a Gaussian
    tail, within [1/2, 4]; 1/2 when almost nothing was clipped."""
    if estimate <= aim / 20.0:
        return _CLIP_SHRINK
    f = min(estimate, 0.9)
    return min(max(float(ndtri(aim / 2.0) / ndtri(f / 2.0)), _CLIP_SHRINK), _CLIP_GROW)
