"""Tight accounting for a penalty step that publishes only its accept bit.

**The mechanism.** One random-walk penalty step computes the public-plus-private log ratio
``x = d + a`` (``d`` the clipped log-likelihood difference, ``a`` the exact log prior and
proposal ratios, which carry no data), releases ``x + xi - s**2 / 2`` with
``xi ~ N(0, s**2)`` and accepts when ``log U`` is below it. With ``E = -log U ~ Exp(1)``:

    accept  <=>  x + xi + E > s**2 / 2,
    P(accept | x) = alpha(x) = Phi(x/s - s/2) + exp(x) Phi(-x/s - s/2)

(the seed's Prop. 1; :func:`~pymc_penalty.accounting.expected_acceptance`). For a
neighbouring data set the ratio is ``x'`` with ``|x - x'| <= Delta`` (the release's L2
sensitivity: ``2B`` substitute-one, ``B`` add/remove-one). ``x`` is unknown and chosen
adaptively, and the sign of ``x' - x`` may change from step to step. A pair at distance
``|x' - x| < Delta`` is a post-processing of a pair at ``Delta`` (binary randomised response
can be garbled from ``Bern(a)``, ``Bern(c)`` to ``Bern(a)``, ``Bern(b)`` for
``a <= b <= c``), so the worst cases are the per-``x`` binary pairs
``(Bern(alpha(x)), Bern(alpha(x + Delta)))`` and their reverses.

**The dominating trade-off function.** With ``f_x`` the trade-off function of one such pair
(Dong, Roth and Su 2022), every step is ``f``-DP for
``f = (min_x min(f_x, f_x^-1))**``, the greatest convex minorant of the pointwise minimum
(the minimum alone need not be convex; its biconjugate is a symmetric trade-off function
below every ``f_x``). Adaptive composition of ``T`` steps that are each ``f``-DP whatever came
before is ``f^(x)T``-DP (their Theorem 3.2). By convex conjugacy the envelope's
hockey-stick curve is the supremum of the per-``x`` curves:

    delta_f(eps) = 1 + f*(-e^eps) = max(0, 1 - e^eps, sup_x [alpha(x+D) - e^eps alpha(x)],
                                              sup_x [q(x) - e^eps q(x+D)]),  q = 1 - alpha,

which :func:`envelope_delta` evaluates at the maximisers (``log alpha'(x+D) / alpha'(x) = eps``,
a decreasing function of ``x``), with bounds for the ``x`` outside a finite bracket.

**What the envelope is.** The accept bit is a threshold of ``Y = x + xi + E``, a location
family with log-concave noise ``N(0, s**2) + Exp(1)``, so the corners of the ``f_x`` trace its
trade-off curve: the envelope is the symmetrised trade-off of releasing ``d`` with that noise.
The tests use this (through ``scipy.stats.exponnorm``) as the independent computation.

**The dominating pair.** The supporting lines of ``f`` at a grid of ``eps`` values bound it
from below; their upper envelope is a polygon whose ``k`` pieces are the outcomes of a
discrete pair with privacy losses exactly on the grid (:func:`dominating_pair`). That pair's
privacy-loss distribution is `dp-accounting`'s pessimistic connect-the-dots PLD (Doroshenko et
al. 2022), built by :func:`accept_bit_pld` and composed by :func:`accept_bit_epsilon`.

Pure NumPy/SciPy; `dp-accounting` is imported only by the functions that compose.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from scipy.special import log_ndtr

from pymc_penalty.accounting.calibration import expected_acceptance
from pymc_penalty.accounting.gdp import _gdp_epsilon, _log_gdp_delta, gdp_mu
from pymc_penalty.validation import check_integer, check_real

__all__ = [
    "DominatingPair",
    "accept_bit_epsilon",
    "accept_bit_pld",
    "accept_bit_releases_allowed",
    "binary_hockey_stick",
    "binary_tradeoff_corners",
    "dominating_pair",
    "envelope_delta",
    "lower_convex_envelope",
    "pair_hockey_stick",
]

# Gauss-Legendre rule for the increments of alpha (smooth on the scale min(1, s)).
_GL_NODES, _GL_WEIGHTS = np.polynomial.legendre.leggauss(8)
# Bracket for the maximiser in x: alpha(-45) < 3e-20 and q(s (s/2 + 10)) < 8e-24; what lies
# outside is bounded, not dropped.
_X_LOW = -45.0
_Q_SIGMAS = 10.0
# Default discretisation of the privacy loss, per unit of the Gaussian step mu = Delta / s: a
# Gaussian composed 1e5 times through the same pipeline lands within 4e-5 of its closed form.
_STEPS_PER_MU = 50
# Default hockey-stick mass put at +infinity (and composed as such).
_TAIL_DELTA = 1e-16


def _check(sensitivity: float, noise_sd: float) -> tuple[float, float]:
    sensitivity = check_real("sensitivity", sensitivity, low=0.0, low_open=True)
    noise_sd = check_real("noise_sd", noise_sd, low=0.0, low_open=True)
    return sensitivity, noise_sd


def _log_alpha_prime(y: np.ndarray, s: float) -> np.ndarray:
    """``log d alpha / dx = x + log Phi(-x/s - s/2)`` (the two Gaussian densities cancel)."""
    return y + log_ndtr(-y / s - 0.5 * s)


def _alpha(x: np.ndarray, s: float) -> np.ndarray:
    """``alpha(x)``: :func:`expected_acceptance` for ``x <= 0``, ``1 - q(x)`` above (where
    ``q`` is small and must keep its relative accuracy)."""
    x = np.asarray(x, dtype=float)
    low = np.asarray(expected_acceptance(np.minimum(x, 0.0), s))
    return np.where(x <= 0.0, low, 1.0 - _q(x, s))


_LOG_Q_POSITIVE = np.vectorize(_log_gdp_delta, otypes=[float])


def _q(x: np.ndarray, s: float) -> np.ndarray:
    """``1 - alpha(x)``: for ``x >= 0`` it is GDP's ``delta(eps=x, mu=s)``, in log space."""
    x = np.asarray(x, dtype=float)
    low = 1.0 - np.asarray(expected_acceptance(np.minimum(x, 0.0), s))
    return np.where(x <= 0.0, low, np.exp(_LOG_Q_POSITIVE(np.maximum(x, 0.0), s)))


def _increment(x: np.ndarray, h: float, s: float) -> np.ndarray:
    """``alpha(x + h) - alpha(x)`` as the integral of ``alpha'`` (no cancellation for small h)."""
    x = np.asarray(x, dtype=float)
    panels = max(1, math.ceil(h / (0.5 * min(1.0, s))))
    width = h / panels
    starts = x[..., None] + width * np.arange(panels)
    y = starts[..., None] + 0.5 * width * (_GL_NODES + 1.0)
    vals = np.exp(_log_alpha_prime(y, s)) @ _GL_WEIGHTS
    return 0.5 * width * vals.sum(axis=-1)


def binary_tradeoff_corners(
    x: np.ndarray | float, sensitivity: float, noise_sd: float
) -> tuple[np.ndarray, np.ndarray]:
    """Corners of the per-``x`` binary trade-off curves, both directions.

    The accept bit under ``x`` against ``x + Delta`` is ``Bern(alpha(x))`` against
    ``Bern(alpha(x + Delta))``; its trade-off curve runs from ``(0, 1)`` through the corner
    ``(alpha(x), 1 - alpha(x + Delta))`` (reject the null on "accept") to ``(1, 0)``. The
    reversed pair's corner is the reflection ``(1 - alpha(x + Delta), alpha(x))``.

    Parameters
    ----------
    x : float or array_like
        Log ratios under the first data set.
    sensitivity : float
        ``Delta > 0``, the largest ``|x - x'|`` between neighbours.
    noise_sd : float
        ``s > 0``.

    Returns
    -------
    type_one, type_two : ndarray
        Corners ``(alpha, beta)``: first the pairs ``(x, x + Delta)``, then their reflections.
    """
    sensitivity, noise_sd = _check(sensitivity, noise_sd)
    x = np.atleast_1d(np.asarray(x, dtype=float))
    a = _alpha(x, noise_sd)
    b = _q(x + sensitivity, noise_sd)
    return np.concatenate([a, b]), np.concatenate([b, a])


def binary_hockey_stick(
    epsilon: np.ndarray | float, x: float, sensitivity: float, noise_sd: float
) -> np.ndarray:
    """Exact hockey-stick divergence of one step's accept bit at a given ``x``.

    ``max`` over the two directions of ``sum_o [P(o) - e^eps Q(o)]_+`` for
    ``(P, Q) = (Bern(alpha(x + Delta)), Bern(alpha(x)))`` and the reverse.

    Parameters
    ----------
    epsilon : float or array_like
        Any real ``eps``.
    x : float
        Log ratio under one data set; the other's is ``x + Delta``.
    sensitivity, noise_sd : float
        ``Delta > 0`` and ``s > 0``.

    Returns
    -------
    ndarray
        ``delta(eps)`` of this single binary mechanism.
    """
    sensitivity, noise_sd = _check(sensitivity, noise_sd)
    eps = np.asarray(epsilon, dtype=float)
    x = check_real("x", x)
    a, a2 = _alpha(np.array(x), noise_sd), _alpha(np.array(x + sensitivity), noise_sd)
    q, q2 = _q(np.array(x), noise_sd), _q(np.array(x + sensitivity), noise_sd)
    inc = _increment(np.array(x), sensitivity, noise_sd)  # a2 - a = q - q2
    em1 = np.expm1(eps)
    up = np.maximum(0.0, inc - em1 * a) + np.maximum(0.0, -inc - em1 * q)
    down = np.maximum(0.0, -inc - em1 * a2) + np.maximum(0.0, inc - em1 * q2)
    return np.minimum(1.0, np.maximum(up, down))


def lower_convex_envelope(
    type_one: np.ndarray, type_two: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Greatest convex minorant of trade-off points, with ``(0, 1)`` and ``(1, 0)``.

    The lower convex hull (Andrew's monotone chain) of the points: the tightest trade-off
    function below every binary curve whose corner is among them. With finitely many corners
    it lies *above* the envelope over a continuum of ``x`` (optimistic); it is used to check
    :func:`envelope_delta`, which is exact.

    Parameters
    ----------
    type_one, type_two : array_like
        Points ``(alpha, beta)`` in the unit square.

    Returns
    -------
    type_one, type_two : ndarray
        The envelope's vertices, ``alpha`` increasing.
    """
    a = np.concatenate([[0.0, 1.0], np.asarray(type_one, dtype=float).ravel()])
    b = np.concatenate([[1.0, 0.0], np.asarray(type_two, dtype=float).ravel()])
    order = np.lexsort((b, a))
    hull: list[tuple[float, float]] = []
    for p in zip(a[order], b[order], strict=True):
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (x2 - x1) * (p[1] - y1) - (y2 - y1) * (p[0] - x1) <= 0.0:
                hull.pop()
            else:
                break
        hull.append(p)
    va, vb = np.array(hull).T
    # Keep the non-increasing part: a trade-off function never rises.
    keep = np.concatenate([[True], np.diff(vb) < 0.0])
    return va[keep], vb[keep]


def _loss(x: np.ndarray, h: float, s: float) -> np.ndarray:
    """``log alpha'(x + h) / alpha'(x)``: decreasing in ``x``, from ``h`` to ``-inf``."""
    return h + log_ndtr(-(x + h) / s - 0.5 * s) - log_ndtr(-x / s - 0.5 * s)


def _solve_loss(target: np.ndarray, h: float, s: float, low: float, high: float) -> np.ndarray:
    """The ``x`` in ``[low, high]`` where :func:`_loss` crosses ``target`` (clamped), bisection."""
    lo = np.full(target.shape, low)
    hi = np.full(target.shape, high)
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        above = _loss(mid, h, s) > target
        lo = np.where(above, mid, lo)
        hi = np.where(above, hi, mid)
    return 0.5 * (lo + hi)


def envelope_delta(epsilon: np.ndarray | float, sensitivity: float, noise_sd: float) -> np.ndarray:
    """Hockey-stick curve of the lower convex envelope over ``x`` of the binary trade-offs.

    ``delta(eps) = sup_x`` of the per-``x`` binary :func:`binary_hockey_stick`, both
    directions: the tight ``delta`` of one accept bit against an adversary who picks ``x``.
    Evaluated at the per-``eps`` maximiser; beyond the bracket ``x < -45``,
    ``x > s (s/2 + 10)`` the supremum is bounded from above (at most 3e-20 more).

    Parameters
    ----------
    epsilon : float or array_like
        Any real ``eps``.
    sensitivity, noise_sd : float
        ``Delta > 0`` and ``s > 0``.

    Returns
    -------
    ndarray
        ``delta(eps)`` in ``[0, 1]``, an upper bound on every single ``x``'s.
    """
    h, s = _check(sensitivity, noise_sd)
    eps = np.atleast_1d(np.asarray(epsilon, dtype=float))
    low, high = _X_LOW - h, s * (0.5 * s + _Q_SIGMAS) + h
    em1, e = np.expm1(eps), np.exp(eps)
    a_low = float(_alpha(np.array(low + h), s))  # alpha(x + h) for every x < low is below it
    q_high = float(_q(np.array(high), s))  # q(x) for every x > high is below it
    ends = (np.full_like(eps, low), np.full_like(eps, high))

    # "Accept" corners: g_A(x) = alpha(x + h) - e^eps alpha(x), unimodal with its maximum
    # where the loss equals eps. Beyond the bracket: g_A <= alpha(low + h) for x < low and
    # g_A <= 1 - e^eps alpha(high) = -expm1(eps) + e^eps q(high) for x > high.
    xs = (_solve_loss(eps, h, s, low, high), *ends)
    delta_a = np.maximum.reduce(
        [_increment(x, h, s) - em1 * _alpha(x, s) for x in xs]
        + [np.full_like(eps, a_low), -em1 + e * q_high]
    )
    # "Reject" corners: g_B(x) = q(x) - e^eps q(x + h), maximal where the loss equals -eps.
    # Beyond: g_B <= 1 - e^eps + e^eps alpha(low + h) for x < low, g_B <= q(high) for x > high.
    xs = (_solve_loss(-eps, h, s, low, high), *ends)
    delta_b = np.maximum.reduce(
        [_increment(x, h, s) - em1 * _q(x + h, s) for x in xs]
        + [-em1 + e * a_low, np.full_like(eps, q_high)]
    )
    out = np.maximum.reduce([np.zeros_like(eps), -em1, delta_a, delta_b])
    return np.minimum(out, 1.0)


class DominatingPair(NamedTuple):
    """A discrete pair ``(P, Q)`` whose trade-off curve lies below the accept bit's envelope.

    Outcome ``i`` has privacy loss ``log(P_i / Q_i) = loss[i]`` (``P`` is dp-accounting's
    upper distribution); ``infinity_mass`` is ``P``'s mass on an outcome ``Q`` never gives.

    Attributes
    ----------
    loss : ndarray
        Grid of privacy losses, ``discretization * index``.
    index : ndarray
        Integer grid indices (increasing).
    upper, lower : ndarray
        ``P`` and ``Q`` masses of the finite-loss outcomes.
    infinity_mass : float
        ``P``'s mass with infinite loss (the hockey-stick curve at the grid's top).
    discretization : float
        Grid step of the losses.
    deltas : ndarray
        The envelope's ``delta(loss)`` at the grid, from which the pair was built.
    """

    loss: np.ndarray
    index: np.ndarray
    upper: np.ndarray
    lower: np.ndarray
    infinity_mass: float
    discretization: float
    deltas: np.ndarray


def _grid(sensitivity: float, noise_sd: float, discretization: float | None, tail: float):
    mu_step = sensitivity / noise_sd
    w = mu_step / _STEPS_PER_MU if discretization is None else discretization
    w = check_real("discretization", w, low=0.0, low_open=True)
    # The bit is a post-processing of the Gaussian release, so its curve is below the
    # Gaussian's: the Gaussian's epsilon at `tail` bounds where the grid may stop.
    top = max(_gdp_epsilon(mu_step, tail), 2.0 * w)
    n = math.ceil(top / w)
    return np.arange(-n, n + 1), w


def dominating_pair(
    sensitivity: float,
    noise_sd: float,
    *,
    discretization: float | None = None,
    tail_delta: float = _TAIL_DELTA,
) -> DominatingPair:
    """Discrete dominating pair realising the envelope's supporting lines on a loss grid.

    The lines ``beta = 1 - delta(eps_i) - e^eps_i alpha`` at ``eps_i = i * discretization``
    support the envelope ``f`` from below (``f >= max_i`` of them, by the definition of
    ``delta``); their upper envelope is a polygon with one piece per grid point, and the pair
    whose outcome ``i`` has ``P_i = e^eps_i Q_i`` and ``Q_i`` the ``alpha``-width of piece
    ``i`` has exactly that polygon as its trade-off curve. Coarser grids are more pessimistic,
    never optimistic.

    Parameters
    ----------
    sensitivity, noise_sd : float
        ``Delta > 0`` and ``s > 0``.
    discretization : float, optional
        Grid step of the losses; default ``(Delta / s) / 50``.
    tail_delta : float, default 1e-16
        The grid stops where the Gaussian with ``mu = Delta / s`` has ``delta`` below this;
        the envelope's ``delta`` there becomes the mass at ``+inf``.

    Returns
    -------
    DominatingPair
    """
    sensitivity, noise_sd = _check(sensitivity, noise_sd)
    tail_delta = check_real(
        "tail_delta", tail_delta, low=0.0, high=1.0, low_open=True, high_open=True
    )
    index, w = _grid(sensitivity, noise_sd, discretization, tail_delta)
    eps = index * w
    # Non-increasing in eps; rounding noise is resolved upwards (pessimistic).
    deltas = np.maximum.accumulate(envelope_delta(eps, sensitivity, noise_sd)[::-1])[::-1]
    # With losses eps_i and lower masses Q_i, the pair's curve is
    # delta(eps_j) = P_inf + sum_{i > j} Q_i (e^eps_i - e^eps_j), so the lower mass above
    # eps_j is tail_j = (delta_j - delta_{j+1}) / (e^eps_{j+1} - e^eps_j): the polygon's
    # vertices. Below the grid, Q keeps only (1 - delta_0) e^-eps_0 (the rest of Q has P = 0).
    tails = (deltas[:-1] - deltas[1:]) / -np.expm1(eps[:-1] - eps[1:]) / np.exp(eps[1:])
    tails = np.concatenate([[(1.0 - deltas[0]) * np.exp(-eps[0])], tails, [0.0]])
    lower = np.maximum(0.0, tails[:-1] - tails[1:])
    upper = np.exp(eps) * lower
    return DominatingPair(eps, index, upper, lower, float(deltas[-1]), w, deltas)


def pair_hockey_stick(pair: DominatingPair, epsilon: np.ndarray | float) -> np.ndarray:
    """``sum_o [P(o) - e^eps Q(o)]_+`` of a :class:`DominatingPair`, elementwise in ``eps``.

    Parameters
    ----------
    pair : DominatingPair
    epsilon : float or array_like

    Returns
    -------
    ndarray
    """
    eps = np.atleast_1d(np.asarray(epsilon, dtype=float))
    gap = pair.upper[None, :] - np.exp(eps)[:, None] * pair.lower[None, :]
    return pair.infinity_mass + np.maximum(gap, 0.0).sum(axis=1)


def accept_bit_pld(
    sensitivity: float,
    noise_sd: float,
    *,
    discretization: float | None = None,
    tail_delta: float = _TAIL_DELTA,
):
    """`dp-accounting` privacy-loss distribution of the envelope's dominating pair.

    dp-accounting's pessimistic connect-the-dots PLD from the envelope's ``delta`` on the
    loss grid: the privacy-loss distribution of :func:`dominating_pair` (symmetric: the
    envelope is its own inverse).

    Parameters
    ----------
    sensitivity, noise_sd : float
        ``Delta > 0`` and ``s > 0``.
    discretization : float, optional
        Loss grid step; default ``(Delta / s) / 50``.
    tail_delta : float, default 1e-16
        See :func:`dominating_pair`.

    Returns
    -------
    dp_accounting.pld.privacy_loss_distribution.PrivacyLossDistribution
    """
    from dp_accounting.pld import pld_pmf, privacy_loss_distribution

    pair = dominating_pair(
        sensitivity, noise_sd, discretization=discretization, tail_delta=tail_delta
    )
    pmf = pld_pmf.create_pmf_pessimistic_connect_dots(pair.discretization, pair.index, pair.deltas)
    return privacy_loss_distribution.PrivacyLossDistribution(pmf)


def accept_bit_epsilon(
    sensitivity: float,
    noise_sd: float,
    releases: int,
    delta: float,
    *,
    discretization: float | None = None,
) -> float:
    """``epsilon`` at ``delta`` of ``releases`` accept bits, composed adaptively.

    Parameters
    ----------
    sensitivity, noise_sd : float
        ``Delta > 0`` and ``s > 0`` of every step (the same for all).
    releases : int
        Number of steps ``T >= 1``.
    delta : float
        Target ``delta`` in ``(0, 1)``.
    discretization : float, optional
        Loss grid step; default ``(Delta / s) / 50``.

    Returns
    -------
    float
        A pessimistic ``epsilon`` (an upper bound up to the grid's rounding, which is itself
        pessimistic) for the composition ``f^(x)T``.
    """
    releases = check_integer("releases", releases, low=1)
    delta = check_real("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
    pld = accept_bit_pld(sensitivity, noise_sd, discretization=discretization)
    if releases > 1:
        pld = pld.self_compose(releases)
    return float(pld.get_epsilon_for_delta(delta))


def accept_bit_releases_allowed(
    sensitivity: float,
    noise_sd: float,
    epsilon: float,
    delta: float,
    *,
    rtol: float = 2e-3,
) -> int:
    """Largest number of accept bits whose composition stays within ``(epsilon, delta)``.

    Bisection in ``T`` on :func:`accept_bit_epsilon`, started from the Gaussian count
    ``(mu / (Delta / s))**2`` (never fewer: the bit is a post-processing of the release).

    Parameters
    ----------
    sensitivity, noise_sd : float
        ``Delta > 0`` and ``s > 0`` of every step.
    epsilon, delta : float
        The budget.
    rtol : float, default 2e-3
        Relative width at which the bisection stops (the count returned is the lower end).

    Returns
    -------
    int
        ``T`` with ``accept_bit_epsilon(T) <= epsilon``; 0 when not even one fits.
    """
    sensitivity, noise_sd = _check(sensitivity, noise_sd)
    epsilon = check_real("epsilon", epsilon, low=0.0, low_open=True)
    mu = gdp_mu(epsilon, delta)
    pld = accept_bit_pld(sensitivity, noise_sd)

    def fits(t: int) -> bool:
        composed = pld.self_compose(t) if t > 1 else pld
        return composed.get_epsilon_for_delta(delta) <= epsilon

    gaussian = max(1, math.floor((mu * noise_sd / sensitivity) ** 2))
    if fits(gaussian):
        lo, hi = gaussian, math.ceil(1.5 * gaussian) + 1
        while fits(hi):
            lo, hi = hi, math.ceil(1.5 * hi) + 1
    else:  # only the grid's pessimism can put the bit above the Gaussian
        lo, hi = 0, gaussian
    while hi - lo > max(1.0, rtol * lo):
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return int(lo)
