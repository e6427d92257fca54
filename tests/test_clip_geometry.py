"""The block-clip diagnostic's math (``scripts/clip_geometry.py``) on synthetic scores with
known answers."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import optimize, stats

_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "clip_geometry.py"
_spec = importlib.util.spec_from_file_location("clip_geometry", _SCRIPT)
cg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cg)


def test_noise_error_one_block_is_the_joint_formula():
    total, sds = cg.noise_error(np.array([2.5]), np.array([4]), mu=0.5)
    assert total == pytest.approx(4 * (2 * 2.5) ** 2 / 0.5**2)
    assert sds == pytest.approx([2 * 2.5 / 0.5])


def test_noise_error_is_the_constrained_minimum():
    """The sds spend exactly mu^2 and no other allocation of it does better (a brute-force
    minimisation over the sds agrees; equal sds do worse)."""
    clips, dims, mu = np.array([1.0, 3.0, 0.5]), np.array([3, 1, 2]), 0.7
    total, sds = cg.noise_error(clips, dims, mu)
    assert np.sum((2 * clips / sds) ** 2) == pytest.approx(mu**2)
    assert np.sum(dims * sds**2) == pytest.approx(total)

    def err(log_s):  # the noise error of any sds scaled onto the constraint
        s = np.exp(log_s)
        s = s * math.sqrt(np.sum((2 * clips / s) ** 2)) / mu
        return float(np.sum(dims * s**2))

    brute = optimize.minimize(err, np.zeros(3), method="Nelder-Mead", options={"xatol": 1e-10})
    assert brute.fun == pytest.approx(total, rel=1e-6)
    assert err(np.zeros(3)) > 1.05 * total


def test_clipped_off_by_hand():
    rows = np.array([[3.0, 4.0], [0.0, 1.0], [0.5, 0.0]])
    excess, share = cg.clipped_off(rows, [np.array([0, 1])], np.array([1.0]))
    assert excess == pytest.approx([3 * 0.8, 4 * 0.8])  # the first row cut to norm 1
    assert share == pytest.approx(1 / 3)
    excess, share = cg.clipped_off(rows, [np.array([0]), np.array([1])], np.array([1.0, 1.0]))
    assert excess == pytest.approx([2.0, 3.0])
    assert share == pytest.approx(1 / 3)


def test_block_clips_split_the_tail_equally():
    rows = np.random.default_rng(0).random((200_000, 2))
    clips = cg.block_clips(rows, [np.array([0]), np.array([1])], tail=0.01)
    assert clips == pytest.approx([0.995, 0.995], abs=2e-3)  # each block at 1 - 0.01 / 2
    assert cg.block_clips(rows, [np.array([0])], tail=0.01) == pytest.approx([0.99], abs=2e-3)


def test_iid_gaussian_scores_per_coordinate_is_worse():
    """iid N(0, 1) scores: the joint clip is sqrt(chi2_d quantile), each coordinate's the
    normal quantile at tail / (2 d); the per-coordinate rule's RMS error is sqrt(d) c_k / c
    times the joint's (1.70 at d = 4), the two-block rule's in between."""
    d, tail = 4, 1e-3
    rows = np.random.default_rng(1).standard_normal((200_000, d))
    res = cg.compare_rules(rows, mu=1.0, tail=tail)
    c = math.sqrt(stats.chi2.ppf(1 - tail, d))
    c_k = stats.norm.ppf(1 - tail / (2 * d))
    expected = math.sqrt(d) * c_k / c
    assert res["per_coord"]["ratio"] == pytest.approx(expected, rel=0.04)
    assert res["per_coord"]["ratio"] > 1.5
    assert 1.0 < res["two_block"]["ratio"] < res["per_coord"]["ratio"]
    assert res["joint"]["clipped_share"] == pytest.approx(tail, rel=0.2)
    assert res["joint"]["ratio"] == 1.0


def test_one_heavy_coordinate_two_blocks_win():
    """Seven N(0, 1) coordinates and one of unit sd but a far heavier tail, (w^4 - 3) /
    sqrt(96): the joint clip is set by the heavy one and the two-block rule, which isolates
    it, is better (about 0.85-0.94 of the joint's RMS error)."""
    rng = np.random.default_rng(2)
    rows = rng.standard_normal((100_000, 8))
    w = rng.standard_normal(100_000)
    rows[:, 7] = (w**4 - 3.0) / math.sqrt(96.0)
    res = cg.compare_rules(rows, mu=1.0)
    assert res["two_block"]["ratio"] < 0.95
    assert res["two_block"]["blocks"][1] == [7]
    # a chi-square coordinate at unit sd is not heavy enough to pay for the split
    rows[:, 7] = (w**2 - 1.0) / math.sqrt(2.0)
    assert cg.compare_rules(rows, mu=1.0)["two_block"]["ratio"] > 0.97
