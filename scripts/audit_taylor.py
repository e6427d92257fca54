"""Empirical privacy audit of the Taylor path (issue 27): the one-shot release and one step.

Two mechanisms, each on a Poisson regression (``n = 300``) and a worst-case neighbour, each
with a broken control that must fail:

(a) **The one-shot release** of the clipped Taylor sums ``G`` and ``H`` at a fixed public
    expansion point ``t``, whitening ``L`` and clips ``c_g``, ``c_H``. The per-row terms come
    from the package's own code path (``warmstart.taylor_terms.row_terms`` on the compiled
    likelihood of ``prepare_warm_start``, then ``privacy.taylor.clip_packed_rows`` and
    ``release_packed_sums``). Outputs audited: every coordinate of ``G`` and of ``H``'s upper
    triangle (black box), and the projection of the whitened release onto the exact
    difference of the two data sets' sums (the Neyman-Pearson statistic; white-box Gaussian
    fit of its ``mu``). The claim is ``sqrt(mu_G^2 + mu_H^2)`` (the clips are fixed here, so
    the histograms that choose them are not part of this release).
(b) **One residual step** of ``TaylorPenaltyMetropolis`` at a fixed pair ``(x0, x1)``, the
    released ``TaylorModel`` the same on both data sets (it is public) and each data set's
    own clipped row coefficients in the compiled likelihood. Output audited: the released
    ``d_hat`` (clipped residual sum + noise + the public model's difference; the statistic
    ``accept`` is a function of it), driven through the step's own ``_step_noise`` release as
    ``pymc_penalty.audit._step_release`` drives ``astep``. The claim is the step's ``mu``.

Neighbours: substitute-one (row 0, ``x = 3``: ``y = 100`` against ``y = 0``; both rows'
whitened gradients clip at ``c_g`` in opposite directions, both residuals clip at ``+B`` and
``-B``), and add/remove-one (that row present or absent: the sums move by exactly ``c_g`` and
``c_H``, the residual sum by ``B``). Broken controls: the one-shot release with its
sensitivity computed from ``c_g / 2`` and ``c_H / 2`` (noise sds halved), and the step with its
noise sd halved; both keep the honest claim.

Verdicts: an honest row passes when neither the black-box lower bound on epsilon nor the
white-box ``mu`` lower bound exceeds the claim (``AuditResult.exceeds_claim`` False); a broken
row must exceed it.

Run: ``python scripts/audit_taylor.py [runs]`` (default 20000 runs per data set), from the
repository root. Prints a table, then ``RESULT {json}``; exit status 1 if a verdict is wrong.
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from typing import Any

import numpy as np
import pymc as pm

from pymc_penalty.audit import audit_releases
from pymc_penalty.model.likelihood import RowControl
from pymc_penalty.privacy import taylor as tl
from pymc_penalty.sampling.taylor import TaylorModel, TaylorPenaltyMetropolis
from pymc_penalty.warmstart import prepare_warm_start
from pymc_penalty.warmstart.taylor import ONESHOT_SHARES
from pymc_penalty.warmstart.taylor_terms import Expansion, row_terms

N = 300
SEED = 20270127
T = np.array([0.5, 0.5])  # public expansion point (intercept, slope)
L = np.diag([0.1, 0.1])  # public whitening factor
ROW_X, ROW_Y, ROW_Y_PRIME = 3.0, 100.0, 0.0  # the worst-case row and its substitute
MU_ONESHOT = 1.0  # mu of the G/H release: shared as in ONESHOT_SHARES
MU_STEP = 1.0
X0, X1 = np.array([0.5, 0.45]), np.array([0.5, 0.55])  # the audited step's pair
COUNT_SHARE = 0.05  # the step's default clip_count_share (its clipped count is released too)
B_TARGET = 1.0  # residual bound at (X0, X1): r = B_TARGET / residual_length(X0, X1)


def data(relation: str) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """``(D, D')``: ``D`` has the worst-case row at index 0 (``y = 100`` at ``x = 3``);
    substitute-one replaces its ``y`` by 0, add/remove-one drops it."""
    rng = np.random.default_rng(SEED)
    x = rng.normal(size=N)
    y = rng.poisson(np.exp(T[0] + T[1] * x)).astype(float)
    x[0], y[0] = ROW_X, ROW_Y
    if relation == "substitute":
        y2 = y.copy()
        y2[0] = ROW_Y_PRIME
        return (x, y), (x.copy(), y2)
    return (x, y), (x[1:].copy(), y[1:].copy())


def poisson(dataset: tuple[np.ndarray, np.ndarray]) -> pm.Model:
    x, y = dataset
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 2.0)
        b = pm.Normal("b", 0.0, 2.0)
        pm.Poisson("y", mu=pm.math.exp(a + b * x), observed=y)
    return model


def row_coefficients(model: pm.Model, relation: str) -> np.ndarray:
    """Each row's whitened Taylor terms at ``T`` (gradient, packed Hessian), unclipped, by the
    one-shot's own finite differences on the compiled likelihood."""
    neighbours = "substitute" if relation == "substitute" else "add_remove"
    target = prepare_warm_start(
        model, neighbours=neighbours, min_rows=100 if relation != "substitute" else None
    )
    g, h = row_terms(target.likelihood, Expansion(T, L, np.arange(2), 2), target.n)
    return np.concatenate([g, h], axis=1)


def clips(coef: np.ndarray) -> tuple[float, float]:
    """Fixed public clips, as the one-shot's rule would place them: twice / three times the
    90% quantile of the rows' norms (exact here: the audit's clips are inputs, not releases)."""
    g_norm = np.linalg.norm(coef[:, :2], axis=1)
    h_norm = tl.packed_frobenius(coef[:, 2:], 2)
    return 2.0 * float(np.quantile(g_norm, 0.9)), 3.0 * float(np.quantile(h_norm, 0.9))


def _whitened(G: np.ndarray, H: np.ndarray, sd_G: float, sd_H: float) -> np.ndarray:
    """The release as a vector of unit-variance coordinates: ``G / sd_G`` and
    ``(diag H, sqrt 2 * upper H) / sd_H`` (the noise of :func:`symmetric_noise` is isotropic
    there)."""
    j, k = tl.packed_index(2)
    scale = np.where(j == k, 1.0, math.sqrt(2.0))
    return np.concatenate([G / sd_G, H[j, k] * scale / sd_H])


def audit_oneshot(relation: str, runs: int, broken: bool = False) -> Any:
    """Audit the G/H release on ``D`` and ``D'`` (``broken``: sensitivity from half clips)."""
    d_pair = data(relation)
    rel = "substitute" if relation == "substitute" else "add_remove"
    raw = [row_coefficients(poisson(d), relation) for d in d_pair]
    c_g, c_H = clips(raw[0])
    coefs = [tl.clip_packed_rows(r[:, :2], r[:, 2:], c_g, c_H)[0] for r in raw]
    mu_G = math.sqrt(ONESHOT_SHARES["G"]) * MU_ONESHOT
    mu_H = math.sqrt(ONESHOT_SHARES["H"]) * MU_ONESHOT
    claimed = math.sqrt(mu_G**2 + mu_H**2)
    # The noise's sensitivity: honest, or the broken control's half clips (clipping unchanged).
    s_g, s_H = (c_g / 2.0, c_H / 2.0) if broken else (c_g, c_H)
    dG, dH = tl.oneshot_sensitivities(s_g, s_H, rel)
    sd_G, sd_H = dG / mu_G, dH / mu_H
    # The exact sums (the auditor's white-box knowledge): the likelihood-ratio direction.
    exact = []
    for coef in coefs:
        H = np.zeros((2, 2))
        j, k = tl.packed_index(2)
        H[j, k] = coef[:, 2:].sum(axis=0)
        H = H + np.triu(H, 1).T
        exact.append(_whitened(coef[:, :2].sum(axis=0), H, sd_G, sd_H))
    diff = exact[0] - exact[1]
    direction = diff / np.linalg.norm(diff)
    noise = np.random.default_rng([SEED, 1, int(broken), int(rel == "substitute")])

    def release_on(coef: np.ndarray):
        def release() -> dict[str, Any]:
            r = tl.release_packed_sums(coef, 2, s_g, s_H, mu_G, mu_H, noise, rel)
            j, k = tl.packed_index(2)
            v = _whitened(r.G, r.H, r.sd_G, r.sd_H)
            return {"G": r.G, "H": r.H[j, k], "proj": float(v @ direction)}

        return release

    result = audit_releases(
        release_on(coefs[0]),
        release_on(coefs[1]),
        claimed_mu=claimed,
        runs=runs,
        gaussian={"proj": "identity"},
        label=f"one-shot G/H, {relation}" + (", sensitivity from c/2" if broken else ""),
    )
    # How tight the neighbour is: the pair's exact mu under the honest noise.
    hG, hH = tl.oneshot_sensitivities(c_g, c_H, rel)
    honest = np.linalg.norm(
        diff * np.concatenate([[sd_G / (hG / mu_G)] * 2, [sd_H / (hH / mu_H)] * 3])
    )
    return result, float(honest)


class _NoiseHalved(TaylorPenaltyMetropolis):
    """Broken control: the likelihood release's noise sd halved, the claim unchanged."""

    def _sensitivity_and_noise(self, step_length: float) -> tuple[float, ...]:
        bound, delta, sigma, count_sd, mu = super()._sensitivity_and_noise(step_length)
        return bound, delta, sigma / 2.0, count_sd, mu


def _taylor_model(coef_public: np.ndarray, coef_own: np.ndarray, r: float, rel: str) -> TaylorModel:
    """A TaylorModel whose public part (release, clips, point) is the same on both data sets
    and whose private RowControl holds this data set's own clipped coefficients."""
    release = tl.release_packed_sums(
        coef_public, 2, 1.0, 1.0, 1.0, 1.0, np.random.default_rng([SEED, 2]), rel
    )
    return TaylorModel(
        t=T,
        L=L,
        release=release,
        order=2,
        clip_g=1.0,
        clip_H=1.0,
        residual_clip=r,
        mu=1.0,
        releases=2,
        point=T,
        covariance=L @ L.T,
        control=RowControl(T, L, coef_own, np.arange(2)),
        index=np.arange(2),
    )


def residual_r() -> float:
    return B_TARGET / tl.residual_bound(
        np.linalg.solve(L, X0 - T), np.linalg.solve(L, X1 - T), 1.0, 2, 1.0
    )


def audit_residual_step(relation: str, runs: int, broken: bool = False) -> Any:
    """Audit one step's released ``d_hat`` at ``(X0, X1)`` on ``D`` and ``D'``."""
    d_pair = data(relation)
    rel = "substitute" if relation == "substitute" else "add_remove"
    models = [poisson(d) for d in d_pair]
    raw = [row_coefficients(m, relation) for m in models]
    c_g, c_H = clips(raw[0])
    coefs = [tl.clip_packed_rows(r[:, :2], r[:, 2:], c_g, c_H)[0] for r in raw]
    r = residual_r()
    cls = _NoiseHalved if broken else TaylorPenaltyMetropolis
    claimed = []

    def release_on(model: pm.Model, coef: np.ndarray):
        taylor = _taylor_model(coefs[0], coef, r, rel)
        with model, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kwargs = {"min_rows": 100} if rel == "add_remove" else {}
            step = cls(
                taylor=taylor,
                mu=MU_STEP,
                neighbours=rel,
                clip_count_share=COUNT_SHARE,
                **kwargs,
            )

        def release() -> dict[str, Any]:
            noise, rel_fn, _ = step._step_noise(taylor.residual_length(X0, X1))
            claimed.append(noise.mu)
            out = rel_fn(step._current(X0), X1)
            step._lik.commit(False)
            return {"d_hat": out.d_hat, "dp_clipped_count": out.clipped_count}

        return release

    result = audit_releases(
        release_on(models[0], coefs[0]),
        release_on(models[1], coefs[1]),
        claimed_mu=MU_STEP,
        runs=runs,
        gaussian={"d_hat": "identity", "dp_clipped_count": "identity"},
        label=f"residual step, {relation}" + (", noise sd / 2" if broken else ""),
    )
    assert max(claimed) == MU_STEP
    return result, _residual_tightness(models, coefs, r, rel)


def _residual_tightness(models, coefs, r, rel) -> float:
    """The pair's exact mu under the honest step's noise: the clipped residual sums' and the
    clipped counts' differences over their noise sds, composed."""
    from pymc_penalty.accounting.gdp import split_step_mu
    from pymc_penalty.model.likelihood import PenaltyLikelihood

    B = r * tl.residual_bound(np.linalg.solve(L, X0 - T), np.linalg.solve(L, X1 - T), 1.0, 2, 1.0)
    sums, counts = [], []
    for model, coef in zip(models, coefs, strict=True):
        lik = PenaltyLikelihood(
            model, list(model.value_vars), model.initial_point(), control=RowControl(T, L, coef)
        )
        n = coef.shape[0]
        lik.reset(X0, n)
        clipped_sum, n_clipped, _ = lik.propose(X1, B)
        sums.append(clipped_sum)
        counts.append(n_clipped)
        lik.commit(False)
    mu_ll, mu_count = split_step_mu(MU_STEP, COUNT_SHARE)
    sigma = tl.residual_sensitivity(B, rel) / mu_ll
    return math.hypot((sums[0] - sums[1]) / sigma, (counts[0] - counts[1]) * mu_count)


def main(runs: int = 20_000) -> dict[str, Any]:
    warnings.simplefilter("ignore")
    rows = []
    for name, fn in (("oneshot", audit_oneshot), ("step", audit_residual_step)):
        for relation in ("substitute", "add_remove"):
            for broken in (False, True):
                res, exact_mu = fn(relation, runs, broken)
                rows.append(
                    {
                        "mechanism": name,
                        "relation": relation,
                        "broken": broken,
                        "claimed_mu": res.claimed_mu,
                        "pair_mu_honest": exact_mu,
                        "mu_estimate": res.mu_estimate,
                        "mu_lower": res.mu_lower,
                        "claimed_eps": res.claimed_epsilon,
                        "eps_lb": res.epsilon_lb,
                        "exceeds_claim": bool(res.exceeds_claim),
                        "verdict_ok": bool(res.exceeds_claim) == broken,
                    }
                )
    head = (
        f"{'mechanism':9s} {'relation':11s} {'control':8s} {'claim mu':>8s} {'pair mu':>8s} "
        f"{'mu est':>7s} {'mu low':>7s} {'claim eps':>9s} {'eps lb':>7s}  verdict"
    )
    print(
        f"Taylor path audit, {runs} runs per data set (pair mu: the neighbour's exact mu "
        "under the honest noise)"
    )
    print(head)
    for r in rows:
        verdict = "EXCEEDS" if r["exceeds_claim"] else "below"
        print(
            f"{r['mechanism']:9s} {r['relation']:11s} {'broken' if r['broken'] else 'honest':8s} "
            f"{r['claimed_mu']:8.3f} {r['pair_mu_honest']:8.3f} {r['mu_estimate']:7.3f} "
            f"{r['mu_lower']:7.3f} {r['claimed_eps']:9.3f} {r['eps_lb']:7.3f}  {verdict}"
            f"{'' if r['verdict_ok'] else '  <-- WRONG'}"
        )
    result = {"runs": runs, "ok": all(r["verdict_ok"] for r in rows), "rows": rows}
    print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    out = main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000)
    sys.exit(0 if out["ok"] else 1)
