"""The owner's side: what runs in an owner's worker process, next to its rows.

An :class:`OwnerService` is created on the owner's worker (as a Dask actor). It loads the
owner's rows there, with the owner's loader, fills the model's ``pm.Data`` containers with
them and compiles the likelihood on the worker: the model travels without rows and the rows
never leave. Per release it

1. checks the step id (``(run, step)``, strictly increasing per run) against its journal,
   re-read from the file under the journal's lock (so every service on one owner ledger, and
   every driver talking to them, sees the others' steps): a retried id with the same request
   returns the identical value without a new charge; the same id with another request is
   refused;
2. charges its own ledger (a file on the owner's side) for every chain of the call *before*
   it reads a row, and journals the id, still under the journal's lock;
3. releases, per chain, its clipped sum plus Gaussian noise and, where asked, its clip count
   plus noise, each on its published grid (:mod:`pymc_penalty.privacy.precision`: the sum on
   the grid of its noise sd, the count on the integers). Nothing else leaves: not the
   per-row values, not the row count, not a noisy value at full precision.

The noise comes from a counter-based generator keyed by the owner's secret and the digest of
the *whole request* (run, step, points, bounds, noise sds, declared costs), not by the step id
alone. Two different requests therefore never share noise, whatever the journal says (a line
lost to a crash, a second service that has not read it yet): the difference of two releases
always carries the noise of both. An identical request gets the identical value, which
reveals nothing new; every distinct request was charged when it was first journaled.

The secret and the journal live beside the ledger file, so a restarted owner keeps them: a
resumed run neither charges completed steps twice nor forgets them.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import secrets
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pymc as pm

from pymc_penalty.accounting.sensitivity import Neighbours
from pymc_penalty.errors import OwnerSideError
from pymc_penalty.model.likelihood import PenaltyLikelihood
from pymc_penalty.privacy.ledger import PrivacyLedger
from pymc_penalty.privacy.precision import snap_count, snap_noisy
from pymc_penalty.warmstart import per_datapoint_gradients
from pymc_penalty.warmstart.statistics import STATISTICS, RowGradients
from pymc_penalty.warmstart.taylor_terms import TAYLOR_STATISTICS, Expansion, RowTaylorTerms

__all__ = [
    "OwnerService",
    "OwnerSideError",
    "RowsService",
    "ShardService",
    "digest",
    "keyed_noise",
    "load_rows",
    "load_secret",
]


def load_rows(
    loader: Callable[[], Mapping[str, Any]] | str | os.PathLike | Mapping[str, Any],
) -> dict[str, Any]:
    """Run an owner's loader: a callable returning ``{container name: array}``, or the path
    of an ``.npz`` file whose arrays are named after the model's ``pm.Data`` containers, or
    (a shard of a Dask collection) that mapping itself, already computed on this worker."""
    if callable(loader):
        rows = loader()
    elif isinstance(loader, Mapping):
        rows = loader
    else:
        path = Path(loader)
        if path.suffix != ".npz":
            raise OwnerSideError("A loader path must name an .npz file of named arrays.")
        with np.load(path, allow_pickle=False) as npz:
            rows = {name: npz[name] for name in npz.files}
    if not isinstance(rows, Mapping) or not rows:
        raise OwnerSideError("The loader must return a non-empty mapping of container names.")
    return {str(k): np.asarray(v) for k, v in rows.items()}


def load_secret(path: Path) -> bytes:
    """A noise key, created once from OS entropy and kept beside its ledger (an owner's, or
    the driver's of a sharded run)."""
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
            f.flush()
            os.fsync(f.fileno())
    return path.read_bytes()


def digest(*arrays: np.ndarray) -> str:
    """A request's identity: the digest of its points, bounds and noise (public inputs)."""
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        a = np.ascontiguousarray(a, dtype=np.float64)
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


class RowsService:
    """Rows loaded on this worker, the model compiled on them, and the per-chain cache.

    What an owner and a shard share: the loader runs here (never in the driver), its arrays
    fill the model's ``pm.Data`` containers after checks that name the array but never a
    value or a row count, and :meth:`clipped_sums` returns every chain's exact clipped sum
    and clip count. Those are exact and data-dependent: a subclass adds noise
    (:class:`OwnerService`) or returns them only to a driver that adds it
    (:class:`ShardService`).

    Parameters
    ----------
    name : str
        Its name (in messages).
    model_bytes : bytes
        The model, pickled without rows (its ``pm.Data`` containers hold placeholders).
    value_names : list of str
        Names of the value variables of the raveled parameter vector, in order.
    point : dict
        A point giving their shapes.
    loader : callable or path
        See :func:`load_rows`; it runs here, never in the driver.
    driver_pid : int
        The driver's process id: the rows are refused if this is the driver's process.
    compile_kwargs : dict, optional
    """

    #: How messages call it.
    kind = "Owner"

    def __init__(
        self,
        name: str,
        model_bytes: bytes,
        value_names: list[str],
        point: dict[str, np.ndarray],
        loader: Any,
        driver_pid: int,
        compile_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if os.getpid() == driver_pid:
            raise OwnerSideError(
                f"{self.kind} {name!r}: its rows would load in the driver's process."
            )
        self.name = name
        model = cloudpickle.loads(model_bytes)
        containers = {v.name: v for v in model.data_vars}
        rows = load_rows(loader)
        unknown = sorted(set(rows) - set(containers))
        if unknown:
            raise OwnerSideError(
                f"{self.kind} {name!r}: the loader returned {unknown}, which are not pm.Data "
                f"containers of the model (it has {sorted(containers)})."
            )
        lengths = set()
        for key, value in rows.items():
            placeholder = containers[key].get_value(borrow=True)
            if value.ndim != placeholder.ndim or value.shape[1:] != placeholder.shape[1:]:
                raise OwnerSideError(
                    f"{self.kind} {name!r}: array {key!r} must have the placeholder's trailing "
                    f"shape {placeholder.shape[1:]} (columns); it differs."
                )
            # NaN or inf is not refused (issue 28: a refusal would tell the driver, for free,
            # that a record is invalid): the row's ratio adds 0 and counts as clipped.
            lengths.add(value.shape[0] if value.ndim else 1)
        if len(lengths) != 1 or 0 in lengths:
            # Row counts are not printed: under add/remove-one neighbours they are private.
            raise OwnerSideError(
                f"{self.kind} {name!r}: the loader's arrays must share one positive number of rows."
            )
        with model:
            pm.set_data(rows)
        by_name = {v.name: v for v in model.value_vars}
        value_vars = [by_name[v] for v in value_names]
        self._model = model
        self._compiled = (value_vars, point, compile_kwargs)  # to compile it again
        self._lik = PenaltyLikelihood(model, value_vars, point, compile_kwargs)
        self._n = lengths.pop()
        self._cache: dict[int, dict[bytes, np.ndarray]] = {}

    def ready(self) -> str:
        """Its name, once its rows are loaded and its likelihood compiled."""
        return self.name

    def clipped_sums(
        self,
        x0s: np.ndarray,
        x1s: np.ndarray,
        bounds: np.ndarray,
        lik: PenaltyLikelihood | None = None,
        cache: dict[int, dict[bytes, np.ndarray]] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Every chain's exact clipped sum and clip count (data-dependent: never returned to
        a caller by this class; the budget must be committed before it is called), of the
        rows' log-likelihood ratios, or of ``lik``'s per-row values (with ``cache``: the
        rows' residuals of a :class:`ShardService`'s Taylor model)."""
        lik = self._lik if lik is None else lik
        cache = self._cache if cache is None else cache
        chains = x0s.shape[0]
        sums, counts = np.empty(chains), np.empty(chains)
        for c in range(chains):
            ll0 = self._terms(c, x0s[c], lik, cache)
            ll1, clipped_sum, n_clipped, _ = lik.evaluate(x1s[c], ll0, float(bounds[c]))
            cache[c] = {x0s[c].tobytes(): ll0, x1s[c].tobytes(): ll1}
            sums[c], counts[c] = clipped_sum, n_clipped
        return sums, counts

    def _terms(
        self,
        chain: int,
        x: np.ndarray,
        lik: PenaltyLikelihood,
        cache: dict[int, dict[bytes, np.ndarray]],
    ) -> np.ndarray:
        """Per-row terms at a chain's current point: from the cache (the last call's current
        point or proposal, whichever was accepted), else computed."""
        cached = cache.get(chain, {}).get(x.tobytes())
        if cached is not None:
            return cached
        x = np.asarray(x, dtype=lik.input_dtype)
        return lik.initial(x, self._n)[0]


def points(x0s: Any, x1s: Any) -> tuple[np.ndarray, np.ndarray]:
    """Own, writeable, aligned copies: arrays deserialised from a message may be views of a
    read-only buffer, which the compiled function refuses."""
    return (
        np.array(np.atleast_2d(x0s), dtype=np.float64, order="C"),
        np.array(np.atleast_2d(x1s), dtype=np.float64, order="C"),
    )


class OwnerService(RowsService):
    """One data owner's releases, run in the owner's worker process.

    Parameters
    ----------
    name, model_bytes, value_names, point, loader
        As :class:`RowsService` (``name`` is the owner's).
    ledger_path : str
        The owner's ledger file (the secret and the journal are kept beside it).
    budget_mu : float
        The owner's Gaussian-DP budget.
    reserve_fraction : float
        Its ledger's reservation share (see :class:`~pymc_penalty.PrivacyLedger`).
    factor : float
        The sensitivity of the owner's clipped sum in units of the bound (2 under the owner's
        substitute-one relation, 1 under add/remove-one): the owner's own check of what a
        release's noise costs.
    driver_pid, compile_kwargs
        As :class:`RowsService`.
    """

    def __init__(
        self,
        name: str,
        model_bytes: bytes,
        value_names: list[str],
        point: dict[str, np.ndarray],
        loader: Any,
        ledger_path: str,
        budget_mu: float,
        reserve_fraction: float,
        factor: float,
        driver_pid: int,
        compile_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(name, model_bytes, value_names, point, loader, driver_pid, compile_kwargs)
        self._factor = float(factor)
        ledger = Path(ledger_path)
        self._ledger = (
            PrivacyLedger.open(ledger, reserve_fraction=reserve_fraction)
            if ledger.exists()
            else PrivacyLedger(budget_mu, ledger, reserve_fraction=reserve_fraction)
        )
        self._secret = load_secret(ledger.with_name(ledger.name + ".key"))
        self._journal_path = ledger.with_name(ledger.name + ".journal")
        self._journal: dict[tuple[str, int], str] = {}
        self._last: dict[str, int] = {}
        self._journal_read = 0  # bytes of the journal file read into the two dicts above
        with self._journal_locked() as fd:
            self._read_journal(fd)

    # --- what the driver may ask -------------------------------------------------------

    def spent(self) -> dict[str, float]:
        """The owner's own ledger: budget, spent and releases (public figures); its unused
        reservation is returned first, so the figures are exact."""
        self._ledger.release_unused()
        return {
            "budget_mu": self._ledger.budget_mu,
            "spent_mu2": self._ledger.spent_mu2,
            "releases": self._ledger.releases,
        }

    def release(
        self,
        run: str,
        step: int,
        x0s: np.ndarray,
        x1s: np.ndarray,
        bounds: np.ndarray,
        sigma: np.ndarray | float,
        count_sd: float,
        mu2: np.ndarray,
    ) -> dict[str, Any]:
        """Release every chain's noisy clipped sum (and clip count) for step ``(run, step)``.

        ``sigma`` is the noise sd of the clipped sum, one per chain (or one for all).
        Returns ``{"released": bool, "sums": (chains,), "counts": (chains,)}``; ``released``
        is False (and nothing is computed) when the owner's budget cannot pay.
        """
        x0s, x1s = points(x0s, x1s)
        bounds, mu2 = np.atleast_1d(bounds), np.atleast_1d(mu2)
        sigmas = np.broadcast_to(np.asarray(sigma, dtype=np.float64), (x0s.shape[0],))
        step_digest = digest(x0s, x1s, bounds, sigmas, np.array([count_sd]), mu2)
        key = (str(run), int(step))
        # Decided and journaled under the journal's lock, after reading what other services
        # on this ledger journaled: one id is released for one request only.
        with self._journal_locked() as fd:
            self._read_journal(fd)
            retried = key in self._journal
            if retried and self._journal[key] != step_digest:
                raise OwnerSideError(
                    f"Owner {self.name!r}: step {key} was already released for other points; "
                    "a step id is used once."
                )
            if not retried:
                self._check_cost(bounds, sigmas, count_sd, mu2)
                if key[1] <= self._last.get(key[0], -1):
                    raise OwnerSideError(
                        f"Owner {self.name!r}: step ids must increase; {key} comes after "
                        f"step {self._last[key[0]]} of this run."
                    )
                if not self._ledger.try_spend(float(np.sum(mu2))):
                    return {"released": False, "sums": None, "counts": None}
                # Flushed, not synced: the charge above is what must survive (the ledger
                # syncs it). A journal line lost to a power failure makes a retry pay again,
                # and the other request it then admits gets noise of its own (see _noise).
                line = json.dumps({"run": key[0], "step": key[1], "digest": step_digest}) + "\n"
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    line = "\n" + line  # end a torn line first, so this one parses
                os.write(fd, line.encode())
                self._journal[key] = step_digest
                self._last[key[0]] = key[1]
        # The budget is committed (now or when the request was first seen): rows may be read.
        noise = self._noise(key, step_digest)
        sums, counts = self.clipped_sums(x0s, x1s, bounds)
        for c in range(x0s.shape[0]):
            # Each on its grid (pymc_penalty.privacy.precision) before it leaves the owner: the
            # sum on the grid of its noise sd, the count on the integers.
            sums[c] = snap_noisy(sums[c] + sigmas[c] * noise.standard_normal(), sigmas[c])
            z = noise.standard_normal()
            counts[c] = snap_count(counts[c] + count_sd * z) if math.isfinite(count_sd) else np.nan
        return {"released": True, "sums": sums, "counts": counts}

    # --- internals ---------------------------------------------------------------------

    def _check_cost(
        self, bounds: np.ndarray, sigmas: np.ndarray, count_sd: float, mu2: np.ndarray
    ) -> None:
        """Refuse a release whose declared cost is below what its noise costs the owner's
        rows: ``(factor * B_c / sigma_c)^2 + 1 / count_sd^2`` per chain. The owner's ledger
        then never rests on the driver's arithmetic."""
        with np.errstate(divide="ignore", invalid="ignore"):
            ll = np.where(bounds > 0, (self._factor * bounds / sigmas) ** 2, 0.0)
        count = 1.0 / count_sd**2 if math.isfinite(count_sd) else 0.0
        implied = np.nan_to_num(ll + count, nan=math.inf)
        if mu2.shape != implied.shape or np.any(mu2 < implied * (1.0 - 1e-9)):
            raise OwnerSideError(
                f"Owner {self.name!r}: a release's declared cost is below what its noise "
                "costs under the owner's neighbour relation; nothing was charged or released."
            )

    def _noise(self, key: tuple[str, int], digest: str) -> np.random.Generator:
        """A counter-based generator keyed by the owner's secret and the whole request (step
        id and request digest): an identical request draws the same noise, so its release is
        identical and reveals nothing new; any other request draws independent noise, so two
        releases never cancel each other's noise, even where the journal was lost."""
        return keyed_noise(self._secret, key, digest)

    @contextmanager
    def _journal_locked(self) -> Iterator[int]:
        """The journal file, open for appending under an exclusive ``flock`` (every service
        on this owner ledger takes it before it decides and journals a release). The ledger's
        own lock is on another file, so charging inside it cannot deadlock."""
        fd = os.open(self._journal_path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)  # also releases the flock

    def _read_journal(self, fd: int) -> None:
        """Read the journal lines written since the last read (by any service). A line that
        does not parse (torn by a crash) is skipped: it only makes a retry pay again."""
        size = os.fstat(fd).st_size
        if size <= self._journal_read:
            return
        raw = os.pread(fd, size - self._journal_read, self._journal_read)
        end = raw.rfind(b"\n") + 1  # complete lines only; a torn tail is read once completed
        for line in raw[:end].splitlines():
            try:
                entry = json.loads(line)
                key = (str(entry["run"]), int(entry["step"]))
                digest = str(entry["digest"])
            except (ValueError, KeyError, TypeError):
                continue
            self._journal[key] = digest
            self._last[key[0]] = max(self._last.get(key[0], -1), key[1])
        self._journal_read += end


def keyed_noise(secret: bytes, key: tuple[str, int], request: str) -> np.random.Generator:
    """A counter-based generator keyed by a secret, a step id ``(run, step)`` and the digest of
    the whole request: an identical request draws the same noise, so its release is identical
    and reveals nothing new; any other request draws independent noise, so two releases never
    cancel each other's noise, even where a journal was lost."""
    label = json.dumps([key[0], key[1], request]).encode()  # injective in its three parts
    h = hashlib.blake2b(label, key=secret, digest_size=16)
    return np.random.Generator(np.random.Philox(key=int.from_bytes(h.digest(), "little")))


class ShardService(RowsService):
    """One shard of a single curator's table, run in a worker process next to its rows.

    Unlike an owner it holds no ledger and adds no noise: it returns every chain's *exact*
    clipped partial sum and clip count to the driver, which sums the shards, adds one noise
    draw per release and has charged its ledger before it asked (see
    :class:`~pymc_penalty.distributed.shards.ShardPool`). Its reply is one float and one
    count per chain, whatever its number of rows. The data of the table are checked here,
    only for their shape (columns, one row count); NaN or inf is not refused (a row's ratio
    then adds 0 and counts as clipped), as for owners: a refusal would tell, for free, that a
    record is invalid.

    It counts how often each step id was computed (:meth:`computed`): a measurement of
    re-executed calls, which the driver's journal makes harmless (a step's noise is keyed by
    its id, so a recomputed step is released identically or refused).

    Its arguments are :class:`RowsService`'s.
    """

    kind = "Shard"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._computed: dict[tuple[str, int], int] = {}
        self._warm: RowGradients | None = None  # the warm start's sums over these rows
        self._taylor: RowTaylorTerms | None = None  # the Taylor one-shot's
        # The rows' residuals after the released Taylor model (taylor_control), and their
        # per-chain cache.
        self._residual: PenaltyLikelihood | None = None
        self._residual_cache: dict[int, dict[bytes, np.ndarray]] = {}

    def partial_sums(
        self,
        run: str,
        step: int,
        x0s: np.ndarray,
        x1s: np.ndarray,
        bounds: np.ndarray,
        residual: bool = False,
    ) -> dict[str, np.ndarray]:
        """Every chain's exact clipped partial sum and clip count for step ``(run, step)``:
        ``{"sums": (chains,) float64, "counts": (chains,) int64}``. The driver has committed
        the step's cost before it calls (and adds the noise). ``residual``: of the rows'
        residuals after the Taylor model of :meth:`taylor_control` (the Taylor path's step),
        not of their log-likelihood ratios."""
        x0s, x1s = points(x0s, x1s)
        key = (str(run), int(step))
        self._computed[key] = self._computed.get(key, 0) + 1
        if not residual:
            sums, counts = self.clipped_sums(x0s, x1s, np.atleast_1d(bounds))
        elif self._residual is None:
            raise OwnerSideError(f"Shard {self.name!r}: no Taylor model (taylor_control).")
        else:
            sums, counts = self.clipped_sums(
                x0s, x1s, np.atleast_1d(bounds), self._residual, self._residual_cache
            )
        return {"sums": sums, "counts": counts.astype(np.int64)}

    def taylor_control(self, e: Expansion, c_g: float, c_H: float | None) -> str:
        """Compile the likelihood of the rows' residuals after their clipped Taylor model at
        the public expansion ``e`` and clips (the one-shot's,
        :class:`~pymc_penalty.model.likelihood.RowControl`): the Taylor path's steps then ask
        :meth:`partial_sums` with ``residual=True``. The clipped coefficients are the
        one-shot's where this shard still holds them, else computed again from the rows
        (deterministic: a resumed run rebuilds the same model without a release). Nothing
        leaves: the reply is this shard's name."""
        if self._taylor is None:
            self._taylor = RowTaylorTerms(self._lik, self._n)
        e, c_g, c_H = _owned((e, float(c_g), None if c_H is None else float(c_H)))
        control = self._taylor.control(e, c_g, c_H)
        value_vars, point, compile_kwargs = self._compiled
        self._residual = PenaltyLikelihood(
            self._model, value_vars, point, compile_kwargs, control=control
        )
        self._residual_cache = {}
        return self.name

    def computed(self) -> dict[str, int]:
        """How many times each step id was computed here, ``{"run/step": times}``."""
        return {f"{run}/{step}": k for (run, step), k in self._computed.items()}

    def warm_statistic(self, name: str, args: tuple, neighbours: str) -> Any:
        """One of the warm start's exact sums over this shard's rows, for the driver's
        :class:`~pymc_penalty.warmstart.statistics.SummedStatistics` (which has charged the
        release it feeds before it asks, and adds the noise to the shards' total).

        ``name`` is one of :data:`~pymc_penalty.warmstart.statistics.STATISTICS` (with its
        arguments after the point: a ``(d, d)`` matrix, a ``(d,)`` vector or a number comes
        back), ``"rows"`` (this shard's row count: one integer) or ``"forget"`` (drop the
        per-row gradients kept for the last point). Per-row gradients are the in-process
        warm start's (:func:`~pymc_penalty.warmstart.per_datapoint_gradients`), its pairs
        formed within this shard; they never leave it."""
        relation = Neighbours.parse(neighbours)
        if self._warm is None or self._warm.neighbours is not relation:
            lik, n = self._lik, self._n
            self._warm = RowGradients(lambda at: per_datapoint_gradients(lik, at, n), n, relation)
        if name == "rows":
            return int(self._n)
        if name == "forget":
            self._warm.forget()
            return None
        if name not in STATISTICS:
            raise OwnerSideError(f"Shard {self.name!r}: no warm-start statistic {name!r}.")
        x = np.array(args[0], dtype=np.float64, order="C")  # own, writeable copies
        rest = [None if a is None else np.array(a, dtype=np.float64) for a in args[1:]]
        rest = [float(a) if a is not None and a.ndim == 0 else a for a in rest]
        return np.asarray(getattr(self._warm, name)(x, *rest), dtype=np.float64)

    def taylor_statistic(self, name: str, args: tuple) -> Any:
        """One of the Taylor one-shot's exact sums over this shard's rows, for the driver's
        :class:`~pymc_penalty.warmstart.taylor_terms.SummedTaylorTerms` (which has charged
        the release it feeds before it asks, and adds the noise to the shards' total).

        ``name`` is one of :data:`~pymc_penalty.warmstart.taylor_terms.TAYLOR_STATISTICS`
        (histogram counts of public length, or the clipped sums ``G`` and ``H`` packed: at
        most ``k + k (k + 1) / 2`` values) or ``"forget"``. The rows' Taylor terms are the
        in-process one-shot's (:class:`~pymc_penalty.warmstart.taylor_terms.RowTaylorTerms`),
        clipped here, row by row, before they are summed; they never leave this shard (the
        clipped coefficients are kept here for the chains' residuals)."""
        if self._taylor is None:
            self._taylor = RowTaylorTerms(self._lik, self._n)
        if name == "forget":
            self._taylor.forget()
            return None
        if name not in TAYLOR_STATISTICS:
            raise OwnerSideError(f"Shard {self.name!r}: no Taylor statistic {name!r}.")
        return np.asarray(getattr(self._taylor, name)(*_owned(args)), dtype=np.float64)


def _owned(value: Any) -> Any:
    """Own, writeable, aligned copies of the arrays in a message's arguments (arrays
    deserialised from a message may be views of a read-only buffer, which the compiled
    function refuses); an :class:`Expansion` stays one."""
    if isinstance(value, Expansion):
        t, L, index, order = value
        return Expansion(
            np.array(t, dtype=np.float64, order="C"),
            np.array(L, dtype=np.float64, order="C"),
            np.array(index, dtype=np.int64),
            int(order),
        )
    if isinstance(value, tuple | list):
        return type(value)(_owned(v) for v in value)
    if isinstance(value, np.ndarray):
        return np.array(value, dtype=value.dtype, order="C")
    return value
