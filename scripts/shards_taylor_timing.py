"""Milliseconds per chain step of the sharded Taylor path against the sharded plain walk.

``python scripts/shards_taylor_timing.py --n 2e4 1e5 --chains 4 --steps 30``: the logistic
regression of ``benchmarks/shards.py`` (d = 10, rows made on the workers), 2 shards on a
``LocalCluster`` of 2 workers, the same pool for both paths; the median interval between
two chain steps (``benchmarks/_dask_common.step_starts``: every chain's proposal, the ledger,
the shards' call and the decisions), after each run's warm start (and, on the Taylor path,
its one-shot and ``taylor_control``), which are not timed. A Taylor step's shards evaluate
each row's residual after its second-order Taylor model (65 coefficients a row at d = 10)
besides its log-likelihood.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import _dask_common as dask_common  # noqa: E402
from _dask_common import data_model, rows_loader  # noqa: E402

from pymc_penalty.distributed import ShardPool, sample_sharded  # noqa: E402

ROWS = {"base_seed": 20261127, "unit_norm": True}


def step_ms(pool: ShardPool, loaders: list, method: str, chains: int, steps: int) -> float:
    """Median ms between chain steps of one ``sample_sharded`` run through ``pool``."""
    model = data_model()
    with dask_common.step_starts(pool) as spans, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sample_sharded(
            loaders, model=model, pool=pool, epsilon=10.0, delta=1e-5, draws=steps, tune=5,
            chains=chains, clip="auto", clip_mode="metric", warm_start=0.2, method=method,
            random_seed=1,
        )  # fmt: skip
    return dask_common.median_interval_ms(spans[5:])  # the draws' steps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=float, nargs="+", default=[2e4])
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args(argv)
    dask_common.quiet_logs()
    dask_common.print_provenance(__file__, sys.argv[1:] if argv is None else argv)
    print("| n | chains | plain ms/step | Taylor ms/step | ratio |")
    print("|---|---|---|---|---|")
    for n in (int(v) for v in args.n):
        loaders = [rows_loader(n // 2, k, **ROWS) for k in range(2)]
        model = data_model()
        with ShardPool(loaders, model, model.value_vars, model.initial_point()) as pool:
            plain = step_ms(pool, loaders, "penalty", args.chains, args.steps)
            taylor = step_ms(pool, loaders, "taylor", args.chains, args.steps)
        print(f"| {n:.0e} | {args.chains} | {plain:.1f} | {taylor:.1f} | {taylor / plain:.2f} |")


if __name__ == "__main__":
    main()
