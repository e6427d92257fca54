"""The precision at which noisy values are published: declared grids (pure NumPy).

A Gaussian release computed in floating point is not an exact sample of the continuous
mechanism: which floats a noisy value can take, and how often, depends at the last bits on the
value the noise was added to. Published at full float64 precision, a release (or a quantity it
determines exactly: the ``accept`` statistic together with ``dp_noise_sd`` and the proposal
gives the penalty test's release to about one ulp) opens attacks on those bits (Mironov 2012,
for the Laplace mechanism). The analysis of the mechanism is about the continuous Gaussian, so
what leaves the package sits on a grid far coarser than the floats:

* ``accept`` (an acceptance probability, a function of the noisy release) on multiples of
  :data:`ACCEPT_GRID`, rounded *stochastically* with the step's own decision uniform: up with
  probability the fractional part, so that its expectation is the exact probability and
  waste recycling stays unbiased; the proposal is accepted on the unrounded test, so the
  chain itself is unchanged;
* noisy counts (``dp_clipped_count``, an owner's count, the warm start's count of the rows)
  on the integers (:data:`COUNT_GRID`), and ``dp_clipped_fraction`` is that integer over the
  public n.

Every cell of either grid holds about ``2**40`` or more floats of the underlying release, so a
cell's probability is the continuous mechanism's up to rounding: what the analysis allows.
Adaptation reads the published (grid) values, so ``scaling`` and the found clip are functions
of grid values and public inputs only.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["ACCEPT_GRID", "COUNT_GRID", "on_grid", "snap_accept", "snap_count"]

#: Spacing of the published ``accept`` statistic (a power of two: the rounding is exact).
ACCEPT_GRID = 2.0**-10
#: Spacing of every published noisy count.
COUNT_GRID = 1.0


def snap_accept(prob: Any, u: Any) -> Any:
    """An acceptance probability rounded to a multiple of :data:`ACCEPT_GRID`, up when
    ``u < frac`` (``frac`` the fractional part in grid units), down otherwise.

    Parameters
    ----------
    prob : float or ndarray
        Acceptance probabilities in [0, 1] (NaN stays NaN).
    u : float or ndarray
        Uniform(0, 1) draws independent of the data: the step's decision uniforms. Over ``u``
        the expectation of the result is ``prob`` exactly.

    Returns
    -------
    float or ndarray
        Values ``k * ACCEPT_GRID`` with ``k`` an integer in ``[0, 1 / ACCEPT_GRID]``.
    """
    scaled = np.asarray(prob, dtype=np.float64) / ACCEPT_GRID  # exact: a power of two
    low = np.floor(scaled)
    out = (low + (np.asarray(u) < scaled - low)) * ACCEPT_GRID
    return float(out) if np.ndim(out) == 0 else out


def snap_count(count: Any) -> Any:
    """A noisy count rounded to the nearest multiple of :data:`COUNT_GRID` (NaN stays NaN).

    The count's noise sd is at least 1 wherever the budget is not enormous, so rounding to the
    nearest integer adds no bias that matters (the fractional part of the noise is nearly
    uniform) and leaves the count's accounting unchanged (post-processing).
    """
    out = np.rint(np.asarray(count, dtype=np.float64) / COUNT_GRID) * COUNT_GRID
    return float(out) if np.ndim(out) == 0 else out


def on_grid(values: Any, grid: float) -> bool:
    """Whether every finite value is an exact multiple of ``grid`` (a test helper; NaN and
    values that were not released are skipped)."""
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[np.isfinite(v)]
    return bool(np.all(np.rint(v / grid) * grid == v)) if not math.isnan(grid) else False
