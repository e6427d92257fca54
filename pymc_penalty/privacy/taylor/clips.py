"""Clips for the Taylor path found from one noisy histogram of per-row norms (pure NumPy).

Each row contributes one count to a histogram of a row-local nonnegative value (a whitened
gradient norm, a Hessian's Frobenius norm, a residual's ratio to its bound) on a fixed
geometric grid of public edges. One row moves one count out of a bin and into another:
L2 sensitivity ``sqrt 2`` under substitute-one, ``1`` under add/remove-one. The histogram is
released once with Gaussian noise (:func:`noisy_histogram`) and a clip is read from it as
post-processing (:func:`clip_by_scale`, :func:`clip_by_tail`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from pymc_penalty.privacy.precision import COUNT_GRID, snap_count

__all__ = [
    "clip_by_scale",
    "clip_by_tail",
    "clip_by_visible_tail",
    "data_top",
    "geometric_edges",
    "histogram_counts",
    "histogram_sensitivity",
    "noisy_counts",
    "noisy_histogram",
    "noisy_quantile",
    "TailCounts",
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


#: Widths (in bins) of the windows :func:`data_top` tests for rows.
TOP_WIDTHS = (1, 2, 4, 8, 16)
#: Where ``k`` noise sds are at most this many rows (:class:`TailCounts`), rows are visible
#: bin by bin, and bins below ``k`` sds read as empty.
_VISIBLE_ROWS = 2.0


def _threshold(bins: int, alpha: float) -> float:
    """``k = sqrt(2 log(M / alpha))`` over the ``M`` windows :func:`data_top` tests."""
    tests = sum(bins - w + 1 for w in TOP_WIDTHS if w <= bins)
    return float(np.sqrt(2.0 * np.log(max(tests, 1) / alpha)))


def data_top(counts: np.ndarray, sd: float, alpha: float = 0.01) -> int:
    """Index of the highest bin that a window of the noisy counts shows rows in, or -1.

    Windows of :data:`TOP_WIDTHS` consecutive bins are tested at every offset: a window's
    rows count where its noisy sum exceeds ``k sqrt(w)`` noise sds, ``k = sqrt(2 log(M /
    alpha))`` over the ``M`` windows tested, so that empty bins read as rows in about
    ``alpha`` of releases. A wide window sees a tail spread thin over many bins, each below
    its own noise: read bin by bin (the rule before 2026-11-28) such a tail vanished, and at
    epsilon 0.5 and n = 1e4 the one-shot clips cut 500 to 1300 rows, 10 to 40 times the rows
    they aimed at (``benchmarks/clip_reading.py``). The counts are snapped to
    :data:`~pymc_penalty.privacy.precision.COUNT_GRID` (:func:`noisy_counts`), so an empty
    bin reads as ``m`` where its noise exceeds ``m`` less half the grid: a window counts
    where it exceeds its threshold by that half per bin too. Without it, at a noise sd below
    ``1 / k`` (an enormous budget: about 0.22 under add/remove-one at epsilon 2000) a one
    read in an empty bin passed as a row, in about one bin of 82 per release, and the clip
    went to that bin's edge (hundreds of times the rows' largest).

    The top is a window's last bin, so it can lie up to ``max(TOP_WIDTHS) - 1`` bins above
    the rows: those bins add noise to the counts read above an edge, not bias. A rule that
    let a window count only where no narrower one inside it had (the top then nearer the
    rows) lost the thin tail just above them, the rows a clip must see: at epsilon 0.5 its
    clips left 100 to 470 rows above them against the 10 to 120 of this one
    (``benchmarks/clip_reading.py`` on the suite's gradients).
    """
    counts = np.asarray(counts, dtype=float)
    widths = [w for w in TOP_WIDTHS if w <= counts.size]
    k = _threshold(counts.size, alpha)
    top = -1
    for w in widths:
        sums = np.convolve(counts, np.ones(w), mode="valid")
        seen = np.flatnonzero(sums - 0.5 * COUNT_GRID * w > k * float(sd) * np.sqrt(w))
        if seen.size:
            top = max(top, int(seen[-1]) + w - 1)
    return top


def _denoised(counts: np.ndarray, sd: float, k: float) -> np.ndarray:
    """Bins below ``k`` noise sds read as empty (post-processing). The counts are snapped to
    :data:`~pymc_penalty.privacy.precision.COUNT_GRID` (:func:`noisy_counts`), so an empty
    bin reads as ``m`` where its noise exceeds ``m`` less half the grid: a count is kept
    where it exceeds ``k`` sds by that half too (at a noise sd below ``1 / k`` an empty bin
    snapped to one read as a row, and the clip went to its edge)."""
    return np.where(counts - 0.5 * COUNT_GRID > k * float(sd), counts, 0.0)


@dataclass(frozen=True)
class TailCounts:
    """The noisy count of rows above each edge, read from the top of the data down
    (post-processing; :meth:`of`).

    ``above[j]`` sums the noisy counts of bins ``j + 1`` to ``top`` (:func:`data_top`; bins
    above it read as empty). Every bin up to the top counts with its noise, so the reading
    is unbiased there: a reading that drops each bin below its own noise loses the rows of a
    thin tail. Where ``k`` noise sds are at most :data:`_VISIBLE_ROWS` rows (enormous
    budgets) rows are visible one by one and the bins are read so (:func:`_denoised`): an
    empty bin's noise snaps it to one in about 1.3% of bins at sd 0.22, and summed over the
    empty bins a window's top leaves above the rows, such ones moved the clip above the rows
    in 1 release of 7.
    """

    above: np.ndarray
    top: int
    sd: float

    @classmethod
    def of(cls, counts: np.ndarray, sd: float, alpha: float = 0.01) -> TailCounts:
        """Read the noisy ``counts`` (one per bin, ``len(edges) + 1``) of noise sd ``sd``."""
        counts = np.asarray(counts, dtype=float)
        top = data_top(counts, sd, alpha)
        k = _threshold(counts.size, alpha)
        if k * float(sd) <= _VISIBLE_ROWS * COUNT_GRID:
            counts = _denoised(counts, sd, k)
        counts = counts.copy()
        counts[top + 1 :] = 0.0
        return cls(np.cumsum(counts[::-1])[::-1][1:], top, float(sd))

    def noise_sd(self, edge_index: int) -> float:
        """The noise sd of ``above[edge_index]``: ``sd`` times the square root of the number
        of bins it sums (at least one)."""
        return self.sd * float(np.sqrt(max(self.top - int(edge_index), 1)))

    def edge(self, edges: np.ndarray, tail: float) -> float:
        """Smallest edge above which the count is at most ``tail``: the edge above the
        highest one whose count exceeds it (:func:`clip_by_tail`)."""
        over = np.flatnonzero(self.above[: len(edges)] > float(tail))
        if over.size == 0:
            return float(edges[0])
        return float(edges[min(int(over[-1]) + 1, len(edges) - 1)])


def noisy_quantile(
    edges: np.ndarray, counts: np.ndarray, sd: float, q: float, total: float | None = None
) -> float:
    """The ``q`` quantile read from the top: :func:`clip_by_tail` at ``(1 - q) * total``.

    Reading from the top sums only the bins between the quantile and the top of the data
    (:func:`data_top`): a cumulative sum from the bottom carries the noise of every bin
    below (about ``sd * sqrt(bins)`` rows, 12% of n = 1e4 at the warm start's budget with
    161 bins), one from the grid's top that of every empty bin above the rows.
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
    """Smallest edge above which the noisy count of rows (:attr:`TailCounts.above`) is at most
    ``tail``: the edge above the highest one whose count exceeds it.

    The count above an edge is read from the top of the data down (:func:`data_top`), so a
    thin tail of rows counts, and it carries the noise of the bins it sums: where ``tail``
    is below that noise, the reading lands where the noise happens to exceed it, above the
    true edge as often as below. Callers that need a tail below the noise extrapolate from
    resolvable ones (:func:`pymc_penalty.warmstart.taylor._oneshot_clip`).
    """
    return TailCounts.of(counts, sd, alpha).edge(edges, tail)


def clip_by_visible_tail(
    edges: np.ndarray, counts: np.ndarray, sd: float, tail: float, alpha: float = 0.01
) -> float:
    """Smallest edge above which the bins that stand out of the noise hold at most ``tail``
    rows: bins below ``k = sqrt(2 log(bins / alpha))`` noise sds (and half the count grid)
    read as empty, so rows spread thin below that are not seen, and the edge lands where
    the tail is about ``k * sd`` rows.

    The chains' residual clip reads its histogram this way (``_RESIDUAL_FACTOR`` times this
    edge, then raised to the noise the chains carry, :func:`pymc_penalty.sampling.taylor.
    noise_limited_clip`): that rule was measured with it. Read with :func:`clip_by_tail`
    instead (the one-shot clips' reading since 2026-11-28), a 10-row tail below the noise
    landed where the noise put it, and the residual clip rose until the chains stuck (bulk
    ESS 4 to 30 on most of the suite's models at epsilon 2 and 6 in a ``benchmarks/
    model_suite.py`` run stopped after 4 data sets, its CSV not kept).
    """
    counts = np.asarray(counts, dtype=float)
    k = float(np.sqrt(2.0 * np.log(len(counts) / alpha)))
    above = np.cumsum(_denoised(counts, sd, k)[::-1])[::-1]  # above[j] = rows in bins j..
    for j, c in enumerate(edges):
        if above[j + 1] <= tail:
            return float(c)
    return float(edges[-1])
