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

__all__ = ["PrivateNoiseMixin"]


class PrivateNoiseMixin:
    """Mixin for penalty step methods: the noise source, pickling and tuning hooks.

    Expects the attributes ``reproducible_noise``, ``rng``, ``adapter``, ``_untuned_adapter``
    and ``tune``.
    """

    _noise_gen: np.random.Generator | None = None
    _noise_pid: int | None = None

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
