"""pymc-penalty: differentially private Bayesian inference for PyMC (the penalty algorithm)."""

from pymc_penalty._version import __version__
from pymc_penalty.model_checks import ModelNotPrivateError
from pymc_penalty.step import NotPrivateWarning, PenaltyMetropolis

__all__ = [
    "ModelNotPrivateError",
    "NotPrivateWarning",
    "PenaltyMetropolis",
    "__version__",
]
