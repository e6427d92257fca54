"""Red-team issue 28, item 5: no noisy value is published at more precision than the analysis
allows.

At main e48aff3 the continuous ``accept`` statistic, with ``dp_noise_sd`` and the proposal,
gave the penalty test's noisy release to about one ulp, and ``dp_clipped_count`` was a raw
float64 noisy count: the floating-point attacks on the noise (Mironov 2012) had their input.
Now every published noisy value sits on a declared grid (:mod:`pymc_penalty.privacy.precision`):
``accept`` on multiples of ``ACCEPT_GRID`` (rounded with the decision's own uniform, so
unbiased), counts on the integers and ``dp_clipped_fraction`` on ``k / n``. The first test
fails on e48aff3 (no value of ``accept`` in (0, 1) there is a multiple of 2**-10).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pymc as pm
import pytest

import pymc_penalty as pp
from pymc_penalty.privacy.precision import ACCEPT_GRID, COUNT_GRID, on_grid, snap_accept, snap_count
from pymc_penalty.variants import MultiOwnerPenaltyMetropolis

N = 400
Y = np.random.default_rng(5).normal(1.0, 1.0, N)
QUIET = {"progressbar": False, "compute_convergence_checks": False, "cores": 1}


def _model() -> pm.Model:
    with pm.Model() as model:
        pm.Normal("y", pm.Normal("mu", 0.0, 10.0), 1.0, observed=Y)
    return model


def _check_stats(stats) -> None:
    accept = stats["accept"].values
    assert on_grid(accept, ACCEPT_GRID)
    assert np.all((accept >= 0) & (accept <= 1))
    assert on_grid(stats["dp_clipped_count"].values, COUNT_GRID)
    k = stats["dp_clipped_fraction"].values * N
    finite = np.isfinite(k)
    assert finite.any() and np.allclose(k[finite], np.rint(k[finite]), rtol=0, atol=1e-9)


def test_pp_sample_publishes_accept_and_counts_on_their_grids():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # short chains: convergence is not the point
        idata = pp.sample(
            model=_model(), epsilon=20.0, delta=1e-5, draws=150, tune=150, chains=2,
            warm_start=0, random_seed=3, **QUIET,
        )  # fmt: skip
    for group in ("sample_stats",):  # the tuning draws are not published
        stats = idata[group]
        _check_stats(stats)
        # Informative, not constant: the grid keeps the acceptance probabilities' spread.
        inner = stats["accept"].values[(stats["accept"].values > 0) & (stats["accept"].values < 1)]
        assert np.unique(inner).size > 10


def test_the_owners_step_publishes_its_summed_count_on_the_integers():
    owners = np.arange(N) % 3
    with _model():
        step = MultiOwnerPenaltyMetropolis(owners=owners, epsilon=50.0, delta=1e-5, clip=3.0)
        idata = pm.sample(draws=60, tune=60, chains=1, step=step, random_seed=4, **QUIET)
    pp.finalize(idata, step)
    _check_stats(idata.sample_stats)


def test_snap_accept_is_unbiased_and_on_the_grid():
    rng = np.random.default_rng(0)
    probs = np.array([0.0, 1e-5, 0.3, 0.5 + 0.3 * ACCEPT_GRID, 0.999, 1.0])
    m = 200_000
    for p in probs:
        out = snap_accept(np.full(m, p), rng.random(m))
        assert on_grid(out, ACCEPT_GRID) and np.all((out >= 0) & (out <= 1))
        assert np.all(
            (out == np.floor(p / ACCEPT_GRID) * ACCEPT_GRID)
            | (out == np.ceil(p / ACCEPT_GRID) * ACCEPT_GRID)
        )
        # Unbiased: the mean is p within 5 Monte Carlo standard errors (at most grid / 2 each).
        assert abs(out.mean() - p) <= 5 * 0.5 * ACCEPT_GRID / math.sqrt(m) + 1e-15
    # A biased rounding (always down) would be caught at p = 0.5 + 0.3 grid.
    p = probs[3]
    assert abs(np.floor(p / ACCEPT_GRID) * ACCEPT_GRID - p) > 5 * 0.5 * ACCEPT_GRID / math.sqrt(m)
    assert snap_accept(0.25, 0.9) == 0.25 and math.isnan(snap_accept(math.nan, 0.5))


def test_snap_count_and_on_grid():
    assert snap_count(3.49) == 3.0 and snap_count(-0.6) == -1.0 and math.isnan(snap_count(math.nan))
    np.testing.assert_array_equal(snap_count(np.array([0.4, 7.5, 8.5])), [0.0, 8.0, 8.0])
    assert on_grid([0.0, 2 * ACCEPT_GRID, math.nan], ACCEPT_GRID)
    assert not on_grid([0.3], ACCEPT_GRID)  # the check can fail
    assert not on_grid([2.5], COUNT_GRID)


@pytest.mark.slow
def test_the_jax_backend_publishes_on_the_same_grids():
    pytest.importorskip("jax")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idata = pp.sample(
            model=_model(), epsilon=20.0, delta=1e-5, draws=150, tune=150, chains=1,
            warm_start=0, random_seed=3, backend="jax", progressbar=False,
        )  # fmt: skip
    _check_stats(idata.sample_stats)
