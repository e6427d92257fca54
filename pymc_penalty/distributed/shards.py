"""One curator's table split into shards on Dask workers: partial sums there, one noise here.

Unlike :class:`~pymc_penalty.distributed.OwnerPool` (several parties, each adding its own
noise), a :class:`ShardPool` serves a single data curator. Each shard is an actor
(:class:`~pymc_penalty.distributed._service.ShardService`) on a worker: its loader runs there,
the model (shipped without rows) is compiled there, and per step it returns, for every chain
in one call, only its exact clipped partial sum and clip count. The driver sums the shards
and adds **one** Gaussian draw per release, calibrated for the whole table: one row changes
one shard's partial sum by at most the clip bound, so the sensitivity is the in-process one.

No silent second release. The driver's noise for step ``(run, step)`` comes from a
counter-based generator keyed by a secret (drawn once from OS entropy, kept beside the run
ledger as ``<ledger_path>.key``), the step id and the digest of the step's request (points,
bounds, noise sds), as an owner's; that digest is journaled before the noise is added. A
step computed again (a retried call, a re-executed task, a resumed run) therefore returns the
*identical* release; the same id with other points is refused, and were its journal line
lost, it would get independent noise: the same noise is never added to two different sums.
Dask's retries are off (``allowed-failures = 0``); actor calls are never re-run.

:func:`sample_sharded` runs the penalty chain through a pool (also ``pp.sample(shards=...)``).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pymc as pm

from pymc_penalty.accounting.sensitivity import Neighbours
from pymc_penalty.distributed._service import ShardService, digest, keyed_noise, load_secret
from pymc_penalty.distributed._setup import Journal
from pymc_penalty.distributed.pool import DEFAULT_TIMEOUT, ActorPool, ActorSpec
from pymc_penalty.errors import ShardError
from pymc_penalty.privacy.precision import snap_count, snap_noisy
from pymc_penalty.warmstart.statistics import SummedStatistics
from pymc_penalty.warmstart.taylor_terms import SummedTaylorTerms

__all__ = ["ShardPool", "driver_secret", "shard_loaders", "shard_names"]

Loader = Callable[[], Mapping[str, Any]] | str | os.PathLike


def shard_loaders(shards: Any) -> list[Loader]:
    """The shards as a list of loaders, checked (a ValueError naming ``shards``).

    Parameters
    ----------
    shards : sequence of callable or path, or dict of dask arrays
        Each a callable returning ``{pm.Data container name: array}`` (the shard's rows) or
        the path of an ``.npz`` file of arrays so named; they run on the workers. Or
        ``{pm.Data container name: dask.array.Array}`` with the same row chunks: block ``k``
        of every array is shard ``k`` (computed on the workers; the columns must be one
        chunk).

    Returns
    -------
    list
        Loaders; for dask arrays, one ``{name: Delayed}`` per row block.
    """
    if isinstance(shards, Mapping):
        return _dask_shards(shards)
    if isinstance(shards, str | os.PathLike) or not isinstance(shards, Sequence):
        raise ValueError(
            "`shards` must be a non-empty list of loaders: callables returning "
            "{pm.Data name: array}, or paths of .npz files (read on the workers)."
        )
    shards = list(shards)
    if not shards:
        raise ValueError("`shards` must hold at least one loader.")
    for k, loader in enumerate(shards):
        if isinstance(loader, Mapping) and _delayed_blocks(loader):
            continue  # a block of a dask collection (from a dict of dask arrays)
        if not (callable(loader) or isinstance(loader, str | os.PathLike)):
            raise ValueError(f"`shards[{k}]` must be a callable or an .npz path.")
        if isinstance(loader, str | os.PathLike) and Path(loader).suffix != ".npz":
            raise ValueError(f"`shards[{k}]` names a path that is not an .npz file.")
    return shards


def shard_names(n: int) -> list[str]:
    """The names of ``n`` shards in messages and reports: ``shard-0``, ``shard-1``, ..."""
    return [f"shard-{k}" for k in range(n)]


def _delayed_blocks(block: Mapping[str, Any]) -> bool:
    """Whether every value is a dask ``Delayed`` (rows that are not in the driver)."""
    try:
        from dask.delayed import Delayed
    except ImportError:  # pragma: no cover
        return False
    return bool(block) and all(isinstance(v, Delayed) for v in block.values())


def _dask_shards(arrays: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``{name: dask array}`` to one ``{name: Delayed}`` per row block (nothing computed)."""
    try:
        import dask.array as da
    except ImportError:  # pragma: no cover - dask comes with the distributed extra
        da = None
    if (
        da is None
        or not arrays
        or not all(isinstance(a, da.Array) and a.ndim >= 1 for a in arrays.values())
    ):
        raise ValueError(
            "`shards` given as a dict must map pm.Data container names to dask arrays."
        )
    row_chunks = {a.chunks[0] for a in arrays.values()}
    if len(row_chunks) != 1:
        raise ValueError("`shards`: the dask arrays must share their row chunks.")
    if any(len(c) != 1 for a in arrays.values() for c in a.chunks[1:]):
        raise ValueError("`shards`: each dask array's columns must be one chunk (rechunk).")
    blocks = {name: a.to_delayed().reshape(-1) for name, a in arrays.items()}
    n_blocks = len(next(iter(row_chunks)))
    return [{name: blocks[name][k] for name in arrays} for k in range(n_blocks)]


class ShardPool(ActorPool):
    """One actor per shard of one curator's table; one noise draw per release at the driver.

    Parameters
    ----------
    shards : sequence of callable or path
        The shards' loaders (:func:`shard_loaders`); each runs on its worker.
    model : pm.Model
        The model with placeholder ``pm.Data`` containers (the right columns, any rows): it
        travels to the workers without rows.
    value_vars : sequence of Variable
        The value variables of the raveled parameter vector.
    point : dict
        A point giving their shapes.
    cluster : None, str or distributed.Client
        ``None`` starts a ``LocalCluster`` with ``min(len(shards), os.cpu_count())`` worker
        processes (one thread each); a scheduler address or a ``Client`` uses that cluster.
        Shards are placed round-robin on the cluster's workers and pinned there.
    timeout : float, default 60
        Seconds a call may take before its shard counts as lost (starting one, which loads
        its rows and compiles, may take up to ``max(timeout, 300)``).
    compile_kwargs : dict, optional
        Passed to each shard's compiled likelihood.
    run : str, optional
        The run id of the step ids (a fresh one by default; reuse it to resume a run).
    journal : Journal, optional
        The driver's journal (the digest of each released step's points is added to it); an
        in-memory one by default.
    secret : bytes, optional
        The key of the driver's noise (32 bytes of OS entropy by default; a resumed run must
        pass the one kept beside its ledger).
    """

    kind = "Shard"
    error = ShardError

    def __init__(
        self,
        shards: Sequence[Loader],
        model: pm.Model,
        value_vars: Sequence[Any],
        point: Mapping[str, np.ndarray],
        *,
        cluster: Any = None,
        timeout: float = DEFAULT_TIMEOUT,
        compile_kwargs: dict[str, Any] | None = None,
        run: str | None = None,
        journal: Journal | None = None,
        secret: bytes | None = None,
    ) -> None:
        loaders = shard_loaders(shards)
        names = shard_names(len(loaders))
        self.journal = Journal(None) if journal is None else journal
        self._secret = secrets.token_bytes(32) if secret is None else bytes(secret)
        super().__init__(names, cluster, min(len(loaders), os.cpu_count() or 1), timeout, run)
        try:
            workers = sorted(self.client.scheduler_info()["workers"])
        except Exception:  # noqa: BLE001
            workers = []
        if not workers:
            self.close()
            raise ShardError("The Dask cluster has no workers to hold the shards.")
        #: Which worker holds each shard (round-robin).
        self.placement = [workers[k % len(workers)] for k in range(len(loaders))]
        # A dask collection's blocks are computed on the workers; the actors receive them
        # worker to worker (Dask resolves the futures in the arguments), never via the driver.
        loaders = [
            dict(zip(loader, self.client.compute(list(loader.values())), strict=True))
            if isinstance(loader, Mapping)
            else loader
            for loader in loaders
        ]
        specs = [
            ActorSpec(loader, (), name, {"workers": [where], "allow_other_workers": False})
            for name, loader, where in zip(self.names, loaders, self.placement, strict=True)
        ]
        self._start(ShardService, model, value_vars, point, compile_kwargs, specs)

    def release(
        self,
        x0s: np.ndarray,
        x1s: np.ndarray,
        bounds: np.ndarray,
        sigmas: np.ndarray,
        count_sds: np.ndarray,
        mu2: np.ndarray | None = None,
        step: int | None = None,
        residual: bool = False,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The whole table's noisy release for every chain of one step.

        The caller has committed the step's cost (``mu2``, unused here) to its ledger first.
        Every shard returns its exact clipped partial sums; the driver adds one Gaussian draw
        per chain to their total (and one to the clip count's), from the generator keyed by
        the step id.

        Parameters
        ----------
        x0s, x1s : ndarray, shape (chains, d)
            Current points and proposals.
        bounds : ndarray, shape (chains,)
            Clip bounds.
        sigmas : ndarray, shape (1, chains) or (chains,)
            Noise sd of each chain's clipped sum (the whole table's sensitivity over mu).
        count_sds : ndarray, shape (1,) or scalar
            Noise sd of the clip count (``inf``: none released).
        mu2 : ndarray, optional
            The step's cost, as :meth:`OwnerPool.release` takes it (charged by the caller).
        step : int, optional
            The step id (the next one by default). A step already released with the same
            points returns the identical values; with other points it is refused.
        residual : bool, default False
            Release the clipped sums of the rows' residuals after the Taylor model of
            :meth:`taylor_control` (the Taylor path's step) instead of their log-likelihood
            ratios (part of the request's digest: the two never share noise).

        Returns
        -------
        (sums, counts) : ndarrays of shape (1, chains)
            The noisy sums and noisy clip counts, as one party's release.

        Raises
        ------
        ShardError
            A shard was lost, hung or failed (nothing of the step is released), or the step
            id was already released for other points.
        """
        step = self._next_step(step)
        x0s = np.atleast_2d(np.asarray(x0s, dtype=np.float64))
        x1s = np.atleast_2d(np.asarray(x1s, dtype=np.float64))
        chains = x0s.shape[0]
        bounds = np.broadcast_to(np.asarray(bounds, dtype=np.float64), (chains,)).copy()
        sigma = np.broadcast_to(np.asarray(sigmas, dtype=np.float64).reshape(-1), (chains,))
        count_sd = float(np.asarray(count_sds, dtype=np.float64).reshape(-1)[0])
        key = (self.run, step)
        request = [x0s, x1s, bounds, sigma, np.array([count_sd])]
        step_digest = digest(*request, *([np.array([1.0])] if residual else []))
        known = self.journal.points.get(key)
        if known is not None and known != step_digest:
            raise ShardError(
                f"Step {step} of run {self.run!r} was already released for other points; a "
                "step id is used once (its noise would be reused). Nothing was released."
            )
        replies = self._ask_all(
            f"compute step {step}",
            lambda _, actor: actor.partial_sums(self.run, step, x0s, x1s, bounds, residual),
        )
        sums, counts = np.zeros(chains), np.zeros(chains)
        for name, reply in replies:
            part_sums = np.asarray(reply["sums"], dtype=np.float64)
            part_counts = np.asarray(reply["counts"], dtype=np.float64)
            if part_sums.shape != (chains,) or part_counts.shape != (chains,):
                raise ShardError(f"Shard {name!r} replied with a malformed partial sum.")
            sums += part_sums
            counts += part_counts
        # Every shard answered: the step's points are journaled before its noise is drawn.
        if known is None:
            self.journal.add({"run": self.run, "step": step, "digest": step_digest})
        noise = keyed_noise(self._secret, key, step_digest)
        for c in range(chains):
            # On their grids, as an owner's (pymc_penalty.privacy.precision): the noisy sum on
            # the grid of its noise sd (the pool returns it), the count on the integers.
            sums[c] = snap_noisy(sums[c] + sigma[c] * noise.standard_normal(), sigma[c])
            z = noise.standard_normal()
            counts[c] = snap_count(counts[c] + count_sd * z) if np.isfinite(count_sd) else np.nan
        return sums[None, :], counts[None, :]

    def warm_statistics(self, neighbours: Neighbours, d: int) -> SummedStatistics:
        """The private warm start's reads of the whole table: every shard's exact sums
        (:meth:`~pymc_penalty.distributed._service.ShardService.warm_statistic`, pairs within
        the shard), added here for :func:`~pymc_penalty.warmstart.warm_start_on`, which
        charges the driver's ledger for each release before it asks and adds one noise to the
        total. A shard's reply is a ``(d, d)`` matrix, a ``(d,)`` vector or a number, whatever
        its rows; any other reply stops the run (:class:`ShardError`).

        Parameters
        ----------
        neighbours : Neighbours
        d : int
            The number of parameters.

        Returns
        -------
        SummedStatistics
        """
        shapes = {"rows": (), "outer": (d, d), "log_scale": (), "gradient": (d,), "count": ()}

        def ask(name: str, args: tuple) -> list:
            what = f"compute the warm start's {name.replace('_', ' ')}"
            replies = list(
                self._ask_all(
                    what, lambda _, actor: actor.warm_statistic(name, args, neighbours.value)
                )
            )
            if name == "forget":
                return [None for _ in replies]
            for shard, reply in replies:
                if np.shape(reply) != shapes[name]:
                    raise ShardError(f"Shard {shard!r} replied with a malformed warm-start sum.")
            return [reply for _, reply in replies]

        return SummedStatistics(ask, len(self.names), neighbours)

    def taylor_statistics(self) -> SummedTaylorTerms:
        """The Taylor one-shot's reads of the whole table: every shard's exact sums
        (:meth:`~pymc_penalty.distributed._service.ShardService.taylor_statistic`), added
        here for :func:`~pymc_penalty.warmstart.taylor.taylor_oneshot_on`, which charges the
        driver's ledger for each release before it asks and adds one noise to the total. A
        shard's reply is a histogram of the public edges' length or the ``k`` or
        ``k + k (k + 1) / 2`` packed clipped sums, whatever its rows; any other reply stops
        the run (:class:`ShardError`).

        Returns
        -------
        SummedTaylorTerms
        """

        def shape(name: str, args: tuple) -> tuple[int]:
            if name == "clipped_sums":
                e = args[0]
                k = int(np.shape(e.L)[0])
                return (k + k * (k + 1) // 2,) if e.order == 2 else (k,)
            return (len(args[-1]) + 1,)  # the counts of the public edges' bins

        def ask(name: str, args: tuple) -> list:
            what = f"compute the Taylor one-shot's {name.replace('_', ' ')}"
            replies = list(self._ask_all(what, lambda _, actor: actor.taylor_statistic(name, args)))
            if name == "forget":
                return [None for _ in replies]
            for shard, reply in replies:
                if np.shape(reply) != shape(name, args):
                    raise ShardError(f"Shard {shard!r} replied with a malformed Taylor sum.")
            return [reply for _, reply in replies]

        return SummedTaylorTerms(ask)

    def taylor_control(self, e: Any, c_g: float, c_H: float | None) -> None:
        """Make every shard hold the likelihood of its rows' residuals after their clipped
        Taylor model at the public expansion ``e`` (a
        :class:`~pymc_penalty.warmstart.taylor_terms.Expansion`) and clips ``c_g``, ``c_H``
        (the one-shot's): :meth:`release` with ``residual=True`` then releases the Taylor
        path's steps. Reads the rows (their Taylor terms, where a shard no longer holds the
        one-shot's) but releases nothing: each shard answers its name."""
        for name, reply in self._ask_all(
            "compile its Taylor residuals",
            lambda _, actor: actor.taylor_control(e, c_g, c_H),
        ):
            if reply != name:
                raise ShardError(f"Shard {name!r} replied with something other than its name.")

    def computed(self) -> dict[str, dict[str, int]]:
        """Per shard, how many times its worker computed each step id (a measurement of
        re-executed calls: 1 everywhere when nothing was retried)."""
        return dict(self._ask_all("report", lambda _, actor: actor.computed()))

    def _spent_text(self, exclude: str) -> str:
        return "No partial sum of this step was released (the noise is added once all answer)."


def driver_secret(ledger_path: str | os.PathLike[str] | None) -> bytes:
    """The key of the driver's noise: kept beside a persistent ledger (``<path>.key``, so a
    resumed run re-adds the identical noise), else fresh from OS entropy."""
    if ledger_path is None:
        return secrets.token_bytes(32)
    return load_secret(Path(str(ledger_path) + ".key"))
