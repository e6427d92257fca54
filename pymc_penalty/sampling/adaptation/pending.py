"""A step's tuning update, held back to the start of the next step that still tunes.

``pm.Metropolis`` tunes at the start of its step, from what earlier steps recorded, and PyMC
calls ``stop_tuning`` between two steps; so the first draw after tuning uses exactly the
proposal the last tuning draw recorded. A penalty step learns its released outcome at the end
of the step: it holds the update (:meth:`PendingTuning.hold`) and applies it at the start of
the next step if that step still tunes (:meth:`PendingTuning.start_step`); otherwise the update
is dropped. The held values are released outcomes and the chain's state, never data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pymc.step_methods.state import equal_dataclass_values

__all__ = ["PendingTuning"]


class PendingTuning:
    """The last tuning step's update arguments, until the next step starts.

    Part of a step's sampling state (it compares by value, as ``equal_dataclass_values``
    needs); ``reset_tuning`` must :meth:`clear` it, so that a chain never starts with the
    previous chain's update.
    """

    def __init__(self) -> None:
        self.held: tuple | None = None

    def hold(self, *update: Any) -> None:
        """Keep this step's update arguments (copies: the caller may reuse its arrays)."""
        self.held = update

    def start_step(self, tuning: bool, update: Callable[..., Any]) -> None:
        """At the start of a step: apply the held update with ``update(*held)`` if this step
        still tunes; drop it either way."""
        held, self.held = self.held, None
        if tuning and held is not None:
            update(*held)

    def clear(self) -> None:
        """Drop the held update (a tuning reset)."""
        self.held = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PendingTuning) and equal_dataclass_values(self.held, other.held)

    __hash__ = None  # mutable, compared by value
