"""The warm start's guessed steps (stretched, or capped at a grown radius): a guess whose
released slope reversed goes back to the secant's zero (``warmstart.scoring._backtrack``).

The case they mend: the model suite's linear regression (``benchmarks/model_suite.py``, data
set 0, n = 1e4) at ``mu = 0.22`` (``pp.sample``'s warm start at epsilon 2), noise seed 1. A
slope that kept 97% of itself along a step, the 3% within its noise, stretched the next step
36 times; it overshot from 58 to 212 posterior sds, the reversal stayed within the last slope
(the far point's rows clipped), and the warm start ended 147 sds off; now 48.
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
    # Past half the last slope: the secant's zero is beyond half the step; at most a half.
    ascent, step = _slope(-0.6)
    assert scoring._backtrack(ascent, step, 1.0, noise, True) == 0.5
    # A reversal within half the last slope (though 4 noise sds), within 3 noise sds, or
    # none: kept.
    for value in (-0.4, -0.25, 0.5):
        ascent, step = _slope(value)
        assert scoring._backtrack(ascent, step, 1.0, noise, True) is None


@pytest.mark.slow
def test_the_linear_warm_start_no_longer_overshoots(monkeypatch: pytest.MonkeyPatch) -> None:
    """The case above ends within 75 posterior sds (48 measured; before: 147, the control
    with the old rule, which must stay over 100)."""
    spec = importlib.util.spec_from_file_location("warm_start_trace", _SCRIPT)
    wst = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wst)
    model = wst.build("linear", 10_000, 0)
    exact = wst.Exact(model)

    def dist() -> float:
        _, warm, _ = wst.trace(model, 0.22, 1, None)
        z = np.linalg.solve(exact.chol, warm.point - exact.mode)
        return float(np.sqrt(np.mean(z**2)))

    assert dist() < 75.0
    monkeypatch.setattr(scoring, "_GUESS_SES", math.inf)
    assert dist() > 100.0
