"""The sampler's found clip starts from the warm start's released clip (issue 13).

After a warm start the found clip starts at its Gaussian-tail value and only rises; where the
rows' ratios have heavier tails, ``pymc_penalty.sample`` now starts it higher by the warm
start's own found gradient clip over that clip's Gaussian start, to the 0.75th power
(:func:`pymc_penalty.planning.plan.clip_tail`; released values only). Measured in
``sample_plan.CLIP_TAIL_POWER``'s comment; here the rule, its plumbing and its checks.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest
from scipy import stats

import pymc_penalty as pp
from pymc_penalty.errors import InvalidArgumentError
from pymc_penalty.planning import plan as sample_plan
from pymc_penalty.sampling.adaptation import clip_target_fraction, starting_clip
from pymc_penalty.warmstart import WarmStart, warm_start_clips

QUIET = dict(cores=1, progressbar=False, compute_convergence_checks=False)


def _warm(d: int, clip: float, found: bool = True, n_rows: float = 1000.0) -> WarmStart:
    """A warm start whose clip was found (a clipped count released) or given (none)."""
    return WarmStart(
        point=np.zeros(d),
        covariance=np.eye(d),
        initvals={},
        mu=1.0,
        releases=1,
        clip=clip,
        metric_clip=0.01,
        clipped_fraction=0.001 if found else None,
        clip_history=(clip,),
        n_rows=n_rows,
    )


@pytest.mark.parametrize("d", [1, 3, 10])
def test_clip_tail_is_the_warm_start_ratio_to_the_power(d):
    start, _ = warm_start_clips("auto", d)
    # A clip that stayed at its Gaussian start (the gauss and logistic workloads): exactly 1.
    assert sample_plan.clip_tail(_warm(d, start)) == 1.0
    # Twice the start: 2 ** 0.75.
    assert sample_plan.clip_tail(_warm(d, 2.0 * start)) == pytest.approx(2.0**0.75)
    # A given (not found) warm-start clip says nothing about the tails.
    assert sample_plan.clip_tail(_warm(d, 2.0 * start, found=False)) == 1.0
    # Never below 1 (the sampler's clip only rises from its start after a warm start).
    assert sample_plan.clip_tail(_warm(d, 0.5 * start)) == 1.0


@pytest.mark.parametrize("d", [1, 5, 10])
def test_clip_tail_is_measured_from_where_gaussian_scores_settle(d):
    """With ``mu n`` large the warm start aims below the start's 0.1% (here 1e-4, its
    floor), and its clip rises to that chi quantile on Gaussian scores: a ratio of 1 there."""
    start, _ = warm_start_clips("auto", d)
    n = 1e6  # mu = 1: target 0.002 * 1.2e4 / 1e6, floored at 1e-4
    assert clip_target_fraction(n, mu=1.0) == pytest.approx(1e-4)
    settled = float(np.sqrt(stats.chi2.isf(1e-4, d)))
    assert settled > 1.05 * start  # the case the rule is for
    assert sample_plan.clip_tail(_warm(d, settled, n_rows=n)) == pytest.approx(1.0)
    assert sample_plan.clip_tail(_warm(d, 1.5 * settled, n_rows=n)) == pytest.approx(1.5**0.75)
    # Control: measured from the start (the old rule), the same clip would count as a tail.
    assert (settled / start) ** sample_plan.CLIP_TAIL_POWER > 1.03


def _poisson(n: int = 2000):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(n, 2)) * 0.5
    y = rng.poisson(np.exp(0.5 + X @ np.array([0.8, -0.4])))
    with pm.Model() as model:
        b0 = pm.Normal("b0", 0.0, 2.0)
        b = pm.Normal("b", 0.0, 1.0, shape=2)
        pm.Poisson("y", pm.math.exp(b0 + pm.math.dot(X, b)), observed=y)
    return model


def test_the_step_starts_its_found_clip_at_tail_times_the_gaussian_start():
    model = _poisson()
    kwargs = dict(epsilon=2.0, delta=1e-5, plan=pp.RunPlan(10, 10, 1), clip="auto", model=model)
    kwargs["warm_start"] = 0  # the clip's own start (a warm start passes its clip_tail)
    with model:
        base = pp.PenaltyMetropolis(**kwargs)
        tailed = pp.PenaltyMetropolis(clip_tail=1.7, **kwargs)
    assert base.clip == pytest.approx(starting_clip(2000, clip_target_fraction(2000)), rel=1e-12)
    assert tailed.clip == pytest.approx(1.7 * base.clip, rel=1e-12)
    with pytest.raises(InvalidArgumentError, match="clip_tail"), model:
        pp.PenaltyMetropolis(clip_tail=0.9, **kwargs)


@pytest.mark.slow
def test_sample_passes_the_warm_starts_tail_to_the_step(monkeypatch):
    seen: dict = {}
    real_tail = sample_plan.clip_tail

    def recording_tail(warm):
        seen["warm"], seen["tail"] = warm, real_tail(warm)
        return seen["tail"]

    monkeypatch.setattr(sample_plan, "clip_tail", recording_tail)  # warm_step_kwargs' rule
    kwargs = dict(epsilon=4.0, delta=1e-5, draws=20, tune=10, chains=1, random_seed=2)
    with _poisson():
        idata = pp.sample(method="penalty", discard_tuned_samples=False, **kwargs, **QUIET)
    assert seen["tail"] == sample_plan.clip_tail(seen["warm"])
    first_clip = float(idata.warmup_sample_stats["dp_clip"].values[0, 0])
    gaussian = starting_clip(2000, clip_target_fraction(2000))
    assert first_clip == pytest.approx(seen["tail"] * gaussian, rel=1e-12)
    # Control: a value given in step_kwargs wins over the rule.
    with _poisson():
        idata = pp.sample(
            method="penalty",
            discard_tuned_samples=False,
            step_kwargs={"clip_tail": 1.0},
            **kwargs,
            **QUIET,
        )
    assert float(idata.warmup_sample_stats["dp_clip"].values[0, 0]) == pytest.approx(
        gaussian, rel=1e-12
    )
