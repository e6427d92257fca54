"""PenaltyMetropolis as a PyMC step: stats, errors, reproducibility, adaptation, float32."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pymc as pm
import pytensor
import pytest
from conftest import _mcse
from pymc.blocking import DictToArrayBijection

from pymc_penalty import (
    ClipPolicy,
    ModelNotPrivateError,
    NotPrivateWarning,
    PenaltyMetropolis,
    PrivacyPolicy,
)

QUIET = dict(progressbar=False, compute_convergence_checks=False)
#: Noise from the step's seeded generator (reproducible, not private).
SEEDED = PrivacyPolicy(reproducible_noise=True)


@pytest.fixture
def normal_model():
    rng = np.random.default_rng(0)
    y = rng.normal(1.0, 1.0, size=100)
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, 10.0)
        s = pm.HalfNormal("s", 2.0)
        pm.Normal("y", m, s, observed=y)
    return model


def test_stats_are_the_declared_ones_and_never_exact(normal_model):
    with normal_model:
        step = PenaltyMetropolis(mu=0.5, clip=2.0)
        idata = pm.sample(draws=50, tune=50, chains=1, step=step, random_seed=1, **QUIET)
    names = set(idata.sample_stats.data_vars)
    assert names == {
        "accept",
        "accepted",
        "scaling",
        "dp_noise_sd",
        "dp_sensitivity",
        "dp_mu",
        "dp_clipped_fraction",
        "dp_clipped_count",
        "dp_released",
        "proposal",
    }
    assert "lp" not in names and "model_logp" not in names
    st = idata.sample_stats
    # The proposal is a float vector per draw over the raveled (m, log s) space.
    assert st["proposal"].dims == ("chain", "draw", "proposal_dim_0")
    assert st["proposal"].shape == (1, 50, 2) and st["proposal"].dtype == np.float64
    np.testing.assert_allclose(st["dp_mu"].values, 0.5)
    # Delta = 2 * clip * ||step|| under substitution and sigma = Delta / mu_ll.
    mu_ll = 0.5 * np.sqrt(1 - 0.05)
    np.testing.assert_allclose(st["dp_noise_sd"].values, st["dp_sensitivity"].values / mu_ll)
    assert np.all((st["accept"].values >= 0) & (st["accept"].values <= 1))


def test_sensitivity_follows_the_neighbour_relation(normal_model):
    point = normal_model.initial_point()
    sens = {}
    for relation in ("substitute", "add_remove"):
        with normal_model:
            step = PenaltyMetropolis(
                noise_sd=1.0,
                clip=ClipPolicy(3.0, mode="constant"),
                privacy=PrivacyPolicy(neighbours=relation, min_rows=50),  # n = 100
                rng=5,
            )
        _, stats = step.step(point)
        sens[relation] = stats[0]["dp_sensitivity"]
    assert sens == {"substitute": 6.0, "add_remove": 3.0}


def test_clipped_fraction_is_noisy_when_private_and_exact_otherwise(normal_model):
    point = normal_model.initial_point()
    with normal_model:
        # A tiny constant bound clips every ratio: the exact fraction would be exactly 1.
        tiny = ClipPolicy(1e-9, mode="constant")
        private = PenaltyMetropolis(noise_sd=1.0, clip=tiny, rng=1)
        exact = PenaltyMetropolis(noise_sd=1.0, clip=tiny, privacy=SEEDED, rng=1)
    fractions = [private.step(point)[1][0]["dp_clipped_fraction"] for _ in range(5)]
    assert all(f != 1.0 for f in fractions)
    assert exact.step(point)[1][0]["dp_clipped_fraction"] == 1.0


@pytest.mark.slow
def test_noise_does_not_follow_random_seed_unless_reproducible(normal_model):
    def draws(seed, reproducible):
        with normal_model:
            privacy = PrivacyPolicy(reproducible_noise=reproducible)
            step = PenaltyMetropolis(noise_sd=3.0, clip=None, privacy=privacy)
            pm.sample(draws=30, tune=0, chains=1, step=step, random_seed=seed, **QUIET)
        # Read the noise stream itself: the published `accept` sits on a coarse grid
        # (pymc_penalty.privacy.precision), so two runs with other noise can publish the same.
        return step._noise().standard_normal(16)

    assert not np.array_equal(draws(7, False), draws(7, False))
    assert np.array_equal(draws(7, True), draws(7, True))
    assert not np.array_equal(draws(7, True), draws(8, True))


@pytest.mark.slow
def test_same_seed_same_draws_with_one_or_two_cores(normal_model):
    out = {}
    for cores in (1, 2):
        with normal_model:
            step = PenaltyMetropolis(noise_sd=1.0, clip=None, privacy=SEEDED)
            out[cores] = pm.sample(
                draws=100, tune=100, chains=2, cores=cores, step=step, random_seed=42, **QUIET
            )
    for var in ("m", "s"):
        np.testing.assert_array_equal(out[1].posterior[var].values, out[2].posterior[var].values)


def _noise_after_fork(step, point, conn):
    step.step(point)
    conn.send(step._noise().standard_normal())  # the stream's next privacy-noise draw
    conn.close()


def test_private_noise_differs_between_forked_copies(normal_model):
    """Forked workers must not replay their parent's noise stream (that would reveal the
    difference of two releases exactly). Same proposal stream, so only the noise differs."""
    import multiprocessing as mp

    point = normal_model.initial_point()
    with normal_model:
        step = PenaltyMetropolis(noise_sd=10.0, clip=None, scaling=0.01, rng=9)
    step.step(point)  # the parent has created its noise generator
    ctx = mp.get_context("fork")
    draws = []
    for _ in range(2):
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_noise_after_fork, args=(step, point, send))
        proc.start()
        draws.append(recv.recv())
        proc.join()
    step.step(point)
    draws.append(step._noise().standard_normal())
    # Read from the generator itself: the published `accept` sits on a coarse grid
    # (pymc_penalty.privacy.precision) and no longer shows the noise to full precision.
    assert len(set(draws)) == 3, draws


@pytest.mark.slow
def test_adaptation_reaches_a_far_badly_scaled_posterior():
    """Scales differ 1000x and the start is thousands of posterior sds away."""
    rng = np.random.default_rng(1)
    ya = rng.normal(3.0, 0.01, size=100)  # posterior sd 1e-3
    yb = rng.normal(30.0, 10.0, size=100)  # posterior sd 1
    with pm.Model():
        a = pm.Normal("a", 0.0, 100.0)
        b = pm.Normal("b", 0.0, 100.0)
        pm.Normal("ya", a, 0.01, observed=ya)
        pm.Normal("yb", b, 10.0, observed=yb)
        step = PenaltyMetropolis(noise_sd=1.0, clip=None, privacy=SEEDED)
        idata = pm.sample(draws=2000, tune=3000, chains=4, step=step, random_seed=2, **QUIET)
    import arviz as az

    truth = {"a": (ya.mean(), 0.01 / 10), "b": (yb.mean(), 1.0)}
    for var, (mean, sd) in truth.items():
        draws = idata.posterior[var].values
        assert abs(draws.mean() - mean) < 4 * _mcse(draws) + 0.01 * sd
        assert 0.8 < draws.std() / sd < 1.25
        assert float(az.ess(draws)) > 300
        assert float(az.rhat(draws)) < 1.05


def test_float32(normal_model):
    with pytensor.config.change_flags(floatX="float32"):
        rng = np.random.default_rng(0)
        with pm.Model():
            m = pm.Normal("m", 0.0, 10.0)
            pm.Normal("y", m, 1.0, observed=rng.normal(1.0, 1.0, size=50).astype("float32"))
            step = PenaltyMetropolis(noise_sd=1.0, clip=None, privacy=SEEDED)
            idata = pm.sample(draws=300, tune=300, chains=1, step=step, random_seed=1, **QUIET)
    assert idata.posterior["m"].dtype == np.float32
    assert abs(float(idata.posterior["m"].mean()) - 1.0) < 0.5


# --- clear errors ----------------------------------------------------------------------


def _assert_no_data_in(message: str, data: np.ndarray) -> None:
    for value in np.ravel(data)[:20]:
        assert f"{value:.4f}"[:6] not in message


def test_refuses_discrete_free_variables():
    with pm.Model():
        k = pm.Poisson("k", 3.0)
        pm.Normal("y", k, 1.0, observed=np.ones(5))
        with pytest.raises(ModelNotPrivateError, match="'k' is discrete"):
            PenaltyMetropolis(noise_sd=1.0)


def test_refuses_free_variables_left_to_other_steps(normal_model):
    with normal_model, pytest.raises(ModelNotPrivateError, match="'s_log__'"):
        PenaltyMetropolis([normal_model["m"]], noise_sd=1.0)


def test_refuses_potentials_that_depend_on_data():
    y = np.random.default_rng(0).normal(size=30)
    with pm.Model():
        m = pm.Normal("m", 0.0, 1.0)
        pm.Normal("y", m, 1.0, observed=y)
        pm.Potential("pen", -((m - y) ** 2).sum())
        with pytest.raises(ModelNotPrivateError, match="Potential 'pen'") as err:
            PenaltyMetropolis(noise_sd=1.0)
    _assert_no_data_in(str(err.value), y)


def test_accepts_data_free_potentials():
    with pm.Model():
        m = pm.Normal("m", 0.0, 1.0)
        pm.Normal("y", m, 1.0, observed=np.zeros(10))
        pm.Potential("constraint", pm.math.switch(m > -5, 0.0, -np.inf))
        PenaltyMetropolis(noise_sd=1.0)


def test_refuses_pm_data_in_potential():
    with pm.Model():
        x = pm.Data("x", np.arange(10.0))
        m = pm.Normal("m", 0.0, 1.0)
        pm.Normal("y", m * x, 1.0, observed=np.zeros(10))
        pm.Potential("pen", (m * x).sum())
        with pytest.raises(ModelNotPrivateError, match="Potential 'pen'"):
            PenaltyMetropolis(noise_sd=1.0)


def test_refuses_total_size():
    with pm.Model():
        m = pm.Normal("m", 0.0, 1.0)
        pm.Normal("y", m, 1.0, observed=np.zeros(10), total_size=1000)
        with pytest.raises(ModelNotPrivateError, match="total_size"):
            PenaltyMetropolis(noise_sd=1.0)


def test_refuses_imputed_missing_observations():
    y = np.array([0.1, np.nan, 0.3, 0.2])
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, 1.0)
        with pytest.warns(UserWarning):
            pm.Normal("y", m, 1.0, observed=y)
    with model, pytest.raises(ModelNotPrivateError, match="missing values"):
        PenaltyMetropolis(noise_sd=1.0)


def test_refuses_disagreeing_datapoint_axes():
    with pm.Model():
        m = pm.Normal("m", 0.0, 1.0)
        pm.Normal("y1", m, 1.0, observed=np.zeros(10))
        pm.Normal("y2", m, 1.0, observed=np.zeros(12))
        with pytest.raises(ModelNotPrivateError, match="leading"):
            PenaltyMetropolis(noise_sd=1.0)


def test_refuses_data_dependent_prior():
    y = np.random.default_rng(0).normal(size=20)
    with pm.Model():
        m = pm.Normal("m", pm.math.constant(y).mean(), 1.0)
        pm.Normal("y", m, 1.0, observed=y)
        with pytest.raises(ModelNotPrivateError, match="prior"):
            PenaltyMetropolis(noise_sd=1.0)


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(noise_sd=-1.0), "noise_sd"),
        (dict(noise_sd=np.inf), "noise_sd"),
        (dict(noise_sd=np.nan), "noise_sd"),
        (dict(mu=0.0), "mu"),
        (dict(mu=0.1, clip=-2.0), "clip"),
        (dict(noise_sd=1.0, clip=np.inf), "clip"),
        (dict(mu=0.1, clip=None), "clip"),
        (dict(noise_sd=1.0, mu=0.1), "noise_sd"),
        (dict(), "noise_sd"),
        (dict(noise_sd=1.0, scaling=0.0), "scaling"),
        (dict(noise_sd=1.0, privacy=PrivacyPolicy), "privacy"),
        (dict(noise_sd=1.0, proposal=3), "proposal"),
        (dict(noise_sd=1.0, S=np.ones(7)), "S"),
        (dict(noise_sd=1.0, proposal_dist=pm.CauchyProposal), "proposal_dist"),
        (dict(epsilon=1.0, delta=1e-5, clip=ClipPolicy(None)), "clip"),
        (dict(noise_sd=1.0, clip=ClipPolicy("auto", mode="lipschitz")), "clip"),
        (dict(noise_sd=1.0, clip=ClipPolicy("auto", count_share=0.0)), "ClipPolicy.count_share"),
        (dict(noise_sd=1.0, bogus=1), "bogus"),
    ],
)
def test_bad_arguments_name_the_argument(normal_model, kwargs, argument):
    with normal_model, pytest.raises(ValueError, match=f"`{argument}`"):
        PenaltyMetropolis(**kwargs)


def test_not_private_configurations_warn(normal_model):
    with normal_model:
        with pytest.warns(NotPrivateWarning, match="NOT differentially private"):
            PenaltyMetropolis(noise_sd=1.0, clip=None)
        with pytest.warns(NotPrivateWarning, match="reproducible"):
            PenaltyMetropolis(noise_sd=1.0, privacy=SEEDED)


def test_data_dependent_deterministic_warns():
    x = np.random.default_rng(0).normal(size=20)
    with pm.Model():
        b = pm.Normal("b", 0.0, 1.0)
        eta = pm.Deterministic("eta", b * x)
        pm.Normal("y", eta, 1.0, observed=np.zeros(20))
        with pytest.warns(NotPrivateWarning, match="'eta'"):
            PenaltyMetropolis(noise_sd=1.0)


def test_likelihood_errors_do_not_leak_data(normal_model):
    from pymc_penalty.errors import LikelihoodEvaluationError

    with normal_model:
        step = PenaltyMetropolis(noise_sd=1.0)
    with pytest.raises(LikelihoodEvaluationError) as err:
        step._lik.evaluate(np.zeros(2), np.zeros(3), 1.0)  # wrong cache length
    assert "y{" not in str(err.value) and "Inputs values" not in str(err.value)


def _bounded_logistic(n: int = 200):
    rng = np.random.default_rng(21)
    X = np.clip(rng.normal(size=(n, 3)), -1.0, 1.0)  # |x_ij| <= 1
    y = rng.binomial(1, 0.5, size=n)
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 1.0, shape=3)
        pm.Bernoulli("y", logit_p=pm.math.dot(X, beta), observed=y)
    return model


def test_lipschitz_bound_sets_an_l1_sensitivity_and_never_clips_when_true():
    # |d/dbeta_j log p(y | x, beta)| = |(y - sigmoid(x beta)) x_j| <= 1 when |x_j| <= 1.
    model = _bounded_logistic()
    point = model.initial_point()
    with model:
        step = PenaltyMetropolis(
            noise_sd=1.0, clip=ClipPolicy(1.0, mode="lipschitz"), privacy=SEEDED, rng=3
        )
    x0 = point["beta"]
    checked = 0
    for _ in range(50):
        before = point["beta"].copy()
        point, stats = step.step(point)
        assert stats[0]["dp_clipped_fraction"] == 0.0  # exact count in reproducible mode
        if stats[0]["accepted"]:
            # Substitute-one: Delta = 2 M ||theta' - theta||_1.
            l1 = np.abs(point["beta"] - before).sum()
            assert stats[0]["dp_sensitivity"] == pytest.approx(2.0 * l1, rel=1e-9)
            checked += 1
    assert checked > 0 and not np.array_equal(point["beta"], x0)


def test_a_false_lipschitz_claim_is_clipped_and_counted():
    model = _bounded_logistic()
    point = model.initial_point()
    with model:
        step = PenaltyMetropolis(
            noise_sd=1.0, clip=ClipPolicy(0.01, mode="lipschitz"), privacy=SEEDED, rng=3
        )
    fractions = [step.step(point)[1][0]["dp_clipped_fraction"] for _ in range(20)]
    assert max(fractions) > 0.5


def test_lipschitz_sensitivity_uses_the_l1_norm():
    from pymc_penalty.accounting.sensitivity import ClipMode, step_length
    from pymc_penalty.privacy.mechanism import clip_bound

    diff = np.array([0.3, -0.4, 0.0])
    assert step_length(ClipMode.LIPSCHITZ, diff) == pytest.approx(0.7)
    assert step_length(ClipMode.DISTANCE, diff) == pytest.approx(0.5)
    assert clip_bound(2.0, ClipMode.LIPSCHITZ, 0.7) == pytest.approx(1.4)


def _interleaved_accepts(copier) -> list[float]:
    rng = np.random.default_rng(0)
    X = rng.normal(size=500)
    y = 0.3 + 0.8 * X + rng.normal(size=500)
    with pm.Model():
        a = pm.Normal("a", 0, 2)
        b = pm.Normal("b", 0, 2)
        pm.Normal("y", a + b * X, 1.0, observed=y)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s1 = PenaltyMetropolis(
                noise_sd=1e-3, clip=None, privacy=SEEDED, S=np.full(2, 0.05), tune=False
            )
    s2 = copier(s1)
    s1.set_rng(np.random.default_rng(1))
    s2.set_rng(np.random.default_rng(2))
    qa = DictToArrayBijection.map({"a": np.array(0.3), "b": np.array(0.8)})
    qb = DictToArrayBijection.map({"a": np.array(-1.0), "b": np.array(2.0)})
    out = []
    for _ in range(20):
        qa, st = s1.astep(qa)
        out.append(st[0]["accept"])
        qb, st = s2.astep(qb)
        out.append(st[0]["accept"])
    return out


@pytest.mark.slow
def test_shallow_copies_of_a_step_never_compare_against_each_others_state():
    # The cached state lives with the per-row vectors in the shared PenaltyLikelihood: two
    # shallow copies alternating on different chains must give what independent copies give
    # (with the key on the step, each compared its proposal with the other's current point).
    assert _interleaved_accepts(copy.copy) == _interleaved_accepts(copy.deepcopy)


def test_same_shape_set_data_is_seen_by_the_cached_state():
    # pm.set_data with the same shape passes the layout check; after a rejected step the
    # cached vector still held the old rows (accept 3e-12 against 1.0 from a fresh step).
    rng = np.random.default_rng(0)
    y0 = rng.normal(size=200)
    kwargs = dict(noise_sd=1e-6, clip=None, S=np.full(1, 0.01), tune=False, privacy=SEEDED)
    with pm.Model() as model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yd = pm.Data("yd", y0)
        a = pm.Normal("a", 0, 5)
        pm.Normal("y", a, 1.0, observed=yd)
        step = PenaltyMetropolis(**kwargs)
    q = DictToArrayBijection.map({"a": np.array(0.0)})
    for seed in range(100):  # a rejected first step: the cache stays at q on the old rows
        step.set_rng(np.random.default_rng(seed))
        if np.array_equal(step.astep(q)[0].data, q.data):
            break
    with model:
        pm.set_data({"yd": y0 + 0.5})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fresh = PenaltyMetropolis(**kwargs)
    step.set_rng(np.random.default_rng(7))
    fresh.set_rng(np.random.default_rng(7))
    assert step.astep(q)[1][0]["accept"] == fresh.astep(q)[1][0]["accept"]
