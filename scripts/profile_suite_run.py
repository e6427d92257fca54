"""Where the time of one ``pp.sample(method="taylor")`` run goes (issue 27's 2-minute target).

Runs the model suite's ``taylor`` method once on one data set of ``benchmarks/model_suite.py``
under :mod:`cProfile` and prints the wall time with the cumulative seconds of its stages:
the chains (PyMC's sampling loop), the residual releases inside them, the private start
(screen, warm start and one-shot), and PyTensor's compilation. Run it on an otherwise idle
machine: ``python scripts/profile_suite_run.py --model logistic --n 1e5 --eps 1``.
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import pstats
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import model_suite as ms  # noqa: E402

#: Stage label -> (file suffix, function name) in the profile.
STAGES = {
    "chains (pm.sample's loop)": ("pymc/sampling/mcmc.py", "_sample_many"),
    "residual releases": ("pymc_penalty/sampling/taylor.py", "_release_sum"),
    "private start": ("pymc_penalty/budgeted.py", "run_private_start"),
    "compiling": ("pytensor/compile/function/__init__.py", "function"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="logistic", choices=ms.MODELS)
    parser.add_argument("--n", type=float, default=1e5)
    parser.add_argument("--eps", type=float, default=1.0)
    parser.add_argument("--dataset", type=int, default=0)
    parser.add_argument("--top", type=int, default=0, help="also the N slowest package calls")
    args = parser.parse_args(argv)
    logging.getLogger("pymc").setLevel(logging.ERROR)
    logging.getLogger("pymc_penalty").setLevel(logging.ERROR)
    ds = ms.make_dataset(args.model, int(args.n), args.dataset)
    profile = cProfile.Profile()
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        profile.enable()
        _, info = ms.run_taylor(ds, args.eps, 1000 * args.dataset + 1, False)
        profile.disable()
    wall = time.perf_counter() - t0
    stats = pstats.Stats(profile).stats  # (file, line, name) -> (cc, nc, tt, ct, callers)
    print(
        f"{args.model} n = {args.n:g} epsilon {args.eps:g} data set {args.dataset}: "
        f"{wall:.1f} s, {info.get('verdict')}"
    )
    for label, (suffix, name) in STAGES.items():
        seconds = sum(
            v[3] for (path, _, fn), v in stats.items() if fn == name and path.endswith(suffix)
        )
        print(f"  {label}: {seconds:.1f} s")
    if args.top:  # the package's own functions by cumulative time
        pstats.Stats(profile).sort_stats("cumulative").print_stats("pymc_penalty", args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
