"""Utility table: pymc_penalty.sample's defaults beside an oracle-tuned chain and E_max.

For each cell (workload, n, epsilon) of the grid n in {1e4, 1e5, 1e6} x epsilon in
{0.5, 1, 2, 6} on two workloads:

- ``logistic``: :mod:`utility`'s model (Bayesian logistic regression, d = 5, ``beta ~ N(0, 1)``,
  coefficients drawn from a fixed seed) with covariates uniform in the unit ball
  (``||x|| <= 1``, as issue 13 specifies; :mod:`utility` itself draws them standard normal),
  delta = 1 / n;
- ``gauss``: :mod:`gauss`'s workload (d = 10, rows ``N(theta, Sigma)``, scales 0.1 to 10 in a
  random rotation, prior ``N(0, 10^2 I)``), delta = 0.1 / n;

substitute-one neighbours, three figures side by side:

- ``defaults``: ``pymc_penalty.sample(epsilon, delta)`` with every other argument at its
  default on this checkout (the plan, the clip, the warm start; only ``cores=1``,
  ``progressbar=False``, the seed and the model are passed);
- ``oracle``: a penalty random walk (NumPy, here) that knows the posterior: it starts every
  chain at one exact posterior draw (a chain that cannot move keeps about 1 sd of error;
  independent exact starts would let four frozen chains show 0.5 sd), proposes ``theta + L w``
  (``L`` the posterior covariance's Cholesky factor, ``w`` a random direction of fixed whitened
  length ``l``), clips each row's log-likelihood ratio at ``c l`` with ``c`` the rows' measured
  whitened-ratio quantile at the fraction ``pymc_penalty.sample``'s clip adaptation aims at
  (``min(0.002, 0.06 / sqrt(n))``), and takes ``l`` where the noise sd is 2 (the forecast's
  optimum), at most 2.38; it makes the same releases as the defaults' plan (``chains x (tune +
  draws)``, all its budget on the log-likelihood releases) and discards its first ``tune`` steps
  per chain, as :mod:`gauss`'s oracle does;
- ``E_max = sigma^2 mu^2 n / (4 k^2 d^2)`` (``../shared/DESIGN.md`` section 6) with sigma = 1,
  ``mu`` the budget's Gaussian-DP ``mu`` and ``k`` from the per-row bound ``c_w = k sqrt(d / n)``
  with ``c_w = q / sqrt(n)``, ``q`` the likelihood family's whitened-ratio quantile at the same
  fraction (:func:`pymc_penalty.planning.forecast.row_quantile`), so ``k = q / sqrt(d)``;
  shown as the error it allows, ``1 / sqrt(E_max)`` (a loose ceiling: no acceptance loss,
  one effective sample per ``d`` of squared distance); and the forecast's error for the
  defaults' plan (:func:`pymc_penalty.forecast_utility` with the likelihood's family).

Metrics (as :func:`gauss.metrics`): ``mean_err_sd``, the RMS over coordinates of
``(mean - reference mean) / reference sd``; ``sd_ratio``, the geometric mean over coordinates
of ``sd / reference sd``. References: the exact posterior (gauss); for logistic, importance
sampling from the Laplace approximation with antithetic pairs (its own error is a small
fraction of a posterior sd's hundredth). Target (issue 13): the defaults within 1.5 times the
oracle's error wherever the oracle reaches 0.5 sd or less ("met" / "not met" per cell; "n/a"
where the oracle does not reach 0.5 sd).

Run ``python benchmarks/utility_table.py [--quick] [--jobs N] [--cells SPEC ...] [--merge LOG
...] [--write-docs]``. A cell spec is ``workload:n:epsilon`` with ``*`` for any
(``gauss:1e5:*``). ``--jobs N`` runs cells in N processes, each single-threaded; ``--merge``
adds the cells of earlier runs' printed output (their RESULT lines) without rerunning them.
``--write-docs`` writes ``docs/benchmarks/utility-table.md`` and ``.png`` (the cells not run are
listed). The last line printed is ``RESULT {"cells": {"<workload>:<n>:<epsilon>": {...}},
...}``."""

from __future__ import annotations

import os

# One thread per process (before NumPy is imported): --jobs parallelises over cells.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import datetime  # noqa: E402
import fnmatch  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import multiprocessing  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gauss as gauss_bench  # noqa: E402
import utility as utility_bench  # noqa: E402
from _common import (  # noqa: E402
    REPO_ROOT,
    command_line,
    logistic_model,
    make_logistic_data,
    rms_over_seeds,
)  # noqa: E402

WORKLOADS = ("logistic", "gauss")
SIZES = (10_000, 100_000, 1_000_000)
EPSILONS = (0.5, 1.0, 2.0, 6.0)
QUICK_SIZES = (2_000,)
QUICK_EPSILONS = (6.0,)
TARGET_FACTOR = 1.5
ORACLE_REACH = 0.5
ORACLE_NOISE_SD = 2.0
LONGEST_STEP = 2.38
DOCS = os.path.join(REPO_ROOT, "docs", "benchmarks")


@dataclass(frozen=True)
class Plan:
    """Steps per chain and chains: the defaults' plan (the oracle makes the same releases)."""

    draws: int
    tune: int  # AUTO_TUNE: pp.sample's tune="auto", resolved per cell by the defaults' run
    chains: int  # AUTO_TUNE too: pp.sample's chains="auto", resolved per cell likewise

    @classmethod
    def defaults(cls) -> Plan:
        """``pymc_penalty.sample``'s own defaults, read from its signature."""
        import pymc_penalty as pp

        params = inspect.signature(pp.sample).parameters
        tune, chains = params["tune"].default, params["chains"].default
        tune = AUTO_TUNE if tune == "auto" else int(tune)
        chains = AUTO_TUNE if chains == "auto" else int(chains)
        return cls(int(params["draws"].default), tune, chains)


#: ``Plan.tune`` for ``pp.sample``'s ``tune="auto"`` (and ``Plan.chains`` for ``chains="auto"``):
#: the tuning steps and chains the defaults chose in a cell (its report's ``dp_tune``, its
#: posterior's chains) are then the oracle's too, so both make the same releases.
AUTO_TUNE = -1


QUICK_PLAN = Plan(draws=150, tune=150, chains=2)


@dataclass(frozen=True)
class Cell:
    workload: str
    n: int
    epsilon: float

    @property
    def key(self) -> str:
        return f"{self.workload}:{_n_label(self.n)}:{self.epsilon:g}"


def _n_label(n: int) -> str:
    """``1e4`` for 10000 (a power-of-ten label)."""
    return f"{n:.0e}".replace("e+0", "e").replace("e+", "e")


@dataclass
class Problem:
    """A workload at one n: its model, per-row log-likelihood and reference posterior."""

    workload: str
    n: int
    d: int
    delta: float
    family: str
    post_mean: np.ndarray
    post_cov: np.ndarray
    data: object

    @property
    def post_sd(self) -> np.ndarray:
        return np.sqrt(np.diag(self.post_cov))

    def model(self):
        """The PyMC model the defaults run on."""
        import pymc as pm

        if self.workload == "logistic":
            return logistic_model(self.data)
        g = self.data
        with pm.Model() as model:
            th = pm.Normal("th", 0.0, 10.0, shape=self.d)
            pm.MvNormal("x", mu=th, cov=g.cov, observed=g.X)
        return model

    def loglik(self, theta: np.ndarray) -> np.ndarray:
        """Per-row log-likelihood at each row of ``theta`` (k, d), shape (n, k), up to a
        per-row constant (it cancels in the ratios)."""
        if self.workload == "logistic":
            eta = self.data.X @ theta.T
            return self.data.y[:, None] * eta - np.logaddexp(0.0, eta)
        a = theta @ self._prec
        return self.data.X @ a.T - 0.5 * np.sum(theta * a, axis=1)

    def log_prior(self, theta: np.ndarray) -> np.ndarray:
        scale2 = 1.0 if self.workload == "logistic" else 100.0
        return -0.5 * np.sum(theta**2, axis=1) / scale2

    @property
    def _prec(self) -> np.ndarray:
        return np.linalg.inv(self.data.cov)


def _logistic_reference(
    data, pairs: int = 1000, seed: int = 3, prior_sd: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and covariance of the logistic model (``data.X``, ``data.y``; prior
    ``N(0, prior_sd^2)`` per coefficient): Newton's mode and Hessian, then self-normalised
    importance sampling from that Gaussian with antithetic pairs (the linear part of the error
    cancels in each pair)."""
    from scipy.special import expit

    X, y = data.X, data.y.astype(float)
    d = X.shape[1]
    beta = np.zeros(d)
    for _ in range(50):
        p = expit(X @ beta)
        hess = (X * (p * (1 - p))[:, None]).T @ X + np.eye(d) / prior_sd**2
        step = np.linalg.solve(hess, X.T @ (y - p) - beta / prior_sd**2)
        beta += step
        if np.max(np.abs(step)) < 1e-12:
            break
    p = expit(X @ beta)
    cov = np.linalg.inv((X * (p * (1 - p))[:, None]).T @ X + np.eye(d) / prior_sd**2)
    chol = np.linalg.cholesky(cov)
    z = np.random.default_rng(seed).normal(size=(pairs, d))
    draws = beta + np.concatenate([z, -z]) @ chol.T
    log_w = np.empty(len(draws))
    for i in range(0, len(draws), 16):
        th = draws[i : i + 16]
        eta = X @ th.T
        log_lik = y @ eta - np.logaddexp(0.0, eta).sum(axis=0)
        log_post = log_lik - 0.5 * np.sum(th**2, axis=1) / prior_sd**2
        zz = np.linalg.solve(chol, (th - beta).T)
        log_w[i : i + 16] = log_post + 0.5 * np.sum(zz**2, axis=0)
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    mean = w @ draws
    centred = draws - mean
    return mean, (centred * w[:, None]).T @ centred


def make_problem(workload: str, n: int) -> Problem:
    """The workload's data (from its benchmark's fixed seed) and reference posterior."""
    if workload == "logistic":
        data = make_logistic_data(n, utility_bench.D, seed=utility_bench.DATA_SEED, x_bound=1.0)
        mean, cov = _logistic_reference(data)
        return Problem(workload, n, utility_bench.D, 1.0 / n, "bernoulli", mean, cov, data)
    if workload == "gauss":
        g = gauss_bench.make_gauss(n, 10)
        return Problem(workload, n, 10, 0.1 / n, "gaussian", g.post_mean, g.post_cov, g)
    raise ValueError(f"unknown workload {workload!r}")


def run_defaults(prob: Problem, plan: Plan, epsilon: float, seed: int, quick: bool) -> dict:
    """``pymc_penalty.sample(epsilon, delta)``, everything else at its default."""
    import pymc_penalty as pp

    model = prob.model()
    sized = asdict(plan) if quick else {}  # quick mode: a short plan, for CI
    t0 = time.perf_counter()
    idata = pp.sample(
        epsilon=epsilon,
        delta=prob.delta,
        model=model,
        random_seed=seed,
        cores=1,
        progressbar=False,
        **sized,
    )
    wall = time.perf_counter() - t0
    spent = float(idata.attrs["dp_epsilon"])
    if spent > epsilon * (1 + 1e-9):
        raise RuntimeError(f"spent epsilon {spent} > {epsilon}")
    name = next(iter(idata.posterior.data_vars))
    out = gauss_bench.metrics(idata.posterior[name].values.reshape(-1, prob.d), prob)
    stats = idata.sample_stats
    out.update(
        epsilon_spent=round(spent, 4),
        r_hat_max=round(float(idata.attrs.get("dp_r_hat_max", math.nan)), 3),
        accept=round(float(np.mean(stats["accepted"].values)), 3),
        noise_sd=round(float(np.median(stats["dp_noise_sd"].values)), 3),
        forecast_ess=round(float(idata.attrs.get("dp_forecast_ess", math.nan)), 3),
        tune=int(idata.attrs.get("dp_tune", plan.tune)),
        chains=int(idata.posterior.sizes["chain"]),
        warm_start_share=float(idata.attrs.get("dp_warm_start_share", 0.0)),
        wall_s=round(wall, 1),
    )
    return out


def run_oracle(prob: Problem, plan: Plan, epsilon: float, seed: int) -> dict:
    """The oracle-tuned penalty random walk (see the module notes), all chains at once."""
    import pymc_penalty as pp
    from pymc_penalty.sampling.adaptation import clip_target_fraction

    d, chains = prob.d, plan.chains
    rng = np.random.default_rng([seed, 77])
    releases = chains * (plan.tune + plan.draws)
    mu_step = pp.gdp_mu(epsilon, prob.delta) / math.sqrt(releases)
    chol = np.linalg.cholesky(prob.post_cov)
    fraction = clip_target_fraction(prob.n)
    ll_mean = prob.loglik(prob.post_mean[None, :])[:, 0]

    def row_constant(length: float) -> float:
        """Quantile of |r_i| / |w| over 20 moves of whitened length ``length`` from the mean."""
        u = rng.normal(size=(20, d))
        w = length * u / np.linalg.norm(u, axis=1, keepdims=True)
        ratios = prob.loglik(prob.post_mean + w @ chol.T) - ll_mean[:, None]
        return float(np.quantile(np.abs(ratios) / length, 1.0 - fraction))

    c = row_constant(0.1)
    for _ in range(2):  # the step depends on c and c (a little) on the step
        length = min(LONGEST_STEP, ORACLE_NOISE_SD * mu_step / (2.0 * c))
        c = row_constant(length)
    length = min(LONGEST_STEP, ORACLE_NOISE_SD * mu_step / (2.0 * c))
    bound = c * length
    sigma = 2.0 * bound / mu_step
    start = prob.post_mean + chol @ rng.normal(size=d)  # one exact draw, shared
    theta = np.repeat(start[None, :], chains, axis=0)
    ll = prob.loglik(theta)
    lp = prob.log_prior(theta)
    kept, accepted, clipped = [], 0, 0
    for t in range(plan.tune + plan.draws):
        u = rng.normal(size=(chains, d))
        prop = theta + (length * u / np.linalg.norm(u, axis=1, keepdims=True)) @ chol.T
        ll_prop = prob.loglik(prop)
        ratio = ll_prop - ll
        clipped += int(np.count_nonzero(np.abs(ratio) > bound))
        d_hat = np.clip(ratio, -bound, bound).sum(axis=0) + sigma * rng.normal(size=chains)
        lp_prop = prob.log_prior(prop)
        accept = np.log(rng.uniform(size=chains)) < d_hat - 0.5 * sigma**2 + lp_prop - lp
        theta = np.where(accept[:, None], prop, theta)
        ll = np.where(accept[None, :], ll_prop, ll)
        lp = np.where(accept, lp_prop, lp)
        if t >= plan.tune:
            kept.append(theta.copy())
            accepted += int(accept.sum())
    out = gauss_bench.metrics(np.concatenate(kept), prob)
    out.update(
        accept=round(accepted / (chains * plan.draws), 3),
        noise_sd=round(sigma, 3),
        whitened_step=round(length, 4),
        clip=round(c, 6),
        clipped_fraction=float(f"{clipped / (prob.n * releases):.3g}"),
    )
    return out


def limits(prob: Problem, plan: Plan, epsilon: float) -> dict:
    """E_max (DESIGN section 6) and the forecast for the defaults' plan: public quantities."""
    import pymc_penalty as pp
    from pymc_penalty.planning.forecast import row_quantile
    from pymc_penalty.sampling.adaptation import clip_target_fraction

    mu = pp.gdp_mu(epsilon, prob.delta)
    # c_w = q / sqrt(n) = k sqrt(d / n): DESIGN's k is the per-row quantile over sqrt(d).
    k = row_quantile(prob.family, clip_target_fraction(prob.n)) / math.sqrt(prob.d)
    e_max = mu**2 * prob.n / (4.0 * k**2 * prob.d**2)
    forecast = pp.forecast_utility(
        epsilon, prob.delta, n=prob.n, d=prob.d, likelihood=prob.family, **asdict(plan)
    )
    return {
        "mu": round(mu, 5),
        "k": round(k, 4),
        "e_max": float(f"{e_max:.4g}"),
        "e_max_err_sd": round(1.0 / math.sqrt(e_max), 4),
        "forecast_ess": float(f"{forecast.ess:.4g}"),
        "forecast_err_sd": round(forecast.rms_error_sd, 4),
    }


def _chains_text(chains: int) -> str:
    """The plan's chains as the docs page states them."""
    return '`chains="auto"` (per cell: the `chains` column)' if chains == AUTO_TUNE else str(chains)


def _tune_text(tune: int) -> str:
    """The plan's tuning steps as the docs say them."""
    return '`tune="auto"` (per cell: the `tune` column)' if tune == AUTO_TUNE else str(tune)


def verdict(defaults_err: float, oracle_err: float) -> str:
    """The target: defaults within 1.5x of the oracle wherever the oracle reaches 0.5 sd."""
    if not oracle_err <= ORACLE_REACH:
        return "n/a"
    return "met" if defaults_err <= TARGET_FACTOR * oracle_err else "not met"


def over_seeds(runs: list[dict]) -> dict:
    """One chain kind's figures over seeds: ``mean_err_sd`` is the RMS over seeds of each run's
    error (``mean_err_sd_se``: its standard error, from the mean square's, propagated);
    ``sd_ratio`` the geometric mean; the other numbers the median; ``per_seed`` each run's
    error. One run is returned as it is."""
    if len(runs) == 1:
        return runs[0]
    rms, se = rms_over_seeds([r["mean_err_sd"] for r in runs])
    out = {
        key: float(np.median([r[key] for r in runs]))
        for key, value in runs[0].items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }
    out.update(
        mean_err_sd=round(rms, 4),
        mean_err_sd_se=round(se, 4),
        sd_ratio=round(float(np.exp(np.mean(np.log([r["sd_ratio"] for r in runs])))), 4),
        per_seed=[r["mean_err_sd"] for r in runs],
    )
    for key in ("tune", "chains"):
        if key in runs[0]:
            out[key] = int(runs[0][key])
    return out


def _resolved(plan: Plan, defaults: dict) -> Plan:
    """``plan`` with its ``"auto"`` tuning and chains as the defaults' run chose them."""
    tune = defaults["tune"] if plan.tune == AUTO_TUNE else plan.tune
    chains = defaults["chains"] if plan.chains == AUTO_TUNE else plan.chains
    return Plan(plan.draws, tune, chains)


def run_cell(args: tuple[Cell, Plan, list[int], bool]) -> tuple[str, dict]:
    """One cell over ``seeds``: the reference, the oracle, the defaults and the limits."""
    cell, plan, seeds, quick = args
    utility_bench._quiet()
    t0 = time.perf_counter()
    prob = make_problem(cell.workload, cell.n)
    runs_d, runs_o = [], []
    for seed in seeds:
        defaults = run_defaults(prob, plan, cell.epsilon, seed, quick)
        # With tune="auto" the oracle makes the releases the defaults made (the rule reads
        # public quantities only, so every seed resolves it alike).
        seed_plan = _resolved(plan, defaults)
        runs_d.append(defaults)
        runs_o.append(run_oracle(prob, seed_plan, cell.epsilon, seed))
    plan = _resolved(plan, runs_d[0])
    defaults, oracle = over_seeds(runs_d), over_seeds(runs_o)
    row = {
        "seeds": list(seeds),
        "workload": cell.workload,
        "n": cell.n,
        "epsilon": cell.epsilon,
        "delta": prob.delta,
        "d": prob.d,
        "defaults": defaults,
        "oracle": oracle,
        **limits(prob, plan, cell.epsilon),
        "target": verdict(defaults["mean_err_sd"], oracle["mean_err_sd"]),
        "wall_s": round(time.perf_counter() - t0, 1),
        "load": round(os.getloadavg()[0], 2),
    }
    return cell.key, row


def all_cells(quick: bool) -> list[Cell]:
    sizes, epsilons = (QUICK_SIZES, QUICK_EPSILONS) if quick else (SIZES, EPSILONS)
    return [Cell(w, n, e) for w in WORKLOADS for n in sizes for e in epsilons]


def select(cells: list[Cell], specs: list[str] | None) -> list[Cell]:
    """The cells matching any spec ``workload:n:epsilon`` (``*`` for any field)."""
    if not specs:
        return cells
    chosen = []
    for spec in specs:
        parts = spec.split(":")
        if len(parts) != 3:
            raise SystemExit(f"--cells: {spec!r} is not workload:n:epsilon")
        w, n, e = parts
        hits = [
            c
            for c in cells
            if fnmatch.fnmatch(c.workload, w)
            and (n == "*" or float(n) == c.n)
            and (e == "*" or float(e) == c.epsilon)
        ]
        if not hits:
            raise SystemExit(f"--cells: {spec!r} matches no cell of the grid")
        chosen += [c for c in hits if c not in chosen]
    return chosen


def merge_results(paths: list[str], plan: Plan, commands: list[str]) -> dict[str, dict]:
    """The cells of earlier runs' outputs, checked to share ``plan``: a file's last RESULT line,
    or, from a run stopped before it printed one (a time limit), the cells it printed one by
    one (``<key>: {json}``) and the plan of its first line; their commands are appended to
    ``commands``."""
    merged: dict[str, dict] = {}
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            text = fh.read().splitlines()
        lines = [line for line in text if line.startswith("RESULT ")]
        if lines:
            result = json.loads(lines[-1][len("RESULT ") :])
        else:
            result = _partial_result(text, path)
        ran = dict(result["plan"])
        if plan.chains == AUTO_TUNE and ran.get("chains") != AUTO_TUNE:
            # A run from before chains="auto": its chains go into each of its rows.
            for row in result["cells"].values():
                row["defaults"].setdefault("chains", ran["chains"])
            ran["chains"] = AUTO_TUNE
        if ran != asdict(plan):
            raise SystemExit(f"--merge: {path} ran plan {result['plan']}, not {asdict(plan)}")
        merged.update(result["cells"])
        commands += [c for c in result.get("commands", []) if c not in commands]
    return merged


def _partial_result(lines: list[str], path: str) -> dict:
    """What a run stopped before its RESULT line printed: its plan and finished cells."""
    import ast

    head = [line for line in lines if line.startswith("utility table: ")]
    if not head or " plan " not in head[0]:
        raise SystemExit(f"--merge: no RESULT line and no run header in {path}")
    plan_text = head[0].split(" plan ", 1)[1].rsplit(", ", 1)[0]
    cells = {}
    for line in lines:
        key, sep, rest = line.partition(": ")
        if sep and key.count(":") == 2 and rest.startswith("{"):
            cells[key] = json.loads(rest)
    return {"plan": ast.literal_eval(plan_text), "cells": cells}


def _error_text(runs: dict) -> str:
    """An error, with its standard error over seeds where there were several."""
    if "mean_err_sd_se" in runs:
        return f"{runs['mean_err_sd']:.3g} +- {runs['mean_err_sd_se']:.2g}"
    return f"{runs['mean_err_sd']:.3g}"


def table(rows: dict[str, dict]) -> str:
    """Markdown table of the cells run."""
    lines = [
        "| workload | n | epsilon | seeds | defaults error (sd) | defaults sd ratio "
        "| defaults R-hat | tune | chains | oracle error (sd) | oracle sd ratio "
        "| 1/sqrt(E_max) | forecast error | target |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows.values():
        df, orc = r["defaults"], r["oracle"]
        lines.append(
            f"| {r['workload']} | {_n_label(r['n'])} | {r['epsilon']:g} "
            f"| {len(r.get('seeds', [1]))} | {_error_text(df)} "
            f"| {df['sd_ratio']:.3g} | {df.get('r_hat_max', math.nan):.3g} "
            f"| {df.get('tune', '')} | {df.get('chains', '')} | {_error_text(orc)} "
            f"| {orc['sd_ratio']:.3g} "
            f"| {r['e_max_err_sd']:.3g} | {r['forecast_err_sd']:.3g} | {r['target']} |"
        )
    return "\n".join(lines)


def plot(rows: dict[str, dict], path: str) -> None:
    """Error against epsilon per workload: defaults, oracle and 1/sqrt(E_max), one colour per n."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fig, axes = plt.subplots(1, len(WORKLOADS), figsize=(11, 4), squeeze=False)
    for ax, workload in zip(axes[0], WORKLOADS, strict=True):
        mine = [r for r in rows.values() if r["workload"] == workload]
        for i, n in enumerate(sorted({r["n"] for r in mine})):
            rs = sorted((r for r in mine if r["n"] == n), key=lambda r: r["epsilon"])
            eps = [r["epsilon"] for r in rs]
            for name, style, values in (
                ("defaults", "o-", [r["defaults"]["mean_err_sd"] for r in rs]),
                ("oracle", "s--", [r["oracle"]["mean_err_sd"] for r in rs]),
                ("1/sqrt(E_max)", ":", [r["e_max_err_sd"] for r in rs]),
            ):
                label = f"{name}, n = {_n_label(n)}"
                ax.plot(eps, values, style, color=f"C{i}", label=label)
        ax.axhline(ORACLE_REACH, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ticks = sorted({r["epsilon"] for r in mine}) or list(EPSILONS)
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{e:g}" for e in ticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("epsilon")
        ax.set_ylabel("RMS posterior-mean error (posterior sd)")
        ax.set_title(workload)
        if mine:
            ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_docs(out: dict, png: str) -> None:
    """Write ``docs/benchmarks/utility-table.md`` beside the plot."""
    rows, plan = out["cells"], out["plan"]
    not_run = out["not_run"]
    met = [k for k, r in rows.items() if r["target"] == "met"]
    missed = [k for k, r in rows.items() if r["target"] == "not met"]
    text = f"""# Utility table: the defaults against an oracle-tuned chain

Commands (each ran the cells it names; `--merge` of their outputs with `--write-docs` wrote
this page): {"; ".join(f"`{c}`" for c in out["commands"]) or "none recorded"}. Written
{datetime.date.today().isoformat()} from runs on {out["machine"]} (load average per cell in the
RESULT line). With one seed (the `seeds` column) a cell's error is one draw of a quantity
whose sd is about half its size (the oracle over 8 seeds at logistic n = 1e4, epsilon = 6
measured 0.11-0.53 sd); with several, the error is the RMS over seeds (the privacy noise is
fresh each run), +- its standard error, for the defaults and the oracle alike, and the target
compares those.

What is compared, per cell (workload, n, epsilon), substitute-one neighbours: `defaults` is
`pymc_penalty.sample(epsilon, delta)` with every other argument at its default (the plan:
{_chains_text(plan["chains"])} chains x ({_tune_text(plan["tune"])} tuning + {plan["draws"]}
draws));
`oracle` is a
penalty random walk that knows the posterior covariance and the rows' ratio quantiles, making
the same releases (see `benchmarks/utility_table.py`); `1/sqrt(E_max)` is the error the budget's
distance allows at best, `E_max = mu^2 n / (4 k^2 d^2)` (DESIGN section 6, sigma = 1, `k = q /
sqrt(d)` with `q` the likelihood family's per-row whitened bound at the clipped fraction the
defaults aim at; a loose ceiling); `forecast error` is `pymc_penalty.forecast_utility`'s for the
defaults' plan and the likelihood's family. Errors: RMS over coordinates of (mean - reference
mean) / reference sd; sd ratio: geometric mean over coordinates of sd / reference sd. Workloads:
logistic (`benchmarks/utility.py`'s model, d = 5, with covariates uniform in the unit ball,
`||x|| <= 1`, delta = 1/n; reference by importance sampling from the Laplace approximation)
and gauss (`benchmarks/gauss.py`: d = 10, anisotropic, delta = 0.1/n; exact reference).

Target (issue 13): the defaults within {TARGET_FACTOR}x of the oracle's error where the oracle
reaches <= {ORACLE_REACH} sd. Met in {len(met)} of the cells run, not met in {len(missed)}
(n/a where the oracle does not reach {ORACLE_REACH} sd).

{table(rows)}

![error against epsilon]({os.path.basename(png)})

Cells not run here: {", ".join(not_run) if not_run else "none"}.
"""
    with open(os.path.join(DOCS, "utility-table.md"), "w") as fh:
        fh.write(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="n = 2000, eps 6, a short plan")
    parser.add_argument("--cells", nargs="+", help="subset: workload:n:epsilon, * for any")
    parser.add_argument("--jobs", type=int, default=1, help="processes (one thread each)")
    parser.add_argument("--seed", type=int, default=1, help="the first seed")
    parser.add_argument(
        "--seeds",
        type=int,
        default=None,
        help="seeds per cell (seed, seed + 1, ...), errors RMS over them (1; --quick: 2)",
    )
    parser.add_argument("--write-docs", action="store_true", help="docs/benchmarks/utility-table")
    parser.add_argument(
        "--merge",
        nargs="+",
        default=[],
        metavar="LOG",
        help="outputs of earlier runs (same plan): their RESULT cells join the table, not rerun",
    )
    args = parser.parse_args(argv)
    utility_bench._quiet()
    grid = all_cells(args.quick)
    cells = select(grid, args.cells) if args.cells or not args.merge else []
    plan = QUICK_PLAN if args.quick else Plan.defaults()
    commands: list[str] = []
    merged = merge_results(args.merge, plan, commands)
    cells = [c for c in cells if c.key not in merged]
    if cells:  # this run's own cells, reproducible without the merged files
        own = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--write-docs"]
        if args.merge:
            at = own.index("--merge")
            own = own[:at] + own[at + 1 + len(args.merge) :]
        commands.append(command_line(__file__, own))
    print(
        f"utility table: {len(cells)} of {len(grid)} cells, plan {asdict(plan)}, "
        f"{args.jobs} job(s)",
        flush=True,
    )
    # Longest first (largest n), so that a pool finishes together.
    count = args.seeds if args.seeds is not None else (2 if args.quick else 1)
    seeds = list(range(args.seed, args.seed + max(1, count)))
    work = [(c, plan, seeds, args.quick) for c in sorted(cells, key=lambda c: -c.n)]
    done: dict[str, dict] = {}
    if args.jobs > 1:
        with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
            for key, row in pool.imap_unordered(run_cell, work):
                done[key] = row
                print(f"{key}: {json.dumps(row)}", flush=True)
    else:
        for item in work:
            key, row = run_cell(item)
            done[key] = row
            print(f"{key}: {json.dumps(row)}", flush=True)
    done.update(merged)
    rows = {c.key: done[c.key] for c in grid if c.key in done}
    from _common import machine_info

    info = machine_info()
    out = {
        "cells": rows,
        "plan": asdict(plan),
        "not_run": [c.key for c in grid if c.key not in rows],
        "machine": f"{info['cpu']} ({info['cpu_count']} cores)",
        "commands": commands,
    }
    print()
    print(table(rows))
    if args.write_docs and not args.quick:
        png = os.path.join(DOCS, "utility-table.png")
        plot(rows, png)
        write_docs(out, png)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            plot(rows, os.path.join(tmp, "utility-table.png"))
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("RESULT " + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
