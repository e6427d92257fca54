"""The certified combination: a per-record bound of the contaminated likelihood as the clip.

The bounds are checked against an independent computation (SciPy densities mixed by hand)
on dense grids of records and parameters: the grid maximum must not exceed the bound, and
must come close to it (the derivations are tight: a loose bound would cost noise). The
must-fail cases (p = 0, an unbounded response for a Gaussian f, g vanishing on the domain,
a truncated-Normal location model) are refused before any ledger exists. A chain with the
certified clip clips no record; an audit with worst-case neighbours stays below the claim.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import special, stats

import pymc_penalty as pp
from pymc_penalty import ModelNotPrivateError, NotPrivateWarning
from pymc_penalty import audit as pa
from pymc_penalty.contamination import (
    BernoulliContamination,
    LinearRegression,
    LocationModel,
    LogisticRegression,
    RecordDomain,
    StudentTContamination,
    TruncatedStudentT,
    certified_bound,
    certified_step,
)

# --- independent log-densities -------------------------------------------------------------


def _gauss_fp(y, mu, sigma, rate, g_pdf):
    return np.log((1 - rate) * stats.norm.pdf(y, mu, sigma) + rate * g_pdf)


def _logit_fp(y, mu, rate, q):
    s = special.expit(mu)
    return np.log((1 - rate) * np.where(y == 1, s, 1 - s) + rate * np.where(y == 1, q, 1 - q))


def _grid_sup(kind, logf, mus):
    """Max over records (columns) of the range (constant) or slope (lipschitz) over mu."""
    if kind == "constant":
        return float(np.max(logf.max(axis=0) - logf.min(axis=0)))
    return float(np.max(np.abs(np.diff(logf, axis=0) / np.diff(mus)[:, None])))


@pytest.mark.parametrize("kind", ["constant", "lipschitz"])
@pytest.mark.parametrize("rate", [0.02, 0.1, 0.4])
@pytest.mark.slow
def test_location_bound_holds_and_is_tight_on_a_dense_grid(kind, rate):
    g = StudentTContamination(3, 10.0, loc=1.0)
    model = LocationModel(sigma=2.0, density=g)
    domain = RecordDomain(y=(-30.0, 25.0))
    bound = certified_bound(model, rate, domain, kind=kind).clip
    ys = np.linspace(-30.0, 25.0, 551)
    mus = np.linspace(-200.0, 200.0, 16_001)  # theta far outside the record domain too
    g_pdf = stats.t.pdf((ys - 1.0) / 10.0, 3) / 10.0
    logf = _gauss_fp(ys[None, :], mus[:, None], 2.0, rate, g_pdf[None, :])
    sup = _grid_sup(kind, logf, mus)
    assert sup <= bound * (1 + 1e-9)
    assert sup >= 0.995 * bound  # attained (the constant at the domain's far end)


@pytest.mark.parametrize("kind", ["constant", "lipschitz"])
def test_regression_bound_with_a_covariate_shifted_g_holds_on_a_grid(kind):
    rate, beta, sigma = 0.1, np.array([0.5, 2.0, -1.0]), 1.5
    g = StudentTContamination(4, sigma, beta=beta)
    model = LinearRegression(3, sigma, g)
    domain = RecordDomain(y=(-10.0, 10.0), x_radius=1.0)
    bound = certified_bound(model, rate, domain, kind=kind).clip
    rng = np.random.default_rng(3)
    u = rng.standard_normal((40, 2))
    xs = u / np.linalg.norm(u, axis=1, keepdims=True) * rng.random((40, 1)) ** 0.5
    ys = np.linspace(-10.0, 10.0, 201)
    sup = 0.0
    for x in xs:
        loc = beta[0] + x @ beta[1:]
        mus = np.linspace(-60.0, 60.0, 3001)  # mu = x^T theta for any theta
        logf = _gauss_fp(
            ys[None, :],
            mus[:, None],
            sigma,
            rate,
            stats.t.pdf((ys - loc) / sigma, 4)[None, :] / sigma,
        )
        # d/dtheta_j = x_j d/dmu; the bound is per coordinate (|x_j| <= 1 = intercept).
        scale = 1.0 if kind == "constant" else max(1.0, np.abs(x).max())
        sup = max(sup, _grid_sup(kind, logf, mus) * scale)
    assert sup <= bound * (1 + 1e-9)
    assert sup >= 0.5 * bound  # the grid of x does not reach the worst corner exactly


@pytest.mark.parametrize("kind", ["constant", "lipschitz"])
@pytest.mark.parametrize("q", [0.5, 0.2])
def test_logistic_bound_is_exact(kind, q):
    rate = 0.1
    model = LogisticRegression(2, BernoulliContamination(q))
    bound = certified_bound(model, rate, RecordDomain(x_radius=1.0), kind=kind).clip
    mus = np.linspace(-40.0, 40.0, 160_001)
    logf = np.stack([_logit_fp(y, mus, rate, q) for y in (0, 1)], axis=1)
    sup = _grid_sup(kind, logf, mus)
    assert sup <= bound * (1 + 1e-9)
    assert sup >= 0.999 * bound


def test_contamination_shrinks_the_logistic_lipschitz_bound_below_one():
    model = LogisticRegression(2)
    lips = [certified_bound(model, r, kind="lipschitz").clip for r in (0.01, 0.1, 0.5)]
    assert 1.0 > lips[0] > lips[1] > lips[2]


# --- must fail ----------------------------------------------------------------------------


def test_no_bound_without_contamination():
    g = StudentTContamination(3, 10.0)
    with pytest.raises(ModelNotPrivateError, match="rate p is 0"):
        certified_bound(LocationModel(1.0, g), 0.0, RecordDomain(y=(-5, 5)))
    with pytest.raises(ModelNotPrivateError, match="rate p is 0"):
        certified_bound(LogisticRegression(2), 0.0)


@pytest.mark.parametrize("nu", [3.0, math.inf])  # heavy tails do not help; nor a light g
def test_gaussian_on_an_unbounded_response_is_refused(nu):
    g = StudentTContamination(nu, 1.0)
    for kind in ("constant", "lipschitz"):
        with pytest.raises(ModelNotPrivateError, match="bounded RecordDomain"):
            certified_bound(LocationModel(1.0, g), 0.1, kind=kind)
        with pytest.raises(ModelNotPrivateError, match="bounded RecordDomain"):
            certified_bound(LinearRegression(2, 1.0, g), 0.1, kind=kind)


def test_g_vanishing_on_the_domain_truncation_and_loc_fn_are_refused():
    narrow = TruncatedStudentT(3, 1.0, -2.0, 2.0)
    with pytest.raises(ModelNotPrivateError, match="no positive lower bound"):
        certified_bound(LocationModel(1.0, narrow), 0.1, RecordDomain(y=(-3.0, 3.0)))
    truncated = LocationModel(1.0, TruncatedStudentT(3, 1.0, -3.0, 3.0), lower=-3.0, upper=3.0)
    with pytest.raises(ModelNotPrivateError, match="truncated-Normal"):
        certified_bound(truncated, 0.1)
    g = StudentTContamination(3, 1.0, loc_fn=lambda x: x[..., 0])
    with pytest.raises(ModelNotPrivateError, match="loc_fn"):
        certified_bound(LinearRegression(2, 1.0, g), 0.1, RecordDomain(y=(-3.0, 3.0)))
    with pytest.raises(ValueError, match="`kind`"):
        certified_bound(LogisticRegression(2), 0.1, kind="distance")


def test_certified_step_refuses_a_mismatched_model_before_any_ledger():
    g = StudentTContamination(3, 5.0)
    model = LocationModel(1.0, g)
    domain = RecordDomain(y=(-10.0, 10.0))
    y = np.linspace(-3, 3, 50)
    with model.pymc_model(y, rate=0.2):
        with pytest.raises(ValueError, match="another contamination rate"):
            certified_step(model, 0.1, domain=domain, epsilon=1.0, delta=1e-5)
        with pytest.raises(ValueError, match="`clip` is set"):
            certified_step(model, 0.2, domain=domain, epsilon=1.0, delta=1e-5, clip=1.0)
    with LocationModel(1.0, None).pymc_model(y):
        with pytest.raises(ValueError, match="not a contaminated likelihood"):
            certified_step(model, 0.2, domain=domain, epsilon=1.0, delta=1e-5)


# --- the chain and the audit ----------------------------------------------------------------

RATE = 0.1
G = StudentTContamination(3, 5.0)
DOMAIN = RecordDomain(y=(-15.0, 15.0))
LOC = LocationModel(1.0, G)


def _data(n=100, seed=5):
    y = np.clip(np.random.default_rng(seed).normal(1.0, 1.0, n), *DOMAIN.y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotPrivateWarning)
        return np.clip(pp.contaminate(y, RATE, G, rng=seed), *DOMAIN.y)


@pytest.mark.parametrize("kind", ["constant", "lipschitz"])
@pytest.mark.slow
def test_a_chain_with_the_certified_clip_clips_no_record(kind):
    y = _data()
    with LOC.pymc_model(y, rate=RATE) as model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # reproducible_noise: the clipped count is then exact (a test, not a release).
        step = certified_step(LOC, RATE, domain=DOMAIN, kind=kind, noise_sd=0.5,
                              reproducible_noise=True)  # fmt: skip
        other = pp.PenaltyMetropolis(noise_sd=0.5, clip=0.2, reproducible_noise=True)
    point = model.initial_point()
    counts, other_counts = [], []
    for _ in range(300):
        point, st = step.step(point)
        counts.append(st[0]["dp_clipped_count"])
        other_counts.append(other.step(point)[1][0]["dp_clipped_count"])
    assert sum(counts) == 0.0
    assert step.certified_bound.kind == kind
    assert sum(other_counts) > 0  # an ordinary clip of 0.2 does clip: the check can fail


#: Worst-case pairs. Constant: theta = -15 -> 15 moves a record at y = -15 from ratio -B
#: to +B at y = 15 (B is attained there), 2B in all; the other records sit symmetrically
#: about 0, so their ratios cancel and the acceptance stays below 1. Lipschitz: a short step
#: where the slope of a record at y = -15 is near its supremum, the other records symmetric
#: about the step's midpoint.
AUDIT_PAIRS = {"constant": (-15.0, 15.0), "lipschitz": (-12.6, -12.2)}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["constant", "lipschitz"])
def test_certified_step_audits_below_its_claim(kind):
    a, b = AUDIT_PAIRS[kind]
    half = np.linspace(0.2, 2.0, 10)
    y = np.concatenate([[DOMAIN.y[0]], 0.5 * (a + b) + half, 0.5 * (a + b) - half])

    def factory(data):
        model = LOC.pymc_model(data, rate=RATE)
        with model, warnings.catch_warnings():
            warnings.simplefilter("ignore", NotPrivateWarning)
            return model, certified_step(LOC, RATE, domain=DOMAIN, kind=kind, mu=1.0)

    result = pa.audit_step(
        factory,
        y,
        record=DOMAIN.y[1],
        point=np.array([a]),
        proposal=np.array([b]),
        runs=10_000,
        label=f"certified contamination step ({kind})",
    )
    print(f"\n{result}")
    assert result.epsilon_lb < result.claimed_epsilon, str(result)
    assert not result.exceeds_claim
    if not math.isnan(result.mu_estimate):
        assert result.mu_estimate < 1.1 * result.claimed_mu, str(result)
