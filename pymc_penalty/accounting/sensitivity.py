"""Sensitivity: neighbour relations, clip modes and the proposal length a bound scales with.

The bound and the noise themselves are computed in one place,
:mod:`pymc_penalty.privacy.mechanism` (:func:`~pymc_penalty.privacy.mechanism.clip_bound`,
:func:`~pymc_penalty.privacy.mechanism.l2_sensitivity`,
:func:`~pymc_penalty.privacy.mechanism.release_noise`).

Each datapoint's log-likelihood ratio ``r_i = log p(y_i | theta') - log p(y_i | theta)`` is
clipped to ``[-B, B]`` before summation. The bound ``B`` is either a constant (``clip``) or
proportional to the proposal's step length: ``clip * ||theta' - theta||_2`` on the sampler's
unconstrained space (``distance``), or ``clip * ||L^-1 (theta' - theta)||_2`` in the
proposal's own metric (``metric``, ``L`` the proposal's Cholesky factor, built from released
quantities only, so public). The metric bound is scale-free: one constant fits every direction
of an anisotropic posterior, where a Euclidean bound must cover the steepest one. The
step-length bounds keep the noise-to-sensitivity ratio constant per step and make clipping
rare near the posterior, where steps are small. A declared Lipschitz bound
``M`` on each partial derivative of a datapoint's log-likelihood gives
``B = M * ||theta' - theta||_1``, which never clips when the declaration holds (the chain is
then exact); the step still clips at ``B``, so the guarantee never rests on the claim.

The L2 sensitivity of the clipped sum is ``2B`` when neighbours differ by substituting one
datapoint and ``B`` when they differ by adding or removing one.
"""

from __future__ import annotations

import math
from enum import Enum

import numpy as np
from scipy.linalg import solve_triangular

__all__ = ["ClipMode", "Neighbours", "step_length"]


class _Choice(str, Enum):
    """A string option of the public API; ``parse`` names the argument on bad input."""

    @classmethod
    def parse(cls, value: str | _Choice, argument: str):
        """Return the member named by ``value``, or raise a ValueError naming the choices."""
        try:
            return cls(value)
        except ValueError:
            choices = ", ".join(repr(m.value) for m in cls)
            raise ValueError(f"`{argument}` must be one of {choices}; got {value!r}.") from None


class Neighbours(_Choice):
    """Neighbour relation of the differential privacy guarantee."""

    SUBSTITUTE = "substitute"
    ADD_REMOVE = "add_remove"

    @classmethod
    def parse(cls, value: str | Neighbours, argument: str = "neighbours") -> Neighbours:
        """Return the relation named by ``value`` (ValueError naming the choices if none)."""
        return super().parse(value, argument)

    @property
    def factor(self) -> float:
        """Sensitivity of the clipped sum in units of the clip bound ``B``."""
        return 2.0 if self is Neighbours.SUBSTITUTE else 1.0


class ClipMode(_Choice):
    """How the clip bound ``B`` depends on the proposal."""

    DISTANCE = "distance"
    METRIC = "metric"
    CONSTANT = "constant"
    LIPSCHITZ = "lipschitz"

    @classmethod
    def parse(cls, value: str | ClipMode, argument: str = "clip_mode") -> ClipMode:
        """Return the mode named by ``value`` (ValueError naming the choices if none)."""
        return super().parse(value, argument)


def step_length(mode: ClipMode, diff: np.ndarray, chol: np.ndarray | None = None) -> float:
    """The norm of ``theta' - theta`` that ``mode`` scales the bound with.

    L1 for ``LIPSCHITZ`` (a bound on each partial derivative gives
    ``|log p(y|theta') - log p(y|theta)| <= M ||theta' - theta||_1``), ``||L^-1 diff||_2`` for
    ``METRIC`` (``chol`` is ``L``, lower triangular; required), L2 otherwise. Every norm is
    symmetric in the two points, so the noise it sets keeps the penalty test exact.
    """
    if mode is ClipMode.LIPSCHITZ:
        return float(np.abs(diff).sum())
    if mode is ClipMode.METRIC:
        if chol is None:
            raise ValueError("`chol` is required for clip_mode='metric'.")
        white = solve_triangular(chol, diff, lower=True, check_finite=False)
        return math.sqrt(float(white @ white))
    return math.sqrt(float(diff @ diff))
