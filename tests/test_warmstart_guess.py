"""The warm start's guessed steps (stretched, or capped at a grown radius): the secant stretch
is no larger than the releases show, and a guess whose released slope reversed goes back to
the secant's zero (``warmstart.scoring._stretch`` and ``_backtrack``).

The case they mend: the model suite's linear regression (``benchmarks/model_suite.py``, data
set 0, n = 1e4) at ``mu = 0.22`` (``pp.sample``'s warm start at epsilon 2), noise seed 1. A
slope that kept 97% of itself along a step, the 3% within its noise, stretched the next step
36 times; it overshot from 58 to 212 posterior sds, the reversal stayed within the last slope
(the far point's rows clipped), and the warm start ended 147 sds off.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

import pymc_penalty.warmstart.scoring as scoring

_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "warm_start_trace.py"


def _slope(value: float) -> tuple[np.ndarray, np.ndarray]:
    """``(ascent, step)`` whose slope ``ascent @ step`` is ``value``."""
    return np.array([value, 0.0]), np.array([1.0, 0.0])


def test_a_stretch_counts_the_noise_of_the_slopes_fall() -> None:
    """The figures of the linear case: slopes 3550 -> 3450 with noise sd 362 stretch
    ``1 / (1 - (3450 - 2 sqrt(2) 362) / 3550)`` = 3.16 times, not the 36 of the slopes alone
    (a noise of 0 gives that one: the must-differ case)."""
    kept = (3450.0 - scoring._STRETCH_SES * math.sqrt(2.0) * 362.0) / 3550.0
    assert scoring._stretch((3450.0, 3550.0), 1.0, 362.0) == pytest.approx(1.0 / (1.0 - kept))
    assert scoring._stretch((3450.0, 3550.0), 1.0, 362.0) == pytest.approx(3.16, abs=0.01)
    assert scoring._stretch((3450.0, 3550.0), 1.0, 0.0) == pytest.approx(35.5, abs=0.1)
    # Noise larger than the fall: no stretch (never below 1).
    assert scoring._stretch((3450.0, 3550.0), 1.0, 5000.0) == 1.0
    # Insignificant slopes: no stretch at all.
    assert scoring._stretch(None, 4.0, 1.0) == 1.0


def test_an_overshoot_goes_back_a_quarter_a_guess_to_the_secants_zero() -> None:
    noise = np.array([0.1, 0.0])  # the slope's noise sd, 0.1
    # Reversed beyond the last slope plus 3 noise sds: an overshoot, guess or not.
    ascent, step = _slope(-1.5)
    for guess in (False, True):
        assert scoring._backtrack(ascent, step, 1.0, noise, guess) == 0.25
    # Reversed by 12 noise sds, within the last slope: a Fisher step is kept (the
    # must-differ case); a guess goes back to the secant's zero, 1 / (1 + 1.2).
    ascent, step = _slope(-1.2)
    assert scoring._backtrack(ascent, step, 1.0, noise, False) is None
    assert scoring._backtrack(ascent, step, 1.0, noise, True) == pytest.approx(1.0 / 2.2)
    # A small reversal: the secant's zero is beyond half the step; at most a half.
    ascent, step = _slope(-0.4)
    assert scoring._backtrack(ascent, step, 1.0, noise, True) == 0.5
    # A reversal within 3 noise sds, or none: kept.
    for value in (-0.25, 0.5):
        ascent, step = _slope(value)
        assert scoring._backtrack(ascent, step, 1.0, noise, True) is None


@pytest.mark.slow
def test_the_linear_warm_start_no_longer_overshoots(monkeypatch: pytest.MonkeyPatch) -> None:
    """The case above ends within 30 posterior sds (16.6 measured; before: 147, the control
    with the old rules, which must stay over 100)."""
    spec = importlib.util.spec_from_file_location("warm_start_trace", _SCRIPT)
    wst = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wst)
    model = wst.build("linear", 10_000, 0)
    exact = wst.Exact(model)

    def dist() -> float:
        _, warm = wst.trace(model, 0.22, 1, None)
        z = np.linalg.solve(exact.chol, warm.point - exact.mode)
        return float(np.sqrt(np.mean(z**2)))

    assert dist() < 30.0
    monkeypatch.setattr(scoring, "_GUESS_SES", math.inf)
    monkeypatch.setattr(scoring, "_STRETCH_SES", 0.0)
    assert dist() > 100.0
