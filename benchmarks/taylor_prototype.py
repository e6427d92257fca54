"""End-to-end NumPy prototype of the Taylor control-variate path (issue 27, items 1 and 2).

Per dataset (true parameter drawn from the prior, rows simulated from it):

1. a private warm start: ``--ws-rounds`` noisy Newton steps from the prior mean, each releasing
   a noisy histogram of the rows' whitened gradient and Hessian norms (to find its clips), then
   the clipped sums ``G`` and ``H`` in the current metric; its end is the public reference
   ``t`` and its released curvature the whitening factor ``L``;
2. the one-shot release at ``t`` (:mod:`pymc_penalty.privacy.taylor`): clips from two noisy
   histograms (:mod:`pymc_penalty.privacy.taylor.clips`), then ``G`` and ``H``;
3. the residual bound's constant ``r`` from a noisy histogram of the rows' residual ratios at
   public probe moves;
4. a penalty random walk in ``w`` (``x = t + L w``) that releases only the clipped residual sum
   per step (``--steps`` releases, equal shares of the residual budget);
5. noise-aware draws (:func:`pymc_penalty.privacy.taylor.noise_aware_draws`).

Every release is charged; the total ``mu^2`` equals ``gdp_mu(epsilon, 1e-5)^2`` (substitute-one
neighbours) and is asserted. The reference posterior is non-private: the Laplace approximation
at the exact mode corrected by self-normalised importance sampling (``--ref-draws`` draws).

Reported per cell (means over datasets): RMS error of the posterior mean in exact posterior sd
(noise-aware draws), mean and min sd ratio (noise-aware; raw chain in brackets), 90% interval
coverage of the true parameter (noise-aware and raw chain), the residual's clipped fraction per
step, acceptance, and the per-step cost ratio: ``mu^2`` per unit squared whitened distance of
today's plain release over the residual release's (first and second order), each with its
bound at the 99.9% per-row quantile of the chain's own moves (measured, not released).

Run ``python benchmarks/taylor_prototype.py [--quick]``; the last line is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pymc_penalty.accounting.gdp import gdp_mu
from pymc_penalty.privacy import taylor as tl
from pymc_penalty.privacy.taylor import clips as tc

DELTA = 1e-5
D = 4
WS_NEAR = 5.0  # the table's split: warm start within this many exact posterior sds
FLOOR = 1.0  # public floor of the residual bound's radius (whitened units)

# shares of the total mu^2 (they sum to 1)
SHARES = {
    "warm_start": 0.15,
    "hist_g": 0.02,
    "hist_h": 0.02,
    "hist_r": 0.02,
    "G": 0.55,
    "H": 0.06,
    "residual": 0.18,
}
WS_ROUND_SHARES = {"hist_g": 0.05, "hist_h": 0.05, "G": 0.5, "H": 0.4}
WS_ROUND_WEIGHTS = (1.0, 2.0, 2.0, 2.0)  # later rounds, nearer the mode, get more
# clips: a public tail factor times the noisy 90% quantile of the rows' norms
CLIP_Q = 0.9
WS_FACTOR_G, WS_FACTOR_H = 2.0, 3.0


@dataclass(frozen=True)
class Glm:
    """Generalised linear rows: ``l(eta, y)``, ``dl/deta``, ``-d^2 l/deta^2``."""

    name: str
    ll: Callable[[np.ndarray, np.ndarray], np.ndarray]
    a: Callable[[np.ndarray, np.ndarray], np.ndarray]
    h: Callable[[np.ndarray, np.ndarray], np.ndarray]
    scales: np.ndarray  # covariate scales (first column: intercept)
    prior_mean: np.ndarray
    prior_sd: np.ndarray

    def simulate(self, n: int, rng: np.random.Generator):
        theta = self.prior_mean + self.prior_sd * rng.normal(size=D)
        x = rng.normal(size=(n, D)) * self.scales
        x[:, 0] = 1.0
        eta = x @ theta
        if self.name == "logistic":
            y = (rng.random(n) < 1.0 / (1.0 + np.exp(-eta))).astype(float)
        elif self.name == "poisson":
            y = rng.poisson(np.exp(eta)).astype(float)
        else:
            y = eta + rng.normal(size=n)
        return theta, x, y


def _sigmoid(e: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * e))


MODELS = {
    "logistic": Glm(
        "logistic",
        lambda e, y: y * e - np.logaddexp(0.0, e),
        lambda e, y: y - _sigmoid(e),
        lambda e, y: _sigmoid(e) * (1.0 - _sigmoid(e)),
        np.array([1.0, 1.0, 10.0, 0.1]),
        np.zeros(D),
        np.array([1.0, 0.5, 0.05, 5.0]),
    ),
    "poisson": Glm(
        "poisson",
        lambda e, y: y * e - np.exp(e),
        lambda e, y: y - np.exp(e),
        lambda e, y: np.exp(e),
        np.array([1.0, 0.5, 0.5, 0.5]),
        np.array([1.0, 0.0, 0.0, 0.0]),
        np.full(D, 0.5),
    ),
    "linear": Glm(
        "linear",
        lambda e, y: -0.5 * (y - e) ** 2,
        lambda e, y: y - e,
        lambda e, y: np.ones_like(e),
        np.array([1.0, 1.0, 3.0, 0.3]),
        np.zeros(D),
        np.ones(D),
    ),
}


def _log_prior(m: Glm, theta: np.ndarray) -> float:
    return float(-0.5 * np.sum(((theta - m.prior_mean) / m.prior_sd) ** 2))


class Ledger:
    """Charges ``mu^2`` before a release; refuses to pass the budget."""

    def __init__(self, mu2_total: float) -> None:
        self.total, self.spent = mu2_total, 0.0

    def charge(self, mu: float) -> float:
        self.spent += mu**2
        if self.spent > self.total * (1 + 1e-9):
            raise RuntimeError(f"budget exceeded: {self.spent} > {self.total}")
        return mu


def _newton(G, H, L, m: Glm, theta, cap: float, floor: float = 0.0):
    """Newton step in whitened coordinates from released sums plus the exact prior.

    The precision's eigenvalues are raised to ``floor`` (three noise sds of the released
    Hessian's spectrum: a direction the noise can cancel is not trusted to be that flat).
    """
    g = G + L.T @ (-(theta - m.prior_mean) / m.prior_sd**2)
    P = -H + L.T @ np.diag(1.0 / m.prior_sd**2) @ L
    P = (P + P.T) / 2.0
    lam, V = np.linalg.eigh(P)
    lam = np.maximum(lam, max(max(lam.max(), 1e-12) * 1e-3, floor))
    P = (V * lam) @ V.T
    w = np.linalg.solve(P, g)
    norm = np.linalg.norm(w)
    if norm > cap:
        w *= cap / norm
    return w, P


def _row_terms(m: Glm, x, y, theta, L):
    z = x @ L
    eta = x @ theta
    return z, eta, m.a(eta, y), m.h(eta, y)


def warm_start(m: Glm, x, y, ledger: Ledger, mu2_ws: float, rounds: int, rng):
    n = len(y)
    theta, L = m.prior_mean.astype(float).copy(), np.diag(m.prior_sd).astype(float)
    for k in range(rounds):
        mu2 = mu2_ws * WS_ROUND_WEIGHTS[k] / sum(WS_ROUND_WEIGHTS[:rounds])
        z, eta, a, h = _row_terms(m, x, y, theta, L)
        zn = np.linalg.norm(z, axis=1)
        mu_G = ledger.charge(np.sqrt(WS_ROUND_SHARES["G"] * mu2))
        mu_H = ledger.charge(np.sqrt(WS_ROUND_SHARES["H"] * mu2))
        e_g = tc.geometric_edges(np.sqrt(D / n), -24, 56, 4)
        cnt, sd = tc.noisy_histogram(
            np.abs(a) * zn, e_g, ledger.charge(np.sqrt(WS_ROUND_SHARES["hist_g"] * mu2)), rng
        )
        c_g = tc.clip_by_scale(e_g, cnt, sd, CLIP_Q, WS_FACTOR_G)
        e_h = tc.geometric_edges(D / n, -24, 56, 4)
        cnt, sd = tc.noisy_histogram(
            np.abs(h) * zn**2, e_h, ledger.charge(np.sqrt(WS_ROUND_SHARES["hist_h"] * mu2)), rng
        )
        c_H = tc.clip_by_scale(e_h, cnt, sd, CLIP_Q, WS_FACTOR_H)
        rows = tl.clip_rank_one_rows(z, a, h, c_g, c_H)
        rel = tl.release_sums(rows, c_g, c_H, mu_G, mu_H, rng)
        # the first step is in the prior's metric (4 prior sds at most), later ones in the
        # released posterior metric, where a far start is many sds away
        floor = tl.curvature_floor(rel.sd_H, D)
        w, P = _newton(rel.G, rel.H, L, m, theta, cap=4.0 if k == 0 else 1e3, floor=floor)
        theta = theta + L @ w
        L = L @ np.linalg.cholesky(np.linalg.inv(P))
    return theta, L


def exact_reference(m: Glm, x, y, start, draws: int, rng):
    """Exact mode by Newton, Laplace proposal, self-normalised importance sampling."""

    def log_post(th):
        return float(m.ll(x @ th, y).sum()) + _log_prior(m, th)

    theta = start.copy()
    lp = log_post(theta)
    for _ in range(100):
        eta = x @ theta
        g = x.T @ m.a(eta, y) - (theta - m.prior_mean) / m.prior_sd**2
        Hm = (x * m.h(eta, y)[:, None]).T @ x + np.diag(1.0 / m.prior_sd**2)
        step = np.linalg.solve(Hm, g)
        for _ in range(60):  # damped: the log posterior must not fall
            cand = theta + step
            lp_c = log_post(cand)
            if lp_c >= lp - 1e-9:
                break
            step = step / 2.0
        theta, lp = cand, lp_c
        if np.max(np.abs(step)) < 1e-12:
            break
    eta = x @ theta
    Hm = (x * m.h(eta, y)[:, None]).T @ x + np.diag(1.0 / m.prior_sd**2)
    cov = np.linalg.inv(Hm)
    C = np.linalg.cholesky(cov) * 1.1
    props = theta + rng.normal(size=(draws, D)) @ C.T
    logq = -0.5 * np.sum(np.linalg.solve(C, (props - theta).T) ** 2, axis=0)
    logp = np.empty(draws)
    for s in range(0, draws, 100):
        eta = x @ props[s : s + 100].T
        logp[s : s + 100] = m.ll(eta, y[:, None]).sum(axis=0) - 0.5 * np.sum(
            ((props[s : s + 100] - m.prior_mean) / m.prior_sd) ** 2, axis=1
        )
    lw = logp - logq
    wts = np.exp(lw - lw.max())
    wts /= wts.sum()
    mean = wts @ props
    sd = np.sqrt(wts @ (props - mean) ** 2)
    return mean, sd, 1.0 / np.sum(wts**2)


def run_one(m: Glm, n: int, epsilon: float, seed: int, steps: int, order: int, args) -> dict:
    data_rng = np.random.default_rng([27, seed, n])
    rng = np.random.default_rng([2700, seed, n, int(epsilon * 100), order])  # privacy noise
    theta_true, x, y = m.simulate(n, data_rng)
    mu_total = gdp_mu(epsilon, DELTA)
    ledger = Ledger(mu_total**2)
    share = {k: v * mu_total**2 for k, v in SHARES.items()}

    t, L = warm_start(m, x, y, ledger, share["warm_start"], args.ws_rounds, rng)

    # one-shot release at t
    z, eta_t, a, h = _row_terms(m, x, y, t, L)
    zn = np.linalg.norm(z, axis=1)
    if order == 1:  # no Hessian release: its shares go to G
        share["G"] += share.pop("H") + share.pop("hist_h")
    mu_G = ledger.charge(np.sqrt(share["G"]))
    mu_H = ledger.charge(np.sqrt(share["H"])) if order == 2 else 0.0
    e_g = tc.geometric_edges(np.sqrt(D / n), -24, 56, 4)
    cnt, sd = tc.noisy_histogram(np.abs(a) * zn, e_g, ledger.charge(np.sqrt(share["hist_g"])), rng)
    c_g = tc.clip_by_scale(e_g, cnt, sd, CLIP_Q, args.factor_g)
    c_H = None
    if order == 2:
        e_h = tc.geometric_edges(D / n, -24, 56, 4)
        cnt, sd = tc.noisy_histogram(
            np.abs(h) * zn**2, e_h, ledger.charge(np.sqrt(share["hist_h"])), rng
        )
        c_H = tc.clip_by_scale(e_h, cnt, sd, CLIP_Q, args.factor_h)
    rows = tl.clip_rank_one_rows(z, a, h if order == 2 else None, c_g, c_H)
    rel = tl.release_sums(rows, c_g, c_H, mu_G, mu_H, rng)
    H_rel = rel.H if rel.H is not None else -np.eye(D)  # first order: the warm start's metric
    w_hat, P = _newton(rel.G, H_rel, L, m, t, cap=1e3)
    prop_chol = np.linalg.cholesky(np.linalg.inv(P)) * 2.4 / np.sqrt(D)

    # residual bound constant r from public probe moves around w_hat
    probe = np.random.default_rng([99, seed])  # public probes
    v = np.zeros(n)
    for _ in range(8):
        w0 = w_hat + np.linalg.cholesky(np.linalg.inv(P)) @ probe.normal(size=D)
        w1 = w0 + prop_chol @ probe.normal(size=D)
        rho = tl.residual_rows(m.ll(eta_t + z @ w1, y), m.ll(eta_t + z @ w0, y), rows, w1, w0)
        radius = max(np.linalg.norm(w0), np.linalg.norm(w1), FLOOR)
        v = np.maximum(v, np.abs(rho) / (radius**order * np.linalg.norm(w1 - w0)))
    e_r = tc.geometric_edges((D / n) ** ((order + 1) / 2), -16, 32)
    cnt, sd = tc.noisy_histogram(v, e_r, ledger.charge(np.sqrt(share["hist_r"])), rng)
    r = 2.0 * tc.clip_by_visible_tail(e_r, cnt, sd, tail=1e-3 * n)  # as the package reads it

    # the residual penalty chain
    mu_step = ledger.charge(np.sqrt(share["residual"] / steps))
    for _ in range(steps - 1):
        ledger.charge(mu_step)
    assert abs(ledger.spent - ledger.total) <= 1e-9 * ledger.total, (ledger.spent, ledger.total)

    w = w_hat.copy()
    ll0 = m.ll(eta_t + z @ w, y)
    m0 = rows.model(w)
    lp0 = _log_prior(m, t + L @ w)
    M0 = rel.model(w) if rel.H is not None else float(rel.G @ w)
    W = np.empty((steps, D))
    accepted = clipped_rows = 0
    cost_plain, cost_1, cost_2 = [], [], []
    g_first = rows.g
    for k in range(steps):
        w1 = w + prop_chol @ rng.normal(size=D)
        dw = float(np.linalg.norm(w1 - w))
        radius = max(float(np.linalg.norm(w)), float(np.linalg.norm(w1)), FLOOR)
        B = tl.residual_bound(w, w1, r, order, FLOOR)
        s = tl.residual_sensitivity(B) / mu_step
        ll1 = m.ll(eta_t + z @ w1, y)
        m1 = rows.model(w1)
        rho = (ll1 - m1) - (ll0 - m0)
        rho = np.where(np.isnan(rho), -np.inf, rho)
        res, nclip = tl.clipped_residual_sum(rho, B)
        clipped_rows += nclip
        lp1 = _log_prior(m, t + L @ w1)
        M1 = rel.model(w1)
        log_ratio = lp1 - lp0 + M1 - M0 + res + s * rng.normal() - 0.5 * s**2
        if k % 10 == 0:  # measured cost, not released
            dll = ll1 - ll0
            cost_plain.append(np.quantile(np.abs(dll), 0.999) ** 2 / dw**2)
            r1 = dll - g_first @ (w1 - w)
            cost_1.append(np.quantile(np.abs(r1) / (radius * dw), 0.999) ** 2 * radius**2)
            if order == 2:
                cost_2.append(np.quantile(np.abs(rho) / (radius**2 * dw), 0.999) ** 2 * radius**4)
        if np.log(rng.random()) < log_ratio:
            w, ll0, m0, lp0, M0 = w1, ll1, m1, lp1, M1
            accepted += 1
        W[k] = w
    W = W[steps // 10 :]

    ref_mean, ref_sd, ref_ess = exact_reference(
        m, x, y, t, args.ref_draws, np.random.default_rng([7, seed])
    )
    post_rng = np.random.default_rng([8, seed])
    try:
        W_na = tl.noise_aware_draws(W, rel.sd_G, rel.sd_H, post_rng)
        frozen = False
    except np.linalg.LinAlgError:  # the draws do not span the space: a stuck chain
        W_na, frozen = W, True
    out = {}
    for tag, Wd in (("na", W_na), ("raw", W)):
        th = t + Wd @ L.T
        mean, sdv = th.mean(axis=0), th.std(axis=0)
        lo, hi = np.quantile(th, [0.05, 0.95], axis=0)
        out[tag] = {
            "err": ((mean - ref_mean) / ref_sd).tolist(),
            "sd_ratio": (sdv / ref_sd).tolist(),
            "cover": ((lo <= theta_true) & (theta_true <= hi)).tolist(),
        }
    return {
        **out,
        "accept": accepted / steps,
        "frozen": frozen,
        "r_units": r / (D / n) ** ((order + 1) / 2),
        "w_hat_norm": float(np.linalg.norm(w_hat)),
        "clipped_fraction": clipped_rows / (steps * n),
        "ws_err": float(np.sqrt(np.mean(((t - ref_mean) / ref_sd) ** 2))),
        "cost_ratio_1": float(np.mean(cost_plain) / np.mean(cost_1)),
        "cost_ratio_2": float(np.mean(cost_plain) / np.mean(cost_2)) if cost_2 else None,
        "sd_G": rel.sd_G,
        "oneshot_clipped_g": float(rows.g_clipped.mean()),
        "oneshot_clipped_H": float(rows.H_clipped.mean()),
        "c_g_sqrt_n": c_g * np.sqrt(n),
        "ref_ess": ref_ess,
    }


def summarise(runs: list[dict]) -> dict:
    def arr(tag, key):
        return np.array([r[tag][key] for r in runs], dtype=float)

    cell = {
        "rms": float(np.sqrt(np.mean(arr("na", "err") ** 2))),
        "sd_ratio": float(np.mean(arr("na", "sd_ratio"))),
        "sd_ratio_min": float(np.min(np.mean(arr("na", "sd_ratio"), axis=0))),
        "sd_ratio_raw": float(np.mean(arr("raw", "sd_ratio"))),
        "cover": float(np.mean(arr("na", "cover"))),
        "cover_raw": float(np.mean(arr("raw", "cover"))),
        "ws_rms": float(np.sqrt(np.mean([r["ws_err"] ** 2 for r in runs]))),
        "accept": float(np.mean([r["accept"] for r in runs])),
        "clipped": float(np.mean([r["clipped_fraction"] for r in runs])),
        "cost1": float(np.median([r["cost_ratio_1"] for r in runs])),
        "c_g": float(np.median([r["c_g_sqrt_n"] for r in runs])),
        "g_clip": float(np.mean([r["oneshot_clipped_g"] for r in runs])),
        "sd_G": float(np.mean([r["sd_G"] for r in runs])),
        "datasets": len(runs),
        "frozen": int(sum(r["frozen"] for r in runs)),
    }
    # diagnostic split: datasets whose (simulated) warm start ended within WS_NEAR sds
    near = [r for r in runs if r["ws_err"] <= WS_NEAR]
    cell["near_datasets"] = len(near)
    if near:
        cell["rms_near"] = float(np.sqrt(np.mean(np.array([r["na"]["err"] for r in near]) ** 2)))
        cell["cover_near"] = float(np.mean([r["na"]["cover"] for r in near]))
    c2 = [r["cost_ratio_2"] for r in runs if r["cost_ratio_2"] is not None]
    cell["cost2"] = float(np.median(c2)) if c2 else None
    return cell


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="n = 1e4, epsilon 2, 3 datasets")
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--n", nargs="+", type=int, default=[10_000, 100_000])
    p.add_argument("--epsilon", nargs="+", type=float, default=[1.0, 2.0])
    p.add_argument("--datasets", type=int, default=20)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--order", type=int, choices=[1, 2], default=2)
    p.add_argument("--ws-rounds", type=int, default=3)
    p.add_argument("--ref-draws", type=int, default=1000)
    p.add_argument("--per-run", action="store_true", help="print a RUN json line per dataset")
    p.add_argument("--factor-g", type=float, default=2.5, help="one-shot c_g over the 90%% q")
    p.add_argument("--factor-h", type=float, default=4.0, help="one-shot c_H over the 90%% q")
    args = p.parse_args()
    if args.quick:
        args.n, args.epsilon, args.datasets, args.steps = [10_000], [2.0], 3, 600
    t0 = time.time()
    cells = {}
    hdr = (
        f"{'model':9} {'n':>7} {'eps':>4} {'rms':>6} {'ws_rms':>6} {'sd_rat':>6} {'(raw)':>6} "
        f"{'sd_min':>6} {'cover':>6} {'(raw)':>6} {'acc':>5} {'clip%':>7} {'c_g':>5} "
        f"{'g_clip%':>7} {'sd_G':>5} {'cost1x':>8} {'cost2x':>9}"
    )
    print(f"order {args.order}, {args.steps} residual steps, shares {SHARES}")
    print(hdr)
    for name in args.models:
        for n in args.n:
            for eps in args.epsilon:
                runs = []
                for s in range(args.datasets):
                    runs.append(run_one(MODELS[name], n, eps, s, args.steps, args.order, args))
                    if args.per_run:
                        print(
                            "RUN "
                            + json.dumps(
                                {"model": name, "n": n, "eps": eps, "seed": s, **runs[-1]}
                            ),
                            flush=True,
                        )
                c = summarise(runs)
                cells[f"{name}/n={n}/eps={eps:g}"] = c
                c2 = f"{c['cost2']:9.3g}" if c["cost2"] is not None else f"{'-':>9}"
                print(
                    f"{name:9} {n:7d} {eps:4g} {c['rms']:6.3f} {c['ws_rms']:6.2f} "
                    f"{c['sd_ratio']:6.3f} {c['sd_ratio_raw']:6.3f} {c['sd_ratio_min']:6.3f} "
                    f"{c['cover']:6.3f} {c['cover_raw']:6.3f} {c['accept']:5.2f} "
                    f"{100 * c['clipped']:7.4f} {c['c_g']:5.2f} {100 * c['g_clip']:7.3f} "
                    f"{c['sd_G']:5.2f} {c['cost1']:8.3g} {c2}   near {c['near_datasets']:2d}: "
                    f"rms {c.get('rms_near', float('nan')):.3f} "
                    f"cover {c.get('cover_near', float('nan')):.3f}",
                    flush=True,
                )
    print(f"elapsed {time.time() - t0:.1f} s")
    print("RESULT " + json.dumps({"order": args.order, "steps": args.steps, "cells": cells}))


if __name__ == "__main__":
    main()
