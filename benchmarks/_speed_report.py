"""Tables, plot and docs page of the speed benchmark (``benchmarks/speed.py``).

Everything here works on the RESULT dictionary that ``speed.py`` builds, so that what is
printed, written to ``docs/benchmarks/speed.md`` and plotted in ``speed.png`` are the same
measured figures.
"""

from __future__ import annotations

import datetime
import math
import os
from typing import Any

import numpy as np

__all__ = [
    "md_table",
    "ms",
    "plot",
    "ratio",
    "report_text",
    "summarise_breakdown",
    "summarise_mode",
    "targets_met",
    "write_docs",
]

PART_LABELS = {
    "likelihood": "likelihood: the compiled call (in the chain)",
    "proposal": "proposal: draw, step length, noise scale (in the chain)",
    "accounting": "accounting: ledger.try_spend, noise draws, decision (in the chain)",
    "step_bookkeeping": "step bookkeeping: PyMC's step wrapper, stats, cache key, casts",
    "sampler_loop": "sampler loop: pm.sample per draw (trace.record, stats log, callback)",
}


# --- the RESULT dictionary ------------------------------------------------------------------


def ms(x: float | None, digits: int = 5) -> float | None:
    """Seconds to milliseconds, rounded; None for a missing or non-finite time."""
    return round(1e3 * float(x), digits) if x is not None and np.isfinite(x) else None


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` rounded, or None when either is missing or not a positive finite number."""
    if a is None or b is None or not np.isfinite(a) or not np.isfinite(b) or b <= 0:
        return None
    return round(float(a / b), 4)


def summarise_mode(mode: str, label: str, results: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The RESULT entry of one mode: times in ms and ratios keyed by n (as strings).

    Parameters
    ----------
    mode : str
        Key of the mode in each size's ``"modes"``.
    label : str
        How the mode was passed to PyTensor.
    results : dict
        ``speed.bench_size`` output by n.
    """
    per = {n: r["modes"].get(mode, {}) for n, r in results.items()}
    entry: dict[str, Any] = {"pytensor_mode": label}
    for key, what in (
        ("per_step_ms", "sample"),
        ("step_loop_ms", "step_loop"),
        ("compiled_call_ms", "compiled_call"),
    ):
        entry[key] = {str(n): ms(r.get(what)) for n, r in per.items()}
    entry["ratio_vs_numpy"] = {
        str(n): ratio(per[n].get("sample"), r["numpy"]) for n, r in results.items()
    }
    entry["ratio_vs_metropolis_per_proposal"] = {
        str(n): ratio(per[n].get("sample"), r["metropolis_per_proposal"])
        for n, r in results.items()
    }
    for key in ("build_s", "first_call_s"):
        entry[key] = {str(n): round(r[key], 3) for n, r in per.items() if key in r}
    entry["accept"] = {
        str(n): round(r["sample_accept"], 3) for n, r in per.items() if "sample_accept" in r
    }
    errors = {str(n): r["error"] for n, r in per.items() if "error" in r}
    if errors:
        entry["errors"] = errors
    return entry


def targets_met(
    modes: dict[str, dict[str, Any]], targets: dict[str, Any]
) -> dict[str, dict[str, dict[str, Any]]]:
    """Each measured mode against the design targets: True, False, or None (not measured).

    Parameters
    ----------
    modes : dict
        :func:`summarise_mode` entries (or ``{"skipped": reason}``) by mode.
    targets : dict
        ``ratio_vs_numpy`` bounds keyed by n, and the ``ratio_vs_metropolis_per_proposal``
        bound.
    """
    met: dict[str, dict[str, dict[str, Any]]] = {}
    for mode, entry in modes.items():
        if "skipped" in entry:
            continue
        vs_numpy = {
            n: (None if entry["ratio_vs_numpy"].get(n) is None else entry["ratio_vs_numpy"][n] <= t)
            for n, t in targets["ratio_vs_numpy"].items()
        }
        t_met = targets["ratio_vs_metropolis_per_proposal"]
        vs_met = {
            n: (None if r is None else r < t_met)
            for n, r in entry["ratio_vs_metropolis_per_proposal"].items()
        }
        met[mode] = {"ratio_vs_numpy": vs_numpy, "ratio_vs_metropolis_per_proposal": vs_met}
    return met


def summarise_breakdown(bd: dict[str, Any]) -> dict[str, Any]:
    """The RESULT entry of the breakdown (ms), with the sum-of-parts check."""
    if "error" in bd:
        return bd
    total = bd["total"]
    parts_sum = float(sum(bd["parts"].values()))
    return {
        "config": bd["config"],
        "total_ms": ms(total),
        "parts_ms": {k: ms(v) for k, v in bd["parts"].items()},
        "sum_parts_ms": ms(parts_sum),
        "parts_share_of_total": round(parts_sum / total, 3),
        "step_ms": ms(bd["step"]),
        "likelihood_isolated_ms": ms(bd["likelihood_isolated"]),
        "clock_overhead_us": round(1e6 * bd["clock_overhead"], 3),
        "accept": round(bd["accept"], 3),
    }


# --- tables and docs -----------------------------------------------------------------------


def md_table(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> str:
    """A markdown table padded to aligned columns (readable as plain text too).

    Parameters
    ----------
    headers : list of str
    rows : list of list of str
    right : set of int, optional
        Column indices aligned right (default: all but the first).
    """
    right = set(range(1, len(headers))) if right is None else right
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        padded = [
            str(c).rjust(w) if i in right else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(padded) + " |"

    sep = (
        "|"
        + "|".join(
            "-" * (w + 1) + ":" if i in right else "-" * (w + 2) for i, w in enumerate(widths)
        )
        + "|"
    )
    return "\n".join([line(headers), sep, *(line(r) for r in rows)])


def _fmt(x: float | None, spec: str = ".4g") -> str:
    return "-" if x is None else format(x, spec)


def _n_label(n: str | int) -> str:
    return f"1e{round(math.log10(int(n)))}" if int(n) > 0 else str(n)


def blackjax_table(summary: dict[str, Any]) -> str:
    """Per-step ms of the package's paths beside BlackJAX's jitted chain, and their ratio."""
    bj = summary.get("ms_blackjax", {})
    if "skipped" in bj:
        return f"BlackJAX baseline skipped: {bj['skipped']}."
    paths = summary["ms_per_step"]
    headers = ["n", "BlackJAX rmh (jit + scan)", "BlackJAX acceptance"]
    headers += [f"pp path '{p}'" for p in paths]
    headers += ["default / BlackJAX", "jax / BlackJAX"]
    rows = []
    for n in map(str, summary["sizes"]):
        row = [_n_label(n), _fmt(bj.get(n)), _fmt(summary["blackjax_accept"].get(n), ".2f")]
        for entry in paths.values():
            row.append("skipped" if "skipped" in entry else _fmt(entry.get(n)))
        row.append(_fmt(summary["ratio_vs_blackjax"].get(n), ".2f"))
        row.append(_fmt(summary.get("ratio_jax_vs_blackjax", {}).get(n), ".2f"))
        rows.append(row)
    return md_table(headers, rows)


def timing_table(summary: dict[str, Any]) -> str:
    """Per-step times (ms) of every method by n."""
    modes = {m: e for m, e in summary["modes"].items() if "skipped" not in e}
    headers = ["n", "NumPy loop", "pm.Metropolis / draw", "pm.Metropolis / proposal"]
    headers += [f"Penalty {m}, pm.sample" for m in modes]
    headers += [f"Penalty {m}, step loop" for m in modes]
    headers += [f"{m} compiled call" for m in modes]
    rows = []
    for n in map(str, summary["sizes"]):
        row = [_n_label(n), _fmt(summary["ms_numpy"][n])]
        row += [_fmt(summary["ms_metropolis_per_draw"][n])]
        row += [_fmt(summary["ms_metropolis_per_proposal"][n])]
        for key in ("per_step_ms", "step_loop_ms", "compiled_call_ms"):
            row += [_fmt(e[key].get(n)) for e in modes.values()]
        rows.append(row)
    return md_table(headers, rows)


def ratio_table(summary: dict[str, Any]) -> str:
    """Ratios of the penalty step (``pm.sample``, per mode) against both baselines."""
    modes = {m: e for m, e in summary["modes"].items() if "skipped" not in e}
    headers = ["n"] + [f"{m} / NumPy loop" for m in modes]
    headers += [f"{m} / Metropolis per proposal" for m in modes]
    headers += ["target vs NumPy"]
    rows = []
    for n in map(str, summary["sizes"]):
        row = [_n_label(n)]
        row += [_fmt(e["ratio_vs_numpy"].get(n), ".2f") for e in modes.values()]
        row += [_fmt(e["ratio_vs_metropolis_per_proposal"].get(n), ".2f") for e in modes.values()]
        target = summary["targets"]["ratio_vs_numpy"].get(n)
        row.append("-" if target is None else f"<= {target:g}")
        rows.append(row)
    return md_table(headers, rows)


def compile_table(summary: dict[str, Any]) -> str:
    """Step construction (graph + compile) and first-call (JIT) wall times per mode."""
    modes = {m: e for m, e in summary["modes"].items() if "skipped" not in e}
    headers = ["n"] + [f"{m} build (s)" for m in modes] + [f"{m} first call (s)" for m in modes]
    headers.append("pm.Metropolis set-up (s)")
    rows = []
    for n in map(str, summary["sizes"]):
        row = [_n_label(n)]
        row += [_fmt(e["build_s"].get(n), ".2f") for e in modes.values()]
        row += [_fmt(e["first_call_s"].get(n), ".3f") for e in modes.values()]
        row.append(_fmt(summary["metropolis_setup_s"].get(n), ".2f"))
        rows.append(row)
    return md_table(headers, rows)


def breakdown_text(bd: dict[str, Any] | None) -> str:
    """The breakdown table and its sum check."""
    if bd is None:
        return "Breakdown not run."
    if "error" in bd:
        return f"Breakdown unavailable ({bd['error']})."
    total = bd["total_ms"]
    rows = [
        [PART_LABELS[k], _fmt(v, ".4f"), f"{100 * v / total:.0f} %"]
        for k, v in bd["parts_ms"].items()
    ]
    rows.append(["sum of the parts", _fmt(bd["sum_parts_ms"], ".4f"), ""])
    rows.append(["measured: one draw through pm.sample", _fmt(total, ".4f"), "100 %"])
    table = md_table(["part (ms per step)", "ms", "share of the draw"], rows)
    share = bd["parts_share_of_total"]
    verdict = "add up" if abs(1 - share) <= 0.15 else "do NOT add up"
    return (
        f"{table}\n\n"
        f"Check: the parts, measured apart from the total, sum to {bd['sum_parts_ms']:.4f} ms, "
        f"{100 * share:.0f} % of the measured {total:.4f} ms per draw: they {verdict} "
        f"(within 15 %). Other figures: one `step.step` call {bd['step_ms']:.4f} ms; the "
        f"compiled call timed alone, back to back, {bd['likelihood_isolated_ms']:.4f} ms (warm "
        "memory caches; in the chain other work runs between calls); clock cost subtracted "
        f"per timed call in the chain {bd['clock_overhead_us']:.2f} us; acceptance rate "
        f"{bd['accept']:.2f}."
    )


def targets_text(summary: dict[str, Any]) -> str:
    """One line per design target and measured mode: met / NOT met / not measured."""
    lines = []
    for mode, met in summary["targets_met"].items():
        entry = summary["modes"][mode]
        for n, target in summary["targets"]["ratio_vs_numpy"].items():
            ok, r = met["ratio_vs_numpy"][n], entry["ratio_vs_numpy"].get(n)
            status = "not measured" if ok is None else ("met" if ok else "NOT met")
            value = "" if r is None else f" ({r:.2f})"
            lines.append(
                f"- {mode}, n = {_n_label(n)}: within {target:g}x of NumPy{value}: {status}"
            )
        for n, ok in met["ratio_vs_metropolis_per_proposal"].items():
            r = entry["ratio_vs_metropolis_per_proposal"][n]
            status = "not measured" if ok is None else ("met" if ok else "NOT met")
            value = "" if r is None else f" ({r:.2f})"
            lines.append(
                f"- {mode}, n = {_n_label(n)}: faster than pm.Metropolis per proposal{value}: "
                f"{status}"
            )
    return "\n".join(lines)


def report_text(summary: dict[str, Any]) -> str:
    """Everything printed and written to the docs, as markdown."""
    skipped = [f"- {m}: skipped ({e['skipped']})" for m, e in summary["modes"].items()
               if "skipped" in e]  # fmt: skip
    errors = summary.get("penalty_error")
    met_draws = ", ".join(
        f"{_n_label(n)}: {k}" for n, k in summary["metropolis_timed_draws"].items()
    )
    breakdown_config = (summary["breakdown_1000"] or {}).get("config", "")
    parts = [
        "## Against a jitted JAX sampler (BlackJAX random walk, same model, proposal and n)",
        blackjax_table(summary),
        "## Time per step (ms)",
        timing_table(summary),
        f"pm.Metropolis draws timed (best chunk kept), by n: {met_draws}.",
        "## Ratios (per draw through `pm.sample`)",
        ratio_table(summary),
        "## Compilation and warm-up (wall time, not in the per-step figures)",
        compile_table(summary),
        f"## Where the time goes at n = 1e3 ({breakdown_config})",
        breakdown_text(summary["breakdown_1000"]),
        "## Design targets (DESIGN.md section 6)",
        targets_text(summary),
    ]
    if skipped:
        parts += ["## Modes not run", "\n".join(skipped)]
    if errors:
        parts += ["## Errors", errors]
    return "\n\n".join(parts)


def plot(summary: dict[str, Any], path: str) -> None:
    """Per-step time against n, log-log: each mode, the NumPy loop, pm.Metropolis/proposal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = np.asarray(summary["sizes"], dtype=float)

    def series(d: dict[str, float | None]) -> np.ndarray:
        return np.asarray([np.nan if d.get(str(n)) is None else d[str(n)] for n in ns.astype(int)])

    fig, ax = plt.subplots(figsize=(6.4, 4.4), layout="constrained")
    ax.plot(ns, series(summary["ms_numpy"]), "k--o", label="NumPy loop (same arithmetic)")
    ax.plot(
        ns, series(summary["ms_metropolis_per_proposal"]), ":s", color="grey",
        label="pm.Metropolis, per proposal",
    )  # fmt: skip
    for mode, entry in summary["modes"].items():
        if "skipped" not in entry:
            ax.plot(ns, series(entry["per_step_ms"]), "-o", label=f"PenaltyMetropolis, {mode}")
    if "skipped" not in summary.get("ms_blackjax", {"skipped": ""}):
        ax.plot(ns, series(summary["ms_blackjax"]), "-^", label="BlackJAX rmh (jit + scan)")
    jax_backend = summary["ms_per_step"].get("jax", {"skipped": ""})
    if "skipped" not in jax_backend:
        ax.plot(ns, series(jax_backend), "-v", label="pp.sample(backend='jax')")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("n (datapoints)")
    ax.set_ylabel("ms per step (CPU time, one BLAS thread)")
    ax.set_title(f"Logistic regression, d = {summary['d']}: time per step")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_docs(
    summary: dict[str, Any], command: str, md_path: str, png_path: str, notes: str = ""
) -> None:
    """Rewrite the docs page and its plot from one run.

    Parameters
    ----------
    summary : dict
        The RESULT dictionary.
    command : str
        The command that produced it (relative to the repository root).
    md_path, png_path : str
        Output files; the page links the plot by its file name.
    notes : str
        Markdown appended under "Notes" (findings from profiling).
    """
    os.makedirs(os.path.dirname(md_path), exist_ok=True)
    plot(summary, png_path)
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    versions = ", ".join(f"{k} {v}" for k, v in summary["versions"].items() if v is not None)
    blas = f"`{summary['blas_ldflags']}`" if summary["blas_ldflags"] else "none linked"
    text = (
        "# Speed benchmark\n\n"
        f"Produced by `{command}` (run from the repository root) on {today} (UTC); the run "
        f"took {summary['wall_s']:.0f} s. Machine: {summary['cpu']}, {summary['cpu_count']} "
        f"CPUs, {summary['system']} {summary['machine']}, Python {summary['python']}; "
        f"{versions}. PyTensor BLAS (`blas__ldflags`): {blas} (see `docs/blas.md`); NumPy "
        f"BLAS: {summary['numpy_blas']}. Clock: process {summary['clock']} time; BLAS limited "
        "to one thread for every method.\n\n"
        f"Logistic regression with d = {summary['d']}. Each figure is the fastest chunk of "
        "steps over interleaved rounds (see the docstring of `benchmarks/speed.py`). The "
        f"penalty step is `PenaltyMetropolis(noise_sd={summary['noise_sd']:g}, clip=None)` "
        'with `compile_kwargs={"mode": ...}`, where C is PyTensor\'s default mode; its '
        "headline time is per draw through `pm.sample`. pm.Metropolis runs in the default "
        "mode and makes d proposals per draw.\n\n"
        f"![Time per step against n, log-log](speed.png)\n\n{report_text(summary)}\n"
    )
    if notes:
        text += f"\n## Notes\n\n{notes.rstrip()}\n"
    with open(md_path, "w", encoding="utf-8") as fh:
        fh.write(text)
