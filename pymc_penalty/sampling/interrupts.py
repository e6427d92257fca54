"""Ctrl-C during :func:`pymc_penalty.sample`: stop every chain, and say what was spent.

``pm.sample`` swallows :class:`KeyboardInterrupt`: with ``cores=1`` it ends the current chain
and starts the next one, which goes on spending budget after the user asked to stop, and the
run then returns as if nothing happened. While :func:`pymc_penalty.sample` runs
``pm.sample``, :func:`stop_on_interrupt` replaces the SIGINT handler (main thread only) by
one that raises :class:`_Interrupt`, which PyMC does not catch: no further chain starts, the
worker processes of ``cores > 1`` are terminated by PyMC's own cleanup, and
:func:`pymc_penalty.sample` raises :class:`SamplingInterrupted` with the privacy report of
what the ledger committed (epsilon spent, releases: no data).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pymc_penalty.errors import SamplingInterrupted

__all__ = ["SamplingInterrupted", "interrupted_message", "stop_on_interrupt"]


class _Interrupt(BaseException):
    """Raised by the temporary SIGINT handler; not a KeyboardInterrupt, so that PyMC's
    ``except KeyboardInterrupt`` (which goes on with the next chain) lets it through."""


#: The process that installed the handler: a worker forked from it keeps PyMC's own
#: meaning of Ctrl-C (KeyboardInterrupt, which ends the worker quietly).
_OWNER_PID: list[int] = []


def _raise_interrupt(signum: int, frame: Any) -> None:
    if _OWNER_PID and os.getpid() != _OWNER_PID[-1]:
        raise KeyboardInterrupt
    raise _Interrupt


@contextmanager
def stop_on_interrupt() -> Iterator[type[BaseException]]:
    """While active, Ctrl-C raises the exception class it yields (outside the main thread,
    where no handler can be installed, nothing changes and KeyboardInterrupt keeps PyMC's
    meaning)."""
    if threading.current_thread() is not threading.main_thread():
        yield _Interrupt
        return
    _OWNER_PID.append(os.getpid())
    previous = signal.signal(signal.SIGINT, _raise_interrupt)
    try:
        yield _Interrupt
    finally:
        signal.signal(signal.SIGINT, previous)
        _OWNER_PID.pop()


def interrupted_message(report: dict[str, Any], budget: Any, ledger_path: Any) -> str:
    """What an interrupted run spent, in public figures only (epsilon, delta, releases)."""
    where = (
        f" The ledger {str(ledger_path)!r} holds it: a later run on it gets what is left."
        if ledger_path is not None
        else ""
    )
    return (
        f"Sampling interrupted after spending epsilon = {report['dp_epsilon']:.4g} of "
        f"{budget.epsilon:g} (delta {budget.delta:g}, {report['dp_releases']} releases). "
        "That spend is final; no result was returned." + where
    )
