"""Waste-recycling (Rao-Blackwellised) estimators from private chains, at no privacy cost.

Given the current state ``theta``, the proposal ``theta'`` and the step's noisy release, the
penalty step accepts with probability ``a`` (the ``accept`` statistic) using an independent
uniform. So ``E[f(theta_next) | past, theta', release] = a f(theta') + (1 - a) f(theta)``,
and averaging these terms instead of ``f(theta_next)`` removes the uniform's randomness from
the estimate. Every input is already released (the chain, ``accept``) or data-independent
(the proposal: the state plus a move from the step's generator), so the estimator is
post-processing and spends no privacy budget. See ``docs/recycling.md``.

Proposals are recorded in the step's raveled, unconstrained space (the ``proposal``
statistic); :class:`ProposalMap` maps them to the model's free variables and data-free
Deterministics with a compiled function of the value variables only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import arviz as az
import numpy as np
import pandas as pd
import pymc as pm
import pytensor.tensor as pt
import xarray as xr
from pymc.pytensorf import compile as pm_compile
from pymc.pytensorf import join_nonshared_inputs
from pymc.util import get_value_vars_from_user_vars
from pytensor.graph.replace import vectorize_graph

from pymc_penalty.model.checks import data_sources, depends_on_data, n_datapoints
from pymc_penalty.results.noise_aware import NOISE_AWARE_ATTR
from pymc_penalty.results.report import sampled_model
from pymc_penalty.sampling.step import PROPOSAL_STAT

__all__ = [
    "ProposalMap",
    "RecycledEstimate",
    "recycle",
    "recycled_mean",
    "recycled_summary",
    "recycled_terms",
]

#: A function of the variables: dict of arrays ``(chain, draw, *shape)`` -> ``(chain, draw, ...)``.
StatFn = Callable[[dict[str, np.ndarray]], np.ndarray]


class RecycledEstimate(NamedTuple):
    """Waste-recycling and plain estimates of one posterior expectation.

    Attributes
    ----------
    mean : ndarray
        Waste-recycling estimate (average of the per-step recycled terms).
    mcse : ndarray
        Its Monte Carlo standard error (ArviZ's ESS-based ``mcse`` of the recycled terms).
    plain_mean : ndarray
        Plain average of ``f`` over the draws.
    plain_mcse : ndarray
        Its Monte Carlo standard error.
    """

    mean: np.ndarray
    mcse: np.ndarray
    plain_mean: np.ndarray
    plain_mcse: np.ndarray


def recycle(f_prev: np.ndarray, f_prop: np.ndarray, accept: np.ndarray) -> np.ndarray:
    """Per-step recycled terms ``a f(theta') + (1 - a) f(theta)``.

    Parameters
    ----------
    f_prev : ndarray, shape (chain, draw, ...)
        ``f`` at the state each step started from.
    f_prop : ndarray, shape (chain, draw, ...)
        ``f`` at each step's proposal.
    accept : ndarray, shape (chain, draw)
        Each step's acceptance probability given its release.

    Returns
    -------
    ndarray
        Same shape as ``f_prev``. Where ``a = 0`` (proposal outside the support, or a release
        the ledger refused) the term is ``f(theta)`` even if ``f(theta')`` is not finite.
    """
    f_prev = np.asarray(f_prev, dtype=np.float64)
    f_prop = np.asarray(f_prop, dtype=np.float64)
    a = np.asarray(accept, dtype=np.float64).reshape(accept.shape + (1,) * (f_prev.ndim - 2))
    with np.errstate(invalid="ignore", over="ignore"):
        mixed = a * f_prop + (1.0 - a) * f_prev
    return np.where(a <= 0.0, f_prev, np.where(a >= 1.0, f_prop, mixed))


class ProposalMap:
    """Compiled, data-free map from raveled unconstrained proposals to model variables.

    Parameters
    ----------
    var_names : sequence of str
        Free variables and Deterministics to compute (constrained space).
    model : pm.Model, optional
        The model the chain was sampled from (from the context if omitted).
    vars : list, optional
        The variables given to the step, in the same order (default: all free variables in
        model order, what :class:`~pymc_penalty.PenaltyMetropolis` and
        :func:`pymc_penalty.sample` use).

    Raises
    ------
    ValueError
        If a name is not a free variable or Deterministic, or depends on data.
    """

    def __init__(
        self,
        var_names: Sequence[str],
        model: pm.Model | None = None,
        vars: list | None = None,
    ) -> None:
        model = pm.modelcontext(model)
        value_vars = (
            model.value_vars if vars is None else get_value_vars_from_user_vars(vars, model)
        )
        named = {rv.name: rv for rv in model.free_RVs}
        named.update({det.name: det for det in model.deterministics})
        unknown = [name for name in var_names if name not in named]
        if unknown:
            raise ValueError(
                f"`var_names` entries {unknown} are not free variables or Deterministics of the "
                "model."
            )
        outputs = [named[name] for name in var_names]
        replaced = model.replace_rvs_by_values(outputs)
        n = n_datapoints(model)
        sources = data_sources(model)
        leaky = [
            name
            for name, out, rep in zip(var_names, outputs, replaced, strict=True)
            if depends_on_data([out], sources, n) or depends_on_data([rep], sources, n)
        ]
        if leaky:
            raise ValueError(
                f"`var_names` entries {leaky} depend on data: evaluating them at proposals would "
                "use the data without noise. Recycle only data-free quantities."
            )
        point = model.initial_point()
        self.var_names = list(var_names)
        self.size = int(sum(np.size(point[v.name]) for v in value_vars))
        outs, flat = join_nonshared_inputs(point, replaced, value_vars)
        batch = pt.matrix("proposals", dtype=flat.dtype)
        batched = vectorize_graph(outs, replace={flat: batch})
        self._fn = pm_compile([batch], batched, on_unused_input="ignore")
        self._dtype = np.dtype(flat.dtype)

    def __call__(self, proposals: np.ndarray) -> dict[str, np.ndarray]:
        """Map proposals of shape ``(..., size)`` to ``{name: (..., *var_shape)}``."""
        proposals = np.asarray(proposals)
        if proposals.shape[-1] != self.size:
            raise ValueError(
                f"`proposals` have {proposals.shape[-1]} coordinates; the step's variables have "
                f"{self.size}. Pass the model (and `vars`) the chain was sampled with."
            )
        lead = proposals.shape[:-1]
        flat = proposals.reshape(-1, self.size).astype(self._dtype, copy=False)
        values = self._fn(flat)
        return {
            name: np.asarray(v).reshape(lead + np.shape(v)[1:])
            for name, v in zip(self.var_names, values, strict=True)
        }


def _previous_states(idata: az.InferenceData, names: Sequence[str]) -> dict[str, np.ndarray]:
    """The state each posterior draw's step started from; ``None``-free arrays.

    For the first draw this is the last tuning draw when ``warmup_posterior`` is stored, and
    otherwise the first draw itself (its term is then the plain ``f(theta_0)``).
    """
    post = idata.posterior
    warm = None
    if "warmup_posterior" in idata.groups() and idata.warmup_posterior.sizes.get("draw", 0):
        warm = idata.warmup_posterior.sel(chain=post.chain.values)
    out = {}
    for name in names:
        cur = np.asarray(post[name].values)
        if warm is not None and name in warm:
            first = np.asarray(warm[name].values)[:, -1:]
        else:
            first = cur[:, :1]
        out[name] = np.concatenate([first, cur[:, :-1]], axis=1)
    return out


def _default_names(idata: az.InferenceData, model: pm.Model) -> list[str]:
    candidates = [rv.name for rv in model.free_RVs] + [d.name for d in model.deterministics]
    return [name for name in candidates if name in idata.posterior]


def _check_alignment(
    mapped: dict[str, np.ndarray], idata: az.InferenceData, accepted: np.ndarray
) -> None:
    """Accepted proposals must map onto the stored draws (catches a wrong model or order)."""
    if not accepted.any():
        return
    for name, values in mapped.items():
        if name not in idata.posterior:
            continue
        stored = np.asarray(idata.posterior[name].values)
        rtol = 1e-4 if stored.dtype == np.float32 else 1e-6
        if not np.allclose(values[accepted], stored[accepted], rtol=rtol, atol=rtol):
            raise ValueError(
                f"Accepted proposals do not map onto the stored draws of {name!r}: pass the "
                "model (and `vars`, in the step's order) the chain was sampled with."
            )


def recycled_terms(
    idata: az.InferenceData,
    var_names: Sequence[str] | None = None,
    fn: StatFn | None = None,
    model: pm.Model | None = None,
    vars: list | None = None,
    *,
    fn_name: str | None = None,
) -> xr.Dataset:
    """Per-step waste-recycling terms ``a_t f(theta'_t) + (1 - a_t) f(theta_{t-1})``.

    Parameters
    ----------
    idata : InferenceData
        From :func:`pymc_penalty.sample` or ``pm.sample`` with a penalty step (its
        ``sample_stats`` need ``accept`` and ``proposal``).
    var_names : sequence of str, optional
        Free variables and data-free Deterministics (default: those in the posterior).
    fn : callable, optional
        A function of the variables: it takes a dict of arrays ``(chain, draw, *shape)``
        (the ``var_names``) and returns an array ``(chain, draw, ...)``. Default: each
        variable itself.
    model : pm.Model, optional
        The sampled model. Default: the model the result was sampled from in this process
        (so no model context is needed), else the context's. Only its data-free part is compiled.
    vars : list, optional
        The variables given to the step, in its order (default: all free variables).
    fn_name : str, optional
        Name of ``fn``'s output in the result (default: ``fn.__name__``).

    Returns
    -------
    xarray.Dataset
        One variable per name (or one for ``fn``), dims ``(chain, draw, ...)`` like the
        posterior; a plain-average counterpart is ``f`` of the posterior itself.

    Raises
    ------
    ValueError
        If the statistics are missing, a variable depends on data, or the recorded proposals
        do not match the model.
    """
    if idata.posterior.attrs.get(NOISE_AWARE_ATTR):
        raise ValueError(
            "Waste recycling needs the chain's own draws beside its proposals; this result's "
            "posterior is the Taylor path's noise-aware draws (the chain's are in "
            "`posterior_tilted` and target the posterior tilted by the one-shot noise). Use "
            "the posterior's plain means, or method='penalty' to recycle."
        )
    model = sampled_model(idata, model)  # works outside the model's context
    if "sample_stats" not in idata.groups() or PROPOSAL_STAT not in idata.sample_stats:
        raise ValueError(
            f"`idata` has no `{PROPOSAL_STAT}` sample statistic: sample with a pymc_penalty "
            "step (this version or later) to record proposals."
        )
    stats = idata.sample_stats
    if isinstance(var_names, str):
        var_names = [var_names]  # one name, not its letters
    names = _default_names(idata, model) if var_names is None else list(var_names)
    if not names:
        raise ValueError("`var_names` is empty: nothing to recycle.")
    missing = [name for name in names if name not in idata.posterior]
    if missing:
        raise ValueError(f"`var_names` entries {missing} are not in `idata.posterior`.")
    accept = np.asarray(stats["accept"].values, dtype=np.float64)
    mapped = ProposalMap(names, model, vars)(np.asarray(stats[PROPOSAL_STAT].values))
    _check_alignment(mapped, idata, np.asarray(stats["accepted"].values, dtype=bool))
    prev = _previous_states(idata, names)
    post = idata.posterior
    if fn is None:
        data = {
            name: (post[name].dims, recycle(prev[name], mapped[name], accept)) for name in names
        }
        return xr.Dataset(data, coords=post[names].coords)
    coords = {"chain": post.chain.values, "draw": post.draw.values}
    label = fn_name or getattr(fn, "__name__", "fn")
    terms = recycle(np.asarray(fn(prev)), np.asarray(fn(mapped)), accept)
    dims = ("chain", "draw") + tuple(f"{label}_dim_{i}" for i in range(terms.ndim - 2))
    return xr.Dataset({label: xr.DataArray(terms, dims=dims)}, coords=coords)


def _mcse(ds: xr.Dataset) -> xr.Dataset:
    return az.mcse(ds, method="mean")


def recycled_mean(
    idata: az.InferenceData,
    var_names: Sequence[str] | None = None,
    fn: StatFn | None = None,
    model: pm.Model | None = None,
    vars: list | None = None,
    *,
    fn_name: str | None = None,
) -> dict[str, RecycledEstimate]:
    """Waste-recycling posterior means, with MCSEs, beside the plain averages.

    The estimate is the average over all chains and draws of :func:`recycled_terms`. Its
    MCSE is ArviZ's ESS-based ``mcse(method="mean")`` of those terms: after tuning, the triple
    (state, proposal, release) is a stationary Markov chain and each term is a function of it.
    No privacy budget is spent (see the module docstring).

    Parameters
    ----------
    idata, var_names, fn, model, vars, fn_name
        As in :func:`recycled_terms`.

    Returns
    -------
    dict of str to RecycledEstimate
        Keyed by variable name (or ``fn``'s name).
    """
    model = sampled_model(idata, model)  # works outside the model's context
    if isinstance(var_names, str):
        var_names = [var_names]
    terms = recycled_terms(idata, var_names, fn, model, vars, fn_name=fn_name)
    if fn is None:
        plain = idata.posterior[list(terms.data_vars)]
    else:
        names = _default_names(idata, model) if var_names is None else list(var_names)
        values = fn({name: np.asarray(idata.posterior[name].values) for name in names})
        label = next(iter(terms.data_vars))
        plain = xr.Dataset({label: (terms[label].dims, np.asarray(values, dtype=np.float64))})
    rec_mcse, plain_mcse = _mcse(terms), _mcse(plain)
    out = {}
    for name in terms.data_vars:
        out[str(name)] = RecycledEstimate(
            mean=np.asarray(terms[name].mean(("chain", "draw")).values),
            mcse=np.asarray(rec_mcse[name].values),
            plain_mean=np.asarray(plain[name].mean(("chain", "draw")).values),
            plain_mcse=np.asarray(plain_mcse[name].values),
        )
    return out


def recycled_summary(
    idata: az.InferenceData,
    var_names: Sequence[str] | None = None,
    model: pm.Model | None = None,
    vars: list | None = None,
) -> pd.DataFrame:
    """Table of recycled and plain means per scalar component (ArviZ-style row labels).

    Parameters
    ----------
    idata, var_names, model, vars
        As in :func:`recycled_mean`.

    Returns
    -------
    pandas.DataFrame
        Columns ``mean_recycled``, ``mcse_recycled``, ``mean_plain``, ``mcse_plain`` and
        ``variance_ratio`` (``(mcse_recycled / mcse_plain)^2``: below 1 means recycling
        helped).
    """
    rows: dict[str, dict[str, Any]] = {}
    for name, est in recycled_mean(idata, var_names, model=model, vars=vars).items():
        for index in np.ndindex(est.mean.shape):
            label = name if not index else f"{name}[{', '.join(map(str, index))}]"
            rec_se, plain_se = float(est.mcse[index]), float(est.plain_mcse[index])
            rows[label] = {
                "mean_recycled": float(est.mean[index]),
                "mcse_recycled": rec_se,
                "mean_plain": float(est.plain_mean[index]),
                "mcse_plain": plain_se,
                "variance_ratio": (rec_se / plain_se) ** 2 if plain_se > 0 else np.nan,
            }
    return pd.DataFrame.from_dict(rows, orient="index")
