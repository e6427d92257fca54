"""The iteration and noise schedule of the arXiv seed's Theorem 1 / Corollary 1.

Kept for comparison with tight accounting: the seed combines the classical Gaussian bound with
advanced composition, and its printed ``epsilon`` bound drops a ``sqrt(log n)`` factor (see
:class:`Theorem1Schedule`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pymc_penalty.accounting.gdp import _gdp_epsilon
from pymc_penalty.validation import check_integer, check_real

__all__ = ["Theorem1Schedule", "theorem1_schedule"]


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
        accounting (``gdp_epsilon(mu=sqrt(k) * mu_step, delta=delta)``).
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

    @property
    def tight_epsilon(self) -> float:
        """Tight Gaussian-DP ``epsilon`` of the same ``k`` releases at the theorem's ``delta``.

        What tight accounting gives for exactly this run, beside the paper's ``epsilon``.
        """
        return _gdp_epsilon(mu=math.sqrt(self.k) * self.mu_step, delta=self.delta)


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
    n = check_integer("n", n, low=2)
    c = check_real("c", c, low=0.0, low_open=True)
    alpha = check_real("alpha", alpha, low=0.0, low_open=True)
    beta = check_real("beta", beta, low=0.0, low_open=True)
    k0 = check_real("k0", k0, low=0.0, low_open=True)
    beta_p = 2.0 * alpha + beta

    def bound(m: float) -> float:
        return c * m ** (-alpha) * math.sqrt(2.0 * beta_p * math.log(m))

    if sigma is None:
        # c m^-alpha sqrt(log m) peaks at m = exp(1 / (2 alpha)); check the integers beside it.
        peak = math.exp(min(1.0 / (2.0 * alpha), 700.0))
        candidates = {2, max(2, math.floor(peak)), max(2, math.ceil(peak))}
        sigma = math.nextafter(max(bound(m) for m in candidates), math.inf)
    else:
        sigma = check_real("sigma", sigma, low=0.0, low_open=True)
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
        s = check_real("stat_sensitivity", stat_sensitivity, low=0.0, low_open=True)
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
