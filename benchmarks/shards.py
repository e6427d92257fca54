"""Milliseconds per step of one curator's table sharded over Dask workers vs in-process.

Model: Bayesian logistic regression with d = 10 coefficients on n synthetic rows (fixed
seeds), all chains of a step batched. In-process is ``PenaltyMetropolis`` on the whole table
(one proposal per ``step.step``; a step of C chains costs C proposals), timed with
``best_seconds_per_step``. Sharded is :func:`pymc_penalty.distributed.sample_sharded` on a
``LocalCluster`` with 1 worker (one shard of n rows) and 2 workers (two shards of n / 2 rows),
each shard's rows generated on its worker (never in the driver); per step is the median
interval between successive steps' calls (proposals, ledger charge, journal, the shards'
partial sums, the noise, the decisions). The round trip is the sharded step at n = 1e3 per
shard, where the rows cost nearly nothing, in parts (``round_trip_parts``): the
``pool.release`` call (the shards' replies plus the driver's noise and journal), the driver's
own work between calls (proposals, ledger, decisions) and an empty call to every shard
(Dask's own round trip, no computing).

Memory: the driver's peak resident set (``ru_maxrss``) is read after the sharded runs and
before any in-process table exists (imports included; ``driver_import_mb`` is the peak after
the imports alone); each worker's peak is read on the worker. The in-process runs come last.
The peak never falls, so ``driver_peak_mb_by_n``, read after the round trip's runs (key
``2000``) and after each n's sharded runs, shows whether the driver grows with n:
``driver_growth_mb`` is its last value less its first.

Extrapolation (on paper): a step of C chains on 1e9 rows over 64 workers costs about
``C * per_row * 1e9 / 64 + round_trip``, with ``per_row`` the in-process cost per row and
proposal at the largest n measured and ``round_trip`` the 2-worker round trip (a real
cluster's network adds its own latency; see docs/distributed.md).

Run ``python benchmarks/shards.py [--quick] [--n 1e5 1e6] [--chains 16] [--steps 15]`` from
the repository root. ``--quick``: n = 2e4, 4 chains (about a minute). The full run: n = 1e5
and 1e6, 16 chains. The last line is
``RESULT {"rows": [{n, chains, config, ms_per_step, ratio}], "driver_peak_mb",
"driver_import_mb", "driver_peak_mb_by_n", "driver_growth_mb", "worker_peak_mb",
"round_trip_ms", "round_trip_parts": {ms, release_ms, driver_ms, empty_call_ms},
"per_row_us", "extrapolated_1e9_64_ms_per_step"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import warnings

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # as Dask sets for its workers

import numpy as np  # noqa: E402

from pymc_penalty import PenaltyMetropolis  # noqa: E402
from pymc_penalty.distributed import ShardPool, sample_sharded  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _dask_common as dask_common  # noqa: E402
from _common import best_seconds_per_step  # noqa: E402
from _dask_common import D, data_model, logistic_rows, rows_loader  # noqa: E402

#: The table's rows: ``logistic_rows(n_k, k, **ROWS)`` for shard k; in-process, the table is
#: ``logistic_rows(n, 0, **ROWS)``.
ROWS = {"base_seed": 20261127, "unit_norm": True}


def _max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _empty_call_ms(pool: ShardPool, calls: int = 30) -> float:
    """Median ms of one call to every shard that computes nothing (each actor's ``ready``),
    sent and awaited as a step's calls are (the pool's own fan-out; a private method: this
    measures the pool's internals)."""
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        list(pool._ask_all("answer", lambda _, actor: actor.ready()))
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def sharded_ms(n: int, workers: int, chains: int, steps: int) -> tuple[dict, list[float]]:
    """ms per step of sample_sharded with ``workers`` shards of n / workers rows (``ms``:
    the median interval between steps; ``release_ms``: the median ``pool.release`` call,
    i.e. the shards' round trip plus the driver's noise and journal; ``driver_ms``: the
    rest of a step, the driver's proposals, ledger and decisions; ``empty_call_ms``: a call
    to every shard that computes nothing), and each worker's peak resident set in MB."""
    n_k = n // workers
    loaders = [rows_loader(n_k, k, **ROWS) for k in range(workers)]
    model = data_model()
    with ShardPool(loaders, model, model.value_vars, model.initial_point()) as pool:
        with dask_common.step_starts(pool) as spans, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sample_sharded(
                loaders, model=model, pool=pool, epsilon=1e6, delta=1e-5, draws=steps, tune=0,
                chains=chains, clip=1.0, S=np.full(D, 0.02), random_seed=1,
            )  # fmt: skip
        empty = _empty_call_ms(pool)
        peaks = pool.client.run(_max_rss_mb)
    ms = dask_common.median_interval_ms(spans)
    release = dask_common.median_release_ms(spans)
    parts = {"ms": ms, "release_ms": release, "driver_ms": ms - release, "empty_call_ms": empty}
    return parts, [float(v) for v in peaks.values()]


def in_process_ms(n: int, chains: int, steps: int) -> float:
    """Fastest chunk's ms per step of C chains (C proposals) of PenaltyMetropolis."""
    model = data_model(logistic_rows(n, 0, **ROWS))
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = PenaltyMetropolis(mu=0.5, scaling=0.02, rng=1)
    return best_seconds_per_step(step, model.initial_point(), steps, 3) * 1e3 * chains


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 2e4, 4 chains")
    parser.add_argument("--n", type=float, nargs="+", help="table sizes (default 1e5 1e6)")
    parser.add_argument("--chains", type=int, help="chains per step (default 16)")
    parser.add_argument("--steps", type=int, help="timed steps per configuration (default 15)")
    args = parser.parse_args(argv)
    dask_common.quiet_logs()
    driver_import = _max_rss_mb()  # the imports alone (pymc, pytensor, dask)
    sizes = (20_000,) if args.quick else (100_000, 1_000_000)
    sizes = tuple(int(n) for n in args.n) if args.n else sizes
    chains = args.chains or (4 if args.quick else 16)
    steps = args.steps or (20 if args.quick else 15)
    rows, worker_peak = [], 0.0
    parts, _ = sharded_ms(2 * 1000, 2, chains, steps)
    round_trip = parts["ms"]
    print(
        f"round trip (2 workers, 1e3 rows each, {chains} chains): {round_trip:.2f} ms/step: "
        f"release {parts['release_ms']:.2f} ms (an empty call to both shards "
        f"{parts['empty_call_ms']:.2f} ms), the driver's own {parts['driver_ms']:.2f} ms"
    )
    peak_by_n = {2000: _max_rss_mb()}
    for n in sizes:
        for workers in (1, 2):
            parts_n, peaks = sharded_ms(n, workers, chains, steps)
            ms = parts_n["ms"]
            worker_peak = max(worker_peak, *peaks)
            rows.append(
                {"n": n, "chains": chains, "config": f"{workers}_workers", "ms_per_step": ms}
            )
            print(f"n={n:.0e} {workers} worker(s): {ms:9.2f} ms/step", flush=True)
        peak_by_n[n] = _max_rss_mb()
        print(f"driver peak after n={n:.0e}: {peak_by_n[n]:.0f} MB", flush=True)
    driver_peak = _max_rss_mb()  # before any in-process table exists
    per_row_us = 0.0
    for n in sizes:
        ms = in_process_ms(n, chains, max(steps // 3, 3))
        rows.append({"n": n, "chains": chains, "config": "in_process", "ms_per_step": ms})
        per_row_us = ms * 1e3 / (n * chains)  # the largest n's, last
        print(f"n={n:.0e} in-process: {ms:9.2f} ms/step", flush=True)
    for r in rows:
        base = next(
            x["ms_per_step"] for x in rows if x["n"] == r["n"] and x["config"] == "in_process"
        )
        r["ratio"] = r["ms_per_step"] / base
    extrapolated = chains * per_row_us * 1e-3 * 1e9 / 64 + round_trip
    if not args.quick:
        dask_common.print_provenance(__file__, argv)
        print("| n | chains | configuration | ms/step | ratio to in-process |")
        print("|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['n']:.0e} | {r['chains']} | {r['config']} | {r['ms_per_step']:.1f} | "
                  f"{r['ratio']:.2f} |")  # fmt: skip
    print(f"driver peak {driver_peak:.0f} MB (imports {driver_import:.0f} MB), worker peak "
          f"{worker_peak:.0f} MB; per row and proposal {per_row_us:.4f} us; 1e9 rows on 64 "
          f"workers, {chains} chains: about {extrapolated:.0f} ms/step")  # fmt: skip
    result = {
        "rows": rows,
        "driver_peak_mb": driver_peak,
        "driver_import_mb": driver_import,
        "driver_peak_mb_by_n": peak_by_n,
        "driver_growth_mb": peak_by_n[sizes[-1]] - peak_by_n[2000],
        "worker_peak_mb": worker_peak,
        "round_trip_ms": round_trip,
        "round_trip_parts": parts,
        "per_row_us": per_row_us,
        "extrapolated_1e9_64_ms_per_step": extrapolated,
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
