"""Per-step time of ExpFamPenaltyMetropolis against n, and its speed-up over PenaltyMetropolis.

Model: ``lam ~ Gamma(2, 1)``, ``y ~ Poisson(lam)`` with synthetic counts (fixed seed) for
n = 1e3 ... 1e7 (1e6 at most with ``--quick``). Both steps are driven by ``step.step(point)``
alone (no trace recording); compile and set-up time are excluded, and each figure is the
fastest of several chunks. The general path (``PenaltyMetropolis(noise_sd=1, clip=None)``,
one compiled per-datapoint likelihood per step) is timed up to n = 1e6 only; beyond that its
speed-up is reported as null (not extrapolated).

Run ``python benchmarks/expfam.py [--quick]``; the last line is
``RESULT {"per_step_seconds": {n: s}, "speedup_vs_general": {n: ratio or null}}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings

import numpy as np
import pymc as pm

from pymc_penalty import NotPrivateWarning, PenaltyMetropolis
from pymc_penalty.variants import ExpFamPenaltyMetropolis


def _model(n: int) -> pm.Model:
    y = np.random.default_rng([20240521, n]).poisson(3.0, size=n)
    with pm.Model() as model:
        lam = pm.Gamma("lam", 2.0, 1.0)
        pm.Poisson("y", lam, observed=y)
    return model


def _per_step(model: pm.Model, step, steps: int, chunks: int) -> float:
    point = model.initial_point()
    point, _ = step.step(point)  # warm-up (fills caches)
    best = np.inf
    for _ in range(chunks):
        t0 = time.perf_counter()
        for _ in range(steps):
            point, _ = step.step(point)
        best = min(best, (time.perf_counter() - t0) / steps)
    return float(best)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n up to 1e6, fewer steps")
    args = parser.parse_args()
    logging.getLogger("pymc").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=NotPrivateWarning)
    ns = [10**k for k in range(3, 7 if args.quick else 8)]
    steps, chunks = (200, 3) if args.quick else (500, 5)
    per_step: dict[str, float] = {}
    speedup: dict[str, float | None] = {}
    for n in ns:
        model = _model(n)
        with model:
            fast = ExpFamPenaltyMetropolis(data_bound=50, xi=1.0, scaling=0.05, rng=1)
        t_fast = _per_step(model, fast, steps, chunks)
        per_step[str(n)] = t_fast
        if n <= 10**6:
            with model:
                general = PenaltyMetropolis(noise_sd=1.0, clip=None, scaling=0.05, rng=1)
            g_steps = max(5, min(steps, int(2e7 // n)))
            t_gen = _per_step(model, general, g_steps, chunks)
            speedup[str(n)] = t_gen / t_fast
            print(
                f"n={n:>9d}  expfam {t_fast * 1e6:8.1f} us/step  general "
                f"{t_gen * 1e6:10.1f} us/step  speed-up {t_gen / t_fast:8.1f}x",
                flush=True,
            )
        else:
            speedup[str(n)] = None
            print(f"n={n:>9d}  expfam {t_fast * 1e6:8.1f} us/step  general (not run)", flush=True)
        del model
    print("RESULT " + json.dumps({"per_step_seconds": per_step, "speedup_vs_general": speedup}))


if __name__ == "__main__":
    main()
