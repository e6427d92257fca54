"""The gate: every idiom through which data could reach the output without noise.

Design notes, invariants 7 (row locality) and 8 (data is whatever carries a record). Each
idiom is written the way users write it, and is either refused before anything is compiled
or spent, or cleaned from the published result. Controls that must still be accepted sit at
the end: a gate that refuses everything would pass the rest of this file.
"""

from __future__ import annotations

import warnings

import arviz as az
import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
import xarray as xr

from pymc_penalty import ModelNotPrivateError, PenaltyMetropolis, PrivacyLedger
from pymc_penalty.model.checks import (
    carries_records,
    data_dependent_variables,
    data_dims,
    validate_model,
)
from pymc_penalty.results.report import attach_report
from pymc_penalty.variants import ExpFamPenaltyMetropolis

N = 120
#: The public lower bound on the rows that add/remove-one requires (ignored under
#: substitute-one).
MIN_ROWS = 100
RNG = np.random.default_rng(20261124)
X = RNG.normal(size=(N, 2))
Y_BIN = RNG.binomial(1, 0.5, size=N)
Y_REAL = RNG.normal(size=N)
Y_COUNT = RNG.poisson(2.0, size=N)
QUIET = dict(progressbar=False, compute_convergence_checks=False)


def _refused(build, match: str) -> str:
    """Build the model, construct the step, and return the refusal's message."""
    with pm.Model():
        build()
        with pytest.raises(ModelNotPrivateError, match=match) as err:
            PenaltyMetropolis(mu=0.5)
    message = str(err.value)
    for value in (*X.ravel()[:20], *Y_REAL[:20]):
        assert f"{value:.6g}" not in message and f"{value!r}" not in message
    return message


# --- rows that couple (invariant 7) ---------------------------------------------------------


def test_covariates_centred_and_scaled_inside_the_model_are_refused():
    def build():
        xd = pm.Data("xd", X[:, 0])
        b = pm.Normal("b", 0, 1)
        pm.Bernoulli("y", logit_p=b * (xd - xd.mean()) / xd.std(), observed=Y_BIN)

    message = _refused(build, "moves other datapoints")
    assert "'xd'" in message and "outside the model with public constants" in message


def test_raw_numpy_covariates_centred_inside_the_model_are_refused():
    def build():
        x = pt.as_tensor_variable(X[:, 0])
        b = pm.Normal("b", 0, 1)
        pm.Bernoulli("y", logit_p=b * (x - x.mean()), observed=Y_BIN)

    assert "a constant array of shape (n,)" in _refused(build, "moves other datapoints")


def test_shared_covariates_scaled_by_their_maximum_are_refused():
    def build():
        x = pytensor.shared(X[:, 1], name="x_shared")
        b = pm.Normal("b", 0, 1)
        pm.Normal("y", b * x / pt.max(pt.abs(x)), 1.0, observed=Y_REAL)

    assert "'x_shared'" in _refused(build, "moves other datapoints")


def test_one_joint_mvnormal_over_all_rows_is_refused():
    def build():
        m = pm.Normal("m", 0, 1)
        pm.MvNormal("y", mu=m * np.ones(N), cov=np.eye(N), observed=Y_REAL)

    _refused(build, "one joint log density")


def test_a_term_that_reads_the_previous_row_is_refused():
    def build():
        yd = pm.Data("yd", Y_REAL)
        rho = pm.Normal("rho", 0, 0.5)
        pm.Normal("y", rho * pt.roll(yd, 1), 1.0, observed=Y_REAL)

    _refused(build, "moves other datapoints")


def test_a_summary_of_the_observations_inside_a_term_is_refused():
    def build():
        m = pm.Normal("m", 0, 1)
        y_obs = pm.Data("y_obs", Y_REAL)
        pm.Normal("y", m + 0.1 * y_obs.mean(), 1.0, observed=y_obs)

    _refused(build, "moves other datapoints")


def test_transposed_observations_are_refused():
    def build():
        m = pm.Normal("m", 0, 1)
        pm.Normal("y", m, 1.0, observed=np.stack([Y_REAL, Y_REAL]))

    _refused(build, "transpose the data")


# --- data that would enter without noise (invariant 8) ----------------------------------------


def test_potential_reading_a_shared_copy_of_the_data_is_refused():
    def build():
        m = pm.Normal("m", 0, 1)
        pm.Potential("fit", -((pytensor.shared(Y_REAL) - m) ** 2).sum())
        pm.Normal("y", m, 1.0, observed=Y_REAL)

    _refused(build, "Potential 'fit' depends on data")


def test_potential_reading_reshaped_data_is_refused():
    def build():
        m = pm.Normal("m", 0, 1)
        pm.Potential("fit", -((Y_REAL.reshape(1, N) - m) ** 2).sum())
        pm.Normal("y", m, 1.0, observed=Y_REAL)

    _refused(build, "Potential 'fit' depends on data")


def test_potential_reading_data_sliced_to_n_minus_one_rows_is_refused():
    def build():
        m = pm.Normal("m", 0, 1)
        pm.Potential("fit", -((Y_REAL[1:] - m) ** 2).sum())
        pm.Normal("y", m, 1.0, observed=Y_REAL)

    _refused(build, "Potential 'fit' depends on data")


def test_prior_reading_pm_data_is_refused():
    def build():
        yd = pm.Data("yd", Y_REAL)
        m = pm.Normal("m", yd.mean(), 1.0)
        pm.Normal("y", m, 1.0, observed=Y_REAL)

    _refused(build, "The prior of 'm' depends on data")


def test_prior_reading_a_reshaped_copy_of_the_data_is_refused():
    def build():
        m = pm.Normal("m", pt.as_tensor_variable(Y_REAL.reshape(10, N // 10)).mean(), 1.0)
        pm.Normal("y", m, 1.0, observed=Y_REAL)

    _refused(build, "The prior of 'm' depends on data")


def test_expfam_parameter_reading_a_covariate_is_refused():
    with pm.Model():
        a = pm.Normal("a", 0, 1)
        exposure = pm.Data("exposure", np.abs(X[:, 0]) + 0.5)
        pm.Poisson("y", pm.math.exp(a) * exposure.mean(), observed=Y_COUNT)
        with pytest.raises(ModelNotPrivateError, match="depends on data"):
            ExpFamPenaltyMetropolis(mu=0.5, data_bound=10.0)


def test_expfam_parameter_reading_a_numpy_covariate_is_refused():
    with pm.Model():
        a = pm.Normal("a", 0, 1)
        pm.Poisson(
            "y", pm.math.exp(a) * np.mean(np.abs(X[:, :1]) + X[:, :1] ** 2), observed=Y_COUNT
        )
        # A scalar computed in NumPy is a public constant as far as any check can tell; the
        # same computation left in the graph is caught:
    with pm.Model():
        a = pm.Normal("a", 0, 1)
        x = pt.as_tensor_variable(np.abs(X[:, 0]))
        pm.Poisson("y", pm.math.exp(a) * x.mean(), observed=Y_COUNT)
        with pytest.raises(ModelNotPrivateError, match="depends on data"):
            ExpFamPenaltyMetropolis(mu=0.5, data_bound=10.0)


def test_record_detection_is_conservative():
    assert carries_records((N,), N)
    assert carries_records((N - 1,), N)  # sliced
    assert carries_records((1, N), N)  # reshaped
    assert carries_records((3, N), N)  # transposed
    assert carries_records((10, N // 10), N)  # reshaped to no axis of length n
    assert carries_records((N // 2 + 1,), N)  # every other row
    # Control: the small public arrays of ordinary priors are not data.
    assert not carries_records((3,), N)
    assert not carries_records((3, 3), N)
    assert not carries_records((), N)


# --- cleaned from the result ---------------------------------------------------------------------


def _leaky_model():
    """Logistic regression with the covariates in three idioms and data-reading outputs."""
    with pm.Model(coords={"obs_id": [f"patient-{i}" for i in range(N)]}) as model:
        xs = pytensor.shared(X, name="X_shared")
        beta = pm.Normal("beta", 0, 1, shape=2)
        pm.Deterministic("eta_t", pm.math.dot(beta, X.T))  # X.T has shape (d, n)
        pm.Deterministic("eta_shared", pm.math.dot(xs, beta))
        pm.Deterministic("fitted_tail", pm.math.dot(X[1:], beta))  # n - 1 rows
        pm.Deterministic("beta_sum", beta.sum())  # control: no data
        pm.Bernoulli("y", logit_p=pm.math.dot(xs, beta), observed=Y_BIN, dims="obs_id")
    return model


def test_data_dependent_outputs_are_named():
    model = _leaky_model()
    leaky = set(data_dependent_variables(model))
    assert {"eta_t", "eta_shared", "fitted_tail", "y"} <= leaky
    assert "beta_sum" not in leaky and "beta" not in leaky
    assert data_dims(model) == ["obs_id"]


@pytest.mark.parametrize("neighbours", ["substitute", "add_remove"])
@pytest.mark.slow
def test_stripping_removes_data_outputs_and_record_ids(neighbours):
    model = _leaky_model()
    with model:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            step = PenaltyMetropolis(mu=0.5, neighbours=neighbours, min_rows=MIN_ROWS)
            idata = pm.sample(draws=5, tune=5, chains=1, step=step, random_seed=1, cores=1, **QUIET)
        pm.sample_posterior_predictive(idata, extend_inferencedata=True, progressbar=False)
    assert "obs_id" in idata.posterior_predictive.coords  # the raw result has record ids
    idata.attrs["sampling_time"] = 1.0
    report = {"dp_neighbours": neighbours}
    attach_report(idata, report, model=model)
    for group in idata.groups():
        ds = getattr(idata, group)
        assert not {"eta_t", "eta_shared", "fitted_tail"} & set(ds.data_vars), group
        assert "obs_id" not in ds.coords, group
        for name in ds.data_vars:
            assert not np.isin(np.asarray(ds[name].values), X).any(), f"{group}/{name}"
    assert "y" not in idata.posterior_predictive  # y_rep_i reads x_i
    assert "beta_sum" in idata.posterior and "beta" in idata.posterior
    assert not {"observed_data", "constant_data"} & set(idata.groups())
    assert ("sampling_time" in idata.attrs) == (neighbours == "substitute")


def test_add_remove_drops_variables_whose_length_is_n():
    """Under add/remove-one, n is private: a per-record variable's length would tell it."""
    idata = az.InferenceData(
        posterior=xr.Dataset(
            {
                "u": (("chain", "draw", "u_dim"), np.zeros((1, 3, N))),
                "m": (("chain", "draw"), np.zeros((1, 3))),
            }
        )
    )
    with pm.Model() as model:
        m = pm.Normal("m")
        pm.Normal("y", m, 1.0, observed=Y_REAL)
    attach_report(idata, {"dp_neighbours": "add_remove"}, model=model)
    assert "u" not in idata.posterior and "m" in idata.posterior


def test_row_count_mismatch_message_holds_no_counts():
    with pm.Model() as model:
        m = pm.Normal("m")
        pm.Normal("a", m, 1.0, observed=Y_REAL)
        pm.Normal("b", m, 1.0, observed=Y_REAL[:-1])
        with pytest.raises(ModelNotPrivateError) as err:
            validate_model(model, model.value_vars)
    assert str(N) not in str(err.value) and str(N - 1) not in str(err.value)


# --- controls: models written correctly must still be accepted --------------------------------


def _accepted(build) -> None:
    with pm.Model():
        build()
        PenaltyMetropolis(mu=0.5)


def test_control_rowwise_mvnormal_is_accepted():
    def build():
        mu = pm.Normal("mu", 0, 1, shape=2)
        pm.MvNormal("y", mu=mu, cov=np.eye(2), observed=X)

    _accepted(build)


def test_control_hierarchical_model_with_a_group_index_is_accepted():
    def build():
        group = RNG.integers(0, 4, size=N)
        a = pm.Normal("a", 0, 1, shape=4)
        s = pm.HalfNormal("s", 1.0)
        pm.Normal("y", a[group], s, observed=Y_REAL)

    _accepted(build)


def test_control_logistic_regression_with_pm_data_is_accepted():
    def build():
        xd = pm.Data("xd", X)
        beta = pm.Normal("beta", np.zeros(2), 1.0, shape=2)
        pm.Bernoulli("y", logit_p=pm.math.dot(xd, beta), observed=Y_BIN)

    _accepted(build)


def test_control_covariates_standardised_outside_with_public_constants_is_accepted():
    public_mean, public_sd = 0.0, 1.5  # published constants, not computed from these rows
    xs = (X - public_mean) / public_sd

    def build():
        beta = pm.Normal("beta", 0, 1, shape=2)
        pm.Bernoulli("y", logit_p=pm.math.dot(xs, beta), observed=Y_BIN)

    _accepted(build)


def test_control_poisson_with_a_per_row_exposure_is_accepted():
    def build():
        exposure = pm.Data("exposure", np.abs(X[:, 0]) + 0.5)
        a = pm.Normal("a", 0, 1)
        pm.Poisson("y", pm.math.exp(a) * exposure, observed=Y_COUNT)

    _accepted(build)


def test_control_model_with_initvals_is_accepted():
    with pm.Model():
        m = pm.Normal("m", 0, 1, initval=0.3)
        pm.Normal("y", m, 1.0, observed=Y_REAL)
        PenaltyMetropolis(mu=0.5)


def test_an_invalid_covariate_moves_only_its_own_term():
    """PyMC checks parameters over all rows at once (one invalid exposure would set every
    term to -inf); the step's terms check row by row, so the clipped sums of two neighbours,
    one with an invalid record, differ by at most the claimed sensitivity 2B."""
    from pymc_penalty.model.likelihood import PenaltyLikelihood

    exposure = np.abs(X[:, 0]) + 0.5
    bad = exposure.copy()
    bad[7] = -1.0  # a worst-case neighbour: one record outside the parameter's domain
    sums = []
    for e in (exposure, bad):
        with pm.Model() as model:
            a = pm.Normal("a", 0, 1)
            pm.Poisson("y", pm.math.exp(a) * pm.Data("e", e), observed=Y_COUNT)
        point = model.initial_point()
        lik = PenaltyLikelihood(model, model.value_vars, point)
        ll0, _ = lik.initial(np.array([0.0]), N)
        _, clipped_sum, _, _ = lik.evaluate(np.array([0.3]), ll0, 0.05)
        sums.append(clipped_sum)
    assert np.isfinite(sums).all()
    assert abs(sums[0] - sums[1]) <= 2 * 0.05 + 1e-12


# --- couplings that synthetic values alone would not switch on (structure) ----------------------

AGE = RNG.integers(20, 60, size=N)
X_SENTINEL = np.where(RNG.random(N) < 0.3, -999.0, X[:, 0])


def test_integer_covariate_scaled_by_its_maximum_is_refused():
    """Synthetic integers are {0, 1}, so age / age.max() never moves on them; the structure
    (a maximum over records) is refused all the same."""

    def build():
        age = pm.Data("age", AGE)
        b = pm.Normal("b", 0, 1)
        pm.Bernoulli("y", logit_p=b * age / age.max(), observed=Y_BIN)

    assert "'age'" in _refused(build, "summary of many records")


def test_sentinel_imputed_by_the_mean_of_other_rows_is_refused():
    def build():
        xd = pm.Data("x", X_SENTINEL)
        missing = pt.eq(xd, -999.0)
        mean_observed = pt.switch(missing, 0.0, xd).sum() / (~missing).sum()
        b = pm.Normal("b", 0, 1)
        pm.Bernoulli("y", logit_p=b * pt.switch(missing, mean_observed, xd), observed=Y_BIN)

    _refused(build, "impute missing values before sampling")


def test_nan_imputed_inside_the_model_through_shared_is_refused():
    def build():
        xd = pytensor.shared(np.where(X_SENTINEL == -999.0, np.nan, X_SENTINEL), name="xs")
        missing = pt.isnan(xd)
        fill = pt.switch(missing, 0.0, xd).sum() / (~missing).sum()
        b = pm.Normal("b", 0, 1)
        pm.Bernoulli("y", logit_p=b * pt.switch(missing, fill, xd), observed=Y_BIN)

    assert "'xs'" in _refused(build, "moves other datapoints")


def test_rescaling_switched_on_by_the_data_maximum_is_refused():
    def build():
        xd = pm.Data("x", X[:, 0])
        b = pm.Normal("b", 0, 1)
        xs = pt.switch(pt.gt(pt.abs(xd).max(), 50.0), xd / 100.0, xd)
        pm.Normal("y", b * xs, 1.0, observed=Y_REAL)

    _refused(build, "moves other datapoints")


def test_binomial_trials_set_to_the_data_maximum_is_refused():
    def build():
        trials = pm.Data("trials", Y_COUNT + 1)
        p = pm.Beta("p", 1, 1)
        pm.Binomial("y", n=trials.max(), p=p, observed=Y_COUNT)

    assert "'trials'" in _refused(build, "summary of many records")


def test_coupling_switched_on_far_from_the_initial_point_is_refused():
    """Probes at two random points would not reach m > 4; the structure does."""

    def build():
        yd = pm.Data("yd", Y_REAL)
        m = pm.Normal("m", 0, 5)
        pm.Normal("y", m + pt.switch(pt.gt(m, 4.0), yd.mean() - 4.0, 0.0), 1.0, observed=yd)

    _refused(build, "moves other datapoints")


def test_rows_read_through_an_offset_index_array_are_refused():
    def build():
        xd = pm.Data("x", X[:, 0])
        idx = pm.Data("nbr", np.full(N, 10))
        rho = pm.Normal("rho", 0, 1)
        pm.Normal("y", rho * xd[idx + 2], 1.0, observed=Y_REAL)

    _refused(build, "data-dependent index")


def test_normalising_by_group_size_counted_in_the_model_is_refused():
    group = RNG.integers(0, 4, size=N)

    def build():
        g = pm.Data("g", group)
        a = pm.Normal("a", 0, 1)
        size = pt.bincount(g, minlength=4)
        pm.Normal("y", a / size[g], 1.0, observed=Y_REAL)

    assert "'g'" in _refused(build, "moves other datapoints")


def test_cumulative_sum_over_rows_is_refused():
    def build():
        xd = pm.Data("x", X[:, 0])
        b = pm.Normal("b", 0, 1)
        pm.Normal("y", b * pt.cumsum(xd), 1.0, observed=Y_REAL)

    assert "'x'" in _refused(build, "moves other datapoints")


# --- arrays whose length is not n --------------------------------------------------------------


def test_lagged_covariates_one_row_longer_centred_inside_are_refused():
    """Observed y[1:] has n - 1 rows; the covariate keeps all n: it is a stand-in too."""
    series = np.cumsum(Y_REAL) * 0.1

    def build():
        xd = pm.Data("x", X[:, 0])
        xs = (xd - xd.mean()) / xd.std()
        b = pm.Normal("b", 0, 1)
        rho = pm.Normal("rho", 0, 0.5)
        pm.Normal("y", rho * series[:-1] + b * xs[1:], 1.0, observed=series[1:])

    assert "'x'" in _refused(build, "moves other datapoints")


def test_autoregression_reading_the_same_series_twice_is_refused():
    """y_t enters row t (as the response) and row t + 1 (as the lag): two terms move."""

    def build():
        yd = pm.Data("series", Y_REAL)
        rho = pm.Normal("rho", 0, 0.5)
        pm.Normal("y", rho * yd[:-1], 1.0, observed=yd[1:])

    assert "'series'" in _refused(build, "moves other datapoints")


def test_long_format_covariates_reshaped_and_centred_inside_are_refused():
    def build():
        flat = pm.Data("x_long", X.ravel())
        xm = flat.reshape((N, 2))
        b = pm.Normal("b", 0, 1, shape=2)
        pm.Normal("y", pt.dot(xm - xm.mean(axis=0), b), 1.0, observed=Y_REAL)

    assert "'x_long'" in _refused(build, "moves other datapoints")


# --- other ways in: initial values, computed observations, n under add/remove -----------------


def test_initial_value_computed_from_data_is_refused():
    def build():
        yd = pm.Data("yd", Y_REAL)
        pm.Normal("m", 0, 10, initval=yd.mean())
        pm.Normal("y", pm.modelcontext(None)["m"], 1.0, observed=yd)

    _refused(build, "initial value of 'm' depends on data")


def test_expfam_observations_computed_inside_the_model_are_refused():
    with pm.Model():
        income = pm.Data("income", X[:, 0])
        p = pm.Beta("p", 1, 1)
        pm.Bernoulli("high", p=p, observed=pt.gt(income, income.mean()))
        with pytest.raises(ModelNotPrivateError, match="computed inside the model"):
            ExpFamPenaltyMetropolis(mu=0.5)


def test_per_datapoint_free_variables_are_refused_under_add_remove():
    with pm.Model(coords={"obs": np.arange(N)}):
        a = pm.Normal("a", 0, 1)
        u = pm.Normal("u", 0, 0.5, dims="obs")
        pm.Poisson("y", pm.math.exp(a + u), observed=Y_COUNT, dims="obs")
        with pytest.raises(ModelNotPrivateError, match="number of datapoints is private") as err:
            PenaltyMetropolis(mu=0.5, neighbours="add_remove", min_rows=MIN_ROWS)
        assert str(N) not in str(err.value)
        PenaltyMetropolis(mu=0.5)  # control: under substitute-one the count is public


def test_clipped_fraction_is_not_released_under_add_remove():
    """The noisy clipped count divided by n would publish n (its spread is count_sd / n)."""
    with pm.Model() as model:
        m = pm.Normal("m", 0, 1)
        pm.Normal("y", m, 1.0, observed=Y_REAL)
        fractions: dict[str, list[float]] = {}
        for relation in ("substitute", "add_remove"):
            step = PenaltyMetropolis(mu=0.5, clip=0.5, neighbours=relation, min_rows=MIN_ROWS)
            point = model.initial_point()
            stats = [step.step(point)[1][0] for _ in range(20)]
            fractions[relation] = [s["dp_clipped_fraction"] for s in stats]
            assert all(np.isfinite(s["dp_clipped_count"]) for s in stats)
    assert np.isfinite(fractions["substitute"]).all()
    assert np.isnan(fractions["add_remove"]).all()


def test_group_labels_of_data_indexed_effects_are_stripped():
    """Patient ids as coords of a per-patient effect (several rows each) are records too."""
    patients = [f"MRN-{i:07d}" for i in RNG.integers(0, 10**7, size=6)]
    with pm.Model(coords={"patient": patients, "coef": ["slope"]}) as model:
        pidx = pm.Data("patient_idx", RNG.integers(0, 6, size=N))
        u = pm.Normal("u", 0, 1, dims="patient")
        b = pm.Normal("b", 0, 1, dims="coef")
        pm.Normal("y", u[pidx] + b[0], 1.0, observed=Y_REAL)
    dims = data_dims(model)
    assert "patient" in dims and "coef" not in dims


# --- controls: more idioms that are row-local and must be accepted -------------------------------


@pytest.mark.parametrize(
    "likelihood",
    ["normal_mixture", "mixture", "zero_inflated", "customdist_logp_only", "categorical",
     "ordered_logistic", "multinomial", "student_t"],
)  # fmt: skip
@pytest.mark.slow
def test_control_row_local_likelihoods_are_accepted(likelihood):
    def build():
        if likelihood == "normal_mixture":
            w = pm.Dirichlet("w", np.ones(2))
            mu = pm.Normal("mu", [-1, 1], 1, shape=2)
            pm.NormalMixture("y", w=w, mu=mu, sigma=1.0, observed=Y_REAL)
        elif likelihood == "mixture":
            w = pm.Dirichlet("w", np.ones(2))
            mu = pm.Normal("mu", 0, 1, shape=2)
            comps = [pm.Normal.dist(mu[0], 1), pm.Normal.dist(mu[1], 1)]
            pm.Mixture("y", w=w, comp_dists=comps, observed=Y_REAL)
        elif likelihood == "zero_inflated":
            psi = pm.Beta("psi", 1, 1)
            pm.ZeroInflatedPoisson("y", psi=psi, mu=pm.Exponential("lam", 1), observed=Y_COUNT)
        elif likelihood == "customdist_logp_only":
            m = pm.Normal("m", 0, 1)
            pm.CustomDist("y", m, logp=lambda v, mu: -0.5 * (v - mu) ** 2, observed=Y_REAL)
        elif likelihood == "categorical":
            B = pm.Normal("B", 0, 1, shape=(2, 3))
            p = pm.math.softmax(pt.dot(pm.Data("X", X), B), axis=-1)
            pm.Categorical("y", p=p, observed=RNG.integers(0, 3, N))
        elif likelihood == "ordered_logistic":
            b = pm.Normal("b", 0, 1)
            c = pm.Normal("c", [-1, 0, 1], 1, transform=pm.distributions.transforms.ordered)
            pm.OrderedLogistic("y", eta=b * X[:, 0], cutpoints=c, observed=RNG.integers(0, 4, N))
        elif likelihood == "multinomial":
            p = pm.Dirichlet("p", np.ones(3))
            pm.Multinomial("y", n=10, p=p, observed=RNG.multinomial(10, [0.2, 0.3, 0.5], N))
        else:
            nu = pm.Gamma("nu", 2, 0.1)
            pm.StudentT("y", nu=nu, mu=pm.Normal("b", 0, 1) * X[:, 0], sigma=1, observed=Y_REAL)

    _accepted(build)


def test_control_a_filled_prior_mean_of_length_n_is_accepted():
    """np.zeros(n) as a prior mean holds no records (every element is the same)."""

    def build():
        a = pm.Normal("a", 0, 2.0)
        u = pm.Normal("u", mu=np.zeros(N), sigma=0.5)
        pm.Normal("y", a + u, 1.0, observed=Y_REAL)

    _accepted(build)


def test_a_scalar_pm_data_in_a_prior_is_data():
    """A scalar pm.Data may hold a statistic of the table (invariant 8): refused, with the
    fix (a plain number) in the message; a varying constant of length n is refused too."""

    def build():
        a = pm.Normal("a", 0, pm.Data("prior_scale", 2.0))
        pm.Normal("y", a, 1.0, observed=Y_REAL)

    assert "plain numbers" in _refused(build, "The prior of 'a' depends on data")

    def build_varying():
        u = pm.Normal("u", mu=np.linspace(0, 1, N), sigma=0.5)
        pm.Normal("y", u, 1.0, observed=Y_REAL)

    _refused(build_varying, "The prior of 'u' depends on data")


def test_control_per_row_effect_sized_from_the_data_shape_is_accepted():
    """size=y.shape[0] reads the count, not the values: public under substitute-one."""
    with pm.Model():
        yd = pm.Data("yd", Y_COUNT)
        u = pm.Normal("u", 0, 1, shape=yd.shape[0])
        a = pm.Normal("a", 0, 1)
        pm.Poisson("y", pm.math.exp(a + u), observed=yd)
        PenaltyMetropolis(mu=0.5)
        # Under add/remove-one the count is private, and its shape depends on it.
        with pytest.raises(ModelNotPrivateError, match="prior of 'u' depends on data"):
            PenaltyMetropolis(mu=0.5, neighbours="add_remove", min_rows=MIN_ROWS)


def test_data_swapped_to_another_shape_after_the_step_is_built_is_refused_before_spending():
    """The gate ran on the construction-time layout: pm.set_data to another shape (here a
    second covariate column the checks never saw) is refused before any release, and a
    same-shape swap (the usual prediction idiom) still samples."""
    from pymc_penalty.errors import DataChangedError

    with pm.Model():
        xd = pm.Data("xd", X[:, 0])
        b = pm.Normal("b", 0, 1)
        pm.Bernoulli("y", logit_p=b * xd, observed=Y_BIN)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            step = PenaltyMetropolis(mu=0.5, ledger=PrivacyLedger(5.0))
        pm.set_data({"xd": X[:, 1]})  # same layout: accepted
        step.astep(pm.blocking.DictToArrayBijection.map(pm.modelcontext(None).initial_point()))
        spent_before = step.ledger.spent_mu2
        assert spent_before > 0
        pm.set_data({"xd": np.concatenate([X[:, 0], X[:1, 1]])})
        q = pm.blocking.DictToArrayBijection.map(pm.modelcontext(None).initial_point())
        # The replaced array invalidates the cached state: the layout is checked again.
        with pytest.raises(DataChangedError, match=r"\['xd'\] changed shape") as err:
            step.astep(q)
    assert f"{X[0, 1]:.6g}" not in str(err.value) and str(N) not in str(err.value)
    assert step.ledger.spent_mu2 == spent_before


# --- one gate decision per pp.sample call ---------------------------------------------------


def _counting_gate(monkeypatch) -> list[int]:
    """Count the gate's real runs (not the remembered ones)."""
    import pymc_penalty.model.checks as checks

    runs: list[int] = []
    real = checks._validate_model

    def counted(*args, **kwargs):
        runs.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(checks, "_validate_model", counted)
    return runs


def _logistic_on_data(centred: bool = False) -> None:
    """Inside a model context: a logistic regression on ``pm.Data``; ``centred`` centres the
    covariate inside the graph (rows coupled by the mean: refused)."""
    xd = pm.Data("xd", X[:, 0])
    b = pm.Normal("b", 0, 1)
    pm.Bernoulli("y", logit_p=b * ((xd - xd.mean()) if centred else xd), observed=Y_BIN)


def test_sample_runs_the_gate_once_for_its_screen_warm_start_and_step(monkeypatch):
    """pp.sample gates the model for the row screen, the warm start and the step: the
    row-locality probes run once, in pp.sample and in a budgeted step (the card usage),
    whose block pp.sample's contains. A coupled model is still refused before anything is
    spent (the control)."""
    import pymc_penalty as pp

    runs = _counting_gate(monkeypatch)
    with pm.Model():
        _logistic_on_data()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            idata = pp.sample(epsilon=2.0, delta=1e-5, draws=40, tune=40, chains=1, **QUIET)
    assert idata.attrs["dp_warm_start_mu"] > 0  # the warm start ran, and gated the model
    assert len(runs) == 1
    # The package's warnings still point at the caller's line (no wrapper frame between).
    ours = [w for w in caught if w.category.__module__.startswith("pymc_penalty")]
    assert ours and all(w.filename == __file__ for w in ours), [w.filename for w in ours]
    runs.clear()
    # the card usage: a budgeted step spends on the same three before its chains
    with pm.Model():
        _logistic_on_data()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            step = pp.PenaltyMetropolis(epsilon=2.0, delta=1e-5)
    assert step.extra_report["dp_warm_start_mu"] > 0
    assert len(runs) == 1
    runs.clear()
    with pm.Model():
        _logistic_on_data(centred=True)
        with pytest.raises(ModelNotPrivateError, match="One record moves"):
            pp.sample(epsilon=2.0, delta=1e-5, draws=40, tune=40, chains=1, **QUIET)
    assert len(runs) == 1


def test_remembered_gate_decision_is_tied_to_the_data_it_checked(monkeypatch):
    """Inside one_model_gate the same model and data are checked once; new values (a
    same-shape pm.set_data) run the gate again, and a new row count is returned, not the
    remembered one. Outside the block every call runs."""
    from pymc_penalty.model.checks import one_model_gate

    runs = _counting_gate(monkeypatch)
    with pm.Model() as model:
        xd = pm.Data("xd", X[:, 0])
        yd = pm.Data("yd", Y_REAL)
        b = pm.Normal("b", 0, 1)
        pm.Normal("y", b * xd, 1.0, observed=yd, shape=xd.shape[0])
    value_vars = list(model.value_vars)
    with one_model_gate():
        assert validate_model(model, value_vars) == N
        assert validate_model(model, value_vars) == N
        assert len(runs) == 1
        with one_model_gate():  # a block inside (a budgeted step's) shares the decisions
            assert validate_model(model, value_vars) == N
        assert len(runs) == 1
        with model:
            pm.set_data({"xd": X[:, 1]})
        assert validate_model(model, value_vars) == N
        assert len(runs) == 2
        with model:
            pm.set_data({"xd": X[:-5, 0], "yd": Y_REAL[:-5]})
        assert validate_model(model, value_vars) == N - 5
        assert len(runs) == 3
    validate_model(model, value_vars)
    validate_model(model, value_vars)
    assert len(runs) == 5
    # observed values given as an expression of the data: its inputs are what is hashed
    with pm.Model() as scaled:
        yd = pm.Data("yd", Y_REAL)
        b = pm.Normal("b", 0, 1)
        pm.Normal("y", b, 1.0, observed=2.0 * yd)
    with one_model_gate():
        validate_model(scaled, list(scaled.value_vars))
        validate_model(scaled, list(scaled.value_vars))
        assert len(runs) == 6
        with scaled:
            pm.set_data({"yd": Y_REAL[::-1]})
        validate_model(scaled, list(scaled.value_vars))
        assert len(runs) == 7
