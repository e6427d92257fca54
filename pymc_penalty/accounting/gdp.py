"""Tight Gaussian differential privacy: conversions and composition.

An adaptive composition of Gaussian releases with ``mu_t = Delta_t / sigma_t`` is exactly
``mu``-GDP with ``mu = sqrt(sum_t mu_t**2)`` (Dong, Roth and Su, "Gaussian differential
privacy", JRSS-B 2022, Corollary 3.3), whose tight ``(epsilon, delta)`` curve is

    delta(epsilon) = Phi(-epsilon / mu + mu / 2) - exp(epsilon) * Phi(-epsilon / mu - mu / 2).

The conversions here (:func:`gdp_delta`, :func:`gdp_epsilon`, :func:`gdp_mu`) are evaluated in
log space so they stay finite far into the tails. Composition and the conversion of what a run
spent live here and nowhere else in the package: :func:`compose_mu2` (``sum mu_t**2``, also
per chain or cumulative), :func:`compose_mu` (its square root) and :func:`composed_epsilon`
(the tight ``epsilon`` of a composed ``sum mu_t**2``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable

import numpy as np
from scipy.optimize import brentq
from scipy.special import erfcx, erfinv, log_ndtr, ndtri

from pymc_penalty.errors import DegenerateDeltaWarning, InvalidArgumentError
from pymc_penalty.validation import check_real

__all__ = [
    "DegenerateDeltaWarning",
    "clip_count_noise_sd",
    "compose_mu",
    "compose_mu2",
    "composed_epsilon",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
    "likelihood_mu2",
    "split_step_mu",
    "step_mu_of_release",
]

_SQRT2 = math.sqrt(2.0)
_SQRT_PI = math.sqrt(math.pi)
_LOG_HALF = math.log(0.5)
# Gauss-Legendre 3-point rule on [-1, 1].
_GL_NODE = math.sqrt(0.6)
_GL_W_OUTER = 5.0 / 9.0
_GL_W_CENTRE = 8.0 / 9.0
# Smallest relative tolerance brentq accepts (4 machine epsilons).
_BRENT_RTOL = 4.0 * float(np.finfo(float).eps)


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
    epsilon = check_real("epsilon", epsilon, low=0.0)
    mu = check_real("mu", mu, low=0.0)
    if mu == 0.0:
        return 0.0
    return min(1.0, math.exp(_log_gdp_delta(epsilon, mu)))


def gdp_epsilon(mu: float, delta: float) -> float:
    """Smallest ``epsilon`` such that ``mu``-GDP implies ``(epsilon, delta)``-DP.

    Inverts :func:`gdp_delta` in ``epsilon`` with Brent's method on
    ``log gdp_delta(epsilon, mu) - log delta``, bracketed in ``[0, mu (mu/2 - Phi^-1(delta))]``
    (at the upper end the first term alone equals ``delta``).  Relative accuracy about 1e-13.

    The argument order is ``(mu, delta)``, as in :func:`classical_gaussian_epsilon` and
    :func:`zcdp_epsilon` (the mechanism's parameter, then ``delta``). Before 0.2 it was
    ``(delta, mu)``: calls that pass keywords (``gdp_epsilon(mu=..., delta=...)``) work with
    both.

    Parameters
    ----------
    mu : float
        GDP parameter, in ``[0, inf)``.
    delta : float
        Target ``delta``, in ``(0, 1)``.

    Returns
    -------
    float
        ``epsilon >= 0``; ``0.0`` when ``delta >= gdp_delta(0, mu)``, the mechanism's total
        variation distance. That ``0.0`` comes with a :class:`DegenerateDeltaWarning`: such a
        ``delta`` protects nothing, and it is what the pre-0.2 order gives when a call such as
        ``gdp_epsilon(1e-5, 0.5)`` meant ``delta=1e-5, mu=0.5``.

    Raises
    ------
    ValueError
        If an argument is outside its range (:class:`~pymc_penalty.InvalidArgumentError`).
        A ``delta`` of 1 or more names the pre-0.2 order as a likely cause.
    """
    mu = check_real("mu", mu, low=0.0)
    if not isinstance(delta, bool) and isinstance(delta, int | float) and delta >= 1.0:
        raise InvalidArgumentError(
            f"`delta` must be a real number in (0, 1); got {delta!r}. The order of "
            "gdp_epsilon's arguments is (mu, delta) since 0.2 (it was (delta, mu)): pass "
            "gdp_epsilon(mu=..., delta=...)."
        )
    epsilon = _gdp_epsilon(mu, delta)
    if epsilon == 0.0 and mu > 0.0:
        warnings.warn(
            f"gdp_epsilon(mu={mu:g}, delta={delta:g}) is 0: delta is at least the total "
            f"variation of {mu:g}-GDP, so the guarantee says nothing. The order of the "
            "arguments is (mu, delta) since 0.2 (it was (delta, mu)); pass them by name.",
            DegenerateDeltaWarning,
            stacklevel=2,
        )
    return epsilon


def _gdp_epsilon(mu: float, delta: float) -> float:
    """:func:`gdp_epsilon` without the warning, for the package's own conversions (``0.0`` is
    a valid answer for a tiny spend, such as a curve's first releases)."""
    mu = check_real("mu", mu, low=0.0)
    delta = check_real("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
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
    epsilon = check_real("epsilon", epsilon, low=0.0)
    delta = check_real("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
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


def compose_mu2(
    mus: Iterable[float] | np.ndarray, *, axis: int | None = None, cumulative: bool = False
) -> float | np.ndarray:
    """``sum_t mu_t**2`` of an adaptive composition of ``mu_t``-GDP releases.

    The one place where the package composes per-release GDP parameters: a run's, a chain's or
    a party's releases compose to ``sqrt(compose_mu2(mus))``-GDP (Dong, Roth and Su 2022,
    Corollary 3.3).

    Parameters
    ----------
    mus : array_like of float
        Per-release GDP parameters, each ``>= 0`` (``0`` for a refused release); ``inf``
        (a release without finite sensitivity) makes the sum ``inf``.
    axis : int, optional
        Compose along this axis only (for instance one sum per chain); all entries by default.
    cumulative : bool, default False
        Return the running sums along ``axis`` (the spend after each release) instead.

    Returns
    -------
    float or numpy.ndarray
        A float when everything is composed into one number, else an array.

    Raises
    ------
    ValueError
        If any entry is negative or NaN.
    """
    arr = np.asarray(list(mus) if not isinstance(mus, np.ndarray) else mus, dtype=float)
    if np.any(np.isnan(arr)) or np.any(arr < 0.0):
        raise ValueError("mus must contain only real numbers in [0, inf]")
    sq = arr * arr
    if cumulative:
        out = np.cumsum(sq if axis is not None else sq.ravel(), axis=axis)
    else:
        out = np.sum(sq, axis=axis)
    return float(out) if np.ndim(out) == 0 else out


def composed_epsilon(mu2: float, delta: float) -> float:
    """Tight ``epsilon`` at ``delta`` of releases whose ``sum mu_t**2`` is ``mu2``.

    The one conversion of a spend into ``epsilon`` used by the package's ledger, callback,
    report, diagnostics and variants: ``gdp_epsilon(sqrt(mu2), delta)``, without the
    :class:`DegenerateDeltaWarning` (``0.0`` is the right answer for a tiny spend, such as the
    first point of an epsilon curve).

    Parameters
    ----------
    mu2 : float
        Composed ``sum mu_t**2`` (see :func:`compose_mu2`); a negative value (round-off below
        zero) counts as ``0``; ``inf`` or NaN (no finite guarantee) gives ``inf``.
    delta : float
        Target ``delta``, in ``(0, 1)``.

    Returns
    -------
    float
        ``epsilon >= 0``, or ``inf``.
    """
    delta = check_real("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
    mu2 = float(mu2)
    if not math.isfinite(mu2):
        return math.inf
    return _gdp_epsilon(math.sqrt(max(mu2, 0.0)), delta)


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
    if not np.all(np.isfinite(arr)):
        raise ValueError("mus must contain only finite real numbers in [0, inf)")
    return math.sqrt(compose_mu2(arr))


# --- within one step: the likelihood release and the clip count ------------------------------
#
# Each private step makes two Gaussian releases, the clipped log-likelihood difference and the
# number of clipped datapoints (sensitivity 1), composed to one step mu with
# ``mu^2 = mu_ll^2 + mu_count^2``; ``count_share`` is the count's share of ``mu^2``.


def split_step_mu(step_mu: float, count_share: float) -> tuple[float, float]:
    """Split one step's Gaussian-DP ``mu`` between the likelihood release and the clip count.

    Each step releases two Gaussian mechanisms: the clipped log-likelihood difference and
    (optionally) the number of clipped datapoints. Their composition is ``mu``-GDP with
    ``mu^2 = mu_ll^2 + mu_count^2``; ``count_share`` is the share of ``mu^2`` given to the
    count.

    Parameters
    ----------
    step_mu : float
        Total per-step ``mu``.
    count_share : float
        Share in ``[0, 1)`` of ``step_mu^2`` spent on the clip count.

    Returns
    -------
    tuple of float
        ``(mu_ll, mu_count)``.
    """
    return step_mu * np.sqrt(1.0 - count_share), step_mu * np.sqrt(count_share)


def clip_count_noise_sd(mu_ll: float, count_share: float) -> float:
    """Noise sd for the clip count so that it takes ``count_share`` of the step's ``mu^2``.

    The number of clipped datapoints changes by at most one between neighbouring datasets
    (both relations), so its sensitivity is 1 and its ``mu`` is ``1 / sd``.

    Parameters
    ----------
    mu_ll : float
        ``mu`` of the likelihood release of this step.
    count_share : float
        Share in ``(0, 1)`` of the step's total ``mu^2`` for the count.

    Returns
    -------
    float
        The count's noise standard deviation (``inf`` when ``mu_ll`` is zero).
    """
    mu_count_sq = mu_ll**2 * count_share / (1.0 - count_share)
    if mu_count_sq <= 0.0:
        return np.inf
    return float(1.0 / np.sqrt(mu_count_sq))


def step_mu_of_release(mu_ll: float | np.ndarray, count_share: float) -> float | np.ndarray:
    """The step's ``mu`` when its likelihood release is ``mu_ll``-GDP and the clip count takes
    ``count_share`` of ``mu^2``: ``mu_ll / sqrt(1 - count_share)`` (inverse of
    :func:`split_step_mu`).

    Parameters
    ----------
    mu_ll : float or ndarray
        ``mu`` of the likelihood release (one per owner in the owners variant).
    count_share : float
        Share in ``[0, 1)`` of the step's ``mu^2`` spent on the clip count.

    Returns
    -------
    float or ndarray
    """
    return mu_ll / math.sqrt(1.0 - count_share)


def likelihood_mu2(step_mu: float, releases: float, count_share: float) -> float:
    """``mu^2`` that ``releases`` steps of ``step_mu`` spend on their likelihood releases (the
    clip counts' share left out): ``step_mu^2 * releases * (1 - count_share)``.

    What the kept draws' noise is calibrated by, for the utility forecast.

    Parameters
    ----------
    step_mu : float
        Per-step ``mu`` (both releases of the step composed).
    releases : float
        Number of steps (or a fraction of a budget's steps).
    count_share : float
        Share in ``[0, 1)`` of each step's ``mu^2`` spent on the clip count.

    Returns
    -------
    float
    """
    return step_mu**2 * releases * (1.0 - count_share)
