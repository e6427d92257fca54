"""Run the README's minimal example several times, fresh privacy noise each time (issue 29 item 4).

The example's data and model, exactly as in ``README.md`` ("A minimal example"), sampled with
``pp.sample(epsilon=2, delta=1e-5, ...)`` by ``--method`` (``taylor``; ``penalty``, the
README's earlier call ``draws=500, tune=1000, chains=2``) or, for ``step``, with the README's
second example, the card usage ``pm.sample(step=pp.PenaltyMetropolis(epsilon=1.0,
delta=1e-5), compute_convergence_checks=False)`` then ``pp.finalize`` (``cores=1``: 2 chains
here as on any machine with at most 2 cores), ``--runs`` times; NUTS on the same data is the
reference. Printed per run: the report's verdict, R-hat, bulk ESS,
the error of each coefficient's mean in NUTS posterior sd and the sd ratio. The last line is
``RESULT {json}`` (verdict counts per method).

Run ``python scripts/readme_example_runs.py [--runs 5] [--method taylor penalty step]``.
"""

from __future__ import annotations

import argparse
import json
import warnings

import numpy as np
import pymc as pm

import pymc_penalty as pp

CALLS = {
    "taylor": dict(method="taylor", chains=2),
    "penalty": dict(draws=500, tune=1000, chains=2),
    "step": None,  # the README's second example: the card usage (see run_step)
}


def run_step(model: pm.Model):
    """The README's second example, ``pm.sample``'s defaults on one core (2 chains)."""
    with model:
        step = pp.PenaltyMetropolis(epsilon=1.0, delta=1e-5)
        idata = pm.sample(step=step, compute_convergence_checks=False, progressbar=False, cores=1)
    return pp.finalize(idata, step)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--method", nargs="+", choices=list(CALLS), default=list(CALLS))
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    X = rng.normal(size=(10_000, 2))
    y = rng.binomial(1, 1 / (1 + np.exp(-(X @ [1.0, -0.5]))))
    with pm.Model() as model:
        beta = pm.Normal("beta", 0, 2, shape=2)
        pm.Bernoulli("y", logit_p=pm.math.dot(X, beta), observed=y)
        ref = pm.sample(
            1000, progressbar=False, compute_convergence_checks=False, random_seed=1, cores=1
        )
    ref_mean = ref.posterior["beta"].mean(("chain", "draw")).values
    ref_sd = ref.posterior["beta"].std(("chain", "draw")).values
    counts: dict[str, dict[str, int]] = {}
    for method in args.method:
        counts[method] = {}
        for run in range(args.runs):
            with model, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if CALLS[method] is None:
                    idata = run_step(model)
                else:
                    idata = pp.sample(
                        epsilon=2.0, delta=1e-5, progressbar=False, cores=1, **CALLS[method]
                    )
            post = idata.posterior["beta"]
            err = (post.mean(("chain", "draw")).values - ref_mean) / ref_sd
            ratio = post.std(("chain", "draw")).values / ref_sd
            verdict = idata.attrs["dp_convergence"]
            counts[method][verdict] = counts[method].get(verdict, 0) + 1
            print(
                f"{method:8s} run {run}: {verdict:14s} R-hat {idata.attrs['dp_r_hat_max']:.3f} "
                f"ESS {idata.attrs['dp_ess_bulk_min']:7.1f}  error {np.round(err, 2)} sd, "
                f"sd ratio {np.round(ratio, 2)}",
                flush=True,
            )
    print("RESULT " + json.dumps(counts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
