"""Per-step speed of PenaltyMetropolis against a NumPy loop and pm.Metropolis, per PyTensor mode.

Model: Bayesian logistic regression with d = 10 coefficients, ``beta ~ Normal(0, 1)``,
``y ~ Bernoulli(logit_p=X @ beta)``, synthetic data from a fixed seed, n = 1e3, 1e4, 1e5 and
1e6 (``--quick``: 1e3 and 1e4).

Methods timed, all in the same run (set-up, compilation and JIT warm-up excluded: only steady
state steps are timed; compile times are reported separately):

1. ``numpy``: a hand-written NumPy loop doing the arithmetic of the penalty step
   (:class:`_common.NumpyPenaltyLoop`).
2. ``metropolis``: ``pm.Metropolis`` (PyTensor's default mode) through ``pm.sample``. It
   updates the vector variable one element at a time, so one draw makes d proposals (each
   evaluating the log density at both points): reported per draw and per proposal (per draw
   / d). At n = 1e6 a draw takes about a second, so only a few draws are timed there (the
   count is printed).
3. For each PyTensor mode (``C``: PyTensor's default mode, which compiles to C; ``NUMBA``;
   ``JAX``, passed as ``compile_kwargs={"mode": ...}`` to the step; ``--quick``: C and NUMBA):
   ``PenaltyMetropolis(noise_sd=1.0, clip=None)`` through the same ``pm.sample`` call (one
   proposal per draw; the headline figure), driven by ``step.step(point)`` alone, and its
   compiled likelihood call alone. JAX is optional: without it the JAX column is skipped with
   the reason.

Draw times come from timestamps taken in ``pm.sample``'s callback, so compilation, initial
point and trace conversion are not counted. The methods run in interleaved rounds; each figure
is the fastest of several chunks of steps, timed by process CPU time unless ``--clock wall``
is given (a shared machine inflates wall time, not CPU time). BLAS is limited to one thread
for all methods, as ``pm.sample(cores=1)`` does by default. All methods use the same
random-walk scale and start at the coefficients the data were drawn from.

At n = 1e3 (C mode) the benchmark also splits one step of a private configuration
(``mu=0.1, clip=1.0`` and a :class:`pymc_penalty.PrivacyLedger`) into parts timed on their
own: the compiled likelihood call, the proposal, the accounting (``ledger.try_spend``, the
noise draws and the accept decision), PyMC's step wrapper and ``pm.sample``'s trace
recording, and checks that they add up to the measured time per draw.

Run ``python benchmarks/speed.py [--quick] [--clock {cpu,wall}] [--profile]``. Full mode
rewrites ``docs/benchmarks/speed.md`` and ``docs/benchmarks/speed.png`` (``--no-write-docs``
to skip); quick mode writes nothing. The JAX backend (``pp.sample(backend="jax")``'s device
chain, :mod:`_jax_backend`) is timed beside the BlackJAX chain whenever the ``bench`` extra is
installed. The last line printed is ``RESULT {json}`` with ``ms_per_step`` (``default``: C
mode through ``pm.sample``; ``jax``: the backend; ``pytensor_jax``: the step in PyTensor's JAX
mode), ``ms_blackjax``, ``ratio_jax_vs_blackjax``,
``ratio_vs_numpy`` (C mode: penalty per-draw time in ``pm.sample`` / NumPy per-step time) and
``ratio_vs_metropolis_per_proposal`` (penalty per-draw time / (pm.Metropolis per-draw time /
d)), keyed by n, ``modes`` (the same per PyTensor mode, or ``{"skipped": reason}``),
``breakdown_1000`` and ``targets_met``. Targets (design notes, section 6): ratio_vs_numpy <= 4
at n = 1e3, <= 1.5 at n = 1e5 and <= 2 at n = 1e6; ratio_vs_metropolis_per_proposal < 1.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import logging
import math
import os
import pstats
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _blackjax import BlackjaxChain  # noqa: E402
from _blackjax import skip_reason as blackjax_skip_reason  # noqa: E402
from _common import (  # noqa: E402
    CHUNKS,
    CLOCK,
    CLOCKS,
    REPO_ROOT,
    LogisticData,
    NumpyPenaltyLoop,
    PartTimer,
    command_line,
    logistic_model,
    machine_info,
    make_logistic_data,
    per_call_runner,
    pm_sample_runner,
    repeat,
    step_loop_runner,
)
from _jax_backend import PenaltyDeviceChain  # noqa: E402
from _speed_report import (  # noqa: E402
    ms,
    ratio,
    report_text,
    summarise_breakdown,
    summarise_mode,
    targets_met,
    write_docs,
)

SIZES = {"quick": (1_000, 10_000), "full": (1_000, 10_000, 100_000, 1_000_000)}
MODES = {"quick": ("C", "NUMBA"), "full": ("C", "NUMBA", "JAX")}
# The step's compile_kwargs["mode"] for each column; None is PyTensor's default mode (C).
PYTENSOR_MODE: dict[str, str | None] = {"C": None, "NUMBA": "NUMBA", "JAX": "JAX"}
D = 10
NOISE_SD = 1.0
# Private configuration of the n = 1e3 breakdown: per-step GDP mu and distance clip constant.
BREAKDOWN_N = 1_000
BREAKDOWN_MU = 0.1
BREAKDOWN_CLIP = 1.0
TARGETS = {
    "ratio_vs_numpy": {"1000": 4.0, "100000": 1.5, "1000000": 2.0},
    "ratio_vs_metropolis_per_proposal": 1.0,
}
DOCS_MD = os.path.join(REPO_ROOT, "docs", "benchmarks", "speed.md")
DOCS_PNG = os.path.join(REPO_ROOT, "docs", "benchmarks", "speed.png")
JAX_INSTALL_HINT = "install the bench extra: pip install 'pymc-penalty[bench]'"


@dataclass(frozen=True)
class Budget:
    """How much to run for one data-set size.

    Attributes
    ----------
    numpy_steps, penalty_draws, loop_steps, calls, metropolis_draws : int
        Steps, draws or calls per round of each method (the penalty ones per mode).
    rounds : int
        Interleaved rounds (every method runs once per round).
    """

    numpy_steps: int
    penalty_draws: int
    loop_steps: int
    calls: int
    metropolis_draws: int
    rounds: int


BUDGETS = {
    "quick": {
        1_000: Budget(1000, 500, 500, 500, 50, 3),
        10_000: Budget(200, 100, 100, 100, 10, 2),
        100_000: Budget(20, 20, 20, 20, 6, 2),
        1_000_000: Budget(5, 5, 5, 5, 3, 1),
    },
    "full": {
        1_000: Budget(10000, 5000, 5000, 5000, 500, 5),
        10_000: Budget(2000, 1000, 1000, 1000, 100, 5),
        100_000: Budget(300, 300, 300, 300, 20, 5),
        1_000_000: Budget(40, 40, 40, 40, 4, 3),
    },
}
# Steps and calls of the breakdown at n = 1e3 per round, and its rounds.
BREAKDOWN_BUDGET = {"quick": (1000, 3), "full": (5000, 5)}


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


def _short_error(exc: BaseException) -> str:
    # One line, bounded: compile errors can print whole graphs.
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first[:200]}"


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
        return None, _short_error(exc)
    return PenaltyMetropolis, ""


def mode_skip_reason(mode: str) -> str:
    """Why a PyTensor mode cannot run here ('' if it can).

    Parameters
    ----------
    mode : str
        ``"C"``, ``"NUMBA"`` or ``"JAX"``.

    Returns
    -------
    str
    """
    if mode == "JAX":
        try:
            import jax  # noqa: F401 - optional: only the JAX column needs it
        except ImportError as exc:
            return (
                f"jax is not installed ({type(exc).__name__}); it is not a dependency of "
                f"pymc-penalty: {JAX_INSTALL_HINT}"
            )
    if mode == "NUMBA":
        try:
            import numba  # noqa: F401 - a dependency of pytensor
        except ImportError as exc:
            return f"numba is not importable ({type(exc).__name__})"
    return ""


def make_penalty_step(penalty_cls, model, data: LogisticData, mode: str = "C", **kwargs):
    """Build the benchmarked ``PenaltyMetropolis`` with the shared proposal scale.

    Parameters
    ----------
    penalty_cls : class
    model : pm.Model
    data : LogisticData
    mode : str
        Key of :data:`PYTENSOR_MODE`, passed as ``compile_kwargs={"mode": ...}``.
    **kwargs
        Replace the default ``noise_sd=1.0, clip=None``.

    Returns
    -------
    PenaltyMetropolis
    """
    options = {"noise_sd": NOISE_SD, "clip": None, **kwargs}
    with model:
        return penalty_cls(
            scaling=proposal_scale(data),
            tune=False,
            compile_kwargs={"mode": PYTENSOR_MODE[mode]},
            **options,
        )


def start_point(model, data: LogisticData) -> dict[str, np.ndarray]:
    """The model's initial point with ``beta`` at the coefficients the data came from."""
    point = model.initial_point()
    point["beta"] = np.asarray(data.beta_true, dtype=point["beta"].dtype)
    return point


def compiled_call(step, data: LogisticData, bound: float = np.inf, ring: int = 16):
    """``op()`` making one call of the step's compiled likelihood alone, as the chain does.

    The calls cycle through ``ring`` proposals drawn around ``beta_true`` at the benchmark's
    scale, each against the current state's per-datapoint vector that the compiled function
    keeps in its storage (filled once here), and write the proposal's vector there, as in
    the chain: the same inputs over and over would flatter the call through memory caches.
    Converting the clipped sum to a NumPy value waits for JAX's asynchronous dispatch, as the
    step does; C and NUMBA outputs are NumPy arrays already.
    """
    lik = step._lik
    fn = lik._fn
    rng = np.random.default_rng(1)
    xs = [
        np.asarray(data.beta_true + proposal_scale(data) * rng.standard_normal(data.d),
                   dtype=lik.input_dtype)
        for _ in range(ring)
    ]  # fmt: skip
    lik.reset(xs[-1], data.n)
    b = np.asarray(bound, dtype=np.float64)
    state = {"i": 0, "out": None}

    def op() -> None:
        i = state["i"]
        out = fn(xs[i], b)
        np.asarray(out[1])
        state["out"] = out
        state["i"] = (i + 1) % ring

    return op


# --- one data-set size ---------------------------------------------------------------------


def setup_mode(penalty_cls, mode: str, model, data: LogisticData, budget: Budget, seed: int):
    """Build, warm up and wrap one mode's step; record its compile and first-call times.

    Returns
    -------
    (dict, dict, dict)
        Runners ``{name: (run, k)}``, the mode's info (``build_s``, ``first_call_s``) and the
        acceptance states. Raises whatever the step raises.
    """
    t0 = time.perf_counter()
    step = make_penalty_step(penalty_cls, model, data, mode)
    info: dict[str, Any] = {"build_s": time.perf_counter() - t0}
    loop_fn, loop_state = step_loop_runner(step, start_point(model, data))
    info["first_call_s"] = loop_state["first_call_s"]
    loop_fn(3)  # JIT modes may compile again on the first calls with cached inputs
    pen_run, pen_state = pm_sample_runner(model, step, {"beta": data.beta_true}, seed)
    pen_run(3)  # fails here, not in the timed rounds, if sampling is broken
    pen_state["accepted"].clear()
    pen_state["timed"] = 0
    call = compiled_call(step, data)
    call()
    runners = {
        f"{mode}/sample": (pen_run, budget.penalty_draws),
        f"{mode}/step_loop": (per_call_runner(loop_fn), budget.loop_steps),
        f"{mode}/compiled_call": (per_call_runner(repeat(call)), budget.calls),
    }
    return runners, info, {"sample": pen_state, "step_loop": loop_state}


def bench_size(
    n: int,
    budget: Budget,
    penalty_cls,
    modes: list[str],
    seed: int = 0,
    blackjax: bool = False,
) -> dict[str, Any]:
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
    modes : list of str
        PyTensor modes to time the penalty step in (keys of :data:`PYTENSOR_MODE`).
    seed : int
    blackjax : bool
        Also time the BlackJAX random-walk chain (:mod:`_blackjax`) and the package's JAX
        backend (:mod:`_jax_backend`, private configuration), ``numpy_steps`` steps per round
        each.

    Returns
    -------
    dict
        Seconds per step, draw or proposal of the baselines, acceptance rates and set-up
        times; under ``"modes"`` per mode the seconds per draw (``sample``), per step
        (``step_loop``) and per compiled call, ``build_s``, ``first_call_s`` and acceptance
        rates, or ``error``.
    """
    import pymc as pm

    data = make_logistic_data(n, D)
    scale = proposal_scale(data)
    out: dict[str, Any] = {"modes": {}}
    runners: dict[str, tuple[Any, int]] = {}

    loop = NumpyPenaltyLoop(data, scale=scale, noise_sd=NOISE_SD, clip=None, seed=seed)
    loop.run(2)
    runners["numpy"] = (per_call_runner(loop.run), budget.numpy_steps)

    chain = None
    if blackjax:
        t0 = time.perf_counter()
        sizes = [c.size for c in np.array_split(np.arange(budget.numpy_steps), CHUNKS)]
        chain = BlackjaxChain(data, scale=scale, chunk_sizes=sizes, seed=seed)
        out["blackjax_setup_s"] = time.perf_counter() - t0
        runners["blackjax"] = (per_call_runner(chain.run), budget.numpy_steps)
        t0 = time.perf_counter()
        device = PenaltyDeviceChain(data, scale=scale, chunk_sizes=sizes, seed=seed)
        out["jax_backend_setup_s"] = time.perf_counter() - t0
        runners["jax_backend"] = (per_call_runner(device.run), budget.numpy_steps)

    model = logistic_model(data)
    t0 = time.perf_counter()
    with model:
        met = pm.Metropolis(S=np.ones(D), scaling=scale, tune=False)
    out["metropolis_setup_s"] = time.perf_counter() - t0
    met_run, met_state = pm_sample_runner(model, met, {"beta": data.beta_true}, seed)
    runners["metropolis_per_draw"] = (met_run, budget.metropolis_draws)

    states: dict[str, dict] = {}
    for mode in modes if penalty_cls is not None else []:
        try:
            mode_runners, info, states[mode] = setup_mode(
                penalty_cls, mode, model, data, budget, seed
            )
        except Exception as exc:  # noqa: BLE001 - report the other modes regardless
            out["modes"][mode] = {"error": _short_error(exc)}
            continue
        out["modes"][mode] = info
        runners.update(mode_runners)

    # pm.sample(cores=1) limits BLAS to one thread (blas_cores="auto"): do the same for all.
    best = {name: np.inf for name in runners}
    with threadpool_limits(limits=1):
        for _ in range(budget.rounds):
            for name, (run, k) in runners.items():
                best[name] = min(best[name], *run(k))

    out["numpy"] = best["numpy"]
    out["numpy_accept"] = loop.acceptance_rate
    out["numpy_accept_steps"] = loop.n_steps
    if chain is not None:
        out["blackjax"] = best["blackjax"]
        out["blackjax_accept"] = chain.acceptance_rate
        out["jax_backend"] = best["jax_backend"]
        out["jax_backend_accept"] = device.acceptance_rate
    out["metropolis_per_draw"] = best["metropolis_per_draw"]
    out["metropolis_per_proposal"] = best["metropolis_per_draw"] / D
    out["metropolis_accept"] = float(np.mean(met_state["accepted"]))
    out["metropolis_timed_draws"] = met_state["timed"]
    for mode, st in states.items():
        res = out["modes"][mode]
        for what in ("sample", "step_loop", "compiled_call"):
            res[what] = best[f"{mode}/{what}"]
        res["sample_accept"] = float(np.mean(st["sample"]["accepted"]))
        res["sample_accept_steps"] = st["sample"]["timed"]  # draws behind the mean (about)
        loop_state = st["step_loop"]
        res["step_loop_accept"] = loop_state["accepted"] / max(loop_state["steps"], 1)
    return out


# --- where the time goes at n = 1e3 --------------------------------------------------------

PARTS = ("likelihood", "proposal", "accounting", "step_bookkeeping", "sampler_loop")


class _TimedNoise:
    """Stands in for the privacy-noise generator; times each draw as accounting."""

    def __init__(self, gen, timer: PartTimer) -> None:
        self.standard_normal = timer.wrap("accounting", gen.standard_normal)


def _instrument(step, timer: PartTimer) -> None:
    """Time the step's likelihood call, proposal and accounting in place, in the chain."""
    real_noise, ledger = step._noise, step.ledger
    proxies: dict[int, _TimedNoise] = {}

    def noise() -> _TimedNoise:
        gen = real_noise()
        if id(gen) not in proxies:  # one generator per process: wrap it once
            proxies[id(gen)] = _TimedNoise(gen, timer)
        return proxies[id(gen)]

    step._lik._fn = timer.wrap("likelihood", step._lik._fn)
    step._propose = timer.wrap("proposal", step._propose)
    step._sensitivity_and_noise = timer.wrap("proposal", step._sensitivity_and_noise)
    step._noise = timer.wrap("accounting", noise)
    step.ledger = type("TimedLedger", (), {})()
    step.ledger.try_spend = timer.wrap("accounting", ledger.try_spend)


def _stub_parts(step, outputs: dict[str, Any]) -> None:
    """Replace the step's timed parts by constant stubs (its bookkeeping is then all it does)."""
    fn_out = outputs["fn"]
    step._lik._fn = lambda *args: fn_out
    step._propose = lambda x0: outputs["propose"]
    step._sensitivity_and_noise = lambda length: outputs["sensitivity"]
    step.ledger = type("Ledger", (), {"try_spend": staticmethod(lambda mu2: True)})()
    zero = type("Noise", (), {"standard_normal": staticmethod(lambda: 0.0)})()
    step._noise = lambda: zero


def breakdown(penalty_cls, steps: int, rounds: int, seed: int = 0) -> dict[str, Any]:
    """Split one private step at n = 1e3 (C mode) into parts and check that they add up.

    The measured step is ``PenaltyMetropolis(mu=0.1, clip=1.0)`` with a
    :class:`PrivacyLedger` whose budget covers every release of the benchmark (so
    ``try_spend`` does its ordinary work: in-memory grants and occasional file-locked
    reservations). Its time per draw through ``pm.sample`` is the total. The parts are
    measured on other instances of the same step, independently of the total:

    - in the chain, by timing calls in place during ``pm.sample`` runs of an instrumented
      instance: ``likelihood`` (the compiled call), ``proposal`` (``step._propose``: draw and
      step length, and the noise scale), ``accounting`` (``ledger.try_spend``, getting the
      noise generator and the two noise draws);
    - ``step_bookkeeping``: ``step.step`` with those parts replaced by constant stubs: PyMC's
      ``ArrayStepShared.step`` (point to raveled vector and back) and the rest of ``astep``
      (the transition of :mod:`pymc_penalty.sampling.kernel` with its accept test, stats, cache key,
      casts around the compiled call);
    - ``sampler_loop``: ``pm.sample`` per draw with ``step.step`` replaced by a stub that
      returns the point and stats unchanged (``trace.record``, ``log_warning_stats``, the
      timing callback, the generator).

    The compiled call is also timed alone, outside the chain (``likelihood_isolated``):
    back-to-back calls find the memory caches warm and are cheaper than calls in the chain.

    Parameters
    ----------
    penalty_cls : class
    steps : int
        Draws, steps or calls per round of each part.
    rounds : int
    seed : int

    Returns
    -------
    dict
        Seconds per draw through ``pm.sample`` (``total``), per ``step.step`` call
        (``step``), per part (``parts``) and ``likelihood_isolated``, the acceptance rate
        and the configuration.
    """
    from pymc.blocking import DictToArrayBijection

    from pymc_penalty import PrivacyLedger

    data = make_logistic_data(BREAKDOWN_N, D)
    model = logistic_model(data)
    releases = 4 * (rounds + 1) * (steps + 10)  # every release below, with room to spare

    def private_step():
        return make_penalty_step(
            penalty_cls,
            model,
            data,
            noise_sd=None,
            mu=BREAKDOWN_MU,
            clip=BREAKDOWN_CLIP,
            ledger=PrivacyLedger(BREAKDOWN_MU * math.sqrt(releases)),
        )

    step, probe, inst, stub, loop_stub = (private_step() for _ in range(5))
    start = {"beta": data.beta_true}
    sample_run, sample_state = pm_sample_runner(model, step, start, seed)
    sample_run(3)
    sample_state["accepted"].clear()
    loop_fn, _ = step_loop_runner(step, start_point(model, data))

    # Inputs of the stubs, from one real step of the probe at the starting point.
    point = start_point(model, data)
    _, stats = probe.step(point)
    x0 = DictToArrayBijection.map(point).data
    x1, length = probe._propose(x0)
    sensitivity = probe._sensitivity_and_noise(length)
    bound = sensitivity[0]
    fn_out = probe._lik._fn(x1, np.asarray(bound))

    stub.step(point)  # fills the cache before the stubs replace the likelihood
    _stub_parts(
        stub,
        {"fn": fn_out, "propose": (x1, length), "sensitivity": sensitivity},
    )
    loop_stub.step = lambda p: (p, stats)
    stub_point = {"p": point}

    def bookkeeping() -> None:
        stub_point["p"] = stub.step(stub_point["p"])[0]

    timer = PartTimer()
    _instrument(inst, timer)
    in_chain_parts = PARTS[:3]
    inst_run, inst_state = pm_sample_runner(
        model, inst, start, seed, snapshot=lambda: [timer.totals[p] for p in in_chain_parts]
    )
    inst_run(3)
    in_chain = {"total": np.inf}

    def instrumented(k: int) -> list[float]:
        # The parts of the instrumented chunk with the smallest time per draw, as the other
        # figures are each the fastest chunk.
        times = inst_run(k)
        i = int(np.argmin(times))
        if times[i] < in_chain["total"]:
            in_chain["total"] = times[i]
            in_chain.update(zip(in_chain_parts, inst_state["chunk_snapshots"][i], strict=True))
        return [np.nan]

    runners = {
        "total": sample_run,
        "step": per_call_runner(loop_fn),
        "instrumented": instrumented,
        "likelihood_isolated": per_call_runner(repeat(compiled_call(probe, data, bound))),
        "step_bookkeeping": per_call_runner(repeat(bookkeeping)),
        "sampler_loop": pm_sample_runner(model, loop_stub, start, seed)[0],
    }
    best = {name: np.inf for name in runners}
    with threadpool_limits(limits=1):
        for _ in range(rounds):
            for name, run in runners.items():
                best[name] = np.nanmin([best[name], *run(steps)])
    best.update({p: in_chain[p] for p in in_chain_parts})
    return {
        "config": (
            f"PenaltyMetropolis(mu={BREAKDOWN_MU:g}, clip={BREAKDOWN_CLIP:g}, "
            "ledger=PrivacyLedger(...)), C mode"
        ),
        "total": best["total"],
        "step": best["step"],
        "parts": {k: best[k] for k in PARTS},
        "likelihood_isolated": best["likelihood_isolated"],
        "clock_overhead": timer.overhead,
        "accept": float(np.mean(sample_state["accepted"])),
    }


def profile_step(penalty_cls, n: int = 1_000, steps: int = 3000, top: int = 25) -> str:
    """cProfile of ``step.step`` at size ``n`` (C mode), sorted by internal time.

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
    run, _ = step_loop_runner(step, start_point(model, data))
    run(100)
    prof = cProfile.Profile()
    with threadpool_limits(limits=1):
        prof.enable()
        run(steps)
        prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


# --- summary -------------------------------------------------------------------------------


def summarise(
    results: dict[int, dict[str, Any]],
    modes: dict[str, str],
    bd: dict[str, Any] | None,
    run_mode: str,
    penalty_error: str,
    blackjax_skipped: str = "",
) -> dict[str, Any]:
    """Build the RESULT dictionary (ratios keyed by n as strings; times in ms).

    Parameters
    ----------
    results : dict
        :func:`bench_size` output by n.
    modes : dict
        Every PyTensor mode, mapped to '' if it ran or the reason it was skipped.
    bd : dict or None
        :func:`breakdown` output, ``{"error": ...}``, or None if not run.
    run_mode : str
        ``"quick"`` or ``"full"``.
    penalty_error : str
        Why ``PenaltyMetropolis`` could not be imported ('' if it could).
    blackjax_skipped : str
        Why the BlackJAX chain did not run ('' if it did).
    """
    mode_entries = {
        m: {"skipped": reason}
        if reason
        else summarise_mode(m, PYTENSOR_MODE[m] or "default (C)", results)
        for m, reason in modes.items()
    }
    c = mode_entries.get("C", {})

    def per_n(key: str) -> dict[str, float | None]:
        return {str(n): ms(r.get(key)) for n, r in results.items()}

    jax_entry = mode_entries.get("JAX", {"skipped": "not a PyTensor mode here"})
    skipped = {"skipped": blackjax_skipped}
    ms_blackjax = skipped if blackjax_skipped else per_n("blackjax")
    summary: dict[str, Any] = {
        # The paths a user can pick (issue: speed parity with a jitted JAX sampler) and the
        # jitted BlackJAX chain they would compare with, measured in the same run: "jax" is
        # pp.sample(backend="jax")'s device chain, "pytensor_jax" the default step with
        # PyTensor's JAX mode.
        "ms_per_step": {
            "default": c.get("per_step_ms", {}),
            "jax": skipped if blackjax_skipped else per_n("jax_backend"),
            "pytensor_jax": jax_entry
            if "skipped" in jax_entry
            else jax_entry.get("per_step_ms", {}),
        },
        "ms_blackjax": ms_blackjax,
        "ratio_jax_vs_blackjax": {
            str(n): ratio(r.get("jax_backend"), r.get("blackjax")) for n, r in results.items()
        },
        "jax_backend_accept": {str(n): r.get("jax_backend_accept") for n, r in results.items()},
        "ratio_vs_blackjax": {
            str(n): ratio(r["modes"].get("C", {}).get("sample"), r.get("blackjax"))
            for n, r in results.items()
        },
        "blackjax_accept": {str(n): r.get("blackjax_accept") for n, r in results.items()},
        "ratio_vs_numpy": c.get("ratio_vs_numpy", {}),
        "ratio_vs_metropolis_per_proposal": c.get("ratio_vs_metropolis_per_proposal", {}),
        "ratio_vs_numpy_step_loop": {
            str(n): ratio(r["modes"].get("C", {}).get("step_loop"), r["numpy"])
            for n, r in results.items()
        },
        "ms_numpy": per_n("numpy"),
        # The same chain (noise sd, no clip, proposal scale, start) as the default path: their
        # acceptance rates must agree, or the two timings are not of the same algorithm.
        "accept_same_chain": {
            str(n): {
                "numpy": r["numpy_accept"],
                "numpy_steps": r["numpy_accept_steps"],
                "default": r["modes"].get("C", {}).get("sample_accept"),
                "default_steps": r["modes"].get("C", {}).get("sample_accept_steps"),
            }
            for n, r in results.items()
        },
        "ms_penalty_sample": c.get("per_step_ms", {}),
        "ms_penalty_step_loop": c.get("step_loop_ms", {}),
        "ms_metropolis_per_draw": per_n("metropolis_per_draw"),
        "ms_metropolis_per_proposal": per_n("metropolis_per_proposal"),
        "metropolis_timed_draws": {str(n): r["metropolis_timed_draws"] for n, r in results.items()},
        "penalty_setup_s": c.get("build_s", {}),
        "modes": mode_entries,
        "breakdown_1000": None if bd is None else summarise_breakdown(bd),
        "targets": TARGETS,
        "targets_met": targets_met(mode_entries, TARGETS),
        "sizes": [int(n) for n in results],
        "d": D,
        "noise_sd": NOISE_SD,
        "mode": run_mode,
        "penalty_available": not penalty_error,
    }
    errors = [
        f"n={n} {m}: {r['error']}"
        for n, res in results.items()
        for m, r in res["modes"].items()
        if "error" in r
    ]
    if penalty_error or errors:
        summary["penalty_error"] = "; ".join([penalty_error] * bool(penalty_error) + errors)
    summary["metropolis_setup_s"] = {
        str(n): round(r["metropolis_setup_s"], 3) for n, r in results.items()
    }
    summary.update(machine_info(("numpy", "scipy", "pymc", "pytensor", "numba", "jax", "blackjax")))
    return summary


# Findings from profiling, written below the tables in speed.md. The JAX figures were measured
# by calling the step's compiled function directly (process CPU time, best of 5 x 3000 calls).
NOTES = """\
- **JAX at small n: a fixed cost per call.** The step's compiled call in JAX mode costs
  about 0.020 ms at n = 10 (C: 0.009 ms) once its outputs are ready, and the step then
  converts three JAX scalars (clipped sum, clip count, log prior) to Python numbers, 0.009
  to 0.012 ms each (0.035 ms for the three at n = 1e3): a device-to-host copy per output even
  on the CPU backend. That is why JAX is about three times slower per step than C at
  n = 1e3; from n = 1e4 the per-datapoint work dominates. A package-side change that would
  remove most of the conversion cost is to return the three scalars as one stacked float64
  vector from the compiled function (one copy instead of three); it is not made here (the
  step's code is out of this benchmark's scope) and its saving is estimated from the costs
  above, not measured end to end.
- **JAX at n = 1e5** is the fastest mode, below the NumPy loop. The likely reason (not
  profiled further) is that XLA evaluates the softplus's `exp` and `log1p` with SIMD, while
  PyTensor's C backend calls scalar libm in a loop and NumPy's `logaddexp` is not
  vectorised (see `docs/blas.md`).
- **n = 1e6:** X is 80 MB, more than the caches hold, and the three modes' times converge;
  most likely every step is bound by reading X from main memory.
- **C at n = 1e5** sits at the 1.5x target. On the shared 2-core machine, n = 1e5 figures move
  by up to 10 % between runs (`docs/blas.md`), so the met/not-met verdict there can differ
  from run to run; NUMBA is consistently a little faster.
- **NUMBA** compiles on the first call (the "first call" column; numba caches machine code on
  disk, so a later run can start faster) and then runs at about the C mode's speed or
  slightly faster.
- **pm.Metropolis** at n = 1e6 takes about a second per draw (d = 10 proposals, each
  evaluating the full log density twice), so only a few draws are timed there (the count is
  given under the first table); its per-proposal figure is the least precise in the tables.
"""


# --- command line --------------------------------------------------------------------------


def _csv(kind: type, allowed: tuple | None = None):
    def parse(text: str) -> tuple:
        values = tuple(kind(float(v)) if kind is int else kind(v) for v in text.split(","))
        if allowed is not None and not set(values) <= set(allowed):
            raise argparse.ArgumentTypeError(f"choose from {', '.join(map(str, allowed))}")
        return values

    return parse


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="n = 1e3, 1e4; C and NUMBA (<1 min)")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="cpu",
        help="time steps by process CPU time (default; robust on a shared machine) or wall time",
    )
    parser.add_argument(
        "--modes", type=_csv(str, tuple(PYTENSOR_MODE)), help="PyTensor modes, e.g. C,NUMBA"
    )
    parser.add_argument("--sizes", type=_csv(int, tuple(BUDGETS["full"])), help="e.g. 1e3,1e5")
    parser.add_argument(
        "--write-docs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="rewrite docs/benchmarks/speed.{md,png} (default: only in a full, unrestricted run)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="also print a cProfile of step.step at n=1e3"
    )
    args = parser.parse_args(argv)
    CLOCK[0] = CLOCKS[args.clock]
    _quiet()
    run_mode = "quick" if args.quick else "full"
    sizes = args.sizes or SIZES[run_mode]
    wanted = args.modes or MODES[run_mode]
    write = args.write_docs
    if write is None:
        write = run_mode == "full" and args.modes is None and args.sizes is None
    t_start = time.perf_counter()

    penalty_cls, penalty_error = load_penalty()
    modes = {
        m: (mode_skip_reason(m) if m in wanted else "not selected (--modes)") for m in PYTENSOR_MODE
    }
    if run_mode == "quick" and args.modes is None:
        modes = {m: r if m in wanted else "not run in --quick mode" for m, r in modes.items()}
    info = machine_info()
    print(f"pymc-penalty speed benchmark ({run_mode}); logistic regression, d = {D}")
    print(
        f"PyTensor blas__ldflags = {info['blas_ldflags']!r}; NumPy BLAS = {info['numpy_blas']}; "
        f"BLAS threads: 1 (threadpoolctl); CPUs: {os.cpu_count()}; clock: {args.clock} time"
    )
    for m, reason in modes.items():
        if reason:
            print(f"PyTensor mode {m}: skipped ({reason})")
    if penalty_error:
        print(f"PenaltyMetropolis unavailable ({penalty_error}): baselines only.")
    print()

    blackjax_skipped = blackjax_skip_reason()
    if blackjax_skipped:
        print(f"BlackJAX baseline: skipped ({blackjax_skipped})")
    run_modes = [m for m, reason in modes.items() if not reason]
    results: dict[int, dict[str, Any]] = {}
    for n in sizes:
        t0 = time.perf_counter()
        results[n] = bench_size(
            n, BUDGETS[run_mode][n], penalty_cls, run_modes, blackjax=not blackjax_skipped
        )
        for m, r in results[n]["modes"].items():
            if "error" in r:
                print(f"PenaltyMetropolis ({m}) failed at n={n}: {r['error']}")
        print(f"n = {n}: {time.perf_counter() - t0:.1f} s", flush=True)

    bd = None
    if penalty_cls is not None and "C" in run_modes:
        try:
            bd = breakdown(penalty_cls, *BREAKDOWN_BUDGET[run_mode])
        except Exception as exc:  # noqa: BLE001 - uses step internals; report, do not fail
            bd = {"error": _short_error(exc)}

    summary = summarise(results, modes, bd, run_mode, penalty_error, blackjax_skipped)
    summary["clock"] = args.clock
    print()
    print(report_text(summary))
    print()

    if args.profile and penalty_cls is not None:
        print("cProfile of step.step at n = 1000 (sorted by internal time):")
        print(profile_step(penalty_cls, steps=1000 if args.quick else 5000))

    summary["wall_s"] = round(time.perf_counter() - t_start, 1)
    if write:
        write_docs(summary, command_line(__file__, argv), DOCS_MD, DOCS_PNG, NOTES)
        print(f"wrote {os.path.relpath(DOCS_MD, REPO_ROOT)} and speed.png")
    print(f"total wall time {summary['wall_s']:.1f} s")
    print("RESULT " + json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
