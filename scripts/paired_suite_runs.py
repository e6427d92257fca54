"""Two ``benchmarks/model_suite.py`` CSVs of the same runs, paired (before and after a change).

Run ``python scripts/paired_suite_runs.py BEFORE.csv AFTER.csv``, both written with
``--seeded-noise`` on the same data sets, so a run whose draws did not change reads the same
to the last digit. Per private run ``(model, n, epsilon, method, dataset)`` present in both:
the RMS error in NUTS sds before -> after, the smallest sd ratio, the verdicts, and ``same``
where every figure agrees. Then per model: how many runs changed, the RMS over runs of the
error before -> after, and the runs "converged". A run missing from either file, or that
ended in an error, is listed and left out of the figures.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections import defaultdict

#: The figures compared per run (a run is ``same`` when all agree).
FIGURES = ("err_rms", "sd_ratio_min", "verdict", "ess_bulk_min")


def read(path: str) -> dict[tuple[str, ...], dict[str, str]]:
    """The private runs of a CSV by ``(model, n, epsilon, method, dataset)`` (NUTS references
    left out; a run repeated in the file: its last row)."""
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    return {
        (r["model"], r["n"], r["epsilon"], r["method"], r["dataset"]): r
        for r in rows
        if r["method"] != "nuts"
    }


def _rms(values: list[float]) -> float:
    return math.sqrt(sum(v * v for v in values) / len(values)) if values else math.nan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    args = parser.parse_args(argv)
    before, after = read(args.before), read(args.after)
    by_model: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for key in sorted(set(before) | set(after), key=lambda k: (k[0], k[2], int(k[4]))):
        label = " ".join(f"{v}" for v in key)
        if key not in before or key not in after:
            print(f"{label}: only in {'after' if key not in before else 'before'}")
            continue
        b, a = before[key], after[key]
        if b["error"] or a["error"]:
            print(f"{label}: error ({b['error'] or a['error']})")
            continue
        same = all(b[f] == a[f] for f in FIGURES)
        print(
            f"{label}: RMS {float(b['err_rms']):.2f} -> {float(a['err_rms']):.2f} sd, "
            f"smallest sd ratio {float(b['sd_ratio_min']):.2f} -> {float(a['sd_ratio_min']):.2f}, "
            f"{b['verdict']} -> {a['verdict']}{', same' if same else ''}"
        )
        stats = by_model[key[0]]
        stats["before"].append(float(b["err_rms"]))
        stats["after"].append(float(a["err_rms"]))
        stats["changed"].append(not same)
        stats["conv_before"].append(b["verdict"] == "converged")
        stats["conv_after"].append(a["verdict"] == "converged")
    for model, s in by_model.items():
        print(
            f"SUMMARY {model}: {sum(s['changed'])} of {len(s['changed'])} runs changed; RMS "
            f"over runs {_rms(s['before']):.2f} -> {_rms(s['after']):.2f} sd; converged "
            f"{sum(s['conv_before'])} -> {sum(s['conv_after'])}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
