"""A privacy budget, and what a ledger has left of it.

The budget ``(epsilon, delta)`` is converted once into the Gaussian-DP parameter ``mu`` that
spends it exactly; a run of ``R = (draws + tune) * chains`` releases, each ``mu_t``-GDP,
composes to ``sqrt(sum mu_t^2)``, so equal releases get ``mu_t = mu / sqrt(R)``. The step
then sets its noise sd to ``Delta_t / mu_t``. The composition, the conversions and that
calibration (:func:`calibrate`, :class:`RunPlan`) live in :mod:`pymc_penalty.accounting`;
they are re-exported here, where they have always been importable from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pymc_penalty.accounting import composed_epsilon, gdp_mu
from pymc_penalty.accounting.calibration import RunPlan, calibrate
from pymc_penalty.errors import FrozenChainWarning
from pymc_penalty.validation import check_budget

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
        mu_spent = max(float(mu_spent), 0.0)
        return composed_epsilon(mu_spent * mu_spent, self.delta)


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
