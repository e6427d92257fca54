"""How the Taylor one-shot reads its clips from noisy histograms: the reading now against the
one before 2026-11-28 (issue 27).

For each model and data set (``benchmarks/model_suite.py``'s generators): the package's
private warm start at ``--eps`` (delta 1e-5, ``pp.sample``'s shares), then the rows' exact
histograms of whitened gradient and Hessian norms at its point, on the one-shot's own bins
(:func:`pymc_penalty.warmstart.taylor.stage_edges`). Measured, not released: the edge above
which ``k sqrt(dim) / mu_G`` rows lie (the "aimed edge": where the noise the clip adds
balances the rows it cuts; the reading now aims at ``_RECAPTURE`` = 4 times as many rows,
since the chains' residual carries part of a cut row's leftover). Each histogram
is then released ``--releases`` times with the first stage's histogram noise, and each
release is read two ways:

- ``now``: :func:`pymc_penalty.warmstart.taylor._oneshot_clip` (counts above an edge read
  from the top of the data down, with every bin's noise; extrapolated from two resolvable
  quantiles);
- ``before``: the rule before 2026-11-28, kept here as the baseline (:func:`clip_before`):
  bins below their own noise read as empty, the clip never below 2 (gradients) or 3
  (Hessians) times the 90% quantile.

Printed per model, kind (``g``, ``H``) and reading: the median and 10-90% range over
releases and data sets of the clip over the aimed edge, and the median and 90th percentile
of the rows above the clip (the rows whose leftover the chains' residual must carry).

Run ``python benchmarks/clip_reading.py [--eps 0.5 2] [--datasets 3] [--quick]``; the last
line is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import model_suite as ms  # noqa: E402

from pymc_penalty.accounting.gdp import gdp_mu  # noqa: E402
from pymc_penalty.model.screen import SCREEN_SHARE  # noqa: E402
from pymc_penalty.planning.plan import AUTO_WARM_START_SHARE  # noqa: E402
from pymc_penalty.privacy.ledger import PrivacyLedger  # noqa: E402
from pymc_penalty.privacy.taylor import clips as tc  # noqa: E402
from pymc_penalty.warmstart import prepare_warm_start, private_warm_start  # noqa: E402
from pymc_penalty.warmstart import taylor as wt  # noqa: E402
from pymc_penalty.warmstart.taylor_terms import Expansion, RowTaylorTerms  # noqa: E402

DELTA = 1e-5


def clip_before(edges, counts, sd, mu_sum, dim, rows, factor) -> float:
    """The one-shot clip as read before 2026-11-28 (substitute-one), the baseline: bins
    below ``k`` noise sds read as empty, the tail extrapolated from the 90% quantile and the
    one above ``max(1% of the rows, 10 sds)``."""

    def by_tail(tail: float) -> float:  # the old bin-by-bin reading, kept by the package
        return tc.clip_by_visible_tail(edges, counts, sd, tail)

    aim = wt.balance_rows(dim, mu_sum, "substitute")
    q90 = by_tail(0.1 * rows)
    hi_rows = max(0.01 * rows, 10.0 * sd)
    q_hi = by_tail(hi_rows)
    clip = factor * q90
    if q90 > 0.0 and q_hi > q90 and aim < hi_rows:
        per_decade = (q_hi - q90) / math.log(0.1 * rows / hi_rows)
        clip = max(clip, q_hi + per_decade * math.log(hi_rows / aim))
    return max(clip, by_tail(aim))


def _edge_above(edges: np.ndarray, exact: np.ndarray, rows: float) -> float:
    """The smallest edge with at most ``rows`` rows above it (exact counts)."""
    above = exact.sum() - np.cumsum(exact)[: len(edges)]
    return float(edges[min(int(np.searchsorted(-above, -rows)), len(edges) - 1)])


def _rows_above(edges: np.ndarray, exact: np.ndarray, clip: float) -> float:
    above = exact.sum() - np.cumsum(exact)
    return float(above[min(int(np.searchsorted(edges, clip)), len(edges) - 1)])


def measure(model_name: str, n: int, index: int, epsilon: float, releases: int, seed: int):
    """Per kind: (clip / aimed edge, rows above) for each reading and release."""
    model = ms.build_model(ms.make_dataset(model_name, n, index))
    mu = gdp_mu(epsilon, DELTA)
    noise = np.random.default_rng([seed, index])
    target = prepare_warm_start(model)
    rest = mu**2 * (1.0 - SCREEN_SHARE)
    warm = private_warm_start(
        model, mu=math.sqrt(rest * AUTO_WARM_START_SHARE), ledger=PrivacyLedger(mu),
        noise_rng=noise, target=target,
    )  # fmt: skip
    oneshot_mu2 = rest * (1.0 - AUTO_WARM_START_SHARE) * wt.TAYLOR_SHARE
    index_ = np.flatnonzero(target.likelihood.reads)
    index_ = np.arange(warm.point.size) if index_.size == 0 else index_
    k = index_.size
    order = 2 if k <= wt.MAX_SECOND_ORDER_DIM else 1
    e = Expansion(
        np.asarray(warm.point, float),
        np.linalg.cholesky(warm.covariance[np.ix_(index_, index_)]),
        index_,
        order,
    )
    data = RowTaylorTerms(target.likelihood, target.n)
    rows = float(target.n)
    # the first stage's histogram noise; the clips aimed as a one-stage release's (its G, H)
    first = wt.FIRST_STAGE_SHARES
    mu_hist = math.sqrt(first["hist_g"] / sum(first.values()) * oneshot_mu2 * wt.TAYLOR_FIRST_STAGE)
    full = dict(wt.ONESHOT_SHARES)
    if order == 1:
        full["G"] += full.pop("H") + full.pop("hist_h")
    e_g, e_h = wt.stage_edges(k, rows)
    kinds = [("g", e_g, wt._FACTOR_G, 2.0, full["G"], k)]
    if order == 2:
        kinds.append(("H", e_h, wt._FACTOR_H, 3.0, full["H"], k * (k + 1) // 2))
    out = {}
    for kind, edges, factor, factor_before, share, dim in kinds:
        exact = np.asarray(data.norm_counts(e, kind, edges), float)
        mu_sum = math.sqrt(share * oneshot_mu2)
        aimed = _edge_above(edges, exact, wt.balance_rows(dim, mu_sum, "substitute"))
        got = {"now": [], "before": []}
        for _ in range(releases):
            noisy, sd = tc.noisy_counts(exact, mu_hist, noise, "substitute")
            now = wt._oneshot_clip(edges, noisy, sd, mu_sum, dim, "substitute", rows, factor)
            before = clip_before(edges, noisy, sd, mu_sum, dim, rows, factor_before)
            for name, c in (("now", now), ("before", before)):
                got[name].append((c / aimed, _rows_above(edges, exact, c)))
        out[kind] = {name: np.array(v) for name, v in got.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(ms.MODELS), choices=ms.MODELS)
    parser.add_argument("--n", type=float, default=1e4)
    parser.add_argument("--eps", type=float, nargs="+", default=[0.5, 2.0])
    parser.add_argument("--datasets", type=int, default=3)
    parser.add_argument("--releases", type=int, default=100)
    parser.add_argument("--seed", type=int, default=28)
    parser.add_argument(
        "--quick", action="store_true", help="linear, n = 1e4, epsilon 0.5, 1 data set, 20 releases"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.n, args.eps, args.datasets, args.releases = (
            ["linear"], 1e4, [0.5], 1, 20,
        )  # fmt: skip
    cells = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for epsilon in args.eps:
            for name in args.models:
                pooled: dict[str, dict[str, list]] = {}
                for index in range(args.datasets):
                    res = measure(name, int(args.n), index, epsilon, args.releases, args.seed)
                    for kind, by in res.items():
                        for reading, arr in by.items():
                            pooled.setdefault(kind, {}).setdefault(reading, []).append(arr)
                for kind, by in pooled.items():
                    cell = {}
                    for reading, arrs in by.items():
                        a = np.concatenate(arrs)
                        ratio, above = a[:, 0], a[:, 1]
                        cell[reading] = {
                            "clip_over_aimed": float(np.median(ratio)),
                            "clip_over_aimed_q10": float(np.quantile(ratio, 0.1)),
                            "clip_over_aimed_q90": float(np.quantile(ratio, 0.9)),
                            "rows_above": float(np.median(above)),
                            "rows_above_q90": float(np.quantile(above, 0.9)),
                        }
                        print(
                            f"eps {epsilon:g} {name:12s} {kind} {reading:6s}: clip / aimed edge "
                            f"{cell[reading]['clip_over_aimed']:.2f} "
                            f"[{cell[reading]['clip_over_aimed_q10']:.2f}, "
                            f"{cell[reading]['clip_over_aimed_q90']:.2f}], rows above "
                            f"{cell[reading]['rows_above']:.0f} "
                            f"(90th pct {cell[reading]['rows_above_q90']:.0f})",
                            flush=True,
                        )
                    cells[f"{name}/eps={epsilon:g}/{kind}"] = cell
    print(
        "RESULT "
        + json.dumps(
            {"n": int(args.n), "datasets": args.datasets, "releases": args.releases, "cells": cells}
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
