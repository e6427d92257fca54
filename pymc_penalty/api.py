"""``pymc_penalty.sample``: plan, calibrate, sample and report in one call; ``finalize``.

Both paths share one budget path and one report path: :func:`sample` builds a budgeted
:class:`~pymc_penalty.PenaltyMetropolis` (which calibrates itself from the budget and the
ledger) and ends with the same code as :func:`finalize`, the last step of the low-level path
``pm.sample(step=PenaltyMetropolis(epsilon=..., delta=...))``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import warnings
from typing import Any

import arviz as az
import numpy as np
import pymc as pm

from pymc_penalty.accounting.sensitivity import Neighbours
from pymc_penalty.budgeted import (
    run_private_start,
    screen_before_sampling,
    screen_report,
    taylor_step_settings,
    warm_start_report,
)
from pymc_penalty.errors import (
    InvalidArgumentError,
    PrivateSamplingError,
    SamplingInterrupted,
    UnpublishedResultWarning,
)
from pymc_penalty.model.checks import (
    check_initvals,
    check_min_rows,
    data_dependent_deterministics,
    n_datapoints,
    one_model_gate,
    rule_rows,
)
from pymc_penalty.model.screen import SCREEN_SHARE
from pymc_penalty.planning.plan import (
    chain_starts,
    phase_report,
    resolve_chains,
    resolve_method,
    resolve_tune,
    resolve_warm_start,
    warm_step_kwargs,
)
from pymc_penalty.planning.resolve import resolve_plan
from pymc_penalty.planning.taylor_forecast import taylor_forecast_report
from pymc_penalty.privacy.budget import (
    NEGLIGIBLE_SHARE,
    PrivacyBudget,
    available_mu,
)
from pymc_penalty.privacy.callback import PrivacyCallback
from pymc_penalty.privacy.ledger import PrivacyLedger
from pymc_penalty.privacy.output import hidden_timing, progressbar_allowed
from pymc_penalty.results.publish import finalize, finalize_result, step_report
from pymc_penalty.sampling.interrupts import interrupted_message, stop_on_interrupt
from pymc_penalty.sampling.options import (
    ClipPolicy,
    PrivacyPolicy,
    ProposalPolicy,
    group_step_options,
)
from pymc_penalty.sampling.setup import check_step_kwargs
from pymc_penalty.sampling.step import PenaltyMetropolis
from pymc_penalty.sampling.taylor import (
    TaylorModel,
    TaylorPenaltyMetropolis,
)
from pymc_penalty.validation import check_sample_arguments
from pymc_penalty.warmstart import WARM_START_STEPS, WarmStart
from pymc_penalty.warmstart.taylor import TAYLOR_DRAWS, TAYLOR_SHARE, TAYLOR_TUNE

__all__ = ["PrivateSamplingError", "finalize", "sample"]

#: ``draws="auto"`` on the plain penalty path (``pm.sample``'s default).
DEFAULT_DRAWS = 1000

#: Below this share of the ledger's budget ``mu^2``, what is left counts as nothing.
_NEGLIGIBLE_SHARE = NEGLIGIBLE_SHARE


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


def sample(
    *,
    epsilon: float,
    delta: float,
    draws: int | str = "auto",
    tune: int | str = "auto",
    chains: int | str = "auto",
    neighbours: str = "substitute",
    min_rows: int | None = None,
    clip: float | str = "auto",
    clip_mode: str = "metric",
    clip_count_share: float = 0.05,
    warm_start: float | str = "auto",
    warm_start_clip: float | None = None,
    warm_start_steps: int = WARM_START_STEPS,
    ledger_path: str | os.PathLike[str] | None = None,
    keep_data: bool = False,
    step_kwargs: dict[str, Any] | None = None,
    model: pm.Model | None = None,
    owners: Any = None,
    cluster: Any = None,
    shards: Any = None,
    backend: str = "pymc",
    method: str = "auto",
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
    draws : int or "auto", default "auto"
        As in ``pm.sample``; every chain is paid for. ``"auto"``: 1000, or
        :data:`~pymc_penalty.warmstart.taylor.TAYLOR_DRAWS` (4000) with ``method="taylor"``,
        whose residual steps cost almost nothing: a random walk needs that many for the
        chains to agree (R-hat <= 1.01; logistic and Poisson regressions, n = 1e4, epsilon 2:
        "not converged" at 4 x 1000 draws, "converged" at 4 x 4000).
    chains : int or "auto", default "auto"
        As in ``pm.sample``; every chain is paid for. ``"auto"``: 4, or 8 after a warm start
        when the forecast for 4 chains is at least 2 and below 20 effective draws
        (``pymc_penalty.planning.plan.resolve_chains``). Each chain starts at its own draw from
        the warm start's approximation, and more chains sharing the budget add less
        random-walk error to the pooled mean (logistic regression, n = 1e5, epsilon 1: RMS
        error 0.34 sd with 4 chains, 0.27 with 8); at smaller forecasts the warm start is
        further off and fewer chains, each moving further, correct it more, and at larger
        ones the chains mix and their number no longer matters.
    tune : int or "auto", default "auto"
        Tuning steps per chain, each paid for like a draw. ``"auto"``: 1000 without a warm
        start; with one, a tenth of ``draws`` within [100, 1000] (the chains start near the
        posterior with its metric, and only the scaling and the clip are tuned).
    neighbours : {"substitute", "add_remove"}
    min_rows : int, optional
        Under add/remove-one, where it is required, a public lower bound (``>= 2``) on the
        number of rows, fixed without looking at the table: the model gate's shape rules
        compare lengths with it instead of the private count, so no refusal depends on ``n``
        (a table with fewer rows is refused before anything is spent). Without it the call
        is refused, the same for every table, before anything is spent: a refusal that
        compared lengths with ``n`` could tell whether one record is in the table (issue
        28). Recorded as ``dp_min_rows``. Ignored under substitute-one; with ``shards``
        passed to :func:`~pymc_penalty.distributed.sample_sharded`; not with ``owners``.
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
        (``dp_warm_start_*``). ``"auto"``: 0.2 (also when the forecast is hopeless: the
        chains then at least start near the posterior; under add/remove-one its first step
        releases a noisy count of the rows, n being private); 0 with ``initvals`` or
        ``owners``. With ``shards`` the warm start runs on the shards' summed statistics
        (:func:`pymc_penalty.distributed.sample_sharded`). ``warm_start=0`` opts out (the
        behaviour of earlier releases: chains start at the model's initial point and adapt
        the full covariance).
    warm_start_clip : float, optional
        Clip of each per-datapoint log-likelihood gradient's length in the warm start, in the
        metric of the per-datapoint Fisher information it estimates (released, so public).
        By default ``"auto"``: the 99.9% quantile of that length at the mode, which needs no
        knowledge of the data's scale (:func:`pymc_penalty.warmstart.warm_start_clips`).
    warm_start_steps : int, default 12
        Fisher-scoring steps of the warm start (two releases each).
    ledger_path : path, optional
        A persistent ledger: successive analyses of one dataset share its budget, and the
        plan is calibrated to what is left.
    keep_data : bool, default False
        Keep ``observed_data``, ``constant_data`` and data-dependent Deterministics (the
        result is then not private).
    step_kwargs : dict, optional
        More :class:`PenaltyMetropolis` arguments: ``S``, ``scaling``, ``proposal`` (a
        :class:`~pymc_penalty.ProposalPolicy`), ``privacy`` (a
        :class:`~pymc_penalty.PrivacyPolicy`: its ``neighbours`` and ``min_rows`` are this
        function's own), ``clip`` (a :class:`~pymc_penalty.ClipPolicy`: its ``value``,
        ``mode`` and ``count_share`` are this function's ``clip``, ``clip_mode`` and
        ``clip_count_share``), ... The step's old keywords (``adapt``,
        ``reproducible_noise``, ...) still work, each with a ``FutureWarning``.
    model : pm.Model, optional
    owners, cluster : optional
        Several data owners on a Dask cluster: a list of
        :class:`pymc_penalty.distributed.Owner`; see :func:`pymc_penalty.distributed.sample`.
    shards : list of loaders or dict of dask arrays, optional
        One curator's table split into shards on a Dask cluster (``cluster`` as for owners):
        one loader (callable or ``.npz`` path) per shard, run on the workers, or
        ``{pm.Data name: dask array}`` whose row blocks are the shards; the driver adds one
        noise draw per release. See :func:`pymc_penalty.distributed.sample_sharded`.
    backend : {"pymc", "jax"}, default "pymc"
        ``"jax"`` (needs the ``jax`` extra): tuning as with ``"pymc"``, then each chain's
        draws run on a JAX device in jitted blocks, with the same releases, noise source,
        ledger and report (:mod:`pymc_penalty.backends.jax.driver`).
    method : {"auto", "taylor", "penalty"}, default "auto"
        ``"auto"``: ``"taylor"`` wherever it applies (a warm start, the PyMC backend, no
        owners, ``clip_mode="metric"``), else ``"penalty"``; the report's
        ``dp_method`` says which ran (:func:`pymc_penalty.planning.plan.resolve_method`).
        ``"taylor"``: after the warm start, release each row's Taylor terms at its point once
        (summed, clipped, with noise; :func:`pymc_penalty.warmstart.taylor.taylor_oneshot`,
        :data:`~pymc_penalty.warmstart.taylor.TAYLOR_SHARE` of what the warm start leaves),
        and let the chains pay per step only for the clipped sum of the rows' residuals
        (:class:`pymc_penalty.sampling.taylor.TaylorPenaltyMetropolis`). The chains then
        target the posterior tilted by the one-shot noise; the returned posterior integrates
        that noise out (:func:`pymc_penalty.results.noise_aware.noise_aware_posterior`,
        Gaussian regime) and the raw chain's draws are in the ``posterior_tilted`` group.
        Its forecast (``dp_forecast_ess``, ``dp_forecast_verdict``) is made after the
        one-shot release, before the chains spend, from public values
        (:func:`pymc_penalty.planning.taylor_forecast.forecast_taylor`).
        ``"penalty"``: the plain penalty walk (exact for the posterior itself). With
        ``shards`` the one-shot and the residual steps run on the shards
        (:func:`pymc_penalty.distributed.sample_sharded`'s ``method``).
    **pm_sample_kwargs
        Passed to ``pm.sample`` (``cores``, ``random_seed``, ``progressbar``, ...).
        ``progressbar=False`` also silences the privacy progress lines (``pymc.penalty``
        logger), whose epsilon is the report's (the warm start included).
        ``compute_convergence_checks`` defaults to False here: the package's verdict
        (``dp_convergence``, :class:`~pymc_penalty.ConvergenceWarning`) replaces PyMC's own
        R-hat/ESS warnings.

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
    min_rows = check_min_rows(min_rows)
    # The step's old keywords in `step_kwargs` into their groups (FutureWarning), once, here.
    step_kwargs = group_step_options(step_kwargs or {})
    model = pm.modelcontext(model)
    parties = owners if shards is None else shards  # distributed: no JAX
    # Shards (one curator's table) get the warm start and the Taylor path; owners do not.
    warm_start = resolve_warm_start(warm_start, model, pm_sample_kwargs, owners, neighbours)
    method = resolve_method(
        method, warm_start, backend=backend, parties=owners, clip_mode=clip_mode
    )
    if isinstance(draws, str) and draws == "auto":
        draws = TAYLOR_DRAWS if method == "taylor" else DEFAULT_DRAWS
    taylor_tune = method == "taylor" and isinstance(tune, str) and tune == "auto"
    # The Taylor path's residual steps cost almost nothing: its chains tune as long as
    # without a warm start, adapting their full covariance (its start is the released
    # model's Newton step, whose metric ignores what only the prior shapes).
    tune = TAYLOR_TUNE if taylor_tune else resolve_tune(tune, int(draws), warm_start)
    if backend == "jax":  # draws on a JAX device: pymc_penalty.backends.jax.driver
        from pymc_penalty.backends.jax.driver import check_jax_backend, sample_on_device

        check_jax_backend(pm_sample_kwargs, step_kwargs, parties, model=model)
    if parties is not None:  # owners or shards on a cluster: pymc_penalty.distributed
        if min_rows is not None and shards is None:
            # Several owners: no model gate runs on a table there, so no bound is used.
            raise InvalidArgumentError("`min_rows` is not supported with `owners`; leave it out.")
        chains = resolve_chains(chains, 0.0, None)  # no warm start there
        args = dict(locals(), **pm_sample_kwargs)
        if shards is None:
            del args["min_rows"]
        from pymc_penalty.distributed.sampler import from_pp_sample

        # `backend` is the default one here (backend='jax' with owners was refused above).
        skip = ("pm_sample_kwargs", "backend", "parties", "taylor_tune")
        return from_pp_sample({k: v for k, v in args.items() if k not in skip})
    if pm_sample_kwargs.get("return_inferencedata", True) is not True:
        raise ValueError(
            "`return_inferencedata` must be True: the privacy report lives in InferenceData."
        )
    # The step is built after the warm start has spent: its arguments are checked now.
    check_step_kwargs(step_kwargs, PenaltyMetropolis, model.initial_point())
    given_adapt = (step_kwargs.get("proposal") or ProposalPolicy()).adapt
    # This function's own settings, in the step's groups.
    step_kwargs["clip"] = dataclasses.replace(
        step_kwargs.get("clip") or ClipPolicy(),
        value=clip,
        mode=clip_mode,
        count_share=clip_count_share,
    )
    step_kwargs["privacy"] = dataclasses.replace(
        step_kwargs.get("privacy") or PrivacyPolicy(), neighbours=neighbours, min_rows=min_rows
    )
    for name in ("step", "callback"):
        if name in pm_sample_kwargs:
            raise ValueError(
                f"`{name}` is set by pymc_penalty.sample; use pm.sample(step=..., callback=...) "
                "for the low-level path."
            )
    budget = PrivacyBudget(float(epsilon), float(delta))
    if warm_start > 0 and "initvals" in pm_sample_kwargs:
        raise ValueError(
            "`initvals` cannot be combined with `warm_start`: the chains start at the private "
            "warm-start estimate. Set warm_start=0 to choose the starting point."
        )
    add_remove = Neighbours.parse(neighbours) is Neighbours.ADD_REMOVE
    # The count the gate's shape rules use: n, or under add/remove-one the public bound.
    rule_n = rule_rows(n_datapoints(model), add_remove, min_rows)
    check_initvals(model, pm_sample_kwargs.get("initvals"), rule_n)  # before anything is spent
    if ledger_path is None:
        ledger = PrivacyLedger(budget.mu)
    else:
        ledger = PrivacyLedger(budget.mu, ledger_path)
    available = available_mu(ledger) ** 2  # raises if nothing is left
    plan_args = dict(
        draws=int(draws),
        tune=int(tune),
        chains=chains,
        warm_start=warm_start,
        budget=budget,
        model=model,
        neighbours=neighbours,
        clip_count_share=clip_count_share,
    )
    taylor_path = method == "taylor"
    if taylor_path and warm_start <= 0:
        raise InvalidArgumentError(
            "method='taylor' needs a warm start: leave out `initvals` (the chains start at "
            "the released model's estimate)."
        )
    chains_share = (1.0 - TAYLOR_SHARE) if taylor_path else 1.0
    # The plain walk's forecast, before anything is spent; the Taylor path's is made after
    # its one-shot release, from the released model (planning.taylor_forecast).
    plan_args["forecast"] = not taylor_path
    # Before anything is spent: the chains get what the screen and the warm start leave.
    resolved = resolve_plan(
        chains_mu=math.sqrt(available * (1.0 - SCREEN_SHARE) * (1.0 - warm_start) * chains_share),
        **plan_args,
    )
    noise_rng = None
    if step_kwargs["privacy"].reproducible_noise:
        noise_rng = np.random.default_rng(pm_sample_kwargs.get("random_seed"))
    # The screen, the warm start and the step share one gate decision: the model's checks
    # (the row-locality probes above all) run once.
    with one_model_gate():
        # The first spend: the noisy count of rows the likelihood cannot evaluate (issue 28).
        screen = screen_before_sampling(
            model, ledger, add_remove=add_remove, min_rows=min_rows, noise_rng=noise_rng
        )
        warm: WarmStart | None = None
        taylor: TaylorModel | None = None
        if warm_start > 0:
            warm, taylor = run_private_start(
                model,
                share=warm_start,
                taylor=taylor_path,
                ledger=ledger,
                neighbours=neighbours,
                min_rows=min_rows,
                warm_start_clip=warm_start_clip,
                steps=int(warm_start_steps),
                noise_rng=noise_rng,
                compile_kwargs=step_kwargs.get("compile_kwargs"),
            )
            if Neighbours.parse(neighbours) is Neighbours.ADD_REMOVE:  # from its released count
                resolved = resolve_plan(
                    chains_mu=available_mu(ledger), released_rows=warm.n_rows, **plan_args
                )
            pm_sample_kwargs["initvals"] = chain_starts(
                warm, resolved.run.chains, pm_sample_kwargs.get("random_seed")
            )
            step_kwargs = warm_step_kwargs(warm, neighbours, step_kwargs)
        # The budgeted step calibrates itself to what the ledger has left (the one calibration
        # path). This function finalizes the result itself, so the step's warning that a raw
        # result is unpublished does not apply here.
        step_class: type[PenaltyMetropolis] = PenaltyMetropolis
        if taylor is not None:
            taylor, step_kwargs = taylor_step_settings(
                taylor, step_kwargs, adapt=given_adapt, step_mu=resolved.step_mu
            )
            step_class = functools.partial(TaylorPenaltyMetropolis, taylor=taylor)
            # The forecast of the chains' ESS, from the released model and the plan (public).
            taylor_forecast = taylor_forecast_report(
                taylor,
                resolved.run,
                resolved.step_mu,
                neighbours=neighbours,
                clip_count_share=float(clip_count_share),
                clip=float(step_kwargs["clip"].value),
                offset=taylor.start_offset,
            )
        with model, warnings.catch_warnings():
            warnings.simplefilter("ignore", UnpublishedResultWarning)
            step = step_class(
                epsilon=budget.epsilon,
                delta=budget.delta,
                plan=resolved.run,
                ledger=ledger,
                **step_kwargs,
            )
    if "var_names" not in pm_sample_kwargs and not keep_data:
        # Deterministics that read data are not even computed: their exact values (and any
        # error raised while computing them on the data) never exist outside the model.
        leaky = set(data_dependent_deterministics(model, rule_n))
        stored = [*model.free_RVs, *model.deterministics]
        pm_sample_kwargs["var_names"] = [v.name for v in stored if v.name not in leaky]
    # The privacy progress lines are part of the progress display: progressbar=False is quiet.
    quiet = not pm_sample_kwargs.get("progressbar", True)
    callback = PrivacyCallback(
        budget,
        ledger,
        log_every=0 if quiet else max(resolved.run.releases // 10, 1),
        total_draws=resolved.run.releases,
    )
    # One voice: the package's verdict (dp_convergence, ConvergenceWarning) replaces PyMC's
    # own R-hat/ESS log warnings, which use other thresholds. An explicit True is kept.
    pm_sample_kwargs.setdefault("compute_convergence_checks", False)
    # spent_mu2 is the ledger's total: it includes the warm start's releases.
    warm_report = warm_start_report(warm, warm_start)
    warm_report.update(screen_report(screen))
    warm_report.update(phase_report(step, resolved.run))
    warm_report.update(resolved.report)
    warm_report.update(taylor.report() if taylor is not None else {"dp_method": "penalty"})
    if taylor is not None:
        warm_report.update(taylor_forecast)

    if not progressbar_allowed(neighbours):
        # Its draws per second and times measure n, private under add/remove-one.
        pm_sample_kwargs["progressbar"] = False
    try:
        # PyMC's "... took N seconds." line measures n too: logged without the duration.
        with model, stop_on_interrupt() as interrupt, hidden_timing():
            if backend == "jax":  # tuning as below, then the draws on the device
                idata = sample_on_device(
                    step,
                    draws=resolved.run.draws,
                    tune=resolved.run.tune,
                    chains=resolved.run.chains,
                    callback=callback,
                    model=model,
                    **pm_sample_kwargs,
                )
            else:
                idata = pm.sample(
                    draws=resolved.run.draws,
                    tune=resolved.run.tune,
                    chains=resolved.run.chains,
                    step=step,
                    callback=callback,
                    **pm_sample_kwargs,
                )
    except interrupt:  # Ctrl-C: no further chain starts; say what was spent
        report = {**step_report(step, budget, callback, float("nan")), **warm_report}
        message = interrupted_message(report, budget, ledger_path)
        raise SamplingInterrupted(message, report) from None
    except Exception as exc:
        report = step_report(step, budget, callback, float("nan"))
        report.update(warm_report)
        raise PrivateSamplingError(
            f"pm.sample failed ({type(exc).__name__}: {_data_free_reason(exc)}) after "
            f"spending epsilon = {report['dp_epsilon']:.4g} of {budget.epsilon:g} (delta "
            f"{budget.delta:g}, {report['dp_releases']} releases).",
            report,
        ) from None  # the original (and a worker's traceback) could quote data values
    return finalize_result(
        idata,
        step,
        callback=callback,
        model=model,
        keep_data=keep_data,
        extra=warm_report,
        random_seed=pm_sample_kwargs.get("random_seed"),
    )
