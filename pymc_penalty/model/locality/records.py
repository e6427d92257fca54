"""What could carry records: the test the row-locality gate and data recognition share.

An array could hold the records of an ``n``-row dataset when it has an axis of at least half
the datapoint count or as many elements (:func:`carries_records`); a constant or shared
array that does (:func:`holds_records`) counts as data wherever it appears. Pure shape and
type tests: nothing here reads a value except to see that a constant is filled with one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pytensor.graph.basic import Constant, Variable
from pytensor.tensor.sharedvar import TensorSharedVariable

from pymc_penalty.errors import RowCouplingError

__all__ = ["RowCouplingError", "array_value", "carries_records", "holds_records"]


def carries_records(shape: Sequence[int], n: int) -> bool:
    """Whether an array of this shape could hold the records of an ``n``-row dataset.

    Conservative on purpose: an axis of at least ``ceil(n / 2)`` (rows, a transpose, a
    reshape to ``(1, n)``, a slice of ``n - 1`` rows) or at least ``n`` elements in all
    (any other reshape, long format). A false positive costs a refusal; a false negative, a
    leak.
    """
    if n < 2 or len(shape) == 0:
        return False
    half = (n + 1) // 2
    return any(int(s) >= half for s in shape) or int(np.prod(shape)) >= n


def array_value(var: Variable) -> np.ndarray | None:
    """The value of a constant or shared tensor (None for anything else)."""
    if isinstance(var, Constant):
        return np.asarray(var.data)
    if isinstance(var, TensorSharedVariable):
        return np.asarray(var.get_value(borrow=True))
    return None


def holds_records(var: Variable, n: int) -> bool:
    """Whether a constant or shared array could hold records (:func:`carries_records`).

    A constant whose elements are all equal (``np.zeros(n)`` as a prior mean) holds nothing
    and is exempt; a shared variable never is, since ``set_data`` can refill it later.
    """
    value = array_value(var)
    if value is None or value.ndim == 0 or not carries_records(value.shape, n):
        return False
    if isinstance(var, Constant) and value.dtype.kind in "biuf":
        flat = value.reshape(-1)
        return not bool(np.all(flat == flat[0]))
    return True
