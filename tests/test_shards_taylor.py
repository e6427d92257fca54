"""The Taylor path's one-shot release on a sharded table (issue 31), on a real Dask
LocalCluster (2 worker processes, 1 thread each): on the same noise it is the in-process
one-shot of the concatenated table (one shard: to float precision; two shards: the same sums
up to rounding, so the same release within a hundredth of its noise, and a shifted table's is
told apart), no shard's reply has a value per row, and every release is committed to the
driver's ledger before a shard reads its rows for it.
"""

from __future__ import annotations

import math

import numpy as np
import pymc as pm
import pytest

pytest.importorskip("distributed")

import dask_table as table  # noqa: E402
from dask_table import (  # noqa: E402
    N_K,
    loader_of,
    prepared_run,
    rows_of,
    scale_model,
    table_loader,
)

from pymc_penalty.distributed import ShardError, ShardPool  # noqa: E402
from pymc_penalty.distributed._warm import sharded_taylor_oneshot  # noqa: E402
from pymc_penalty.model.likelihood import PenaltyLikelihood  # noqa: E402
from pymc_penalty.privacy.ledger import PrivacyLedger  # noqa: E402
from pymc_penalty.warmstart import WarmStart, prepare_warm_start, split_point  # noqa: E402
from pymc_penalty.warmstart.taylor import (  # noqa: E402
    FIRST_STAGE_SHARES,
    ONESHOT_SHARES,
    taylor_oneshot_on,
    two_stage_oneshot,
)
from pymc_penalty.warmstart.taylor_terms import Expansion, RowTaylorTerms  # noqa: E402

pytestmark = pytest.mark.slow

DRIVER_PID = table.DRIVER_PID
MU = 3.0  # the one-shot's mu

client = table.shard_client  # the module's LocalCluster (2 workers)


def _warm(model: pm.Model, n_rows: float) -> WarmStart:
    """A public expansion: ``(mu, log s) = (1, 0)``, about the posterior's sds."""
    point = np.array([1.0, 0.0])
    n = 2 * N_K
    return WarmStart(
        point=point, covariance=np.diag([1.0 / n, 0.5 / n]),
        initvals=split_point(point, model.initial_point()), mu=0.0, releases=0, clip=1.0,
        metric_clip=1.0, clipped_fraction=None, clip_history=(), n_rows=float(n_rows),
    )  # fmt: skip


def _rows_public(neighbours: str) -> float:
    """The warm start's row count: ``n``, or a released (noisy) one under add/remove-one."""
    return 2.0 * N_K if neighbours == "substitute" else 2.0 * N_K - 3.0


def _sharded(client, loaders, neighbours, seed, ledger=None):
    model = scale_model()
    r = prepared_run(model, neighbours)
    if ledger is not None:
        r = r._replace(ledger=ledger(r.ledger))
    with ShardPool(loaders, model, r.value_vars, r.point, cluster=client) as pool:
        tm = sharded_taylor_oneshot(
            pool, r, _warm(model, _rows_public(neighbours)), mu=MU,
            noise_rng=np.random.default_rng(seed),
        )  # fmt: skip
    return tm, r.ledger


def _in_process(y, neighbours, seed):
    model = scale_model(y)
    target = prepare_warm_start(
        model, neighbours=neighbours, min_rows=100 if neighbours == "add_remove" else None
    )
    data = RowTaylorTerms(target.likelihood, target.n)
    noise, ledger = np.random.default_rng(seed), PrivacyLedger(100.0)

    def stage(at, **kw):
        return taylor_oneshot_on(
            data, at, reads=target.likelihood.reads, prior=target.prior,
            relation=target.relation, ledger=ledger, noise_rng=noise, **kw,
        )  # fmt: skip

    return two_stage_oneshot(stage, _warm(model, _rows_public(neighbours)), MU**2)[0]


@pytest.mark.parametrize("neighbours", ["substitute", "add_remove"])
def test_the_sharded_oneshot_is_the_in_process_one_on_the_concatenated_table(client, neighbours):
    """Same noise seeds. One shard holding the whole table: the in-process release, clips,
    mode and metric to float precision. Two shards (the same per-row terms, summed in
    another order): within 1% of the release's noise sds and of the posterior's sds. A table
    shifted by 0.3 (about 7 posterior sds): its released mode more than 4 posterior sds
    away."""
    y = np.concatenate([rows_of(0)["y"], rows_of(1)["y"]])
    post_sd = 1.0 / math.sqrt(y.size)  # of mu, about
    for seed in (0, 1):
        local = _in_process(y, neighbours, seed)
        one, _ = _sharded(client, [table_loader((0, 1))], neighbours, seed)
        assert one.control is None  # the rows' coefficients stay on the shards
        for got in (one.release.G, one.release.H, one.point, one.covariance):
            assert np.all(np.isfinite(got))
        np.testing.assert_allclose(one.release.G, local.release.G, rtol=1e-8)
        np.testing.assert_allclose(one.release.H, local.release.H, rtol=1e-8)
        np.testing.assert_allclose(one.point, local.point, rtol=1e-8)
        np.testing.assert_allclose(one.covariance, local.covariance, rtol=1e-8)
        assert (one.clip_g, one.clip_H, one.residual_clip) == (
            local.clip_g, local.clip_H, local.residual_clip,
        )  # fmt: skip
        assert one.mu == pytest.approx(MU, rel=1e-12) and one.releases == local.releases

        two, _ = _sharded(client, [loader_of(0), loader_of(1)], neighbours, seed)
        assert (two.clip_g, two.clip_H, two.residual_clip) == (
            local.clip_g, local.clip_H, local.residual_clip,
        )  # fmt: skip
        assert np.all(np.abs(two.release.G - local.release.G) < 0.01 * local.release.sd_G)
        assert np.all(np.abs(two.release.H - local.release.H) < 0.01 * local.release.sd_H)
        assert np.all(np.abs(two.point - local.point) < 0.01 * post_sd)

        shifted, _ = _sharded(
            client, [table_loader((0,), 0.3), table_loader((1,), 0.3)], neighbours, seed
        )
        assert abs(shifted.point[0] - local.point[0]) / post_sd > 4.0


class _EventLedger:
    """A ledger that records its commits, in order, into a shared event list."""

    def __init__(self, ledger, events):
        self.ledger, self.events = ledger, events

    def try_spend(self, mu2):
        ok = self.ledger.try_spend(mu2)
        if ok:
            self.events.append(("spend", mu2))
        return ok

    def release_unused(self):
        self.ledger.release_unused()


def test_every_oneshot_release_is_charged_before_a_shard_reads_and_no_reply_holds_a_row(client):
    """The sequence of the driver's commits and the shards' reads is the one-shot's: each
    stage's histogram shares, then the norm counts, then ``G`` and ``H``, then their sums,
    then the residual histogram's share, then its counts (a read before its charge would
    break the sequence); the commits add up to ``MU^2``. Every reply a shard sent is a
    histogram of public length or the five packed sums, never ``N_K`` values."""
    events: list = []
    original = ShardPool._ask_all

    def spy(self, what, send):
        events.append(("read", what.split("one-shot's ")[-1]))
        return original(self, what, send)

    with table.replies_received(ShardPool) as replies, pytest.MonkeyPatch.context() as patch:
        patch.setattr(ShardPool, "_ask_all", spy)
        tm, _ = _sharded(
            client, [loader_of(0), loader_of(1)], "substitute", 0,
            ledger=lambda led: _EventLedger(led, events),
        )  # fmt: skip
    reads = [e for e in events if e[0] == "read" and "load" not in e[1]]
    kinds = [e[1] if e[0] == "read" else "spend" for e in events if e in reads or e[0] == "spend"]
    first = ["spend", "spend", "norm counts", "norm counts", "spend", "spend", "clipped sums"]
    combined = ["spend", "spend", "clipped sums", "spend", "residual counts"]
    far = first[:-1] + ["clipped sums", "spend", "residual counts"]
    assert kinds in (first + combined, first + far), kinds
    spent = sum(mu2 for kind, mu2 in events if kind == "spend")
    assert spent == pytest.approx(MU**2, rel=1e-9)
    assert tm.releases == len(FIRST_STAGE_SHARES) + (3 if kinds == first + combined else 5)
    assert len(ONESHOT_SHARES) == 5

    sizes = {np.size(a) for r in replies for a in table.arrays(r)}
    assert sizes and max(sizes) <= 82 and not sizes & {N_K, 2 * N_K}, sizes
    assert 5 in sizes  # the packed G and H came from the shards


def test_the_shards_residual_sums_are_the_in_process_compiled_ones(client):
    """After ``taylor_control`` at a public expansion and clips, every chain's clipped
    residual sum and clip count from two shards (summed) are the in-process compiled
    likelihood's with the same ``RowControl`` on the concatenated table (sums to float
    precision, counts exactly), at an infinite bound and at one that clips rows. The
    must-fail sides: the plain log-likelihood ratios' sums, and a shifted table's residuals,
    are far from them. A step released as residuals cannot be released again as ratios
    under the same id (the flag is part of the request's digest). Each reply is one float
    and one count per chain."""
    y = np.concatenate([rows_of(0)["y"], rows_of(1)["y"]])
    target = prepare_warm_start(scale_model(y))
    n = target.n
    warm = _warm(target.model, n)
    e = Expansion(warm.point, np.linalg.cholesky(warm.covariance), np.arange(2), 2)
    c_g, c_H = 0.1, 0.01
    control = RowTaylorTerms(target.likelihood, n).control(e, c_g, c_H)
    lik = PenaltyLikelihood(target.model, target.value_vars, target.point, control=control)
    rng = np.random.default_rng(3)
    sd = np.sqrt(np.diag(warm.covariance))
    x0s = warm.point + sd * rng.normal(size=(3, 2))
    x1s = x0s + 0.5 * sd * rng.normal(size=(3, 2))

    def local(bound):
        out = [
            lik.evaluate(x1, lik.initial(x0, n)[0], bound)[1:3]
            for x0, x1 in zip(x0s, x1s, strict=True)
        ]
        return np.array([s for s, _ in out]), np.array([k for _, k in out])

    def sharded(pool, bound, residual=True):
        replies = pool._ask_all(
            "test", lambda _, a: a.partial_sums("t", 0, x0s, x1s, np.full(3, bound), residual)
        )
        replies = [r for _, r in replies]
        for r in replies:
            assert r["sums"].shape == (3,) and r["counts"].shape == (3,)
        return sum(r["sums"] for r in replies), sum(r["counts"] for r in replies)

    free, _ = local(np.inf)
    bound = float(np.median(np.abs(free))) / 50.0  # clips some rows in every chain
    clipped, counts = local(bound)
    assert np.all(counts > 0) and np.all(counts < n)
    model = scale_model()
    with ShardPool(
        [loader_of(0), loader_of(1)], model, model.value_vars, model.initial_point(),
        cluster=client,
    ) as pool:  # fmt: skip
        pool.taylor_control(e, c_g, c_H)
        got, _ = sharded(pool, np.inf)
        np.testing.assert_allclose(got, free, rtol=1e-9, atol=1e-9)
        got, got_counts = sharded(pool, bound)
        np.testing.assert_allclose(got, clipped, rtol=1e-9, atol=1e-9)
        np.testing.assert_array_equal(got_counts, counts)
        ratios, _ = sharded(pool, np.inf, residual=False)
        assert np.all(np.abs(ratios - free) > 0.1)  # measured 0.3-4.1
        sums, _ = pool.release(x0s, x1s, bound, 1e-3, np.inf, step=0, residual=True)
        assert sums.shape == (1, 3)
        with pytest.raises(ShardError, match="already released for other points"):
            pool.release(x0s, x1s, bound, 1e-3, np.inf, step=0, residual=False)
    with ShardPool(
        [table_loader((0,), 0.3), table_loader((1,), 0.3)], model, model.value_vars,
        model.initial_point(), cluster=client,
    ) as pool:  # fmt: skip
        pool.taylor_control(e, c_g, c_H)
        shifted, _ = sharded(pool, np.inf)
    assert np.max(np.abs(shifted - free)) > 1.0
