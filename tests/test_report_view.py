"""``pp.report(idata)`` (issue 17, item 4): a readable report, text and HTML, from released
quantities only, with figures checked against independent computations."""

from __future__ import annotations

import math

import arviz as az
import numpy as np
import pymc as pm
import pytest
from conftest import leaked_strings

import pymc_penalty as pp
from pymc_penalty.accounting import gdp_epsilon

pytestmark = [
    pytest.mark.filterwarnings("ignore::pymc_penalty.FrozenChainWarning"),
    pytest.mark.filterwarnings("ignore::pymc_penalty.UtilityWarning"),
]
DELTA = 1e-5


@pytest.fixture(scope="module")
def data():
    return np.random.default_rng(11).normal(0.7, 1.0, size=300)


def _run(data, **kwargs):
    with pm.Model():
        m = pm.Normal("m", 0.0, 5.0)
        pm.Normal("y", m, 1.0, observed=data)
        return pp.sample(
            method="penalty",
            epsilon=4.0,
            delta=DELTA,
            cores=1,
            random_seed=3,
            progressbar=False,
            compute_convergence_checks=False,
            **kwargs,
        )


@pytest.fixture(scope="module")
def idata(data):
    return _run(data, draws=150, tune=150, chains=2, warm_start=0.1)


def test_text_report_shows_budget_phases_convergence_clipping_and_utility(idata, data):
    view = pp.report(idata)
    text = str(view)
    for heading in ("Budget", "Cost per phase", "Convergence", "Clipping", "Utility"):
        assert heading in text
    a = idata.attrs
    assert f"epsilon spent             {a['dp_epsilon']:.4g} of 4" in text
    # Each phase's epsilon alone, computed independently from the raw statistics.
    sampling_mu2 = float(np.sum(idata.sample_stats["dp_mu"].values ** 2))
    step_mu2 = float(idata.sample_stats["dp_mu"].values.max()) ** 2
    tuning_mu2 = 2 * 150 * step_mu2  # tuning draws are not stored: 150 per chain
    warm_mu2 = a["dp_warm_start_mu"] ** 2
    screen_mu2 = a["dp_screen_mu"] ** 2  # the noisy count of unevaluable rows (issue 28)
    phases = (
        ("screen", screen_mu2),
        ("warm start", warm_mu2),
        ("tuning", tuning_mu2),
        ("sampling", sampling_mu2),
    )
    for name, mu2 in phases:
        eps = gdp_epsilon(math.sqrt(mu2), DELTA)
        assert f"epsilon {eps:.4g} alone" in text, name
    # Composition adds mu^2: the phases are the whole spend.
    total = screen_mu2 + warm_mu2 + tuning_mu2 + sampling_mu2
    assert total == pytest.approx(a["dp_mu"] ** 2, rel=1e-9)
    # Convergence computed from the released draws, as ArviZ computes it.
    rhat = float(az.rhat(idata.posterior)["m"])
    ess = float(az.ess(idata.posterior, method="bulk")["m"])
    assert f"largest R-hat             {rhat:.3g}" in text
    assert f"{1 / math.sqrt(ess):.2g} posterior sds" in text
    assert f"{100 * a['dp_clipped_fraction']:.2f}%" in text
    assert f"({a['dp_forecast_verdict']})" in text
    assert leaked_strings(text + view._repr_html_(), data) == []


def test_a_stored_verdict_is_used_and_a_bad_one_warns(idata):
    good = idata.copy()
    good.attrs.update(dp_convergence="converged", dp_r_hat_max=1.001, dp_ess_bulk_min=900.0)
    text = str(pp.report(good))
    assert "converged (sampler)" in text and "WARNING" not in text
    bad = idata.copy()
    bad.attrs.update(dp_convergence="not converged", dp_r_hat_max=2.43, dp_ess_bulk_min=2.0)
    text = str(pp.report(bad))
    assert text.splitlines()[2].startswith("WARNING: the chains have not converged")
    assert "2.43" in text
    html = pp.report(bad, html=True)
    assert isinstance(html, str) and "<table>" in html and "Warning" in html


def test_computed_verdict_flags_a_short_run(data):
    """Control: the README's finding (R-hat 2.43, ESS 2 and no warning) must now warn."""
    with pytest.warns(pp.ConvergenceWarning):
        short = _run(data, draws=20, tune=5, chains=2)
    assert short.attrs["dp_convergence"] == "not converged"
    for key in ("dp_convergence", "dp_r_hat_max", "dp_ess_bulk_min"):
        del short.attrs[key]  # as a result finalized by an older version: computed again
    text = str(pp.report(short))
    assert "WARNING: the chains have not" in text
    assert "computed by pp.report" in text


def test_add_remove_does_not_publish_a_clipped_fraction(data):
    idata = _run(data, draws=30, tune=30, chains=1, neighbours="add_remove", min_rows=100)
    text = str(pp.report(idata))
    assert "not published: under add/remove-one neighbours n is private" in text
    assert str(data.size) not in text  # never n (noisy counts only)


def test_a_raw_result_is_refused():
    raw = az.from_dict(posterior={"m": np.zeros((1, 5))})
    with pytest.raises(ValueError, match="no privacy report"):
        pp.report(raw)
