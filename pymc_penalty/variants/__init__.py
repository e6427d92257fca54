"""Variants of the penalty algorithm (see the design notes, section 2)."""

from pymc_penalty.errors import DeclarationMismatchError
from pymc_penalty.variants.expfam import FAMILIES, ExpFamPenaltyMetropolis
from pymc_penalty.variants.owners import MultiOwnerPenaltyMetropolis, owner_report
from pymc_penalty.variants.statistic import SufficientStatistic

__all__ = [
    "FAMILIES",
    "DeclarationMismatchError",
    "ExpFamPenaltyMetropolis",
    "MultiOwnerPenaltyMetropolis",
    "SufficientStatistic",
    "owner_report",
]
