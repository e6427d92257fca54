"""Statistics of the privacy auditor: Clopper-Pearson threshold tests that bound epsilon from
below, and white-box Gaussian estimates of a release's ``mu``. Pure NumPy and SciPy; see
:mod:`pymc_penalty.audit` for how they are used."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import optimize, stats

from pymc_penalty.accounting import composed_epsilon
from pymc_penalty.privacy.precision import ACCEPT_GRID

#: Most candidate thresholds tried per output on the selection half.
_MAX_THRESHOLDS = 2000
#: Probability that the white-box verdict fails an honest mechanism (shared by Bonferroni over
#: the fitted outputs): a fit whose estimate exceeds the claim by more than its standard error
#: times ``Phi^-1(1 - WHITE_BOX_FALSE_FAIL / fitted)`` fails the audit.
WHITE_BOX_FALSE_FAIL = 1e-3

# --- statistics -----------------------------------------------------------------------------


def _cp_upper(k: np.ndarray, n: int, level: float) -> np.ndarray:
    """One-sided Clopper-Pearson upper bounds at ``level`` for ``k`` successes in ``n``."""
    k = np.asarray(k, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        up = stats.beta.ppf(level, k + 1.0, np.maximum(n - k, 1e-300))
    return np.where(k >= n, 1.0, up)


def _as_column(values: Any) -> np.ndarray:
    col = np.asarray(values, dtype=np.float64).ravel()
    # A NaN is an outcome like any other; +inf sorts it to one end.
    return np.where(np.isnan(col), np.inf, col)


def _test_bounds(
    a: np.ndarray,
    b: np.ndarray,
    thresholds: np.ndarray,
    delta: float,
    level: float,
) -> np.ndarray:
    """Bounds of every test: shape (len(thresholds), 8).

    Columns: rejection region ``{o >= t}``, ``{o < t}``, ``{o <= t}``, ``{o > t}``, each with
    ``a``'s data set as the null and then with ``b``'s.
    """
    sa, sb = np.sort(a), np.sort(b)
    na, nb = sa.size, sb.size
    lt_a = np.searchsorted(sa, thresholds, "left")
    lt_b = np.searchsorted(sb, thresholds, "left")
    le_a = np.searchsorted(sa, thresholds, "right")
    le_b = np.searchsorted(sb, thresholds, "right")
    regions = [  # (count in region under a, under b)
        (na - lt_a, nb - lt_b),  # o >= t
        (lt_a, lt_b),  # o < t
        (le_a, le_b),  # o <= t
        (na - le_a, nb - le_b),  # o > t
    ]
    cols = []
    for in_a, in_b in regions:
        # null a: alpha = P_a(R), beta = P_b(not R); null b: the other way round.
        for alpha_k, n_null, beta_k, n_alt in (
            (in_a, na, nb - in_b, nb),
            (in_b, nb, na - in_a, na),
        ):
            alpha_u = _cp_upper(alpha_k, n_null, level)
            beta_u = _cp_upper(beta_k, n_alt, level)
            cols.append((alpha_u, beta_u))
    alpha = np.stack([c[0] for c in cols], axis=1)
    beta = np.stack([c[1] for c in cols], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        eps = np.log(np.maximum(1.0 - delta - beta, 0.0) / alpha)
    return np.stack([np.nan_to_num(eps, nan=-np.inf), alpha, beta], axis=-1)


def epsilon_lower_bound(
    samples: Any,
    samples_prime: Any,
    *,
    delta: float = 1e-5,
    confidence: float = 0.95,
    seed: int | np.random.Generator | None = 0,
) -> tuple[float, float, float]:
    """Empirical lower bound on epsilon from one output's samples under two data sets.

    The runs of each data set are split at random in halves. On the first halves the best
    threshold test is chosen (threshold, side, and which data set is the null hypothesis);
    on the second halves its false positive and false negative rates get one-sided
    Clopper-Pearson upper bounds ``alpha_u``, ``beta_u``, each at level
    ``1 - (1 - confidence) / 2``, and ``epsilon >= log((1 - delta - beta_u) / alpha_u)``.

    Parameters
    ----------
    samples, samples_prime : array_like
        The output in independent runs on each data set (booleans count as 0 and 1; NaN is a
        value of its own).
    delta : float, default 1e-5
    confidence : float, default 0.95
        Confidence of the bound.
    seed : int or Generator, optional
        Randomness of the split only (it never touches the mechanism).

    Returns
    -------
    tuple of float
        ``(epsilon_lb, alpha_u, beta_u)``; ``epsilon_lb`` is 0 when the test shows nothing.
    """
    return _threshold_audit(
        _as_column(samples),
        _as_column(samples_prime),
        delta=float(delta),
        level=1.0 - (1.0 - float(confidence)) / 2.0,
        rng=np.random.default_rng(seed),
    )


def _threshold_audit(
    a: np.ndarray, b: np.ndarray, *, delta: float, level: float, rng: np.random.Generator
) -> tuple[float, float, float]:
    if a.size < 4 or b.size < 4:
        raise ValueError("Need at least 4 runs per data set.")
    a = a[rng.permutation(a.size)]
    b = b[rng.permutation(b.size)]
    a_sel, a_eval = a[: a.size // 2], a[a.size // 2 :]
    b_sel, b_eval = b[: b.size // 2], b[b.size // 2 :]
    values = np.unique(np.concatenate([a_sel, b_sel]))
    if values.size > _MAX_THRESHOLDS:
        pos = np.linspace(0, values.size - 1, _MAX_THRESHOLDS).round().astype(np.int64)
        values = values[np.unique(pos)]
    sel = _test_bounds(a_sel, b_sel, values, delta, level)[..., 0]
    i, j = np.unravel_index(int(np.argmax(sel)), sel.shape)
    ev = _test_bounds(a_eval, b_eval, values[i : i + 1], delta, level)[0, j]
    return max(0.0, float(ev[0])), float(ev[1]), float(ev[2])


def gaussian_mu_estimate(
    samples: Any, samples_prime: Any, *, censor_above: float | None = None
) -> float:
    """White-box estimate of a Gaussian release's ``mu`` from its samples under two data sets.

    Fits ``N(m, s^2)`` and ``N(m', s^2)`` (one common sd, as a Gaussian mechanism has) by
    maximum likelihood and returns ``|m - m'| / s``. With ``censor_above``, values at or
    above it are treated as right-censored there (a Tobit fit). This is an *estimate* of the
    mechanism's ``mu``, not a bound; :func:`gaussian_mu_fit` also gives its standard error.

    Parameters
    ----------
    samples, samples_prime : array_like
        The release in independent runs on each data set; non-finite values are dropped.
    censor_above : float, optional
        Censoring point (for ``log(accept)``, which is ``min(0, log ratio)``: 0).

    Returns
    -------
    float
        The estimate (NaN when it cannot be fitted).
    """
    return gaussian_mu_fit(samples, samples_prime, censor_above=censor_above)[0]


def gaussian_mu_fit(
    samples: Any,
    samples_prime: Any,
    *,
    censor_above: float | None = None,
    censor_below: float | None = None,
) -> tuple[float, float]:
    """:func:`gaussian_mu_estimate` and its standard error, from the fit's own information.

    Without censoring the error is the delta method's on ``|m - m'| / s`` with the pooled sd:
    ``sqrt(1/N + 1/N' + mu^2 / (2 (N + N' - 2)))``. With censoring it is the delta method's on
    the inverse of the observed information (the numerical Hessian of the negative log
    likelihood at the fit, in ``(m, m', log s)``).

    ``censor_below`` (with ``censor_above``) also treats values below it (``-inf`` included)
    as left-censored there: ``log(accept)`` of an ``accept`` published as 0 on its grid.

    Returns
    -------
    (float, float)
        ``(estimate, standard error)``; NaN where it cannot be fitted.
    """
    a = np.asarray(samples, dtype=np.float64).ravel()
    b = np.asarray(samples_prime, dtype=np.float64).ravel()
    lo = -math.inf if censor_below is None else float(censor_below)
    # Below censor_below (-inf included: log of an accept published as 0) is censored there.
    low_a, low_b = int(np.sum(a < lo)), int(np.sum(b < lo))
    a, b = a[np.isfinite(a) & (a >= lo)], b[np.isfinite(b) & (b >= lo)]
    nan = (math.nan, math.nan)
    if a.size < 3 or b.size < 3:
        return nan
    if censor_above is None:
        s2 = (np.sum((a - a.mean()) ** 2) + np.sum((b - b.mean()) ** 2)) / (a.size + b.size - 2)
        if s2 <= 0.0:
            return (math.inf, 0.0) if a.mean() != b.mean() else nan
        mu = float(abs(a.mean() - b.mean()) / math.sqrt(s2))
        var = 1.0 / a.size + 1.0 / b.size + mu * mu / (2.0 * (a.size + b.size - 2))
        return mu, math.sqrt(var)
    c = float(censor_above)
    obs_a, obs_b = a[a < c], b[b < c]
    cens_a, cens_b = int(np.sum(a >= c)), int(np.sum(b >= c))
    if obs_a.size < 2 or obs_b.size < 2:
        return nan

    def nll(p: np.ndarray) -> float:
        m_a, m_b, log_s = p
        s = math.exp(log_s)
        out = 0.0
        for obs, cens, low, m in ((obs_a, cens_a, low_a, m_a), (obs_b, cens_b, low_b, m_b)):
            out -= float(np.sum(stats.norm.logpdf(obs, m, s)))
            if cens:
                out -= cens * float(stats.norm.logsf(c, m, s))
            if low:
                out -= low * float(stats.norm.logcdf(lo, m, s))
        return out

    pooled = np.concatenate([obs_a - obs_a.mean(), obs_b - obs_b.mean()])
    start = np.array([obs_a.mean(), obs_b.mean(), math.log(max(float(pooled.std()), 1e-12))])
    fit = optimize.minimize(
        nll, start, method="Nelder-Mead", options={"xatol": 1e-6, "fatol": 1e-6}
    )
    m_a, m_b, log_s = fit.x
    s = math.exp(log_s)
    mu = float(abs(m_a - m_b) / s)
    hess = _hessian(nll, fit.x, np.array([1e-3 * s, 1e-3 * s, 1e-3]))
    grad = np.array([1.0, -1.0, -(m_a - m_b)]) / s * math.copysign(1.0, m_a - m_b)
    try:
        var = float(grad @ np.linalg.solve(hess, grad))
    except np.linalg.LinAlgError:
        return mu, math.nan
    return mu, math.sqrt(var) if var > 0.0 else math.nan


def _hessian(f: Any, x: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Central-difference Hessian of ``f`` at ``x`` with steps ``h``."""
    k = x.size
    out = np.empty((k, k))
    for i in range(k):
        for j in range(i, k):
            ei, ej = np.eye(k)[i] * h[i], np.eye(k)[j] * h[j]
            val = (f(x + ei + ej) - f(x + ei - ej) - f(x - ei + ej) + f(x - ei - ej)) / (
                4.0 * h[i] * h[j]
            )
            out[i, j] = out[j, i] = val
    return out


def white_box_z(fitted: int, false_fail: float = WHITE_BOX_FALSE_FAIL) -> float:
    """The one-sided normal quantile of the white-box verdict: ``false_fail`` shared over
    ``fitted`` estimates (Bonferroni), so that an honest mechanism fails with probability at
    most ``false_fail`` (asymptotically, the estimates being normal)."""
    return float(stats.norm.isf(false_fail / max(int(fitted), 1)))


def _gaussian_estimate(kind: str, a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    if kind == "identity":
        return gaussian_mu_fit(a, b)
    if kind == "log-censored":
        # An accept published as 0 on its grid (pymc_penalty.privacy.precision) was below one grid
        # step: left-censored there, not dropped.
        with np.errstate(divide="ignore"):
            return gaussian_mu_fit(
                np.log(a), np.log(b), censor_above=0.0, censor_below=math.log(ACCEPT_GRID)
            )
    raise ValueError(f"Unknown Gaussian fit {kind!r}; use 'identity' or 'log-censored'.")


def _epsilon(delta: float, mu: float) -> float:
    """The accountant's conversion of one release's ``mu``; NaN stays NaN (no fit)."""
    return math.nan if math.isnan(mu) else composed_epsilon(mu * mu, delta)
