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
from dataclasses import dataclass, field

import numpy as np

from pymc_penalty.sampling.adaptation.clip import _FieldwiseEq

__all__ = [
    "ADAPT_MODES",
    "PROPOSAL_KINDS",
    "ProposalAdapter",
    "RW_SCALE",
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
