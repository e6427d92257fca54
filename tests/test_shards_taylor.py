"""The Taylor path's one-shot release on a sharded table (issue 31), on a real Dask
LocalCluster (2 worker processes, 1 thread each): on the same noise it is the in-process
one-shot of the concatenated table (one shard: to float precision; two shards: the same sums
up to rounding, so the same release within a hundredth of its noise, and a shifted table's is
told apart), no shard's reply has a value per row, and every release is committed to the
driver's ledger before a shard reads its rows for it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

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

from pymc_penalty.accounting.sensitivity import ClipMode  # noqa: E402
from pymc_penalty.distributed import ShardError, ShardPool  # noqa: E402
from pymc_penalty.distributed._warm import sharded_taylor_oneshot  # noqa: E402
from pymc_penalty.model.likelihood import PenaltyLikelihood  # noqa: E402
from pymc_penalty.privacy.ledger import PrivacyLedger  # noqa: E402
from pymc_penalty.warmstart import WarmStart, prepare_warm_start, split_point  # noqa: E402
from pymc_penalty.warmstart.taylor import (  # noqa: E402
    FIRST_STAGE_SHARES,
    ONESHOT_SHARES,
    staged_oneshot,
    taylor_oneshot_on,
)
from pymc_penalty.warmstart.taylor_terms import Expansion, RowTaylorTerms  # noqa: E402

pytestmark = pytest.mark.slow

DRIVER_PID = table.DRIVER_PID
MU = 3.0  # the one-shot's mu
CLIP_NUMERIC = 6.0  # a numeric clip (the plain walk's run being refused)

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

    return staged_oneshot(stage, _warm(model, _rows_public(neighbours)), MU**2)[0]


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
    # three stages (TAYLOR_LATER_STAGES = 2): a middle one combined with the first or
    # expanded again (as the first), then the last one, combined or expanded again
    first = ["spend", "spend", "norm counts", "norm counts", "spend", "spend", "clipped sums"]
    middle = {2: ["spend", "spend", "clipped sums"], 4: first}
    last = {3: ["spend", "spend", "clipped sums", "spend", "residual counts"]}
    last[5] = first + ["spend", "residual counts"]
    counts = {
        (m, k): len(FIRST_STAGE_SHARES) + m + k
        for m in middle
        for k in last
        if kinds == first + middle[m] + last[k]
    }
    assert len(counts) == 1, kinds
    spent = sum(mu2 for kind, mu2 in events if kind == "spend")
    assert spent == pytest.approx(MU**2, rel=1e-9)
    assert tm.releases == next(iter(counts.values()))
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


# --- the Taylor path's chains on shards (sample_sharded(method="taylor")) ---------------------

#: The chains' run: small, with the Taylor path's own settings (clip="auto" in its metric).
TAYLOR_RUN = dict(draws=300, tune=150, chains=4, warm_start=0.2, warm_start_steps=6)


def _taylor_on_shards(shards, **kwargs):
    """``pp.sample(shards=..., method="taylor")`` of :func:`dask_table.normal_model`."""
    import pymc_penalty as pp

    return pp.sample(
        shards=shards, model=table.normal_model(), epsilon=table.EPS, delta=table.DELTA,
        method="taylor", **{**TAYLOR_RUN, **kwargs},
    )  # fmt: skip


@pytest.mark.parametrize("neighbours", ["substitute", "add_remove"])
def test_the_sharded_taylor_posterior_is_the_in_process_one(client, neighbours):
    """``pp.sample(shards=..., method="taylor")`` on two shards and in-process
    ``pp.sample(method="taylor")`` on the concatenated table: the same report keys
    (``dp_method``, every ``dp_taylor_*``, the forecast's) and bound, both publish the
    noise-aware posterior beside the raw chains' (``posterior_tilted``), and the posterior
    means agree within 4 combined MCSE (``dask_table.assert_same_posterior``: the sharded one
    within 4 MCSE of the exact mean too, and the check has power), their sds within 20%.
    The must-fail side: the same run on the table shifted by 0.3 (about 7 posterior sds)
    lands more than that tolerance away. Under both relations (add/remove-one with
    ``min_rows=100``: its clip histograms' noise sd is below one count at this epsilon, where
    an empty bin snapped to one once read as a row and sent the clip to the grid's top,
    ``scripts/taylor_add_remove_check.py``)."""
    import arviz as az

    import pymc_penalty as pp

    y = np.concatenate([rows_of(0)["y"], rows_of(1)["y"]])
    shards = [loader_of(0), loader_of(1)]
    # Chains long enough for the sd check to have power (at 300 draws its band was wider
    # than the sqrt(2) it must detect in 2 of 12 runs).
    relation = {"neighbours": neighbours, "draws": 1000}
    if neighbours == "add_remove":
        relation["min_rows"] = 100
    dist = _taylor_on_shards(shards, cluster=client, random_seed=5, **relation)
    local = pp.sample(
        model=table.normal_model(y), epsilon=table.EPS, delta=table.DELTA, method="taylor",
        random_seed=6, cores=1, progressbar=False, **{**TAYLOR_RUN, **relation},
    )  # fmt: skip
    for idata in (dist, local):
        assert idata.attrs["dp_method"] == "taylor"
        assert "posterior_tilted" in idata.groups() and idata.posterior.attrs["dp_noise_aware"]
    keys = {k for k in local.attrs if k.startswith(("dp_taylor", "dp_forecast"))}
    assert keys and keys <= set(dist.attrs)
    assert dist.attrs["dp_sensitivity"] == local.attrs["dp_sensitivity"]
    assert dist.attrs["dp_taylor_releases"] in (9, 11, 13)  # three stages, each way
    table.assert_same_posterior(dist, local, y)
    # and the same spread, within 4 combined Monte Carlo errors of the two sd estimates
    # (sd / sqrt(2 ESS), ESS for the sd from ArviZ; a fixed 20% failed in 2 of 14 runs of
    # these short chains): a chain that counted the rows twice (ratios released where
    # residuals belong, plus the model) is sqrt(2) too narrow, outside that band
    sds, sd_mcse = [], []
    for idata in (dist, local):
        sd = float(idata.posterior["mu"].std())
        ess = float(az.ess(idata.posterior, var_names=["mu"], method="sd")["mu"])
        sds.append(sd)
        sd_mcse.append(sd / math.sqrt(2.0 * ess))
    assert abs(sds[0] - sds[1]) < 4 * math.hypot(*sd_mcse), (sds, sd_mcse)
    assert 4 * math.hypot(*sd_mcse) < (1 - 2**-0.5) * sds[1], (sds, sd_mcse)  # has power
    # Gaussian rows' residuals after a second-order model are zero: the shards released
    # residuals (their noisy clip counts near 0), not the rows' ratios (nearly all clipped
    # at the residual's small bound)
    assert float(dist.sample_stats["dp_clipped_count"].mean()) < 0.01 * y.size

    shifted = _taylor_on_shards(
        [table_loader((0,), 0.3), table_loader((1,), 0.3)], cluster=client, random_seed=5,
        **relation,
    )  # fmt: skip
    means, mcses = [], []
    for idata in (shifted, local):
        means.append(float(idata.posterior["mu"].mean()))
        mcses.append(float(az.mcse(idata.posterior["mu"])["mu"]))
    assert abs(means[0] - means[1]) > 4 * math.hypot(*mcses)


def test_a_bad_method_is_refused_before_anything_is_spent(client, tmp_path):
    """An unknown ``method``, and ``method="taylor"`` without a warm start or outside the
    metric clip mode, are refused with a clear error before any ledger is opened or any
    shard read (the ledger file is not even created); ``pp.sample`` refuses the same."""
    import pymc_penalty as pp
    from pymc_penalty.distributed import sample_sharded
    from pymc_penalty.errors import InvalidArgumentError

    ledger_path = tmp_path / "run.ledger"
    shards = [loader_of(0), loader_of(1)]
    common = dict(model=table.normal_model(), epsilon=table.EPS, delta=table.DELTA,
                  cluster=client, ledger_path=ledger_path)  # fmt: skip
    with pytest.raises(InvalidArgumentError, match="method"):
        sample_sharded(shards, method="bogus", **common)
    with pytest.raises(InvalidArgumentError, match="warm_start"):
        sample_sharded(shards, method="taylor", clip="auto", clip_mode="metric", **common)
    with pytest.raises(InvalidArgumentError, match="clip_mode"):
        sample_sharded(shards, method="taylor", warm_start=0.2, **common)
    with pytest.raises(InvalidArgumentError, match="method"):
        pp.sample(shards=shards, method="bogus", **common)
    assert not ledger_path.exists()


def test_a_killed_worker_then_resume_charges_every_release_once(tmp_path):
    """The Taylor path on shards with a persistent ledger, a worker killed during the chains
    (draws, where the independent moves run), then a resume. The ledger holds exactly an
    independent count: the warm start's share of the budget, ``TAYLOR_SHARE`` of the rest
    for the one-shot, and ``chains * mu^2`` per step (each step once, its ``mu`` the rest's
    calibration), and so does every step's ``dp_mu``. The resume rebuilds the shards'
    residuals from the journaled model and asks no shard for a warm-start or one-shot sum;
    a resume with another ``method`` is refused first, without a charge. No reply the driver
    received, in either run, holds a value per row."""
    import pymc_penalty as pp
    from pymc_penalty.distributed import DistributedSamplingError, sample_sharded
    from pymc_penalty.warmstart.taylor import TAYLOR_SHARE

    model = table.normal_model()
    shards = [loader_of(0), loader_of(1)]
    ledger_path = tmp_path / "run.ledger"
    draws, tune, chains, share = 30, 20, 2, 0.2
    kwargs = dict(
        epsilon=table.EPS, delta=table.DELTA, draws=draws, tune=tune, chains=chains,
        clip="auto", clip_mode="metric", warm_start=share, warm_start_steps=4,
        method="taylor", model=model,
    )  # fmt: skip
    kill_at = tune + 12  # in the draws
    asked: list[str] = []
    original = ShardPool._ask_all

    def spy(self, what, send):
        asked.append(what)
        return original(self, what, send)

    with table.replies_received(ShardPool) as replies, pytest.MonkeyPatch.context() as patch:
        patch.setattr(ShardPool, "_ask_all", spy)
        with ShardPool(shards, model, model.value_vars, model.initial_point(), timeout=10) as pool:
            pids = pool.client.run(os.getpid)
            table.kill_before_step(pool, pids[pool.placement[1]], kill_at)
            with pytest.raises(DistributedSamplingError, match="Shard 'shard-1'") as err:
                sample_sharded(shards, pool=pool, ledger_path=ledger_path, **kwargs)
        assert any("one-shot" in w for w in asked) and any("warm start" in w for w in asked)
        run = err.value.run
        budget_mu2 = pp.PrivacyBudget(table.EPS, table.DELTA).mu ** 2
        before_chains = budget_mu2 * (share + (1 - share) * TAYLOR_SHARE)
        header = next(
            json.loads(s) for s in (tmp_path / "run.ledger.runs").read_text().splitlines()
            if "owner_mu" in s
        )  # fmt: skip
        mu2 = header["owner_mu"][0] ** 2
        chains_mu2 = budget_mu2 * (1 - share) * (1 - TAYLOR_SHARE)
        assert (tune + draws) * chains * mu2 == pytest.approx(chains_mu2, rel=1e-6)
        spent = PrivacyLedger.open(ledger_path).spent_mu2
        assert spent == pytest.approx(before_chains + (kill_at + 1) * chains * mu2, rel=1e-9)

        with pytest.raises(ValueError, match="`method` differs"):
            sample_sharded(
                shards, ledger_path=ledger_path, run=run,
                **{**kwargs, "method": "penalty", "clip": CLIP_NUMERIC},
            )  # fmt: skip
        assert PrivacyLedger.open(ledger_path).spent_mu2 == spent

        asked.clear()
        idata = table.resume(sample_sharded, shards, run, ledger_path, **kwargs)
    assert not [w for w in asked if "one-shot" in w or "warm start" in w], asked
    assert any("Taylor residuals" in w for w in asked)
    final = PrivacyLedger.open(ledger_path).spent_mu2
    assert final == pytest.approx(before_chains + (tune + draws) * chains * mu2, rel=1e-9)
    stats_mu2 = sum(float((g["dp_mu"] ** 2).sum()) for g in (idata.warmup_sample_stats,
                                                             idata.sample_stats))  # fmt: skip
    assert stats_mu2 == pytest.approx((tune + draws) * chains * mu2, rel=1e-9)
    assert idata.attrs["dp_method"] == "taylor" and idata.attrs["dp_run_id"] == run
    assert idata.attrs["dp_taylor_mu"] ** 2 == pytest.approx(before_chains - share * budget_mu2)
    sizes = {np.size(a) for r in replies for a in table.arrays(r)}
    assert sizes and not sizes & {N_K, 2 * N_K}, sizes
    assert max(sizes) <= 82, sizes


@pytest.mark.filterwarnings("ignore::pymc_penalty.ConvergenceWarning")  # short on purpose
def test_auto_chooses_the_taylor_path_on_shards_where_in_process_would(client):
    """``pp.sample(shards=...)``'s default ``method="auto"`` runs the Taylor path where
    in-process ``pp.sample`` does (a warm start, ``clip_mode="metric"``: its defaults), and
    the plain walk where it does not (``clip_mode="distance"``, or no warm start)."""
    import pymc_penalty as pp

    y = np.concatenate([rows_of(0)["y"], rows_of(1)["y"]])
    shards = [loader_of(0), loader_of(1)]
    run = dict(epsilon=table.EPS, delta=table.DELTA, draws=20, tune=20, chains=2)
    cases = [({}, "taylor"), ({"clip_mode": "distance", "clip": CLIP_NUMERIC}, "penalty"),
             ({"warm_start": 0}, "penalty")]  # fmt: skip
    for extra, method in cases:
        dist = pp.sample(shards=shards, cluster=client, model=table.normal_model(),
                         **run, **extra)  # fmt: skip
        local = pp.sample(model=table.normal_model(y), progressbar=False, cores=1, **run, **extra)
        assert dist.attrs["dp_method"] == local.attrs["dp_method"] == method


class _ResidualFreeShards:
    """A stand-in for a ``ShardPool`` whose rows' residuals after the Taylor model are all
    zero (Gaussian rows, exact second-order model): each release is its noise alone. It
    records whether every request asked for residuals."""

    def __init__(self, seed: int) -> None:
        self.noise = np.random.default_rng(seed)
        self.residual: list[bool] = []

    def release(self, x0s, x1s, bounds, sigmas, count_sds, mu2=None, step=None, residual=False):
        self.residual.append(residual)
        sigma = np.asarray(sigmas, dtype=np.float64).reshape(-1)
        return (sigma * self.noise.standard_normal(sigma.size))[None, :], np.zeros((1, sigma.size))


def test_the_drivers_taylor_kernel_targets_the_exact_posterior():
    """``run_chains`` with a released model that is the exact second-order model of a
    Gaussian likelihood (no one-shot noise) and residuals that are exactly zero: the chain's
    target is then the exact posterior, whatever the residual noise (the penalty test), the
    independent moves (their Hastings term) and the walk. Long chains, no cluster: the mean
    within 4 MCSE of the exact one and the sd within 5% (measured 1.016 at a bulk ESS of
    4200: its standard error about 1.1%). The must-fail sides are the kernel's parts: without
    the Hastings term the sd measured 0.75 of the exact one; without the released model's
    difference it wanders off (sd 4.7 times). Every step was released, and every release
    asked the shards for residuals."""
    import arviz as az

    from pymc_penalty.distributed._driver import run_chains
    from pymc_penalty.privacy.budget import RunPlan
    from pymc_penalty.privacy.taylor import TaylorRelease
    from pymc_penalty.sampling.taylor import TaylorModel

    y = np.concatenate([rows_of(0)["y"], rows_of(1)["y"]])
    n = y.size
    post_var = 1.0 / (n + 1 / 100)
    post_mean = post_var * y.sum()
    t = np.array([post_mean + 2.0 * math.sqrt(post_var)])  # expanded off the mode
    L = np.array([[math.sqrt(post_var)]])
    G = L.T @ np.array([np.sum(y - t[0])])  # the exact whitened sums at t
    H = L.T @ np.array([[-float(n)]]) @ L
    model = TaylorModel(
        t=t, L=L, release=TaylorRelease(G, H, 0.0, 0.0, 0.0), order=2, clip_g=1.0,
        clip_H=1.0, residual_clip=0.005, mu=1.0, releases=0, point=np.array([post_mean]),
        covariance=np.array([[post_var]]), control=None, index=np.array([0]),
    )  # fmt: skip
    r = prepared_run(table.normal_model(), "substitute")
    config = dataclasses.replace(
        r.config, ledger=PrivacyLedger(1e6), clip=model.residual_clip, clip_mode=ClipMode.METRIC,
        taylor=model,
    )  # fmt: skip
    chains, tune, draws = 4, 300, 3000
    pool = _ResidualFreeShards(0)
    header = {"run": "kernel", "owner_mu": [0.3], "seed": 7}  # residual noise sd about 2
    starts = post_mean + math.sqrt(post_var) * np.array([[-1.0], [0.0], [1.0], [0.5]])
    idata = run_chains(
        pool, config, r.journal, header, RunPlan(draws, tune, chains), 0.05, r.model,
        r.value_vars, r.x_init, model.covariance, scaling=2.38, adapt="full",
        target_accept=0.234, adapt_window=100, party_stats=False, starts=starts, taylor=model,
    )  # fmt: skip
    assert pool.residual and all(pool.residual)
    assert bool(idata.sample_stats["dp_released"].all())
    draws_mu = idata.posterior["mu"]
    mcse = float(az.mcse(draws_mu)["mu"])
    assert abs(float(draws_mu.mean()) - post_mean) < 4 * mcse
    assert abs(float(draws_mu.std()) / math.sqrt(post_var) - 1.0) < 0.05
    noise = float(idata.sample_stats["dp_noise_sd"].mean())
    assert 0.5 < noise < 5.0  # the residual noise was there, and the chain carried it


def _hierarchy(y: np.ndarray | None = None) -> pm.Model:
    """``m ~ N(0, 1)``, ``mu ~ N(m, 1)``, ``y ~ N(mu, 1)``: ``m`` is read by no row (a
    hyperparameter only the prior sees); without ``y``, a one-row placeholder."""
    with pm.Model() as model:
        data = pm.Data("y", np.zeros(1) if y is None else y)
        m = pm.Normal("m", 0.0, 1.0)
        mu = pm.Normal("mu", m, 1.0)
        pm.Normal("obs", mu, 1.0, observed=data)
    return model


@pytest.mark.filterwarnings("ignore::pymc_penalty.ConvergenceWarning")  # short on purpose
def test_the_sharded_chains_move_the_coordinates_no_row_reads_on_the_prior(client):
    """As the in-process step, the driver moves the hyperparameter no row reads (``m``) after
    each released step on the exact prior alone (free moves): on steps whose proposal was
    rejected ``m`` still moved (the must-fail side: without free moves it never does there)
    and ``mu`` did not; ``m``'s posterior is the exact one (mean within 4 MCSE, sd within
    25%)."""
    import arviz as az

    from pymc_penalty.distributed import sample_sharded

    y = np.concatenate([rows_of(0)["y"], rows_of(1)["y"]])
    n = y.size
    precision = np.array([[2.0, -1.0], [-1.0, 1.0 + n]])
    cov = np.linalg.inv(precision)
    mean = cov @ np.array([0.0, y.sum()])
    idata = sample_sharded(
        [loader_of(0), loader_of(1)], model=_hierarchy(), cluster=client, epsilon=table.EPS,
        delta=table.DELTA, method="taylor", clip="auto", clip_mode="metric", random_seed=3,
        **TAYLOR_RUN,
    )  # fmt: skip
    assert idata.attrs["dp_method"] == "taylor"
    raw = idata.posterior_tilted  # the chains' own draws (the posterior is noise-aware)
    m, mu = raw["m"].values, raw["mu"].values
    # the driver's draw t is the state its step t starts from (its stats are that step's)
    rejected = idata.sample_stats["accepted"].values[:, :-1] == 0.0
    m_moved = m[:, 1:] != m[:, :-1]
    assert rejected.sum() > 50
    assert np.mean(m_moved[rejected]) > 0.5
    assert np.all(mu[:, 1:][rejected] == mu[:, :-1][rejected])
    draws = idata.posterior["m"]
    assert abs(float(draws.mean()) - mean[0]) < 4 * float(az.mcse(draws)["m"])
    assert abs(float(draws.std()) / math.sqrt(cov[0, 0]) - 1.0) < 0.25
