"""clip="auto": the clip constant found in tuning from the released (noisy) clipped counts."""

import numpy as np
import pymc as pm
import pytest

from pymc_penalty import PenaltyMetropolis, RunPlan
from pymc_penalty.sampling.adaptation import clip_target_fraction, starting_clip


def _logistic(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = rng.binomial(1, 1 / (1 + np.exp(-(X @ [1.0, -0.5]))))
    with pm.Model() as model:
        xd = pm.Data("X", X)
        b = pm.Normal("b", 0, 2, shape=2)
        pm.Bernoulli("y", logit_p=pm.math.dot(xd, b), observed=y)
    return model


def _run(model, step, draws, tune, chains=1, seed=1):
    with model:
        return pm.sample(
            draws,
            tune=tune,
            chains=chains,
            cores=1,
            step=step,
            progressbar=False,
            random_seed=seed,
            compute_convergence_checks=False,
            discard_tuned_samples=False,
        )


@pytest.mark.slow
def test_auto_clip_finds_a_clip_that_clips_about_the_target_fraction():
    # Started 10x too small and in the untuned metric: tuning must find the constant that
    # clips ~0.2% of rows in the tuned metric, from counts with noise of sd ~100 rows.
    n = 10_000
    model = _logistic(n)
    with model:
        step = PenaltyMetropolis(
            epsilon=10.0,
            delta=1e-5,
            plan=RunPlan(600, 1000, 1),
            clip="auto",
            clip_mode="metric",
            warm_start=0,  # the low-level start: the clip found from the untuned metric
            reproducible_noise=True,  # a fixed seed: the check is deterministic
        )
    target = clip_target_fraction(n)
    assert step.clip == pytest.approx(starting_clip(n, target))
    idata = _run(model, step, 600, 1000)
    clips = idata.sample_stats["dp_clip"].values[0]
    assert np.all(clips == clips[0]), "the clip must be frozen after tuning"
    assert clips[0] != pytest.approx(starting_clip(n, target))
    counts = idata.sample_stats["dp_clipped_count"].values[0]
    # Mean released count over the sampling phase, with its standard error from the count
    # noise (the dominant term): the true clipped fraction must be near the target.
    sd = float(np.median(idata.sample_stats["dp_noise_sd"].values))  # sanity: finite
    assert np.isfinite(sd)
    fraction = counts.mean() / n
    se = counts.std(ddof=1) / np.sqrt(counts.size) / n
    print(f"released clipped fraction {fraction:.2e} (se {se:.1e}, target {target:.1e})")
    assert fraction < 5 * target + 3 * se, (fraction, se)
    # The proposal starts at the posterior's 1/sqrt(n) scale, the metric the starting clip
    # assumes, so the found clip stays within a small factor of its start (from proposal sd 1
    # it had to climb 4x a window and then fall ~100x when the metric was first re-estimated).
    assert step._untuned_adapter.chol[0, 0] == pytest.approx(1 / np.sqrt(n))
    found = clips[0] / starting_clip(n, target)
    print(f"found clip / starting clip {found:.2f}")
    assert 0.25 < found < 8.0, found


def test_auto_clip_is_reset_with_the_proposal_and_frozen_without_tuning():
    model = _logistic(500)
    with model:
        # Proposal sd 1 (not the 1/sqrt(n) default): the starting clip then clips most of the
        # 500 rows, so tuning must move it (from the default start it may rightly stay put).
        step = PenaltyMetropolis(
            epsilon=10.0,
            delta=1e-5,
            plan=RunPlan(50, 100, 1),
            clip="auto",
            clip_mode="metric",
            S=np.ones(2),
            warm_start=0,  # the low-level found clip (a warm start would start it elsewhere)
        )
    start = step.clip
    _run(model, step, 50, 100)
    assert step.clip != start  # tuned from 500 rows mostly clipped at the start
    step.reset_tuning()
    assert step.clip == start
    with model:
        frozen = PenaltyMetropolis(
            epsilon=10.0,
            delta=1e-5,
            plan=RunPlan(50, 0, 1),
            clip="auto",
            clip_mode="metric",
            tune=False,
            warm_start=0,
        )
    idata = _run(model, frozen, 50, 0)
    assert np.all(idata.sample_stats["dp_clip"].values == frozen.clip)


def test_auto_clip_start_does_not_depend_on_n_under_add_remove():
    starts = []
    for n in (50, 51):
        with _logistic(n):
            step = PenaltyMetropolis(
                epsilon=1.0,
                delta=1e-5,
                plan=RunPlan(10, 10, 1),
                clip="auto",
                clip_mode="metric",
                neighbours="add_remove",
                min_rows=20,  # public, below both n
                warm_start=0,  # the found clip's own start (a warm start starts it elsewhere)
            )
        starts.append((step.clip, step.clip_adapter.n_rows))
    assert starts[0] == starts[1] == (1.0, None)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(clip="auto", clip_count_share=0.0), "clip_count_share"),
        (dict(clip="auto", clip_mode="lipschitz"), "lipschitz"),
        (dict(clip="automatic"), "clip"),
    ],
)
def test_auto_clip_arguments_are_checked_before_anything_is_spent(kwargs, match):
    with _logistic(100):
        with pytest.raises(ValueError, match=match):
            PenaltyMetropolis(epsilon=1.0, delta=1e-5, plan=RunPlan(10, 10, 1), **kwargs)
