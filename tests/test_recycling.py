"""Waste-recycling estimator: unbiased, lower variance, and wrong variants are detected.

Chains use ``clip=None`` and a fixed noise sd, so they target the exact conjugate posterior;
tolerances are multiples of the Monte Carlo standard error.
"""

from __future__ import annotations

import arviz as az
import numpy as np
import pymc as pm
import pytest
from conftest import _mcse
from scipy import stats

from pymc_penalty import PenaltyMetropolis
from pymc_penalty.results.recycling import (
    ProposalMap,
    recycle,
    recycled_mean,
    recycled_summary,
    recycled_terms,
)
from pymc_penalty.variants import ExpFamPenaltyMetropolis, MultiOwnerPenaltyMetropolis

QUIET = dict(progressbar=False, compute_convergence_checks=False)
PRIOR_SD = 10.0


@pytest.fixture(scope="module")
def normal_data():
    return np.random.default_rng(0).normal(1.0, 1.0, size=50)


@pytest.fixture(scope="module")
def normal_posterior(normal_data):
    """Exact posterior mean and variance of ``m`` in ``y_i ~ N(m, 1)``, ``m ~ N(0, 10^2)``."""
    precision = normal_data.size + PRIOR_SD**-2
    return float(normal_data.sum() / precision), float(1.0 / precision)


def _normal_model(data, initval=None):
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, PRIOR_SD, initval=initval)
        pm.Normal("y", m, 1.0, observed=data)
    return model


@pytest.fixture(scope="module")
def normal_chains(normal_data):
    model = _normal_model(normal_data)
    with model:
        step = PenaltyMetropolis(noise_sd=1.0, clip=None, reproducible_noise=True)
        idata = pm.sample(
            1500,
            tune=300,
            chains=4,
            cores=1,
            step=step,
            random_seed=11,
            discard_tuned_samples=False,
            **QUIET,
        )
    return model, idata


def test_recycled_mean_and_variance_are_unbiased(normal_chains, normal_posterior):
    model, idata = normal_chains
    mean, var = normal_posterior
    est = recycled_mean(idata, model=model)["m"]
    assert abs(float(est.mean) - mean) < 4.0 * float(est.mcse)
    assert abs(float(est.plain_mean) - mean) < 4.0 * float(est.plain_mcse)
    sq = recycled_mean(idata, fn=lambda v: (v["m"] - mean) ** 2, fn_name="sq", model=model)
    assert abs(float(sq["sq"].mean) - var) < 4.0 * float(sq["sq"].mcse)


def _wrong_terms(idata, mean, accept_fn):
    """Recycled terms of (m - mean)^2 with a deliberately wrong acceptance probability."""
    post = idata.posterior["m"].values
    prev = np.concatenate([idata.warmup_posterior["m"].values[:, -1:], post[:, :-1]], axis=1)
    prop = idata.sample_stats["proposal"].values[..., 0]
    accept = accept_fn(idata.sample_stats["accept"].values)
    return recycle((prev - mean) ** 2, (prop - mean) ** 2, accept)


@pytest.mark.parametrize(
    "accept_fn",
    [lambda a: 1.0 - a, lambda a: np.roll(a, 1, axis=1)],
    ids=["swapped", "previous_step"],
)
def test_wrong_acceptance_weights_are_detected_as_biased(
    normal_chains, normal_posterior, accept_fn
):
    """Control: the same check rejects 1 - a_t and a_{t-1} in place of a_t."""
    model, idata = normal_chains
    mean, var = normal_posterior
    right = _wrong_terms(idata, mean, lambda a: a)
    np.testing.assert_allclose(
        right, recycled_terms(idata, fn=lambda v: (v["m"] - mean) ** 2, model=model)["<lambda>"]
    )
    wrong = _wrong_terms(idata, mean, accept_fn)
    assert abs(float(wrong.mean()) - var) > 4.0 * _mcse(wrong)


def test_recycling_reduces_the_variance_across_replicate_chains(normal_data, normal_posterior):
    """60 independent chains: per-chain plain vs recycled means of the same draws.

    Pitman-Morgan test for paired samples: Var(X) = Var(Y) iff corr(X + Y, X - Y) = 0, so a
    significantly positive correlation (one-sided p < 1e-3) shows the recycled mean has the
    smaller variance across replicates.
    """
    mean, var = normal_posterior
    model = _normal_model(normal_data, initval=mean)
    with model:
        step = PenaltyMetropolis(
            noise_sd=1.0,
            clip=None,
            reproducible_noise=True,
            tune=False,
            S=np.array([np.sqrt(var)]),
            scaling=2.4,
        )
        idata = pm.sample(400, tune=0, chains=60, cores=1, step=step, random_seed=3, **QUIET)
    plain = idata.posterior["m"].values.mean(axis=1)
    recycled = recycled_terms(idata, model=model)["m"].values.mean(axis=1)
    r, p_two = stats.pearsonr(plain + recycled, plain - recycled)
    assert r > 0 and p_two / 2 < 1e-3
    assert recycled.var(ddof=1) < 0.95 * plain.var(ddof=1)
    # Both are centred on the exact posterior mean (3 standard errors of the 60-chain mean).
    for est in (plain, recycled):
        assert abs(est.mean() - mean) < 3.0 * est.std(ddof=1) / np.sqrt(est.size)


def test_beta_bernoulli_maps_proposals_to_the_constrained_space():
    y = (np.random.default_rng(2).random(40) < 0.3).astype(int)
    a, b = 2.0 + y.sum(), 3.0 + y.size - y.sum()
    with pm.Model() as model:
        p = pm.Beta("p", 2.0, 3.0)
        pm.Deterministic("odds", p / (1.0 - p))
        pm.Bernoulli("y", p=p, observed=y)
        step = PenaltyMetropolis(noise_sd=1.0, clip=None, reproducible_noise=True)
        idata = pm.sample(1500, tune=300, chains=3, cores=1, step=step, random_seed=4, **QUIET)
    # The proposal is on the log-odds scale; the map returns p and the Deterministic.
    mapped = ProposalMap(["p", "odds"], model)(idata.sample_stats["proposal"].values)
    np.testing.assert_allclose(
        mapped["p"], 1.0 / (1.0 + np.exp(-idata.sample_stats["proposal"].values[..., 0]))
    )
    np.testing.assert_allclose(mapped["odds"], mapped["p"] / (1.0 - mapped["p"]))
    est = recycled_mean(idata, model=model)
    assert abs(float(est["p"].mean) - a / (a + b)) < 4.0 * float(est["p"].mcse)
    assert abs(float(est["odds"].mean) - a / (b - 1.0)) < 4.0 * float(est["odds"].mcse)
    table = recycled_summary(idata, model=model)
    assert list(table.index) == ["p", "odds"]
    np.testing.assert_allclose(table.loc["p", "mean_recycled"], est["p"].mean)


def test_proposals_are_data_independent_moves(normal_data):
    """Same seed, different data: the moves theta' - theta are identical (private noise)."""
    moves = []
    for data in (normal_data, normal_data[::-1] * 3.0 + 5.0):
        with _normal_model(data):
            step = PenaltyMetropolis(noise_sd=1.0, clip=None, tune=False)
            idata = pm.sample(200, tune=0, chains=1, step=step, random_seed=7, **QUIET)
        prop = idata.sample_stats["proposal"].values[0, :, 0]
        prev = np.concatenate([[0.0], idata.posterior["m"].values[0, :-1]])  # initval 0
        moves.append(prop - prev)
        accepted = idata.sample_stats["accepted"].values[0] == 1.0  # float64, as in PyMC
        np.testing.assert_array_equal(prop[accepted], idata.posterior["m"].values[0][accepted])
    np.testing.assert_allclose(moves[0], moves[1], rtol=0, atol=1e-12)


def test_component_proposals_change_one_coordinate():
    y = np.random.default_rng(3).normal(size=(30, 3))
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, 5.0, shape=3)
        pm.Normal("y", m, 1.0, observed=y)
        step = PenaltyMetropolis(noise_sd=1.0, clip=None, proposal="component")
        idata = pm.sample(100, tune=50, chains=1, step=step, random_seed=5, **QUIET)
    prop = idata.sample_stats["proposal"].values[0]
    prev = np.concatenate([idata.posterior["m"].values[0, :1], idata.posterior["m"].values[0, :-1]])
    changed = np.count_nonzero(prop[1:] != prev[1:], axis=1)
    assert np.all(changed == 1)
    est = recycled_mean(idata, model=model)["m"]
    assert est.mean.shape == (3,) and np.all(np.isfinite(est.mcse))


def test_variants_record_proposals():
    counts = np.random.default_rng(4).poisson(3.0, size=200)
    with pm.Model() as pois:
        lam = pm.Gamma("lam", 2.0, 1.0)
        pm.Poisson("y", lam, observed=counts)
        step = ExpFamPenaltyMetropolis(data_bound=30, xi=1.0, reproducible_noise=True)
        idata = pm.sample(200, tune=100, chains=1, step=step, random_seed=6, **QUIET)
    assert idata.sample_stats["proposal"].shape == (1, 200, 1)
    est = recycled_mean(idata, model=pois)["lam"]  # alignment with accepted draws is checked
    assert np.isfinite(est.mean) and est.mean > 0

    y = np.random.default_rng(5).normal(1.0, 1.0, size=60)
    with _normal_model(y) as model:
        step = MultiOwnerPenaltyMetropolis(
            owners=np.arange(60) % 3, noise_sd=0.5, clip=None, reproducible_noise=True
        )
        idata = pm.sample(200, tune=100, chains=1, step=step, random_seed=6, **QUIET)
    assert idata.sample_stats["proposal"].shape == (1, 200, 1)
    assert np.isfinite(recycled_mean(idata, model=model)["m"].mean)


def test_wrong_model_and_data_dependent_quantities_are_refused(normal_chains):
    model, idata = normal_chains
    with pm.Model() as other:
        pm.Normal("m", 3.0, 1.0, transform=pm.distributions.transforms.log, initval=1.0)
        pm.Normal("y", 0.0, 1.0, observed=np.zeros(5))
    with pytest.raises(ValueError, match="do not map onto the stored draws"):
        recycled_mean(idata, model=other)
    X = np.random.default_rng(0).normal(size=(20, 2))
    with pm.Model() as leaky:
        beta = pm.Normal("beta", 0.0, 1.0, shape=2)
        pm.Deterministic("eta", pm.math.dot(X, beta))
        pm.Bernoulli("y", logit_p=pm.math.dot(X, beta), observed=np.ones(20))
    with pytest.raises(ValueError, match="depend on data"):
        ProposalMap(["beta", "eta"], leaky)
    old = az.InferenceData(
        posterior=idata.posterior, sample_stats=idata.sample_stats.drop_vars("proposal")
    )
    with pytest.raises(ValueError, match="no `proposal` sample statistic"):
        recycled_mean(old, model=model)
