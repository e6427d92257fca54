"""The store of a :class:`~pymc_penalty.PrivacyLedger`: exact integer units, the crash-safe
file and its lock-free helpers, and the argument checks of the ledger's constructor.

Standard library only (worker processes import the ledger without PyMC).

File format
-----------
A binary file of ``4096 + 100`` bytes with two state slots at offsets 0 and 4096, each in the
little-endian ``struct`` layout ``<8sQdqQQQQQQddI``: magic ``b"PMCPLDG1"``, sequence number,
``budget_mu``, unit exponent ``shift`` (one unit is ``2**-shift``), budget, committed and
granted units, releases, reservations, returns, creation and update times (Unix), and the
CRC-32 of the preceding bytes. The valid slot with the higher sequence number is the state;
an update writes the other slot. Read it with :meth:`PrivacyLedger.open` and
:meth:`PrivacyLedger.snapshot`.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import math
import os
import secrets
import struct
import time
import zlib
from fractions import Fraction
from typing import Any, NamedTuple

MAX_BUDGET_MU = 1e150
UNIT_BITS = 62
_INF = math.inf

_MAGIC = b"PMCPLDG1"
_BODY = struct.Struct("<8sQdqQQQQQQdd")
_CRC = struct.Struct("<I")
_SLOT_SIZE = _BODY.size + _CRC.size
_SLOT_OFFSETS = (0, 4096)
_FILE_SIZE = _SLOT_OFFSETS[1] + _SLOT_SIZE


# --------------------------------------------------------------------------------------------
# Units: exact integer accounting.
# --------------------------------------------------------------------------------------------


def _unit_shift(budget_mu: float) -> int:
    """Exponent ``shift`` such that ``budget_mu**2 < 2**(62 - shift)``; one unit is 2**-shift."""
    _, exponent = math.frexp(budget_mu)  # budget_mu < 2**exponent
    return UNIT_BITS - 2 * exponent


@functools.lru_cache(maxsize=64)
def _budget_units(budget_mu: float, shift: int) -> int:
    """``budget_mu**2 * 2**shift`` rounded down to an integer with 53 significant bits.

    The budget in units is then exactly a float times ``2**shift``, so ``budget_mu2`` is exact
    and bounds every reported ``spent_mu2``.
    """
    units = math.floor(Fraction(budget_mu) ** 2 * Fraction(2) ** shift)
    excess = units.bit_length() - 53
    if excess > 0:
        units = (units >> excess) << excess
    return units


def _units_to_float(units: int, shift: int, *, up: bool) -> float:
    """``units * 2**-shift`` as a float rounded up (``up``) or down."""
    exact = Fraction(units) / Fraction(2) ** shift
    value = float(exact)
    if up and Fraction(value) < exact:
        value = math.nextafter(value, _INF)
    elif not up and Fraction(value) > exact:
        value = math.nextafter(value, -_INF)
    return value


# --------------------------------------------------------------------------------------------
# On-disk state.
# --------------------------------------------------------------------------------------------


class _State(NamedTuple):
    seq: int
    budget_mu: float
    shift: int
    budget_units: int
    committed: int
    granted: int
    releases: int
    reservations: int
    returns: int
    created: float
    updated: float


def _pack(state: _State) -> bytes:
    body = _BODY.pack(_MAGIC, *state)
    return body + _CRC.pack(zlib.crc32(body))


def _unpack(raw: bytes) -> _State | None:
    """The state in one slot, or None if the slot is empty, torn or inconsistent."""
    if len(raw) < _SLOT_SIZE:
        return None
    body = raw[: _BODY.size]
    (crc,) = _CRC.unpack_from(raw, _BODY.size)
    if body[:8] != _MAGIC or zlib.crc32(body) != crc:
        return None
    state = _State(*_BODY.unpack(body)[1:])
    budget = state.budget_mu
    if not (0.0 <= budget <= MAX_BUDGET_MU) or state.shift != _unit_shift(budget):
        return None
    if state.budget_units != _budget_units(budget, state.shift):
        return None
    if state.granted > state.committed:
        return None
    return state


def _parse(raw: bytes, path: str) -> _State:
    slots = [_unpack(raw[off : off + _SLOT_SIZE]) for off in _SLOT_OFFSETS]
    valid = [s for s in slots if s is not None]
    if not valid:
        raise ValueError(
            f"{path!r} is not a readable pymc-penalty privacy ledger (no valid state record)."
        )
    if len(valid) == 2 and valid[0].budget_mu != valid[1].budget_mu:
        raise ValueError(f"{path!r}: the two state records disagree on the budget; corrupt.")
    return max(valid, key=lambda s: s.seq)


def _read_fd(fd: int, path: str) -> _State:
    return _parse(os.pread(fd, _FILE_SIZE, 0), path)


def _write_fd(fd: int, state: _State, durable: bool) -> None:
    data = _pack(state)
    written = os.pwrite(fd, data, _SLOT_OFFSETS[state.seq % 2])
    if written != len(data):  # pragma: no cover - regular files do not write short here
        raise OSError(f"short write to the privacy ledger ({written} of {len(data)} bytes)")
    if durable:
        os.fdatasync(fd)


def _fsync_dir(directory: str) -> None:
    with contextlib.suppress(OSError):
        dfd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _write_new_file(path: str, data: bytes, durable: bool) -> None:
    """Create ``path`` (FileExistsError if it exists) holding ``data``, synced if ``durable``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        _write_all(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def _create_file(path: str, budget_mu: float, durable: bool) -> bool:
    """Create a fresh ledger at ``path`` atomically; False if a file already exists there."""
    now = time.time()
    shift = _unit_shift(budget_mu)
    state = _State(0, budget_mu, shift, _budget_units(budget_mu, shift), 0, 0, 0, 0, 0, now, now)
    data = _pack(state).ljust(_FILE_SIZE, b"\0")
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
    _write_new_file(tmp, data, durable)
    try:
        # link() publishes the complete file, or fails if the name is taken: no process can
        # ever see a half-written ledger.
        os.link(tmp, path)
        created = True
    except FileExistsError:
        created = False
    except OSError:  # pragma: no cover - file systems without hard links
        try:
            _write_new_file(path, data, durable)
            created = True
        except FileExistsError:
            created = False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    if created and durable:
        _fsync_dir(os.path.dirname(path))
    return created


def _read_path(path: str) -> _State:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        return _read_fd(fd, path)
    finally:
        os.close(fd)


def _normalise_path(path: str | os.PathLike[str]) -> str:
    try:
        text = os.fsdecode(os.fspath(path))
    except TypeError:
        raise TypeError(f"`path` must be a str, an os.PathLike or None; got {path!r}.") from None
    return os.path.abspath(text)


def _check_budget_mu(budget_mu: Any) -> float:
    try:
        value = float(budget_mu)
    except (TypeError, ValueError):
        value = math.nan
    if not 0.0 <= value <= MAX_BUDGET_MU:
        raise ValueError(
            f"`budget_mu` must be a finite number in [0, {MAX_BUDGET_MU:g}] (the run's total "
            f"Gaussian-DP parameter); got {budget_mu!r}."
        )
    return value


def _check_reserve_fraction(reserve_fraction: Any) -> float:
    try:
        value = float(reserve_fraction)
    except (TypeError, ValueError):
        value = math.nan
    if not 0.0 <= value <= 1.0:
        raise ValueError(
            f"`reserve_fraction` must be a number in [0, 1] (the share of the uncommitted "
            f"budget a process reserves at a time); got {reserve_fraction!r}."
        )
    return value


def _bad_mu2(mu2: Any) -> ValueError:
    return ValueError(
        f"`mu2` must be a finite number in [0, inf) (one release's (sensitivity / noise sd)**2); "
        f"got {mu2!r}."
    )
