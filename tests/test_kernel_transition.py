"""The one penalty transition (:func:`pymc_penalty.sampling.kernel.transition`) with fake releases.

No PyMC and no model: the release is a function of a known exact difference ``d`` and Gaussian
noise, so the kernel's acceptance probability can be compared with its closed form.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from pymc_penalty.sampling.kernel import (
    INFO_STATS,
    PenaltyState,
    Release,
    StepNoise,
    info_stats,
    stats_dtypes_shapes,
    transition,
)


def mean_accept_closed_form(d: float, sigma: float, penalty: bool = True) -> float:
    """``E[min(1, exp(d + sigma Z - c))]`` for ``Z ~ N(0, 1)``, ``c = sigma^2 / 2`` or 0.

    With ``X ~ N(m, s^2)``: ``E[min(1, e^X)] = Phi(m / s) + exp(m + s^2 / 2) Phi(-(m + s^2) / s)``.
    """
    m = d - (0.5 * sigma**2 if penalty else 0.0)
    s = sigma
    return float(norm.cdf(m / s) + math.exp(m + 0.5 * s**2) * norm.cdf(-(m + s**2) / s))


def fake_release(d: float, sigma: float, noise: np.random.Generator, log_prior1: float = 0.0):
    """A release of the exact difference ``d`` with Gaussian noise of sd ``sigma``."""

    def release(state: PenaltyState, x1: np.ndarray) -> Release:
        return Release(d + sigma * noise.standard_normal(), PenaltyState(x1, log_prior1, "c1"))

    return release


def run_many(d: float, sigma: float, n: int, *, penalty: bool = True, seed: int = 0):
    rng, noise_rng = np.random.default_rng(seed), np.random.default_rng(seed + 1)
    state = PenaltyState(np.zeros(1), 0.0, "c0")
    noise = StepNoise.from_sd(2.0, sigma, 0.1)
    release = fake_release(d, sigma, noise_rng)
    accept = np.empty(n)
    accepted = np.empty(n)
    x1 = np.ones(1)
    for i in range(n):
        _, info = transition(rng, state, x1, noise, release, penalty=penalty)
        accept[i], accepted[i] = info.accept, info.accepted
    return accept, accepted


@pytest.mark.parametrize(("d", "sigma"), [(-0.5, 1.5), (0.8, 0.7), (-2.0, 2.5)])
def test_acceptance_matches_the_closed_form_of_the_penalty_test(d, sigma):
    n = 40_000
    accept, accepted = run_many(d, sigma, n)
    expected = mean_accept_closed_form(d, sigma)
    se = accept.std() / math.sqrt(n)
    assert abs(accept.mean() - expected) < 5 * se
    # The uniform draw turns the probability into a decision with that frequency.
    se_b = math.sqrt(expected * (1 - expected) / n)
    assert abs(accepted.mean() - expected) < 5 * se_b
    # Detailed balance of the closed form itself: a(d) = e^d a(-d) (why the chain is exact).
    assert expected == pytest.approx(math.exp(d) * mean_accept_closed_form(-d, sigma), rel=1e-9)


def test_without_the_penalty_the_acceptance_is_biased():
    """Must fail: without subtracting sigma^2 / 2 the kernel accepts too often, by far more
    than the Monte Carlo error, and matches the unpenalised closed form instead."""
    d, sigma, n = -0.5, 1.5, 40_000
    accept, _ = run_many(d, sigma, n, penalty=False)
    se = accept.std() / math.sqrt(n)
    assert abs(accept.mean() - mean_accept_closed_form(d, sigma)) > 20 * se
    assert abs(accept.mean() - mean_accept_closed_form(d, sigma, penalty=False)) < 5 * se
    # ... and that biased rule breaks detailed balance.
    biased = mean_accept_closed_form(d, sigma, penalty=False)
    assert abs(biased - math.exp(d) * mean_accept_closed_form(-d, sigma, penalty=False)) > 0.05


def test_a_refused_charge_releases_nothing_and_draws_nothing():
    calls: list[str] = []

    def charge(mu2: float) -> bool:
        calls.append(f"charge {mu2:.6g}")
        return False

    def release(state, x1):
        calls.append("release")
        raise AssertionError("the release must not run when the charge is refused")

    rng = np.random.default_rng(3)
    before = rng.bit_generator.state
    state = PenaltyState(np.zeros(2), -1.0, "cache")
    noise = StepNoise.from_sd(2.0, 0.5, 0.3, (("dp_mu_owner_0", 0.3), ("dp_mu_outsider", 0.1)))
    new, info = transition(rng, state, np.ones(2), noise, release, charge=charge)
    assert new is state
    assert calls == [f"charge {0.3**2:.6g}"]
    assert rng.bit_generator.state == before
    assert not info.released and not info.accepted and info.accept == 0.0 and info.mu == 0.0
    assert info.noise_sd == 0.5 and info.sensitivity == 2.0
    assert math.isnan(info.d_hat) and math.isnan(info.clipped_count)
    assert dict(info.party_mu) == {"dp_mu_owner_0": 0.0, "dp_mu_outsider": 0.0}


def test_the_charge_comes_before_the_release_and_the_uniform_after_it():
    calls: list[str] = []

    class Rng:
        def random(self) -> float:
            calls.append("uniform")
            return 0.5

    def charge(mu2: float) -> bool:
        calls.append("charge")
        return True

    def release(state, x1):
        calls.append("release")
        return Release(10.0, PenaltyState(x1, 0.0, None), 2.0, 0.1)

    noise = StepNoise.from_var(2.0, 0.25, 0.3)
    state = PenaltyState(np.zeros(1), 0.0)
    new, info = transition(Rng(), state, np.ones(1), noise, release, charge=charge)
    assert calls == ["charge", "release", "uniform"]
    assert info.accepted and info.released and info.accept == 1.0
    assert new.position[0] == 1.0 and info.noise_sd == 0.5 and info.mu == 0.3
    assert (info.clipped_count, info.clipped_fraction, info.d_hat) == (2.0, 0.1, 10.0)


def test_a_rebuilt_current_state_is_used_for_the_ratio_and_kept_on_rejection():
    """A release may rebuild the current state (its log prior unknown before the charge)."""
    stale = PenaltyState(np.zeros(1), math.nan, None)
    fresh = PenaltyState(np.zeros(1), 0.0, "fresh")

    def release(d_hat):
        return lambda s, x1: Release(d_hat, PenaltyState(x1, 0.0, "prop"), current=fresh)

    rng = np.random.default_rng(0)
    noise = StepNoise.from_sd(1.0, 0.0, 0.1)
    new, info = transition(rng, stale, np.ones(1), noise, release(-math.inf))
    assert new is fresh and not info.accepted
    new, info = transition(rng, stale, np.ones(1), noise, release(50.0))
    assert new.cache == "prop" and info.accepted and info.accept == 1.0
    # A NaN release (a proposal outside the support) is rejected, never accepted.
    new, info = transition(rng, fresh, np.ones(1), noise, release(math.nan))
    assert new is fresh and info.accept == 0.0 and not info.accepted


def test_one_stats_schema():
    info = transition(
        np.random.default_rng(0),
        PenaltyState(np.zeros(1), 0.0),
        np.ones(1),
        StepNoise.from_sd(1.0, 1.0, 0.2, (("dp_mu_outsider", 0.1),)),
        lambda s, x1: Release(0.0, PenaltyState(x1, 0.0)),
    )[1]
    stats = info_stats(info)
    assert set(stats) == set(stats_dtypes_shapes()) | {"dp_mu_outsider"}
    assert stats["dp_released"] is True and stats["dp_mu"] == 0.2
    assert {name for name, _ in INFO_STATS.values()} <= set(stats)


def test_every_step_declares_the_transition_statistics():
    from pymc_penalty.sampling.step import PenaltyMetropolis
    from pymc_penalty.variants import ExpFamPenaltyMetropolis, MultiOwnerPenaltyMetropolis

    for cls in (PenaltyMetropolis, MultiOwnerPenaltyMetropolis, ExpFamPenaltyMetropolis):
        for name, (dtype, shape) in stats_dtypes_shapes().items():
            assert cls.stats_dtypes_shapes[name] == (dtype, shape), (cls, name)
