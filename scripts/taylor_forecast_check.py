"""The Taylor path's ESS forecast against the realised ESS on models outside the model suite.

``benchmarks/model_suite.py`` reports the forecast (``dp_forecast_ess``) beside the realised
smallest bulk ESS (``dp_ess_bulk_min``) for its five models; this script does the same for
models the forecast was not checked on while it was written (its constants come from
``scripts/taylor_ess_sim.py``'s Gaussian model problem only):

- ``gamma``: a gamma regression with a log link, ``y ~ Gamma(alpha, alpha / exp(b0 + b1 x))``,
  ``alpha ~ HalfNormal(5)`` unknown (3 parameters);
- ``probit``: ``y ~ Bernoulli(Phi(X b))``, 4 standard normal covariates with an intercept
  (5 parameters);
- ``negbin``: a negative binomial regression with 6 covariates and an unknown dispersion
  (8 parameters).

Run ``python scripts/taylor_forecast_check.py --n 10000 --eps 2 --datasets 2``; one JSON line
per run (forecast, realised ESS, their ratio, R-hat, the residual noise sd and the start's
offset), then ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings

import numpy as np
import pymc as pm

import pymc_penalty as pp

MODELS = ("gamma", "probit", "negbin")


def build(model: str, n: int, index: int) -> pm.Model:
    """The model on simulated data (seed ``[2027, model, n, index]``)."""
    rng = np.random.default_rng([2027, MODELS.index(model), n, index])
    with pm.Model() as m:
        if model == "gamma":
            x = rng.standard_normal(n)
            b_true, alpha_true = rng.normal(0.0, 0.5, 2), 1.0 + 4.0 * rng.random()
            mean = np.exp(b_true[0] + b_true[1] * x)
            y = rng.gamma(alpha_true, mean / alpha_true)
            b = pm.Normal("b", 0.0, 1.0, shape=2)
            alpha = pm.HalfNormal("alpha", 5.0)
            pm.Gamma("y", alpha=alpha, beta=alpha / pm.math.exp(b[0] + b[1] * x), observed=y)
        elif model == "probit":
            X = np.column_stack([np.ones(n), rng.standard_normal((n, 4))])
            b_true = rng.normal(0.0, 0.5, 5)
            y = (rng.standard_normal(n) < X @ b_true).astype(np.int64)
            b = pm.Normal("b", 0.0, 1.0, shape=5)
            pm.Bernoulli("y", p=pm.math.invprobit(X @ b), observed=y)
        elif model == "negbin":
            X = np.column_stack([np.ones(n), rng.standard_normal((n, 6))])
            b_true = rng.normal(0.0, 0.3, 7)
            y = rng.negative_binomial(3.0, 3.0 / (3.0 + np.exp(X @ b_true)))
            b = pm.Normal("b", 0.0, 1.0, shape=7)
            phi = pm.HalfNormal("phi", 5.0)
            pm.NegativeBinomial("y", mu=pm.math.exp(X @ b), alpha=phi, observed=y)
        else:
            raise ValueError(model)
    return m


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--n", type=int, default=10000)
    p.add_argument("--eps", type=float, nargs="+", default=[2.0])
    p.add_argument("--datasets", type=int, default=2)
    args = p.parse_args(argv)
    logging.getLogger("pymc").setLevel(logging.ERROR)
    rows = []
    for index in range(args.datasets):
        for model in args.models:
            for eps in args.eps:
                m = build(model, args.n, index)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    idata = pp.sample(
                        epsilon=eps, delta=1e-5, model=m, method="taylor", cores=1,
                        random_seed=index + 1, progressbar=False,
                    )  # fmt: skip
                a = idata.attrs
                row = {
                    "model": model,
                    "n": args.n,
                    "epsilon": eps,
                    "dataset": index,
                    "ess": float(a["dp_ess_bulk_min"]),
                    "forecast_ess": float(a["dp_forecast_ess"]),
                    "ratio": float(a["dp_forecast_ess"] / a["dp_ess_bulk_min"]),
                    "r_hat_max": float(a["dp_r_hat_max"]),
                    "noise_sd": float(a["dp_taylor_noise_sd"]),
                    "start_offset": float(a["dp_taylor_start_offset"]),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    ratios = np.array([r["ratio"] for r in rows])
    print(
        "RESULT " + json.dumps({"rows": rows, "ratio_min": ratios.min(), "ratio_max": ratios.max()})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
