"""Random-walk proposal with tuning from the chain's own history: pure NumPy, no PyMC.

During tuning two things adapt, using only released outcomes (the chain's states and the
noisy acceptance probabilities), so adaptation is post-processing and costs no privacy:

- a global scaling, steered toward ``target_accept`` by a Robbins-Monro recursion on its
  logarithm, with a gain that restarts at each adaptation window;
- the proposal's shape: at the end of each window (windows double in length, starting at
  ``tune_interval``) the proposal covariance becomes ``2.38^2 / d`` times the covariance
  (``"full"``, correlations shrunk toward zero in proportion to how few moves were accepted)
  or variances (``"diag"``) of the draws of every window pooled since the chain last
  travelled.

A window whose mean lies more than two of its own sds from the pool's mean in some coordinate
restarts the pool, so windows spent travelling from a far-away start are forgotten; the others
accumulate (one window of an autocorrelated chain gives a noisy covariance: pooling improved
the proposal's median log condition number relative to a correlated target from 1.33 to 0.95,
``tests/test_adaptation.py``).
After tuning the proposal is frozen, so the chain is a time-homogeneous Markov chain with the
exact posterior as its stationary distribution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import numpy as np
from pymc.step_methods.state import equal_dataclass_values
from scipy.special import ndtri

__all__ = [
    "ADAPT_MODES",
    "CLIP_TARGET_FRACTION",
    "PROPOSAL_KINDS",
    "ClipAdapter",
    "ProposalAdapter",
    "RW_SCALE",
    "clip_target_fraction",
    "starting_clip",
    "starting_sd",
]

ADAPT_MODES = ("full", "diag", "scaling", "none")
#: ``block``: one Gaussian move of all coordinates; ``component``: one random coordinate per
#: step; ``guided``: one random coordinate per step, moving in that coordinate's persistent
#: direction, which flips on rejection (Gustafson 1998's guided walk, coordinate-wise).
PROPOSAL_KINDS = ("block", "component", "guided")
_MAX_REDRAWS = 1000

# Minimum number of accepted moves in a window before its covariance is trusted.
_MIN_MOVES = 10
_SCALING_BOUNDS = (float(np.exp(-30.0)), float(np.exp(30.0)))
# Pseudo-moves per dimension with which a window's correlations are shrunk toward zero.
_PRIOR_MOVES_PER_DIM = 5.0
# A window whose mean is this many of its own sds from the pool's mean restarts the pool.
_TRAVEL_SDS = 2.0


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


@dataclass(eq=False)
class ProposalAdapter(_FieldwiseEq):
    """State of an adaptive multivariate normal random-walk proposal.

    Parameters
    ----------
    chol : ndarray, shape (d, d)
        Lower Cholesky factor of the base proposal covariance.
    scaling : float
        Global scaling applied to ``chol`` (stored as given, adapted multiplicatively).
    mode : {"full", "diag", "scaling", "none"}
        What adapts during tuning.
    target_accept : float
        Target mean acceptance probability for the scaling.
    window : int
        Length of the current adaptation window.
    """

    chol: np.ndarray
    scaling: float
    mode: str
    target_accept: float
    window: int
    t_window: int = 0
    moves: int = 0
    sum_x: np.ndarray = field(default_factory=lambda: np.zeros(0))
    sum_xx: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    kind: str = "block"
    max_step: float = np.inf
    directions: np.ndarray = field(default_factory=lambda: np.ones(0))
    last_coordinate: int = -1
    # Draws of the windows pooled so far (since the chain last travelled): count, accepted
    # moves, sums of x and of x x^T.
    pool_n: int = 0
    pool_moves: int = 0
    pool_sum_x: np.ndarray = field(default_factory=lambda: np.zeros(0))
    pool_sum_xx: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))

    @classmethod
    def create(
        cls,
        S: np.ndarray,
        scaling: float,
        mode: str,
        target_accept: float,
        window: int,
        kind: str = "block",
        max_step: float = np.inf,
    ) -> ProposalAdapter:
        """Build the initial state from ``S`` (sd vector or covariance matrix) and ``scaling``.

        ``max_step`` bounds every coordinate's move, ``|theta'_j - theta_j| < max_step`` (the
        arXiv paper's Theorem 1 assumes it); moves beyond it are redrawn, which keeps the
        proposal symmetric.
        """
        S = np.asarray(S, dtype=np.float64)
        chol = np.diag(S) if S.ndim == 1 else np.linalg.cholesky(S)
        d = chol.shape[0]
        return cls(
            chol=chol,
            scaling=float(scaling),
            mode=mode,
            target_accept=target_accept,
            window=int(window),
            sum_x=np.zeros(d),
            sum_xx=np.zeros((d, d)),
            pool_sum_x=np.zeros(d),
            pool_sum_xx=np.zeros((d, d)),
            kind=kind,
            max_step=float(max_step),
            directions=np.ones(d),
        )

    def propose(self, rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
        """Draw a symmetric move: ``x + scaling * chol @ z`` (block) or one coordinate."""
        if self.max_step == np.inf:
            return x + self._draw_move(rng, x.shape[0])
        for _ in range(_MAX_REDRAWS):
            move = self._draw_move(rng, x.shape[0])
            if np.all(np.abs(move) < self.max_step):
                return x + move
        raise RuntimeError(
            "No proposal within `max_step` after 1000 draws: max_step is far smaller than the "
            "proposal's scale."
        )

    def _draw_move(self, rng: np.random.Generator, d: int) -> np.ndarray:
        if self.kind == "block":
            return self.scaling * (self.chol @ rng.standard_normal(d))
        j = int(rng.integers(d))
        self.last_coordinate = j
        sd = self.scaling * float(np.sqrt(self.chol[j] @ self.chol[j]))
        z = rng.standard_normal()
        move = np.zeros(d)
        move[j] = sd * (self.directions[j] * abs(z) if self.kind == "guided" else z)
        return move

    def after_decision(self, accepted: bool) -> None:
        """Guided walk: a rejected move reverses its coordinate's direction (always, not only
        while tuning: it is part of the transition kernel)."""
        if self.kind == "guided" and not accepted and self.last_coordinate >= 0:
            self.directions[self.last_coordinate] *= -1.0

    def update(self, x: np.ndarray, accept_prob: float, moved: bool) -> None:
        """Record one tuning step: the chain's new state and the released acceptance prob."""
        if self.mode == "none":
            return
        self.t_window += 1
        gain = 1.0 / (self.t_window**0.6)
        step = gain * (accept_prob - self.target_accept) * 2.0
        self.scaling = float(np.clip(self.scaling * math.exp(step), *_SCALING_BOUNDS))
        if self.mode == "scaling":
            return
        xf = np.asarray(x, dtype=np.float64)
        self.moves += int(moved)
        self.sum_x += xf
        self.sum_xx += np.outer(xf, xf)
        if self.t_window >= self.window:
            self._end_window()

    def _pool_window(self) -> None:
        """Add the finished window's draws to the pool, or restart the pool with them when the
        chain has travelled: the pool's mean lies more than ``_TRAVEL_SDS`` of the window's own
        sd from the window's mean in some coordinate (a chain still on its way from a far start,
        whose earlier draws would inflate the covariance along its path)."""
        n = self.t_window
        mean = self.sum_x / n
        var = np.clip(np.diag(self.sum_xx) / n - mean**2, 0.0, None)
        travelled = False
        if self.pool_n > 0:
            pool_mean = self.pool_sum_x / self.pool_n
            travelled = bool(np.any(np.abs(pool_mean - mean) > _TRAVEL_SDS * np.sqrt(var)))
        if travelled:
            self.pool_n, self.pool_moves = 0, 0
            self.pool_sum_x[:] = 0.0
            self.pool_sum_xx[:] = 0.0
        self.pool_n += n
        self.pool_moves += self.moves
        self.pool_sum_x += self.sum_x
        self.pool_sum_xx += self.sum_xx

    def _end_window(self) -> None:
        """Update the proposal covariance from every window since the chain last travelled
        (accumulated, not only the last window: a short window of an autocorrelated chain
        gives a noisy covariance), then double the window."""
        self._pool_window()
        n = self.pool_n
        d = self.chol.shape[0]
        if self.pool_moves >= _MIN_MOVES:
            mean = self.pool_sum_x / n
            cov = (self.pool_sum_xx - n * np.outer(mean, mean)) / max(n - 1, 1)
            var = np.clip(np.diag(cov), 0.0, None)
            if self.mode == "diag":
                cov = np.diag(var)
            else:
                # Shrink correlations toward zero, weighted by the pooled accepted moves: a
                # window spent moving along one line (travelling from a far start) would
                # otherwise leave a nearly singular proposal that cannot leave that line.
                # Scale-free: the variances themselves are kept.
                weight = self.pool_moves / (self.pool_moves + _PRIOR_MOVES_PER_DIM * d)
                cov = weight * cov + (1.0 - weight) * np.diag(var)
            cov = cov * (RW_SCALE**2 / d)
            jitter = 1e-10 * max(float(np.max(np.diag(cov))), 1e-300)
            try:
                chol = np.linalg.cholesky(cov + jitter * np.eye(d))
            except np.linalg.LinAlgError:
                chol = None
            if chol is not None and np.all(np.isfinite(chol)) and np.all(np.diag(chol) > 0):
                self.chol = chol
                self.scaling = 1.0
        self.window *= 2
        self.t_window = 0
        self.moves = 0
        self.sum_x[:] = 0.0
        self.sum_xx[:] = 0.0


#: Random-walk scale: a tuned proposal's covariance is ``RW_SCALE^2 / d`` times the chain's.
RW_SCALE = 2.38

#: Largest clipped fraction the clip adaptation aims at (0.2% of the rows per release).
CLIP_TARGET_FRACTION = 0.002
# Clipping biases the posterior mean by about (clipped fraction) * sqrt(n) posterior sds times
# a model constant (measured on a logistic regression with n = 1e5: 0.9, 4.8 and 13.8 sds at
# 0.2%, 1% and 3% clipped; within Monte Carlo error at 0.02%), so the target shrinks as
# 1 / sqrt(n): 0.06 / sqrt(n), about 0.02% of the rows at n = 1e5.
_CLIP_BIAS_CONSTANT = 0.06
# Per-window factor by which a clip is shrunk when almost nothing was clipped.
_CLIP_SHRINK = 0.5
# A window's estimate moves the clip only when it differs from the target by this many of its
# standard errors (the counts carry the release's noise).
_CLIP_EVIDENCE_SES = 2.0
# Largest per-window growth of the clip (the Gaussian-tail rule overshoots from far below).
_CLIP_GROW = 4.0
# A probe aims at this many standard errors of a window's mean count when the target is below
# that: far enough from zero that a window which clipped nothing disagrees with the aim.
_CLIP_PROBE_SES = 4.0
# Windows in a row that must agree with the probe's aim before it is extrapolated.
_CLIP_PROBE_AGREEMENT = 2


def clip_target_fraction(n_rows: float | None) -> float:
    """Clipped fraction a found clip aims at: ``min(0.002, 0.06 / sqrt(n))``.

    The bias clipping adds to a posterior mean, in posterior sds, grows like the clipped
    fraction times ``sqrt(n)``, so the target shrinks with n. Without a public n (add/remove-one)
    it is :data:`CLIP_TARGET_FRACTION`, which :class:`ClipAdapter` then reads as one clipped
    row per release.
    """
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

    @classmethod
    def create(
        cls,
        clip: float,
        n_rows: float | None,
        count_noise_sd: float,
        window: int,
        target_fraction: float = CLIP_TARGET_FRACTION,
        growth: int = 2,
    ) -> ClipAdapter:
        """Build the adapter (arguments as in the class docstring)."""
        if not (math.isfinite(clip) and clip > 0):
            raise ValueError("`clip` must be a finite positive number.")
        if not 0.0 < target_fraction < 0.5:
            raise ValueError("`target_fraction` must lie in (0, 0.5).")
        if int(growth) < 1:
            raise ValueError("`growth` must be a positive integer.")
        return cls(
            math.log(clip), n_rows, float(count_noise_sd), int(window), target_fraction, int(growth)
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
            if abs(estimate - target) <= _CLIP_EVIDENCE_SES * se:
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
            if estimate - target > _CLIP_EVIDENCE_SES * se:
                self._restart_hold()  # still held, at a larger clip
                return _tail_factor(target, estimate)
            pooled = self.hold_counts / self.hold_releases / scale
            pooled_se = self.count_noise_sd / math.sqrt(self.hold_releases) / scale
            if pooled + _CLIP_EVIDENCE_SES * pooled_se < 0.5 * target:
                self._restart_hold()
                self.phase = "probe"
            return 1.0
        # Probe: aim at the target or, when the counts cannot resolve it, at the smallest
        # fraction they tell apart from zero with margin (a window that clipped nothing then
        # lies outside the band around the aim and moves the clip down).
        aim = min(max(target, _CLIP_PROBE_SES * se), 0.25)
        if _CLIP_EVIDENCE_SES * se >= aim:
            return 1.0  # the counts cannot tell even the largest aim from zero
        if abs(estimate - aim) > _CLIP_EVIDENCE_SES * se:
            self.agreed = 0
            return _tail_factor(aim, estimate)
        self.agreed += 1
        if aim <= target or self.agreed < _CLIP_PROBE_AGREEMENT:
            return 1.0
        self.phase = "hold"
        self.agreed = 0
        return float(ndtri(target / 2.0) / ndtri(aim / 2.0))

    def _restart_hold(self) -> None:
        self.hold_counts = 0.0
        self.hold_releases = 0


def _tail_factor(aim: float, estimate: float) -> float:
    """Factor taking a clip that clipped ``estimate`` to one that clips ``aim`` under a Gaussian
    tail, within [1/2, 4]; 1/2 when almost nothing was clipped."""
    if estimate <= aim / 20.0:
        return _CLIP_SHRINK
    f = min(estimate, 0.9)
    return min(max(float(ndtri(aim / 2.0) / ndtri(f / 2.0)), _CLIP_SHRINK), _CLIP_GROW)
