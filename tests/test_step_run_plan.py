"""The card's usage when ``pm.sample`` runs another run than the step's plan (issue 29,
item 2): each case asserts what is spent, what is reported and what is warned.

Before: a run longer than the plan let the first chains spend the later ones' share (one
chain froze at 0 releases), ``finalize`` removed that chain and cut every chain without a
word, and the report's release counts disagreed ("releases 8000", "sampling 3000").
"""

from __future__ import annotations

import os
import re
import warnings

import numpy as np
import pymc as pm
import pytest

import pymc_penalty as pp
from pymc_penalty import (
    FrozenChainWarning,
    PenaltyMetropolis,
    PlanMismatchWarning,
    PrivacyBudget,
    RunPlan,
)
from pymc_penalty.results.diagnostics import phase_costs
from pymc_penalty.sampling.setup import DEFAULT_PLAN, pymc_default_chains

pytestmark = [
    pytest.mark.filterwarnings("ignore::pymc_penalty.ConvergenceWarning"),
    pytest.mark.filterwarnings("ignore::pymc_penalty.UnpublishedResultWarning"),
]
QUIET = dict(progressbar=False, compute_convergence_checks=False)
EPS, DELTA = 1.0, 1e-5


@pytest.fixture(scope="module")
def model():
    y = np.random.default_rng(5).normal(0.4, 1.0, size=40)
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, 5.0)
        pm.Normal("y", m, 1.0, observed=y)
    return model


def _step(model: pm.Model, plan: RunPlan | None) -> PenaltyMetropolis:
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore", FrozenChainWarning)
        return PenaltyMetropolis(epsilon=EPS, delta=DELTA, plan=plan)


def _run(model, step, **kwargs):
    """``pm.sample`` then ``pp.finalize``; returns the result and the PlanMismatchWarnings."""
    with model:
        raw = pm.sample(step=step, random_seed=3, **QUIET, **kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = pp.finalize(raw, step)
    found = [str(w.message) for w in caught if issubclass(w.category, PlanMismatchWarning)]
    return idata, found


def _phase_releases_add_up(idata) -> None:
    """The report's counts agree: tuning + kept draws + removed draws = dp_releases."""
    costs = phase_costs(idata)
    a = idata.attrs
    assert a["dp_releases"] == sum(a["dp_releases_per_chain"])
    total = costs.tuning_releases.sum() + costs.sampling_releases.sum() + costs.removed_releases
    assert total == a["dp_releases"], (costs, dict(a))
    text = str(pp.report(idata))
    assert re.search(rf"^  releases +{a['dp_releases']} \(per chain", text, re.M), text
    shown = [int(k) for k in re.findall(r"^  \S[^\n]*?  (\d+) releases, ", text, re.M)]
    # Before the chains: the screen, the warm start and the Taylor path's one-shot.
    others = a.get("dp_warm_start_releases", 0) + a.get("dp_taylor_releases", 0)
    others += int(a.get("dp_screen_mu", 0.0) > 0)
    assert sum(shown) == a["dp_releases"] + others, text


def test_over_run_longer_chains_stop_at_the_same_length(model):
    """Plan 10 tune + 20 draws x 2 chains, run 10 + 40: each chain releases exactly 30 steps
    (before: chain 0 spent 50 and chain 1 was removed), every chain keeps 20 draws."""
    step = _step(model, RunPlan(draws=20, tune=10, chains=2))
    idata, found = _run(model, step, draws=40, tune=10, chains=2, cores=1)
    a = idata.attrs
    # Spent: the whole budget, the plan's releases, never more.
    assert a["dp_epsilon"] == pytest.approx(EPS, abs=1e-6) and a["dp_epsilon"] <= EPS
    assert step.ledger.releases - step.other_releases == 60
    # Reported: both chains, each cut to the plan's draws; nothing released was removed.
    assert a["dp_releases_per_chain"] == [30, 30]
    assert idata.posterior.sizes["chain"] == 2 and idata.posterior.sizes["draw"] == 20
    assert a["dp_trimmed_draws"] == 20 and a["dp_chains_removed"] == "none"
    assert a["dp_releases_removed"] == 0
    _phase_releases_add_up(idata)
    # Warned, with what was cut and what was spent.
    assert len(found) == 1
    assert "cut to its first 20 draws (20 stored draws removed per chain)" in found[0]
    assert f"epsilon {a['dp_epsilon']:.4g} of 1 spent" in found[0]


def test_over_run_on_two_cores_more_chains_than_planned(model):
    """The card's case: chains=4 on 2 cores, the step planned for 2 shorter chains. The two
    chains the plan pays for run its full length; the two more release nothing and are
    removed, and said so (before: they raced the planned chains for the budget)."""
    step = _step(model, RunPlan(draws=20, tune=10, chains=2))
    idata, found = _run(model, step, draws=40, tune=10, chains=4, cores=2)
    a = idata.attrs
    # Spent: the whole budget, the plan's releases.
    assert a["dp_epsilon"] == pytest.approx(EPS, abs=1e-6) and a["dp_epsilon"] <= EPS
    assert step.ledger.spent_mu2 <= PrivacyBudget(EPS, DELTA).mu ** 2 * (1 + 1e-12)
    assert step.ledger.releases - step.other_releases == 60
    # Reported: four chains ran, two are kept with the plan's 20 draws each.
    assert a["dp_releases_per_chain"] == [30, 30, 0, 0]
    assert idata.posterior.sizes["chain"] == 2 and idata.posterior.sizes["draw"] == 20
    assert a["dp_chains_removed"] == "2, 3" and a["dp_releases_removed"] == 0
    _phase_releases_add_up(idata)
    # Warned.
    assert len(found) == 1
    assert "chain(s) 2, 3 released no draw and are removed" in found[0]
    assert "cut to its first 20 draws" in found[0]
    assert f"epsilon {a['dp_epsilon']:.4g} of 1 spent" in found[0]


def test_chain_slots_are_claimed_once_each_across_processes(tmp_path):
    """The slots hold across processes: 8 forked claimers, 3 slots, 3 winners."""
    import multiprocessing as mp

    from pymc_penalty.privacy.chain_slots import ChainSlots

    slots = ChainSlots(3)
    ctx = mp.get_context("fork")
    with ctx.Pool(4) as pool:
        got = pool.map(_claim, [slots] * 8)
    assert sorted(g for g in got if g is not None) == [0, 1, 2]
    assert got.count(None) == 5
    path = slots.path
    del slots
    import gc

    gc.collect()
    assert not os.path.exists(path)  # removed by the process that made it


def _claim(slots) -> int | None:
    return slots.claim()


def test_under_run_fewer_chains_than_planned(model):
    """Plan 4 chains, run 2: half the releases, a smaller epsilon, and a warning."""
    plan = RunPlan(draws=20, tune=10, chains=4)
    step = _step(model, plan)
    idata, found = _run(model, step, draws=20, tune=10, chains=2, cores=1)
    a = idata.attrs
    assert a["dp_releases"] == 60 == step.ledger.releases - step.other_releases
    # The chains', the screen's, the warm start's and the one-shot's.
    # Each chain's 10 tuning releases are one move each, its 20 draws 10 moves each (the
    # Taylor path's moves_per_draw at draws=20), charged as one release per draw.
    before = a["dp_screen_mu"] ** 2 + a["dp_warm_start_mu"] ** 2 + a["dp_taylor_mu"] ** 2
    k = step.plan.moves_per_draw
    assert k == a["dp_moves_per_draw"] == 10
    moves = 2 * (10 + k * 20)
    spent = moves * step.mu**2 + before
    planned_eps = pp.accounting.composed_epsilon(spent, DELTA)
    assert a["dp_epsilon"] == pytest.approx(planned_eps, rel=1e-6)
    # Less than the plan's: the two chains' releases the run did not make were not spent.
    unmade = moves * step.mu**2
    assert a["dp_epsilon"] < pp.accounting.composed_epsilon(spent + unmade, DELTA) - 0.01
    assert a["dp_trimmed_draws"] == 0 and a["dp_releases_removed"] == 0
    _phase_releases_add_up(idata)
    assert len(found) == 1
    assert "made 60 releases of the 120 the step's plan" in found[0]
    assert f"epsilon {a['dp_epsilon']:.4g} of 1 spent" in found[0]


def test_step_with_no_plan_assumes_pm_sample_defaults_on_this_machine(model):
    """No plan: pm.sample's own draws, tune and chains here (before: 4 chains, which left a
    third of the budget unspent on 2 cores). The run pm.sample makes by default spends the
    budget, and nothing is warned."""
    cores = os.cpu_count() or 1
    assert pymc_default_chains() == max(2, min(4, cores))
    step = _step(model, None)
    assert DEFAULT_PLAN == RunPlan(1000, 1000, pymc_default_chains())
    # On the Taylor path a chain releases pp.sample's 500 tuning steps of pm.sample's 1000.
    assert step.plan == RunPlan(1000, 500, pymc_default_chains(), moves_per_draw=4)
    # pm.sample's defaults (draws, tune, chains), one process to keep the test light.
    idata, found = _run(model, step, chains=pymc_default_chains(), cores=1)
    a = idata.attrs
    assert a["dp_releases"] == step.plan.releases == pymc_default_chains() * 1500
    assert a["dp_epsilon"] == pytest.approx(EPS, abs=1e-6) and a["dp_epsilon"] <= EPS
    _phase_releases_add_up(idata)
    assert found == []
