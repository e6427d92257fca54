"""Several data owners (Algorithm 2): exactness, power, per-owner accounting, validation."""

from __future__ import annotations

import math

import numpy as np
import pymc as pm
import pytest
from conftest import posterior_check
from scipy import stats

from pymc_penalty.accounting import gdp_epsilon
from pymc_penalty.variants.owners import MultiOwnerPenaltyMetropolis, owner_report

SIZES = (6, 14, 30)  # three owners of unequal sizes
#: The public lower bound on the rows that add/remove-one requires (ignored under
#: substitute-one).
MIN_ROWS = 20
OWNERS = np.repeat(np.arange(3), SIZES)
SAMPLE_KWARGS = dict(
    draws=4000, tune=1000, chains=4, cores=1, progressbar=False, compute_convergence_checks=False
)


def normal_normal():
    rng = np.random.default_rng(21)
    y = rng.normal(1.5, 2.0, size=sum(SIZES))
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, 10.0)
        pm.Normal("y", m, 2.0, observed=y)
    prec = 1 / 10.0**2 + y.size / 2.0**2
    post = stats.norm((y.sum() / 2.0**2) / prec, prec**-0.5)
    return model, post


def run_owners(noise_sd, seed, draws=4000, **kwargs):
    model, post = normal_normal()
    # Shuffle the assignment so owners are not contiguous blocks of the data.
    owners = np.random.default_rng(5).permutation(OWNERS)
    with model:
        step = MultiOwnerPenaltyMetropolis(
            owners=owners, noise_sd=noise_sd, clip=None, reproducible_noise=True, **kwargs
        )
        idata = pm.sample(step=step, random_seed=seed, **{**SAMPLE_KWARGS, "draws": draws})
    return idata, post


# --- exactness and power ------------------------------------------------------------------


@pytest.mark.slow
def test_three_owners_target_the_exact_posterior():
    idata, post = run_owners([0.6, 0.9, 1.2], seed=301)
    ok, msg = posterior_check(idata.posterior["m"].values, post.cdf, post.mean())
    assert ok, msg
    ss = idata.sample_stats
    # The test's noise is the sum of the owners' noises.
    assert np.allclose(ss["dp_noise_sd"].values, math.sqrt(0.36 + 0.81 + 1.44))
    assert bool(ss["dp_released"].values.all())
    assert np.all(ss["dp_clipped_fraction"].values == 0.0)


@pytest.mark.slow
def test_checks_have_power_with_a_single_owner_penalty(monkeypatch):
    """Subtracting only sigma^2/2 (one owner's share) instead of N sigma^2/2 must be caught."""
    import pymc_penalty.sampling.kernel as kernel_mod

    original = kernel_mod.penalised_log_ratio

    def one_owner_penalty(d_hat, noise_var, log_prior_ratio, **kwargs):
        return original(d_hat, noise_var / 3.0, log_prior_ratio, **kwargs)

    # Every step shares the one transition (pymc_penalty.sampling.kernel), which calls this
    # function.
    monkeypatch.setattr(kernel_mod, "penalised_log_ratio", one_owner_penalty)
    idata, post = run_owners(1.2, seed=302, draws=12000)
    ok, msg = posterior_check(idata.posterior["m"].values, post.cdf, post.mean())
    assert not ok, f"a chain with a single owner's penalty passed the exactness checks: {msg}"


def test_same_owner_for_all_data_matches_the_parent_release():
    """One owner holding everything releases exactly what PenaltyMetropolis releases."""
    model, _ = normal_normal()
    with model:
        multi = MultiOwnerPenaltyMetropolis(
            owners=np.zeros(sum(SIZES), dtype=int), noise_sd=0.7, clip=0.3, clip_mode="constant"
        )
    x0 = np.array([0.0])
    bound, delta, sigmas, _, mu_owners, mu_out = multi._owner_noise(0.0)
    assert (bound, delta) == (0.3, 0.6)
    assert sigmas.tolist() == [0.7]
    assert mu_owners[0] == pytest.approx(mu_out)
    assert mu_owners[0] == pytest.approx(0.6 / 0.7 / math.sqrt(1 - 0.05))
    # The NumPy segment sum equals the compiled clipped sum.
    ll0, _ = multi._lik.initial(x0, sum(SIZES))
    ll1, _, _, _ = multi._lik.evaluate(np.array([2.0]), ll0, np.inf)
    multi._lik.reset(x0, sum(SIZES))
    clipped_sum, n_clipped, _ = multi._lik.propose(np.array([2.0]), 0.3)
    ratio = ll1 - ll0
    seg = np.bincount(multi.owners, weights=np.clip(ratio, -0.3, 0.3), minlength=1)
    assert seg[0] == pytest.approx(clipped_sum, rel=1e-12)
    assert int(np.sum(np.abs(ratio) > 0.3)) == n_clipped


# --- accounting -----------------------------------------------------------------------------


class RecordingLedger:
    def __init__(self, limit=math.inf):
        self.calls: list[float] = []
        self.limit = limit
        self.spent_mu2 = 0.0

    def try_spend(self, mu2):
        self.calls.append(mu2)
        if self.spent_mu2 + mu2 > self.limit:
            return False
        self.spent_mu2 += mu2
        return True


def _private_step(model, **kwargs):
    with model:
        return MultiOwnerPenaltyMetropolis(
            owners=OWNERS, clip=0.5, clip_mode="constant", tune=False, **kwargs
        )


@pytest.mark.parametrize("neighbours, factor", [("substitute", 2.0), ("add_remove", 1.0)])
@pytest.mark.slow
def test_per_owner_and_outsider_mu_formulas(neighbours, factor):
    model, _ = normal_normal()
    sds = np.array([1.0, 2.0, 4.0])
    step = _private_step(
        model, noise_sd=sds, neighbours=neighbours, min_rows=MIN_ROWS, clip_count_share=0.0
    )
    _, delta, sigmas, count_sd, mu_owners, mu_out = step._owner_noise(0.0)
    assert delta == factor * 0.5
    assert np.all(np.isinf(count_sd))
    np.testing.assert_allclose(mu_owners, delta / sds, rtol=1e-15)
    assert mu_out == pytest.approx(delta / math.sqrt(1 + 4 + 16), rel=1e-15)
    # Equal sds: the outsider faces sqrt(N) sigma, clip count included.
    step = _private_step(
        model, noise_sd=1.3, neighbours=neighbours, min_rows=MIN_ROWS, clip_count_share=0.1
    )
    _, delta, _, count_sd, mu_owners, mu_out = step._owner_noise(0.0)
    np.testing.assert_allclose(mu_owners, delta / 1.3 / math.sqrt(0.9), rtol=1e-14)
    assert mu_out == pytest.approx(mu_owners[0] / math.sqrt(3), rel=1e-14)
    # Calibrated by mu: every owner gets exactly mu against the others.
    step = _private_step(model, mu=0.05, neighbours=neighbours, min_rows=MIN_ROWS)
    _, _, _, _, mu_owners, mu_out = step._owner_noise(0.0)
    np.testing.assert_allclose(mu_owners, 0.05, rtol=1e-14)
    assert mu_out == pytest.approx(0.05 / math.sqrt(3), rel=1e-14)


def test_ledger_charged_once_per_step_with_the_binding_owner():
    model, _ = normal_normal()
    sds = np.array([3.0, 5.0, 8.0])
    ledger = RecordingLedger()
    step = _private_step(model, noise_sd=sds, clip_count_share=0.0, ledger=ledger)
    with model:
        idata = pm.sample(
            step=step, draws=50, tune=10, chains=1, random_seed=3, progressbar=False,
            compute_convergence_checks=False, discard_tuned_samples=False,
        )  # fmt: skip
    assert len(ledger.calls) == 60
    np.testing.assert_allclose(ledger.calls, (1.0 / 3.0) ** 2, rtol=1e-14)
    ss = idata.sample_stats
    np.testing.assert_allclose(ss["dp_mu"].values, 1.0 / 3.0)
    for j, sd in enumerate(sds):
        np.testing.assert_allclose(ss[f"dp_mu_owner_{j}"].values, 1.0 / sd)
    np.testing.assert_allclose(ss["dp_mu_outsider"].values, 1.0 / math.sqrt(98.0))
    report = owner_report(idata, 1e-5)
    assert report["releases"] == 60
    for j, sd in enumerate(sds):
        assert report["epsilon_vs_owners"][j] == pytest.approx(
            gdp_epsilon(mu=math.sqrt(60) / sd, delta=1e-5), rel=1e-10
        )
    assert report["epsilon_vs_outsider"] == pytest.approx(
        gdp_epsilon(mu=math.sqrt(60 / 98.0), delta=1e-5), rel=1e-10
    )
    # The worst owner's epsilon is what the ledger's total gives.
    assert max(report["epsilon_vs_owners"]) == pytest.approx(
        gdp_epsilon(mu=math.sqrt(ledger.spent_mu2), delta=1e-5), rel=1e-10
    )


def test_refused_steps_release_nothing_and_cost_nothing():
    model, _ = normal_normal()
    ledger = RecordingLedger(limit=10.5 * 0.25**2)
    step = _private_step(model, noise_sd=4.0, clip_count_share=0.0, ledger=ledger)
    with model:
        idata = pm.sample(
            step=step, draws=20, tune=0, chains=1, random_seed=4, progressbar=False,
            compute_convergence_checks=False,
        )  # fmt: skip
    ss = idata.sample_stats
    released = ss["dp_released"].values[0]
    assert released[:10].all() and not released[10:].any()
    for name in ("dp_mu", "dp_mu_outsider", "dp_mu_owner_0", "dp_mu_owner_2"):
        assert np.all(ss[name].values[0, 10:] == 0.0)
    assert owner_report(idata, 1e-5)["mu_vs_owners"] == pytest.approx([0.25 * math.sqrt(10)] * 3)


def test_owner_report_refuses_discarded_tuning_releases():
    model, _ = normal_normal()
    step = _private_step(model, noise_sd=4.0)
    with model:
        idata = pm.sample(
            step=step, draws=5, tune=5, chains=1, random_seed=4, progressbar=False,
            compute_convergence_checks=False,
        )  # fmt: skip
    with pytest.raises(ValueError, match="tuning"):
        owner_report(idata, 1e-5)
    assert owner_report(idata, 1e-5, allow_missing_tune=True)["releases"] == 5


dpa = pytest.importorskip("dp_accounting")


def _pld_epsilon(sigma, sensitivity, count, delta):
    from dp_accounting.pld import PLDAccountant

    pld = PLDAccountant(dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
    pld.compose(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(sigma / sensitivity), count))
    return pld.get_epsilon(delta)


def test_owner_epsilons_match_dp_accounting_and_outsider_mu_understates():
    delta_dp, steps = 1e-5, 200
    sds = np.array([6.0, 9.0, 15.0])
    sens = 1.0  # substitute-one with B = 0.5
    mu_owner = sens / sds
    mu_out = sens / math.sqrt(float(np.sum(sds**2)))
    stats_map = {f"dp_mu_owner_{j}": np.full(steps, m) for j, m in enumerate(mu_owner)}
    stats_map["dp_mu_outsider"] = np.full(steps, mu_out)
    report = owner_report(stats_map, delta_dp)
    for j, sd in enumerate(sds):
        truth = _pld_epsilon(sd, sens, steps, delta_dp)
        assert report["epsilon_vs_owners"][j] == pytest.approx(truth, abs=2e-3, rel=2e-3)
        # Charging the outsider's mu where the owner's is required understates epsilon.
        assert report["epsilon_vs_outsider"] < truth - 0.05
    truth_out = _pld_epsilon(math.sqrt(float(np.sum(sds**2))), sens, steps, delta_dp)
    assert report["epsilon_vs_outsider"] == pytest.approx(truth_out, abs=2e-3, rel=2e-3)


# --- validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "owners",
    [
        np.zeros(sum(SIZES) - 1, dtype=int),  # wrong length
        np.r_[OWNERS[:-1], -1],  # negative
        OWNERS.astype(float),  # not integer
        OWNERS.reshape(2, -1),  # not 1-D
        [],  # empty
        ["a"] * sum(SIZES),  # not numbers
    ],
)
def test_bad_owners_raise_naming_owners(owners):
    model, _ = normal_normal()
    with model, pytest.raises(ValueError, match="owners"):
        MultiOwnerPenaltyMetropolis(owners=owners, noise_sd=1.0, clip=None)


def test_bad_noise_sd_and_n_owners():
    model, _ = normal_normal()
    with model:
        with pytest.raises(ValueError, match="owners"):
            MultiOwnerPenaltyMetropolis(owners=OWNERS, n_owners=2, noise_sd=1.0, clip=None)
        with pytest.raises(ValueError, match="noise_sd"):
            MultiOwnerPenaltyMetropolis(owners=OWNERS, noise_sd=[1.0, 2.0], clip=None)
        with pytest.raises(ValueError, match="noise_sd"):
            MultiOwnerPenaltyMetropolis(owners=OWNERS, noise_sd=[1.0, -2.0, 1.0], clip=None)
        # An owner without data still adds its noise.
        step = MultiOwnerPenaltyMetropolis(
            owners=OWNERS, n_owners=4, noise_sd=[1.0, 1.0, 1.0, 2.0], clip=None
        )
        assert step.owner_sizes.tolist() == [*SIZES, 0]
        _, _, sigmas, *_ = step._owner_noise(0.1)
        assert float(np.sum(sigmas**2)) == 7.0


def test_callback_and_report_carry_each_owners_epsilon():
    from pymc_penalty import PrivacyBudget, PrivacyCallback, build_report

    model, _ = normal_normal()
    sds = np.array([3.0, 5.0, 8.0])
    ledger = RecordingLedger()
    step = _private_step(model, noise_sd=sds, clip_count_share=0.0, ledger=ledger)
    budget = PrivacyBudget(epsilon=50.0, delta=1e-5)
    callback = PrivacyCallback(budget, ledger)
    with model:
        pm.sample(
            step=step, draws=40, tune=10, chains=2, cores=1, random_seed=4, progressbar=False,
            compute_convergence_checks=False, callback=callback,
        )  # fmt: skip
    report = build_report(
        step=step,
        budget=budget,
        spent_mu2=ledger.spent_mu2,
        releases_by_chain=callback.releases_by_chain,
        clipped_fraction=0.0,
        component_mu2=callback.component_mu2,
    )
    # 100 releases, tuning included; each owner's mu is 1/sd per release (independent formula).
    for j, sd in enumerate(sds):
        expected = gdp_epsilon(mu=math.sqrt(100) / sd, delta=1e-5)
        assert report["dp_epsilon_vs_owners"][j] == pytest.approx(expected, rel=1e-10)
    assert report["dp_epsilon_vs_outsider"] == pytest.approx(
        gdp_epsilon(mu=math.sqrt(100 / 98.0), delta=1e-5), rel=1e-10
    )
    assert max(report["dp_epsilon_vs_owners"]) == pytest.approx(report["dp_epsilon"], rel=1e-10)
    # A run without owners has no such keys.
    plain = build_report(
        step=step, budget=budget, spent_mu2=1.0, releases_by_chain={0: 1}, clipped_fraction=0.0
    )
    assert "dp_epsilon_vs_owners" not in plain
