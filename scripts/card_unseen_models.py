"""The card usage and ``pp.sample`` on models outside the benchmark suite, against NUTS.

Two models the suite does not have, each on its own simulated data (fixed data seeds, fresh
privacy noise every run):

- ``gamma``: Gamma regression with a log link, ``y ~ Gamma(alpha, alpha / exp(b0 + b1 x))``,
  ``x ~ N(0, 1)``, priors ``b ~ N(0, 1)``, ``alpha ~ HalfNormal(5)``;
- ``probit``: probit regression, covariates ``N(0, 1)`` and ``N(0, 3^2)``, ``b ~ N(0, 1)``.

- ``negbin``: ``scripts/taylor_forecast_check.py``'s negative binomial regression (6
  covariates and an unknown dispersion; its data set 0).

For each: NUTS (1000 draws, 2 chains), ``pp.sample(epsilon=, delta=1e-5)`` at its defaults
(``pp_sample``), the card usage ``pm.sample(step=pp.PenaltyMetropolis(epsilon=, delta=1e-5))``
at ``pm.sample``'s defaults (``card``), and, for comparison, ``pp_sample`` with the Taylor
one-shot as one expansion (``pp_sample_one_stage``: ``TAYLOR_FIRST_STAGE = 1``, the release
before the staged one-shot) or in two stages (``pp_sample_two_stage``:
``TAYLOR_LATER_STAGES = 1``, the default before 2026-11-28; three since; in
``benchmarks/results/card_unseen_three_eps1.txt``, written before the change, ``pp_sample``
is two stages and ``pp_sample_three`` three), or with the independent moves used up to a
median noise sd of 3 (``pp_sample_share3``: ``sampling.taylor._SHARE_MAX_NOISE_SD = 3``;
default 2), or a first-order Taylor model (``pp_sample_first_order``:
``warmstart.taylor.MAX_SECOND_ORDER_DIM = 1``; default 12), one core. With ``--seeded-noise`` the
``pp_sample`` ways draw their privacy noise from the run's index (not private; paired
comparisons). Printed per run:
the report's verdict and method, the RMS over parameters of the mean's error in NUTS sd, and
the sd ratios. Last line ``RESULT {json}``.

Run ``python scripts/card_unseen_models.py [--n 5000] [--eps 2] [--runs 2] [--models ...]
[--ways ...] [--seeded-noise]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from unittest import mock

import numpy as np
import pymc as pm

import pymc_penalty as pp
from pymc_penalty import budgeted
from pymc_penalty.sampling import taylor as st
from pymc_penalty.warmstart import taylor as wt

MODELS = ("gamma", "probit", "negbin")
WAYS = (
    "pp_sample",
    "card",
    "pp_sample_one_stage",
    "pp_sample_two_stage",
    "pp_sample_share3",
    "pp_sample_first_order",
)
#: The ``pp_sample`` variants: the module constant each one patches, and its value.
PATCHES = {
    "pp_sample_one_stage": (budgeted, "TAYLOR_FIRST_STAGE", 1.0),
    "pp_sample_two_stage": (wt, "TAYLOR_LATER_STAGES", 1),
    "pp_sample_share3": (st, "_SHARE_MAX_NOISE_SD", 3.0),
    "pp_sample_first_order": (wt, "MAX_SECOND_ORDER_DIM", 1),
}


def build(name: str, n: int) -> pm.Model:
    if name == "negbin":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from taylor_forecast_check import build as build_check

        return build_check("negbin", n, 0)
    rng = np.random.default_rng({"gamma": 11, "probit": 12}[name])
    with pm.Model() as model:
        if name == "gamma":
            x = rng.normal(size=n)
            mean = np.exp(0.5 + 0.3 * x)
            y = rng.gamma(4.0, mean / 4.0)
            b = pm.Normal("b", 0.0, 1.0, shape=2)
            alpha = pm.HalfNormal("alpha", 5.0)
            pm.Gamma("y", alpha=alpha, beta=alpha / pm.math.exp(b[0] + b[1] * x), observed=y)
        else:
            X = rng.normal(size=(n, 2)) * np.array([1.0, 3.0])
            p = 0.5 * (1.0 + np.vectorize(__import__("math").erf)((X @ [0.4, -0.1]) / np.sqrt(2)))
            y = rng.binomial(1, p)
            b = pm.Normal("b", 0.0, 1.0, shape=2)
            pm.Bernoulli("y", p=pm.math.invprobit(pm.math.dot(X, b)), observed=y)
    return model


def flat(post) -> dict[str, np.ndarray]:
    return {v: post[v].values.reshape(-1, *post[v].shape[2:]) for v in post.data_vars}


def compare(post, ref) -> tuple[float, list[float]]:
    errs, ratios = [], []
    for name, draws in flat(ref).items():
        d = flat(post)[name]
        m, s = draws.mean(0), draws.std(0)
        errs.extend(np.atleast_1d((d.mean(0) - m) / s))
        ratios.extend(np.atleast_1d(d.std(0) / s))
    return float(np.sqrt(np.mean(np.square(errs)))), [round(float(r), 2) for r in ratios]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--eps", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--models", nargs="+", default=["gamma", "probit"], choices=MODELS)
    parser.add_argument("--ways", nargs="+", default=["pp_sample", "card"], choices=WAYS)
    parser.add_argument("--seeded-noise", action="store_true", help="pp_sample ways: seeded")
    args = parser.parse_args(argv)
    result = {}
    for name in args.models:
        model = build(name, args.n)
        with model, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = pm.sample(1000, chains=2, cores=1, progressbar=False, random_seed=1).posterior
        for way in args.ways:
            for run in range(args.runs):
                with model, warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    kw: dict = {"epsilon": args.eps, "delta": 1e-5, "cores": 1}
                    if args.seeded_noise:
                        kw.update(
                            random_seed=run,
                            step_kwargs={"privacy": pp.PrivacyPolicy(reproducible_noise=True)},
                        )
                    if way in PATCHES:
                        with mock.patch.object(*PATCHES[way]):
                            idata = pp.sample(progressbar=False, **kw)
                    elif way == "pp_sample":
                        idata = pp.sample(progressbar=False, **kw)
                    else:
                        step = pp.PenaltyMetropolis(epsilon=args.eps, delta=1e-5)
                        raw = pm.sample(step=step, cores=1, progressbar=False)
                        idata = pp.finalize(raw, step)
                rms, ratios = compare(idata.posterior, ref)
                a = idata.attrs
                print(
                    f"{name:7s} {way:19s} run {run}: {a['dp_method']:7s} {a['dp_convergence']:14s}"
                    f" R-hat {a['dp_r_hat_max']:.3f} RMS error {rms:.2f} sd, sd ratios {ratios}",
                    flush=True,
                )
                result.setdefault(f"{name}/{way}", []).append(
                    {"verdict": a["dp_convergence"], "rms": round(rms, 3), "sd_ratio": ratios}
                )
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
