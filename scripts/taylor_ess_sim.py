"""Effective sample size of the Taylor path's chains on a model problem (pure NumPy).

The calibration behind :mod:`pymc_penalty.planning.taylor_forecast`. The chains of
``pp.sample(method="taylor")`` are random-walk Metropolis chains with the penalty test on a
noisy log ratio whose noise sd is proportional to the residual bound's length,

    sigma(x, x') = a * max(|u|, |u'|, 1)^order * |u' - u|,

``u`` the likelihood's coordinates whitened at the expansion point ``t``. ``a`` is set, as
the package sets the residual clip (:func:`pymc_penalty.sampling.taylor.noise_limited_clip`),
so that the median length over 8 probe moves around the start (``x ~ N(point, cov)``,
``x' = x + 2.38 / sqrt(d) chol(cov) z``) has noise sd ``noise_sd``. The chains tune as the
package's do: :class:`~pymc_penalty.sampling.adaptation.ProposalAdapter` with the full
covariance adapted from the released model's covariance, scaling started at ``2.38 /
sqrt(d)``, target acceptance 0.234, first window 100 steps; then the proposal is frozen.

The model problem: the target is ``N(0, I_d)`` (the released model's covariance taken as the
posterior's), the first ``k`` coordinates are the likelihood's (the rest, hyperparameters
only the prior sees, move at no noise), the expansion point sits ``offset`` whitened units
from the target's mean (along the first coordinate) and the chains start at centred draws
from the target (as :func:`pymc_penalty.planning.plan.chain_starts` does). Reported: the bulk
ESS of every coordinate (ArviZ, the verdict's own estimator), its smallest and its mean, and
the acceptance after tuning.

Run ``python scripts/taylor_ess_sim.py --grid`` for the calibration grid (a few minutes on one
core) or ``--d 4 --noise-sd 1 --order 2 --reps 4`` for one cell; the last line is
``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings

import arviz as az
import numpy as np

from pymc_penalty.sampling.adaptation import RW_SCALE, ProposalAdapter

TARGET_ACCEPT = 0.234
ADAPT_WINDOW = 100
PROBES = 8


def residual_length(u0: np.ndarray, u1: np.ndarray, order: int) -> float:
    """``max(|u0|, |u1|, 1)^order |u1 - u0|`` (the package's residual bound per unit clip)."""
    radius = max(float(np.linalg.norm(u0)), float(np.linalg.norm(u1)), 1.0)
    return radius**order * float(np.linalg.norm(u1 - u0))


def probe_length(d: int, k: int, order: int, shift: np.ndarray, rng: np.random.Generator) -> float:
    """The median residual length of the package's 8 probe moves around the start."""
    lengths = []
    for _ in range(PROBES):
        x0 = rng.standard_normal(d)
        x1 = x0 + (RW_SCALE / math.sqrt(d)) * rng.standard_normal(d)
        lengths.append(residual_length(x0[:k] - shift, x1[:k] - shift, order))
    return float(np.median(lengths))


def run_chain(
    x0: np.ndarray,
    *,
    a: float,
    k: int,
    order: int,
    shift: np.ndarray,
    draws: int,
    tune: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, float]:
    """One chain: its kept draws (draws, d) and its acceptance rate after tuning."""
    d = x0.size
    adapter = ProposalAdapter.create(
        np.eye(d), RW_SCALE / math.sqrt(d), "full", TARGET_ACCEPT, ADAPT_WINDOW
    )
    x, logp = x0.copy(), -0.5 * float(x0 @ x0)
    out = np.empty((draws, d))
    accepted = 0.0
    for i in range(tune + draws):
        x1 = adapter.propose(rng, x)
        sigma = a * residual_length(x[:k] - shift, x1[:k] - shift, order)
        logp1 = -0.5 * float(x1 @ x1)
        log_ratio = logp1 - logp + sigma * rng.standard_normal() - 0.5 * sigma**2
        prob = math.exp(min(0.0, log_ratio))
        moved = bool(math.log(max(rng.random(), 1e-300)) < log_ratio)
        if moved:
            x, logp = x1, logp1
        if i < tune:
            adapter.update(x, prob, moved)
        else:
            out[i - tune] = x
            accepted += prob
    return out, accepted / max(draws, 1)


def simulate(
    d: int,
    noise_sd: float,
    order: int = 2,
    *,
    k: int | None = None,
    offset: float = 0.0,
    draws: int = 4000,
    tune: int = 500,
    chains: int = 4,
    seed: int = 0,
) -> dict:
    """One run of ``chains`` chains on the model problem; returns the ESS figures.

    Parameters
    ----------
    d : int
        Dimension of the chain.
    noise_sd : float
        Noise sd at the probes' median residual length.
    order : {1, 2}
        The Taylor model's order (the radius power of the bound).
    k : int, optional
        How many coordinates the likelihood reads (default ``d``).
    offset : float
        Distance of the expansion point from the target's mean, in whitened units.
    draws, tune, chains : int
        As in ``pp.sample``.
    seed : int

    Returns
    -------
    dict
        ``ess_min`` and ``ess_mean`` (bulk, over coordinates), ``accept`` (mean over chains
        after tuning), ``a`` (the noise per unit residual length).
    """
    k = d if k is None else int(k)
    rng = np.random.default_rng([2027, d, k, order, seed])
    shift = np.zeros(k)
    shift[0] = offset
    a = float(noise_sd) / probe_length(d, k, order, shift, rng)
    starts = rng.standard_normal((chains, d))
    if chains > 1:
        starts = (starts - starts.mean(0)) * math.sqrt(chains / (chains - 1.0))
    runs = [
        run_chain(s, a=a, k=k, order=order, shift=shift, draws=draws, tune=tune, rng=rng)
        for s in starts
    ]
    post = np.stack([r[0] for r in runs])  # (chains, draws, d)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ess = np.array([float(az.ess(post[:, :, j], method="bulk")) for j in range(d)])
    return {
        "ess_min": float(ess.min()),
        "ess_mean": float(ess.mean()),
        "accept": float(np.mean([r[1] for r in runs])),
        "a": a,
    }


def cell(d, noise_sd, order, k=None, offset=0.0, reps=4, **kw) -> dict:
    """``reps`` runs of one cell: mean ESS figures and their standard errors."""
    res = [simulate(d, noise_sd, order, k=k, offset=offset, seed=s, **kw) for s in range(reps)]
    out = {"d": d, "k": d if k is None else k, "order": order, "noise_sd": noise_sd}
    out["offset"] = offset
    for key in ("ess_min", "ess_mean", "accept"):
        v = np.array([r[key] for r in res])
        out[key] = float(v.mean())
        out[key + "_se"] = float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else math.nan
    return out


GRID = {
    "d": (1, 2, 3, 4, 6, 8, 10, 14),
    "noise_sd": (0.0, 1.0, 2.0, 4.0),
    "order": (1, 2),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--grid", action="store_true", help=f"the calibration grid {GRID}")
    p.add_argument("--d", type=int, nargs="+", default=[4])
    p.add_argument("--k", type=int, default=None)
    p.add_argument("--noise-sd", type=float, nargs="+", default=[1.0])
    p.add_argument("--order", type=int, nargs="+", default=[2])
    p.add_argument("--offset", type=float, nargs="+", default=[0.0])
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--draws", type=int, default=4000)
    p.add_argument("--tune", type=int, default=500)
    p.add_argument("--chains", type=int, default=4)
    args = p.parse_args(argv)
    if args.grid:
        args.d, args.noise_sd, args.order = GRID["d"], GRID["noise_sd"], GRID["order"]
    kw = dict(draws=args.draws, tune=args.tune, chains=args.chains, reps=args.reps)
    rows = []
    t0 = time.perf_counter()
    for order in args.order:
        for d in args.d:
            for s in args.noise_sd:
                for off in args.offset:
                    r = cell(d, s, order, k=args.k, offset=off, **kw)
                    rows.append(r)
                    print(
                        f"order {order} d {d:2d} k {r['k']:2d} sd {s:4.1f} off {off:3.1f}: "
                        f"ESS min {r['ess_min']:7.1f} +- {r['ess_min_se']:5.1f}, mean "
                        f"{r['ess_mean']:7.1f}, accept {r['accept']:.3f}",
                        flush=True,
                    )
    print("RESULT " + json.dumps({"rows": rows, "seconds": time.perf_counter() - t0, **kw}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
