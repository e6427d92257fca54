"""Shared pieces of the benchmarks: synthetic data, the PyMC model, the NumPy reference loop.

Nothing here touches private data: the data sets are synthetic and drawn from fixed seeds.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

__all__ = [
    "LogisticData",
    "NumpyPenaltyLoop",
    "blas_info",
    "logistic_model",
    "make_logistic_data",
]


@dataclass(frozen=True)
class LogisticData:
    """Synthetic logistic-regression data set.

    Attributes
    ----------
    X : ndarray, shape (n, d)
        Covariates, standard normal.
    y : ndarray, shape (n,)
        Binary outcomes (int64, 0 or 1).
    beta_true : ndarray, shape (d,)
        Coefficients the outcomes were drawn from.
    """

    X: np.ndarray
    y: np.ndarray
    beta_true: np.ndarray

    @property
    def n(self) -> int:
        """Number of datapoints."""
        return int(self.X.shape[0])

    @property
    def d(self) -> int:
        """Number of coefficients."""
        return int(self.X.shape[1])


def make_logistic_data(n: int, d: int = 10, seed: int = 20240521) -> LogisticData:
    """Draw a synthetic logistic-regression data set from a fixed seed.

    Parameters
    ----------
    n : int
        Number of datapoints.
    d : int, default 10
        Number of coefficients.
    seed : int
        Seed of the generator (the data set depends on ``n``, ``d`` and ``seed`` only).

    Returns
    -------
    LogisticData
    """
    rng = np.random.default_rng([seed, n, d])
    beta_true = rng.normal(0.0, 0.5, size=d)
    X = rng.standard_normal((n, d))
    p = 1.0 / (1.0 + np.exp(-(X @ beta_true)))
    y = (rng.random(n) < p).astype(np.int64)
    return LogisticData(X=X, y=y, beta_true=beta_true)


def logistic_model(data: LogisticData):
    """Bayesian logistic regression: ``beta ~ N(0, 1)``, ``y ~ Bernoulli(logit_p=X @ beta)``.

    Parameters
    ----------
    data : LogisticData

    Returns
    -------
    pm.Model
    """
    import pymc as pm

    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 1.0, shape=data.d)
        pm.Bernoulli("y", logit_p=data.X @ beta, observed=data.y)
    return model


class NumpyPenaltyLoop:
    """Hand-written NumPy version of the penalty step on the logistic model.

    Per step: one random-walk proposal over all coefficients, the per-datapoint
    log-likelihood at the proposal only (the current state's vector is cached), the ratios
    clipped to ``[-B, B]``, their sum plus ``N(0, sigma^2)`` noise, and the penalised test
    ``log u < d_hat - sigma^2 / 2 + log prior ratio``. The per-datapoint log-likelihood is
    ``y * eta - logaddexp(0, eta)`` with ``eta = X @ beta``: the numerically stable form,
    the same quantity as PyMC's Bernoulli ``logit_p`` log-density.

    Parameters
    ----------
    data : LogisticData
    scale : float
        Proposal standard deviation of each coefficient.
    noise_sd : float
        Privacy-noise standard deviation ``sigma``.
    clip : float or None
        ``B = clip * ||theta' - theta||_2`` (the step's default clip mode); ``None`` gives
        ``B = inf`` (the clip is still applied, as in the compiled step).
    seed : int
        Seed of the generator for proposals, noise and uniforms.
    """

    def __init__(
        self,
        data: LogisticData,
        *,
        scale: float,
        noise_sd: float,
        clip: float | None = None,
        seed: int = 1,
    ) -> None:
        self.X = np.ascontiguousarray(data.X, dtype=np.float64)
        self.y = data.y.astype(np.float64)
        self.scale = float(scale)
        self.noise_sd = float(noise_sd)
        self.clip = np.inf if clip is None else float(clip)
        self.rng = np.random.default_rng(seed)
        self.reset(data.beta_true)

    def _loglik(self, theta: np.ndarray) -> np.ndarray:
        eta = self.X @ theta
        return self.y * eta - np.logaddexp(0.0, eta)

    @staticmethod
    def _logprior(theta: np.ndarray) -> float:
        return float(-0.5 * (theta @ theta) - 0.5 * theta.size * np.log(2.0 * np.pi))

    def reset(self, theta: np.ndarray) -> None:
        """Set the current state and fill the cache (not timed as part of a step).

        Parameters
        ----------
        theta : ndarray, shape (d,)
        """
        self.theta = np.array(theta, dtype=np.float64)
        self.ll = self._loglik(self.theta)
        self.logprior = self._logprior(self.theta)
        self.n_accepted = 0
        self.n_steps = 0

    def run(self, n_steps: int) -> None:
        """Make ``n_steps`` penalty steps.

        Parameters
        ----------
        n_steps : int
        """
        rng, d, sigma = self.rng, self.theta.size, self.noise_sd
        theta, ll_cur, lp_cur = self.theta, self.ll, self.logprior
        accepted = 0
        for _ in range(n_steps):
            prop = theta + self.scale * rng.standard_normal(d)
            ll = self._loglik(prop)
            bound = self.clip * float(np.linalg.norm(prop - theta))
            d_sum = float(np.clip(ll - ll_cur, -bound, bound).sum())
            d_hat = d_sum + sigma * rng.standard_normal()
            lp = self._logprior(prop)
            if np.log(rng.uniform()) < d_hat - 0.5 * sigma**2 + lp - lp_cur:
                theta, ll_cur, lp_cur = prop, ll, lp
                accepted += 1
        self.theta, self.ll, self.logprior = theta, ll_cur, lp_cur
        self.n_accepted += accepted
        self.n_steps += n_steps

    @property
    def acceptance_rate(self) -> float:
        """Fraction of accepted proposals since the last :meth:`reset`."""
        return self.n_accepted / max(self.n_steps, 1)


def blas_info() -> dict[str, str]:
    """BLAS facts that matter for the timings.

    Returns
    -------
    dict
        ``blas_ldflags`` (PyTensor's, empty when it found no BLAS), ``pytensor_mode`` and
        ``numpy_blas``.
    """
    import pytensor

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="PyTensor could not link to a BLAS")
        ldflags = str(pytensor.config.blas__ldflags)
    try:
        numpy_blas = str(np.show_config(mode="dicts")["Build Dependencies"]["blas"]["name"])
    except Exception:  # noqa: BLE001 - informative only
        numpy_blas = "unknown"
    return {
        "blas_ldflags": ldflags,
        "pytensor_mode": str(pytensor.config.mode),
        "numpy_blas": numpy_blas,
    }
