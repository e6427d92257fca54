"""``pymc_penalty.sample``: plan, calibrate, sample and report in one call; ``finalize``.

Both paths share one budget path and one report path: :func:`sample` builds a budgeted
:class:`~pymc_penalty.PenaltyMetropolis` (which calibrates itself from the budget and the
ledger) and ends with the same code as :func:`finalize`, the last step of the low-level path
``pm.sample(step=PenaltyMetropolis(epsilon=..., delta=...))``.
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

import arviz as az
import numpy as np
import pymc as pm

from pymc_penalty.accounting.gdp import likelihood_mu2
from pymc_penalty.adaptation import RW_SCALE
from pymc_penalty.budget import NEGLIGIBLE_SHARE, PrivacyBudget, RunPlan, available_mu
from pymc_penalty.callback import PrivacyCallback
from pymc_penalty.diagnostics import ESS_MIN, R_HAT_MAX, ConvergenceWarning, convergence_verdict
from pymc_penalty.forecast import (
    UtilityWarning,
    forecast_run,
    forecast_utility,
    likelihood_family,
)
from pymc_penalty.interrupts import SamplingInterrupted, interrupted_message, stop_on_interrupt
from pymc_penalty.ledger import PrivacyLedger
from pymc_penalty.model_checks import (
    check_initvals,
    data_dependent_deterministics,
    n_datapoints,
)
from pymc_penalty.report import attach_report, build_report
from pymc_penalty.sensitivity import Neighbours
from pymc_penalty.step import PenaltyMetropolis, UnpublishedResultWarning
from pymc_penalty.validation import check_sample_arguments
from pymc_penalty.warmstart import WarmStart, WarmStartRefused, private_warm_start

__all__ = ["PrivateSamplingError", "finalize", "sample"]

#: Below this share of the ledger's budget ``mu^2``, what is left counts as nothing.
_NEGLIGIBLE_SHARE = NEGLIGIBLE_SHARE


class PrivateSamplingError(RuntimeError):
    """``pm.sample`` failed; ``.privacy_report`` holds what the run had spent by then."""

    def __init__(self, message: str, privacy_report: dict[str, Any]) -> None:
        super().__init__(message)
        self.privacy_report = privacy_report


#: Reasons PyMC and this package give in their own words, free of data.
_DATA_FREE_REASONS = (
    "Not enough samples to build a trace",
    "Evaluating the model's log-likelihood failed",
)


def _data_free_reason(exc: BaseException) -> str:
    """The failure's reason where it is a known data-free message; else a note that it is
    withheld (PyTensor's messages print input values)."""
    text = str(exc)
    for reason in _DATA_FREE_REASONS:
        if reason in text:
            return reason + (" (details withheld)" if "withheld" in text else "")
    return "details withheld, they could quote data values"


def _mean_clipped_fraction(idata: az.InferenceData) -> float:
    stats = idata.sample_stats
    frac = np.asarray(stats["dp_clipped_fraction"].values, dtype=float)
    released = np.asarray(stats["dp_released"].values, dtype=bool)
    vals = frac[released & np.isfinite(frac)]
    return float(vals.mean()) if vals.size else float("nan")


def _as_float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _check_warm_start(warm_start: float | str, warm_start_clip: float | None, steps: int) -> None:
    if isinstance(warm_start, str) and warm_start == "auto":
        pass
    elif isinstance(warm_start, bool) or not 0.0 <= _as_float(warm_start) < 1.0:
        raise ValueError("`warm_start` must be a share of the budget in [0, 1), or 'auto'.")
    if warm_start_clip is not None:
        clip = _as_float(warm_start_clip)
        if not (math.isfinite(clip) and clip > 0):
            raise ValueError("`warm_start_clip` must be a finite positive number, in (0, inf).")
    if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or steps < 1:
        raise ValueError("`warm_start_steps` must be a positive integer.")


def _releases_by_chain(idata: az.InferenceData, ledger: Any) -> dict[int, int]:
    """Releases per chain, tuning included, from the stored statistics and the ledger.

    Stored draws say which were released. Tuning draws are usually not stored: a chain whose
    first stored draw was released released every tuning step too (a ledger's refusal is
    final for a fixed per-step cost, so nothing before a released step was refused). For the
    other chains the ledger's release count, less the chains known, is shared out, each
    getting at most its tuning steps.
    """
    stats = idata.sample_stats
    released = np.asarray(stats["dp_released"].values, dtype=bool)
    counts = released.sum(axis=1)
    warm = idata.warmup_sample_stats if "warmup_sample_stats" in idata.groups() else None
    if warm is not None and "dp_released" in warm:
        counts = counts + np.asarray(warm["dp_released"].values, dtype=bool).sum(axis=1)
    else:
        tune = int(stats.attrs.get("tuning_steps", 0) or 0)
        certain = released[:, 0] if released.shape[1] else np.zeros(len(counts), dtype=bool)
        counts = counts + np.where(certain, tune, 0)
        total = getattr(ledger, "releases", None)
        rest = tune * int((~certain).sum()) if total is None else int(total) - int(counts.sum())
        for c in np.flatnonzero(~certain):
            share = min(tune, max(rest, 0))
            counts[c] += share
            rest -= share
    chains = np.asarray(stats["chain"].values)
    return {int(c): int(k) for c, k in zip(chains, counts, strict=True)}


def _return_reservation(ledger: Any) -> None:
    release = getattr(ledger, "release_unused", None)
    if release is not None:
        release()


def _step_report(
    step: Any,
    budget: PrivacyBudget,
    callback: PrivacyCallback | None,
    clipped_fraction: float,
    releases_by_chain: dict[int, int] | None = None,
) -> dict[str, Any]:
    """The report of what ``step``'s ledger has committed (its unused reservation returned)."""
    _return_reservation(step.ledger)
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


def _finalize(
    idata: az.InferenceData,
    step: Any,
    *,
    callback: PrivacyCallback | None,
    model: pm.Model | None,
    keep_data: bool = False,
    extra: dict[str, Any] | None = None,
) -> az.InferenceData:
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
    _return_reservation(ledger)  # this process's: the file then holds every grant
    if callback is not None:
        callback.check_against_ledger()
    releases = None if callback is not None else _releases_by_chain(idata, ledger)
    report = _step_report(step, budget, callback, _mean_clipped_fraction(idata), releases)
    report.update(extra or {})
    if model is None:
        model = getattr(step, "_model", None)
    idata = attach_report(idata, report, model=model, keep_data=keep_data)
    _verdict_after_sampling(idata)
    return idata


def _verdict_after_sampling(idata: az.InferenceData) -> None:
    """Attach the convergence verdict (released draws only) and warn when it is bad."""
    verdict = convergence_verdict(idata)
    idata.attrs.update(verdict)
    if verdict["dp_convergence"] == "not converged":
        warnings.warn(
            f"The private chains have not converged: largest R-hat "
            f"{verdict['dp_r_hat_max']:.3g} (want <= {R_HAT_MAX}), smallest bulk ESS "
            f"{verdict['dp_ess_bulk_min']:.3g} (want >= {ESS_MIN:g}). Do not report these "
            "draws as the posterior: the budget was too small for this model and n (see the "
            "forecast, pymc_penalty.forecast_utility), or tuning too short; see "
            "docs/choosing-parameters.md.",
            ConvergenceWarning,
            stacklevel=4,
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
    ``dp_epsilon`` in its attrs, which :func:`pymc_penalty.diagnostics.summary` requires.

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
    return _finalize(idata, step, callback=callback, model=model)


def _warm_start_clip(warm_start_clip: float | None) -> float | str:
    """The warm start's gradient clip, in its own metric: ``"auto"`` unless given."""
    return "auto" if warm_start_clip is None else float(warm_start_clip)


#: Share of the budget's ``mu^2`` that ``warm_start="auto"`` spends on the warm start.
AUTO_WARM_START_SHARE = 0.2


def _resolve_warm_start(
    warm_start: float | str,
    model: pm.Model,
    pm_sample_kwargs: dict,
    owners: Any,
    forecast: dict[str, Any],
) -> float:
    """The warm start's share of the budget. ``"auto"`` is :data:`AUTO_WARM_START_SHARE` when
    the forecast for the whole budget (``forecast``: :func:`forecast_utility`'s arguments but
    the budget, public quantities only) is better than hopeless, and 0 otherwise: with
    ``initvals`` or ``owners`` given, without a public n (add/remove-one neighbours, where
    there is no forecast), or with a forecast effective sample size below 1, where the warm start's
    released curvature is mostly noise (opt in with a share)."""
    if not (isinstance(warm_start, str) and warm_start == "auto"):
        return float(warm_start)
    if owners is not None or "initvals" in pm_sample_kwargs:
        return 0.0
    if forecast.get("neighbours") != "substitute":
        return 0.0  # n is private: no forecast
    if any(v.dtype in pm.discrete_types for v in model.value_vars):
        return 0.0  # refused by the step; the warm start needs gradients
    try:
        n = n_datapoints(model)
        d = int(sum(np.size(v) for v in model.initial_point().values()))
    except Exception:  # noqa: BLE001 - the step's model gate raises the clear error
        return 0.0
    outlook = forecast_utility(n=n, d=d, **forecast)
    return 0.0 if outlook.verdict == "hopeless" else AUTO_WARM_START_SHARE


#: Tuning steps per chain with ``tune="auto"`` and no warm start (``pm.sample``'s default).
_COLD_TUNE = 1000
#: With a warm start, ``tune="auto"`` tunes for this share of the draws, within the bounds.
_WARM_TUNE_SHARE = 1.0 / 3.0
_WARM_TUNE_BOUNDS = (200, 1000)


def _resolve_tune(tune: int | str, draws: int, warm_start: float) -> int:
    """Tuning steps per chain: ``"auto"`` is 1000 without a warm start (the chains travel
    from the model's initial point) and a third of ``draws`` within [200, 1000] with one.

    Every tuning step costs as much privacy as a draw, and the budget buys a fixed total
    squared distance, so the tuning share is taken from the draws' effective sample size.
    Started from the warm start's approximation with its metric kept, the chains need no
    travel, only the scaling and the clip: on the gauss workload (n = 1e5, d = 10,
    epsilon = 2) the scaling settled within 50 steps and the clip within 300 (one chain of
    four moved it once more, at 500-700)."""
    if not (isinstance(tune, str) and tune == "auto"):
        return int(tune)
    if warm_start <= 0:
        return _COLD_TUNE
    low, high = _WARM_TUNE_BOUNDS
    return int(min(max(round(draws * _WARM_TUNE_SHARE), low), high))


def _positive_definite(cov: np.ndarray) -> np.ndarray:
    """``cov`` symmetrised, its eigenvalues floored at ``1e-12`` of the largest: the inverse of
    a released precision can lose definiteness to rounding when it is ill conditioned."""
    vals, vecs = np.linalg.eigh(0.5 * (cov + cov.T))
    vals = np.maximum(vals, 1e-12 * max(float(vals.max()), 1e-300))
    out = (vecs * vals) @ vecs.T
    return 0.5 * (out + out.T)


def _chain_starts(warm: WarmStart, chains: int, random_seed: Any) -> list[dict[str, np.ndarray]]:
    """One start per chain, drawn independently from the warm start's Gaussian approximation
    ``N(point, covariance)`` (post-processing of released values: no privacy cost).

    Chains that all start at the estimated mode begin with no spread, and a noise-limited
    chain moves too little in one run to build it: on the gauss workload (epsilon = 2) their
    sd was 0.71 of the posterior's and R-hat 3.9. Started from the approximation, each chain
    is near its stationary distribution from the first step."""
    seed = random_seed if isinstance(random_seed, int | np.integer) else None
    rng = np.random.default_rng(None if seed is None else [int(seed), 0x5EED])
    vals, vecs = np.linalg.eigh(_positive_definite(warm.covariance))
    root = vecs * np.sqrt(vals)
    starts = []
    for _ in range(chains):
        x = warm.point + root @ rng.standard_normal(warm.point.size)
        start, values = 0, {}
        for name, value in warm.initvals.items():
            size = int(np.size(value))
            values[name] = x[start : start + size].reshape(np.shape(value)).astype(value.dtype)
            start += size
        starts.append(values)
    return starts


def _warm_start_report(warm: WarmStart | None, share: float) -> dict[str, Any]:
    return {
        "dp_warm_start_share": float(share) if warm is not None else 0.0,
        "dp_warm_start_mu": warm.mu if warm is not None else 0.0,
        "dp_warm_start_releases": warm.releases if warm is not None else 0,
    }


def _phase_report(step: PenaltyMetropolis, plan: RunPlan) -> dict[str, Any]:
    """What the plan gives tuning and the draws: the tuning steps per chain and the Gaussian-DP
    ``mu`` of each phase over every chain (``sqrt(steps) * mu``; the warm start's is
    ``dp_warm_start_mu``). Planned values: a ledger that refuses earlier spends less."""
    mu = step.mu if step.mu is not None else math.nan
    return {
        "dp_tune": int(plan.tune),
        "dp_tuning_mu": float(mu * math.sqrt(plan.tune * plan.chains)),
        "dp_draws_mu": float(mu * math.sqrt(plan.draws * plan.chains)),
    }


def _forecast_before_spending(
    step: PenaltyMetropolis, budget: PrivacyBudget, plan: RunPlan, model: pm.Model
) -> dict[str, Any]:
    """Forecast the run's utility from public quantities and warn (:class:`UtilityWarning`)
    before anything is spent when it is poor or hopeless. Under add/remove-one neighbours n is
    private, so there is no forecast (it would publish n)."""
    if step.neighbours is not Neighbours.SUBSTITUTE or step.mu is None:
        return {}
    d = int(sum(np.size(v) for v in model.initial_point().values()))
    kept_mu2 = likelihood_mu2(step.mu, plan.draws * plan.chains, step.clip_count_share)
    forecast = forecast_run(
        math.sqrt(kept_mu2),
        budget_mu=budget.mu,
        delta=budget.delta,
        n=step._n,  # public under substitute-one (checked above)
        d=d,
        steps=plan.draws * plan.chains,
        likelihood=likelihood_family(model),  # the tail of its rows: public, from the model
    )
    if forecast.verdict in ("poor", "hopeless"):
        warnings.warn(f"{forecast}", UtilityWarning, stacklevel=3)
    return {"dp_forecast_ess": forecast.ess, "dp_forecast_verdict": forecast.verdict}


def sample(
    *,
    epsilon: float,
    delta: float,
    draws: int = 1000,
    tune: int | str = "auto",
    chains: int = 4,
    neighbours: str = "substitute",
    clip: float | str = "auto",
    clip_mode: str = "metric",
    clip_count_share: float = 0.05,
    warm_start: float | str = "auto",
    warm_start_clip: float | None = None,
    warm_start_steps: int = 8,
    ledger_path: str | os.PathLike[str] | None = None,
    keep_data: bool = False,
    step_kwargs: dict[str, Any] | None = None,
    model: pm.Model | None = None,
    owners: Any = None,
    cluster: Any = None,
    backend: str = "pymc",
    **pm_sample_kwargs: Any,
) -> az.InferenceData:
    """Draw a differentially private posterior sample with a privacy report.

    Plans the run (``(draws + tune) * chains`` releases), calibrates the per-step noise so
    the plan spends at most ``(epsilon, delta)`` under tight Gaussian-DP accounting, samples
    with :class:`PenaltyMetropolis` and a shared ledger that refuses any release past the
    budget, and attaches the report to the returned InferenceData (data-bearing groups
    removed).

    Parameters
    ----------
    epsilon, delta : float
        The budget; ``epsilon > 0``, ``0 < delta < 1``.
    draws, chains : int
        As in ``pm.sample``; every chain is paid for.
    tune : int or "auto", default "auto"
        Tuning steps per chain, each paid for like a draw. ``"auto"``: 1000 without a warm
        start; with one, a third of ``draws`` within [200, 1000] (the chains start near the
        posterior with its metric, and only the scaling and the clip are tuned).
    neighbours : {"substitute", "add_remove"}
    clip : float or "auto", default "auto"
        Clip constant of the per-datapoint log-likelihood ratios. ``"auto"`` finds it during
        tuning from the released noisy clipped counts (aiming at ``min(0.2%, 0.06 / sqrt(n))``
        of the rows clipped, or the smallest fraction the noisy counts resolve; no
        extra cost; under add/remove-one, where n is private, at one row per release), and
        the value each chain used is in ``sample_stats["dp_clip"]``.
    clip_mode : {"metric", "distance", "constant", "lipschitz"}, default "metric"
        ``"metric"``: the bound is ``clip * ||L^-1 (theta' - theta)||_2`` in the proposal's
        own metric (``L`` its Cholesky factor: public), so one constant fits every direction.
        ``"distance"``: ``clip * ||theta' - theta||_2``; ``"constant"``: ``clip``.
    clip_count_share : float
        Share of each step's privacy spent on the noisy clipped-datapoint count (with
        ``clip="auto"`` it must be positive: the clip is found from these counts).
    warm_start : float or "auto", default "auto"
        Share, in ``[0, 1)``, of the budget's ``mu^2`` (of what the ledger has left) spent on
        a private estimate of the posterior mode and covariance
        (:func:`pymc_penalty.warmstart.private_warm_start`) before sampling. With a positive
        share each chain starts at its own draw from the estimate's Gaussian approximation
        (``initvals`` may not be given) and, unless ``step_kwargs`` sets ``S``, the proposal
        covariance is the estimated posterior covariance, kept through tuning (only the
        scaling adapts, from ``2.38 / sqrt(d)``); the chains are calibrated to the rest of
        the budget. Its releases are charged to the same ledger and included in the report
        (``dp_warm_start_*``). ``"auto"``: 0.2 under substitute-one neighbours when the
        forecast for the whole budget (:func:`~pymc_penalty.forecast_utility`) is better than
        hopeless; 0 with ``initvals`` or ``owners``, under add/remove-one (n is private) or
        with a hopeless forecast. ``warm_start=0`` opts out (the behaviour of earlier
        releases: chains start at the model's initial point and adapt the full covariance).
    warm_start_clip : float, optional
        Clip of each per-datapoint log-likelihood gradient's length in the warm start, in the
        metric of the per-datapoint Fisher information it estimates (released, so public).
        By default ``"auto"``: the 99.9% quantile of that length at the mode, which needs no
        knowledge of the data's scale (:func:`pymc_penalty.warmstart.warm_start_clips`).
    warm_start_steps : int, default 8
        Fisher-scoring steps of the warm start (two releases each).
    ledger_path : path, optional
        A persistent ledger: successive analyses of one dataset share its budget, and the
        plan is calibrated to what is left.
    keep_data : bool, default False
        Keep ``observed_data``, ``constant_data`` and data-dependent Deterministics (the
        result is then not private).
    step_kwargs : dict, optional
        More :class:`PenaltyMetropolis` arguments (``S``, ``adapt``, ``target_accept``, ...).
    model : pm.Model, optional
    owners, cluster : optional
        Several data owners on a Dask cluster: a list of
        :class:`pymc_penalty.distributed.Owner`; see :func:`pymc_penalty.distributed.sample`.
    backend : {"pymc", "jax"}, default "pymc"
        ``"jax"`` (needs the ``jax`` extra): tuning as with ``"pymc"``, then each chain's
        draws run on a JAX device in jitted blocks, with the same releases, noise source,
        ledger and report (:mod:`pymc_penalty.jax_backend`).
    **pm_sample_kwargs
        Passed to ``pm.sample`` (``cores``, ``random_seed``, ``progressbar``, ...).

    Returns
    -------
    InferenceData
        With the privacy report in ``attrs`` (keys ``dp_*``).

    Raises
    ------
    PrivateSamplingError
        If ``pm.sample`` fails; its ``privacy_report`` says what was spent.
    """
    # Every argument, before a ledger is opened or anything compiled (the data are checked
    # by the step and the warm start, after the model gate).
    check_sample_arguments(**{k: v for k, v in locals().items() if k != "model"})
    model = pm.modelcontext(model)
    _check_warm_start(warm_start, warm_start_clip, warm_start_steps)
    outlook = {
        "epsilon": float(epsilon),
        "delta": float(delta),
        "draws": int(draws),
        "chains": int(chains),
        "neighbours": str(getattr(neighbours, "value", neighbours)),
        "likelihood": likelihood_family(model),  # the tail of its rows: public, from the model
    }
    warm_start = _resolve_warm_start(warm_start, model, pm_sample_kwargs, owners, outlook)
    tune = _resolve_tune(tune, int(draws), warm_start)
    if backend == "jax":  # draws on a JAX device: pymc_penalty.jax_backend
        from pymc_penalty.jax_backend import check_jax_backend, sample_on_device

        check_jax_backend(pm_sample_kwargs, step_kwargs, owners, model=model)
    if owners is not None:  # several owners on a cluster: pymc_penalty.distributed
        args = dict(locals(), **pm_sample_kwargs)
        from pymc_penalty.distributed.sampler import from_pp_sample

        # `backend` is the default one here (backend='jax' with owners was refused above).
        skip = ("pm_sample_kwargs", "backend")
        return from_pp_sample({k: v for k, v in args.items() if k not in skip})
    if pm_sample_kwargs.get("return_inferencedata", True) is not True:
        raise ValueError(
            "`return_inferencedata` must be True: the privacy report lives in InferenceData."
        )
    for name in ("step", "callback"):
        if name in pm_sample_kwargs:
            raise ValueError(
                f"`{name}` is set by pymc_penalty.sample; use pm.sample(step=..., callback=...) "
                "for the low-level path."
            )
    budget = PrivacyBudget(float(epsilon), float(delta))
    plan = RunPlan(int(draws), int(tune), int(chains))
    if warm_start > 0 and "initvals" in pm_sample_kwargs:
        raise ValueError(
            "`initvals` cannot be combined with `warm_start`: the chains start at the private "
            "warm-start estimate. Set warm_start=0 to choose the starting point."
        )
    check_initvals(model, pm_sample_kwargs.get("initvals"))  # before anything is spent
    if ledger_path is None:
        ledger = PrivacyLedger(budget.mu)
    else:
        ledger = PrivacyLedger(budget.mu, ledger_path)
    available = available_mu(ledger) ** 2  # raises if nothing is left
    warm: WarmStart | None = None
    step_kwargs = dict(step_kwargs or {})
    if warm_start > 0:
        noise_rng = None
        if step_kwargs.get("reproducible_noise"):
            noise_rng = np.random.default_rng(pm_sample_kwargs.get("random_seed"))
        try:
            warm = private_warm_start(
                model,
                mu=float(np.sqrt(available * warm_start)),
                ledger=ledger,
                clip=_warm_start_clip(warm_start_clip),
                steps=int(warm_start_steps),
                neighbours=neighbours,
                noise_rng=noise_rng,
                compile_kwargs=step_kwargs.get("compile_kwargs"),
            )
        except WarmStartRefused:
            ledger.release_unused()
            raise
        # The chains get exactly what the warm start left (its unused reservation returned).
        ledger.release_unused()
        pm_sample_kwargs["initvals"] = _chain_starts(
            warm, plan.chains, pm_sample_kwargs.get("random_seed")
        )
        if "S" not in step_kwargs:
            # Keep the warm start's metric: only the scaling adapts. The chain's own
            # covariance is a worse metric while the privacy noise holds it nearly still
            # (gauss, epsilon = 2: adapt="full" left sd ratio 0.71, R-hat 3.9; scaling-only
            # 1.04, 2.6), and a proposal frozen at the posterior's shape is what the metric
            # clip assumes. The step starts at the random-walk scale 2.38 / sqrt(d).
            step_kwargs["S"] = _positive_definite(warm.covariance)
            step_kwargs.setdefault("adapt", "scaling")
            step_kwargs.setdefault("scaling", RW_SCALE / math.sqrt(warm.point.size))
    # The budgeted step calibrates itself to what the ledger has left (the one calibration
    # path). This function finalizes the result itself, so the step's warning that a raw
    # result is unpublished does not apply here.
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore", UnpublishedResultWarning)
        step = PenaltyMetropolis(
            epsilon=budget.epsilon,
            delta=budget.delta,
            plan=plan,
            clip=clip,
            clip_mode=clip_mode,
            neighbours=neighbours,
            clip_count_share=clip_count_share,
            ledger=ledger,
            **step_kwargs,
        )
    if "var_names" not in pm_sample_kwargs and not keep_data:
        # Deterministics that read data are not even computed: their exact values (and any
        # error raised while computing them on the data) never exist outside the model.
        leaky = set(data_dependent_deterministics(model))
        stored = [*model.free_RVs, *model.deterministics]
        pm_sample_kwargs["var_names"] = [v.name for v in stored if v.name not in leaky]
    callback = PrivacyCallback(budget, ledger, log_every=max(plan.releases // 10, 1))
    # spent_mu2 is the ledger's total: it includes the warm start's releases.
    warm_report = _warm_start_report(warm, warm_start)
    warm_report.update(_phase_report(step, plan))
    warm_report.update(_forecast_before_spending(step, budget, plan, model))

    try:
        with model, stop_on_interrupt() as interrupt:
            if backend == "jax":  # tuning as below, then the draws on the device
                idata = sample_on_device(
                    step,
                    draws=plan.draws,
                    tune=plan.tune,
                    chains=plan.chains,
                    callback=callback,
                    model=model,
                    **pm_sample_kwargs,
                )
            else:
                idata = pm.sample(
                    draws=plan.draws,
                    tune=plan.tune,
                    chains=plan.chains,
                    step=step,
                    callback=callback,
                    **pm_sample_kwargs,
                )
    except interrupt:  # Ctrl-C: no further chain starts; say what was spent
        report = {**_step_report(step, budget, callback, float("nan")), **warm_report}
        message = interrupted_message(report, budget, ledger_path)
        raise SamplingInterrupted(message, report) from None
    except Exception as exc:
        report = _step_report(step, budget, callback, float("nan"))
        report.update(warm_report)
        raise PrivateSamplingError(
            f"pm.sample failed ({type(exc).__name__}: {_data_free_reason(exc)}) after "
            f"spending epsilon = {report['dp_epsilon']:.4g} of {budget.epsilon:g} (delta "
            f"{budget.delta:g}, {report['dp_releases']} releases).",
            report,
        ) from None  # the original (and a worker's traceback) could quote data values
    return _finalize(
        idata, step, callback=callback, model=model, keep_data=keep_data, extra=warm_report
    )
