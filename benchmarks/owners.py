"""Milliseconds per step and per proposal of several owners on Dask workers vs in-process.

Model: Bayesian logistic regression with d = 10 coefficients; each owner holds n_k synthetic
rows (fixed seeds). The in-process figure is ``MultiOwnerPenaltyMetropolis`` (Algorithm 2 with
every owner's rows in the driver's memory) driven by ``step.step(point)``: one proposal per
step, so its time per proposal does not depend on the number of chains; for reference,
``PenaltyMetropolis`` on the pooled rows (one noise, no per-owner sums) is timed too. The
distributed figure is :func:`pymc_penalty.distributed.sample` on a ``LocalCluster`` with one
worker process per owner (started once per configuration, excluded), all chains of a step in
one call per owner; per step is the median interval between successive steps' calls (driver
proposals, ledger charge and journal, the owners' calls, the decisions), per proposal is that
divided by the chains.

Run ``python benchmarks/owners.py [--quick]`` from the repository root. ``--quick`` runs 2
owners at n_k = 1e3 with 1 and 16 chains (under a minute); the full run covers 1, 2 and 4
owners, n_k = 1e3 and 1e5, 1 and 16 chains, and prints the markdown table for
``docs/distributed.md``. The last line is
``RESULT {"rows": [{owners, n_k, chains, inproc_ms_per_proposal, pooled_ms_per_proposal,
dist_ms_per_step, dist_ms_per_proposal, extra_ms_per_proposal, ratio}, ...]}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import warnings

# Single-threaded BLAS, as Dask sets for its workers (OMP/OPENBLAS/MKL_NUM_THREADS=1): the
# in-process baseline would otherwise time OpenBLAS's threads fighting over a loaded box.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from pymc_penalty import PenaltyMetropolis  # noqa: E402
from pymc_penalty.distributed import Owner, OwnerPool  # noqa: E402
from pymc_penalty.distributed import sample as dsample  # noqa: E402
from pymc_penalty.variants import MultiOwnerPenaltyMetropolis  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _dask_common as dask_common  # noqa: E402
from _common import best_seconds_per_step  # noqa: E402
from _dask_common import D, data_model, logistic_rows, rows_loader  # noqa: E402

#: The owners' rows: ``logistic_rows(n_k, k, **ROWS)`` for owner k.
ROWS = {"base_seed": 20240521}


def in_process_ms(owners: int, n_k: int, steps: int, chunks: int = 3) -> float:
    """Fastest chunk's ms per step (= per proposal) of the in-process Algorithm 2 step."""
    parts = [logistic_rows(n_k, k, **ROWS) for k in range(owners)]
    rows = {key: np.concatenate([p[key] for p in parts]) for key in ("X", "y")}
    model = data_model(rows)
    index = np.repeat(np.arange(owners), n_k)
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = MultiOwnerPenaltyMetropolis(owners=index, mu=0.5, scaling=0.02, rng=1)
    return best_seconds_per_step(step, model.initial_point(), steps, chunks) * 1e3


def pooled_ms(owners: int, n_k: int, steps: int, chunks: int = 3) -> float:
    """The same for ``PenaltyMetropolis`` on the pooled rows (one noise, no per-owner sums):
    the fastest in-process path, for reference."""
    parts = [logistic_rows(n_k, k, **ROWS) for k in range(owners)]
    model = data_model({key: np.concatenate([p[key] for p in parts]) for key in ("X", "y")})
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = PenaltyMetropolis(mu=0.5, scaling=0.02, rng=1)
    return best_seconds_per_step(step, model.initial_point(), steps, chunks) * 1e3


def distributed_ms(pool: OwnerPool, owners: list[Owner], chains: int, steps: int) -> float:
    """Median ms per step of distributed.sample through ``pool`` (interval between calls)."""
    with dask_common.step_starts(pool) as starts, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dsample(
            owners,
            model=data_model(),
            pool=pool,
            epsilon=1e6,
            delta=1e-5,
            draws=steps,
            tune=0,
            chains=chains,
            S=np.full(D, 0.02),
            random_seed=1,
        )
    return dask_common.median_interval_ms(starts)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 owners, n_k = 1e3 only")
    args = parser.parse_args(argv)
    dask_common.quiet_logs()
    owner_counts = (2,) if args.quick else (1, 2, 4)
    sizes = (1000,) if args.quick else (1000, 100_000)
    rows = []
    for n_owners in owner_counts:
        for n_k in sizes:
            steps = 60 if args.quick else (200 if n_k <= 1000 else 40)
            inproc = in_process_ms(n_owners, n_k, steps)
            pooled = pooled_ms(n_owners, n_k, steps)
            tmp = tempfile.mkdtemp(prefix="owners-bench-")
            owners = [
                Owner(f"o{k}", rows_loader(n_k, k, **ROWS), os.path.join(tmp, f"o{k}"), 1e6, 1e-5)
                for k in range(n_owners)
            ]
            model = data_model()
            with OwnerPool(owners, model, model.value_vars, model.initial_point()) as pool:
                for chains in (1, 16):
                    per_step = distributed_ms(pool, owners, chains, steps)
                    row = {
                        "owners": n_owners,
                        "n_k": n_k,
                        "chains": chains,
                        "inproc_ms_per_proposal": inproc,
                        "pooled_ms_per_proposal": pooled,
                        "dist_ms_per_step": per_step,
                        "dist_ms_per_proposal": per_step / chains,
                        "extra_ms_per_proposal": per_step / chains - inproc,
                        "ratio": per_step / chains / inproc,
                    }
                    rows.append(row)
                    print(
                        f"owners={n_owners} n_k={n_k:>6d} chains={chains:>2d}  in-process "
                        f"{inproc:8.3f} ms/proposal (pooled {pooled:8.3f})  dask "
                        f"{per_step:8.3f} ms/step "
                        f"{per_step / chains:8.3f} ms/proposal  ratio {row['ratio']:6.2f}",
                        flush=True,
                    )
    if not args.quick:
        dask_common.print_provenance(__file__, argv)
        print("| owners | n_k | chains | in-process ms/proposal | pooled ms/proposal | "
              "Dask ms/step | Dask ms/proposal | extra ms/proposal | ratio |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['owners']} | {r['n_k']:.0e} | {r['chains']} | "
                f"{r['inproc_ms_per_proposal']:.3f} | {r['pooled_ms_per_proposal']:.3f} | "
                f"{r['dist_ms_per_step']:.2f} | "
                f"{r['dist_ms_per_proposal']:.3f} | {r['extra_ms_per_proposal']:+.3f} | "
                f"{r['ratio']:.2f} |"
            )
    print("RESULT " + json.dumps({"rows": rows}))


if __name__ == "__main__":
    main()
