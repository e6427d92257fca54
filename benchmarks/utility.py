"""Privacy-utility benchmark: the penalty algorithm and DP-SGLD against a non-private posterior.

Model: Bayesian logistic regression, ``beta ~ N(0, 1)`` with d = 5 coefficients,
``y ~ Bernoulli(logit_p=X @ beta)``, synthetic data with known coefficients from a fixed seed
(:func:`_common.make_logistic_data`), n = 1e5 (1e4 in ``--quick``).

Reference: one long non-private NUTS run (``pm.sample``, seeded), computed once per run.

Methods, each at every ``epsilon`` with ``delta = 1/n``, substitute-one neighbours:

- ``penalty``: :func:`pymc_penalty.sample` (the user path). The model's initial point
  (``beta = 0``, data-independent) starts a private warm start that spends a declared share
  of the budget (``warm_start``); the chains start at its (private) estimate with its
  covariance estimate as proposal shape, and spend the rest. The privacy report's epsilon
  covers both and is checked against the budget.
- ``dp_sgld``: full-batch DP Langevin dynamics (:mod:`_dpsgld`) from ``beta = 0``, accounted
  by ``dp-accounting``'s PLD accountant.

Metrics per method and epsilon, over ``repeats`` independent runs (fresh privacy noise and
seeds): ``mean_err_sd``, the root-mean-square over coordinates and repeats of
``(mean - reference mean) / reference sd``; ``sd_ratio``, the geometric mean over
coordinates (and repeats) of ``sd / reference sd``; ``mmd``, the Gaussian-kernel maximum
mean discrepancy between the draws and the reference, both standardised by the reference
mean and sd, bandwidth the median pairwise distance of the standardised reference
(``MMD = sqrt`` of the biased estimate on at most 500 draws of each), averaged over repeats.
Target (issue 6) at epsilon = 1: ``mean_err_sd <= 0.3`` and ``0.8 <= sd_ratio <= 1.25``.

Run ``python benchmarks/utility.py [--quick]``. Full mode writes
``docs/benchmarks/utility.md`` and ``docs/benchmarks/utility.png``. The last line printed is
``RESULT {"penalty": {"<epsilon>": {"mean_err_sd": ..., "sd_ratio": ..., "mmd": ...}},
"dp_sgld": {...}}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
import time
import warnings
from dataclasses import dataclass, replace

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import LogisticData, logistic_model, make_logistic_data  # noqa: E402
from _dpsgld import run_dpsgld  # noqa: E402

D = 5
DATA_SEED = 20240521
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = {"epsilon": 1.0, "mean_err_sd": 0.3, "sd_ratio": (0.8, 1.25)}


@dataclass(frozen=True)
class Settings:
    """What one mode runs.

    Attributes
    ----------
    n : int
        Datapoints.
    epsilons : tuple of float
    repeats : int
    chains, tune, draws : int
        Penalty chains and steps per chain (every step is a release).
    warm_start : float
        Share of the budget's ``mu^2`` for the private warm start.
    clip, clip_mode, warm_start_clip : float, str, float or None
        Penalty clip, its mode and the warm-start gradient clip passed to
        ``pymc_penalty.sample``; ``None`` leaves its default (``clip="auto"``,
        ``clip_mode="metric"``, ``warm_start_clip="auto"``).
    step_kwargs : dict
        :class:`PenaltyMetropolis` settings passed through ``pymc_penalty.sample``.
    sgld_clip : float
        DP-SGLD per-example gradient clip.
    sgld_max_steps : int
    ref_chains, ref_draws, ref_tune : int
        Reference NUTS run.
    """

    n: int
    epsilons: tuple[float, ...]
    repeats: int
    chains: int | None  # None: pp.sample's default (also tune, draws, warm_start)
    tune: int | None
    draws: int | None
    warm_start: float | None
    clip: float | None
    clip_mode: str | None
    warm_start_clip: float | None
    step_kwargs: dict
    sgld_clip: float
    sgld_max_steps: int
    ref_chains: int
    ref_draws: int
    ref_tune: int


# Guided walk (one coordinate per step, persistent direction) at a high acceptance target,
# keeping the warm start's covariance: with strong privacy noise the optimal step is small,
# and a guided walk's progress grows with the step length, a random walk's with its square.
STEP_KWARGS = {"proposal": "guided", "target_accept": 0.5, "adapt": "scaling"}

FULL = Settings(
    n=100_000,
    epsilons=(0.5, 1.0, 2.0, 4.0, 6.0, 8.0),
    repeats=5,
    chains=2,
    tune=300,
    draws=1700,
    warm_start=0.2,
    # pp.sample's clip defaults were measured worse here (issue 13: mean error 2.48 sd at
    # epsilon = 1 against 0.58 for these; see docs/benchmarks.md): kept explicit until the
    # warm start's automatic clip stops biasing logistic scores. --defaults runs the defaults.
    clip=3.0,
    clip_mode="distance",
    warm_start_clip=None,
    step_kwargs=STEP_KWARGS,
    sgld_clip=4.5,
    sgld_max_steps=2500,
    ref_chains=4,
    ref_draws=1500,
    ref_tune=700,
)
SETTINGS = {
    "full": FULL,
    "quick": replace(
        FULL,
        n=10_000,
        epsilons=(1.0, 4.0),
        repeats=1,
        tune=200,
        draws=700,
        sgld_max_steps=1500,
        ref_chains=2,
        ref_draws=500,
        ref_tune=500,
    ),
}


def _quiet() -> None:
    import pymc  # noqa: F401 - importing sets PyMC's logger level; override it after

    warnings.filterwarnings("ignore", message="PyTensor could not link to a BLAS")
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    logging.getLogger("pymc").setLevel(logging.ERROR)
    logging.getLogger("pymc.penalty").setLevel(logging.WARNING)


def reference_draws(data: LogisticData, s: Settings, seed: int = 1) -> np.ndarray:
    """Non-private NUTS draws of the posterior, shape (draws, d)."""
    import pymc as pm

    model = logistic_model(data)
    with model:
        idata = pm.sample(
            draws=s.ref_draws,
            tune=s.ref_tune,
            chains=s.ref_chains,
            cores=min(s.ref_chains, os.cpu_count() or 1),
            random_seed=seed,
            progressbar=False,
            compute_convergence_checks=False,
        )
    return idata.posterior["beta"].values.reshape(-1, data.d)


def penalty_draws(data: LogisticData, s: Settings, epsilon: float, seed: int) -> tuple:
    """Draws from :func:`pymc_penalty.sample` and the report's spent epsilon."""
    import pymc_penalty as pp

    model = logistic_model(data)
    explicit = {
        k: v
        for k, v in (
            ("clip", s.clip),
            ("clip_mode", s.clip_mode),
            ("warm_start_clip", s.warm_start_clip),
            ("draws", s.draws),
            ("tune", s.tune),
            ("chains", s.chains),
            ("warm_start", s.warm_start),
        )
        if v is not None
    }
    idata = pp.sample(
        epsilon=epsilon,
        delta=1.0 / data.n,
        cores=1,
        neighbours="substitute",
        step_kwargs=dict(s.step_kwargs),
        random_seed=seed,
        progressbar=False,
        compute_convergence_checks=False,
        model=model,
        **explicit,
    )
    draws = idata.posterior["beta"].values.reshape(-1, data.d)
    return draws, float(idata.attrs["dp_epsilon"])


def _sq_dists(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.maximum((a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T, 0.0)


def mmd(x: np.ndarray, ref: np.ndarray, bandwidth: float) -> float:
    """Biased-estimate Gaussian-kernel MMD between two standardised samples (its sqrt)."""
    g = -0.5 / bandwidth**2
    kxx = np.exp(g * _sq_dists(x, x)).mean()
    kyy = np.exp(g * _sq_dists(ref, ref)).mean()
    kxy = np.exp(g * _sq_dists(x, ref)).mean()
    return float(np.sqrt(max(kxx + kyy - 2.0 * kxy, 0.0)))


def _subsample(x: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    return x if x.shape[0] <= k else x[rng.choice(x.shape[0], k, replace=False)]


class Reference:
    """The reference posterior's moments and standardised subsample for the metrics."""

    def __init__(self, draws: np.ndarray, k: int = 500, seed: int = 7) -> None:
        self.mean = draws.mean(0)
        self.sd = draws.std(0, ddof=1)
        rng = np.random.default_rng(seed)
        z = (draws - self.mean) / self.sd
        self.sample = _subsample(z, k, rng)
        self.k = k
        self.bandwidth = float(np.sqrt(np.median(_sq_dists(self.sample, self.sample))))
        # MMD of another reference subsample: the figure a perfect sampler gets here.
        other = _subsample(np.delete(z, np.arange(0, z.shape[0], 2), axis=0), k, rng)
        self.mmd_floor = mmd(other, self.sample, self.bandwidth)

    def metrics(self, runs: list[np.ndarray], seed: int = 11) -> dict[str, float]:
        """``mean_err_sd``, ``sd_ratio`` and ``mmd`` over repeated runs."""
        rng = np.random.default_rng(seed)
        errs = np.array([(r.mean(0) - self.mean) / self.sd for r in runs])
        ratios = np.array([r.std(0, ddof=1) / self.sd for r in runs])
        mmds = [
            mmd(_subsample((r - self.mean) / self.sd, self.k, rng), self.sample, self.bandwidth)
            for r in runs
        ]
        with np.errstate(divide="ignore"):
            log_ratio = np.log(ratios)
        return {
            "mean_err_sd": round(float(np.sqrt(np.mean(errs**2))), 4),
            "sd_ratio": round(float(np.exp(np.mean(log_ratio))), 4),
            "mmd": round(float(np.mean(mmds)), 4),
        }


def budget_split(s: Settings) -> str:
    """How the penalty runs spend their budget (from the settings; in units of ``mu^2``)."""
    if None in (s.chains, s.tune, s.draws, s.warm_start):
        return (
            "pp.sample's defaults: warm_start='auto' (20% of mu^2 unless the forecast is "
            "hopeless), 4 chains x (tune='auto': a third of the draws after a warm start, "
            "+ 1000 draws), unless set: "
            f"chains={s.chains}, tune={s.tune}, draws={s.draws}, warm_start={s.warm_start}"
        )
    releases = s.chains * (s.tune + s.draws)
    return (
        f"{100 * s.warm_start:.0f}% of mu^2 to the private warm start (8 Fisher-scoring steps, "
        f"17 releases: 70% on gradient sums, 30% on curvature, clipped in the released "
        f"Fisher metric); "
        f"{100 * (1 - s.warm_start):.0f}% to {releases} penalty steps ({s.chains} chains x "
        f"({s.tune} tuning + {s.draws} draws)), each step giving 95% to the log-likelihood "
        f"release and 5% to the noisy clipped count"
    )


def run(mode: str | Settings, log=print) -> dict:
    """Run the benchmark; return the per-method, per-epsilon metrics and run facts."""
    s = SETTINGS[mode] if isinstance(mode, str) else mode
    data = make_logistic_data(s.n, D, seed=DATA_SEED)
    t0 = time.perf_counter()
    ref = Reference(reference_draws(data, s))
    log(
        f"reference NUTS: {s.ref_chains} x {s.ref_draws} draws in {time.perf_counter() - t0:.0f}"
        f" s; posterior sd {np.round(ref.sd, 5).tolist()}; MMD floor {ref.mmd_floor:.4f}"
    )
    results: dict[str, dict[str, dict[str, float]]] = {"penalty": {}, "dp_sgld": {}}
    spent: dict[str, dict[str, list[float]]] = {"penalty": {}, "dp_sgld": {}}
    for eps in s.epsilons:
        key = f"{eps:g}"
        runs: dict[str, list[np.ndarray]] = {"penalty": [], "dp_sgld": []}
        spent["penalty"][key], spent["dp_sgld"][key] = [], []
        for rep in range(s.repeats):
            t1 = time.perf_counter()
            draws, eps_spent = penalty_draws(data, s, eps, seed=1000 * rep + 17)
            if eps_spent > eps * (1 + 1e-9):
                raise RuntimeError(f"penalty spent epsilon {eps_spent} > {eps}")
            runs["penalty"].append(draws)
            spent["penalty"][key].append(eps_spent)
            t2 = time.perf_counter()
            sg = run_dpsgld(
                data.X,
                data.y,
                epsilon=eps,
                delta=1.0 / data.n,
                rng=np.random.default_rng([rep, int(1000 * eps)]),
                clip=s.sgld_clip,
                max_steps=s.sgld_max_steps,
            )
            if sg.epsilon > eps * (1 + 1e-9):
                raise RuntimeError(f"DP-SGLD spent epsilon {sg.epsilon} > {eps}")
            runs["dp_sgld"].append(sg.draws)
            spent["dp_sgld"][key].append(sg.epsilon)
            log(
                f"  eps {key:>3} repeat {rep}: penalty {t2 - t1:5.1f} s (eps spent "
                f"{eps_spent:.4f}); dp_sgld {time.perf_counter() - t2:5.1f} s ({sg.steps} "
                f"steps, eta {sg.eta:.3g}, eps spent {sg.epsilon:.4f})"
            )
        for method in results:
            results[method][key] = ref.metrics(runs[method])
        log(f"eps {key}: " + json.dumps({m: results[m][key] for m in results}))
    return {
        "results": results,
        "spent": spent,
        "mmd_floor": round(ref.mmd_floor, 4),
        "ref_sd": ref.sd.tolist(),
        "settings": s,
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def target_met(results: dict) -> dict[str, bool]:
    """Whether each method meets the epsilon = 1 target (None if epsilon 1 was not run)."""
    out = {}
    lo, hi = TARGET["sd_ratio"]
    for method, per_eps in results.items():
        m = per_eps.get(f"{TARGET['epsilon']:g}")
        out[method] = (
            None
            if m is None
            else bool(m["mean_err_sd"] <= TARGET["mean_err_sd"] and lo <= m["sd_ratio"] <= hi)
        )
    return out


def table(results: dict) -> str:
    """Markdown table of the metrics."""
    rows = [
        "| epsilon | penalty mean_err_sd | penalty sd_ratio | penalty MMD "
        "| DP-SGLD mean_err_sd | DP-SGLD sd_ratio | DP-SGLD MMD |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key in results["penalty"]:
        p, g = results["penalty"][key], results["dp_sgld"][key]
        rows.append(
            f"| {key} | {p['mean_err_sd']:.3f} | {p['sd_ratio']:.3f} | {p['mmd']:.3f} "
            f"| {g['mean_err_sd']:.3f} | {g['sd_ratio']:.3f} | {g['mmd']:.3f} |"
        )
    return "\n".join(rows)


def write_docs(out: dict, command: str) -> None:
    """Write ``docs/benchmarks/utility.md`` and ``utility.png`` (full mode only)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    results, s = out["results"], out["settings"]
    eps = [float(k) for k in results["penalty"]]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    labels = {"penalty": "penalty (pymc_penalty.sample)", "dp_sgld": "DP-SGLD (full batch)"}
    for ax, metric in zip(axes, ("mean_err_sd", "sd_ratio", "mmd"), strict=True):
        for method, label in labels.items():
            ax.plot(eps, [results[method][k][metric] for k in results[method]], "o-", label=label)
        ax.set_xscale("log")
        ax.set_xticks(eps)
        ax.set_xticklabels([f"{e:g}" for e in eps])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("epsilon (delta = 1/n)")
        ax.set_title(metric)
    axes[0].axhline(TARGET["mean_err_sd"], color="grey", ls=":", label="target at eps = 1")
    for bound in TARGET["sd_ratio"]:
        axes[1].axhline(bound, color="grey", ls=":")
    axes[2].axhline(out["mmd_floor"], color="grey", ls="--", label="reference vs reference")
    axes[0].set_yscale("log")
    axes[0].set_yticks([0.1, 0.2, 0.3, 0.5, 1.0, 2.0])
    axes[0].yaxis.set_major_formatter(ScalarFormatter())
    axes[0].yaxis.set_minor_formatter(NullFormatter())
    axes[0].legend(fontsize=7)
    axes[2].legend(fontsize=7)
    fig.suptitle(f"Logistic regression, n = {s.n}, d = {D}; {s.repeats} repeats")
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, "docs", "benchmarks", "utility.png"), dpi=110)
    met = target_met(results)
    date = datetime.date.today().isoformat()
    text = f"""# Privacy-utility benchmark

Command: `{command}`. Measured {date} on the 2-core development machine (shared with other
jobs; wall time {out["wall_s"]:.0f} s).

Logistic regression, n = {s.n}, d = {D}, `beta ~ N(0, 1)`, synthetic data with known
coefficients; delta = 1/n, substitute-one neighbours; {s.repeats} repeats per epsilon. All
metrics are against one long non-private NUTS run ({s.ref_chains} x {s.ref_draws} draws).
`mean_err_sd`: root-mean-square over coordinates and repeats of (mean - reference mean) /
reference sd. `sd_ratio`: geometric mean over coordinates and repeats of sd / reference sd.
`MMD`: Gaussian kernel on reference-standardised draws, median-heuristic bandwidth, 500 draws
of each, mean over repeats; two reference subsamples give {out["mmd_floor"]:.3f}.

{table(results)}

![error against epsilon](utility.png)

Target at epsilon = 1 (means within 0.3 posterior sd, sd ratio in [0.8, 1.25]):
penalty {"met" if met["penalty"] else "not met"}; DP-SGLD {"met" if met["dp_sgld"] else "not met"}.

## How the budget is spent

- **penalty** (`pymc_penalty.sample(..., warm_start={s.warm_start},
  step_kwargs={s.step_kwargs})`, clip arguments at their defaults unless shown here:
  clip={s.clip}, clip_mode={s.clip_mode}, warm_start_clip={s.warm_start_clip}):
  {budget_split(s)}. The warm start begins at the model's initial point (beta = 0,
  data-independent); the chains start at its private estimate, with its private covariance
  estimate as proposal shape. The report's epsilon (the ledger's total, warm start included)
  is checked to be within the budget in every run.
- **DP-SGLD** (`benchmarks/_dpsgld.py`): full-batch Langevin from beta = 0, per-example
  gradients clipped to L2 norm {s.sgld_clip:g}, sensitivity 2 x clip (substitute-one), every
  step a Gaussian release accounted by `dp-accounting`'s PLD accountant; the number of steps
  (at most {s.sgld_max_steps}) is chosen so that the privacy noise is no more than
  Langevin's own noise at the step size 0.1 / (0.25 n + 1); the first 25% are burn-in.
"""
    with open(os.path.join(ROOT, "docs", "benchmarks", "utility.md"), "w") as fh:
        fh.write(text)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="n = 1e4, 2 epsilons, 1 repeat")
    parser.add_argument("--epsilons", type=float, nargs="+", help="a subset (no docs written)")
    parser.add_argument("--repeats", type=int, help="fewer repeats (no docs written)")
    parser.add_argument(
        "--defaults",
        action="store_true",
        help="pp.sample's defaults: epsilon and delta only (no step_kwargs, clip, warm start, "
        "chains, tune or draws given)",
    )
    parser.add_argument(
        "--warm-start-clip", type=float, help="the warm start's gradient clip (in its metric)"
    )
    parser.add_argument(
        "--old-clip",
        action="store_true",
        help="clip=3.0, clip_mode='distance' and a warm-start clip of 3.0 (in its metric)",
    )
    args = parser.parse_args(argv)
    _quiet()
    mode = "quick" if args.quick else "full"
    s = SETTINGS[mode]
    if args.defaults:
        s = replace(
            s,
            clip=None,
            clip_mode=None,
            warm_start_clip=None,
            chains=None,
            tune=None,
            draws=None,
            warm_start=None,
            step_kwargs={},
        )
    if args.warm_start_clip is not None:
        s = replace(s, warm_start_clip=args.warm_start_clip)
    if args.old_clip:
        s = replace(s, clip=3.0, clip_mode="distance", warm_start_clip=3.0)
    if args.epsilons:
        s = replace(s, epsilons=tuple(args.epsilons))
    if args.repeats:
        s = replace(s, repeats=args.repeats)
    partial = s != SETTINGS[mode]
    print(f"pymc-penalty utility benchmark ({mode}); logistic regression n = {s.n}, d = {D}")
    print(f"budget split (penalty): {budget_split(s)}", flush=True)
    if partial:
        print(f"settings: {s}")
    out = run(s, log=lambda msg: print(msg, flush=True))
    print()
    print(table(out["results"]))
    print(f"target at epsilon = 1 met: {target_met(out['results'])}")
    print(f"total wall time {out['wall_s']:.1f} s")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if mode == "full" and not partial:
        write_docs(out, "python benchmarks/utility.py")
    print("RESULT " + json.dumps(out["results"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
