"""The Taylor path's forecast (issue 27, item 5): the effective sample size of its chains from
public values, checked against the model problem's simulation (``scripts/taylor_ess_sim.py``)
and carried into ``pp.sample``'s report under the plain path's keys."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import warnings
from pathlib import Path

import numpy as np
import pytest

import pymc_penalty as pp
from pymc_penalty.errors import InvalidArgumentError, UtilityWarning
from pymc_penalty.model.likelihood import RowControl
from pymc_penalty.planning.forecast import forecast_verdict
from pymc_penalty.planning.taylor_forecast import (
    _ON_THE_BOUND,
    forecast_taylor,
    start_offset,
    taylor_forecast_report,
    typical_noise_sd,
)
from pymc_penalty.privacy import taylor as tl
from pymc_penalty.privacy.budget import RunPlan
from pymc_penalty.results.diagnostics import ESS_MIN
from pymc_penalty.sampling.adaptation import RW_SCALE
from pymc_penalty.sampling.taylor import RESIDUAL_NOISE_SD, TaylorModel, compare_moves

_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "taylor_ess_sim.py"
_spec = importlib.util.spec_from_file_location("taylor_ess_sim", _SCRIPT)
taylor_ess_sim = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(taylor_ess_sim)

DEFAULT = {"draws": 4000, "tune": 500, "chains": 4}


def _ess(**kwargs) -> float:
    return forecast_taylor(**{**DEFAULT, "d": 4, "noise_sd": 1.0, **kwargs}).ess


def test_forecast_falls_with_noise_and_dimension_and_grows_with_draws():
    noise = [_ess(noise_sd=s) for s in (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)]
    assert all(a > b for a, b in zip(noise, noise[1:], strict=False)), noise
    dims = [_ess(d=d) for d in (1, 2, 3, 4, 6, 8, 10, 14, 20, 30, 50)]
    assert all(a > b for a, b in zip(dims, dims[1:], strict=False)), dims
    assert _ess(draws=1000) < _ess(draws=2000) < _ess(draws=4000) < _ess(draws=8000)
    assert _ess(chains=8) == pytest.approx(2 * _ess(chains=4))
    # The noise's cost: 1 / (1 + kappa sigma^2), kappa about 1 / 2.38^2 for many coordinates
    # (the random walk's diffusion limit with the noise proportional to the move).
    base = _ess(d=30, noise_sd=0.0)
    assert base / _ess(d=30, noise_sd=2.0) == pytest.approx(1 + 4 / 2.38**2, rel=0.05)
    # The likelihood's coordinates enter the noise's cost only (the probes' median move over
    # the mean squared one); never more of them than the chain has.
    assert _ess(d=10, likelihood_dim=8, noise_sd=0.0) == _ess(d=10, noise_sd=0.0)
    assert _ess(d=10, likelihood_dim=8) == pytest.approx(_ess(d=10), rel=0.01)
    assert _ess(d=4, likelihood_dim=9) == _ess(d=4)


def test_forecast_fields_verdict_and_the_draws_it_suggests():
    f = forecast_taylor(d=30, draws=50, tune=100, chains=2, noise_sd=1.0)
    assert f.ess < 100 and f.verdict == forecast_verdict(f.ess) in ("usable", "poor", "hopeless")
    assert f.rms_error_sd == pytest.approx(1 / math.sqrt(f.ess))
    assert f.ess == pytest.approx(f.ess_per_draw * 50 * 2)
    assert (
        f.ess_per_draw * f.draws_for_target * 2
        >= 100
        > f.ess_per_draw * (f.draws_for_target - 1) * 2
    )
    assert "draws per chain" in str(f) and f.verdict in str(f)
    good = forecast_taylor(d=3, **DEFAULT, noise_sd=1.0)
    assert good.verdict == "good" and "draws per chain" not in str(good)


def test_a_start_on_the_search_bound_forecasts_two_draws_per_chain():
    lost = forecast_taylor(**DEFAULT, d=10, noise_sd=1.0, start_found=False)
    assert lost.ess == pytest.approx(8.0) and lost.verdict == "poor"
    assert lost.draws_for_target == 0 and not lost.start_found
    assert "not expected to meet" in str(lost) and "draws per chain" not in str(lost)
    assert forecast_taylor(**DEFAULT, d=10, noise_sd=1.0).start_found


def test_start_offset_is_the_distance_over_the_search_reach():
    """In the warm start's metric, over NEWTON_RADIUS sqrt(d); the search's own cap lands on 1."""
    from pymc_penalty.warmstart.taylor import NEWTON_RADIUS

    cov = np.array([[4.0, 1.0, 0.0], [1.0, 2.0, 0.5], [0.0, 0.5, 1.0]])
    L = np.linalg.cholesky(cov)
    v = np.array([3.0, -4.0, 12.0])  # |v| = 13
    taylor = dataclasses.replace(_taylor_model(d=3), point=L @ v)
    assert start_offset(taylor, cov) == pytest.approx(13.0 / (NEWTON_RADIUS * math.sqrt(3)))
    capped = dataclasses.replace(taylor, point=L @ (v * NEWTON_RADIUS * math.sqrt(3) / 13.0))
    assert start_offset(capped, cov) == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize(
    "kwargs",
    [{"d": 0}, {"draws": 0}, {"tune": -1}, {"chains": 0}, {"noise_sd": -1.0}, {"noise_sd": "1"}],
)
def test_bad_arguments_are_named(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(InvalidArgumentError, match=name):
        forecast_taylor(**{**DEFAULT, "d": 4, "noise_sd": 1.0, **kwargs})


#: (d, noise sd, order) points of the model problem, not the table's own cells (the table is
#: noise-free; these test the noise's cost and the interpolation).
SIM_POINTS = [(2, 1.0, 2), (3, 2.0, 1), (5, 1.0, 2), (8, 3.0, 1)]


@pytest.mark.slow
@pytest.mark.parametrize(("d", "noise_sd", "order"), SIM_POINTS)
def test_forecast_agrees_with_the_model_problems_simulation(d, noise_sd, order):
    """The forecast is within Monte Carlo error of the simulated chains (fixed seeds): three
    standard errors of the runs' mean, and 10% for the table's own Monte Carlo error."""
    reps = 6
    runs = [
        taylor_ess_sim.simulate(d, noise_sd, order, seed=100 + s, **DEFAULT) for s in range(reps)
    ]
    ess = np.array([r["ess_min"] for r in runs])
    mean, se = ess.mean(), ess.std(ddof=1) / math.sqrt(reps)
    forecast = forecast_taylor(d=d, noise_sd=noise_sd, **DEFAULT).ess
    assert abs(forecast - mean) <= 3 * se + 0.1 * forecast, (forecast, mean, se)


def _taylor_model(d: int = 3, probe_length: float = 2.0, index=None) -> TaylorModel:
    t = np.zeros(d)
    k = d if index is None else len(index)
    return TaylorModel(
        t=t,
        L=np.eye(k),
        release=tl.TaylorRelease(np.zeros(k), None, 1.0, 0.0, 1.0),
        order=2,
        clip_g=1.0,
        clip_H=1.0,
        residual_clip=1e-3,
        mu=1.0,
        releases=5,
        point=t,
        covariance=np.eye(d),
        control=RowControl(t, np.eye(k), np.zeros((3, k)), None if index is None else index),
        index=None if index is None else np.asarray(index),
        probe_length=probe_length,
    )


def test_report_keys_are_the_plain_paths_and_read_public_values_only():
    taylor = _taylor_model(d=3, probe_length=2.0, index=[0, 1])
    step_mu, share, clip = 0.02, 0.05, 4e-3
    lik_mu = step_mu * math.sqrt(1 - share)
    for neighbours, k in (("substitute", 2.0), ("add_remove", 1.0)):
        noise = typical_noise_sd(taylor, step_mu, neighbours, share, clip)
        assert noise == pytest.approx(k * clip * 2.0 / lik_mu, rel=1e-12)
    run = RunPlan(4000, 500, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UtilityWarning)  # a good forecast does not warn
        report = taylor_forecast_report(
            taylor, run, step_mu, neighbours="substitute", clip_count_share=share, clip=clip
        )
    assert set(report) == {
        "dp_forecast_ess",
        "dp_forecast_verdict",
        "dp_taylor_noise_sd",
        "dp_taylor_start_offset",
    }
    # The draws' independent moves as the step will choose them, from its starting walk.
    walk = (RW_SCALE / math.sqrt(3)) * np.linalg.cholesky(taylor.covariance)
    choice = compare_moves(taylor, walk, lambda length: 2.0 * clip * length / lik_mu)
    expected = forecast_taylor(
        d=3,
        likelihood_dim=2,
        noise_sd=report["dp_taylor_noise_sd"],
        independent_share=choice.share,
        independent_per_draw=choice.independent_per_draw,
        **DEFAULT,
    )
    assert report["dp_forecast_ess"] == pytest.approx(expected.ess, rel=1e-12)
    # The independent moves only add: at least the walk's forecast.
    walk_only = forecast_taylor(
        d=3, likelihood_dim=2, noise_sd=report["dp_taylor_noise_sd"], **DEFAULT
    )
    assert report["dp_forecast_ess"] >= walk_only.ess * (1 - 1e-12)
    assert report["dp_forecast_verdict"] == expected.verdict == "good"
    # A run too short for its dimension warns, as the plain forecast does.
    with pytest.warns(UtilityWarning, match="(?s)Taylor path.*draws per chain"):
        short = taylor_forecast_report(
            _taylor_model(d=30), RunPlan(5, 10, 1), step_mu, neighbours="substitute",
            clip_count_share=share, clip=clip,
        )  # fmt: skip
    assert short["dp_forecast_verdict"] in ("poor", "hopeless")
    # A start on the released mode search's bound: chains that never meet, two draws each.
    with pytest.warns(UtilityWarning, match="no mode within reach"):
        lost = taylor_forecast_report(
            taylor, run, step_mu, neighbours="substitute", clip_count_share=share, clip=clip,
            offset=1.0,
        )  # fmt: skip
    assert lost["dp_forecast_ess"] == pytest.approx(8.0) and lost["dp_taylor_start_offset"] == 1
    assert lost["dp_forecast_verdict"] == "poor"
    # Without probe lengths there is no typical noise: the forecast assumes none.
    bare = _taylor_model(probe_length=math.nan)
    assert math.isnan(typical_noise_sd(bare, step_mu, "substitute", share, clip))


@pytest.mark.slow
def test_sample_on_the_taylor_path_reports_the_forecast():
    """pp.sample(method="taylor") forecasts after its one-shot, under the plain path's keys:
    the forecast is the function of the plan, the dimension and the typical noise sd (which
    the noise-limited clip holds at RESIDUAL_NOISE_SD or above), and the report shows it."""
    from test_taylor_path import _logistic

    model = _logistic(2000, 9)
    # Seeded noise (tests only): the one-shot draw and the chains' noise are a fixed stream.
    # With fresh noise the realised ESS over the forecast was 0.15-1.27 in 22 runs of this
    # call (median 0.8), below the 1/3 checked below in one of them (0.154, forecast 145)
    # and at 0.37 in another: about 1 run in 20 failed.
    seeded = {"privacy": pp.PrivacyPolicy(reproducible_noise=True)}
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore", UtilityWarning)
        idata = pp.sample(
            epsilon=2.0, delta=1e-5, method="taylor", draws=300, tune=200, chains=2,
            progressbar=False, random_seed=3, step_kwargs=seeded,
        )  # fmt: skip
    attrs = idata.attrs
    assert attrs["dp_method"] == "taylor"
    noise = attrs["dp_taylor_noise_sd"]
    assert noise >= RESIDUAL_NOISE_SD * (1 - 1e-9)
    assert "forecast" in str(pp.report(idata))
    assert attrs["dp_forecast_verdict"] in ("good", "usable", "poor", "hopeless")
    plan = dict(d=2, draws=300, tune=200, chains=2, noise_sd=noise)
    if attrs["dp_taylor_start_offset"] >= _ON_THE_BOUND:
        # Some one-shot draws (fresh OS noise: CI met one) leave the released mode search on
        # its bound; the forecast then says so, about two effective draws per chain.
        lost = forecast_taylor(**plan, start_found=False)
        assert attrs["dp_forecast_ess"] == pytest.approx(lost.ess)
        return
    # The walk's forecast, raised by the draws' independent moves where the step uses them.
    walk_only = forecast_taylor(**plan)
    assert attrs["dp_forecast_ess"] >= walk_only.ess * (1 - 1e-12)
    if attrs["dp_forecast_ess"] < 20.0:
        # A one-shot draw that leaves the residual noise large (fresh OS noise: a full test
        # run met a forecast of 2.05 against a realised 7.0): bulk ESS estimates this small
        # are noise themselves, so the check is the verdict's, a run that has not converged.
        assert attrs["dp_ess_bulk_min"] < ESS_MIN, attrs["dp_ess_bulk_min"]
        return
    # The realised ESS is within a factor 3 of the forecast on this short run.
    assert 1 / 3 < attrs["dp_ess_bulk_min"] / attrs["dp_forecast_ess"] < 3
