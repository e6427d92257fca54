"""Input checkers shared by the accounting modules.

Every public function of :mod:`pymc_penalty.accounting` validates its arguments through these
helpers, so that a bad argument raises the same ``ValueError`` message wherever it is passed.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np


def _real(
    name: str,
    value: Any,
    *,
    low: float = -math.inf,
    high: float = math.inf,
    low_open: bool = False,
    high_open: bool = False,
    finite: bool = True,
) -> float:
    """Return ``value`` as a float after checking it lies in the stated interval."""
    lb = "(" if low_open else "["
    rb = ")" if high_open else "]"
    accepted = f"{lb}{low:g}, {high:g}{rb}"
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.ndarray)):
        raise ValueError(f"{name} must be a real number in {accepted}; got {value!r}")
    if isinstance(value, np.ndarray):
        if value.ndim != 0:
            raise ValueError(f"{name} must be a scalar in {accepted}; got shape {value.shape}")
        value = value.item()
    x = float(value)
    ok = not math.isnan(x) and (math.isfinite(x) or not finite)
    ok = ok and (x > low if low_open else x >= low) and (x < high if high_open else x <= high)
    if not ok:
        raise ValueError(f"{name} must be a real number in {accepted}; got {value!r}")
    return x


def _integer(name: str, value: Any, *, low: int = 0) -> int:
    """Return ``value`` as an int after checking it is an integer ``>= low``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}; got {value!r}")
    return int(value)


def _choice(name: str, value: Any, options: tuple[str, ...]) -> str:
    if value not in options:
        raise ValueError(f"{name} must be one of {options}; got {value!r}")
    return value
