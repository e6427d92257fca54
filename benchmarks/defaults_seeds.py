"""The defaults over seeds on one cell of the utility table, with the warm start's share.

A cell of :mod:`utility_table` run once is one draw of its error (the privacy noise is fresh
OS entropy every run). This runs ``pymc_penalty.sample(epsilon, delta)`` on one cell's
workload for several seeds and splits each run's error into its parts:

- ``err``: RMS over coordinates of (posterior mean - reference mean) / reference sd;
- ``ws_err``: the same for the private warm start's estimated mode (captured from the run);
- ``first_err``: the same for the mean of the chains' first draws (after tuning);
- ``sd_ratio``: geometric mean over coordinates of the pooled sd / reference sd;
- ``within_sd``: the same for the chains' own sd (how far a chain travels);
- ``rhat``: the largest R-hat of the run's verdict.

The summary line gives the RMS of ``err`` over seeds with one standard error (of the mean
squared error, propagated), and the means of the rest. Extra ``pymc_penalty.sample``
arguments go in ``--kwargs`` as JSON (``'{"warm_start": 0.35}'``). ``--workload
logistic_normal`` is the logistic workload with :mod:`utility`'s standard normal covariates.

Run ``python benchmarks/defaults_seeds.py logistic 1e5 1 --seeds 1 2 3 4 5 6``. The last line
printed is ``RESULT {...}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import utility_table as ut  # noqa: E402
from _common import capture_warm_start, rms_over_seeds  # noqa: E402

#: ``--quick``: a cell where the defaults converge well, two seeds, a short plan.
QUICK = ("logistic", 2000.0, 6.0, [1, 2], '{"draws": 300}')


def _problem(workload: str, n: int) -> ut.Problem:
    if workload == "logistic_normal":
        original = ut.make_logistic_data

        def standard_normal(n, d, seed, x_bound=None):
            return original(n, d, seed=seed)

        ut.make_logistic_data = standard_normal
        try:
            return ut.make_problem("logistic", n)
        finally:
            ut.make_logistic_data = original
    return ut.make_problem(workload, n)


def run_seed(prob: ut.Problem, epsilon: float, seed: int, kwargs: dict) -> dict:
    """One ``pymc_penalty.sample`` run and its error split."""
    import pymc_penalty as pp

    with capture_warm_start() as captured:
        t0 = time.perf_counter()
        idata = pp.sample(
            epsilon=epsilon,
            delta=prob.delta,
            model=prob.model(),
            random_seed=seed,
            cores=1,
            progressbar=False,
            **kwargs,
        )
        wall = time.perf_counter() - t0
    name = next(iter(idata.posterior.data_vars))
    x = idata.posterior[name].values.reshape(idata.posterior.sizes["chain"], -1, prob.d)
    sd = prob.post_sd

    def rms(v: np.ndarray) -> float:
        return float(np.sqrt(np.mean(((v - prob.post_mean) / sd) ** 2)))

    warm = captured.get("warm")
    return {
        "seed": seed,
        "err": rms(x.reshape(-1, prob.d).mean(axis=0)),
        "ws_err": rms(warm.point) if warm is not None else math.nan,
        "first_err": rms(x[:, 0].mean(axis=0)),
        "sd_ratio": float(np.exp(np.mean(np.log(x.reshape(-1, prob.d).std(axis=0) / sd)))),
        "within_sd": float(np.exp(np.mean(np.log(x.std(axis=1).mean(axis=0) / sd)))),
        "rhat": float(idata.attrs.get("dp_r_hat_max", math.nan)),
        "wall_s": round(wall, 1),
    }


def summary(rows: list[dict]) -> dict:
    """RMS error over seeds with one standard error, and the means of the other columns."""
    rms, se = rms_over_seeds([r["err"] for r in rows])
    out = {"seeds": len(rows), "rms_err": rms, "rms_err_se": se}
    for key in ("ws_err", "first_err"):
        out["rms_" + key] = float(np.sqrt(np.mean([r[key] ** 2 for r in rows])))
    for key in ("sd_ratio", "within_sd", "rhat"):
        out["mean_" + key] = float(np.mean([r[key] for r in rows]))
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workload", nargs="?", choices=["logistic", "logistic_normal", "gauss"])
    parser.add_argument("n", type=float, nargs="?")
    parser.add_argument("epsilon", type=float, nargs="?")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--kwargs", default="{}", help="pymc_penalty.sample arguments, JSON")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK} (for CI)")
    args = parser.parse_args(argv)
    if args.quick:
        args.workload, args.n, args.epsilon, args.seeds, args.kwargs = QUICK
    elif args.epsilon is None:
        parser.error("give workload, n and epsilon (or --quick)")
    logging.getLogger("pymc").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    prob = _problem(args.workload, int(args.n))
    kwargs = json.loads(args.kwargs)
    rows = []
    for seed in args.seeds:
        row = run_seed(prob, args.epsilon, seed, kwargs)
        rows.append(row)
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}))
    result = {"cell": f"{args.workload}:{args.n:g}:{args.epsilon:g}", "kwargs": kwargs}
    result.update(summary(rows))
    result["rows"] = rows
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
