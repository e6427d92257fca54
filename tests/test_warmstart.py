"""The private warm start: paid for before the data are touched, reported, and accurate."""

from __future__ import annotations

import math

import numpy as np
import pymc as pm
import pytest
from scipy import optimize, stats

import pymc_penalty as pp
from pymc_penalty import PrivacyLedger
from pymc_penalty.errors import WarmStartRefused
from pymc_penalty.model.likelihood import PenaltyLikelihood
from pymc_penalty.model.screen import SCREEN_SHARE
from pymc_penalty.warmstart import WARM_START_STEPS, private_warm_start, warm_start_schedule

pytestmark = pytest.mark.filterwarnings("ignore::pymc_penalty.FrozenChainWarning")
QUIET = dict(progressbar=False, compute_convergence_checks=False)
N = 2000
#: The public lower bound on the rows that add/remove-one requires (ignored under
#: substitute-one).
MIN_ROWS = 1000


@pytest.fixture(scope="module")
def data():
    return np.random.default_rng(5).normal(0.5, 1.0, size=N)


@pytest.fixture(scope="module")
def model(data):
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, 10.0)
        pm.Normal("y", m, 1.0, observed=data)
    return model


class RecordingLedger:
    """A ledger that grants ``grants`` releases, then refuses; records every call in
    ``events`` (shared with the likelihood spy, so the order of both is visible)."""

    def __init__(self, events: list, grants: int = 10**9) -> None:
        self.events, self.grants = events, grants

    def try_spend(self, mu2: float) -> bool:
        if self.grants <= 0:
            self.events.append(("refused", mu2))
            return False
        self.grants -= 1
        self.events.append(("spend", mu2))
        return True


@pytest.fixture
def spy(monkeypatch):
    """Record every evaluation of the per-datapoint log-likelihood (a data access)."""
    events: list = []
    original = PenaltyLikelihood.evaluate

    def evaluate(self, *args, **kwargs):
        events.append(("data",))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(PenaltyLikelihood, "evaluate", evaluate)
    return events


def test_schedule_spends_exactly_mu():
    sched = warm_start_schedule(0.7, 8)
    assert len(sched) == 8
    assert math.isclose(sum(g**2 + c**2 for g, c in sched), 0.49, rel_tol=1e-12)
    grads = [g for g, _ in sched]
    assert all(b > a for a, b in zip(grads, grads[1:], strict=False))  # later steps less noisy


def test_each_step_is_paid_before_its_data_access(model, spy):
    ledger = RecordingLedger(spy)
    with model:
        ws = private_warm_start(
            mu=0.5, ledger=ledger, clip=6.0, steps=3, noise_rng=np.random.default_rng(0)
        )
    assert ws.releases == 7
    # Per step: its spends (three in the first: shape, scale, gradient; then curvature and
    # gradient), then 2 d = 2 evaluations (finite differences, d = 1).
    kinds = [e[0] for e in spy]
    assert kinds == ["spend"] * 3 + ["data"] * 2 + (["spend"] * 2 + ["data"] * 2) * 2
    spent = sum(e[1] for e in spy if e[0] == "spend")
    assert math.isclose(math.sqrt(spent), ws.mu, rel_tol=1e-12)
    assert math.isclose(ws.mu, 0.5, rel_tol=1e-12)


@pytest.mark.parametrize("neighbours", ["substitute", "add_remove"])
@pytest.mark.slow
def test_found_clip_counts_are_charged_before_the_data(model, spy, neighbours):
    """clip='auto' adds a clipped count to every step after the first. The ledger's total is
    the sum of an independent list of every release's mu^2, built from the schedule here:
    step 0 splits its curvature mu^2 over the shape and the scale (and the noisy n under
    add/remove-one) and spends its gradient's; each later step spends its curvature's, and
    95% of its gradient's mu^2 on the gradient sum, 5% on the clipped count."""
    mu, steps = 0.5, 3
    ledger = RecordingLedger(spy)
    with model:
        ws = private_warm_start(
            mu=mu, ledger=ledger, clip="auto", steps=steps, neighbours=neighbours,
            min_rows=MIN_ROWS, noise_rng=np.random.default_rng(2),
        )  # fmt: skip
    sched = warm_start_schedule(mu, steps)
    parts = 2 if neighbours == "substitute" else 3
    expected = [sched[0][1] ** 2 / parts] * parts + [sched[0][0] ** 2]
    for g, c in sched[1:]:
        expected += [c**2, 0.95 * g**2, 0.05 * g**2]
    spent = [e[1] for e in spy if e[0] == "spend"]
    np.testing.assert_allclose(spent, expected, rtol=1e-12)
    assert ws.releases == len(expected) == 3 * steps + parts - 2
    assert math.isclose(ws.mu**2, sum(expected), rel_tol=1e-12)
    assert math.isclose(sum(expected), mu**2, rel_tol=1e-12)
    # Every step's releases are paid before its 2 d = 2 evaluations of the data.
    kinds = [e[0] for e in spy]
    assert kinds == ["spend"] * (parts + 1) + ["data"] * 2 + (["spend"] * 3 + ["data"] * 2) * 2
    # The fields the sampler reads.
    assert len(ws.clip_history) == steps + 1 and ws.clip == ws.clip_history[-1]
    assert ws.clipped_fraction is not None and abs(ws.clipped_fraction) < 0.05
    assert ws.metric_clip == pytest.approx(ws.clip / math.sqrt(N), rel=0.05)
    # A real ledger records the same total and number of releases.
    real = PrivacyLedger(1.001 * mu)
    with model:
        private_warm_start(
            mu=mu, ledger=real, clip="auto", steps=steps, neighbours=neighbours, min_rows=MIN_ROWS
        )
    assert real.releases == len(expected)
    assert math.isclose(real.used_mu2, mu**2, rel_tol=1e-6)


def test_a_fixed_clip_releases_no_count(model):
    with model:
        ws = private_warm_start(mu=0.5, ledger=PrivacyLedger(0.6), clip=6.0, steps=3)
    assert ws.clipped_fraction is None and ws.clip_history == (6.0,) * 4
    assert ws.metric_clip == pytest.approx(6.0 / math.sqrt(N))


@pytest.mark.parametrize("neighbours", ["substitute", "add_remove"])
@pytest.mark.slow
def test_a_tiny_budget_gives_a_metric_not_a_crash(model, neighbours):
    """At a tiny budget the released mean log length is mostly noise (sd in the hundreds);
    unclipped it reached about -800 and exp() underflowed the first metric to a singular 0
    (np.linalg.cholesky failed on [[0.]], about 1 run in 4 under add/remove-one). The released
    mean is clipped to the rows' own range, so every seed gives a finite estimate."""
    for seed in range(40):
        with model:
            ws = private_warm_start(
                mu=1e-4,
                ledger=PrivacyLedger(1e-3),
                steps=2,
                neighbours=neighbours,
                min_rows=MIN_ROWS,
                noise_rng=np.random.default_rng(seed),
            )
        assert np.all(np.isfinite(ws.point)) and np.all(np.isfinite(ws.covariance)), seed


@pytest.mark.parametrize(("grants", "steps_done"), [(0, 0), (2, 0), (3, 1), (4, 1), (6, 2)])
@pytest.mark.slow
def test_a_refusing_ledger_stops_the_warm_start_before_the_data(model, spy, grants, steps_done):
    ledger = RecordingLedger(spy, grants=grants)
    with model, pytest.raises(WarmStartRefused):
        private_warm_start(mu=0.5, ledger=ledger, clip=6.0, steps=3)
    # Only steps whose releases were all granted touched the data (2 evaluations each).
    assert sum(e[0] == "data" for e in spy) == 2 * steps_done
    assert spy[-1][0] == "refused"


@pytest.mark.slow
def test_warm_start_lands_near_the_mode_within_its_noise():
    """Normal mean, sd 1, prior N(0, 10^2): exact mode and Fisher information are known.
    The clip is stated in the metric of the estimated per-datapoint Fisher information (1
    here, estimated within a few percent), so no gradient is clipped (|y - m| < C on every
    iterate) and the error is the noise of the averaged last half of the steps:
    sd = 2 C / (F sqrt(sum of their mu_grad^2)), F ~ n."""
    n, mu, clip, steps = 20_000, 1.0, 6.0, 8
    data = np.random.default_rng(6).normal(0.5, 1.0, size=n)
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, 10.0)
        pm.Normal("y", m, 1.0, observed=data)
    assert np.max(np.abs(data)) + 1.0 < clip
    mode = data.sum() / (n + 1e-2)
    sched = warm_start_schedule(mu, steps)
    last = sum(g**2 for g, _ in sched[steps // 2 :])
    err_sd = 2.0 * clip / (n * math.sqrt(last))
    errors, variances = [], []
    for seed in range(6):
        with model:
            ws = private_warm_start(
                mu=mu, ledger=PrivacyLedger(1.001 * mu), clip=clip, steps=steps,
                noise_rng=np.random.default_rng(seed),
            )  # fmt: skip
        errors.append(float(ws.point[0]) - mode)
        variances.append(float(ws.covariance[0, 0]))
    errors = np.asarray(errors)
    # Six seeded runs: each within 4 sd, and their mean square consistent with err_sd^2.
    assert np.all(np.abs(errors) < 4 * err_sd), (errors, err_sd)
    assert stats.chi2.sf(np.sum((errors / err_sd) ** 2), df=6) > 1e-3
    # Covariance: 1 / (sum (y - m)^2 + prior precision) at the mode, up to the curvature
    # noise (sd sqrt(2) C^2 / mu_curv per step, averaged over four: 2.5% of n here).
    exact_var = 1.0 / (np.sum((data - mode) ** 2) + 1e-2)
    np.testing.assert_allclose(variances, exact_var, rtol=0.12)


def _gdp_epsilon_closed_form(mu: float, delta: float) -> float:
    """Tight epsilon of mu-GDP at delta, solved here with SciPy (independent of the package)."""

    def excess(eps: float) -> float:
        return (
            stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
        ) - delta

    return optimize.brentq(excess, 0.0, 50.0, xtol=1e-12)


def test_report_composes_the_warm_start_with_every_chain_release(model):
    eps, delta, share = 1.0, 1e-5, 0.3
    with model:
        idata = pp.sample(method="penalty",
            epsilon=eps, delta=delta, draws=30, tune=20, chains=2, cores=1, warm_start=share,
            warm_start_clip=8.0, random_seed=1, discard_tuned_samples=False, **QUIET,
        )  # fmt: skip
    budget_mu2 = pp.gdp_mu(eps, delta) ** 2
    chain_mu2 = 0.0
    for group in (idata.warmup_sample_stats, idata.sample_stats):  # tuning releases count
        released = np.asarray(group["dp_released"].values, bool)
        chain_mu2 += float(np.sum(np.asarray(group["dp_mu"].values)[released] ** 2))
    assert idata.attrs["dp_releases"] == 2 * (20 + 30)
    # The screen of unevaluable rows spends its share first (issue 28); the warm start takes
    # its share of what is left.
    screen_mu2 = SCREEN_SHARE * budget_mu2
    assert math.isclose(idata.attrs["dp_screen_mu"] ** 2, screen_mu2, rel_tol=1e-9)
    warm_mu2 = share * (budget_mu2 - screen_mu2)
    # Two releases a step (gradient, curvature), one more in the first (the pilot's scale).
    assert idata.attrs["dp_warm_start_releases"] == 2 * WARM_START_STEPS + 1
    assert math.isclose(idata.attrs["dp_warm_start_mu"] ** 2, warm_mu2, rel_tol=1e-9)
    total = _gdp_epsilon_closed_form(math.sqrt(screen_mu2 + warm_mu2 + chain_mu2), delta)
    assert math.isclose(idata.attrs["dp_epsilon"], total, rel_tol=1e-6, abs_tol=1e-9)
    assert idata.attrs["dp_epsilon"] <= eps * (1 + 1e-9)
    # The warm start is part of the total: without it the epsilon would be clearly lower.
    assert _gdp_epsilon_closed_form(math.sqrt(chain_mu2), delta) < 0.95 * total


def test_chains_start_at_the_warm_start_and_constrained_variables_work():
    data = np.random.default_rng(7).normal(0.5, 1.0, size=20_000)
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, 10.0)
        s = pm.HalfNormal("s", 5.0)
        pm.Normal("y", m, s, observed=data)
    with model:
        idata = pp.sample(method="penalty",
            epsilon=2.0, delta=1e-5, draws=20, tune=0, chains=1, cores=1, warm_start=0.5,
            warm_start_clip=6.0, random_seed=3, **QUIET,
        )  # fmt: skip
    first = idata.posterior.isel(chain=0, draw=0)
    # The chain starts near the exact values (m ~ 0.5, s ~ 1), far from the model's initial
    # point (m = 0, s ~ 4). The warm start's noise comes from OS entropy: over 40 runs its
    # error had sd 0.037 in m and 0.020 in s (bias 0.019, -0.023; clipping at 6 biases s),
    # so the tolerances are six sds (plus the bias); both stay below the distance to the
    # initial point.
    assert abs(float(first["m"]) - data.mean()) < 0.25
    assert abs(float(first["s"]) - data.std()) < 0.15


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"warm_start": 1.0}, "warm_start"),
        ({"warm_start": -0.1}, "warm_start"),
        ({"warm_start": "half"}, "warm_start"),
        ({"warm_start": 0.2, "warm_start_steps": 2.5}, "warm_start_steps"),
        ({"warm_start": 0.2, "warm_start_clip": 0.0}, "warm_start_clip"),
        ({"warm_start": 0.2, "warm_start_steps": 0}, "warm_start_steps"),
        ({"warm_start": 0.2, "initvals": {"m": 0.0}}, "initvals"),
    ],
)
def test_bad_warm_start_arguments_are_named(model, kwargs, argument):
    with model, pytest.raises(ValueError, match=f"`{argument}`"):
        pp.sample(
            method="penalty", epsilon=1.0, delta=1e-5, draws=5, tune=5, chains=1, **kwargs, **QUIET
        )
