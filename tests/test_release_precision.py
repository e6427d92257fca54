"""Red-team issue 28, item 5 (continued): the continuous releases are on grids too.

:mod:`pymc_penalty.privacy.precision` already put ``accept`` and the noisy counts on coarse
grids (``tests/test_published_precision.py``). Still at full float64 precision were the private
warm start's noisy gradient, curvature and log-scale sums, the Taylor path's one-shot ``G`` and
``H``, and an owner's noisy clipped sums as the driver receives them: each carried the low-order
bits a floating-point attack on the noise reads (Mironov 2012). Each is now rounded where its
noise is added to the grid of its noise sd (:func:`~pymc_penalty.privacy.precision.noise_grid`:
a power of two, at most ``2**-10`` of the sd near zero and never holding fewer than ``2**40``
floats of the value's magnitude). The checks below divide each released value by its grid and
require an exact integer; on the old code none of them passes (an unrounded noisy value is off
its grid, the must-fail of :func:`test_an_unrounded_noisy_value_is_detected_off_its_grid`).
"""

from __future__ import annotations

import math

import numpy as np
import pymc as pm
import pytest

import pymc_penalty.variants.owners as owners_module
import pymc_penalty.warmstart.scoring as scoring_module
from pymc_penalty.accounting.sensitivity import Neighbours
from pymc_penalty.privacy import taylor as tl
from pymc_penalty.privacy.ledger import PrivacyLedger
from pymc_penalty.privacy.precision import (
    FLOAT_CELL_BITS,
    NOISE_GRID_BITS,
    gaussian_release,
    noise_grid,
    on_noise_grid,
    snap_noisy,
)
from pymc_penalty.privacy.taylor import clips as tc
from pymc_penalty.warmstart import (
    WarmStart,
    fisher_scoring,
    prepare_warm_start,
    warm_start_schedule,
)
from pymc_penalty.warmstart.taylor import taylor_oneshot

QUIET = {"progressbar": False, "compute_convergence_checks": False, "cores": 1}


# --- the grid --------------------------------------------------------------------------------


def _cases(m: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Noisy values from far below to far above their noise sds, over many binades."""
    rng = np.random.default_rng(seed)
    sd = 2.0 ** rng.uniform(-40.0, 40.0, m)
    value = rng.choice([-1.0, 1.0], m) * sd * 2.0 ** rng.uniform(-30.0, 40.0, m)
    return value, sd


def test_the_grid_is_a_power_of_two_tied_to_the_sd_and_holds_2_40_floats():
    value, sd = _cases(200_000)
    grid = noise_grid(value, sd)
    mantissa, _ = np.frexp(grid)
    assert np.all(mantissa == 0.5)  # a power of two: the rounding is exact
    assert np.all(grid >= 2.0**FLOAT_CELL_BITS * np.spacing(np.abs(value)))  # >= 2**40 floats
    assert np.all(grid > sd * 2.0 ** -(NOISE_GRID_BITS + 1))
    near = np.abs(value) < 4.0 * sd  # near zero the sd sets the grid: at most 2**-10 sd
    assert near.any() and np.all(grid[near] <= sd[near] * 2.0**-NOISE_GRID_BITS)
    out = snap_noisy(value, sd)
    assert on_noise_grid(out, sd)
    np.testing.assert_array_equal(snap_noisy(out, sd), out)  # idempotent: its own grid
    np.testing.assert_array_equal(noise_grid(out, sd) >= grid, True)
    # The rounding moves a value by at most 2**-11 of its sd, or 2**-13 of itself far out.
    bound = np.maximum(sd * 2.0**-11, np.abs(value) * 2.0**-13)
    assert np.all(np.abs(out - value) <= bound)
    assert np.all(np.abs(out - value) <= grid / 2)


def test_values_without_noise_or_not_finite_are_left_alone():
    assert math.isnan(snap_noisy(math.nan, 1.0)) and snap_noisy(math.inf, 1.0) == math.inf
    assert snap_noisy(math.pi, 0.0) == math.pi  # no noise: not private, nothing to hide
    assert snap_noisy(math.pi, math.inf) == math.pi
    assert math.isnan(noise_grid(1.0, 0.0)) and math.isnan(noise_grid(math.nan, 1.0))
    assert snap_noisy(0.0, 1.0) == 0.0 and snap_noisy(1e-300, 1.0) == 0.0
    assert snap_noisy(math.pi, 1.0) == 3217 * 2.0**-10
    assert snap_noisy(1e6 * math.pi, 1.0) == 24544 * 2.0**7  # 2**40 floats of 3.1e6: 128
    assert on_noise_grid([0.0, math.nan, math.inf], 1.0)


def test_an_unrounded_noisy_value_is_detected_off_its_grid():
    """The must-fail: the check reads the low-order bits an attack would."""
    rng = np.random.default_rng(1)
    value, sd = _cases(1000, seed=2)
    raw = value + sd * rng.standard_normal(value.size)
    assert not on_noise_grid(raw, sd)
    off = [not on_noise_grid(r, s) for r, s in zip(raw, sd, strict=True)]
    assert np.mean(off) > 0.99
    assert not on_noise_grid(math.pi, 1.0) and not on_noise_grid(1.0, 0.0)
    # A grid of 2**-10 sd alone would keep too many bits far from zero: detected too.
    far = 1e6 * math.pi
    assert not on_noise_grid(np.rint(far * 2**10) / 2**10, 1.0)


def test_gaussian_release_draws_the_same_noise_and_rounds_it():
    value, sd = np.array([3.0, -2e5, 0.0]), np.array([0.5, 1.0, 4.0])
    out = gaussian_release(value, sd, np.random.default_rng(7))
    raw = value + sd * np.random.default_rng(7).standard_normal(3)
    np.testing.assert_array_equal(out, snap_noisy(raw, sd))
    assert on_noise_grid(out, sd) and not on_noise_grid(raw, sd)
    scalar = gaussian_release(1.5, 0.25, np.random.default_rng(7))
    assert isinstance(scalar, float)
    assert scalar == snap_noisy(1.5 + 0.25 * np.random.default_rng(7).standard_normal(), 0.25)


# --- the warm start ---------------------------------------------------------------------------


class _CountingNoise:
    """A generator that counts its standard normal draws (the warm start's only noise)."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)
        self.drawn = 0

    def standard_normal(self, size=None):
        self.drawn += int(np.prod(size)) if size is not None else 1
        return self._rng.standard_normal(size)


@pytest.mark.parametrize("neighbours", [Neighbours.SUBSTITUTE, Neighbours.ADD_REMOVE])
def test_every_warm_start_release_is_on_its_grid(monkeypatch, neighbours):
    """Every noise draw of the warm start enters a rounded release: a continuous one on the
    grid of its sd (gradient sums, curvature matrices, log-scale sums) or a count on the
    integers; none is kept or used unrounded."""
    continuous, counts = [], []

    def recording_release(value, sd, rng):
        out = gaussian_release(value, sd, rng)
        continuous.append((np.asarray(out), np.broadcast_to(sd, np.shape(out)), np.size(out)))
        return out

    snap_count = scoring_module.snap_count

    def recording_count(count):
        out = snap_count(count)
        counts.append(out)
        return out

    monkeypatch.setattr(scoring_module, "gaussian_release", recording_release)
    monkeypatch.setattr(scoring_module, "snap_count", recording_count)
    rng = np.random.default_rng(3)
    n, d = 4000, 3
    x = rng.normal([2.0, -1.0, 0.5], [1.0, 3.0, 0.3], size=(n, d))
    prec = np.diag([1.0, 1 / 9.0, 1 / 0.09])
    noise = _CountingNoise(4)
    result = fisher_scoring(
        lambda at: (x - at) @ prec,
        lambda at: (-at / 100.0, -np.eye(d) / 100.0),
        np.zeros(d),
        n,
        schedule=warm_start_schedule(0.5, 6),
        neighbours=neighbours,
        clip="auto",
        noise=noise,
        commit=lambda mu: None,
    )
    assert np.all(np.isfinite(result.mode))
    # Gradient sums (d), curvature matrices (diagonal and upper triangle) and the pilot's
    # log-scale sum, each on the grid of its own sd.
    assert {size for *_, size in continuous} >= {1, d, d * (d - 1) // 2}
    for out, sd, _ in continuous:
        assert on_noise_grid(out, sd), (out, sd)
    assert all(float(c) == round(float(c)) for c in counts) and counts
    # Coverage: every standard normal drawn went into one of them.
    assert noise.drawn == sum(size for *_, size in continuous) + len(counts)


# --- the Taylor path's one-shot release --------------------------------------------------------


@pytest.mark.parametrize("relation", ["substitute", "add_remove"])
def test_the_oneshot_sums_are_on_their_grids(relation):
    rng = np.random.default_rng(5)
    n, d = 500, 3
    g = rng.normal(size=(n, d))
    a = rng.normal(size=(n, d, d))
    H = -(a + np.swapaxes(a, 1, 2))
    rows = tl.clip_rows(g, H, 2.0, 3.0)
    release = tl.release_sums(rows, 2.0, 3.0, 0.7, 0.4, rng, relation)
    assert on_noise_grid(release.G, release.sd_G)
    assert on_noise_grid(release.H, tl.hessian_noise_sds(d, release.sd_H))
    np.testing.assert_array_equal(release.H, release.H.T)
    # Must-fail: the exact sums plus the same noise, unrounded, are off the grid.
    G, Hs = rows.sums()
    assert not on_noise_grid(G + (release.G - G) * (1 + 1e-9), release.sd_G)
    # The packed form, first order included.
    j, k = tl.packed_index(d)
    coef, _, _ = tl.clip_packed_rows(g, H[:, j, k], 2.0, 3.0)
    for c_H in (3.0, None):
        packed = tl.release_packed_sums(coef, d, 2.0, c_H, 0.7, 0.4, rng, relation)
        assert on_noise_grid(packed.G, packed.sd_G)
        assert packed.H is None or on_noise_grid(packed.H, tl.hessian_noise_sds(d, packed.sd_H))
    # Each row moves a sum by at most its sensitivity: the rounding (post-processing) changes
    # the release by at most half a grid cell.
    exact = G + (release.G - G)
    assert np.all(np.abs(release.G - exact) <= noise_grid(release.G, release.sd_G) / 2)


def test_noisy_histogram_counts_are_on_the_integers():
    v = np.random.default_rng(6).lognormal(size=300)
    edges = tc.geometric_edges(1.0, -8, 8)
    counts, sd = tc.noisy_histogram(v, edges, 0.3, np.random.default_rng(0))
    assert sd > 1 and np.all(counts == np.rint(counts))


def test_taylor_oneshot_releases_g_and_h_on_their_grids(monkeypatch):
    """The wired one-shot (three histograms, then G and H) on a logistic regression."""
    n = 1500
    rng = np.random.default_rng(8)
    x = rng.normal(size=n)
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-(0.3 + 0.8 * x)))).astype(float)
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 2.0)
        b = pm.Normal("b", 0.0, 2.0)
        pm.Bernoulli("y", logit_p=a + b * x, observed=y)
    histograms = []
    original = tc.noisy_counts  # where every noisy histogram is released

    def recording_histogram(*args, **kwargs):
        out = original(*args, **kwargs)
        histograms.append(out[0])
        return out

    monkeypatch.setattr(tc, "noisy_counts", recording_histogram)
    target = prepare_warm_start(model)
    warm = WarmStart(
        point=np.array([0.3, 0.8]),
        covariance=np.diag([0.06**2, 0.06**2]),
        initvals={"a": np.array(0.3), "b": np.array(0.8)},
        mu=0.0,
        releases=0,
        clip=1.0,
        metric_clip=1.0,
        clipped_fraction=None,
        clip_history=(),
        n_rows=float(n),
    )
    tm = taylor_oneshot(
        target, warm, mu=1.0, ledger=PrivacyLedger(10.0), noise_rng=np.random.default_rng(0)
    )
    release = tm.release
    assert tm.order == 2 and release.H is not None
    assert on_noise_grid(release.G, release.sd_G)
    assert on_noise_grid(release.H, tl.hessian_noise_sds(release.G.size, release.sd_H))
    assert len(histograms) == 3 and all(np.all(h == np.rint(h)) for h in histograms)


# --- the owners' sums ---------------------------------------------------------------------------


def test_each_owner_releases_its_sum_on_its_grid(monkeypatch):
    """MultiOwnerPenaltyMetropolis: what leaves each (simulated) owner, its noisy clipped sum,
    is on the grid of that owner's noise sd before the sums are added."""
    from pymc_penalty.variants import MultiOwnerPenaltyMetropolis

    released = []

    def recording_release(value, sd, rng):
        out = gaussian_release(value, sd, rng)
        released.append((out, np.asarray(sd, dtype=float)))
        return out

    monkeypatch.setattr(owners_module, "gaussian_release", recording_release)
    y = np.random.default_rng(9).normal(1.0, 1.0, 300)
    with pm.Model():
        pm.Normal("y", pm.Normal("mu", 0.0, 10.0), 1.0, observed=y)
        step = MultiOwnerPenaltyMetropolis(
            owners=np.arange(300) % 3, clip=3.0, noise_sd=[0.5, 2.0, 40.0],
        )  # fmt: skip
        pm.sample(draws=30, tune=30, chains=1, step=step, random_seed=4, **QUIET)
    assert len(released) >= 60
    for out, sd in released:
        assert out.shape == (3,) and np.all(sd > 0) and on_noise_grid(out, sd)


def test_an_owner_service_replies_on_the_grid(tmp_path):
    """The distributed owner (what the driver receives): each chain's sum on its grid."""
    import cloudpickle

    from pymc_penalty.distributed._service import OwnerService

    with pm.Model() as model:
        data = pm.Data("y", np.zeros(1))
        pm.Normal("obs", pm.Normal("mu", 0.0, 10.0), 1.0, observed=data)
    rows = np.random.default_rng(10).normal(3.0, 1.0, size=60)
    service = OwnerService(
        "site", cloudpickle.dumps(model), ["mu"], {"mu": np.array(0.0)}, lambda: {"y": rows},
        str(tmp_path / "site.ledger"), 1e6, 0.0, 2.0, driver_pid=-1,
    )  # fmt: skip
    sigma = np.array([0.3, 7.0])
    bounds = np.array([20.0, 20.0])
    reply = service.release(
        "R", 0, np.zeros((2, 1)), np.array([[0.5], [1.5]]), bounds, sigma, 2.0,
        (2.0 * bounds / sigma) ** 2 + 1.0 / 4.0,
    )  # fmt: skip
    assert reply["released"]
    assert on_noise_grid(reply["sums"], sigma)
    assert np.all(reply["counts"] == np.rint(reply["counts"]))
