"""Fingerprint seeded, reproducible-noise runs through the public API (issue 30's check).

A refactor that moves code must not change what a seeded run draws. This script runs a fixed
set of configurations with ``reproducible_noise=True`` (not private: for comparisons only)
and prints one SHA-256 per configuration of the draws and sample statistics, so two checkouts
can be compared line by line:

    python scripts/seeded_fingerprint.py > after.txt   # in each checkout, then diff

Only public names are used (``pymc_penalty``, ``pymc_penalty.variants``), so the script runs
unchanged on a tree from before a module move.
"""

from __future__ import annotations

import hashlib
import sys
import warnings

import numpy as np
import pymc as pm

import pymc_penalty as pp


def _digest(idata) -> str:
    h = hashlib.sha256()
    for group in ("posterior", "sample_stats"):
        ds = getattr(idata, group)
        for name in sorted(ds.data_vars):
            h.update(name.encode())
            h.update(np.ascontiguousarray(ds[name].values).tobytes())
    return h.hexdigest()[:16]


def _logistic(n: int, seed: int):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    y = rng.binomial(1, 1 / (1 + np.exp(-(X @ [1.0, -0.5, 0.25]))))
    with pm.Model() as model:
        beta = pm.Normal("beta", 0, 2, shape=3)
        pm.Bernoulli("y", logit_p=pm.math.dot(X, beta), observed=y)
    return model


def _normal(n: int, seed: int):
    y = np.random.default_rng(seed).normal(1.0, 2.0, size=n)
    with pm.Model() as model:
        m = pm.Normal("m", 0, 10)
        s = pm.HalfNormal("s", 5)
        pm.Normal("y", m, s, observed=y)
    return model


def run() -> dict[str, str]:
    out = {}
    common = {"progressbar": False, "random_seed": 11, "cores": 1}
    repro = {"reproducible_noise": True}
    # pp.sample with its defaults (warm start, auto tune and chains, found clip)
    with _logistic(2000, 1):
        idata = pp.sample(epsilon=4.0, delta=1e-5, draws=150, step_kwargs=repro, **common)
    out["pp.sample logistic defaults"] = _digest(idata)
    with _normal(1500, 2):
        idata = pp.sample(
            epsilon=3.0,
            delta=1e-5,
            draws=120,
            tune=60,
            chains=2,
            neighbours="add_remove",
            min_rows=100,  # required under add/remove-one (a public bound below n = 1500)
            step_kwargs=repro,
            **common,
        )
    out["pp.sample normal add_remove"] = _digest(idata)
    with _normal(1000, 3):
        idata = pp.sample(
            epsilon=2.0,
            delta=1e-5,
            draws=100,
            tune=100,
            chains=2,
            warm_start=0,
            step_kwargs={**repro, "proposal": "guided"},
            **common,
        )
    out["pp.sample normal guided, no warm start"] = _digest(idata)
    # the card's usage: the step inside pm.sample, then finalize
    with _logistic(1000, 4) as model:
        plan = pp.RunPlan(draws=80, tune=80, chains=2)
        step = pp.PenaltyMetropolis(epsilon=2.0, delta=1e-5, plan=plan, **repro)
        idata = pm.sample(plan.draws, tune=plan.tune, chains=plan.chains, step=step, **common)
        idata = pp.finalize(idata, step)
    del model
    out["step + finalize logistic"] = _digest(idata)
    # the exponential-family variant
    from pymc_penalty.variants import ExpFamPenaltyMetropolis

    y = np.random.default_rng(5).normal(0.5, 1.0, size=3000)
    with pm.Model():
        m = pm.Normal("m", 0, 5)
        pm.Normal("y", m, 1.0, observed=y)
        step = ExpFamPenaltyMetropolis(mu=0.05, data_bound=5.0, **repro)
        idata = pm.sample(80, tune=80, chains=2, step=step, **common)
    out["expfam normal mean"] = _digest(idata)
    return out


def main() -> int:
    warnings.simplefilter("ignore")
    for name, digest in run().items():
        print(f"{digest}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
