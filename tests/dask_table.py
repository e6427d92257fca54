"""What the Dask samplers' tests share (``test_distributed_sampler.py`` for owners,
``test_shards.py`` for shards): a conjugate normal model and its rows, loaders that refuse to
run in the driver, a spy on what the driver receives, the posterior check against in-process
``pp.sample``, a worker killed mid-run and the resume of the stopped run.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import arviz as az
import numpy as np
import pymc as pm
import pytest

from pymc_penalty.privacy.ledger import PrivacyLedger

N_K = 301  # odd: no array of the driver's (chains, steps, ...) shapes has this size
DRIVER_PID = os.getpid()
EPS, DELTA = 2000.0, 1e-5
CLIP = 6.0  # |y - mu| < 6 for every row near the posterior: nothing is clipped, both exact


@pytest.fixture(scope="module")
def shard_client():
    """A client of a LocalCluster of 2 worker processes (1 thread each), per test module (the
    shards' tests: ``client = dask_table.shard_client`` there)."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    )
    client = Client(cluster, set_as_default=False)
    yield client
    client.close()
    cluster.close()


def rows_of(seed: int) -> dict[str, np.ndarray]:
    """One party's rows: ``N_K`` draws of N(1, 1)."""
    return {"y": np.random.default_rng(seed).normal(1.0, 1.0, size=N_K)}


def loader_of(seed: int):
    """A loader of :func:`rows_of` that refuses to run in the driver's process (pickled by
    value, so it runs on a worker)."""

    def load():
        if os.getpid() == DRIVER_PID:
            raise AssertionError("rows loaded in the driver")
        return rows_of(seed)

    return load


def normal_model(y: np.ndarray | None = None) -> pm.Model:
    """``mu ~ N(0, 10)``, ``y ~ N(mu, 1)``; without ``y``, a one-row placeholder."""
    with pm.Model() as m:
        data = pm.Data("y", np.zeros(1) if y is None else y)
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("obs", mu, 1.0, observed=data)
    return m


def scale_model(y: np.ndarray | None = None) -> pm.Model:
    """``mu ~ N(0, 10)``, ``s ~ HalfNormal(5)``, ``y ~ N(mu, s)`` (a transformed coordinate);
    without ``y``, a one-row placeholder."""
    with pm.Model() as m:
        data = pm.Data("y", np.zeros(1) if y is None else y)
        mu = pm.Normal("mu", 0.0, 10.0)
        s = pm.HalfNormal("s", 5.0)
        pm.Normal("obs", mu, s, observed=data)
    return m


def table_loader(seeds: tuple[int, ...], shift: float = 0.0):
    """A loader of the concatenated rows of ``seeds`` (:func:`rows_of`), shifted, that refuses
    to run in the driver."""

    def load():
        if os.getpid() == DRIVER_PID:
            raise AssertionError("rows loaded in the driver")
        return {"y": np.concatenate([rows_of(k)["y"] for k in seeds]) + shift}

    return load


def prepared_run(model: pm.Model, neighbours: str) -> Any:
    """A run of ``model`` (its ledger, relation, value variables) at :data:`EPS`, nothing
    spent (``pymc_penalty.distributed._setup.prepare_run``)."""
    from pymc_penalty.distributed._setup import prepare_run

    return prepare_run(
        model, epsilon=EPS, delta=DELTA, draws=10, tune=10, chains=2, neighbours=neighbours,
        clip=CLIP, clip_mode="distance", clip_count_share=0.05, S=None, scaling=1.0,
        adapt="full", target_accept=0.234, adapt_window=None, tune_interval=None,
        ledger_path=None, run=None,
    )  # fmt: skip


def arrays(obj: Any) -> Iterator[np.ndarray]:
    """Every NumPy array in a reply (nested in dicts, lists and tuples)."""
    if isinstance(obj, np.ndarray):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from arrays(v)
    elif isinstance(obj, list | tuple):
        for v in obj:
            yield from arrays(v)


@contextmanager
def replies_received(pool_class: type) -> Iterator[list[Any]]:
    """Every answer the driver receives through a ``pool_class`` (its ``_answer``) while
    inside the block."""
    replies: list[Any] = []
    original = pool_class._answer

    def spy(self, name, future, what, timeout=None):
        out = original(self, name, future, what, timeout)
        replies.append(out)
        return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pool_class, "_answer", spy)
        yield replies


def assert_same_posterior(dist: az.InferenceData, local: az.InferenceData, y: np.ndarray) -> None:
    """The distributed and the in-process posterior of ``mu`` (of :func:`normal_model` on ``y``)
    agree within 4 combined MCSE, the distributed one is within 4 MCSE of the exact mean, and
    the check has power: a posterior shifted by two of its sds is told apart."""
    exact_sd = 1 / math.sqrt(len(y) + 1 / 100)
    exact_mean = exact_sd**2 * y.sum()
    means, mcses = [], []
    for idata in (dist, local):
        draws = idata.posterior["mu"]
        means.append(float(draws.mean()))
        mcses.append(float(az.mcse(draws)["mu"]))
        assert float(az.ess(draws)["mu"]) > 50  # enough to estimate the MCSE
    tol = 4 * math.hypot(*mcses)
    assert abs(means[0] - means[1]) < tol
    assert abs(means[0] - exact_mean) < 4 * mcses[0]
    assert abs(means[0] + 2 * exact_sd - means[1]) > tol


def kill_before_step(pool: Any, victim: int, kill_at: int) -> None:
    """Make ``pool`` kill the worker process ``victim`` just before it sends step
    ``kill_at``."""
    release = pool.release

    def release_then_kill(*args, step, **kw):
        if step == kill_at:
            os.kill(victim, signal.SIGKILL)
            time.sleep(0.3)
        return release(*args, step=step, **kw)

    pool.release = release_then_kill


def resume(sampler: Any, parties: Any, run: str, ledger_path: Any, **kwargs: Any) -> Any:
    """``sampler(parties, ...)`` resumes the stopped ``run``, after a run id that is not in
    the journal is refused without a charge on the driver's ledger."""
    spent = PrivacyLedger.open(ledger_path).spent_mu2
    with pytest.raises(ValueError, match="no run to resume"):
        sampler(parties, ledger_path=ledger_path, run="nope", **kwargs)
    assert PrivacyLedger.open(ledger_path).spent_mu2 == spent
    return sampler(parties, ledger_path=ledger_path, run=run, **kwargs)
