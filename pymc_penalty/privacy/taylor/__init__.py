"""Taylor control variates for the penalty test: one release of the Taylor sums, then residuals.

Pure NumPy (no PyMC import). Coordinates are whitened at a public reference point ``t`` by a
public factor ``L`` (for example the private warm start's released Cholesky factor of the
posterior covariance): ``x = t + L w``. A row's gradient and Hessian in ``w`` are ``L' g_i`` and
``L' H_i L``.

The scheme (``docs/algorithm.md``, "Taylor control variates"):

1. Clip each row's whitened gradient to L2 norm ``c_g`` and its whitened Hessian to Frobenius
   norm ``c_H`` (:func:`clip_rows`, :func:`clip_rank_one_rows`). The clipped rows define each
   row's Taylor model ``m_i(w) = g_i.w + w' H_i w / 2`` (clipped ``g_i``, ``H_i``).
2. Release ``G = sum g_i`` and ``H = sum H_i`` once with Gaussian noise (:func:`release_sums`).
   One row moves ``G`` by at most ``2 c_g`` (substitute-one) or ``c_g`` (add/remove-one) in L2,
   and ``H`` by ``2 c_H`` or ``c_H`` in Frobenius norm (:func:`oneshot_sensitivities`). ``H``'s
   noise is :func:`symmetric_noise`, whose upper triangle (off-diagonal entries scaled by
   ``sqrt 2``) is isotropic, so the Frobenius sensitivity is the L2 sensitivity of that vector.
3. At each step release only the clipped residual sum ``sum_i clip(rho_i, B) + N(0, s^2)``,
   ``rho_i(w, w') = [l_i(w') - m_i(w')] - [l_i(w) - m_i(w)]`` (:func:`residual_rows`,
   :func:`residual_bound`, :func:`clipped_residual_sum`), and accept on
   ``M_rel(w') - M_rel(w) + released residual - s^2 / 2`` (:func:`taylor_log_ratio`).

Without residual clipping the chain's target is the posterior tilted by the one-shot noise,
``p(w) exp(sum_i l_i(w) + xi_G.w + w' Xi_H w / 2)`` (:func:`tilted_log_target`), whatever the
one-shot clip: the clipped-away part of a row's Taylor terms stays in its residual.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import numpy as np

from pymc_penalty.privacy.precision import gaussian_release, snap_noisy

__all__ = [
    "ClippedRows",
    "TaylorRelease",
    "clip_packed_rows",
    "clip_rank_one_rows",
    "clip_rows",
    "clipped_residual_sum",
    "combine_releases",
    "curvature_floor",
    "hessian_noise_sds",
    "noise_aware_draws",
    "oneshot_sensitivities",
    "packed_frobenius",
    "packed_index",
    "packed_sums",
    "release_packed",
    "release_packed_sums",
    "release_sums",
    "residual_bound",
    "residual_rows",
    "residual_sensitivity",
    "symmetric_noise",
    "taylor_log_ratio",
    "tilt_mean_sd",
    "tilted_log_target",
    "whiten_rows",
]

Relation = Literal["substitute", "add_remove"]


def _factor(relation: Relation) -> float:
    """L2 sensitivity of a sum of per-row terms of norm at most 1, by neighbour relation."""
    if relation == "substitute":
        return 2.0
    if relation == "add_remove":
        return 1.0
    raise ValueError(f"relation must be 'substitute' or 'add_remove', got {relation!r}")


class ClippedRows(NamedTuple):
    """Each row's clipped whitened Taylor terms.

    Attributes
    ----------
    g : ndarray, shape (n, d)
        Clipped whitened gradients (L2 norm at most ``c_g``).
    H : ndarray, shape (n, d, d) or None
        Clipped whitened Hessians (Frobenius norm at most ``c_H``); ``None`` for a first-order
        model or when stored in rank-one form.
    z : ndarray, shape (n, d) or None
        Rank-one form ``H_i = -h_i z_i z_i'`` (generalised linear rows): the whitened covariates.
    h : ndarray, shape (n,) or None
        Rank-one form: the clipped curvature scalars.
    g_clipped : ndarray of bool, shape (n,)
        Rows whose gradient was clipped.
    H_clipped : ndarray of bool, shape (n,)
        Rows whose Hessian was clipped (all ``False`` for a first-order model).
    """

    g: np.ndarray
    H: np.ndarray | None
    z: np.ndarray | None
    h: np.ndarray | None
    g_clipped: np.ndarray
    H_clipped: np.ndarray

    def sums(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Exact clipped sums ``(G, H)`` (``H`` is ``None`` for a first-order model)."""
        G = self.g.sum(axis=0)
        if self.H is not None:
            return G, self.H.sum(axis=0)
        if self.z is not None and self.h is not None:
            return G, -np.einsum("i,ij,ik->jk", self.h, self.z, self.z)
        return G, None

    def model(self, w: np.ndarray) -> np.ndarray:
        """Each row's Taylor model ``m_i(w) = g_i.w + w' H_i w / 2``, shape (n,)."""
        w = np.asarray(w, dtype=float)
        m = self.g @ w
        if self.H is not None:
            m = m + 0.5 * np.einsum("ijk,j,k->i", self.H, w, w)
        elif self.z is not None and self.h is not None:
            m = m - 0.5 * self.h * (self.z @ w) ** 2
        return m


class TaylorRelease(NamedTuple):
    """The one-shot release of the Taylor sums (all public after release).

    Attributes
    ----------
    G, H : ndarray
        Released (noisy) sums; ``H`` is ``None`` for a first-order release. Each entry is on
        the grid of its noise sd (:func:`pymc_penalty.privacy.precision.noise_grid`).
    sd_G, sd_H : float
        Noise standard deviations: ``G``'s coordinates have sd ``sd_G``; ``H``'s diagonal has sd
        ``sd_H`` and its off-diagonal entries ``sd_H / sqrt 2`` (:func:`symmetric_noise`,
        :func:`hessian_noise_sds`).
    mu2 : float
        The release's GDP cost ``(Delta_G / sd_G)^2 + (Delta_H / sd_H)^2``.
    """

    G: np.ndarray
    H: np.ndarray | None
    sd_G: float
    sd_H: float
    mu2: float

    def model(self, w: np.ndarray) -> float:
        """Released Taylor model ``M_rel(w) = G.w + w' H w / 2``."""
        w = np.asarray(w, dtype=float)
        out = float(self.G @ w)
        if self.H is not None:
            out += 0.5 * float(w @ self.H @ w)
        return out


def whiten_rows(
    grads: np.ndarray, hessians: np.ndarray | None, L: np.ndarray
) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-row gradients and Hessians in whitened coordinates ``x = t + L w``.

    Parameters
    ----------
    grads : ndarray, shape (n, d)
        Per-row gradients at ``t`` in raw coordinates.
    hessians : ndarray, shape (n, d, d) or None
        Per-row Hessians at ``t`` in raw coordinates.
    L : ndarray, shape (d, d)
        Public whitening factor.

    Returns
    -------
    tuple of ndarray
        ``(grads @ L, L' H_i L)``.
    """
    L = np.asarray(L, dtype=float)
    gw = np.asarray(grads, dtype=float) @ L
    if hessians is None:
        return gw, None
    Hw = np.einsum("ji,njk,kl->nil", L, np.asarray(hessians, dtype=float), L)
    return gw, Hw


def _clip_factor(norms: np.ndarray, c: float) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.where(norms > c, c / norms, 1.0)
    return np.where(np.isfinite(f), f, 0.0)


def clip_rows(
    g: np.ndarray, H: np.ndarray | None, c_g: float, c_H: float | None = None
) -> ClippedRows:
    """Clip whitened rows: gradients in L2 norm at ``c_g``, Hessians in Frobenius norm at ``c_H``.

    Parameters
    ----------
    g : ndarray, shape (n, d)
        Whitened per-row gradients.
    H : ndarray, shape (n, d, d) or None
        Whitened per-row Hessians (symmetric); ``None`` for a first-order model.
    c_g, c_H : float
        Clips (``c_H`` needed when ``H`` is given).

    Returns
    -------
    ClippedRows
    """
    g = np.asarray(g, dtype=float)
    with np.errstate(over="ignore"):  # a norm past the float range clips the row to zero
        fg = _clip_factor(np.linalg.norm(g, axis=1), float(c_g))
    gc = g * fg[:, None]
    if H is None:
        return ClippedRows(gc, None, None, None, fg < 1.0, np.zeros(len(g), dtype=bool))
    if c_H is None:
        raise ValueError("c_H is required with Hessians")
    H = np.asarray(H, dtype=float)
    with np.errstate(over="ignore"):
        fH = _clip_factor(np.sqrt(np.einsum("ijk,ijk->i", H, H)), float(c_H))
    return ClippedRows(gc, H * fH[:, None, None], None, None, fg < 1.0, fH < 1.0)


def clip_rank_one_rows(
    z: np.ndarray, a: np.ndarray, h: np.ndarray | None, c_g: float, c_H: float | None = None
) -> ClippedRows:
    """:func:`clip_rows` for generalised-linear rows, ``g_i = a_i z_i``, ``H_i = -h_i z_i z_i'``.

    ``z_i = L' x_i`` is the whitened covariate row, ``a_i = dl_i/deta`` and
    ``h_i = -d^2 l_i/deta^2`` at ``t``. Then ``||g_i|| = |a_i| ||z_i||`` and
    ``||H_i||_F = |h_i| ||z_i||^2``; the clipped Hessian stays rank one (scalar ``h_i``).
    """
    z = np.asarray(z, dtype=float)
    a = np.asarray(a, dtype=float)
    with np.errstate(over="ignore"):
        zn = np.linalg.norm(z, axis=1)
        fg = _clip_factor(np.abs(a) * zn, float(c_g))
    gc = z * (a * fg)[:, None]
    if h is None:
        return ClippedRows(gc, None, None, None, fg < 1.0, np.zeros(len(z), dtype=bool))
    if c_H is None:
        raise ValueError("c_H is required with curvatures")
    h = np.asarray(h, dtype=float)
    with np.errstate(over="ignore"):
        fH = _clip_factor(np.abs(h) * zn**2, float(c_H))
    return ClippedRows(gc, None, z, h * fH, fg < 1.0, fH < 1.0)


def packed_index(d: int) -> tuple[np.ndarray, np.ndarray]:
    """The upper triangle (diagonal included), row by row: the packed order of a Hessian."""
    return np.triu_indices(d)


def packed_frobenius(h_packed: np.ndarray, d: int) -> np.ndarray:
    """Frobenius norms of packed symmetric matrices (:func:`packed_index`), shape (n,)."""
    j, k = packed_index(d)
    weight = np.where(j == k, 1.0, 2.0)  # each off-diagonal entry appears twice
    return np.sqrt(np.einsum("ik,k->i", h_packed**2, weight))


def clip_packed_rows(
    g: np.ndarray, h_packed: np.ndarray | None, c_g: float, c_H: float | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`clip_rows` on Hessians stored packed (:func:`packed_index`), ``n x d(d+1)/2``.

    Returns ``(coef, g_clipped, H_clipped)`` where ``coef`` is ``[g_i, H_i packed]`` clipped
    (the coefficients of :func:`pymc_penalty.model.likelihood.taylor_features`). Rows with a
    non-finite entry are set to zero first: a row that cannot be differentiated adds no
    Taylor term (its whole log-likelihood stays in its clipped residual).
    """
    g = np.asarray(g, dtype=float)
    bad = ~np.all(np.isfinite(g), axis=1)
    if h_packed is not None:
        h_packed = np.asarray(h_packed, dtype=float)
        bad |= ~np.all(np.isfinite(h_packed), axis=1)
        h_packed = np.where(bad[:, None], 0.0, h_packed)
    g = np.where(bad[:, None], 0.0, g)
    with np.errstate(over="ignore"):  # a norm past the float range clips the row to zero
        fg = _clip_factor(np.linalg.norm(g, axis=1), float(c_g))
    gc = g * fg[:, None]
    if h_packed is None:
        return gc, fg < 1.0, np.zeros(len(g), dtype=bool)
    if c_H is None:
        raise ValueError("c_H is required with Hessians")
    with np.errstate(over="ignore"):
        fH = _clip_factor(packed_frobenius(h_packed, g.shape[1]), float(c_H))
    return np.concatenate([gc, h_packed * fH[:, None]], axis=1), fg < 1.0, fH < 1.0


def packed_sums(coef: np.ndarray, d: int) -> np.ndarray:
    """The exact column sums of packed coefficients (:func:`clip_packed_rows`): ``G`` then,
    for a second-order model, ``H`` packed (:func:`packed_index`), one vector of ``d`` or
    ``d + d (d + 1) / 2`` values. The sums of disjoint sets of rows add up to their union's:
    a sharded table's are its shards' summed."""
    coef = np.asarray(coef, dtype=float)
    if coef.shape[1] <= d:
        return coef[:, :d].sum(axis=0)
    return np.concatenate([coef[:, :d].sum(axis=0), coef[:, d:].sum(axis=0)])


def release_packed(
    sums: np.ndarray,
    d: int,
    c_g: float,
    c_H: float | None,
    mu_G: float,
    mu_H: float,
    rng: np.random.Generator,
    relation: Relation = "substitute",
) -> TaylorRelease:
    """:func:`release_sums` of exact packed sums (:func:`packed_sums`)."""
    sums = np.asarray(sums, dtype=float)
    G, H = sums[:d], None
    if c_H is not None and sums.size > d:
        j, k = packed_index(d)
        H = np.zeros((d, d))
        H[j, k] = sums[d:]
        H = H + np.triu(H, 1).T
    return _noisy_sums(G, H, c_g, c_H, mu_G, mu_H, rng, relation)


def release_packed_sums(
    coef: np.ndarray,
    d: int,
    c_g: float,
    c_H: float | None,
    mu_G: float,
    mu_H: float,
    rng: np.random.Generator,
    relation: Relation = "substitute",
) -> TaylorRelease:
    """:func:`release_sums` for packed coefficients (:func:`clip_packed_rows`)."""
    return release_packed(packed_sums(coef, d), d, c_g, c_H, mu_G, mu_H, rng, relation)


def oneshot_sensitivities(
    c_g: float, c_H: float | None, relation: Relation = "substitute"
) -> tuple[float, float]:
    """L2 sensitivities of the clipped sums ``(G, H)``; ``H`` in Frobenius norm.

    Substitute-one: ``(2 c_g, 2 c_H)`` (one row's clipped term leaves, another arrives, each of
    norm at most the clip; the triangle inequality is attained by antipodal rows).
    Add/remove-one: ``(c_g, c_H)``. ``c_H = None`` gives ``0`` for ``H``.
    """
    k = _factor(relation)
    return k * float(c_g), (0.0 if c_H is None else k * float(c_H))


def symmetric_noise(d: int, sd: float, rng: np.random.Generator) -> np.ndarray:
    """Symmetric Gaussian matrix: diagonal sd ``sd``, off-diagonal sd ``sd / sqrt 2``.

    Its vector ``(diagonal, sqrt 2 * upper triangle)`` is ``N(0, sd^2 I)`` and has the same L2
    norm as the matrix's Frobenius norm: a Frobenius sensitivity ``Delta`` gives a
    ``Delta / sd``-GDP release.
    """
    A = rng.normal(0.0, sd, size=(d, d))
    return (A + A.T) / 2.0 if d > 0 else A


#: Noise sds (of the released Hessian's spectrum) below which a released curvature is not
#: told from none (:func:`curvature_floor`).
CURVATURE_FLOOR_SDS = 3.0


def curvature_floor(sd_H: float, d: int) -> float:
    """The least curvature a released ``d x d`` Hessian of entry noise sd ``sd_H`` tells from
    none: :data:`CURVATURE_FLOOR_SDS` times the noise sd of its spectrum, about ``sd_H
    sqrt(d)`` (:func:`symmetric_noise`). The released mode search reads any flatter (or
    upturned) direction as this (public values only)."""
    return CURVATURE_FLOOR_SDS * float(sd_H) * math.sqrt(d)


def hessian_noise_sds(d: int, sd: float) -> np.ndarray:
    """The noise sd of each entry of a released ``d x d`` Hessian (:func:`symmetric_noise`):
    ``sd`` on the diagonal, ``sd / sqrt 2`` off it (the sds its grid is tied to)."""
    return np.where(np.eye(d, dtype=bool), float(sd), float(sd) / np.sqrt(2.0))


def release_sums(
    rows: ClippedRows,
    c_g: float,
    c_H: float | None,
    mu_G: float,
    mu_H: float,
    rng: np.random.Generator,
    relation: Relation = "substitute",
) -> TaylorRelease:
    """Release the clipped Taylor sums once, at GDP cost ``mu_G^2 + mu_H^2``.

    Parameters
    ----------
    rows : ClippedRows
        Output of :func:`clip_rows` or :func:`clip_rank_one_rows` with the same clips.
    c_g, c_H : float
        The clips used (``c_H`` ``None`` for a first-order release).
    mu_G, mu_H : float
        GDP shares of ``G`` and ``H`` (``mu_H`` ignored when ``c_H`` is ``None``).
    rng : numpy.random.Generator
        Privacy noise source.
    relation : {"substitute", "add_remove"}
        Neighbour relation.

    Returns
    -------
    TaylorRelease
    """
    G, H = rows.sums()
    return _noisy_sums(G, H, c_g, c_H, mu_G, mu_H, rng, relation)


def _noisy_sums(
    G: np.ndarray,
    H: np.ndarray | None,
    c_g: float,
    c_H: float | None,
    mu_G: float,
    mu_H: float,
    rng: np.random.Generator,
    relation: Relation,
) -> TaylorRelease:
    """The exact clipped sums ``(G, H)`` with their Gaussian noise (one place for both
    storage forms), each entry rounded to the grid of its noise sd where the noise is added
    (:mod:`pymc_penalty.privacy.precision`): the unrounded sums are never returned."""
    if mu_G <= 0.0:
        raise ValueError("mu_G must be positive")
    dG, dH = oneshot_sensitivities(c_g, c_H, relation)
    sd_G = dG / mu_G
    d = G.shape[0]
    G_rel = gaussian_release(G, sd_G, rng)
    if H is None or c_H is None:
        return TaylorRelease(G_rel, None, sd_G, 0.0, mu_G**2)
    if mu_H <= 0.0:
        raise ValueError("mu_H must be positive for a second-order release")
    sd_H = dH / mu_H
    H_rel = snap_noisy(H + symmetric_noise(d, sd_H, rng), hessian_noise_sds(d, sd_H))
    return TaylorRelease(G_rel, H_rel, sd_G, sd_H, mu_G**2 + mu_H**2)


def combine_releases(a: TaylorRelease, b: TaylorRelease) -> TaylorRelease:
    """Two releases of the same clipped sums (same rows, expansion point, whitening and clips),
    weighted by their inverse noise variances (post-processing of both).

    The result's noise has sd ``(sd_a^-2 + sd_b^-2)^-1/2`` per entry (each of ``G`` and ``H``
    on its own), as one release spending ``mu2_a + mu2_b`` would: Gaussian noises of the
    same sum combine without loss. Both must be of the same order.
    """

    def weighted(x, y, sx: float, sy: float) -> tuple[np.ndarray, float]:
        wx, wy = 1.0 / sx**2, 1.0 / sy**2
        return (wx * x + wy * y) / (wx + wy), 1.0 / math.sqrt(wx + wy)

    if (a.H is None) != (b.H is None):
        raise ValueError("combine_releases needs two releases of the same order")
    G, sd_G = weighted(a.G, b.G, a.sd_G, b.sd_G)
    H, sd_H = None, 0.0
    if a.H is not None:
        H, sd_H = weighted(a.H, b.H, a.sd_H, b.sd_H)
    return TaylorRelease(G, H, sd_G, sd_H, a.mu2 + b.mu2)


def residual_rows(
    ll_new: np.ndarray,
    ll_old: np.ndarray,
    rows: ClippedRows,
    w_new: np.ndarray,
    w_old: np.ndarray,
) -> np.ndarray:
    """Per-row residual ``rho_i = [l_i(w') - m_i(w')] - [l_i(w) - m_i(w)]``.

    ``ll_new``, ``ll_old`` are the rows' log-likelihoods at ``w'`` and ``w``. A row whose
    log-likelihood difference is NaN (impossible at both points) gets 0, as in the compiled
    likelihood (:func:`pymc_penalty.model.likelihood.clipped_ratio_sum`): it adds nothing,
    which keeps the released difference antisymmetric.
    """
    rho = (np.asarray(ll_new) - rows.model(w_new)) - (np.asarray(ll_old) - rows.model(w_old))
    return np.where(np.isnan(rho), 0.0, rho)


def residual_bound(
    w_old: np.ndarray, w_new: np.ndarray, r: float, power: int, floor: float = 1.0
) -> float:
    """Per-row residual bound ``B = r * max(||w||, ||w'||, floor)^power * ||w' - w||``.

    Symmetric in ``(w, w')`` (so the penalty chain stays exact). ``power`` is the order of the
    Taylor model: a model exact to order ``k`` leaves a residual whose gradient is of order
    ``k`` in the distance to ``t``, so ``|rho_i| <= sup ||grad rho_i|| * ||w' - w||`` scales
    as ``R^k ||w' - w||`` on the ball of radius ``R = max(||w||, ||w'||)``. ``floor`` keeps the
    bound from vanishing at ``t``, where rows whose Taylor terms were clipped keep a residual of
    lower order.
    """
    radius = max(float(np.linalg.norm(w_old)), float(np.linalg.norm(w_new)), float(floor))
    return float(r) * radius**power * float(np.linalg.norm(np.asarray(w_new) - w_old))


def clipped_residual_sum(rho: np.ndarray, bound: float) -> tuple[float, int]:
    """``(sum_i clip(rho_i, -B, B), number of rows clipped)``."""
    rho = np.asarray(rho, dtype=float)
    clipped = np.abs(rho) > bound
    return float(np.clip(rho, -bound, bound).sum()), int(np.count_nonzero(clipped))


def residual_sensitivity(bound: float, relation: Relation = "substitute") -> float:
    """L2 sensitivity of the clipped residual sum: ``2 B`` (substitute-one) or ``B``."""
    return _factor(relation) * float(bound)


def taylor_log_ratio(
    release: TaylorRelease,
    w_old: np.ndarray,
    w_new: np.ndarray,
    residual_released: float,
    noise_sd: float,
    log_prior_ratio: float = 0.0,
) -> float:
    """The penalty test's log acceptance ratio on the Taylor path.

    ``log_prior_ratio + M_rel(w') - M_rel(w) + residual_released - noise_sd^2 / 2``, where
    ``residual_released`` is the clipped residual sum plus ``N(0, noise_sd^2)``. Accept when
    ``log U`` is below it.
    """
    return (
        float(log_prior_ratio)
        + release.model(w_new)
        - release.model(w_old)
        + float(residual_released)
        - 0.5 * float(noise_sd) ** 2
    )


def tilt_mean_sd(
    covariance: np.ndarray, L: np.ndarray, sd_G: float, index: np.ndarray | None = None
) -> float:
    """The one-shot ``G`` noise's sd on the posterior means, in posterior sds (RMS over the
    coordinates).

    The tilt ``xi . u`` with ``u = E (x - t)`` (``E x = L^-1 x[index]``) and ``xi ~ N(0,
    sd_G^2 I)`` moves the mode of a Gaussian target of covariance ``C`` by ``C E' xi``, whose
    sd on coordinate ``j`` is ``sd_G ||(C E')_j||``; over ``sqrt(C_jj)`` that is the error of
    the ``j``-th mean the noise causes, in that target's sds. It equals ``sd_G`` where
    ``L L' = C`` (the whitening is the posterior's), and is larger where the whitening is
    narrower than the posterior (``sd_G`` is in whitened units). Public inputs only.

    Parameters
    ----------
    covariance : ndarray, shape (d, d)
        The target's covariance ``C`` (the released model's, every coordinate).
    L : ndarray, shape (k, k)
        The whitening factor on ``index``.
    sd_G : float
        The noise sd of each whitened coordinate of ``G``.
    index : ndarray of int, optional
        The coordinates ``u`` lives on (None: all ``d``, with ``k = d``).

    Returns
    -------
    float
    """
    C = np.asarray(covariance, dtype=np.float64)
    cols = np.arange(C.shape[0]) if index is None else np.asarray(index)
    # (C E')' = E C = L^-1 C[index, :]
    shift = float(sd_G) * np.linalg.norm(np.linalg.solve(np.asarray(L, float), C[cols, :]), axis=0)
    return float(np.sqrt(np.mean(shift**2 / np.diag(C))))


def tilted_log_target(
    log_prior: float,
    loglik: float,
    w: np.ndarray,
    xi_G: np.ndarray,
    Xi_H: np.ndarray | None,
) -> float:
    """Log of the chain's target (up to a constant) when no residual is clipped.

    ``log p(w) + sum_i l_i(w) + xi_G.w + w' Xi_H w / 2``: the posterior tilted by the one-shot
    noise ``(xi_G, Xi_H) = (G_rel - G, H_rel - H)``, in whitened coordinates (``w = L^{-1}(x -
    t)``; the prior density in ``w`` differs from that in ``x`` by the constant ``log|L|``).
    """
    w = np.asarray(w, dtype=float)
    out = float(log_prior) + float(loglik) + float(np.asarray(xi_G) @ w)
    if Xi_H is not None:
        out += 0.5 * float(w @ Xi_H @ w)
    return out


#: :func:`noise_aware_draws` keeps a Hessian noise draw only where it moves every precision
#: direction by a factor within [0.5, 2].
_MIN_PRECISION_RATIO = 0.5


def noise_aware_draws(
    draws: np.ndarray,
    sd_G: float,
    sd_H: float,
    rng: np.random.Generator,
    max_tries: int = 100,
    embed: np.ndarray | None = None,
) -> np.ndarray:
    """Integrate the one-shot noise out of draws of the tilted posterior (Gaussian regime).

    The chain targets ``N(m_t, Q^{-1})`` with ``Q = P - Xi_H`` and ``Q m_t = b + xi_G``, where
    ``N(P^{-1} b, P^{-1})`` is the untilted posterior (whitened coordinates). With ``Q`` and
    ``m_t`` estimated from the draws, each draw ``w_j`` gets its own noise pair
    ``(xi*, Xi*)`` from the release's known law and is mapped to
    ``m* + A* (w_j - m_t)``, ``P* = Q + Xi*``, ``m* = P*^{-1} (Q m_t - xi*)``,
    ``A* = chol(P*^{-1}) chol(Q^{-1})^{-1}``: the draws then follow the predictive law of the
    untilted posterior given the released one. Post-processing of released draws and the
    release's public noise law: no privacy cost. Draws ``Xi*`` that change a precision
    direction of ``Q`` by more than a factor 2 (``P*`` near singular: the map would stretch
    draws without limit) are redrawn, at most ``max_tries`` times, then ``Xi* = 0``: the
    Hessian noise's law is truncated there, an approximation of the Gaussian regime.

    Parameters
    ----------
    draws : ndarray, shape (m, d)
        Draws of the tilted posterior in whitened coordinates.
    sd_G, sd_H : float
        The release's noise sds (:class:`TaylorRelease`).
    rng : numpy.random.Generator
        Source of the post-processing noise (need not be private).
    embed : ndarray, shape (k, d), optional
        The released model's coordinates ``u = E w`` when they are not the draws' own (the
        Taylor model on the coordinates the likelihood depends on): the noise pair
        ``(xi, Xi)`` of ``u`` acts on ``w`` as ``(E' xi, E' Xi E)``. None: ``E = I``.

    Returns
    -------
    ndarray, shape (m, d)
    """
    draws = np.asarray(draws, dtype=float)
    m, d = draws.shape
    E = np.eye(d) if embed is None else np.asarray(embed, dtype=float)
    k = E.shape[0]
    mean = draws.mean(axis=0)
    cov = np.atleast_2d(np.cov(draws, rowvar=False))
    Q = np.linalg.inv(cov)
    b = Q @ mean
    C = np.linalg.cholesky(cov)
    out = np.empty_like(draws)
    # Q^{-1/2}: a noise pair is used only where it changes no precision direction by more
    # than a factor 2 (beyond, the Gaussian-regime map stretches draws without limit)
    lam_q, V_q = np.linalg.eigh(Q)
    q_inv_half = (V_q / np.sqrt(np.maximum(lam_q, 1e-300))) @ V_q.T
    for j in range(m):
        P = Q
        if sd_H > 0.0:
            for _ in range(max_tries):
                cand = Q + E.T @ symmetric_noise(k, sd_H, rng) @ E
                rel = np.linalg.eigvalsh(q_inv_half @ cand @ q_inv_half)
                if np.all(rel >= _MIN_PRECISION_RATIO) and np.all(
                    rel <= 1.0 / _MIN_PRECISION_RATIO
                ):
                    P = cand
                    break
        xi = E.T @ rng.normal(0.0, sd_G, size=k)
        S = np.linalg.inv(P)
        m_star = S @ (b - xi)
        A = np.linalg.cholesky(S) @ np.linalg.inv(C)
        out[j] = m_star + A @ (draws[j] - mean)
    return out
