"""Row locality: datapoint i's log-likelihood term may read data through row i alone.

The penalty step clips each datapoint's log-likelihood ratio to ``[-B, B]`` and claims an L2
sensitivity of ``2B`` (``B`` under add/remove-one). That holds only if one record moves one
term. Covariates centred or scaled inside the graph (``(x - x.mean()) / x.std()``), one joint
density over all rows (an observed ``MvNormal`` over a vector of all rows), or a term that
reads another row's values break it: one record then moves every term.

The check looks at the structure, never at the data. Every array that could carry records
(:func:`carries_records`: observed values, ``pm.Data``, ``pytensor.shared`` variables and
constants with an axis of at least half the datapoint count, or as many elements) is
replaced by a synthetic stand-in: covariates by random values, observations by a draw from
the model itself given the synthetic covariates and a prior draw. Then two checks run.

1. **Structure.** No operation in the per-row terms' graph may summarise records: reduce a
   record-carrying data array to something smaller (``sum``, ``mean``, ``max``, a quantile,
   one record picked out, a count per group), or read data rows through a data-dependent
   index (``x[idx + 1]``). Such a summary couples every row that reads it, whatever values
   switch it on, so it is refused even where a probe could not see it move (``x /
   x.max()`` on integer data, imputation of a sentinel by the mean of other rows, a
   rescaling switched on by the data's own maximum, a coupling active only in one region
   of the parameter space).
2. **Probes.** One record at a time is changed (first, last and one in the middle; in
   every stand-in together and in each alone; moved far, then to extreme values and NaN),
   at two random parameter points, and at most one datapoint's term may move. A term that
   reads a neighbouring row (lags ``y[:-1]`` beside ``y[1:]``, cumulative sums, sorts)
   moves two.

Nothing of the real data is read, so the outcome reveals nothing about it.
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
from pytensor.graph.basic import Apply, Constant, Variable
from pytensor.graph.traversal import ancestors, graph_inputs, io_toposort
from pytensor.tensor.shape import Shape, Shape_i
from pytensor.tensor.sharedvar import TensorSharedVariable
from pytensor.tensor.subtensor import AdvancedSubtensor, AdvancedSubtensor1
from pytensor.tensor.type_other import NoneTypeT, SliceType

from pymc_penalty.likelihood import per_datapoint_terms

__all__ = [
    "RowCouplingError",
    "array_value",
    "carries_records",
    "check_row_locality",
    "holds_records",
]

#: Parameter points at which the terms are compared.
_POINTS = 2
_SEED = 20261124


class RowCouplingError(ValueError):
    """One record moves several datapoints' log-likelihood terms (raised as the gate's error)."""


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


class _Probe:
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


def _check_term_shapes(model: pm.Model, raw_terms: list, n: int) -> None:
    """Refuse observed variables whose log density has no datapoint axis of length n."""
    for rv, term in zip(model.observed_RVs, raw_terms, strict=True):
        length = term.type.shape[0] if term.ndim else None
        if term.ndim == 0 or (length is not None and length != n):
            raise RowCouplingError(
                f"Observed variable {rv.name!r} has one joint log density over all its rows "
                "(for instance an MvNormal over a vector that holds every datapoint), so one "
                "record moves the whole term. Give each datapoint its own density: observe "
                "an (n, k) array with a row-wise distribution, or one row per datapoint."
            )


# --- 1. structure ------------------------------------------------------------------------

_SHAPE_OPS = (Shape, Shape_i)
_GATHER_OPS = (AdvancedSubtensor, AdvancedSubtensor1)


def _data_dependent(nodes: Sequence[Apply], data: set[Variable]) -> set[Variable]:
    """Variables whose values depend on ``data`` (shapes do not count: under the substitute
    relation the datapoint count is public)."""
    dependent = set(data)
    for node in nodes:
        if isinstance(node.op, _SHAPE_OPS):
            continue
        if any(i in dependent for i in node.inputs):
            dependent.update(node.outputs)
    return dependent


def _gather_axes(node: Apply) -> list[tuple[Variable, int]]:
    """(index input, axis of the indexed array it selects along) of an advanced gather."""
    if isinstance(node.op, AdvancedSubtensor1):
        return [(node.inputs[1], 0)]
    pairs, axis = [], 0
    for idx in node.inputs[1:]:
        if isinstance(idx.type, NoneTypeT):
            continue
        if isinstance(idx.type, SliceType) or not hasattr(idx.type, "ndim"):
            axis += 1
            continue
        pairs.append((idx, axis))
        axis += idx.type.ndim if idx.type.dtype == "bool" else 1
    return pairs


def _summaries(
    terms: Sequence[Variable],
    inputs: Sequence[Variable],
    point: Sequence[np.ndarray],
    data: set[Variable],
    n: int,
) -> list[Apply]:
    """Nodes of the terms' graph that summarise records or read rows through a data index."""
    nodes = io_toposort([*inputs, *graph_inputs(terms)], list(terms))
    dependent = _data_dependent(nodes, data)
    candidates = [
        node
        for node in nodes
        if not isinstance(node.op, _SHAPE_OPS)
        and any(i in dependent for i in node.inputs)
        and all(hasattr(v.type, "ndim") for v in (*node.inputs, *node.outputs))
        or isinstance(node.op, _GATHER_OPS)
    ]
    if not candidates:
        return []
    tensors = {v for node in candidates for v in (*node.inputs, *node.outputs)}
    tensors = [v for v in tensors if hasattr(v.type, "ndim") and v.type.ndim > 0]
    shape_fn = pytensor.function(
        list(inputs), [v.shape for v in tensors], on_unused_input="ignore", mode="FAST_RUN"
    )
    shapes = dict(zip(tensors, (tuple(int(s) for s in sh) for sh in shape_fn(*point)), strict=True))

    def size(v: Variable) -> int:
        return int(np.prod(shapes[v])) if v in shapes else 1

    found = []
    for node in candidates:
        data_in = [i for i in node.inputs if i in dependent]
        data_out = [o for o in node.outputs if o in dependent]
        if data_out and any(size(i) >= n for i in data_in) and any(size(o) < n for o in data_out):
            found.append(node)  # a reduction of records (or a few records picked out)
            continue
        if isinstance(node.op, _GATHER_OPS) and node.inputs[0] in dependent:
            array_shape = shapes.get(node.inputs[0], ())
            for idx, axis in _gather_axes(node):
                if idx in dependent and axis < len(array_shape) and array_shape[axis] >= n:
                    found.append(node)  # rows read through a data-dependent index
                    break
    return found


def _labels_behind(node: Apply, probe: _Probe) -> str:
    behind = [probe.names[v] for v in ancestors(node.inputs) if v in probe.names]
    labels = [probe.sources[name].label for name in dict.fromkeys(behind)]
    return ", ".join(labels) if labels else "the data"


def _observed_reading(node: Apply, model: pm.Model, terms: Sequence[Variable]) -> list[str]:
    outs = set(node.outputs)
    return [
        rv.name
        for rv, term in zip(model.observed_RVs, terms, strict=True)
        if outs & set(ancestors([term]))
    ]


# --- 2. probes ---------------------------------------------------------------------------


def _moved_rows(base: list[np.ndarray], moved: list[np.ndarray]) -> set[int]:
    """Datapoints whose term moved, over every observed variable."""
    rows: set[int] = set()
    for b, m in zip(base, moved, strict=True):
        same = (b == m) | (np.isnan(b) & np.isnan(m))
        rows.update(int(i) for i in np.flatnonzero(~same))
    return rows


def _refuse_hidden_records(terms: Sequence[Variable], n: int, stand_ins: set[Variable]) -> None:
    """Refuse arrays that could hold records and appear only in the log density.

    Every record-carrying array of the model's graph has been replaced by a stand-in; a
    constant or shared array that still could hold records entered when the log density was
    derived (a NumPy array, or a ``pytensor.shared`` one, that a ``CustomDist``'s ``logp``
    closes over), where no stand-in can reach it, so neither check could see what it couples.
    """
    if any(v not in stand_ins and holds_records(v, n) for v in graph_inputs(terms)):
        raise RowCouplingError(
            "A log density reads an array that could hold records but is not in the model's "
            "graph (for instance a NumPy array that a CustomDist's logp closes over), so "
            "row locality cannot be checked. Pass every data array to the distribution as "
            "a parameter (pm.Data with one row per datapoint), or as the observed values."
        )


def check_row_locality(
    model: pm.Model,
    value_vars: Sequence[Variable],
    point: dict[str, np.ndarray],
    n: int,
) -> None:
    """Refuse a model in which one record could move several datapoints' log-likelihood terms.

    Parameters
    ----------
    model : pm.Model
    value_vars : sequence of Variable
        The value variables the step samples (the raveled parameter vector).
    point : dict
        A point giving the shapes of ``value_vars``.
    n : int
        The datapoint count.

    Raises
    ------
    RowCouplingError
        Naming the observed variable and the array through which rows couple. The message
        never holds data values (nor n).
    """
    _check_term_shapes(model, model.logp(vars=model.observed_RVs, sum=False), n)
    if n < 2:
        return
    probe = _Probe(model, n)
    terms = per_datapoint_terms(probe.model)
    _refuse_hidden_records(terms, n, {s.stand_in for s in probe.sources.values()})
    names = [v.name for v in value_vars]
    by_name = {v.name: v for v in probe.model.value_vars}
    new_vars = [by_name[name] for name in names]
    rng = np.random.default_rng(_SEED)
    probe.fill(rng, False, _SEED)
    data = {s.stand_in for s in probe.sources.values()}
    values = [np.asarray(point[name], dtype=by_name[name].dtype) for name in names]
    try:
        found = _summaries(terms, new_vars, values, data, n)
    except Exception:  # noqa: BLE001 (shapes not computable on stand-ins: the probes decide)
        found = []
    if found:
        node = found[0]
        observed = _observed_reading(node, probe.model, terms) or [
            rv.name for rv in model.observed_RVs
        ]
        raise RowCouplingError(
            f"One record moves other datapoints' log-likelihood terms of {observed}: they "
            f"read a summary of many records of {_labels_behind(node, probe)} (a sum, mean, "
            "max, min, count, quantile, a record picked out, or rows read through a "
            "data-dependent index), so the clip bound would not bound the sensitivity. "
            "Standardise covariates outside the model with public constants, compute other "
            "constants from public information, impute missing values before sampling, and "
            "let datapoint i's term read row i only."
        )
    _probe_records(probe, model, terms, new_vars, point, names, rng)


def _probe_records(probe, model, terms, new_vars, point, names, rng) -> None:  # noqa: ANN001
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
            probe.fill(rng, tame, _SEED)
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
        saved = probe.change_record(where, move, _SEED + 1, only)
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


def _find_culprit(probe: _Probe, fn, x, where: float, move: str, base) -> str:  # noqa: ANN001
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
