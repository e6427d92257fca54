"""Per-step speed of PenaltyMetropolis against a NumPy loop and pm.Metropolis.

Model: Bayesian logistic regression with d = 10 coefficients, ``beta ~ Normal(0, 1)``,
``y ~ Bernoulli(logit_p=X @ beta)``, synthetic data from a fixed seed, n = 1e3 and 1e5.

Methods timed (compile and set-up time excluded: only the draws are timed):

1. ``numpy``: a hand-written NumPy loop doing the arithmetic of the penalty step
   (:class:`_common.NumpyPenaltyLoop`).
2. ``metropolis``: ``pm.Metropolis`` through ``pm.sample``. It updates the vector variable
   one element at a time, so one draw makes d proposals (each evaluating the log density at
   both points): reported per draw and per proposal (per draw / d).
3. ``penalty (pm.sample)``: ``PenaltyMetropolis(noise_sd=1.0, clip=None)`` through the same
   ``pm.sample`` call; one proposal per draw.
4. ``penalty (step loop)``: the same step driven by ``step.step(point)`` alone, without
   ``pm.sample``'s trace recording.

Draw times come from timestamps taken in ``pm.sample``'s callback, so compilation, initial
point and trace conversion are not counted. The methods run in interleaved rounds; each figure
is the fastest of several chunks of steps, timed by process CPU time unless ``--clock wall``
is given (a shared machine inflates wall time, not CPU time). BLAS is limited to one thread
for all methods, as ``pm.sample(cores=1)`` does by default, so CPU time equals the wall time
of an idle machine. All methods use the same random-walk scale and start at the coefficients
the data were drawn from.

Run ``python benchmarks/speed.py [--quick] [--clock {cpu,wall}] [--profile]``. The last line
printed is ``RESULT {json}`` with ``ratio_vs_numpy`` (penalty per-draw time in ``pm.sample`` / NumPy
per-step time) and ``ratio_vs_metropolis_per_proposal`` (penalty per-draw time /
(pm.Metropolis per-draw time / d)), keyed by n, plus absolute times in ms and BLAS facts.
Targets (design notes, section 6): ratio_vs_numpy <= 4 at n = 1e3 and <= 1.5 at n = 1e5;
ratio_vs_metropolis_per_proposal < 1.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import logging
import os
import platform
import pstats
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (  # noqa: E402
    LogisticData,
    NumpyPenaltyLoop,
    blas_info,
    logistic_model,
    make_logistic_data,
)

SIZES = (1_000, 100_000)
D = 10
NOISE_SD = 1.0
TARGETS = {"ratio_vs_numpy": {"1000": 4.0, "100000": 1.5}, "ratio_vs_metropolis_per_proposal": 1.0}


@dataclass(frozen=True)
class Budget:
    """How much to run for one data-set size.

    Attributes
    ----------
    numpy_steps, loop_steps, penalty_draws, metropolis_draws : int
        Steps or draws per round of each method.
    rounds : int
        Interleaved rounds (every method runs once per round).
    """

    numpy_steps: int
    loop_steps: int
    penalty_draws: int
    metropolis_draws: int
    rounds: int


BUDGETS = {
    "quick": {
        1_000: Budget(1000, 1000, 500, 50, 3),
        100_000: Budget(20, 20, 20, 6, 2),
    },
    "full": {
        1_000: Budget(10000, 10000, 5000, 500, 5),
        100_000: Budget(300, 300, 300, 20, 5),
    },
}
CHUNKS = 5
# The clock for steps and draws: process CPU time by default (BLAS runs on one thread, so on an
# idle machine it equals wall time, and it is not inflated when a shared machine is busy).
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
CLOCK = [CLOCKS["cpu"]]


def proposal_scale(data: LogisticData) -> float:
    """Random-walk standard deviation per coefficient, shared by all methods.

    Parameters
    ----------
    data : LogisticData

    Returns
    -------
    float
        ``0.5 / sqrt(n)``, of the order of the posterior standard deviation.
    """
    return 0.5 / np.sqrt(data.n)


def _quiet() -> None:
    import pymc  # noqa: F401 - importing sets the level of PyMC's logger; override it after

    warnings.filterwarnings("ignore", message="PyTensor could not link to a BLAS")
    warnings.filterwarnings("ignore", message=".*NOT differentially private.*")
    warnings.filterwarnings("ignore", category=UserWarning, module="pymc")
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    logging.getLogger("pymc").setLevel(logging.ERROR)


def load_penalty() -> tuple[Any, str]:
    """Import ``PenaltyMetropolis``.

    Returns
    -------
    (class or None, str)
        The class, or None with the reason it could not be imported.
    """
    try:
        from pymc_penalty import PenaltyMetropolis
    except Exception as exc:  # noqa: BLE001 - the benchmark reports baselines regardless
        return None, f"{type(exc).__name__}: {exc}"
    return PenaltyMetropolis, ""


def pm_sample_runner(model, step, data: LogisticData, seed: int):
    """Return ``run(draws)`` timing one ``pm.sample`` call through its callback.

    Parameters
    ----------
    model : pm.Model
    step : step method
    data : LogisticData
        Gives the starting point (``beta_true``).
    seed : int
        ``random_seed`` of the first call (incremented per call).

    Returns
    -------
    (callable, dict)
        ``run(draws)`` makes one ``pm.sample`` call and returns the mean seconds per draw of
        each of ``CHUNKS`` consecutive chunks of draws, from the times of the draws'
        callbacks (so compilation, set-up and trace conversion are excluded); the dict
        accumulates the ``accepted`` statistic of every draw under ``"accepted"``.
    """
    import pymc as pm

    state: dict[str, Any] = {"accepted": [], "calls": 0}

    def run(draws: int) -> list[float]:
        stamps: list[float] = []

        def callback(trace, draw):
            stamps.append(CLOCK[0]())
            state["accepted"].append(draw.stats[0]["accepted"])  # averaged after sampling

        with model:
            pm.sample(
                draws=draws,
                step=step,
                chains=1,
                cores=1,
                tune=0,
                progressbar=False,
                compute_convergence_checks=False,
                initvals={"beta": data.beta_true},
                random_seed=seed + state["calls"],
                return_inferencedata=False,
                callback=callback,
            )
        state["calls"] += 1
        return [float(np.mean(c)) for c in np.array_split(np.diff(stamps), CHUNKS) if c.size]

    return run, state


def per_call_runner(fn):
    """Wrap ``fn(k)`` (k calls of an operation) as ``run(k)``: seconds per call by chunk."""

    def run(k: int) -> list[float]:
        times = []
        for c in np.array_split(np.arange(k), CHUNKS):
            if c.size:
                t0 = CLOCK[0]()
                fn(c.size)
                times.append((CLOCK[0]() - t0) / c.size)
        return times

    return run


def make_penalty_step(penalty_cls, model, data: LogisticData):
    """Build ``PenaltyMetropolis(noise_sd=1.0, clip=None)`` with the shared proposal scale."""
    with model:
        return penalty_cls(noise_sd=NOISE_SD, clip=None, scaling=proposal_scale(data), tune=False)


def step_loop_runner(step, model, data: LogisticData):
    """Return ``run(k)`` making ``k`` calls of ``step.step`` from a persistent point."""
    point = model.initial_point()
    point["beta"] = np.asarray(data.beta_true, dtype=point["beta"].dtype)
    state = {"point": step.step(point)[0], "accepted": 0, "steps": 0}

    def run(k: int) -> None:
        p, acc = state["point"], 0
        for _ in range(k):
            p, stats = step.step(p)
            acc += bool(stats[0]["accepted"])
        state["point"] = p
        state["accepted"] += acc
        state["steps"] += k

    return run, state


def bench_size(n: int, budget: Budget, penalty_cls, seed: int = 0) -> dict[str, float]:
    """Run every method at one data-set size.

    The methods are timed in interleaved rounds, each round in ``CHUNKS`` chunks of steps or
    draws, and each method keeps its fastest chunk, so that a load that comes and goes on a
    shared machine affects all of them alike. BLAS runs on one thread throughout, as in
    ``pm.sample(cores=1)``.

    Parameters
    ----------
    n : int
    budget : Budget
    penalty_cls : class or None
        ``PenaltyMetropolis``; None skips the penalty rows.
    seed : int

    Returns
    -------
    dict
        Seconds per step, draw or proposal, acceptance rates and set-up times;
        ``penalty_error`` if the penalty step could not be built or run.
    """
    import pymc as pm

    data = make_logistic_data(n, D)
    scale = proposal_scale(data)
    out: dict[str, float] = {}
    runners: dict[str, tuple[Any, int]] = {}

    loop = NumpyPenaltyLoop(data, scale=scale, noise_sd=NOISE_SD, clip=None, seed=seed)
    loop.run(2)
    runners["numpy"] = (per_call_runner(loop.run), budget.numpy_steps)

    model = logistic_model(data)
    t0 = time.perf_counter()
    with model:
        met = pm.Metropolis(S=np.ones(D), scaling=scale, tune=False)
    out["metropolis_setup_s"] = time.perf_counter() - t0
    met_run, met_state = pm_sample_runner(model, met, data, seed)
    runners["metropolis_per_draw"] = (met_run, budget.metropolis_draws)

    if penalty_cls is not None:
        try:
            t0 = time.perf_counter()
            step = make_penalty_step(penalty_cls, model, data)
            out["penalty_setup_s"] = time.perf_counter() - t0
            pen_run, pen_state = pm_sample_runner(model, step, data, seed)
            pen_run(2)  # fails here, not in the timed rounds, if sampling is broken
            loop_fn, loop_state = step_loop_runner(step, model, data)
        except Exception as exc:  # noqa: BLE001 - report the baselines regardless
            out["penalty_error"] = f"{type(exc).__name__}: {exc}"
            penalty_cls = None
        else:
            pen_state["accepted"].clear()
            runners["penalty_sample"] = (pen_run, budget.penalty_draws)
            runners["penalty_step_loop"] = (per_call_runner(loop_fn), budget.loop_steps)

    # pm.sample(cores=1) limits BLAS to one thread (blas_cores="auto"): do the same for all.
    best = {name: np.inf for name in runners}
    with threadpool_limits(limits=1):
        for _ in range(budget.rounds):
            for name, (run, k) in runners.items():
                best[name] = min(best[name], *run(k))
    out.update(best)

    out["numpy_accept"] = loop.acceptance_rate
    out["metropolis_per_proposal"] = out["metropolis_per_draw"] / D
    out["metropolis_accept"] = float(np.mean(np.asarray(met_state["accepted"], dtype=float)))
    if penalty_cls is not None:
        out["penalty_sample_accept"] = float(np.mean(np.asarray(pen_state["accepted"], float)))
        out["penalty_step_loop_accept"] = loop_state["accepted"] / max(loop_state["steps"], 1)
    return out


def profile_step(penalty_cls, n: int = 1_000, steps: int = 3000, top: int = 25) -> str:
    """cProfile of ``step.step`` at size ``n``, sorted by internal time.

    Parameters
    ----------
    penalty_cls : class
    n : int
    steps : int
    top : int
        Number of rows printed.

    Returns
    -------
    str
        The pstats report.
    """
    data = make_logistic_data(n, D)
    model = logistic_model(data)
    step = make_penalty_step(penalty_cls, model, data)
    run, _ = step_loop_runner(step, model, data)
    run(100)
    prof = cProfile.Profile()
    with threadpool_limits(limits=1):
        prof.enable()
        run(steps)
        prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def _ms(x: float | None) -> str:
    return "      -" if x is None or not np.isfinite(x) else f"{1e3 * x:9.4f}"


def print_table(results: dict[int, dict[str, float]]) -> None:
    """Print the per-size timings as a table (milliseconds)."""
    head = f"{'n':>7}  {'method':34} {'ms/step':>9} {'ms/proposal':>11} {'accept':>7}"
    print(head)
    print("-" * len(head))
    rows = [
        ("numpy loop (same arithmetic)", "numpy", "numpy", "numpy_accept"),
        ("pm.Metropolis, pm.sample (per draw)", "metropolis_per_draw", "metropolis_per_proposal",
         "metropolis_accept"),
        ("PenaltyMetropolis, pm.sample", "penalty_sample", "penalty_sample",
         "penalty_sample_accept"),
        ("PenaltyMetropolis, step.step loop", "penalty_step_loop", "penalty_step_loop",
         "penalty_step_loop_accept"),
    ]  # fmt: skip
    for n, res in results.items():
        for label, k_step, k_prop, k_acc in rows:
            if k_step not in res:
                continue
            acc = res.get(k_acc, np.nan)
            print(f"{n:>7}  {label:34} {_ms(res[k_step])} {_ms(res[k_prop]):>11} {acc:7.3f}")
        setup = [f"pm.Metropolis set-up {res['metropolis_setup_s']:.2f} s"]
        if "penalty_setup_s" in res:
            setup.append(f"PenaltyMetropolis set-up (compile) {res['penalty_setup_s']:.2f} s")
        print(f"{'':9}({'; '.join(setup)})")
    print()


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not np.isfinite(a) or not np.isfinite(b) or b <= 0:
        return None
    return round(float(a / b), 4)


def summarise(results: dict[int, dict[str, float]], mode: str, penalty_error: str) -> dict:
    """Build the RESULT dictionary (ratios keyed by n as strings; times in ms)."""

    def per_n(key: str) -> dict[str, float | None]:
        return {
            str(n): (round(1e3 * r[key], 5) if key in r and np.isfinite(r[key]) else None)
            for n, r in results.items()
        }

    summary: dict[str, Any] = {
        "ratio_vs_numpy": {
            str(n): _ratio(r.get("penalty_sample"), r["numpy"]) for n, r in results.items()
        },
        "ratio_vs_metropolis_per_proposal": {
            str(n): _ratio(r.get("penalty_sample"), r["metropolis_per_proposal"])
            for n, r in results.items()
        },
        "ratio_vs_numpy_step_loop": {
            str(n): _ratio(r.get("penalty_step_loop"), r["numpy"]) for n, r in results.items()
        },
        "ms_numpy": per_n("numpy"),
        "ms_penalty_sample": per_n("penalty_sample"),
        "ms_penalty_step_loop": per_n("penalty_step_loop"),
        "ms_metropolis_per_draw": per_n("metropolis_per_draw"),
        "ms_metropolis_per_proposal": per_n("metropolis_per_proposal"),
        "penalty_setup_s": {
            str(n): round(r["penalty_setup_s"], 3) if "penalty_setup_s" in r else None
            for n, r in results.items()
        },
        "d": D,
        "mode": mode,
        "targets": TARGETS,
        "penalty_available": not penalty_error,
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
    }
    errors = [f"n={n}: {r['penalty_error']}" for n, r in results.items() if "penalty_error" in r]
    if penalty_error or errors:
        summary["penalty_error"] = "; ".join([penalty_error] * bool(penalty_error) + errors)
        summary["penalty_available"] = False
    summary.update(blas_info())
    return summary


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer draws (under ~1 minute)")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="cpu",
        help="time steps by process CPU time (default; robust on a shared machine) or wall time",
    )
    parser.add_argument(
        "--profile", action="store_true", help="also print a cProfile of step.step at n=1e3"
    )
    args = parser.parse_args(argv)
    CLOCK[0] = CLOCKS[args.clock]
    _quiet()
    mode = "quick" if args.quick else "full"
    t_start = time.perf_counter()

    penalty_cls, penalty_error = load_penalty()
    info = blas_info()
    print(f"pymc-penalty speed benchmark ({mode}); logistic regression, d = {D}")
    print(
        f"PyTensor blas__ldflags = {info['blas_ldflags']!r}; NumPy BLAS = {info['numpy_blas']}; "
        f"BLAS threads: 1 (threadpoolctl); CPUs: {os.cpu_count()}; clock: {args.clock} time"
    )
    if penalty_error:
        print(f"PenaltyMetropolis unavailable ({penalty_error}): baselines only.")
    print()

    results: dict[int, dict[str, float]] = {}
    for n in SIZES:
        results[n] = bench_size(n, BUDGETS[mode][n], penalty_cls)
        if "penalty_error" in results[n]:
            print(f"PenaltyMetropolis failed at n={n}: {results[n]['penalty_error']}")
    print_table(results)

    if args.profile and penalty_cls is not None:
        print("cProfile of step.step at n = 1000 (sorted by internal time):")
        print(profile_step(penalty_cls, steps=1000 if args.quick else 5000))

    summary = summarise(results, mode, penalty_error)
    summary["clock"] = args.clock
    summary["wall_s"] = round(time.perf_counter() - t_start, 1)
    print(f"total wall time {summary['wall_s']:.1f} s")
    print("RESULT " + json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
