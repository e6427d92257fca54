"""Contamination (Hu et al.): densities, the mechanism, the mixture likelihood, Algorithm 1.

Statistical tests are seeded; tolerances come from Monte Carlo standard errors measured over
independent seeds. Quadrature references for d = 1 are written with SciPy, independently of
the package's code.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from scipy import integrate, special, stats

import pymc_penalty as pp
from pymc_penalty import ModelNotPrivateError, NotPrivateWarning
from pymc_penalty.contamination import (
    BernoulliContamination,
    LinearRegression,
    LocationModel,
    LogisticRegression,
    RecordDomain,
    StudentTContamination,
    TruncatedStudentT,
    contaminate,
    contaminated_likelihood,
    estimate_privacy,
    privacy_curve,
    privacy_on_dataset,
    sample_contaminated,
)

ALPHA = 1e-3  # significance of the seeded goodness-of-fit tests


def _seeded(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotPrivateWarning)
        return fn(*args, **kwargs)


# --- contaminate ---------------------------------------------------------------------------


def test_contaminate_count_is_binomial_and_values_follow_g():
    rng = np.random.default_rng(1)
    n, rate = 20_000, 0.1
    y = rng.normal(size=n)
    g = StudentTContamination(3, 2.0, loc=1.0)
    out, mask = _seeded(contaminate, y, rate, g, rng=7, return_mask=True)
    assert stats.binomtest(int(mask.sum()), n, rate).pvalue > ALPHA
    assert np.array_equal(out[~mask], y[~mask])
    cdf = lambda v: stats.t.cdf((v - 1.0) / 2.0, 3)  # noqa: E731
    assert stats.kstest(out[mask], cdf).pvalue > ALPHA
    assert y is not out and not np.shares_memory(y, out)


def test_contaminate_truncated_and_covariate_located_g():
    rng = np.random.default_rng(2)
    n = 6000
    g = TruncatedStudentT(3, 10.0, -20.0, 50.0)
    out, mask = _seeded(contaminate, np.zeros(n), 0.5, g, rng=3, return_mask=True)
    z = out[mask]
    assert z.min() >= -20 and z.max() <= 50
    mass = stats.t.cdf(5.0, 3) - stats.t.cdf(-2.0, 3)
    cdf = lambda v: (stats.t.cdf(np.asarray(v) / 10, 3) - stats.t.cdf(-2.0, 3)) / mass  # noqa: E731
    assert stats.kstest(z, cdf).pvalue > ALPHA
    # g located at x^T beta: the covariates are read, never changed
    x = rng.normal(size=(n, 2))
    x0 = x.copy()
    beta = np.array([1.0, -2.0])
    g = StudentTContamination(4, 1.0, beta=beta)
    out, mask = _seeded(contaminate, np.zeros(n), 0.3, g, covariates=x, rng=4, return_mask=True)
    assert np.array_equal(x, x0)
    assert stats.kstest(out[mask] - x[mask] @ beta, stats.t(4).cdf).pvalue > ALPHA


def test_contaminate_bernoulli_edge_rates_and_seeding():
    y = np.zeros(5000, dtype=int)
    out, mask = _seeded(contaminate, y, 1.0, BernoulliContamination(0.3), rng=5, return_mask=True)
    assert mask.all() and out.dtype.kind == "i"
    assert stats.binomtest(int(out.sum()), y.size, 0.3).pvalue > ALPHA
    x = np.random.default_rng(0).normal(size=100)
    assert np.array_equal(_seeded(contaminate, x, 0.0, StudentTContamination(3), rng=1), x)
    a = _seeded(contaminate, x, 0.5, StudentTContamination(3), rng=9)
    b = _seeded(contaminate, x, 0.5, StudentTContamination(3), rng=9)
    assert np.array_equal(a, b)
    with pytest.warns(NotPrivateWarning, match="not private"):
        contaminate(x, 0.5, StudentTContamination(3), rng=9)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NotPrivateWarning)
        c, d = (contaminate(x, 0.5, StudentTContamination(3)) for _ in range(2))
    assert not np.array_equal(c, d)  # OS entropy: no two releases share a mask


def test_contaminate_argument_errors_name_the_argument():
    y = np.arange(10.0)
    with pytest.raises(ValueError, match=r"`rate` must be in \[0, 1\]"):
        contaminate(y, 1.5, StudentTContamination(3))
    with pytest.raises(ValueError, match="`covariates`"):
        contaminate(y, 0.5, StudentTContamination(3, beta=[1.0]))
    with pytest.raises(ValueError, match=r"`nu` must be positive"):
        StudentTContamination(-1)
    with pytest.raises(ValueError, match=r"`q` must be in \(0, 1\)"):
        BernoulliContamination(1.0)


# --- parameters of g computed from the data --------------------------------------------------


def test_g_with_data_derived_parameters_is_refused():
    y = np.random.default_rng(0).normal(size=200)
    with pm.Model(), pytest.raises(ModelNotPrivateError, match="`loc`"):
        StudentTContamination(3, 1.0, loc=pm.Data("y", y).mean())
    g = StudentTContamination(3, 1.0, loc=pt.as_tensor(y).mean())  # a constant graph over y
    with pytest.raises(ModelNotPrivateError, match="`loc`") as err:
        contaminate(y, 0.1, g)
    assert str(y[0])[:6] not in str(err.value)
    with pm.Model(), pytest.raises(ModelNotPrivateError, match="`loc`"):
        mu = pm.Normal("mu")
        contaminated_likelihood("obs", pm.Normal.dist(mu, 1), g, 0.1, y)
    with pytest.raises(ModelNotPrivateError, match="`beta`"):
        contaminate(y, 0.1, StudentTContamination(3, beta=y), covariates=np.eye(200))
    model = LocationModel(1.0, StudentTContamination(3, 1.0, loc=pt.as_tensor(y).mean()))
    with pytest.raises(ModelNotPrivateError, match="`loc`"):
        estimate_privacy(model, [0.0], 200, 0.1, 0.3, reps=1, mc_draws=50, rng=0)


# --- the contaminated likelihood -------------------------------------------------------------


def _obs_logp(model, point):
    return model.compile_logp(vars=model.observed_RVs, sum=False)(point)[0]


def test_mixture_logp_matches_scipy_and_is_observed():
    y = np.random.default_rng(3).standard_t(2, size=300) * 4
    g = StudentTContamination(3, 2.5, loc=0.5)
    for rate in (0.0, 0.2, 1.0):
        with pm.Model() as model:
            mu = pm.Normal("mu", 0, 1)
            obs = contaminated_likelihood("y", pm.Normal.dist(mu, 1.5), g, rate, y)
        assert obs in model.observed_RVs and not model.potentials
        got = _obs_logp(model, {"mu": 0.3})
        lf = stats.norm.logpdf(y, 0.3, 1.5)
        lg = stats.t.logpdf((y - 0.5) / 2.5, 3) - np.log(2.5)
        with np.errstate(divide="ignore"):
            ref = np.logaddexp(np.log1p(-rate) + lf, np.log(rate) + lg)
        np.testing.assert_allclose(got, ref, rtol=1e-7, atol=1e-9)
    # far in the tail the mixture is p g, computed without underflow
    with pm.Model() as model:
        contaminated_likelihood("y", pm.Normal.dist(0, 1), g, 0.1, np.array([1e3]))
    far = _obs_logp(model, {})
    assert np.isfinite(far).all()
    np.testing.assert_allclose(far, np.log(0.1) + g.logpdf([1e3]), rtol=1e-8)


def test_truncated_and_bernoulli_likelihoods_match_scipy():
    g = TruncatedStudentT(3, 10.0, -30.0, 30.0)
    y = np.linspace(-29, 29, 50)
    with pm.Model() as model:
        contaminated_likelihood("y", pm.Normal.dist(2.0, 3.0), g, 0.3, y)
    mass = stats.t.cdf(3.0, 3) - stats.t.cdf(-3.0, 3)
    lg = stats.t.logpdf(y / 10, 3) - np.log(10) - np.log(mass)
    ref = np.logaddexp(np.log(0.7) + stats.norm.logpdf(y, 2, 3), np.log(0.3) + lg)
    np.testing.assert_allclose(_obs_logp(model, {}), ref, rtol=1e-7)
    np.testing.assert_allclose(g.logpdf(y), lg, rtol=1e-10)
    assert integrate.quad(lambda v: np.exp(g.logpdf(v)), -30, 30)[0] == pytest.approx(1, 1e-8)
    eta = np.linspace(-40, 40, 21)
    yb = np.arange(21) % 2
    with pm.Model() as model:
        contaminated_likelihood(
            "y", pm.Bernoulli.dist(logit_p=eta), BernoulliContamination(0.5), 0.1, yb
        )
    p = 0.9 * special.expit(eta) + 0.05
    np.testing.assert_allclose(_obs_logp(model, {}), stats.bernoulli.logpmf(yb, p), rtol=1e-9)


@pytest.mark.slow
def test_mixture_normalises_and_supports_predictive_and_log_likelihood():
    grid = np.linspace(-200.0, 200.0, 100_001)
    g = StudentTContamination(3, 1.0)
    with pm.Model() as model:
        contaminated_likelihood("y", pm.Normal.dist(1.0, 0.5), g, 0.25, grid)
    dens = np.exp(_obs_logp(model, {}))
    tail = 0.25 * 2 * stats.t.sf(200.0, 3)
    assert integrate.trapezoid(dens, grid) == pytest.approx(1 - tail, abs=1e-6)
    y = _seeded(contaminate, np.random.default_rng(0).normal(size=40), 0.2, g, rng=1)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 5)
        contaminated_likelihood("y", pm.Normal.dist(mu, 1.0), g, 0.2, y)
        prior = pm.sample_prior_predictive(20, random_seed=1)
        assert prior.prior_predictive["y"].shape == (1, 20, 40)
        idata = prior
        idata.add_groups(posterior=prior.prior)
        pm.compute_log_likelihood(idata, progressbar=False)
    assert idata.log_likelihood["y"].shape == (1, 20, 40)


# --- Algorithm 1 against grid quadrature (d = 1) ---------------------------------------------

SIG, NU, PRIOR_SD = 1.0, 3.0, 10.0


def _quadrature(y, rate, radius, fresh, theta_ref=0.0):
    """Exact eps (Prop. 2, eq. 17) and delta = pi(N^c | D + {fresh}) on a theta grid."""

    def log_fp(v, th):
        lf = stats.norm.logpdf(v, th, SIG)
        lg = stats.t.logpdf(v, NU)
        return np.logaddexp(np.log1p(-rate) + lf, np.log(rate) + lg)

    th = np.linspace(-1.5, 1.5, 1501)
    lp = stats.norm.logpdf(th, 0, PRIOR_SD) + log_fp(y[None, :], th[:, None]).sum(axis=1)
    lw = lp - special.logsumexp(lp)
    z = np.concatenate([np.linspace(-50, 50, 2001), np.linspace(-8, 8, 8001)])
    lfz = log_fp(z[None, :], th[:, None])
    log_e = special.logsumexp(lw[:, None] + lfz, axis=0)
    ball = np.abs(th - theta_ref) <= radius
    eps = np.max(lfz[ball].max(axis=0) - log_e) + np.max(log_e - lfz[ball].min(axis=0))
    lw2 = lw + log_fp(fresh, th)
    delta = np.exp(special.logsumexp(lw2[~ball]) - special.logsumexp(lw2))
    return eps, delta


@pytest.fixture(scope="module")
def shared_d():
    model = LocationModel(SIG, StudentTContamination(NU, 1.0), prior_sd=PRIOR_SD)
    rng = np.random.default_rng(11)
    y, _ = model.simulate(59, np.zeros(1), 0.2, rng, RecordDomain())
    return model, y


@pytest.mark.slow
def test_estimates_agree_with_quadrature(shared_d):
    model, y = shared_d
    rate, radius, fresh = 0.2, 0.25, 0.4
    eps_q, delta_q = _quadrature(y, rate, radius, fresh)
    runs = np.array(
        [
            privacy_on_dataset(
                model, y, None, [0.0], rate, radius, None, 2000, seed, fresh=(fresh, [1.0])
            )
            for seed in range(8)
        ]
    )
    mean, sd = runs.mean(axis=0), runs.std(axis=0, ddof=1)
    # 4 standard errors of the mean, plus the per-run sd for the bias of a max of noisy ratios
    tol = 4 * sd / np.sqrt(len(runs)) + sd + 1e-3
    assert abs(mean[0] - eps_q) < tol[0], (mean[0], eps_q, tol[0])
    assert abs(mean[1] - delta_q) < tol[1], (mean[1], delta_q, tol[1])
    assert 0.05 < eps_q < 5 and 1e-4 < delta_q < 0.9  # a non-trivial case


def test_definition_holds_for_many_sets(shared_d):
    """pi(A|X) <= e^eps pi(A|Y) + delta for half-lines and intervals (Prop. 2 is exact)."""
    model, y = shared_d
    rate, radius = 0.2, 0.25
    eps, delta = privacy_on_dataset(
        model, y, None, [0.0], rate, radius, None, 4000, 1, worst_case_delta=True
    )
    th = np.linspace(-2.5, 2.5, 5001)

    def post(extra):
        v = np.append(y, extra)
        lf = stats.norm.logpdf(v[None, :], th[:, None], SIG)
        lg = stats.t.logpdf(v, NU)[None, :]
        lp = stats.norm.logpdf(th, 0, PRIOR_SD)
        lp = lp + np.logaddexp(np.log(0.8) + lf, np.log(0.2) + lg).sum(axis=1)
        w = np.exp(lp - lp.max())
        return np.cumsum(w / w.sum())

    records = [-30.0, -4.0, -2.5, -1.0, 0.0, 1.5, 3.0, 8.0]
    cdfs = {r: post(r) for r in records}
    cuts = np.arange(0, len(th), 50)
    slack = 0.02  # Monte Carlo error of eps-hat and delta-hat (see the quadrature test)
    for xr in records:
        for yr in records:
            cx, cy = cdfs[xr][cuts], cdfs[yr][cuts]
            lower = (cx, cy)  # A = (-inf, t]
            upper = (1 - cx, 1 - cy)  # A = (t, inf)
            s_lt_t = np.triu_indices(len(cuts), 1)
            inter = (  # A = (s, t], s < t
                (cx[None, :] - cx[:, None])[s_lt_t],
                (cy[None, :] - cy[:, None])[s_lt_t],
            )
            for px, py in (lower, upper, inter):
                assert np.all(px <= math.exp(eps + slack) * py + delta + slack)


# --- trends and must-fail cases ---------------------------------------------------------------


@pytest.mark.slow
def test_location_model_trend_in_n():
    """eps-hat and delta-hat fall with n under the schedules p_n and r_n (section 2.3)."""
    g = TruncatedStudentT(3, 12.0, -150, 150)
    model = LocationModel(12.0, g, lower=-150, upper=150)
    curve = privacy_curve(
        [100, 1000, 5000],
        lambda n: min(0.5, 1.3 * n**-0.2),
        lambda n: 1.5 * n**-0.12,
        model,
        [0.0],
        reps=4,
        mc_draws=800,
        rng=3,
    )
    assert np.all(np.diff(curve.eps_mean) < 0) and np.all(np.diff(curve.delta_mean) < 0)
    assert np.all(curve.eps_max >= curve.eps_mean) and np.all(curve.delta_max >= curve.delta_mean)


def test_rate_and_radius_trends(shared_d):
    model, _ = shared_d
    kw = dict(reps=3, mc_draws=1000, rng=5)
    lo = estimate_privacy(model, [0.0], 100, 0.05, 0.25, **kw)
    hi = estimate_privacy(model, [0.0], 100, 0.4, 0.25, **kw)
    assert hi.eps_mean < lo.eps_mean
    wide = estimate_privacy(model, [0.0], 100, 0.2, 0.5, **kw)
    narrow = estimate_privacy(model, [0.0], 100, 0.2, 0.15, **kw)
    assert wide.delta_mean < narrow.delta_mean and wide.eps_mean > narrow.eps_mean


def test_contaminated_logistic_has_smaller_eps():
    model = LogisticRegression(2, prior_sd=5.0)
    dom = RecordDomain(x_radius=1.0, directions=6)
    kw = dict(domain=dom, reps=2, mc_draws=800, rng=2)
    clean = estimate_privacy(model, [0.5, -1.0], 300, 0.0, 0.3, **kw)
    dirty = estimate_privacy(model, [0.5, -1.0], 300, 0.3, 0.3, **kw)
    assert np.isfinite(clean.eps_mean) and dirty.eps_mean < clean.eps_mean


def test_gaussian_without_contamination_on_unbounded_domain_is_not_private():
    model = LocationModel(1.0)
    est = estimate_privacy(model, [0.0], 100, 0.0, 0.3, reps=2, mc_draws=300, rng=0)
    assert est.eps_mean == math.inf and est.eps_max == math.inf
    # on a bounded domain the same model has a finite estimate
    bounded = estimate_privacy(model, [0.0], 100, 0.0, 0.3, (-5, 5), 2, 300, rng=0)
    assert np.isfinite(bounded.eps_max)
    reg = LinearRegression(2, 1.0)
    est = estimate_privacy(reg, [0.0, 1.0], 100, 0.0, 0.3, RecordDomain(directions=4), 1, 300)
    assert est.eps_max == math.inf


def test_light_tailed_g_is_refused():
    for model in (
        LocationModel(1.0, StudentTContamination(np.inf, 1.0)),  # a Normal with the model's sd
        LinearRegression(2, 1.0, StudentTContamination(np.inf, 1.0, beta=[0.0, 1.0])),
        LocationModel(1.0, TruncatedStudentT(3, 1.0, -10, 10)),  # no mass beyond +-10
    ):
        with pytest.raises(ModelNotPrivateError, match="Assumption 4"):
            estimate_privacy(model, [0.0] * model.dim, 100, 0.1, 0.3, reps=1, mc_draws=50)
    # a heavier Normal satisfies the condition, as does a t
    ok = LocationModel(1.0, StudentTContamination(np.inf, 3.0))
    est = estimate_privacy(ok, [0.0], 100, 0.1, 0.3, reps=1, mc_draws=300, rng=0)
    assert np.isfinite(est.eps_mean)


def test_estimate_privacy_validates_arguments():
    model = LocationModel(1.0, StudentTContamination(3))
    with pytest.raises(ValueError, match="`radius` must be positive"):
        estimate_privacy(model, [0.0], 100, 0.1, 0.0)
    with pytest.raises(ValueError, match="`n` must be"):
        estimate_privacy(model, [0.0], 1, 0.1, 0.1)
    with pytest.raises(ValueError, match="`theta_ref`"):
        estimate_privacy(model, [0.0, 1.0], 100, 0.1, 0.1)
    with pytest.raises(TypeError, match="`model_builder`"):
        estimate_privacy(lambda y: None, [0.0], 100, 0.1, 0.1)
    with pytest.raises(ValueError, match="`rate` > 0 needs"):
        estimate_privacy(LocationModel(1.0), [0.0], 100, 0.1, 0.1)


# --- release --------------------------------------------------------------------------------


@pytest.mark.slow
def test_release_is_one_draw_with_an_uncertified_separate_report():
    g = StudentTContamination(3, 1.0)
    y = _seeded(contaminate, np.random.default_rng(0).normal(1, 1, 80), 0.2, g, rng=2)
    est = estimate_privacy(LocationModel(1.0, g), [1.0], 80, 0.2, 0.3, reps=2, mc_draws=300, rng=0)
    with pm.Model(coords={"obs": np.arange(80)}):
        mu = pm.Normal("mu", 0, 10)
        pm.Deterministic("resid", y - mu, dims="obs")
        contaminated_likelihood("y", pm.Normal.dist(mu, 1.0), g, 0.2, y, dims="obs")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            idata = sample_contaminated(privacy=est, tune=300, thin=2)
            two = pp.sample_contaminated(2, privacy=est, tune=300, thin=2, random_seed=1)
    assert idata.groups() == ["posterior"]
    assert idata.posterior["mu"].shape == (1, 1) and "resid" not in idata.posterior
    report = idata.attrs["contamination_privacy"]
    assert report["certified"] is False and report["draws_covered"] == 1
    assert report["eps_hat"] == pytest.approx(est.eps_mean) and "estimate" in report["statement"]
    assert not any(k.startswith("dp_") for k in idata.attrs)
    r2 = two.attrs["contamination_privacy"]
    assert r2["eps_hat"] == pytest.approx(2 * est.eps_mean) and r2["seeded"] is True
    with pm.Model():
        pm.Normal("y", pm.Normal("m"), 1, observed=y)
        with pytest.raises(ModelNotPrivateError, match="contaminated_likelihood"):
            sample_contaminated()
