"""Where privacy noise comes from, and the tuning hooks every penalty step shares.

Privacy noise is drawn from a generator seeded by OS entropy, created afresh in every process:
a forked or unpickled copy of a step must never replay its parent's stream, since two releases
with the same noise reveal their exact difference. ``reproducible_noise=True`` draws from the
step's seeded generator instead (``random_seed`` then reproduces runs; not private).
"""

from __future__ import annotations

import os
from copy import deepcopy
from typing import Any

import numpy as np

from pymc_penalty.privacy.chain_slots import ChainSlots

__all__ = ["PrivateNoiseMixin"]

#: A chain that has not yet asked for a slot.
_UNCLAIMED = "unclaimed"


class PrivateNoiseMixin:
    """Mixin for penalty step methods: the noise source, pickling and tuning hooks.

    Expects the attributes ``reproducible_noise``, ``rng``, ``adapter``, ``_untuned_adapter``
    and ``tune``.
    """

    _noise_gen: np.random.Generator | None = None
    _noise_pid: int | None = None
    #: Releases one chain may make (the plan's ``tune + draws``; None: no limit but the
    #: ledger's), and those this chain has made. Every chain then stops at the same length
    #: when ``pm.sample`` runs longer chains than planned, instead of the first chains
    #: spending the later ones' share.
    _chain_cap: int | None = None
    _chain_releases: int = 0
    #: The plan's chains (:class:`~pymc_penalty.privacy.chain_slots.ChainSlots`; None: no
    #: limit), and this chain's slot: ``_UNCLAIMED`` until its first release, None when none
    #: was free.
    _chain_slots: ChainSlots | None = None
    _chain_slot: int | str | None = _UNCLAIMED
    #: Public start points, one per slot (dicts keyed by value variable, as ``initvals``):
    #: each chain moves to its slot's start at its first step. None: the chain starts where
    #: ``pm.sample`` puts it.
    _chain_starts: list[dict[str, np.ndarray]] | None = None
    #: Tuning steps a chain releases (None: all of ``pm.sample``'s); the rest of its tuning
    #: steps release nothing and stay put. A chain started near the posterior with its
    #: metric needs only the scaling and the clip tuned, and every tuning release costs as
    #: much as a draw (``pymc_penalty.planning.plan.resolve_tune``).
    tune_release_cap: int | None = None
    _tune_releases: int = 0
    _chain_started: bool = False

    def set_rng(self, rng: Any) -> None:
        """Set the chain's generator; ``pm.sample`` calls it once as each chain starts (with
        any ``cores``), so the chain's release count and slot start here."""
        super().set_rng(rng)  # type: ignore[misc]
        self._chain_releases = 0
        self._chain_slot = _UNCLAIMED
        self._chain_started = False
        self._tune_releases = 0

    def _claim_slot(self) -> int | None:
        """This chain's slot, claimed now if it has none yet (None when every slot is taken)."""
        if self._chain_slot == _UNCLAIMED:
            self._chain_slot = self._chain_slots.claim()  # type: ignore[union-attr]
        return self._chain_slot  # type: ignore[return-value]

    def _chain_start(self, q0: Any) -> np.ndarray:
        """The point this step moves from: ``q0``'s, except at a chain's first step when the
        step has starts, where it is the start of the chain's slot (raveled as ``q0``).

        ``pm.sample`` passes its own initial point and offers no hook to change it, so the
        step moves each chain itself: a jump to a public point (a draw from the private warm
        start's approximation), no data read, before the chain's first release. The chain
        learns its index from its slot, claimed in the ledger's folder of slots
        (:class:`~pymc_penalty.privacy.chain_slots.ChainSlots`): that works alike for
        chains run one after another by one step (``cores=1``, ``set_rng`` starts each) and
        for copies of the step in worker processes (``cores>1``), where nothing else tells a
        copy which chain it runs. A chain past the plan's number has no slot, releases
        nothing and stays where it is."""
        if self._chain_starts is None or self._chain_started:
            return q0.data
        self._chain_started = True
        slot = self._claim_slot() if self._chain_slots is not None else None
        if slot is None:
            return q0.data
        start = self._chain_starts[slot % len(self._chain_starts)]
        parts = [np.ravel(start[name]) for name, _shape, _size, _dtype in q0.point_map_info]
        return np.concatenate(parts).astype(q0.data.dtype, copy=False)

    def _charge(self, mu2: float) -> bool:
        """Commit one release's ``mu2`` to the ledger, unless this chain has made the
        releases its plan allows, or the plan's chains are all taken (then refused, as the
        ledger refuses: finally)."""
        if self._chain_cap is not None and self._chain_releases >= self._chain_cap:
            return False
        tuning = bool(getattr(self, "tune", False))
        if tuning and self.tune_release_cap is not None:
            if self._tune_releases >= self.tune_release_cap:
                return False
        if self._chain_slots is not None and self._claim_slot() is None:
            return False
        if not self.ledger.try_spend(mu2):  # type: ignore[attr-defined]
            return False
        self._chain_releases += 1
        self._tune_releases += tuning
        return True

    def _noise(self) -> np.random.Generator:
        """Generator for privacy noise: OS entropy per process unless reproducible."""
        if self.reproducible_noise:
            return self.rng
        pid = os.getpid()
        if self._noise_gen is None or self._noise_pid != pid:
            self._noise_gen = np.random.default_rng()
            self._noise_pid = pid
        return self._noise_gen

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_noise_gen"] = None
        state["_noise_pid"] = None
        return state

    def reset_tuning(self) -> None:
        """Restore the proposal to its untuned state (called by PyMC with cores=1)."""
        self.adapter = deepcopy(self._untuned_adapter)

    def stop_tuning(self) -> None:
        """Freeze the proposal; from here the chain is time-homogeneous."""
        self.tune = False
