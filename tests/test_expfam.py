"""ExpFamPenaltyMetropolis: exactness, likelihood recognition, ledger protocol, O(1) steps."""

from __future__ import annotations

import time

import numpy as np
import pymc as pm
import pytest
from conftest import posterior_check
from scipy import stats

from pymc_penalty import InvalidArgumentError, ModelNotPrivateError, PrivacyPolicy
from pymc_penalty.variants import ExpFamPenaltyMetropolis

QUIET = dict(progressbar=False, compute_convergence_checks=False)


def _sample(model, step, draws=4000, tune=1000, seed=3):
    with model:
        return pm.sample(draws=draws, tune=tune, chains=2, step=step, random_seed=seed, **QUIET)


def test_poisson_gamma_exact():
    y = np.random.default_rng(1).poisson(3.0, size=200)
    with pm.Model() as model:
        lam = pm.Gamma("lam", 2.0, 1.0)
        pm.Poisson("y", lam, observed=y)
        step = ExpFamPenaltyMetropolis(data_bound=50, xi=400.0, reproducible_noise=True)
    idata = _sample(model, step)
    a, b = 2.0 + y.sum(), 1.0 + y.size
    ok, msg = posterior_check(idata.posterior["lam"].values, stats.gamma(a, scale=1 / b).cdf, a / b)
    assert ok, msg
    assert np.all(idata.sample_stats["dp_noise_sd"].values > 0)


@pytest.mark.slow
def test_add_remove_releases_the_count_and_stays_exact():
    # Under add/remove-one, n is released with S: the noise variance gains (A' - A)^2 xi, which
    # dominates here (|d log lam| << |d lam|), so a wrong penalty would bias the chain.
    y = np.random.default_rng(1).poisson(3.0, size=200)
    with pm.Model() as model:
        lam = pm.Gamma("lam", 2.0, 1.0)
        pm.Poisson("y", lam, observed=y)
        step = ExpFamPenaltyMetropolis(
            data_bound=50,
            xi=400.0,
            privacy=PrivacyPolicy("add_remove", min_rows=100, reproducible_noise=True),
        )
    assert step.sensitivity == pytest.approx(np.hypot(50.0, 1.0))
    idata = _sample(model, step)
    a, b = 2.0 + y.sum(), 1.0 + y.size
    ok, msg = posterior_check(idata.posterior["lam"].values, stats.gamma(a, scale=1 / b).cdf, a / b)
    assert ok, msg
    assert float(np.median(idata.sample_stats["dp_noise_sd"].values)) > 1.0


@pytest.mark.slow
def test_dirichlet_multinomial_exact():
    y = np.random.default_rng(4).multinomial(4, [0.2, 0.3, 0.5], size=60)
    bad = y.copy()
    bad[0] = [5, -1, 0]  # not a count vector: counted as clipped, not refused (issue 28)
    with pm.Model():
        p = pm.Dirichlet("p", np.ones(3))
        pm.Multinomial("y", n=4, p=p, observed=bad)
        step = ExpFamPenaltyMetropolis(xi=4.0, reproducible_noise=True)
    assert step._clipped_fraction_exact == pytest.approx(1 / bad.shape[0])
    y = y[1:]
    with pm.Model() as model:
        p = pm.Dirichlet("p", np.ones(3))
        pm.Multinomial("y", n=4, p=p, observed=y)
        step = ExpFamPenaltyMetropolis(xi=4.0, reproducible_noise=True)
    assert step.family == "multinomial" and step.sensitivity == pytest.approx(4 * 2**0.5)
    assert step._clipped_fraction_exact == 0.0
    idata = _sample(model, step)
    alpha = 1.0 + y.sum(axis=0)
    a, b = alpha[0], alpha.sum() - alpha[0]
    draws = idata.posterior["p"].values[..., 0]
    ok, msg = posterior_check(draws, stats.beta(a, b).cdf, a / (a + b))
    assert ok, msg


def test_beta_bernoulli_exact():
    y = (np.random.default_rng(2).random(150) < 0.3).astype(int)
    with pm.Model() as model:
        p = pm.Beta("p", 2.0, 2.0)
        pm.Bernoulli("y", p=p, observed=y)
        step = ExpFamPenaltyMetropolis(mu=0.5, reproducible_noise=True)
    idata = _sample(model, step)
    a, b = 2.0 + y.sum(), 2.0 + y.size - y.sum()
    ok, msg = posterior_check(idata.posterior["p"].values, stats.beta(a, b).cdf, a / (a + b))
    assert ok, msg
    np.testing.assert_allclose(idata.sample_stats["dp_mu"].values, 0.5)


def test_normal_normal_exact():
    y = np.random.default_rng(3).normal(1.5, 2.0, size=100)
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, 10.0)
        pm.Normal("y", m, 2.0, observed=y)
        step = ExpFamPenaltyMetropolis(data_bound=20.0, xi=100.0, reproducible_noise=True)
    idata = _sample(model, step)
    prec = 1 / 100 + y.size / 4.0
    mean = (y.sum() / 4.0) / prec
    ok, msg = posterior_check(idata.posterior["m"].values, stats.norm(mean, prec**-0.5).cdf, mean)
    assert ok, msg


def _family_models():
    rng = np.random.default_rng(4)
    with pm.Model() as poisson:
        lam = pm.Gamma("lam", 2.0, 1.0)
        pm.Poisson("y", lam, observed=rng.poisson(2.0, 30))
    with pm.Model() as bern_logit:
        b = pm.Normal("b", 0.0, 1.0)
        pm.Bernoulli("y", logit_p=b, observed=rng.integers(0, 2, 30))
    with pm.Model() as binomial:
        p = pm.Beta("p", 1.0, 1.0)
        pm.Binomial("y", 7, p, observed=rng.binomial(7, 0.4, 30))
    with pm.Model() as normal:
        m = pm.Normal("m", 0.0, 1.0)
        pm.Normal("y", 2.0 * m, 1.5, observed=rng.normal(0.0, 1.5, 30))
    with pm.Model() as expo:
        lam = pm.Gamma("lam", 2.0, 1.0)
        pm.Exponential("y", lam, observed=rng.exponential(1.0, 30))
    with pm.Model() as gamma:
        beta = pm.Gamma("beta", 2.0, 1.0)
        pm.Gamma("y", 3.0, beta, observed=rng.gamma(3.0, 1.0, 30))
    with pm.Model() as cat:
        pv = pm.Dirichlet("pv", np.ones(4))
        pm.Categorical("y", p=pv, observed=rng.integers(0, 4, 30))
    with pm.Model() as multi:
        pv = pm.Dirichlet("pv", np.ones(3))
        pm.Multinomial("y", n=5, p=pv, observed=rng.multinomial(5, [0.2, 0.3, 0.5], 30))
    return {
        "poisson": (poisson, 100.0),
        "bernoulli": (bern_logit, None),
        "binomial": (binomial, None),
        "normal": (normal, 100.0),
        "exponential": (expo, 100.0),
        "gamma": (gamma, 100.0),
        "categorical": (cat, None),
        "multinomial": (multi, None),
    }


@pytest.mark.parametrize(
    "family",
    [
        pytest.param(f, marks=pytest.mark.slow) if f == "categorical" else f
        for f in sorted(_family_models())
    ],
)
@pytest.mark.slow
def test_statistic_difference_equals_model_loglik_difference(family):
    model, bound = _family_models()[family]
    with model:
        step = ExpFamPenaltyMetropolis(family=family, data_bound=bound, xi=1.0, rng=0)
    assert step.family == family
    obs_logp = model.compile_logp(vars=model.observed_RVs, jacobian=False)
    ip = model.initial_point()
    rng = np.random.default_rng(5)
    from pymc.blocking import DictToArrayBijection

    x0 = DictToArrayBijection.map(ip)
    for _ in range(3):
        x1 = x0.data + 0.3 * rng.standard_normal(x0.data.size)
        p1 = DictToArrayBijection.rmap(x0._replace(data=x1), ip)
        _, phi0, a0 = step._eval(x0.data)
        _, phi1, a1 = step._eval(x1)
        d = float((phi1 - phi0) @ step._S) - step._n * (a1 - a0)
        np.testing.assert_allclose(d, obs_logp(p1) - obs_logp(ip), rtol=1e-8, atol=1e-8)


class _Refuse:
    def __init__(self):
        self.calls = 0

    def try_spend(self, mu2):
        self.calls += 1
        return False


class _Untouchable:
    """Stands in for the exact statistic: any use fails the test."""

    def __getattr__(self, name):
        raise AssertionError(f"the sufficient statistic was used ({name})")

    def __add__(self, other):
        raise AssertionError("the sufficient statistic was used")

    __radd__ = __rmatmul__ = __matmul__ = __array__ = __add__


def test_refused_ledger_never_touches_the_statistic():
    y = np.random.default_rng(6).poisson(3.0, size=50)
    with pm.Model() as model:
        lam = pm.Gamma("lam", 2.0, 1.0)
        pm.Poisson("y", lam, observed=y)
        ledger = _Refuse()
        step = ExpFamPenaltyMetropolis(data_bound=20, mu=0.3, ledger=ledger, rng=1)
    step._S = _Untouchable()
    point = model.initial_point()
    for _ in range(5):
        new, st = step.step(point)
        assert st[0]["dp_released"] is False or st[0]["dp_released"] == np.False_
        assert st[0]["dp_mu"] == 0.0 and not st[0]["accepted"]
        np.testing.assert_array_equal(new["lam_log__"], point["lam_log__"])
    assert ledger.calls == 5


def test_accepting_ledger_is_charged_mu_squared_per_release():
    spent = []

    class _Log:
        def try_spend(self, mu2):
            spent.append(mu2)
            return True

    y = np.random.default_rng(6).poisson(3.0, size=50)
    with pm.Model() as model:
        lam = pm.Gamma("lam", 2.0, 1.0)
        pm.Poisson("y", lam, observed=y)
        step = ExpFamPenaltyMetropolis(data_bound=20, mu=0.3, ledger=_Log(), rng=1)
    point = model.initial_point()
    for _ in range(4):
        point, st = step.step(point)
        assert st[0]["dp_released"]
        assert np.isnan(st[0]["dp_clipped_fraction"])  # private mode
    np.testing.assert_allclose(spent, [0.09] * 4)
    # sensitivity = data_bound, xi = (Delta / mu)^2
    assert step.sensitivity == 20.0
    np.testing.assert_allclose(step.xi, (20.0 / 0.3) ** 2)


def test_normal_sensitivity_follows_neighbours():
    with pm.Model():
        m = pm.Normal("m", 0.0, 1.0)
        pm.Normal("y", m, 1.0, observed=np.zeros(10))
        sub = ExpFamPenaltyMetropolis(data_bound=3.0, mu=1.0)
        add = ExpFamPenaltyMetropolis(
            data_bound=3.0, mu=1.0, privacy=PrivacyPolicy("add_remove", min_rows=10)
        )
    # Add/remove also releases the count n: the statistic is (y, 1), of norm <= hypot(3, 1).
    assert sub.sensitivity == 6.0 and add.sensitivity == pytest.approx(10**0.5)


def test_add_remove_needs_min_rows_and_refuses_the_same_for_n_and_n_plus_one():
    """Under add/remove-one the step needs ``min_rows``, a public lower bound on the rows, as
    every step does (issue 28): the refusal is the same for n and n + 1 rows and never prints
    n; with the bound the step is built and reports it. ``released_rows`` does not apply."""
    messages = []
    for n in (23, 24):
        with pm.Model():
            m = pm.Normal("m", 0.0, 1.0)
            pm.Normal("y", m, 1.0, observed=np.zeros(n))
            with pytest.raises(InvalidArgumentError, match="min_rows") as info:
                ExpFamPenaltyMetropolis(data_bound=3.0, mu=1.0, privacy=PrivacyPolicy("add_remove"))
            messages.append(str(info.value))
            step = ExpFamPenaltyMetropolis(
                data_bound=3.0, mu=1.0, privacy=PrivacyPolicy("add_remove", min_rows=20)
            )
            assert step.min_rows == 20
            with pytest.raises(ModelNotPrivateError, match="min_rows"):
                ExpFamPenaltyMetropolis(
                    data_bound=3.0, mu=1.0, privacy=PrivacyPolicy("add_remove", min_rows=30)
                )
            with pytest.raises(InvalidArgumentError, match="released_rows"):
                ExpFamPenaltyMetropolis(
                    data_bound=3.0,
                    mu=1.0,
                    privacy=PrivacyPolicy("add_remove", min_rows=20, released_rows=20.0),
                )
    assert messages[0] == messages[1]
    assert not any(str(n) in text for n in (23, 24) for text in messages)


def _poisson_step(n):
    y = np.random.default_rng(7).poisson(3.0, size=n)
    with pm.Model() as model:
        lam = pm.Gamma("lam", 2.0, 1.0)
        pm.Poisson("y", lam, observed=y)
        step = ExpFamPenaltyMetropolis(data_bound=30, xi=1.0, rng=2)
    return model, step


def _time_steps(model, step, k=300):
    point = model.initial_point()
    best = np.inf
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(k):
            point, _ = step.step(point)
        best = min(best, (time.perf_counter() - t0) / k)
    return best


def test_step_is_o1_in_n():
    n = 1_000_000
    model_big, big = _poisson_step(n)
    # Structurally: the step keeps no array of size n, and its compiled function holds none.
    for name, value in vars(big).items():
        if isinstance(value, np.ndarray):
            assert value.size < 100, name
    for const in big._fn.maker.fgraph.variables:
        data = getattr(const, "data", None)
        if data is not None:
            assert np.size(data) < 100
    for inp in big._fn.maker.fgraph.inputs:
        assert inp.type.ndim <= 1
    model_small, small = _poisson_step(1000)
    t_big, t_small = _time_steps(model_big, big), _time_steps(model_small, small)
    assert t_big < 3.0 * t_small + 1e-4, (t_big, t_small)


def test_errors_name_the_argument():
    y = np.random.default_rng(8).poisson(3.0, size=20)
    with pm.Model():
        lam = pm.Gamma("lam", 2.0, 1.0)
        pm.Poisson("y", lam, observed=y)
        with pytest.raises(ValueError, match="`data_bound`"):
            ExpFamPenaltyMetropolis(xi=1.0)
        with pytest.raises(ValueError, match="`family`"):
            ExpFamPenaltyMetropolis(family="weibull", data_bound=5, xi=1.0)
        with pytest.raises(ValueError, match="`family`"):
            ExpFamPenaltyMetropolis(family="normal", data_bound=5, xi=1.0)
        with pytest.raises(ValueError, match="`xi`"):
            ExpFamPenaltyMetropolis(data_bound=5)
        with pytest.raises(ValueError, match="`xi`"):
            ExpFamPenaltyMetropolis(data_bound=5, xi=-1.0)
    with pm.Model():
        m = pm.Normal("m")
        pm.StudentT("y", nu=3, mu=m, observed=y.astype(float))
        with pytest.raises(ValueError, match="not a supported exponential family"):
            ExpFamPenaltyMetropolis(data_bound=5, xi=1.0)
    with pm.Model():
        m = pm.Normal("m")
        s = pm.HalfNormal("s")
        pm.Normal("y", m, s, observed=y.astype(float))
        with pytest.raises(ValueError, match="must be a constant"):
            ExpFamPenaltyMetropolis(data_bound=5, xi=1.0)
    with pm.Model():
        b = pm.Normal("b", shape=20)
        pm.Poisson("y", pm.math.exp(b), observed=y)
        with pytest.raises(ValueError, match="one scalar shared"):
            ExpFamPenaltyMetropolis(data_bound=5, xi=1.0)
    with pm.Model():
        b = pm.Normal("b")  # a per-row array in the parameter carries records: refused
        pm.Poisson("y", pm.math.exp(b * np.arange(20.0)), observed=y)
        with pytest.raises(ModelNotPrivateError, match="depends on data"):
            ExpFamPenaltyMetropolis(data_bound=5, xi=1.0)
    with pm.Model():
        lam = pm.Gamma("lam", 2.0, 1.0)
        pm.Poisson("y", lam, observed=y)
        pm.Poisson("z", lam, observed=y)
        with pytest.raises(ModelNotPrivateError, match="exactly one observed"):
            ExpFamPenaltyMetropolis(data_bound=5, xi=1.0)


def test_out_of_support_proposals_are_ordinary_rejections_not_refusals():
    """dp_released=False means "refused by the ledger" (it stops the run and trims the
    result); a proposal outside a data-free Potential's support must not look like one."""
    y = np.random.default_rng(8).poisson(2.0, size=200)
    with pm.Model() as model:
        lam = pm.Gamma("lam", alpha=2.0, beta=1.0)
        pm.Poisson("y", lam, observed=y)
        pm.Potential("upper", pm.math.switch(lam < 2.2, 0.0, -np.inf))
        step = ExpFamPenaltyMetropolis(xi=1.0, data_bound=20.0, scaling=2.0, tune=False, rng=2)
    point = model.initial_point()
    point["lam_log__"] = np.log(2.0)
    rejected = 0
    for _ in range(100):
        point, st = step.step(point)
        assert st[0]["dp_released"]
        assert float(np.exp(point["lam_log__"])) < 2.2
        rejected += not st[0]["accepted"]
    assert rejected > 0


def test_report_describes_the_sufficient_statistic_bound():
    from pymc_penalty import PrivacyBudget, build_report

    with pm.Model():
        lam = pm.Gamma("lam", 2.0, 1.0)
        pm.Poisson("y", lam, observed=np.arange(5))
        step = ExpFamPenaltyMetropolis(data_bound=20, mu=0.3)
    report = build_report(
        step=step,
        budget=PrivacyBudget(1.0, 1e-5),
        spent_mu2=0.09,
        releases_by_chain={0: 1},
        clipped_fraction=float("nan"),
    )
    assert report["dp_sensitivity"] == "sufficient statistic (poisson): Delta = 20"
    assert report["dp_noise_private"] == 1
