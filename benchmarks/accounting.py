"""Iterations allowed by tight GDP accounting against looser bounds, and calibration speed.

For a budget of ``(epsilon, delta) = (1, 1e-5)`` and per-step ``mu = Delta / sigma`` in
``{1e-3, 1e-2, 5e-2}``, the number of penalty steps (Gaussian releases) each accountant fits in
the budget, from :func:`pymc_penalty.accounting.iterations_allowed`:

1. ``gdp``: tight Gaussian-DP accounting (what pymc-penalty spends);
2. ``zcdp``: zCDP with the standard conversion ``rho + 2 sqrt(rho log(1/delta))``;
3. ``rdp``: RDP over all real orders with the improved RDP-to-DP conversion;
4. ``advanced``: advanced composition of the classical per-step Gaussian bound, with the
   ``delta`` split optimised (the arXiv seed's accounting).

Ratios are GDP iterations / the other accountant's (``null`` where the other fits none).

Timings: median and 99th percentile over many calls of
``calibrate_step_mu(1.0, 1e-5, 8000)`` (target: under 1 ms) and of ``gdp_epsilon`` at the
budget's ``mu``.  Cross-check: when ``dp_accounting`` is importable, the tight epsilon at one
point is recomputed with its PLD accountant and the absolute difference reported.

Run ``python benchmarks/accounting.py [--quick]``.  The markdown tables are printed; a full
run also writes them to ``docs/benchmarks/accounting.md`` with the command and the date.  The
last line printed is ``RESULT {json}`` with ``iterations`` (keyed by mu, then accountant),
``ratio_vs`` (keyed by accountant, then mu) and ``calibration_ms`` (``median``, ``p99``).
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
from typing import Any

import numpy as np
from _common import REPO_ROOT, command_line

from pymc_penalty.accounting import (
    calibrate_step_mu,
    gdp_epsilon,
    gdp_mu,
    iterations_allowed,
)

EPSILON = 1.0
DELTA = 1e-5
MUS = (1e-3, 1e-2, 5e-2)
ACCOUNTANTS = ("gdp", "zcdp", "rdp", "advanced")
OTHERS = ACCOUNTANTS[1:]
LABELS = {
    "gdp": "GDP (tight)",
    "zcdp": "zCDP",
    "rdp": "RDP (improved)",
    "advanced": "advanced comp.",
}
CALIBRATION_RELEASES = 8000
CALIBRATION_TARGET_MS = 1.0
# Per-step mu and PLD discretisation interval of the dp_accounting cross-check.
CHECK_MU = 1e-2
PLD_INTERVAL = {"quick": 1e-4, "full": 1e-5}
# Timed calls (after warm-up) per function.
TIMED_CALLS = {"quick": 2_000, "full": 20_000}
WARMUP_CALLS = 200
DOCS_PATH = os.path.join(REPO_ROOT, "docs", "benchmarks", "accounting.md")


def count_iterations() -> dict[str, dict[str, int]]:
    """Iterations each accountant allows at ``(EPSILON, DELTA)`` for every per-step mu.

    Returns
    -------
    dict
        ``{repr(mu): {accountant: iterations}}``.
    """
    return {
        repr(mu): {a: iterations_allowed(mu, EPSILON, DELTA, a) for a in ACCOUNTANTS} for mu in MUS
    }


def ratios(iterations: dict[str, dict[str, int]]) -> dict[str, dict[str, float | None]]:
    """GDP iterations divided by each other accountant's.

    Parameters
    ----------
    iterations : dict
        Output of :func:`count_iterations`.

    Returns
    -------
    dict
        ``{accountant: {repr(mu): ratio}}``, rounded to 4 decimals; ``None`` where the other
        accountant allows no iteration at all.
    """
    return {
        other: {
            mu: (round(row["gdp"] / row[other], 4) if row[other] > 0 else None)
            for mu, row in iterations.items()
        }
        for other in OTHERS
    }


def time_calls(fn: Callable[[], Any], calls: int) -> dict[str, float]:
    """Median and 99th percentile wall time of single calls of ``fn``, in milliseconds.

    Parameters
    ----------
    fn : callable
        Called without arguments.
    calls : int
        Number of timed calls (after :data:`WARMUP_CALLS` untimed ones).

    Returns
    -------
    dict
        ``median`` and ``p99`` in ms.
    """
    for _ in range(WARMUP_CALLS):
        fn()
    clock = time.perf_counter_ns
    samples = np.empty(calls, dtype=np.int64)
    for i in range(calls):
        t0 = clock()
        fn()
        samples[i] = clock() - t0
    median, p99 = np.percentile(samples, [50.0, 99.0]) / 1e6
    return {"median": round(float(median), 5), "p99": round(float(p99), 5)}


def pld_cross_check(iterations: dict[str, dict[str, int]], interval: float) -> dict[str, Any]:
    """Recompute the tight epsilon at one point with dp_accounting's PLD accountant.

    The point is :data:`CHECK_MU` per step, composed as many times as GDP allows; PLD uses
    add/remove-one with unit sensitivity, so the noise multiplier is ``1 / mu``.

    Parameters
    ----------
    iterations : dict
        Output of :func:`count_iterations`.
    interval : float
        PLD value-discretisation interval.

    Returns
    -------
    dict
        ``available`` (bool) and, when available, ``mu_step``, ``count``, ``eps_gdp``,
        ``eps_pld``, ``abs_diff``, ``interval``, ``seconds`` and ``version``; otherwise
        ``reason``.
    """
    try:
        import dp_accounting as dpa
        from dp_accounting.pld import PLDAccountant
    except ImportError as exc:
        return {"available": False, "reason": f"dp_accounting not importable ({exc})"}
    count = iterations[repr(CHECK_MU)]["gdp"]
    eps_gdp = gdp_epsilon(mu=CHECK_MU * math.sqrt(count), delta=DELTA)
    t0 = time.perf_counter()
    pld = PLDAccountant(
        dpa.NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=interval
    )
    pld.compose(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(1.0 / CHECK_MU), count))
    eps_pld = float(pld.get_epsilon(DELTA))
    seconds = time.perf_counter() - t0
    try:
        version = metadata.version("dp-accounting")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return {
        "available": True,
        "mu_step": CHECK_MU,
        "count": count,
        "eps_gdp": eps_gdp,
        "eps_pld": eps_pld,
        "abs_diff": abs(eps_pld - eps_gdp),
        "interval": interval,
        "seconds": seconds,
        "version": version,
    }


def _ratio_cell(x: float | None) -> str:
    return "n/a (0 allowed)" if x is None else f"{x:.3f}x"


def iterations_table(
    iterations: dict[str, dict[str, int]], ratio: dict[str, dict[str, float | None]]
) -> str:
    """Markdown table of iterations allowed and GDP ratios, one row per per-step mu.

    Parameters
    ----------
    iterations : dict
        Output of :func:`count_iterations`.
    ratio : dict
        Output of :func:`ratios`.

    Returns
    -------
    str
    """
    head = ["per-step mu", *(LABELS[a] for a in ACCOUNTANTS)]
    head += [f"GDP / {LABELS[a]}" for a in OTHERS]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---:"] * len(head)) + "|"]
    for mu, row in iterations.items():
        cells = [mu, *(f"{row[a]:,}" for a in ACCOUNTANTS)]
        cells += [_ratio_cell(ratio[a][mu]) for a in OTHERS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def timing_table(timings: dict[str, dict[str, float]], calls: int) -> str:
    """Markdown table of the timed functions.

    Parameters
    ----------
    timings : dict
        ``{label: {"median": ms, "p99": ms}}``.
    calls : int
        Timed calls per function.

    Returns
    -------
    str
    """
    lines = [
        f"| function ({calls:,} calls each) | median (ms) | p99 (ms) |",
        "|---|---:|---:|",
    ]
    for label, t in timings.items():
        lines.append(f"| `{label}` | {t['median']:.4f} | {t['p99']:.4f} |")
    return "\n".join(lines)


def cross_check_text(check: dict[str, Any]) -> str:
    """One markdown line describing the dp_accounting cross-check.

    Parameters
    ----------
    check : dict
        Output of :func:`pld_cross_check`.

    Returns
    -------
    str
    """
    if not check["available"]:
        return f"Cross-check skipped: {check['reason']}."
    return (
        f"Cross-check against dp_accounting {check['version']} `PLDAccountant` "
        f"(add/remove-one, value_discretization_interval = {check['interval']:g}): "
        f"{check['count']:,} releases with mu = {check['mu_step']:g} each at delta = "
        f"{DELTA:g}: epsilon GDP = {check['eps_gdp']:.10f}, PLD = {check['eps_pld']:.10f}, "
        f"|d eps| = {check['abs_diff']:.2e} (PLD took {check['seconds']:.2f} s)."
    )


def write_plot(path: str) -> None:
    """Plot the iterations each accountant allows against the per-step mu (log-log).

    Parameters
    ----------
    path : str
        Output PNG file.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = np.geomspace(1e-3, 5e-2, 13)
    fig, ax = plt.subplots(figsize=(6, 4))
    for acc in ACCOUNTANTS:
        counts = [iterations_allowed(float(mu), EPSILON, DELTA, acc) for mu in grid]
        keep = [(m, c) for m, c in zip(grid, counts, strict=True) if c > 0]
        ax.loglog(*zip(*keep, strict=True), "o-", ms=3, label=LABELS[acc])
    ax.set_xlabel("per-step mu (Delta / sigma)")
    ax.set_ylabel(f"releases allowed at ({EPSILON:g}, {DELTA:g})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_docs(path: str, command: str, body: str) -> None:
    """Write the report to ``path`` (creating its folders).

    Parameters
    ----------
    path : str
        Output file.
    command : str
        Command that produced it.
    body : str
        Markdown body (tables and cross-check).
    """
    os.makedirs(os.path.dirname(path), exist_ok=True)
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    text = (
        "# Accounting benchmark\n\n"
        f"Produced by `{command}` (run from the repository root) on {today} (UTC); "
        f"Python {platform.python_version()}, NumPy {np.__version__}, "
        f"SciPy {metadata.version('scipy')}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs.\n\n"
        f"Iterations (Gaussian releases) that fit a budget of (epsilon, delta) = "
        f"({EPSILON:g}, {DELTA:g}), from `pymc_penalty.accounting.iterations_allowed`. "
        "GDP is the tight accounting pymc-penalty spends; zCDP uses the standard conversion; "
        "RDP optimises over all real orders with the improved conversion; advanced "
        "composition uses the classical per-step Gaussian bound with the delta split "
        "optimised (the arXiv seed's accounting). Timings are wall time of single calls and "
        "depend on the machine.\n\n"
        f"{body}\n\n![releases allowed against the per-step mu](accounting.png)\n"
    )
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="fewer timed calls, coarser PLD (under ~20 s)"
    )
    args = parser.parse_args(argv)
    mode = "quick" if args.quick else "full"
    calls = TIMED_CALLS[mode]
    t_start = time.perf_counter()

    print(
        f"pymc-penalty accounting benchmark ({mode}); budget (epsilon, delta) = "
        f"({EPSILON:g}, {DELTA:g})"
    )
    print()
    iterations = count_iterations()
    ratio = ratios(iterations)

    budget_mu = gdp_mu(EPSILON, DELTA)
    timings = {
        f"calibrate_step_mu({EPSILON:g}, {DELTA:g}, {CALIBRATION_RELEASES})": time_calls(
            lambda: calibrate_step_mu(EPSILON, DELTA, CALIBRATION_RELEASES), calls
        ),
        f"gdp_epsilon(mu={budget_mu:.6f}, delta={DELTA:g})": time_calls(
            lambda: gdp_epsilon(mu=budget_mu, delta=DELTA), calls
        ),
    }
    calibration_ms = next(iter(timings.values()))
    check = pld_cross_check(iterations, PLD_INTERVAL[mode])

    verdict = "meets" if calibration_ms["p99"] < CALIBRATION_TARGET_MS else "MISSES"
    body = "\n\n".join(
        [
            iterations_table(iterations, ratio),
            timing_table(timings, calls),
            f"Calibration p99 {verdict} the {CALIBRATION_TARGET_MS:g} ms target.",
            cross_check_text(check),
        ]
    )
    print(body)
    print()
    command = command_line(__file__, argv)
    if mode == "full":  # the committed page holds full-mode figures only
        write_docs(DOCS_PATH, command, body)
        write_plot(DOCS_PATH.replace(".md", ".png"))
        print(f"wrote {os.path.relpath(DOCS_PATH, REPO_ROOT)} ({command})")
    print(f"total wall time {time.perf_counter() - t_start:.1f} s")
    summary = {"iterations": iterations, "ratio_vs": ratio, "calibration_ms": calibration_ms}
    print("RESULT " + json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
