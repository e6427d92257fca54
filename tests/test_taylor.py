"""Bounds of the Taylor control-variate path (pymc_penalty.privacy.taylor) and its tilted target."""

from __future__ import annotations

import numpy as np
import pytest

from pymc_penalty.privacy import taylor as tl

RTOL = 1e-9


def _rows(rng: np.random.Generator, n: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    g = rng.normal(size=(n, d)) * rng.lognormal(0.0, 1.0, size=(n, 1))
    A = rng.normal(size=(n, d, d))
    return g, (A + A.transpose(0, 2, 1)) / 2.0


def _extreme_rows(d: int, g_ref: np.ndarray, H_ref: np.ndarray) -> list:
    """Adversarial rows: huge, tiny, antipodal to a reference row, far-out but finite."""
    e = np.eye(d)[0]
    return [
        (1e12 * e, 1e12 * np.eye(d)),
        (np.zeros(d), np.zeros((d, d))),
        (-1e6 * g_ref, -1e6 * H_ref),
        (np.full(d, 1e300), np.full((d, d), -1e300)),
        (np.array([1e-300] + [0.0] * (d - 1)), 1e-300 * np.eye(d)),
    ]


def _sums(g: np.ndarray, H: np.ndarray, c_g: float, c_H: float) -> tuple[np.ndarray, np.ndarray]:
    return tl.clip_rows(g, H, c_g, c_H).sums()


@pytest.mark.parametrize("relation", ["substitute", "add_remove"])
def test_oneshot_sums_move_at_most_their_sensitivity(relation: str) -> None:
    rng = np.random.default_rng(1)
    n, d, c_g, c_H = 40, 3, 0.7, 1.3
    g, H = _rows(rng, n, d)
    dG, dH = tl.oneshot_sensitivities(c_g, c_H, relation)
    assert (dG, dH) == ((2 * c_g, 2 * c_H) if relation == "substitute" else (c_g, c_H))
    G0, H0 = _sums(g, H, c_g, c_H)
    worst_G = worst_H = 0.0
    for j in range(n):
        for gx, Hx in _extreme_rows(d, g[j], H[j]):
            if relation == "substitute":
                g1, H1 = g.copy(), H.copy()
                g1[j], H1[j] = gx, Hx
                pairs = [(g1, H1)]
            else:  # add the extreme row, or remove row j
                pairs = [
                    (np.vstack([g, gx[None]]), np.concatenate([H, Hx[None]])),
                    (np.delete(g, j, 0), np.delete(H, j, 0)),
                ]
            for g1, H1 in pairs:
                G1, Hs1 = _sums(g1, H1, c_g, c_H)
                worst_G = max(worst_G, float(np.linalg.norm(G1 - G0)))
                worst_H = max(worst_H, float(np.linalg.norm(Hs1 - H0)))
    assert worst_G <= dG * (1 + RTOL)
    assert worst_H <= dH * (1 + RTOL)
    # the bound is attained (antipodal replacement of a clipped row, or adding a clipped row)
    assert worst_G >= 0.999 * dG
    assert worst_H >= 0.999 * dH


def test_oneshot_unclipped_sums_exceed_the_bound() -> None:
    """Must-fail control: without the clip one far-out row moves the sums past the claim."""
    rng = np.random.default_rng(2)
    g, H = _rows(rng, 40, 3)
    dG, dH = tl.oneshot_sensitivities(0.7, 1.3)
    g1, H1 = g.copy(), H.copy()
    g1[0], H1[0] = 1e6 * np.ones(3), 1e6 * np.eye(3)
    assert np.linalg.norm(g1.sum(0) - g.sum(0)) > dG
    assert np.linalg.norm(H1.sum(0) - H.sum(0)) > dH
    # and a claim made with the wrong (add/remove) factor under substitution fails too
    dG_ar, _ = tl.oneshot_sensitivities(0.7, 1.3, "add_remove")
    G0, _ = _sums(g, H, 0.7, 1.3)
    g2 = g.copy()
    g2[0] = -g[0] * 1e6
    g2[0] *= 1.0 if np.linalg.norm(g[0]) > 0.7 else 0.7 / np.linalg.norm(g[0])
    G2, _ = _sums(g2, H, 0.7, 1.3)
    g3 = g.copy()
    g3[0] = 1e6 * g[0]
    G3, _ = _sums(g3, H, 0.7, 1.3)
    assert np.linalg.norm(G3 - G2) > dG_ar


def test_rank_one_rows_match_general_rows() -> None:
    rng = np.random.default_rng(3)
    n, d = 60, 4
    x = rng.normal(size=(n, d)) * np.array([1.0, 10.0, 0.1, 1.0])
    L = np.linalg.cholesky(np.diag([0.3, 0.03, 3.0, 0.3]) + 0.01)
    a, h = rng.normal(size=n), rng.lognormal(size=n)
    gw, Hw = tl.whiten_rows(a[:, None] * x, -h[:, None, None] * np.einsum("ij,ik->ijk", x, x), L)
    general = tl.clip_rows(gw, Hw, 0.5, 0.4)
    rank1 = tl.clip_rank_one_rows(x @ L, a, h, 0.5, 0.4)
    for A, B in zip(general.sums(), rank1.sums(), strict=True):
        np.testing.assert_allclose(A, B, rtol=1e-10, atol=1e-12)
    w = rng.normal(size=d)
    np.testing.assert_allclose(general.model(w), rank1.model(w), rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(general.H_clipped, rank1.H_clipped)
    assert general.g_clipped.any() and general.H_clipped.any()


def test_symmetric_noise_is_isotropic_in_the_frobenius_vector() -> None:
    rng = np.random.default_rng(4)
    d, sd, m = 3, 0.5, 20000
    iu = np.triu_indices(d, 1)
    vecs = np.empty((m, d + len(iu[0])))
    for k in range(m):
        E = tl.symmetric_noise(d, sd, rng)
        assert np.array_equal(E, E.T)
        vecs[k] = np.concatenate([np.diag(E), np.sqrt(2.0) * E[iu]])
    var = vecs.var(axis=0)
    # sd of a variance estimate of a Gaussian: var * sqrt(2 / m)
    assert np.all(np.abs(var - sd**2) < 5 * sd**2 * np.sqrt(2.0 / m))


def _logistic_ll(eta: np.ndarray, y: np.ndarray) -> np.ndarray:
    return y * eta - np.logaddexp(0.0, eta)


def _residual_sum(x, y, t, L, w0, w1, B, c_g, c_H, clip=True):
    z = x @ L
    eta_t = x @ t
    p = 1.0 / (1.0 + np.exp(-eta_t))
    rows = tl.clip_rank_one_rows(z, y - p, p * (1 - p), c_g, c_H)
    rho = tl.residual_rows(
        _logistic_ll(eta_t + z @ w1, y), _logistic_ll(eta_t + z @ w0, y), rows, w1, w0
    )
    return tl.clipped_residual_sum(rho, B)[0] if clip else float(rho.sum())


@pytest.mark.parametrize("relation", ["substitute", "add_remove"])
def test_clipped_residual_sum_moves_at_most_its_sensitivity(relation: str) -> None:
    rng = np.random.default_rng(5)
    n, d = 300, 3
    x = rng.normal(size=(n, d))
    x[0] = 50.0  # a far-out row already in the data: its residual sits at the clip
    y = (rng.random(n) < 0.4).astype(float)
    t, L = np.array([0.2, -0.1, 0.3]), 0.1 * np.eye(d)
    w0, w1 = rng.normal(size=d), rng.normal(size=d)
    B = tl.residual_bound(w0, w1, r=1e-4, power=2)
    assert B == tl.residual_bound(w1, w0, r=1e-4, power=2)  # symmetric
    delta = tl.residual_sensitivity(B, relation)
    s0 = _residual_sum(x, y, t, L, w0, w1, B, 0.2, 0.05)
    # a row whose linear predictor changes sign along the move, either way: its residual is
    # large of either sign (concave rows alone give one sign)
    a, b = t + L @ w0, t + L @ w1
    v = a / np.linalg.norm(a) - b / np.linalg.norm(b)
    extremes = [np.full(d, 1e8), -np.full(d, 1e150), np.zeros(d), -1e3 * x[0], 1e6 * v, -1e6 * v]
    worst = 0.0
    for j in (0, 7, 123):
        for xe in extremes:
            for ye in (0.0, 1.0):
                if relation == "substitute":
                    x1, y1 = x.copy(), y.copy()
                    x1[j], y1[j] = xe, ye
                    cases = [(x1, y1)]
                else:
                    cases = [
                        (np.vstack([x, xe]), np.append(y, ye)),
                        (np.delete(x, j, 0), np.delete(y, j)),
                    ]
                for x1, y1 in cases:
                    with np.errstate(over="ignore", invalid="ignore"):
                        s1 = _residual_sum(x1, y1, t, L, w0, w1, B, 0.2, 0.05)
                    worst = max(worst, abs(s1 - s0))
    assert worst <= delta * (1 + RTOL)
    assert worst >= 0.99 * delta  # the extreme rows reach it

    # must-fail control: the unclipped residual of a far-out row exceeds the claim
    x1 = x.copy()
    x1[1] = np.full(d, 1e3)
    u0 = _residual_sum(x, y, t, L, w0, w1, B, 0.2, 0.05, clip=False)
    u1 = _residual_sum(x1, y, t, L, w0, w1, B, 0.2, 0.05, clip=False)
    assert abs(u1 - u0) > delta


def _gauss_problem(seed: int):
    rng = np.random.default_rng(seed)
    n, d, sig, tau = 200, 2, 1.5, 3.0
    theta = np.array([0.7, -1.2])
    y = theta + sig * rng.normal(size=(n, d))
    t = np.array([0.5, -1.0])
    L = np.array([[0.12, 0.0], [0.05, 0.09]])
    return rng, n, d, sig, tau, y, t, L


def _gauss_ll_rows(y, t, L, w, sig):
    x = t + L @ w
    return -np.sum((y - x) ** 2, axis=1) / (2 * sig**2)


def _gauss_closed_form(n, sig, tau, y, t, L, xi_G, Xi_H):
    """Tilted target in w: precision Q and linear term b (log density -w'Qw/2 + b.w)."""
    LtL = L.T @ L
    Q = LtL * (n / sig**2 + 1 / tau**2) - Xi_H
    b = L.T @ ((y - t).sum(axis=0) / sig**2 - t / tau**2) + xi_G
    return Q, b


@pytest.mark.parametrize("c_g", [1e6, 0.05])  # no clipping; most gradients clipped
def test_tilted_target_matches_the_closed_form_on_a_conjugate_gaussian(c_g: float) -> None:
    rng, n, d, sig, tau, y, t, L = _gauss_problem(6)
    g = (y - t) / sig**2
    H = np.repeat(-np.eye(d)[None] / sig**2, n, axis=0)
    gw, Hw = tl.whiten_rows(g, H, L)
    rows = tl.clip_rows(gw, Hw, c_g, 0.01)
    release = tl.release_sums(rows, c_g, 0.01, mu_G=0.5, mu_H=0.5, rng=rng)
    G, Hs = rows.sums()
    xi_G, Xi_H = release.G - G, release.H - Hs
    Q, b = _gauss_closed_form(n, sig, tau, y, t, L, xi_G, Xi_H)

    def log_prior(w):
        return -np.sum((t + L @ w) ** 2) / (2 * tau**2)

    for _ in range(20):
        w0, w1 = rng.normal(size=d), rng.normal(size=d)
        rho = tl.residual_rows(
            _gauss_ll_rows(y, t, L, w1, sig), _gauss_ll_rows(y, t, L, w0, sig), rows, w1, w0
        )
        if c_g > 1e3:  # Gaussian-linear rows: the second-order model is exact
            assert np.max(np.abs(rho)) < 1e-9
        lr = tl.taylor_log_ratio(release, w0, w1, rho.sum(), 0.0, log_prior(w1) - log_prior(w0))
        closed = (-w1 @ Q @ w1 / 2 + b @ w1) - (-w0 @ Q @ w0 / 2 + b @ w0)
        np.testing.assert_allclose(lr, closed, rtol=1e-9, atol=1e-9)
        direct = tl.tilted_log_target(
            log_prior(w1), _gauss_ll_rows(y, t, L, w1, sig).sum(), w1, xi_G, Xi_H
        ) - tl.tilted_log_target(
            log_prior(w0), _gauss_ll_rows(y, t, L, w0, sig).sum(), w0, xi_G, Xi_H
        )
        np.testing.assert_allclose(lr, direct, rtol=1e-9, atol=1e-9)


def test_tilted_target_fails_when_the_residual_clip_is_active() -> None:
    """Must-fail control: clipped rows' residuals clipped at a small B break the identity."""
    rng, n, d, sig, tau, y, t, L = _gauss_problem(7)
    gw, Hw = tl.whiten_rows((y - t) / sig**2, np.repeat(-np.eye(d)[None] / sig**2, n, 0), L)
    rows = tl.clip_rows(gw, Hw, 0.05, 0.01)
    release = tl.release_sums(rows, 0.05, 0.01, 0.5, 0.5, rng)
    G, Hs = rows.sums()
    Q, b = _gauss_closed_form(n, sig, tau, y, t, L, release.G - G, release.H - Hs)
    w0, w1 = np.array([1.0, 0.5]), np.array([-0.5, 1.5])
    rho = tl.residual_rows(
        _gauss_ll_rows(y, t, L, w1, sig), _gauss_ll_rows(y, t, L, w0, sig), rows, w1, w0
    )
    clipped, count = tl.clipped_residual_sum(rho, tl.residual_bound(w0, w1, 1e-6, 2))
    assert count > 0
    lp = -np.sum((t + L @ w1) ** 2) / (2 * tau**2) + np.sum((t + L @ w0) ** 2) / (2 * tau**2)
    lr = tl.taylor_log_ratio(release, w0, w1, clipped, 0.0, lp)
    closed = (-w1 @ Q @ w1 / 2 + b @ w1) - (-w0 @ Q @ w0 / 2 + b @ w0)
    assert abs(lr - closed) > 1e-3  # the passing case agrees to 1e-9


@pytest.mark.slow
def test_penalty_chain_samples_the_tilted_gaussian() -> None:
    """A penalty chain (noise sd 1 on the residual) has the closed-form tilted mean and var."""
    rng, n, d, sig, tau, y, t, L = _gauss_problem(8)
    gw, Hw = tl.whiten_rows((y - t) / sig**2, np.repeat(-np.eye(d)[None] / sig**2, n, 0), L)
    rows = tl.clip_rows(gw, Hw, 1e6, 1e6)
    release = tl.release_sums(rows, 1e6, 1e6, mu_G=1e6 / 0.6, mu_H=1e6 / 0.05, rng=rng)
    G, Hs = rows.sums()
    Q, b = _gauss_closed_form(n, sig, tau, y, t, L, release.G - G, release.H - Hs)
    S = np.linalg.inv(Q)
    mean = S @ b
    chain_rng = np.random.default_rng(9)
    w = mean.copy()
    ll = _gauss_ll_rows(y, t, L, w, sig)
    steps, s_noise = 40000, 1.0
    out = np.empty((steps, d))
    chol = np.linalg.cholesky(S)
    for k in range(steps):
        w1 = w + 1.2 * chol @ chain_rng.normal(size=d)
        ll1 = _gauss_ll_rows(y, t, L, w1, sig)
        rho = tl.residual_rows(ll1, ll, rows, w1, w)
        res, _ = tl.clipped_residual_sum(rho, np.inf)
        lp = (np.sum((t + L @ w) ** 2) - np.sum((t + L @ w1) ** 2)) / (2 * tau**2)
        lr = tl.taylor_log_ratio(release, w, w1, res + s_noise * chain_rng.normal(), s_noise, lp)
        if np.log(chain_rng.random()) < lr:
            w, ll = w1, ll1
        out[k] = w
    # batch-means Monte Carlo standard errors
    batches = out.reshape(100, -1, d).mean(axis=1)
    se = batches.std(axis=0, ddof=1) / np.sqrt(100)
    assert np.all(np.abs(out.mean(0) - mean) < 4 * se)
    var_b = ((out - mean) ** 2).reshape(100, -1, d).mean(axis=1)
    se_v = var_b.std(axis=0, ddof=1) / np.sqrt(100)
    assert np.all(np.abs(var_b.mean(0) - np.diag(S)) < 4 * se_v)
    # and it is not the untilted posterior (the one-shot noise moved it by several se)
    Q0, b0 = _gauss_closed_form(n, sig, tau, y, t, L, np.zeros(d), np.zeros((d, d)))
    assert np.max(np.abs(out.mean(0) - np.linalg.solve(Q0, b0)) / se) > 8


def test_noise_aware_draws_integrate_the_release_noise() -> None:
    rng = np.random.default_rng(10)
    d, m = 3, 20000
    A = rng.normal(size=(d, d))
    cov = A @ A.T / d + np.eye(d)
    mean = rng.normal(size=d)
    draws = rng.multivariate_normal(mean, cov, size=m)
    same = tl.noise_aware_draws(draws, 0.0, 0.0, rng)
    np.testing.assert_allclose(same, draws, atol=1e-9)
    out = tl.noise_aware_draws(draws, 0.8, 0.02, rng)
    # first order: covariance cov + sd_G^2 cov^2 (cov = Q^{-1}); Xi_H adds O(sd_H^2)
    target = cov + 0.8**2 * cov @ cov
    emp = np.cov(out, rowvar=False)
    se = np.sqrt((target**2 + np.outer(np.diag(target), np.diag(target))) / m)
    assert np.all(np.abs(emp - target) < 5 * se + 0.02 * np.abs(target))
    assert np.all(np.abs(out.mean(0) - mean) < 5 * np.sqrt(np.diag(target) / m))
    # must-fail: the raw draws' covariance misses the noise term
    assert np.max(np.abs(np.cov(draws, rowvar=False) - target) / se) > 20


@pytest.mark.parametrize("relation", ["substitute", "add_remove"])
def test_noisy_histogram_counts_move_at_most_their_sensitivity(relation: str) -> None:
    from pymc_penalty.privacy.taylor import clips as tc

    rng = np.random.default_rng(11)
    v = rng.lognormal(size=200)
    edges = tc.geometric_edges(1.0, -8, 8)
    delta = tc.histogram_sensitivity(relation)

    def counts(values):
        idx = np.searchsorted(edges, np.where(np.isnan(values), np.inf, values), side="left")
        return np.bincount(idx, minlength=len(edges) + 1)

    base = counts(v)
    worst = 0.0
    for j in (0, 50, 199):
        for ve in (0.0, 1e300, -5.0, np.nan, v[j] * 1e6):
            if relation == "substitute":
                v1 = v.copy()
                v1[j] = ve
                cases = [v1]
            else:
                cases = [np.append(v, ve), np.delete(v, j)]
            for v1 in cases:
                worst = max(worst, float(np.linalg.norm(counts(v1) - base)))
    assert worst <= delta * (1 + RTOL) and worst >= 0.999 * delta
    # must-fail: a count per row and per edge crossed (tail counts) moves by sqrt(#edges)
    tails = np.array([np.sum(v > e) for e in edges])
    v1 = v.copy()
    v1[0] = 1e300
    tails1 = np.array([np.sum(v1 > e) for e in edges])
    assert np.linalg.norm(tails1 - tails) > delta
    # the release is the exact histogram plus noise of the stated sd
    noisy, sd = tc.noisy_histogram(v, edges, 2.0, np.random.default_rng(0), relation)
    assert sd == delta / 2.0
    assert np.all(np.abs(noisy - base) < 6 * sd)


def test_noisy_quantile_reads_a_resolvable_quantile() -> None:
    from pymc_penalty.privacy.taylor import clips as tc

    rng = np.random.default_rng(12)
    v = np.sqrt(rng.chisquare(4, size=10_000))
    edges = tc.geometric_edges(1.0, -24, 24, 4)
    q90 = np.quantile(v, 0.9)
    for seed in range(20):
        noisy, sd = tc.noisy_histogram(v, edges, mu=0.05, rng=np.random.default_rng(seed))
        got = tc.noisy_quantile(edges, noisy, sd, 0.9)
        # within one bin (2^(1/4)) of the truth, above it at most by a bin and a noise margin
        assert q90 / 2**0.25 <= got <= q90 * 2**0.5, (seed, got, q90)


def test_a_thin_tail_below_each_bins_noise_is_read() -> None:
    """A tail of 1000 rows spread over 10 bins, 100 a bin, each below its own noise (sd 132,
    the one-shot's first-stage histograms at epsilon 0.5 and n = 1e4). The count of rows
    above an edge, read from the top of the data down with every bin's noise, puts the 97%
    quantile (300 rows above it) within 2 bins of the truth at the median of 400 releases
    (its own noise, about 5 bins' worth of rows, spreads it either way). The reading before
    2026-11-28 (bins below ``k`` sds read as empty: the must-fail side, the same releases)
    loses the tail and lands at the bulk's top, 7 bins low, at the median."""
    from pymc_penalty.privacy.taylor import clips as tc

    edges = tc.geometric_edges(1.0, -24, 56, 4)
    counts = np.zeros(len(edges) + 1)
    counts[20:30] = 900.0  # the bulk: 9000 rows
    counts[30:40] = 100.0  # the tail: 1000 rows
    truth = 36  # 300 rows lie above edge 36 (bins 37 to 39)
    sd = 132.0
    now, before = [], []
    for seed in range(400):
        noisy = np.round(counts + np.random.default_rng(seed).normal(0.0, sd, counts.size))
        got = tc.clip_by_tail(edges, noisy, sd, tail=300.0)
        now.append(int(np.searchsorted(edges, got)) - truth)
        old = tc.clip_by_visible_tail(edges, noisy, sd, tail=300.0)  # the old reading
        before.append(int(np.searchsorted(edges, old)) - truth)
    assert abs(np.median(now)) <= 2.0, np.median(now)
    assert np.median(before) <= -5.0, np.median(before)


def test_tilt_mean_sd_is_the_g_noise_error_of_the_means_in_posterior_sds() -> None:
    """``tilt_mean_sd`` against an independent computation: the mode of a Gaussian target
    tilted by ``xi . u`` (``u = L^-1 (x - t)[index]``), solved from its normal equations for
    many noise draws, moves each mean by a sd that, over the target's sd, has the RMS the
    function gives (Monte Carlo, 4000 draws: relative standard error about 1%); a whitening
    narrower than the posterior gives a larger error than ``sd_G`` (the must-differ case)."""
    rng = np.random.default_rng(7)
    A = rng.normal(size=(3, 3))
    C = A @ A.T + 0.5 * np.eye(3)
    index = np.array([0, 2])
    L = np.linalg.cholesky(C[np.ix_(index, index)]) * np.array([[0.4, 0.0], [0.1, 1.7]])
    sd_G = 0.8
    P = np.linalg.inv(C)
    Et = np.zeros((3, 2))
    Et[index, :] = np.linalg.inv(L).T  # E' (E x = L^-1 x[index])
    xi = sd_G * rng.standard_normal((4000, 2))
    shifts = np.linalg.solve(P, Et @ xi.T).T  # the tilted mode minus the untilted
    expected = np.sqrt(np.mean(shifts.var(axis=0) / np.diag(C)))
    assert tl.tilt_mean_sd(C, L, sd_G, index) == pytest.approx(expected, rel=0.04)
    # The whitening is the posterior's: the error is sd_G itself.
    assert tl.tilt_mean_sd(C, np.linalg.cholesky(C), sd_G) == pytest.approx(sd_G, rel=1e-12)
    # Five times narrower than the posterior: five times sd_G, not sd_G.
    narrow = tl.tilt_mean_sd(C, np.linalg.cholesky(C) / 5.0, sd_G)
    assert narrow == pytest.approx(5.0 * sd_G, rel=1e-12) and narrow > 4.0 * sd_G


def test_an_empty_bin_snapped_to_one_is_not_read_as_a_row_at_a_small_noise_sd() -> None:
    """At a noise sd below ``1 / k`` (an enormous budget: 0.224 is add/remove-one's at
    epsilon 2000 on the one-shot's histograms) an empty bin's noise snaps it to one in about
    1.3% of bins, above ``k`` sds: read as a row, such a bin in the top half of an 82-bin
    histogram sent the clip to its edge (the sharded and in-process Taylor posteriors 10 sds
    off, "converged"). The reading counts the snap's half-grid: the clip is the rows' own
    edge in at least 97% of 300 releases (binomial, expected about 99%), where a reading
    without it (the must-fail side, the same releases) goes astray in over a fifth."""
    from pymc_penalty.privacy.taylor import clips as tc

    edges = tc.geometric_edges(1.0, -24, 56, 4)  # 82 bins, as the one-shot's
    values = np.full(602, 1.1)  # every row in one bin
    truth = float(edges[np.searchsorted(edges, 1.1)])
    sd = 1.0 / 4.47
    k = float(np.sqrt(2.0 * np.log((len(edges) + 1) / 0.01)))
    right = astray = 0
    for seed in range(300):
        noisy, sd_out = tc.noisy_counts(
            tc.histogram_counts(values, edges), 4.47, np.random.default_rng(seed), "add_remove"
        )
        assert sd_out == pytest.approx(sd)
        right += tc.clip_by_tail(edges, noisy, sd_out, tail=0.5) == truth
        # the old reading: counts above k sds, the snap ignored
        kept = np.where(noisy > k * sd_out, noisy, 0.0)
        above = np.cumsum(kept[::-1])[::-1]
        old = next((float(c) for j, c in enumerate(edges) if above[j + 1] <= 0.5), edges[-1])
        astray += old != truth
    assert right >= 0.97 * 300, right
    assert astray > 0.2 * 300, astray
