"""Tests of the shared privacy ledger: exhaustion, processes, crashes, fork, overhead."""

from __future__ import annotations

import gc
import importlib.util
import math
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import random
import signal
import statistics
import sys
import threading
import time
import types
from fractions import Fraction

import pytest


def _light_import_in_workers() -> None:
    """In a spawned or forkserver worker, import ``pymc_penalty.privacy.ledger`` without the
    package.

    ``pymc_penalty/__init__`` imports PyMC, which takes seconds per worker process; the ledger
    needs only the standard library. The test process itself imports the package normally.
    """
    # While a spawned or forkserver child unpickles its target, ``_inheriting`` is set and
    # ``parent_process()`` is not yet.
    in_worker = mp.parent_process() is not None or getattr(
        mp.current_process(), "_inheriting", False
    )
    if not in_worker or "pymc_penalty" in sys.modules:
        return
    spec = importlib.util.find_spec("pymc_penalty")  # locates without executing __init__
    if spec is None or not spec.submodule_search_locations:
        return
    package = types.ModuleType("pymc_penalty")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["pymc_penalty"] = package


_light_import_in_workers()

from pymc_penalty.privacy.ledger import PrivacyLedger  # noqa: E402

START_METHODS = ["fork", "forkserver", "spawn"]
JOIN_TIMEOUT = 120.0


def _tolerance(releases: int) -> Fraction:
    """Documented rounding, relative to the budget: the budget is rounded down to 53 bits
    (below 2**-52) and each release's cost up to a unit (below 2**-60)."""
    return Fraction(1, 2**52) + Fraction(releases, 2**60)


def _max_affordable(budget_mu: float, mu2: float) -> tuple[int, bool]:
    """The exact number of releases of cost ``mu2`` that fit in ``budget_mu**2``, and whether
    the last of them fits only within the rounding tolerance (it may then be refused)."""
    budget2 = Fraction(budget_mu) ** 2
    k = math.floor(budget2 / Fraction(mu2))
    return k, budget2 - k * Fraction(mu2) < _tolerance(k) * budget2


def _spend_until_refused(ledger: PrivacyLedger, mu2: float, limit: int = 10**7) -> int:
    n = 0
    while ledger.try_spend(mu2):
        n += 1
        assert n < limit
    return n


# ------------------------------------------------------------------------------------------
# Single process.


@pytest.mark.parametrize(
    ("budget_mu", "mu2", "reserve_fraction"),
    [
        (1.0, 1 / 64, 0.05),
        (1.0, 0.01, 0.05),
        (0.268051, (0.268051 / 10) ** 2, 0.3),
        (0.268051, 0.000123, 0.0),
        (3.0, 0.7, 1.0),
        (1.0, 1.0, 0.05),
    ],
)
def test_exhaustion_grants_exactly_the_affordable_number(budget_mu, mu2, reserve_fraction):
    ledger = PrivacyLedger(budget_mu, reserve_fraction=reserve_fraction)
    expected, tight = _max_affordable(budget_mu, mu2)
    granted = _spend_until_refused(ledger, mu2)
    assert granted == expected or (tight and granted == expected - 1)
    expected = granted
    # One more must fail, however often it is asked, and commit nothing.
    spent = ledger.spent_mu2
    assert not ledger.try_spend(mu2)
    assert not ledger.try_spend(mu2)
    assert ledger.spent_mu2 == spent
    assert ledger.exhausted
    assert ledger.releases == expected
    assert Fraction(ledger.used_mu2) <= expected * Fraction(mu2) <= Fraction(budget_mu) ** 2
    assert ledger.spent_mu2 <= ledger.budget_mu2 <= budget_mu**2
    assert ledger.spent_mu <= budget_mu


def test_exact_budgets_are_used_to_the_last_bit():
    # Dyadic costs and budgets: no rounding anywhere, so the count is exactly the quotient.
    for budget_mu, mu2, n in [(1.0, 2.0**-6, 64), (0.5, 2.0**-10, 256), (3.0, 0.5625, 16)]:
        ledger = PrivacyLedger(budget_mu)
        assert _spend_until_refused(ledger, mu2) == n
        assert ledger.spent_mu2 == ledger.used_mu2 == ledger.budget_mu2 == budget_mu**2


def test_random_costs_never_exceed_the_budget_and_waste_at_most_the_last_refusal():
    rng = random.Random(1234)
    for _ in range(30):
        budget_mu = rng.uniform(0.05, 5.0)
        ledger = PrivacyLedger(budget_mu, reserve_fraction=rng.choice([0.0, 0.01, 0.2, 1.0]))
        budget2 = Fraction(budget_mu) ** 2
        total = Fraction(0)
        n = 0
        while True:
            mu2 = rng.uniform(0.0, 0.05) * budget_mu**2
            if not ledger.try_spend(mu2):
                break
            total += Fraction(mu2)
            n += 1
        assert total <= budget2
        # The refused request really did not fit, up to the documented tolerance.
        assert total + Fraction(mu2) > budget2 * (1 - _tolerance(n + 1))
        assert ledger.releases == n
        assert ledger.spent_mu2 <= ledger.budget_mu2 <= budget_mu**2


def test_budget_smaller_than_one_release_grants_nothing():
    ledger = PrivacyLedger(0.1)
    assert not ledger.try_spend(0.0101)
    assert not ledger.try_spend(1e300)  # far beyond the budget: refused, no overflow
    assert ledger.releases == 0
    assert ledger.spent_mu2 == 0.0
    assert ledger.exhausted
    assert ledger.try_spend(0.01)  # fits: float(0.01) < float(0.1)**2, by 9e-19...
    assert not ledger.try_spend(1e-18)  # ...which a further 1e-18 does not


def test_zero_budget_refuses_everything_but_free_releases():
    ledger = PrivacyLedger(0.0)
    assert not ledger.try_spend(1e-300)
    assert ledger.try_spend(0.0)  # carries no information
    assert ledger.spent_mu2 == 0.0
    assert ledger.releases == 1


def test_spending_past_the_budget_is_refused_with_mixed_costs():
    ledger = PrivacyLedger(1.0)
    assert ledger.try_spend(0.5)
    assert ledger.try_spend(0.25)
    assert not ledger.try_spend(0.3)
    assert ledger.exhausted  # the refused request does not fit
    assert ledger.try_spend(0.25)
    assert not ledger.try_spend(2.0**-60)
    snap = ledger.snapshot()
    assert snap["spent_mu2"] == snap["used_mu2"] == 1.0
    assert snap["releases"] == 3


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, -math.inf, 1e200, "one", None])
def test_bad_budget_is_refused(bad):
    with pytest.raises(ValueError, match="budget_mu.*\\[0, "):
        PrivacyLedger(bad)


@pytest.mark.parametrize("bad", [-1e-12, math.nan, math.inf, "x", None])
def test_bad_mu2_is_refused(bad):
    ledger = PrivacyLedger(1.0)
    with pytest.raises(ValueError, match="mu2.*\\[0, inf\\)"):
        ledger.try_spend(bad)
    assert ledger.releases == 0


@pytest.mark.parametrize("bad", [-0.1, 1.5, math.nan])
def test_bad_reserve_fraction_is_refused(bad):
    with pytest.raises(ValueError, match="reserve_fraction.*\\[0, 1\\]"):
        PrivacyLedger(1.0, reserve_fraction=bad)


def test_snapshot_is_a_plain_dict():
    ledger = PrivacyLedger(2.0)
    assert ledger.try_spend(0.5)
    snap = ledger.snapshot()
    assert set(snap) >= {
        "budget_mu",
        "spent_mu2",
        "spent_mu",
        "used_mu2",
        "remaining_mu2",
        "releases",
        "exhausted",
    }
    assert all(isinstance(v, str | float | int | bool) for v in snap.values())
    assert snap["budget_mu2"] == 4.0
    assert snap["used_mu2"] == 0.5
    assert snap["spent_mu2"] >= 0.5  # the chunk is committed
    assert snap["remaining_mu2"] + snap["spent_mu2"] == pytest.approx(4.0)
    assert snap["local_unused_mu2"] == pytest.approx(snap["spent_mu2"] - 0.5)
    assert not snap["exhausted"]
    returned = ledger.release_unused()
    assert returned == pytest.approx(snap["local_unused_mu2"])
    assert ledger.spent_mu2 == ledger.used_mu2 == 0.5
    assert ledger.remaining_mu2 == 3.5


# ------------------------------------------------------------------------------------------
# Files: persistence, reopening, corruption.


def test_persistent_budget_is_shared_across_ledger_objects(tmp_path):
    path = tmp_path / "dataset.ledger"
    first = PrivacyLedger(1.0, path)
    assert first.durable
    for _ in range(10):
        assert first.try_spend(1 / 64)
    first.release_unused()
    del first

    second = PrivacyLedger(1.0, str(path))  # a second analysis of the same dataset
    assert second.releases == 10
    assert second.spent_mu2 == 10 / 64
    # A third object holding a chunk at the same time: the two cannot share the chunk.
    third = PrivacyLedger.open(path)
    assert third.try_spend(1 / 64)
    n = _spend_until_refused(second, 1 / 64)
    third.release_unused()
    n += _spend_until_refused(third, 1 / 64)
    assert n == 64 - 10 - 1
    second.release_unused()
    third.release_unused()
    assert PrivacyLedger.open(path).snapshot()["releases"] == 64
    assert PrivacyLedger.open(path).spent_mu2 == 1.0


def test_existing_ledger_with_another_budget_is_refused(tmp_path):
    path = tmp_path / "dataset.ledger"
    PrivacyLedger(0.5, path)
    with pytest.raises(ValueError, match="budget_mu=0.5.*cannot be changed"):
        PrivacyLedger(0.6, path)
    assert PrivacyLedger.open(path).budget_mu == 0.5


def test_open_rejects_missing_and_foreign_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        PrivacyLedger.open(tmp_path / "missing")
    foreign = tmp_path / "table.csv"
    foreign.write_text("age,income\n")
    with pytest.raises(ValueError, match="not a readable pymc-penalty privacy ledger"):
        PrivacyLedger.open(foreign)
    with pytest.raises(ValueError, match="not a readable"):
        PrivacyLedger(1.0, foreign)  # never overwritten
    assert foreign.read_text() == "age,income\n"


def test_a_torn_newest_record_falls_back_to_the_previous_one(tmp_path):
    path = tmp_path / "l"
    ledger = PrivacyLedger(1.0, path, reserve_fraction=0.0)
    assert ledger.try_spend(0.25)  # writes record 1 (slot 1)
    assert ledger.try_spend(0.25)  # writes record 2 (slot 0)
    raw = bytearray(path.read_bytes())
    raw[20] ^= 0xFF  # corrupt the newest record, as an interrupted write would
    path.write_bytes(bytes(raw))
    assert PrivacyLedger.open(path).spent_mu2 == 0.25  # the state before that write
    raw[4096 + 20] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="no valid state record"):
        PrivacyLedger.open(path)


def test_a_vanished_file_is_not_silently_recreated(tmp_path):
    path = tmp_path / "l"
    ledger = PrivacyLedger(1.0, path)
    os.remove(path)
    with pytest.raises(FileNotFoundError, match="disappeared"):
        ledger.try_spend(0.1)
    assert not path.exists()


def test_pickle_carries_the_path_and_not_the_chunk():
    ledger = PrivacyLedger(1.0)
    assert ledger.try_spend(0.01)
    assert ledger.local_unused_mu2 > 0
    clone = pickle.loads(pickle.dumps(ledger))
    assert clone.path == ledger.path
    assert clone.budget_mu == 1.0
    assert clone.local_unused_mu2 == 0.0
    reservations = clone.snapshot()["reservations"]
    assert clone.try_spend(0.01)
    assert clone.snapshot()["reservations"] == reservations + 1  # its own chunk


# ------------------------------------------------------------------------------------------
# Processes. Worker functions live at module level so that spawned workers can import them.


def _hammer(ledger, seed, barrier, conn):
    """Spend random costs until refused; report every granted cost at the end."""
    rng = random.Random(seed)
    unit = ledger.budget_mu**2 / 3000
    granted = []
    barrier.wait()
    while True:
        mu2 = rng.uniform(0.5, 1.5) * unit
        if not ledger.try_spend(mu2):
            break
        granted.append(mu2)
    ledger.release_unused()
    conn.send(granted)
    conn.close()


@pytest.mark.parametrize("method", START_METHODS)
def test_concurrent_spending_never_exceeds_the_budget(method):
    if method not in mp.get_all_start_methods():
        pytest.skip(f"start method {method!r} unavailable")
    ctx = mp.get_context(method)
    budget_mu = 0.7
    ledger = PrivacyLedger(budget_mu, reserve_fraction=0.01)
    barrier = ctx.Barrier(4)
    pipes, procs = [], []
    for seed in range(4):
        receiver, sender = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_hammer, args=(ledger, seed, barrier, sender))
        proc.start()
        sender.close()
        pipes.append(receiver)
        procs.append(proc)
    results = []
    for receiver in pipes:
        assert receiver.poll(JOIN_TIMEOUT), "worker did not report"
        results.append(receiver.recv())
    for proc in procs:
        proc.join(JOIN_TIMEOUT)
        assert proc.exitcode == 0

    budget2 = Fraction(budget_mu) ** 2
    total = sum((Fraction(x) for grants in results for x in grants), Fraction(0))
    count = sum(len(grants) for grants in results)
    snap = PrivacyLedger.open(ledger.path).snapshot()
    assert total <= budget2
    assert snap["releases"] == count
    assert snap["spent_mu2"] <= budget_mu**2
    assert snap["used_mu2"] <= float(total) * (1 + 1e-12)
    # Every worker returned its chunk: nothing is outstanding...
    assert snap["outstanding_mu2"] == 0.0
    # ...and the budget was used, up to what the last refusals could not fit.
    assert total >= budget2 * Fraction(95, 100)
    assert snap["reservations"] > 20  # the workers did contend for the file


def _report_each_grant(path, reserve_fraction, go, conn):
    """Spend until refused, sending each grant through ``conn`` before 'using' it."""
    ledger = PrivacyLedger.open(path, reserve_fraction=reserve_fraction)
    if go is not None:
        go.wait()
    rng = random.Random(os.getpid())
    while True:
        mu2 = rng.uniform(0.5, 1.5) * ledger.budget_mu**2 / 20000
        if not ledger.try_spend(mu2):
            break
        conn.send(mu2)  # reported before the noisy value would be used
    ledger.release_unused()
    conn.send(None)
    conn.close()


def test_sigkill_mid_run_leaves_a_readable_conservative_ledger(tmp_path):
    ctx = mp.get_context("fork")
    budget_mu = 1.0
    path = tmp_path / "run.ledger"
    PrivacyLedger(budget_mu, path)
    go = ctx.Event()
    # Worker 0 is the victim: it reserves exactly one release at a time, so it spends much of
    # its time inside file updates when the kill arrives. The others start once it is under
    # way and run while it is killed.
    fractions = [0.0, 0.05, 0.05, 0.01]
    receivers, procs = [], []
    for i, fraction in enumerate(fractions):
        receiver, sender = ctx.Pipe(duplex=False)
        args = (path, fraction, None if i == 0 else go, sender)
        proc = ctx.Process(target=_report_each_grant, args=args)
        proc.start()
        sender.close()
        receivers.append(receiver)
        procs.append(proc)

    grants: list[list[float]] = [[] for _ in procs]
    open_pipes = dict(enumerate(receivers))
    killed = False
    deadline = time.monotonic() + JOIN_TIMEOUT
    while open_pipes:
        assert time.monotonic() < deadline, "workers did not finish"
        for receiver in mp.connection.wait(list(open_pipes.values()), timeout=1.0):
            i = next(k for k, r in open_pipes.items() if r is receiver)
            try:
                msg = receiver.recv()
            except EOFError:
                del open_pipes[i]
                continue
            if msg is None:
                del open_pipes[i]
                continue
            grants[i].append(msg)
            if i == 0 and len(grants[0]) == 20:
                go.set()
            if i == 0 and not killed and len(grants[0]) >= 60:
                os.kill(procs[0].pid, signal.SIGKILL)
                killed = True
    for proc in procs:
        proc.join(JOIN_TIMEOUT)
    assert killed
    assert procs[0].exitcode == -signal.SIGKILL
    assert [p.exitcode for p in procs[1:]] == [0, 0, 0]

    snap = PrivacyLedger.open(path).snapshot()
    reported = sum((Fraction(x) for g in grants for x in g), Fraction(0))
    assert Fraction(snap["spent_mu2"]) >= reported  # never less than was granted
    assert snap["spent_mu2"] <= budget_mu**2  # never more than the budget
    survivors = sum(len(g) for g in grants[1:])
    assert survivors > 0
    assert survivors <= snap["releases"] <= survivors + len(grants[0])
    print(
        f"\nkilled worker reported {len(grants[0])} grants; ledger after the crash: "
        f"spent_mu2={snap['spent_mu2']:.6f}, used_mu2={snap['used_mu2']:.6f}, "
        f"outstanding_mu2={snap['outstanding_mu2']:.2e}"
    )


def _child_spends(ledger, conn):
    before = ledger.local_unused_mu2
    granted = [ledger.try_spend(1 / 1024) for _ in range(10)]
    ledger.release_unused()
    conn.send((before, granted))
    conn.close()


def test_forked_child_does_not_reuse_the_parents_chunk():
    ctx = mp.get_context("fork")
    ledger = PrivacyLedger(1.0, reserve_fraction=0.5)
    assert ledger.try_spend(1 / 1024)  # reserves half the budget as a chunk
    parent_chunk = ledger.local_unused_mu2
    assert parent_chunk == 0.5 - 1 / 1024
    reservations = ledger.snapshot()["reservations"]

    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_spends, args=(ledger, sender))
    proc.start()
    sender.close()
    before, granted = receiver.recv()
    proc.join(JOIN_TIMEOUT)
    assert proc.exitcode == 0
    assert before == 0.0  # the inherited chunk was dropped...
    assert all(granted)
    snap = ledger.snapshot()
    assert snap["reservations"] == reservations + 1  # ...the child reserved its own...
    # ...and returned only its own: the parent's chunk is still committed.
    assert snap["spent_mu2"] == 0.5 + 10 / 1024
    assert snap["releases"] == 1 + 10
    assert ledger.local_unused_mu2 == parent_chunk  # the parent still owns its chunk
    assert ledger.try_spend(1 / 1024)
    assert ledger.snapshot()["reservations"] == reservations + 1  # served from the chunk
    ledger.release_unused()
    assert ledger.spent_mu2 == ledger.used_mu2 == 12 / 1024


def _spend_and_exit_without_release(ledger, n):
    for _ in range(n):
        assert ledger.try_spend(1 / 4096)


def test_worker_exit_returns_the_unused_chunk_automatically():
    ctx = mp.get_context("fork")
    ledger = PrivacyLedger(1.0, reserve_fraction=0.5)
    proc = ctx.Process(target=_spend_and_exit_without_release, args=(ledger, 7))
    proc.start()
    proc.join(JOIN_TIMEOUT)
    assert proc.exitcode == 0
    snap = ledger.snapshot()
    assert snap["spent_mu2"] == snap["used_mu2"] == 7 / 4096
    assert snap["releases"] == 7
    assert snap["returns"] == 1


def test_threads_share_one_ledger_safely():
    ledger = PrivacyLedger(1.0, reserve_fraction=0.01)
    counts = [0] * 4

    def spend(i):
        while ledger.try_spend(2.0**-14):
            counts[i] += 1

    threads = [threading.Thread(target=spend, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(counts) == 2**14 == ledger.releases
    assert ledger.spent_mu2 == 1.0


def test_garbage_collection_returns_the_chunk(tmp_path):
    path = tmp_path / "l"
    ledger = PrivacyLedger(1.0, path, reserve_fraction=0.5)
    assert ledger.try_spend(0.125)
    assert PrivacyLedger.open(path).spent_mu2 == 0.5
    del ledger
    gc.collect()
    snap = PrivacyLedger.open(path).snapshot()
    assert snap["spent_mu2"] == snap["used_mu2"] == 0.125
    assert snap["releases"] == 1


def _child_creates_and_exits(parent_path, conn):
    from pymc_penalty.privacy import ledger as module

    own = PrivacyLedger(1.0)
    assert own.try_spend(0.5)
    module._at_exit()  # what the child's exit runs: its own ledger only
    conn.send((str(own.path), os.path.exists(own.path), os.path.exists(parent_path)))
    conn.close()


def test_exit_removes_only_this_processes_temporary_ledger():
    ctx = mp.get_context("fork")
    ledger = PrivacyLedger(1.0, reserve_fraction=0.5)
    assert ledger.try_spend(0.25)
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_creates_and_exits, args=(str(ledger.path), sender))
    proc.start()
    sender.close()
    child_path, child_exists, parent_exists = receiver.recv()
    proc.join(JOIN_TIMEOUT)
    assert proc.exitcode == 0
    assert not child_exists and not os.path.exists(os.path.dirname(child_path))
    assert parent_exists and ledger.path.exists()
    assert ledger.local_unused_mu2 > 0  # the child's exit did not return the parent's chunk
    assert ledger.spent_mu2 > ledger.used_mu2 == 0.25


# ------------------------------------------------------------------------------------------
# Overhead.


def _time_spending(ledger: PrivacyLedger, mu2: float, calls: int, block: int = 256):
    """Median per-call time over blocks of ``block`` calls, and the mean over all calls."""
    per_call = []
    timer = time.perf_counter
    spend = ledger.try_spend
    start = timer()
    for _ in range(calls // block):
        t0 = timer()
        for _ in range(block):
            spend(mu2)
        per_call.append((timer() - t0) / block)
    mean = (timer() - start) / calls
    return statistics.median(per_call), mean


def test_overhead_per_release_is_small(tmp_path):
    calls = 2**17
    mu2 = 2.0**-17  # the budget affords exactly `calls` releases: all of them are granted
    best = None
    for _ in range(3):  # best of three, against noise from other processes on the machine
        ledger = PrivacyLedger(1.0)
        median, mean = _time_spending(ledger, mu2, calls)
        assert ledger.releases == calls
        reservations = ledger.snapshot()["reservations"]
        best = (median, mean) if best is None else (min(best[0], median), min(best[1], mean))
    durable = PrivacyLedger(1.0, tmp_path / "durable.ledger")
    d_median, d_mean = _time_spending(durable, mu2, calls)
    print(
        f"\ntry_spend: median {best[0] * 1e6:.2f} us/call, mean {best[1] * 1e6:.2f} us/call "
        f"over {calls} calls with {reservations} reservations (temporary ledger); durable "
        f"ledger: median {d_median * 1e6:.2f} us, mean {d_mean * 1e6:.2f} us"
    )
    # A step at n = 1e3 costs about 100 us: the ledger must stay well under 5 us per release.
    assert best[0] < 5e-6
    assert best[1] < 5e-6
    assert d_mean < 20e-6


# ------------------------------------------------------------------------------------------
# Import has no side effects: the process hooks are installed with the first ledger.


def test_importing_the_ledger_installs_no_process_hook():
    import subprocess
    import textwrap
    from pathlib import Path

    code = textwrap.dedent(
        """
        import atexit, importlib.util, sys, types
        spec = importlib.util.find_spec("pymc_penalty")
        package = types.ModuleType("pymc_penalty")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["pymc_penalty"] = package  # the ledger without PyMC, as workers do
        import multiprocessing.util  # registers its own exit function when imported
        before = atexit._ncallbacks()
        import pymc_penalty.privacy.ledger.hooks as hooks
        import pymc_penalty.privacy.ledger as ledger
        assert atexit._ncallbacks() == before and not hooks._INSTALLED, "hook at import"
        first = ledger.PrivacyLedger(1.0)
        assert atexit._ncallbacks() == before + 1 and hooks._INSTALLED, "no hook with a ledger"
        second = ledger.PrivacyLedger(2.0)
        assert atexit._ncallbacks() == before + 1, "hooks installed twice"
        assert first.try_spend(0.5) and second.try_spend(0.5)
        print("ok")
        """
    )
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
