"""Free moves: coordinates no row's log-likelihood reads (a hierarchical model's group mean)
move by Metropolis on the exact prior alone, reading no data and releasing nothing.

The target's likelihood is constant along them, so each move leaves the posterior invariant:
checked against the closed form of a Gaussian hierarchical model, with a must-fail (moves
that ignore the prior), and the prior function is checked to hold no data.
"""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest
from pytensor.graph.basic import Constant
from pytensor.graph.traversal import ancestors
from scipy import stats

from pymc_penalty.sampling.step import PenaltyMetropolis
from tests.conftest import posterior_check

N_ROWS = 40


def _model(seed: int = 3) -> tuple[pm.Model, np.ndarray, float, float]:
    """mu ~ N(0, 1), a_g ~ N(mu, 1) (2 groups), y ~ N(a[g], 1): the model, the rows, and
    the exact posterior mean and sd of mu (a joint Gaussian)."""
    rng = np.random.default_rng(seed)
    g = np.arange(N_ROWS) % 2
    y = rng.normal(1.5, 1.0, N_ROWS) + g
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 1.0)
        a = pm.Normal("a", mu, 1.0, shape=2)
        pm.Normal("y", a[g], 1.0, observed=y)
    # Precision of (mu, a0, a1): prior 1 on mu, (a_g - mu)^2 terms, then the rows.
    n_g = np.bincount(g, minlength=2)
    P = np.array([[3.0, -1.0, -1.0], [-1.0, 1.0 + n_g[0], 0.0], [-1.0, 0.0, 1.0 + n_g[1]]])
    b = np.array([0.0, y[g == 0].sum(), y[g == 1].sum()])
    cov = np.linalg.inv(P)
    mean = cov @ b
    return model, y, float(mean[0]), float(np.sqrt(cov[0, 0]))


def _run(model: pm.Model, seed: int) -> tuple[np.ndarray, PenaltyMetropolis]:
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Tiny exact noise, no clip: the penalty moves are nearly plain Metropolis.
        step = PenaltyMetropolis(noise_sd=0.05, clip=None, reproducible_noise=True, rng=seed)
        idata = pm.sample(
            2000,
            tune=500,
            chains=2,
            cores=1,
            step=step,
            random_seed=seed,
            progressbar=False,
            compute_convergence_checks=False,
        )
    return idata.posterior["mu"].values, step


def test_only_the_rows_coordinates_are_not_free():
    model, _, _, _ = _model()
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = PenaltyMetropolis(noise_sd=0.05, clip=None)
    assert step._free_index.tolist() == [0]  # mu; a (coordinates 1, 2) is read by the rows


@pytest.mark.slow
def test_free_moves_keep_the_exact_posterior():
    model, _, mean, sd = _model()
    draws, step = _run(model, seed=5)
    ok, text = posterior_check(draws, stats.norm(mean, sd).cdf, mean)
    assert ok, text


@pytest.mark.slow
def test_free_moves_that_ignore_the_prior_fail_the_same_check(monkeypatch):
    # Must-fail: accepting every free move (a flat prior along mu) is not the posterior.
    monkeypatch.setattr(
        "pymc_penalty.model.likelihood.PenaltyLikelihood.log_prior", lambda self, x: 0.0
    )
    model, _, mean, sd = _model()
    draws, _ = _run(model, seed=5)
    ok, text = posterior_check(draws, stats.norm(mean, sd).cdf, mean)
    assert not ok, text


def test_the_free_moves_prior_holds_no_data():
    model, y, _, _ = _model()
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = PenaltyMetropolis(noise_sd=0.05, clip=None)
    _, logprior, _ = step._lik._prior_graph
    constants = [v for v in ancestors([logprior]) if isinstance(v, Constant)]
    assert constants  # the graph was read
    assert not any(np.size(c.data) >= N_ROWS for c in constants)
    x = np.zeros(3)
    assert np.isfinite(step._lik.log_prior(x))
