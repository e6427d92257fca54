"""The warm start's releases in a metric built from earlier releases (pure NumPy, no PyMC).

Each per-datapoint gradient ``g_i`` is measured in a public metric ``P = L L^T`` (an estimate
of the per-datapoint Fisher information, a function of earlier releases only): the whitened
row is ``z_i = L^-1 g_i`` and its length ``||z_i|| = sqrt(g_i^T P^-1 g_i)`` is what is clipped.
One clip then fits every direction of an anisotropic posterior, where a clip in raw units must
cover the steepest direction (and clips nearly every row in the others' favour).

Three statistics are released, each with Gaussian noise on a vector whose L2 sensitivity is
stated here (``C`` the clip, ``T`` an outer-product term, Frobenius norm ``||T|| <= C^2``):

- the sum of clipped whitened gradients: ``2 C`` (substitute-one), ``C`` (add/remove-one);
- the sum of outer products of clipped whitened *differences of rows*. Differences remove the
  common mean of the gradients (far from the mode it dominates, and an uncentred outer
  product would mistake it for curvature): ``E[(g_i - g_j)(g_i - g_j)^T] = 2 Cov(g)``, the
  Fisher information twice, wherever the iterate is. Substitute-one uses disjoint pairs
  ``(0, 1), (2, 3), ...``: one row moves one term, so ``||T - T'||_F <= sqrt(2) C^2`` (both
  rank one and positive semi-definite: ``||A - B||^2 = ||A||^2 + ||B||^2 - 2 tr(AB)``).
  Add/remove-one uses the chain ``(0, 1), (1, 2), ...``: removing row ``i`` removes
  ``T_(i-1,i)`` and ``T_(i,i+1)`` and adds ``T_(i-1,i+1)`` (the rest only shift), so the change
  is at most ``sqrt(||T_1 + T_2||^2 + ||T_3||^2) <= sqrt(5) C^2``;
- the number of rows whose whitened length exceeds the clip (``clip="auto"``, from the second
  step on): each row adds 0 or 1, so 1 under either relation, the clipped count of the
  sampler's step (:func:`pymc_penalty.accounting.gdp.split_step_mu` splits a step's ``mu``
  between it and the gradient sum);
- the sum of ``log(||w_k||^2 / d)`` clipped to ``[-LOG_CLIP, LOG_CLIP]`` over the same
  differences whitened by a public shape (the scale of the first metric, scale-free), a tie
  (an exact zero difference) counting ``TIE_LOG`` (0), within the same range:
  ``2 LOG_CLIP`` (substitute-one), ``3 LOG_CLIP`` (add/remove-one).

With ``clip=None`` the outer-product terms are normalised (``C = 1``, each difference scaled
to unit length): the spatial-sign shape, which needs no scale at all.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.linalg import solve_triangular

from pymc_penalty.accounting.sensitivity import Neighbours

__all__ = [
    "LOG_CLIP",
    "TIE_LOG",
    "clipped_count",
    "clipped_whitened",
    "gradient_sensitivity",
    "log_scale_sensitivity",
    "log_scale_sum",
    "outer_sensitivity",
    "pair_differences",
    "pair_outer_sum",
]

#: Bound on each released ``log(||w||^2 / d)``: covers a factor ``e^25`` (about 7e10) between
#: the shape's scale and the data's; beyond it the scale is biased, never the privacy.
LOG_CLIP = 25.0
#: The term of a tie (an exact zero difference, common with discrete data): 0, the current
#: metric's unit, since it carries no information about the scale. At ``-LOG_CLIP`` (as
#: before) the ties of a Bernoulli response (58% of the pairs at p = 0.3) made the first metric
#: about ``e^14`` times too small: every row was then clipped, the clipped gradients' sum became
#: a sign test, and the warm start of a Beta-Bernoulli (n = 1e4, epsilon 1, a 20% share)
#: ended 4.7-36 posterior sds off (8 seeds); with 0, within 0.71 (8 seeds), and ``pp.sample``
#: 0.11-1.02 sd (4 seeds) against 52-57. Data without exact ties are unchanged bit for bit.
TIE_LOG = 0.0


def pair_differences(grads: np.ndarray, neighbours: Neighbours) -> np.ndarray:
    """Differences of rows: disjoint pairs (substitute-one) or the chain (add/remove-one).

    Parameters
    ----------
    grads : ndarray, shape (n, d)
        Per-datapoint gradients (finite).
    neighbours : Neighbours

    Returns
    -------
    ndarray, shape (n // 2, d) or (n - 1, d)
    """
    if neighbours is Neighbours.SUBSTITUTE:
        m = grads.shape[0] // 2
        return grads[0 : 2 * m : 2] - grads[1 : 2 * m : 2]
    return grads[:-1] - grads[1:]


def clipped_whitened(rows: np.ndarray, chol: np.ndarray | None, clip: float | None) -> np.ndarray:
    """Rows whitened by ``L^-1`` (``chol``; ``None`` for the identity), then each scaled to
    length at most ``clip`` (``None``: to length exactly 1, zero rows staying zero).

    Parameters
    ----------
    rows : ndarray, shape (k, d)
    chol : ndarray, shape (d, d) or None
        Lower Cholesky factor ``L`` of the public metric.
    clip : float or None

    Returns
    -------
    ndarray, shape (k, d)
    """
    white = rows if chol is None else solve_triangular(chol, rows.T, lower=True).T
    # A row whose whitened value overflowed adds nothing (still within the bound).
    white = np.where(np.all(np.isfinite(white), axis=1)[:, None], white, 0.0)
    with np.errstate(over="ignore"):
        norms = np.sqrt(np.einsum("ij,ij->i", white, white))
    if clip is None:
        scale = np.where(norms > 0, 1.0 / np.maximum(norms, 1e-300), 0.0)
    else:
        scale = np.minimum(1.0, clip / np.maximum(norms, 1e-300))
    return white * scale[:, None]


def clipped_count(
    rows: np.ndarray, chol: np.ndarray, clip: float, centre: np.ndarray | None = None
) -> int:
    """Number of rows whose whitened distance from a public centre, ``||L^-1 g_i - m||``,
    exceeds ``clip`` (a row whose whitened value overflowed counts).

    Parameters
    ----------
    rows : ndarray, shape (k, d)
    chol : ndarray, shape (d, d)
        Lower Cholesky factor ``L`` of the public metric.
    clip : float
    centre : ndarray, shape (d,), optional
        Public whitened centre ``m`` (zero by default).

    Returns
    -------
    int
    """
    white = solve_triangular(chol, rows.T, lower=True).T
    with np.errstate(over="ignore", invalid="ignore"):
        if centre is not None:
            white = white - centre
        norms = np.sqrt(np.einsum("ij,ij->i", white, white))
    return int(np.sum(~(norms <= clip)))  # NaN and inf: clipped


def pair_outer_sum(diffs: np.ndarray, chol: np.ndarray | None, clip: float | None) -> np.ndarray:
    """``sum_k w_k w_k^T`` of the clipped (or normalised) whitened differences.

    Parameters
    ----------
    diffs : ndarray, shape (k, d)
        :func:`pair_differences`.
    chol : ndarray or None
    clip : float or None

    Returns
    -------
    ndarray, shape (d, d)
    """
    w = clipped_whitened(diffs, chol, clip)
    return w.T @ w


def log_scale_sum(diffs: np.ndarray, chol: np.ndarray) -> float:
    """``sum_k clip(log(||L^-1 diff_k||^2 / d), -LOG_CLIP, LOG_CLIP)`` (a zero difference, a
    tie, gives :data:`TIE_LOG`).

    Parameters
    ----------
    diffs : ndarray, shape (k, d)
    chol : ndarray, shape (d, d)

    Returns
    -------
    float
    """
    white = solve_triangular(chol, diffs.T, lower=True).T
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        sq = np.einsum("ij,ij->i", white, white) / diffs.shape[1]
        logs = np.where(sq > 0.0, np.log(sq), TIE_LOG)
    logs = np.where(np.isnan(logs), LOG_CLIP, logs)  # an overflowed difference: the top
    return float(np.clip(logs, -LOG_CLIP, LOG_CLIP).sum())


def gradient_sensitivity(clip: float, neighbours: Neighbours) -> float:
    """L2 sensitivity of a sum of rows each of length at most ``clip``."""
    return neighbours.factor * clip


def outer_sensitivity(clip: float | None, neighbours: Neighbours) -> float:
    """Frobenius sensitivity of :func:`pair_outer_sum` (``clip=None``: normalised terms)."""
    c2 = 1.0 if clip is None else clip**2
    return (math.sqrt(2.0) if neighbours is Neighbours.SUBSTITUTE else math.sqrt(5.0)) * c2


def log_scale_sensitivity(neighbours: Neighbours) -> float:
    """Sensitivity of :func:`log_scale_sum`."""
    return (2.0 if neighbours is Neighbours.SUBSTITUTE else 3.0) * LOG_CLIP
