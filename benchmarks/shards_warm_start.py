"""Seconds of the private warm start on a sharded table vs in-process, and how far apart the
two land on the same noise.

Model: the logistic regression of ``benchmarks/shards.py`` (d = 10, rows of unit expected
norm, fixed seeds). In-process is :func:`pymc_penalty.warmstart.private_warm_start` on the
concatenated table; sharded is :func:`pymc_penalty.distributed._warm.sharded_warm_start` on a
``LocalCluster`` with 2 workers (two shards of n / 2 rows, each generated on its worker),
timed after the shards have loaded and compiled. Both with ``clip="auto"``, 12 steps, the
same seeded noise (a reproducible, non-private comparison) and ``mu`` given by ``--mu``.
The distance is per coordinate in posterior sds (from the in-process warm start's
covariance): the two differ only through the pairs (formed within each shard) and the float
order of the sums.

Both timings leave out compiling (the in-process target is prepared once, the shards are
started before). With n / 2 even and substitute-one the shards' pairs are the whole table's:
the two then differ only in the float order of the sums. Under add/remove-one the pair across
the shards' boundary is missing and the pair count is ``n_hat - 2``.

``--taylor MU`` also times the Taylor path's one-shot release (every stage,
:func:`~pymc_penalty.warmstart.taylor.staged_oneshot`) of ``mu`` = MU at the in-process warm
start's point, in-process (:class:`~pymc_penalty.warmstart.taylor_terms.RowTaylorTerms` on the
concatenated table) and on the shards
(:func:`~pymc_penalty.distributed._warm.sharded_taylor_oneshot`), on the same seeded noise:
``oneshot_in_process_s``, ``oneshot_sharded_s``, ``oneshot_ratio`` and ``oneshot_max_sd``
(the released modes' largest distance per coordinate, in the released covariance's sds).

Run ``python benchmarks/shards_warm_start.py [--n 2e4] [--mu 1.0] [--seeds 2]
[--neighbours substitute] [--taylor 3.0] [--quick]`` from the repository root. The last line
is ``RESULT {"rows": [{n, seed, in_process_s, sharded_s, ratio, rms_sd, max_sd, ...}]}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # as Dask sets for its workers

import numpy as np  # noqa: E402

from pymc_penalty.distributed import ShardPool  # noqa: E402
from pymc_penalty.distributed._setup import prepare_run  # noqa: E402
from pymc_penalty.distributed._warm import sharded_taylor_oneshot, sharded_warm_start  # noqa: E402
from pymc_penalty.privacy.ledger import PrivacyLedger  # noqa: E402
from pymc_penalty.warmstart import prepare_warm_start, private_warm_start  # noqa: E402
from pymc_penalty.warmstart.taylor import staged_oneshot, taylor_oneshot_on  # noqa: E402
from pymc_penalty.warmstart.taylor_terms import RowTaylorTerms  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _dask_common as dask_common  # noqa: E402
from _dask_common import data_model, logistic_rows, rows_loader  # noqa: E402

ROWS = {"base_seed": 20261127, "unit_norm": True}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=float, nargs="+", default=[2e4])
    parser.add_argument("--mu", type=float, default=1.0)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--neighbours", default="substitute")
    parser.add_argument("--taylor", type=float, default=None, help="the one-shot's mu too")
    parser.add_argument("--quick", action="store_true", help="n = 4000, one seed (for CI)")
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.seeds = [4000.0], 1
    adds = args.neighbours == "add_remove"
    dask_common.print_provenance(__file__, sys.argv[1:] if argv is None else argv)
    dask_common.quiet_logs()
    warnings.simplefilter("ignore")
    from distributed import Client, LocalCluster

    rows = []
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, silence_logs=50)
    client = Client(cluster, set_as_default=False)
    try:
        for n in (int(v) for v in args.n):
            half = n // 2
            parts = [logistic_rows(half, k, **ROWS) for k in range(2)]
            table = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
            placeholder = data_model()
            r = prepare_run(
                placeholder, epsilon=1.0, delta=1e-5, draws=10, tune=10, chains=2,
                neighbours=args.neighbours, clip=1.0, clip_mode="distance", clip_count_share=0.05,
                S=None, scaling=1.0, adapt="full", target_accept=0.234, adapt_window=None,
                tune_interval=None, ledger_path=None, run=None,
            )  # fmt: skip
            loaders = [rows_loader(half, k, **ROWS) for k in range(2)]
            with ShardPool(loaders, placeholder, r.value_vars, r.point, cluster=client) as pool:
                whole = data_model(table)
                target = prepare_warm_start(
                    whole, neighbours=args.neighbours, min_rows=1000 if adds else None
                )
                for seed in range(args.seeds):
                    start = time.perf_counter()
                    local = private_warm_start(
                        whole, mu=args.mu, ledger=PrivacyLedger(10.0), clip="auto",
                        neighbours=args.neighbours, noise_rng=np.random.default_rng(seed),
                        target=target, min_rows=1000 if adds else None,
                    )  # fmt: skip
                    local_s = time.perf_counter() - start
                    r = r._replace(ledger=PrivacyLedger(10.0))
                    start = time.perf_counter()
                    warm = sharded_warm_start(
                        pool, r, mu=args.mu, clip="auto", steps=12,
                        noise_rng=np.random.default_rng(seed),
                    )  # fmt: skip
                    sharded_s = time.perf_counter() - start
                    sd = np.sqrt(np.diag(local.covariance))
                    z = (warm.point - local.point) / sd
                    row = {
                        "n": n,
                        "seed": seed,
                        "in_process_s": round(local_s, 3),
                        "sharded_s": round(sharded_s, 3),
                        "ratio": round(sharded_s / local_s, 2),
                        "rms_sd": float(f"{np.sqrt(np.mean(z**2)):.3g}"),
                        "max_sd": float(f"{np.max(np.abs(z)):.3g}"),
                    }
                    if args.taylor is not None:
                        row.update(_oneshots(pool, r, target, local, args.taylor, seed))
                    print(row, flush=True)
                    rows.append(row)
    finally:
        client.close()
        cluster.close()
    result = {"rows": rows}
    print("RESULT " + json.dumps(result))
    return result


def _oneshots(pool, r, target, warm, mu: float, seed: int) -> dict:
    """The one-shot of ``mu`` at ``warm`` in-process and on the shards, timed, and how far
    apart their released modes are (in the in-process released covariance's sds)."""
    data, ledger = RowTaylorTerms(target.likelihood, target.n), PrivacyLedger(100.0)
    noise = np.random.default_rng(seed)

    def stage(at, **kw):
        return taylor_oneshot_on(
            data, at, reads=target.likelihood.reads, prior=target.prior,
            relation=target.relation, ledger=ledger, noise_rng=noise, **kw,
        )  # fmt: skip

    start = time.perf_counter()
    local = staged_oneshot(stage, warm, mu**2)[0]
    local_s = time.perf_counter() - start
    r = r._replace(ledger=PrivacyLedger(100.0))
    start = time.perf_counter()
    sharded = sharded_taylor_oneshot(pool, r, warm, mu=mu, noise_rng=np.random.default_rng(seed))
    sharded_s = time.perf_counter() - start
    z = (sharded.point - local.point) / np.sqrt(np.diag(local.covariance))
    return {
        "oneshot_in_process_s": round(local_s, 3),
        "oneshot_sharded_s": round(sharded_s, 3),
        "oneshot_ratio": round(sharded_s / local_s, 2),
        "oneshot_max_sd": float(f"{np.max(np.abs(z)):.3g}"),
    }


if __name__ == "__main__":
    main()
