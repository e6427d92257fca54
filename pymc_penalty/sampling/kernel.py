"""The penalty test itself: pure NumPy, no PyMC.

The penalty algorithm (Ceperley and Dewing 1999; Yildirim and Ermis 2019) replaces the exact
log-likelihood difference ``d`` of a Metropolis-Hastings step with a noisy release
``d_hat = d + N(0, sigma^2)`` and subtracts ``sigma^2 / 2`` in the acceptance test. When
``sigma^2`` is known and symmetric in (theta, theta'), the chain keeps the exact posterior as
its stationary distribution, because ``E[min(1, exp(d_hat - sigma^2/2 + c))]`` satisfies
detailed balance for every ``sigma``.

Everything here is a function of released (noisy) quantities and public inputs, so it can be
tested in microseconds without compiling a model.

:func:`transition` is the one penalty transition of every step in the package, in the style of
BlackJAX kernels: an immutable :class:`PenaltyState` in, a new state and a
:class:`PenaltyInfo` out. What differs between the variants is only the *release*, the function
that turns the committed budget into a noisy log-likelihood difference: one owner's clipped sum
(:class:`~pymc_penalty.PenaltyMetropolis`), several owners' sums added
(:class:`~pymc_penalty.variants.MultiOwnerPenaltyMetropolis`), a noisy sufficient statistic
(:class:`~pymc_penalty.variants.ExpFamPenaltyMetropolis`) or remote owners' replies
(:func:`pymc_penalty.distributed.sample`). The sample statistics of every step are derived from
:class:`PenaltyInfo` by :func:`info_stats` (the one stats schema, :data:`INFO_STATS`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

# The split of a step's mu between its two releases is composition: it lives in the accountant
# (re-exported here, where it used to be).
from pymc_penalty.accounting.gdp import clip_count_noise_sd, split_step_mu
from pymc_penalty.privacy.precision import snap_accept

__all__ = [
    "INFO_STATS",
    "PenaltyDecision",
    "PenaltyInfo",
    "PenaltyState",
    "Release",
    "StepNoise",
    "clip_count_noise_sd",
    "combine_move_stats",
    "info_stats",
    "penalised_log_ratio",
    "penalty_decision",
    "split_step_mu",
    "stats_dtypes_shapes",
    "transition",
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


# --- the transition ----------------------------------------------------------------------------


class PenaltyState(NamedTuple):
    """State of a penalty chain at one point.

    Attributes
    ----------
    position : ndarray
        The point, raveled on the unconstrained space (public: it is the chain).
    log_prior : float
        Its exact log prior, Jacobians included (no data).
    cache : object, optional
        What a release keeps about the point between steps (the per-datapoint log-likelihood
        vector, or the natural parameters). Private: it never enters an output.
    """

    position: np.ndarray
    log_prior: float
    cache: Any = None


class StepNoise(NamedTuple):
    """What the mechanism fixes for one step, from public inputs only, before any data.

    Build it with :meth:`from_sd` or :meth:`from_var`, whichever the variant computes, so that
    the sd and the variance are the same numbers the variant has always used.

    Attributes
    ----------
    sensitivity : float
        L2 sensitivity ``Delta`` of the release (``dp_sensitivity``).
    noise_sd : float
        Standard deviation of the total noise in ``d_hat`` (``dp_noise_sd``).
    noise_var : float
        Its variance, the ``sigma^2`` the penalty test subtracts half of.
    mu : float
        The step's Gaussian-DP ``mu``; the ledger is charged ``mu^2`` (``dp_mu``).
    party_mu : tuple of (str, float)
        Further per-step ``mu`` statistics (per owner, outsider), zeroed with ``dp_mu`` when
        the ledger refuses the step.
    """

    sensitivity: float
    noise_sd: float
    noise_var: float
    mu: float
    party_mu: tuple[tuple[str, float], ...] = ()

    @classmethod
    def from_sd(
        cls, sensitivity: float, noise_sd: float, mu: float, party_mu: tuple = ()
    ) -> StepNoise:
        """From the noise sd (the variance is its square)."""
        return cls(sensitivity, noise_sd, noise_sd**2, mu, party_mu)

    @classmethod
    def from_var(
        cls, sensitivity: float, noise_var: float, mu: float, party_mu: tuple = ()
    ) -> StepNoise:
        """From the noise variance (the sd is its square root)."""
        return cls(sensitivity, math.sqrt(noise_var), noise_var, mu, party_mu)


class Release(NamedTuple):
    """What a release function returns once the step's budget is committed.

    Attributes
    ----------
    d_hat : float
        The released (noisy) log-likelihood difference, proposal minus current point.
    proposal : PenaltyState
        The proposed point with its exact log prior and its cache.
    clipped_count : float, default NaN
        The released number of clipped datapoints (NaN when not released).
    clipped_fraction : float, default NaN
        That count as a fraction of the datapoints, where the count of datapoints is public.
    current : PenaltyState, optional
        The current state, when the release had to rebuild its cache (its log prior was then
        not known before the budget was committed); None keeps the state passed in.
    """

    d_hat: float
    proposal: PenaltyState
    clipped_count: float = math.nan
    clipped_fraction: float = math.nan
    current: PenaltyState | None = None


class PenaltyInfo(NamedTuple):
    """What one transition did: public quantities only.

    Attributes
    ----------
    accept : float
        Acceptance probability given the release (0 when refused), on the published grid
        (:func:`pymc_penalty.privacy.precision.snap_accept`; its expectation is the exact one).
    accepted : bool
        Whether the proposal was accepted.
    released : bool
        Whether the ledger paid for the step (False: nothing was released).
    noise_sd, sensitivity : float
        As in :class:`StepNoise`.
    mu : float
        The ``mu`` charged (0 when refused).
    clipped_count, clipped_fraction : float
        As in :class:`Release` (NaN when refused).
    d_hat : float
        The release (NaN when refused). Not a sample statistic.
    party_mu : tuple of (str, float)
        As in :class:`StepNoise`, zero when refused.
    """

    accept: float
    accepted: bool
    released: bool
    noise_sd: float
    sensitivity: float
    mu: float
    clipped_count: float
    clipped_fraction: float
    d_hat: float
    party_mu: tuple[tuple[str, float], ...] = ()


#: The one stats schema: :class:`PenaltyInfo` field -> (sample statistic, dtype). ``d_hat`` and
#: ``party_mu`` are not in it (the first is not recorded, the second names its own statistics).
INFO_STATS: dict[str, tuple[str, Any]] = {
    "accept": ("accept", np.float64),
    "accepted": ("accepted", np.float64),  # 1.0 / 0.0, as pm.Metropolis records it
    "released": ("dp_released", bool),
    "noise_sd": ("dp_noise_sd", np.float64),
    "sensitivity": ("dp_sensitivity", np.float64),
    "mu": ("dp_mu", np.float64),
    "clipped_fraction": ("dp_clipped_fraction", np.float64),
    "clipped_count": ("dp_clipped_count", np.float64),
}


def stats_dtypes_shapes() -> dict[str, tuple[Any, list]]:
    """PyMC ``stats_dtypes_shapes`` of the statistics :func:`info_stats` returns."""
    return {name: (dtype, []) for name, dtype in INFO_STATS.values()}


#: Statistic names of PenaltyInfo's leading fields, in order, for :func:`info_stats` (a KeyError
#: at import if a field is added among them without a statistic).
_STAT_FIELDS = len(INFO_STATS)
_STAT_NAMES = tuple(INFO_STATS[f][0] for f in PenaltyInfo._fields[:_STAT_FIELDS])


def info_stats(info: PenaltyInfo) -> dict[str, Any]:
    """The sample statistics of one transition (the one place they are named)."""
    stats = dict(zip(_STAT_NAMES, info[:_STAT_FIELDS], strict=True))
    stats["accepted"] = float(info.accepted)  # bool in the info, float64 in the trace
    if info.party_mu:
        stats.update(info.party_mu)
    return stats


def combine_move_stats(moves: list[dict[str, Any]]) -> dict[str, Any]:
    """The statistics of one draw made of several released moves (a run plan's
    ``moves_per_draw``, charged as one release): the last move's, with ``accept`` and the
    clipped count and fraction averaged over the moves, ``accepted`` 1.0 when any move was
    accepted, and every ``dp_mu*`` the moves' Gaussian-DP composition ``sqrt(sum mu^2)``
    (what the draw's release was charged). One move's statistics are returned as they are.
    Functions of released values only."""
    if len(moves) == 1:
        return moves[0]
    out = dict(moves[-1])
    for name in ("accept", "dp_clipped_count", "dp_clipped_fraction"):
        out[name] = float(np.mean([m[name] for m in moves]))
    out["accepted"] = float(any(m["accepted"] for m in moves))
    for name in out:
        if name.startswith("dp_mu"):
            out[name] = math.sqrt(sum(float(m[name]) ** 2 for m in moves))
    return out


def refused_info(noise: StepNoise) -> PenaltyInfo:
    """Info of a step the ledger refused: nothing released, nothing charged."""
    nan = math.nan
    zero_mu = tuple((name, 0.0) for name, _ in noise.party_mu)
    return PenaltyInfo(
        0.0, False, False, noise.noise_sd, noise.sensitivity, 0.0, nan, nan, nan, zero_mu
    )


def transition(
    rng: np.random.Generator,
    state: PenaltyState,
    position: np.ndarray,
    noise: StepNoise,
    release: Callable[[PenaltyState, np.ndarray], Release],
    *,
    charge: Callable[[float], bool] | None = None,
    penalty: bool = True,
) -> tuple[PenaltyState, PenaltyInfo]:
    """One penalty transition: charge, release, penalised test.

    Parameters
    ----------
    rng : numpy.random.Generator
        The chain's generator; one uniform is drawn after the release (none when refused).
    state : PenaltyState
        The current state.
    position : ndarray
        The proposal, drawn by the caller from a symmetric proposal (no data).
    noise : StepNoise
        The step's sensitivity, noise and ``mu`` (public inputs only).
    release : callable
        ``release(state, position) -> Release``: the only variant-specific part, and the only
        code that reads data. Called only after ``charge`` succeeded.
    charge : callable, optional
        ``charge(mu2) -> bool``: commit the step's cost ``noise.mu ** 2`` (a ledger's
        ``try_spend``). False refuses the step: the state is returned unchanged, and neither
        the release nor the generator is called. None: the caller has charged already.
    penalty : bool, default True
        Subtract ``noise_var / 2`` (False only to show that statistical tests have power).

    Returns
    -------
    (PenaltyState, PenaltyInfo)
    """
    if charge is not None and not charge(noise.mu**2):
        return state, refused_info(noise)
    out = release(state, position)
    current = state if out.current is None else out.current
    log_ratio = penalised_log_ratio(
        out.d_hat, noise.noise_var, out.proposal.log_prior - current.log_prior, penalty=penalty
    )
    u = rng.random()
    decision = penalty_decision(log_ratio, math.log(u) if u > 0.0 else -math.inf)
    info = PenaltyInfo(
        # Published on its grid, rounded with the decision's own uniform (unbiased); the
        # decision above used the exact test (pymc_penalty.privacy.precision).
        snap_accept(decision.accept_prob, u),
        decision.accepted,
        True,
        noise.noise_sd,
        noise.sensitivity,
        noise.mu,
        out.clipped_count,
        out.clipped_fraction,
        out.d_hat,
        noise.party_mu,
    )
    return (out.proposal if decision.accepted else current), info
