"""``pp.sample``'s run, resolved once from public quantities into a frozen plan.

:func:`resolve_plan` turns the user's ``draws``, ``tune``, ``chains`` and warm-start share
(``"auto"`` or numbers, :mod:`pymc_penalty.planning.plan`'s rules) and the ``mu`` the chains
will get into a :class:`SamplePlan`: the :class:`~pymc_penalty.RunPlan`, and the utility
forecast (:func:`~pymc_penalty.planning.forecast.forecast_run`) with its report keys.
``chains="auto"`` is decided from the forecast of a 4-chain plan, so the two are resolved
together.

Under substitute-one neighbours n is public and the plan is resolved before anything is
spent. Under add/remove-one n is private: there is no forecast before the warm start, and
the plan is resolved again from the warm start's released noisy count of the rows (post-
processing) before the chains spend, with ``released_rows``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pymc as pm

from pymc_penalty.accounting.gdp import likelihood_mu2
from pymc_penalty.accounting.sensitivity import Neighbours
from pymc_penalty.errors import UtilityWarning
from pymc_penalty.model.checks import n_datapoints
from pymc_penalty.planning.forecast import UtilityForecast, forecast_run, likelihood_family
from pymc_penalty.planning.plan import resolve_chains
from pymc_penalty.privacy.budget import PrivacyBudget, RunPlan, calibrate

__all__ = ["SamplePlan", "resolve_plan"]


@dataclass(frozen=True)
class SamplePlan:
    """What ``pp.sample`` will run, resolved from public quantities.

    Attributes
    ----------
    run : RunPlan
        Draws, tuning steps and chains (``"auto"`` resolved).
    warm_start : float
        The warm start's share of the budget's ``mu^2`` (0: none).
    step_mu : float
        The chains' per-step ``mu`` as the step will calibrate it.
    report : dict
        The forecast's report keys (``dp_forecast_ess``, ``dp_forecast_verdict`` and, under
        add/remove-one, ``dp_forecast_rows``); empty when there is no forecast.
    """

    run: RunPlan
    warm_start: float
    step_mu: float
    report: dict[str, Any] = field(default_factory=dict)


def _forecast(
    step_mu: float,
    run: RunPlan,
    *,
    clip_count_share: float,
    neighbours: Any,
    budget: PrivacyBudget,
    model: pm.Model,
    released_rows: float | None,
) -> UtilityForecast | None:
    """The run's forecast from public quantities, or None where there is none: under
    add/remove-one without a released count (it would publish n), or for a model whose
    datapoints cannot be counted (the gate raises the clear error). Warns nothing."""
    adds = Neighbours.parse(neighbours) is not Neighbours.SUBSTITUTE
    if adds and released_rows is None:
        return None
    try:
        d = int(sum(np.size(v) for v in model.initial_point().values()))
        # Substitute-one: n is public. Add/remove-one: only the released count is read.
        n = float(released_rows) if adds else n_datapoints(model)
    except Exception:  # noqa: BLE001 - the model gate raises the clear error, before spending
        return None
    kept_mu2 = likelihood_mu2(step_mu, run.draws * run.chains, clip_count_share)
    return forecast_run(
        math.sqrt(kept_mu2),
        budget_mu=budget.mu,
        delta=budget.delta,
        n=n,
        d=d,
        steps=run.draws * run.chains,
        neighbours="add_remove" if adds else "substitute",
        likelihood=likelihood_family(model),  # the tail of its rows: public, from the model
    )


def resolve_plan(
    *,
    draws: int,
    tune: int,
    chains: int | str,
    warm_start: float,
    chains_mu: float,
    budget: PrivacyBudget,
    model: pm.Model,
    neighbours: Any,
    clip_count_share: float,
    released_rows: float | None = None,
    forecast: bool = True,
) -> SamplePlan:
    """Resolve the run once: ``chains="auto"`` from the forecast of a 4-chain plan, then the
    forecast of the resolved plan, which warns (:class:`~pymc_penalty.UtilityWarning`) when it
    is poor or hopeless, before the chains spend.

    Parameters
    ----------
    draws, tune : int
        Per chain (``tune`` already resolved: :func:`~pymc_penalty.planning.plan.resolve_tune`).
    chains : int or "auto"
    warm_start : float
        The warm start's share (resolved: :func:`~pymc_penalty.planning.plan.resolve_warm_start`).
    chains_mu : float
        The total ``mu`` the chains will get (what the ledger leaves them).
    budget : PrivacyBudget
    model : pm.Model
    neighbours : str or Neighbours
    clip_count_share : float
        As in :func:`pymc_penalty.sample`.
    released_rows : float, optional
        Under add/remove-one, the warm start's released noisy count of the rows.
    forecast : bool, default True
        False: no forecast (the Taylor path, which the plain penalty walk's forecast does not
        describe); ``chains="auto"`` is then 4.

    Returns
    -------
    SamplePlan
    """
    args = dict(
        clip_count_share=clip_count_share,
        neighbours=neighbours,
        budget=budget,
        model=model,
        released_rows=released_rows,
    )
    run = RunPlan(int(draws), int(tune), resolve_chains(chains, 0.0, None))
    if not forecast:
        return SamplePlan(
            run=run, warm_start=float(warm_start), step_mu=calibrate(chains_mu, run, warn_below=0.0)
        )
    if isinstance(chains, str) and chains == "auto":
        forecast = _forecast(calibrate(chains_mu, run, warn_below=0.0), run, **args)
        ess = None if forecast is None else float(forecast.ess)
        run = RunPlan(run.draws, run.tune, resolve_chains("auto", warm_start, ess))
    step_mu = calibrate(chains_mu, run, warn_below=0.0)
    forecast = _forecast(step_mu, run, **args)
    report: dict[str, Any] = {}
    if forecast is not None:
        adds = Neighbours.parse(neighbours) is not Neighbours.SUBSTITUTE
        if forecast.verdict in ("poor", "hopeless"):
            note = (
                "\n(Forecast after the warm start's share was spent, from its released noisy "
                "count of the rows: under add/remove-one neighbours n is private.)"
                if adds
                else ""
            )
            # stacklevel: warn -> resolve_plan -> pymc_penalty.sample -> the user's call
            warnings.warn(f"{forecast}{note}", UtilityWarning, stacklevel=3)
        report = {"dp_forecast_ess": forecast.ess, "dp_forecast_verdict": forecast.verdict}
        if adds:
            report["dp_forecast_rows"] = float(released_rows)  # not n
    return SamplePlan(run=run, warm_start=float(warm_start), step_mu=step_mu, report=report)
