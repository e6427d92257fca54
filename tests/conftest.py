"""Shared fixtures and statistical checks for the test suite."""

from __future__ import annotations

import warnings

import arviz as az
import numpy as np
import pytest
from scipy import stats

from pymc_penalty import NotPrivateWarning


def pytest_configure(config: pytest.Config) -> None:
    warnings.filterwarnings("ignore", category=NotPrivateWarning)


def _mcse(draws: np.ndarray) -> float:
    """Monte Carlo standard error of the mean of (chain, draw) samples."""
    return float(np.asarray(az.mcse(np.asarray(draws, dtype=np.float64), method="mean")).item())


def thinned(draws: np.ndarray) -> np.ndarray:
    """Thin (chain, draw) samples to near-independence using the bulk ESS.

    Keeps every k-th draw of each chain with k = ceil(2 * total / ESS), so the retained
    draws are (very nearly) independent and a KS test is valid.
    """
    ess = float(az.ess(np.asarray(draws)))
    total = draws.size
    k = max(1, int(np.ceil(2.0 * total / max(ess, 1.0))))
    return np.asarray(draws)[:, ::k].ravel()


def posterior_check(
    draws: np.ndarray, cdf, true_mean: float, *, ks_alpha: float = 1e-3, n_mcse: float = 4.0
) -> tuple[bool, str]:
    """KS test on thinned draws against ``cdf`` and ``|mean - truth| < n_mcse * MCSE``.

    Parameters
    ----------
    draws : ndarray, shape (chains, draws)
    cdf : callable
        Exact posterior CDF.
    true_mean : float
        Exact posterior mean.

    Returns
    -------
    (bool, str)
        Whether both checks pass, and a description with the figures.
    """
    draws = np.asarray(draws, dtype=np.float64)
    mcse = _mcse(draws)
    err = abs(float(draws.mean()) - true_mean)
    sample = thinned(draws)
    p = float(stats.kstest(sample, cdf).pvalue)
    ok = p > ks_alpha and err < n_mcse * mcse
    return ok, f"KS p={p:.3g} on {sample.size} thinned draws; |mean err|={err:.3g}, MCSE={mcse:.3g}"


def data_strings(values: np.ndarray) -> list[str]:
    """A few ways a data value could be printed (precise enough never to collide by chance)."""
    out = []
    for v in np.asarray(values, dtype=float).ravel():
        out += [f"{v:.6f}", f"{v:.8g}", repr(float(v))]
    # Short forms (a round neighbour such as 10 prints as "10") occur by chance inside
    # unrelated figures ("0.103"); only forms of five or more characters are distinctive.
    return [s for s in out if len(s) >= 5]


def leaked_strings(text: str, values: np.ndarray) -> list[str]:
    """The printed forms of ``values`` that occur in ``text`` (empty when nothing leaked)."""
    return [s for s in data_strings(values) if s in text]
