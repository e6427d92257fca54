"""Utility on the "gauss" workload: pymc_penalty.sample's defaults against an oracle-tuned chain.

Workload (the anisotropic Gaussian of the DP-HMC experiments, Raisa, Koskela and Honkela
2021): d = 10, n = 1e5 rows ``x_i ~ N(theta, Sigma)`` with known ``Sigma`` (scales 0.1 to 10
in a random rotation), prior ``theta ~ N(0, 10^2 I)``, delta = 0.1 / n, substitute-one
neighbours. The posterior is Gaussian and known exactly.

Methods, at each epsilon, over the same number of releases
(``chains x (tune + draws)``):

- ``defaults``: ``pymc_penalty.sample(epsilon, delta)`` with every other argument at its
  default (``warm_start="auto"``, ``tune="auto"``, ``clip="auto"``, ``clip_mode="metric"``,
  ``warm_start_clip="auto"``).
- ``oracle``: a penalty random walk (NumPy, here) that knows the posterior: it starts at
  exact posterior draws, proposes ``theta + L w`` (``L`` the posterior covariance's Cholesky
  factor, ``w ~ N(0, (step^2 / d) I)``, so ``|w|`` is about ``step = 0.4``), and clips each
  row's log-likelihood ratio at ``c |w|`` with ``c`` the 99.9% quantile of ``|r_i| / |w|``
  (measured on the data); its per-step noise spends the whole budget on the same number of
  releases (no clipped-count release). Its first ``tune`` steps per chain are discarded.

Metrics: ``mean_err_sd``, the root-mean-square over coordinates of
``(mean - exact mean) / exact sd``; ``sd_ratio``, the geometric mean over coordinates of
``sd / exact sd``; for the defaults also the report's R-hat, bulk ESS, the chains' first
warm-up state in posterior sd (``warm_start_err_sd``: with a warm start each chain starts at a
draw from its Gaussian approximation, so about 1 plus the mode's own error), the median noise
sd, the acceptance, the tuning steps and each phase's ``mu^2``. Target (issue 13):
``mean_err_sd <= 0.3`` at epsilon = 2 and 6.

Run ``python benchmarks/gauss.py [--quick] [--epsilons 2 6] [--warm-start 0.2] [--tune 1000]``
(``--warm-start`` and ``--tune`` default to ``pp.sample``'s own: ``"auto"``). The last
line printed is ``RESULT {"<epsilon>": {"defaults": {...}, "oracle": {...}}}``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass, replace

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from utility import _quiet  # noqa: E402

DATA_SEED = 7


@dataclass(frozen=True)
class Settings:
    """What one mode runs."""

    n: int
    d: int
    chains: int
    tune: int | None  # None: pp.sample's default ("auto")
    draws: int
    epsilons: tuple[float, ...]


FULL = Settings(n=100_000, d=10, chains=4, tune=None, draws=1000, epsilons=(2.0,))
QUICK = Settings(n=10_000, d=10, chains=2, tune=150, draws=150, epsilons=(6.0,))
ORACLE_STEP = 0.4


@dataclass(frozen=True)
class Gauss:
    """The data set and its exact posterior."""

    X: np.ndarray
    cov: np.ndarray
    post_mean: np.ndarray
    post_cov: np.ndarray

    @property
    def post_sd(self) -> np.ndarray:
        return np.sqrt(np.diag(self.post_cov))


def make_gauss(n: int, d: int, seed: int = DATA_SEED) -> Gauss:
    """Rows ``N(theta, Sigma)``, scales 0.1 to 10 in a random rotation; exact posterior under
    the ``N(0, 10^2 I)`` prior."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    cov = q @ np.diag(np.geomspace(0.1, 10.0, d) ** 2) @ q.T
    theta = rng.normal(size=d)
    X = rng.multivariate_normal(theta, cov, size=n)
    prec = np.linalg.inv(cov)
    post_cov = np.linalg.inv(n * prec + np.eye(d) / 100.0)
    post_mean = post_cov @ (prec @ X.sum(axis=0))
    return Gauss(X=X, cov=cov, post_mean=post_mean, post_cov=post_cov)


def metrics(draws: np.ndarray, g: Gauss) -> dict[str, float]:
    """RMS error of the means and geometric-mean sd ratio, in exact posterior sd."""
    err = (draws.mean(axis=0) - g.post_mean) / g.post_sd
    ratio = draws.std(axis=0, ddof=1) / g.post_sd
    return {
        "mean_err_sd": round(float(np.sqrt(np.mean(err**2))), 4),
        "sd_ratio": round(float(np.exp(np.mean(np.log(ratio)))), 4),
    }


def run_defaults(
    g: Gauss, s: Settings, epsilon: float, warm_start: float | None, seed: int
) -> dict:
    """``pymc_penalty.sample`` with its defaults (``warm_start`` given only when not None)."""
    import pymc as pm

    import pymc_penalty as pp

    n, d = g.X.shape
    with pm.Model():
        th = pm.Normal("th", 0.0, 10.0, shape=d)
        pm.MvNormal("x", mu=th, cov=g.cov, observed=g.X)
        idata = pp.sample(
            epsilon=epsilon,
            delta=0.1 / n,
            draws=s.draws,
            chains=s.chains,
            cores=1,
            **({} if warm_start is None else {"warm_start": warm_start}),
            **({} if s.tune is None else {"tune": s.tune}),
            random_seed=seed,
            progressbar=False,
            discard_tuned_samples=False,
        )
    if float(idata.attrs["dp_epsilon"]) > epsilon * (1 + 1e-9):
        raise RuntimeError(f"spent epsilon {idata.attrs['dp_epsilon']} > {epsilon}")
    out = metrics(idata.posterior["th"].values.reshape(-1, d), g)
    start = idata.warmup_posterior["th"].values[:, 0, :]  # where each chain began
    start_err = (start - g.post_mean) / g.post_sd
    out.update(
        warm_start_err_sd=round(float(np.sqrt(np.mean(start_err**2))), 3),
        r_hat_max=round(float(idata.attrs["dp_r_hat_max"]), 3),
        ess_bulk_min=round(float(idata.attrs["dp_ess_bulk_min"]), 1),
        epsilon_spent=round(float(idata.attrs["dp_epsilon"]), 4),
        final_clip=[round(float(c), 5) for c in idata.sample_stats["dp_clip"].values[:, -1]]
        if "dp_clip" in idata.sample_stats
        else [round(float(idata.attrs.get("dp_taylor_residual_clip", float("nan"))), 8)],
        noise_sd=round(float(np.median(idata.sample_stats["dp_noise_sd"].values)), 3),
        accept=round(float(np.mean(idata.sample_stats["accept"].values)), 3),
        tune=int(idata.attrs.get("dp_tune", s.tune or 0)),
        phase_mu2={
            k: round(float(idata.attrs.get(f"dp_{k}_mu", 0.0)) ** 2, 5)
            for k in ("warm_start", "tuning", "draws")
        },
    )
    return out


def run_oracle(g: Gauss, s: Settings, epsilon: float, seed: int) -> dict:
    """The oracle-tuned penalty random walk (see the module notes), all chains at once."""
    import pymc_penalty as pp

    n, d = g.X.shape
    rng = np.random.default_rng([seed, 99])
    releases = s.chains * (s.tune + s.draws)
    mu_step = pp.gdp_mu(epsilon, 0.1 / n) / math.sqrt(releases)
    prec_x = np.linalg.inv(g.cov)
    chol = np.linalg.cholesky(g.post_cov)
    # Clip: the 99.9% quantile of |r_i| / |w| over proposals from the posterior mean.
    probe = []
    for _ in range(20):
        w = rng.normal(size=d) * ORACLE_STEP / math.sqrt(d)
        delta = chol @ w
        r = (g.X - g.post_mean) @ (prec_x @ delta) - 0.5 * delta @ prec_x @ delta
        probe.append(np.abs(r) / np.linalg.norm(w))
    c = float(np.quantile(np.concatenate(probe), 0.999))
    theta = g.post_mean + rng.normal(size=(s.chains, d)) @ chol.T  # exact posterior draws
    kept, accepted, noise_sds = [], 0, []
    for t in range(s.tune + s.draws):
        w = rng.normal(size=(s.chains, d)) * ORACLE_STEP / math.sqrt(d)
        delta = w @ chol.T
        a = delta @ prec_x  # (chains, d)
        # r_i = (x_i - theta)^T A delta - delta^T A delta / 2, per chain
        r = g.X @ a.T - np.sum(theta * a, axis=1) - 0.5 * np.sum(delta * a, axis=1)
        bound = c * np.linalg.norm(w, axis=1)
        sigma = 2.0 * bound / mu_step
        d_hat = np.clip(r, -bound, bound).sum(axis=0) + sigma * rng.normal(size=s.chains)
        prop = theta + delta
        log_prior = -0.5 * (np.sum(prop**2, axis=1) - np.sum(theta**2, axis=1)) / 100.0
        accept = np.log(rng.uniform(size=s.chains)) < d_hat - 0.5 * sigma**2 + log_prior
        theta = np.where(accept[:, None], prop, theta)
        noise_sds.append(sigma)
        if t >= s.tune:
            kept.append(theta.copy())
            accepted += int(accept.sum())
    out = metrics(np.concatenate(kept), g)
    out.update(
        accept=round(accepted / (s.chains * s.draws), 3),
        noise_sd=round(float(np.median(noise_sds)), 3),
        clip=round(c, 5),
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="n = 1e4, 2 x (150 + 150)")
    parser.add_argument("--epsilons", type=float, nargs="+", help="default: 2 (quick: 6)")
    parser.add_argument(
        "--warm-start", type=float, default=None, help="budget share (default: pp.sample's)"
    )
    parser.add_argument("--tune", type=int, default=None, help="default: pp.sample's")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    _quiet()
    s = QUICK if args.quick else FULL
    if args.tune is not None:
        s = replace(s, tune=args.tune)
    epsilons = tuple(args.epsilons) if args.epsilons else s.epsilons
    g = make_gauss(s.n, s.d)
    results: dict[str, dict] = {}
    for eps in epsilons:
        t0 = time.perf_counter()
        defaults = run_defaults(g, s, eps, args.warm_start, args.seed)
        t1 = time.perf_counter()
        # The oracle makes as many releases as the defaults did (their tuning included).
        oracle = run_oracle(g, replace(s, tune=defaults["tune"]), eps, args.seed)
        t2 = time.perf_counter()
        results[f"{eps:g}"] = {"defaults": defaults, "oracle": oracle}
        print(
            f"eps {eps:g}: defaults {json.dumps(defaults)} ({t1 - t0:.0f} s); "
            f"oracle {json.dumps(oracle)} ({t2 - t1:.0f} s)",
            flush=True,
        )
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("RESULT " + json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
