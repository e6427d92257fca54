"""Checks that a PyMC model can be sampled privately, and where its data lives.

The step refuses models in which data could reach the chain without noise: free variables
left to other step methods, discrete variables, Potentials or priors that depend on data,
``total_size`` minibatch scaling, imputed missing observations. Error messages name variables
and arguments, never data values.

"Data" means every column of the table however it enters the graph (design notes,
invariant 8): observed values, ``pm.Data`` containers, and, conservatively, any
``pytensor.shared`` variable or constant array that could carry records: one with an axis
of at least half the datapoint count (transposed, reshaped to ``(1, n)`` or sliced to
``n - 1`` rows), or with at least ``n`` elements in all. The likelihood may read data only
through per-row terms (invariant 7), checked by :mod:`pymc_penalty.model.locality`.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import pymc as pm
from pymc.variational.minibatch_rv import MinibatchRandomVariable
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.traversal import ancestors
from pytensor.tensor.shape import Shape, Shape_i
from pytensor.tensor.sharedvar import TensorSharedVariable
from pytensor.tensor.subtensor import AdvancedSubtensor, AdvancedSubtensor1

from pymc_penalty.errors import (
    InvalidArgumentError,
    ModelNotPrivateError,
    RowCouplingError,
)
from pymc_penalty.model.locality import (
    carries_records,
    check_row_locality,
    holds_records,
)

__all__ = [
    "ModelNotPrivateError",
    "check_initvals",
    "carries_records",
    "data_dependent_deterministics",
    "data_dependent_variables",
    "data_dims",
    "data_sources",
    "depends_on_data",
    "check_min_rows",
    "n_datapoints",
    "one_model_gate",
    "reads_array_constant",
    "rule_rows",
    "validate_model",
]


def _shape_of(var: Variable) -> tuple[int, ...]:
    if isinstance(var, Constant):
        return tuple(np.shape(var.data))
    if isinstance(var, TensorSharedVariable):
        return tuple(np.shape(var.get_value(borrow=True)))
    return tuple(int(s) for s in var.shape.eval())


def n_datapoints(model: pm.Model) -> int:
    """Number of datapoints: the common leading axis of all observed variables.

    Parameters
    ----------
    model : pm.Model

    Returns
    -------
    int

    Raises
    ------
    ModelNotPrivateError
        If the model has no observed variable or their leading axes disagree.
    """
    if not model.observed_RVs:
        raise ModelNotPrivateError(
            "The model has no observed variables: there is no data for PenaltyMetropolis "
            "to protect. Use pm.Metropolis for a prior-only model."
        )
    lengths = {}
    for rv in model.observed_RVs:
        shape = _shape_of(model.rvs_to_values[rv])
        lengths[rv.name] = shape[0] if shape else 1
    if len(set(lengths.values())) > 1:
        # The counts are not printed: under add/remove-one neighbours n itself is private.
        raise ModelNotPrivateError(
            f"Observed variables {sorted(lengths)} must share their leading (datapoint) axis "
            "so that datapoint i is row i of every one of them; their row counts differ."
        )
    return next(iter(lengths.values()))


def check_min_rows(min_rows: object) -> int | None:
    """``min_rows`` as an int ``>= 2``, or None.

    Raises
    ------
    InvalidArgumentError
    """
    from pymc_penalty.validation import check_integer

    return None if min_rows is None else check_integer("min_rows", min_rows, low=2)


def rule_rows(n: int, add_remove: bool, min_rows: int | None) -> int:
    """The row count the gate's shape rules compare lengths with.

    Under substitute-one ``n`` is public and the rules use it. Under add/remove-one ``n`` is
    private: a rule that compares a length with ``n`` (an axis of at least ``n / 2`` is data;
    a published length within one of ``n`` is refused; fewer than two rows skip the probes)
    answers a membership question for free (issue 28: 42 parameters were accepted at
    ``n = 40`` and refused at ``n = 41``). So under add/remove-one ``min_rows``, a public
    lower bound on ``n``, is required, and the rules use it instead: every decision is a
    function of public inputs only. A table with fewer rows than the bound is outside the
    stated domain and refused (the message names ``min_rows``, never ``n``).

    Parameters
    ----------
    n : int
        The datapoint count.
    add_remove : bool
        Whether the guarantee is for add/remove-one neighbours.
    min_rows : int or None
        Public lower bound on ``n`` (used under add/remove-one only).

    Returns
    -------
    int

    Raises
    ------
    InvalidArgumentError
        Under add/remove-one without ``min_rows``.
    ModelNotPrivateError
        Under add/remove-one, when the table has fewer rows than ``min_rows``.
    """
    if not add_remove:
        return n
    if min_rows is None:
        # Raised for every n alike, before anything reads the data or spends.
        raise InvalidArgumentError(
            "Under add/remove-one neighbours `min_rows` is required: a public lower bound on "
            "the number of rows (an integer >= 2), fixed without looking at the table "
            "(pymc_penalty.sample's `min_rows`, or a step's PrivacyPolicy(min_rows=...)). "
            "Without it the model gate's shape rules would compare lengths with the private "
            "number of rows, and whether a model is refused could tell whether one record is "
            "in the table (a refusal spends nothing)."
        )
    if n < min_rows:
        raise ModelNotPrivateError(
            f"The table has fewer rows than `min_rows` = {min_rows}, the public lower bound "
            "on the number of rows the guarantee is stated for. Lower `min_rows` (it must be "
            "fixed without looking at the table)."
        )
    return int(min_rows)


def data_sources(model: pm.Model) -> list[Variable]:
    """Graph variables that are data by declaration: observed values and every ``pm.Data``
    container, whatever its shape (design notes, invariant 8: a scalar ``pm.Data`` may hold
    a statistic of the table; pass public settings as plain numbers)."""
    sources = [model.rvs_to_values[rv] for rv in model.observed_RVs]
    sources += list(model.data_vars)
    return sources


def _ancestors(outputs: Sequence[Variable], through_shapes: bool) -> set[Variable]:
    """Ancestors of ``outputs``; without ``through_shapes``, what is reached only through an
    array's shape (``size=y.shape[0]``) is left out."""
    seen: set[Variable] = set()
    stack = list(outputs)
    while stack:
        var = stack.pop()
        if var in seen:
            continue
        seen.add(var)
        node = var.owner
        if node is not None and (through_shapes or not isinstance(node.op, Shape | Shape_i)):
            stack.extend(node.inputs)
    return seen


def depends_on_data(
    outputs: Sequence[Variable],
    sources: Iterable[Variable],
    n: int,
    *,
    shapes_are_public: bool = False,
) -> bool:
    """Whether any of ``outputs`` depends on data.

    Besides the variables in ``sources``, any constant or ``pytensor.shared`` array that
    could hold records (:func:`pymc_penalty.model.locality.holds_records`) counts as data, whatever
    its name or shape. With ``shapes_are_public`` (the substitute-one relation, under which
    the datapoint count is public) a dependence through an array's shape alone does not
    count.
    """
    source_set = set(sources)
    return any(
        var in source_set or holds_records(var, n)
        for var in _ancestors(list(outputs), through_shapes=not shapes_are_public)
    )


def reads_array_constant(outputs: Sequence[Variable]) -> bool:
    """Whether ``outputs`` read a constant array of two or more distinct values (not through
    a shape only).

    Whatever its length: a slice of a record array of any length is caught (issue 28: three
    Deterministics ``a * 0 + y[100 * i : 100 * (i + 1)]``, each shorter than ``n / 2``,
    published all 300 records). A scalar is not caught: a number computed from the table
    cannot be told from a public one, which is why the trust boundary (docs/threat-model.md)
    puts records that reach the graph outside the declared containers outside the guarantee.
    """
    for var in _ancestors(list(outputs), through_shapes=False):
        if isinstance(var, Constant) and getattr(var.type, "ndim", 0) >= 1:
            flat = np.asarray(var.data).reshape(-1)
            if flat.size >= 2 and flat.dtype.kind in "biufc" and not bool(np.all(flat == flat[0])):
                return True
    return False


def data_dependent_deterministics(model: pm.Model, n: int | None = None) -> list[str]:
    """Names of Deterministics that are never released: those whose value depends on data
    (exact), and those that read a constant array (:func:`reads_array_constant`): a
    Deterministic is published only if it reads free variables, scalars and filled arrays,
    so no slicing of an array written into the graph can publish it. Compute quantities of
    public arrays from the published posterior instead."""
    n = n_datapoints(model) if n is None else n
    sources = data_sources(model)
    return [
        d.name
        for d in model.deterministics
        if depends_on_data([d], sources, n) or reads_array_constant([d])
    ]


def data_dependent_variables(model: pm.Model, n: int | None = None) -> list[str]:
    """Names of every model variable whose draws would carry data.

    Deterministics that read data, and observed variables whose generative graph reads
    covariates (their posterior or prior predictive draws are functions of the covariates,
    e.g. ``y_rep_i ~ Bernoulli(logit(x_i beta))``).
    """
    n = n_datapoints(model) if n is None else n
    sources = data_sources(model)
    names = data_dependent_deterministics(model, n)
    names += [rv.name for rv in model.observed_RVs if depends_on_data([rv], sources, n)]
    return names


def data_dims(model: pm.Model, n: int | None = None, *, bounded: bool = False) -> list[str]:
    """Dimensions whose coordinates label records (record ids are data too).

    The dims of observed variables and ``pm.Data`` containers, and any model coordinate as
    long as the data (``n``); with ``bounded`` (``n`` is then a public lower bound on the
    count), any coordinate at least ``n - 1`` long.
    """
    n = n_datapoints(model) if n is None else n
    dims: set[str] = set()
    named = model.named_vars_to_dims
    for var in [*model.observed_RVs, *model.data_vars]:
        dims.update(d for d in named.get(var.name, ()) if d is not None)
    for name, values in model.coords.items():
        if values is not None and (len(values) >= n - 1 if bounded else len(values) == n):
            dims.add(name)
    dims.update(_data_indexed_dims(model, n))
    return sorted(dims)


def _data_indexed_dims(model: pm.Model, n: int) -> set[str]:
    """Dims of free variables read through a data index (``u[patient_idx]``): their
    coordinates name the groups found in the data (patient ids, say), which are records too."""
    sources = data_sources(model)
    free = set(model.free_RVs)
    named = model.named_vars_to_dims
    dims: set[str] = set()
    for var in ancestors(model.observed_RVs):
        node = var.owner
        if node is None or not isinstance(node.op, AdvancedSubtensor | AdvancedSubtensor1):
            continue
        indices = [i for i in node.inputs[1:] if hasattr(i.type, "ndim")]
        if not depends_on_data(indices, sources, n):
            continue
        for rv in ancestors([node.inputs[0]]):
            if rv in free:
                dims.update(d for d in named.get(rv.name, ()) if d is not None)
    return dims


def _refuse_summaries_in_pm_data(model: pm.Model, n: int) -> None:
    """Refuse ``pm.Data`` containers too small to hold one row per datapoint that the
    likelihood reads.

    Every ``pm.Data`` container is data (invariant 8): a scalar or short one may hold a
    statistic of the table (``pm.Data("xbar", x.mean())``, mixture weights counted from the
    data), and every datapoint's term that reads it then moves with every record, as with
    covariates centred inside the model. The row-locality probes cannot see it (its value is
    not a record), so it is refused by declaration: pass public constants as plain numbers.
    """
    if n < 2:
        return
    # The generative graph, and the log density (a CustomDist's logp may close over one).
    terms = model.logp(vars=model.observed_RVs, sum=False)
    read = _ancestors([*model.observed_RVs, *terms], through_shapes=False)
    small = [d.name for d in model.data_vars if d in read and not carries_records(_shape_of(d), n)]
    if small:
        raise ModelNotPrivateError(
            f"The likelihood reads pm.Data containers {small} that do not hold one row per "
            "datapoint. A pm.Data container is data: if it holds a statistic of the table (a "
            "mean, a count, weights), every datapoint's term moves with every record and the "
            "clip bound would not bound the sensitivity. Pass public constants (group-level "
            "covariates included) as plain numbers or NumPy arrays, and per-datapoint "
            "covariates as pm.Data with one row per datapoint."
        )


def check_initvals(model: pm.Model, initvals: object, n: int | None = None) -> None:
    """Refuse ``pm.sample`` initial values that could carry data (before anything is spent).

    ``initvals`` (a mapping, or one per chain) reaches the chain without noise: a symbolic
    value that reads data (``{"mu": pt.mean(y_data)}``) would start the chain at an exact
    statistic, and an array that could hold records (invariant 8) at the records themselves.
    A scalar computed with NumPy from the data cannot be told from a public one; that stays
    the curator's responsibility.

    Raises
    ------
    ModelNotPrivateError
        Naming the variable, never a value.
    """
    if initvals is None:
        return
    n = n_datapoints(model) if n is None else n  # or the rules' count (rule_rows)
    sources = data_sources(model)
    per_chain = [initvals] if isinstance(initvals, dict) else list(initvals)
    for chain_values in per_chain:
        for name, value in dict(chain_values or {}).items():
            if isinstance(value, Variable):
                leaky = depends_on_data([value], sources, n)
            else:
                array = np.asarray(value) if value is not None else np.zeros(())
                flat = array.reshape(-1)
                leaky = (
                    array.dtype.kind in "biuf"
                    and carries_records(array.shape, n)
                    and not bool(np.all(flat == flat[0]))
                )
            if leaky:
                raise ModelNotPrivateError(
                    f"The initial value given for {str(name)!r} (initvals) could carry data (an "
                    "expression of pm.Data or observed values, or an array as long as the "
                    "data); the chain would start at it without noise. Give a public initial "
                    "value, or use warm_start for a private starting point."
                )


def _as_long(bounded: bool) -> str:
    """How a near-n refusal describes the axis (never printing n)."""
    return "at least `min_rows` - 1 long (it could be" if bounded else "as long as the data (it is"


def _near_n(shape: Sequence[int], n: int, bounded: bool = False) -> bool:
    """Whether an axis could be the datapoint count (``n``, or ``n +- 1`` from 20 rows on).

    With ``bounded`` (``n`` is then the public lower bound ``min_rows``): whether an axis is
    at least ``n - 1``, that is, could be the count or one off it for some table allowed by
    the bound.
    """
    if bounded:
        return any(int(s) >= n - 1 for s in shape)
    return any(int(s) == n or (n >= 20 and abs(int(s) - n) <= 1) for s in shape)


def _refuse_published_axes_near_n(
    model: pm.Model,
    value_vars: Sequence[Variable],
    sources: Sequence[Variable],
    n: int,
    point: dict[str, np.ndarray],
    bounded: bool = False,
) -> None:
    """Under add/remove-one, refuse published outputs that have an axis as long as the data.

    Stripping (:func:`pymc_penalty.results.report.strip_data`) drops every variable with an axis of
    length ``n`` where ``n`` is private; if a variable of a *fixed* length that happens to
    equal ``n`` reached it, whether it is published would tell ``n`` from ``n + 1``. So the
    data-independent Deterministics and the ``proposal`` statistic (the raveled parameter
    vector) must not have such an axis. Data-dependent Deterministics are dropped whatever
    their shape and are not refused.
    """
    near = [
        d.name
        for d in model.deterministics
        if not depends_on_data([d], sources, n)
        and not reads_array_constant([d])  # never published: its shape tells nothing
        and _near_n(_shape_of(d), n, bounded)
    ]
    if near:
        raise ModelNotPrivateError(
            f"Deterministics {near} have an axis {_as_long(bounded)} the row count). Under "
            "add/remove-one neighbours the number of datapoints is private, and their shape "
            "would publish it. Use neighbours='substitute' (the count is then public), or "
            "remove them."
        )
    size = sum(int(np.size(point[v.name])) for v in value_vars)
    if _near_n((size,), n, bounded):
        raise ModelNotPrivateError(
            "The step's parameter vector (all free variables raveled, published per step as "
            f"the `proposal` statistic) is {_as_long(bounded)} the row count). Under "
            "add/remove-one neighbours the number of datapoints is private, and that length "
            "would publish it. Use neighbours='substitute' (the count is then public), or "
            "change the parameters."
        )


# Within pymc_penalty.sample, the models the gate has passed (one_model_gate); None outside.
_PASSED: contextvars.ContextVar[dict[tuple, tuple[pm.Model, int]] | None] = contextvars.ContextVar(
    "pymc_penalty_passed_models", default=None
)


@contextlib.contextmanager
def one_model_gate() -> Iterator[None]:
    """Run :func:`validate_model` once per model and data within this block.

    ``pymc_penalty.sample`` gates the same model three times (the row screen, the warm
    start, the step); the row-locality probes dominate a run's setup at large ``n``. Inside
    the block a model that has passed with the same settings, the same graph and the same
    data (every data source's values, hashed: a ``pm.set_data`` in between runs the gate
    again) is not checked again. Refusals are never remembered, and nothing outlives the
    outermost block (a budgeted step built inside ``pymc_penalty.sample`` shares its
    block).
    """
    if _PASSED.get() is not None:  # inside another block: its decisions hold here too
        yield
        return
    token = _PASSED.set({})
    try:
        yield
    finally:
        _PASSED.reset(token)


def _gate_key(model: pm.Model, value_vars: Sequence[Variable], settings: tuple) -> tuple:
    """What a gate decision depends on: the model's graph (its variables' identities), the
    step's variables, the settings, and a hash of every data source's values and shape."""
    digest = hashlib.blake2b(digest_size=16)
    # An observed value may be an expression (observed=2 * x): its constant and shared inputs.
    leaves = [v for v in ancestors(data_sources(model)) if v.owner is None]
    for source in leaves:
        if isinstance(source, Constant):
            value = source.data
        elif hasattr(source, "get_value"):
            value = source.get_value(borrow=True)
        else:  # a root variable: no value of its own to hash
            continue
        array = np.ascontiguousarray(value)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.tobytes())
    graph = tuple(id(v) for v in model.named_vars.values())
    names = tuple(v.name for v in value_vars)
    return (id(model), graph, names, settings, digest.hexdigest())


def validate_model(
    model: pm.Model,
    value_vars: Sequence[Variable],
    *,
    row_locality: bool = True,
    point: dict[str, np.ndarray] | None = None,
    add_remove: bool = False,
    min_rows: int | None = None,
) -> int:
    """Refuse models that cannot be sampled privately; return the datapoint count.

    Parameters
    ----------
    model : pm.Model
    value_vars : sequence of Variable
        The value variables assigned to the step.
    row_locality : bool, default True
        Check that each datapoint's log-likelihood term reads its own row only
        (:func:`pymc_penalty.model.locality.check_row_locality`), as every step that clips
        per-datapoint ratios needs. The exponential-family step computes its statistic one
        row at a time itself and skips it.
    point : dict, optional
        Initial point (shapes of ``value_vars``) for the row-locality check.
    add_remove : bool, default False
        Whether the guarantee is for add/remove-one neighbours, under which the datapoint
        count is private: free variables with an axis of the data's length are refused.
    min_rows : int, optional
        Under add/remove-one, where it is required, a public lower bound on the number of
        rows: every shape rule compares lengths with it instead of the private count
        (:func:`rule_rows`), so no decision depends on ``n``.

    Returns
    -------
    int
        The number of datapoints.

    Raises
    ------
    InvalidArgumentError
        Under add/remove-one without ``min_rows`` (:func:`rule_rows`).
    ModelNotPrivateError
        With a message naming the offending variable or feature.
    """
    passed = _PASSED.get()
    if passed is None or point is not None:
        return _validate_model(model, value_vars, row_locality, point, add_remove, min_rows)
    key = _gate_key(model, value_vars, (row_locality, add_remove, min_rows))
    if key not in passed:  # the model is kept with its key, so its id is not reused
        n = _validate_model(model, value_vars, row_locality, None, add_remove, min_rows)
        passed[key] = (model, n)
    return passed[key][1]


def _validate_model(
    model: pm.Model,
    value_vars: Sequence[Variable],
    row_locality: bool,
    point: dict[str, np.ndarray] | None,
    add_remove: bool,
    min_rows: int | None,
) -> int:
    """:func:`validate_model`, each time."""
    assigned = {v.name for v in value_vars}
    for var in value_vars:
        if var.dtype in pm.discrete_types:
            raise ModelNotPrivateError(
                f"Free variable {var.name!r} is discrete ({var.dtype}); PenaltyMetropolis "
                "samples continuous variables only. Marginalise it out of the model."
            )
    missing = [model.rvs_to_values[rv].name for rv in model.free_RVs]
    missing = [name for name in missing if name not in assigned]
    if missing:
        raise ModelNotPrivateError(
            f"Free variables {missing} are not assigned to PenaltyMetropolis. Any other step "
            "method would evaluate the likelihood without noise; assign all free variables "
            "to one PenaltyMetropolis step (the default when `vars` is omitted)."
        )
    for rv in model.observed_RVs:
        if rv.owner is not None and isinstance(rv.owner.op, MinibatchRandomVariable):
            raise ModelNotPrivateError(
                f"Variable {rv.name!r} uses `total_size` (minibatch scaling), which the "
                "privacy accounting does not cover. Remove `total_size`."
            )
    observed_names = {rv.name for rv in model.observed_RVs}
    for rv in model.free_RVs:
        if rv.name.endswith("_unobserved"):
            base = rv.name[: -len("_unobserved")]
            if f"{base}_observed" in observed_names:
                raise ModelNotPrivateError(
                    f"Observed variable {base!r} has missing values that PyMC imputes as the "
                    f"free variable {rv.name!r}; imputed values are exact functions of the "
                    "data. Drop or impute the missing rows before sampling."
                )
    n_rows = n_datapoints(model)
    n = rule_rows(n_rows, add_remove, min_rows)  # what the shape rules compare lengths with
    bounded = add_remove and min_rows is not None
    for rv in model.observed_RVs:
        shape = _shape_of(model.rvs_to_values[rv])
        if len(shape) >= 2 and max(shape[1:]) > shape[0]:
            # One record would sit in every "row": each clipped term would move at once.
            raise ModelNotPrivateError(
                f"Observed variable {rv.name!r} has a trailing axis longer than its leading "
                "(datapoint) axis, as transposed data do. Datapoint i must be row i: "
                "transpose the data so that records run along the first axis."
            )
    sources = data_sources(model)
    for pot in model.potentials:
        if depends_on_data([pot], sources, n):
            raise ModelNotPrivateError(
                f"Potential {pot.name!r} depends on data; its value would enter the "
                "acceptance test without noise. Express it as an observed likelihood term."
            )
    # The generative graph, not the logp graph: PyMC's logp rewrites constant-fold data.
    for rv in model.free_RVs:
        if depends_on_data([rv], sources, n, shapes_are_public=not add_remove):
            raise ModelNotPrivateError(
                f"The prior of {rv.name!r} depends on data (an observed value, pm.Data, or an "
                "array that could hold records); its value would enter the acceptance test "
                "without noise. Use data-independent priors with scalar or small public "
                "parameters, given as plain numbers rather than pm.Data."
            )
    _refuse_summaries_in_pm_data(model, n)
    for rv, initval in model.rvs_to_initial_values.items():
        if isinstance(initval, Variable) and depends_on_data([initval], sources, n):
            raise ModelNotPrivateError(
                f"The initial value of {rv.name!r} depends on data (for instance "
                "initval=y.mean()); the chain would start at an exact statistic of the data. "
                "Give a public initial value, or use pp.sample(warm_start=...) for a private "
                "starting point."
            )
    if add_remove:
        # Under add/remove-one neighbours the datapoint count is private: a free variable
        # with one entry per datapoint would publish it in the posterior's shape.
        per_row = [rv.name for rv in model.free_RVs if _near_n(_shape_of(rv), n, bounded)]
        if per_row:
            raise ModelNotPrivateError(
                f"Free variables {per_row} have an axis {_as_long(bounded)} the row count). Under "
                "add/remove-"
                "one neighbours the number of datapoints is private, and their shape would "
                "publish it. Use neighbours='substitute' (the count is then public), or model "
                "per-datapoint effects by groups of public size."
            )
    if add_remove:
        point = point or model.initial_point()
        _refuse_published_axes_near_n(model, value_vars, sources, n, point, bounded)
    if row_locality:
        try:
            check_row_locality(model, value_vars, point or model.initial_point(), n_rows, rule_n=n)
        except RowCouplingError as exc:
            raise ModelNotPrivateError(str(exc)) from None
    return n_rows
