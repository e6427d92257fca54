"""The private warm start on discrete data, whose score differences tie (issue 13).

A Beta-Bernoulli (the penalty paper's own example): ``theta ~ Beta(1, 1)``, ``y ~
Bernoulli(theta)``, n = 1e4, p = 0.3, a 20% share of epsilon = 1. 58% of the row pairs tie (an
exact zero difference). Counted at ``-LOG_CLIP`` in the first metric's scale release, the ties
made that metric about ``e^14`` times too small and the warm start ended 4.7-36 posterior sds
off (8 seeds);
counted at ``TIE_LOG`` (0) it lands within 0.71 (8 seeds).
"""

from __future__ import annotations

import math

import numpy as np
import pymc as pm
import pytest

import pymc_penalty as pp
import pymc_penalty.warmstart.releases as releases
from pymc_penalty import PrivacyLedger
from pymc_penalty.warmstart import private_warm_start

N, P = 10_000, 0.3


@pytest.fixture(scope="module")
def bernoulli():
    y = (np.random.default_rng(0).random(N) < P).astype(int)
    k = int(y.sum())
    with pm.Model() as model:
        theta = pm.Beta("theta", 1.0, 1.0)
        pm.Bernoulli("y", p=theta, observed=y)
    # The exact posterior of logit(theta) (Jacobian included) is logit of Beta(1 + k, 1 + n - k):
    # its mode and the Laplace sd there.
    mode = math.log((1 + k) / (1 + N - k))
    sd = math.sqrt(1.0 / (1 + k) + 1.0 / (1 + N - k))
    return model, mode, sd


def _errors(model, mode, sd, seeds):
    mu = math.sqrt(0.2) * pp.gdp_mu(1.0, 1.0 / N)
    out = []
    for seed in seeds:
        with model:
            ws = private_warm_start(
                mu=mu, ledger=PrivacyLedger(1.001 * mu), noise_rng=np.random.default_rng(seed)
            )
        out.append((float(ws.point[0]) - mode) / sd)
    return np.abs(out)


@pytest.mark.slow
def test_a_bernoulli_warm_start_lands(bernoulli):
    """Measured 0.04-0.71 posterior sd over seeds 0-7; 2.5 is over three times the largest."""
    errors = _errors(*bernoulli, range(4))
    assert np.all(errors < 2.5), errors


@pytest.mark.slow
def test_control_ties_at_the_bottom_of_the_log_range_leave_it_far(bernoulli, monkeypatch):
    """The must-fail control: ties counted at ``-LOG_CLIP`` (the old rule): 4.7-36 sds off
    over seeds 0-7 (seeds 0-3: 35.5, 7.2, 4.7, 7.2)."""
    monkeypatch.setattr(releases, "TIE_LOG", -releases.LOG_CLIP)
    errors = _errors(*bernoulli, range(4))
    assert np.all(errors > 3.0), errors
