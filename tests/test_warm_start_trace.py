"""The warm-start trace diagnostic (``scripts/warm_start_trace.py``): its exact mode and
whitening, and the correlations it reports, against known answers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pymc as pm
import pytest

_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "warm_start_trace.py"
_spec = importlib.util.spec_from_file_location("warm_start_trace", _SCRIPT)
wst = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wst)


def test_largest_correlation_of_a_known_matrix() -> None:
    m = np.array([[4.0, 1.0, 0.0], [1.0, 1.0, -0.9], [0.0, -0.9, 1.0]])
    assert wst._largest_correlation(m) == pytest.approx(0.9)
    assert wst._largest_correlation(np.eye(3)) == 0.0


def _regression(n: int = 400) -> tuple[pm.Model, np.ndarray]:
    """A Gaussian regression and its exact posterior mode (``b``, then ``a``)."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(n, 2))
    y = x @ np.array([0.5, -1.0]) + 0.3 + rng.normal(size=n)
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 10.0, shape=2)
        a = pm.Normal("a", 0.0, 10.0)
        pm.Normal("y", a + x @ b, 1.0, observed=y)
    design = np.column_stack([x, np.ones(n)])
    mode = np.linalg.solve(design.T @ design + np.eye(3) / 100.0, design.T @ y)
    return model, mode


def test_exact_mode_whitens_the_hessian_and_its_gradient_vanishes() -> None:
    """The exact mode of a Gaussian regression is its closed form (least squares with a weak
    prior); there the whitened Hessian is -I (correlation 0), the rows' score covariance is near the
    identity, and the gradient is zero; at the model's initial point the gradient is not (the
    must-differ case)."""
    model, closed_form = _regression()
    exact = wst.Exact(model)
    mode, chol, grad = exact.mode, exact.chol, exact.grad
    assert mode == pytest.approx(closed_form, abs=1e-4)
    at = wst.metrics(exact)
    spread, curvature = at(mode)
    assert curvature < 1e-6
    assert spread < 0.3  # the rows' sample covariance of 400 rows: within sampling error
    assert np.linalg.norm(chol.T @ grad(mode)) < 1e-3
    assert np.linalg.norm(chol.T @ grad(exact.start)) > 10.0


def test_variants_are_the_scoring_constants_and_a_bad_one_fails() -> None:
    assert wst._constants("package") == {}
    assert wst._constants("_GUESS_SES=inf,_GUESS_REVERSAL=0") == {
        "_GUESS_SES": float("inf"),
        "_GUESS_REVERSAL": 0.0,
    }
    for bad in ("_NO_SUCH=1", "_GUESS_SES", "_GUESS_SES="):
        with pytest.raises(SystemExit, match="--variant"):
            wst._constants(bad)


def test_the_hard_starts_are_built_on_their_data() -> None:
    """The two starts of ``tests/test_warmstart_scale.py`` on fresh data: their observed
    rows' mean and sd are the generators' (170, 10) and (0, 10)."""
    for name, (mean, sd) in zip(wst.STARTS, [(170.0, 10.0), (0.0, 10.0)], strict=True):
        model = wst.build(name, 4000, 0)
        y = model.rvs_to_values[model.observed_RVs[0]].data
        assert np.mean(y) == pytest.approx(mean, abs=4 * sd / np.sqrt(4000))
        assert np.std(y) == pytest.approx(sd, rel=0.05)
