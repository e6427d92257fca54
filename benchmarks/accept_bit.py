"""Does charging only the accept bit buy more penalty steps than the Gaussian accounting?

A random-walk penalty step's output depends on the data only through accept/reject. Its
tight accounting (:mod:`pymc_penalty.accounting.accept_bit`) composes the lower convex
envelope over ``x`` of the per-``x`` binary trade-off curves, as a dominating pair's PLD, with
``dp-accounting``. The Gaussian accounting charges ``mu_step = Delta / s`` per step and
composes to ``sqrt(T) mu_step``.

For each budget ``(epsilon, delta = 1e-5)`` and number of releases ``T`` the Gaussian
calibration gives ``mu_step = gdp_mu(epsilon, delta) / sqrt(T)``; at a noise sd ``s`` the step's
sensitivity is ``Delta = s mu_step``. Reported per cell:

* ``bit eps``: epsilon of ``T`` accept bits at that ``(Delta, s)``;
* ``steps x``: how many more steps the bit accounting allows at the same ``(Delta, s)``;
* ``s_bit / s``: how much smaller the noise may be at the same ``T`` and ``Delta``.

The mechanism depends on ``(Delta, s)`` only, whatever the neighbour relation: substitute-one
has ``Delta = 2B`` and add/remove-one ``Delta = B``, so at the same clip and step length an
add/remove-one chain runs at half the substitute-one chain's ``s``: read its row at ``s/2``.
``pp.sample`` keeps ``s`` near 2 (the forecast's default ``noise_sd``).

Two further measurements at one cell: the budget-limited effective sample size of the
forecast, ``2 Phi(-s/2) s^2`` per unit of ``mu^2`` (acceptance times squared distance),
multiplied by the bit's step ratio and maximised over ``s``; and the step ratio when each
step also releases the clip count (a Gaussian, 5% of the step's ``mu^2``, as ``pp.sample``
does), which the bit accounting cannot cover.

Run ``python benchmarks/accept_bit.py [--quick]`` (full: a few minutes on one core; quick:
under 60 s). A full run also writes its output to ``docs/benchmarks/accept-bit.md``. The last
line printed is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from importlib import metadata

import numpy as np
from _common import REPO_ROOT, command_line
from scipy.special import ndtr, ndtri

from pymc_penalty.accounting import gdp_mu
from pymc_penalty.accounting.accept_bit import (
    _alpha,
    _q,
    accept_bit_epsilon,
    accept_bit_pld,
    accept_bit_releases_allowed,
    dominating_pair,
)

DELTA = 1e-5
GRID = {
    "full": {
        "releases": (1_000, 10_000, 100_000),
        "epsilons": (0.5, 1.0, 2.0, 6.0),
        "noise_sds": (0.5, 1.0, 2.0, 3.0),
        "utility_sds": (0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 3.0, 3.5, 4.0),
    },
    "quick": {
        "releases": (1_000,),
        "epsilons": (1.0,),
        "noise_sds": (1.0, 2.0),
        "utility_sds": (1.0, 2.0, 3.0),
    },
}
UTILITY_CELL = (10_000, 1.0)  # (T, epsilon) of the utility and clip-count measurements
COUNT_SHARE = 0.05
TARGET = 1.5  # the adoption threshold: at least 1.5x more steps
TARGET_ACCEPT = 0.234  # PenaltyMetropolis's default, steered to during tuning
RTOL = 2e-3


def _boundary(
    holds: Callable[[float], bool], lo: float, hi: float, *, log: bool
) -> tuple[float, float]:
    """Bisection for the boundary of a monotone predicate: ``holds(lo)``, not ``holds(hi)``."""
    if not holds(lo) or holds(hi):
        raise RuntimeError(f"no boundary in [{lo:g}, {hi:g}]")
    while hi - lo > RTOL * lo:
        mid = math.sqrt(lo * hi) if log else 0.5 * (lo + hi)
        lo, hi = (mid, hi) if holds(mid) else (lo, mid)
    return lo, hi


def smallest_noise(sens: float, noise_sd: float, releases: int, epsilon: float) -> float:
    """Smallest ``s`` whose ``releases`` accept bits at sensitivity ``sens`` fit ``epsilon``."""

    def short(s: float) -> bool:  # this noise is not enough
        return accept_bit_epsilon(sens, s, releases, DELTA) > epsilon

    return _boundary(short, noise_sd / 4.0, noise_sd, log=True)[1]  # the smallest that fits


def cell(releases: int, epsilon: float, noise_sd: float) -> dict:
    mu_step = gdp_mu(epsilon, DELTA) / math.sqrt(releases)
    sens = noise_sd * mu_step
    bit_eps = accept_bit_epsilon(sens, noise_sd, releases, DELTA)
    allowed = accept_bit_releases_allowed(sens, noise_sd, epsilon, DELTA, rtol=RTOL)
    s_bit = smallest_noise(sens, noise_sd, releases, epsilon)
    return {
        "releases": releases,
        "epsilon": epsilon,
        "noise_sd": noise_sd,
        "mu_step": mu_step,
        "bit_epsilon": bit_eps,
        "steps_ratio": allowed / releases,
        "noise_ratio": s_bit / noise_sd,
    }


def with_clip_count(noise_sd: float, releases: int, epsilon: float) -> float:
    """Step ratio when each step also releases the clip count (Gaussian, COUNT_SHARE of mu^2)."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    mu_step = gdp_mu(epsilon, DELTA) / math.sqrt(releases)
    mu_ll, mu_count = mu_step * math.sqrt(1 - COUNT_SHARE), mu_step * math.sqrt(COUNT_SHARE)
    w = mu_ll / 50
    bit = accept_bit_pld(noise_sd * mu_ll, noise_sd, discretization=w)
    count = pld_lib.from_gaussian_mechanism(
        standard_deviation=1.0 / mu_count, sensitivity=1.0, value_discretization_interval=w
    )
    step = bit.compose(count)

    def fits(t: float) -> bool:
        t = int(t)
        return (step.self_compose(t) if t > 1 else step).get_epsilon_for_delta(DELTA) <= epsilon

    lo = float(releases)
    while fits(1.5 * lo):
        lo *= 1.5
    return math.floor(_boundary(fits, lo, 1.5 * lo, log=False)[0]) / releases


def information(noise_sd: float, releases: int, epsilon: float) -> dict:
    """Mean privacy loss (KL) per step, against the Gaussian's ``mu^2 / 2``.

    ``pair``: the envelope's dominating pair, whose composition the table measures (for many
    small steps its composition is close to Gaussian-DP with ``mu^2 = 2 T KL``, so the step
    ratio is about ``1 / pair``); ``best_single_x``: the largest KL of one binary mechanism
    over ``x`` (both directions), which is what the bit tells on average at a fixed ``x``.
    """
    mu_step = gdp_mu(epsilon, DELTA) / math.sqrt(releases)
    sens = noise_sd * mu_step
    pair = dominating_pair(sens, noise_sd)
    kl_pair = float(np.sum(pair.upper * pair.loss))
    xs = np.linspace(-40.0, noise_sd * (noise_sd / 2 + 10), 20_001)
    a, b = _alpha(xs, noise_sd), _alpha(xs + sens, noise_sd)
    qa, qb = _q(xs, noise_sd), _q(xs + sens, noise_sd)
    with np.errstate(divide="ignore", invalid="ignore"):
        kl_x = np.maximum(
            b * np.log(b / a) + qb * np.log(qb / qa), a * np.log(a / b) + qa * np.log(qa / qb)
        )
    half = mu_step * mu_step / 2
    return {
        "noise_sd": noise_sd,
        "pair": kl_pair / half,
        "best_single_x": float(np.nanmax(kl_x)) / half,
    }


def utility(sds: tuple[float, ...]) -> dict:
    releases, epsilon = UTILITY_CELL
    rows = []
    for s in sds:
        mu_step = gdp_mu(epsilon, DELTA) / math.sqrt(releases)
        ratio = accept_bit_releases_allowed(s * mu_step, s, epsilon, DELTA, rtol=RTOL) / releases
        base = 2.0 * float(ndtr(-s / 2.0)) * s * s
        rows.append({"noise_sd": s, "steps_ratio": ratio, "gauss": base, "bit": base * ratio})
    best_g = max(rows, key=lambda r: r["gauss"])
    best_b = max(rows, key=lambda r: r["bit"])
    return {
        "rows": rows,
        "best_gauss_sd": best_g["noise_sd"],
        "best_bit_sd": best_b["noise_sd"],
        "gain_at_optimum": best_b["bit"] / best_g["gauss"],
    }


LOG: list[str] = []
DOCS_PATH = os.path.join(REPO_ROOT, "docs", "benchmarks", "accept-bit.md")


def emit(*parts: object, flush: bool = False) -> None:
    """Print a line and keep it for the docs page."""
    line = " ".join(str(p) for p in parts)
    print(line, flush=flush)
    LOG.append(line)


def write_page(lines: list[str], command: str) -> None:
    """The full run's output as a docs page, with the command, the date and the machine."""
    date = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    head = (
        f"# Accept-bit accounting benchmark\n\nProduced by `{command}` (run from the repository "
        f"root) on {date} (UTC); Python {platform.python_version()}, NumPy {np.__version__}, "
        f"dp-accounting {metadata.version('dp-accounting')}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs. What it measures and the conclusion: "
        '[Accounting](../accounting.md), section "Charging only the accept bit".\n\n'
    )
    text = "\n".join(line for line in lines if not line.startswith("command:"))
    with open(DOCS_PATH, "w", encoding="utf-8") as fh:
        fh.write(head + "```text\n" + text.strip() + "\n```\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="two cells only (under 60 s)")
    mode = "quick" if parser.parse_args(argv).quick else "full"
    grid = GRID[mode]
    LOG.clear()
    t0 = time.perf_counter()
    emit(f"accept-bit accounting against Gaussian accounting ({mode}), delta = {DELTA:g}")
    emit(f"command: {command_line(__file__, argv)}\n")

    rows = []
    emit("| T | epsilon | s | mu_step | bit eps at T | steps x (same s) | s_bit / s (same T) |")
    emit("|---|---|---|---|---|---|---|")
    for releases in grid["releases"]:
        for epsilon in grid["epsilons"]:
            for s in grid["noise_sds"]:
                r = cell(releases, epsilon, s)
                rows.append(r)
                emit(
                    f"| {releases:.0e} | {epsilon:g} | {s:g} | {r['mu_step']:.3g} | "
                    f"{r['bit_epsilon']:.4f} | {r['steps_ratio']:.3f} | {r['noise_ratio']:.3f} |",
                    flush=True,
                )

    util = utility(grid["utility_sds"])
    releases, epsilon = UTILITY_CELL
    emit(
        f"\nbudget-limited ESS proxy 2 Phi(-s/2) s^2 x steps ratio (T = {releases:g}, eps = "
        f"{epsilon:g}):"
    )
    emit("| s | steps x | Gaussian | bit |\n|---|---|---|---|")
    for r in util["rows"]:
        emit(f"| {r['noise_sd']:g} | {r['steps_ratio']:.3f} | {r['gauss']:.3f} | {r['bit']:.3f} |")
    emit(
        f"best s: Gaussian {util['best_gauss_sd']:g}, bit {util['best_bit_sd']:g}; "
        f"gain at the optimum {util['gain_at_optimum']:.3f}x"
    )
    # With the noise alone (x = 0) a step accepts 2 Phi(-s/2): tuning to target_accept caps s.
    s_cap = -2.0 * float(ndtri(TARGET_ACCEPT / 2.0))
    emit(f"s at which the noise alone accepts {TARGET_ACCEPT}: {s_cap:.3f}")
    info = [information(s, releases, epsilon) for s in grid["noise_sds"]]
    emit("\nmean privacy loss per step / (mu^2/2): envelope's pair, best single x:")
    for r in info:
        emit(
            f"  s = {r['noise_sd']:g}: {r['pair']:.3f} (1/that = {1 / r['pair']:.3f}), "
            f"{r['best_single_x']:.3f}"
        )
    count = with_clip_count(2.0, releases, epsilon)
    emit(f"steps x at s = 2 with the clip count ({COUNT_SHARE:.0%} of mu^2, Gaussian): {count:.3f}")

    by_s: dict[float, list[float]] = {}
    for r in rows:
        by_s.setdefault(r["noise_sd"], []).append(r["steps_ratio"])
    span = {s: (min(v), max(v)) for s, v in by_s.items()}
    best = max(rows, key=lambda r: r["steps_ratio"])
    at_target = [r for r in rows if r["steps_ratio"] >= TARGET]
    emit(
        "\nsteps x over the grid, by s: "
        + ", ".join(f"s = {s:g}: {lo:.3f}-{hi:.3f}" for s, (lo, hi) in span.items())
    )
    verdict = (
        f"{len(at_target)} of {len(rows)} cells reach {TARGET}x more steps "
        f"(only where s <= {max(r['noise_sd'] for r in at_target):g})"
        if at_target
        else f"no cell reaches {TARGET}x"
    )
    emit(verdict)
    emit(f"total wall time {time.perf_counter() - t0:.1f} s")
    summary = {
        "delta": DELTA,
        "rows": rows,
        "steps_ratio_by_noise_sd": {f"{s:g}": list(v) for s, v in span.items()},
        "max_steps_ratio": best["steps_ratio"],
        "cells_at_target": len(at_target),
        "utility": util,
        "kl_ratio": info,
        "noise_sd_at_target_accept": s_cap,
        "steps_ratio_with_clip_count_s2": count,
        "verdict": verdict,
    }
    if mode == "full":  # the committed page holds full-mode figures only
        write_page(LOG, command_line(__file__, argv))
        print(f"wrote {os.path.relpath(DOCS_PATH, REPO_ROOT)}")
    print("RESULT " + json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
