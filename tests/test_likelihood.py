"""The compiled likelihood: exact rewrite, per-datapoint vector, clipping outputs."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor
import pytest
from pytensor.compile.mode import get_mode

from pymc_penalty.likelihood import PenaltyLikelihood
from pymc_penalty.rewrites import LIFT_UNARY_THROUGH_SWITCH


@pytest.fixture
def logistic():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 3))
    y = rng.binomial(1, 0.4, size=400)
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 1.0, shape=3)
        pm.Bernoulli("y", logit_p=pm.math.dot(X, beta), observed=y)
    return model, X, y


def test_switch_lift_is_exact(logistic):
    model, X, y = logistic
    term = model.logp(vars=model.observed_RVs, sum=False)[0]
    value = model.rvs_to_values[model["beta"]]
    plain = pytensor.function([value], term, mode=get_mode(None))
    lifted = pytensor.function(
        [value], term, mode=get_mode(None).including(LIFT_UNARY_THROUGH_SWITCH)
    )
    for beta in (np.zeros(3), np.array([0.5, -2.0, 30.0]), np.array([-40.0, 1e3, 0.0])):
        np.testing.assert_array_equal(plain(beta), lifted(beta))
    eta = X @ np.array([0.5, -2.0, 30.0])
    expected = np.where(y == 1, -np.logaddexp(0.0, -eta), -np.logaddexp(0.0, eta))
    np.testing.assert_allclose(lifted(np.array([0.5, -2.0, 30.0])), expected, rtol=1e-12)


def test_evaluate_returns_clipped_sum_and_count(logistic):
    model, X, y = logistic
    point = model.initial_point()
    lik = PenaltyLikelihood(model, model.value_vars, point)
    x0, x1 = np.zeros(3), np.array([0.3, -0.2, 0.1])
    ll0, prior0 = lik.initial(x0, 400)
    ll1, clipped_sum, n_clipped, prior1 = lik.evaluate(x1, ll0, 0.05)
    r = ll1 - ll0
    eta = X @ x1
    np.testing.assert_allclose(ll1, y * eta - np.logaddexp(0.0, eta), rtol=1e-12)
    assert clipped_sum == pytest.approx(np.clip(r, -0.05, 0.05).sum(), rel=1e-12)
    assert n_clipped == int((np.abs(r) > 0.05).sum()) > 0
    # The prior term carries no data: N(0, 1) on each coefficient.
    assert prior1 - prior0 == pytest.approx(-0.5 * (x1 @ x1), rel=1e-12)
