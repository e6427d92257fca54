"""``pymc_penalty.sample`` under add/remove-one neighbours with its defaults: the warm start
(which releases a noisy count of the rows, n being private), the found clip started from that
count, and the forecast made from it after the warm start's share.

The conjugate model: Normal mean, known sd 1, prior N(0, 10^2), n rows of mean 3, exact
posterior. Tolerances come from runs measured over seeds (quoted where used).
"""

from __future__ import annotations

import math
import warnings

import arviz as az
import numpy as np
import pymc as pm
import pytest

from pymc_penalty import PrivacyLedger, PrivacyPolicy, UtilityWarning, sample
from pymc_penalty.accounting import gdp_epsilon, gdp_mu
from pymc_penalty.accounting.gdp import likelihood_mu2
from pymc_penalty.model.screen import SCREEN_SHARE
from pymc_penalty.planning.forecast import forecast_run
from pymc_penalty.privacy.ledger import PrivacyLedger as _Ledger
from pymc_penalty.sampling.adaptation.clip import clip_target_fraction, starting_clip
from pymc_penalty.warmstart import WARM_START_STEPS

QUIET = {"progressbar": False, "compute_convergence_checks": False, "cores": 1}
#: Warm-start releases with the default steps: 3 + 1 in the first step (shape, scale, the noisy
#: count of the rows, gradient), then curvature, gradient and clipped count in each of the others.
ADD_REMOVE_WARM_RELEASES = 3 * WARM_START_STEPS + 1
SUBSTITUTE_WARM_RELEASES = 3 * WARM_START_STEPS  # no count of the rows: n is public
#: The public lower bound on the rows that add/remove-one requires (below every n used here).
#: Above 100: the gate counts a constant with at least ``min_rows`` elements as records, and
#: the anisotropic Gaussian's known covariance has 10 x 10.
MIN_ROWS = 1000


def conjugate(n: int, *, initval: float | None = None, seed: int = 11):
    """The model, its exact posterior mean and sd."""
    y = np.random.default_rng(seed).normal(3.0, 1.0, size=n)
    post_var = 1.0 / (n + 1.0 / 100.0)
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, 10.0, initval=initval)
        pm.Normal("y", m, 1.0, observed=y)
    return model, post_var * y.sum(), math.sqrt(post_var)


@pytest.fixture
def spends(monkeypatch):
    """Every ``mu^2`` the ledger grants, recorded apart from the ledger's own sum."""
    granted: list[float] = []
    original = _Ledger.try_spend

    def recording(self, mu2):
        ok = original(self, mu2)
        if ok:
            granted.append(float(mu2))
        return ok

    monkeypatch.setattr(_Ledger, "try_spend", recording)
    return granted


@pytest.mark.slow
def test_default_add_remove_run_spends_within_budget_and_reports_the_warm_start(spends):
    model, _, _ = conjugate(2000)
    epsilon, delta = 2.0, 1e-5
    idata = sample(
        method="penalty",
        epsilon=epsilon,
        delta=delta,
        draws=50,
        chains=2,
        neighbours="add_remove",
        min_rows=MIN_ROWS,
        model=model,
        random_seed=1,
        **QUIET,
    )
    attrs = idata.attrs
    # The warm start ran by default, with its noisy count of the rows among its releases.
    assert attrs["dp_warm_start_share"] == pytest.approx(0.2)
    assert attrs["dp_warm_start_releases"] == ADD_REMOVE_WARM_RELEASES
    assert attrs["dp_warm_start_mu"] > 0
    assert attrs["dp_tune"] == 100  # tune="auto" after a warm start
    # Independently: every release the ledger granted, the warm start's included.
    # The screen of unevaluable rows is the first (issue 28).
    assert len(spends) == 1 + ADD_REMOVE_WARM_RELEASES + attrs["dp_releases"]
    total_mu = math.sqrt(sum(spends))
    assert gdp_epsilon(mu=total_mu, delta=delta) <= epsilon * (1 + 1e-9)
    assert total_mu == pytest.approx(attrs["dp_mu"], rel=1e-6)
    assert attrs["dp_epsilon"] <= epsilon
    budget_mu2 = gdp_mu(epsilon, delta) ** 2
    assert spends[0] == pytest.approx(SCREEN_SHARE * budget_mu2, rel=1e-6)
    assert math.sqrt(spends[0]) == pytest.approx(attrs["dp_screen_mu"], rel=1e-6)
    # The warm start's own releases come next, and sum to its reported mu.
    warm_mu2 = sum(spends[1 : 1 + ADD_REMOVE_WARM_RELEASES])
    assert math.sqrt(warm_mu2) == pytest.approx(attrs["dp_warm_start_mu"], rel=1e-6)
    assert warm_mu2 == pytest.approx(0.2 * (1 - SCREEN_SHARE) * budget_mu2, rel=1e-6)


def test_the_substitute_warm_start_has_one_release_fewer(spends):
    """Control: the count of the rows is what add/remove-one adds (n is public otherwise)."""
    model, _, _ = conjugate(2000)
    idata = sample(
        method="penalty",
        epsilon=2.0,
        delta=1e-5,
        draws=20,
        chains=1,
        model=model,
        random_seed=1,
        **QUIET,
    )
    assert idata.attrs["dp_warm_start_releases"] == SUBSTITUTE_WARM_RELEASES
    assert len(spends) == 1 + SUBSTITUTE_WARM_RELEASES + idata.attrs["dp_releases"]  # + screen


def _error_sd(idata, mean, sd):
    return abs(float(idata.posterior["m"].values.mean()) - mean) / sd


def test_default_add_remove_chains_land_on_the_conjugate_model():
    """Measured (this model, n = 2e4, epsilon = 2, delta = 5e-6, draws 500, 2 chains): |error|
    0.02-0.24 sd, R-hat 1.03-1.13 (seeds 1-8); 0.06-0.41 sd in 22 runs of this call (the
    privacy noise is fresh in each); tolerance 1 sd. With ``tune="auto"`` at 100 steps
    instead of 200 (2026-11-27): 0.004-0.37 sd in 12 runs of this call. Before the warm
    start's count started the found clip (at 1 instead), 0.27-1.2 sd and R-hat 1.6-2.7."""
    n = 20_000
    model, mean, sd = conjugate(n)
    idata = sample(
        method="penalty",
        epsilon=2.0,
        delta=0.1 / n,
        draws=500,
        chains=2,
        neighbours="add_remove",
        min_rows=MIN_ROWS,
        model=model,
        random_seed=3,
        **QUIET,
    )
    assert idata.attrs["dp_warm_start_releases"] == ADD_REMOVE_WARM_RELEASES
    assert idata.attrs["dp_tune"] == 100
    assert _error_sd(idata, mean, sd) < 1.0


def anisotropic_gaussian(n: int, d: int, seed: int = 7):
    """``benchmarks/gauss.py``'s workload: rows N(theta, Sigma), scales 0.1 to 10 in a random
    rotation, prior N(0, 10^2 I); the model and the exact posterior mean and sds."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    cov = q @ np.diag(np.geomspace(0.1, 10.0, d) ** 2) @ q.T
    X = rng.multivariate_normal(rng.normal(size=d), cov, size=n)
    prec = np.linalg.inv(cov)
    post_cov = np.linalg.inv(n * prec + np.eye(d) / 100.0)
    with pm.Model() as model:
        th = pm.Normal("th", 0.0, 10.0, shape=d)
        pm.MvNormal("x", mu=th, cov=cov, observed=X)
    return model, post_cov @ (prec @ X.sum(axis=0)), np.sqrt(np.diag(post_cov))


@pytest.mark.slow
def test_without_the_warm_start_the_chains_do_not_land():
    """The must-fail control: on ``benchmarks/gauss.py``'s workload at n = 1e4, epsilon = 6
    (add/remove-one, draws 300, 2 chains), the defaults land and the same plan without the
    warm start (tune 100 as theirs) does not.

    Measured (RMS error over the 10 coordinates in posterior sd, largest R-hat): defaults
    0.08-0.81, R-hat 1.18-1.88 (23 runs of this call or of seeds 1-4; the privacy noise is
    fresh in each); the control 20.9-22.1 (8 runs), and 12-45, R-hat 2.7-3.2 with
    tune="auto" (1000). Before the found clip started from the released count the defaults had
    R-hat 2.4-3.1. Tolerances: 1.5 sd and R-hat 2.3 for the defaults, 5 sd for the control.

    The defaults' privacy noise is seeded (``reproducible_noise``: the same algorithm and noise
    distribution, a fixed stream): with fresh noise R-hat was 1.21-2.05 (mean 1.51, sd 0.23)
    in 26 runs of this call, so R-hat > 2.3 would fail about 1 run in 130 (a log-normal fit
    of R-hat - 1). Seeded: RMS error 0.48, R-hat 1.46. Those figures are for 200 tuning
    steps; with ``tune="auto"`` at 100 (2026-11-27) 12 runs with fresh noise gave 0.17-0.37
    sd and R-hat 1.22-1.60 (mean 1.38), and the seeded run 0.20 and R-hat 1.24."""
    n = 10_000
    model, mean, sd = anisotropic_gaussian(n, 10)
    kwargs = dict(
        epsilon=6.0, delta=0.1 / n, draws=300, chains=2, neighbours="add_remove", min_rows=MIN_ROWS
    )

    def rms_error(idata):
        draws = idata.posterior["th"].values.reshape(-1, mean.size)
        return float(np.sqrt(np.mean(((draws.mean(axis=0) - mean) / sd) ** 2)))

    seeded = {"reproducible_noise": True}
    warm = sample(
        method="penalty", model=model, random_seed=1, step_kwargs=seeded, **kwargs, **QUIET
    )
    assert warm.attrs["dp_tune"] == 100
    cold = sample(
        method="penalty", model=model, random_seed=1, warm_start=0, tune=100, **kwargs, **QUIET
    )
    assert cold.attrs["dp_warm_start_releases"] == 0
    print(
        f"\nRMS error in posterior sd: defaults {rms_error(warm):.3g}, cold {rms_error(cold):.3g}"
    )
    assert rms_error(warm) < 1.5
    assert float(az.rhat(warm).to_array().max()) < 2.3
    assert rms_error(cold) > 5.0


# --- the forecast from the released count ----------------------------------------------------

#: An unusual n: its printed form would be noticed in any output.
N_ODD = 1237


def _starved(model, **kwargs):
    return sample(
        method="penalty",
        epsilon=0.3,
        delta=1e-5,
        draws=20,
        tune=20,
        chains=2,
        neighbours="add_remove",
        min_rows=MIN_ROWS,
        model=model,
        random_seed=2,
        **kwargs,
        **QUIET,
    )


@pytest.mark.slow
def test_add_remove_forecast_comes_after_the_warm_start_from_its_released_count(tmp_path):
    model, _, _ = conjugate(N_ODD)
    path = tmp_path / "ledger"
    with warnings.catch_warnings():
        warnings.simplefilter("error", UtilityWarning)
        with pytest.raises(UtilityWarning, match="hopeless") as info:
            _starved(model, ledger_path=path)
    text = str(info.value)
    assert "after the warm start's share" in text and "released noisy count" in text
    assert str(N_ODD) not in text
    # Raised after the screen and the warm start spent their shares, before any chain spent.
    spent = PrivacyLedger.open(path).spent_mu2
    shares = SCREEN_SHARE + 0.2 * (1 - SCREEN_SHARE)
    assert spent == pytest.approx(shares * gdp_mu(0.3, 1e-5) ** 2, rel=1e-6)

    with pytest.warns(UtilityWarning, match="after the warm start's share") as record:
        idata = _starved(model)
    attrs = idata.attrs
    assert attrs["dp_forecast_verdict"] == "hopeless"
    rows = attrs["dp_forecast_rows"]
    # The released count (an integer since counts are released on the integers: it equals n
    # by chance in a few percent of runs, CI met one, which is no leak); never n itself.
    assert rows >= 2.0 and float(rows).is_integer()
    # The forecast is the post-processing of that count (and, as a control, not of n).
    step_mu = float(idata.sample_stats["dp_mu"].values[0, 0])
    kept = math.sqrt(likelihood_mu2(step_mu, 2 * 20, 0.05))

    def ess(n_rows):
        return forecast_run(
            kept,
            budget_mu=gdp_mu(0.3, 1e-5),
            delta=1e-5,
            n=n_rows,
            d=1,
            steps=40,
            neighbours="add_remove",
            likelihood="gaussian",
        ).ess

    assert attrs["dp_forecast_ess"] == pytest.approx(ess(rows), rel=1e-9)
    if rows != N_ODD:
        assert attrs["dp_forecast_ess"] != pytest.approx(ess(N_ODD), rel=1e-9)
    # No exact n anywhere: not in a warning, not in a report value.
    for w in record:
        assert str(N_ODD) not in str(w.message)
    for key, value in attrs.items():
        if key == "dp_forecast_rows":  # the released count, checked above
            continue
        if np.asarray(value).dtype.kind == "f":
            # A noisy float (the released count centred on n, R-hat, ESS) holds the digits
            # "1237" by chance in about 0.7% of runs (computed from their spread): only n
            # itself would carry it.
            assert not np.any(np.asarray(value) == N_ODD), key
        else:
            assert str(N_ODD) not in str(value), key


def test_the_found_clip_starts_from_the_released_count():
    """After the warm start the chains' found clip starts where substitute-one's would, at the
    released count of the rows; without a warm start (control) at 1, as before."""
    model, _, _ = conjugate(N_ODD)
    kwargs = dict(
        epsilon=4.0,
        delta=1e-5,
        draws=10,
        tune=10,
        chains=2,
        neighbours="add_remove",
        min_rows=MIN_ROWS,
    )
    # clip_tail pinned at 1: the start's factor from the warm start's found clip (released,
    # noisy) is tested in test_clip_tail.py; here, the row count it starts from.
    # Seeded noise (tests only): the released count is a fixed draw. It is snapped to whole
    # rows, so with fresh noise it equals n in about 1 run in 55 (sd 21.6) and the check
    # below could not tell the released count from n (CI failed once on exactly that).
    kwargs["step_kwargs"] = {
        "clip_tail": 1.0,
        "privacy": PrivacyPolicy(reproducible_noise=True),
    }
    warm = sample(
        method="penalty", model=model, random_seed=4, discard_tuned_samples=False, **kwargs, **QUIET
    )
    rows = warm.attrs["dp_forecast_rows"]
    assert rows != N_ODD  # the seeded draw is not the one in 55 that lands on n
    first = warm.warmup_sample_stats["dp_clip"].values[:, 0]
    np.testing.assert_allclose(first, starting_clip(rows, clip_target_fraction(rows)), rtol=1e-12)
    assert first[0] != pytest.approx(starting_clip(N_ODD, clip_target_fraction(N_ODD)), rel=1e-10)
    cold = sample(
        method="penalty",
        model=model,
        random_seed=4,
        warm_start=0,
        discard_tuned_samples=False,
        **kwargs,
        **QUIET,
    )
    np.testing.assert_array_equal(cold.warmup_sample_stats["dp_clip"].values[:, 0], 1.0)


def test_no_forecast_under_add_remove_without_a_warm_start():
    model, _, _ = conjugate(N_ODD)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UtilityWarning)
        idata = _starved(model, warm_start=0)
    assert "dp_forecast_ess" not in idata.attrs and "dp_forecast_rows" not in idata.attrs
