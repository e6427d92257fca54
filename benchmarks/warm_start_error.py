"""The private warm start alone: its error, in posterior sd, on the utility and gauss workloads.

Workloads (those of ``benchmarks/utility.py --defaults`` and ``benchmarks/gauss.py``):

- ``logistic``: Bayesian logistic regression, d = 5, n = 1e5, epsilon = 1, delta = 1/n;
  reference: the exact posterior mode and the inverse Hessian there (Newton, non-private);
  at n = 1e5 the mode lies within a few hundredths of a posterior sd of the mean.
- ``gauss``: the anisotropic Gaussian, d = 10, n = 1e5, epsilon = 2, delta = 0.1/n; exact
  posterior.

Each seed runs :func:`pymc_penalty.warmstart.private_warm_start` with ``mu = sqrt(share)``
times the budget's ``mu`` (as ``pymc_penalty.sample(warm_start=share)`` does) and prints the
error of its point in posterior sd per coordinate, their RMS and largest magnitude, and the
warm start's found clip and released clipped fraction where it has them. No chains are run.

Run ``python benchmarks/warm_start_error.py [--quick] [--workloads logistic gauss]
[--seeds 0 1 2] [--clip auto]`` (``--quick``: n = 1e4, one seed, gauss at epsilon 6). The
last line printed is ``RESULT {...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import logistic_model, make_logistic_data  # noqa: E402
from gauss import make_gauss  # noqa: E402
from utility import DATA_SEED, _quiet  # noqa: E402


def _logistic(n: int, quick: bool = False):
    data = make_logistic_data(n, 5, seed=DATA_SEED)
    X, y = data.X, data.y
    beta = np.zeros(5)
    for _ in range(50):  # Newton on the log posterior (prior N(0, 1))
        p = 1.0 / (1.0 + np.exp(-(X @ beta)))
        grad = X.T @ (y - p) - beta
        hess = (X * (p * (1 - p))[:, None]).T @ X + np.eye(5)
        step = np.linalg.solve(hess, grad)
        beta = beta + step
        if np.max(np.abs(step)) < 1e-12:
            break
    cov = np.linalg.inv(hess)
    return logistic_model(data), beta, np.sqrt(np.diag(cov)), 1.0, 1.0 / n


def _gauss(n: int, quick: bool = False):
    import pymc as pm

    g = make_gauss(n, 10)
    with pm.Model() as model:
        th = pm.Normal("th", 0.0, 10.0, shape=10)
        pm.MvNormal("x", mu=th, cov=g.cov, observed=g.X)
    # Quick: epsilon 6, as gauss.py's quick mode (at n = 1e4 and epsilon 2 the warm start is
    # noise-bound: errors of 3-15 sd before and after the found clip, 10 seeds).
    return model, g.post_mean, g.post_sd, 6.0 if quick else 2.0, 0.1 / n


WORKLOADS = {"logistic": _logistic, "gauss": _gauss}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="n = 1e4, one seed")
    parser.add_argument("--workloads", nargs="+", default=["logistic", "gauss"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--share", type=float, default=0.2)
    parser.add_argument("--clip", default="auto", help='"auto" or a number')
    args = parser.parse_args(argv)
    _quiet()
    import pymc_penalty as pp
    from pymc_penalty.warmstart import private_warm_start

    clip = args.clip if args.clip == "auto" else float(args.clip)
    n, seeds = (10_000, [0]) if args.quick else (100_000, args.seeds)
    result = {}
    for name in args.workloads:
        model, mean, sd, eps, delta = WORKLOADS[name](n, args.quick)
        mu = float(np.sqrt(args.share)) * pp.gdp_mu(eps, delta)
        rows = []
        for seed in seeds:
            with model:
                ws = private_warm_start(
                    mu=mu, ledger=pp.PrivacyLedger(1.001 * mu), clip=clip,
                    noise_rng=np.random.default_rng(seed),
                )  # fmt: skip
            err = (ws.point - mean) / sd
            row = {
                "seed": seed,
                "rms_sd": round(float(np.sqrt(np.mean(err**2))), 3),
                "max_sd": round(float(np.max(np.abs(err))), 3),
                "err_sd": [round(float(e), 2) for e in err],
            }
            for field in ("clip", "clipped_fraction", "clip_history"):
                if hasattr(ws, field):
                    value = getattr(ws, field)
                    row[field] = np.round(np.asarray(value, float), 4).tolist()
            rows.append(row)
            print(name, json.dumps(row), flush=True)
        result[name] = rows
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
