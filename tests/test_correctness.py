"""The penalty chain targets the exact posterior: conjugate models and logistic regression.

Correctness runs use ``clip=None`` (exact, unbounded sensitivity) with a fixed noise sd and a
seeded noise stream, so every figure is reproducible. Each check is a KS test on draws thinned
to near-independence (p > 1e-3) and ``|mean - truth| < 4 MCSE``.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pymc as pm
import pytest
from conftest import _mcse, posterior_check, thinned
from scipy import stats

import pymc_penalty.sampling.step as step_module
from pymc_penalty import PenaltyMetropolis
from pymc_penalty.sampling.kernel import transition

SAMPLE_KWARGS = dict(
    draws=4000, tune=1000, chains=4, cores=1, progressbar=False, compute_convergence_checks=False
)


def beta_bernoulli():
    rng = np.random.default_rng(11)
    y = rng.binomial(1, 0.3, size=60)
    with pm.Model() as model:
        p = pm.Beta("p", 2.0, 3.0)
        pm.Bernoulli("y", p, observed=y)
    k = int(y.sum())
    post = stats.beta(2.0 + k, 3.0 + y.size - k)
    return model, "p", post


def normal_normal():
    rng = np.random.default_rng(12)
    y = rng.normal(1.5, 2.0, size=50)
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, 10.0)
        pm.Normal("y", m, 2.0, observed=y)
    prec = 1 / 10.0**2 + y.size / 2.0**2
    post = stats.norm((y.sum() / 2.0**2) / prec, prec**-0.5)
    return model, "m", post


def gamma_poisson():
    rng = np.random.default_rng(13)
    y = rng.poisson(4.0, size=40)
    with pm.Model() as model:
        lam = pm.Gamma("lam", alpha=2.0, beta=1.0)
        pm.Poisson("y", lam, observed=y)
    post = stats.gamma(2.0 + y.sum(), scale=1.0 / (1.0 + y.size))
    return model, "lam", post


MODELS = {"beta_bernoulli": beta_bernoulli, "normal_normal": normal_normal}
MODELS["gamma_poisson"] = gamma_poisson


def run_penalty(model, *, noise_sd, seed, penalty=True, **kwargs):
    """Sample with the step; ``penalty=False`` drops the penalty term from the acceptance test
    (the test of statistical power: the naive noisy test must be biased). The step module's
    transition is swapped for the run, so production code carries no test switch (cores=1)."""
    with model, pytest.MonkeyPatch.context() as patch:
        if not penalty:
            patch.setattr(step_module, "transition", partial(transition, penalty=False))
        step = PenaltyMetropolis(noise_sd=noise_sd, clip=None, reproducible_noise=True, **kwargs)
        return pm.sample(step=step, random_seed=seed, **SAMPLE_KWARGS)


@pytest.mark.slow
@pytest.mark.parametrize("noise_sd", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_conjugate_posteriors_are_exact(name, noise_sd):
    model, var, post = MODELS[name]()
    idata = run_penalty(model, noise_sd=noise_sd, seed=100 + int(10 * noise_sd))
    draws = idata.posterior[var].values
    ok, msg = posterior_check(draws, post.cdf, post.mean())
    assert ok, msg
    # Clipping is off, so nothing was clipped and every step released.
    assert np.all(idata.sample_stats["dp_clipped_fraction"].values == 0.0)
    assert bool(idata.sample_stats["dp_released"].values.all())


@pytest.mark.slow
def test_checks_have_power_without_the_penalty():
    """The same chain without the sigma^2/2 penalty is biased and the checks must say so."""
    model, var, post = normal_normal()
    idata = run_penalty(model, noise_sd=2.0, seed=120, penalty=False)
    ok, msg = posterior_check(idata.posterior[var].values, post.cdf, post.mean())
    assert not ok, f"an unpenalised chain passed the exactness checks: {msg}"


@pytest.mark.slow
def test_logistic_regression_matches_long_nuts():
    rng = np.random.default_rng(14)
    n, d = 300, 4
    X = rng.normal(size=(n, d))
    beta_true = np.array([1.0, -0.5, 0.25, 0.0])
    y = rng.binomial(1, 1 / (1 + np.exp(-X @ beta_true)))
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 2.0, shape=d)
        pm.Bernoulli("y", logit_p=pm.math.dot(X, beta), observed=y)
        ref = pm.sample(
            draws=3000,
            tune=1000,
            chains=4,
            cores=1,
            random_seed=3,
            progressbar=False,
            compute_convergence_checks=False,
        )
    idata = run_penalty(model, noise_sd=1.0, seed=4)
    ref_draws = ref.posterior["beta"].values
    pen_draws = idata.posterior["beta"].values
    for j in range(d):
        a, b = pen_draws[..., j], ref_draws[..., j]
        mcse = np.hypot(_mcse(a), _mcse(b))
        err = abs(a.mean() - b.mean())
        assert err < 4 * mcse, f"beta[{j}]: |mean diff|={err:.3g} vs 4 MCSE={4 * mcse:.3g}"
        p = stats.ks_2samp(thinned(a), thinned(b)).pvalue
        assert p > 1e-3, f"beta[{j}]: KS p={p:.3g}"


def two_normal_means():
    rng = np.random.default_rng(15)
    y = rng.normal([1.0, -2.0], [1.0, 3.0], size=(40, 2))
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, 10.0, shape=2)
        pm.Normal("y", m, np.array([1.0, 3.0]), observed=y)
    posts = []
    for j, s in enumerate((1.0, 3.0)):
        prec = 1 / 100.0 + y.shape[0] / s**2
        posts.append(stats.norm((y[:, j].sum() / s**2) / prec, prec**-0.5))
    return model, posts


@pytest.mark.slow
@pytest.mark.parametrize("proposal", ["component", "guided"])
def test_one_component_and_guided_walk_proposals_are_exact(proposal):
    model, posts = two_normal_means()
    idata = run_penalty(model, noise_sd=1.0, seed=7, proposal=proposal)
    draws = idata.posterior["m"].values
    for j, post in enumerate(posts):
        ok, msg = posterior_check(draws[..., j], post.cdf, post.mean())
        assert ok, f"m[{j}]: {msg}"


def test_bounded_proposals_stay_within_max_step():
    model, _ = two_normal_means()
    point = model.initial_point()
    with model:
        step = PenaltyMetropolis(
            noise_sd=1.0, clip=None, scaling=1.0, max_step=0.3, tune=False, rng=1
        )
    for _ in range(200):
        new, _ = step.step(point)
        assert np.all(np.abs(new["m"] - point["m"]) < 0.3)
        point = new
