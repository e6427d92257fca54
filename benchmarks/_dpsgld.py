"""DP-SGLD baseline for the utility benchmark: full-batch DP Langevin dynamics in NumPy.

Model: logistic regression with a ``N(0, 1)`` prior on every coefficient (as in
:func:`_common.logistic_model`). Each step releases the sum of the per-example
log-likelihood gradients, each clipped to L2 norm ``C``, plus ``N(0, sigma^2 I)``. Under
substitute-one neighbours the L2 sensitivity of that sum is ``2C`` (``C`` for add/remove),
so a step is a Gaussian mechanism with noise multiplier ``sigma / Delta``. The run's
privacy is accounted by ``dp-accounting``'s PLD accountant on
``SelfComposedDpEvent(GaussianDpEvent(sigma / Delta), T)``; the relation's ``Delta`` is
passed explicitly with ``ADD_OR_REMOVE_ONE`` (for a plain Gaussian the sensitivity carries
the relation). Full batch: no subsampling, so no amplification to account for.

The update is unadjusted Langevin, ``theta += (eta / 2) (grad log prior + released sum) +
extra``. The privacy noise contributes ``(eta / 2) sigma`` per coordinate; the step size is
set to ``eta = min(eta_max, 4 / sigma^2)`` and ``extra ~ N(0, eta - (eta sigma / 2)^2)``, so
the total noise is exactly Langevin's (the privacy noise is part of it, as in "privacy for
free" SGLD) and never more. ``eta_max`` keeps the discretisation error small: a tenth of the
inverse of a public smoothness bound, ``0.25 n + 1`` (standardised covariates, Bernoulli
log-likelihood curvature at most 1/4 per unit squared covariate norm).

Every chain starts at zero (data-independent); the first ``burn_share`` of the steps is
discarded, and every step, burn-in included, is paid for.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import dp_accounting
import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant

__all__ = ["DPSGLDRun", "dpsgld_epsilon", "dpsgld_noise_multiplier", "run_dpsgld"]

_ADD_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


def dpsgld_epsilon(noise_multiplier: float, steps: int, delta: float) -> float:
    """Epsilon of ``steps`` Gaussian releases with this noise multiplier (PLD accountant).

    Parameters
    ----------
    noise_multiplier : float
        ``sigma / Delta`` with ``Delta`` the L2 sensitivity under the relation in use.
    steps : int
    delta : float

    Returns
    -------
    float
    """
    accountant = pld_privacy_accountant.PLDAccountant(neighboring_relation=_ADD_REMOVE)
    event = dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(noise_multiplier), steps)
    accountant.compose(event)
    return float(accountant.get_epsilon(delta))


@functools.lru_cache(maxsize=64)
def dpsgld_noise_multiplier(epsilon: float, delta: float, steps: int) -> float:
    """Smallest noise multiplier (to 0.2%) whose ``steps`` releases spend at most ``epsilon``.

    Bisection on the PLD accountant's epsilon, started from the closed-form Gaussian-DP
    value.
    """
    from pymc_penalty.accounting import gdp_mu

    guess = math.sqrt(steps) / gdp_mu(epsilon, delta)
    lo, hi = 0.8 * guess, 1.25 * guess
    while dpsgld_epsilon(hi, steps, delta) > epsilon:
        lo, hi = hi, 1.5 * hi
    while dpsgld_epsilon(lo, steps, delta) <= epsilon:
        lo, hi = 0.7 * lo, lo
    while hi / lo > 1.002:
        mid = math.sqrt(lo * hi)
        if dpsgld_epsilon(mid, steps, delta) <= epsilon:
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True)
class DPSGLDRun:
    """Draws and settings of one DP-SGLD run.

    Attributes
    ----------
    draws : ndarray, shape (k, d)
        Thinned post-burn-in states.
    epsilon : float
        Spent epsilon by the PLD accountant (at the run's delta).
    steps, noise_multiplier, eta : float
        Releases, ``sigma / Delta`` and the step size used.
    extra_noise_sd : float
        Sd of the noise added on top of the privacy noise (0 when the privacy noise is all
        of Langevin's).
    """

    draws: np.ndarray
    epsilon: float
    steps: int
    noise_multiplier: float
    eta: float
    extra_noise_sd: float


def _clipped_grad_sum(
    X: np.ndarray, y: np.ndarray, x_norms: np.ndarray, theta: np.ndarray, clip: float
) -> np.ndarray:
    """Sum of the per-example gradients ``(y_i - p_i) x_i``, each clipped to norm ``clip``."""
    resid = y - 0.5 * (1.0 + np.tanh(0.5 * (X @ theta)))  # y - sigmoid, overflow-free
    scale = resid * np.minimum(1.0, clip / np.maximum(np.abs(resid) * x_norms, 1e-300))
    return scale @ X


def run_dpsgld(
    X: np.ndarray,
    y: np.ndarray,
    *,
    epsilon: float,
    delta: float,
    rng: np.random.Generator,
    clip: float = 3.0,
    neighbours: str = "substitute",
    max_steps: int = 6000,
    burn_share: float = 0.25,
    keep: int = 2000,
) -> DPSGLDRun:
    """Run full-batch DP Langevin dynamics from zero under an ``(epsilon, delta)`` budget.

    The number of steps is the largest (up to ``max_steps``) for which the calibrated
    privacy noise does not exceed Langevin's at ``eta_max``, so the chain is never hotter
    than the posterior.

    Parameters
    ----------
    X, y : ndarray
        Covariates (n, d) and binary outcomes (n,).
    epsilon, delta : float
    rng : numpy.random.Generator
    clip : float, default 3.0
        L2 clip of each per-example gradient.
    neighbours : {"substitute", "add_remove"}
    max_steps : int
    burn_share : float
    keep : int
        Number of post-burn-in draws kept (evenly thinned).

    Returns
    -------
    DPSGLDRun
    """
    n, d = X.shape
    sens = (2.0 if neighbours == "substitute" else 1.0) * clip
    eta_max = 0.1 / (0.25 * n + 1.0)
    from pymc_penalty.accounting import gdp_mu

    # Privacy noise sd sigma = Delta sqrt(T) / mu (Gaussian DP); Langevin's, 2 / sqrt(eta).
    steps = int(min(max_steps, max(100, (gdp_mu(epsilon, delta) / sens) ** 2 * 4.0 / eta_max)))
    z = dpsgld_noise_multiplier(epsilon, delta, steps)
    sigma = z * sens
    eta = min(eta_max, 4.0 / sigma**2)
    extra_sd = math.sqrt(max(eta - (0.5 * eta * sigma) ** 2, 0.0))
    spent = dpsgld_epsilon(z, steps, delta)

    yf = y.astype(np.float64)
    x_norms = np.sqrt(np.einsum("ij,ij->i", X, X))
    theta = np.zeros(d)
    burn = int(burn_share * steps)
    kept_idx = set(np.linspace(burn, steps - 1, min(keep, steps - burn)).astype(int).tolist())
    draws = []
    for t in range(steps):
        released = _clipped_grad_sum(X, yf, x_norms, theta, clip) + sigma * rng.standard_normal(d)
        theta = theta + 0.5 * eta * (released - theta) + extra_sd * rng.standard_normal(d)
        if t in kept_idx:
            draws.append(theta.copy())
    return DPSGLDRun(
        draws=np.asarray(draws),
        epsilon=spent,
        steps=steps,
        noise_multiplier=z,
        eta=eta,
        extra_noise_sd=extra_sd,
    )
