"""The utility forecast: its closed form, its suggestions, its checks, and a measured run."""

import math
import warnings

import numpy as np
import pymc as pm
import pytest
from scipy.stats import norm

from pymc_penalty import PrivacyLedger, UtilityWarning, sample
from pymc_penalty.accounting import gdp_mu
from pymc_penalty.forecast import forecast_utility


def test_forecast_is_the_closed_form_of_the_budget_distance():
    f = forecast_utility(2.0, 1e-6, n=1e5, d=10, draws=1000, tune=1000, chains=4)
    mu_s = gdp_mu(epsilon=2.0, delta=1e-6) * math.sqrt(0.5 * 0.95)
    accept = 2 * norm.cdf(-1.0)
    expected = 0.25 * accept * 4.0 * mu_s**2 * 1e5 / (4.0 * 3.29**2) / 10
    assert f.ess == pytest.approx(expected, rel=1e-12)
    assert f.rms_error_sd == pytest.approx(1 / math.sqrt(expected), rel=1e-12)
    assert f.limited_by == "budget"
    # Linear in n, four times larger without the factor 2 of substitution.
    assert forecast_utility(2.0, 1e-6, n=2e5, d=10).ess == pytest.approx(2 * expected, rel=1e-12)
    add_remove = forecast_utility(2.0, 1e-6, n=1e5, d=10, neighbours="add_remove")
    assert add_remove.ess == pytest.approx(4 * expected, rel=1e-12)


def test_suggested_epsilon_and_rows_reach_the_target():
    f = forecast_utility(1.0, 1e-5, n=1e5, d=5, draws=2000, chains=4)
    assert f.verdict == "poor" and f.ess < 100
    at_eps = forecast_utility(f.epsilon_for_target, 1e-5, n=1e5, d=5, draws=2000, chains=4)
    assert at_eps.ess == pytest.approx(100.0, rel=1e-6)
    more_rows = forecast_utility(1.0, 1e-5, n=1e5 * f.n_factor_for_target, d=5, draws=2000)
    assert more_rows.ess == pytest.approx(100.0, rel=1e-9)
    text = str(f)
    assert "poor" in text and "epsilon about" in text


def test_verdicts_and_the_step_cap():
    assert forecast_utility(20.0, 1e-6, n=1e6, d=2, draws=5000).verdict == "good"
    assert forecast_utility(0.05, 1e-5, n=1e3, d=5).verdict == "hopeless"
    short = forecast_utility(20.0, 1e-6, n=1e6, d=2, draws=10, chains=1)
    assert short.limited_by == "steps" and short.ess == pytest.approx(0.33 * 10 / 2)
    assert short.steps_needed > 10 and "too short" in str(short)


@pytest.mark.parametrize(
    ("argument", "kwargs"),
    [
        ("epsilon", {"epsilon": 0.0}),
        ("epsilon", {"epsilon": "1"}),
        ("delta", {"delta": 1.0}),
        ("n", {"n": 0}),
        ("d", {"d": 2.5}),
        ("draws", {"draws": 0}),
        ("chains", {"chains": 0}),
        ("neighbours", {"neighbours": "replace"}),
        ("noise_sd", {"noise_sd": -1.0}),
        ("per_row_quantile", {"per_row_quantile": float("nan")}),
        ("clip_count_share", {"clip_count_share": 1.0}),
    ],
)
def test_bad_arguments_are_named(argument, kwargs):
    args = {"epsilon": 1.0, "delta": 1e-5, "n": 1000, "d": 3} | kwargs
    with pytest.raises(ValueError, match=argument):
        forecast_utility(**args)


def _whitened_penalty_walk(n: int, epsilon: float, noise_sd: float, steps: int, seed: int):
    """Reference simulation of the forecast's sampler: a penalty random walk on a Gaussian
    likelihood (d = 10, anisotropic) whose per-row bound is stated in the posterior's whitened
    metric, c = 3.29 / sqrt(n), started at a posterior draw. Returns the squared errors of the
    chain's means in posterior sds."""
    d = 10
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    cov = q @ np.diag(np.logspace(-1, 1, d)) @ q.T
    prec = np.linalg.inv(cov)
    y = rng.normal(size=d) + rng.multivariate_normal(np.zeros(d), cov, size=n)
    centre, chol = y.mean(0), np.linalg.cholesky(cov / n)
    mu_t = gdp_mu(epsilon=epsilon, delta=0.1 / n) / math.sqrt(steps)
    c = 3.29 / math.sqrt(n)
    length = noise_sd * mu_t / (2 * c)
    theta = centre + chol @ rng.normal(size=d)
    resid = y - theta
    draws = np.empty((steps, d))
    for t in range(steps):
        z = rng.normal(size=d)
        move = chol @ (length * z / np.linalg.norm(z))
        ratio = resid @ (prec @ move) - 0.5 * move @ prec @ move
        bound = c * length
        released = np.clip(ratio, -bound, bound).sum() + noise_sd * rng.normal()
        if math.log(rng.uniform()) < released - noise_sd**2 / 2:
            theta, resid = theta + move, resid - move
        draws[t] = theta
    white = np.linalg.solve(chol, (draws.mean(0) - centre))
    return white**2


@pytest.mark.slow
def test_forecast_matches_a_measured_whitened_penalty_walk():
    """12 seeds x 10 coordinates of squared mean errors: their mean has a relative Monte Carlo
    standard error near sqrt(2 / 120) = 0.13; with the forecast's own model error (measured
    within 0.8-1.5x over noise sd 1-3) the ratio must lie in [0.5, 2]. The add/remove-one
    forecast (four times the ESS) must fall outside it."""
    n, epsilon, steps = 20000, 4.0, 1500
    sq = np.concatenate([_whitened_penalty_walk(n, epsilon, 2.0, steps, s) for s in range(12)])
    kwargs = {"n": n, "d": 10, "draws": steps, "tune": 0, "chains": 1, "clip_count_share": 0.0}
    honest = forecast_utility(epsilon, 0.1 / n, **kwargs)
    assert 0.5 < sq.mean() * honest.ess < 2.0, sq.mean() * honest.ess
    wrong = forecast_utility(epsilon, 0.1 / n, neighbours="add_remove", **kwargs)
    assert not 0.5 < sq.mean() * wrong.ess < 2.0


# --------------------------------------------------------------------------------------------
# pp.sample forecasts before spending
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_model():
    y = np.random.default_rng(5).normal(0.5, 1.0, size=40)
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, 5.0)
        pm.Normal("y", m, 1.0, observed=y)
    return model


QUIET = {"progressbar": False, "compute_convergence_checks": False, "cores": 1}


def test_a_hopeless_budget_is_forecast_before_anything_is_spent(small_model, tmp_path):
    path = tmp_path / "ledger"
    with warnings.catch_warnings():
        warnings.simplefilter("error", UtilityWarning)
        with pytest.raises(UtilityWarning, match="hopeless") as info:
            sample(
                epsilon=0.5,
                delta=1e-5,
                draws=20,
                tune=20,
                chains=2,
                model=small_model,
                ledger_path=path,
                random_seed=1,
                **QUIET,
            )
    assert "epsilon about" in str(info.value) and "more rows" in str(info.value)
    assert PrivacyLedger.open(path).spent_mu2 == 0.0
    with pytest.warns(UtilityWarning, match="hopeless"):
        idata = sample(
            epsilon=0.5,
            delta=1e-5,
            draws=20,
            tune=20,
            chains=2,
            model=small_model,
            random_seed=1,
            **QUIET,
        )
    assert idata.attrs["dp_forecast_verdict"] == "hopeless"
    assert 0 < idata.attrs["dp_forecast_ess"] < 1


def test_no_forecast_under_add_remove_where_n_is_private(small_model):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UtilityWarning)
        idata = sample(
            epsilon=0.5,
            delta=1e-5,
            draws=20,
            tune=20,
            chains=2,
            neighbours="add_remove",
            model=small_model,
            random_seed=1,
            **QUIET,
        )
    assert "dp_forecast_ess" not in idata.attrs
