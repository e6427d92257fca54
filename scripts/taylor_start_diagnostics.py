"""Where the Taylor path's pre-chain phases put the chains, against the exact posterior mode.

For each model and repeat (fresh privacy noise), run what ``pp.sample(method="taylor")`` runs
before its chains (the screen, the private warm start, the one-shot Taylor release and the
released model's mode search) and compare with the exact (non-private) mode and Laplace
covariance of the same model on the same data:

- ``expand_err``: the last expansion point (the warm start's point, or with ``--stages``
  the previous stage's released mode) minus the exact mode, largest over coordinates, in
  Laplace sd;
- ``start_err``: the same for the chains' start (the released model's mode);
- ``offset``: :func:`pymc_penalty.planning.taylor_forecast.start_offset` (1: the mode search
  stopped on its bound);
- ``start_sd_ratio``: the released model's sd over the Laplace sd, smallest and largest;
- ``releases``: the one-shot's releases (second order; with three stages 9 where every
  later stage reused the first's point and clips, 11 or 13 where one or two expanded again
  at the released mode so far; with two stages, before 2026-11-28, 7 or 9).

Models: ``logistic2`` (tests/test_taylor_path.py's, n = 2000), the model suite's
``hierarchical``, and ``gamma``/``negbin`` from ``scripts/taylor_forecast_check.py``.

Run ``python scripts/taylor_start_diagnostics.py [--models ...] [--n 10000] [--eps 2]
[--repeats 5]``; one JSON line per run, then ``RESULT {json}`` (per model: the share of runs
whose start is on the bound and the median/max ``start_err``).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pymc as pm
from scipy import optimize

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts"), str(ROOT / "benchmarks")]

from model_suite import build_model, make_dataset  # noqa: E402
from taylor_forecast_check import build as build_check  # noqa: E402

from pymc_penalty import budgeted  # noqa: E402
from pymc_penalty.budgeted import run_private_start, screen_before_sampling  # noqa: E402
from pymc_penalty.privacy.budget import PrivacyBudget  # noqa: E402
from pymc_penalty.privacy.ledger import PrivacyLedger  # noqa: E402
from pymc_penalty.warmstart import WARM_START_STEPS, split_point  # noqa: E402
from pymc_penalty.warmstart import taylor as wt  # noqa: E402

MODELS = ("logistic2", "hierarchical", "gamma", "negbin", "linear", "poisson")


def build(name: str, n: int) -> pm.Model:
    if name == "logistic2":
        rng = np.random.default_rng(9)
        x = rng.normal(size=2000)
        y = (rng.random(2000) < 1.0 / (1.0 + np.exp(-(0.3 + 0.8 * x)))).astype(float)
        with pm.Model() as model:
            a = pm.Normal("a", 0.0, 2.0)
            b = pm.Normal("b", 0.0, 2.0)
            pm.Bernoulli("y", logit_p=a + b * x, observed=y)
        return model
    if name in ("gamma", "negbin"):
        return build_check(name, n, 0)
    return build_model(make_dataset(name, n, 0))


def exact_laplace(model: pm.Model, template: dict, x0: np.ndarray):
    """The exact posterior mode on the raveled unconstrained space (BFGS, then Newton steps
    on the exact gradient) and the inverse negative Hessian there (central differences of
    the exact gradient). Also ``scripts/clip_geometry.py``'s."""
    logp = model.compile_logp()
    dlogp = model.compile_dlogp()

    def f(x):
        return -float(logp(split_point(x, template)))

    def g(x):
        return -np.asarray(dlogp(split_point(x, template)), dtype=np.float64)

    def hess(x):
        d, h = x.size, 1e-5
        H = np.empty((d, d))
        for j in range(d):
            e = np.zeros(d)
            e[j] = h * max(1.0, abs(x[j]))
            H[:, j] = (g(x + e) - g(x - e)) / (2 * e[j])
        return 0.5 * (H + H.T)

    res = optimize.minimize(f, x0, jac=g, method="BFGS", options={"gtol": 1e-8, "maxiter": 5000})
    x = res.x
    for _ in range(5):  # Newton polish: the mode exactly, not to BFGS's tolerance
        step = np.linalg.solve(hess(x), g(x))
        x = x - step
        if np.max(np.abs(step)) < 1e-12:
            break
    return x, np.linalg.inv(hess(x))


def one_run(model: pm.Model, eps: float) -> dict:
    ledger = PrivacyLedger(PrivacyBudget(eps, 1e-5).mu)
    screen_before_sampling(model, ledger, add_remove=False, min_rows=None, noise_rng=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warm, taylor = run_private_start(
            model,
            share=0.2,
            taylor=True,
            ledger=ledger,
            neighbours="substitute",
            min_rows=None,
            warm_start_clip=None,
            steps=WARM_START_STEPS,
            noise_rng=None,
            compile_kwargs=None,
        )
    return {"warm": warm, "taylor": taylor}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS[:4]))
    p.add_argument("--n", type=int, default=10000)
    p.add_argument("--eps", type=float, default=2.0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument(
        "--first-stage",
        type=float,
        default=None,
        help="share of the one-shot mu^2 on the first expansion (default: the package's "
        "TAYLOR_FIRST_STAGE; 1: one expansion, as before two stages)",
    )
    args = p.parse_args(argv)
    if args.first_stage is not None:
        budgeted.TAYLOR_FIRST_STAGE = float(args.first_stage)
    logging.getLogger("pymc").setLevel(logging.ERROR)
    summary = {}
    all_combined = 5 + 2 * wt.TAYLOR_LATER_STAGES  # the releases when no stage expands again
    for name in args.models:
        model = build(name, args.n)
        rows = []
        ref = None
        for _ in range(args.repeats):
            out = one_run(model, args.eps)
            warm, taylor = out["warm"], out["taylor"]
            if ref is None:
                ref = exact_laplace(model, warm.initvals, np.asarray(taylor.t, float))
            mode, cov = ref
            sd = np.sqrt(np.diag(cov))
            start_sd = np.sqrt(np.diag(taylor.covariance))
            row = {
                "model": name,
                "expand_err": float(np.max(np.abs(np.asarray(taylor.t) - mode) / sd)),
                "start_err": float(np.max(np.abs(np.asarray(taylor.point) - mode) / sd)),
                "offset": round(float(taylor.start_offset), 3),
                "start_sd_ratio": [
                    round(float(np.min(start_sd / sd)), 2),
                    round(float(np.max(start_sd / sd)), 2),
                ],
                "releases": int(taylor.releases),
                "clip_g": round(float(taylor.clip_g), 3),
                "clip_H": round(float(taylor.clip_H), 3) if math.isfinite(taylor.clip_H) else None,
                "sd_G": round(float(taylor.release.sd_G), 3),
                "sd_H": round(float(taylor.release.sd_H), 3),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
        errs = np.array([r["start_err"] for r in rows])
        summary[name] = {
            "on_bound": float(np.mean([r["offset"] >= 1 - 1e-6 for r in rows])),
            "start_err_median": round(float(np.median(errs)), 3),
            "start_err_max": round(float(np.max(errs)), 3),
            "expanded_again": float(np.mean([r["releases"] > all_combined for r in rows])),
            "expand_err_median": round(float(np.median([r["expand_err"] for r in rows])), 3),
        }
    first = budgeted.TAYLOR_FIRST_STAGE
    print(
        "RESULT "
        + json.dumps({"n": args.n, "eps": args.eps, "first_stage": first, "models": summary})
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
