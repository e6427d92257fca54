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
from typing import Any

from pymc_penalty.accounting import expected_acceptance, gdp_mu, plan_releases
from pymc_penalty.accounting.calibration import CALIBRATION_MARGIN
from pymc_penalty.accounting.gdp import _gdp_epsilon
from pymc_penalty.kernel import split_step_mu
from pymc_penalty.sensitivity import ClipMode, Neighbours
from pymc_penalty.validation import (
    InvalidArgumentError,
    check_budget,
    check_clip,
    check_integer,
    check_real,
    check_share,
)

__all__ = [
    "NEGLIGIBLE_SHARE",
    "FrozenChainWarning",
    "PrivacyBudget",
    "RunPlan",
    "available_mu",
    "calibrate",
]

#: Below this share of a ledger's budget ``mu^2``, what is left counts as nothing: a completed
#: run leaves only the calibration margin (~1e-9 of the budget), which would calibrate a
#: frozen chain.
NEGLIGIBLE_SHARE = 1e-6


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
        check_budget(self.epsilon, self.delta)

    @property
    def mu(self) -> float:
        """The Gaussian-DP ``mu`` that spends exactly ``(epsilon, delta)``."""
        return gdp_mu(self.epsilon, self.delta)

    def epsilon_spent(self, mu_spent: float) -> float:
        """Tight ``epsilon`` at this budget's ``delta`` for a spent ``mu``."""
        if mu_spent <= 0.0:
            return 0.0
        return _gdp_epsilon(mu=mu_spent, delta=self.delta)


@dataclass(frozen=True)
class RunPlan:
    """What a run will do: draws and tuning steps per chain, and chains.

    Parameters
    ----------
    draws, tune : int
        Draws and tuning steps per chain, ``>= 0``, not both 0.
    chains : int
        Number of chains, ``>= 1``.
    """

    draws: int
    tune: int
    chains: int

    def __post_init__(self) -> None:
        if self.releases < 1:  # plan_releases checks each field's type and range
            raise ValueError("`draws + tune` must be at least 1: the plan makes no release.")

    @property
    def releases(self) -> int:
        """Releases the whole run makes: tuning steps and every chain count."""
        return plan_releases(self.draws, self.tune, self.chains)


def available_mu(ledger: Any) -> float:
    """The Gaussian-DP ``mu`` a ledger has left, ``sqrt(ledger.remaining_mu2)``.

    Parameters
    ----------
    ledger : PrivacyLedger
        Anything with ``remaining_mu2`` and ``budget_mu2``.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        If what is left is at most :data:`NEGLIGIBLE_SHARE` of the ledger's budget.
    """
    left = float(ledger.remaining_mu2)
    if left <= NEGLIGIBLE_SHARE * float(ledger.budget_mu2):
        raise ValueError(
            f"The privacy ledger has no budget left (mu^2 {left:.3g} of "
            f"{float(ledger.budget_mu2):.3g} remains)."
        )
    return math.sqrt(left)


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
        Used for the near-frozen warning with ``clip_mode="distance"`` under substitute-one
        neighbours, where ``n`` is public: the typical posterior step length is taken as
        ``1 / sqrt(n)``. Ignored under add/remove-one, where ``n`` itself is private: the
        warning then assumes a step of length 0.1, as it does when ``n`` is not given.
    clip, clip_mode, neighbours, clip_count_share
        The step's settings, to predict its noise.
    warn_below : float, default 0.05
        Warn (:class:`FrozenChainWarning`) when the closed-form expected acceptance of a
        proposal whose true log-likelihood ratio is 0 falls below this.

    Returns
    -------
    float
        Per-step ``mu``.

    Notes
    -----
    The warning's text is built from public quantities only (the per-step ``mu``, the number
    of planned releases, ``clip`` and the threshold), never from ``n`` or anything computed
    from it, so it is identical for any two datasets; whether it fires depends on ``n`` only
    under substitute-one neighbours, where ``n`` is public.
    """
    available_mu = check_real("available_mu", available_mu, low=0.0, low_open=True)
    if not isinstance(plan, RunPlan):
        raise InvalidArgumentError("`plan` must be a pymc_penalty.RunPlan(draws, tune, chains).")
    if n_datapoints is not None:
        check_integer("n_datapoints", n_datapoints, low=1)
    clip = check_clip(clip, allow_auto=False)
    clip_count_share = check_share("clip_count_share", clip_count_share)
    warn_below = check_real("warn_below", warn_below, low=0.0, high=1.0)
    step_mu = available_mu / math.sqrt(plan.releases) * CALIBRATION_MARGIN
    mu_ll, _ = split_step_mu(step_mu, clip_count_share)
    relation = Neighbours.parse(neighbours)
    if ClipMode.parse(clip_mode) is ClipMode.CONSTANT:
        length = 1.0
    elif n_datapoints and relation is Neighbours.SUBSTITUTE:
        # n is public under substitute-one only; under add/remove-one it must not decide
        # anything that leaves the package, this warning included.
        length = 1.0 / math.sqrt(n_datapoints)
    else:
        length = 0.1
    sigma = relation.factor * clip * length / mu_ll
    if float(expected_acceptance(0.0, sigma)) < warn_below:
        # Public figures only: neither n nor the predicted noise sd or acceptance (both
        # computed from n) may appear in the message.
        warnings.warn(
            f"The calibrated per-step mu ({step_mu:.3g} for each of {plan.releases} releases, "
            f"clip={clip:g}) predicts an expected acceptance below {warn_below:g} even for a "
            "move that does not change the likelihood: the chain will be nearly frozen. Raise "
            "epsilon, run fewer steps, or lower `clip`.",
            FrozenChainWarning,
            stacklevel=2,
        )
    return step_mu
