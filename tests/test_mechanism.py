"""The one mechanism (pymc_penalty.privacy.mechanism.release_noise) against independent
computations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pymc_penalty.accounting.sensitivity import ClipMode, Neighbours
from pymc_penalty.privacy.mechanism import release_noise

CASES = [
    (ClipMode.CONSTANT, Neighbours.SUBSTITUTE, 2.0, 0.3, 2.0, 4.0),
    (ClipMode.DISTANCE, Neighbours.SUBSTITUTE, 0.5, 0.3, 0.15, 0.3),
    (ClipMode.METRIC, Neighbours.ADD_REMOVE, 0.5, 0.3, 0.15, 0.15),
]


@pytest.mark.parametrize(("mode", "neighbours", "clip", "length", "bound", "delta"), CASES)
@pytest.mark.parametrize("share", [0.0, 0.05, 0.5])
def test_a_budgeted_release_spends_exactly_its_mu(
    mode, neighbours, clip, length, bound, delta, share
):
    """Given mu: the likelihood release (Delta / sigma) and the count release (1 / count sd,
    sensitivity 1) compose to mu, with the count taking `share` of mu^2 (Gaussian DP)."""
    mu = 0.7
    out = release_noise(clip, mode, neighbours, length, mu=mu, count_share=share)
    assert out.bound == pytest.approx(bound)
    assert out.sensitivity == pytest.approx(delta)
    mu_ll = delta / out.sigma
    mu_count = 0.0 if math.isinf(out.count_sd) else 1.0 / out.count_sd
    assert mu_ll**2 + mu_count**2 == pytest.approx(mu**2)
    assert mu_count**2 == pytest.approx(share * mu**2)
    assert out.step_mu == mu
    # Must fail: the noise of the other neighbour relation spends a different mu.
    other = Neighbours.ADD_REMOVE if neighbours is Neighbours.SUBSTITUTE else Neighbours.SUBSTITUTE
    wrong = release_noise(clip, mode, other, length, mu=mu, count_share=share)
    assert (delta / wrong.sigma) ** 2 + mu_count**2 != pytest.approx(mu**2)


@pytest.mark.parametrize("share", [0.0, 0.05])
def test_a_fixed_noise_release_reports_the_mu_it_spends(share):
    """Given a noise sd (one per owner): mu_ll = Delta / sigma, the count sd gives the count
    `share` of the step's mu^2, and step_mu composes both; arrays broadcast per owner."""
    sds = np.array([0.5, 1.0, 4.0])
    out = release_noise(
        0.2, ClipMode.DISTANCE, Neighbours.SUBSTITUTE, 1.5, noise_sd=sds, count_share=share
    )
    delta = 2 * 0.2 * 1.5
    mu_ll = delta / sds
    expected_mu = mu_ll / math.sqrt(1.0 - share)
    np.testing.assert_allclose(out.step_mu, expected_mu)
    if share > 0:
        np.testing.assert_allclose(1.0 / out.count_sd**2, expected_mu**2 * share)
    else:
        assert np.all(np.isinf(out.count_sd))
    scalar = release_noise(
        0.2, ClipMode.DISTANCE, Neighbours.SUBSTITUTE, 1.5, noise_sd=1.0, count_share=share
    )
    assert isinstance(scalar.step_mu, float) and scalar.step_mu == pytest.approx(expected_mu[1])


def test_no_clip_is_infinite_sensitivity_and_needs_a_fixed_noise():
    out = release_noise(
        None, ClipMode.DISTANCE, Neighbours.SUBSTITUTE, 1.0, noise_sd=2.0, count_share=0.05
    )
    assert math.isinf(out.bound) and math.isinf(out.step_mu) and out.sigma == 2.0
    with pytest.raises(ValueError, match="exactly one"):
        release_noise(1.0, ClipMode.DISTANCE, Neighbours.SUBSTITUTE, 1.0)
    with pytest.raises(ValueError, match="exactly one"):
        release_noise(1.0, ClipMode.DISTANCE, Neighbours.SUBSTITUTE, 1.0, mu=1.0, noise_sd=1.0)
