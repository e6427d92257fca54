"""How often the auditor's white-box verdict fails an honest mechanism (issue 28, item 7).

The worst honest case is a Gaussian release whose true ``mu`` equals the claim. This script
simulates it (seeded) for both fits the auditor uses: the plain Gaussian (``"identity"``) and
the Gaussian censored at 0 (``"log-censored"``, the ``accept`` statistic), and counts the
repetitions in which ``mu_estimate - z * mu_se`` lands above the claim, with ``z`` the
verdict's for one fitted output (false fail 1e-3). It prints the observed rate with its 95%
Clopper-Pearson upper bound, and the mean and sd of ``(estimate - mu) / se`` (0 and 1 when the
standard error is right).

Run: ``python scripts/audit_white_box_false_fail.py [reps_identity] [reps_censored] [runs]``
(defaults 20000, 600, 10000).
"""

from __future__ import annotations

import sys
import time

import numpy as np
from scipy import stats

from pymc_penalty.audit.stats import WHITE_BOX_FALSE_FAIL, gaussian_mu_fit, white_box_z


def simulate(reps: int, runs: int, censored: bool, seed: int) -> tuple[int, np.ndarray]:
    """False fails and z-scores over ``reps`` honest audits with true mu = claim = 1."""
    rng = np.random.default_rng(seed)
    z_crit = white_box_z(1)
    fails, z = 0, np.empty(reps)
    for r in range(reps):
        # log ratio under each data set: shift 1 sd apart, mostly below the censoring point.
        a, b = rng.normal(-0.3, 1.0, runs), rng.normal(0.7, 1.0, runs)
        if censored:
            mu, se = gaussian_mu_fit(np.minimum(a, 0.0), np.minimum(b, 0.0), censor_above=0.0)
        else:
            mu, se = gaussian_mu_fit(a, b)
        z[r] = (mu - 1.0) / se
        fails += bool(mu - z_crit * se > 1.0)
    return fails, z


def main() -> None:
    args = [int(a) for a in sys.argv[1:]]
    reps_id, reps_cens, runs = (args + [20_000, 600, 10_000][len(args) :])[:3]
    print(f"white-box verdict, one fitted output: false fail target {WHITE_BOX_FALSE_FAIL:g}")
    for label, reps, censored in (("identity", reps_id, False), ("log-censored", reps_cens, True)):
        start = time.perf_counter()
        fails, z = simulate(reps, runs, censored, seed=2028)
        upper = stats.beta.ppf(0.95, fails + 1, reps - fails)
        print(
            f"{label:13s} {reps} reps x {runs} runs: false fails {fails} "
            f"(rate {fails / reps:.2e}, 95% upper {upper:.2e}); z mean {z.mean():+.3f} "
            f"sd {z.std(ddof=1):.3f}; P(N(0,1) > z_crit) = {stats.norm.sf(white_box_z(1)):.1e} "
            f"[{time.perf_counter() - start:.0f} s]"
        )


if __name__ == "__main__":
    main()
