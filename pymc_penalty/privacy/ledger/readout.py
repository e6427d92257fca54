"""What a :class:`~pymc_penalty.PrivacyLedger` reports: its budget, what all processes spent,
and a snapshot, read from the file (:mod:`pymc_penalty.privacy.ledger` holds the filter that
spends).

Standard library only.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pymc_penalty.privacy.ledger.store import _State


class _LedgerReadout:
    """The read side of :class:`~pymc_penalty.PrivacyLedger` (a mixin: the ledger provides
    ``_state()``, ``_mu2(units, up=)``, ``_drop_inherited()`` and its settings)."""

    __slots__ = ()

    _path: str
    _budget_mu: float
    _budget_units: int
    _reserve_fraction: float
    _durable: bool
    _pid: int
    _left: int
    _unflushed: int
    _unflushed_n: int
    _refused: int | None

    @property
    def path(self) -> Path:
        """The ledger file."""
        return Path(self._path)

    @property
    def budget_mu(self) -> float:
        """The budget's Gaussian-DP parameter ``mu``."""
        return self._budget_mu

    @property
    def budget_mu2(self) -> float:
        """The budget in ``mu**2``: ``budget_mu**2`` rounded down to a float (exact as held)."""
        return self._mu2(self._budget_units, up=False)

    @property
    def reserve_fraction(self) -> float:
        """Share of the uncommitted budget this process reserves at a time."""
        return self._reserve_fraction

    @property
    def durable(self) -> bool:
        """Whether file updates are synced to stable storage."""
        return self._durable

    @property
    def spent_mu2(self) -> float:
        """Committed ``mu2`` of all processes, outstanding reservations included (conservative).

        This is the figure that bounds the privacy loss: the run is ``sqrt(spent_mu2)``-GDP.
        Rounded up.
        """
        return self._mu2(self._state().committed, up=True)

    @property
    def spent_mu(self) -> float:
        """``sqrt(spent_mu2)``: the Gaussian-DP parameter spent so far (conservative)."""
        return math.sqrt(self.spent_mu2)

    @property
    def used_mu2(self) -> float:
        """``mu2`` of the releases granted (see the class notes on what it counts); rounded down."""
        return self._mu2(self._state().granted + self._unflushed, up=False)

    @property
    def used_mu(self) -> float:
        """``sqrt(used_mu2)``."""
        return math.sqrt(self.used_mu2)

    @property
    def releases(self) -> int:
        """Number of releases granted (see the class notes on what it counts)."""
        return self._state().releases + self._unflushed_n

    @property
    def remaining_mu2(self) -> float:
        """Uncommitted budget, ``budget_mu2 - spent_mu2``, excluding chunks held by processes."""
        state = self._state()
        return self._mu2(state.budget_units - state.committed, up=False)

    @property
    def local_unused_mu2(self) -> float:
        """Unused part of this process's reservation (spendable here, counted as spent)."""
        if self._pid != os.getpid():
            self._drop_inherited()
        return self._mu2(self._left, up=False)

    def _exhausted(self, state: _State) -> bool:
        available = state.budget_units - state.committed + self._left
        refused = self._refused
        return available <= 0 or (refused is not None and refused > available)

    @property
    def exhausted(self) -> bool:
        """Whether this process can spend no more.

        True when no budget is left to this process (uncommitted budget plus its own chunk),
        or when the latest request refused in this process, with no grant since, still does
        not fit.
        """
        return self._exhausted(self._state())

    def snapshot(self) -> dict[str, Any]:
        """The ledger's state as a plain dictionary (one consistent read of the file).

        Returns
        -------
        dict
            Keys ``path``, ``budget_mu``, ``budget_mu2``, ``spent_mu2``, ``spent_mu``,
            ``used_mu2``, ``used_mu``, ``remaining_mu2``, ``releases``, ``outstanding_mu2``
            (committed but not reported as granted: reservations held by live processes, and
            those of killed ones), ``local_unused_mu2``, ``reservations``, ``returns``,
            ``exhausted``, ``created`` and ``updated`` (Unix times), ``reserve_fraction`` and
            ``durable``. Values are str, float, int or bool.
        """
        state = self._state()
        granted = state.granted + self._unflushed
        spent = self._mu2(state.committed, up=True)
        used = self._mu2(granted, up=False)
        return {
            "path": self._path,
            "budget_mu": self._budget_mu,
            "budget_mu2": self._mu2(state.budget_units, up=False),
            "spent_mu2": spent,
            "spent_mu": math.sqrt(spent),
            "used_mu2": used,
            "used_mu": math.sqrt(used),
            "remaining_mu2": self._mu2(state.budget_units - state.committed, up=False),
            "releases": state.releases + self._unflushed_n,
            "outstanding_mu2": self._mu2(max(state.committed - granted, 0), up=True),
            "local_unused_mu2": self._mu2(self._left, up=False),
            "reservations": state.reservations,
            "returns": state.returns,
            "exhausted": self._exhausted(state),
            "created": state.created,
            "updated": state.updated,
            "reserve_fraction": self._reserve_fraction,
            "durable": self._durable,
        }
