"""The private warm start from an initial point far from the mode (issue 13).

Far from the mode every row's gradient is clipped in one direction, so a Fisher step moves at
most the clip ``C`` in per-datapoint sds (``C sqrt(n)`` posterior sds): before the warm start
travelled, a Normal mean started at 50 for data centred on 3 (n = 2e4, 6600 posterior sds)
ended 3070-3810 sds short under both neighbour relations. After three far steps (the released
whitened mean near the clip) the gradient clip grows 16 times per far step, from released
quantities only.
"""

from __future__ import annotations

import math

import numpy as np
import pymc as pm
import pytest
from conftest import SpendRecorder

import pymc_penalty as pp
import pymc_penalty.warmstart.scoring as scoring
from pymc_penalty import PrivacyLedger
from pymc_penalty.warmstart import WARM_START_STEPS, private_warm_start, warm_start_schedule

pytestmark = pytest.mark.filterwarnings("ignore::pymc_penalty.FrozenChainWarning")
N = 20_000
#: The public lower bound on the rows that add/remove-one requires (ignored under
#: substitute-one).
MIN_ROWS = 1000
#: pymc_penalty.sample's default warm-start share (20%) of epsilon = 1, delta = 1e-5.
MU = math.sqrt(0.2) * pp.gdp_mu(1.0, 1e-5)


def _normal_mean(initval: float):
    """Data N(3, 1), prior N(0, 100^2) on the mean, started at ``initval``: the exact mode and
    posterior sd."""
    data = np.random.default_rng(1).normal(3.0, 1.0, size=N)
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, 100.0, initval=initval)
        pm.Normal("y", m, 1.0, observed=data)
    precision = N + 1e-4
    return model, data.sum() / precision, 1.0 / math.sqrt(precision)


@pytest.fixture(scope="module")
def far():
    return _normal_mean(50.0)


def _errors(model, mode, sd, neighbours, seeds):
    out = []
    for seed in seeds:
        with model:
            ws = private_warm_start(
                mu=MU, ledger=PrivacyLedger(1.001 * MU), neighbours=neighbours,
                min_rows=MIN_ROWS, noise_rng=np.random.default_rng(seed),
            )  # fmt: skip
        out.append((float(ws.point[0]) - mode) / sd)
    return np.asarray(out)


@pytest.mark.parametrize("neighbours", ["substitute", "add_remove"])
@pytest.mark.slow
def test_a_far_start_lands_within_a_few_posterior_sd(far, neighbours):
    """Measured over 20 seeds each (these settings): RMS 0.89 sd (largest 2.6) substitute-one,
    0.30 (largest 0.64) add/remove-one; a near start gets 0.06-0.37. Before: 3230-3810."""
    errors = _errors(*far, neighbours, range(4))
    assert np.all(np.abs(errors) < 5.0), errors
    assert math.sqrt(np.mean(errors**2)) < 2.5, errors


def test_control_without_travelling_the_far_start_stays_far(far, monkeypatch):
    """The must-fail control: the extrapolation switched off is the old behaviour."""
    monkeypatch.setattr(scoring, "_FAR_SHARE", math.inf)
    errors = _errors(*far, "substitute", range(2))
    assert np.all(np.abs(errors) > 1000.0), errors


@pytest.mark.parametrize("neighbours", ["substitute", "add_remove"])
def test_travelling_releases_nothing_more(far, neighbours, monkeypatch):
    """The same releases at the same costs as without travelling; their mu^2 sum to the warm
    start's mu^2 and to the schedule's, counted here independently."""
    model = far[0]
    runs = {}
    for share in (scoring._FAR_SHARE, math.inf):
        monkeypatch.setattr(scoring, "_FAR_SHARE", share)
        ledger = SpendRecorder()
        with model:
            ws = private_warm_start(
                mu=MU,
                ledger=ledger,
                neighbours=neighbours,
                min_rows=MIN_ROWS,
                noise_rng=np.random.default_rng(0),
            )
        runs[share] = (ws, ledger.spent)
    (ws, spent), (ws_off, spent_off) = runs.values()
    assert max(ws.clip_history) >= 16 * ws.clip_history[0]  # it travelled
    assert max(ws_off.clip_history) < 2 * ws_off.clip_history[0]  # the control did not
    assert spent == spent_off
    steps = WARM_START_STEPS
    # Per step: curvature and gradient; step 0 two curvature parts (three under add/remove:
    # the noisy count), each later step the clipped count.
    assert len(spent) == ws.releases == 2 * steps + 1 + (neighbours == "add_remove") + steps - 1
    independent = sum(g**2 + c**2 for g, c in warm_start_schedule(MU, steps))
    assert math.isclose(math.fsum(spent), MU**2, rel_tol=1e-12)
    assert math.isclose(math.fsum(spent), independent, rel_tol=1e-12)
    assert math.isclose(ws.mu**2, math.fsum(spent), rel_tol=1e-12)


@pytest.mark.parametrize("neighbours", ["substitute", "add_remove"])
@pytest.mark.parametrize("initval", [0.0, 13.0])
@pytest.mark.slow
def test_a_near_start_is_unchanged_bit_for_bit(initval, neighbours, monkeypatch):
    """Seeded: the same point, covariance and clips as with travelling switched off. From 13
    (1410 posterior sds, 3 clips) up to two steps are far, one short of travelling: with two
    (``_FAR_STEPS = 2``) the output changes, which this test would catch."""
    model = _normal_mean(initval)[0]
    outputs = []
    for share in (scoring._FAR_SHARE, math.inf):
        monkeypatch.setattr(scoring, "_FAR_SHARE", share)
        with model:
            ws = private_warm_start(
                mu=MU, ledger=PrivacyLedger(1.001 * MU), neighbours=neighbours,
                min_rows=MIN_ROWS, noise_rng=np.random.default_rng(3),
            )  # fmt: skip
        outputs.append(
            (ws.point.tobytes(), ws.covariance.tobytes(), ws.clip_history, ws.clipped_fraction)
        )
    assert outputs[0] == outputs[1]


@pytest.mark.slow
def test_the_near_check_can_fail(monkeypatch):
    """Travelling after two far steps changes the start from 13 (in some of four seeds): the
    bit-for-bit check above is not vacuous."""
    model = _normal_mean(13.0)[0]
    points = {}
    for steps in (2, math.inf):
        monkeypatch.setattr(scoring, "_FAR_STEPS", steps)
        for seed in range(4):
            with model:
                ws = private_warm_start(
                    mu=MU, ledger=PrivacyLedger(1.001 * MU), noise_rng=np.random.default_rng(seed)
                )
            points[steps, seed] = ws.point.tobytes()
    assert any(points[2, seed] != points[math.inf, seed] for seed in range(4))


def test_damping_hook_is_off_by_default_and_damps_when_set(monkeypatch):
    """``scoring.DAMPING`` (a comparison hook, read at the call): 1 halves a one-parameter
    model's Fisher steps, so from 13 (1410 posterior sds) the seeded run differs from the
    default's (0, the Fisher step itself), yet both land within a few posterior sds with the
    same releases and spend. (That 0 leaves every output unchanged is what the recorded-value
    tests of the warm start check.)"""
    model, mode, sd = _normal_mean(13.0)
    out = {}
    for damping in (0.0, 1.0):
        monkeypatch.setattr(scoring, "DAMPING", damping)
        ledger = PrivacyLedger(1.001 * MU)
        with model:
            ws = private_warm_start(
                mu=MU, ledger=ledger, noise_rng=np.random.default_rng(3),
            )  # fmt: skip
        out[damping] = (ws.point.copy(), ws.mu, ws.releases)
    assert out[0.0][1:] == out[1.0][1:]  # the same releases and spend
    assert out[0.0][0][0] != out[1.0][0][0]  # the hook is live
    assert abs(out[1.0][0][0] - mode) / sd < 10.0
    assert abs(out[0.0][0][0] - mode) / sd < 10.0
