"""Audit a step whose noise is divided by 1.5 and by 2, and the honest step (issue 28, item 7).

Prints, per step, the black-box lower bound against the claimed epsilon, the white-box ``mu``
estimate of ``accept`` and its lower confidence bound (where this version has one), and the
verdict ``exceeds_claim``. Runs on any checkout of the package (attributes a version lacks
print as nan), so the same command shows the verdict before and after the fix.

Run: ``python scripts/audit_weak_noise.py [runs]`` (default 10000 runs per data set), from the
repository root.
"""

from __future__ import annotations

import math
import sys
import warnings

import numpy as np
import pymc as pm

import pymc_penalty as pp
from pymc_penalty import audit as pa

# The worst-case Normal-mean pair of tests/test_audit.py: row 0 just inside -B at mu: 0 -> 0.5,
# its substitute y = 10 clipped at +B.
Y = np.random.default_rng(20261124).normal(size=20)
Y[0] = -0.75 + 0.0002


def normal_mean(y: np.ndarray) -> pm.Model:
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("y", mu, 1.0, observed=y)
    return model


def weak(factor: float) -> type:
    class NoiseDivided(pp.PenaltyMetropolis):
        def _sensitivity_and_noise(self, step_length: float) -> tuple[float, ...]:
            bound, delta, sigma, count_sd, mu = super()._sensitivity_and_noise(step_length)
            return bound, delta, sigma / factor, count_sd, mu

    return NoiseDivided


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    warnings.simplefilter("ignore")
    for label, cls in (("noise / 1.5", weak(1.5)), ("noise / 2", weak(2.0)), ("honest", weak(1.0))):
        r = pa.audit_step(
            normal_mean, Y, record=10.0, step=lambda cls=cls: cls(mu=1.0, clip=1.0),
            point={"mu": 0.0}, proposal={"mu": 0.5}, runs=runs, label=label,
        )  # fmt: skip
        accept = next(o for o in r.outputs if o.name.startswith("accept"))
        print(
            f"{label:12s} claim eps {r.claimed_epsilon:.3g} (mu {r.claimed_mu:.3g}); bound "
            f"{r.epsilon_lb:.3g}; accept mu estimate {accept.mu_estimate:.3g}, mu lower "
            f"{getattr(accept, 'mu_lower', math.nan):.3g}; exceeds_claim {r.exceeds_claim}"
        )


if __name__ == "__main__":
    main()
