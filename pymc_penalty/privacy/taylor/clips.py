"""Clips for the Taylor path found from one noisy histogram of per-row norms (pure NumPy).

Each row contributes one count to a histogram of a row-local nonnegative value (a whitened
gradient norm, a Hessian's Frobenius norm, a residual's ratio to its bound) on a fixed
geometric grid of public edges. One row moves one count out of a bin and into another:
L2 sensitivity ``sqrt 2`` under substitute-one, ``1`` under add/remove-one. The histogram is
released once with Gaussian noise (:func:`noisy_histogram`) and a clip is read from it as
post-processing (:func:`clip_by_scale`, :func:`clip_by_tail`).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from pymc_penalty.privacy.precision import COUNT_GRID, snap_count

__all__ = [
    "clip_by_scale",
    "clip_by_tail",
    "geometric_edges",
    "histogram_counts",
    "histogram_sensitivity",
    "noisy_counts",
    "noisy_histogram",
    "noisy_quantile",
]

Relation = Literal["substitute", "add_remove"]


def histogram_sensitivity(relation: Relation = "substitute") -> float:
    """L2 sensitivity of a histogram with one count per row."""
    if relation == "substitute":
        return float(np.sqrt(2.0))
    if relation == "add_remove":
        return 1.0
    raise ValueError(f"relation must be 'substitute' or 'add_remove', got {relation!r}")


def geometric_edges(unit: float, low: int = -12, high: int = 16, per_octave: int = 2) -> np.ndarray:
    """Public bin edges ``unit * 2^(k / per_octave)`` for ``k`` in ``[low, high]``."""
    k = np.arange(low, high + 1)
    return float(unit) * 2.0 ** (k / per_octave)


def histogram_counts(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Exact counts of ``values`` in ``(-inf, e_0], (e_0, e_1], ..., (e_last, inf)``, as
    floats (a NaN value counts in the top bin). Counts of disjoint sets of rows add up to the
    counts of their union: a sharded table's histogram is its shards' counts summed."""
    v = np.asarray(values, dtype=float)
    v = np.where(np.isnan(v), np.inf, v)
    idx = np.searchsorted(edges, v, side="left")
    return np.bincount(idx, minlength=len(edges) + 1).astype(float)


def noisy_counts(
    counts: np.ndarray, mu: float, rng: np.random.Generator, relation: Relation = "substitute"
) -> tuple[np.ndarray, float]:
    """Release exact histogram counts (:func:`histogram_counts`) with Gaussian noise:
    ``(noisy counts, noise sd)``, ``mu``-GDP, the noisy counts on the integers, as every
    published noisy count (:func:`pymc_penalty.privacy.precision.snap_count`)."""
    counts = np.asarray(counts, dtype=float)
    sd = histogram_sensitivity(relation) / float(mu)
    return snap_count(counts + rng.normal(0.0, sd, size=counts.shape)), sd


def noisy_histogram(
    values: np.ndarray,
    edges: np.ndarray,
    mu: float,
    rng: np.random.Generator,
    relation: Relation = "substitute",
) -> tuple[np.ndarray, float]:
    """Release counts of ``values`` in ``(-inf, e_0], (e_0, e_1], ..., (e_last, inf)``.

    A NaN value counts in the top bin. Returns ``(noisy counts, noise sd)``; the release is
    ``mu``-GDP (:func:`histogram_counts`, then :func:`noisy_counts`).
    """
    return noisy_counts(histogram_counts(values, edges), mu, rng, relation)


def _denoised(counts: np.ndarray, sd: float, k: float) -> np.ndarray:
    """Counts below ``k`` noise sds read as empty (post-processing).

    The counts are snapped to :data:`~pymc_penalty.privacy.precision.COUNT_GRID`
    (:func:`noisy_counts`), so an empty bin reads as ``m`` where its noise exceeds ``m`` less
    half the grid: a count is kept where it exceeds ``k`` sds by that half too. Without it,
    at a noise sd below ``1 / k`` (an enormous budget: about 0.22 under add/remove-one at
    epsilon 2000) a one read in an empty bin passed as a row, in about one bin of 82 per
    release, and the clip went to that bin's edge (hundreds of times the rows' largest)."""
    return np.where(counts - 0.5 * COUNT_GRID > k * sd, counts, 0.0)


def noisy_quantile(
    edges: np.ndarray, counts: np.ndarray, sd: float, q: float, total: float | None = None
) -> float:
    """The ``q`` quantile read from the top: :func:`clip_by_tail` at ``(1 - q) * total``.

    Reading from the top sums only the bins above the quantile, and bins read as empty add no
    noise (a cumulative sum from the bottom carries the noise of every bin below: about
    ``sd * sqrt(bins)`` rows, 12% of n = 1e4 at the warm start's budget with 161 bins).
    ``total`` is the number of rows when public (substitute-one), else the noisy counts' sum.
    """
    counts = np.asarray(counts, dtype=float)
    n = float(counts.sum()) if total is None else float(total)
    return clip_by_tail(edges, counts, sd, tail=(1.0 - q) * n)


def clip_by_scale(
    edges: np.ndarray, counts: np.ndarray, sd: float, q: float, factor: float
) -> float:
    """``factor`` times the noisy ``q`` quantile (:func:`noisy_quantile`).

    A tail quantile (99.9%) cannot be read from counts whose noise sd exceeds the tail's rows
    (sd ``sqrt 2 / mu``, about 30 to 60 rows at the warm start's budgets); a resolvable quantile
    times a public tail factor can.
    """
    return float(factor) * noisy_quantile(edges, counts, sd, q)


def clip_by_tail(
    edges: np.ndarray, counts: np.ndarray, sd: float, tail: float, alpha: float = 0.01
) -> float:
    """Smallest edge whose (denoised) count of rows above it is at most ``tail``.

    Bins are read as empty below ``k = sqrt(2 log(bins / alpha))`` noise sds, so that a bin
    that is empty reads as such in all but about ``alpha`` of releases (with 50 bins and a
    2-sd threshold one in two releases had a spurious top bin, sending the clip to the grid's
    top). Rows in bins below the threshold are not seen: the clip then lands where the tail
    is about ``k * sd`` rows.
    """
    counts = np.asarray(counts, dtype=float)
    k = float(np.sqrt(2.0 * np.log(len(counts) / alpha)))
    c_all = _denoised(counts, sd, k)
    above = np.cumsum(c_all[::-1])[::-1]  # above[j] = rows in bins j.. ; edge j's tail is j+1
    for j, c in enumerate(edges):
        if above[j + 1] <= tail:
            return float(c)
    return float(edges[-1])
