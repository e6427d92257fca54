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

from collections.abc import Sequence

import numpy as np
import pymc as pm
import pytensor
from pytensor.graph.basic import Apply, Variable
from pytensor.graph.traversal import ancestors, graph_inputs, io_toposort
from pytensor.tensor.shape import Shape, Shape_i
from pytensor.tensor.subtensor import AdvancedSubtensor, AdvancedSubtensor1
from pytensor.tensor.type_other import NoneTypeT, SliceType

from pymc_penalty.errors import RowCouplingError
from pymc_penalty.model.likelihood import per_datapoint_terms
from pymc_penalty.model.locality.probes import SEED, Probe, probe_records
from pymc_penalty.model.locality.records import array_value, carries_records, holds_records

__all__ = [
    "RowCouplingError",
    "array_value",
    "carries_records",
    "check_row_locality",
    "holds_records",
]


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


def _labels_behind(node: Apply, probe: Probe) -> str:
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
    *,
    rule_n: int | None = None,
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
    rule_n : int, optional
        The count the shape rules compare lengths with (which arrays could hold records,
        what is a reduction of records): ``n`` by default; under add/remove-one with a
        public bound, the bound (:func:`pymc_penalty.model.checks.rule_rows`).

    Raises
    ------
    RowCouplingError
        Naming the observed variable and the array through which rows couple. The message
        never holds data values (nor n).
    """
    _check_term_shapes(model, model.logp(vars=model.observed_RVs, sum=False), n)
    if n < 2:
        return
    n = n if rule_n is None else int(rule_n)
    probe = Probe(model, n)
    terms = per_datapoint_terms(probe.model)
    _refuse_hidden_records(terms, n, {s.stand_in for s in probe.sources.values()})
    names = [v.name for v in value_vars]
    by_name = {v.name: v for v in probe.model.value_vars}
    new_vars = [by_name[name] for name in names]
    rng = np.random.default_rng(SEED)
    probe.fill(rng, False, SEED)
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
    # --- 2. probes (pymc_penalty.model.locality.probes) ---
    probe_records(probe, terms, new_vars, point, names, rng)
