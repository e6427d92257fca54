"""Variants of the penalty algorithm (see the design notes, section 2)."""

from pymc_penalty.variants.expfam import FAMILIES, ExpFamPenaltyMetropolis

__all__ = ["FAMILIES", "ExpFamPenaltyMetropolis"]
