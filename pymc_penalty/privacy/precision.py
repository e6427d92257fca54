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

Continuous releases that leave the place where their noise is added (the private warm
start's noisy gradient, curvature and log-scale sums; the Taylor path's one-shot ``G`` and
``H``; an owner's noisy clipped sums as the driver receives them, and a shard pool's noisy
total) are rounded to the nearest multiple of :func:`noise_grid` (:func:`snap_noisy`) where
the noise is added (:func:`gaussian_release`): the unrounded noisy value is never stored or
returned. For a value ``y`` released with noise sd ``s`` the grid is the power of two

    ``g(y, s) = max(2**floor(log2 s) * 2**-NOISE_GRID_BITS, 2**FLOAT_CELL_BITS * ulp(y))``

(``NOISE_GRID_BITS = 10``, ``FLOAT_CELL_BITS = 40``). Why this is enough, and what it costs:

* *What the rounding publishes.* ``y = fl(x + fl(s Z))``, with ``Z`` the generator's normal
  draw. Float rounding is monotone, so the published cell ``k g`` is the event that ``Z``
  lies in an interval, whose two ends are those of the continuous mechanism's cell, ``(k g
  +- g / 2 - x) / s``, each moved by at most about ``ulp(y) + ulp(s Z)`` (plus the lattice of
  the generator's draws, about ``2**-50 s``). The continuous mechanism followed by the same
  rounding is post-processing, as private as the analysis says; the published cell's
  probability differs from it only through those moves of its ends. Against a cell of width
  ``g <= s`` (the value within about ``2**13`` noise sds of zero) they are small: the first
  term keeps ``ulp(y) <= 2**-40 g``, the second keeps ``g > 2**-11 s``, so that ``ulp(s Z) <=
  2**-49 s`` (``|Z| < 8``) is at most ``2**-38 g``, and each cell's probability is the
  continuous mechanism's to a relative ``2**-36`` or so (the density moves by a factor at most
  ``exp(g |y - x| / s**2)`` across a cell: nothing within a thousand noise sds of ``x``).
  Where ``g > s`` a cell ``k`` noise sds from ``x`` is off by about ``k ulp(y) / s = k 2**-52
  |y| / s`` relative (``2**-22 k`` at ``|y| = 2**30 s``): the rounding of ``x + s Z`` itself,
  which no grid removes, an additive ``k ulp(y) / s`` at most on the privacy loss. In
  either case no cell the continuous mechanism reaches is missing or added: the holes and
  the value-dependent lattice that the floating-point attacks read (Mironov 2012) are inside
  cells. What remains is the generator's own departure from the Gaussian law, the same for
  every grid: the package does not implement an exact sampler.
* *Far from zero the float term sets the grid.* Where ``|y|`` exceeds 4 to 8 noise sds,
  ``2**40`` floats of ``|y|`` are wider than ``2**-10 s``: the value keeps 13 significant bits
  (``|y| / g`` in ``[2**12, 2**13)``) and moves by at most ``2**-13 |y|`` (1.2e-4 of itself).
  A grid of only ``2**-10 s`` there would hold fewer floats the larger ``|y|`` is (``2**12``
  at ``|y| = 2**30 s``), and a cell's probability would then depend on ``x`` at a relative
  ``ulp(y) / g`` (``2**-12``): a measurable departure, which the float term brings down to
  the ``k ulp(y) / s`` of the rounding itself (``2**-22 k`` there). The
  cost: the rounding, at most ``2**-13 |y|``, exceeds ``2**-11 s`` where ``|y| > 4 s`` and
  reaches the noise sd itself only where ``|y| > 2**13 s``, a release whose relative noise
  is already below ``1.2e-4`` (a Fisher or Taylor sum over very many rows). There the
  rounding is larger than the noise (and the noise-aware posterior, which integrates out
  the noise only, does not see it), but a metric, a mode or a Hessian moved by ``1.2e-4``
  of itself is nothing a user can see.
* *Near zero* (``|y|`` below about 4 noise sds) the grid is ``2**-10`` to ``2**-11`` of the
  noise sd: the rounding moves a value by at most ``2**-11 s`` and adds ``g**2 / 12``
  (``< 1e-6 s**2``) to its variance.
* *Data independence.* ``g`` depends on the public ``s`` and on the noisy ``y`` only, and the
  rounding is deterministic: post-processing, no privacy cost. The result is again on its
  own grid (``snap_noisy`` is idempotent: a value rounded up to ``2**(E + 1)`` is a multiple
  of the coarser grid there), so :func:`on_noise_grid` checks a published value from the
  value and its sd alone. A value released without noise (``s`` zero or not finite: not
  private, e.g. ``clip=None``) and a value that is not finite are returned unchanged.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = [
    "ACCEPT_GRID",
    "COUNT_GRID",
    "FLOAT_CELL_BITS",
    "NOISE_GRID_BITS",
    "gaussian_release",
    "noise_grid",
    "on_grid",
    "on_noise_grid",
    "snap_accept",
    "snap_count",
    "snap_noisy",
]

#: Spacing of the published ``accept`` statistic (a power of two: the rounding is exact).
ACCEPT_GRID = 2.0**-10
#: Spacing of every published noisy count.
COUNT_GRID = 1.0
#: A continuous release's grid is at most ``2**-NOISE_GRID_BITS`` of its noise sd (between
#: ``2**-11`` and ``2**-10`` of it, a power of two) where the value is near zero.
NOISE_GRID_BITS = 10
#: Each cell of a continuous release's grid holds at least ``2**FLOAT_CELL_BITS`` floats of the
#: value's magnitude.
FLOAT_CELL_BITS = 40


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


def noise_grid(value: Any, sd: Any) -> Any:
    """The grid of a continuous value released with Gaussian noise of sd ``sd`` (see the
    module docstring): ``max(2**floor(log2 sd) * 2**-NOISE_GRID_BITS,
    2**FLOAT_CELL_BITS * ulp(value))``, a power of two.

    Parameters
    ----------
    value : float or ndarray
        The noisy value (or the published one: the grid of a value on its grid is its own).
    sd : float or ndarray
        Its noise sd (broadcast against ``value``).

    Returns
    -------
    float or ndarray
        The spacing per value; NaN where ``value`` is not finite or ``sd`` is not positive
        and finite (no grid: such a value is not rounded).
    """
    v = np.abs(np.asarray(value, dtype=np.float64))
    s = np.asarray(sd, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(s) & (s > 0.0)
    _, exponent = np.frexp(np.where(ok, s, 1.0))  # s = m 2**exponent, m in [0.5, 1)
    by_sd = np.ldexp(1.0, exponent - 1 - NOISE_GRID_BITS)  # largest power of two <= s, scaled
    with np.errstate(invalid="ignore"):
        by_float = np.ldexp(np.spacing(v), FLOAT_CELL_BITS)  # ulp(|v|) is a power of two
        grid = np.where(ok & np.isfinite(v), np.maximum(by_sd, by_float), np.nan)
    return float(grid) if np.ndim(grid) == 0 else grid


def snap_noisy(value: Any, sd: Any) -> Any:
    """A noisy continuous value rounded to the nearest multiple of :func:`noise_grid` (ties to
    even): deterministic post-processing of the noisy value and its public sd.

    A value that is not finite, or whose ``sd`` is zero or not finite (released without
    noise: not private), is returned unchanged.
    """
    v = np.asarray(value, dtype=np.float64)
    grid = noise_grid(v, sd)
    with np.errstate(invalid="ignore"):
        # |v| / grid < 2**13 wherever grid is finite: the quotient, rint and product are exact.
        out = np.where(np.isfinite(grid), np.rint(v / grid) * grid, v)
    return float(out) if np.ndim(out) == 0 else out


def gaussian_release(value: Any, sd: Any, rng: np.random.Generator) -> Any:
    """``value`` plus Gaussian noise of sd ``sd`` (one standard normal draw per entry, in
    order), rounded to its grid (:func:`snap_noisy`) before it is returned: the one place a
    continuous release gets its noise, so that the unrounded noisy value exists nowhere else.

    Parameters
    ----------
    value : float or ndarray
        The exact statistic (its budget already committed).
    sd : float or ndarray
        Noise sd, broadcast against ``value``.
    rng : numpy.random.Generator
        The privacy noise.

    Returns
    -------
    float or ndarray
        The release, on its grid; a float for a scalar ``value``.
    """
    v = np.asarray(value, dtype=np.float64)
    z = rng.standard_normal() if v.ndim == 0 else rng.standard_normal(v.shape)
    return snap_noisy(v + np.asarray(sd, dtype=np.float64) * z, sd)


def on_noise_grid(values: Any, sd: Any) -> bool:
    """Whether every finite value divided by its :func:`noise_grid` is exactly an integer (a
    test helper; values that are not finite are skipped, a finite value without a grid fails).
    """
    v = np.asarray(values, dtype=np.float64)
    grid = np.broadcast_to(
        np.asarray(noise_grid(v, sd), dtype=np.float64), np.broadcast_shapes(v.shape, np.shape(sd))
    )
    v = np.broadcast_to(v, grid.shape)
    finite = np.isfinite(v)
    ratio = v[finite] / grid[finite]
    return bool(np.all(np.isfinite(ratio)) and np.all(ratio == np.rint(ratio)))
