"""The README's main job and the embedded dataset."""

from __future__ import annotations

import numpy as np
import pytest

from pymc_penalty.datasets import load_screening
from pymc_penalty.demo import main


def test_screening_dataset():
    data = load_screening()
    assert data.X.shape == (20000, 5) and data.y.shape == (20000,)
    assert set(np.unique(data.y)) == {0, 1}
    np.testing.assert_array_equal(data.X[:, 0], 1.0)
    assert data.columns[0] == "intercept" and set(data.truth) == set(data.columns)


@pytest.mark.slow
def test_demo_prints_a_posterior_and_its_report(capsys):
    assert main(["--draws", "60", "--tune", "60", "--chains", "2", "--cores", "1"]) == 0
    out = capsys.readouterr().out
    assert "beta[age]" in out
    # The readable report (pp.report): budget, phases, convergence verdict, clipping.
    for heading in ("Privacy report", "Budget", "Cost per phase", "Convergence", "Clipping"):
        assert heading in out
    assert "releases" in out and "240 (per chain [120, 120])" in out
    assert "epsilon spent" in out and "verdict" in out
