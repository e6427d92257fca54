"""ArviZ-facing diagnostics of private InferenceData: values checked, plots rendered (Agg)."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import arviz as az  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pymc as pm  # noqa: E402
import pytest  # noqa: E402
from conftest import leaked_strings  # noqa: E402

import pymc_penalty as pp  # noqa: E402
from pymc_penalty.accounting import gdp_epsilon  # noqa: E402
from pymc_penalty.results import diagnostics  # noqa: E402
from pymc_penalty.results.report import REPORT_KEYS  # noqa: E402

QUIET = dict(progressbar=False, compute_convergence_checks=False)
# ArviZ 0.23 calls a Matplotlib API deprecated in 3.11 (not ours).
pytestmark = pytest.mark.filterwarnings("ignore:Passing a dict or None as alias_mapping")


@pytest.fixture(scope="module")
def data():
    return np.random.default_rng(0).normal(1.0, 1.0, size=500)


@pytest.fixture(scope="module")
def model(data):
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, 5.0, shape=2)
        s = pm.HalfNormal("s", 2.0)
        pm.Normal("y", m.sum(), s, observed=data)
    return model


def _private(model, discard_tuned_samples=False):
    return pp.sample(
        epsilon=3.0,
        delta=1e-5,
        draws=150,
        tune=100,
        chains=2,
        cores=1,
        random_seed=2,
        model=model,
        discard_tuned_samples=discard_tuned_samples,
        **QUIET,
    )


@pytest.fixture(scope="module")
def idata(model):
    return _private(model)


def test_summary_is_arviz_summary_beside_the_report(idata, data):
    result = diagnostics.summary(idata)
    assert result.table.equals(az.summary(idata))
    for key in REPORT_KEYS:
        assert result.privacy[key] == idata.attrs[key]
    st = idata.sample_stats
    np.testing.assert_allclose(result.chains["acceptance_rate"], st["accepted"].values.mean(axis=1))
    np.testing.assert_allclose(result.chains["mean_accept_prob"], st["accept"].values.mean(axis=1))
    np.testing.assert_allclose(
        result.chains["mean_noise_sd"], st["dp_noise_sd"].values.mean(axis=1)
    )
    np.testing.assert_allclose(
        result.chains["clipped_fraction"], st["dp_clipped_fraction"].values.mean(axis=1)
    )
    text, html = str(result), result._repr_html_()
    assert f"{idata.attrs['dp_epsilon']:.4g}" in text and "Posterior" in html
    assert leaked_strings(text + html, data) == []


def test_summary_refuses_results_without_a_report_or_with_data(model, idata):
    with model:
        step = pp.PenaltyMetropolis(mu=0.1)
        raw = pm.sample(5, tune=5, chains=1, step=step, random_seed=1, **QUIET)
    with pytest.raises(ValueError, match="no privacy report"):
        diagnostics.summary(raw)
    kept = raw.copy()
    kept.attrs.update(dict(idata.attrs), dp_data_removed=0)
    with pytest.raises(ValueError, match="keep_data=True"):
        diagnostics.summary(kept)


def test_epsilon_curve_ends_at_the_reported_epsilon(idata):
    curve = diagnostics.epsilon_curve(idata)
    delta = idata.attrs["dp_delta"]
    assert curve.includes_tuning and curve.missing_tuning == 0
    assert curve.draw[0] == -100 and curve.draw[-1] == 149
    assert curve.total[-1] == pytest.approx(idata.attrs["dp_epsilon"], rel=1e-9)
    assert np.all(np.diff(curve.total) >= 0)
    # Independent per-chain composition of the raw statistics, tuning included.
    for c in range(2):
        mu2 = np.sum(idata.warmup_sample_stats["dp_mu"].values[c] ** 2)
        mu2 += np.sum(idata.sample_stats["dp_mu"].values[c] ** 2)
        assert curve.per_chain[c, -1] == pytest.approx(gdp_epsilon(mu=math.sqrt(mu2), delta=delta))
    # Each chain alone spends less than both together (sqrt(2) times the mu).
    assert np.all(curve.per_chain[:, -1] < curve.total[-1])
    # The plotted "all chains" line ends at the report's epsilon.
    ax = pp.plot_epsilon(idata)
    (line,) = [ln for ln in ax.lines if ln.get_label() == "all chains"]
    assert line.get_ydata()[-1] == pytest.approx(idata.attrs["dp_epsilon"], rel=1e-9)
    plt.close("all")


@pytest.mark.slow
def test_without_tuning_draws_the_curve_still_counts_tuning_and_says_so(model):
    """Discarded tuning draws are still releases: the curve counts them as one lump at draw
    -1 (from the report's release counts) and ends at the report's epsilon (it fell short by
    more than 5% before 0.2)."""
    short = _private(model, discard_tuned_samples=True)
    curve = diagnostics.epsilon_curve(short)
    assert curve.includes_tuning and curve.missing_tuning == 100
    assert curve.draw[0] == -1 and curve.draw[-1] == 149
    assert curve.total[-1] == pytest.approx(short.attrs["dp_epsilon"], rel=1e-9)
    # Without the tuning lump the last point would be the kept draws' epsilon alone.
    mu2 = float(np.sum(short.sample_stats["dp_mu"].values ** 2))
    assert gdp_epsilon(mu=math.sqrt(mu2), delta=short.attrs["dp_delta"]) < 0.95 * curve.total[-1]
    ax = pp.plot_epsilon(short)
    assert "not stored" in ax.get_title()
    plt.close("all")


def test_plot_privacy_shows_the_released_statistics(idata):
    fig = pp.plot_privacy(idata)
    assert len(fig.axes) == 4
    noise_ax = fig.axes[1]
    expected = np.concatenate(
        [idata.warmup_sample_stats["dp_noise_sd"].values[0], idata.sample_stats["dp_noise_sd"][0]]
    )
    np.testing.assert_allclose(noise_ax.lines[0].get_ydata(), expected)
    clip_ax = fig.axes[3]
    np.testing.assert_allclose(
        clip_ax.lines[1].get_ydata()[-150:], idata.sample_stats["dp_clipped_fraction"].values[1]
    )
    fig.savefig(__import__("io").BytesIO(), format="png")
    plt.close(fig)


def test_arviz_plots_and_netcdf_work_on_private_results(idata, tmp_path):
    assert idata.sample_stats["proposal"].dtype == np.float64
    for plot in (az.plot_trace, az.plot_posterior, az.plot_ess, az.plot_rank):
        axes = plot(idata)
        assert np.asarray(axes).size >= 1
        plt.close("all")
    az.plot_trace(idata, var_names=["m"], compact=True)
    plt.close("all")
    path = tmp_path / "private.nc"
    idata.to_netcdf(str(path))
    back = az.from_netcdf(str(path))
    assert back.attrs["dp_epsilon"] == idata.attrs["dp_epsilon"]
    assert diagnostics.epsilon_curve(back).total[-1] == pytest.approx(idata.attrs["dp_epsilon"])
    np.testing.assert_array_equal(back.sample_stats["proposal"], idata.sample_stats["proposal"])
