"""The mechanism of one penalty step: clip policy and neighbour relation to noise (pure NumPy).

This is the only code that turns a step's clip (its constant, mode and the proposal's length
in that mode), its neighbour relation and its noise specification (a per-step Gaussian-DP
``mu`` or a fixed noise sd) into the numbers of one release:

- ``bound`` B, the per-datapoint clip of the log-likelihood ratio (:func:`clip_bound`);
- ``sensitivity`` Delta, the L2 sensitivity of the clipped sum (:func:`l2_sensitivity`);
- ``sigma``, the sd of the Gaussian noise added to the clipped sum (what the acceptance test
  of :func:`pymc_penalty.sampling.kernel.transition` subtracts half the square of);
- ``count_sd``, the sd of the noise on the clipped count (``inf``: no count released);
- ``step_mu``, the step's Gaussian-DP ``mu`` (likelihood and count releases composed), which
  the ledger is charged.

With a budget the step's ``mu`` is fixed (:func:`pymc_penalty.privacy.budget.calibrate`) and the
noise follows the bound; with ``noise_sd`` the noise is fixed and ``mu`` follows. The
owners variant passes one noise sd per owner (an array); everything else is scalar.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from pymc_penalty.accounting.gdp import clip_count_noise_sd, split_step_mu, step_mu_of_release
from pymc_penalty.accounting.sensitivity import ClipMode, Neighbours

__all__ = ["ReleaseNoise", "clip_bound", "l2_sensitivity", "release_noise"]


class ReleaseNoise(NamedTuple):
    """The numbers of one step's release (see the module docstring); ``sigma``, ``count_sd``
    and ``step_mu`` are arrays (one per owner) when ``mu`` or the noise sd was given as an
    array."""

    bound: float
    sensitivity: float
    sigma: float | np.ndarray
    count_sd: float | np.ndarray
    step_mu: float | np.ndarray


def clip_bound(clip: float | None, mode: ClipMode, length: float) -> float:
    """Per-datapoint clip bound ``B`` for one proposal.

    Parameters
    ----------
    clip : float or None
        The clip constant (for ``LIPSCHITZ``, the declared bound ``M`` on every
        ``|d log p(y_i | theta) / d theta_j|``); ``None`` means no clipping (``B = inf``, not
        private).
    mode : ClipMode
        ``DISTANCE``: ``B = clip * ||theta' - theta||_2``; ``METRIC``:
        ``B = clip * ||L^-1 (theta' - theta)||_2``; ``LIPSCHITZ``:
        ``B = clip * ||theta' - theta||_1``; ``CONSTANT``: ``B = clip``.
    length : float
        :func:`step_length` of the proposal on the unconstrained space.

    Returns
    -------
    float
    """
    if clip is None:
        return math.inf
    if mode is ClipMode.CONSTANT:
        return clip
    return clip * length


def l2_sensitivity(bound: float, neighbours: Neighbours) -> float:
    """L2 sensitivity ``Delta`` of the sum of ratios clipped to ``[-bound, bound]``."""
    return neighbours.factor * bound


def release_noise(
    clip: float | None,
    clip_mode: ClipMode,
    neighbours: Neighbours,
    length: float,
    *,
    mu: float | None = None,
    noise_sd: float | np.ndarray | None = None,
    count_share: float = 0.0,
) -> ReleaseNoise:
    """The bound, sensitivity and noise of one release.

    Parameters
    ----------
    clip : float or None
        The clip constant (None: no clipping, infinite sensitivity).
    clip_mode : ClipMode
        How the bound scales with the proposal's ``length``.
    neighbours : Neighbours
        The neighbour relation (substitute-one doubles the bound's sensitivity).
    length : float
        The proposal's length in the clip's metric
        (:func:`~pymc_penalty.accounting.sensitivity.step_length`).
    mu : float or ndarray, optional
        The step's Gaussian-DP ``mu`` (likelihood and count releases together; one per owner
        as an array). Exactly one of ``mu`` and ``noise_sd`` is given. With ``mu`` the
        arithmetic also traces under JAX (``length`` and ``clip`` may be traced values).
    noise_sd : float or ndarray, optional
        Fixed noise sd of the likelihood release (one per owner as an array).
    count_share : float, default 0
        Share in ``[0, 1)`` of the step's ``mu^2`` spent on the clipped count (0: no count).

    Returns
    -------
    ReleaseNoise
    """
    if (mu is None) == (noise_sd is None):
        raise ValueError("Give exactly one of `mu` and `noise_sd`.")
    bound = clip_bound(clip, clip_mode, length)
    delta = l2_sensitivity(bound, neighbours)
    if mu is not None:
        if np.ndim(mu) == 0:  # one step's release (the per-step path: plain floats, no NumPy)
            step_mu = float(mu)
            mu_ll, mu_count = split_step_mu(step_mu, count_share)
            count_sd = 1.0 / mu_count if mu_count > 0 else math.inf  # inf: no count released
            return ReleaseNoise(bound, delta, delta / mu_ll, count_sd, step_mu)
        step_mu = np.asarray(mu, dtype=np.float64)
        mu_ll, mu_count = split_step_mu(step_mu, count_share)
        with np.errstate(divide="ignore"):
            count_sd = np.divide(1.0, mu_count)  # inf: no count released
        return ReleaseNoise(bound, delta, delta / mu_ll, count_sd, step_mu)
    sigma = noise_sd if np.ndim(noise_sd) else float(noise_sd)
    if not math.isfinite(delta):
        inf = np.full(np.shape(sigma), math.inf) if np.ndim(sigma) else math.inf
        return ReleaseNoise(bound, delta, sigma, inf, inf)
    mu_ll = delta / sigma
    if count_share > 0:
        count_sd = np.vectorize(clip_count_noise_sd, otypes=[float])(mu_ll, count_share)
        count_sd = count_sd if np.ndim(sigma) else float(count_sd)
    else:
        count_sd = np.full(np.shape(sigma), math.inf) if np.ndim(sigma) else math.inf
    return ReleaseNoise(bound, delta, sigma, count_sd, step_mu_of_release(mu_ll, count_share))
