"""Shared fixtures and statistical checks for the test suite."""

from __future__ import annotations

import re
import warnings

import arviz as az
import numpy as np
import pytest
from scipy import stats

from pymc_penalty import NotPrivateWarning


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--runslow",
        action="store_true",
        default=False,
        help="also run the tests marked slow (CI, .ci/run, passes it)",
    )


def pytest_configure(config: pytest.Config) -> None:
    warnings.filterwarnings("ignore", category=NotPrivateWarning)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the tests marked ``slow`` unless ``--runslow`` is given (pymc-extras' convention)."""
    if config.getoption("--runslow"):
        return
    skip_slow = pytest.mark.skip(reason="slow: run with --runslow (CI does)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)


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


#: A number as text: digits with an optional point, sign and exponent.
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
#: Significant digits from which a printed number identifies a data value (a report's figures,
#: printed to 3-4 digits, coincide with data values by chance; six digits do about once in
#: 1e6 pairs, and a number printed to its full precision never does).
_DISTINCT_DIGITS = 6


def _significant_digits(token: str) -> int:
    mantissa = re.split("[eE]", token)[0].lstrip("+-").replace(".", "")
    return len(mantissa.lstrip("0"))


def leaked_strings(text: str, values: np.ndarray) -> list[str]:
    """The numbers in ``text`` that print a value of ``values`` (empty when nothing leaked).

    Every number in the text is read whole (a token), with as many significant digits ``s`` as
    it was printed with; it prints a data value ``v`` when ``|v|`` rounded to ``s`` significant
    digits equals it in magnitude (any precision from six digits up: ``.6f``, NumPy's eight
    decimals, ``repr``, a ``.9f`` coordinate). Whole tokens, compared at their own precision,
    never match by chance inside a longer unrelated figure (a substring match of ``.6f``
    forms against 8-decimal posterior draws did in about 1 run of 800).
    """
    values = np.abs(np.asarray(values, dtype=float).ravel())
    rounded: dict[int, set[float]] = {}
    found = []
    for token in set(_NUMBER.findall(text)):
        digits = _significant_digits(token)
        if digits < _DISTINCT_DIGITS:
            continue
        if digits not in rounded:
            rounded[digits] = {float(f"{v:.{digits}g}") for v in values}
        if abs(float(token)) in rounded[digits]:
            found.append(token)
    return sorted(found)


class SpendRecorder:
    """A ledger stand-in that records every ``mu^2`` it is asked to spend and allows it."""

    def __init__(self) -> None:
        self.spent: list[float] = []

    def try_spend(self, mu2: float) -> bool:
        self.spent.append(mu2)
        return True
