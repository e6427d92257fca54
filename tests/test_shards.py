"""One curator's table sharded over a real Dask LocalCluster (2 worker processes, 1 thread
each): the posterior matches in-process ``pp.sample`` on the concatenated table within Monte
Carlo error (and a shifted posterior is told apart), no reply of a shard's row count reaches
the driver, a released step is never released again with other noise, a killed worker stops
the run naming its shard and a resume charges every step exactly once, a hung worker hits the
timeout, and bad arguments or an unreachable scheduler are refused before anything is spent.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time

import numpy as np
import pymc as pm
import pytest

pytest.importorskip("distributed")

import dask_table as table  # noqa: E402
from dask_table import CLIP, DELTA, EPS, N_K, loader_of, normal_model, rows_of  # noqa: E402

import pymc_penalty as pp  # noqa: E402
from pymc_penalty import ModelNotPrivateError  # noqa: E402
from pymc_penalty.distributed import (  # noqa: E402
    DistributedSamplingError,
    ShardError,
    ShardPool,
    sample_sharded,
)
from pymc_penalty.privacy.ledger import PrivacyLedger  # noqa: E402
from pymc_penalty.privacy.precision import on_noise_grid  # noqa: E402

pytestmark = pytest.mark.slow


client = table.shard_client  # the module's LocalCluster (2 workers)


def test_the_sharded_posterior_matches_in_process_and_no_row_array_reaches_the_driver(client):
    kwargs = dict(
        epsilon=EPS, delta=DELTA, draws=600, tune=300, chains=4, clip=CLIP, clip_mode="distance"
    )
    shards = [loader_of(0), loader_of(1)]
    with table.replies_received(ShardPool) as replies:
        # Through pp.sample's hook: the same call as in-process, with the shards.
        dist = pp.sample(
            shards=shards, cluster=client, model=normal_model(), random_seed=11, warm_start=0,
            **kwargs,
        )  # fmt: skip

    # What the driver received from the shards: one float and one count per chain.
    sums = [r for r in replies if isinstance(r, dict) and "sums" in r]
    assert len(sums) == 2 * (600 + 300)
    sizes = {a.size for r in replies for a in table.arrays(r)}
    assert sizes == {4}, sizes
    from distributed import Actor

    # Besides them: the actor handles and the names ready() returns once a shard is loaded.
    assert {type(r) for r in replies} <= {dict, str, Actor}

    y = np.concatenate([rows_of(0)["y"], rows_of(1)["y"]])
    with normal_model(y):
        local = pp.sample(random_seed=12, progressbar=False, warm_start=0, **kwargs)
    table.assert_same_posterior(dist, local, y)
    # The same noise as in-process: one draw for the whole table's sensitivity.
    np.testing.assert_allclose(
        dist.sample_stats["dp_noise_sd"] / dist.sample_stats["dp_sensitivity"],
        1 / dist.sample_stats["dp_mu"] / math.sqrt(1 - 0.05),
        rtol=1e-9,
    )
    attrs = dist.attrs
    assert attrs["dp_shards"] == 2 and attrs["dp_releases"] == 4 * 900
    assert attrs["dp_epsilon"] <= EPS and "observed_data" not in dist.groups()
    assert not any(k.startswith("dp_mu_owner") for k in dist.sample_stats.data_vars)


def test_a_step_is_released_once_whatever_is_retried(client, tmp_path):
    model = normal_model()
    with ShardPool(
        [loader_of(0), loader_of(1)], model, model.value_vars, model.initial_point(), cluster=client
    ) as pool:
        x0 = np.zeros((3, 1))
        x1 = np.full((3, 1), 0.5)
        args = (x0, x1, np.full(3, 6.0), np.full((1, 3), 0.7), np.array([2.0]))
        first = pool.release(*args, step=0)
        again = pool.release(*args, step=0)  # a re-executed step: the identical release
        np.testing.assert_array_equal(first[0], again[0])
        np.testing.assert_array_equal(first[1], again[1])
        # The same id with other points would reuse its noise: refused, nothing released.
        with pytest.raises(ShardError, match="already released for other points"):
            pool.release(x0, x1 + 0.1, *args[2:], step=0)
        # Noise is added at the driver, once: the release minus the exact total is N(0, s^2).
        exact = sum(
            np.sum(np.clip(-0.5 * ((rows_of(k)["y"] - 0.5) ** 2 - rows_of(k)["y"] ** 2), -6, 6))
            for k in range(2)
        )
        z = (first[0][0] - exact) / 0.7
        assert np.all(np.abs(z) < 5) and np.ptp(z) > 0  # a fresh draw per chain
        other = pool.release(*args, step=1)  # another step: other noise
        assert not np.allclose(other[0], first[0])
        # Measured: each shard computed step 0 twice (the retry) and step 1 once; the
        # refused call never reached a shard.
        computed = pool.computed()
        for name in ("shard-0", "shard-1"):
            assert computed[name] == {f"{pool.run}/0": 2, f"{pool.run}/1": 1}


def test_the_blocks_of_dask_arrays_are_shards_computed_on_the_workers(client):
    import dask
    import dask.array as da

    driver_pid = table.DRIVER_PID  # in the closure: a worker importing table has its own

    def block(k):  # runs on a worker: the rows are never in the driver
        if os.getpid() == driver_pid:
            raise AssertionError("rows computed in the driver")
        return rows_of(k)["y"]

    y = da.concatenate(
        [da.from_delayed(dask.delayed(block)(k), shape=(N_K,), dtype=float) for k in range(3)]
    )
    model = normal_model()
    with ShardPool(
        {"y": y}, model, model.value_vars, model.initial_point(), cluster=client
    ) as pool:
        assert pool.names == ["shard-0", "shard-1", "shard-2"]
        x0, x1 = np.zeros((2, 1)), np.array([[0.5], [-0.25]])
        sums, counts = pool.release(x0, x1, np.full(2, 6.0), np.full(2, 1e-9), np.array([1e-9]))
    y_all = np.concatenate([rows_of(k)["y"] for k in range(3)])
    exact = [np.sum(-0.5 * ((y_all - m) ** 2 - y_all**2)) for m in (0.5, -0.25)]
    # The noisy total is on the grid of its noise sd (pymc_penalty.privacy.precision): at 1e-9
    # noise sds, 13 significant bits, within 2**-13 of the exact sum.
    assert on_noise_grid(sums[0], 1e-9)
    np.testing.assert_allclose(sums[0], exact, rtol=2.0**-13)
    np.testing.assert_allclose(counts[0], 0.0, atol=1e-6)  # nothing clipped at B = 6
    with pytest.raises(ValueError, match="share their row chunks"):
        sample_sharded(
            {"y": y, "X": da.zeros((3 * N_K, 2), chunks=(N_K // 2, 2))}, epsilon=EPS,
            delta=DELTA, model=model, clip=CLIP,
        )  # fmt: skip


@pytest.mark.filterwarnings("ignore::pymc_penalty.ConvergenceWarning")  # short on purpose
def test_dask_never_reruns_a_step_in_a_run(client):
    model = normal_model()
    with ShardPool(
        [loader_of(0), loader_of(1)], model, model.value_vars, model.initial_point(), cluster=client
    ) as pool:
        import dask

        assert dask.config.get("distributed.scheduler.allowed-failures") == 0
        sample_sharded(
            [loader_of(0), loader_of(1)], model=model, pool=pool, epsilon=EPS, delta=DELTA,
            draws=20, tune=10, chains=2, clip=CLIP,
        )  # fmt: skip
        computed = pool.computed()
    for name in ("shard-0", "shard-1"):
        assert sorted(int(k.split("/")[1]) for k in computed[name]) == list(range(30))
        assert set(computed[name].values()) == {1}


@pytest.mark.filterwarnings("ignore::pymc_penalty.ConvergenceWarning")  # short on purpose
def test_a_killed_worker_stops_the_run_and_a_resume_charges_every_step_once(tmp_path):
    model = normal_model()
    shards = [loader_of(0), loader_of(1)]
    ledger_path = tmp_path / "run.ledger"
    kwargs = dict(epsilon=EPS, delta=DELTA, draws=40, tune=20, chains=3, clip=CLIP)
    kill_at = 25
    with ShardPool(shards, model, model.value_vars, model.initial_point(), timeout=10) as pool:
        pids = pool.client.run(os.getpid)
        table.kill_before_step(pool, pids[pool.placement[1]], kill_at)
        with pytest.raises(DistributedSamplingError, match="Shard 'shard-1'") as err:
            sample_sharded(shards, model=model, pool=pool, ledger_path=ledger_path, **kwargs)
    assert err.value.step == kill_at
    run = err.value.run
    lines = [json.loads(s) for s in (tmp_path / "run.ledger.runs").read_text().splitlines()]
    header = next(e for e in lines if "owner_mu" in e)
    mu2 = header["owner_mu"][0] ** 2
    chains = kwargs["chains"]
    # Charged before sending: every step the driver sent, the lost one included; released
    # (digest journaled, noise drawn): only the steps every shard answered.
    driver = PrivacyLedger.open(ledger_path).spent_mu2
    assert driver == pytest.approx((kill_at + 1) * chains * mu2, rel=1e-9)
    released = sorted(e["step"] for e in lines if "digest" in e)
    assert released == list(range(kill_at))
    assert err.value.privacy_report["dp_epsilon"] < EPS

    idata = table.resume(sample_sharded, shards, run, ledger_path, model=model, **kwargs)
    steps = kwargs["draws"] + kwargs["tune"]
    final = PrivacyLedger.open(ledger_path).spent_mu2
    assert final == pytest.approx(steps * chains * mu2, rel=1e-9)  # each step once
    lines = [json.loads(s) for s in (tmp_path / "run.ledger.runs").read_text().splitlines()]
    digests = [e["step"] for e in lines if "digest" in e]
    assert sorted(digests) == list(range(steps))  # each step released (journaled) once
    assert idata.posterior.sizes["draw"] == kwargs["draws"]
    assert idata.attrs["dp_releases"] == steps * chains


def test_a_hung_worker_hits_the_timeout(client):
    model = normal_model()
    with ShardPool(
        [loader_of(0), loader_of(1)],
        model,
        model.value_vars,
        model.initial_point(),
        cluster=client,
        timeout=3,
    ) as pool:
        victim = client.run(os.getpid)[pool.placement[0]]
        os.kill(victim, signal.SIGSTOP)
        try:
            start = time.monotonic()
            with pytest.raises(ShardError, match="Shard 'shard-0' did not compute step 0"):
                pool.release(np.zeros((1, 1)), np.ones((1, 1)), np.ones(1), np.ones(1), np.ones(1))
            assert time.monotonic() - start < 30
        finally:
            os.kill(victim, signal.SIGCONT)


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"shards": "table.npz"}, "`shards` must be a non-empty list of loaders"),
        ({"shards": {"y": np.zeros(3)}}, "must map pm.Data container names to dask arrays"),
        ({"shards": [{"y": np.zeros(3)}]}, r"`shards\[0\]` must be a callable"),
        ({"shards": []}, "`shards` must hold at least one loader"),
        ({"shards": ["table.csv"]}, r"`shards\[0\]` names a path that is not an .npz"),
        ({"shards": [3]}, r"`shards\[0\]` must be a callable"),
        ({"clip": "found"}, "`clip` must be a finite"),
        ({"clip": "auto", "clip_count_share": 0.0}, "needs a positive `clip_count_share`"),
        ({"warm_start": 1.5}, "warm_start"),
        ({"warm_start_clip": -1.0}, "warm_start_clip"),
        ({"warm_start_steps": 0}, "warm_start_steps"),
        ({"cores": 2}, r"\['cores'\] are pm.sample arguments"),
        ({"owners": ["x"]}, "not both"),
        ({"epsilon": -1.0}, "epsilon"),
        ({"chains": 0}, "chains"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_spent(tmp_path, extra, match):
    ledger_path = tmp_path / "run.ledger"
    PrivacyLedger(pp.PrivacyBudget(EPS, DELTA).mu, ledger_path)
    args = dict(
        shards=[loader_of(0)], epsilon=EPS, delta=DELTA, draws=10, tune=10, chains=2, clip=CLIP,
        clip_mode="distance", cluster="tcp://127.0.0.1:9", ledger_path=ledger_path,
    )  # fmt: skip
    args.update(extra)
    with pytest.raises(ValueError, match=match):
        pp.sample(model=normal_model(), **args)
    assert PrivacyLedger.open(ledger_path).spent_mu2 == 0.0


def test_an_unreachable_scheduler_and_a_refused_model_spend_nothing(tmp_path):
    ledger_path = tmp_path / "run.ledger"
    args = dict(epsilon=EPS, delta=DELTA, draws=10, tune=10, chains=2, clip=CLIP)
    with pytest.raises(ShardError, match="No Dask scheduler answered"):
        sample_sharded(
            [loader_of(0)], model=normal_model(), cluster="tcp://127.0.0.1:9",
            ledger_path=ledger_path, **args,
        )  # fmt: skip
    assert PrivacyLedger.open(ledger_path).spent_mu2 == 0.0
    # The gate runs on the driver's placeholders before any cluster or shard is touched: a
    # prior that reads the data is refused (not a scheduler error).
    with pm.Model() as coupled:
        y = pm.Data("y", np.zeros(1))
        mu = pm.Normal("mu", y.mean(), 10.0)
        pm.Normal("obs", mu, 1.0, observed=y)
    with pytest.raises(ModelNotPrivateError):
        sample_sharded(
            [loader_of(0)], model=coupled, cluster="tcp://127.0.0.1:9", ledger_path=ledger_path,
            **args,
        )  # fmt: skip
    assert PrivacyLedger.open(ledger_path).spent_mu2 == 0.0


def test_add_remove_needs_min_rows_before_any_scheduler_is_touched(tmp_path):
    """Under add/remove-one ``min_rows`` is required here too: without it the gate (on the
    driver's placeholders) refuses the run, naming ``min_rows``, before a cluster is reached
    or anything is spent. With it the gate passes, and the unreachable scheduler is what
    stops the run, as through pp.sample; a bound above the placeholders' rows
    (``GATE_ROWS``) is no reason to refuse, the driver never sees the table's rows."""
    ledger_path = tmp_path / "run.ledger"
    args = dict(
        epsilon=EPS, delta=DELTA, draws=10, tune=10, chains=2, clip=CLIP, neighbours="add_remove",
        cluster="tcp://127.0.0.1:9", ledger_path=ledger_path,
    )  # fmt: skip
    with pytest.raises(pp.InvalidArgumentError, match="`min_rows` is required"):
        sample_sharded([loader_of(0)], model=normal_model(), **args)
    with pytest.raises(pp.InvalidArgumentError, match="`min_rows`"):
        sample_sharded([loader_of(0)], model=normal_model(), min_rows=1, **args)
    for min_rows in (100, 1000):
        with pytest.raises(ShardError, match="No Dask scheduler answered"):
            sample_sharded([loader_of(0)], model=normal_model(), min_rows=min_rows, **args)
    with pytest.raises(ShardError, match="No Dask scheduler answered"):
        pp.sample(
            model=normal_model(), shards=[loader_of(0)], min_rows=100, clip_mode="distance",
            **args,
        )  # fmt: skip
    assert PrivacyLedger.open(ledger_path).spent_mu2 == 0.0


@pytest.mark.filterwarnings("ignore::pymc_penalty.ConvergenceWarning")  # short on purpose
def test_an_add_remove_run_records_its_min_rows(client):
    idata = sample_sharded(
        [loader_of(0), loader_of(1)], model=normal_model(), cluster=client, epsilon=EPS,
        delta=DELTA, draws=20, tune=10, chains=2, clip=CLIP, neighbours="add_remove",
        min_rows=100,
    )  # fmt: skip
    assert idata.attrs["dp_neighbours"] == "add_remove"
    assert idata.attrs["dp_min_rows"] == 100
    assert "mu" in idata.posterior


def test_a_failing_loader_is_named_and_spends_nothing(client, tmp_path):
    ledger_path = tmp_path / "run.ledger"

    def wrong_names():
        return {"not_a_container": np.zeros(3)}

    with pytest.raises(ShardError, match="Shard 'shard-1' failed to start.*not pm.Data"):
        sample_sharded(
            [loader_of(0), wrong_names], model=normal_model(), cluster=client,
            ledger_path=ledger_path, epsilon=EPS, delta=DELTA, draws=10, tune=10, chains=2,
            clip=CLIP,
        )  # fmt: skip
    assert PrivacyLedger.open(ledger_path).spent_mu2 == 0.0
