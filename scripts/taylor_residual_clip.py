"""Why the Taylor path's chains run loud at epsilon 1 and below (issue 27 diagnosis).

The chains' residual clip is the larger of the released residual clip ``r`` (from a noisy
histogram of the rows' residual ratios at public probe moves) and the noise-limited clip,
the one at which a typical move's noise sd is 1 (``sampling.taylor.noise_limited_clip``).
Where ``r`` is the larger, the per-step noise sd is ``r / noise-limited`` at a typical move;
on the suite at epsilon 1 that was the case in 15 of 20 linear and 17 of 20 logistic runs,
among them 10 of the 10 linear and 9 of the 10 logistic runs that did not converge (``python
benchmarks/model_suite.py --from-csv benchmarks/results/model_suite_issue27_recapture4_*.csv
--methods taylor --n 1e4``, column "residual noise sd > 1.5").

For each run of ``pp.sample(method="taylor")`` on a data set of
``benchmarks/model_suite.py`` (the suite's seed, so the suite's released values), this
prints:

- ``r / limit``: the released ``r`` over the noise-limited clip (the typical move's noise sd
  the chains run with, where above 1);
- ``rows > limit``: the rows whose residual ratio at the probes is above the noise-limited
  clip, with the released model's clipped rows (as the chains run) and, for comparison,
  with every row's own unclipped Taylor terms (what the one-shot's clips left in them);
- ``one-shot clipped``: the rows whose gradient (or Hessian) the one-shot clipped, and how
  many of those are among the rows above the limit;
- ``|u(mode)|``: the released mode (the chains' start) in whitened units from the
  expansion point, and whether each later stage of the one-shot expanded again or was
  combined with the model so far (with ``--nuts``, distances from the NUTS mean too);
- the report's verdict and smallest bulk ESS.

- with ``--nuts``, ``far test``: each later stage's move of the released mode from its
  expansion point, in whitened units, against the bar :func:`far_from_expansion` set for it
  (the larger of ``FAR_DISTANCE sqrt(d)`` and ``FAR_NOISE`` times the ``G`` noise's move),
  and the move's chi-square statistic against the ``G`` noise's own covariance (d degrees of
  freedom where the move is the noise alone; ``warmstart.taylor.far_test``);
  and ``|u(chains)|``, the chains' posterior mean in whitened units from the last expansion
  point (where the residual bound ``r max(|u|, |u'|, 1)^k |u' - u|`` is paid).

The models outside the suite (``gamma``, ``probit``, ``negbin`` of
``scripts/taylor_forecast_check.py``, data set ``index`` of its seeds) run the same way, with
NUTS (1000 draws, 2 chains) as their reference.

The counts are read from the simulated data (a diagnosis, not a release). The privacy noise
is fresh in every run (``pp.sample`` draws it from the OS), so a data set's run here is not
the suite's run of it. Run ``python
scripts/taylor_residual_clip.py --model linear --eps 1 --datasets 0 1 2 3``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import model_suite as ms  # noqa: E402
import taylor_forecast_check as unseen  # noqa: E402

import pymc_penalty as pp  # noqa: E402
from pymc_penalty.model.likelihood import RowControl  # noqa: E402
from pymc_penalty.privacy import taylor as tl  # noqa: E402
from pymc_penalty.sampling import taylor as st  # noqa: E402
from pymc_penalty.warmstart import taylor as wt  # noqa: E402
from pymc_penalty.warmstart import taylor_terms as tt  # noqa: E402


def _rows_seen(stats: tt.RowTaylorTerms, e, c_g, c_H, probes) -> dict:
    """The rows' residual ratios at the probes with the clipped and the unclipped model, and
    which rows the one-shot clipped (data values: diagnosis only)."""
    n = stats._n
    g, h = tt.row_terms(stats._lik, e, n)
    k = e.L.shape[0]
    cut = tt.row_norms(g, "g", k) > c_g
    if h is not None and c_H is not None:
        cut |= tt.row_norms(h, "H", k) > c_H
    full, _, _ = tl.clip_packed_rows(g, h, math.inf, None if h is None else math.inf)
    return {
        "clipped": tt.residual_ratios(stats._lik, n, stats.control(e, c_g, c_H), *probes),
        "unclipped": tt.residual_ratios(
            stats._lik, n, RowControl(e.t, e.L, full, e.index), *probes
        ),
        "cut": cut,
    }


def _sd_distances(model, flat: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> dict:
    """RMS and largest distance of each flat point from the NUTS mean, in NUTS sd, over the
    coordinates of free variables sampled untransformed (where the flat point is the
    parameter itself)."""
    import pymc as pm

    info = pm.blocking.DictToArrayBijection.map(model.initial_point()).point_map_info
    plain = {rv.name for rv in model.free_RVs if model.rvs_to_values[rv].name == rv.name}
    out = {}
    for label, x in flat.items():
        z, start = [], 0
        for name, _shape, size, _ in info:
            if name in plain:  # the value variable is the parameter itself
                draws = ref[name].reshape(ref[name].shape[0], -1)
                part = np.asarray(x[start : start + size], dtype=np.float64)
                z.extend((part - draws.mean(0)) / draws.std(0))
            start += size
        z = np.abs(np.asarray(z))
        out[label] = (float(np.sqrt(np.mean(z**2))), float(z.max()))
    return out


def _nuts_unseen(model, seed: int) -> dict[str, np.ndarray]:
    """NUTS on a model outside the suite (1000 draws, 2 chains): each free variable's draws,
    flattened over chains."""
    import pymc as pm
    from card_unseen_models import flat

    with model:
        post = pm.sample(
            1000, chains=2, cores=1, progressbar=False, random_seed=seed,
            compute_convergence_checks=False,
        ).posterior  # fmt: skip
    return flat(post)


def _chains_mean(model, idata) -> np.ndarray:
    """The chains' posterior mean (the tilted chains where the Taylor path keeps them), as the
    mean of their draws mapped to the model's raveled value vector (each free variable's
    transform forward)."""
    from pymc_penalty.results.noise_aware import _forward_fn

    post = idata.get("posterior_tilted", idata.posterior)
    fn, _ = _forward_fn(model)
    draws = [post[rv.name].values.reshape(-1, *post[rv.name].shape[2:]) for rv in model.free_RVs]
    values = fn(*draws)
    flat = np.concatenate([np.reshape(v, (v.shape[0], -1)) for v in values], axis=1)
    return flat.mean(0)


def run(
    model_name: str, eps: float, index: int, n: int, nuts: bool = False, seeded: bool = False
) -> dict:
    """One run's figures (with ``nuts``, the expansion point's and the released mode's
    distance from the NUTS mean; with ``seeded``, the suite's seeded privacy noise)."""
    seen: dict = {}
    counts, limit, far = (
        tt.RowTaylorTerms.residual_counts,
        st.noise_limited_clip,
        wt.far_from_expansion,
    )

    def keep_rows(self, e, c_g, c_H, probes, edges):
        seen.update(_rows_seen(self, e, c_g, c_H, probes))
        return counts(self, e, c_g, c_H, probes, edges)

    def keep_limit(taylor, likelihood_mu, relation, noise_sd=None):
        quiet = dataclasses.replace(taylor, residual_clip=0.0)
        seen["limit"] = limit(quiet, likelihood_mu, relation, noise_sd)
        seen["r"] = float(taylor.residual_clip)
        seen["u_mode"] = float(np.linalg.norm(taylor.whiten(taylor.point)))
        seen["expansion"] = np.array(taylor.t, dtype=np.float64)
        seen["mode"] = np.array(taylor.point, dtype=np.float64)
        seen["whiten"] = taylor.whiten
        return limit(taylor, likelihood_mu, relation, noise_sd)

    def keep_far(model, covariance, noise=None):  # before each later stage, on the model so far
        seen.setdefault("far", []).append(far(model, covariance, noise))
        seen.setdefault("far_move", []).append(wt.far_test(model, covariance, noise))
        seen.setdefault("warm", np.array(model.t, dtype=np.float64))  # the first's expansion
        seen.setdefault("first_mode", np.array(model.point, dtype=np.float64))
        return seen["far"][-1]

    tt.RowTaylorTerms.residual_counts, st.noise_limited_clip = keep_rows, keep_limit
    wt.far_from_expansion = keep_far
    try:
        if model_name in unseen.MODELS:
            model = unseen.build(model_name, n, index)
        else:
            ds = ms.make_dataset(model_name, n, index)
            model = ms.build_model(ds)
        extra = {}
        if seeded:
            extra["step_kwargs"] = {"privacy": pp.PrivacyPolicy(reproducible_noise=True)}
        idata = pp.sample(
            epsilon=eps, delta=ms.DELTA, model=model, random_seed=1000 * index + 1, cores=1,
            progressbar=False, method="taylor", **extra,
        )  # fmt: skip
    finally:
        tt.RowTaylorTerms.residual_counts, st.noise_limited_clip = counts, limit
        wt.far_from_expansion = far
    over = seen["clipped"] > seen["limit"]
    distances = {}
    if nuts:
        if model_name in unseen.MODELS:
            ref = _nuts_unseen(model, 1000 * index + 7)
        else:
            ref, _, _ = ms.run_nuts(ds, 1000 * index + 7, False)
        points = {k: seen[k] for k in ("warm", "first_mode", "expansion", "mode") if k in seen}
        points["chains"] = _chains_mean(model, idata)
        distances = _sd_distances(model, points, ref)
        distances["u_chains"] = float(np.linalg.norm(seen["whiten"](points["chains"])))
    return {
        "distances": distances,
        "r_over_limit": seen["r"] / seen["limit"],
        "over": int(over.sum()),
        "over_unclipped": int((seen["unclipped"] > seen["limit"]).sum()),
        "cut": int(seen["cut"].sum()),
        "over_and_cut": int((over & seen["cut"]).sum()),
        "u_mode": seen["u_mode"],
        "far": list(seen.get("far", [])),
        "far_move": list(seen.get("far_move", [])),
        "ess": float(idata.attrs["dp_ess_bulk_min"]),
        "verdict": str(idata.attrs["dp_convergence"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="linear", choices=ms.MODELS + unseen.MODELS)
    parser.add_argument("--eps", type=float, default=1.0)
    parser.add_argument("--datasets", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--n", type=float, default=1e4)
    parser.add_argument(
        "--nuts",
        action="store_true",
        help="also the warm start, the first stage's mode, the last stage's expansion point "
        "and the released mode, in "
        "NUTS sd from the NUTS mean (untransformed coordinates: RMS, largest)",
    )
    parser.add_argument(
        "--seeded-noise", action="store_true", help="the privacy noise seeded (not private)"
    )
    args = parser.parse_args(argv)
    logging.getLogger("pymc").setLevel(logging.ERROR)
    logging.getLogger("pymc_penalty").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for index in args.datasets:
            r = run(args.model, args.eps, index, int(args.n), args.nuts, args.seeded_noise)
            stages = "later stages " + "/".join(
                "re-expanded" if f else "combined" for f in r["far"]
            )
            far = "".join(
                f", {k} {v[0]:.2f}/{v[1]:.2f} sd"
                for k, v in r["distances"].items()
                if k != "u_chains"
            )
            if "u_chains" in r["distances"]:
                moves = "/".join(
                    f"{f.move:.1f} (bar {f.reach:.1f}, chi2 {f.chi2:.0f})" for f in r["far_move"]
                )
                far += f", far test {moves}, |u(chains)| {r['distances']['u_chains']:.2f}"
            print(
                f"{args.model} eps {args.eps:g} data set {index}: r / limit "
                f"{r['r_over_limit']:.2f}, rows > limit {r['over']} (unclipped model "
                f"{r['over_unclipped']}), one-shot clipped {r['cut']} ({r['over_and_cut']} of "
                f"them > limit), |u(mode)| {r['u_mode']:.2f}, "
                f"{stages}, bulk ESS {r['ess']:.0f}, "
                f"{r['verdict']}{far}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
