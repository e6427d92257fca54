"""Empirical audit of the Taylor path (issue 27): the one-shot G/H release and one residual
step pass their claims on a worst-case neighbour, and broken controls (the one-shot's
sensitivity from half clips, the step's noise sd halved) fail them.

A small version of ``python scripts/audit_taylor.py`` (2,000 runs per data set instead of
20,000; the script's table is in ``docs/audit.md``), using its harness.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "audit_taylor.py"
_spec = importlib.util.spec_from_file_location("audit_taylor", _SCRIPT)
audit_taylor = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(audit_taylor)

RUNS = 2_000


@pytest.mark.parametrize("relation", ["substitute", "add_remove"])
def test_oneshot_release_passes_and_a_half_sensitivity_fails(relation: str) -> None:
    honest, pair_mu = audit_taylor.audit_oneshot(relation, RUNS)
    # The worst-case neighbour is (nearly) tight: the pair's exact mu is the G share's
    # (substitute: antipodal clipped gradients, equal Hessians) or the whole claim.
    assert pair_mu >= 0.9 * honest.claimed_mu
    assert pair_mu <= honest.claimed_mu * (1 + 1e-9)
    assert not honest.exceeds_claim
    assert honest.mu_estimate == pytest.approx(pair_mu, abs=0.15)
    broken, _ = audit_taylor.audit_oneshot(relation, RUNS, broken=True)
    assert broken.exceeds_claim  # must-fail control
    assert broken.mu_lower > broken.claimed_mu


def test_residual_step_passes_and_a_halved_noise_fails() -> None:
    honest, pair_mu = audit_taylor.audit_residual_step("substitute", RUNS)
    assert pair_mu >= 0.95 * honest.claimed_mu  # the row's residual clips at +B and at -B
    assert not honest.exceeds_claim
    assert honest.mu_estimate == pytest.approx(pair_mu, abs=0.15)
    broken, _ = audit_taylor.audit_residual_step("substitute", RUNS, broken=True)
    assert broken.exceeds_claim  # must-fail control
    assert broken.mu_lower > broken.claimed_mu


@pytest.mark.parametrize("relation", ["substitute", "add_remove"])
def test_a_neighbour_changes_one_row_of_taylor_terms(relation: str) -> None:
    """The finite-difference Taylor terms are row-local: every row but the changed one has
    bit-identical terms on the two data sets (so only one clipped term moves the sums)."""
    d, d2 = audit_taylor.data(relation)
    a = audit_taylor.row_coefficients(audit_taylor.poisson(d), relation)
    b = audit_taylor.row_coefficients(audit_taylor.poisson(d2), relation)
    assert np.array_equal(a[1:], b[1:] if relation == "substitute" else b)
    if relation == "substitute":
        assert not np.array_equal(a[0], b[0])
