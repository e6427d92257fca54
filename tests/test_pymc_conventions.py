"""PyMC's step-method conventions that PenaltyMetropolis keeps (the redesign issue's list)."""

import numpy as np
import pymc as pm
import pytest
from pymc.step_methods.state import equal_dataclass_values

from pymc_penalty import ClipPolicy, PenaltyMetropolis, PrivacyPolicy, ProposalPolicy
from pymc_penalty.variants import ExpFamPenaltyMetropolis

#: Noise from the step's seeded generator (reproducible, not private).
SEEDED = PrivacyPolicy(reproducible_noise=True)


def _model():
    y = np.random.default_rng(0).normal(1.0, 1.0, size=300)
    model = pm.Model()
    with model:
        m = pm.Normal("m", 0.0, 5.0, shape=2)
        pm.Normal("y", m.sum(), 1.0, observed=y)
    return model


def _check_tuning_reset(step, untuned: dict, *, draws: int, tune: int, chains: int) -> None:
    """As PyMC's own tuning-reset test for pm.Metropolis: with cores=1 one step instance runs
    every chain; each chain starts from the untuned values (exactly as given) and samples with
    exactly the values its last tuning draw recorded."""
    idata = pm.sample(
        draws=draws,
        tune=tune,
        chains=chains,
        cores=1,
        step=step,
        random_seed=1,
        progressbar=False,
        compute_convergence_checks=False,
        discard_tuned_samples=False,
    )
    for name, value in untuned.items():
        warm = idata.warmup_sample_stats[name].values
        post = idata.sample_stats[name].values
        for c in range(chains):
            assert warm[c, 0] == value
            assert warm[c, -1] != warm[c, 0]  # it tuned
            np.testing.assert_array_equal(post[c], warm[c, -1])


@pytest.mark.parametrize("clip", [1.0, "auto"])
def test_tuning_is_reset_per_chain_and_the_last_tuned_values_are_the_ones_used(clip):
    with _model():
        step = PenaltyMetropolis(noise_sd=1.0, clip=ClipPolicy(clip, mode="metric"), scaling=0.1)
        untuned = {"scaling": 0.1}
        if clip == "auto":
            untuned["dp_clip"] = step._untuned_clip_adapter.clip
        _check_tuning_reset(step, untuned, draws=50, tune=120, chains=3)


def _expfam_step():
    y = np.random.default_rng(0).poisson(3.0, size=200)
    with pm.Model() as model:
        lam = pm.Gamma("lam", 2.0, 1.0)
        pm.Poisson("y", lam, observed=y)
        # rng seeded: the check below needs a step whose held update differs from the last
        # one, which two rejections in a row (accept published as 0 on its grid) do not give.
        step = ExpFamPenaltyMetropolis(data_bound=50, xi=400.0, scaling=0.1, privacy=SEEDED, rng=1)
    return model, step


def test_expfam_tuning_is_reset_per_chain_and_the_last_tuned_scaling_is_the_one_used():
    # The same convention for the exponential-family step: the update a tuning step learns is
    # applied at the start of the next step only if that step still tunes.
    model, step = _expfam_step()
    with model:
        _check_tuning_reset(step, {"scaling": 0.1}, draws=5, tune=60, chains=2)


def _penalty_step():
    model = _model()
    with model:
        step = PenaltyMetropolis(
            noise_sd=1.0,
            clip=ClipPolicy("auto", mode="metric"),
            scaling=0.1,
            privacy=SEEDED,
            rng=1,
        )
    return model, step


@pytest.mark.parametrize("make", [_penalty_step, _expfam_step], ids=["penalty", "expfam"])
def test_sampling_state_holds_the_pending_tuning_update(make):
    """The update a tuning step holds for the next step is part of the sampling state: a
    restored state replays the next step exactly (fails when the held update is left out)."""
    model, step = make()
    point = model.initial_point()
    for _ in range(3):
        point, _ = step.step(point)
    state = step.sampling_state
    assert state._pending_tuning.held is not None
    after, stats = step.step(point)
    tuned = step.sampling_state
    assert not equal_dataclass_values(tuned._pending_tuning, state._pending_tuning)
    step.reset_tuning()
    assert not equal_dataclass_values(state, step.sampling_state)
    step.sampling_state = state
    assert equal_dataclass_values(state, step.sampling_state)
    again, stats_again = step.step(point)  # the restored state replays the step exactly
    assert stats_again[0]["scaling"] == stats[0]["scaling"] != state.adapter.scaling
    for name in after:
        np.testing.assert_array_equal(again[name], after[name])
    assert step.adapter == tuned.adapter  # the held update (not the later one) was applied


def test_sampling_state_round_trips_and_compares():
    with _model():
        step = PenaltyMetropolis(noise_sd=1.0, clip=ClipPolicy("auto", mode="metric"))
        pm.sample(
            draws=5,
            tune=30,
            chains=1,
            step=step,
            progressbar=False,
            random_seed=2,
            compute_convergence_checks=False,
        )
    state = step.sampling_state
    assert equal_dataclass_values(state, step.sampling_state)  # crashed on plain dataclasses
    step.reset_tuning()
    assert not equal_dataclass_values(state, step.sampling_state)
    step.sampling_state = state
    assert equal_dataclass_values(state, step.sampling_state)
    assert step.clip == state.clip


def test_scaling_comes_back_exactly():
    with _model():
        step = PenaltyMetropolis(noise_sd=1.0, scaling=0.1)
    assert step.adapter.scaling == 0.1


def test_accepted_is_float64_as_in_pm_metropolis():
    """PyMC 5.28's Metropolis records ``accepted`` as float64 (the mean over its blocks)."""
    from pymc_penalty.variants import ExpFamPenaltyMetropolis, MultiOwnerPenaltyMetropolis

    expected = pm.Metropolis.stats_dtypes_shapes["accepted"]
    assert expected[0] is np.float64
    for cls in (PenaltyMetropolis, MultiOwnerPenaltyMetropolis, ExpFamPenaltyMetropolis):
        assert cls.stats_dtypes_shapes["accepted"] == expected
    with _model():
        step = PenaltyMetropolis(noise_sd=1.0)
        idata = pm.sample(
            draws=40, tune=0, chains=1, step=step, random_seed=3, progressbar=False,
            compute_convergence_checks=False,
        )  # fmt: skip
    accepted = idata.sample_stats["accepted"].values
    assert accepted.dtype == np.float64
    assert set(np.unique(accepted)) <= {0.0, 1.0} and 0.0 < accepted.mean() < 1.0


def test_tune_interval_is_a_deprecated_name_of_adapt_window():
    """``tune_interval`` means something else in pm.Metropolis (steps between scaling
    updates): the window length is ``ProposalPolicy.adapt_window``; the old names still
    work, warned."""
    with _model():
        new = PenaltyMetropolis(noise_sd=1.0, proposal=ProposalPolicy(adapt_window=37))
        with pytest.warns(FutureWarning, match="`tune_interval` is renamed `adapt_window`"):
            old = PenaltyMetropolis(noise_sd=1.0, tune_interval=37)
        with pytest.warns(FutureWarning, match="`adapt_window` is deprecated"):
            flat = PenaltyMetropolis(noise_sd=1.0, adapt_window=37)
        default = PenaltyMetropolis(noise_sd=1.0)
        assert new.adapter.window == old.adapter.window == flat.adapter.window == 37
        assert default.adapter.window == 100
        with pytest.raises(ValueError, match="`adapt_window` and `tune_interval` both set"):
            PenaltyMetropolis(noise_sd=1.0, adapt_window=37, tune_interval=37)
        with pytest.raises(ValueError, match="`ProposalPolicy.adapt_window` must be an integer"):
            PenaltyMetropolis(noise_sd=1.0, proposal=ProposalPolicy(adapt_window=0))
        with (
            pytest.warns(FutureWarning, match="tune_interval"),
            pytest.raises(ValueError, match="given as the deprecated `tune_interval`"),
        ):
            PenaltyMetropolis(noise_sd=1.0, tune_interval=2.5)


def test_blocked_false_is_refused_with_the_reason():
    with _model():
        with pytest.raises(ValueError, match="one private release per step") as err:
            PenaltyMetropolis(noise_sd=1.0, blocked=False)
    assert "privacy cost" in str(err.value)
