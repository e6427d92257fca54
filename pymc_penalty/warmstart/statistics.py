"""The warm start's only reads of the data: sums over rows at a point (pure NumPy, no PyMC).

:func:`~pymc_penalty.warmstart.scoring.fisher_scoring` reads the rows through a
:class:`RowStatistics` and nothing else. Each method returns one exact sum of per-row terms
(:mod:`pymc_penalty.warmstart.releases`, where their sensitivities are stated), which the
caller releases with noise after charging its ledger:

- :meth:`~RowStatistics.outer`: ``pair_outer_sum(pair_differences(g), chol, clip)``;
- :meth:`~RowStatistics.log_scale`: ``log_scale_sum(pair_differences(g), chol)``;
- :meth:`~RowStatistics.gradient`: ``clipped_whitened(g, chol, clip).sum(0)``;
- :meth:`~RowStatistics.count`: ``clipped_count(g, chol, clip, centre)``;

with ``g`` the ``(n, d)`` per-row gradients at the point. :class:`RowGradients` computes them
in this process from a ``row_grads(x)`` callable, keeping the gradients of the current point
until :meth:`~RowStatistics.forget` (called once a step's releases are made). A sharded table
(:mod:`pymc_penalty.distributed`) runs a :class:`RowGradients` on each shard's rows, so the
pairs of :func:`~pymc_penalty.warmstart.releases.pair_differences` are formed within a shard,
and its driver adds the shards' sums: every term is a function of one row (gradients, counts)
or of one pair inside one shard (outer products, log lengths), so one row still moves one
pair term (substitute-one, disjoint pairs) or the chain terms around it in its shard
(add/remove-one) and the sensitivities of :mod:`~pymc_penalty.warmstart.releases` hold for the
total. Only the number of pair terms changes: :meth:`~RowStatistics.pairs`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np

from pymc_penalty.accounting.sensitivity import Neighbours
from pymc_penalty.warmstart.releases import (
    clipped_count,
    clipped_whitened,
    log_scale_sum,
    pair_differences,
    pair_outer_sum,
)

__all__ = ["STATISTICS", "RowGradients", "RowStatistics", "SummedStatistics"]

#: The names of the sums a :class:`RowStatistics` returns at a point (a shard is asked for one
#: of these by name, and nothing else).
STATISTICS = ("outer", "log_scale", "gradient", "count")


class RowStatistics(ABC):
    """The warm start's view of the data: exact sums of per-row terms at a point.

    Every method but :meth:`pairs` and :meth:`forget` reads the data: the caller has charged
    the release it feeds before calling (:func:`~pymc_penalty.warmstart.scoring.fisher_scoring`
    commits a step's releases first).

    Parameters
    ----------
    neighbours : Neighbours
        The relation (which pairs are formed, and what :meth:`pairs` counts).
    """

    def __init__(self, neighbours: Neighbours) -> None:
        self.neighbours = neighbours

    @abstractmethod
    def rows(self) -> int:
        """The exact number of rows: public under substitute-one; under add/remove-one read
        once, after its noisy count's charge, only to add that count's noise."""

    @abstractmethod
    def pairs(self, n_hat: float) -> float:
        """The number of pair terms of :meth:`outer` and :meth:`log_scale`, from public values
        only (``n_hat``: ``n`` under substitute-one, the released count under add/remove)."""

    @abstractmethod
    def outer(self, x: np.ndarray, chol: np.ndarray | None, clip: float | None) -> np.ndarray:
        """``sum_k w_k w_k^T`` of the clipped whitened pair differences at ``x``, shape (d, d)
        (:func:`~pymc_penalty.warmstart.releases.pair_outer_sum`)."""

    @abstractmethod
    def log_scale(self, x: np.ndarray, chol: np.ndarray) -> float:
        """The clipped log lengths of the pair differences at ``x``, summed
        (:func:`~pymc_penalty.warmstart.releases.log_scale_sum`)."""

    @abstractmethod
    def gradient(self, x: np.ndarray, chol: np.ndarray, clip: float) -> np.ndarray:
        """The sum of the clipped whitened per-row gradients at ``x``, shape (d,)
        (:func:`~pymc_penalty.warmstart.releases.clipped_whitened`)."""

    @abstractmethod
    def count(self, x: np.ndarray, chol: np.ndarray, clip: float, centre: np.ndarray) -> int:
        """The number of rows clipped at ``x`` around ``centre``
        (:func:`~pymc_penalty.warmstart.releases.clipped_count`)."""

    def forget(self) -> None:  # noqa: B027 - nothing is kept by default
        """Drop the per-row values kept for the last point (after a step's releases)."""


class RowGradients(RowStatistics):
    """The sums computed here from per-row gradients, kept for the current point only.

    Parameters
    ----------
    row_grads : callable
        ``row_grads(x) -> (n, d)`` per-row gradients at ``x``, every row finite (a data
        access: called once per point, at the first sum asked there).
    n : int
        The number of rows (what ``row_grads`` returns).
    neighbours : Neighbours
    """

    def __init__(
        self, row_grads: Callable[[np.ndarray], np.ndarray], n: int, neighbours: Neighbours
    ) -> None:
        super().__init__(neighbours)
        self._row_grads = row_grads
        self._n = n
        self._x: np.ndarray | None = None
        self._grads: np.ndarray | None = None
        self._diffs: np.ndarray | None = None

    def _at(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The gradients and pair differences at ``x`` (computed at the first sum asked)."""
        if self._grads is None or self._x is None or not np.array_equal(self._x, x):
            self._x = np.array(x, copy=True)
            self._grads = self._row_grads(x)
            self._diffs = pair_differences(self._grads, self.neighbours)
        return self._grads, self._diffs

    def rows(self) -> int:
        return self._n

    def pairs(self, n_hat: float) -> float:
        if self.neighbours is Neighbours.ADD_REMOVE:
            return n_hat - 1.0
        m = self._grads.shape[0] if self._grads is not None else self._n
        return float(m // 2)

    def outer(self, x: np.ndarray, chol: np.ndarray | None, clip: float | None) -> np.ndarray:
        return pair_outer_sum(self._at(x)[1], chol, clip)

    def log_scale(self, x: np.ndarray, chol: np.ndarray) -> float:
        return log_scale_sum(self._at(x)[1], chol)

    def gradient(self, x: np.ndarray, chol: np.ndarray, clip: float) -> np.ndarray:
        return clipped_whitened(self._at(x)[0], chol, clip).sum(axis=0)

    def count(self, x: np.ndarray, chol: np.ndarray, clip: float, centre: np.ndarray) -> int:
        return clipped_count(self._at(x)[0], chol, clip, centre)

    def forget(self) -> None:
        self._x = self._grads = self._diffs = None


class SummedStatistics(RowStatistics):
    """The sums of several parts of one table (the shards of a sharded table), each part's
    pairs formed within it, added here.

    Each part answers with its own :class:`RowGradients`' sums; only the total is used (and
    released, with one noise, by the caller). One row sits in one part, so every sum keeps
    the sensitivity of :mod:`~pymc_penalty.warmstart.releases`; the pair terms number
    ``sum_k floor(n_k / 2)`` under substitute-one (public there: the relation keeps every
    part's size) and ``n - K`` under add/remove-one, estimated by ``n_hat - K`` (``K`` the
    public number of parts).

    Parameters
    ----------
    ask : callable
        ``ask(name, args) -> list`` of every part's answer to ``RowGradients.<name>(*args)``
        (``name`` one of :data:`STATISTICS`, ``"rows"`` or ``"forget"``).
    parts : int
        The number of parts ``K``.
    neighbours : Neighbours
    """

    def __init__(
        self, ask: Callable[[str, tuple], list], parts: int, neighbours: Neighbours
    ) -> None:
        super().__init__(neighbours)
        self._ask = ask
        self._parts = int(parts)
        self._sizes: list[int] | None = None

    def _rows(self) -> list[int]:
        """The parts' sizes: kept only under substitute-one, where they are public."""
        if self._sizes is not None:
            return self._sizes
        sizes = [int(k) for k in self._ask("rows", ())]
        if self.neighbours is Neighbours.SUBSTITUTE:
            self._sizes = sizes
        return sizes

    def rows(self) -> int:
        return sum(self._rows())

    def pairs(self, n_hat: float) -> float:
        # At least 1 (shards of one row each form no pair): a public floor, as n_hat's.
        if self.neighbours is Neighbours.ADD_REMOVE:
            return max(n_hat - self._parts, 1.0)
        return max(float(sum(k // 2 for k in self._rows())), 1.0)

    def _sum(self, name: str, *args: object) -> np.ndarray:
        return np.sum([np.asarray(a, dtype=np.float64) for a in self._ask(name, args)], axis=0)

    def outer(self, x: np.ndarray, chol: np.ndarray | None, clip: float | None) -> np.ndarray:
        return self._sum("outer", x, chol, clip)

    def log_scale(self, x: np.ndarray, chol: np.ndarray) -> float:
        return float(self._sum("log_scale", x, chol))

    def gradient(self, x: np.ndarray, chol: np.ndarray, clip: float) -> np.ndarray:
        return self._sum("gradient", x, chol, clip)

    def count(self, x: np.ndarray, chol: np.ndarray, clip: float, centre: np.ndarray) -> int:
        return int(self._sum("count", x, chol, clip, centre))

    def forget(self) -> None:
        self._ask("forget", ())
