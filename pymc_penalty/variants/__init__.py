"""Variants of the penalty algorithm (see the design notes, section 2)."""

from pymc_penalty.variants.expfam import FAMILIES, ExpFamPenaltyMetropolis
from pymc_penalty.variants.owners import MultiOwnerPenaltyMetropolis, owner_report

__all__ = ["FAMILIES", "ExpFamPenaltyMetropolis", "MultiOwnerPenaltyMetropolis", "owner_report"]
