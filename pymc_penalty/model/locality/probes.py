"""The row-locality probes: the model rebuilt on synthetic stand-ins, one record changed at a
time (check 2 of :mod:`pymc_penalty.model.locality`).

Every array that could carry records gets a stand-in (:class:`Probe`); one record at a time is
changed (first, last and one in the middle; in every stand-in together and in each alone;
moved far, then to extreme values and NaN) at a few random parameter points, and at most one
datapoint's term may move (:func:`probe_records`). Nothing of the real data is read.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pymc as pm
import pytensor
from pymc.model.fgraph import fgraph_from_model, model_from_fgraph
from pymc.pytensorf import compile as pm_compile
from pymc.pytensorf import join_nonshared_inputs, make_shared_replacements
from pytensor.graph.basic import Constant, Variable
from pytensor.tensor.sharedvar import TensorSharedVariable

from pymc_penalty.errors import RowCouplingError
from pymc_penalty.model.locality.records import array_value, holds_records

__all__ = ["SEED", "Probe", "probe_records"]

#: Parameter points at which the terms are compared.
_POINTS = 2
#: Seed of the stand-ins, the parameter points and the changed records (fixed: the outcome
#: depends on the model's structure alone).
SEED = 20261124


def _record_axis(shape: tuple[int, ...], n: int) -> int | None:
    """The axis along which records run: one of length ``n``, else the longest one of at least
    ``ceil(n / 2)``; None when no axis is that long (records are then single elements)."""
    exact = [ax for ax, s in enumerate(shape) if int(s) == n]
    if exact:
        return exact[0]
    half = (n + 1) // 2
    long = [ax for ax, s in enumerate(shape) if int(s) >= half]
    return max(long, key=lambda ax: shape[ax]) if long else None


def _synthetic(
    dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator, tame: bool
) -> np.ndarray:
    """A stand-in array.

    Random: floats in (0.1, 0.9), integers and booleans in {0, 1}. Tame (the fallback when
    random stand-ins make the model fail, e.g. as an index or a matrix that must be
    positive definite): floats near 0.5, integers 0, square float matrices near the identity.
    """
    if dtype.kind == "b":
        return np.zeros(shape, dtype=bool) if tame else rng.integers(0, 2, size=shape) > 0
    if dtype.kind in "iu":
        return (
            np.zeros(shape, dtype=dtype) if tame else rng.integers(0, 2, size=shape).astype(dtype)
        )
    if not tame:
        return rng.uniform(0.1, 0.9, size=shape).astype(dtype)
    values = rng.uniform(0.45, 0.55, size=shape)
    if len(shape) >= 2 and shape[-1] == shape[-2]:
        values = values * 1e-3 + np.eye(shape[-1])
    return values.astype(dtype)


#: How a record is changed: moved far up or down (ranks, max and min change), or set to an
#: extreme value (sentinels, thresholds, overflow) or NaN (missing-value handling).
_MOVES = ("up", "down", "huge", "negative", "nan")
#: How far a float record is moved by "up" / "down": beyond every synthetic value.
_FAR = 7.25
_HUGE = 1e6


def _changed(values: np.ndarray, move: str) -> np.ndarray:
    """A different value of the same kind for ``move`` (see ``_MOVES``)."""
    kind = values.dtype.kind
    if kind == "b":
        return ~values
    if kind in "iu":
        info = np.iinfo(values.dtype)
        if move == "huge":
            return np.full_like(values, min(int(_HUGE), info.max))
        if move in ("negative", "nan"):
            return np.full_like(values, max(-1, info.min) if info.min < 0 else info.max)
        return np.where(values == 0, 1, 0).astype(values.dtype)
    if move == "up":
        return (values + _FAR).astype(values.dtype)
    if move == "down":
        return (values - _FAR).astype(values.dtype)
    if move == "huge":
        return np.full_like(values, _HUGE)
    if move == "negative":
        return np.full_like(values, -_HUGE)
    return np.full_like(values, np.nan)


class _Source(NamedTuple):
    stand_in: TensorSharedVariable
    axis: int | None  # record axis (None: single elements)
    label: str


class Probe:
    """The model rebuilt on synthetic stand-ins, with one record changeable at a time."""

    def __init__(self, model: pm.Model, n: int) -> None:
        # PyMC's conversion refuses user initvals, which the check does not need.
        initvals = dict(model.rvs_to_initial_values)
        try:
            model.rvs_to_initial_values.update(dict.fromkeys(initvals))
            fgraph, _ = fgraph_from_model(model, inlined_views=True)
        finally:
            model.rvs_to_initial_values.update(initvals)
        self.n = n
        self.sources: dict[str, _Source] = {}
        replacements = []
        for var in list(fgraph.variables):
            if not isinstance(var, Constant | TensorSharedVariable) or not holds_records(var, n):
                continue
            shape = tuple(array_value(var).shape)
            name = f"synthetic_{len(self.sources)}"
            stand_in = pytensor.shared(
                np.zeros(shape, dtype=var.dtype), shape=var.type.shape, name=name
            )
            label = (
                repr(var.name) if var.name else f"a constant array of shape {_shape_text(shape, n)}"
            )
            self.sources[name] = _Source(stand_in, _record_axis(shape, n), label)
            replacements.append((var, stand_in))
        fgraph.replace_all(replacements, import_missing=True)
        self.model = model_from_fgraph(fgraph, mutate_fgraph=True)
        # PyMC renames a stand-in after the pm.Data container it replaced: match by identity.
        self.names = {source.stand_in: name for name, source in self.sources.items()}
        self.observed = {}
        for rv in self.model.observed_RVs:
            value = self.model.rvs_to_values[rv]
            if value in self.names:
                self.observed[self.names[value]] = rv

    def fill(self, rng: np.random.Generator, tame: bool, seed: int) -> None:
        """Synthetic covariates, then observations drawn from the model given them (kept
        synthetic when the model cannot draw them, e.g. a CustomDist without ``random``)."""
        for source in self.sources.values():
            value = source.stand_in.get_value(borrow=True)
            source.stand_in.set_value(_synthetic(value.dtype, value.shape, rng, tame))
        for name, value in self._draw_observations(seed).items():
            var = self.sources[name].stand_in
            var.set_value(np.asarray(value, dtype=var.dtype))

    def _draw_observations(self, seed: int) -> dict[str, np.ndarray]:
        """One joint draw of every observed variable from the synthetic model (or none)."""
        if not self.observed:
            return {}
        try:
            draws = pm.draw(list(self.observed.values()), random_seed=seed)
        except Exception:  # noqa: BLE001 (no random method: observations stay synthetic)
            return {}
        return dict(zip(self.observed, draws, strict=True))

    def index(self, name: str, where: float) -> tuple:
        """The index of the record at relative position ``where`` in [0, 1] of a source."""
        source = self.sources[name]
        shape = source.stand_in.get_value(borrow=True).shape
        if source.axis is None:
            flat = round(where * (int(np.prod(shape)) - 1))
            return tuple(int(i) for i in np.unravel_index(flat, shape))
        index: list = [slice(None)] * len(shape)
        index[source.axis] = round(where * (shape[source.axis] - 1))
        return tuple(index)

    def change_record(
        self, where: float, move: str, seed: int, only: str | None = None
    ) -> dict[str, tuple[tuple, np.ndarray]]:
        """Change the record at ``where`` in every stand-in (or in ``only``), in place; return
        what :meth:`restore` needs. Observations take a fresh draw's record where it differs
        (a likely value of their own distribution), else a changed one."""
        fresh = self._draw_observations(seed) if only is None and move in ("up", "down") else {}
        saved = {}
        for name, source in self.sources.items():
            if only is not None and name != only:
                continue
            values = source.stand_in.get_value(borrow=True)
            index = self.index(name, where)
            old = np.array(values[index], copy=True)
            changed = _changed(old, move)
            if name in fresh:
                other = np.asarray(fresh[name], dtype=values.dtype)[index]
                changed = np.where(other == old, changed, other)
            values[index] = changed
            source.stand_in.set_value(values, borrow=True)
            saved[name] = (index, old)
        return saved

    def restore(self, saved: dict[str, tuple[tuple, np.ndarray]]) -> None:
        for name, (index, old) in saved.items():
            var = self.sources[name].stand_in
            values = var.get_value(borrow=True)
            values[index] = old
            var.set_value(values, borrow=True)


def _shape_text(shape: tuple[int, ...], n: int) -> str:
    parts = ["n" if s == n else str(s) for s in shape]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def _moved_rows(base: list[np.ndarray], moved: list[np.ndarray]) -> set[int]:
    """Datapoints whose term moved, over every observed variable."""
    rows: set[int] = set()
    for b, m in zip(base, moved, strict=True):
        same = (b == m) | (np.isnan(b) & np.isnan(m))
        rows.update(int(i) for i in np.flatnonzero(~same))
    return rows


def probe_records(
    probe: Probe,
    terms: Sequence[Variable],
    new_vars: Sequence[Variable],
    point: dict[str, np.ndarray],
    names: Sequence[str],
    rng: np.random.Generator,
) -> None:
    """Change one record at a time on the stand-ins; refuse when more than one datapoint's
    term moves (or when the model cannot run on the stand-ins at all)."""
    shared = make_shared_replacements(point, new_vars, probe.model)
    outs, flat = join_nonshared_inputs(
        point=point, outputs=terms, inputs=new_vars, shared_inputs=shared
    )
    fn = pm_compile([flat], outs, mode="FAST_COMPILE", on_unused_input="ignore")
    x0 = np.concatenate([np.ravel(point[name]) for name in names]).astype(flat.dtype)
    xs = [(x0 + rng.normal(0.0, 0.5, size=x0.shape)).astype(flat.dtype) for _ in range(_POINTS)]
    wheres = (0.0, 1.0, float(rng.uniform(0.1, 0.9)))
    bases = None
    for tame in (False, True):
        try:
            probe.fill(rng, tame, SEED)
            bases = [[np.asarray(t) for t in fn(x)] for x in xs]
            break
        except Exception:  # noqa: BLE001 (any failure on synthetic stand-ins: try tamer ones)
            continue
    if bases is None:
        raise RowCouplingError(
            "Row locality could not be checked: the model fails on synthetic stand-ins for "
            "its data (random values in (0.1, 0.9) and {0, 1}, then values near 0.5 and 0). "
            "Pass covariates through pm.Data and keep index arrays in the model's own range."
        )
    groups: list[str | None] = [None]
    if len(probe.sources) > 1:
        groups += list(probe.sources)
    probes = [
        (move, only)
        for move, only in itertools.product(_MOVES, groups)
        if only is None or move in ("up", "down")  # extreme values: every array at once
    ]
    for (x, base), where, (move, only) in itertools.product(
        zip(xs, bases, strict=True), wheres, probes
    ):
        saved = probe.change_record(where, move, SEED + 1, only)
        try:
            moved = [np.asarray(t) for t in fn(x)]
        except Exception:  # noqa: BLE001 (an extreme value out of the model's range)
            moved = None
        finally:
            probe.restore(saved)
        if moved is None:
            if move in ("up", "down"):
                raise RowCouplingError(
                    "Row locality could not be checked: the model fails when one synthetic "
                    "record changes. Keep index arrays in the model's own range."
                )
            continue
        if len(_moved_rows(base, moved)) > 1:
            culprit = only and probe.sources[only].label
            culprit = culprit or _find_culprit(probe, fn, x, where, move, base)
            raise RowCouplingError(
                f"Changing one record moves other datapoints' log-likelihood terms (through "
                f"{culprit}): the clip bound would not bound the sensitivity. This happens "
                "when covariates are centred or scaled inside the model (x - x.mean(), "
                "x / x.std()), when a term reads other rows (lags such as y[:-1] beside "
                "y[1:], cumulative sums, sorts), or when rows are summarised inside the "
                "graph. Standardise covariates outside the model with public constants, and "
                "let datapoint i's term read row i only."
            )


def _find_culprit(probe: Probe, fn, x, where: float, move: str, base) -> str:  # noqa: ANN001
    """Name the stand-in whose record alone moves several rows."""
    for name in probe.sources:
        saved = probe.change_record(where, move, 0, only=name)
        try:
            moved = [np.asarray(t) for t in fn(x)]
        except Exception:  # noqa: BLE001
            continue
        finally:
            probe.restore(saved)
        if len(_moved_rows(base, moved)) > 1:
            return probe.sources[name].label
    return "several arrays together"
