"""Privacy accounting for compositions of Gaussian releases.

Every step of the penalty algorithm releases one Gaussian-noised log-likelihood difference.
With L2 sensitivity ``Delta_t`` and noise standard deviation ``sigma_t`` the release is
``mu_t``-GDP with ``mu_t = Delta_t / sigma_t``, and an adaptive composition of such releases is
exactly ``mu``-GDP with ``mu = sqrt(sum_t mu_t**2)`` (Dong, Roth and Su, "Gaussian differential
privacy", JRSS-B 2022, Corollary 3.3).  Its tight ``(epsilon, delta)`` curve is

    delta(epsilon) = Phi(-epsilon / mu + mu / 2) - exp(epsilon) * Phi(-epsilon / mu - mu / 2).

The subpackage is split by responsibility; every public name is re-exported here, so import
from ``pymc_penalty.accounting`` directly:

* :mod:`~pymc_penalty.accounting.gdp`: the tight GDP conversions (:func:`gdp_delta`,
  :func:`gdp_epsilon`, :func:`gdp_mu`), evaluated in log space so they stay finite far into
  the tails, and composition (:func:`compose_mu2`, :func:`compose_mu`) with the conversion of
  a composed spend (:func:`composed_epsilon`): the only code in the package that composes
  releases or turns a spend into ``epsilon`` (the ledger, callback, report, diagnostics,
  variants and warm start read it);
* :mod:`~pymc_penalty.accounting.bounds`: looser comparison bounds for the same composition
  (zCDP, RDP and advanced composition), :func:`gaussian_epsilon` and
  :func:`iterations_allowed`;
* :mod:`~pymc_penalty.accounting.theorem1`: the schedule of the arXiv seed's Theorem 1 /
  Corollary 1 (:func:`theorem1_schedule`);
* :mod:`~pymc_penalty.accounting.events`: a small immutable event vocabulary and
  :class:`GDPAccountant`, which can be checkpointed;
* :mod:`~pymc_penalty.accounting.calibration`: the one calibration from a run plan
  (``pymc_penalty.calibrate``, with ``pymc_penalty.RunPlan`` and :func:`plan_releases`;
  :func:`calibrate_step_mu` is its deprecated alias taking a budget) and the closed-form
  expected acceptance probability of the penalty test (:func:`expected_acceptance`);
* :mod:`~pymc_penalty.accounting.accept_bit`: tight accounting for a step that publishes only
  its accept bit (the envelope over ``x`` of the binary trade-off curves, its dominating pair
  and its PLD composed with `dp-accounting`); analysis only, not re-exported here and not
  charged by the ledger (``docs/accounting.md`` has the measurement);
* :mod:`~pymc_penalty.accounting._validation`: the shared argument checkers (private).

Pure NumPy/SciPy: nothing here imports PyMC.  Sensitivities are the L2 sensitivity under the
neighbour relation in use (substitute-one: ``2B``; add/remove-one: ``B``); this subpackage
never doubles or halves them itself.
"""

from __future__ import annotations

# The option types of the bounds' signatures stay importable from here (not in __all__, as
# before the split).
from pymc_penalty.accounting.bounds import Accountant as Accountant
from pymc_penalty.accounting.bounds import PerStepBound as PerStepBound
from pymc_penalty.accounting.bounds import RdpConversion as RdpConversion
from pymc_penalty.accounting.bounds import (
    advanced_composition,
    classical_gaussian_epsilon,
    gaussian_epsilon,
    iterations_allowed,
    rdp_epsilon,
    zcdp_epsilon,
    zcdp_rho,
)
from pymc_penalty.accounting.calibration import (
    calibrate_step_mu,
    expected_acceptance,
    plan_releases,
)
from pymc_penalty.accounting.events import (
    ComposedReleases,
    GaussianRelease,
    GDPAccountant,
    PrivacyEvent,
    RepeatedRelease,
)
from pymc_penalty.accounting.gdp import (
    clip_count_noise_sd,
    compose_mu,
    compose_mu2,
    composed_epsilon,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
    likelihood_mu2,
    split_step_mu,
    step_mu_of_release,
)
from pymc_penalty.accounting.theorem1 import Theorem1Schedule, theorem1_schedule
from pymc_penalty.errors import DegenerateDeltaWarning

__all__ = [
    "ComposedReleases",
    "DegenerateDeltaWarning",
    "GDPAccountant",
    "GaussianRelease",
    "PrivacyEvent",
    "RepeatedRelease",
    "Theorem1Schedule",
    "advanced_composition",
    "calibrate_step_mu",
    "classical_gaussian_epsilon",
    "clip_count_noise_sd",
    "compose_mu",
    "compose_mu2",
    "composed_epsilon",
    "expected_acceptance",
    "gaussian_epsilon",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
    "iterations_allowed",
    "likelihood_mu2",
    "plan_releases",
    "rdp_epsilon",
    "split_step_mu",
    "step_mu_of_release",
    "theorem1_schedule",
    "zcdp_epsilon",
    "zcdp_rho",
]
