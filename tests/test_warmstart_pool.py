"""The warm start's pooled curvature releases (``warmstart_scoring._pool_curvature``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_warmstart_releases import _gauss  # the anisotropic Gaussian, exact posterior

import pymc_penalty.warmstart.scoring as scoring_module
from pymc_penalty.accounting.sensitivity import Neighbours
from pymc_penalty.warmstart import fisher_scoring, warm_start_schedule
from pymc_penalty.warmstart.scoring import _pool_curvature, _pooled_curvature, _Release

D = 4


def _sym(rng: np.random.Generator, scale: float) -> np.ndarray:
    a = rng.normal(size=(D, D)) * scale
    return np.eye(D) + 0.5 * (a + a.T)


def test_releases_in_one_metric_pool_to_their_inverse_variance_mean():
    rng = np.random.default_rng(0)
    chol = np.linalg.cholesky(np.diag([4.0, 1.0, 0.25, 9.0]))
    sds = [0.3, 0.1, 0.2]
    means = [chol @ _sym(rng, 0.05) @ chol.T for _ in sds]
    pool = [_Release(m, s, chol) for m, s in zip(means, sds, strict=True)]
    white, sd = _pooled_curvature(pool, chol)
    w = np.array([1.0 / s**2 for s in sds])
    inv = np.linalg.inv(chol)
    expected = sum(wi * (inv @ m @ inv.T) for wi, m in zip(w, means, strict=True)) / w.sum()
    np.testing.assert_allclose(white, expected, rtol=1e-12, atol=1e-12)
    assert math.isclose(sd, 1.0 / math.sqrt(w.sum()), rel_tol=1e-12)


def test_a_release_from_a_distant_metric_counts_by_its_noise_in_this_one():
    """A release clipped in a metric 4 times as long in every direction has its noise 16 times
    as large here, so its weight is 256 times smaller."""
    chol = np.eye(D)
    near, far = np.eye(D), 2.0 * np.eye(D)
    white, sd = _pooled_curvature([_Release(near, 0.1, chol), _Release(far, 0.1, 4.0 * chol)], chol)
    w_near, w_far = 1.0 / 0.1**2, 1.0 / (0.1 * 16.0) ** 2
    np.testing.assert_allclose(white, (w_near * near + w_far * far) / (w_near + w_far))
    assert math.isclose(sd, 1.0 / math.sqrt(w_near + w_far))


def test_a_release_that_disagrees_beyond_its_noise_starts_a_new_pool():
    rng = np.random.default_rng(1)
    chol, s = np.eye(D), 0.05
    pool = [_Release(_sym(rng, s), s, chol)]
    agrees = _Release(_sym(rng, s), s, chol)  # the same information, other noise
    assert len(_pool_curvature(pool, agrees, chol)[0]) == 2
    # Twice the curvature in one direction: far beyond 3 sqrt(d) noise sds of the two.
    moved = _Release(np.diag([2.0, 1.0, 1.0, 1.0]) + (agrees.mean - np.eye(D)), s, chol)
    assert _pool_curvature(pool, moved, chol)[0] == [moved]


@pytest.mark.parametrize("pooled", [True, False])
@pytest.mark.slow
def test_pooling_halves_the_metric_error_at_a_small_budget(monkeypatch, pooled):
    """An anisotropic Gaussian (scales 0.1 to 10), n = 2e4, d = 5, mu = 0.1, 12 steps, 12 noise
    seeds: the largest log eigenvalue error of the estimated posterior covariance averages
    0.22 pooled and 0.45 with every release on its own (``_POOL_GAP = -1``); the mode's RMS
    error 0.94 and 1.57 posterior sd. The pooled run must beat 0.3 and 1.2; the unpooled one is
    the control that must not."""
    if not pooled:
        monkeypatch.setattr(scoring_module, "_POOL_GAP", -1.0)
    n, d = 20_000, 5
    x, prec_x, post_mean, post_cov = _gauss(n, d, seed=11)
    inv = np.linalg.inv(np.linalg.cholesky(post_cov))
    cov_err, mode_err = [], []
    for seed in range(12):
        result = fisher_scoring(
            lambda at: (x - at) @ prec_x,
            lambda at: (-at / 100.0, -np.eye(d) / 100.0),
            np.zeros(d),
            n,
            schedule=warm_start_schedule(0.1, 12),
            neighbours=Neighbours.SUBSTITUTE,
            clip="auto",
            noise=np.random.default_rng(seed),
            commit=lambda mu: None,
        )
        ratio = np.linalg.eigvalsh(inv @ np.linalg.inv(result.precision) @ inv.T)
        cov_err.append(float(np.max(np.abs(np.log(ratio)))))
        mode_err.append(float(np.sqrt(np.mean((result.mode - post_mean) ** 2 / np.diag(post_cov)))))
    cov, mode = float(np.mean(cov_err)), math.sqrt(float(np.mean(np.square(mode_err))))
    assert (cov < 0.3 and mode < 1.2) is pooled, (cov, mode)
