"""API consistency (issue 17, item 5): argument order, helpers outside a model context, and an
epsilon curve that agrees with the report."""

from __future__ import annotations

import inspect
import math
import warnings

import numpy as np
import pymc as pm
import pytest

import pymc_penalty as pp
from pymc_penalty.accounting import (
    classical_gaussian_epsilon,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
    zcdp_epsilon,
)
from pymc_penalty.errors import DegenerateDeltaWarning

pytestmark = [
    pytest.mark.filterwarnings("ignore::pymc_penalty.FrozenChainWarning"),
    pytest.mark.filterwarnings("ignore::pymc_penalty.UtilityWarning"),
]


def test_epsilon_conversions_take_the_mechanism_parameter_then_delta():
    for fn in (gdp_epsilon, classical_gaussian_epsilon, zcdp_epsilon):
        params = list(inspect.signature(fn).parameters)
        assert params[1] == "delta", (fn.__name__, params)
    # Budget-taking functions: epsilon, delta, then the rest.
    for fn in (gdp_mu, pp.forecast_utility, pp.accounting.calibrate_step_mu):
        assert list(inspect.signature(fn).parameters)[:2] == ["epsilon", "delta"], fn.__name__
    assert list(inspect.signature(gdp_delta).parameters)[:2] == ["epsilon", "mu"]


def test_gdp_epsilon_inverts_gdp_mu_in_the_new_order():
    mu = gdp_mu(1.0, 1e-5)
    assert gdp_epsilon(mu, 1e-5) == pytest.approx(1.0, rel=1e-10)
    assert gdp_epsilon(mu=mu, delta=1e-5) == gdp_epsilon(mu, 1e-5)
    # The finding: gdp_epsilon(0.5, ...) meant mu = 0.5 and returned 0.0.
    assert gdp_epsilon(0.5, 1e-5) > 1.5


def test_the_old_order_is_never_silent():
    # delta >= 1 in the new order: the message names the order change.
    with pytest.raises(ValueError, match=r"\(mu, delta\) since 0.2"):
        gdp_epsilon(1e-5, 2.0)
    # Both in (0, 1): the old-order meaning (delta=1e-5, mu=0.5) lands on a degenerate delta,
    # which warns instead of returning 0.0 silently.
    with pytest.warns(DegenerateDeltaWarning, match=r"\(mu, delta\)"):
        assert gdp_epsilon(1e-5, 0.5) == 0.0
    with pytest.raises(TypeError, match="delta"):
        gdp_epsilon(0.5)  # noqa


def test_package_conversions_of_a_tiny_spend_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert pp.PrivacyBudget(1.0, 1e-5).epsilon_spent(1e-9) == 0.0
        assert gdp_epsilon(0.0, 1e-5) == 0.0


@pytest.fixture(scope="module")
def model():
    rng = np.random.default_rng(5)
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, 5.0)
        pm.Normal("y", m, 1.0, observed=rng.normal(0.3, 1.0, size=200))
    return model


@pytest.fixture(scope="module")
def idata(model):
    with model:
        return pp.sample(
            method="penalty",
            epsilon=3.0,
            delta=1e-5,
            draws=100,
            tune=100,
            chains=2,
            cores=1,
            warm_start=0.2,
            random_seed=1,
            progressbar=False,
            compute_convergence_checks=False,
        )


def test_epsilon_curve_matches_the_report_with_warm_start_and_discarded_tuning(idata):
    curve = pp.epsilon_curve(idata)
    assert curve.total[-1] == pytest.approx(idata.attrs["dp_epsilon"], rel=1e-9)
    assert curve.warm_start_epsilon == pytest.approx(
        gdp_epsilon(idata.attrs["dp_warm_start_mu"], 1e-5), rel=1e-12
    )
    assert curve.total[0] > curve.warm_start_epsilon > 0  # the curve starts at the warm start
    costs = pp.diagnostics.phase_costs(idata)
    assert costs.tuning_releases.tolist() == [100, 100]
    assert costs.sampling_releases.tolist() == [100, 100]
    assert math.sqrt(costs.total_mu2) == pytest.approx(idata.attrs["dp_mu"], rel=1e-9)


def test_recycled_mean_works_outside_the_model_context(idata, model):
    outside = pp.recycled_mean(idata)
    with model:
        inside = pp.recycled_mean(idata)
    np.testing.assert_allclose(outside["m"].mean, inside["m"].mean)
    assert pp.recycled_summary(idata).shape[0] == 1
    # A copy (or a file read back) has no known model: a clear error, not PyMC's.
    with pytest.raises(ValueError, match="model="):
        pp.recycled_mean(idata.copy())
    np.testing.assert_allclose(
        pp.recycled_mean(idata.copy(), model=model)["m"].mean, outside["m"].mean
    )


def test_recycled_mean_takes_one_name_as_a_string(idata):
    assert list(pp.recycled_mean(idata, "m")) == ["m"]
