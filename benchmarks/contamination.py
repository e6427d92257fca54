"""When does the certified contamination combination beat clipping? (issue 14, item 2)

At equal (epsilon, delta), one chain of ``tune + draws`` penalty steps each, compare:

- ``certified-constant`` / ``certified-lipschitz``:
  :func:`pymc_penalty.contamination.certified_step` on the contaminated model and the
  contaminated data (clip derived from (p, g, f));
- ``clipped``: an ordinary :class:`~pymc_penalty.PenaltyMetropolis` with a fixed clip
  (``clip=1``, ``clip_mode="distance"``, no warm start: the step's defaults before issue 29)
  on the uncontaminated model and the original data.

Every chain starts at the data-generating parameter (public here: the synthetic data's
``theta_ref``), so the table measures the stationary error, not the burn-in.

Metrics over ``repeats`` runs (fresh contamination and privacy noise each): bias and RMS
error of the chain's posterior mean (after tuning) against the exact contaminated posterior
mean and against the exact uncontaminated posterior mean, both by grid quadrature, in units
of the exact uncontaminated posterior sd, averaged (RMS) over coordinates.

Models: the location model ``y ~ N(theta, 1)`` on the public domain ``[-15, 15]`` with g a
t_3 of scale 5, and a logistic regression ``(intercept, slope)`` with ``|x| <= 1`` and g
Bernoulli(1/2); p = 0.1. A third case draws the location model's noise from a centred
Exp(1) (skewed, the model misspecified): clipping then removes more of one tail than the
other. delta = 1/n, substitute-one neighbours.

Run ``python benchmarks/contamination.py [--quick]`` (quick: under 2 minutes on 2 cores).
The last line printed is ``RESULT {...}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings

import numpy as np
import pymc as pm
from scipy import special

import pymc_penalty as pp
from pymc_penalty.contamination import (
    LocationModel,
    LogisticRegression,
    RecordDomain,
    StudentTContamination,
    certified_step,
)

RATE = 0.1
LOC_DOMAIN = RecordDomain(y=(-15.0, 15.0))
LOGIT_DOMAIN = RecordDomain(x_radius=1.0)
METHODS = ("certified-constant", "certified-lipschitz", "clipped")


def _quiet() -> None:
    logging.getLogger("pymc").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")


def _grid_moments(logpost: np.ndarray, axes: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    w = np.exp(logpost - logpost.max())
    w /= w.sum()
    mesh = np.meshgrid(*axes, indexing="ij")
    mean = np.array([(w * m).sum() for m in mesh])
    sd = np.sqrt(np.array([(w * (m - mu) ** 2).sum() for m, mu in zip(mesh, mean, strict=True)]))
    return mean, sd


def exact_posterior(model, y, x, rate):
    """Posterior mean and sd of theta by quadrature (1-d or 2-d grid), prior included."""
    lg = model.log_g(y, x)
    d = model.dim

    def loglik(thetas):
        out = np.empty(len(thetas))
        for s in range(0, len(thetas), 200):
            mu = thetas[s : s + 200] @ x.T
            out[s : s + 200] = model.log_fp(y[None, :], mu, lg[None, :], rate).sum(axis=1)
        return out

    centre, half = np.zeros(d), np.full(d, 3.0)
    for size in (61, 201):  # coarse, then fine around the mass
        axes = [np.linspace(c - h, c + h, size) for c, h in zip(centre, half, strict=True)]
        thetas = np.stack([m.ravel() for m in np.meshgrid(*axes, indexing="ij")], axis=1)
        logprior = -0.5 * (((thetas - model.prior_mean) / model.prior_sd) ** 2).sum(axis=1)
        logpost = (loglik(thetas) + logprior).reshape([size] * d)
        centre, sd = _grid_moments(logpost, axes)
        half = 8.0 * sd
    return centre, sd


def location_case(n, rng, skewed=False):
    g = StudentTContamination(3, 5.0)
    model = LocationModel(1.0, g)
    noise = rng.exponential(1.0, n) - 1.0 if skewed else rng.standard_normal(n)
    y = np.clip(1.0 + noise, *LOC_DOMAIN.y)
    y_tilde = np.clip(pp.contaminate(y, RATE, g, rng=rng), *LOC_DOMAIN.y)
    x = np.ones((n, 1))
    return model, LocationModel(1.0, None), LOC_DOMAIN, (y, x), (y_tilde, x), np.array([1.0])


def logistic_case(n, rng):
    model = LogisticRegression(2, prior_sd=5.0)
    x = np.column_stack([np.ones(n), rng.uniform(-1.0, 1.0, n)])
    y = (rng.random(n) < special.expit(x @ np.array([0.5, -1.5]))).astype(float)
    y_tilde = pp.contaminate(y, RATE, model.density, rng=rng)
    plain = LogisticRegression(2, prior_sd=5.0)
    plain.density = None  # the uncontaminated model
    return model, plain, LOGIT_DOMAIN, (y, x), (y_tilde, x), np.array([0.5, -1.5])


def run_chain(method, model, plain, domain, data, data_tilde, start, epsilon, delta, plan, seed):
    if method == "clipped":
        y, x = data
        pm_model = plain.pymc_model(y, x)
        with pm_model:
            step = pp.PenaltyMetropolis(
                epsilon=epsilon,
                delta=delta,
                plan=plan,
                clip=1.0,
                clip_mode="distance",
                warm_start=0,
            )
    else:
        y, x = data_tilde
        pm_model = model.pymc_model(y, x, rate=RATE)
        kind = method.split("-")[1]
        with pm_model:
            step = certified_step(
                model, RATE, domain=domain, kind=kind, epsilon=epsilon, delta=delta, plan=plan
            )
    with pm_model:
        idata = pm.sample(
            draws=plan.draws, tune=plan.tune, chains=1, cores=1, step=step, random_seed=seed,
            initvals={"theta": start},
            progressbar=False, compute_convergence_checks=False,
        )  # fmt: skip
    draws = idata.posterior["theta"].values.reshape(-1, model.dim)
    clipped = float(np.nanmean(idata.sample_stats["dp_clipped_fraction"].values))
    accept = float(np.mean(idata.sample_stats["accepted"].values))
    return draws.mean(axis=0), clipped, accept


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    _quiet()
    t0 = time.time()
    if args.quick:
        epsilons, repeats, draws, tune = (1.0,), 1, 500, 500
    else:
        epsilons, repeats, draws, tune = (1.0, 10.0), 2, 500, 500
    plan = pp.RunPlan(draws=draws, tune=tune, chains=1)
    cases = {
        "location (n=1000)": (location_case, 1000),
        "location, skewed noise (n=1000)": (lambda n, rng: location_case(n, rng, True), 1000),
        "logistic (n=2000)": (logistic_case, 2000),
    }
    result: dict = {}
    rows = []
    for name, (make, n) in cases.items():
        for eps in epsilons:
            errs = {m: {"contam": [], "plain": []} for m in METHODS}
            extra = {m: [] for m in METHODS}
            for r in range(repeats):
                rng = np.random.default_rng(1000 * r + 7)
                model, plain, domain, data, data_tilde, start = make(n, rng)
                m_c, _ = exact_posterior(model, *data_tilde, RATE)
                m_p, sd_p = exact_posterior(plain, *data, 0.0)
                for k, method in enumerate(METHODS):
                    est, clipped, accept = run_chain(
                        method, model, plain, domain, data, data_tilde, start, eps, 1.0 / n, plan,
                        seed=100 * r + k,
                    )  # fmt: skip
                    errs[method]["contam"].append((est - m_c) / sd_p)
                    errs[method]["plain"].append((est - m_p) / sd_p)
                    extra[method].append((clipped, accept))
            for method in METHODS:
                out = {}
                for ref in ("contam", "plain"):
                    e = np.array(errs[method][ref])  # repeats x dim
                    out[f"bias_{ref}"] = float(np.sqrt(np.mean(e.mean(axis=0) ** 2)))
                    out[f"rms_{ref}"] = float(np.sqrt(np.mean(e**2)))
                ex = np.array(extra[method])
                out["clipped"], out["accept"] = float(np.mean(ex[:, 0])), float(np.mean(ex[:, 1]))
                result.setdefault(name, {}).setdefault(f"{eps:g}", {})[method] = out
                rows.append((name, eps, method, out))
    print(
        "| model | epsilon | method | bias vs contaminated | RMS vs contaminated | "
        "bias vs uncontaminated | RMS vs uncontaminated | clipped | accepted |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, eps, method, o in rows:
        print(
            f"| {name} | {eps:g} | {method} | {o['bias_contam']:.2f} | {o['rms_contam']:.2f} | "
            f"{o['bias_plain']:.2f} | {o['rms_plain']:.2f} | {o['clipped']:.3f} | "
            f"{o['accept']:.2f} |"
        )
    print(
        f"({repeats} repeats, {tune} tuning + {draws} draws, one chain; {time.time() - t0:.0f} s)"
    )
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
