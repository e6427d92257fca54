"""Noise-aware posterior draws from a Taylor control-variate chain, at no privacy cost.

The Taylor path (``docs/algorithm.md``, "Taylor control variates") releases the sums ``G``
and ``H`` of the rows' Taylor terms once, with Gaussian noise of sds ``sd_G`` and ``sd_H``,
in whitened unconstrained coordinates ``x = t + L w`` (``x`` is PyMC's raveled vector of
``model.value_vars``; ``t`` and ``L`` are public). The chain then targets the posterior
tilted by that one-shot noise. :func:`noise_aware_posterior` maps the chain's draws to draws
that integrate the known noise out (:func:`pymc_penalty.privacy.taylor.noise_aware_draws`,
Gaussian regime), and recomputes the model's free variables and Deterministics from them.

Every input is public (the released draws, ``t``, ``L`` and the release's noise law), and
the model is evaluated only on its data-free part: post-processing, no privacy budget.
"""

from __future__ import annotations

from collections.abc import Sequence

import arviz as az
import numpy as np
import pymc as pm
import pytensor.tensor as pt
import xarray as xr
from pymc.pytensorf import compile as pm_compile
from pymc.pytensorf import join_nonshared_inputs
from pytensor.graph.replace import graph_replace, vectorize_graph
from scipy.linalg import solve_triangular

from pymc_penalty.model.checks import (
    data_dependent_deterministics,
    data_sources,
    depends_on_data,
    n_datapoints,
)
from pymc_penalty.privacy.taylor import noise_aware_draws
from pymc_penalty.validation import check_real

__all__ = ["NOISE_AWARE_ATTR", "noise_aware_posterior"]

#: Key of ``idata.posterior.attrs`` set on a noise-aware posterior. Its value is ``1`` (an
#: integer, as the package's other flags: netCDF has no boolean attributes).
NOISE_AWARE_ATTR = "dp_noise_aware"


def _free_rv_names(model: pm.Model) -> list[str]:
    return [rv.name for rv in model.free_RVs]


def _check_continuous(model: pm.Model) -> None:
    discrete = [rv.name for rv in model.free_RVs if rv.type.dtype.startswith(("int", "uint"))]
    if discrete:
        raise ValueError(
            f"`model` has discrete free variables {discrete}: the Taylor path and its "
            "noise-aware draws live in a continuous unconstrained space."
        )


def _value_sizes(model: pm.Model) -> tuple[dict[str, np.ndarray], list[int]]:
    point = model.initial_point()
    sizes = [int(np.size(point[v.name])) for v in model.value_vars]
    return point, sizes


def _data_dependent(model: pm.Model, names: Sequence[str], graphs: Sequence) -> list[str]:
    """Names whose value (or whose map to or from ``x``) reads data."""
    if not model.observed_RVs:
        return []
    n = n_datapoints(model)
    sources = data_sources(model)
    dets = set(data_dependent_deterministics(model, n))
    return [
        name
        for name, graph in zip(names, graphs, strict=True)
        if name in dets or depends_on_data(list(graph), sources, n)
    ]


def _forward_fn(model: pm.Model):
    """Compiled map: batched constrained draws of the free RVs -> their value variables.

    Each free RV's transform is applied forward with its parameters' RVs replaced by their
    constrained draws (an Interval whose bounds are RVs reads those RVs' draws). Returns the
    function (one ``(m, *shape)`` array per free RV in, one per value variable out, in
    ``model.value_vars`` order) and each free RV's forward graph (for the data check).
    """
    free = list(model.free_RVs)
    holders = {rv: rv.type(name=f"{rv.name}_draw") for rv in free}
    forward = []
    for rv in free:
        transform = model.rvs_to_transforms.get(rv)
        value = holders[rv]
        forward.append(value if transform is None else transform.forward(value, *rv.owner.inputs))
    forward = graph_replace(forward, replace=holders, strict=False)
    batched_in = [
        pt.tensor(dtype=rv.type.dtype, shape=(None, *rv.type.shape), name=f"{rv.name}_draws")
        for rv in free
    ]
    batched_out = vectorize_graph(
        forward, replace=dict(zip([holders[rv] for rv in free], batched_in, strict=True))
    )
    fn = pm_compile(batched_in, batched_out, on_unused_input="ignore")
    return fn, forward


def _backward_fn(model: pm.Model, names: Sequence[str], point: dict[str, np.ndarray]):
    """Compiled map: batched raveled value vectors ``(m, d)`` -> the named variables."""
    named = {rv.name: rv for rv in model.free_RVs}
    named.update({det.name: det for det in model.deterministics})
    outputs = [named[name] for name in names]
    replaced = model.replace_rvs_by_values(outputs)
    outs, flat = join_nonshared_inputs(point, replaced, model.value_vars)
    batch = pt.matrix("x_draws", dtype=flat.dtype)
    batched = vectorize_graph(outs, replace={flat: batch})
    fn = pm_compile([batch], batched, on_unused_input="ignore")
    return fn, outputs, replaced, np.dtype(flat.dtype)


def _check_factor(t: np.ndarray, L: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(t, dtype=float)
    L = np.asarray(L, dtype=float)
    if t.shape != (d,):
        raise ValueError(
            f"`t` must have shape ({d},), the size of the model's raveled unconstrained "
            f"parameter vector; got shape {t.shape}."
        )
    if not np.all(np.isfinite(t)):
        raise ValueError("`t` must be finite.")
    if L.shape != (d, d):
        raise ValueError(
            f"`L` must have shape ({d}, {d}), for the model's {d} unconstrained coordinates; "
            f"got shape {L.shape}."
        )
    if not np.all(np.isfinite(L)):
        raise ValueError("`L` must be finite.")
    if np.any(np.triu(L, k=1) != 0.0):
        raise ValueError(
            "`L` must be lower-triangular (the public Cholesky factor of the whitening: "
            "x = t + L w); it has non-zero entries above the diagonal."
        )
    diag = np.diag(L)
    if np.any(diag <= 0.0):
        raise ValueError(
            "`L` must be positive definite (a Cholesky factor with a positive diagonal); its "
            f"smallest diagonal entry is {diag.min():g}."
        )
    return t, L


def _output_coords(
    idata: az.InferenceData, model: pm.Model, name: str, values: np.ndarray
) -> tuple[list[str], dict[str, np.ndarray]]:
    """Dims and coords of a variable's output: the input posterior's, else the model's."""
    post = idata.posterior
    if name in post:
        da = post[name]
        return list(da.dims), {dim: da[dim].values for dim in da.dims if dim in da.coords}
    dims = ["chain", "draw"]
    model_dims = model.named_vars_to_dims.get(name)
    extra = values.ndim - 2
    if model_dims is not None and len(model_dims) == extra:
        dims += list(model_dims)
    else:
        dims += [f"{name}_dim_{i}" for i in range(extra)]
    coords = {"chain": post["chain"].values, "draw": post["draw"].values}
    for dim in dims[2:]:
        if dim in post.coords:
            coords[dim] = post[dim].values
        elif dim in model.coords and model.coords[dim] is not None:
            coords[dim] = np.asarray(model.coords[dim])
    return dims, coords


def noise_aware_posterior(
    idata: az.InferenceData,
    model: pm.Model,
    *,
    t: np.ndarray,
    L: np.ndarray,
    sd_G: float,
    sd_H: float,
    rng: np.random.Generator,
    var_names: list[str] | None = None,
    index: np.ndarray | None = None,
    allow_data: bool = False,
) -> az.InferenceData:
    """Integrate the Taylor release's one-shot noise out of a chain's posterior draws.

    The draws of every free variable are mapped to PyMC's raveled unconstrained vector ``x``
    (each free variable's transform forward, in ``model.value_vars`` order), whitened as
    ``w = L^{-1} (x - t)`` with all chains pooled, passed through
    :func:`pymc_penalty.privacy.taylor.noise_aware_draws` (which estimates the tilted
    posterior's mean and covariance from all draws and gives each draw its own noise pair
    from the release's law), mapped back as ``x = t + L w``, and the requested variables are
    recomputed from ``x`` with one compiled function of the value variables.

    Post-processing of public values (the released draws, ``t``, ``L``, the noise law): no
    privacy cost. Only the model's data-free part is evaluated.

    Parameters
    ----------
    idata : InferenceData
        The chain's result; ``idata.posterior`` must hold every free variable (constrained
        space, as ``pm.sample`` stores them). Not modified.
    model : pm.Model
        The model the chain was sampled from.
    t : ndarray, shape (d,)
        The public reference point of the release, in raveled unconstrained coordinates.
    L : ndarray, shape (d, d), or (k, k) with ``index``
        The public whitening factor of the release: lower-triangular, positive diagonal.
    sd_G, sd_H : float
        The release's noise sds (:class:`pymc_penalty.privacy.taylor.TaylorRelease`);
        ``sd_H = 0`` for a first-order release. With both 0 the map is the identity (up to
        rounding).
    rng : numpy.random.Generator
        Source of the post-processing noise (need not be private).
    var_names : list of str, optional
        Free variables and Deterministics to hold in the output posterior (default: every
        variable of ``idata.posterior``). A variable of the input posterior not listed is
        left out: its draws would be those of the tilted posterior.
    index : ndarray of int, optional
        The coordinates of ``x`` the released model lives on (``k`` of them), whitened there
        by ``L``: ``u = L^-1 (x - t)[index]``; the rest of ``x`` follows through the draws'
        joint covariance. None: every coordinate.
    allow_data : bool, default False
        Recompute data-dependent Deterministics too (reading the data without noise: only
        for a result that keeps its data and is not private, ``pp.sample(keep_data=True)``).

    Returns
    -------
    InferenceData
        A new object: its ``posterior`` holds the noise-aware draws of ``var_names`` with the
        input's chain and draw coordinates, dims and names, its attrs plus
        ``dp_noise_aware = 1`` (:data:`NOISE_AWARE_ATTR`; an integer so the result still
        writes to netCDF); every other group and ``idata.attrs`` are copies of the input's.

    Raises
    ------
    ValueError
        If ``t`` or ``L`` does not match the model's ``d`` unconstrained coordinates, ``L`` is
        not lower-triangular with a positive diagonal, ``sd_G`` or ``sd_H`` is negative,
        ``idata`` has fewer than ``d + 2`` draws in all (chains pooled), lacks a free
        variable or has non-finite or degenerate draws, ``var_names`` names something that
        is not a free variable or Deterministic or that depends on data, or the model has
        discrete free variables.
    """
    if not isinstance(idata, az.InferenceData) or "posterior" not in idata.groups():
        raise ValueError("`idata` must be an InferenceData with a posterior group.")
    if not isinstance(model, pm.Model):
        raise ValueError(f"`model` must be a pm.Model; got {type(model).__name__}.")
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"`rng` must be a numpy.random.Generator; got {type(rng).__name__}.")
    sd_G = check_real("sd_G", sd_G, low=0.0)
    sd_H = check_real("sd_H", sd_H, low=0.0)
    _check_continuous(model)

    post = idata.posterior
    free_names = _free_rv_names(model)
    missing = [name for name in free_names if name not in post]
    if missing:
        raise ValueError(
            f"`idata.posterior` lacks the free variables {missing} of `model`: every free "
            "variable's draws are needed to map the draws to the unconstrained space."
        )
    point, sizes = _value_sizes(model)
    d = int(sum(sizes))
    if index is None:
        t, L = _check_factor(t, L, d)
        embed = None
    else:  # the released model lives on the coordinates `index`, whitened by L there
        index = np.asarray(index, dtype=int)
        if index.ndim != 1 or index.size == 0 or np.any((index < 0) | (index >= d)):
            raise ValueError(f"`index` must list coordinates in [0, {d}); got {index!r}.")
        t = np.asarray(t, dtype=float)
        if t.shape != (d,):
            raise ValueError(f"`t` must have shape ({d},); got shape {t.shape}.")
        _, L = _check_factor(t[index], L, index.size)
        select = np.zeros((index.size, d))
        select[np.arange(index.size), index] = 1.0
        embed = solve_triangular(L, select, lower=True)  # u = L^-1 (x - t)[index]
        L = np.eye(d)  # the draws are kept in x - t
    n_chains = int(post.sizes.get("chain", 0))
    n_draws = int(post.sizes.get("draw", 0))
    total = n_chains * n_draws
    if total < d + 2:
        raise ValueError(
            f"`idata` has {total} draws in all (chains pooled); the tilted posterior's "
            f"covariance in the model's {d} unconstrained coordinates needs at least {d + 2}."
        )

    if var_names is None:
        var_names = list(post.data_vars)
    else:
        var_names = list(var_names)
    known = set(free_names) | {det.name for det in model.deterministics}
    unknown = [name for name in var_names if name not in known]
    if unknown:
        raise ValueError(
            f"`var_names` entries {unknown} are not free variables or Deterministics of "
            "`model` (the default is every variable of `idata.posterior`: pass `var_names` "
            "to leave others out)."
        )

    forward, forward_graphs = _forward_fn(model)
    backward, outputs, replaced, x_dtype = _backward_fn(model, var_names, point)
    leaky = _data_dependent(
        model,
        var_names,
        [(out, rep) for out, rep in zip(outputs, replaced, strict=True)],
    )
    leaky_maps = _data_dependent(model, free_names, [(g,) for g in forward_graphs])
    if (leaky or leaky_maps) and not allow_data:
        raise ValueError(
            f"`var_names` entries {leaky} (or the transforms of {leaky_maps}) depend on data: "
            "recomputing them at the noise-aware draws would use the data without noise. "
            "Pass `var_names` with data-free quantities only."
        )

    # 1. Constrained draws -> raveled unconstrained x, chains pooled.
    shape_lead = (n_chains, n_draws)
    inputs = []
    for rv in model.free_RVs:
        da = post[rv.name].transpose("chain", "draw", ...)
        arr = np.asarray(da.values)
        inputs.append(arr.reshape(total, *arr.shape[2:]).astype(rv.type.dtype, copy=False))
    values = forward(*inputs)
    pieces = []
    for value_var, size, value in zip(model.value_vars, sizes, values, strict=True):
        value = np.asarray(value, dtype=float).reshape(total, -1)
        if value.shape[1] != size:
            raise ValueError(
                f"`idata.posterior` draws map to {value.shape[1]} coordinates of "
                f"{value_var.name!r}; `model` has {size}: pass the model the chain was "
                "sampled from."
            )
        pieces.append(value)
    x = np.concatenate(pieces, axis=1)
    if not np.all(np.isfinite(x)):
        raise ValueError(
            "`idata.posterior` has draws that are not finite in the unconstrained space (a "
            "draw on the boundary of its support, or NaN)."
        )

    # 2. Whiten, integrate the noise out, map back.
    w = solve_triangular(L, (x - t).T, lower=True).T
    try:
        w_star = noise_aware_draws(w, sd_G, sd_H, rng, embed=embed)
    except np.linalg.LinAlgError:
        raise ValueError(
            "`idata`'s draws have a singular covariance in the unconstrained space (a stuck "
            "chain, or a coordinate that never moves): the tilted posterior cannot be "
            "estimated from them."
        ) from None
    x_star = t + w_star @ L.T

    # 3. Recompute the requested variables from x.
    results = backward(x_star.astype(x_dtype, copy=False))
    data_vars = {}
    for name, value in zip(var_names, results, strict=True):
        value = np.asarray(value)
        value = value.reshape(shape_lead + value.shape[1:])
        if name in post:
            value = value.astype(post[name].dtype, copy=False)
        dims, coords = _output_coords(idata, model, name, value)
        attrs = dict(post[name].attrs) if name in post else {}
        data_vars[name] = xr.DataArray(value, dims=dims, coords=coords, attrs=attrs)
    new_post = xr.Dataset(data_vars, attrs=dict(post.attrs))
    new_post.attrs[NOISE_AWARE_ATTR] = 1

    groups = {
        group: (new_post if group == "posterior" else getattr(idata, group).copy(deep=True))
        for group in idata.groups()
    }
    attrs = dict(getattr(idata, "attrs", {}) or {})
    return az.InferenceData(attrs=attrs, warn_on_custom_groups=False, **groups)
