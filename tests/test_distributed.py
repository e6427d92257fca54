"""Owners on a real Dask LocalCluster (worker processes): rows stay on the owners' workers,
releases match the in-process computation, step ids are never released twice, and lost,
hung or misconfigured owners stop the run with an error that names them."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pymc as pm
import pytest

pytest.importorskip("distributed")

from pymc_penalty.distributed import Owner, OwnerPool  # noqa: E402
from pymc_penalty.errors import OwnerError
from pymc_penalty.model.likelihood import PenaltyLikelihood  # noqa: E402
from pymc_penalty.privacy.ledger import PrivacyLedger  # noqa: E402

pytestmark = pytest.mark.slow

N_K = 300
CHAINS = 4
DRIVER_PID = os.getpid()


def _rows(seed: int, n: int = N_K) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2))
    y = (rng.random(n) < 1 / (1 + np.exp(-x @ np.array([0.5, -1.0])))).astype(float)
    return {"X": x, "y": y}


def _loader(seed: int, driver_pid: int, n: int = N_K):
    """A loader that refuses to run in the driver's process (pickled by value)."""

    def load():
        if os.getpid() == driver_pid:
            raise AssertionError("rows loaded in the driver")
        return _rows(seed, n)

    return load


def _model() -> pm.Model:
    with pm.Model() as model:
        X = pm.Data("X", np.zeros((1, 2)))
        y = pm.Data("y", np.zeros(1))
        b = pm.Normal("b", 0, 1, shape=2)
        pm.Bernoulli("obs", logit_p=pm.math.dot(X, b), observed=y)
    return model


def _owners(tmp_path, loaders, epsilon: float = 2.0) -> list[Owner]:
    return [
        Owner(f"site{k}", loader, tmp_path / f"site{k}.ledger", epsilon=epsilon, delta=1e-5)
        for k, loader in enumerate(loaders)
    ]


def _args(step_size: float = 0.05, sigma: float = 20.0):
    """A step's arguments; each release costs what its noise implies under substitute-one,
    (2 B / sigma)^2 per chain (the owners check it)."""
    rng = np.random.default_rng(3)
    x0 = rng.normal(0, 0.3, size=(CHAINS, 2))
    x1 = x0 + step_size * rng.normal(size=(CHAINS, 2))
    bounds = np.full(CHAINS, 0.2)
    return (
        x0,
        x1,
        bounds,
        np.full(2, sigma),
        np.full(2, np.inf),
        np.tile((2 * bounds / sigma) ** 2, (2, 1)),
    )


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("owners")
    model = _model()
    # A large budget: the first test releases with tiny noise, which costs much.
    owners = _owners(tmp, [_loader(k, DRIVER_PID) for k in range(2)], epsilon=1e7)
    with OwnerPool(owners, model, model.value_vars, model.initial_point(), timeout=60) as p:
        yield p


def test_releases_match_the_in_process_sums_and_rows_stay_on_the_workers(pool):
    x0, x1, bounds, _, count_sds, mu2 = _args(sigma=1e-3)
    sums, counts = pool.release(x0, x1, bounds, np.full(2, 1e-3), count_sds, mu2)
    assert sums.shape == (2, CHAINS) and np.isnan(counts).all()  # nothing of size n_k
    # The oracle: the same computation in this process on the same rows.
    for k in range(2):
        model = _model()
        with model:
            pm.set_data(_rows(k))
        lik = PenaltyLikelihood(model, model.value_vars, model.initial_point())
        for c in range(CHAINS):
            ll0, _ = lik.initial(x0[c], N_K)
            _, exact, _, _ = lik.evaluate(x1[c], ll0, bounds[c])
            assert sums[k, c] == pytest.approx(exact, abs=5e-3)  # 5 noise sds


def test_a_retried_step_is_identical_and_free_and_a_reused_id_is_refused(pool):
    x0, x1, bounds, sigmas, count_sds, mu2 = _args()
    first = pool.release(x0, x1, bounds, sigmas, count_sds, mu2)
    step = pool._step - 1
    before = pool.spent()
    again = pool.release(x0, x1, bounds, sigmas, count_sds, mu2, step=step)
    assert np.array_equal(first[0], again[0])  # the same noise: nothing new is learned
    assert pool.spent() == before  # and nothing more is charged
    with pytest.raises(OwnerError, match="already released for other points"):
        pool.release(x0, x1 + 0.1, bounds, sigmas, count_sds, mu2, step=step)
    # Ids may skip, never go back: an id below the last one released is refused.
    pool.release(x0, x1, bounds, sigmas, count_sds, mu2, step=step + 10)
    with pytest.raises(OwnerError, match="step ids must increase"):
        pool.release(x0, x1, bounds, sigmas, count_sds, mu2, step=step + 5)


def test_each_owner_charges_its_own_ledger_before_releasing(pool):
    before = pool.spent()
    x0, x1, bounds, sigmas, count_sds, mu2 = _args()
    pool.release(x0, x1, bounds, sigmas, count_sds, mu2)
    after = pool.spent()
    for name in before:
        assert after[name]["spent_mu2"] == pytest.approx(
            before[name]["spent_mu2"] + mu2.sum(axis=1)[0], rel=1e-9
        )
        assert after[name]["releases"] == before[name]["releases"] + 1
    # An owner whose budget cannot pay releases nothing.
    assert pool.release(x0, x1, bounds, sigmas, count_sds, np.full((2, CHAINS), 1e9)) is None


def test_an_owner_refuses_a_release_that_costs_more_than_declared(pool):
    x0, x1, bounds, sigmas, count_sds, mu2 = _args()
    before = pool.spent()
    with pytest.raises(OwnerError, match="declared cost is below"):
        pool.release(x0, x1, bounds, sigmas, count_sds, mu2 / 2)
    with pytest.raises(OwnerError, match="declared cost is below"):
        pool.release(x0, x1, bounds, sigmas, np.full(2, 1.0), mu2)  # the count costs 1 too
    assert pool.spent() == before
    # Declared at the implied cost, or above, it is released.
    assert pool.release(x0, x1, bounds, sigmas, count_sds, mu2 * (1 + 1e-12)) is not None


def test_a_resumed_run_reuses_the_owners_ledgers(tmp_path):
    model = _model()
    owners = _owners(tmp_path, [_loader(k, DRIVER_PID) for k in range(2)])
    args = _args()
    with OwnerPool(owners, model, model.value_vars, model.initial_point()) as p:
        run = p.run
        first = p.release(*args)
        spent = p.spent()
    # A new pool (new worker processes) on the same ledgers, continuing the same run.
    with OwnerPool(owners, model, model.value_vars, model.initial_point(), run=run) as p:
        again = p.release(*args, step=0)  # a step the crashed driver did not see answered
        assert np.array_equal(first[0], again[0])
        assert p.spent() == spent
    for k in range(2):
        ledger = PrivacyLedger.open(tmp_path / f"site{k}.ledger")
        assert ledger.releases == 1


@pytest.mark.parametrize("how", ["killed", "hung"])
def test_a_lost_owner_stops_the_run_with_its_name(tmp_path, how):
    model = _model()
    owners = _owners(tmp_path, [_loader(k, DRIVER_PID) for k in range(2)])
    with OwnerPool(owners, model, model.value_vars, model.initial_point(), timeout=5) as p:
        p.release(*_args())
        pids = p.client.run(os.getpid)
        victim = pids[list(p.client.scheduler_info()["workers"])[1]]
        os.kill(victim, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        try:
            t0 = time.perf_counter()
            with pytest.raises(OwnerError, match="Owner 'site1'") as err:
                p.release(*_args())
            assert time.perf_counter() - t0 < 30
            assert "site0: mu^2" in str(err.value)  # what the other owner has spent
        finally:
            if how == "hung":
                os.kill(victim, signal.SIGCONT)
    # The owner's ledger file holds at least the cost of what it released (committed before
    # the release; the release counter itself is flushed lazily and dies with the process).
    released_mu2 = _args()[-1].sum(axis=1)[1]
    assert PrivacyLedger.open(tmp_path / "site1.ledger").spent_mu2 >= released_mu2 * (1 - 1e-12)


@pytest.mark.parametrize(
    ("loader", "match"),
    [
        (lambda: (_ for _ in ()).throw(OSError("disk")), "failed to start"),
        (lambda: {"X": np.zeros((5, 3)), "y": np.zeros(5)}, "trailing shape"),
        (lambda: {"X": np.zeros((0, 2)), "y": np.zeros(0)}, "positive number of rows"),
        (lambda: {"Z": np.zeros((5, 2))}, "not pm.Data containers"),
    ],
    ids=["loader-fails", "columns", "no-rows", "unknown-name"],
)
def test_bad_owners_are_named_and_spend_nothing(tmp_path, loader, match):
    model = _model()
    owners = _owners(tmp_path, [_loader(0, DRIVER_PID), loader])
    with pytest.raises(OwnerError, match=match) as err:
        OwnerPool(owners, model, model.value_vars, model.initial_point(), timeout=60)
    assert "site1" in str(err.value)
    for k in range(2):
        path = tmp_path / f"site{k}.ledger"
        assert not path.exists() or PrivacyLedger.open(path).spent_mu2 == 0.0


def test_an_unreachable_cluster_is_a_clear_error(tmp_path):
    model = _model()
    owners = _owners(tmp_path, [_loader(0, DRIVER_PID)])
    with pytest.raises(OwnerError, match="No Dask scheduler answered"):
        OwnerPool(
            owners, model, model.value_vars, model.initial_point(), cluster="tcp://127.0.0.1:9"
        )


def test_owner_arguments_are_checked_before_anything_starts(tmp_path):
    with pytest.raises(ValueError, match="`name`"):
        Owner("", lambda: {}, tmp_path / "a", 1.0, 1e-5)
    with pytest.raises(ValueError, match="`loader`"):
        Owner("a", 3, tmp_path / "a", 1.0, 1e-5)
    with pytest.raises(ValueError, match="epsilon"):
        Owner("a", lambda: {}, tmp_path / "a", -1.0, 1e-5)
