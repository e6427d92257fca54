"""How a penalty step tunes: its adapters, their sampling state, the deferred update.

During tuning the proposal (:class:`pymc_penalty.sampling.adaptation.ProposalAdapter`) and, with
``clip="auto"``, the clip constant (:class:`pymc_penalty.sampling.adaptation.ClipAdapter`) adapt to
released outcomes only (post-processing). As in ``pm.Metropolis``, a step's update is applied
at the start of the next step that still tunes, so the first draw after tuning uses exactly
the proposal and clip the last tuning draw recorded; ``reset_tuning`` restores both.
"""

from __future__ import annotations

import math
from copy import deepcopy
from dataclasses import field
from typing import Any

import numpy as np
from pymc.step_methods.compound import StepMethodState
from pymc.step_methods.state import dataclass_state

from pymc_penalty.sampling.adaptation import (
    ClipAdapter,
    ProposalAdapter,
    clip_target_fraction,
    starting_clip,
    starting_sd,
)
from pymc_penalty.sampling.adaptation.pending import PendingTuning
from pymc_penalty.sampling.setup import check_proposal_shape

__all__ = [
    "ClippedPenaltyState",
    "adapt_found_clip",
    "found_clip_adapter",
    "PenaltyMetropolisState",
    "TuningMixin",
    "progressbar_config",
    "progressbar_update_functions",
    "starting_proposal",
]


@dataclass_state
class PenaltyMetropolisState(StepMethodState):
    """Sampling state of :class:`PenaltyMetropolis` (privacy noise is deliberately absent)."""

    adapter: ProposalAdapter
    tune: bool
    _untuned_adapter: ProposalAdapter = field(metadata={"frozen": False})
    _pending_tuning: PendingTuning = field(metadata={"frozen": False})


@dataclass_state
class ClippedPenaltyState(PenaltyMetropolisState):
    """Sampling state of a clipping penalty step: the proposal's, plus the clip and its
    adaptation (``clip="auto"``)."""

    clip: float | None
    clip_adapter: ClipAdapter | None
    _untuned_clip_adapter: ClipAdapter | None = field(metadata={"frozen": False})


def starting_proposal(
    S: Any, size: int, clip: float | str | None, n_public: int | None, tail: float = 1.0
) -> tuple[np.ndarray, float | None]:
    """The proposal's starting shape and clip constant.

    ``S`` (sds or a covariance; None: sd 1 in every coordinate) is checked against the
    raveled ``size``. With ``clip="auto"`` the clip starts at ``tail`` times
    :func:`~pymc_penalty.sampling.adaptation.starting_clip` and a default ``S`` at
    :func:`~pymc_penalty.sampling.adaptation.starting_sd` (both from the public ``n``, or None under
    add/remove-one).
    """
    default_s = S is None
    S = check_proposal_shape(np.ones(size) if default_s else S, size)
    if isinstance(clip, str) and clip == "auto":
        clip = tail * starting_clip(n_public, clip_target_fraction(n_public))
        if default_s:
            S = np.full(size, starting_sd(n_public))
    return S, None if clip is None else float(clip)


def found_clip_adapter(
    clip: float, n_public: int | None, adapt_window: int, probe: bool = True
) -> ClipAdapter:
    """The adapter of a found clip (``clip="auto"``) starting at ``clip``: short fixed
    windows of half the proposal's adaptation window (each change of the proposal's metric
    restarts one), aiming at :func:`~pymc_penalty.sampling.adaptation.clip_target_fraction`
    of the public ``n`` (None under add/remove-one), probing down from its start unless
    ``probe`` is False. The penalty step and the sharded driver
    (:mod:`pymc_penalty.distributed`) both build theirs here."""
    return ClipAdapter.create(
        clip,
        n_public,
        math.inf,
        max(adapt_window // 2, 1),
        target_fraction=clip_target_fraction(n_public),
        growth=1,
        probe=probe,
    )


def adapt_found_clip(
    clip_adapter: ClipAdapter,
    clipped_count: float,
    count_sd: float,
    clip_chol: np.ndarray,
    chol: np.ndarray,
) -> np.ndarray:
    """Move a found clip from one released (noisy) clipped count, then follow the proposal's
    metric when its Cholesky factor ``chol`` was re-estimated since ``clip_chol`` (a row's
    ratio per whitened step scales with the factor's geometric mean). Post-processing of
    released values only. Returns the factor the clip now follows."""
    clip_adapter.update(clipped_count, count_sd)
    if chol is not clip_chol:
        d = chol.shape[0]
        old = float(np.log(np.abs(np.diag(clip_chol))).sum())
        new = float(np.log(np.abs(np.diag(chol))).sum())
        clip_adapter.rescale(math.exp((new - old) / d))
    return chol


class TuningMixin:
    """Tuning of a penalty step (see the module docstring); the step sets ``clip``,
    ``clip_auto`` and ``tune`` and calls :meth:`_init_tuning` in its constructor."""

    def _init_tuning(
        self,
        S: np.ndarray,
        scaling: float,
        tune: bool,
        adapt: str,
        target_accept: float,
        adapt_window: int,
        proposal: str,
        max_step: float | None,
        n_public: int | None,
        clip_probe: bool = True,
    ) -> None:
        """Build the proposal's adapter and, with ``clip="auto"``, the clip's (probing down
        from its start unless ``clip_probe`` is False)."""
        self.tune = bool(tune)
        adapter = ProposalAdapter.create(
            S,
            float(scaling),
            adapt if tune else "none",
            float(target_accept),
            adapt_window,
            kind=proposal,
            max_step=np.inf if max_step is None else float(max_step),
        )
        self.adapter = adapter
        self._untuned_adapter = deepcopy(adapter)
        self.clip_adapter: ClipAdapter | None = None
        if self.clip_auto and tune:
            self.clip_adapter = found_clip_adapter(self.clip, n_public, adapt_window, clip_probe)
        self._untuned_clip_adapter = deepcopy(self.clip_adapter)
        self._clip_chol = adapter.chol
        # The last step's tuning update, applied at the start of the next step if it tunes.
        self._pending_tuning = PendingTuning()

    def _start_step(self) -> None:
        """At the start of a step: apply the previous step's held tuning update if this step
        still tunes (:class:`pymc_penalty.sampling.adaptation.pending.PendingTuning`)."""
        self._pending_tuning.start_step(self.tune, self._apply_tuning)

    def _apply_tuning(
        self, x_new: np.ndarray, accept_prob: float, accepted: bool, count: tuple | None
    ) -> None:
        """Adapt the proposal (and a found clip) to a step's released outcome."""
        self.adapter.update(x_new, accept_prob, accepted)
        if count is not None and self.clip_adapter is not None:
            self._adapt_clip(*count)

    def _adapt_clip(self, clipped_count: float, count_sd: float) -> None:
        """Tuning: move the clip from the released (noisy) count, then follow the proposal's
        metric when its Cholesky factor was re-estimated (a row's ratio per whitened step
        scales with the factor's geometric mean). Post-processing of released values only."""
        self._clip_chol = adapt_found_clip(
            self.clip_adapter, clipped_count, count_sd, self._clip_chol, self.adapter.chol
        )
        self.clip = self.clip_adapter.clip

    def reset_tuning(self) -> None:
        """Restore the proposal and, with ``clip="auto"``, the clip to their untuned state."""
        super().reset_tuning()
        self._pending_tuning.clear()
        if self._untuned_clip_adapter is not None:
            self.clip_adapter = deepcopy(self._untuned_clip_adapter)
            self.clip = self.clip_adapter.clip
        self._clip_chol = self.adapter.chol


def progressbar_config(n_chains: int = 1) -> tuple[list, dict[str, list]]:
    """Columns of PyMC's progress bar for a penalty step: scaling, acceptance, noise sd."""
    from rich.progress import TextColumn
    from rich.table import Column

    columns = [
        TextColumn("{task.fields[scaling]:0.3g}", table_column=Column("Scaling", ratio=1)),
        TextColumn("{task.fields[accept_rate]:0.2f}", table_column=Column("Accept Rate", ratio=1)),
        TextColumn("{task.fields[noise_sd]:0.3g}", table_column=Column("Noise sd", ratio=1)),
    ]
    stats = {
        "scaling": [0.0] * n_chains,
        "accept_rate": [0.0] * n_chains,
        "noise_sd": [0.0] * n_chains,
    }
    return columns, stats


def progressbar_update_functions() -> tuple:
    """How a step's stats feed the progress bar's columns."""

    def update_stats(step_stats: dict[str, Any]) -> dict[str, float]:
        return {
            "scaling": step_stats["scaling"],
            "accept_rate": step_stats["accept"],
            "noise_sd": step_stats["dp_noise_sd"],
        }

    return (update_stats,)
