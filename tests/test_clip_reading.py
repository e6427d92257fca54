"""The Taylor one-shot's clips read from noisy histograms (issue 27, 2026-11-28): the top of
the data found by windows, the counts above an edge read with every bin's noise (unbiased),
and the one-shot clip near the edge it aims at on a thin tail and on rows that share one
Hessian per group. Pure NumPy: the end-to-end effect is measured by
``benchmarks/clip_reading.py`` and ``benchmarks/model_suite.py``."""

from __future__ import annotations

import math

import numpy as np

from pymc_penalty.privacy.taylor import clips as tc
from pymc_penalty.warmstart import taylor as wt

EDGES = tc.geometric_edges(1.0, -24, 56, 4)  # 82 bins, as the one-shot's
SD = 132.0  # the first stage's histogram noise at epsilon 0.5 and n = 1e4


def _thin_tail() -> np.ndarray:
    counts = np.zeros(len(EDGES) + 1)
    counts[20:30] = 900.0  # the bulk: 9000 rows
    counts[30:40] = 100.0  # a tail of 1000 rows, each bin below its noise
    return counts


def test_the_top_of_a_thin_tail_is_found_and_an_empty_histogram_has_none() -> None:
    """Windows of up to 16 bins find a tail whose bins are each below their noise: the top
    lies at or above the tail's last bin less 2 in at least 90% of 200 releases, where
    single bins (the must-fail side: ``TOP_WIDTHS`` of 1 alone) put it in the bulk, at or
    below bin 31, in over 90%. On pure noise the top is -1 in at least 97% (alpha 1%)."""
    counts = _thin_tail()
    found = bulk_only = empty = 0
    saved = tc.TOP_WIDTHS
    for seed in range(200):
        noisy = np.round(counts + np.random.default_rng(seed).normal(0.0, SD, counts.size))
        found += tc.data_top(noisy, SD) >= 37
        tc.TOP_WIDTHS = (1,)
        try:
            bulk_only += tc.data_top(noisy, SD) <= 31
        finally:
            tc.TOP_WIDTHS = saved
        nothing = np.round(np.random.default_rng([seed, 1]).normal(0.0, SD, counts.size))
        empty += tc.data_top(nothing, SD) == -1
    assert found >= 0.9 * 200, found
    assert bulk_only >= 0.9 * 200, bulk_only
    assert empty >= 0.97 * 200, empty


def test_the_count_above_an_edge_is_unbiased_with_the_noise_it_states() -> None:
    """Over 2000 releases the count above an edge in the tail averages to the exact count
    within 4 Monte Carlo standard errors (from the stated sd ``TailCounts.noise_sd``), and its
    spread is the stated sd within 10%; the bin-by-bin reading (the must-fail side) is
    biased low by hundreds of rows."""
    counts = _thin_tail()
    edge = 32  # 700 rows above it
    exact = float(counts[edge + 1 :].sum())
    k = math.sqrt(2.0 * math.log(len(counts) / 0.01))
    got, stated, old = [], [], []
    for seed in range(2000):
        noisy = np.round(counts + np.random.default_rng(seed).normal(0.0, SD, counts.size))
        tails = tc.TailCounts.of(noisy, SD)
        got.append(tails.above[edge])
        stated.append(tails.noise_sd(edge))
        kept = np.where(noisy - 0.5 > k * SD, noisy, 0.0)
        old.append(kept[edge + 1 :].sum())
    got = np.array(got)
    mcse = np.std(got) / math.sqrt(got.size)
    assert abs(got.mean() - exact) < 4.0 * mcse, (got.mean(), exact, mcse)
    # the stated sd assumes the top's bin; the spread of the top adds a little
    assert 0.9 < np.std(got) / np.median(stated) < 1.25, (np.std(got), np.median(stated))
    assert exact - np.mean(old) > 300.0, np.mean(old)


def test_the_gradient_clip_keeps_the_tail_the_old_reading_cut() -> None:
    """The one-shot gradient clip on 10,000 rows whose norms are exponential and lognormal
    (tails like the suite's Poisson and logistic gradients at a warm start), at the first
    stage's noise at epsilon 0.5 with the noise-bias balance at 40 rows (the clip aims at
    ``_RECAPTURE`` times that): the median over 100 releases leaves at most twice the
    balance above the clip (seeded: 31 and 41 rows), where the reading before 2026-11-28
    (``benchmarks/clip_reading.clip_before``, the must-fail side on the same releases) left
    at least five times it (545 and 223)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from clip_reading import clip_before

    mu_sum, dim, rows, aim = 2.0 * math.sqrt(4.0) / 40.0, 4, 10_000.0, 40.0
    rng = np.random.default_rng(3)
    for v in (rng.exponential(1.0, 10_000), rng.lognormal(0.0, 0.6, 10_000)):
        counts = tc.histogram_counts(v, EDGES)
        now, old = [], []
        for seed in range(100):
            noisy = np.round(counts + np.random.default_rng(seed).normal(0.0, SD, counts.size))
            c = wt._oneshot_clip(EDGES, noisy, SD, mu_sum, dim, "substitute", rows, wt._FACTOR_G)
            now.append(int((v > c).sum()))
            o = clip_before(EDGES, noisy, SD, mu_sum, dim, rows, 2.0)
            old.append(int((v > o).sum()))
        assert np.median(now) <= 2.0 * aim, np.median(now)
        assert np.median(old) >= 5.0 * aim, np.median(old)


def test_a_hessian_clip_of_rows_sharing_one_hessian_per_group_is_the_largest() -> None:
    """Eight groups of 1250 rows, each group's rows one Hessian norm (a hierarchical
    model's intercepts: no tail, but spaced one bin apart, which the exponential
    extrapolation reads as one), at the first stage's noise at epsilon 1: the clip lies at
    most three bins (1.7 times) above the largest norm in at least 95 of 100 releases. The
    factor of 3 before 2026-11-28 (the must-fail side) put it 3 times higher in every
    release."""
    counts = np.zeros(len(EDGES) + 1)
    counts[np.arange(8) + 28] = 1250.0
    largest = float(EDGES[35])  # the top group's upper edge
    sd, mu_sum, dim, rows = 60.0, 0.1, 36, 10_000.0
    near = 0
    for seed in range(100):
        noisy = np.round(counts + np.random.default_rng(seed).normal(0.0, sd, counts.size))
        c = wt._oneshot_clip(EDGES, noisy, sd, mu_sum, dim, "substitute", rows, wt._FACTOR_H)
        near += largest <= c <= largest * 2**0.75 * (1 + 1e-12)
        old = wt._oneshot_clip(EDGES, noisy, sd, mu_sum, dim, "substitute", rows, 3.0)
        assert old >= 2.5 * largest, old
    assert near >= 95, near
