"""Per-step cost of the Taylor path's residual release against the plain release (issue 27).

For each model and data set (``benchmarks/model_suite.py``'s generators): the package's private
warm start and one-shot release (``prepare_warm_start``, ``private_warm_start``,
``warmstart.taylor.taylor_oneshot``; epsilon 2, delta 1e-5, the shares ``pp.sample`` uses), then
``--moves`` public random-walk moves of the chains' own kind around the released start
(``x ~ N(point, cov)``, ``x' = x + 2.38 / sqrt(d) chol(cov) z``). Per move, measured and not
released:

- plain: the 99.9% quantile over rows of ``|l_i(x') - l_i(x)|`` per unit of whitened distance
  ``|chol(cov)^-1 (x' - x)|`` (the plain release's bound per unit length, at that quantile);
- residual: the 99.9% quantile of ``|rho_i|`` (the row's log-likelihood difference less its
  clipped Taylor model's) per unit of ``|u' - u|``, ``u`` the likelihood's coordinates whitened
  as the step does (``TaylorModel.whiten``).

The cost ratio is ``(plain / residual)^2``: how much less ``mu^2`` a step of the same length
and noise costs on the residual path (issue 27's target: at least 100 on logistic and
Poisson at n = 1e4). Printed per model: the median over moves and data sets, and the range.

Run ``python benchmarks/taylor_cost.py [--models logistic poisson] [--datasets 3] [--quick]``;
the last line is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import model_suite as ms  # noqa: E402

from pymc_penalty.accounting.gdp import gdp_mu  # noqa: E402
from pymc_penalty.model.screen import SCREEN_SHARE  # noqa: E402
from pymc_penalty.planning.plan import AUTO_WARM_START_SHARE  # noqa: E402
from pymc_penalty.privacy.ledger import PrivacyLedger  # noqa: E402
from pymc_penalty.warmstart import prepare_warm_start, private_warm_start  # noqa: E402
from pymc_penalty.warmstart.taylor import TAYLOR_SHARE, taylor_oneshot  # noqa: E402

EPSILON, DELTA, QUANTILE = 2.0, 1e-5, 0.999


def measure(model_name: str, n: int, index: int, moves: int, seed: int) -> list[float]:
    """Cost ratios of ``moves`` public moves on one data set."""
    model = ms.build_model(ms.make_dataset(model_name, n, index))
    mu = gdp_mu(EPSILON, DELTA)
    noise = np.random.default_rng([seed, index])
    ledger = PrivacyLedger(mu)
    target = prepare_warm_start(model)
    rest = mu**2 * (1.0 - SCREEN_SHARE)
    warm = private_warm_start(
        model, mu=math.sqrt(rest * AUTO_WARM_START_SHARE), ledger=ledger, noise_rng=noise,
        target=target,
    )  # fmt: skip
    rest *= 1.0 - AUTO_WARM_START_SHARE
    taylor = taylor_oneshot(
        target, warm, mu=math.sqrt(rest * TAYLOR_SHARE), ledger=ledger, noise_rng=noise
    )
    lik, rows = target.likelihood, target.n
    models = taylor.control.values
    chol = np.linalg.cholesky(taylor.covariance)
    d = chol.shape[0]
    public = np.random.default_rng([7, index])  # the moves: public points
    ratios = []
    for _ in range(moves):
        x0 = taylor.point + chol @ public.standard_normal(d)
        x1 = x0 + (2.38 / math.sqrt(d)) * (chol @ public.standard_normal(d))
        l0, _ = lik.initial(x0, rows)
        l1, _ = lik.initial(x1, rows)
        with np.errstate(invalid="ignore", over="ignore"):
            dll = np.asarray(l1, float) - np.asarray(l0, float)
            u0, u1 = taylor.whiten(x0), taylor.whiten(x1)
            rho = dll - (models(u1) - models(u0))
        ok = np.isfinite(dll) & np.isfinite(rho)
        plain = np.quantile(np.abs(dll[ok]), QUANTILE) / np.linalg.norm(
            np.linalg.solve(chol, x1 - x0)
        )
        resid = np.quantile(np.abs(rho[ok]), QUANTILE) / np.linalg.norm(u1 - u0)
        ratios.append(float((plain / max(resid, 1e-300)) ** 2))
    return ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["logistic", "poisson"], choices=ms.MODELS)
    parser.add_argument("--n", type=float, default=1e4)
    parser.add_argument("--datasets", type=int, default=3)
    parser.add_argument("--moves", type=int, default=20)
    parser.add_argument("--seed", type=int, default=27)
    parser.add_argument("--quick", action="store_true", help="1 data set, 4 moves, n = 2000")
    args = parser.parse_args(argv)
    if args.quick:
        args.datasets, args.moves, args.n = 1, 4, 2000.0
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in args.models:
            ratios = []
            for index in range(args.datasets):
                ratios += measure(name, int(args.n), index, args.moves, args.seed)
            out[name] = {
                "median": float(np.median(ratios)),
                "min": float(np.min(ratios)),
                "max": float(np.max(ratios)),
                "moves": len(ratios),
            }
            print(
                f"{name:10s} n = {int(args.n)}: cost ratio (plain / residual mu^2 per unit "
                f"squared distance) median {out[name]['median']:.3g}, range "
                f"{out[name]['min']:.3g}-{out[name]['max']:.3g} over {len(ratios)} moves",
                flush=True,
            )
    print("RESULT " + json.dumps({"n": int(args.n), "epsilon": EPSILON, "models": out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
