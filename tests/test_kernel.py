"""Pure NumPy pieces: the penalty test, sensitivity bounds, the adaptive proposal."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from pymc_penalty.accounting.sensitivity import ClipMode, Neighbours
from pymc_penalty.privacy.mechanism import clip_bound, l2_sensitivity
from pymc_penalty.sampling.adaptation import ProposalAdapter
from pymc_penalty.sampling.kernel import (
    clip_count_noise_sd,
    penalised_log_ratio,
    penalty_decision,
    split_step_mu,
)


def test_penalty_subtracts_half_the_noise_variance():
    assert penalised_log_ratio(1.0, 4.0, 0.5) == pytest.approx(1.0 + 0.5 - 2.0)
    assert penalised_log_ratio(1.0, 4.0, 0.5, penalty=False) == pytest.approx(1.5)
    assert penalised_log_ratio(np.nan, 1.0, 0.0) == -np.inf


def test_penalty_acceptance_satisfies_detailed_balance_in_expectation():
    """E[min(1, exp(r + sigma Z - sigma^2/2))] * 1 == E[min(1, exp(-r + ...))] * e^r.

    This identity is why the penalty chain is exact; check it by Monte Carlo with a tolerance
    of 5 standard errors.
    """
    rng = np.random.default_rng(0)
    z = rng.standard_normal(400_000)
    for r, sigma in [(0.3, 1.0), (-1.2, 2.0), (2.0, 0.5)]:
        fwd = np.minimum(1.0, np.exp(r + sigma * z - sigma**2 / 2))
        bwd = np.minimum(1.0, np.exp(-r + sigma * z - sigma**2 / 2)) * math.exp(r)
        diff = fwd - bwd
        assert abs(diff.mean()) < 5 * diff.std() / math.sqrt(z.size)
        # Without the penalty the identity fails by far more than the MC error.
        fwd0 = np.minimum(1.0, np.exp(r + sigma * z))
        bwd0 = np.minimum(1.0, np.exp(-r + sigma * z)) * math.exp(r)
        diff0 = fwd0 - bwd0
        assert abs(diff0.mean()) > 20 * diff0.std() / math.sqrt(z.size)


def test_penalty_decision():
    d = penalty_decision(-1.0, math.log(0.3))
    assert d.accepted and d.accept_prob == pytest.approx(math.exp(-1.0))
    d = penalty_decision(-1.0, math.log(0.5))
    assert not d.accepted
    assert penalty_decision(3.0, -1e-12).accept_prob == 1.0


def test_step_mu_split_and_count_noise_compose_to_the_step_mu():
    mu_ll, mu_count = split_step_mu(0.2, 0.05)
    assert math.hypot(mu_ll, mu_count) == pytest.approx(0.2)
    sd = clip_count_noise_sd(mu_ll, 0.05)
    assert math.hypot(mu_ll, 1 / sd) == pytest.approx(0.2)
    assert clip_count_noise_sd(0.0, 0.05) == math.inf


def test_within_step_composition_lives_in_the_accountant():
    """The step's mu from its likelihood release's, and the kept releases' mu^2, checked
    against the two releases composed one by one (mu^2 adds up under GDP composition)."""
    from pymc_penalty.accounting.gdp import compose_mu2, likelihood_mu2, step_mu_of_release

    for mu, share in [(0.2, 0.05), (1.3, 0.0), (0.7, 0.4)]:
        mu_ll, mu_count = split_step_mu(mu, share)
        assert step_mu_of_release(mu_ll, share) == pytest.approx(mu, rel=1e-12)
        owners = step_mu_of_release(np.array([mu_ll, 2 * mu_ll]), share)
        np.testing.assert_allclose(owners, [mu, 2 * mu], rtol=1e-12)
        # 7 steps: the likelihood releases alone, composed one by one.
        assert likelihood_mu2(mu, 7, share) == pytest.approx(compose_mu2([mu_ll] * 7), rel=1e-12)
        # Must differ when the count takes a share: the count's releases are not kept draws.
        if share > 0:
            assert likelihood_mu2(mu, 7, share) < compose_mu2([mu] * 7) * (1 - share / 2)


def test_sensitivity():
    assert clip_bound(2.0, ClipMode.DISTANCE, 0.5) == 1.0
    assert clip_bound(2.0, ClipMode.CONSTANT, 0.5) == 2.0
    assert clip_bound(None, ClipMode.CONSTANT, 0.5) == math.inf
    assert l2_sensitivity(1.5, Neighbours.SUBSTITUTE) == 3.0
    assert l2_sensitivity(1.5, Neighbours.ADD_REMOVE) == 1.5
    with pytest.raises(ValueError, match="`neighbours`"):
        Neighbours.parse("replace")


def test_proposal_is_symmetric_gaussian_with_the_given_covariance():
    cov = np.array([[2.0, 0.6], [0.6, 0.5]])
    ad = ProposalAdapter.create(cov, 1.5, "full", 0.234, 100)
    rng = np.random.default_rng(1)
    steps = np.array([ad.propose(rng, np.zeros(2)) for _ in range(20000)])
    emp = np.cov(steps.T)
    se = np.sqrt((cov**2 + np.outer(np.diag(cov), np.diag(cov))) / steps.shape[0]) * 1.5**2
    assert np.all(np.abs(emp - 1.5**2 * cov) < 5 * se)
    assert stats.kstest(steps[:, 0] / (1.5 * np.sqrt(2.0)), "norm").pvalue > 1e-3


def test_scaling_moves_toward_target_acceptance():
    ad = ProposalAdapter.create(np.ones(3), 1.0, "scaling", 0.25, 100)
    for _ in range(50):
        ad.update(np.zeros(3), 0.0, False)
    assert ad.scaling < 0.1
    low = ad.scaling
    for _ in range(50):
        ad.update(np.zeros(3), 1.0, True)
    assert ad.scaling > low


def test_covariance_window_learns_the_shape():
    rng = np.random.default_rng(2)
    scales = np.array([1e-3, 1.0, 30.0])
    ad = ProposalAdapter.create(np.ones(3), 1.0, "full", 0.234, 500)
    for _ in range(500):
        ad.update(rng.normal(size=3) * scales, 0.234, True)
    learned_sd = np.sqrt(np.diag(ad.chol @ ad.chol.T)) / (2.38 / np.sqrt(3))
    np.testing.assert_allclose(learned_sd, scales, rtol=0.15)
    assert ad.window == 1000 and ad.scaling == 1.0


def test_window_without_moves_keeps_the_old_proposal():
    ad = ProposalAdapter.create(np.ones(2), 1.0, "full", 0.234, 20)
    chol = ad.chol.copy()
    for _ in range(20):
        ad.update(np.zeros(2), 0.0, False)
    np.testing.assert_array_equal(ad.chol, chol)


def test_a_window_along_one_line_leaves_a_nonsingular_proposal():
    """Travelling from a far start moves the chain along a line; the proposal must still be
    able to leave that line (correlations are shrunk toward zero by the move count)."""
    ad = ProposalAdapter.create(np.ones(2), 1.0, "full", 0.234, 30)
    for t in range(30):
        ad.update(np.array([t, 2.0 * t], dtype=float), 0.5, True)
    cov = ad.chol @ ad.chol.T
    corr = cov[0, 1] / np.sqrt(cov[0, 0] * cov[1, 1])
    assert 0.5 < corr < 0.8  # shrunk from 1 by 30 / (30 + 5 * 2)
    assert np.linalg.cond(cov) < 1e3


def test_guided_walk_keeps_direction_until_a_rejection():
    ad = ProposalAdapter.create(np.ones(1), 1.0, "none", 0.234, 100, kind="guided")
    rng = np.random.default_rng(4)
    moves = [ad.propose(rng, np.zeros(1))[0] for _ in range(20)]
    assert all(m > 0 for m in moves)
    ad.after_decision(accepted=False)
    assert all(ad.propose(rng, np.zeros(1))[0] < 0 for _ in range(20))
    ad.after_decision(accepted=True)
    assert ad.propose(rng, np.zeros(1))[0] < 0


def test_component_proposal_moves_one_coordinate_with_its_scale():
    ad = ProposalAdapter.create(np.array([1e-3, 10.0]), 1.0, "none", 0.234, 100, kind="component")
    rng = np.random.default_rng(5)
    moves = np.array([ad.propose(rng, np.zeros(2)) for _ in range(4000)])
    assert np.all((moves != 0).sum(axis=1) == 1)
    for j, sd in enumerate((1e-3, 10.0)):
        mj = moves[moves[:, j] != 0, j]
        assert abs(mj.std() / sd - 1) < 5 / np.sqrt(2 * mj.size)
