"""The private warm start on a sharded table (issue 31), on a real Dask LocalCluster (2 worker
processes, 1 thread each): on the same noise it is the in-process warm start of the
concatenated table (one shard: to float precision; two shards, pairs within each: within
its noise, and a shifted table's is told apart), no shard's reply has a value per row, the
driver's ledger holds exactly the warm start's ``mu^2`` plus the steps' (and a resume after a
killed worker releases the warm start no second time), and bad arguments are refused before
anything is spent.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time

import numpy as np
import pytest

pytest.importorskip("distributed")

import dask_table as table  # noqa: E402
from dask_table import (  # noqa: E402
    CLIP,
    DELTA,
    EPS,
    N_K,
    loader_of,
    prepared_run,
    rows_of,
    scale_model,
    table_loader,
)

import pymc_penalty as pp  # noqa: E402
from pymc_penalty.distributed import (  # noqa: E402
    DistributedSamplingError,
    ShardError,
    ShardPool,
    sample_sharded,
)
from pymc_penalty.distributed._warm import sharded_warm_start  # noqa: E402
from pymc_penalty.privacy.ledger import PrivacyLedger  # noqa: E402
from pymc_penalty.warmstart import private_warm_start, warm_start_schedule  # noqa: E402

pytestmark = pytest.mark.slow

DRIVER_PID = table.DRIVER_PID


client = table.shard_client  # the module's LocalCluster (2 workers)


def _sharded(client, loaders, neighbours, *, mu, seed):
    model = scale_model()
    r = prepared_run(model, neighbours)
    with ShardPool(loaders, model, r.value_vars, r.point, cluster=client) as pool:
        return sharded_warm_start(
            pool, r, mu=mu, clip="auto", steps=12, noise_rng=np.random.default_rng(seed)
        )


@pytest.mark.parametrize("neighbours", ["substitute", "add_remove"])
def test_the_sharded_warm_start_is_the_in_process_one_on_the_concatenated_table(client, neighbours):
    """Same noise seeds, ``mu`` 4 for the warm start. One shard holding the whole table: the
    in-process result to float precision. Two shards (pairs within each): modes within 1
    posterior sd of the in-process one (the whole table's own mode moves 0.1-1.7 posterior
    sd between noise seeds in the NumPy twin of this test, ``test_warmstart_statistics``); a
    table shifted by 0.3 row sds (about 7 posterior sds) lands farther than 4."""
    y = np.concatenate([rows_of(0)["y"], rows_of(1)["y"]])
    n = y.size
    post_sd = np.array([1.0, 1.0 / math.sqrt(2.0)]) / math.sqrt(n)  # mu and log s, about
    min_rows = 100 if neighbours == "add_remove" else None
    mu = 4.0
    for seed in (0, 1):
        with scale_model(y):
            local = private_warm_start(
                mu=mu, ledger=PrivacyLedger(10.0), clip="auto", neighbours=neighbours,
                noise_rng=np.random.default_rng(seed), min_rows=min_rows,
            )  # fmt: skip
        one = _sharded(client, [table_loader((0, 1))], neighbours, mu=mu, seed=seed)
        np.testing.assert_allclose(one.point, local.point, rtol=1e-8)
        np.testing.assert_allclose(one.covariance, local.covariance, rtol=1e-8)
        assert one.n_rows == local.n_rows and one.releases == local.releases
        assert one.mu == pytest.approx(mu, rel=1e-12)

        two = _sharded(client, [loader_of(0), loader_of(1)], neighbours, mu=mu, seed=seed)
        assert np.all(np.abs(two.point - local.point) / post_sd < 1.0), two.point - local.point
        inv = np.linalg.inv(np.linalg.cholesky(local.covariance))
        ratio = np.linalg.eigvalsh(inv @ two.covariance @ inv.T)  # 1 where they agree
        assert np.all((ratio > 0.6) & (ratio < 1.6)), ratio
        shifted = _sharded(
            client, [table_loader((0,), 0.3), table_loader((1,), 0.3)], neighbours, mu=mu,
            seed=seed,
        )  # fmt: skip
        assert abs(shifted.point[0] - local.point[0]) / post_sd[0] > 4.0


def test_the_warm_start_is_charged_once_and_no_reply_holds_a_row(client, tmp_path):
    """Through ``pp.sample(shards=...)``: every reply a shard sent (the warm start's sums and
    the steps') has at most ``d x d`` values, never ``N_K``; the driver's ledger holds exactly
    the warm start's ``mu^2`` (its share of the budget) plus every step's
    ``chains * mu_step^2``; the chains start at the warm start's draws and move in its
    metric."""
    ledger_path = tmp_path / "run.ledger"
    chains, draws, tune, share = 3, 40, 20, 0.2
    with table.replies_received(ShardPool) as replies:
        idata = pp.sample(
            shards=[loader_of(0), loader_of(1)], cluster=client, model=scale_model(),
            epsilon=EPS, delta=DELTA, draws=draws, tune=tune, chains=chains, clip=CLIP,
            clip_mode="distance", warm_start=share, ledger_path=ledger_path, random_seed=3,
        )  # fmt: skip
    d = 2
    sizes = {np.size(a) for r in replies for a in table.arrays(r)}
    sizes |= {np.size(r) for r in replies if isinstance(r, np.ndarray | float | int)}
    assert max(sizes) <= d * d and N_K not in sizes, sizes
    warm_sums = [r for r in replies if isinstance(r, np.ndarray) and r.shape == (d, d)]
    assert warm_sums  # the warm start's curvature sums came from the shards

    budget_mu2 = pp.PrivacyBudget(EPS, DELTA).mu ** 2
    lines = [json.loads(s) for s in (tmp_path / "run.ledger.runs").read_text().splitlines()]
    header = next(e for e in lines if "owner_mu" in e)
    warm = header["warm_start"]
    assert warm["mu"] ** 2 == pytest.approx(share * budget_mu2, rel=1e-9)
    step_mu2 = header["owner_mu"][0] ** 2
    assert idata.sample_stats["dp_mu"].values ** 2 == pytest.approx(step_mu2, rel=1e-9)
    spent = PrivacyLedger.open(ledger_path).spent_mu2
    expected = share * budget_mu2 + (draws + tune) * chains * step_mu2
    assert spent == pytest.approx(expected, rel=1e-9)
    assert spent <= budget_mu2
    assert idata.attrs["dp_warm_start_share"] == share
    assert idata.attrs["dp_warm_start_mu"] == pytest.approx(math.sqrt(share * budget_mu2))
    assert idata.attrs["dp_warm_start_releases"] == warm["releases"] > 0
    # Each chain's first point is its journaled start; the starts centre on the warm point.
    first = np.stack(
        [
            idata.warmup_posterior["mu"].values[:, 0],
            np.log(idata.warmup_posterior["s"].values[:, 0]),
        ],
        axis=1,
    )
    np.testing.assert_allclose(first, np.asarray(warm["starts"]), rtol=1e-9)
    y = np.concatenate([rows_of(0)["y"], rows_of(1)["y"]])
    assert abs(np.mean(warm["starts"], axis=0)[0] - y.mean()) < 0.5  # near the mode


def test_a_resume_reuses_the_journaled_warm_start(tmp_path):
    """A worker killed during the chains' tuning; the resume neither re-runs the warm start
    (no shard is asked for a warm-start sum) nor charges it again: the ledger holds the warm
    start once and every step once. The found clip (``clip="auto"``) starts from the
    journal and, on the replayed steps' identical releases, moves identically (a replayed
    step with other points would be refused). A resume with another ``warm_start`` is
    refused first, without a charge."""
    model = scale_model()
    shards = [loader_of(0), loader_of(1)]
    ledger_path = tmp_path / "run.ledger"
    kwargs = dict(
        epsilon=EPS, delta=DELTA, draws=20, tune=10, chains=2, clip="auto", warm_start=0.3,
        warm_start_steps=4,
    )  # fmt: skip
    kill_at = 8  # in tuning: the replay must find the same clips (else its digests differ)
    with ShardPool(shards, model, model.value_vars, model.initial_point(), timeout=10) as pool:
        pids = pool.client.run(os.getpid)
        table.kill_before_step(pool, pids[pool.placement[1]], kill_at)
        with pytest.raises(DistributedSamplingError, match="Shard 'shard-1'") as err:
            sample_sharded(shards, model=model, pool=pool, ledger_path=ledger_path, **kwargs)
    run = err.value.run
    lines = [json.loads(s) for s in (tmp_path / "run.ledger.runs").read_text().splitlines()]
    header = next(e for e in lines if "owner_mu" in e)
    warm_mu2, mu2 = header["warm_start"]["mu"] ** 2, header["owner_mu"][0] ** 2
    budget_mu2 = pp.PrivacyBudget(EPS, DELTA).mu ** 2
    assert warm_mu2 == pytest.approx(0.3 * budget_mu2, rel=1e-9)
    spent = PrivacyLedger.open(ledger_path).spent_mu2
    assert spent == pytest.approx(warm_mu2 + (kill_at + 1) * 2 * mu2, rel=1e-9)

    with pytest.raises(ValueError, match="`warm_start` differs"):
        sample_sharded(
            shards, model=model, ledger_path=ledger_path, run=run, **{**kwargs, "warm_start": 0.2}
        )
    assert PrivacyLedger.open(ledger_path).spent_mu2 == spent
    with pytest.raises(ValueError, match="`clip` .* differs"):
        sample_sharded(
            shards, model=model, ledger_path=ledger_path, run=run, **{**kwargs, "clip": CLIP}
        )
    assert PrivacyLedger.open(ledger_path).spent_mu2 == spent

    with table.replies_received(ShardPool) as replies:
        idata = table.resume(sample_sharded, shards, run, ledger_path, model=model, **kwargs)
    assert not [r for r in replies if isinstance(r, np.ndarray) and r.shape == (2, 2)]
    final = PrivacyLedger.open(ledger_path).spent_mu2
    assert final == pytest.approx(warm_mu2 + 30 * 2 * mu2, rel=1e-9)  # each once
    assert idata.attrs["dp_warm_start_mu"] ** 2 == pytest.approx(warm_mu2)
    assert header["found_clip"]["probe"] is False  # after a warm start: it holds
    clip = idata.warmup_sample_stats["dp_clip"].values
    assert np.all(clip[:, 0] == header["found_clip"]["start"])


def heavy_loader(seed: int):
    """A loader of 2000 rows ``1 + t_2`` (tails heavier than the normal model's: a found clip
    must grow), refusing to run in the driver."""

    def load():
        if os.getpid() == DRIVER_PID:
            raise AssertionError("rows loaded in the driver")
        return {"y": heavy_rows(seed)}

    return load


def heavy_rows(seed: int) -> np.ndarray:
    return 1.0 + np.random.default_rng(seed).standard_t(2.0, size=2000)


def test_the_chains_found_clip_on_shards_is_pymc_penalty_samples(client):
    """``clip="auto"`` through ``pp.sample(shards=...)`` without a warm start: each chain's
    clip starts where in-process ``pp.sample`` starts it on the concatenated table (from the
    public n: the same number) and, on rows with heavy tails, grows during tuning as the
    in-process one does (measured 0.052 to 5.8-7.7 sharded, to 7.9-9.1 in-process, epsilon
    20): the two ends within a factor 3, both over 20 times the start (the must-fail side: a
    clip that did not move); it holds during the draws, and the report says it was found."""
    kw = dict(epsilon=20.0, delta=DELTA, draws=100, tune=300, chains=2, warm_start=0)
    model = table.normal_model()
    dist = pp.sample(shards=[heavy_loader(0), heavy_loader(1)], model=model, cluster=client,
                     random_seed=1, **kw)  # fmt: skip
    with table.normal_model(np.concatenate([heavy_rows(0), heavy_rows(1)])):
        local = pp.sample(random_seed=2, method="penalty", discard_tuned_samples=False,
                          progressbar=False, **kw)  # fmt: skip
    starts, ends = [], []
    for idata in (dist, local):
        clip = idata.warmup_sample_stats["dp_clip"].values
        starts.append(clip[:, 0])
        ends.append(np.median(idata.sample_stats["dp_clip"].values, axis=1))
        drawn = idata.sample_stats["dp_clip"].values
        assert np.all(drawn == drawn[:, :1])  # held during the draws
    np.testing.assert_allclose(starts[0], starts[1], rtol=1e-12)
    assert np.all(ends[0] > 20 * starts[0]) and np.all(ends[1] > 20 * starts[1])
    assert 1 / 3 < np.median(ends[0]) / np.median(ends[1]) < 3, ends
    assert "found in tuning" in dist.attrs["dp_sensitivity"]


@pytest.mark.parametrize("neighbours", ["substitute", "add_remove"])
def test_the_found_clip_starts_from_public_counts_only(client, tmp_path, neighbours):
    """After a warm start, the chains' found clip starts at ``clip_tail`` times the Gaussian
    start of the row count that is public: ``n`` (the shards' sizes) under substitute-one,
    the warm start's released count under add/remove-one, where the journal keeps no exact
    count (``n_public`` None) and the clip aims at one row per release."""
    from pymc_penalty.sampling.adaptation import clip_target_fraction, starting_clip

    ledger_path = tmp_path / "run.ledger"
    pp.sample(
        shards=[loader_of(0), loader_of(1)], cluster=client, model=table.normal_model(),
        epsilon=4.0, delta=DELTA, draws=20, tune=20, chains=2, neighbours=neighbours,
        min_rows=100 if neighbours == "add_remove" else None, ledger_path=ledger_path,
        random_seed=5, progressbar=False, method="penalty",  # the plain walk's found clip
    )  # fmt: skip
    lines = [json.loads(s) for s in (tmp_path / "run.ledger.runs").read_text().splitlines()]
    header = next(e for e in lines if "owner_mu" in e)
    warm, found = header["warm_start"], header["found_clip"]
    if neighbours == "substitute":
        rows = found["n_public"]
        assert rows == 2 * N_K and "n_rows" not in warm
    else:
        rows = warm["n_rows"]  # released: an integer, noisy
        assert found["n_public"] is None and rows == round(rows)
    expected = warm["clip_tail"] * starting_clip(rows, clip_target_fraction(rows))
    assert found["start"] == pytest.approx(expected, rel=1e-12)
    assert found["probe"] is False and found["S"] is None  # the warm start's metric


class _CountingLedger:
    """A ledger that records what it committed, in order (the real one's reservations would
    hide the order)."""

    def __init__(self, ledger):
        self.ledger, self.committed = ledger, 0.0

    def try_spend(self, mu2):
        ok = self.ledger.try_spend(mu2)
        self.committed += mu2 if ok else 0.0
        return ok

    def release_unused(self):
        self.ledger.release_unused()


def test_every_warm_start_release_is_charged_before_a_shard_reads_its_rows(client):
    """At every call that makes a shard read its rows for the warm start (its sums at a
    point), the driver's ledger has committed every release of the Fisher-scoring steps up to
    and including that call's step (counted by the gradient sums asked before it); asking a
    shard its row count is public under substitute-one."""
    model = table.normal_model()
    r = prepared_run(model, "substitute")
    ledger = _CountingLedger(r.ledger)
    r = r._replace(ledger=ledger)
    steps, mu = 6, 1.0
    schedule = warm_start_schedule(mu, steps)
    # Step k's releases: gradient and curvature, split into parts (step 0) or with the count.
    due = np.cumsum([g**2 + c**2 for g, c in schedule])
    seen: list[tuple[str, float]] = []
    original = ShardPool._ask_all

    def spy(self, what, send):
        seen.append((what, ledger.committed))
        return original(self, what, send)

    with ShardPool(
        [loader_of(0), loader_of(1)], model, r.value_vars, r.point, cluster=client
    ) as pool:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(ShardPool, "_ask_all", spy)
            warm = sharded_warm_start(pool, r, mu=mu, clip="auto", steps=steps)
    assert warm.mu == pytest.approx(mu, rel=1e-12)
    assert len([w for w, _ in seen if "gradient" in w]) == steps
    k = 0  # the step of a read: the shards forget each step's gradients after its releases
    for what, committed in seen:
        if "forget" in what:
            k += 1
        elif "rows" not in what:
            assert committed >= due[k] * (1 - 1e-9), (what, k, committed, due[k])
    assert k == steps
    assert ledger.committed == pytest.approx(mu**2, rel=1e-9)


def test_a_shard_lost_during_the_warm_start_stops_the_run_unresumable(tmp_path):
    """A worker killed while the warm start runs: ``ShardError`` names the shard and says the
    run cannot be resumed; the ledger keeps what was committed, and no run was journaled."""
    model = scale_model()
    shards = [loader_of(0), loader_of(1)]
    ledger_path = tmp_path / "run.ledger"
    kwargs = dict(epsilon=EPS, delta=DELTA, draws=10, tune=10, chains=2, clip=CLIP)
    with ShardPool(shards, model, model.value_vars, model.initial_point(), timeout=10) as pool:
        pids = pool.client.run(os.getpid)
        victim = pids[pool.placement[1]]
        warm_statistics = pool.warm_statistics

        def killing(neighbours, d):
            data = warm_statistics(neighbours, d)
            ask = data._ask

            def ask_then_kill(name, args):
                if name == "gradient":
                    os.kill(victim, signal.SIGKILL)
                    time.sleep(0.3)
                return ask(name, args)

            data._ask = ask_then_kill
            return data

        pool.warm_statistics = killing
        with pytest.raises(ShardError, match="shard-1.*cannot be resumed"):
            sample_sharded(
                shards, model=model, pool=pool, ledger_path=ledger_path, warm_start=0.2, **kwargs
            )
    spent = PrivacyLedger.open(ledger_path).spent_mu2
    assert 0.0 < spent < 0.2 * pp.PrivacyBudget(EPS, DELTA).mu ** 2
    runs = tmp_path / "run.ledger.runs"
    assert not runs.exists() or not runs.read_text().strip()


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"warm_start": 1.0}, "warm_start"),
        ({"warm_start": -0.1}, "warm_start"),
        ({"warm_start": "auto"}, "warm_start"),
        ({"warm_start_clip": 0.0}, "warm_start_clip"),
        ({"warm_start_steps": 0}, "warm_start_steps"),
        ({"warm_start_steps": 2.5}, "warm_start_steps"),
        ({"clip": "found"}, "`clip` must be"),
        ({"clip": "auto", "clip_count_share": 0.0}, "positive `clip_count_share`"),
    ],
)
def test_bad_warm_start_and_clip_arguments_are_refused_before_spending(tmp_path, extra, match):
    ledger_path = tmp_path / "run.ledger"
    PrivacyLedger(pp.PrivacyBudget(EPS, DELTA).mu, ledger_path)
    args = dict(
        epsilon=EPS, delta=DELTA, draws=10, tune=10, chains=2, clip=CLIP, warm_start=0.2,
        cluster="tcp://127.0.0.1:9", ledger_path=ledger_path,
    )  # fmt: skip
    args.update(extra)
    with pytest.raises(ValueError, match=match):
        sample_sharded([loader_of(0)], model=scale_model(), **args)
    assert PrivacyLedger.open(ledger_path).spent_mu2 == 0.0
