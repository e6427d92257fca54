"""Per-step time of ExpFamPenaltyMetropolis against n, and its speed-up over PenaltyMetropolis.

Model: ``lam ~ Gamma(2, 1)``, ``y ~ Poisson(lam)`` with synthetic counts (fixed seed) for
n = 1e3 ... 1e7 (1e6 at most with ``--quick``). Both steps are driven by ``step.step(point)``
alone (no trace recording); compile and set-up time are excluded, and each figure is the
fastest of several chunks. The general path (``PenaltyMetropolis(noise_sd=1, clip=None)``,
one compiled per-datapoint likelihood per step) is timed at every n (with fewer steps at
large n).

Run ``python benchmarks/expfam.py [--quick]``; the last line is
``RESULT {"per_step_seconds": {n: s}, "speedup_vs_general": {n: ratio}}``. A full run
also writes ``docs/benchmarks/expfam.md`` (table, command, date, machine) and ``expfam.png``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
import warnings

import numpy as np
import pymc as pm

from pymc_penalty import NotPrivateWarning, PenaltyMetropolis
from pymc_penalty.variants import ExpFamPenaltyMetropolis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import REPO_ROOT, best_seconds_per_step, command_line, machine_info  # noqa: E402

DOCS_MD = os.path.join(REPO_ROOT, "docs", "benchmarks", "expfam.md")
DOCS_PNG = os.path.join(REPO_ROOT, "docs", "benchmarks", "expfam.png")


def _model(n: int) -> pm.Model:
    y = np.random.default_rng([20240521, n]).poisson(3.0, size=n)
    with pm.Model() as model:
        lam = pm.Gamma("lam", 2.0, 1.0)
        pm.Poisson("y", lam, observed=y)
    return model


def _per_step(model: pm.Model, step, steps: int, chunks: int) -> float:
    return best_seconds_per_step(step, model.initial_point(), steps, chunks)


def write_docs(per_step: dict, speedup: dict, command: str) -> None:
    """Write the markdown table and the log-log plot of a full run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    info = machine_info()
    rows = [
        f"| {int(n):.0e} | {per_step[n] * 1e6:.1f} | "
        + (
            f"{per_step[n] * speedup[n] * 1e6:.1f} | {speedup[n]:.1f}x |"
            if speedup[n]
            else "not run | |"
        )
        for n in per_step
    ]
    flat = max(per_step.values()) / min(per_step.values())
    text = "\n".join(
        [
            "# Exponential-family benchmark",
            "",
            f"Produced by `{command}` on {datetime.date.today().isoformat()}; "
            f"{info['cpu']}, {info['cpu_count']} CPUs, Python {info['python']}, "
            f"pymc {info['versions']['pymc']}, pytensor {info['versions']['pytensor']}.",
            "",
            "Poisson likelihood with a Gamma prior; each figure is the fastest of several chunks "
            "of `step.step(point)` calls (wall time, no trace recording). The general path is "
            "`PenaltyMetropolis(noise_sd=1, clip=None)`, one compiled per-datapoint likelihood "
            "per step.",
            "",
            "| n | ExpFamPenaltyMetropolis (us/step) | PenaltyMetropolis (us/step) | speed-up |",
            "|---:|---:|---:|---:|",
            *rows,
            "",
            f"Largest over smallest per-step time across n: {flat:.2f}x (flat in n: the "
            "statistic is summed once, and each step releases a fresh noisy copy of it).",
            "",
            "![per-step time against n](expfam.png)",
            "",
        ]
    )
    with open(DOCS_MD, "w") as fh:
        fh.write(text)
    ns = [int(n) for n in per_step]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.loglog(ns, [v * 1e6 for v in per_step.values()], "o-", label="ExpFamPenaltyMetropolis")
    gen = [per_step[n] * speedup[n] * 1e6 for n in per_step]
    ax.loglog(ns, gen, "s--", label="PenaltyMetropolis (general)")
    ax.set_xlabel("n (datapoints)")
    ax.set_ylabel("time per step (us)")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(DOCS_PNG, dpi=100)
    plt.close(fig)
    print(f"wrote {os.path.relpath(DOCS_MD, REPO_ROOT)} and {os.path.relpath(DOCS_PNG, REPO_ROOT)}")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n up to 1e6, fewer steps")
    args = parser.parse_args(argv)
    logging.getLogger("pymc").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=NotPrivateWarning)
    ns = [10**k for k in range(3, 7 if args.quick else 8)]
    steps, chunks = (200, 3) if args.quick else (500, 5)
    per_step: dict[str, float] = {}
    speedup: dict[str, float] = {}
    for n in ns:
        model = _model(n)
        with model:
            fast = ExpFamPenaltyMetropolis(data_bound=50, xi=1.0, scaling=0.05, rng=1)
        t_fast = _per_step(model, fast, steps, chunks)
        per_step[str(n)] = t_fast
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
        del general
        del model
    if not args.quick:  # the committed page holds full-mode figures only
        write_docs(per_step, speedup, command_line(__file__, argv))
    print("RESULT " + json.dumps({"per_step_seconds": per_step, "speedup_vs_general": speedup}))


if __name__ == "__main__":
    main()
