"""A privacy ledger shared by every process of a sampling run.

Each release of the penalty algorithm is a Gaussian mechanism with privacy cost
``mu_t**2 = (Delta_t / sigma_t)**2``. Adaptive composition of Gaussian mechanisms is exactly
``mu``-GDP with ``mu = sqrt(sum_t mu_t**2)``, so a run respects a budget ``mu`` as long as the
sum of the committed ``mu_t**2`` never exceeds ``mu**2`` (a GDP privacy filter).
:class:`PrivacyLedger` keeps that sum in a small file so that all chains count against one
budget, whether PyMC runs them sequentially in one process or in worker processes started by
``fork``, ``forkserver`` or ``spawn``.

Guarantees
----------
- :meth:`PrivacyLedger.try_spend` commits the cost of a release *before* the caller touches
  the data, and refuses (committing nothing) when the total would exceed the budget.
- Accounting is exact integer arithmetic in units of ``2**-62`` of the budget's binade. The
  budget is ``budget_mu**2`` rounded down to a float (53 significant bits, so that
  :attr:`PrivacyLedger.budget_mu2` is exact), a relative loss below ``2**-52``; each release
  costs ``mu2`` rounded up to a whole unit (relative to the budget below ``2**-60``, and
  nothing for any ``mu2`` of at least ``2**-8 * budget_mu**2``). Rounding can thus refuse a
  release that fits only to within that tolerance, and never grants one that does not fit:
  the exact sum of the granted ``mu2`` never exceeds the exact ``budget_mu**2``.
- The file is updated under an exclusive ``flock`` and is crash-safe: it holds two checksummed
  copies of the state and each update overwrites the older one, so a process killed at any
  instant (SIGKILL included) leaves a readable file. A grant is handed out only after the
  reservation that covers it is in the file, so the file never shows less than was granted.
- To keep the cost per release small, each process reserves a chunk of the budget
  (``reserve_fraction`` of what is uncommitted, never less than the release at hand, so near
  the end exactly what is needed) and serves releases from it in memory. Reserved but unused
  budget counts as spent until it is returned with :meth:`PrivacyLedger.release_unused`, which
  also runs at process exit (in ``multiprocessing`` workers too) and when the ledger is garbage
  collected. A process that is killed keeps its reservation counted as spent: conservative.
- A child created by ``fork`` does not inherit the parent's chunk: the ledger notices the new
  process id and starts from an empty chunk, leaving the parent's reservation to the parent.
  Pickling carries only the file's path and the settings.

Layout: the units and the file format are in :mod:`pymc_penalty.privacy.ledger.store`, the process
hooks (fork, exit) in :mod:`pymc_penalty.privacy.ledger.hooks`, installed when the first ledger of a
process is set up (importing this module has no side effects), and what a ledger reports
(budget, spent, snapshot) in :mod:`pymc_penalty.privacy.ledger.readout`. This module is the filter
itself: granting, reserving and returning budget.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from pymc_penalty.privacy.ledger import hooks as _hooks
from pymc_penalty.privacy.ledger.hooks import _at_exit as _at_exit
from pymc_penalty.privacy.ledger.readout import _LedgerReadout
from pymc_penalty.privacy.ledger.store import (
    UNIT_BITS,
    _bad_mu2,
    _budget_units,
    _check_budget_mu,
    _check_reserve_fraction,
    _create_file,
    _normalise_path,
    _read_fd,
    _read_path,
    _State,
    _unit_shift,
    _units_to_float,
    _write_fd,
)

__all__ = ["DEFAULT_RESERVE_FRACTION", "PrivacyLedger"]

DEFAULT_RESERVE_FRACTION = 0.05
"""Default share of the uncommitted budget that one process reserves at a time."""

_INF = math.inf
_ldexp = math.ldexp
_ceil = math.ceil
_TEMP_FILE_NAME = "ledger.bin"


# --------------------------------------------------------------------------------------------
# The ledger.
# --------------------------------------------------------------------------------------------


class PrivacyLedger(_LedgerReadout):
    """Gaussian-DP budget shared by all chains and processes of a run (a privacy filter).

    Parameters
    ----------
    budget_mu : float
        Total Gaussian-DP parameter ``mu`` of the run, in ``[0, 1e150]``. The ledger grants
        releases while the sum of their ``mu_t**2`` stays within ``budget_mu**2``.
    path : str or os.PathLike, optional
        Ledger file. With ``None`` (the default) a private file is created in a fresh temporary
        directory, removed when the creating process exits; every process that receives the
        ledger (forked, or unpickled after ``spawn``/``forkserver``) shares it. With a path the
        ledger is persistent: successive analyses of one dataset that pass the same path share
        one budget. The file is created if it does not exist; an existing file must have been
        created with exactly the same ``budget_mu`` (a persistent budget cannot be changed), or
        a ValueError is raised: use :meth:`open` to continue with the stored budget.
    reserve_fraction : float, default 0.05
        Share, in ``[0, 1]``, of the uncommitted budget that this process reserves when its
        local chunk runs out (never less than the release at hand). Larger values touch the
        file less often; smaller values strand less budget in other processes' chunks near the
        end. ``0`` reserves exactly one release at a time.
    durable : bool, optional
        Whether to ``fdatasync`` the file after each update so that the state also survives a
        power failure or kernel crash (a killed process needs no sync). Defaults to True for a
        user path and False for the temporary file of ``path=None``, which does not outlive the
        run.

    Raises
    ------
    ValueError
        If ``budget_mu`` or ``reserve_fraction`` is out of range, if the existing file at
        ``path`` is not a ledger, or if it was created with a different budget.

    Notes
    -----
    Accounting is exact in integer units of ``2**-shift`` with ``budget_mu**2 < 2**(62 -
    shift)``. The budget is ``budget_mu**2`` rounded down to a float (:attr:`budget_mu2`) and
    each release costs ``ceil(mu2 * 2**shift)`` units, so the exact sum of granted ``mu2``
    never exceeds the exact ``budget_mu**2``, and ``spent_mu2 <= budget_mu2 <= budget_mu**2``
    holds for the floats reported.

    The read-side properties (:attr:`spent_mu2`, :attr:`used_mu2`, :attr:`releases`, ...) read
    the file, so they see all processes. :attr:`used_mu2` and :attr:`releases` count another
    process's releases once that process reserves its next chunk or returns its chunk; those of
    a killed process remain counted in :attr:`spent_mu2` only.

    Examples
    --------
    >>> ledger = PrivacyLedger(1.0)
    >>> ledger.try_spend(0.25)
    True
    >>> ledger.try_spend(0.8)
    False
    >>> ledger.releases
    1
    """

    __slots__ = (
        "__weakref__",
        "_budget_mu",
        "_budget_units",
        "_durable",
        "_left",
        "_lock",
        "_mu2_cap",
        "_path",
        "_pid",
        "_refused",
        "_reserve_fraction",
        "_shift",
        "_unflushed",
        "_unflushed_n",
    )

    def __init__(
        self,
        budget_mu: float,
        path: str | os.PathLike[str] | None = None,
        *,
        reserve_fraction: float = DEFAULT_RESERVE_FRACTION,
        durable: bool | None = None,
    ) -> None:
        budget = _check_budget_mu(budget_mu)
        fraction = _check_reserve_fraction(reserve_fraction)
        if path is None:
            directory = tempfile.mkdtemp(prefix="pymc-penalty-ledger-")
            _hooks.own_temp_dir(directory)
            file_path = os.path.join(directory, _TEMP_FILE_NAME)
            durable = False if durable is None else bool(durable)
            _create_file(file_path, budget, durable)
        else:
            file_path = _normalise_path(path)
            durable = True if durable is None else bool(durable)
            if not os.path.exists(file_path):
                _create_file(file_path, budget, durable)
            stored = _read_path(file_path).budget_mu
            if stored != budget:
                raise ValueError(
                    f"The privacy ledger {file_path!r} was created with budget_mu={stored!r}, "
                    f"not {budget!r}; a persistent budget cannot be changed. Use "
                    f"PrivacyLedger.open(path) to continue with the stored budget, or another "
                    f"path for a new budget."
                )
        self._setup(file_path, budget, fraction, durable)

    def _setup(self, path: str, budget_mu: float, reserve_fraction: float, durable: bool) -> None:
        self._path = path
        self._budget_mu = budget_mu
        self._shift = _unit_shift(budget_mu)
        self._budget_units = _budget_units(budget_mu, self._shift)
        # Largest mu2 that can be converted to units without overflow; anything above is
        # larger than the whole budget.
        self._mu2_cap = _ldexp(1.0, UNIT_BITS - self._shift)
        self._reserve_fraction = reserve_fraction
        self._durable = durable
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._left = 0  # units reserved by this process and not yet granted
        self._unflushed = 0  # units granted here and not yet reported to the file
        self._unflushed_n = 0
        self._refused: int | None = None  # units of the last refused request
        _hooks.register(self)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        reserve_fraction: float = DEFAULT_RESERVE_FRACTION,
        durable: bool = True,
    ) -> PrivacyLedger:
        """Open an existing ledger file with its stored budget (for instance after a crash).

        Parameters
        ----------
        path : str or os.PathLike
            The ledger file.
        reserve_fraction : float, default 0.05
            As in :class:`PrivacyLedger`; a setting of this object, not of the file.
        durable : bool, default True
            As in :class:`PrivacyLedger`.

        Returns
        -------
        PrivacyLedger
            A ledger sharing the file's budget; it can spend as well as read.

        Raises
        ------
        FileNotFoundError
            If there is no file at ``path``.
        ValueError
            If the file is not a readable ledger.
        """
        file_path = _normalise_path(path)
        fraction = _check_reserve_fraction(reserve_fraction)
        state = _read_path(file_path)
        self = cls.__new__(cls)
        self._setup(file_path, state.budget_mu, fraction, bool(durable))
        return self

    # ----------------------------------------------------------------------------------------
    # Pickling and fork.

    def __getstate__(self) -> dict[str, Any]:
        return {
            "path": self._path,
            "budget_mu": self._budget_mu,
            "reserve_fraction": self._reserve_fraction,
            "durable": self._durable,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        path, budget = state["path"], state["budget_mu"]
        self._setup(path, budget, state["reserve_fraction"], state["durable"])
        stored = _read_path(path).budget_mu  # fails loudly if the file is not there
        if stored != budget:
            raise ValueError(
                f"The privacy ledger {path!r} holds budget_mu={stored!r}, but the pickled "
                f"ledger expects {budget!r}."
            )

    def _drop_inherited(self) -> None:
        """Forget a chunk inherited through fork: it belongs to the parent, which returns it."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._left = 0
        self._unflushed = 0
        self._unflushed_n = 0
        self._refused = None

    def __del__(self) -> None:
        try:
            if self._pid == os.getpid() and (self._left > 0 or self._unflushed_n > 0):
                self._release(blocking=False)
        except Exception:  # best effort during garbage collection or interpreter shutdown
            pass

    def __repr__(self) -> str:
        return f"PrivacyLedger(budget_mu={self._budget_mu!r}, path={self._path!r})"

    # ----------------------------------------------------------------------------------------
    # Spending.

    def try_spend(self, mu2: float) -> bool:
        """Commit the privacy cost of one release before its value is used.

        Parameters
        ----------
        mu2 : float
            The release's cost ``mu_t**2 = (Delta_t / sigma_t)**2``, finite and ``>= 0``.

        Returns
        -------
        bool
            True if the cost is committed and the release may proceed; False if it would take
            the total above ``budget_mu**2``, in which case nothing is committed and the caller
            must not touch the data.

        Raises
        ------
        ValueError
            If ``mu2`` is negative, NaN or infinite.

        Notes
        -----
        A grant served from this process's chunk costs well under a microsecond. Reserving a
        new chunk, and every refusal, reads the file under its lock (tens of microseconds, plus
        a sync when ``durable``); a caller that keeps stepping after a refusal pays that per
        call, and may see later grants if other processes return unused budget.
        """
        try:
            value = float(mu2)
        except (TypeError, ValueError):
            raise _bad_mu2(mu2) from None
        if not 0.0 <= value < _INF:
            raise _bad_mu2(mu2)
        if self._pid != os.getpid():
            self._drop_inherited()
        with self._lock:
            if value > self._mu2_cap:  # more than the whole budget
                self._refused = self._budget_units + 1
                return False
            units = _ceil(_ldexp(value, self._shift))
            if units > self._left and not self._reserve(units):
                self._refused = units
                return False
            self._left -= units
            self._unflushed += units
            self._unflushed_n += 1
            self._refused = None
            return True

    @contextlib.contextmanager
    def _locked_fd(self, exclusive: bool) -> Iterator[int]:
        flags = os.O_RDWR if exclusive else os.O_RDONLY
        try:
            fd = os.open(self._path, flags | os.O_CLOEXEC)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"The privacy ledger file {self._path!r} has disappeared; refusing to continue "
                f"(a new file would reset the budget)."
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield fd
        finally:
            os.close(fd)  # also releases the flock

    def _read_checked(self, fd: int) -> _State:
        state = _read_fd(fd, self._path)
        if state.budget_mu != self._budget_mu:
            raise ValueError(
                f"The privacy ledger {self._path!r} now holds budget_mu={state.budget_mu!r}, "
                f"not {self._budget_mu!r}: the file was replaced; refusing to continue."
            )
        return state

    def _reserve(self, units: int) -> bool:
        """Extend the local chunk to cover ``units`` (called with ``self._lock`` held)."""
        need = units - self._left
        with _hooks._IO_LOCK:
            _hooks._ensure_exit_hook()
            with self._locked_fd(exclusive=True) as fd:
                state = self._read_checked(fd)
                remaining = state.budget_units - state.committed
                if need > remaining:
                    return False
                chunk = min(remaining, max(need, int(self._reserve_fraction * remaining)))
                new_state = state._replace(
                    seq=state.seq + 1,
                    committed=state.committed + chunk,
                    granted=state.granted + self._unflushed,
                    releases=state.releases + self._unflushed_n,
                    reservations=state.reservations + 1,
                    updated=time.time(),
                )
                _write_fd(fd, new_state, self._durable)
            # Only now, with the reservation in the file, does the chunk become spendable.
            self._left += chunk
            self._unflushed = 0
            self._unflushed_n = 0
        return True

    def release_unused(self) -> float:
        """Return this process's unused reservation to the shared budget.

        Call it at the end of a chain or process. It also reports this process's granted
        total and release count to the file. It runs automatically at process exit
        (``atexit`` and ``multiprocessing`` finalizers) and when the ledger is garbage
        collected, best effort. A forked child never returns its parent's reservation.

        Returns
        -------
        float
            The ``mu2`` returned, rounded down (0.0 if there was nothing to return).
        """
        return self._release(blocking=True)

    def _release(self, *, blocking: bool) -> float:
        if self._pid != os.getpid():
            self._drop_inherited()
            return 0.0
        if not self._lock.acquire(blocking):
            return 0.0
        try:
            left = self._left
            if left == 0 and self._unflushed_n == 0:
                return 0.0
            # Non-blocking from __del__: the collector may run while this thread holds
            # _IO_LOCK, and a second flock from this process would then wait for ever.
            io_lock = _hooks._IO_LOCK
            if not io_lock.acquire(blocking):
                return 0.0
            try:
                with self._locked_fd(exclusive=True) as fd:
                    state = self._read_checked(fd)
                    granted = state.granted + self._unflushed
                    new_state = state._replace(
                        seq=state.seq + 1,
                        committed=max(state.committed - left, granted),
                        granted=granted,
                        releases=state.releases + self._unflushed_n,
                        returns=state.returns + (left > 0),
                        updated=time.time(),
                    )
                    _write_fd(fd, new_state, self._durable)
            finally:
                io_lock.release()
            self._left = 0
            self._unflushed = 0
            self._unflushed_n = 0
            return _units_to_float(left, self._shift, up=False)
        finally:
            self._lock.release()

    # ----------------------------------------------------------------------------------------
    # Reading.

    def _state(self) -> _State:
        if self._pid != os.getpid():
            self._drop_inherited()
        with self._locked_fd(exclusive=False) as fd:
            return self._read_checked(fd)

    def _mu2(self, units: int, *, up: bool) -> float:
        return _units_to_float(units, self._shift, up=up)
