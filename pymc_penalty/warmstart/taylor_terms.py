"""The Taylor one-shot's only reads of the data: sums over rows at a public expansion.

:func:`~pymc_penalty.warmstart.taylor.taylor_oneshot` reads the rows through a
:class:`TaylorStatistics` and nothing else. Every method's arguments are public (the
:class:`Expansion` ``(t, L, index, order)``, clips read from released histograms, public bin
edges, public probe points) and each returns one exact sum over rows of a per-row term, which
the caller releases with noise after charging its ledger:

- :meth:`~TaylorStatistics.norm_counts`: the histogram counts of the rows' whitened gradient
  norms (``"g"``) or Hessian Frobenius norms (``"H"``) at ``t``
  (:func:`~pymc_penalty.privacy.taylor.clips.histogram_counts`);
- :meth:`~TaylorStatistics.clipped_sums`: the clipped sums ``G`` and ``H`` (packed,
  :func:`~pymc_penalty.privacy.taylor.packed_sums`);
- :meth:`~TaylorStatistics.residual_counts`: the histogram counts of each row's largest
  residual ratio over public probe moves.

:class:`RowTaylorTerms` computes them here from the compiled per-row log-likelihood (central
finite differences in whitened coordinates, :func:`row_terms`), keeping the rows' terms at
the current expansion and their clipped coefficients (the in-process chains' control
variates, :meth:`~RowTaylorTerms.control`) until :meth:`~TaylorStatistics.forget`. A sharded
table (:mod:`pymc_penalty.distributed`) runs one on each shard's rows and the driver adds
their sums (:class:`SummedTaylorTerms`): every term is a function of one row, so one row
moves the total as it moves its shard's part, and the sensitivities of
:mod:`pymc_penalty.privacy.taylor` hold for the total. No sum here needs a row count.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from pymc_penalty.model.likelihood import RowControl
from pymc_penalty.privacy import taylor as tl
from pymc_penalty.privacy.taylor import clips as tc

__all__ = [
    "TAYLOR_STATISTICS",
    "Expansion",
    "RowTaylorTerms",
    "SummedTaylorTerms",
    "TaylorStatistics",
    "residual_ratios",
    "row_norms",
    "row_terms",
]

#: The names of the sums a :class:`TaylorStatistics` returns (a shard is asked for one of
#: these by name, and nothing else).
TAYLOR_STATISTICS = ("norm_counts", "clipped_sums", "residual_counts")

_FD_STEP = 1e-2  # finite-difference step in whitened units (posterior sds)


class Expansion(NamedTuple):
    """Where the rows are expanded (public): ``x = t + L u`` on the coordinates ``index``."""

    #: The expansion point, every raveled coordinate, shape (d,).
    t: np.ndarray
    #: The whitening factor on ``index``, lower triangular, shape (k, k).
    L: np.ndarray
    #: The coordinates the rows read, shape (k,).
    index: np.ndarray
    #: 1 or 2.
    order: int

    def key(self) -> tuple[bytes, bytes, bytes, int]:
        """Its identity (the terms kept are those of one expansion)."""
        return (
            np.ascontiguousarray(self.t, np.float64).tobytes(),
            np.ascontiguousarray(self.L, np.float64).tobytes(),
            np.ascontiguousarray(self.index, np.int64).tobytes(),
            int(self.order),
        )


def row_terms(lik: Any, e: Expansion, n: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-row whitened gradients (n, k) and packed Hessians (n, k(k+1)/2) or None in
    ``u = L^-1 (x - t)[index]``, by central finite differences of each row's log-likelihood
    (row-local; ``lik.initial(x, n)`` gives the rows' log-likelihoods at ``x``)."""
    t, L, index, order = e
    d = L.shape[0]
    h = _FD_STEP

    def ll(w: np.ndarray) -> np.ndarray:
        x = t.copy()
        x[index] += L @ w
        out, _ = lik.initial(x, n)
        return np.asarray(out, dtype=np.float64)

    eye = np.eye(d) * h
    with np.errstate(invalid="ignore", over="ignore"):
        plus = [ll(eye[j]) for j in range(d)]
        minus = [ll(-eye[j]) for j in range(d)]
        g = np.stack([(plus[j] - minus[j]) / (2.0 * h) for j in range(d)], axis=1)
        if order == 1:
            return g, None
        centre = ll(np.zeros(d))
        j_idx, k_idx = tl.packed_index(d)
        cols = []
        for j, k in zip(j_idx, k_idx, strict=True):
            if j == k:
                cols.append((plus[j] - 2.0 * centre + minus[j]) / h**2)
            else:
                pp_, pm_ = ll(eye[j] + eye[k]), ll(eye[j] - eye[k])
                mp_, mm_ = ll(-eye[j] + eye[k]), ll(-eye[j] - eye[k])
                cols.append((pp_ - pm_ - mp_ + mm_) / (4.0 * h**2))
    return g, np.stack(cols, axis=1)


def row_norms(terms: np.ndarray, kind: str, k: int) -> np.ndarray:
    """Each row's whitened gradient norm (``kind="g"``, ``terms`` (n, k)) or packed
    Hessian's Frobenius norm (``"H"``, (n, k(k+1)/2)); 0 for a row with a non-finite entry
    (it adds no Taylor term, :func:`~pymc_penalty.privacy.taylor.clip_packed_rows`)."""
    ok = np.all(np.isfinite(terms), axis=1)
    with np.errstate(over="ignore", invalid="ignore"):  # a norm past the float range: top bin
        if kind == "g":
            return np.where(ok, np.linalg.norm(terms, axis=1), 0.0)
        if kind != "H":
            raise ValueError(f"kind must be 'g' or 'H', got {kind!r}")
        h_ok = np.where(ok[:, None], terms, 0.0)
        return np.where(ok, tl.packed_frobenius(h_ok, k), 0.0)


def residual_ratios(
    lik: Any,
    n: int,
    control: RowControl,
    x0s: np.ndarray,
    x1s: np.ndarray,
    u0s: np.ndarray,
    u1s: np.ndarray,
    lengths: np.ndarray,
) -> np.ndarray:
    """Each row's largest ``|residual| / length`` over the probe moves ``x0s[j] -> x1s[j]``
    (``u``: the points whitened, ``lengths``: their residual lengths; all public), shape
    (n,). A row not finite at a probe reads 0 there (it is clipped in the step whatever the
    bound); an overflowed ratio lands in the top bin."""
    features = control.values
    ratio = np.zeros(n)
    for x0, x1, u0, u1, length in zip(x0s, x1s, u0s, u1s, lengths, strict=True):
        ll0, _ = lik.initial(x0, n)
        ll1, _ = lik.initial(x1, n)
        with np.errstate(invalid="ignore", over="ignore"):
            rho = (np.asarray(ll1, np.float64) - features(u1)) - (
                np.asarray(ll0, np.float64) - features(u0)
            )
        rho = np.where(np.isfinite(rho), np.abs(rho), 0.0)
        with np.errstate(over="ignore"):
            ratio = np.maximum(ratio, rho / max(float(length), 1e-300))
    return ratio


class TaylorStatistics(ABC):
    """The one-shot's view of the data: exact sums of per-row terms at a public expansion.

    Every method but :meth:`control` and :meth:`forget` reads the data: the caller has
    charged the release it feeds before calling.
    """

    @abstractmethod
    def norm_counts(self, e: Expansion, kind: str, edges: np.ndarray) -> np.ndarray:
        """Counts of the rows' whitened gradient norms (``"g"``) or Hessian Frobenius norms
        (``"H"``) at ``e`` in the bins of ``edges`` (:func:`row_norms`,
        :func:`~pymc_penalty.privacy.taylor.clips.histogram_counts`), shape
        ``(len(edges) + 1,)``."""

    @abstractmethod
    def clipped_sums(self, e: Expansion, c_g: float, c_H: float | None) -> np.ndarray:
        """The rows' clipped coefficients at ``e`` summed: ``G`` then ``H`` packed
        (:func:`~pymc_penalty.privacy.taylor.packed_sums`)."""

    @abstractmethod
    def residual_counts(
        self,
        e: Expansion,
        c_g: float,
        c_H: float | None,
        probes: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
        edges: np.ndarray,
    ) -> np.ndarray:
        """Counts of the rows' residual ratios (:func:`residual_ratios`, the rows' models
        clipped at ``c_g``, ``c_H``) in the bins of ``edges``; ``probes`` is ``(x0s, x1s,
        u0s, u1s, lengths)``."""

    def control(self, e: Expansion, c_g: float, c_H: float | None) -> RowControl | None:
        """The rows' clipped coefficients as the in-process chains' control variates (None
        where the rows are elsewhere)."""
        return None

    def forget(self) -> None:  # noqa: B027 - nothing is kept by default
        """Drop the per-row values kept (after the one-shot)."""


class RowTaylorTerms(TaylorStatistics):
    """The sums computed here from the compiled per-row log-likelihood.

    Parameters
    ----------
    lik : PenaltyLikelihood
        ``lik.initial(x, n)`` gives the rows' log-likelihoods at ``x`` (a data access).
    n : int
        The number of rows.
    """

    def __init__(self, lik: Any, n: int) -> None:
        self._lik = lik
        self._n = int(n)
        self._terms: tuple[Any, np.ndarray, np.ndarray | None] | None = None
        self._coef: tuple[Any, np.ndarray] | None = None

    def _row_terms(self, e: Expansion) -> tuple[np.ndarray, np.ndarray | None]:
        if self._terms is None or self._terms[0] != e.key():
            self._terms = (e.key(), *row_terms(self._lik, e, self._n))
        return self._terms[1], self._terms[2]

    def _clipped(self, e: Expansion, c_g: float, c_H: float | None) -> np.ndarray:
        key = (e.key(), float(c_g), None if c_H is None else float(c_H))
        if self._coef is None or self._coef[0] != key:
            g, h_packed = self._row_terms(e)
            coef, _, _ = tl.clip_packed_rows(g, h_packed, c_g, c_H)
            self._terms = None  # the unclipped terms are not needed past the clips
            self._coef = (key, coef)
        return self._coef[1]

    def norm_counts(self, e: Expansion, kind: str, edges: np.ndarray) -> np.ndarray:
        g, h_packed = self._row_terms(e)
        terms = g if kind == "g" else h_packed
        if terms is None:
            raise ValueError("a first-order expansion has no Hessian norms")
        return tc.histogram_counts(row_norms(terms, kind, g.shape[1]), edges)

    def clipped_sums(self, e: Expansion, c_g: float, c_H: float | None) -> np.ndarray:
        return tl.packed_sums(self._clipped(e, c_g, c_H), e.L.shape[0])

    def residual_counts(self, e, c_g, c_H, probes, edges) -> np.ndarray:
        control = self.control(e, c_g, c_H)
        ratio = residual_ratios(self._lik, self._n, control, *probes)
        return tc.histogram_counts(ratio, edges)

    def control(self, e: Expansion, c_g: float, c_H: float | None) -> RowControl:
        return RowControl(e.t, e.L, self._clipped(e, c_g, c_H), e.index)

    def forget(self) -> None:
        self._terms = self._coef = None


class SummedTaylorTerms(TaylorStatistics):
    """The sums of several parts of one table (the shards of a sharded table), added here.

    Each part answers with its own :class:`RowTaylorTerms`' sums; only the total is used (and
    released, with one noise, by the caller). One row sits in one part, so every sum keeps
    the sensitivity of :mod:`pymc_penalty.privacy.taylor`.

    Parameters
    ----------
    ask : callable
        ``ask(name, args) -> list`` of every part's answer to ``RowTaylorTerms.<name>(*args)``
        (``name`` one of :data:`TAYLOR_STATISTICS` or ``"forget"``).
    """

    def __init__(self, ask: Callable[[str, tuple], list]) -> None:
        self._ask = ask

    def _sum(self, name: str, *args: object) -> np.ndarray:
        return np.sum([np.asarray(a, dtype=np.float64) for a in self._ask(name, args)], axis=0)

    def norm_counts(self, e: Expansion, kind: str, edges: np.ndarray) -> np.ndarray:
        return self._sum("norm_counts", e, kind, edges)

    def clipped_sums(self, e: Expansion, c_g: float, c_H: float | None) -> np.ndarray:
        return self._sum("clipped_sums", e, c_g, c_H)

    def residual_counts(self, e, c_g, c_H, probes, edges) -> np.ndarray:
        return self._sum("residual_counts", e, c_g, c_H, probes, edges)

    def forget(self) -> None:
        self._ask("forget", ())
