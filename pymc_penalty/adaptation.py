"""Random-walk proposal with tuning from the chain's own history: pure NumPy, no PyMC.

During tuning two things adapt, using only released outcomes (the chain's states and the
noisy acceptance probabilities), so adaptation is post-processing and costs no privacy:

- a global scaling, steered toward ``target_accept`` by a Robbins-Monro recursion on its
  logarithm, with a gain that restarts at each adaptation window;
- the proposal's shape: at the end of each window (windows double in length, starting at
  ``tune_interval``) the proposal covariance moves toward ``2.38^2 / d`` times the
  covariance (``"full"``, correlations shrunk toward zero in proportion to how few moves the
  window accepted) or variances (``"diag"``) of the draws in that window.

Doubling windows let early windows, spent travelling from a far-away start, be forgotten.
After tuning the proposal is frozen, so the chain is a time-homogeneous Markov chain with the
exact posterior as its stationary distribution.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["ADAPT_MODES", "ProposalAdapter"]

ADAPT_MODES = ("full", "diag", "scaling", "none")

# Minimum number of accepted moves in a window before its covariance is trusted.
_MIN_MOVES = 10
_LOG_SCALING_BOUNDS = (-30.0, 30.0)
# Pseudo-moves per dimension with which a window's correlations are shrunk toward zero.
_PRIOR_MOVES_PER_DIM = 5.0


@dataclass
class ProposalAdapter:
    """State of an adaptive multivariate normal random-walk proposal.

    Parameters
    ----------
    chol : ndarray, shape (d, d)
        Lower Cholesky factor of the base proposal covariance.
    log_scaling : float
        Logarithm of the global scaling applied to ``chol``.
    mode : {"full", "diag", "scaling", "none"}
        What adapts during tuning.
    target_accept : float
        Target mean acceptance probability for the scaling.
    window : int
        Length of the current adaptation window.
    """

    chol: np.ndarray
    log_scaling: float
    mode: str
    target_accept: float
    window: int
    t_window: int = 0
    moves: int = 0
    sum_x: np.ndarray = field(default_factory=lambda: np.zeros(0))
    sum_xx: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    last_x: np.ndarray | None = None

    @classmethod
    def create(
        cls,
        S: np.ndarray,
        scaling: float,
        mode: str,
        target_accept: float,
        window: int,
    ) -> ProposalAdapter:
        """Build the initial state from ``S`` (sd vector or covariance matrix) and ``scaling``."""
        S = np.asarray(S, dtype=np.float64)
        chol = np.diag(S) if S.ndim == 1 else np.linalg.cholesky(S)
        d = chol.shape[0]
        return cls(
            chol=chol,
            log_scaling=float(np.log(scaling)),
            mode=mode,
            target_accept=target_accept,
            window=int(window),
            sum_x=np.zeros(d),
            sum_xx=np.zeros((d, d)),
        )

    @property
    def scaling(self) -> float:
        """Current global scaling."""
        return float(np.exp(self.log_scaling))

    def propose(self, rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
        """Draw ``x + scaling * chol @ z`` with ``z ~ N(0, I)`` (symmetric)."""
        z = rng.standard_normal(x.shape[0])
        return x + self.scaling * (self.chol @ z)

    def update(self, x: np.ndarray, accept_prob: float, moved: bool) -> None:
        """Record one tuning step: the chain's new state and the released acceptance prob."""
        if self.mode == "none":
            return
        self.t_window += 1
        gain = 1.0 / (self.t_window**0.6)
        step = gain * (accept_prob - self.target_accept) * 2.0
        self.log_scaling = float(np.clip(self.log_scaling + step, *_LOG_SCALING_BOUNDS))
        if self.mode == "scaling":
            return
        xf = np.asarray(x, dtype=np.float64)
        self.moves += int(moved)
        self.sum_x += xf
        self.sum_xx += np.outer(xf, xf)
        if self.t_window >= self.window:
            self._end_window()

    def _end_window(self) -> None:
        n = self.t_window
        d = self.chol.shape[0]
        if self.moves >= _MIN_MOVES:
            mean = self.sum_x / n
            cov = (self.sum_xx - n * np.outer(mean, mean)) / max(n - 1, 1)
            var = np.clip(np.diag(cov), 0.0, None)
            if self.mode == "diag":
                cov = np.diag(var)
            else:
                # Shrink correlations toward zero, weighted by the window's accepted moves: a
                # window spent moving along one line (travelling from a far start) would
                # otherwise leave a nearly singular proposal that cannot leave that line.
                # Scale-free: the variances themselves are kept.
                weight = self.moves / (self.moves + _PRIOR_MOVES_PER_DIM * d)
                cov = weight * cov + (1.0 - weight) * np.diag(var)
            cov = cov * (2.38**2 / d)
            jitter = 1e-10 * max(float(np.max(np.diag(cov))), 1e-300)
            try:
                chol = np.linalg.cholesky(cov + jitter * np.eye(d))
            except np.linalg.LinAlgError:
                chol = None
            if chol is not None and np.all(np.isfinite(chol)) and np.all(np.diag(chol) > 0):
                self.chol = chol
                self.log_scaling = 0.0
        self.window *= 2
        self.t_window = 0
        self.moves = 0
        self.sum_x[:] = 0.0
        self.sum_xx[:] = 0.0
