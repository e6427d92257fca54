"""``pymc_penalty.sample``: the report, failures that still report, and persistent ledgers."""

from __future__ import annotations

import math
import traceback

import arviz as az
import numpy as np
import pymc as pm
import pytest
from conftest import leaked_strings

import pymc_penalty
from pymc_penalty import PrivacyBudget, PrivacyLedger, PrivateSamplingError
from pymc_penalty.api import _NEGLIGIBLE_SHARE
from pymc_penalty.model.likelihood import PenaltyLikelihood
from pymc_penalty.model.screen import SCREEN_SHARE
from pymc_penalty.results.report import REPORT_KEYS

QUIET = dict(progressbar=False, compute_convergence_checks=False)
pytestmark = pytest.mark.filterwarnings("ignore::pymc_penalty.FrozenChainWarning")
EPS, DELTA = 1.0, 1e-5
REQUIRED_KEYS = {
    "dp_epsilon",
    "dp_delta",
    "dp_mu",
    "dp_neighbours",
    "dp_sensitivity",
    "dp_releases",
    "dp_accountant",
    "dp_noise_private",
    "pymc_penalty_version",
    "dp_clipped_fraction",
}


@pytest.fixture(scope="module")
def data():
    return np.random.default_rng(3).normal(0.5, 1.0, size=40)


@pytest.fixture(scope="module")
def model(data):
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, 5.0)
        pm.Normal("y", m, 1.0, observed=data)
    return model


def fail_after(monkeypatch, calls: int) -> None:
    """Make the compiled likelihood fail (with a PyTensor error that prints its inputs)
    after ``calls`` evaluations in each process."""
    original = PenaltyLikelihood.propose
    count = {"n": 0}

    def propose(self, x, bound):
        count["n"] += 1
        if count["n"] > calls:
            current, _ = self._cells()
            current[0] = current[0][:-1]
        return original(self, x, bound)

    monkeypatch.setattr(PenaltyLikelihood, "propose", propose)


# --------------------------------------------------------------------------------------------
# Invariant 6: the report
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("neighbours", ["substitute", "add_remove"])
@pytest.mark.slow
def test_report_has_every_key_and_survives_netcdf(model, neighbours, tmp_path):
    chains, tune, draws = 2, 10, 10
    idata = pymc_penalty.sample(
        method="penalty",
        epsilon=EPS,
        delta=DELTA,
        draws=draws,
        tune=tune,
        chains=chains,
        cores=1,
        neighbours=neighbours,
        min_rows=20,  # required under add/remove-one (below the 40 rows), ignored otherwise
        random_seed=1,
        model=model,
        **QUIET,
    )
    attrs = dict(idata.attrs)
    assert REQUIRED_KEYS <= set(attrs)
    assert set(REPORT_KEYS) <= set(attrs)
    assert 0.0 < attrs["dp_epsilon"] <= EPS
    assert attrs["dp_delta"] == DELTA
    assert attrs["dp_mu"] == pytest.approx(PrivacyBudget(EPS, DELTA).mu, rel=1e-8)
    assert attrs["dp_neighbours"] == neighbours
    assert "clip" in attrs["dp_sensitivity"]
    assert attrs["dp_releases"] == chains * (tune + draws)
    assert "Gaussian DP" in attrs["dp_accountant"]
    assert attrs["dp_noise_private"] == 1
    assert attrs["pymc_penalty_version"] == pymc_penalty.__version__
    if neighbours == "substitute":
        assert math.isfinite(attrs["dp_clipped_fraction"])
    else:  # n is private: no fraction of it is published (the noisy counts are)
        assert math.isnan(attrs["dp_clipped_fraction"])
        counts = idata.sample_stats["dp_clipped_count"].values
        assert np.isfinite(counts).all()

    path = tmp_path / "result.nc"
    idata.to_netcdf(str(path))
    back = az.from_netcdf(str(path))
    assert set(attrs) <= set(back.attrs)
    for key, value in attrs.items():
        if isinstance(value, str):
            assert back.attrs[key] == value, key
        else:
            np.testing.assert_array_equal(np.asarray(back.attrs[key]), np.asarray(value), key)
    assert set(back.groups()) == set(idata.groups())


# --------------------------------------------------------------------------------------------
# Failures still report what was spent
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cores", [1, 2])
@pytest.mark.slow
def test_failure_mid_run_reports_the_spent_budget(model, data, cores, monkeypatch, tmp_path):
    path = tmp_path / "ledger.bin"
    fail_after(monkeypatch, 15)
    with pytest.raises(PrivateSamplingError) as err:
        pymc_penalty.sample(
            epsilon=EPS,
            delta=DELTA,
            draws=20,
            tune=20,
            chains=2,
            cores=cores,
            random_seed=2,
            model=model,
            ledger_path=path,
            **QUIET,
        )
    report = err.value.privacy_report
    assert REQUIRED_KEYS - {"dp_clipped_fraction"} <= set(report)
    assert report["dp_releases"] > 0
    assert 0.0 < report["dp_epsilon"] <= EPS
    assert "epsilon" in str(err.value)
    ledger = PrivacyLedger.open(path)
    assert 0.0 < ledger.spent_mu2 <= PrivacyBudget(EPS, DELTA).mu ** 2 * (1 + 1e-12)
    # The error (and its chain, worker tracebacks included) withholds the data values.
    text = "".join(traceback.format_exception(err.value))
    assert "withheld" in text
    assert leaked_strings(text, data) == []


@pytest.mark.parametrize("cores", [1, 2])
def test_budget_exhausted_before_any_chain_finished_tuning_still_reports(
    model, cores, monkeypatch, tmp_path
):
    """A plan that overspends (as if another analysis shared the ledger meanwhile): the
    ledger stops it inside the first chain's tuning and PyMC has no trace to build."""
    import pymc_penalty.sampling.step as step_module

    # pp.sample's step calibrates itself (the one calibration path).
    calibrate = step_module.calibrate
    monkeypatch.setattr(step_module, "calibrate", lambda *a, **k: 4.0 * calibrate(*a, **k))
    path = tmp_path / "ledger.bin"
    with pytest.raises(PrivateSamplingError) as err:
        pymc_penalty.sample(
            epsilon=EPS,
            delta=DELTA,
            draws=10,
            tune=40,
            chains=2,
            cores=cores,
            random_seed=3,
            model=model,
            ledger_path=path,
            warm_start=0,  # the chains' releases alone (the warm start's are counted elsewhere)
            **QUIET,
        )
    assert "Not enough samples" in str(err.value)  # the cause itself is not chained
    assert err.value.__cause__ is None and err.value.__suppress_context__
    report = err.value.privacy_report
    ledger = PrivacyLedger.open(path)
    budget_mu2 = PrivacyBudget(EPS, DELTA).mu ** 2
    assert ledger.spent_mu2 <= budget_mu2 * (1 + 1e-12)
    # 100 planned releases at 16 times the calibrated cost: at most 6 fit (the ledger also
    # holds the screen of unevaluable rows, one release before the chains).
    assert 0 < report["dp_releases"] <= 6 and ledger.releases <= 6 + 1
    assert report["dp_epsilon"] <= EPS


# --------------------------------------------------------------------------------------------
# A persistent ledger shared by successive analyses
# --------------------------------------------------------------------------------------------


def test_persistent_ledger_calibrates_to_what_is_left(model, monkeypatch, tmp_path):
    path = tmp_path / "ledger.bin"
    budget = PrivacyBudget(EPS, DELTA)
    kwargs = dict(
        epsilon=EPS,
        delta=DELTA,
        draws=15,
        tune=15,
        chains=2,
        cores=1,
        model=model,
        ledger_path=path,
        warm_start=0,  # the chains alone are calibrated to what is left
        **QUIET,
    )

    # First analysis: fails part-way, having spent part of the budget.
    with monkeypatch.context() as patch:
        fail_after(patch, 20)
        with pytest.raises(PrivateSamplingError):
            pymc_penalty.sample(random_seed=4, **kwargs)
    ledger = PrivacyLedger.open(path)
    left = ledger.remaining_mu2
    assert 0.0 < ledger.spent_mu2 and 0.3 * budget.mu**2 < left < budget.mu**2

    # Second analysis: calibrated to what is left, and the total stays within the budget.
    idata = pymc_penalty.sample(random_seed=5, **kwargs)
    planned = 2 * (15 + 15)
    step_mu = idata.sample_stats["dp_mu"].values
    # The screen of unevaluable rows spends its share of what is left first (issue 28).
    chains_left = left * (1.0 - SCREEN_SHARE)
    np.testing.assert_allclose(step_mu, math.sqrt(chains_left / planned), rtol=1e-8)
    assert idata.attrs["dp_releases"] == planned
    assert ledger.spent_mu2 <= budget.mu**2 * (1 + 1e-12)
    assert ledger.remaining_mu2 <= _NEGLIGIBLE_SHARE * ledger.budget_mu2
    assert idata.attrs["dp_epsilon"] == pytest.approx(EPS, abs=1e-6)
    assert idata.attrs["dp_epsilon"] <= EPS

    # Third analysis: nothing left; refused before sampling, nothing spent.
    spent = ledger.spent_mu2
    with pytest.raises(ValueError, match="no budget left"):
        pymc_penalty.sample(random_seed=6, **kwargs)
    assert ledger.spent_mu2 == spent
    # The stored budget cannot be changed by asking for another one.
    with pytest.raises(ValueError, match="cannot be changed"):
        pymc_penalty.sample(**{**kwargs, "epsilon": 2.0})


def test_sample_refuses_a_multitrace_result():
    with pm.Model():
        m = pm.Normal("m", 0.0, 1.0)
        pm.Normal("y", m, 1.0, observed=np.zeros(10))
        with pytest.raises(ValueError, match="`return_inferencedata`"):
            pymc_penalty.sample(
                epsilon=1.0, delta=1e-5, draws=10, tune=10, return_inferencedata=False
            )
