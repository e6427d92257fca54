"""Checks that a PyMC model can be sampled privately, and where its data lives.

The step refuses models in which data could reach the chain without noise: free variables
left to other step methods, discrete variables, Potentials or priors that depend on data,
``total_size`` minibatch scaling, imputed missing observations. Error messages name variables
and arguments, never data values.

"Data" means every column of the table however it enters the graph: observed values,
``pm.Data`` containers, and (conservatively) any constant array whose leading axis has the
datapoint count.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pymc as pm
from pymc.variational.minibatch_rv import MinibatchRandomVariable
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.traversal import ancestors
from pytensor.tensor.sharedvar import TensorSharedVariable

__all__ = [
    "ModelNotPrivateError",
    "data_dependent_deterministics",
    "data_sources",
    "depends_on_data",
    "n_datapoints",
    "validate_model",
]


class ModelNotPrivateError(ValueError):
    """The model has a feature through which data would reach the chain without noise."""


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
        described = ", ".join(f"{name!r} has {n}" for name, n in lengths.items())
        raise ModelNotPrivateError(
            "Observed variables must share their leading (datapoint) axis so that datapoint i "
            f"is row i of every one of them; {described} rows."
        )
    return next(iter(lengths.values()))


def data_sources(model: pm.Model) -> list[Variable]:
    """Graph variables that hold data: observed values and ``pm.Data`` containers."""
    sources = [model.rvs_to_values[rv] for rv in model.observed_RVs]
    sources += list(model.data_vars)
    return sources


def depends_on_data(outputs: Sequence[Variable], sources: Iterable[Variable], n: int) -> bool:
    """Whether any of ``outputs`` depends on data.

    Conservative: besides the variables in ``sources``, any constant with at least one axis
    whose leading length equals the datapoint count ``n`` (for ``n > 1``) counts as data.
    """
    source_set = set(sources)
    for var in ancestors(list(outputs)):
        if var in source_set:
            return True
        if isinstance(var, Constant) and n > 1:
            shape = np.shape(var.data)
            if len(shape) >= 1 and shape[0] == n:
                return True
    return False


def data_dependent_deterministics(model: pm.Model, n: int | None = None) -> list[str]:
    """Names of Deterministics whose value depends on data (exact, so never to be released)."""
    n = n_datapoints(model) if n is None else n
    sources = data_sources(model)
    return [d.name for d in model.deterministics if depends_on_data([d], sources, n)]


def validate_model(model: pm.Model, value_vars: Sequence[Variable]) -> int:
    """Refuse models that cannot be sampled privately; return the datapoint count.

    Parameters
    ----------
    model : pm.Model
    value_vars : sequence of Variable
        The value variables assigned to the step.

    Returns
    -------
    int
        The number of datapoints.

    Raises
    ------
    ModelNotPrivateError
        With a message naming the offending variable or feature.
    """
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
    n = n_datapoints(model)
    sources = data_sources(model)
    for pot in model.potentials:
        if depends_on_data([pot], sources, n):
            raise ModelNotPrivateError(
                f"Potential {pot.name!r} depends on data; its value would enter the "
                "acceptance test without noise. Express it as an observed likelihood term."
            )
    # The generative graph, not the logp graph: PyMC's logp rewrites constant-fold data.
    if depends_on_data(model.free_RVs, sources, n):
        raise ModelNotPrivateError(
            "A prior (the distribution of a free variable) depends on data; its value would "
            "enter the acceptance test without noise. Use data-independent priors."
        )
    return n
