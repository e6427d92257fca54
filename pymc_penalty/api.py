"""``pymc_penalty.sample``: plan, calibrate, sample and report in one call."""

from __future__ import annotations

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
            **(step_kwargs or {}),
        )
    callback = PrivacyCallback(budget, ledger, log_every=max(plan.releases // 10, 1))

    def current_report(clipped: float) -> dict[str, Any]:
        return build_report(
            step=step,
            budget=budget,
            spent_mu2=ledger.spent_mu2,
            releases_by_chain=dict(callback.releases_by_chain),
            clipped_fraction=clipped,
        )

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
