"""Check one model-suite cell's NUTS reference against the Laplace approximation and pp.sample.

The model suite compares private posteriors with NUTS on the same data. On the logistic model
at n = 1e5, data set 1 (a covariate effect of 22 on a covariate of scale 0.1), both private
methods came out at 0.002-0.02 of the reference's sd in one run
(``benchmarks/results/model_suite_issue27_taylor_1e5.csv``). This script recomputes, for one
data set of ``benchmarks/model_suite.py``'s logistic generator:

- the exact mode and the Laplace sd (Newton on the log posterior, NumPy);
- NUTS as the suite runs it (``model_suite.run_nuts``, ``--nuts-seed``);
- ``pp.sample(epsilon=--epsilon, delta=1e-5)`` with its defaults (fresh privacy noise).

Run ``python scripts/check_suite_reference.py [--n 100000] [--dataset 1]``; the last line is
``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import model_suite as ms  # noqa: E402

import pymc_penalty as pp  # noqa: E402


def laplace(ds: ms.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """Mode and Laplace sd of the logistic model's posterior (its N(0, 1/scale) prior)."""
    X, y = ds.data["X"], ds.data["y"]
    prior_sd = 1.0 / ms.LOGISTIC_SCALES
    b = np.zeros(X.shape[1])
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-(X @ b)))
        grad = X.T @ (y - p) - b / prior_sd**2
        hess = (X * (p * (1.0 - p))[:, None]).T @ X + np.diag(1.0 / prior_sd**2)
        step = np.linalg.solve(hess, grad)
        b = b + step
        if np.max(np.abs(step)) < 1e-12:
            break
    return b, np.sqrt(np.diag(np.linalg.inv(hess)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--dataset", type=int, default=1)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--nuts-seed", type=int, default=1)
    args = parser.parse_args(argv)
    ds = ms.make_dataset("logistic", args.n, args.dataset)
    mode, sd = laplace(ds)
    nuts, _, _ = ms.run_nuts(ds, args.nuts_seed, False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idata = pp.sample(
            epsilon=args.epsilon, delta=1e-5, model=ms.build_model(ds), progressbar=False, cores=1
        )
    private = idata.posterior["b"].values.reshape(-1, 3)
    out = {
        "truth": ds.truth["b"].tolist(),
        "laplace_mode": mode.tolist(),
        "laplace_sd": sd.tolist(),
        "nuts_mean": nuts["b"].mean(0).tolist(),
        "nuts_sd": nuts["b"].std(0).tolist(),
        "private_method": idata.attrs["dp_method"],
        "private_verdict": idata.attrs["dp_convergence"],
        "private_mean": private.mean(0).tolist(),
        "private_sd": private.std(0).tolist(),
    }
    for key, value in out.items():
        print(f"{key:16s} {np.round(value, 5) if isinstance(value, list) else value}")
    print("RESULT " + json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
