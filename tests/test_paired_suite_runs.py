"""``scripts/paired_suite_runs.py``: two model-suite CSVs paired run by run."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "paired_suite_runs.py"
_spec = importlib.util.spec_from_file_location("paired_suite_runs", _SCRIPT)
paired = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(paired)

_FIELDS = ("model", "n", "epsilon", "method", "dataset", *paired.FIGURES, "error")


def _write(path: Path, rows: list[tuple]) -> str:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(_FIELDS)
        writer.writerows(rows)
    return str(path)


def test_runs_pair_by_key_and_the_summary_counts_changes(tmp_path, capsys) -> None:
    nuts = ("linear", "10000", "", "nuts", "0", "0.0", "1.0", "reference", "", "")
    same = ("linear", "10000", "2.0", "taylor", "0", "0.37", "1.09", "converged", "4589", "")
    before = _write(
        tmp_path / "b.csv",
        [
            nuts,
            same,
            ("linear", "10000", "2.0", "taylor", "1", "3.00", "0.50", "not converged", "40", ""),
            ("linear", "10000", "2.0", "taylor", "2", "0.50", "1.00", "converged", "900", ""),
        ],
    )
    after = _write(
        tmp_path / "a.csv",
        [
            nuts,
            same,
            ("linear", "10000", "2.0", "taylor", "1", "0.40", "1.02", "converged", "4000", ""),
        ],
    )
    assert paired.main([before, after]) == 0
    out = capsys.readouterr().out
    assert "linear 10000 2.0 taylor 0: RMS 0.37 -> 0.37 sd" in out and "same" in out
    assert "taylor 1: RMS 3.00 -> 0.40 sd, smallest sd ratio 0.50 -> 1.02, not converged" in out
    assert "linear 10000 2.0 taylor 2: only in before" in out
    # Two paired runs, one changed: RMS over runs sqrt((0.37^2 + 3^2) / 2) -> ...
    rms_before = ((0.37**2 + 3.0**2) / 2) ** 0.5
    rms_after = ((0.37**2 + 0.40**2) / 2) ** 0.5
    summary = [line for line in out.splitlines() if line.startswith("SUMMARY")]
    assert summary == [
        f"SUMMARY linear: 1 of 2 runs changed; RMS over runs {rms_before:.2f} -> "
        f"{rms_after:.2f} sd; converged 1 -> 2"
    ]
    assert rms_before == pytest.approx(2.14, abs=0.01)
