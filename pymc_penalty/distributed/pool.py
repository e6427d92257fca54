"""The driver's side: owners, where they run, and calls that never retry silently.

:class:`Owner` names a data owner, its loader and its budget. :class:`OwnerPool` starts one
:class:`~pymc_penalty.distributed._service.OwnerService` per owner as a Dask actor (on a
``LocalCluster`` with one worker process per owner by default, or on a cluster you name),
ships the model without rows, and asks every owner for its releases, all chains of a step in
one call per owner. Every call has a timeout; a lost or hung owner stops the run with
:class:`OwnerError`, which names the owner and what every owner has spent. Dask's own retries
are off: a step is never re-run behind the caller's back (a retry by the caller returns the
identical release, see the service).

Dask decides where the rows sit, not who may read them: anyone who can submit work to the
cluster (``client.run``) can read an actor's memory. See the trust model in the docs.
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import cloudpickle
import numpy as np
import pymc as pm

from pymc_penalty.accounting.sensitivity import Neighbours
from pymc_penalty.errors import OwnerError
from pymc_penalty.privacy.budget import PrivacyBudget

__all__ = ["ActorPool", "ActorSpec", "Owner", "OwnerError", "OwnerPool"]

#: Seconds a call may take before its owner counts as lost (set per pool).
DEFAULT_TIMEOUT = 60.0
#: Seconds an owner may take to load its rows and compile (at least the call timeout).
START_TIMEOUT = 300.0


@dataclass(frozen=True)
class Owner:
    """A data owner: its name, where its rows come from, and its own budget.

    Parameters
    ----------
    name : str
        A non-empty name, unique in the run.
    loader : callable or path
        Runs on the owner's worker, never in the driver: a callable returning
        ``{pm.Data container name: array}`` (the owner's rows), or the path of an ``.npz``
        file with arrays so named (the path is read on the owner's machine).
    ledger_path : str or os.PathLike
        The owner's ledger file, on the owner's machine; its noise key and step journal are
        kept beside it. Reuse it to resume a run: nothing is charged twice or forgotten.
    epsilon, delta : float
        The owner's own budget (Gaussian DP, converted to mu).
    neighbours : {"substitute", "add_remove"}, default "substitute"
        The neighbour relation the owner protects. The owner checks every release's declared
        cost against its noise under this relation and refuses one that costs more than
        declared.
    reserve_fraction : float, default 0.05
        Share of the owner's uncommitted budget its ledger reserves at a time (see
        :class:`~pymc_penalty.PrivacyLedger`): a release served from the reservation needs no
        write to disk. A killed owner's unused reservation stays counted as spent (never
        less than what it released); ``0`` writes, and syncs, every charge.
    """

    name: str
    loader: Callable[[], Mapping[str, Any]] | str | os.PathLike
    ledger_path: str | os.PathLike
    epsilon: float
    delta: float
    reserve_fraction: float = 0.05
    neighbours: str = "substitute"
    budget_mu: float = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError("`name` must be a non-empty string.")
        if not (callable(self.loader) or isinstance(self.loader, str | os.PathLike)):
            raise ValueError(f"Owner {self.name!r}: `loader` must be a callable or a path.")
        if not isinstance(self.ledger_path, str | os.PathLike) or not str(self.ledger_path):
            raise ValueError(f"Owner {self.name!r}: `ledger_path` must be a file path.")
        Neighbours.parse(self.neighbours)  # ValueError naming the choices
        rf = self.reserve_fraction
        if isinstance(rf, bool) or not isinstance(rf, int | float) or not 0.0 <= rf <= 1.0:
            raise ValueError(f"Owner {self.name!r}: `reserve_fraction` must be in [0, 1].")
        budget = PrivacyBudget(self.epsilon, self.delta)  # validates both
        object.__setattr__(self, "budget_mu", budget.mu)


def _connect(cluster: Any, n_workers: int, error: type[Exception] = OwnerError) -> tuple[Any, Any]:
    """A client (and the LocalCluster it owns, or None); ``error`` when no scheduler
    answers."""
    try:
        import dask
        from distributed import Client, LocalCluster
    except ImportError as exc:  # pragma: no cover - the extra is part of the test extra
        raise ImportError(
            "pymc_penalty.distributed needs Dask distributed: pip install "
            "'pymc-penalty[distributed]'"
        ) from exc
    # A lost task is never re-run on another worker: that would be a second release.
    dask.config.set({"distributed.scheduler.allowed-failures": 0})
    if cluster is None:
        local = LocalCluster(
            n_workers=n_workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=50,
        )
        return Client(local, set_as_default=False), local
    if isinstance(cluster, Client):
        return cluster, None
    if isinstance(cluster, str):
        try:
            return Client(cluster, timeout="10s", set_as_default=False), None
        except OSError:
            raise error(f"No Dask scheduler answered at `cluster`={cluster!r}.") from None
    raise ValueError("`cluster` must be None (a LocalCluster), a scheduler address or a Client.")


class ActorSpec(NamedTuple):
    """One party's actor, as :meth:`ActorPool._start` starts it."""

    #: The party's loader (it runs on the worker).
    loader: Any
    #: The arguments its service takes after the loader (before the driver's pid).
    extra: tuple[Any, ...]
    #: The prefix of its Dask task key (the run id follows).
    key: str
    #: Where it may run: ``client.submit``'s placement arguments.
    where: dict[str, Any]


class ActorPool:
    """Actors on Dask workers, one per party (an owner, or a shard), and calls to them that
    never retry silently: every call has a timeout, and a lost, hung or failing actor raises
    :attr:`error` naming it (:meth:`_answer`, :meth:`_call`, :meth:`_ask_all`). Subclasses
    start their actors with :meth:`_start` and say what was spent in :meth:`_spent_text`.

    Parameters
    ----------
    names : sequence of str
        The parties' names, in the order of their actors (:attr:`names`).
    cluster, timeout, run
        As :class:`OwnerPool`.
    n_workers : int
        Worker processes of a LocalCluster started for ``cluster=None``.
    """

    #: How messages name a party.
    kind = "Owner"
    #: The error a lost or failing party raises.
    error: type[OwnerError] = OwnerError

    def __init__(
        self, names: Sequence[str], cluster: Any, n_workers: int, timeout: float, run: str | None
    ) -> None:
        if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
            raise ValueError("`timeout` must be a positive number of seconds.")
        #: The parties' names, in the order of their actors.
        self.names = list(names)
        self.timeout = float(timeout)
        #: Loading the rows and compiling on the worker may take longer than a step.
        self.start_timeout = max(self.timeout, START_TIMEOUT)
        self.run = run or uuid.uuid4().hex
        self._step = 0
        self._actors: list[Any] = []
        self.client, self._cluster = _connect(cluster, n_workers, self.error)

    def _start(
        self,
        service: type,
        model: pm.Model,
        value_vars: Sequence[Any],
        point: Mapping[str, np.ndarray],
        compile_kwargs: dict[str, Any] | None,
        specs: Sequence[ActorSpec],
    ) -> list[Any]:
        """Start one ``service`` actor per party (``specs``, in the order of :attr:`names`)
        and wait for each to load its rows; on failure close and raise.

        The model travels pickled, without rows. Each actor is created on its worker as
        ``service(name, model_bytes, value_names, point, loader, *extra, driver_pid,
        compile_kwargs)``.
        """
        model_bytes = cloudpickle.dumps(model)
        value_names = [v.name for v in value_vars]
        point = {k: np.asarray(v) for k, v in point.items()}
        futures = [
            self.client.submit(
                service,
                name,
                model_bytes,
                value_names,
                point,
                spec.loader,
                *spec.extra,
                os.getpid(),
                compile_kwargs,
                actor=True,
                pure=False,
                key=f"{spec.key}-{self.run}",
                **spec.where,
            )
            for name, spec in zip(self.names, specs, strict=True)
        ]
        try:
            for name, fut in zip(self.names, futures, strict=True):
                with self.client.as_current():  # the actor handle binds to this client
                    actor = self._answer(name, fut, "start", self.start_timeout)
                self._answer(name, actor.ready(), "load its rows", self.start_timeout)
                self._actors.append(actor)
        except BaseException:
            self.close()
            raise
        return self._actors

    def _next_step(self, step: int | None) -> int:
        """The step id of a call: ``step``, or the next one; later default ids follow it."""
        step = self._step if step is None else int(step)
        self._step = max(self._step, step + 1)
        return step

    def _ask_all(self, what: str, send: Callable[[int, Any], Any]) -> Iterator[tuple[str, Any]]:
        """Send one call to every actor (``send(k, actor)`` for the k-th), all before any
        answer is awaited, then give each party's name and answer in order, each awaited when
        it is reached (:meth:`_answer`: the first that fails raises :attr:`error`)."""
        calls = [
            self._call(name, what, lambda k=k, actor=actor: send(k, actor))
            for k, (name, actor) in enumerate(zip(self.names, self._actors, strict=True))
        ]
        return (
            (name, self._answer(name, call, what))
            for name, call in zip(self.names, calls, strict=True)
        )

    def _answer(self, name: str, future: Any, what: str, timeout: float | None = None) -> Any:
        """A call's result within the timeout, or :attr:`error` naming the party."""
        timeout = self.timeout if timeout is None else timeout
        try:
            return future.result(timeout=timeout)
        except TimeoutError:
            raise self.error(
                f"{self.kind} {name!r} did not {what} within {timeout:g} s (lost or "
                f"hung); the run stops. {self._spent_text(exclude=name)}"
            ) from None
        except OwnerError:
            raise
        except Exception as exc:  # noqa: BLE001 - the worker's messages may quote data
            reason = str(exc) if type(exc).__name__ == "OwnerSideError" else type(exc).__name__
            raise self.error(
                f"{self.kind} {name!r} failed to {what} ({reason}); the run stops. "
                f"{self._spent_text(exclude=name)}"
            ) from None

    def _call(self, name: str, what: str, send: Callable[[], Any]) -> Any:
        """Send a call; an actor whose worker is already known lost raises :attr:`error`."""
        try:
            return send()
        except Exception as exc:  # noqa: BLE001 - Dask raises RuntimeError for a lost actor
            raise self.error(
                f"{self.kind} {name!r} failed to {what} ({type(exc).__name__}: its worker is "
                f"lost); the run stops. {self._spent_text(exclude=name)}"
            ) from None

    def _spent_text(self, exclude: str) -> str:  # pragma: no cover - overridden
        return ""

    def close(self) -> None:
        """Drop the actors and, if this pool started it, the LocalCluster."""
        self._actors = []
        if self._cluster is not None:
            self.client.close()
            self._cluster.close()
            self._cluster = None

    def __enter__(self) -> ActorPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class OwnerPool(ActorPool):
    """One actor per owner, holding its rows; releases asked for all chains at once.

    Parameters
    ----------
    owners : sequence of Owner
    model : pm.Model
        The model, with placeholder ``pm.Data`` containers (the right number of columns,
        any number of rows): it travels to the owners without rows.
    value_vars : sequence of Variable
        The value variables of the raveled parameter vector.
    point : dict
        A point giving their shapes.
    cluster : None, str or distributed.Client
        ``None`` starts a ``LocalCluster`` with one worker process per owner, each owner
        pinned to its own worker. A scheduler address or a ``Client`` uses that cluster; its
        workers must offer a resource ``owner-<name>`` for each owner (``dask worker ...
        --resources owner-<name>=1``), which pins the owner to them.
    timeout : float, default 60
        Seconds a call may take before the owner counts as lost (starting an owner, which
        loads its rows and compiles, may take up to ``max(timeout, 300)``).
    compile_kwargs : dict, optional
        Passed to each owner's compiled likelihood.
    run : str, optional
        The run id of the step ids (a fresh one by default; reuse it to resume a run).
    """

    def __init__(
        self,
        owners: Sequence[Owner],
        model: pm.Model,
        value_vars: Sequence[Any],
        point: Mapping[str, np.ndarray],
        *,
        cluster: Any = None,
        timeout: float = DEFAULT_TIMEOUT,
        compile_kwargs: dict[str, Any] | None = None,
        run: str | None = None,
    ) -> None:
        owners = list(owners)
        if not owners or not all(isinstance(o, Owner) for o in owners):
            raise ValueError("`owners` must be a non-empty sequence of pymc_penalty Owner.")
        names = [o.name for o in owners]
        if len(set(names)) != len(names):
            raise ValueError("`owners` must have distinct names.")
        self.owners = owners
        super().__init__(names, cluster, len(owners), timeout, run)
        workers = list(self.client.scheduler_info()["workers"]) if self._cluster else []
        specs = [
            ActorSpec(
                owner.loader,
                (
                    str(owner.ledger_path),
                    owner.budget_mu,
                    float(owner.reserve_fraction),
                    Neighbours.parse(owner.neighbours).factor,
                ),
                f"owner-{owner.name}",
                {"workers": [workers[k]], "allow_other_workers": False}
                if self._cluster is not None
                else {"resources": {f"owner-{owner.name}": 1}},
            )
            for k, owner in enumerate(owners)
        ]
        self._start(_service_class(), model, value_vars, point, compile_kwargs, specs)

    # --- calls -----------------------------------------------------------------------

    def release(
        self,
        x0s: np.ndarray,
        x1s: np.ndarray,
        bounds: np.ndarray,
        sigmas: np.ndarray,
        count_sds: np.ndarray,
        mu2: np.ndarray,
        step: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """Every owner's release for every chain of one step.

        Parameters
        ----------
        x0s, x1s : ndarray, shape (chains, d)
            Current points and proposals.
        bounds : ndarray, shape (chains,)
            Clip bounds.
        sigmas : ndarray, shape (owners,) or (owners, chains)
            Each owner's noise sd for its clipped sum (per chain, or one for all chains).
        count_sds : ndarray, shape (owners,)
            Each owner's noise sd for its clip count (``inf``: none).
        mu2 : ndarray, shape (owners, chains)
            What each release costs each owner (charged on the owner's side first).
        step : int, optional
            The step id (the next one by default). Giving a step already released, with the
            same points, returns the identical values; with other points it is refused.

        Returns
        -------
        (sums, counts) : ndarrays of shape (owners, chains), or None
            None when an owner's budget could not pay (nothing is released then by it).
        """
        step = self._next_step(step)
        sigmas = np.asarray(sigmas, dtype=np.float64)
        if sigmas.ndim == 1:
            sigmas = sigmas[:, None]
        sigmas = np.broadcast_to(sigmas, (len(self._actors), np.atleast_2d(x0s).shape[0]))
        replies = [
            reply
            for _, reply in self._ask_all(
                f"release step {step}",
                lambda k, actor: actor.release(
                    self.run, step, x0s, x1s, bounds, sigmas[k].copy(), float(count_sds[k]), mu2[k]
                ),
            )
        ]
        if not all(r["released"] for r in replies):
            return None
        return np.stack([r["sums"] for r in replies]), np.stack([r["counts"] for r in replies])

    def spent(self) -> dict[str, dict[str, float]]:
        """Each owner's ledger as the owner reports it."""
        return dict(self._ask_all("report its ledger", lambda _, actor: actor.spent()))

    def _spent_text(self, exclude: str) -> str:
        parts = []
        # While the pool starts, the owners after the failing one have no actor yet.
        for owner, actor in zip(self.owners, self._actors, strict=False):
            if owner.name == exclude:
                parts.append(f"{owner.name}: unknown (see its ledger file)")
                continue
            try:
                s = actor.spent().result(timeout=min(self.timeout, 5.0))
                parts.append(f"{owner.name}: mu^2 {s['spent_mu2']:.4g} in {s['releases']}")
            except Exception:  # noqa: BLE001
                parts.append(f"{owner.name}: unknown (see its ledger file)")
        return "Spent per owner: " + ("; ".join(parts) if parts else "none started") + "."


def _service_class() -> type:
    from pymc_penalty.distributed._service import OwnerService

    return OwnerService
