"""The Taylor one-shot in two stages (issue 27): the released mode's search, the combination of
two releases of the same sums, the second expansion where the first points, and what the
ledger is charged."""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pymc as pm
import pytest
from scipy import optimize
from test_taylor_path import _warm

import pymc_penalty as pp
from pymc_penalty import budgeted
from pymc_penalty.privacy import taylor as tl
from pymc_penalty.privacy.budget import PrivacyBudget
from pymc_penalty.privacy.ledger import PrivacyLedger
from pymc_penalty.warmstart import WARM_START_STEPS, WarmStart, prepare_warm_start, split_point
from pymc_penalty.warmstart import taylor as taylor_module
from pymc_penalty.warmstart.taylor import far_from_expansion, taylor_oneshot


class _Unlimited:
    """A ledger that grants every spend (non-private checks of the search only)."""

    def try_spend(self, mu2: float) -> bool:
        return True


def _groups(n: int = 4000, groups: int = 4, seed: int = 0) -> pm.Model:
    """Group intercepts with a shared Normal prior: the likelihood reads the intercepts only
    (``mu`` and ``tau`` are prior-only coordinates)."""
    rng = np.random.default_rng(seed)
    g = rng.integers(0, groups, n)
    y = rng.normal(0.5, 1.0, groups)[g] + rng.standard_normal(n)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 1.0)
        tau = pm.HalfNormal("tau", 1.0)
        a = pm.Normal("a", mu, tau, shape=groups)
        pm.Normal("y", a[g], 1.0, observed=y)
    return model


def _exact_mode(model: pm.Model, template: dict, x0: np.ndarray):
    """The exact posterior mode and Laplace sds, computed without the package (scipy)."""
    logp, dlogp = model.compile_logp(), model.compile_dlogp()
    res = optimize.minimize(
        lambda x: -float(logp(split_point(x, template))),
        x0,
        jac=lambda x: -np.asarray(dlogp(split_point(x, template)), float),
        method="BFGS",
        options={"gtol": 1e-9},
    )
    return res.x, np.sqrt(np.diag(res.hess_inv))


def _warm_far(model: pm.Model, mode: np.ndarray, sd: np.ndarray, n: int) -> WarmStart:
    """A warm start 15 Laplace sds off the mode on every coordinate, its covariance 5 times too
    small in sd (as the diagnostics saw on a hierarchical and a negative binomial model)."""
    return _warm(model, mode + 15.0 * sd, np.diag((0.2 * sd) ** 2), n)


@pytest.mark.slow
def test_released_mode_is_found_from_a_far_warm_start_without_noise() -> None:
    """With the noise negligible, the released model's mode search reaches the exact mode
    from a warm start 15 sds off whose covariance is 5 times too small in sd: the search's
    model is concave and not held to 10 whitened units per coordinate (before: stopped on
    that bound, 4-6 sds off). The second stage, expanded where the first points, lands
    closer still than the first."""
    n = 4000
    model = _groups(n)
    target = prepare_warm_start(model)
    template = model.initial_point()
    mode, sd = _exact_mode(model, template, np.concatenate([[0.0, 0.0], np.zeros(4)]))
    warm = _warm_far(model, mode, sd, n)
    rng = np.random.default_rng(1)
    first = taylor_oneshot(target, warm, mu=200.0, ledger=_Unlimited(), noise_rng=rng)
    err_first = np.max(np.abs(first.point - mode) / sd)
    assert err_first < 1.0
    assert far_from_expansion(first, warm.covariance)
    again = dataclasses.replace(warm, point=first.point, covariance=first.covariance)
    second = taylor_oneshot(target, again, mu=200.0, ledger=_Unlimited(), noise_rng=rng)
    err_second = np.max(np.abs(second.point - mode) / sd)
    assert err_second < 0.1
    assert err_second < err_first
    released_sd = np.sqrt(np.diag(second.covariance))
    assert np.all(np.abs(released_sd / sd - 1.0) < 0.1)
    assert not far_from_expansion(second, again.covariance)  # must-fail side of the test


def test_combine_releases_is_inverse_variance_weighting() -> None:
    """Two noisy releases of the same sums combine as one release of the summed mu2: the
    weights and sd against a direct computation, and the combined error's spread over many
    draws against the formula (tolerance from the Monte Carlo error)."""
    rng = np.random.default_rng(3)
    G, H = np.array([1.0, -2.0]), np.array([[-3.0, 0.5], [0.5, -1.0]])
    sa, sb, ha, hb = 0.4, 0.8, 0.2, 0.1
    a = tl.TaylorRelease(G + 0.3, H + 0.05, sa, ha, 2.0)
    b = tl.TaylorRelease(G - 0.1, H - 0.02, sb, hb, 0.5)
    c = tl.combine_releases(a, b)
    wa, wb = sa**-2, sb**-2
    assert np.allclose(c.G, (wa * a.G + wb * b.G) / (wa + wb))
    assert math.isclose(c.sd_G, (wa + wb) ** -0.5)
    assert math.isclose(c.sd_H, (ha**-2 + hb**-2) ** -0.5)
    assert math.isclose(c.mu2, 2.5)
    # Monte Carlo: the combined noise has the stated sd.
    draws = 20000
    errs = np.empty(draws)
    for i in range(draws):
        x = tl.TaylorRelease(G + sa * rng.standard_normal(2), None, sa, 0.0, 1.0)
        y = tl.TaylorRelease(G + sb * rng.standard_normal(2), None, sb, 0.0, 1.0)
        errs[i] = (tl.combine_releases(x, y).G - G)[0]
    se = c.sd_G / math.sqrt(2 * (draws - 1))  # sd of a sample sd
    assert abs(errs.std(ddof=1) - c.sd_G) < 4 * se
    assert abs(errs.std(ddof=1) - sa) > 4 * se  # not the better release alone (must fail)
    with pytest.raises(ValueError, match="same order"):
        tl.combine_releases(a, tl.TaylorRelease(G, None, sa, 0.0, 1.0))


def test_previous_stage_must_share_the_expansion() -> None:
    """A stage combined with an earlier one must be expanded at the same point and metric;
    any other is refused before anything is charged."""
    n = 500
    model = _groups(n, groups=2)
    target = prepare_warm_start(model)
    x0 = np.zeros(4)
    warm = _warm(model, x0, np.eye(4) * 0.01, n)
    ledger = PrivacyLedger(10.0)
    first = taylor_oneshot(target, warm, mu=1.0, ledger=ledger, residual=False)
    assert math.isnan(first.residual_clip) and first.releases == 4
    spent = ledger.spent_mu2
    moved = dataclasses.replace(warm, point=x0 + 0.1)
    with pytest.raises(ValueError, match="same point"):
        taylor_oneshot(target, moved, mu=1.0, ledger=ledger, previous=first)
    assert ledger.spent_mu2 == spent
    both = taylor_oneshot(target, warm, mu=1.0, ledger=ledger, previous=first)
    assert both.releases == 3  # G, H and the residual histogram: the clips are reused
    assert both.clip_g == first.clip_g and both.clip_H == first.clip_H
    assert both.release.sd_G < first.release.sd_G
    assert both.residual_clip > 0


@pytest.mark.parametrize("far", [False, True])
def test_private_start_charges_both_stages_once(far: bool, monkeypatch) -> None:
    """run_private_start spends the warm start's share, then TAYLOR_SHARE of what is left
    over the stages, whichever way the later ones go; the Taylor model reports both
    stages' mu and releases, and the ledger agrees."""
    n = 3000
    model = _groups(n)
    monkeypatch.setattr(taylor_module, "far_from_expansion", lambda *a: far)
    ledger = PrivacyLedger(PrivacyBudget(2.0, 1e-5).mu)
    before = ledger.spent_mu2
    warm, taylor = budgeted.run_private_start(
        model,
        share=0.2,
        taylor=True,
        ledger=ledger,
        neighbours="substitute",
        min_rows=None,
        warm_start_clip=None,
        steps=WARM_START_STEPS,
        noise_rng=np.random.default_rng(5),
        compile_kwargs=None,
    )
    total = PrivacyBudget(2.0, 1e-5).mu ** 2 - before
    oneshot = (total - warm.mu**2) * budgeted.TAYLOR_SHARE
    assert math.isclose(taylor.mu**2, oneshot, rel_tol=1e-6)
    # three stages (TAYLOR_LATER_STAGES = 2): a first 4, then 2 or 4, and the last 3 or 5
    assert taylor.releases == (13 if far else 9)
    assert math.isclose(ledger.spent_mu2, before + warm.mu**2 + oneshot, rel_tol=1e-6)
    assert np.array_equal(warm.point, taylor.point)


@pytest.mark.parametrize("far", [(False, False), (True, False), (False, True), (True, True)])
def test_three_stages_charge_the_one_shot_share_once(far: tuple[bool, bool], monkeypatch) -> None:
    """With TAYLOR_LATER_STAGES = 2 (30%, 35%, 35%), whichever way each later stage goes,
    the stages together spend the one-shot share exactly, the model counts every stage's
    releases (a first stage 4; a later one 2 combined or 4 re-expanded, the last 3 or 5 with
    the residual histogram), the ledger agrees, and the chains' expansion is the last
    re-expanded stage's point (the warm start's where none was). The must-fail side: a
    model that reported only its last stage's spend would miss the total."""
    n = 3000
    model = _groups(n)
    answers = iter(far)
    points: list[np.ndarray] = []
    bars: list[float | None] = []

    def decide(stage, covariance, noise=None):
        points.append(np.array(stage.point))
        bars.append(noise)
        return next(answers)

    monkeypatch.setattr(taylor_module, "far_from_expansion", decide)
    monkeypatch.setattr(taylor_module, "TAYLOR_LATER_STAGES", 2)
    monkeypatch.setattr(taylor_module, "FAR_NOISE_LAST", 0.5)  # distinct from FAR_NOISE
    target = prepare_warm_start(model)
    warm = _warm(model, np.zeros(6), np.eye(6) * 0.01, n)
    ledger = PrivacyLedger(10.0)
    spent: list[float] = []

    def stage(at, **kwargs):
        before = ledger.spent_mu2
        out = taylor_oneshot(
            target, at, ledger=ledger, noise_rng=np.random.default_rng(len(spent)), **kwargs
        )
        ledger.release_unused()  # as budgeted.run_taylor_oneshot does
        spent.append(ledger.spent_mu2 - before)
        return out

    tm, expand_at = taylor_module.staged_oneshot(stage, warm, 4.0)
    assert len(spent) == 3 and spent[0] == pytest.approx(0.3 * 4.0, rel=1e-9)
    assert spent[1] == pytest.approx(0.35 * 4.0, rel=1e-9) == spent[2]
    assert tm.mu**2 == pytest.approx(4.0, rel=1e-9) == ledger.spent_mu2
    assert spent[2] < tm.mu**2  # the must-fail side: the last stage's own spend
    assert tm.releases == 4 + (4 if far[0] else 2) + (5 if far[1] else 3)
    expected = points[1] if far[1] else points[0] if far[0] else warm.point
    assert np.array_equal(expand_at.point, expected)
    assert tm.residual_clip > 0
    assert bars == [taylor_module.FAR_NOISE, 0.5]  # the last stage's decision, its own bar


@pytest.mark.slow
def test_the_noise_floor_lets_the_independent_moves_run_on_group_intercepts() -> None:
    """Eight group intercepts with a Gaussian likelihood (residuals zero): with the noise
    floor set at the longer of the walk's and the independent moves' probe lengths
    (``TaylorModel.noise_length``), the independent moves' median noise sd is at most 2 and
    they are used; calibrated at the walk alone (``noise_length`` NaN, the earlier rule)
    their noise is above 2 and they are not (the must-fail side, on the same release).

    Seeded (``rng=1``): unseeded, the earlier rule also used them in 2 of 8 noise draws
    (seeds 0-7: the new rule 8 of 8, the earlier 2 of 8), and the must-fail side then
    failed by chance (a full run on 2026-11-28)."""
    from pymc_penalty.budgeted import PenaltyMetropolis
    from pymc_penalty.sampling.taylor import compare_moves, noise_limited_clip

    model = _groups(n=10000, groups=8, seed=4)
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = PenaltyMetropolis(
            epsilon=2.0, delta=1e-5, rng=1, privacy=pp.PrivacyPolicy(reproducible_noise=True)
        )
    taylor = step.taylor
    assert taylor.noise_length > taylor.probe_length
    walk = (2.38 / math.sqrt(taylor.point.size)) * np.linalg.cholesky(taylor.covariance)
    k = 2.0  # substitute-one
    # The step's likelihood mu, from its own noise: sigma = k clip length / mu.
    lik_mu = k * step.clip * 1.0 / step._sensitivity_and_noise(1.0)[2]
    assert math.isclose(noise_limited_clip(taylor, lik_mu, "substitute"), step.clip)

    def choice(t):
        clip = noise_limited_clip(t, lik_mu, "substitute")
        return compare_moves(t, walk, lambda length: k * clip * length / lik_mu)

    assert choice(taylor).share > 0.0
    old = dataclasses.replace(taylor, noise_length=math.nan)
    assert choice(old).share == 0.0


def _stage_at_the_origin():
    """A warm start at 0 with sd 0.1 on six group intercepts (1000 rows) and a seeded first
    stage expanded there (no residual histogram): the far tests' fixture."""
    n = 1000
    model = _groups(n)
    target = prepare_warm_start(model)
    warm = _warm(model, np.zeros(6), np.eye(6) * 0.01, n)
    stage = taylor_oneshot(
        target, warm, mu=1.0, ledger=_Unlimited(), noise_rng=np.random.default_rng(0),
        residual=False,
    )  # fmt: skip
    return warm, stage


def test_a_move_made_by_the_noise_alone_is_not_far(monkeypatch) -> None:
    """far_from_expansion reads a move of the released mode as far only beyond FAR_NOISE
    times the move its G noise alone gives (``sd_G sqrt(tr C^2)``, ``C`` the released
    covariance in the expansion's metric): the same move of 5 whitened units per coordinate
    is far with a small noise and not with a large one, and with FAR_NOISE = 0 both are
    (the must-fail side)."""
    from pymc_penalty.warmstart import taylor as wt

    warm, stage = _stage_at_the_origin()
    cov = warm.covariance  # the released covariance is the expansion's: C = I
    moved = dataclasses.replace(stage, point=warm.point + 0.1 * 5.0, covariance=cov)
    noise_move = 5.0 * math.sqrt(6) / (wt.FAR_NOISE * math.sqrt(6))  # sd_G at the edge

    def with_sd(sd_g: float):
        return dataclasses.replace(moved, release=moved.release._replace(sd_G=sd_g))

    assert far_from_expansion(with_sd(0.5 * noise_move), cov)
    assert not far_from_expansion(with_sd(2.0 * noise_move), cov)
    assert far_from_expansion(with_sd(2.0 * noise_move), cov, noise=0.4 * wt.FAR_NOISE)
    monkeypatch.setattr(wt, "FAR_NOISE", 0.0)
    assert far_from_expansion(with_sd(2.0 * noise_move), cov)


def test_far_test_figures_are_the_decisions_and_the_noise_chi_square() -> None:
    """far_test's figures, against their closed forms on a released model moved 5 whitened
    units per coordinate (d = 6) with a diagonal released covariance ``C``: the move
    ``5 sqrt 6``; the reach, ``FAR_NOISE sd_G sqrt(tr C^2)``; the chi-square
    ``sum (v_j / c_j)^2 / sd_G^2``; the eigenvalues; and ``far`` is far_from_expansion's
    decision: not far (the move is within the noise's reach and every variance ratio within
    ``FAR_SCALE^2 = 4``), while the same model with one variance ratio 4.5 is far (the scale
    rule, whatever the move), and one with a variance ratio 0 is far with an infinite
    chi-square, not an error."""
    from pymc_penalty.warmstart import taylor as wt

    warm, stage = _stage_at_the_origin()
    c = np.array([0.5, 1.0, 1.0, 2.0, 3.0, 3.9])
    sd_g = 2.0
    moved = dataclasses.replace(  # C = diag(c) in the expansion's metric (sd 0.1)
        stage,
        point=warm.point + 0.1 * 5.0,
        covariance=np.diag(0.01 * c),
        release=stage.release._replace(sd_G=sd_g),
    )
    figures = wt.far_test(moved, warm.covariance)
    assert figures.move == pytest.approx(5.0 * math.sqrt(6))
    assert figures.reach == pytest.approx(
        max(wt.FAR_DISTANCE * math.sqrt(6), wt.FAR_NOISE * sd_g * math.sqrt(np.sum(c**2)))
    )
    assert figures.chi2 == pytest.approx(np.sum((5.0 / c) ** 2) / sd_g**2)
    assert (figures.scale_min, figures.scale_max) == pytest.approx((0.5, 3.9))
    assert figures.far == far_from_expansion(moved, warm.covariance) is False
    wide = dataclasses.replace(moved, covariance=np.diag(0.01 * np.append(c[:-1], 4.5)))
    assert wt.far_test(wide, warm.covariance).far and far_from_expansion(wide, warm.covariance)
    # A degenerate released covariance: no error, the chi-square infinite, far by the scale rule.
    flat = dataclasses.replace(moved, covariance=np.diag(0.01 * np.append(c[:-1], 0.0)))
    figures = wt.far_test(flat, warm.covariance)
    assert figures.chi2 == math.inf and figures.far
