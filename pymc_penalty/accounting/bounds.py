"""Looser comparison bounds for compositions of Gaussian releases.

zCDP (:func:`zcdp_epsilon`, :func:`zcdp_rho`), RDP (:func:`rdp_epsilon`), the classical
Gaussian-mechanism bound with advanced composition (:func:`classical_gaussian_epsilon`,
:func:`advanced_composition`), and the two functions that put them side by side with the tight
GDP accounting of :mod:`pymc_penalty.accounting.gdp`: :func:`gaussian_epsilon` (``epsilon`` of
a given number of releases) and :func:`iterations_allowed` (releases that fit a budget).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import expit

from pymc_penalty.accounting.gdp import _gdp_epsilon, _gdp_mu
from pymc_penalty.validation import check_choice, check_integer, check_real

__all__ = [
    "advanced_composition",
    "classical_gaussian_epsilon",
    "gaussian_epsilon",
    "iterations_allowed",
    "rdp_epsilon",
    "zcdp_epsilon",
    "zcdp_rho",
]

Accountant = Literal["gdp", "zcdp", "rdp", "advanced"]
RdpConversion = Literal["improved", "standard"]
PerStepBound = Literal["classical", "tight"]

_ACCOUNTANTS = ("gdp", "zcdp", "rdp", "advanced")
# Relative slack on a budget's mu**2 when counting whole releases: absorbs round-off (for
# instance from calibrate_step_mu) and is far below any meaningful change in delta.
_BUDGET_SLACK = 1e-10


def zcdp_epsilon(rho: float, delta: float) -> float:
    """``epsilon`` of ``rho``-zCDP at ``delta``: ``rho + 2 sqrt(rho log(1/delta))``.

    The standard conversion of Bun and Steinke (2016, Proposition 1.3), which is also the one
    the published seed uses (its Lemma 3 with ``chi = 0``).  A Gaussian release with
    ``mu = Delta / sigma`` is ``mu**2 / 2``-zCDP.

    Parameters
    ----------
    rho : float
        zCDP parameter, in ``[0, inf)``.
    delta : float
        Target ``delta``, in ``(0, 1)``.

    Returns
    -------
    float
        ``epsilon``.
    """
    rho = check_real("rho", rho, low=0.0)
    delta = check_real("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
    return rho + 2.0 * math.sqrt(rho * -math.log(delta))


def zcdp_rho(epsilon: float, delta: float) -> float:
    """Largest ``rho`` whose zCDP guarantee gives ``(epsilon, delta)`` (inverse of
    :func:`zcdp_epsilon`): ``(sqrt(L + epsilon) - sqrt(L))**2`` with ``L = log(1/delta)``.

    Parameters
    ----------
    epsilon : float
        Budget ``epsilon``, in ``[0, inf)``.
    delta : float
        Budget ``delta``, in ``(0, 1)``.

    Returns
    -------
    float
        ``rho``.
    """
    epsilon = check_real("epsilon", epsilon, low=0.0)
    delta = check_real("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
    log_inv = -math.log(delta)
    # epsilon^2 / (sqrt(L + eps) + sqrt(L))^2 avoids the cancellation of the plain form
    return (epsilon / (math.sqrt(log_inv + epsilon) + math.sqrt(log_inv))) ** 2


def _rdp_conversion_cost(orders: np.ndarray, delta: float, conversion: str) -> np.ndarray:
    """The term added to the RDP value at each order by the RDP-to-DP conversion."""
    log_delta = math.log(delta)
    if conversion == "standard":
        return -log_delta / (orders - 1.0)
    return np.log1p(-1.0 / orders) - (log_delta + np.log(orders)) / (orders - 1.0)


def rdp_epsilon(
    orders: Iterable[float] | np.ndarray,
    rdp: Iterable[float] | np.ndarray,
    delta: float,
    conversion: RdpConversion = "improved",
) -> tuple[float, float]:
    """Convert an RDP curve to ``(epsilon, delta)``-DP, minimising over the given orders.

    ``conversion="standard"``: ``epsilon = rdp(a) + log(1/delta) / (a - 1)`` (Mironov 2017,
    Proposition 3).  ``conversion="improved"`` (default):
    ``epsilon = rdp(a) + log((a - 1)/a) - (log(delta) + log(a)) / (a - 1)`` (Canonne, Kamath and
    Steinke 2020, Proposition 12; Asoodeh et al. 2021), never worse than the standard one.

    Parameters
    ----------
    orders : array_like of float
        Renyi orders, each ``> 1``.
    rdp : array_like of float
        RDP values at those orders, each ``>= 0``.
    delta : float
        Target ``delta``, in ``(0, 1)``.
    conversion : {"improved", "standard"}
        Which conversion to use.

    Returns
    -------
    epsilon : float
        The best ``epsilon`` (at least 0).
    order : float
        The order attaining it.
    """
    a = np.asarray(orders, dtype=float).ravel()
    r = np.asarray(rdp, dtype=float).ravel()
    delta = check_real("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
    conversion = check_choice("conversion", conversion, ("improved", "standard"))
    if a.size == 0 or not np.all(np.isfinite(a) & (a > 1.0)):
        raise ValueError("orders must be a non-empty sequence of finite real numbers in (1, inf)")
    if r.shape != a.shape or not np.all(r >= 0.0):
        raise ValueError("rdp must have one value in [0, inf] per order")
    eps = r + _rdp_conversion_cost(a, delta, conversion)
    i = int(np.argmin(eps))
    return max(0.0, float(eps[i])), float(a[i])


# Orders scanned before a local refinement when optimising over all real orders a > 1.
_ORDER_GRID = 1.0 + np.logspace(-4.0, 8.0, 241)
_LOG_ORDER_GRID = np.log(_ORDER_GRID - 1.0)


def _minimise_over_orders(fun) -> float:
    """Minimum over real orders ``a > 1`` of ``fun`` (vectorised in ``a``).

    A scan of a log-spaced grid followed by a bounded refinement in ``log(a - 1)`` between the
    neighbours of the best grid point.
    """
    vals = fun(_ORDER_GRID)
    i = int(np.argmin(vals))
    lo = _LOG_ORDER_GRID[max(i - 1, 0)]
    hi = _LOG_ORDER_GRID[min(i + 1, _ORDER_GRID.size - 1)]
    res = minimize_scalar(
        lambda t: float(fun(1.0 + math.exp(t))),
        bounds=(lo, hi),
        method="bounded",
        options={"xatol": 1e-10},
    )
    return min(float(vals[i]), float(res.fun))


def _rdp_gaussian_epsilon(
    mu_sq: float, delta: float, conversion: str, orders: np.ndarray | None
) -> float:
    """Best RDP ``epsilon`` of a Gaussian composition with total ``mu**2`` (RDP ``a mu^2/2``)."""
    if mu_sq == 0.0:
        return 0.0
    if orders is not None:
        return rdp_epsilon(orders, 0.5 * mu_sq * orders, delta, conversion)[0]
    return max(
        0.0,
        _minimise_over_orders(
            lambda a: 0.5 * mu_sq * a + _rdp_conversion_cost(a, delta, conversion)
        ),
    )


def _rdp_total_mu_sq(
    epsilon: float, delta: float, conversion: str, orders: np.ndarray | None
) -> float:
    """Largest total ``mu**2`` of a Gaussian composition whose RDP bound meets the budget."""

    # For a fixed order a, a mu^2 / 2 + C(a) <= epsilon  <=>  mu^2 <= 2 (epsilon - C(a)) / a.
    def neg_budget(a):
        return -2.0 * (epsilon - _rdp_conversion_cost(a, delta, conversion)) / a

    if orders is not None:
        return max(0.0, -float(np.min(neg_budget(orders))))
    return max(0.0, -_minimise_over_orders(neg_budget))


def classical_gaussian_epsilon(mu: float, delta: float) -> float:
    """``epsilon = mu sqrt(2 log(1.25 / delta))`` of the classical Gaussian-mechanism bound.

    Dwork and Roth (2014, Theorem A.1), the seed's Theorem 2: noise
    ``sigma >= Delta sqrt(2 log(1.25/delta)) / epsilon`` gives ``(epsilon, delta)``-DP, but only
    for ``epsilon < 1``; callers must check that the returned value is below 1.

    Parameters
    ----------
    mu : float
        ``Delta / sigma``, in ``[0, inf)``.
    delta : float
        Per-release ``delta``, in ``(0, 1)``.

    Returns
    -------
    float
        ``epsilon`` (valid as a guarantee only when ``< 1``).
    """
    mu = check_real("mu", mu, low=0.0)
    delta = check_real("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
    return mu * math.sqrt(2.0 * math.log(1.25 / delta))


def advanced_composition(
    epsilon0: float, delta0: float, count: int, delta_slack: float
) -> tuple[float, float]:
    """Advanced composition (Dwork, Rothblum and Vadhan 2010; the seed's Theorem 3).

    ``count`` adaptively composed ``(epsilon0, delta0)``-DP mechanisms are
    ``(sqrt(2 k log(1/delta')) epsilon0 + k epsilon0 (e^epsilon0 - 1), k delta0 + delta')``-DP.

    Parameters
    ----------
    epsilon0 : float
        Per-mechanism ``epsilon``, in ``[0, inf)``.
    delta0 : float
        Per-mechanism ``delta``, in ``[0, 1]``.
    count : int
        Number of mechanisms ``k >= 0``.
    delta_slack : float
        ``delta'``, in ``(0, 1)``.

    Returns
    -------
    epsilon : float
    delta : float
    """
    epsilon0 = check_real("epsilon0", epsilon0, low=0.0)
    delta0 = check_real("delta0", delta0, low=0.0, high=1.0)
    k = check_integer("count", count)
    delta_slack = check_real(
        "delta_slack", delta_slack, low=0.0, high=1.0, low_open=True, high_open=True
    )
    spread = math.sqrt(2.0 * k * -math.log(delta_slack)) * epsilon0
    drift = k * epsilon0 * math.expm1(epsilon0)
    return spread + drift, k * delta0 + delta_slack


def _advanced_epsilon(mu: float, count: int, delta: float, per_step: str) -> float:
    """Best advanced-composition ``epsilon`` for ``count`` Gaussian releases of ``mu`` each.

    The total ``delta`` is split as ``count * delta0 + delta'``; the split is optimised on a
    logit grid and refined.  ``per_step`` says how each release's ``(epsilon0, delta0)`` is
    obtained: the classical bound (as in the seed; needs ``epsilon0 < 1``) or tight GDP.
    """
    if count == 0 or mu == 0.0:
        return 0.0

    def eps_at(t: float) -> float:
        # t is the logit of the share of delta spent on the per-release deltas
        delta0 = delta * float(expit(t)) / count
        slack = delta * float(expit(-t))
        if delta0 <= 0.0 or slack <= 0.0:
            return math.inf
        if per_step == "classical":
            e0 = mu * math.sqrt(2.0 * math.log(1.25 / delta0))
            if e0 >= 1.0:
                return math.inf
        else:
            e0 = _gdp_epsilon(mu=mu, delta=delta0)
        return math.sqrt(2.0 * count * -math.log(slack)) * e0 + count * e0 * math.expm1(e0)

    grid = np.linspace(-12.0, 12.0, 25)
    vals = np.array([eps_at(t) for t in grid])
    i = int(np.argmin(vals))
    if not math.isfinite(vals[i]):
        return math.inf
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
    res = minimize_scalar(
        lambda t: min(eps_at(t), 1e300),
        bounds=(lo, hi),
        method="bounded",
        options={"xatol": 1e-6},
    )
    return min(float(vals[i]), float(res.fun))


def gaussian_epsilon(
    mu_step: float,
    count: int,
    delta: float,
    accountant: Accountant = "gdp",
    *,
    rdp_conversion: RdpConversion = "improved",
    rdp_orders: Iterable[float] | np.ndarray | None = None,
    advanced_per_step: PerStepBound = "classical",
) -> float:
    """``epsilon`` at ``delta`` of ``count`` Gaussian releases with ``mu_step`` each.

    Parameters
    ----------
    mu_step : float
        Per-release ``Delta / sigma``, in ``[0, inf)``.
    count : int
        Number of releases, ``>= 0``.
    delta : float
        Target ``delta``, in ``(0, 1)``.
    accountant : {"gdp", "zcdp", "rdp", "advanced"}
        ``"gdp"``: tight (:func:`gdp_epsilon`).  ``"zcdp"``: ``rho = count mu^2 / 2`` and
        :func:`zcdp_epsilon`.  ``"rdp"``: RDP ``a count mu^2 / 2`` converted by
        :func:`rdp_epsilon`.  ``"advanced"``: advanced composition with the ``delta`` split
        optimised.
    rdp_conversion : {"improved", "standard"}
        RDP-to-DP conversion (see :func:`rdp_epsilon`).
    rdp_orders : array_like of float, optional
        Orders to scan; by default every real order ``a > 1`` (the Gaussian's RDP curve holds
        at all of them) is optimised over.
    advanced_per_step : {"classical", "tight"}
        Per-release ``(epsilon0, delta0)`` for advanced composition: the classical bound
        :func:`classical_gaussian_epsilon` (the arXiv seed's choice) or the tight GDP one.

    Returns
    -------
    float
        ``epsilon`` (``inf`` when the advanced bound cannot certify any ``epsilon``).
    """
    mu_step = check_real("mu_step", mu_step, low=0.0)
    count = check_integer("count", count)
    delta, accountant, rdp_conversion, orders, advanced_per_step = _check_options(
        delta, accountant, rdp_conversion, rdp_orders, advanced_per_step
    )
    mu_sq = count * mu_step * mu_step
    if accountant == "gdp":
        return _gdp_epsilon(mu=math.sqrt(mu_sq), delta=delta)
    if accountant == "zcdp":
        return zcdp_epsilon(0.5 * mu_sq, delta)
    if accountant == "rdp":
        return _rdp_gaussian_epsilon(mu_sq, delta, rdp_conversion, orders)
    return _advanced_epsilon(mu_step, count, delta, advanced_per_step)


def _check_options(
    delta: float,
    accountant: str,
    rdp_conversion: str,
    rdp_orders: Iterable[float] | np.ndarray | None,
    advanced_per_step: str,
) -> tuple[float, str, str, np.ndarray | None, str]:
    """Validate the options shared by :func:`gaussian_epsilon` and :func:`iterations_allowed`."""
    return (
        check_real("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True),
        check_choice("accountant", accountant, _ACCOUNTANTS),
        check_choice("rdp_conversion", rdp_conversion, ("improved", "standard")),
        _check_orders(rdp_orders),
        check_choice("advanced_per_step", advanced_per_step, ("classical", "tight")),
    )


def _check_orders(orders) -> np.ndarray | None:
    if orders is None:
        return None
    a = np.asarray(orders, dtype=float).ravel()
    if a.size == 0 or not np.all(np.isfinite(a) & (a > 1.0)):
        raise ValueError(
            "rdp_orders must be None or a non-empty sequence of finite real numbers in (1, inf)"
        )
    return a


def iterations_allowed(
    mu_step: float,
    epsilon: float,
    delta: float,
    accountant: Accountant = "gdp",
    *,
    rdp_conversion: RdpConversion = "improved",
    rdp_orders: Iterable[float] | np.ndarray | None = None,
    advanced_per_step: PerStepBound = "classical",
) -> int:
    """Number of Gaussian releases with ``mu_step`` each that an accountant fits in a budget.

    For ``"gdp"``, ``"zcdp"`` and ``"rdp"`` the bound depends on the releases only through
    ``count * mu_step**2``, so the count is the budget's total ``mu**2`` divided by
    ``mu_step**2`` (with a 1e-10 relative slack that absorbs round-off, e.g. from
    :func:`calibrate_step_mu`).  For ``"advanced"`` it is found by bisection on the count.

    At ``(epsilon, delta) = (1, 1e-5)`` the zCDP bound allows ``1/1.7255`` as many releases as
    the tight GDP one, RDP with the improved conversion ``1/1.1757`` (the standard conversion
    over all real orders coincides with zCDP) and advanced composition with the classical
    per-release bound 1/40 to 1/90.

    Parameters
    ----------
    mu_step : float
        Per-release ``Delta / sigma``, in ``(0, inf)``.
    epsilon : float
        Budget ``epsilon``, in ``[0, inf)``.
    delta : float
        Budget ``delta``, in ``(0, 1)``.
    accountant : {"gdp", "zcdp", "rdp", "advanced"}
        Which bound to use; the keyword options are as in :func:`gaussian_epsilon`.
    rdp_conversion, rdp_orders, advanced_per_step
        See :func:`gaussian_epsilon`.

    Returns
    -------
    int
        The largest count whose guarantee is within the budget (possibly 0).
    """
    mu_step = check_real("mu_step", mu_step, low=0.0, low_open=True)
    epsilon = check_real("epsilon", epsilon, low=0.0)
    delta, accountant, rdp_conversion, orders, advanced_per_step = _check_options(
        delta, accountant, rdp_conversion, rdp_orders, advanced_per_step
    )
    if accountant == "gdp":
        total_sq = _gdp_mu(epsilon, delta) ** 2
    elif accountant == "zcdp":
        total_sq = 2.0 * zcdp_rho(epsilon, delta)
    elif accountant == "rdp":
        total_sq = _rdp_total_mu_sq(epsilon, delta, rdp_conversion, orders)
    else:
        return _advanced_count(mu_step, epsilon, delta, advanced_per_step)
    return int(math.floor(total_sq / (mu_step * mu_step) * (1.0 + _BUDGET_SLACK)))


def _advanced_count(mu_step: float, epsilon: float, delta: float, per_step: str) -> int:
    def fits(k: int) -> bool:
        return _advanced_epsilon(mu_step, k, delta, per_step) <= epsilon * (1.0 + _BUDGET_SLACK)

    # A valid bound never allows more than the exact (GDP) composition.
    hi = int((_gdp_mu(epsilon, delta) / mu_step) ** 2) + 2
    while fits(hi):  # defensive: should not happen
        hi *= 2
    lo = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo
