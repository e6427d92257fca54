"""The penalty test itself: pure NumPy, no PyMC.

The penalty algorithm (Ceperley and Dewing 1999; Yildirim and Ermis 2019) replaces the exact
log-likelihood difference ``d`` of a Metropolis-Hastings step with a noisy release
``d_hat = d + N(0, sigma^2)`` and subtracts ``sigma^2 / 2`` in the acceptance test. When
``sigma^2`` is known and symmetric in (theta, theta'), the chain keeps the exact posterior as
its stationary distribution, because ``E[min(1, exp(d_hat - sigma^2/2 + c))]`` satisfies
detailed balance for every ``sigma``.

Everything here is a function of released (noisy) quantities and public inputs, so it can be
tested in microseconds without compiling a model.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

__all__ = [
    "PenaltyDecision",
    "clip_count_noise_sd",
    "penalised_log_ratio",
    "penalty_decision",
    "split_step_mu",
]


class PenaltyDecision(NamedTuple):
    """Outcome of one penalised acceptance test.

    Attributes
    ----------
    log_ratio : float
        ``d_hat - sigma^2 / 2 + log prior ratio + log proposal ratio`` (noisy).
    accept_prob : float
        ``min(1, exp(log_ratio))``, the acceptance probability given the release.
    accepted : bool
        Whether the proposal was accepted.
    """

    log_ratio: float
    accept_prob: float
    accepted: bool


def penalised_log_ratio(
    d_hat: float,
    noise_var: float,
    log_prior_ratio: float,
    log_proposal_ratio: float = 0.0,
    *,
    penalty: bool = True,
) -> float:
    """Log acceptance ratio of the penalty test.

    Parameters
    ----------
    d_hat : float
        Released (noisy) log-likelihood difference between proposal and current point.
    noise_var : float
        Variance ``sigma^2`` of the Gaussian noise in ``d_hat``; must be symmetric in the two
        points for the chain to be exact.
    log_prior_ratio : float
        ``log p(theta') - log p(theta)``, transform Jacobians included (no data: exact).
    log_proposal_ratio : float, default 0
        ``log q(theta | theta') - log q(theta' | theta)``; zero for symmetric proposals.
    penalty : bool, default True
        Subtract ``sigma^2 / 2``. Turning it off gives a biased chain and exists only so tests
        can show that the statistical checks have power.

    Returns
    -------
    float
        The log acceptance ratio; ``-inf`` when any term is NaN.
    """
    value = d_hat + log_prior_ratio + log_proposal_ratio
    if penalty:
        value -= 0.5 * noise_var
    if math.isnan(value):
        return -math.inf
    return float(value)


def penalty_decision(log_ratio: float, log_u: float) -> PenaltyDecision:
    """Accept or reject given the log ratio and ``log(U)`` with ``U ~ Uniform(0, 1)``.

    Parameters
    ----------
    log_ratio : float
        Output of :func:`penalised_log_ratio`.
    log_u : float
        Logarithm of a uniform draw.

    Returns
    -------
    PenaltyDecision
    """
    accept_prob = math.exp(min(0.0, log_ratio))
    return PenaltyDecision(log_ratio, accept_prob, bool(log_u < log_ratio))


def split_step_mu(step_mu: float, count_share: float) -> tuple[float, float]:
    """Split one step's Gaussian-DP ``mu`` between the likelihood release and the clip count.

    Each step releases two Gaussian mechanisms: the clipped log-likelihood difference and
    (optionally) the number of clipped datapoints. Their composition is ``mu``-GDP with
    ``mu^2 = mu_ll^2 + mu_count^2``; ``count_share`` is the share of ``mu^2`` given to the
    count.

    Parameters
    ----------
    step_mu : float
        Total per-step ``mu``.
    count_share : float
        Share in ``[0, 1)`` of ``step_mu^2`` spent on the clip count.

    Returns
    -------
    tuple of float
        ``(mu_ll, mu_count)``.
    """
    return step_mu * np.sqrt(1.0 - count_share), step_mu * np.sqrt(count_share)


def clip_count_noise_sd(mu_ll: float, count_share: float) -> float:
    """Noise sd for the clip count so that it takes ``count_share`` of the step's ``mu^2``.

    The number of clipped datapoints changes by at most one between neighbouring datasets
    (both relations), so its sensitivity is 1 and its ``mu`` is ``1 / sd``.

    Parameters
    ----------
    mu_ll : float
        ``mu`` of the likelihood release of this step.
    count_share : float
        Share in ``(0, 1)`` of the step's total ``mu^2`` for the count.

    Returns
    -------
    float
        The count's noise standard deviation (``inf`` when ``mu_ll`` is zero).
    """
    mu_count_sq = mu_ll**2 * count_share / (1.0 - count_share)
    if mu_count_sq <= 0.0:
        return np.inf
    return float(1.0 / np.sqrt(mu_count_sq))
