"""Shared pieces of the benchmarks: synthetic data, the PyMC model, the NumPy reference loop,
machine facts and timing helpers.

Nothing here touches private data: the data sets are synthetic and drawn from fixed seeds.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shlex
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import numpy as np

__all__ = [
    "CHUNKS",
    "CLOCK",
    "CLOCKS",
    "REPO_ROOT",
    "LogisticData",
    "NumpyPenaltyLoop",
    "PartTimer",
    "blas_info",
    "command_line",
    "logistic_model",
    "machine_info",
    "make_logistic_data",
    "per_call_runner",
    "pm_sample_runner",
    "repeat",
    "step_loop_runner",
]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The repository root (benchmarks are run from there)."""


@dataclass(frozen=True)
class LogisticData:
    """Synthetic logistic-regression data set.

    Attributes
    ----------
    X : ndarray, shape (n, d)
        Covariates: standard normal, or uniform in a ball (``x_bound``).
    y : ndarray, shape (n,)
        Binary outcomes (int64, 0 or 1).
    beta_true : ndarray, shape (d,)
        Coefficients the outcomes were drawn from.
    """

    X: np.ndarray
    y: np.ndarray
    beta_true: np.ndarray

    @property
    def n(self) -> int:
        """Number of datapoints."""
        return int(self.X.shape[0])

    @property
    def d(self) -> int:
        """Number of coefficients."""
        return int(self.X.shape[1])


def rms_over_seeds(errors) -> tuple[float, float]:
    """RMS of per-seed errors and its standard error (the mean square's, propagated)."""
    sq = np.asarray(errors, dtype=float) ** 2
    rms = float(np.sqrt(sq.mean()))
    se = float(sq.std(ddof=1) / np.sqrt(sq.size)) if sq.size > 1 else 0.0
    return rms, (se / (2.0 * rms) if rms > 0 else 0.0)


def make_logistic_data(
    n: int, d: int = 10, seed: int = 20240521, x_bound: float | None = None
) -> LogisticData:
    """Draw a synthetic logistic-regression data set from a fixed seed.

    Parameters
    ----------
    n : int
        Number of datapoints.
    d : int, default 10
        Number of coefficients.
    seed : int
        Seed of the generator (the data set depends on ``n``, ``d``, ``seed`` and
        ``x_bound`` only).
    x_bound : float, optional
        Covariates uniform in the ball ``||x|| <= x_bound`` instead of standard normal.

    Returns
    -------
    LogisticData
    """
    rng = np.random.default_rng([seed, n, d])
    beta_true = rng.normal(0.0, 0.5, size=d)
    X = rng.standard_normal((n, d))
    if x_bound is not None:  # uniform in the ball: a uniform direction, radius ~ U^(1/d)
        radius = x_bound * rng.random(n) ** (1.0 / d)
        X *= (radius / np.linalg.norm(X, axis=1))[:, None]
    p = 1.0 / (1.0 + np.exp(-(X @ beta_true)))
    y = (rng.random(n) < p).astype(np.int64)
    return LogisticData(X=X, y=y, beta_true=beta_true)


def logistic_model(data: LogisticData):
    """Bayesian logistic regression: ``beta ~ N(0, 1)``, ``y ~ Bernoulli(logit_p=X @ beta)``.

    Parameters
    ----------
    data : LogisticData

    Returns
    -------
    pm.Model
    """
    import pymc as pm

    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 1.0, shape=data.d)
        pm.Bernoulli("y", logit_p=data.X @ beta, observed=data.y)
    return model


class NumpyPenaltyLoop:
    """Hand-written NumPy version of the penalty step on the logistic model.

    Per step: one random-walk proposal over all coefficients, the per-datapoint
    log-likelihood at the proposal only (the current state's vector is cached), the ratios
    clipped to ``[-B, B]``, their sum plus ``N(0, sigma^2)`` noise, and the penalised test
    ``log u < d_hat - sigma^2 / 2 + log prior ratio``. The per-datapoint log-likelihood is
    ``y * eta - logaddexp(0, eta)`` with ``eta = X @ beta``: the numerically stable form,
    the same quantity as PyMC's Bernoulli ``logit_p`` log-density.

    Parameters
    ----------
    data : LogisticData
    scale : float
        Proposal standard deviation of each coefficient.
    noise_sd : float
        Privacy-noise standard deviation ``sigma``.
    clip : float or None
        ``B = clip * ||theta' - theta||_2`` (the step's default clip mode); ``None`` gives
        ``B = inf`` (the clip is still applied, as in the compiled step).
    seed : int
        Seed of the generator for proposals, noise and uniforms.
    """

    def __init__(
        self,
        data: LogisticData,
        *,
        scale: float,
        noise_sd: float,
        clip: float | None = None,
        seed: int = 1,
    ) -> None:
        self.X = np.ascontiguousarray(data.X, dtype=np.float64)
        self.y = data.y.astype(np.float64)
        self.scale = float(scale)
        self.noise_sd = float(noise_sd)
        self.clip = np.inf if clip is None else float(clip)
        self.rng = np.random.default_rng(seed)
        self.reset(data.beta_true)

    def _loglik(self, theta: np.ndarray) -> np.ndarray:
        eta = self.X @ theta
        return self.y * eta - np.logaddexp(0.0, eta)

    @staticmethod
    def _logprior(theta: np.ndarray) -> float:
        return float(-0.5 * (theta @ theta) - 0.5 * theta.size * np.log(2.0 * np.pi))

    def reset(self, theta: np.ndarray) -> None:
        """Set the current state and fill the cache (not timed as part of a step).

        Parameters
        ----------
        theta : ndarray, shape (d,)
        """
        self.theta = np.array(theta, dtype=np.float64)
        self.ll = self._loglik(self.theta)
        self.logprior = self._logprior(self.theta)
        self.n_accepted = 0
        self.n_steps = 0

    def run(self, n_steps: int) -> None:
        """Make ``n_steps`` penalty steps.

        Parameters
        ----------
        n_steps : int
        """
        rng, d, sigma = self.rng, self.theta.size, self.noise_sd
        theta, ll_cur, lp_cur = self.theta, self.ll, self.logprior
        accepted = 0
        for _ in range(n_steps):
            prop = theta + self.scale * rng.standard_normal(d)
            ll = self._loglik(prop)
            bound = self.clip * float(np.linalg.norm(prop - theta))
            d_sum = float(np.clip(ll - ll_cur, -bound, bound).sum())
            d_hat = d_sum + sigma * rng.standard_normal()
            lp = self._logprior(prop)
            if np.log(rng.uniform()) < d_hat - 0.5 * sigma**2 + lp - lp_cur:
                theta, ll_cur, lp_cur = prop, ll, lp
                accepted += 1
        self.theta, self.ll, self.logprior = theta, ll_cur, lp_cur
        self.n_accepted += accepted
        self.n_steps += n_steps

    @property
    def acceptance_rate(self) -> float:
        """Fraction of accepted proposals since the last :meth:`reset`."""
        return self.n_accepted / max(self.n_steps, 1)


def blas_info() -> dict[str, str]:
    """BLAS facts that matter for the timings.

    Returns
    -------
    dict
        ``blas_ldflags`` (PyTensor's, empty when it found no BLAS), ``pytensor_mode`` and
        ``numpy_blas``.
    """
    import pytensor

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="PyTensor could not link to a BLAS")
        ldflags = str(pytensor.config.blas__ldflags)
    try:
        numpy_blas = str(np.show_config(mode="dicts")["Build Dependencies"]["blas"]["name"])
    except Exception:  # noqa: BLE001 - informative only
        numpy_blas = "unknown"
    return {
        "blas_ldflags": ldflags,
        "pytensor_mode": str(pytensor.config.mode),
        "numpy_blas": numpy_blas,
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(packages: tuple[str, ...] = ("numpy", "scipy", "pymc", "pytensor")) -> dict:
    """Facts about the machine and software that the timings depend on.

    Parameters
    ----------
    packages : tuple of str
        Distributions whose versions are reported (``None`` for those not installed).

    Returns
    -------
    dict
        ``cpu``, ``cpu_count``, ``machine``, ``system``, ``python``, ``versions`` and the
        entries of :func:`blas_info`.
    """
    versions: dict[str, str | None] = {}
    for name in packages:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "system": platform.system(),
        "python": platform.python_version(),
        "versions": versions,
        **blas_info(),
    }


def command_line(script: str, argv: list[str]) -> str:
    """The command that reproduces a benchmark run, relative to the repository root.

    Parameters
    ----------
    script : str
        Path of the benchmark script (``__file__``).
    argv : list of str
        Arguments after the script name.

    Returns
    -------
    str
    """
    rel = os.path.relpath(os.path.abspath(script), REPO_ROOT)
    return shlex.join(["python", rel, *argv])


# --- timing --------------------------------------------------------------------------------

CHUNKS = 5
"""Chunks each timed run is split into; a method's figure is its fastest chunk."""

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
"""Clocks for steps and draws: process CPU time (the default: BLAS runs on one thread, so on
an idle machine it equals wall time, and a busy shared machine does not inflate it) or wall
time."""

CLOCK = [CLOCKS["cpu"]]
"""The clock in use (a one-element list, so that a benchmark's ``--clock`` can set it)."""


def per_call_runner(fn: Callable[[int], Any]) -> Callable[[int], list[float]]:
    """Wrap ``fn(k)`` (k calls of an operation) as ``run(k)``: seconds per call by chunk.

    Parameters
    ----------
    fn : callable
        ``fn(k)`` performs ``k`` calls.

    Returns
    -------
    callable
        ``run(k)`` returns the mean seconds per call of each of ``CHUNKS`` chunks.
    """

    def run(k: int) -> list[float]:
        times = []
        for c in np.array_split(np.arange(k), CHUNKS):
            if c.size:
                t0 = CLOCK[0]()
                fn(c.size)
                times.append((CLOCK[0]() - t0) / c.size)
        return times

    return run


def repeat(op: Callable[[], Any]) -> Callable[[int], None]:
    """``fn(k)`` calling ``op()`` k times (for :func:`per_call_runner`)."""

    def fn(k: int) -> None:
        for _ in range(k):
            op()

    return fn


def pm_sample_runner(
    model: Any,
    step: Any,
    initvals: dict[str, np.ndarray],
    seed: int,
    snapshot: Callable[[], Any] | None = None,
) -> tuple[Callable[[int], list[float]], dict[str, Any]]:
    """Return ``run(draws)`` timing one ``pm.sample`` call through its callback.

    Parameters
    ----------
    model : pm.Model
    step : step method
    initvals : dict
        Starting point of every call.
    seed : int
        ``random_seed`` of the first call (incremented per call).
    snapshot : callable, optional
        Called after each draw with the clock; its values (a sequence of floats) are
        differenced like the clock and averaged per chunk into ``state["chunk_snapshots"]``.

    Returns
    -------
    (callable, dict)
        ``run(draws)`` makes one ``pm.sample`` call (one chain, no tuning) and returns the
        mean seconds per draw of each of ``CHUNKS`` consecutive chunks of draws, from the
        times of the draws' callbacks (so compilation, set-up and trace conversion are
        excluded; the first draw is not timed). The dict accumulates the mean ``accepted``
        statistic of each call under ``"accepted"`` and the number of timed draws under
        ``"timed"``. The callback only reads the clock, so that it adds as little as
        possible to the draws it times.
    """
    import pymc as pm

    state: dict[str, Any] = {"accepted": [], "calls": 0, "timed": 0}

    def run(draws: int) -> list[float]:
        stamps: list[float] = []
        snaps: list[Any] = []
        clock = CLOCK[0]

        def callback(trace, draw):
            stamps.append(clock())
            if snapshot is not None:
                snaps.append(snapshot())

        with model:
            trace = pm.sample(
                draws=draws,
                step=step,
                chains=1,
                cores=1,
                tune=0,
                progressbar=False,
                compute_convergence_checks=False,
                initvals=initvals,
                random_seed=seed + state["calls"],
                return_inferencedata=False,
                callback=callback,
            )
        state["calls"] += 1
        state["timed"] += len(stamps) - 1
        if "accepted" in trace.stat_names:
            accepted = np.asarray(trace.get_sampler_stats("accepted"), dtype=float)
            state["accepted"].append(float(accepted.mean()))
        chunks = [c for c in np.array_split(np.arange(len(stamps) - 1), CHUNKS) if c.size]
        if snapshot is not None:
            deltas = np.diff(np.asarray(snaps, dtype=float), axis=0)
            state["chunk_snapshots"] = [deltas[c].mean(axis=0) for c in chunks]
        return [float(np.diff(stamps)[c].mean()) for c in chunks]

    return run, state


def step_loop_runner(
    step: Any, point: dict[str, np.ndarray]
) -> tuple[Callable[[int], None], dict[str, Any]]:
    """Return ``run(k)`` making ``k`` calls of ``step.step`` from a persistent point.

    The first ``step.step`` call (which fills a step's caches and, in JIT modes, compiles) is
    made here; its wall time is in the state as ``first_call_s``.

    Parameters
    ----------
    step : step method
    point : dict
        Starting point.

    Returns
    -------
    (callable, dict)
        ``run(k)`` and its state: the ``point``, ``accepted`` and ``steps`` counts.
    """
    t0 = time.perf_counter()
    first = step.step(point)[0]
    state = {"point": first, "accepted": 0, "steps": 0, "first_call_s": time.perf_counter() - t0}

    def run(k: int) -> None:
        p, acc = state["point"], 0
        for _ in range(k):
            p, stats = step.step(p)
            acc += bool(stats[0]["accepted"])
        state["point"] = p
        state["accepted"] += acc
        state["steps"] += k

    return run, state


class PartTimer:
    """Accumulates the clock time spent in wrapped callables, less the clock's own cost.

    An interval between two clock reads includes about one read's cost (the process CPU
    clock is a system call of about a microsecond); that cost, measured as the median empty
    interval, is subtracted from every timed call.

    Attributes
    ----------
    overhead : float
        Seconds subtracted per timed call.
    totals : dict
        Seconds accumulated per part.
    """

    def __init__(self) -> None:
        clock = CLOCK[0]
        empty = []
        for _ in range(2001):
            t = clock()
            empty.append(clock() - t)
        self.overhead = float(np.median(empty))
        self.totals: dict[str, float] = {}

    def wrap(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Return ``fn`` timed into ``part``."""
        clock, overhead, totals = CLOCK[0], self.overhead, self.totals
        totals.setdefault(part, 0.0)

        def timed(*args: Any) -> Any:
            t0 = clock()
            out = fn(*args)
            totals[part] += clock() - t0 - overhead
            return out

        return timed


def best_seconds_per_step(step: Any, point: dict, steps: int, chunks: int) -> float:
    """Fastest of ``chunks`` runs of ``steps`` calls of ``step.step``, in seconds per step,
    after one warm-up step (which fills the step's caches)."""
    point, _ = step.step(point)
    best = np.inf
    for _ in range(chunks):
        t0 = time.perf_counter()
        for _ in range(steps):
            point, _ = step.step(point)
        best = min(best, (time.perf_counter() - t0) / steps)
    return float(best)


@contextlib.contextmanager
def capture_warm_start() -> Iterator[dict[str, Any]]:
    """Within the block, every private warm start ``pymc_penalty.sample`` makes is also stored
    under ``"warm"`` of the dict yielded (its released point and covariance: post-processing)."""
    import pymc_penalty.budgeted as budgeted  # run_warm_start, which pp.sample calls

    captured: dict[str, Any] = {}
    original = budgeted.private_warm_start

    def capturing(*args, **kw):
        captured["warm"] = original(*args, **kw)
        return captured["warm"]

    budgeted.private_warm_start = capturing
    try:
        yield captured
    finally:
        budgeted.private_warm_start = original
