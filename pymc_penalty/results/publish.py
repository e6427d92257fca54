"""Publishing a penalty-step result: the privacy report, the stripped data, the verdict.

:func:`finalize` is the last step of the low-level path
``pm.sample(step=PenaltyMetropolis(epsilon=..., delta=...))``; :func:`pymc_penalty.sample`
ends with the same code (:func:`finalize_result`).
"""

from __future__ import annotations

import warnings
from typing import Any

import arviz as az
import numpy as np
import pymc as pm

from pymc_penalty.errors import (
    ClippingWarning,
    ConvergenceWarning,
    PlanMismatchWarning,
    UtilityWarning,
)
from pymc_penalty.privacy.budget import PrivacyBudget, RunPlan
from pymc_penalty.privacy.callback import PrivacyCallback
from pymc_penalty.results.diagnostics import ESS_NOTE, R_HAT_NOTE, convergence_verdict
from pymc_penalty.results.noise_aware import NOISE_AWARE_ATTR, noise_aware_posterior
from pymc_penalty.results.report import attach_report, build_report, remember_model
from pymc_penalty.sampling.step import PenaltyMetropolis
from pymc_penalty.sampling.taylor import TaylorModel

__all__ = ["finalize", "finalize_result", "step_report", "taylor_posterior"]


def mean_clipped_fraction(idata: az.InferenceData) -> float:
    stats = idata.sample_stats
    frac = np.asarray(stats["dp_clipped_fraction"].values, dtype=float)
    released = np.asarray(stats["dp_released"].values, dtype=bool)
    vals = frac[released & np.isfinite(frac)]
    return float(vals.mean()) if vals.size else float("nan")


def releases_by_chain(
    idata: az.InferenceData, ledger: Any, other_releases: int = 0, tune_cap: int | None = None
) -> dict[int, int]:
    """Releases per chain, tuning included, from the stored statistics and the ledger.

    Stored draws say which were released. Tuning draws are usually not stored: a chain whose
    first stored draw was released released every tuning step too (a ledger's refusal is
    final for a fixed per-step cost, so nothing before a released step was refused). For the
    other chains the ledger's release count, less the chains known, is shared out, each
    getting at most its tuning steps. ``other_releases``: the ledger's releases that no
    chain made (a budgeted step's own warm start).
    """
    stats = idata.sample_stats
    released = np.asarray(stats["dp_released"].values, dtype=bool)
    counts = released.sum(axis=1)
    warm = idata.warmup_sample_stats if "warmup_sample_stats" in idata.groups() else None
    if warm is not None and "dp_released" in warm:
        counts = counts + np.asarray(warm["dp_released"].values, dtype=bool).sum(axis=1)
    else:
        tune = int(stats.attrs.get("tuning_steps", 0) or 0)
        tune = tune if tune_cap is None else min(tune, int(tune_cap))
        certain = released[:, 0] if released.shape[1] else np.zeros(len(counts), dtype=bool)
        counts = counts + np.where(certain, tune, 0)
        total = getattr(ledger, "releases", None)
        total = None if total is None else int(total) - int(other_releases)
        rest = tune * int((~certain).sum()) if total is None else int(total) - int(counts.sum())
        for c in np.flatnonzero(~certain):
            share = min(tune, max(rest, 0))
            counts[c] += share
            rest -= share
    chains = np.asarray(stats["chain"].values)
    return {int(c): int(k) for c, k in zip(chains, counts, strict=True)}


def return_reservation(ledger: Any) -> None:
    release = getattr(ledger, "release_unused", None)
    if release is not None:
        release()


def step_report(
    step: Any,
    budget: PrivacyBudget,
    callback: PrivacyCallback | None,
    clipped_fraction: float,
    releases_by_chain: dict[int, int] | None = None,
) -> dict[str, Any]:
    """The report of what ``step``'s ledger has committed (its unused reservation returned)."""
    return_reservation(step.ledger)
    if callback is not None:
        releases_by_chain = dict(callback.releases_by_chain)
    return build_report(
        step=step,
        budget=budget,
        spent_mu2=step.ledger.spent_mu2,
        releases_by_chain=releases_by_chain or {},
        clipped_fraction=clipped_fraction,
        component_mu2=None if callback is None else dict(callback.component_mu2),
    )


#: The stack level of :func:`finalize_result`'s warnings: the line that called
#: ``pymc_penalty.sample`` or ``pymc_penalty.finalize`` (each calls ``finalize_result``, which
#: calls the warning's function).
_CALLER = 4


def taylor_posterior(
    idata: Any, model: pm.Model, taylor: TaylorModel, random_seed: Any, keep_data: bool = False
) -> Any:
    """The Taylor path's published posterior: the chain's draws with the one-shot noise
    integrated out (:func:`~pymc_penalty.results.noise_aware.noise_aware_posterior`), the
    raw chain's draws (the tilted target's) kept as ``posterior_tilted``. Post-processing of
    released values and the release's public noise law: no privacy cost.

    Where the chain's draws cannot give the tilted posterior's Gaussian approximation (too
    few draws, a stuck chain: a singular covariance) the result keeps the chain's draws as its
    posterior (``dp_noise_aware`` 0) and warns (:class:`~pymc_penalty.UtilityWarning`): its
    intervals then leave the one-shot noise out. The budget is spent by then; failing would
    lose it.
    """
    seed = int(random_seed) if isinstance(random_seed, int | np.integer) else None
    rng = np.random.default_rng(None if seed is None else [seed, 0x7A7])
    try:
        out = noise_aware_posterior(
            idata,
            model,
            t=taylor.t,
            L=taylor.L,
            sd_G=taylor.release.sd_G,
            sd_H=taylor.release.sd_H,
            rng=rng,
            var_names=list(idata.posterior.data_vars),
            index=taylor.index,
            allow_data=keep_data,
        )
    except ValueError:  # its text is not quoted: only the package's own words leave
        warnings.warn(
            "The one-shot noise could not be integrated out of the chains' draws (too few "
            "draws, or a chain that did not move: their covariance is singular). The "
            "posterior is the chains' own, which targets the posterior tilted by that noise: "
            "its means carry an error of about the report's dp_taylor_mean_noise_sd (in "
            "posterior sds) that its intervals leave out. Run longer chains.",
            UtilityWarning,
            stacklevel=_CALLER,
        )
        idata.posterior.attrs[NOISE_AWARE_ATTR] = 0
        return idata
    out.add_groups({"posterior_tilted": idata.posterior})
    remember_model(out, model)  # the result's functions find its model, as pp.sample's do
    return out


def finalize_result(
    idata: az.InferenceData,
    step: Any,
    *,
    callback: PrivacyCallback | None,
    model: pm.Model | None,
    keep_data: bool = False,
    extra: dict[str, Any] | None = None,
    random_seed: Any = None,
) -> az.InferenceData:
    """:func:`finalize`'s work, shared with :func:`pymc_penalty.sample`: the report, the
    stripped data, the verdict and, after a step with a released Taylor model, the
    noise-aware posterior (:func:`taylor_posterior`, seeded by ``random_seed``)."""
    budget = getattr(step, "budget", None)
    if budget is None and callback is not None:
        budget = callback.budget
    if budget is None:
        raise ValueError(
            "`step` has no budget: construct it with `epsilon` and `delta` (or pass the "
            "`callback` that composed its releases, which holds the budget)."
        )
    ledger = getattr(step, "ledger", None)
    if ledger is None or not hasattr(ledger, "spent_mu2"):
        raise ValueError(
            "`step` has no PrivacyLedger, so what it released was never counted: construct it "
            "with `epsilon` and `delta`."
        )
    if not isinstance(idata, az.InferenceData):
        raise ValueError("`idata` must be the InferenceData that pm.sample returned.")
    if "dp_epsilon" in idata.attrs:
        raise ValueError("`idata` already has a privacy report: it was finalized before.")
    if "sample_stats" not in idata.groups() or "dp_released" not in idata.sample_stats:
        raise ValueError(
            "`idata` has no penalty-step statistics (`dp_released` in sample_stats): pass the "
            "result of pm.sample with this step."
        )
    return_reservation(ledger)  # this process's: the file then holds every grant
    if callback is not None:
        callback.check_against_ledger()
    own = getattr(step, "extra_report", None) or {}  # a budgeted step's own warm start
    # The ledger's releases no chain made (a budgeted step's screen, warm start, one-shot).
    others = int(getattr(step, "other_releases", 0))
    releases = (
        None
        if callback is not None
        else releases_by_chain(idata, ledger, others, getattr(step, "tune_release_cap", None))
    )
    report = step_report(step, budget, callback, mean_clipped_fraction(idata), releases)
    report.update(own)
    report.update(extra or {})
    if model is None:
        model = getattr(step, "_model", None)
    idata = attach_report(idata, report, model=model, keep_data=keep_data)
    warn_plan_mismatch(idata, getattr(step, "plan", None))
    warn_clipping(idata)
    verdict_after_sampling(idata)
    taylor = getattr(step, "taylor", None)
    if taylor is not None:  # post-processing of released values: no privacy cost
        idata = taylor_posterior(idata, model, taylor, random_seed, keep_data=keep_data)
    return idata


def warn_plan_mismatch(idata: az.InferenceData, plan: RunPlan | None) -> None:
    """Warn (:class:`~pymc_penalty.PlanMismatchWarning`) when the run was not the step's plan:
    draws or chains removed from the result (released past the plan or the budget), or fewer
    releases than the plan paid for. Reads the attached report only."""
    a = idata.attrs
    spent = f"epsilon {a['dp_epsilon']:.4g} of {a['dp_epsilon_budget']:.4g} spent"
    planned = "" if plan is None else f" (the step's plan: {_plan_text(plan)})"
    fix = (
        "Give the step plan=pp.RunPlan(draws=..., tune=..., chains=...) with the values you "
        "pass to pm.sample."
    )
    cut, gone = int(a.get("dp_trimmed_draws", 0)), str(a.get("dp_chains_removed", "none"))
    if cut or gone != "none":
        kept = idata.posterior.sizes.get("draw", 0) if "posterior" in idata.groups() else 0
        parts = []
        if cut:
            parts.append(
                f"every chain is cut to its first {kept} draws ({cut} stored draws removed "
                "per chain)"
            )
        if gone != "none":
            parts.append(f"chain(s) {gone} released no draw and are removed")
        lost = int(a.get("dp_releases_removed", 0))
        count = (
            f"The removed draws' {lost} releases count all the same: {spent}."
            if lost
            else f"No released draw was removed: {spent}."
        )
        warnings.warn(
            f"The run asked for more releases than it could make{planned}: each chain stops "
            "releasing at the plan's length or when the budget is spent, and chains past the "
            f"plan's number release nothing, so {' and '.join(parts)}. {count} {fix}",
            PlanMismatchWarning,
            stacklevel=_CALLER,
        )
    elif plan is not None and int(a.get("dp_releases", 0)) < plan.releases:
        warnings.warn(
            f"The run made {a['dp_releases']} releases of the {plan.releases} the step's plan "
            f"({_plan_text(plan)}) pays for: {spent}, and each release's noise was sized for "
            f"the longer run. {fix}",
            PlanMismatchWarning,
            stacklevel=_CALLER,
        )


#: Above this released clipped fraction :func:`warn_clipping` warns: the clip found in tuning
#: aims at 0.2% or less, and a fraction this large moves the posterior (issue 29: the fixed
#: clip 1.0 in "distance" mode clipped 25% of the rows at epsilon 1, means 70-160 sd off).
CLIPPED_WARN_FRACTION = 0.05


def warn_clipping(idata: az.InferenceData) -> None:
    """Warn (:class:`~pymc_penalty.ClippingWarning`) when the report's released clipped
    fraction is above :data:`CLIPPED_WARN_FRACTION` (released, so public: no privacy cost)."""
    fraction = float(idata.attrs.get("dp_clipped_fraction", float("nan")))
    if fraction > CLIPPED_WARN_FRACTION:
        warnings.warn(
            f"{fraction:.0%} of the rows' log-likelihood ratios were clipped (released "
            "dp_clipped_fraction): the draws follow a clipped, biased likelihood, and the "
            "report's Monte Carlo error does not include that bias. Use a clip found in "
            "tuning in the proposal's metric (clip=ClipPolicy('auto', mode='metric'), "
            "pp.sample's clip_mode='metric': the default with a budget), or a larger clip.",
            ClippingWarning,
            stacklevel=_CALLER,
        )


def _plan_text(plan: RunPlan) -> str:
    return f"draws={plan.draws}, tune={plan.tune}, chains={plan.chains}"


def verdict_after_sampling(idata: az.InferenceData) -> None:
    """Attach the convergence verdict (released draws only) and warn when it is bad."""
    verdict = convergence_verdict(idata)
    idata.attrs.update(verdict)
    if verdict["dp_convergence"] == "not converged":
        warnings.warn(
            f"The private chains have not converged: largest R-hat "
            f"{verdict['dp_r_hat_max']:.3g} ({R_HAT_NOTE}), smallest bulk ESS "
            f"{verdict['dp_ess_bulk_min']:.3g} ({ESS_NOTE}). Do not report these "
            "draws as the posterior: the budget was too small for this model and n (see the "
            "forecast, pymc_penalty.forecast_utility), or tuning too short; see "
            "docs/choosing-parameters.md.",
            ConvergenceWarning,
            stacklevel=_CALLER,
        )


def finalize(
    idata: az.InferenceData,
    step: PenaltyMetropolis,
    *,
    callback: PrivacyCallback | None = None,
    model: pm.Model | None = None,
) -> az.InferenceData:
    """Make ``pm.sample``'s result publishable: attach the privacy report, strip the data.

    The last step of the low-level path::

        with model:
            step = pp.PenaltyMetropolis(epsilon=1.0, delta=1e-5, plan=plan)
            idata = pm.sample(plan.draws, tune=plan.tune, chains=plan.chains, step=step)
        idata = pp.finalize(idata, step)

    The report (:func:`~pymc_penalty.build_report`) is built from the step's own budget and
    ledger: ``dp_epsilon`` is what the ledger committed, over every chain and process, tuning
    included, and never more than the budget. :func:`~pymc_penalty.attach_report` then
    removes ``observed_data``, ``constant_data``, ``log_likelihood``, data-dependent
    Deterministics and record ids, and the draws the ledger refused. :func:`sample` ends the
    same way.

    Why a separate call: PyMC has no hook that runs after sampling, so a step cannot clean
    ``pm.sample``'s result itself. A budgeted step therefore warns when it is made
    (:class:`~pymc_penalty.UnpublishedResultWarning`), and only a finalized result carries
    ``dp_epsilon`` in its attrs, which :func:`pymc_penalty.results.diagnostics.summary` requires.

    It attaches the convergence verdict and warns (:class:`~pymc_penalty.ConvergenceWarning`)
    when the chains have not converged. PyMC's own R-hat/ESS warnings, with other
    thresholds, are printed by ``pm.sample`` before this runs: pass
    ``compute_convergence_checks=False`` to ``pm.sample`` for the package's verdict alone,
    as :func:`pymc_penalty.sample` does.

    Parameters
    ----------
    idata : InferenceData
        What ``pm.sample(step=step, ...)`` returned. It is modified in place.
    step : PenaltyMetropolis
        The step that produced it, constructed with ``epsilon`` and ``delta`` (or with a
        :class:`~pymc_penalty.PrivacyLedger` and the ``callback`` below).
    callback : PrivacyCallback, optional
        If it was passed to ``pm.sample``: its per-chain release counts (and several owners'
        per-party costs) go into the report, and it is checked against the ledger. Without
        it, releases per chain are counted from the stored statistics; where the budget ran
        out before a chain's first stored draw, its tuning releases (not stored by default)
        are inferred from the ledger's release count.
    model : pm.Model, optional
        The sampled model; default the step's.

    Returns
    -------
    InferenceData
        The same object, with the report in ``attrs`` (keys ``dp_*``).

    Raises
    ------
    ValueError
        If the step has no budget or no ledger, if ``idata`` is not a penalty-step result, or
        if it was finalized already.
    PrivacyAccountingError
        If ``callback`` saw releases that cost more than the ledger recorded.
    """
    seed = getattr(step, "noise_aware_seed", None)
    return finalize_result(idata, step, callback=callback, model=model, random_seed=seed)
