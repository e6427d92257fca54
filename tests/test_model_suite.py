"""The model suite's pieces that need no sampler: data sets, the method registry, the one-shot
baseline's sensitivity and the summary (fast; the quick run is in test_benchmarks)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import model_suite as ms  # noqa: E402


@pytest.mark.parametrize("model", ms.MODELS)
def test_data_sets_are_seeded_and_their_truth_names_the_free_variables(model):
    a, b = ms.make_dataset(model, 500, 3), ms.make_dataset(model, 500, 3)
    c = ms.make_dataset(model, 500, 4)
    assert all(np.array_equal(a.data[k], b.data[k]) for k in a.data)
    assert not np.array_equal(a.data["y"], c.data["y"])
    free = {v.name: v for v in ms.build_model(a).free_RVs}
    assert set(free) == set(a.truth)
    for name, rv in free.items():
        assert np.shape(a.truth[name]) == tuple(rv.shape.eval()), name


def test_a_method_is_added_by_name_and_limited_to_its_models():
    def fake(ds, epsilon, seed, quick):
        return {}, {}

    kept = ms.METHODS.get("taylor")
    try:
        ms.register_method("taylor", models=("linear",))(fake)
        assert ms.METHODS["taylor"].fn is fake and ms.METHODS["taylor"].models == ("linear",)
    finally:
        ms.METHODS.pop("taylor", None)
        if kept is not None:  # the suite's own entry, for the tests that follow
            ms.METHODS["taylor"] = kept
    assert ms.METHODS["nss"].models == ("linear",) and ms.METHODS["pp_sample"].models is None


def test_one_rows_triangle_is_bounded_by_the_clips_within_a_factor_sqrt2():
    cy = ms.nss_y_clip()
    bound = ms.NSS_X_CLIP**2 + cy**2
    rng = np.random.default_rng(0)
    rows = np.vstack([rng.standard_normal((1000, 4)) * 50, [[1e6, 0, 0, -1e6]]])
    x, y = rows[:, :3], rows[:, 3]
    x = x * np.minimum(1.0, ms.NSS_X_CLIP / np.linalg.norm(x, axis=1))[:, None]
    z = np.column_stack([x, np.clip(y, -cy, cy)])
    norms = [np.linalg.norm(np.triu(np.outer(r, r))) for r in z]
    assert max(norms) <= bound * (1 + 1e-12)
    # ||triu(z z')|| >= ||z z'||_F / sqrt(2) = ||z||^2 / sqrt(2): loose by at most sqrt(2).
    assert max(norms) > bound / math.sqrt(2)
    # Unclipped rows would exceed it (the clip is what bounds the sensitivity).
    assert max(np.linalg.norm(np.triu(np.outer(r, r))) for r in rows) > bound


def test_summary_pools_coverage_and_averages_errors_in_square():
    rows = [
        {"model": "linear", "n": 10, "epsilon": 1.0, "method": "m", "err_rms": e,
         "sd_ratio": 1.0, "sd_ratio_min": 0.5, "covered": c, "n_covered": 4,
         "verdict": "converged", "eps_spent": 1.0, "wall_s": 2.0}
        for e, c in ((3.0, 4), (4.0, 2))
    ]  # fmt: skip
    (cell,) = ms.summarise(rows + [{**rows[0], "error": "boom"}])
    assert cell["rms"] == pytest.approx(math.sqrt(12.5)) and cell["coverage"] == 0.75
    assert (cell["datasets"], cell["failed"], cell["converged"]) == (2, 1, 1.0)


def test_g_floor_is_the_g_noise_at_the_whole_budget_and_names_the_miss():
    from pymc_penalty.privacy.budget import PrivacyBudget

    mu = PrivacyBudget(2.0, ms.DELTA).mu
    base = {
        "model": "linear", "n": 10_000, "epsilon": 2.0, "method": "taylor", "sd_ratio": 1.1,
        "sd_ratio_min": 1.05, "covered": 36, "n_covered": 40, "verdict": "converged",
        "eps_spent": 2.0, "wall_s": 1.0,
    }  # fmt: skip
    # G got a quarter of mu^2: its noise is twice the whole-budget one, k clip / mu.
    clip = 0.1
    rows = [
        {**base, "err_rms": e, "clip_g": clip, "noise_sd_g": 2 * 2 * clip / mu,
         "mean_noise_sd": 2 * 2 * clip / mu}
        for e in (0.5, 0.5)
    ]  # fmt: skip
    (cell,) = ms.summarise(rows)
    floor = 2 * clip / mu
    assert cell["g_floor"] == pytest.approx(floor) and cell["g_share"] == pytest.approx(0.25)
    assert cell["noise_mean"] == pytest.approx(2 * floor)
    bound = ms.RMS_TARGET[(10_000, 2.0)]
    reason = ms.miss_reason(cell, f"rms<={bound:g}")
    # An error at the one-shot's noise: the split where the whole budget would meet the
    # bound, the clip where it would not; beyond the noise where the error is larger.
    assert ("split" in reason) == (floor <= bound) and ("clip" in reason) == (floor > bound)
    quiet = {**cell, "noise_mean": 0.9 * bound, "rms": 1.1 * bound}
    assert ms.miss_reason(quiet, f"rms<={bound:g}").endswith("the rest adds")
    far = {**cell, "rms": 2 * ms.NOISE_BOUND_FACTOR * cell["noise_mean"]}
    assert ms.miss_reason(far, f"rms<={bound:g}").startswith("beyond the one-shot noise")
    # Coverage: 0.9 +- small is met; 1.0 with every sd ratio above 1 is "wide".
    assert ms.miss_reason({**cell, "coverage": 1.0, "coverage_se": 0.01}, "cov") == "wide"
    assert ms.miss_reason({**cell, "coverage": 0.6, "coverage_se": 0.01}, "cov").startswith(
        "narrow"
    )
    assert ms.miss_reason({**cell, "coverage": 0.8, "coverage_se": 0.05}, "cov") == ("within 2 se")


def test_a_reference_whose_chains_disagree_scores_nothing(monkeypatch, tmp_path):
    import argparse

    calls = []

    def fake_method(ds, epsilon, seed, quick):
        calls.append(seed)
        return {k: np.zeros((4, *np.shape(v))) for k, v in ds.truth.items()}, {}

    def nuts(r_hat):
        def run(ds, seed, quick):
            draws = {k: np.random.default_rng(0).normal(size=(50, *np.shape(v))) for k, v in
                     ds.truth.items()}  # fmt: skip
            return draws, 0.1, r_hat

        return run

    monkeypatch.setitem(ms.METHODS, "fake", ms.MethodEntry(fake_method, None, "substitute"))
    args = argparse.Namespace(
        first_dataset=0, datasets=1, n=[200], models=["linear"], eps=[1.0], methods=["fake"],
        quick=True,
    )  # fmt: skip
    for r_hat, scored in ((1.001, True), (1.3, False)):
        monkeypatch.setattr(ms, "run_nuts", nuts(r_hat))
        rows: list[dict] = []
        calls.clear()
        ms.run_grid(args, str(tmp_path / "rows.csv"), rows)
        (ref,) = [r for r in rows if r["method"] == "nuts"]
        assert bool(calls) == scored and (ref.get("error") is None) == scored, rows
        if not scored:
            assert "reference not converged" in ref["error"] and len(rows) == 1


def test_from_csv_reads_only_the_selected_cells():
    """``--from-csv`` with ``--eps``, ``--methods``, ``--models`` and ``--n`` keeps those cells
    and their NUTS rows; the defaults keep every row."""
    rows = [
        {"model": "linear", "n": 10000, "epsilon": None, "method": "nuts"},
        {"model": "linear", "n": 10000, "epsilon": 0.5, "method": "taylor"},
        {"model": "linear", "n": 10000, "epsilon": 1.0, "method": "taylor"},
        {"model": "linear", "n": 10000, "epsilon": 1.0, "method": "taylor_short"},
        {"model": "poisson", "n": 10000, "epsilon": 1.0, "method": "taylor"},
        {"model": "linear", "n": 100000, "epsilon": 1.0, "method": "taylor"},
    ]
    parser_args = ["--from-csv", "x.csv", "--eps", "1", "--methods", "taylor", "--n", "1e4"]
    args = ms.parse_args(parser_args + ["--models", "linear"])
    assert [ms._selected(r, args) for r in rows] == [True, False, True, False, False, False]
    every = ms.parse_args(["--from-csv", "x.csv"])
    assert all(ms._selected(r, every) for r in rows)


def test_loud_runs_count_the_runs_above_the_noise_limit_and_their_verdicts():
    rows = [
        {"noise_sd": 1.0, "verdict": "converged"},
        {"noise_sd": 1.6, "verdict": "converged"},
        {"noise_sd": 12.0, "verdict": "not converged"},
        {"noise_sd": math.nan, "verdict": "converged"},
    ]
    assert ms._loud_runs(rows) == {"loud_runs": 2.0, "loud_converged": 1.0}
    none = ms._loud_runs([{"verdict": "converged"}, {"noise_sd": 9.0, "verdict": "exact draws"}])
    assert all(math.isnan(v) for v in none.values())


def test_seeded_noise_asks_pp_sample_for_the_runs_own_noise_stream(monkeypatch):
    """``--seeded-noise`` sets ``PrivacyPolicy(reproducible_noise=True)`` on the ``pp.sample``
    methods and says so in the row; without it no policy is passed and the row says fresh."""
    import pymc_penalty as pp

    seen = {}

    class Stop(Exception):
        pass

    def fake_sample(**kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(pp, "sample", fake_sample)
    ds = ms.make_dataset("linear", 200, 0)
    for seeded in (True, False):
        seen.clear()
        monkeypatch.setattr(ms, "SEEDED_NOISE", seeded)
        with pytest.raises(Stop):
            ms.METHODS["taylor"].fn(ds, 1.0, 7, True)
        policy = seen.get("step_kwargs", {}).get("privacy")
        assert (policy is not None and policy.reproducible_noise) is seeded
        assert seen["random_seed"] == 7 and seen["method"] == "taylor"
    assert ms.parse_args(["--seeded-noise"]).seeded_noise
    assert not ms.parse_args([]).seeded_noise


def test_target_marks_cover_the_issue_s_ceiling_convergence_and_forecast():
    cell = {
        "model": "linear", "n": 10_000, "epsilon": 2.0, "method": "taylor", "datasets": 20,
        "coverage": 0.9, "coverage_se": 0.02, "sd_ratio": 1.1, "sd_ratio_min": 1.0,
        "noise_mean": 0.3, "converged": 0.85, "forecast_ratio": 1.5, "forecast_ratio_min": 0.7,
        "forecast_ratio_max": 2.4, "rms": 0.3,
    }  # fmt: skip
    marks = dict(ms.target_marks(cell))
    assert marks == {"cov": True, "sd": True, "sdmax": True, "conv": True, "fc": True,
                     "rms<=0.35": True}  # fmt: skip
    # Each must-fail case flips its own mark only.
    for key, change in (
        ("sdmax", {"sd_ratio": 1.3}),
        ("conv", {"converged": 0.75}),
        ("fc", {"forecast_ratio": 2.1}),
        ("fc", {"forecast_ratio": 0.45}),
    ):
        changed = dict(ms.target_marks({**cell, **change}))
        assert {k for k in marks if changed[k] != marks[k]} == {key}, change
        assert ms.miss_reason({**cell, **change}, key), key
    # The ceiling applies only where the one-shot noise is below 0.5 sd; convergence only
    # from epsilon 2 up; the forecast only where the method makes one.
    assert "sdmax" not in dict(ms.target_marks({**cell, "noise_mean": 0.6, "sd_ratio": 2.0}))
    assert "conv" not in dict(ms.target_marks({**cell, "epsilon": 1.0, "converged": 0.1}))
    assert "fc" not in dict(ms.target_marks({**cell, "forecast_ratio": math.nan}))
    assert ms.miss_reason({**cell, "converged": 0.75}, "conv") == "75% converged"


def test_a_reference_whose_chains_never_moved_is_run_again(monkeypatch):
    """A NaN R-hat (chains that never moved) fails the reference's bound: the n = 1e5
    logistic data set 16 of the ninth session was scored against such a reference (every
    private run 23 "sds" off), since ``nan > 1.05`` is false."""
    import arviz as az
    import pymc as pm

    rng = np.random.default_rng(0)
    ds = ms.make_dataset("linear", 200, 0)
    names = [v.name for v in ms.build_model(ds).free_RVs]

    def idata(stuck: bool):
        post = {}
        for k in names:
            shape = (2, 1000, *np.shape(ds.truth[k]))
            post[k] = np.ones(shape) if stuck else rng.normal(size=shape)
        return az.from_dict(posterior=post)

    assert ms.max_r_hat(idata(True), names) == math.inf
    # One parameter stuck, the others moving: still infinite (xarray's max skips NaN).
    partly = idata(False)
    partly.posterior[names[-1]] = partly.posterior[names[-1]] * 0 + 1.0
    assert ms.max_r_hat(partly, names) == math.inf
    assert ms.max_r_hat(idata(False), names) < ms.NUTS_R_HAT
    runs = iter([idata(True), idata(False)])
    calls = []

    def fake_sample(**kw):
        calls.append(kw["tune"])
        return next(runs)

    monkeypatch.setattr(pm, "sample", fake_sample)
    draws, _, r_hat = ms.run_nuts(ds, seed=1, quick=True)
    # Run again with twice the tuning, and the run that moved is kept.
    assert calls == [300, 600] and r_hat < ms.NUTS_R_HAT
    assert all(np.std(draws[k]) > 0 for k in names)
    # Both stuck: the reference fails its bound, so run_grid scores nothing against it.
    runs = iter([idata(True), idata(True)])
    assert ms.run_nuts(ds, seed=1, quick=True)[2] > ms.NUTS_R_HAT
