"""Calibration from a run plan, and the expected acceptance of the penalty test.

:func:`plan_releases` counts the releases a run makes, :func:`calibrate_step_mu` spreads a
budget evenly over them, and :func:`expected_acceptance` gives the closed-form acceptance
probability that the chosen noise level costs.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import log_ndtr

from pymc_penalty.accounting._validation import _integer, _real
from pymc_penalty.accounting.gdp import _gdp_mu

__all__ = ["calibrate_step_mu", "expected_acceptance", "plan_releases"]


#: Calibrate a hair below the budget: the ledger errs only on the safe side, so an exact
#: calibration could see its last planned release refused after float rounding.
CALIBRATION_MARGIN = 1.0 - 1e-9


def calibrate_step_mu(epsilon: float, delta: float, n_releases: int) -> float:
    """Per-release ``Delta / sigma`` such that ``n_releases`` releases spend the budget.

    Equal releases compose to ``sqrt(n) mu_step``, so ``mu_step = gdp_mu(epsilon, delta) /
    sqrt(n_releases)``, taken a relative 1e-9 below that so that float rounding can never make
    the last planned release exceed the budget (a :class:`~pymc_penalty.PrivacyLedger` rounds
    every charge up).  The noise standard deviation is then ``Delta / mu_step``.

    Parameters
    ----------
    epsilon : float
        Budget ``epsilon``, in ``[0, inf)``.
    delta : float
        Budget ``delta``, in ``(0, 1)``.
    n_releases : int
        Planned releases, ``>= 1`` (see :func:`plan_releases`).

    Returns
    -------
    float
        Per-release GDP parameter.
    """
    epsilon = _real("epsilon", epsilon, low=0.0)
    delta = _real("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
    n_releases = _integer("n_releases", n_releases, low=1)
    return _gdp_mu(epsilon, delta) / math.sqrt(n_releases) * CALIBRATION_MARGIN


def plan_releases(draws: int, tune: int, chains: int, *, releases_per_step: int = 1) -> int:
    """Number of releases a run makes: ``(draws + tune) * chains * releases_per_step``.

    Tuning steps and every chain count.  ``releases_per_step`` is the number of penalty tests per
    draw (more than one when a step is split per variable).

    Parameters
    ----------
    draws, tune : int
        Draws and tuning steps per chain, ``>= 0``.
    chains : int
        Number of chains, ``>= 1``.
    releases_per_step : int, default 1
        Releases per draw, ``>= 1``.

    Returns
    -------
    int
    """
    draws = _integer("draws", draws)
    tune = _integer("tune", tune)
    chains = _integer("chains", chains, low=1)
    releases_per_step = _integer("releases_per_step", releases_per_step, low=1)
    return (draws + tune) * chains * releases_per_step


# --------------------------------------------------------------------------------------------
# expected acceptance of the penalty test
# --------------------------------------------------------------------------------------------


def expected_acceptance(r: float | np.ndarray, sigma: float | np.ndarray) -> float | np.ndarray:
    """Expected acceptance probability of the penalty test (published seed, Prop. 1).

    With exact log acceptance ratio ``r`` and noise ``N(0, sigma**2)`` on it, the penalty test
    accepts with ``min(1, exp(r + sigma Z - sigma**2 / 2))``, whose expectation is

        alpha_sigma(r) = Phi(r/sigma - sigma/2) + exp(r) Phi(-r/sigma - sigma/2),

    evaluated here as ``exp(logaddexp(...))`` of log-CDFs, so it neither overflows for large
    ``r`` nor loses the tail for very negative ``r``.  ``sigma = 0`` gives ``min(1, exp(r))``;
    the value decreases in ``sigma``.

    Parameters
    ----------
    r : float or array_like
        Exact log acceptance ratio(s); ``+-inf`` allowed, NaN not.
    sigma : float or array_like
        Noise standard deviation(s), finite and ``>= 0``; broadcast against ``r``.

    Returns
    -------
    float or numpy.ndarray
        Acceptance probabilities in ``[0, 1]`` (a float when both inputs are scalars).
    """
    r_arr = np.asarray(r, dtype=float)
    s_arr = np.asarray(sigma, dtype=float)
    if np.any(np.isnan(r_arr)):
        raise ValueError("r must not contain NaN (use -inf for an impossible proposal)")
    if not np.all(np.isfinite(s_arr) & (s_arr >= 0.0)):
        raise ValueError("sigma must contain only finite real numbers in [0, inf)")
    r_arr, s_arr = np.broadcast_arrays(r_arr, s_arr)
    noisy = s_arr > 0.0
    s_safe = np.where(noisy, s_arr, 1.0)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        x = r_arr / s_safe
        log_first = log_ndtr(x - 0.5 * s_safe)
        log_second = r_arr + log_ndtr(-x - 0.5 * s_safe)
        noisy_value = np.exp(np.minimum(np.logaddexp(log_first, log_second), 0.0))
        exact_value = np.exp(np.minimum(r_arr, 0.0))
    out = np.where(noisy, noisy_value, exact_value)
    out = np.where(np.isposinf(r_arr), 1.0, out)
    if out.ndim == 0:
        return float(out)
    return out
