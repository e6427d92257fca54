"""Input checkers shared by the accounting modules: aliases of :mod:`pymc_penalty.validation`.

Every public function of :mod:`pymc_penalty.accounting` validates its arguments through these
names, so that a bad argument raises the same
:class:`~pymc_penalty.validation.InvalidArgumentError` (a ``ValueError``) wherever it is
passed. The checkers themselves live in one place, :mod:`pymc_penalty.validation`.
"""

from __future__ import annotations

from pymc_penalty.validation import check_choice as _choice
from pymc_penalty.validation import check_integer as _integer
from pymc_penalty.validation import check_real as _real

__all__ = ["_choice", "_integer", "_real"]
