"""User-declared sufficient statistics for the exponential-family step.

A likelihood the step does not recognise can still run at O(1) cost per step if the user
declares it as an exponential family,
``log p(y | theta) = eta(theta) . T(y) - A(theta) + h(y)``, by giving ``T``, ``eta`` and ``A``
as a :class:`SufficientStatistic`.

The guarantee never rests on the declaration being right. Each row ``T(y_i)`` is projected onto
the L2 ball of radius ``bound`` before it enters the sum, so the sum's L2 sensitivity is
``2 * bound`` (substitute-one) or ``bound`` (add/remove-one) whatever ``T`` computes. Whether the
chain is *exact* does rest on the declaration, so the step checks it, before it reads any data,
on a synthetic data set drawn from the model's own prior predictive: the declared
``eta . T - A`` differences must match the model's log-likelihood differences there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from pymc_penalty.errors import DeclarationMismatchError

__all__ = ["DeclarationMismatchError", "SufficientStatistic"]

#: Rows recomputed, in reverse order, to check that ``statistic`` keeps no state.
_SPOT_CHECKS = 16


@dataclass(frozen=True)
class SufficientStatistic:
    """An exponential-family likelihood declared by the user.

    Parameters
    ----------
    statistic : callable
        ``statistic(y) -> ndarray`` of shape ``(n, k)`` (or ``(n,)`` for ``k = 1``): the
        per-datapoint sufficient statistic ``T(y_i)``, from the observed values as stored in
        the model (leading axis: datapoint). The step calls it on one datapoint at a time
        (``y[i:i + 1]``), so it cannot read other rows; it must be a pure function (no state
        kept between calls: a spot check recomputes some rows in another order and refuses a
        statistic whose rows change).
    natural : callable
        ``natural(params) -> ndarray`` of shape ``(k,)``: the natural parameter ``eta(theta)``.
        ``params`` maps the model's free variable names to their values (constrained space).
    log_partition : callable
        ``log_partition(params) -> float``: ``A(theta)``, per datapoint.
    bound : float
        L2 radius that every row ``T(y_i)`` is projected onto (datapoints beyond it count as
        clipped). It sets the sensitivity: ``2 * bound`` under substitute-one neighbours and
        ``bound`` under add/remove-one.

    Notes
    -----
    ``statistic`` sees the data; ``natural`` and ``log_partition`` see only parameter values.
    None of their outputs leaves the step except through the noisy sum.
    """

    statistic: Callable[[np.ndarray], np.ndarray]
    natural: Callable[[Mapping[str, np.ndarray]], np.ndarray]
    log_partition: Callable[[Mapping[str, np.ndarray]], float]
    bound: float

    def __post_init__(self) -> None:
        for name in ("statistic", "natural", "log_partition"):
            if not callable(getattr(self, name)):
                raise TypeError(f"`{name}` must be callable.")
        b = float(self.bound)
        if not (math.isfinite(b) and b > 0):
            raise ValueError("`bound` must be a finite positive number.")

    def sensitivity(self, substitute: bool) -> float:
        """L2 sensitivity of the clipped sum under the given neighbour relation."""
        return 2.0 * float(self.bound) if substitute else float(self.bound)

    def rows(self, y: np.ndarray) -> np.ndarray:
        """``T(y_i)`` as a float64 ``(n, k)`` array, before clipping.

        ``statistic`` is applied to one row at a time (``y[i:i + 1]``), so a callable that
        reads other rows (a mean, a rank, a sort) cannot move another row's term: the
        sensitivity bound holds whatever the callable computes.
        """
        y = np.asarray(y)
        if y.ndim == 0:
            y = y[None]
        rows = [self._one_row(y[i : i + 1]) for i in range(y.shape[0])]
        if not rows:
            return np.zeros((0, 1))
        widths = {r.shape[0] for r in rows}
        if len(widths) != 1:
            raise ValueError("`statistic` must return rows of one length k for every datapoint.")
        t = np.stack(rows)
        # Spot check that no state carries between calls: recompute some rows in reverse.
        for i in np.linspace(y.shape[0] - 1, 0, min(y.shape[0], _SPOT_CHECKS)).astype(int):
            again = self._one_row(y[i : i + 1])
            if again.shape != t[i].shape or not np.array_equal(again, t[i], equal_nan=True):
                raise ValueError(
                    "`statistic` returned a different row for the same datapoint on a second "
                    "call: it must be a pure function of the one row it is given."
                )
        return t

    def _one_row(self, row: np.ndarray) -> np.ndarray:
        t = np.asarray(self.statistic(row), dtype=np.float64)
        if t.ndim == 0:
            t = t[None]
        if t.ndim == 2 and t.shape[0] == 1:
            t = t[0]
        if t.ndim != 1:
            raise ValueError(
                "`statistic` must return one row per datapoint: given one datapoint (an array "
                f"with one row) a vector of length k or a (1, k) array, not {t.ndim} dimensions."
            )
        return t

    def clipped_sum(self, y: np.ndarray) -> tuple[np.ndarray, int]:
        """Sum of the rows projected onto the ball of radius ``bound``; and the clip count.

        A row that is not finite counts as clipped and contributes zero.
        """
        t = self.rows(y)
        finite = np.all(np.isfinite(t), axis=1)
        t = np.where(finite[:, None], t, 0.0)
        norms = np.sqrt(np.einsum("ij,ij->i", t, t))
        b = float(self.bound)
        over = norms > b
        scale = np.where(over, b / np.where(over, norms, 1.0), 1.0)
        total = np.einsum("ij,i->j", t, scale)
        return total, int(np.count_nonzero(over | ~finite))

    def parameters(self, params: Mapping[str, np.ndarray]) -> tuple[np.ndarray, float]:
        """``(eta, A)`` at the given parameter values, as float64."""
        eta = np.asarray(self.natural(params), dtype=np.float64).reshape(-1)
        return eta, float(self.log_partition(params))


def check_declaration(
    declared: SufficientStatistic,
    points: list[Mapping[str, np.ndarray]],
    loglik: list[np.ndarray],
    y_synthetic: np.ndarray,
    *,
    rtol: float = 1e-6,
) -> None:
    """Check a declaration against the model on synthetic data; raise if they disagree.

    Parameters
    ----------
    declared : SufficientStatistic
    points : list of mapping
        Parameter values (constrained space) at which the model was evaluated; at least two.
    loglik : list of ndarray
        The model's per-datapoint log-likelihood of ``y_synthetic`` at each point.
    y_synthetic : ndarray
        Data drawn from the model's prior predictive, never the real data: the outcome of this
        check reveals nothing about the data set.
    rtol : float
        Tolerance relative to the scale of the compared differences.

    Raises
    ------
    DeclarationMismatchError
        If some difference ``eta . sum T - n A`` between two points differs from the model's.
    """
    t_sum = declared.rows(y_synthetic).sum(axis=0)
    n = y_synthetic.shape[0]
    decl = []
    for p in points:
        eta, a = declared.parameters(p)
        if eta.shape != t_sum.shape:
            raise DeclarationMismatchError(
                f"`natural` returned {eta.shape[0]} values but `statistic` has "
                f"{t_sum.shape[0]} columns."
            )
        decl.append(float(eta @ t_sum) - n * a)
    model = [float(np.sum(v)) for v in loglik]
    for i in range(1, len(points)):
        d_decl, d_model = decl[i] - decl[0], model[i] - model[0]
        scale = max(abs(d_model), abs(model[i]), abs(model[0]), 1.0)
        if not (np.isfinite(d_decl) and abs(d_decl - d_model) <= rtol * scale):
            raise DeclarationMismatchError(
                "The declared exponential family does not reproduce the model's log-likelihood "
                "differences on synthetic data drawn from the model's prior predictive (this "
                "check never reads the real data). Check `statistic`, `natural` and "
                "`log_partition`, or pass check_statistic=False to skip the check."
            )
