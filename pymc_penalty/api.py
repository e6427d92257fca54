"""``pymc_penalty.sample``: plan, calibrate, sample and report in one call."""

from __future__ import annotations

import math
import os
from typing import Any

import arviz as az
import numpy as np
import pymc as pm

from pymc_penalty.budget import PrivacyBudget, RunPlan, calibrate
from pymc_penalty.callback import PrivacyCallback
from pymc_penalty.ledger import PrivacyLedger
from pymc_penalty.model_checks import n_datapoints
from pymc_penalty.report import attach_report, build_report
from pymc_penalty.step import PenaltyMetropolis
from pymc_penalty.warmstart import WarmStart, WarmStartRefused, private_warm_start

__all__ = ["PrivateSamplingError", "sample"]

#: Below this share of the ledger's budget ``mu^2``, what is left counts as nothing.
_NEGLIGIBLE_SHARE = 1e-6


class PrivateSamplingError(RuntimeError):
    """``pm.sample`` failed; ``.privacy_report`` holds what the run had spent by then."""

    def __init__(self, message: str, privacy_report: dict[str, Any]) -> None:
        super().__init__(message)
        self.privacy_report = privacy_report


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


def _check_warm_start(warm_start: float, warm_start_clip: float | None, steps: int) -> None:
    if isinstance(warm_start, bool) or not 0.0 <= _as_float(warm_start) < 1.0:
        raise ValueError("`warm_start` must be a share of the budget in [0, 1).")
    if warm_start_clip is not None:
        clip = _as_float(warm_start_clip)
        if not (math.isfinite(clip) and clip > 0):
            raise ValueError("`warm_start_clip` must be a finite positive number, in (0, inf).")
    if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or steps < 1:
        raise ValueError("`warm_start_steps` must be a positive integer.")


def _warm_start_report(warm: WarmStart | None, share: float) -> dict[str, Any]:
    return {
        "dp_warm_start_share": float(share) if warm is not None else 0.0,
        "dp_warm_start_mu": warm.mu if warm is not None else 0.0,
        "dp_warm_start_releases": warm.releases if warm is not None else 0,
    }


def sample(
    *,
    epsilon: float,
    delta: float,
    draws: int = 1000,
    tune: int = 1000,
    chains: int = 4,
    neighbours: str = "substitute",
    clip: float = 1.0,
    clip_mode: str = "distance",
    clip_count_share: float = 0.05,
    warm_start: float = 0.0,
    warm_start_clip: float | None = None,
    warm_start_steps: int = 8,
    ledger_path: str | os.PathLike[str] | None = None,
    keep_data: bool = False,
    step_kwargs: dict[str, Any] | None = None,
    model: pm.Model | None = None,
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
    draws, tune, chains : int
        As in ``pm.sample``; tuning steps and every chain are paid for.
    neighbours : {"substitute", "add_remove"}
    clip : float
        Clip constant of the per-datapoint log-likelihood ratios.
    clip_mode : {"distance", "constant"}
    clip_count_share : float
        Share of each step's privacy spent on the noisy clipped-datapoint count.
    warm_start : float, default 0
        Share, in ``[0, 1)``, of the budget's ``mu^2`` (of what the ledger has left) spent on
        a private estimate of the posterior mode and covariance
        (:func:`pymc_penalty.warmstart.private_warm_start`) before sampling. With a positive
        share every chain starts at the estimated mode (``initvals`` may not be given) and,
        unless ``step_kwargs`` sets ``S``, the proposal covariance is the estimated posterior
        covariance; the chains are calibrated to the rest of the budget. Its releases are
        charged to the same ledger and included in the report (``dp_warm_start_*``).
    warm_start_clip : float, optional
        L2 clip of each per-datapoint log-likelihood gradient in the warm start (on the
        unconstrained space). Defaults to ``clip * sqrt(d)`` (``d`` unconstrained
        parameters): the gradient norm at which a random direction's derivative is
        typically ``clip``.
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
    model = pm.modelcontext(model)
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
    _check_warm_start(warm_start, warm_start_clip, warm_start_steps)
    warm_start = float(warm_start)
    if warm_start > 0 and "initvals" in pm_sample_kwargs:
        raise ValueError(
            "`initvals` cannot be combined with `warm_start`: the chains start at the private "
            "warm-start estimate. Set warm_start=0 to choose the starting point."
        )
    if ledger_path is None:
        ledger = PrivacyLedger(budget.mu)
    else:
        ledger = PrivacyLedger(budget.mu, ledger_path)
    available = ledger.remaining_mu2
    # A completed run leaves only the calibration margin (~1e-9 of the budget): treat such
    # dust as nothing left rather than calibrating a frozen chain to it.
    if available <= _NEGLIGIBLE_SHARE * ledger.budget_mu2:
        raise ValueError(
            f"The ledger at `ledger_path` has no budget left (mu^2 {available:.3g} of "
            f"{ledger.budget_mu2:.3g} remains)."
        )
    warm: WarmStart | None = None
    step_kwargs = dict(step_kwargs or {})
    if warm_start > 0:
        d = int(sum(np.size(v) for v in model.initial_point().values()))
        noise_rng = None
        if step_kwargs.get("reproducible_noise"):
            noise_rng = np.random.default_rng(pm_sample_kwargs.get("random_seed"))
        try:
            warm = private_warm_start(
                model,
                mu=float(np.sqrt(available * warm_start)),
                ledger=ledger,
                clip=clip * math.sqrt(d) if warm_start_clip is None else float(warm_start_clip),
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
        available = ledger.remaining_mu2
        pm_sample_kwargs["initvals"] = warm.initvals
        step_kwargs.setdefault("S", warm.covariance)
    step_mu = calibrate(
        np.sqrt(available),
        plan,
        n_datapoints=n_datapoints(model),
        clip=clip,
        clip_mode=clip_mode,
        neighbours=neighbours,
        clip_count_share=clip_count_share,
    )
    with model:
        step = PenaltyMetropolis(
            mu=step_mu,
            clip=clip,
            clip_mode=clip_mode,
            neighbours=neighbours,
            clip_count_share=clip_count_share,
            ledger=ledger,
            **step_kwargs,
        )
    callback = PrivacyCallback(budget, ledger, log_every=max(plan.releases // 10, 1))

    def current_report(clipped: float) -> dict[str, Any]:
        # spent_mu2 is the ledger's total: it includes the warm start's releases.
        report = build_report(
            step=step,
            budget=budget,
            spent_mu2=ledger.spent_mu2,
            releases_by_chain=dict(callback.releases_by_chain),
            clipped_fraction=clipped,
            component_mu2=dict(callback.component_mu2),
        )
        report.update(_warm_start_report(warm, warm_start))
        return report

    try:
        with model:
            idata = pm.sample(
                draws=plan.draws,
                tune=plan.tune,
                chains=plan.chains,
                step=step,
                callback=callback,
                **pm_sample_kwargs,
            )
    except Exception as exc:
        ledger.release_unused()
        report = current_report(float("nan"))
        raise PrivateSamplingError(
            f"pm.sample failed ({type(exc).__name__}) after spending epsilon = "
            f"{report['dp_epsilon']:.4g} of {budget.epsilon:g} (delta {budget.delta:g}, "
            f"{report['dp_releases']} releases).",
            report,
        ) from exc
    ledger.release_unused()
    callback.check_against_ledger()
    report = current_report(_mean_clipped_fraction(idata))
    return attach_report(idata, report, model=model, keep_data=keep_data)
