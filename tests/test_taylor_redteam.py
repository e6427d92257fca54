"""Red-team checks of the Taylor path (issue 27): nothing that depends on one record leaves
the one-shot release outside its noisy outputs."""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest

from pymc_penalty.privacy.ledger import PrivacyLedger
from pymc_penalty.warmstart import WarmStart, prepare_warm_start
from pymc_penalty.warmstart.taylor import taylor_oneshot


def _logistic(x0: float, n: int = 300) -> pm.Model:
    rng = np.random.default_rng(0)
    x = rng.normal(size=n)
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-(0.3 + 0.8 * x)))).astype(float)
    x[0], y[0] = x0, 0.0
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 2.0)
        b = pm.Normal("b", 0.0, 2.0)
        pm.Bernoulli("y", logit_p=a + b * x, observed=y)
    return model


def _warm(n: int) -> WarmStart:
    return WarmStart(
        point=np.array([0.3, 0.8]),
        covariance=np.diag([0.01, 0.01]),
        initvals={"a": np.asarray(0.3), "b": np.asarray(0.8)},
        mu=0.0,
        releases=0,
        clip=1.0,
        metric_clip=1.0,
        clipped_fraction=None,
        clip_history=(),
        n_rows=float(n),
    )


@pytest.mark.parametrize("x0", [1.0, 1e200])
def test_oneshot_emits_no_warning_that_depends_on_one_record(x0: float) -> None:
    """One record with a covariate of 1e200 (finite log-likelihood, a whitened gradient whose
    norm overflows) is clipped to zero like any bad row; before the fix NumPy's 'overflow
    encountered' RuntimeWarnings were printed only for such a table: a free bit about one
    record, outside the ledger. ``x0 = 1`` is the clean control."""
    model = _logistic(x0)
    target = prepare_warm_start(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tm = taylor_oneshot(
            target,
            _warm(300),
            mu=1.0,
            ledger=PrivacyLedger(10.0),
            noise_rng=np.random.default_rng(0),
        )
    assert [str(w.message) for w in caught] == []
    assert np.all(np.isfinite(tm.release.G)) and np.all(np.isfinite(tm.release.H))
    assert np.isfinite(tm.residual_clip) and tm.residual_clip > 0
