"""pp.sample's defaults after a private warm start: its metric is kept through tuning (only
the scaling adapts, from 2.38 / sqrt(d), then freezes), each chain starts at its own draw from
the warm start's Gaussian approximation, and ``warm_start`` / ``tune`` default to rules."""

import math

import numpy as np
import pymc as pm
import pytest

import pymc_penalty as pp
import pymc_penalty.api as api
import pymc_penalty.budgeted as budgeted
import pymc_penalty.planning.plan as sample_plan
from pymc_penalty.errors import InvalidArgumentError
from pymc_penalty.sampling.step import PenaltyMetropolis as LowLevelStep
from pymc_penalty.warmstart import WarmStart


def _regression(n: int = 3000, seed: int = 3) -> pm.Model:
    """A Gaussian regression with features on scales 0.2 to 5 (an anisotropic posterior)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3)) * np.array([0.2, 1.0, 5.0])
    y = X @ np.array([1.0, -0.5, 0.2]) + rng.normal(size=n)
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 10.0, shape=3)
        pm.Normal("y", mu=pm.math.dot(X, b), sigma=1.0, observed=y)
    return model


def _recorded_run(monkeypatch, step_kwargs=None, **kwargs):
    """Run pp.sample, recording the warm start and each chain's last proposal factor."""
    warm_starts: list[WarmStart] = []
    chols: dict[int, np.ndarray] = {}
    real_warm_start = budgeted.private_warm_start

    def recording_warm_start(*args, **kw):
        warm_starts.append(real_warm_start(*args, **kw))
        return warm_starts[-1]

    class Recording(LowLevelStep):  # what pp.sample builds
        def astep(self, q0):
            out = super().astep(q0)
            chols[id(self)] = self.adapter.chol.copy()
            return out

    monkeypatch.setattr(budgeted, "private_warm_start", recording_warm_start)
    monkeypatch.setattr(api, "PenaltyMetropolis", Recording)
    with _regression():
        idata = pp.sample(
            method="penalty",
            epsilon=6.0,
            delta=1e-5,
            draws=100,
            chains=2,
            cores=1,
            random_seed=5,
            progressbar=False,
            compute_convergence_checks=False,
            discard_tuned_samples=False,
            step_kwargs=step_kwargs,
            **kwargs,
        )
    return idata, warm_starts, list(chols.values())


def test_warm_start_metric_is_kept_and_only_the_scaling_tunes(monkeypatch):
    idata, warm_starts, chols = _recorded_run(monkeypatch)
    # warm_start="auto" spent 0.2 here (a forecast better than hopeless), tune="auto" a tenth
    # of the draws within [100, 1000].
    assert idata.attrs["dp_warm_start_share"] == pytest.approx(0.2)
    assert idata.attrs["dp_tune"] == 100
    assert idata.warmup_posterior.sizes["draw"] == 100
    (warm,) = warm_starts
    metric = sample_plan.positive_definite(warm.covariance)
    assert chols, "no step ran"
    for chol in chols:
        np.testing.assert_allclose(chol @ chol.T, metric, rtol=1e-9, atol=0.0)
    # The scaling starts at the random-walk scale and is frozen after tuning.
    scaling = idata.warmup_sample_stats["scaling"].values
    np.testing.assert_allclose(scaling[:, 0], 2.38 / math.sqrt(3), rtol=1e-12)
    drawn = idata.sample_stats["scaling"].values
    assert np.all(drawn == drawn[:, :1])
    assert np.all(np.abs(np.log(drawn[:, 0] / scaling[:, 0])) > 1e-6)  # it did tune


def test_must_fail_control_full_adaptation_replaces_the_warm_start_metric(monkeypatch):
    """The rule before: the chain's covariance replaced the warm start's at each window end
    (tuned for 200 steps, as ``tune="auto"`` did then: 100 here end no window with enough
    accepted moves to replace it)."""
    _, warm_starts, chols = _recorded_run(monkeypatch, step_kwargs={"adapt": "full"}, tune=200)
    metric = sample_plan.positive_definite(warm_starts[0].covariance)
    assert chols
    for chol in chols:
        assert not np.allclose(chol @ chol.T, metric, rtol=1e-3, atol=0.0)


def _warm(point, cov) -> WarmStart:
    point = np.asarray(point, dtype=float)
    initvals = {"a": point[:1].copy(), "b_log__": point[1:].reshape(1, 2).copy()}
    return WarmStart(
        point=point,
        covariance=np.asarray(cov),
        initvals=initvals,
        mu=1.0,
        releases=1,
        clip=3.0,
        metric_clip=0.03,
        clipped_fraction=None,
        clip_history=(3.0,),
    )


def test_chain_starts_are_draws_from_the_warm_start_approximation_centred_on_its_point():
    cov = np.array([[4.0, 1.0, 0.0], [1.0, 1.0, -0.3], [0.0, -0.3, 0.25]])
    warm = _warm([1.0, -2.0, 0.5], cov)

    def raveled(starts):
        return np.array([np.concatenate([s["a"], s["b_log__"].ravel()]) for s in starts])

    # The starts' mean is the point itself, for any number of chains (one: the point).
    for chains in (1, 2, 4, 7):
        x = raveled(sample_plan.chain_starts(warm, chains, random_seed=3))
        np.testing.assert_allclose(x.mean(axis=0), warm.point, rtol=0, atol=1e-12)
    # Each start is marginally N(point, cov): the first of four chains over 4000 seeds, mean
    # within 4 standard errors and covariance entries within 4 of theirs (Wishart). Must-fail
    # control: centred offsets without the sqrt(chains / (chains - 1)) rescaling have
    # covariance 3/4 of cov, which the same check refuses.
    reps = 4000
    first = raveled([sample_plan.chain_starts(warm, 4, random_seed=s)[0] for s in range(reps)])
    assert first.shape == (reps, 3)
    se = np.sqrt(np.diag(cov) / reps)
    assert np.all(np.abs(first.mean(axis=0) - warm.point) < 4 * se)
    se_cov = np.sqrt((cov**2 + np.outer(np.diag(cov), np.diag(cov))) / reps)
    emp = np.cov(first, rowvar=False)
    assert np.all(np.abs(emp - cov) < 4 * se_cov)
    assert not np.all(np.abs(0.75 * emp - cov) < 4 * se_cov)
    # Seeded: reproducible; different seeds, different starts.
    starts = sample_plan.chain_starts(warm, 2, random_seed=11)
    again = sample_plan.chain_starts(warm, 2, random_seed=11)
    np.testing.assert_array_equal(again[1]["a"], starts[1]["a"])
    other = sample_plan.chain_starts(warm, 2, random_seed=12)
    assert not np.array_equal(other[0]["a"], starts[0]["a"])


def test_chain_starts_survive_a_covariance_that_lost_definiteness_to_rounding():
    v = np.array([1.0, 1.0, 1.0]) / math.sqrt(3.0)
    cov = 1e8 * np.outer(v, v) - 1e-9 * np.eye(3)  # rank one, slightly indefinite
    starts = sample_plan.chain_starts(_warm([0.0, 0.0, 0.0], cov), 3, random_seed=1)
    assert all(np.all(np.isfinite(s["a"])) for s in starts)


@pytest.mark.parametrize(
    ("tune", "draws", "share", "expected"),
    [
        ("auto", 1000, 0.2, 100),
        ("auto", 100, 0.2, 100),
        ("auto", 4000, 0.2, 400),
        ("auto", 20000, 0.2, 1000),
        ("auto", 1000, 0.0, 1000),
        (50, 1000, 0.2, 50),
    ],
)
def test_auto_tune_is_a_tenth_of_the_draws_after_a_warm_start(tune, draws, share, expected):
    assert sample_plan.resolve_tune(tune, draws, share) == expected


@pytest.mark.parametrize(
    ("chains", "share", "ess", "expected"),
    [
        ("auto", 0.2, 2.0, 8),  # a warm start and at least 2 forecast effective draws
        ("auto", 0.2, 19.9, 8),
        ("auto", 0.2, 20.0, 4),  # the chains mix: their number no longer matters
        ("auto", 0.2, 50.0, 4),
        ("auto", 0.2, 1.99, 4),  # a small budget: fewer chains correct the warm start more
        ("auto", 0.2, None, 4),  # no forecast (add/remove-one before the released count)
        ("auto", 0.0, 50.0, 4),  # no warm start: the chains travel from one point
        (3, 0.2, 50.0, 3),
        (6, 0.0, None, 6),
    ],
)
def test_auto_chains_rule(chains, share, ess, expected):
    assert sample_plan.resolve_chains(chains, share, ess) == expected


def _normal_mean(n: int):
    y = np.random.default_rng(0).normal(1.0, 1.0, size=n)
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, 5.0)
        pm.Normal("y", m, 1.0, observed=y)
    return model


@pytest.mark.parametrize(
    ("n", "epsilon", "extra", "chains"),
    [
        (3000, 4.0, {}, 8),  # forecast about 12 effective draws for 4 chains
        (30000, 6.0, {}, 4),  # well over 20: the chains mix
        (3000, 0.3, {}, 4),  # about 0.1
        (3000, 4.0, {"warm_start": 0}, 4),
        (3000, 4.0, {"chains": 3}, 3),
        # From the warm start's released count (min_rows: required, a public bound below n).
        (3000, 1.5, {"neighbours": "add_remove", "min_rows": 100}, 8),
    ],
)
@pytest.mark.slow
def test_pp_sample_resolves_auto_chains_from_the_forecast(n, epsilon, extra, chains):
    kwargs = dict(draws=50, tune=10, cores=1, progressbar=False, compute_convergence_checks=False)
    with _normal_mean(n):
        idata = pp.sample(
            method="penalty", epsilon=epsilon, delta=1e-5, random_seed=1, **kwargs, **extra
        )
    assert idata.posterior.sizes["chain"] == chains
    # The report's forecast is for the plan that ran, and the rule reads the 4-chain one.
    if "chains" not in extra and "warm_start" not in extra:
        assert (2.0 <= idata.attrs["dp_forecast_ess"] < 20.0) == (chains == 8)


def test_a_bad_chains_is_refused_naming_auto():
    with (
        _normal_mean(300),
        pytest.raises(InvalidArgumentError, match='`chains` must be an integer >= 1 or "auto"'),
    ):
        pp.sample(method="penalty", epsilon=4.0, delta=1e-5, chains="eight", draws=5, tune=5)


def test_auto_warm_start_rule():
    model = _regression(n=3000)
    sub = "substitute"
    assert sample_plan.resolve_warm_start("auto", model, {}, None, sub) == 0.2
    assert sample_plan.resolve_warm_start(0.35, model, {}, None, sub) == 0.35
    assert sample_plan.resolve_warm_start(0.0, model, {}, None, sub) == 0.0  # the opt-out
    # No warm start: initvals or owners given.
    assert sample_plan.resolve_warm_start("auto", model, {"initvals": {}}, None, sub) == 0.0
    assert sample_plan.resolve_warm_start("auto", model, {}, ["owner"], sub) == 0.0
    # Under add/remove-one too (its first step releases a noisy count of the private n):
    # without it the chains never reached the posterior (docstring: 12-45 against median 0.23 sd).
    adds = "add_remove"
    assert sample_plan.resolve_warm_start("auto", model, {}, None, adds) == 0.2
    with pytest.raises(ValueError):
        sample_plan.resolve_warm_start("auto", model, {}, None, "swap")
    # The budget is no input: a hopeless one still starts from the warm start (from the model's
    # initial point the chains never reach the posterior: 27.6 against 1.14 sd, docstring).
    hopeless = "substitute"
    assert sample_plan.resolve_warm_start("auto", model, {}, None, hopeless) == 0.2
