"""Algorithm 1's numerical core: the Laplace fit of pi_{n-1} and the search over records.

Internal to :mod:`pymc_penalty.contamination.empirical`. Every model is a GLM in
``mu = x^T theta``, so derivatives are taken in ``mu`` and the ball's max and min of
f_p(z | theta) are those over the interval ``x^T theta_ref +- r ||x||``, evaluated on a grid
that contains both ends and the clipped mode of f.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special

_CELLS = 2_000_000  # float64 cells per chunk of the (draws x records) log-likelihood


def _chunked_loglik(model, y, x, lg, rate, thetas) -> np.ndarray:
    """``sum_i log f_p(y_i | x_i^T theta_j)`` for each row theta_j."""
    out = np.empty(len(thetas))
    step = max(1, _CELLS // max(len(y), 1))
    shared_x = bool(np.all(x == x[0]))  # location model: one mu per draw, not per record
    for s in range(0, len(thetas), step):
        mu = (thetas[s : s + step] @ x[0])[:, None] if shared_x else thetas[s : s + step] @ x.T
        out[s : s + step] = model.log_fp(y[None, :], mu, lg[None, :], rate).sum(axis=1)
    return out


def _laplace(model, y, x, lg, rate, theta_ref):
    """MAP and negative Hessian of the log posterior on D (GLM: derivatives in mu)."""
    s2 = model.prior_sd**2
    h = 1e-4 * model.scale

    def parts(theta):
        mu = x @ theta
        l0 = model.log_fp(y, mu, lg, rate)
        lp, lm = model.log_fp(y, mu + h, lg, rate), model.log_fp(y, mu - h, lg, rate)
        return l0, (lp - lm) / (2 * h), (lp - 2 * l0 + lm) / h**2

    def fun(theta):
        l0, d1, _ = parts(theta)
        dev = theta - model.prior_mean
        return -(l0.sum() - 0.5 * dev @ dev / s2), -(x.T @ d1 - dev / s2)

    res = optimize.minimize(fun, theta_ref, jac=True, method="BFGS")
    mode = res.x
    _, _, d2 = parts(mode)
    hess = -(x.T * d2) @ x + np.eye(len(mode)) / s2
    vals, vecs = np.linalg.eigh(0.5 * (hess + hess.T))
    vals = np.maximum(vals, 1e-12 * max(vals.max(), 1.0))
    return mode, vecs, vals


def _y_grid(model, domain, centre, size):
    """Response grid, and which sides are unbounded (searched further for divergence)."""
    if model.binary:
        return np.array([0.0, 1.0]), (False, False), 0.0
    lo, hi = domain.y
    width = 50.0 * model.scale
    a, b = max(lo, centre - width), min(hi, centre + width)
    return np.linspace(a, b, size), (math.isinf(lo), math.isinf(hi)), width


class _Search:
    """Log-ratio objectives over the record domain for one set of weighted draws."""

    def __init__(self, model, thetas, logw, theta_ref, radius, rate, out_ball):
        self.model, self.thetas, self.logw = model, thetas, logw
        self.theta_ref, self.radius, self.rate = theta_ref, radius, rate
        self.out_ball = out_ball

    def objectives(self, x, ys):
        """log U/E, log E/L and pi(N^c | D + {z}) for z = (x, y) for every y in ``ys``."""
        m = self.model
        gx = x[None, :] if (m.density is not None and m.density.uses_covariates) else None
        lg = m.log_g(ys, gx)
        mu = self.thetas @ x
        lfp = m.log_fp(ys[None, :], mu[:, None], lg[None, :], self.rate)
        log_e = special.logsumexp(self.logw[:, None] + lfp, axis=0)
        with np.errstate(divide="ignore"):
            log_out = (
                special.logsumexp(self.logw[self.out_ball, None] + lfp[self.out_ball], axis=0)
                if self.out_ball.any()
                else np.full(len(ys), -np.inf)
            )
        centre, half = float(self.theta_ref @ x), self.radius * float(np.linalg.norm(x))
        cand = np.linspace(centre - half, centre + half, 65)[:, None] * np.ones(len(ys))
        mode = m.mode(ys)
        if mode is not None:
            cand = np.vstack([cand, np.clip(mode, centre - half, centre + half)[None, :]])
        lc = m.log_fp(ys[None, :], cand, lg[None, :], self.rate)
        with np.errstate(invalid="ignore"):
            up, down = lc.max(axis=0) - log_e, log_e - lc.min(axis=0)
        return up, down, np.exp(log_out - log_e)


def _sup(search, x, domain, model):
    """Sup over y of both objectives (and of delta(z)) at covariates x; inf if unbounded."""
    grid, unbounded, width = _y_grid(model, domain, float(search.theta_ref @ x), domain.grid)
    up, down, dz = search.objectives(x, grid)
    best = []
    for obj_index, values in enumerate((up, down)):
        values = np.where(np.isnan(values), np.inf, values)
        i = int(np.argmax(values))
        top = float(values[i])
        if not model.binary and 0 < i < len(grid) - 1:
            fine = np.linspace(grid[i - 1], grid[i + 1], 65)
            top = max(top, float(np.max(search.objectives(x, fine)[obj_index])))
        far = []
        if unbounded[1]:
            far += list(grid[-1] + width * np.array([1.0, 3.0, 7.0]))
        if unbounded[0]:
            far += list(grid[0] - width * np.array([1.0, 3.0, 7.0]))
        if far:
            far_vals = search.objectives(x, np.array(far))[obj_index]
            if np.any(~np.isfinite(far_vals)) or np.max(far_vals) > top + 1e-6 * (1 + abs(top)):
                top = math.inf  # the ratio keeps growing beyond any box: no finite epsilon
        best.append(top)
    return best[0], best[1], float(np.max(dz))
