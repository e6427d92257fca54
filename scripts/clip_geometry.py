"""Would a block clip of the one-shot gradient sum beat the joint L2 clip? (a diagnostic)

NOT PRIVATE: this script reads the simulated data directly (exact posterior mode, exact
Laplace covariance, every row's gradient) to measure the geometry of the rows' scores; it
releases nothing and must never be used as a release.

The Taylor path releases ``G = sum_i g_i``, each row's gradient ``g_i`` taken in whitened
coordinates (``x = t + L w``, ``L`` the Cholesky factor of the covariance on the coordinates
the rows read, :func:`pymc_penalty.warmstart.taylor.taylor_oneshot_on`) and clipped in L2
norm at ``c``; under substitute-one neighbours its sensitivity is ``2 c``, so a Gaussian
mechanism of GDP ``mu`` adds noise of sd ``2 c / mu`` to each of the ``d`` coordinates: total
squared error ``d (2 c)^2 / mu^2``. Clipping each block ``k`` of ``d_k`` coordinates at its
own ``c_k`` with its own noise sd ``s_k`` (Gaussian mechanisms composed,
``mu^2 = sum_k (2 c_k / s_k)^2``), the ``s_k`` that minimise ``sum_k d_k s_k^2`` give
``(sum_k 2 c_k sqrt(d_k))^2 / mu^2`` (:func:`noise_error`).

For each model of ``benchmarks/model_suite.py`` (its own data generators and model builder)
and data set, at the exact posterior mode ``t`` (BFGS, then Newton steps on the exact
gradient) with ``L`` the Cholesky factor of the Laplace covariance (the inverse negative
Hessian of the log posterior at ``t``) on the coordinates the rows read (the package's
convention; a hierarchical model's ``mu`` and ``tau`` are read by the prior only), the rows'
whitened gradients are those the one-shot release sums
(:func:`pymc_penalty.warmstart.taylor_terms.row_terms`, central differences of each row's
log-likelihood). Times ``sqrt(n)`` each coordinate has about unit sd ("scaled", printed as
``sd``). Printed per model and data set:

- ``d``, the 99.9% quantile of the scaled joint norm, and each coordinate's 99.9% quantile
  of the scaled ``|score|`` (with the parameter names);
- three rules, each clipping about the same expected share of rows (``--tail``, 0.1%,
  split equally over its ``K`` blocks: each block's clip is the ``1 - tail / K`` quantile of
  its rows' block norms; :func:`block_clips`):

  (a) ``joint``: one L2 clip on all coordinates (the package's release);
  (b) ``per-coord``: one block per coordinate;
  (c) ``two-block``: coordinates sorted by their 99.9% ``|score|`` quantile, every split
      point tried, each block with its own L2 clip; the split with the least noise error;

- per rule: the clips (scaled), the share of rows clipped in any block, the RMS over
  coordinates of the noise sd of ``G`` (posterior sds: whitened units, at ``--mu``, the
  ``mu`` of the release of ``G``; the suite's ``clip_g`` / ``noise_sd_g`` give
  ``2 c / sd = 0.186`` at epsilon 1), the bias, the norm of the summed clipped-off parts
  (posterior sds) over the noise's norm ``sqrt(sum_k d_k s_k^2)``, and the ratios of the RMS
  error to the joint rule's: noise alone (``ratio``; mu-free) and noise plus squared bias
  (``ratio+bias``; at ``--mu``).

A summary table gives, per model and n, the mean over data sets of the ratios (b)/(a) and
(c)/(a) (and their range). The last line printed is ``RESULT {json}``.

Run ``python scripts/clip_geometry.py --n 1e4 1e5 --datasets 3`` (about 2 minutes on one
core); ``--models`` runs a subset.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts"), str(ROOT / "benchmarks")]

#: The expected share of rows clipped by every rule (split equally over its blocks).
TAIL = 1e-3
#: The release of ``G``'s GDP ``mu`` at epsilon 1 in the suite (``2 clip_g / noise_sd_g`` in
#: ``benchmarks/results/model_suite_issue27_1e5_three_a.csv``); only the bias ratios use it.
MU_G = 0.186
#: Sensitivity of a clipped sum per unit clip under substitute-one neighbours.
SENS = 2.0


# --- the rules' math (pure; tests/test_clip_geometry.py) -----------------------------------


def block_norms(rows: np.ndarray, blocks: list[np.ndarray]) -> np.ndarray:
    """Each row's L2 norm on each block: shape (n, K)."""
    return np.stack([np.linalg.norm(rows[:, b], axis=1) for b in blocks], axis=1)


def block_clips(rows: np.ndarray, blocks: list[np.ndarray], tail: float = TAIL) -> np.ndarray:
    """Each block's clip: the ``1 - tail / K`` quantile of its rows' block norms (so the
    expected share of rows clipped in some block is at most ``tail``)."""
    q = 1.0 - tail / len(blocks)
    return np.quantile(block_norms(rows, blocks), q, axis=0)


def noise_error(clips: np.ndarray, dims: np.ndarray, mu: float) -> tuple[float, np.ndarray]:
    """Least total squared noise error ``sum_k d_k s_k^2`` of a release of block sums
    clipped at ``clips`` (sensitivity ``2 c_k`` each) composed to GDP ``mu``, and the
    per-block noise sds ``s_k`` that reach it.

    Minimising ``sum_k d_k s_k^2`` subject to ``sum_k (2 c_k / s_k)^2 = mu^2`` gives
    ``s_k^2 = (2 c_k / sqrt(d_k)) A / mu^2`` with ``A = sum_k 2 c_k sqrt(d_k)``, and the total
    ``A^2 / mu^2``; one block gives ``d (2 c)^2 / mu^2``.
    """
    a = SENS * np.asarray(clips, dtype=float)
    dims = np.asarray(dims, dtype=float)
    total_a = float(np.sum(a * np.sqrt(dims)))
    sds = np.sqrt(a / np.sqrt(dims) * total_a) / mu
    return total_a**2 / mu**2, sds


def clipped_off(
    rows: np.ndarray, blocks: list[np.ndarray], clips: np.ndarray
) -> tuple[np.ndarray, float]:
    """The summed clipped-off parts ``sum_i (g_i - clip(g_i))`` (shape (d,)) and the share of
    rows clipped in at least one block."""
    norms = block_norms(rows, blocks)
    with np.errstate(divide="ignore", invalid="ignore"):
        keep = np.where(norms > clips, clips / norms, 1.0)
    excess = np.zeros(rows.shape[1])
    for k, b in enumerate(blocks):
        excess[b] = np.sum(rows[:, b] * (1.0 - keep[:, k])[:, None], axis=0)
    return excess, float(np.mean(np.any(norms > clips, axis=1)))


def evaluate_rule(
    rows: np.ndarray, blocks: list[np.ndarray], mu: float, tail: float = TAIL
) -> dict:
    """A rule's clips, noise error (total squared, in ``rows``' units), clipped share and
    bias (norm of the summed clipped-off parts, and that over the noise's norm)."""
    blocks = [np.asarray(b, dtype=int) for b in blocks]
    clips = block_clips(rows, blocks, tail)
    dims = np.array([b.size for b in blocks])
    total, sds = noise_error(clips, dims, mu)
    excess, share = clipped_off(rows, blocks, clips)
    bias = float(np.linalg.norm(excess))
    return {
        "blocks": [b.tolist() for b in blocks],
        "clips": clips,
        "noise_total": total,
        "noise_sds": sds,
        "clipped_share": share,
        "bias": bias,
        "bias_over_noise": bias / math.sqrt(total),
        "mse": total + bias**2,
    }


def coordinate_tails(rows: np.ndarray, tail: float = TAIL) -> np.ndarray:
    """Each coordinate's ``1 - tail`` quantile of ``|score|``."""
    return np.quantile(np.abs(rows), 1.0 - tail, axis=0)


def compare_rules(rows: np.ndarray, mu: float, tail: float = TAIL) -> dict:
    """The three rules (joint, per-coordinate, best two-block split of the coordinates sorted
    by their tail quantile) on ``rows`` (n, d), and their RMS error ratios to the joint's."""
    d = rows.shape[1]
    joint = evaluate_rule(rows, [np.arange(d)], mu, tail)
    per = evaluate_rule(rows, [np.array([j]) for j in range(d)], mu, tail)
    order = np.argsort(coordinate_tails(rows, tail))
    splits = [
        evaluate_rule(rows, [order[:s], order[s:]], mu, tail) for s in range(1, d)
    ]  # every split point
    two = min(splits, key=lambda r: r["noise_total"]) if splits else joint
    out = {"joint": joint, "per_coord": per, "two_block": two}
    for rule in out.values():
        rule["ratio"] = math.sqrt(rule["noise_total"] / joint["noise_total"])
        rule["ratio_bias"] = math.sqrt(rule["mse"] / joint["mse"])
    return out


# --- the models ------------------------------------------------------------------------------


def coordinate_names(value_vars, point: dict) -> list[str]:
    """A name per raveled coordinate (``b[0]``, ``sigma_log__``)."""
    names = []
    for v in value_vars:
        size = int(np.size(point[v.name]))
        names += [v.name] if size == 1 else [f"{v.name}[{j}]" for j in range(size)]
    return names


def row_scores(model_name: str, n: int, index: int) -> dict:
    """The rows' whitened gradients at the exact mode (posterior-sd units) and their names."""
    import model_suite as ms
    from taylor_start_diagnostics import exact_laplace  # the one exact mode and Laplace

    from pymc_penalty.warmstart import prepare_warm_start
    from pymc_penalty.warmstart.taylor_terms import Expansion, row_terms

    model = ms.build_model(ms.make_dataset(model_name, n, index))
    target = prepare_warm_start(model)
    template = target.point
    x0 = np.concatenate([np.ravel(template[v.name]) for v in target.value_vars]).astype(float)
    t, cov = exact_laplace(model, template, x0)
    reads = np.flatnonzero(target.likelihood.reads)
    reads = reads if reads.size else np.arange(t.size)
    L = np.linalg.cholesky(cov[np.ix_(reads, reads)])
    g, _ = row_terms(target.likelihood, Expansion(t, L, reads, 1), target.n)
    g[~np.all(np.isfinite(g), axis=1)] = 0.0
    names = coordinate_names(target.value_vars, template)
    return {
        "rows": g,
        "names": [names[j] for j in reads],
        "grad_sum_norm": float(np.linalg.norm(g.sum(axis=0))),  # about the prior's pull
        "n": target.n,
    }


def _fmt(xs, spec: str = ".2f") -> str:
    return "[" + " ".join(format(float(x), spec) for x in xs) + "]"


def run_one(model_name: str, n: int, index: int, mu: float, tail: float) -> dict:
    s = row_scores(model_name, n, index)
    g, names = s["rows"], s["names"]
    scale = math.sqrt(n)
    scaled = g * scale
    d = g.shape[1]
    res = compare_rules(g, mu, tail)
    joint_q = float(np.quantile(np.linalg.norm(scaled, axis=1), 1.0 - tail))
    tails = coordinate_tails(scaled, tail)
    print(f"\n{model_name} n={n} data set {index}: d={d}, |sum g|={s['grad_sum_norm']:.2g}")
    print(f"  scaled sd per coordinate {_fmt(scaled.std(axis=0))}")
    print(f"  {100 * (1 - tail):g}% joint norm quantile {joint_q:.2f}; per coordinate:")
    print("   " + ", ".join(f"{nm} {q:.2f}" for nm, q in zip(names, tails, strict=True)))
    print(
        f"  {'rule':<10} {'clips (scaled)':<34} {'clipped':>8} {'noise rms':>9} "
        f"{'bias/noise':>10} {'ratio':>6} {'ratio+bias':>10}"
    )
    out = {"model": model_name, "n": n, "dataset": index, "d": d, "names": names}
    out["joint_norm_q"] = joint_q
    out["coord_q"] = dict(zip(names, map(float, tails), strict=True))
    for key, rule in res.items():
        label = key
        if key == "two_block":
            label = "two-block"
            parts = [[names[j] for j in b] for b in rule["blocks"]]
            print(f"  two-block split: {' + '.join(parts[0])} | {' + '.join(parts[1])}")
            out["two_block_split"] = parts
        noise_rms = math.sqrt(rule["noise_total"] / d)
        print(
            f"  {label:<10} {_fmt(rule['clips'] * scale):<34} {rule['clipped_share']:>8.4%} "
            f"{noise_rms:>9.3f} {rule['bias_over_noise']:>10.3f} {rule['ratio']:>6.3f} "
            f"{rule['ratio_bias']:>10.3f}"
        )
        out[key] = {
            "clips_scaled": [float(c) for c in rule["clips"] * scale],
            "clipped_share": rule["clipped_share"],
            "noise_rms_post_sd": noise_rms,
            "bias_post_sd": rule["bias"],
            "bias_over_noise": rule["bias_over_noise"],
            "ratio": rule["ratio"],
            "ratio_bias": rule["ratio_bias"],
        }
    return out


def summarise(runs: list[dict]) -> list[dict]:
    """Per (model, n): mean (min, max) over data sets of the ratios (b)/(a) and (c)/(a)."""
    table = []
    for key in dict.fromkeys((r["model"], r["n"]) for r in runs):
        cell = [r for r in runs if (r["model"], r["n"]) == key]
        row = {"model": key[0], "n": key[1], "d": cell[0]["d"], "datasets": len(cell)}
        for rule in ("per_coord", "two_block"):
            for col in ("ratio", "ratio_bias"):
                v = np.array([r[rule][col] for r in cell])
                row[f"{rule}_{col}"] = [float(v.mean()), float(v.min()), float(v.max())]
        for rule in ("joint", "per_coord", "two_block"):
            row[f"{rule}_clipped"] = float(np.mean([r[rule]["clipped_share"] for r in cell]))
            row[f"{rule}_bias_over_noise"] = float(
                np.mean([r[rule]["bias_over_noise"] for r in cell])
            )
        table.append(row)
    return table


def print_table(table: list[dict]) -> None:
    print("\nRMS error of G's noise over the joint L2 clip's (mean [min, max] over data sets);")
    print("in parentheses: noise plus squared bias at mu; clipped share and bias/noise per rule")
    print(
        f"{'model':<13} {'n':>7} {'d':>2}  {'(b)/(a) per-coord':<28} {'(c)/(a) two-block':<28} "
        f"{'clipped a/b/c':<22} {'bias/noise a/b/c'}"
    )

    def cell(r: dict, rule: str) -> str:
        m, lo, hi = r[f"{rule}_ratio"]
        return f"{m:.3f} [{lo:.2f},{hi:.2f}] ({r[f'{rule}_ratio_bias'][0]:.3f})"

    for r in table:
        clipped = "/".join(
            f"{100 * r[f'{k}_clipped']:.3f}" for k in ("joint", "per_coord", "two_block")
        )
        bias = "/".join(
            f"{r[f'{k}_bias_over_noise']:.2f}" for k in ("joint", "per_coord", "two_block")
        )
        print(
            f"{r['model']:<13} {r['n']:>7} {r['d']:>2}  {cell(r, 'per_coord'):<28} "
            f"{cell(r, 'two_block'):<28} {clipped + ' %':<22} {bias}"
        )


def main(argv: list[str] | None = None) -> int:
    import model_suite as ms

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=float, nargs="+", default=[1e4, 1e5])
    p.add_argument("--datasets", type=int, default=3, help="data sets 0..K-1")
    p.add_argument("--models", nargs="+", choices=ms.MODELS, default=list(ms.MODELS))
    p.add_argument("--mu", type=float, default=MU_G, help="GDP mu of G's release (bias only)")
    p.add_argument("--tail", type=float, default=TAIL, help="expected share of rows clipped")
    args = p.parse_args(argv)
    logging.getLogger("pymc").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    runs = []
    for n in (int(v) for v in args.n):
        for name in args.models:
            for k in range(args.datasets):
                runs.append(run_one(name, n, k, args.mu, args.tail))
    table = summarise(runs)
    print_table(table)
    print("RESULT " + json.dumps({"mu": args.mu, "tail": args.tail, "table": table}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
