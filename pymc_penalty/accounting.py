"""Privacy accounting for compositions of Gaussian releases.

Every step of the penalty algorithm releases one Gaussian-noised log-likelihood difference.
With L2 sensitivity ``Delta_t`` and noise standard deviation ``sigma_t`` the release is
``mu_t``-GDP with ``mu_t = Delta_t / sigma_t``, and an adaptive composition of such releases is
exactly ``mu``-GDP with ``mu = sqrt(sum_t mu_t**2)`` (Dong, Roth and Su, "Gaussian differential
privacy", JRSS-B 2022, Corollary 3.3).  Its tight ``(epsilon, delta)`` curve is

    delta(epsilon) = Phi(-epsilon / mu + mu / 2) - exp(epsilon) * Phi(-epsilon / mu - mu / 2).

This module holds

* the tight GDP conversions (:func:`gdp_delta`, :func:`gdp_epsilon`, :func:`gdp_mu`,
  :func:`compose_mu`), evaluated in log space so they stay finite far into the tails;
* looser comparison bounds for the same composition: zCDP, RDP and advanced composition, the
  schedule of the arXiv seed's Theorem 1 / Corollary 1, and :func:`iterations_allowed`;
* a small immutable event vocabulary and :class:`GDPAccountant`, which can be checkpointed;
* calibration from a run plan (:func:`calibrate_step_mu`, :func:`plan_releases`);
* the closed-form expected acceptance probability of the penalty test
  (:func:`expected_acceptance`).

Pure NumPy/SciPy: nothing here imports PyMC.  Sensitivities are the L2 sensitivity under the
neighbour relation in use (substitute-one: ``2B``; add/remove-one: ``B``); this module never
doubles or halves them itself.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from scipy.optimize import brentq, minimize_scalar
from scipy.special import erfcx, erfinv, expit, log_ndtr, ndtri

__all__ = [
    "ComposedReleases",
    "GDPAccountant",
    "GaussianRelease",
    "PrivacyEvent",
    "RepeatedRelease",
    "Theorem1Schedule",
    "advanced_composition",
    "calibrate_step_mu",
    "classical_gaussian_epsilon",
    "compose_mu",
    "expected_acceptance",
    "gaussian_epsilon",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
    "iterations_allowed",
    "plan_releases",
    "rdp_epsilon",
    "theorem1_schedule",
    "zcdp_epsilon",
    "zcdp_rho",
]

Accountant = Literal["gdp", "zcdp", "rdp", "advanced"]
RdpConversion = Literal["improved", "standard"]
PerStepBound = Literal["classical", "tight"]

_ACCOUNTANTS = ("gdp", "zcdp", "rdp", "advanced")
_SQRT2 = math.sqrt(2.0)
_SQRT_PI = math.sqrt(math.pi)
_LOG_HALF = math.log(0.5)
# Gauss-Legendre 3-point rule on [-1, 1].
_GL_NODE = math.sqrt(0.6)
_GL_W_OUTER = 5.0 / 9.0
_GL_W_CENTRE = 8.0 / 9.0
# Relative slack on a budget's mu**2 when counting whole releases: absorbs round-off (for
# instance from calibrate_step_mu) and is far below any meaningful change in delta.
_BUDGET_SLACK = 1e-10
# Smallest relative tolerance brentq accepts (4 machine epsilons).
_BRENT_RTOL = 4.0 * float(np.finfo(float).eps)


# --------------------------------------------------------------------------------------------
# input validation
# --------------------------------------------------------------------------------------------


def _real(
    name: str,
    value: Any,
    *,
    low: float = -math.inf,
    high: float = math.inf,
    low_open: bool = False,
    high_open: bool = False,
    finite: bool = True,
) -> float:
    """Return ``value`` as a float after checking it lies in the stated interval."""
    lb = "(" if low_open else "["
    rb = ")" if high_open else "]"
    accepted = f"{lb}{low:g}, {high:g}{rb}"
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.ndarray)):
        raise ValueError(f"{name} must be a real number in {accepted}; got {value!r}")
    if isinstance(value, np.ndarray):
        if value.ndim != 0:
            raise ValueError(f"{name} must be a scalar in {accepted}; got shape {value.shape}")
        value = value.item()
    x = float(value)
    ok = not math.isnan(x) and (math.isfinite(x) or not finite)
    ok = ok and (x > low if low_open else x >= low) and (x < high if high_open else x <= high)
    if not ok:
        raise ValueError(f"{name} must be a real number in {accepted}; got {value!r}")
    return x


def _integer(name: str, value: Any, *, low: int = 0) -> int:
    """Return ``value`` as an int after checking it is an integer ``>= low``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}; got {value!r}")
    return int(value)


def _choice(name: str, value: Any, options: tuple[str, ...]) -> str:
    if value not in options:
        raise ValueError(f"{name} must be one of {options}; got {value!r}")
    return value


# --------------------------------------------------------------------------------------------
# tight Gaussian differential privacy
# --------------------------------------------------------------------------------------------


def _minus_erfcx_slope(t: float) -> float:
    """``-d/dt erfcx(t) = 2/sqrt(pi) - 2 t erfcx(t)`` for ``t >= 0``, without cancellation."""
    if t > 100.0:
        # Asymptotic series of erfcx; the first omitted term is below 1e-14 relative here.
        s = 1.0 / (t * t)
        return s * (1.0 - s * (1.5 - s * (3.75 - s * 13.125))) / _SQRT_PI
    return 2.0 / _SQRT_PI - 2.0 * t * float(erfcx(t))


def _erfcx_drop(u: float, h: float) -> float:
    """``erfcx(u) - erfcx(u + h)`` for ``u >= 0``, ``h > 0``, accurate also for tiny ``h``.

    ``h`` is passed separately because forming it as a difference of two large numbers would
    already lose the digits this function is careful to keep.
    """
    if h > 0.01 * max(u, 1.0):
        return float(erfcx(u)) - float(erfcx(u + h))
    # Short interval: integrate the (smooth, positive) slope with 3-point Gauss-Legendre,
    # whose error is O(h**7); the plain difference would lose digits to cancellation.
    m = u + 0.5 * h
    r = 0.5 * h * _GL_NODE
    g = _GL_W_OUTER * (_minus_erfcx_slope(m - r) + _minus_erfcx_slope(m + r))
    return 0.5 * h * (g + _GL_W_CENTRE * _minus_erfcx_slope(m))


def _log_expm1(x: float) -> float:
    """``log(exp(x) - 1)`` for ``x > 0``."""
    return x + math.log1p(-math.exp(-x)) if x > 1.0 else math.log(math.expm1(x))


def _log_gdp_delta(epsilon: float, mu: float) -> float:
    """Natural log of the tight ``delta(epsilon)`` of ``mu``-GDP; needs ``mu > 0``."""
    a = 0.5 * mu - epsilon / mu
    b = -0.5 * mu - epsilon / mu
    if a >= 0.0:
        # delta = [Phi(a) - Phi(b)] - (e^eps - 1) Phi(b); with a >= 0 > b the bracket is a sum
        # of two positive erf terms, so nothing cancels even for tiny mu.
        head = 0.5 * (math.erf(a / _SQRT2) + math.erf(-b / _SQRT2))
        if epsilon == 0.0:
            return math.log(head)
        tail = math.exp(_log_expm1(epsilon) + float(log_ndtr(b)))
        return math.log(head - tail)
    # Here a < 0.  With Phi(-x) = erfcx(x / sqrt 2) exp(-x^2 / 2) / 2 the Gaussian factors of
    # both terms are equal (e^eps phi(b) = phi(a)), so
    # delta = exp(-u^2) [erfcx(u) - erfcx(v)] / 2 with u = -a / sqrt 2, v = -b / sqrt 2.
    u = -a / _SQRT2
    if u > 1e150:
        return -math.inf
    drop = _erfcx_drop(u, mu / _SQRT2)  # v - u = mu / sqrt 2 exactly
    if drop <= 0.0:
        return -math.inf
    return _LOG_HALF - u * u + math.log(drop)


def gdp_delta(epsilon: float, mu: float) -> float:
    """Tight ``delta`` at ``epsilon`` for ``mu``-Gaussian differential privacy.

    ``delta = Phi(-epsilon/mu + mu/2) - exp(epsilon) * Phi(-epsilon/mu - mu/2)`` (Dong, Roth
    and Su 2022, Corollary 2.13), evaluated in log space through ``erfcx`` so that it is
    accurate to about 1e-12 relative wherever the result is a normal double and returns
    ``0.0`` only when the true value underflows.

    Parameters
    ----------
    epsilon : float
        Privacy parameter, in ``[0, inf)``.
    mu : float
        GDP parameter, in ``[0, inf)``; ``0`` means nothing was released.

    Returns
    -------
    float
        ``delta`` in ``[0, 1]``.

    Raises
    ------
    ValueError
        If an argument is outside its range.
    """
    epsilon = _real("epsilon", epsilon, low=0.0)
    mu = _real("mu", mu, low=0.0)
    if mu == 0.0:
        return 0.0
    return min(1.0, math.exp(_log_gdp_delta(epsilon, mu)))


def gdp_epsilon(delta: float, mu: float) -> float:
    """Smallest ``epsilon`` such that ``mu``-GDP implies ``(epsilon, delta)``-DP.

    Inverts :func:`gdp_delta` in ``epsilon`` with Brent's method on
    ``log gdp_delta(epsilon, mu) - log delta``, bracketed in ``[0, mu (mu/2 - Phi^-1(delta))]``
    (at the upper end the first term alone equals ``delta``).  Relative accuracy about 1e-13.

    Parameters
    ----------
    delta : float
        Target ``delta``, in ``(0, 1)``.
    mu : float
        GDP parameter, in ``[0, inf)``.

    Returns
    -------
    float
        ``epsilon >= 0``; ``0.0`` when ``delta >= gdp_delta(0, mu)``.

    Raises
    ------
    ValueError
        If an argument is outside its range.
    """
    delta = _real("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
    mu = _real("mu", mu, low=0.0)
    if mu == 0.0 or delta >= math.erf(mu / (2.0 * _SQRT2)):
        return 0.0
    log_delta = math.log(delta)

    def excess(eps: float) -> float:
        return _log_gdp_delta(eps, mu) - log_delta

    hi = mu * (0.5 * mu - float(ndtri(delta)))
    while excess(hi) > 0.0:  # only reachable through round-off
        hi = 2.0 * hi + mu
    return float(brentq(excess, 0.0, hi, xtol=1e-300, rtol=_BRENT_RTOL, maxiter=200))


def gdp_mu(epsilon: float, delta: float) -> float:
    """Largest ``mu`` such that ``mu``-GDP implies ``(epsilon, delta)``-DP.

    ``delta(epsilon)`` increases with ``mu``; the root is bracketed below by the ``mu`` at which
    ``Phi(-epsilon/mu + mu/2) = delta`` and found with Brent's method in log space.
    ``gdp_mu(1, 1e-5) = 0.268051...``.

    Parameters
    ----------
    epsilon : float
        Privacy budget ``epsilon``, in ``[0, inf)``.
    delta : float
        Privacy budget ``delta``, in ``(0, 1)``.

    Returns
    -------
    float
        The total GDP parameter the budget allows.

    Raises
    ------
    ValueError
        If an argument is outside its range.
    """
    epsilon = _real("epsilon", epsilon, low=0.0)
    delta = _real("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
    return _gdp_mu(epsilon, delta)


def _gdp_mu(epsilon: float, delta: float) -> float:
    if epsilon == 0.0:
        # delta(0, mu) = 2 Phi(mu/2) - 1 = erf(mu / (2 sqrt 2))
        return 2.0 * _SQRT2 * float(erfinv(delta))
    z = float(ndtri(delta))
    root = math.sqrt(z * z + 2.0 * epsilon)
    # positive root of mu^2 - 2 z mu - 2 eps = 0, in the form that does not cancel
    lo = 2.0 * epsilon / (root - z) if z < 0.0 else z + root
    log_delta = math.log(delta)

    def excess(m: float) -> float:
        return _log_gdp_delta(epsilon, m) - log_delta

    while excess(lo) > 0.0:  # only reachable through round-off
        lo *= 0.5
    hi = 2.0 * lo
    while excess(hi) < 0.0:
        lo, hi = hi, 2.0 * hi
    return float(brentq(excess, lo, hi, xtol=1e-300, rtol=_BRENT_RTOL, maxiter=200))


def compose_mu(mus: Iterable[float] | np.ndarray) -> float:
    """GDP parameter of an adaptive composition: ``sqrt(sum(mu_t ** 2))``.

    Parameters
    ----------
    mus : array_like of float
        Per-release GDP parameters, each finite and ``>= 0``; may be empty.

    Returns
    -------
    float
        The composed ``mu``.

    Raises
    ------
    ValueError
        If any entry is negative, infinite or NaN.
    """
    arr = np.asarray(list(mus) if not isinstance(mus, np.ndarray) else mus, dtype=float)
    arr = arr.ravel()
    if not np.all(np.isfinite(arr) & (arr >= 0.0)):
        raise ValueError("mus must contain only finite real numbers in [0, inf)")
    return float(np.sqrt(np.dot(arr, arr)))


# --------------------------------------------------------------------------------------------
# comparison bounds: zCDP, RDP, advanced composition
# --------------------------------------------------------------------------------------------


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
    rho = _real("rho", rho, low=0.0)
    delta = _real("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
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
    epsilon = _real("epsilon", epsilon, low=0.0)
    delta = _real("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
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
    delta = _real("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
    conversion = _choice("conversion", conversion, ("improved", "standard"))
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
    mu = _real("mu", mu, low=0.0)
    delta = _real("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
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
    epsilon0 = _real("epsilon0", epsilon0, low=0.0)
    delta0 = _real("delta0", delta0, low=0.0, high=1.0)
    k = _integer("count", count)
    delta_slack = _real(
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
            e0 = gdp_epsilon(delta0, mu)
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
    mu_step = _real("mu_step", mu_step, low=0.0)
    count = _integer("count", count)
    delta = _real("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
    accountant = _choice("accountant", accountant, _ACCOUNTANTS)
    rdp_conversion = _choice("rdp_conversion", rdp_conversion, ("improved", "standard"))
    advanced_per_step = _choice("advanced_per_step", advanced_per_step, ("classical", "tight"))
    orders = _check_orders(rdp_orders)
    mu_sq = count * mu_step * mu_step
    if accountant == "gdp":
        return gdp_epsilon(delta, math.sqrt(mu_sq))
    if accountant == "zcdp":
        return zcdp_epsilon(0.5 * mu_sq, delta)
    if accountant == "rdp":
        return _rdp_gaussian_epsilon(mu_sq, delta, rdp_conversion, orders)
    return _advanced_epsilon(mu_step, count, delta, advanced_per_step)


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
    mu_step = _real("mu_step", mu_step, low=0.0, low_open=True)
    epsilon = _real("epsilon", epsilon, low=0.0)
    delta = _real("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
    accountant = _choice("accountant", accountant, _ACCOUNTANTS)
    rdp_conversion = _choice("rdp_conversion", rdp_conversion, ("improved", "standard"))
    advanced_per_step = _choice("advanced_per_step", advanced_per_step, ("classical", "tight"))
    orders = _check_orders(rdp_orders)
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


# --------------------------------------------------------------------------------------------
# the arXiv seed's Theorem 1 / Corollary 1
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Theorem1Schedule:
    """Iterations, noise and ``(epsilon, delta)`` of the arXiv seed's Theorem 1 / Corollary 1.

    Attributes
    ----------
    n, c, alpha, beta, k0 : float
        The theorem's inputs: data size, sensitivity bound ``c n^-alpha`` (Assumption A1/A4)
        and the free parameters ``beta``, ``k0``.
    k : int
        ``k(n) = floor(k0 n^(2 alpha) / log n)`` iterations.
    sigma : float
        Noise standard deviation (Theorem 1) or its scale (Corollary 1).
    mu_step : float
        ``c n^-alpha / sigma``: per-release ``Delta / sigma``, for comparison with tight
        accounting (``gdp_epsilon(delta, sqrt(k) * mu_step)``).
    step_epsilon, step_delta : float
        Per-release guarantee from the classical Gaussian bound: ``(c/sigma) n^-alpha
        sqrt(2 beta' log n)`` and ``1.25 n^-beta'`` with ``beta' = 2 alpha + beta``.
    epsilon : float
        A valid bound from the theorem's proof: ``2 sqrt(k0 beta' beta log n) c / sigma +
        4 k0 c^2 beta' / sigma^2``.  The printed bound (3) lacks the ``sqrt(log n)`` factor
        (see ``epsilon_as_printed``).
    epsilon_as_printed : float
        Bound (3) exactly as printed, ``2 sqrt(k0 beta' beta) c / sigma + 4 k0 c^2 beta' /
        sigma^2``.  Not a valid guarantee for ``n > e``: substituting ``k(n)`` and
        ``delta' = n^-beta`` into the proof's advanced-composition bound leaves a factor
        ``sqrt(log n)`` on the first term, which (3) drops; so ``epsilon`` grows like
        ``sqrt(log n)`` rather than being ``O(1)``.
    delta : float
        The theorem's bound (4), ``1.25 k0 n^-beta / log n + n^-beta`` (correct as printed).
    xi : float or None
        Corollary 1's variance of the noisy sufficient statistic,
        ``sigma^2 (Delta_2 S)^2 n^(2 alpha) / c^2``, when ``stat_sensitivity`` was given.
    """

    n: int
    c: float
    alpha: float
    beta: float
    k0: float
    k: int
    sigma: float
    mu_step: float
    step_epsilon: float
    step_delta: float
    epsilon: float
    epsilon_as_printed: float
    delta: float
    xi: float | None = None


def theorem1_schedule(
    n: int,
    c: float,
    alpha: float,
    beta: float,
    k0: float,
    *,
    sigma: float | None = None,
    stat_sensitivity: float | None = None,
) -> Theorem1Schedule:
    """The schedule of the arXiv seed's Theorem 1 (and Corollary 1, exponential families).

    Under Assumption A1 (sensitivity of the log-likelihood difference at most ``c n^-alpha``),
    ``k(n) = floor(k0 n^(2 alpha) / log n)`` iterations with constant noise ``sigma`` are
    ``(epsilon, delta)``-DP with (printed as equations (3) and (4))

        epsilon = 2 sqrt(k0 (2 alpha + beta) beta) c / sigma + 4 k0 c^2 / sigma^2 (2 alpha + beta)
        delta   = 1.25 k0 n^-beta / log n + n^-beta

    for any ``sigma > max_n c n^-alpha sqrt(2 beta' log n)``, ``beta' = 2 alpha + beta`` (the
    proof combines the classical Gaussian bound, valid for per-step ``epsilon < 1``, with
    advanced composition).  Corollary 1 gives the same bounds for the noisy sufficient
    statistic with variance ``xi_n = sigma^2 (Delta_2 S)^2 n^(2 alpha) / c^2``; it writes
    ``k(n)`` without the floor, but iterations are whole, so the floor is used for both.

    The printed ``epsilon`` omits a factor ``sqrt(log n)`` on its first term (the proof's own
    intermediate bound, with ``k = k0 n^(2 alpha) / log n`` and ``log(1/delta') = beta log n``,
    gives ``2 sqrt(k0 beta' beta log n) c / sigma``).  The result therefore reports the
    corrected value as ``epsilon`` and the printed one as ``epsilon_as_printed``.

    Parameters
    ----------
    n : int
        Data size, ``>= 2``.
    c, alpha : float
        Sensitivity constants of Assumption A1 / A4, both ``> 0``.
    beta, k0 : float
        The theorem's free parameters, both ``> 0``.
    sigma : float, optional
        Noise standard deviation; must exceed ``c n^-alpha sqrt(2 beta' log n)``.  Default:
        the smallest double above ``max`` over integers ``m >= 2`` of
        ``c m^-alpha sqrt(2 beta' log m)`` (the choice in the proof, independent of ``n``).
    stat_sensitivity : float, optional
        ``Delta_2 S`` of Corollary 1; when given, ``xi`` is filled in.

    Returns
    -------
    Theorem1Schedule
    """
    n = _integer("n", n, low=2)
    c = _real("c", c, low=0.0, low_open=True)
    alpha = _real("alpha", alpha, low=0.0, low_open=True)
    beta = _real("beta", beta, low=0.0, low_open=True)
    k0 = _real("k0", k0, low=0.0, low_open=True)
    beta_p = 2.0 * alpha + beta

    def bound(m: float) -> float:
        return c * m ** (-alpha) * math.sqrt(2.0 * beta_p * math.log(m))

    if sigma is None:
        # c m^-alpha sqrt(log m) peaks at m = exp(1 / (2 alpha)); check the integers beside it.
        peak = math.exp(min(1.0 / (2.0 * alpha), 700.0))
        candidates = {2, max(2, math.floor(peak)), max(2, math.ceil(peak))}
        sigma = math.nextafter(max(bound(m) for m in candidates), math.inf)
    else:
        sigma = _real("sigma", sigma, low=0.0, low_open=True)
        if not sigma > bound(n):
            raise ValueError(
                f"sigma must exceed c n^-alpha sqrt(2 (2 alpha + beta) log n) = {bound(n):.6g} "
                f"for Theorem 1 to apply; got {sigma!r}"
            )
    log_n = math.log(n)
    k = math.floor(k0 * n ** (2.0 * alpha) / log_n)
    second = 4.0 * k0 * c**2 / sigma**2 * beta_p
    first_printed = 2.0 * math.sqrt(k0 * beta_p * beta) * c / sigma
    delta = 1.25 * k0 * n ** (-beta) / log_n + n ** (-beta)
    xi = None
    if stat_sensitivity is not None:
        s = _real("stat_sensitivity", stat_sensitivity, low=0.0, low_open=True)
        xi = sigma**2 * s**2 * n ** (2.0 * alpha) / c**2
    return Theorem1Schedule(
        n=n,
        c=c,
        alpha=alpha,
        beta=beta,
        k0=k0,
        k=k,
        sigma=sigma,
        mu_step=c * n ** (-alpha) / sigma,
        step_epsilon=bound(n) / sigma,
        step_delta=1.25 * n ** (-beta_p),
        epsilon=first_printed * math.sqrt(log_n) + second,
        epsilon_as_printed=first_printed + second,
        delta=delta,
        xi=xi,
    )


# --------------------------------------------------------------------------------------------
# events and the GDP accountant
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GaussianRelease:
    """One release of a statistic plus ``N(0, noise_sd**2)`` noise.

    Parameters
    ----------
    sensitivity : float
        L2 sensitivity ``Delta`` of the statistic under the neighbour relation in use
        (substitute-one with per-datapoint bound ``B``: ``2B``; add/remove-one: ``B``), in
        ``[0, inf)``.
    noise_sd : float
        Noise standard deviation, in ``(0, inf]``.
    """

    sensitivity: float
    noise_sd: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "sensitivity", _real("sensitivity", self.sensitivity, low=0.0))
        noise_sd = _real("noise_sd", self.noise_sd, low=0.0, low_open=True, finite=False)
        object.__setattr__(self, "noise_sd", noise_sd)

    @property
    def mu(self) -> float:
        """GDP parameter ``sensitivity / noise_sd`` of this release."""
        return self.sensitivity / self.noise_sd


@dataclass(frozen=True)
class ComposedReleases:
    """An adaptive composition of events, in order.

    Parameters
    ----------
    events : sequence of PrivacyEvent
        The composed events (stored as a tuple).
    """

    events: tuple[PrivacyEvent, ...]

    def __post_init__(self) -> None:
        events = tuple(self.events)
        for e in events:
            if not isinstance(e, _EVENT_TYPES):
                raise ValueError(
                    "events must contain only GaussianRelease, ComposedReleases or "
                    f"RepeatedRelease instances; got {type(e).__name__}"
                )
        object.__setattr__(self, "events", events)

    @property
    def mu(self) -> float:
        """GDP parameter of the composition."""
        return math.sqrt(_mu_squared(self))


@dataclass(frozen=True)
class RepeatedRelease:
    """``count`` adaptive repetitions of one event.

    Parameters
    ----------
    event : PrivacyEvent
        The repeated event.
    count : int
        Number of repetitions, ``>= 0``.
    """

    event: PrivacyEvent
    count: int

    def __post_init__(self) -> None:
        if not isinstance(self.event, _EVENT_TYPES):
            raise ValueError(
                "event must be a GaussianRelease, ComposedReleases or RepeatedRelease; "
                f"got {type(self.event).__name__}"
            )
        object.__setattr__(self, "count", _integer("count", self.count))

    @property
    def mu(self) -> float:
        """GDP parameter of the repetitions."""
        return math.sqrt(_mu_squared(self))


PrivacyEvent = GaussianRelease | ComposedReleases | RepeatedRelease
_EVENT_TYPES = (GaussianRelease, ComposedReleases, RepeatedRelease)


def _mu_squared(event: PrivacyEvent) -> float:
    if isinstance(event, GaussianRelease):
        return event.mu * event.mu
    if isinstance(event, RepeatedRelease):
        return event.count * _mu_squared(event.event)
    return math.fsum(_mu_squared(e) for e in event.events)


def _release_count(event: PrivacyEvent) -> int:
    if isinstance(event, GaussianRelease):
        return 1
    if isinstance(event, RepeatedRelease):
        return event.count * _release_count(event.event)
    return sum(_release_count(e) for e in event.events)


class GDPAccountant:
    """Tight accountant for adaptive compositions of Gaussian releases.

    Keeps ``sum mu_t**2`` (with compensated summation, so millions of small releases do not
    drift) and answers with the exact ``mu``-GDP curve.

    Examples
    --------
    >>> acc = GDPAccountant().compose(GaussianRelease(sensitivity=2.0, noise_sd=40.0), count=100)
    >>> round(acc.mu, 6)
    0.5
    """

    _STATE_FORMAT = "pymc_penalty.GDPAccountant"
    _STATE_VERSION = 1

    def __init__(self) -> None:
        self._mu_sq = 0.0
        self._carry = 0.0
        self._releases = 0

    def compose(self, event: PrivacyEvent, count: int = 1) -> GDPAccountant:
        """Add ``count`` adaptive repetitions of ``event``; returns ``self`` for chaining.

        Parameters
        ----------
        event : PrivacyEvent
            The event to add.
        count : int, default 1
            Number of repetitions, ``>= 0``.

        Returns
        -------
        GDPAccountant
        """
        if not isinstance(event, _EVENT_TYPES):
            raise ValueError(
                "event must be a GaussianRelease, ComposedReleases or RepeatedRelease; "
                f"got {type(event).__name__}"
            )
        count = _integer("count", count)
        self._add(count * _mu_squared(event))
        self._releases += count * _release_count(event)
        return self

    def _add(self, x: float) -> None:
        # Neumaier's compensated summation.
        total = self._mu_sq + x
        if abs(self._mu_sq) >= abs(x):
            self._carry += (self._mu_sq - total) + x
        else:
            self._carry += (x - total) + self._mu_sq
        self._mu_sq = total

    @property
    def mu_squared(self) -> float:
        """``sum mu_t**2`` over everything composed so far."""
        return self._mu_sq + self._carry

    @property
    def mu(self) -> float:
        """Composed GDP parameter ``sqrt(sum mu_t**2)``."""
        return math.sqrt(self.mu_squared)

    @property
    def releases(self) -> int:
        """Number of Gaussian releases composed so far."""
        return self._releases

    def get_epsilon(self, delta: float) -> float:
        """Tight ``epsilon`` at ``delta`` (see :func:`gdp_epsilon`)."""
        return gdp_epsilon(delta, self.mu)

    def get_delta(self, epsilon: float) -> float:
        """Tight ``delta`` at ``epsilon`` (see :func:`gdp_delta`)."""
        return gdp_delta(epsilon, self.mu)

    def state_dict(self) -> dict[str, Any]:
        """Plain-Python state for checkpoints (JSON-serialisable, restores bit for bit)."""
        return {
            "format": self._STATE_FORMAT,
            "version": self._STATE_VERSION,
            "mu_squared": self._mu_sq,
            "compensation": self._carry,
            "releases": self._releases,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state produced by :meth:`state_dict`, replacing the current one.

        Raises
        ------
        ValueError
            If ``state`` is not a valid state of this accountant.
        """
        if not isinstance(state, dict) or state.get("format") != self._STATE_FORMAT:
            raise ValueError(f"state must be a dict produced by {type(self).__name__}.state_dict")
        if state.get("version") != self._STATE_VERSION:
            raise ValueError(
                f"state version must be {self._STATE_VERSION}; got {state.get('version')!r}"
            )
        mu_sq = _real("state['mu_squared']", state.get("mu_squared"), low=0.0)
        carry = _real("state['compensation']", state.get("compensation"))
        releases = _integer("state['releases']", state.get("releases"))
        if mu_sq + carry < 0.0:
            raise ValueError("state['mu_squared'] + state['compensation'] must be >= 0")
        self._mu_sq, self._carry, self._releases = mu_sq, carry, releases

    def __repr__(self) -> str:
        return f"{type(self).__name__}(mu={self.mu:.6g}, releases={self._releases})"


# --------------------------------------------------------------------------------------------
# calibration from a run plan
# --------------------------------------------------------------------------------------------


def calibrate_step_mu(epsilon: float, delta: float, n_releases: int) -> float:
    """Per-release ``Delta / sigma`` such that ``n_releases`` releases spend exactly the budget.

    Equal releases compose to ``sqrt(n) mu_step``, so ``mu_step = gdp_mu(epsilon, delta) /
    sqrt(n_releases)``.  The noise standard deviation is then ``Delta / mu_step``.

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
    return _gdp_mu(epsilon, delta) / math.sqrt(n_releases)


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
