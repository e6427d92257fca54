"""Process-level bookkeeping of the privacy ledgers: fork handling and best-effort release
at exit.

Nothing is registered at import: :func:`install` registers the ``atexit`` and
``os.register_at_fork`` hooks once per interpreter, when the first ledger is set up (a forked
child inherits both the registrations and the flag). Standard library only.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing.util
import os
import shutil
import threading
import weakref
from typing import Any

# Serialises this process's file operations. The at-fork hook holds it across fork, so no
# child inherits a descriptor whose flock is held (a flock belongs to the open file
# description, which fork shares).
_IO_LOCK = threading.Lock()
_LEDGERS: weakref.WeakSet[Any] = weakref.WeakSet()
_OWNED_TEMP_DIRS: list[tuple[int, str]] = []
_HOOK_PID: int | None = None


def _release_all_in_this_process() -> None:
    pid = os.getpid()
    for ledger in list(_LEDGERS):
        if ledger._pid == pid:
            with contextlib.suppress(Exception):
                ledger.release_unused()


def _at_exit() -> None:
    _release_all_in_this_process()
    pid = os.getpid()
    for owner, directory in _OWNED_TEMP_DIRS:
        if owner == pid:
            shutil.rmtree(directory, ignore_errors=True)


def _ensure_exit_hook() -> None:
    """Register the release hook with ``multiprocessing`` once per process.

    Workers started by ``multiprocessing`` with ``fork`` or ``forkserver`` end with
    ``os._exit``, which skips ``atexit``; they do run ``multiprocessing.util`` finalizers.
    """
    global _HOOK_PID
    pid = os.getpid()
    if _HOOK_PID != pid:
        _HOOK_PID = pid
        with contextlib.suppress(Exception):
            multiprocessing.util.Finalize(None, _release_all_in_this_process, exitpriority=100)


def _before_fork() -> None:
    _IO_LOCK.acquire()


def _after_fork_in_parent() -> None:
    _IO_LOCK.release()


def _after_fork_in_child() -> None:
    global _IO_LOCK
    _IO_LOCK = threading.Lock()
    for ledger in list(_LEDGERS):
        ledger._drop_inherited()


_INSTALLED = False
_INSTALL_LOCK = threading.Lock()


def install() -> None:
    """Register the exit and fork hooks, once per interpreter (idempotent, thread-safe)."""
    global _INSTALLED
    if _INSTALLED:
        return
    with _INSTALL_LOCK:
        if _INSTALLED:
            return
        atexit.register(_at_exit)
        os.register_at_fork(
            before=_before_fork,
            after_in_parent=_after_fork_in_parent,
            after_in_child=_after_fork_in_child,
        )
        _INSTALLED = True


def register(ledger: Any) -> None:
    """Track ``ledger`` for the exit and fork hooks, installing them first if needed."""
    install()
    _LEDGERS.add(ledger)


def own_temp_dir(directory: str) -> None:
    """Remove ``directory`` when this process exits (a temporary ledger's folder)."""
    install()
    _OWNED_TEMP_DIRS.append((os.getpid(), directory))
