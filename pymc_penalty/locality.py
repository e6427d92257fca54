"""Row locality: datapoint i's log-likelihood term may read data through row i alone.

The penalty step clips each datapoint's log-likelihood ratio to ``[-B, B]`` and claims an L2
sensitivity of ``2B`` (``B`` under add/remove-one). That holds only if one record moves one
term. Covariates centred or scaled inside the graph (``(x - x.mean()) / x.std()``), one joint
density over all rows (an observed ``MvNormal`` over a vector of all rows), or a term that
reads another row's values break it: one record then moves every term.

The check looks at the structure, never at the data. Every array that carries records
(observed values, ``pm.Data``, ``pytensor.shared`` variables and constants with an axis of the
datapoint count) is replaced by a synthetic stand-in: covariates by random values,
observations by a draw from the model itself given the synthetic covariates and a prior draw.
One record at a time is then changed in every stand-in, at two random parameter points, and
every other row's log-likelihood term must stay exactly where it was. Nothing of the real
data is read, so the outcome reveals nothing about it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import pymc as pm
import pytensor
from pymc.model.fgraph import fgraph_from_model, model_from_fgraph
from pymc.pytensorf import compile as pm_compile
from pymc.pytensorf import join_nonshared_inputs, make_shared_replacements
from pytensor.graph.basic import Constant, Variable
from pytensor.tensor.sharedvar import TensorSharedVariable

from pymc_penalty.likelihood import per_datapoint_terms

__all__ = ["RowCouplingError", "check_row_locality"]

#: Records changed per parameter point (first, last and one in the middle).
_PROBES = 3
#: Parameter points at which the terms are compared.
_POINTS = 2
_SEED = 20261124
#: How far a float record is moved: beyond every synthetic value (those lie in (0.1, 0.9)).
_FAR = 7.25


class RowCouplingError(ValueError):
    """One record moves several datapoints' log-likelihood terms (raised as the gate's error)."""


def _record_axes(shape: Sequence[int | None], n: int) -> list[int]:
    return [ax for ax, s in enumerate(shape) if s is not None and int(s) == n]


def _value_shape(var: Variable) -> tuple[int, ...]:
    if isinstance(var, Constant):
        return tuple(np.shape(var.data))
    return tuple(np.shape(var.get_value(borrow=True)))


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


def _row(ndim: int, axis: int, j: int) -> tuple:
    index: list = [slice(None)] * ndim
    index[axis] = j
    return tuple(index)


def _flip(values: np.ndarray, up: bool) -> np.ndarray:
    """A different value of the same kind: {0, 1} swapped; floats moved far out of range.

    Moving a float record beyond every other value (up or down) changes the maximum or the
    minimum, and ranks: couplings through ``max``, ``min``, quantiles and sorts show too.
    """
    if values.dtype.kind == "b":
        return ~values
    if values.dtype.kind in "iu":
        return np.where(values == 0, 1, 0).astype(values.dtype)
    return (values + (_FAR if up else -_FAR)).astype(values.dtype)


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
        # name -> (stand-in, record axes, dtype, shape, label)
        self.sources: dict[str, tuple[TensorSharedVariable, list[int]]] = {}
        self.labels: dict[str, str] = {}
        replacements = []
        for var in list(fgraph.variables):
            if not isinstance(var, Constant | TensorSharedVariable):
                continue
            if getattr(var.type, "ndim", 0) == 0:
                continue
            shape = _value_shape(var)
            axes = _record_axes(shape, n)
            if not axes:
                continue
            name = f"synthetic_{len(self.sources)}"
            stand_in = pytensor.shared(
                np.zeros(shape, dtype=var.dtype), shape=var.type.shape, name=name
            )
            self.sources[name] = (stand_in, axes)
            self.labels[name] = (
                repr(var.name) if var.name else f"a constant array of shape {_shape_text(shape, n)}"
            )
            replacements.append((var, stand_in))
        fgraph.replace_all(replacements, import_missing=True)
        self.model = model_from_fgraph(fgraph, mutate_fgraph=True)
        self.observed = {}
        for rv in self.model.observed_RVs:
            value = self.model.rvs_to_values[rv]
            if isinstance(value, TensorSharedVariable) and value.name in self.sources:
                self.observed[value.name] = rv

    def fill(self, rng: np.random.Generator, tame: bool, seed: int) -> None:
        """Synthetic covariates, then observations drawn from the model given them."""
        for var, _ in self.sources.values():
            value = var.get_value(borrow=True)
            var.set_value(_synthetic(value.dtype, value.shape, rng, tame))
        for name, value in self._draw_observations(seed).items():
            var, _ = self.sources[name]
            var.set_value(np.asarray(value, dtype=var.dtype))

    def _draw_observations(self, seed: int) -> dict[str, np.ndarray]:
        """One joint draw of every observed variable from the synthetic model."""
        if not self.observed:
            return {}
        draws = pm.draw(list(self.observed.values()), random_seed=seed)
        return dict(zip(self.observed, draws, strict=True))

    def change_record(
        self, j: int, seed: int, up: bool = True, only: str | None = None
    ) -> dict[str, np.ndarray]:
        """Change record ``j`` in every stand-in (or in ``only``); return the old values."""
        fresh = self._draw_observations(seed) if only is None else {}
        saved = {}
        for name, (var, axes) in self.sources.items():
            if only is not None and name != only:
                continue
            old = var.get_value()
            new = old.copy()
            for ax in axes:
                index = _row(old.ndim, ax, j)
                flipped = _flip(old[index], up)
                if name in fresh and old.dtype.kind in "biu":
                    # An observation: the fresh draw's record, or a flipped one if it is equal.
                    other = np.asarray(fresh[name], dtype=old.dtype)[index]
                    flipped = np.where(other == old[index], flipped, other)
                new[index] = flipped
            var.set_value(new)
            saved[name] = old
        return saved

    def restore(self, saved: dict[str, np.ndarray]) -> None:
        for name, old in saved.items():
            self.sources[name][0].set_value(old)


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


def check_row_locality(
    model: pm.Model,
    value_vars: Sequence[Variable],
    point: dict[str, np.ndarray],
    n: int,
) -> None:
    """Refuse a model in which one record moves other datapoints' log-likelihood terms.

    Parameters
    ----------
    model : pm.Model
    value_vars : sequence of Variable
        The value variables the step samples (the raveled parameter vector).
    point : dict
        A point giving the shapes of ``value_vars`` (the initial point).
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
    names = [v.name for v in value_vars]
    by_name = {v.name: v for v in probe.model.value_vars}
    new_vars = [by_name[name] for name in names]
    shared = make_shared_replacements(point, new_vars, probe.model)
    outs, flat = join_nonshared_inputs(
        point=point, outputs=terms, inputs=new_vars, shared_inputs=shared
    )
    fn = pm_compile([flat], outs, mode="FAST_COMPILE", on_unused_input="ignore")
    x0 = np.concatenate([np.ravel(point[name]) for name in names]).astype(flat.dtype)
    rng = np.random.default_rng(_SEED)
    xs = [(x0 + rng.normal(0.0, 0.5, size=x0.shape)).astype(flat.dtype) for _ in range(_POINTS)]
    records = sorted({0, n - 1, int(rng.integers(1, n))})[:_PROBES]
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
    for x, base in zip(xs, bases, strict=True):
        for j, up in itertools.product(records, (True, False)):
            saved = probe.change_record(j, _SEED + 1 + j, up)
            try:
                moved = [np.asarray(t) for t in fn(x)]
            finally:
                probe.restore(saved)
            for k, rv in enumerate(model.observed_RVs):
                if _others_moved(base[k], moved[k], j):
                    culprit = _find_culprit(probe, fn, x, j, up, base[k], k)
                    raise RowCouplingError(
                        f"Changing one record moves other datapoints' log-likelihood terms "
                        f"of {rv.name!r} (through {culprit}): the clip bound would not bound "
                        "the sensitivity. This happens when covariates are centred or scaled "
                        "inside the model (x - x.mean(), x / x.std()), when a term reads "
                        "other rows, or when rows are summarised inside the graph. Standardise "
                        "covariates outside the model with public constants, and let "
                        "datapoint i's term read row i only."
                    )


def _others_moved(base: np.ndarray, moved: np.ndarray, j: int) -> bool:
    same = (base == moved) | (np.isnan(base) & np.isnan(moved))
    same[j] = True
    return not bool(same.all())


def _find_culprit(probe: _Probe, fn, x, j: int, up: bool, base: np.ndarray, term: int) -> str:  # noqa: ANN001
    """Name the stand-in whose record ``j`` alone moves other rows of ``term``."""
    for name in probe.sources:
        saved = probe.change_record(j, 0, up, only=name)
        try:
            moved = np.asarray(fn(x)[term])
        except Exception:  # noqa: BLE001
            continue
        finally:
            probe.restore(saved)
        if _others_moved(base, moved, j):
            return probe.labels[name]
    return "several arrays together"
