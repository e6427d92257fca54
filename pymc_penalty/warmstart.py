"""A private warm start: a noisy estimate of the posterior mode and curvature.

From a data-independent point (the model's initial point), a few steps of Fisher scoring
(the BHHH variant: the curvature is the outer product of the per-datapoint gradients) move
toward the posterior mode. Each step makes two Gaussian releases:

- the sum of the per-datapoint log-likelihood gradients, each clipped to L2 norm ``C``:
  L2 sensitivity ``2C`` for substitute-one neighbours, ``C`` for add/remove-one;
- the sum of the outer products ``g_i g_i^T`` of the same clipped gradients, released as the
  vector of its upper triangle with off-diagonal entries scaled by ``sqrt(2)`` (so its L2
  norm is the Frobenius norm): L2 sensitivity ``sqrt(2) C^2`` for substitute-one, since
  ``||a a^T - b b^T||_F^2 = ||a||^4 + ||b||^4 - 2 (a.b)^2 <= 2 C^4``, and ``C^2`` for
  add/remove-one.

Per-datapoint gradients are central finite differences of the compiled per-datapoint
log-likelihood vector. Their accuracy does not matter for privacy: clipping bounds the
sensitivity whatever the rows are, and non-finite rows are set to zero before clipping.
Each release's cost ``mu_t^2 = (Delta_t / sigma_t)^2`` is committed to the run's ledger
before the data are evaluated; the prior's gradient and Hessian carry no data and are exact.
Everything returned is post-processing of the releases and of the data-independent start.

Restrictions: the model must pass the same checks as :class:`PenaltyMetropolis`; the
outer-product curvature estimates the Fisher information, which equals the Hessian of the
log-likelihood for a correctly specified model (otherwise it is only a proposal shape, which
tuning refines: the chain's target is unaffected). Each step costs ``2 d + 1`` evaluations
of the per-datapoint log-likelihood (``d`` the number of unconstrained parameters).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pymc.pytensorf import compile as pm_compile
from pymc.pytensorf import join_nonshared_inputs, make_shared_replacements
from pytensor.gradient import hessian

from pymc_penalty.accounting import GDPAccountant
from pymc_penalty.likelihood import PenaltyLikelihood
from pymc_penalty.model_checks import validate_model
from pymc_penalty.sensitivity import Neighbours
from pymc_penalty.validation import (
    NEIGHBOUR_NAMES,
    check_choice,
    check_integer,
    check_ledger,
    check_model_data,
    check_real,
)

__all__ = ["WarmStart", "WarmStartRefused", "private_warm_start", "warm_start_schedule"]

#: Each step's ``mu^2`` is this many times the previous step's: late steps, near the mode,
#: need the small noise; early ones only need to point the right way.
_GROWTH = 1.6
#: Share of each step's ``mu^2`` spent on the outer-product (curvature) release.
_CURVATURE_SHARE = 0.1


class WarmStartRefused(RuntimeError):
    """The ledger refused a warm-start release (the data were not touched for it)."""


@dataclass(frozen=True)
class WarmStart:
    """Result of :func:`private_warm_start` (all of it is private post-processing).

    Attributes
    ----------
    point : ndarray, shape (d,)
        Estimated posterior mode on the raveled unconstrained space.
    covariance : ndarray, shape (d, d)
        Estimated posterior covariance there (inverse of the noisy curvature plus the
        prior's).
    initvals : dict
        ``point`` split per value variable (transformed names), for ``pm.sample(initvals=)``.
    mu : float
        Gaussian-DP ``mu`` of all warm-start releases together.
    releases : int
        Number of Gaussian releases made.
    """

    point: np.ndarray
    covariance: np.ndarray
    initvals: dict[str, np.ndarray]
    mu: float
    releases: int


def warm_start_schedule(mu: float, steps: int) -> list[tuple[float, float]]:
    """Per-step ``(mu_gradient, mu_curvature)`` whose squares sum to ``mu^2``.

    The curvature releases get 10% of ``mu^2`` in equal parts; the gradient release of step
    ``k`` gets a share of the rest proportional to ``1.6^k``.

    Parameters
    ----------
    mu : float
        Total Gaussian-DP ``mu`` of the warm start, ``> 0``.
    steps : int
        Number of Fisher-scoring steps, ``>= 1``.

    Returns
    -------
    list of (float, float)
    """
    weights = _GROWTH ** np.arange(steps, dtype=np.float64)
    grad_mu2 = mu**2 * (1.0 - _CURVATURE_SHARE) * weights / weights.sum()
    curv_mu = math.sqrt(mu**2 * _CURVATURE_SHARE / steps)
    return [(math.sqrt(m2), curv_mu) for m2 in grad_mu2]


class _Prior:
    """Compiled log prior (with Jacobians), its gradient and Hessian on the raveled space."""

    def __init__(self, model: pm.Model, value_vars: list, point: dict[str, np.ndarray]) -> None:
        prior = model.logp(vars=list(model.free_RVs) + list(model.potentials), jacobian=True)
        shared = make_shared_replacements(point, value_vars, model)
        (prior,), flat = join_nonshared_inputs(
            point=point, outputs=[prior], inputs=value_vars, shared_inputs=shared
        )
        grad = pt.grad(prior, flat)
        self._fn = pm_compile([flat], [grad, hessian(prior, flat)])
        self.dtype = np.dtype(flat.dtype)

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        grad, hess = self._fn(np.asarray(x, dtype=self.dtype))
        return np.asarray(grad, np.float64), np.asarray(hess, np.float64)


def _per_datapoint_gradients(lik: PenaltyLikelihood, x: np.ndarray, n: int) -> np.ndarray:
    """Central finite differences of the per-datapoint log-likelihood: shape (n, d)."""
    h_rel = np.finfo(lik.input_dtype).eps ** (1.0 / 3.0)
    grads = np.empty((n, x.size))
    for j in range(x.size):
        h = h_rel * max(1.0, abs(float(x[j])))
        up, down = x.copy(), x.copy()
        up[j] += h
        down[j] -= h
        ll_up, _ = lik.initial(up, n)
        ll_down, _ = lik.initial(down, n)
        with np.errstate(invalid="ignore", over="ignore"):
            grads[:, j] = (np.asarray(ll_up, np.float64) - ll_down) / (2.0 * h)
    return grads


def _clip_rows(grads: np.ndarray, clip: float) -> np.ndarray:
    """Zero non-finite rows, then scale every row to L2 norm at most ``clip``."""
    grads[~np.all(np.isfinite(grads), axis=1)] = 0.0
    norms = np.sqrt(np.einsum("ij,ij->i", grads, grads))
    scale = np.minimum(1.0, clip / np.maximum(norms, 1e-300))
    return grads * scale[:, None]


def _release_outer(clipped: np.ndarray, sd: float, noise: np.random.Generator) -> np.ndarray:
    """Release ``sum_i g_i g_i^T`` with noise sd ``sd`` on its Frobenius-isometric vector."""
    d = clipped.shape[1]
    outer = clipped.T @ clipped
    iu = np.triu_indices(d, 1)
    diag = np.diag(outer) + sd * noise.standard_normal(d)
    off = outer[iu] + (sd / math.sqrt(2.0)) * noise.standard_normal(iu[0].size)
    released = np.diag(diag)
    released[iu] = off
    released[(iu[1], iu[0])] = off
    return released


def _psd_precision(curv: np.ndarray, noise_sd: float, prior_hess: np.ndarray) -> np.ndarray:
    """Noisy curvature plus the prior's, positive definite.

    The curvature's eigenvalues are floored at ``2 sqrt(d)`` noise sds (about the spectral
    norm of the noise matrix): below it an eigenvalue is noise, and a near-zero one would send
    the Fisher-scoring step far away.
    """
    vals, vecs = np.linalg.eigh(0.5 * (curv + curv.T))
    floor = 2.0 * math.sqrt(curv.shape[0]) * noise_sd
    prec = (vecs * np.maximum(vals, floor)) @ vecs.T
    pvals, pvecs = np.linalg.eigh(-0.5 * (prior_hess + prior_hess.T))
    prec = prec + (pvecs * np.maximum(pvals, 0.0)) @ pvecs.T
    floor = 1e-8 * max(float(np.max(np.diag(prec))), 1e-12)
    return prec + floor * np.eye(prec.shape[0])


def private_warm_start(
    model: pm.Model | None = None,
    *,
    mu: float,
    ledger: Any,
    clip: float = 1.0,
    steps: int = 8,
    neighbours: str = "substitute",
    noise_rng: np.random.Generator | None = None,
    compile_kwargs: dict[str, Any] | None = None,
) -> WarmStart:
    """Estimate the posterior mode and covariance privately, spending ``mu`` from ``ledger``.

    Parameters
    ----------
    model : pm.Model, optional
    mu : float
        Gaussian-DP ``mu`` to spend in total (``mu^2`` is split over the releases by
        :func:`warm_start_schedule`).
    ledger : object
        A privacy ledger with ``try_spend(mu2) -> bool``; every release's cost is committed
        to it before the data are evaluated.
    clip : float, default 1.0
        L2 clip ``C`` of each per-datapoint gradient (on the unconstrained space).
    steps : int, default 8
        Fisher-scoring steps (two releases each).
    neighbours : {"substitute", "add_remove"}
    noise_rng : numpy.random.Generator, optional
        Source of the privacy noise; a fresh OS-entropy generator by default (pass a seeded
        one only for reproducible, non-private runs).
    compile_kwargs : dict, optional
        Passed to PyTensor's compile.

    Returns
    -------
    WarmStart

    Raises
    ------
    WarmStartRefused
        If the ledger refuses a release (nothing more is evaluated).
    ValueError
        If an argument is out of range.
    """
    model = pm.modelcontext(model)
    mu = check_real("mu", mu, low=0.0, low_open=True)
    clip = check_real("clip", clip, low=0.0, low_open=True)
    steps = check_integer("steps", steps, low=1)
    check_ledger(ledger)
    check_choice("neighbours", getattr(neighbours, "value", neighbours), NEIGHBOUR_NAMES)
    factor = Neighbours.parse(neighbours).factor
    grad_sens = factor * clip
    # Substitute: sqrt(2) C^2 (see the module notes); add/remove: C^2.
    outer_sens = (math.sqrt(2.0) if factor == 2.0 else 1.0) * clip**2
    noise = np.random.default_rng() if noise_rng is None else noise_rng

    point = model.initial_point()
    value_vars = list(model.value_vars)
    adds = Neighbours.parse(neighbours) is Neighbours.ADD_REMOVE
    n = validate_model(model, value_vars, add_remove=adds)
    check_model_data(model)  # NaN, inf, values outside the support: before any spend
    lik = PenaltyLikelihood(model, value_vars, point, compile_kwargs)
    prior = _Prior(model, value_vars, point)
    x = np.concatenate([np.ravel(point[v.name]) for v in value_vars]).astype(np.float64)

    spent = GDPAccountant()  # what this warm start committed, release by release
    schedule = warm_start_schedule(float(mu), int(steps))
    # Near the mode each iterate's error is the last step's noise alone (independent across
    # steps), so the last half of the iterates are averaged, weighted by their precision.
    averaged = range(len(schedule) // 2, len(schedule))
    sum_w, sum_wx, sum_wprec = 0.0, np.zeros(x.size), np.zeros((x.size, x.size))
    for k, (mu_grad, mu_curv) in enumerate(schedule):
        # Commit both releases of this step before the data are evaluated.
        for release_mu in (mu_grad, mu_curv):
            if not ledger.try_spend(release_mu**2):
                raise WarmStartRefused(
                    "The privacy ledger refused a warm-start release; lower `warm_start`."
                )
            spent.spend(release_mu)
        clipped = _clip_rows(_per_datapoint_gradients(lik, x, n), clip)
        grad = clipped.sum(axis=0) + (grad_sens / mu_grad) * noise.standard_normal(x.size)
        curv = _release_outer(clipped, outer_sens / mu_curv, noise)
        del clipped  # exact per-datapoint values: not kept past the releases
        prior_grad, prior_hess = prior(x)
        precision = _psd_precision(curv, outer_sens / mu_curv, prior_hess)
        x = x + np.linalg.solve(precision, grad + prior_grad)
        if k in averaged:
            sum_w += mu_grad**2
            sum_wx += mu_grad**2 * x
            sum_wprec += mu_grad**2 * precision

    x = sum_wx / sum_w
    covariance = np.linalg.inv(sum_wprec / sum_w)
    covariance = 0.5 * (covariance + covariance.T)
    initvals, start = {}, 0
    for v in value_vars:
        shape = np.shape(point[v.name])
        size = int(np.prod(shape, dtype=int))
        initvals[v.name] = x[start : start + size].reshape(shape).astype(point[v.name].dtype)
        start += size
    return WarmStart(
        point=x, covariance=covariance, initvals=initvals, mu=spent.mu, releases=spent.releases
    )
