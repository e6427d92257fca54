"""The Taylor path under add/remove-one at an enormous budget, against the exact posterior.

A check of the one-shot's clip histograms where their noise sd falls below one count
(``privacy.taylor.clips.clip_by_tail``): ``pp.sample(method="taylor", neighbours="add_remove",
min_rows=100)`` at epsilon 2000 on the 602 rows N(1, 1) of ``tests/dask_table.py`` (model
``y ~ N(mu, 1)``, ``mu ~ N(0, 10)``), fresh privacy noise per run. One line per run (the
posterior mean and sd of ``mu``, the released clips ``dp_taylor_clip_g`` / ``_h`` and the
residual clip, the verdict), then ``RESULT {...}`` with the exact posterior and the largest
error in posterior sds.

Before the fix of 2026-11-28 (an empty bin snapped to one count read as a row) the clips
varied by a factor of 1000 between runs and some posteriors landed sds off; after it every
run has the same clips. Run ``python scripts/taylor_add_remove_check.py [--runs 12]
[--neighbours add_remove|substitute]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import dask_table as table  # noqa: E402

import pymc_penalty as pp  # noqa: E402

RUN = {"draws": 300, "tune": 150, "chains": 4, "warm_start": 0.2, "warm_start_steps": 6}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=12)
    p.add_argument("--neighbours", choices=("add_remove", "substitute"), default="add_remove")
    args = p.parse_args(argv)
    logging.getLogger("pymc").setLevel(logging.ERROR)
    logging.getLogger("pymc_penalty").setLevel(logging.ERROR)
    y = np.concatenate([table.rows_of(0)["y"], table.rows_of(1)["y"]])
    precision = y.size + 1.0 / 100.0  # conjugate: unit noise, prior sd 10
    exact_mean, exact_sd = float(y.sum() / precision), float(precision**-0.5)
    extra = {"min_rows": 100} if args.neighbours == "add_remove" else {}
    errors = []
    for run in range(args.runs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata = pp.sample(
                model=table.normal_model(y), epsilon=table.EPS, delta=table.DELTA,
                method="taylor", random_seed=run, cores=1, progressbar=False,
                neighbours=args.neighbours, **extra, **RUN,
            )  # fmt: skip
        a = idata.attrs
        mean, sd = float(idata.posterior["mu"].mean()), float(idata.posterior["mu"].std())
        errors.append(abs(mean - exact_mean) / exact_sd)
        row = {
            "run": run, "mean": round(mean, 4), "sd": round(sd, 4),
            "clip_g": round(float(a["dp_taylor_clip_g"]), 5),
            "clip_h": round(float(a["dp_taylor_clip_h"]), 5),
            "residual_clip": round(float(a["dp_taylor_residual_clip"]), 5),
            "verdict": a["dp_convergence"],
        }  # fmt: skip
        print(json.dumps(row), flush=True)
    result = {
        "neighbours": args.neighbours, "exact_mean": exact_mean, "exact_sd": exact_sd,
        "largest_error_sd": max(errors), "runs_off_by_1_sd": int(sum(e > 1 for e in errors)),
    }  # fmt: skip
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
