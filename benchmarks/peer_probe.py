"""The defaults on peer models: does ``pymc_penalty.sample(epsilon, delta)`` alone give a usable
posterior, or an honest warning, on models our other benchmarks do not use?

The models are ones PyMC tutorials and DP-MCMC papers use (data simulated from a fixed seed;
every row independent given the parameters):

- ``linreg_sigma``: ``y = X b + e``, 3 standardized covariates, ``b ~ N(0, 1)``,
  ``e ~ N(0, 0.5^2)``, ``sigma ~ HalfNormal(1)`` unknown;
- ``heights``: ``y ~ N(170, 10)``, ``mu ~ N(150, 30)``, ``sigma ~ HalfNormal(50)`` (the PyMC
  introduction's idiom);
- ``poisson_reg``: log-link Poisson regression, 3 covariates uniform in the unit ball,
  ``b ~ N(0, 1)``;
- ``random_intercept``: 20 groups, ``y ~ N(a[g] + b x, 1)``, ``a ~ N(0, 1)``, ``b ~ N(0, 1)``
  (conjugate: the reference is exact);
- ``student_t``: robust regression ``y = 1 + 2 x + t_4`` noise, ``nu = 4`` fixed,
  intercept and slope ``~ N(0, 5)``, ``sigma ~ HalfNormal(1)``;
- ``beta_bernoulli``: ``theta ~ Beta(1, 1)``, ``y ~ Bernoulli(theta)``, data at p = 0.3 (the
  penalty paper's own example; conjugate: the reference is exact). Its rows' score
  differences tie (58% of pairs), which discrete data do and the others never;
- ``logistic_raw``: logistic regression on unstandardised covariates (an age ``~ N(45, 12)``,
  a binary group, an intercept), ``b ~ N(0, 10)``, as users fit tabular data (Adult-like).

Per model, ``(n, epsilon)`` and seed it runs the defaults (``delta = 1 / n`` unless
``--delta-scale`` says otherwise; every other argument at its default but ``random_seed``,
``cores=1`` and ``progressbar=False``) and compares with a reference posterior (exact where
conjugate, otherwise non-private NUTS, 4 chains x 2000 draws, computed once per model and n).
Per run it prints, over the posterior's scalar coordinates (constrained space):

- ``err_rms`` / ``err_max``: RMS and max of ``|mean - ref mean| / ref sd``;
- ``sd_ratio``: geometric mean of pooled sd / ref sd; ``within_sd``: the same for the
  chains' own sd (how far a chain travels);
- ``rhat``: the report's largest R-hat, ``verdict`` its convergence verdict;
- ``ws_err``: RMS error of the private warm start's point against the reference mean, in the
  unconstrained space (``ref sd`` units there), ``ws_worst`` its worst coordinate (signed),
  ``ws_clipped`` its last released clipped fraction; ``first_err``: the chains' first draws';
- ``worst``: the worst coordinate of the mean (signed); ``forecast_ess``: the forecast's ESS;
- ``warnings``: the package's warnings (category: first 80 characters), and the wall time;
- ``flagged``: off (``err_max`` > 1 or ``sd_ratio`` outside [0.67, 1.5]) with no warning.

Run ``python benchmarks/peer_probe.py --models heights poisson_reg --seeds 1 2``; ``--kwargs``
adds ``pymc_penalty.sample`` arguments as JSON (``'{"warm_start": 0}'``). The last line
printed is ``RESULT {...}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import capture_warm_start, command_line, rms_over_seeds  # noqa: E402

DATA_SEED = 20261126
MODELS = (
    "linreg_sigma", "heights", "poisson_reg", "random_intercept", "student_t", "beta_bernoulli",
    "logistic_raw",
)  # fmt: skip
GROUPS = 20
#: ``--quick``: one model, a small n, a large epsilon, one seed (well under a minute).
QUICK = {"models": ["heights"], "n": [1000], "epsilon": [6.0], "seeds": [1]}


@dataclass
class Reference:
    """A reference posterior: per scalar coordinate, in the constrained space and in the
    unconstrained one the warm start works in (``log`` of the positive parameters)."""

    names: list[str]
    mean: np.ndarray
    sd: np.ndarray
    u_mean: np.ndarray
    u_sd: np.ndarray
    kind: str
    seconds: float


def _rng(model: str, n: int) -> np.random.Generator:
    return np.random.default_rng([DATA_SEED, MODELS.index(model), n])


def _ball(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d))
    radius = rng.random(n) ** (1.0 / d)
    return x * (radius / np.linalg.norm(x, axis=1))[:, None]


def make_data(model: str, n: int) -> dict[str, np.ndarray]:
    """The synthetic data set of ``model`` with ``n`` rows (depends on both only)."""
    rng = _rng(model, n)
    if model == "linreg_sigma":
        X = rng.standard_normal((n, 3))
        X = (X - X.mean(axis=0)) / X.std(axis=0)
        b = rng.normal(0.0, 1.0, size=3)
        return {"X": X, "y": X @ b + rng.normal(0.0, 0.5, size=n)}
    if model == "heights":
        return {"y": rng.normal(170.0, 10.0, size=n)}
    if model == "poisson_reg":
        X = _ball(rng, n, 3)
        b = rng.normal(0.0, 1.0, size=3)
        return {"X": X, "y": rng.poisson(np.exp(X @ b)).astype(np.int64)}
    if model == "random_intercept":
        g = rng.integers(0, GROUPS, size=n)
        x = rng.standard_normal(n)
        a, b = rng.normal(0.0, 1.0, size=GROUPS), rng.normal()
        return {"g": g, "x": x, "y": a[g] + b * x + rng.standard_normal(n)}
    if model == "student_t":
        x = rng.standard_normal(n)
        return {"x": x, "y": 1.0 + 2.0 * x + rng.standard_t(4.0, size=n)}
    if model == "beta_bernoulli":
        return {"y": (rng.random(n) < 0.3).astype(np.int64)}
    if model == "logistic_raw":
        X = np.column_stack([np.ones(n), rng.normal(45.0, 12.0, n), rng.random(n) < 0.4])
        logit = X @ np.array([-3.0, 0.05, 0.8])
        return {"X": X, "y": (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)}
    raise ValueError(f"unknown model {model!r}")


def build_model(model: str, data: dict[str, np.ndarray]):
    """The PyMC model of ``model`` on ``data``."""
    import pymc as pm

    with pm.Model() as m:
        if model == "linreg_sigma":
            b = pm.Normal("b", 0.0, 1.0, shape=3)
            sigma = pm.HalfNormal("sigma", 1.0)
            pm.Normal("y", data["X"] @ b, sigma, observed=data["y"])
        elif model == "heights":
            mu = pm.Normal("mu", 150.0, 30.0)
            sigma = pm.HalfNormal("sigma", 50.0)
            pm.Normal("y", mu, sigma, observed=data["y"])
        elif model == "poisson_reg":
            b = pm.Normal("b", 0.0, 1.0, shape=3)
            pm.Poisson("y", pm.math.exp(data["X"] @ b), observed=data["y"])
        elif model == "random_intercept":
            a = pm.Normal("a", 0.0, 1.0, shape=GROUPS)
            b = pm.Normal("b", 0.0, 1.0)
            pm.Normal("y", a[data["g"]] + b * data["x"], 1.0, observed=data["y"])
        elif model == "student_t":
            alpha = pm.Normal("alpha", 0.0, 5.0)
            beta = pm.Normal("beta", 0.0, 5.0)
            sigma = pm.HalfNormal("sigma", 1.0)
            pm.StudentT("y", nu=4.0, mu=alpha + beta * data["x"], sigma=sigma, observed=data["y"])
        elif model == "beta_bernoulli":
            theta = pm.Beta("theta", 1.0, 1.0)
            pm.Bernoulli("y", p=theta, observed=data["y"])
        elif model == "logistic_raw":
            b = pm.Normal("b", 0.0, 10.0, shape=3)
            pm.Bernoulli("y", logit_p=data["X"] @ b, observed=data["y"])
    return m


POSITIVE = {"sigma"}
"""Variables with a log transform (their warm-start coordinate is the log)."""


def _flat(posterior, names: list[str]) -> np.ndarray:
    """(chains, draws, coordinates) of the named variables, in order."""
    parts = []
    for name in names:
        v = posterior[name].values
        parts.append(v.reshape(v.shape[0], v.shape[1], -1))
    return np.concatenate(parts, axis=2)


def _coords(names: list[str], posterior) -> tuple[list[str], np.ndarray]:
    """Coordinate labels and a mask of the positive (log-transformed) ones."""
    labels, positive = [], []
    for name in names:
        size = int(np.prod(posterior[name].shape[2:], dtype=int))
        labels += [name] if size == 1 else [f"{name}[{i}]" for i in range(size)]
        positive += [name in POSITIVE] * size
    return labels, np.array(positive)


def reference(model: str, n: int, data: dict[str, np.ndarray], names: list[str]) -> Reference:
    """Exact posterior (``random_intercept``, ``beta_bernoulli``), importance sampling from the
    Laplace approximation (``logistic_raw``) or non-private NUTS, 4 chains x 2000 draws."""
    t0 = time.perf_counter()
    if model == "random_intercept":
        Z = np.zeros((n, GROUPS + 1))
        Z[np.arange(n), data["g"]] = 1.0
        Z[:, GROUPS] = data["x"]
        cov = np.linalg.inv(np.eye(GROUPS + 1) + Z.T @ Z)
        mean, sd = cov @ (Z.T @ data["y"]), np.sqrt(np.diag(cov))
        labels = [f"a[{i}]" for i in range(GROUPS)] + ["b"]
        return Reference(labels, mean, sd, mean, sd, "exact", time.perf_counter() - t0)
    if model == "beta_bernoulli":  # Beta(1 + k, 1 + n - k); its log odds from exact draws
        k = int(data["y"].sum())
        x = np.random.default_rng(7).beta(1.0 + k, 1.0 + n - k, size=400_000)
        u = np.log(x) - np.log1p(-x)
        return Reference(
            ["theta"], np.array([x.mean()]), np.array([x.std()]), np.array([u.mean()]),
            np.array([u.std()]), "exact", time.perf_counter() - t0,
        )  # fmt: skip
    if model == "logistic_raw":  # NUTS from b = 0 missed it (sd 1.2 against 0.09): Laplace + IS
        from types import SimpleNamespace

        from utility_table import _logistic_reference

        mean, cov = _logistic_reference(
            SimpleNamespace(X=data["X"], y=data["y"]), pairs=4000, prior_sd=10.0
        )
        sd = np.sqrt(np.diag(cov))
        labels = [f"b[{i}]" for i in range(3)]
        return Reference(labels, mean, sd, mean, sd, "exact", time.perf_counter() - t0)
    import pymc as pm

    with build_model(model, data):
        idata = pm.sample(
            2000, tune=1000, chains=4, cores=1, random_seed=7, progressbar=False,
            compute_convergence_checks=False,
        )  # fmt: skip
    labels, positive = _coords(names, idata.posterior)
    x = _flat(idata.posterior, names)
    x = x.reshape(-1, x.shape[2])
    u = np.where(positive, np.log(np.where(positive, x, 1.0)), x)
    return Reference(
        labels, x.mean(0), x.std(0), u.mean(0), u.std(0), "nuts", time.perf_counter() - t0
    )


def _package_warning(w: warnings.WarningMessage) -> bool:
    return w.category.__module__.startswith("pymc_penalty") or "pymc_penalty" in str(w.filename)


def run_one(model: str, n: int, epsilon: float, seed: int, delta: float, data, ref, kwargs):
    """One ``pymc_penalty.sample`` run with the defaults and its figures."""
    import pymc_penalty as pp

    with capture_warm_start() as captured:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            error = None
            try:
                idata = pp.sample(
                    epsilon=epsilon,
                    delta=delta,
                    model=build_model(model, data),
                    random_seed=seed,
                    cores=1,
                    progressbar=False,
                    **kwargs,
                )
            except Exception as exc:  # noqa: BLE001 - an error is a finding: report it
                error = f"{type(exc).__name__}: {str(exc)[:160]}"
            wall = time.perf_counter() - t0
    found = []
    for w in caught:
        if _package_warning(w):
            text = f"{w.category.__name__}: {str(w.message)[:80]}"
            if text not in found:
                found.append(text)
    row: dict[str, Any] = {"model": model, "n": n, "epsilon": epsilon, "seed": seed}
    if error is not None:
        row.update(error=error, warnings=found, wall_s=round(wall, 1))
        return row
    names = [v for v in idata.posterior.data_vars]
    x = _flat(idata.posterior, names)
    labels, positive = _coords(names, idata.posterior)
    assert labels == ref.names, (labels, ref.names)
    pooled = x.reshape(-1, x.shape[2])
    signed = (pooled.mean(0) - ref.mean) / ref.sd
    z = np.abs(signed)
    first = x[:, 0].mean(0)
    warm = captured.get("warm")
    ws_err, ws_worst = math.nan, None
    if warm is not None:
        ws_z = (warm.point - ref.u_mean) / ref.u_sd
        ws_err = float(np.sqrt(np.mean(ws_z**2)))
        k = int(np.abs(ws_z).argmax())
        ws_worst = f"{labels[k]}:{ws_z[k]:+.2f}"
    accepted = idata.sample_stats.get("accepted")
    attrs = idata.attrs
    row.update(
        err_rms=float(np.sqrt(np.mean(z**2))),
        err_max=float(z.max()),
        worst=f"{labels[int(z.argmax())]}:{signed[int(z.argmax())]:+.2f}",
        sd_ratio=float(np.exp(np.mean(np.log(pooled.std(0) / ref.sd)))),
        within_sd=float(np.exp(np.mean(np.log(x.std(axis=1).mean(0) / ref.sd)))),
        rhat=float(attrs.get("dp_r_hat_max", math.nan)),
        verdict=str(attrs.get("dp_convergence", "")),
        ws_err=ws_err,
        ws_worst=ws_worst,
        ws_clipped=getattr(warm, "clipped_fraction", None),
        forecast_ess=float(attrs.get("dp_forecast_ess", math.nan)),
        first_err=float(np.sqrt(np.mean(((first - ref.mean) / ref.sd) ** 2))),
        accept=float(accepted.values.mean()) if accepted is not None else math.nan,
        clip=float(np.nanmedian(idata.sample_stats["dp_clip"].values))
        if "dp_clip" in idata.sample_stats
        else math.nan,
        warnings=found,
        wall_s=round(wall, 1),
    )
    return row


def flagged(row: dict) -> bool:
    """Off (error > 1 ref sd or sd ratio outside [0.67, 1.5]) without a warning."""
    if "error" in row:
        return False
    off = row["err_max"] > 1.0 or not 0.67 <= row["sd_ratio"] <= 1.5
    return off and not row["warnings"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--n", type=float, nargs="+", default=[1e4, 1e5])
    parser.add_argument("--epsilon", type=float, nargs="+", default=[1.0, 6.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--delta-scale", type=float, default=1.0, help="delta = this / n")
    parser.add_argument("--kwargs", default="{}", help="pymc_penalty.sample arguments, JSON")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK} (for CI)")
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    logging.getLogger("pymc").setLevel(logging.ERROR)
    kwargs = json.loads(args.kwargs)
    rows, refs = [], {}
    for model in args.models:
        for n in (int(v) for v in args.n):
            data = make_data(model, n)
            names = [v.name for v in build_model(model, data).free_RVs]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ref = reference(model, n, data, names)
            refs[f"{model}:{n}"] = {"kind": ref.kind, "seconds": round(ref.seconds, 1)}
            print(f"# reference {model} n={n}: {ref.kind}, {ref.seconds:.0f} s", flush=True)
            for epsilon in args.epsilon:
                for seed in args.seeds:
                    row = run_one(model, n, epsilon, seed, args.delta_scale / n, data, ref, kwargs)
                    row["flagged"] = flagged(row)
                    rows.append(row)
                    print(
                        json.dumps(
                            {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}
                        ),
                        flush=True,
                    )
    ok = [r for r in rows if "error" not in r]
    result = {
        "command": command_line(__file__, sys.argv[1:] if argv is None else argv),
        "kwargs": kwargs,
        "references": refs,
        "runs": len(rows),
        "errors": len(rows) - len(ok),
        "flagged": sum(r["flagged"] for r in rows),
        "rms_err": rms_over_seeds([r["err_rms"] for r in ok])[0] if ok else math.nan,
        "rows": rows,
    }
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
