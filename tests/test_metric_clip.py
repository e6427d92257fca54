"""The per-row bound in the proposal's metric: scale-free where a Euclidean bound is not."""

import math

import numpy as np
import pymc as pm
import pytest

from pymc_penalty import PenaltyMetropolis, finalize
from pymc_penalty.accounting.sensitivity import ClipMode, step_length
from pymc_penalty.privacy.mechanism import clip_bound


def _clipped_fractions(
    mode: ClipMode,
    clip: float,
    chol: np.ndarray,
    rows: np.ndarray,
    prec: np.ndarray,
    theta: np.ndarray,
    moves: np.ndarray,
) -> np.ndarray:
    """Fraction of rows whose exact Gaussian log-likelihood ratio exceeds the bound, per move."""
    out = []
    for move in moves:
        resid = rows - theta
        ratio = resid @ (prec @ move) - 0.5 * move @ prec @ move
        bound = clip_bound(clip, mode, step_length(mode, move, chol))
        out.append(np.mean(np.abs(ratio) > bound))
    return np.array(out)


def test_metric_bound_fits_every_direction_where_a_raw_bound_cannot():
    rng = np.random.default_rng(11)
    d, n = 4, 4000
    sds = np.array([0.05, 0.5, 5.0, 50.0])
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    cov = q @ np.diag(sds**2) @ q.T
    prec = np.linalg.inv(cov)
    rows = rng.multivariate_normal(np.zeros(d), cov, size=n)
    theta = rows.mean(0)
    chol = np.linalg.cholesky(cov / n) * (2.38 / math.sqrt(d))  # a tuned proposal's factor
    moves = np.array([chol @ (0.3 * rng.normal(size=d)) for _ in range(200)])
    # Calibrate both constants on the first move to clip 0.1% of rows there.
    first = moves[:1]
    resid = rows - theta
    r0 = np.abs(resid @ (prec @ first[0]) - 0.5 * first[0] @ prec @ first[0])
    c_metric = np.quantile(r0, 0.999) / step_length(ClipMode.METRIC, first[0], chol)
    c_raw = np.quantile(r0, 0.999) / step_length(ClipMode.DISTANCE, first[0])
    metric = _clipped_fractions(ClipMode.METRIC, c_metric, chol, rows, prec, theta, moves)
    raw = _clipped_fractions(ClipMode.DISTANCE, c_raw, chol, rows, prec, theta, moves)
    # In the metric, a row's ratio over the bound is a standard normal scaled the same way in
    # every direction, so the clipped fraction stays small everywhere (0.1% at calibration; the
    # worst of 200 directions is bounded by the Gaussian tail of the calibration's spread).
    assert metric.max() < 0.02, metric.max()
    # In raw units the same constant clips most rows in the posterior's steep directions.
    assert raw.max() > 0.3, raw.max()


def test_metric_mode_needs_the_factor_and_is_symmetric():
    chol = np.array([[2.0, 0.0], [1.0, 0.5]])
    diff = np.array([0.3, -0.7])
    assert step_length(ClipMode.METRIC, diff, chol) == step_length(ClipMode.METRIC, -diff, chol)
    assert step_length(ClipMode.METRIC, diff, chol) == pytest.approx(
        np.linalg.norm(np.linalg.solve(chol, diff)), rel=1e-12
    )
    with pytest.raises(ValueError, match="chol"):
        step_length(ClipMode.METRIC, diff)


def test_a_metric_clip_step_samples_and_reports_its_bound():
    y = np.random.default_rng(2).normal(1.0, 1.0, size=200)
    with pm.Model():
        m = pm.Normal("m", 0.0, 10.0)
        s = pm.HalfNormal("s", 5.0)
        pm.Normal("y", m, s, observed=y)
        step = PenaltyMetropolis(
            epsilon=10.0, delta=1e-5, clip=1.0, clip_mode="metric", method="penalty"
        )
        idata = pm.sample(
            draws=200,
            tune=200,
            chains=1,
            step=step,
            random_seed=3,
            progressbar=False,
            compute_convergence_checks=False,
        )
    sd = idata.sample_stats["dp_noise_sd"].values
    assert np.all(np.isfinite(sd)) and np.all(sd > 0)

    published = finalize(idata, step)
    assert "||L^-1" in published.attrs["dp_sensitivity"]
