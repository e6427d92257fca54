"""The privacy report in ``InferenceData.attrs``, and stripping what must not be published.

After sampling, :func:`attach_report` writes the report into ``idata.attrs`` (attrs survive
netCDF), trims draws that were not released, and removes content that is an exact function of
the data: the ``observed_data``, ``constant_data`` and ``log_likelihood`` groups and
Deterministics that depend on data.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import arviz as az
import numpy as np
import pymc as pm

from pymc_penalty._version import __version__
from pymc_penalty.accounting import composed_epsilon
from pymc_penalty.model.checks import data_dependent_variables, data_dims, n_datapoints

__all__ = [
    "DATA_GROUPS",
    "REPORT_KEYS",
    "attach_report",
    "build_report",
    "remember_model",
    "sampled_model",
    "strip_data",
]

#: InferenceData groups that hold the data itself or exact functions of it.
DATA_GROUPS = ("observed_data", "constant_data", "log_likelihood", "predictions_constant_data")
#: Keys every report has.
REPORT_KEYS = (
    "dp_epsilon",
    "dp_delta",
    "dp_mu",
    "dp_neighbours",
    "dp_sensitivity",
    "dp_releases",
    "dp_accountant",
    "dp_noise_private",
    "pymc_penalty_version",
)


def build_report(
    *,
    step: Any,
    budget: Any,
    spent_mu2: float,
    releases_by_chain: dict[int, int],
    clipped_fraction: float,
    component_mu2: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Assemble the privacy report of a run.

    Parameters
    ----------
    step : PenaltyMetropolis
        The step (its configuration: relation, sensitivity mode, noise source).
    budget : PrivacyBudget
    spent_mu2 : float
        The ledger's committed ``sum mu_t^2`` (an upper bound on what was released).
    releases_by_chain : dict
        Releases per chain, tuning included.
    clipped_fraction : float
        Mean released (noisy) clipped fraction over the run.
    component_mu2 : dict, optional
        Composed ``sum mu_t^2`` per party of a several-owners run
        (:attr:`PrivacyCallback.component_mu2`): adds ``dp_epsilon_vs_owners`` (each owner's
        epsilon against the other owners) and ``dp_epsilon_vs_outsider``.

    Returns
    -------
    dict
        netCDF-safe values (numbers, strings, lists of ints; flags as 0/1).
    """
    mu = math.sqrt(max(spent_mu2, 0.0))
    private = bool(step.private)
    chains = sorted(releases_by_chain)
    per_chain = [int(releases_by_chain[c]) for c in chains]
    report = {
        "dp_epsilon": _epsilon(spent_mu2, budget.delta, private),
        "dp_delta": float(budget.delta),
        "dp_mu": mu if private else math.inf,
        "dp_epsilon_budget": float(budget.epsilon),
        "dp_neighbours": step.neighbours.value,
        "dp_sensitivity": _describe_sensitivity(step),
        "dp_releases": int(sum(per_chain)),
        "dp_releases_per_chain": per_chain,
        "dp_accountant": "Gaussian DP (tight; Dong, Roth and Su 2022), ledger-enforced",
        # netCDF attributes cannot be booleans: 1 means private noise, 0 not.
        "dp_noise_private": int(private),
        "dp_clipped_fraction": float(clipped_fraction),
        "pymc_penalty_version": __version__,
    }
    report.update(_party_epsilons(budget, component_mu2 or {}, private))
    if getattr(step, "min_rows", None) is not None:
        report["dp_min_rows"] = int(step.min_rows)  # the public bound the gate used
    return report


def _epsilon(mu2: float, delta: float, private: bool) -> float:
    """The report's epsilon of a spend: ``inf`` when the noise was not private."""
    return float(composed_epsilon(mu2, delta)) if private else math.inf


def _describe_sensitivity(step: Any) -> str:
    """How the step bounds the sensitivity, in words (no data)."""
    describe = getattr(step, "describe_sensitivity", None)
    text = describe() if callable(describe) else None
    if text is not None:  # a step whose bound has its own form (the Taylor path's)
        return str(text)
    if getattr(step, "family", None) is not None:  # the exponential-family step
        return f"sufficient statistic ({step.family}): Delta = {step.sensitivity:g}"
    if step.clip is None:
        return "unbounded (clip=None)"
    norm = {
        "distance": " * ||theta' - theta||_2",
        "metric": " * ||L^-1 (theta' - theta)||_2 (L: the proposal's Cholesky factor)",
        "lipschitz": " * ||theta' - theta||_1",
    }
    mode = step.clip_mode.value
    if getattr(step, "clip_auto", False):
        return (
            f"clip {mode}: B = c" + norm.get(mode, "") + ", c found in tuning from the released "
            "clipped counts (per chain: sample_stats['dp_clip'])"
        )
    return f"clip {mode}: B = {step.clip:g}" + norm.get(mode, "")


def _party_epsilons(budget: Any, component_mu2: dict[str, float], private: bool) -> dict:
    """Per-owner and outsider epsilons of a several-owners run (empty for other runs)."""
    owners = sorted(
        (int(k.rsplit("_", 1)[1]), v) for k, v in component_mu2.items() if k[:12] == "dp_mu_owner_"
    )
    if not owners:
        return {}

    return {
        "dp_epsilon_vs_owners": [_epsilon(v, budget.delta, private) for _, v in owners],
        "dp_epsilon_vs_outsider": _epsilon(
            component_mu2.get("dp_mu_outsider", 0.0), budget.delta, private
        ),
    }


def _trim_unreleased(idata: az.InferenceData, per_chain: list[int]) -> dict[str, Any]:
    """Cut every group at the first draw any kept chain did not release, and remove the
    chains that released no stored draw (in place).

    ``per_chain`` is the report's releases per chain (tuning included), in the order of the
    chain labels. Returns the report's account of what was removed: ``dp_trimmed_draws``
    (stored draws cut from every kept chain), ``dp_chains_removed`` (their labels, as text),
    ``dp_releases_removed`` and ``dp_releases_removed_per_chain`` (releases whose draws are
    not in the result: the cut draws, and every release of a removed chain, tuning included;
    they were spent all the same, and ``dp_releases`` counts them).
    """
    if "sample_stats" not in idata.groups() or "dp_released" not in idata.sample_stats:
        return _removal_account(0, [], [0] * len(per_chain))
    released = np.asarray(idata.sample_stats["dp_released"].values, dtype=bool)
    labels = [int(c) for c in idata.sample_stats["chain"].values]
    first_unreleased = [int(np.argmin(r)) if not r.all() else r.size for r in released]
    keep_chains = [c for c, k in enumerate(first_unreleased) if k > 0]
    keep = min((first_unreleased[c] for c in keep_chains), default=0)
    total = released.shape[1]
    removed = released[:, keep:].sum(axis=1).astype(int)  # in the stored chains' order
    gone = [c for c in range(len(labels)) if c not in keep_chains]
    rank = {pos: r for r, pos in enumerate(np.argsort(labels))}  # per_chain is label-sorted
    if len(per_chain) == len(labels):  # a removed chain's tuning releases are removed too
        for c in gone:
            removed[c] = int(per_chain[rank[c]])
    by_label = [0] * len(labels)
    for c in range(len(labels)):
        by_label[rank[c]] = int(removed[c])
    account = _removal_account(total - keep, [labels[c] for c in gone], by_label)
    if keep == total and len(keep_chains) == released.shape[0]:
        return account
    for group in ("posterior", "sample_stats"):
        ds = getattr(idata, group)
        ds = ds.isel(chain=keep_chains, draw=slice(0, keep))
        setattr(idata, group, ds)
    return account


def _removal_account(draws: int, chains: list[int], releases: list[int]) -> dict[str, Any]:
    """The report's keys for what :func:`_trim_unreleased` removed (netCDF-safe values)."""
    return {
        "dp_trimmed_draws": int(draws),
        "dp_chains_removed": ", ".join(str(c) for c in chains) or "none",
        "dp_releases_removed": int(sum(releases)),
        "dp_releases_removed_per_chain": [int(k) for k in releases],
    }


def strip_data(idata: az.InferenceData, model: pm.Model, report: dict[str, Any]) -> list[str]:
    """Remove everything data-bearing from ``idata`` (in place); return what was removed.

    - the groups that hold data (:data:`DATA_GROUPS`);
    - in every other group, each variable whose draws carry data (Deterministics that read
      data, predictive draws of observed variables whose graph reads covariates);
    - the coordinate values of data dimensions (record ids), keeping the dimension;
    - under add/remove-one neighbours, where ``n`` itself is private: every variable with a
      data dimension or an axis of length ``n``, and PyMC's ``sampling_time`` attribute,
      which grows with ``n``. With a public bound ``min_rows`` (``dp_min_rows``) every rule
      compares lengths with the bound instead: an axis of at least ``min_rows - 1`` (the
      gate refused data-independent ones), so what is removed does not depend on ``n``.
    """
    removed: list[str] = []
    for group in DATA_GROUPS:
        if group in idata.groups():
            delattr(idata, group)
            removed.append(group)
    hide_n = report.get("dp_neighbours") == "add_remove"
    bound = report.get("dp_min_rows") if hide_n else None
    n = n_datapoints(model) if bound is None else int(bound)
    leaky = set(data_dependent_variables(model, n))
    dims = set(data_dims(model, n, bounded=bound is not None))
    for group in idata.groups():
        ds = getattr(idata, group)
        drop = [name for name in ds.data_vars if name in leaky]
        if hide_n:
            drop += [
                name
                for name, var in ds.data_vars.items()
                if name not in drop
                and any(
                    d in dims
                    or (d not in ("chain", "draw") and (size >= n - 1 if bound else size == n))
                    for d, size in var.sizes.items()
                )
            ]
        coords = [c for c in ds.coords if c in dims]
        if drop:
            ds = ds.drop_vars(drop)
            removed.extend(f"{group}/{name}" for name in drop)
        if coords:
            ds = ds.drop_vars(coords)
            removed.extend(f"{group}/coords/{name}" for name in coords)
        setattr(idata, group, ds)
    if hide_n and "sampling_time" in idata.attrs:
        del idata.attrs["sampling_time"]
        removed.append("attrs/sampling_time")
    for group in idata.groups():
        ds = getattr(idata, group)
        if hide_n and "sampling_time" in ds.attrs:
            ds.attrs.pop("sampling_time")
    return removed


#: The model each live result was sampled from (process-local, never serialised): helpers
#: such as :func:`~pymc_penalty.recycled_mean` find it outside the model's context.
_SAMPLED_MODELS: dict[int, pm.Model] = {}


def remember_model(idata: az.InferenceData, model: pm.Model) -> None:
    """Register ``model`` as the one ``idata`` was sampled from (for :func:`sampled_model`)."""
    key = id(idata)
    if key not in _SAMPLED_MODELS:
        weakref.finalize(idata, _SAMPLED_MODELS.pop, key, None)
    _SAMPLED_MODELS[key] = model


def sampled_model(idata: az.InferenceData, model: pm.Model | None = None) -> pm.Model:
    """The model behind a result: ``model`` if given, else the one it was sampled from
    (this process, :func:`attach_report`), else the model of the current context.

    Raises
    ------
    ValueError
        If none is known (for instance a result read back from netCDF outside a model).
    """
    if model is not None:
        return model
    known = _SAMPLED_MODELS.get(id(idata))
    if known is not None:
        return known
    try:
        return pm.modelcontext(None)
    except TypeError:
        raise ValueError(
            "No model is known for `idata` (it was not sampled in this process, or was "
            "copied or read from a file): pass `model=` or call inside `with model:`."
        ) from None


def attach_report(
    idata: az.InferenceData,
    report: dict[str, Any],
    *,
    model: pm.Model | None = None,
    keep_data: bool = False,
    trim: bool = True,
) -> az.InferenceData:
    """Attach the report to ``idata.attrs`` and remove data-bearing content (in place).

    Parameters
    ----------
    idata : InferenceData
        The result of ``pm.sample``.
    report : dict
        From :func:`build_report`.
    model : pm.Model, optional
        Used to find Deterministics that depend on data (from the context if omitted).
    keep_data : bool, default False
        Keep the data-bearing groups and Deterministics (the result is then not private;
        the report says so with ``dp_data_removed = False``).
    trim : bool, default True
        Drop draws that were not released (after the budget ran out, or past the plan):
        every chain is cut to the same length, and chains that released no draw are
        removed; the report says what (``dp_trimmed_draws``, ``dp_chains_removed``,
        ``dp_releases_removed``).

    Returns
    -------
    InferenceData
        The same object.
    """
    model = pm.modelcontext(model)
    remember_model(idata, model)
    removed: list[str] = [] if keep_data else strip_data(idata, model, report)
    per_chain = list(report.get("dp_releases_per_chain", []))
    account = _trim_unreleased(idata, per_chain) if trim else {"dp_trimmed_draws": 0}
    for key, value in report.items():
        idata.attrs[key] = value
    idata.attrs["dp_data_removed"] = int(not keep_data)
    idata.attrs["dp_removed"] = ", ".join(removed) if removed else "none"
    idata.attrs.update(account)
    return idata
