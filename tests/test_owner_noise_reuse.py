"""Red-team issue 28, attack 3: an owner's noise is never reused for another request.

The attack (main e48aff3): two :class:`OwnerService` instances on one owner ledger each kept
their own in-memory journal, and the noise was keyed by (secret, run, step) only. Releasing
step ("R", 0) at theta' = 0.5 through one service and at theta' = 1.5 through the other gave
two replies with the *same* noise: their difference is the exact clipped-sum difference, here
``sum(y) - n`` for a Normal(theta, 1) likelihood, so ``sum(y)`` came out exact.

Now the journal is re-read under its file lock before every decision (a second request at an
id is refused, whichever service or driver sends it), and the noise is keyed by the digest of
the whole request (so even a request admitted because its journal line was lost gets noise of
its own, and is charged). Each test below recovers ``sum(y)`` exactly on the old code.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os

import cloudpickle
import numpy as np
import pymc as pm
import pytest
from scipy import stats

from pymc_penalty.distributed._service import OwnerService
from pymc_penalty.errors import OwnerSideError
from pymc_penalty.privacy.ledger import PrivacyLedger

N = 50
Y = np.random.default_rng(28).normal(3.0, 1.0, size=N)
BOUND, SIGMA = 20.0, 10.0  # |r_i| < 12 here: nothing is clipped, the sums are exact
MU2 = (2.0 * BOUND / SIGMA) ** 2  # what one release costs under substitute-one (factor 2)


def _model_bytes() -> bytes:
    with pm.Model() as model:
        data = pm.Data("y", np.zeros(1))
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("obs", mu, 1.0, observed=data)
    return cloudpickle.dumps(model)


def _service(ledger, model_bytes: bytes) -> OwnerService:
    return OwnerService(
        "site",
        model_bytes,
        ["mu"],
        {"mu": np.array(0.0)},
        lambda: {"y": Y},
        str(ledger),
        1e6,
        0.0,
        2.0,
        driver_pid=-1,  # in-process on purpose: the rows are this test's own
    )


def _release(service: OwnerService, step: int, x1: float) -> dict:
    return service.release(
        "R", step, np.zeros((1, 1)), np.full((1, 1), x1), np.array([BOUND]), SIGMA, math.inf,
        np.array([MU2]),
    )  # fmt: skip


def _exact(x1: float) -> float:
    """The clipped sum at 0 -> x1, computed without the package."""
    r = stats.norm.logpdf(Y, x1, 1.0) - stats.norm.logpdf(Y, 0.0, 1.0)
    return float(np.sum(np.clip(r, -BOUND, BOUND)))


def _spent(ledger) -> float:
    return PrivacyLedger.open(ledger).spent_mu2


@pytest.fixture(scope="module")
def model_bytes() -> bytes:
    return _model_bytes()


def test_two_services_on_one_ledger_refuse_a_second_request_at_one_step_id(tmp_path, model_bytes):
    ledger = tmp_path / "site.ledger"
    first, second = _service(ledger, model_bytes), _service(ledger, model_bytes)
    # Both were started before either released: neither has the other's step in memory.
    a = _release(first, 0, 0.5)
    assert a["released"]
    with pytest.raises(OwnerSideError, match="already released for other points"):
        _release(second, 0, 1.5)
    # The identical request, through either service: the identical value, charged once.
    for service in (first, second):
        again = _release(service, 0, 0.5)
        np.testing.assert_array_equal(again["sums"], a["sums"])
    assert _spent(ledger) == pytest.approx(MU2, rel=1e-12)
    # Step ids still increase across the services.
    _release(first, 2, 0.5)
    with pytest.raises(OwnerSideError, match="step ids must increase"):
        _release(second, 1, 0.5)


def _driver(service: OwnerService, x1: float, steps: int, barrier, queue) -> None:
    out = {}
    barrier.wait()
    for t in range(steps):
        try:
            out[t] = float(_release(service, t, x1)["sums"][0])
        except OwnerSideError:
            out[t] = None
    queue.put((x1, out))


def test_two_concurrent_drivers_on_one_owner_ledger_release_each_step_id_once(
    tmp_path, model_bytes
):
    ledger = tmp_path / "site.ledger"
    services = [_service(ledger, model_bytes), _service(ledger, model_bytes)]
    ctx = mp.get_context("fork")
    barrier, queue, steps = ctx.Barrier(2), ctx.Queue(), 40
    procs = [
        ctx.Process(target=_driver, args=(s, x1, steps, barrier, queue))
        for s, x1 in zip(services, (0.5, 1.5), strict=True)
    ]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    both = [t for t in range(steps) if results[0.5][t] is not None and results[1.5][t] is not None]
    # The old code released every id to both drivers with one noise draw: sum(y) exactly.
    for t in both:
        recovered = results[1.5][t] - results[0.5][t] + N
        assert abs(recovered - Y.sum()) > 1e-6
    assert not both
    released = sum(v is not None for r in results.values() for v in r.values())
    assert released == steps  # each id went to the driver that asked for it first
    assert _spent(ledger) == pytest.approx(released * MU2, rel=1e-12)


def test_a_request_admitted_after_a_lost_journal_gets_its_own_noise_and_is_charged(
    tmp_path, model_bytes
):
    ledger = tmp_path / "site.ledger"
    steps = 200
    first = _service(ledger, model_bytes)
    s1 = np.array([_release(first, t, 0.5)["sums"][0] for t in range(steps)])
    # A crash loses the journal (its lines are flushed, not synced); the ledger survives.
    os.unlink(tmp_path / "site.ledger.journal")
    second = _service(ledger, model_bytes)
    s2 = np.array([_release(second, t, 1.5)["sums"][0] for t in range(steps)])
    assert _spent(ledger) == pytest.approx(2 * steps * MU2, rel=1e-12)
    # Each reply is its exact clipped sum plus N(0, SIGMA^2) noise...
    for s, x1 in ((s1, 0.5), (s2, 1.5)):
        z = (s - _exact(x1)) / SIGMA
        assert stats.chi2.ppf(1e-6, steps) < np.sum(z**2) < stats.chi2.ppf(1 - 1e-6, steps)
    # ...and the difference of two replies at one step id carries both noises: variance
    # 2 SIGMA^2 (the old code's difference was exact, sum(y) recovered to rounding error).
    resid = (s2 - s1) - (_exact(1.5) - _exact(0.5))
    chi2 = np.sum(resid**2) / (2 * SIGMA**2)
    assert stats.chi2.ppf(1e-6, steps) < chi2 < stats.chi2.ppf(1 - 1e-6, steps)
    recovered = s2 - s1 + N
    assert np.mean(np.abs(recovered - Y.sum())) > SIGMA  # E|N(0, 2 sigma^2)| = 1.13 sigma
