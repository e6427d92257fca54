"""The penalty chain driven through owners on a real Dask LocalCluster (worker processes):
its posterior matches the in-process sampler's within Monte Carlo error, the driver never
receives an array of an owner's row count, and a killed owner stops the run with its name,
ledgers consistent, and a resume that charges no completed step twice."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

pytest.importorskip("distributed")

import dask_table as table  # noqa: E402
from dask_table import CLIP, DELTA, EPS, N_K, loader_of, normal_model, rows_of  # noqa: E402

import pymc_penalty as pp  # noqa: E402
from pymc_penalty.accounting.sensitivity import Neighbours  # noqa: E402
from pymc_penalty.distributed import (  # noqa: E402
    DistributedSamplingError,
    Owner,
    OwnerPool,
    owner_noise,
)
from pymc_penalty.distributed import sample as dsample  # noqa: E402
from pymc_penalty.privacy.ledger import PrivacyLedger  # noqa: E402

pytestmark = pytest.mark.slow


def _owners(tmp_path, n: int = 2, epsilon: float = EPS) -> list[Owner]:
    # site1 (the one killed below) syncs every charge: a killed owner's unused reservation
    # would stay counted, and the test checks exact totals.
    return [
        Owner(
            f"site{k}",
            loader_of(k),
            tmp_path / f"site{k}.ledger",
            epsilon=epsilon,
            delta=DELTA,
            reserve_fraction=0.05 if k == 0 else 0.0,
        )
        for k in range(n)
    ]


def test_owner_noise_matches_an_independent_computation():
    bounds = np.array([0.1, 0.3])
    sigmas, count_sds, mu_out = owner_noise(
        bounds, Neighbours.SUBSTITUTE, np.array([0.5, 1.0]), 0.1
    )
    mu_ll = np.array([0.5, 1.0]) * math.sqrt(0.9)
    assert np.allclose(sigmas, 2 * bounds[None, :] / mu_ll[:, None])
    assert np.allclose(count_sds, 1 / (np.array([0.5, 1.0]) * math.sqrt(0.1)))
    # An outsider sees the sum: Delta / sqrt(sum sigma^2), composed with the summed counts.
    expect = math.sqrt((2 * 0.1) ** 2 / np.sum(sigmas[:, 0] ** 2) + 1 / np.sum(count_sds**2))
    assert mu_out[0] == pytest.approx(expect, rel=1e-12)
    assert np.all(mu_out <= 1.0 + 1e-12)  # never more than the worst owner's mu


def test_the_distributed_posterior_matches_in_process_and_no_row_array_reaches_the_driver(
    tmp_path,
):
    kwargs = dict(
        epsilon=EPS, delta=DELTA, draws=600, tune=300, chains=4, clip=CLIP, clip_mode="distance"
    )
    with table.replies_received(OwnerPool) as replies:
        # Through pp.sample's hook: the same call as in-process, with the owners.
        dist = pp.sample(owners=_owners(tmp_path), model=normal_model(), random_seed=11, **kwargs)

    sizes = {a.size for r in replies for a in table.arrays(r)}
    assert sizes and N_K not in sizes and 2 * N_K not in sizes

    y = np.concatenate([rows_of(0)["y"], rows_of(1)["y"]])
    with normal_model(y):
        local = pp.sample(random_seed=12, progressbar=False, **kwargs)
    table.assert_same_posterior(dist, local, y)
    # The report: the run's budget, each owner's guarantee at its own delta.
    attrs = dist.attrs
    assert attrs["dp_epsilon"] <= EPS and attrs["dp_owner_names"] == "site0, site1"
    assert len(attrs["dp_owner_epsilon"]) == 2 and attrs["dp_owner_delta"] == [DELTA, DELTA]
    assert attrs["dp_epsilon_vs_outsider"] < min(attrs["dp_epsilon_vs_owners"])
    assert "observed_data" not in dist.groups()


@pytest.mark.filterwarnings("ignore::pymc_penalty.ConvergenceWarning")  # 5 draws on purpose
def test_the_first_draw_uses_the_scaling_the_last_tuning_draw_recorded(tmp_path):
    # PyMC's tuning convention, as PenaltyMetropolis keeps it (tests/test_pymc_conventions.py):
    # a tuning update is applied at the start of the next step that still tunes, so every
    # draw after tuning uses exactly the proposal the last tuning draw recorded.
    idata = dsample(
        _owners(tmp_path),
        model=normal_model(),
        epsilon=EPS,
        delta=DELTA,
        draws=5,
        tune=40,
        chains=2,
        clip=CLIP,
        scaling=0.1,
        random_seed=5,
    )
    warm = idata.warmup_sample_stats["scaling"].values
    post = idata.sample_stats["scaling"].values
    assert warm.shape == (2, 40) and post.shape == (2, 5)
    for c in range(2):
        assert warm[c, 0] == 0.1
        assert warm[c, -1] != warm[c, 0]  # it tuned
        np.testing.assert_array_equal(post[c], warm[c, -1])


def test_a_killed_owner_stops_the_run_and_a_resume_charges_nothing_twice(tmp_path):
    model = normal_model()
    owners = _owners(tmp_path)
    ledger_path = tmp_path / "run.ledger"
    kwargs = dict(epsilon=EPS, delta=DELTA, draws=40, tune=20, chains=3, clip=CLIP)
    kill_at = 25
    with OwnerPool(owners, model, model.value_vars, model.initial_point(), timeout=10) as pool:
        pids = pool.client.run(os.getpid)
        victim = pids[list(pool.client.scheduler_info()["workers"])[1]]
        table.kill_before_step(pool, victim, kill_at)
        with pytest.raises(DistributedSamplingError, match="Owner 'site1'") as err:
            dsample(owners, model=model, pool=pool, ledger_path=ledger_path, **kwargs)
    assert err.value.step == kill_at and "site0: mu^2" in str(err.value)
    run = err.value.run
    header = next(
        json.loads(line)
        for line in (tmp_path / "run.ledger.runs").read_text().splitlines()
        if "owner_mu" in line
    )
    mu2 = np.asarray(header["owner_mu"]) ** 2
    chains = kwargs["chains"]
    # Ledgers consistent: each owner committed what it released (site0 also step kill_at),
    # the driver the worst case of every step it sent, the lost one included.
    spent = [PrivacyLedger.open(tmp_path / f"site{k}.ledger").spent_mu2 for k in range(2)]
    assert spent[0] == pytest.approx((kill_at + 1) * chains * mu2[0], rel=1e-9)
    assert spent[1] >= kill_at * chains * mu2[1] * (1 - 1e-9)
    driver = PrivacyLedger.open(ledger_path).spent_mu2
    assert driver == pytest.approx((kill_at + 1) * chains * mu2.max(), rel=1e-9)
    assert driver >= max(spent) * (1 - 1e-9)
    assert err.value.privacy_report["dp_epsilon"] < EPS

    idata = table.resume(dsample, owners, run, ledger_path, model=model, **kwargs)
    steps = kwargs["draws"] + kwargs["tune"]
    for k in range(2):  # every step charged exactly once, over both attempts
        final = PrivacyLedger.open(tmp_path / f"site{k}.ledger").spent_mu2
        assert final == pytest.approx(steps * chains * mu2[k], rel=1e-9)
    driver = PrivacyLedger.open(ledger_path).spent_mu2
    assert driver == pytest.approx(steps * chains * mu2.max(), rel=1e-9)
    assert idata.posterior.sizes["draw"] == kwargs["draws"]
    assert idata.attrs["dp_releases"] == steps * chains


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"warm_start": 0.2}, "`warm_start` is not available with `owners`"),
        ({"min_rows": 10}, "`min_rows` is not supported with `owners`"),
        ({"keep_data": True}, "`keep_data` is not available"),
        ({"cores": 2}, r"\['cores'\] are pm.sample arguments"),
        ({"step_kwargs": {"proposal": "guided"}}, r"`step_kwargs` \['proposal'\]"),
        ({}, r"`clip` must be a number with `owners`"),
    ],
)
def test_pp_sample_refuses_what_has_no_meaning_with_owners_before_anything_starts(
    tmp_path, extra, match
):
    with pytest.raises(ValueError, match=match):
        pp.sample(owners=_owners(tmp_path), model=normal_model(), epsilon=1.0, delta=1e-5, **extra)
    assert not any(tmp_path.iterdir())  # no ledger, no owner started


def test_a_run_whose_relation_costs_owners_more_than_declared_is_refused_before_starting(
    tmp_path,
):
    with pytest.raises(ValueError, match="protects 'substitute' neighbours"):
        dsample(
            _owners(tmp_path),
            model=normal_model(),
            epsilon=1.0,
            delta=1e-5,
            neighbours="add_remove",
        )
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"clip": 0.0}, "`clip`"),
        ({"scaling": -1.0}, "`scaling`"),
        ({"target_accept": 1.5}, "`target_accept`"),
        ({"tune_interval": 0}, "`tune_interval`"),
        ({"adapt": "nope"}, "`adapt`"),
        ({"clip_count_share": 1.0}, "`clip_count_share`"),
        ({"S": np.ones(3)}, "`S`"),
        ({"run": "r1"}, "`run`"),
    ],
)
def test_bad_arguments_are_named_before_anything_starts(tmp_path, bad, match):
    with pytest.raises(ValueError, match=match):
        dsample(_owners(tmp_path), model=normal_model(), epsilon=1.0, delta=1e-5, **bad)
    assert not any(tmp_path.iterdir())
