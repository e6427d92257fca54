"""``pm.sample(step=PenaltyMetropolis(epsilon=..., delta=...))``: private by construction.

The budgeted step calibrates itself, owns a ledger shared by every chain and process, warns
that ``pm.sample``'s raw result is unpublished, and :func:`pymc_penalty.finalize` turns that
result into a private one. Steps without a budget or ledger warn; bad budgets are refused
before anything is compiled or spent. ``FrozenChainWarning`` carries nothing computed from
``n`` (finding 6 of issue 11).
"""

from __future__ import annotations

import logging
import math
import os
import warnings

import numpy as np
import pymc as pm
import pytest

import pymc_penalty as pp
import pymc_penalty.sampling.step as step_module
from pymc_penalty import (
    FrozenChainWarning,
    NotPrivateWarning,
    PenaltyMetropolis,
    PrivacyBudget,
    PrivacyLedger,
    RunPlan,
    UnpublishedResultWarning,
    diagnostics,
)

QUIET = dict(progressbar=False, compute_convergence_checks=False)
EPS, DELTA = 1.0, 1e-5
DATA_GROUPS = {"observed_data", "constant_data", "log_likelihood"}


@pytest.fixture(scope="module")
def model():
    y = np.random.default_rng(5).normal(0.4, 1.0, size=40)
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, 5.0)
        pm.Normal("y", m, 1.0, observed=y)
    return model


def _budgeted(model: pm.Model, plan: RunPlan, **kwargs) -> PenaltyMetropolis:
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore", FrozenChainWarning)
        return PenaltyMetropolis(epsilon=EPS, delta=DELTA, plan=plan, **kwargs)


def _messages(caught: list[warnings.WarningMessage], category: type[Warning]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, category)]


# --------------------------------------------------------------------------------------------
# The budget is enforced across chains and processes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cores", [1, 2])
def test_budgeted_step_spends_at_most_its_budget(model, cores):
    plan = RunPlan(draws=15, tune=15, chains=2)
    step = _budgeted(model, plan)
    assert isinstance(step.ledger, PrivacyLedger)
    with model:
        raw = pm.sample(15, tune=15, chains=2, cores=cores, step=step, random_seed=1, **QUIET)
    idata = pp.finalize(raw, step)
    budget_mu2 = PrivacyBudget(EPS, DELTA).mu ** 2
    assert 0.0 < step.ledger.spent_mu2 <= budget_mu2 * (1 + 1e-12)
    assert 0.0 < idata.attrs["dp_epsilon"] <= EPS
    assert idata.attrs["dp_epsilon"] == pytest.approx(EPS, abs=1e-6)  # the plan spends it
    # The ledger also holds the step's own screen, warm start and one-shot (pp.sample's
    # defaults, issue 29).
    assert idata.attrs["dp_warm_start_releases"] > 0 and idata.attrs["dp_taylor_releases"] > 0
    assert step.other_releases == (
        1 + idata.attrs["dp_warm_start_releases"] + idata.attrs["dp_taylor_releases"]
    )
    assert idata.attrs["dp_releases"] == plan.releases == step.ledger.releases - step.other_releases
    assert idata.attrs["dp_releases_per_chain"] == [30, 30]
    assert idata.attrs["dp_trimmed_draws"] == 0


def test_a_run_longer_than_the_plan_is_stopped_by_the_ledger(model):
    """A third chain the plan did not pay for gets nothing; finalize drops it, and says so."""
    step = _budgeted(model, RunPlan(draws=10, tune=10, chains=2))
    with model:
        raw = pm.sample(10, tune=10, chains=3, cores=1, step=step, random_seed=2, **QUIET)
    released = raw.sample_stats["dp_released"].values
    assert released[:2].all() and not released[2].any()
    with pytest.warns(pp.PlanMismatchWarning, match=r"chain\(s\) 2 released no draw"):
        idata = pp.finalize(raw, step)
    assert idata.attrs["dp_chains_removed"] == "2" and idata.attrs["dp_releases_removed"] == 0
    assert step.ledger.spent_mu2 <= PrivacyBudget(EPS, DELTA).mu ** 2 * (1 + 1e-12)
    assert idata.attrs["dp_epsilon"] <= EPS
    assert idata.attrs["dp_releases"] == 40 and idata.attrs["dp_releases_per_chain"] == [20, 20, 0]
    assert idata.posterior.sizes["chain"] == 2


def test_the_step_calibrates_through_pp_calibrate(model):
    plan = RunPlan(draws=7, tune=3, chains=3)
    step = _budgeted(model, plan, warm_start=0)
    # Calibrated to what the screen (the first spend, issue 28) left.
    screened = math.sqrt(PrivacyBudget(EPS, DELTA).mu ** 2 - step.ledger.spent_mu2)
    assert step.ledger.releases == 1
    expected = pp.calibrate(screened, plan, warn_below=0.0)
    assert step.mu == pytest.approx(expected, rel=1e-12)
    # With its warm start (the default) the step is calibrated to what the warm start left.
    warm = _budgeted(model, plan)
    left = math.sqrt(step.ledger.budget_mu**2 - warm.ledger.spent_mu2)
    # The Taylor path's draws are several moves each: calibrated to the plan's moves.
    assert warm.plan == RunPlan(7, 3, 3, moves_per_draw=10)
    assert warm.mu == pytest.approx(pp.calibrate(left, warm.plan, warn_below=0.0), rel=1e-9)
    assert warm.mu < pp.calibrate(left, plan, warn_below=0.0)  # must differ: 73 vs 10 moves
    assert step.budget == PrivacyBudget(EPS, DELTA) and step.plan == plan
    # The default plan is pm.sample's draws, tune and chains on this machine.
    chains = max(2, min(4, os.cpu_count() or 1))
    default = _budgeted(model, None, warm_start=0)
    assert default.plan == RunPlan(1000, 1000, chains) and default.tune_release_cap is None
    # After its warm start a chain releases pp.sample's tuning only (issue 29): on the Taylor
    # path (the default) 500 steps, on the plain walk a tenth of the draws.
    warmed = _budgeted(model, None)
    assert warmed.plan == RunPlan(1000, 500, chains, moves_per_draw=4)
    assert warmed.tune_release_cap == 500
    plain = _budgeted(model, None, method="penalty")
    assert plain.plan == RunPlan(1000, 100, chains) and plain.tune_release_cap == 100


def test_a_given_ledger_is_used_and_calibrated_to_what_it_has_left(model):
    budget = PrivacyBudget(EPS, DELTA)
    ledger = PrivacyLedger(budget.mu)
    assert ledger.try_spend(0.75 * budget.mu**2)
    plan = RunPlan(draws=5, tune=5, chains=1)
    step = _budgeted(model, plan, ledger=ledger)
    assert step.ledger is ledger
    left = budget.mu**2 - ledger.spent_mu2
    assert step.plan.moves == 5 + 5 * 10  # tuning steps, then draws of 10 moves
    assert step.mu == pytest.approx(np.sqrt(left / step.plan.moves), rel=1e-6)


def test_a_ledger_with_a_larger_budget_is_refused(model):
    ledger = PrivacyLedger(2.0 * PrivacyBudget(EPS, DELTA).mu)
    with pytest.raises(ValueError, match="`ledger`"):
        _budgeted(model, RunPlan(5, 5, 1), ledger=ledger)
    assert ledger.spent_mu2 == 0.0


# --------------------------------------------------------------------------------------------
# Warnings: no budget, and the raw result
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("noise", [{"mu": 0.1}, {"noise_sd": 1.0}])
def test_a_step_without_budget_or_ledger_warns(model, noise):
    with model, pytest.warns(NotPrivateWarning, match="without a budget or a ledger") as caught:
        PenaltyMetropolis(**noise)
    assert not _messages(caught, UnpublishedResultWarning)


def test_a_step_with_a_ledger_does_not_warn(model):
    ledger = PrivacyLedger(1.0)
    with model, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        PenaltyMetropolis(mu=0.1, ledger=ledger)
    assert not _messages(caught, NotPrivateWarning)


def test_the_budgeted_step_warns_once_that_the_raw_result_is_unpublished(model):
    with model, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = PenaltyMetropolis(epsilon=EPS, delta=DELTA, plan=RunPlan(5, 5, 1))
        raw = pm.sample(5, tune=5, chains=1, step=step, random_seed=3, **QUIET)
    messages = _messages(caught, UnpublishedResultWarning)
    assert len(messages) == 1 and "pymc_penalty.finalize" in messages[0]
    assert issubclass(UnpublishedResultWarning, NotPrivateWarning)
    # The raw result holds data and no report: the diagnostics refuse it.
    assert "observed_data" in raw.groups() and "dp_epsilon" not in raw.attrs
    with pytest.raises(ValueError, match="pymc_penalty.finalize"):
        diagnostics.summary(raw)


def test_pp_sample_does_not_raise_the_unpublished_warning(model):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = pp.sample(
            epsilon=EPS, delta=DELTA, draws=5, tune=5, chains=1, cores=1, model=model, **QUIET
        )
    assert not _messages(caught, UnpublishedResultWarning)
    assert not _messages(caught, NotPrivateWarning)
    assert "observed_data" not in idata.groups() and idata.attrs["dp_epsilon"] <= EPS


# --------------------------------------------------------------------------------------------
# finalize
# --------------------------------------------------------------------------------------------


def test_finalize_strips_data_and_attaches_the_report():
    rng = np.random.default_rng(7)
    x = rng.normal(size=30)
    y = 0.5 * x + rng.normal(size=30)
    with pm.Model() as model:
        xd = pm.Data("x", x)
        b = pm.Normal("b", 0.0, 2.0)
        pm.Normal("y", b * xd, 1.0, observed=y)
        step = _budgeted(model, RunPlan(draws=10, tune=10, chains=1))
        raw = pm.sample(
            10,
            tune=10,
            chains=1,
            step=step,
            random_seed=4,
            idata_kwargs={"log_likelihood": True},
            **QUIET,
        )
    assert DATA_GROUPS <= set(raw.groups())
    # Outside the model context: finalize uses the step's model.
    idata = pp.finalize(raw, step)
    assert not DATA_GROUPS & set(idata.groups())
    assert 0.0 < idata.attrs["dp_epsilon"] <= EPS
    assert idata.attrs["dp_epsilon_budget"] == EPS and idata.attrs["dp_data_removed"] == 1
    assert idata.attrs["dp_releases"] == 20
    assert "Privacy report" in str(diagnostics.summary(idata))
    with pytest.raises(ValueError, match="finalized before"):
        pp.finalize(idata, step)


def test_finalize_refuses_a_step_without_a_budget(model):
    with model:
        step = PenaltyMetropolis(mu=0.1)
        raw = pm.sample(5, tune=5, chains=1, step=step, random_seed=5, **QUIET)
    with pytest.raises(ValueError, match="no budget"):
        pp.finalize(raw, step)
    assert "observed_data" in raw.groups()


# --------------------------------------------------------------------------------------------
# Bad arguments: refused before anything is compiled or spent
# --------------------------------------------------------------------------------------------


BAD = [
    (dict(epsilon=0.0, delta=DELTA), "`epsilon`"),
    (dict(epsilon=-1.0, delta=DELTA), "`epsilon`"),
    (dict(epsilon=float("inf"), delta=DELTA), "`epsilon`"),
    (dict(epsilon="one", delta=DELTA), "`epsilon`"),
    (dict(epsilon=EPS, delta=0.0), "`delta`"),
    (dict(epsilon=EPS, delta=1.0), "`delta`"),
    (dict(epsilon=EPS, delta=1.5), "`delta`"),
    (dict(epsilon=EPS), "`delta`"),
    (dict(delta=DELTA), "`epsilon`"),
    (dict(epsilon=EPS, delta=DELTA, mu=0.1), "exactly one of"),
    (dict(epsilon=EPS, delta=DELTA, noise_sd=1.0), "exactly one of"),
    (dict(mu=0.1, noise_sd=1.0), "exactly one of"),
    (dict(), "exactly one of"),
    (dict(mu=0.1, plan=RunPlan(5, 5, 1)), "`plan`"),
    (dict(epsilon=EPS, delta=DELTA, plan=(5, 5, 1)), "`plan`"),
    (dict(epsilon=EPS, delta=DELTA, clip=None), "`clip`"),
]


@pytest.mark.parametrize(("kwargs", "match"), BAD)
def test_bad_arguments_are_refused_before_anything_is_compiled_or_spent(
    model, monkeypatch, kwargs, match
):
    def reached(*args, **kw):
        raise AssertionError("reached past argument checking")

    for name in ("validate_model", "PenaltyLikelihood", "PrivacyLedger", "calibrate"):
        monkeypatch.setattr(step_module, name, reached)
    with model, pytest.raises(ValueError, match=match):
        PenaltyMetropolis(**kwargs)


@pytest.mark.parametrize(
    "kwargs", [dict(draws=-1, tune=5, chains=1), dict(draws=0, tune=0, chains=1)]
)
def test_bad_plans_are_refused(kwargs):
    with pytest.raises(ValueError):
        RunPlan(**kwargs)


# --------------------------------------------------------------------------------------------
# Finding 6: nothing computed from n in FrozenChainWarning (or any log line)
# --------------------------------------------------------------------------------------------


def _package_log(caplog) -> list[str]:
    """This package's and PyMC's log lines (other libraries print object ids and paths)."""
    return [r.getMessage() for r in caplog.records if r.name.split(".")[0] == "pymc"]


def _calibration_text(n: int, neighbours: str, caplog) -> tuple[list[str], list[str]]:
    caplog.clear()
    with (
        warnings.catch_warnings(record=True) as caught,
        caplog.at_level(logging.DEBUG, logger="pymc"),
    ):
        warnings.simplefilter("always")
        pp.calibrate(
            PrivacyBudget(0.05, DELTA).mu,
            RunPlan(1000, 1000, 4),
            n_datapoints=n,
            clip=1.0,
            neighbours=neighbours,
        )
    return [str(w.message) for w in caught], _package_log(caplog)


@pytest.mark.parametrize("neighbours", ["substitute", "add_remove"])
def test_frozen_chain_warning_is_identical_for_n_50_and_51(neighbours, caplog):
    text_50 = _calibration_text(50, neighbours, caplog)
    text_51 = _calibration_text(51, neighbours, caplog)
    assert text_50[0], "the budget is small enough that the warning fires"
    assert text_50 == text_51


def _construction_text(n: int, caplog) -> tuple[list[str], list[str]]:
    """Every warning and log line of building a budgeted add/remove step on n records."""
    y = np.random.default_rng(n).normal(size=n)
    caplog.clear()
    with (
        warnings.catch_warnings(record=True) as caught,
        caplog.at_level(logging.DEBUG, logger="pymc"),
    ):
        warnings.simplefilter("always")
        with pm.Model():
            m = pm.Normal("m", 0.0, 5.0)
            pm.Normal("y", m, 1.0, observed=y)
            step = PenaltyMetropolis(
                epsilon=0.05,
                delta=DELTA,
                neighbours="add_remove",
                min_rows=20,  # public, below both n
                plan=RunPlan(100, 100, 2),
                warm_start=0,  # its released (noisy) values differ run to run, whatever n
            )
    assert step.budget is not None
    return [f"{w.category.__name__}: {w.message}" for w in caught], _package_log(caplog)


@pytest.mark.slow
def test_a_budgeted_add_remove_step_says_the_same_for_n_50_and_51(caplog):
    text_50 = _construction_text(50, caplog)
    text_51 = _construction_text(51, caplog)
    assert any("FrozenChainWarning" in w for w in text_50[0])
    assert text_50 == text_51
