"""A privacy budget and its calibration into per-step noise for a run plan.

The budget ``(epsilon, delta)`` is converted once into the Gaussian-DP parameter ``mu`` that
spends it exactly; a run of ``R = (draws + tune) * chains`` releases, each ``mu_t``-GDP,
composes to ``sqrt(sum mu_t^2)``, so equal releases get ``mu_t = mu / sqrt(R)``. The step
then sets its noise sd to ``Delta_t / mu_t``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

from pymc_penalty.accounting import expected_acceptance, gdp_epsilon, gdp_mu, plan_releases
from pymc_penalty.accounting.calibration import CALIBRATION_MARGIN
from pymc_penalty.kernel import split_step_mu
from pymc_penalty.sensitivity import ClipMode, Neighbours

__all__ = ["FrozenChainWarning", "PrivacyBudget", "RunPlan", "calibrate"]


class FrozenChainWarning(UserWarning):
    """The calibrated noise is so large that the chain will hardly move."""


@dataclass(frozen=True)
class PrivacyBudget:
    """An ``(epsilon, delta)`` differential privacy budget.

    Parameters
    ----------
    epsilon : float
        In ``(0, inf)``.
    delta : float
        In ``(0, 1)``.
    """

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError("`epsilon` must be a finite positive number, in (0, inf).")
        if not (0.0 < self.delta < 1.0):
            raise ValueError("`delta` must be in (0, 1).")

    @property
    def mu(self) -> float:
        """The Gaussian-DP ``mu`` that spends exactly ``(epsilon, delta)``."""
        return gdp_mu(self.epsilon, self.delta)

    def epsilon_spent(self, mu_spent: float) -> float:
        """Tight ``epsilon`` at this budget's ``delta`` for a spent ``mu``."""
        if mu_spent <= 0.0:
            return 0.0
        return gdp_epsilon(self.delta, mu_spent)


@dataclass(frozen=True)
class RunPlan:
    """What a run will do: draws and tuning steps per chain, and chains."""

    draws: int
    tune: int
    chains: int

    @property
    def releases(self) -> int:
        """Releases the whole run makes: tuning steps and every chain count."""
        return plan_releases(self.draws, self.tune, self.chains)


def calibrate(
    available_mu: float,
    plan: RunPlan,
    *,
    n_datapoints: int | None = None,
    clip: float = 1.0,
    clip_mode: ClipMode | str = ClipMode.DISTANCE,
    neighbours: Neighbours | str = Neighbours.SUBSTITUTE,
    clip_count_share: float = 0.05,
    warn_below: float = 0.05,
) -> float:
    """Per-step ``mu`` so that the whole plan spends at most ``available_mu``.

    Parameters
    ----------
    available_mu : float
        The Gaussian-DP ``mu`` left to spend (a budget's ``mu``, or a ledger's remainder).
    plan : RunPlan
    n_datapoints : int, optional
        Used for the near-frozen warning with ``clip_mode="distance"``: the typical posterior
        step length is taken as ``1 / sqrt(n)`` (a public heuristic, no data).
    clip, clip_mode, neighbours, clip_count_share
        The step's settings, to predict its noise.
    warn_below : float, default 0.05
        Warn (:class:`FrozenChainWarning`) when the closed-form expected acceptance of a
        proposal whose true log-likelihood ratio is 0 falls below this.

    Returns
    -------
    float
        Per-step ``mu``.
    """
    if not (math.isfinite(available_mu) and available_mu > 0):
        raise ValueError("`available_mu` must be a finite positive number (budget left).")
    step_mu = available_mu / math.sqrt(plan.releases) * CALIBRATION_MARGIN
    mu_ll, _ = split_step_mu(step_mu, clip_count_share)
    factor = Neighbours.parse(neighbours).factor
    if ClipMode.parse(clip_mode) is ClipMode.CONSTANT:
        sigma = factor * clip / mu_ll
        where = f"clip={clip:g}"
    else:
        length = 1.0 / math.sqrt(n_datapoints) if n_datapoints else 0.1
        sigma = factor * clip * length / mu_ll
        where = f"a step of length {length:.3g}"
    accept = float(expected_acceptance(0.0, sigma))
    if accept < warn_below:
        warnings.warn(
            f"The calibrated noise (sd {sigma:.3g} for {where}) gives an expected acceptance "
            f"of {accept:.2g} even for a move that does not change the likelihood: the chain "
            "will be nearly frozen. Raise epsilon, run fewer steps, or lower `clip`.",
            FrozenChainWarning,
            stacklevel=2,
        )
    return step_mu
