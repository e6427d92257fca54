"""ExpFamPenaltyMetropolis with a user-declared sufficient statistic (SufficientStatistic)."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest
from conftest import leaked_strings, posterior_check
from scipy import stats

from pymc_penalty import ModelNotPrivateError, PrivacyPolicy
from pymc_penalty.errors import DeclarationMismatchError
from pymc_penalty.variants import ExpFamPenaltyMetropolis, SufficientStatistic

QUIET = dict(progressbar=False, compute_convergence_checks=False)
K = 2.0  # Weibull shape, known
Y = np.random.default_rng(11).weibull(K, size=300) * 1.3


def _weibull_model(y=Y):
    """Weibull(k, beta) with rate = beta^-k ~ Gamma(3, 2): the posterior of rate is Gamma."""
    with pm.Model() as model:
        rate = pm.Gamma("rate", 3.0, 2.0)
        pm.Weibull("y", alpha=K, beta=rate ** (-1.0 / K), observed=y)
    return model


def _declaration(bound=20.0, calls=None):
    """log p(y | rate) = -rate * y^k + log(rate) + h(y): T = y^k, eta = -rate, A = -log(rate)."""

    def statistic(y):
        if calls is not None:
            calls.append(np.array(y, copy=True))
        return np.asarray(y, dtype=float) ** K

    return SufficientStatistic(
        statistic=statistic,
        natural=lambda p: [-p["rate"]],
        log_partition=lambda p: -np.log(p["rate"]),
        bound=bound,
    )


@pytest.mark.slow
def test_declared_weibull_is_exact():
    model = _weibull_model()
    with model:
        step = ExpFamPenaltyMetropolis(statistic=_declaration(), xi=25.0, reproducible_noise=True)
        idata = pm.sample(4000, tune=1000, chains=2, step=step, random_seed=5, **QUIET)
    assert step.family == "declared"
    assert float(np.mean(idata.sample_stats["dp_noise_sd"].values)) > 0.2  # the noise is real
    a, b = 3.0 + Y.size, 2.0 + float(np.sum(Y**K))
    ok, msg = posterior_check(
        idata.posterior["rate"].values, stats.gamma(a, scale=1 / b).cdf, a / b
    )
    assert ok, msg


def test_wrong_declaration_is_caught_before_sampling():
    wrong = SufficientStatistic(  # the Exponential family's statistic, not Weibull's
        statistic=lambda y: np.asarray(y, dtype=float),
        natural=lambda p: [-p["rate"]],
        log_partition=lambda p: -np.log(p["rate"]),
        bound=20.0,
    )
    with _weibull_model():
        with pytest.raises(DeclarationMismatchError, match="prior predictive"):
            ExpFamPenaltyMetropolis(statistic=wrong, xi=1.0)
        # Skipping the check is the user's explicit choice.
        step = ExpFamPenaltyMetropolis(statistic=wrong, xi=1.0, check_statistic=False)
    assert step.family == "declared"


def test_check_never_reads_the_real_data():
    calls: list[np.ndarray] = []
    with _weibull_model():
        ExpFamPenaltyMetropolis(statistic=_declaration(calls=calls), mu=0.5)
    # The statistic sees one datapoint per call, so it cannot read other rows.
    assert all(c.shape == (1,) for c in calls)
    real = [c for c in calls if np.isin(c, Y).all()]
    synthetic = [c for c in calls if not np.isin(c, Y).any()]
    assert len(real) + len(synthetic) == len(calls)
    # S is computed once from the data (every row, plus the spot check's repeats) ...
    assert {float(c[0]) for c in real} == set(Y.tolist())
    assert len(real) == Y.size + 16
    # ... and the declaration check ran on other (synthetic) values only.
    assert len(synthetic) == Y.size + 16


def test_statistic_that_reads_other_rows_cannot_couple_them():
    """T(y) = y - mean(y) over the rows it is given: applied per row it reads one row."""
    centred = SufficientStatistic(
        statistic=lambda y: np.asarray(y, float) - np.mean(y),
        natural=lambda p: [0.0],
        log_partition=lambda p: 0.0,
        bound=10.0,
    )
    y = np.array([1.0, 2.0, 30.0])
    y_neighbour = np.array([1.0, 2.0, -30.0])  # one record changed
    t, t_neighbour = centred.rows(y), centred.rows(y_neighbour)
    assert np.array_equal(t[:2], t_neighbour[:2])  # the other rows do not move


def test_statistic_with_state_is_refused():
    seen = []

    def running(y):
        seen.append(float(np.asarray(y).ravel()[0]))
        return np.asarray([sum(seen)])  # depends on every row seen so far

    stateful = SufficientStatistic(running, lambda p: [0.0], lambda p: 0.0, bound=10.0)
    with pytest.raises(ValueError, match="pure function"):
        stateful.rows(np.arange(5.0))


def test_sum_is_clipped_to_the_bound_and_sensitivity_follows_neighbours():
    decl = _declaration(bound=2.0)
    y = np.array([0.5, 1.0, 3.0, np.nan])  # T = 0.25, 1, 9 (clipped to 2), nan (dropped)
    total, n_clipped = decl.clipped_sum(y)
    np.testing.assert_allclose(total, [0.25 + 1.0 + 2.0])
    assert n_clipped == 2
    vec = SufficientStatistic(
        lambda y: np.stack([y, y], axis=1), lambda p: [0, 0], lambda p: 0, 1.0
    )
    total, n_clipped = vec.clipped_sum(np.array([3.0, 0.1]))
    np.testing.assert_allclose(total, [2**-0.5 + 0.1, 2**-0.5 + 0.1])
    assert n_clipped == 1
    with _weibull_model():
        sub = ExpFamPenaltyMetropolis(statistic=_declaration(bound=4.0), mu=1.0)
        add = ExpFamPenaltyMetropolis(
            statistic=_declaration(bound=4.0),
            mu=1.0,
            privacy=PrivacyPolicy("add_remove", min_rows=10),
        )
    assert sub.sensitivity == 8.0 and add.sensitivity == pytest.approx(17**0.5)
    assert sub.xi == pytest.approx(64.0) and add.xi == pytest.approx(17.0)


def test_declaration_errors_name_the_argument_and_hide_the_data():
    with pytest.raises(ValueError, match="`bound`"):
        SufficientStatistic(lambda y: y, lambda p: [0], lambda p: 0, bound=-1)
    with pytest.raises(TypeError, match="`natural`"):
        SufficientStatistic(lambda y: y, None, lambda p: 0, bound=1)
    bad_shape = SufficientStatistic(lambda y: np.ones((3, 1)), lambda p: [0], lambda p: 0, 1.0)
    with _weibull_model():
        with pytest.raises(ValueError, match="one row per datapoint") as err:
            ExpFamPenaltyMetropolis(statistic=bad_shape, xi=1.0, check_statistic=False)
        assert not leaked_strings(str(err.value), Y)
        with pytest.raises(ValueError, match="omit `family` and `data_bound`"):
            ExpFamPenaltyMetropolis(statistic=_declaration(), data_bound=3.0, xi=1.0)
        with pytest.raises(TypeError, match="SufficientStatistic"):
            ExpFamPenaltyMetropolis(statistic={"T": None}, xi=1.0)


def test_check_refuses_a_likelihood_that_reads_covariates():
    x = np.random.default_rng(3).normal(size=Y.size)
    with pm.Model():
        rate = pm.Gamma("rate", 3.0, 2.0)
        pm.Weibull("y", alpha=K, beta=(rate * np.exp(x)) ** (-1.0 / K), observed=Y)
        with pytest.raises(ModelNotPrivateError, match="check_statistic=False") as err:
            ExpFamPenaltyMetropolis(statistic=_declaration(), xi=1.0)
    assert not leaked_strings(str(err.value), x)
