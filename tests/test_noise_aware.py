"""Noise-aware posterior draws from the Taylor path (issue 27): ``results.noise_aware``.

At zero noise the map is the identity on every variable (forward transform, whitening,
``noise_aware_draws``, back); with ``sd_G`` it widens a Gaussian posterior by the closed
form ``I + sd_G^2 I`` (whitened, unit posterior covariance), which the raw draws fail.
"""

from __future__ import annotations

import copy

import arviz as az
import numpy as np
import pymc as pm
import pytensor
import pytest

from pymc_penalty.results.noise_aware import NOISE_AWARE_ATTR, noise_aware_posterior


def _x_of(idata, model):
    """Raveled unconstrained draws (chains pooled), via PyMC's own transforms, per draw."""
    post = idata.posterior
    out = []
    for c in range(post.sizes["chain"]):
        for k in range(post.sizes["draw"]):
            point = {rv.name: post[rv.name].values[c, k] for rv in model.free_RVs}
            row = []
            for rv in model.free_RVs:
                tr = model.rvs_to_transforms.get(rv)
                if tr is None:
                    row.append(np.ravel(point[rv.name]))
                else:
                    given = {model[n]: point[n] for n in point}
                    expr = tr.forward(rv, *rv.owner.inputs)
                    fn = pytensor.function(list(given), expr, on_unused_input="ignore")
                    row.append(np.ravel(fn(*given.values())))
            out.append(np.concatenate(row))
    return np.array(out)


def _x_draws(idata, model):
    """Raveled unconstrained draws, chains pooled, by the module's compiled forward map."""
    from pymc_penalty.results import noise_aware as na

    fn, _ = na._forward_fn(model)
    post = idata.posterior
    total = post.sizes["chain"] * post.sizes["draw"]
    inputs = [
        post[rv.name].values.reshape(total, *post[rv.name].shape[2:]) for rv in model.free_RVs
    ]
    return np.concatenate([np.asarray(v).reshape(total, -1) for v in fn(*inputs)], axis=1)


@pytest.fixture(scope="module")
def normal_model():
    rng = np.random.default_rng(0)
    y = rng.normal(0.5, 1.3, size=(40, 3))
    with pm.Model(coords={"k": ["a", "b", "c"]}) as model:
        sigma = pm.HalfNormal("sigma", 2.0)
        mu = pm.Normal("mu", 0.0, 3.0, dims="k")
        pm.Deterministic("scaled", sigma * mu.sum())
        pm.Normal("y", mu, sigma, observed=y)
        idata = pm.sample(
            step=pm.Metropolis(),
            draws=300,
            tune=300,
            chains=2,
            cores=1,
            random_seed=1,
            progressbar=False,
            compute_convergence_checks=False,
        )
    return model, idata


def _whitening(idata, model):
    """A public-looking (t, L): the draws' mean, rounded, and a factor of their covariance."""
    x = _x_draws(idata, model)
    return np.round(x.mean(axis=0), 2), np.linalg.cholesky(np.cov(x, rowvar=False) * 1.5)


def test_zero_noise_is_the_identity_and_keeps_every_other_group(normal_model):
    model, idata = normal_model
    before = copy.deepcopy(idata)
    t, L = _whitening(idata, model)
    out = noise_aware_posterior(
        idata, model, t=t, L=L, sd_G=0.0, sd_H=0.0, rng=np.random.default_rng(2)
    )
    assert out is not idata
    assert set(out.posterior.data_vars) == {"sigma", "mu", "scaled"}
    for name in ("sigma", "mu", "scaled"):
        got, want = out.posterior[name], idata.posterior[name]
        assert got.dims == want.dims
        for dim in want.dims:
            np.testing.assert_array_equal(got[dim].values, want[dim].values)
        np.testing.assert_allclose(got.values, want.values, rtol=1e-8, atol=1e-8)
    assert out.posterior.attrs[NOISE_AWARE_ATTR] == 1
    assert NOISE_AWARE_ATTR not in idata.posterior.attrs
    # Every other group unchanged, and the input untouched.
    assert set(out.groups()) == set(idata.groups())
    for group in idata.groups():
        assert getattr(before, group).identical(getattr(idata, group)), group
        if group != "posterior":
            assert getattr(out, group).identical(getattr(idata, group)), group
    assert dict(out.attrs) == dict(idata.attrs)
    for key, value in idata.posterior.attrs.items():
        assert out.posterior.attrs[key] == value


def test_noisy_draws_recompute_the_deterministic_and_write_to_netcdf(normal_model, tmp_path):
    model, idata = normal_model
    t, L = _whitening(idata, model)
    out = noise_aware_posterior(
        idata, model, t=t, L=L, sd_G=0.7, sd_H=0.3, rng=np.random.default_rng(3)
    )
    post = out.posterior
    assert not np.allclose(post["mu"].values, idata.posterior["mu"].values)
    assert np.all(post["sigma"].values > 0.0)
    np.testing.assert_allclose(
        post["scaled"].values, post["sigma"].values * post["mu"].values.sum(axis=-1), rtol=1e-10
    )
    # The noise widens the posterior (each draw's mean moves by its own noise).
    assert float(post["mu"].std()) > float(idata.posterior["mu"].std())
    path = tmp_path / "noise_aware.nc"
    out.to_netcdf(str(path))
    assert az.from_netcdf(str(path)).posterior.attrs[NOISE_AWARE_ATTR] == 1


def test_var_names_selects_the_output(normal_model):
    model, idata = normal_model
    t, L = _whitening(idata, model)
    out = noise_aware_posterior(
        idata,
        model,
        t=t,
        L=L,
        sd_G=0.0,
        sd_H=0.0,
        rng=np.random.default_rng(4),
        var_names=["scaled"],
    )
    assert list(out.posterior.data_vars) == ["scaled"]
    np.testing.assert_allclose(
        out.posterior["scaled"].values, idata.posterior["scaled"].values, rtol=1e-8, atol=1e-8
    )


def test_raveling_matches_pymc_transforms(normal_model, interval_model):
    # The forward map and the raveling order (model.value_vars) agree with PyMC's own
    # transforms applied draw by draw (Interval bounds read the draws of other RVs).
    for model, idata in (normal_model, interval_model):
        small = idata.isel(draw=slice(0, 3))
        np.testing.assert_allclose(_x_draws(small, model), _x_of(small, model), rtol=1e-12)


def _gaussian_idata(x, chains):
    draws = x.shape[0] // chains
    return az.from_dict(posterior={"theta": x.reshape(chains, draws, x.shape[1])})


def test_gaussian_noise_matches_the_closed_form_covariance():
    # Whitened draws w ~ N(m, I); sd_G = 0.5, sd_H = 0: each draw's mean moves by its own
    # N(0, 0.25 I), so the noise-aware draws have covariance I + 0.25 I (docs/algorithm.md).
    d, chains, draws = 3, 2, 6000
    with pm.Model() as model:
        theta = pm.Normal("theta", 0.0, 10.0, shape=d)
        pm.Normal("y", theta.sum(), 1.0, observed=np.zeros(5))
    rng = np.random.default_rng(11)
    m = np.array([1.0, -2.0, 0.5])
    w = rng.normal(size=(chains * draws, d)) + m
    t = np.array([0.3, 0.1, -0.2])
    L = np.array([[2.0, 0.0, 0.0], [0.5, 1.0, 0.0], [-0.3, 0.2, 0.5]])
    x = t + w @ L.T
    idata = _gaussian_idata(x, chains)
    out = noise_aware_posterior(
        idata, model, t=t, L=L, sd_G=0.5, sd_H=0.0, rng=np.random.default_rng(12)
    )
    x_out = out.posterior["theta"].values.reshape(-1, d)
    w_out = np.linalg.solve(L, (x_out - t).T).T
    target = 1.25 * np.eye(d)
    n = len(w_out)
    # Monte Carlo standard errors of a Gaussian sample covariance (independent draws).
    se = np.sqrt((target**2 + np.outer(np.diag(target), np.diag(target))) / n)

    def passes(sample):
        cov = np.cov(sample, rowvar=False)
        mean_ok = np.all(np.abs(sample.mean(axis=0) - m) < 4.0 * np.sqrt(1.25 / n) + 0.05)
        return bool(np.all(np.abs(cov - target) < 4.0 * se) and mean_ok)

    assert passes(w_out)
    assert not passes(w)  # must-fail control: the raw draws have covariance I


@pytest.fixture(scope="module")
def interval_model():
    rng = np.random.default_rng(5)
    with pm.Model() as model:
        lo = pm.Normal("lo", 0.0, 1.0)
        width = pm.HalfNormal("width", 2.0)
        u = pm.Uniform("u", lower=lo, upper=lo + width, shape=2)
        p = pm.Beta("p", 2.0, 2.0)
        pm.Deterministic("hi", lo + width)
        pm.Normal("y", u.sum() + p, 1.0, observed=rng.normal(1.0, 1.0, size=30))
        idata = pm.sample(
            step=pm.Metropolis(),
            draws=300,
            tune=300,
            chains=2,
            cores=1,
            random_seed=6,
            progressbar=False,
            compute_convergence_checks=False,
        )
    return model, idata


def test_interval_bounds_from_rvs_round_trip_and_stay_in_the_support(interval_model):
    model, idata = interval_model
    d = 1 + 1 + 2 + 1  # lo, width_log__, u_interval__ (2), p_logodds__
    x = _x_draws(idata, model)
    assert x.shape == (600, d)
    for L in (np.diag([1.0, 0.5, 2.0, 2.0, 1.0]), np.linalg.cholesky(np.cov(x, rowvar=False))):
        same = noise_aware_posterior(
            idata, model, t=np.zeros(d), L=L, sd_G=0.0, sd_H=0.0, rng=np.random.default_rng(7)
        )
        for name in idata.posterior.data_vars:
            np.testing.assert_allclose(
                same.posterior[name].values, idata.posterior[name].values, rtol=1e-8, atol=1e-8
            )
    # A release whitened by the posterior's scale (the warm start's factor), with noise.
    t = np.round(x.mean(axis=0), 1)
    L = np.linalg.cholesky(np.cov(x, rowvar=False))
    noisy = noise_aware_posterior(
        idata, model, t=t, L=L, sd_G=1.0, sd_H=0.1, rng=np.random.default_rng(8)
    )
    post = noisy.posterior
    lo, hi, u = post["lo"].values[..., None], post["hi"].values[..., None], post["u"].values
    assert np.all(np.isfinite(u))
    assert not np.allclose(u, idata.posterior["u"].values)
    np.testing.assert_allclose(post["hi"], post["lo"] + post["width"], rtol=1e-12)
    assert np.all(post["width"].values > 0.0)
    # PyMC's Interval backward is ``s b + (1 - s) a``: a draw deep in a tail can land a few
    # ulps past a bound by rounding, as pm.sample's own draws can.
    ulps = 4.0 * np.spacing(np.maximum(np.abs(lo), np.abs(hi)))
    assert np.all(u >= lo - ulps) and np.all(u <= hi + ulps)
    assert np.mean((u > lo) & (u < hi)) > 0.99
    assert np.all((post["p"].values > 0.0) & (post["p"].values < 1.0))


def _call(model, idata, **kwargs):
    d = 4
    args = dict(t=np.zeros(d), L=np.eye(d), sd_G=0.1, sd_H=0.0, rng=np.random.default_rng(0))
    args.update(kwargs)
    return noise_aware_posterior(idata, model, **args)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"t": np.zeros(3)}, "`t`"),
        ({"t": np.zeros((4, 1))}, "`t`"),
        ({"L": np.eye(5)}, "`L`"),
        ({"L": np.eye(4)[:, :3]}, "`L`"),
        ({"L": np.diag([1.0, 1.0, 0.0, 1.0])}, "`L`"),
        ({"L": np.diag([1.0, -1.0, 1.0, 1.0])}, "`L`"),
        ({"L": np.eye(4) + np.triu(np.ones((4, 4)), 1)}, "`L`"),
        ({"L": np.full((4, 4), np.nan)}, "`L`"),
        ({"sd_G": -0.1}, "`sd_G`"),
        ({"sd_H": -1e-9}, "`sd_H`"),
        ({"var_names": ["nope"]}, "`var_names`"),
    ],
)
def test_bad_arguments_are_refused_by_name(normal_model, kwargs, named):
    model, idata = normal_model
    with pytest.raises(ValueError, match=named):
        _call(model, idata, **kwargs)


def test_too_few_draws_are_refused(normal_model):
    model, idata = normal_model
    few = idata.isel(draw=slice(0, 2))  # 2 chains x 2 draws = 4 < d + 2 = 6
    with pytest.raises(ValueError, match="`idata`.*at least 6"):
        _call(model, few)
    _call(model, idata.isel(draw=slice(0, 3)))  # 6 draws: accepted


def test_missing_free_variable_and_data_dependent_deterministic_are_refused(normal_model):
    model, idata = normal_model
    with pytest.raises(ValueError, match="lacks the free variables"):
        _call(model, az.InferenceData(posterior=idata.posterior.drop_vars("mu")))
    x = np.linspace(-1.0, 1.0, 20)
    with pm.Model() as leaky:
        b = pm.Normal("b", 0.0, 1.0)
        X = pm.Data("X", x)
        pm.Deterministic("fit", b * X)
        pm.Normal("y", b * X, 1.0, observed=x)
    fake = az.from_dict(
        posterior={"b": np.ones((2, 10)), "fit": np.ones((2, 10, 20))},
    )
    with pytest.raises(ValueError, match="`var_names`.*depend on data"):
        noise_aware_posterior(
            fake,
            leaky,
            t=np.zeros(1),
            L=np.eye(1),
            sd_G=0.0,
            sd_H=0.0,
            rng=np.random.default_rng(0),
        )
