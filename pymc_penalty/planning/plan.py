"""What ``pymc_penalty.sample`` decides before spending: the warm start's share, the tuning
length, each chain's start and the planned cost of each phase (public quantities only).

The rules and the measurements behind them are in the functions' docstrings and in
``docs/choosing-parameters.md``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pymc as pm

from pymc_penalty.accounting.sensitivity import Neighbours
from pymc_penalty.privacy.budget import RunPlan
from pymc_penalty.sampling.adaptation import RW_SCALE
from pymc_penalty.sampling.adaptation.clip import clip_target_fraction
from pymc_penalty.sampling.options import ClipPolicy, PrivacyPolicy, ProposalPolicy, fill_defaults
from pymc_penalty.sampling.step import PenaltyMetropolis
from pymc_penalty.warmstart import WarmStart, split_point
from pymc_penalty.warmstart.scoring import settled_clip

__all__ = [
    "AUTO_WARM_START_SHARE",
    "CLIP_TAIL_POWER",
    "chain_starts",
    "clip_tail",
    "phase_report",
    "positive_definite",
    "resolve_chains",
    "resolve_method",
    "resolve_tune",
    "resolve_warm_start",
    "warm_start_report",
    "warm_step_kwargs",
]


#: Share of the budget's ``mu^2`` that ``warm_start="auto"`` spends on the warm start.
#: Measured against 0.35 with the other defaults (RMS error of the posterior mean in posterior
#: sd over seeds with fresh noise, +- one standard error; `benchmarks/utility_table.py`'s
#: workloads): logistic n = 1e5, epsilon = 1, 16 seeds: 0.360 +- 0.019 / 0.313 +- 0.014 (0.5:
#: 0.404 over 6); logistic n = 1e4, epsilon = 6, 10 seeds: 0.308 +- 0.037 / 0.261 +- 0.022;
#: gauss n = 1e4, epsilon = 6, 10 seeds: 0.377 +- 0.057 / 0.430 +- 0.050. Flat within about
#: two standard errors, and the two workloads disagree on the direction: 0.2 is kept.
AUTO_WARM_START_SHARE = 0.2


def resolve_method(
    method: str, warm_start: float, *, backend: str, parties: Any, clip_mode: str
) -> str:
    """``pp.sample``'s path: ``"auto"`` is ``"taylor"`` wherever it applies (a warm start, the
    PyMC backend, no owners, ``clip_mode="metric"``; ``parties`` are the owners: one
    curator's shards run it), else ``"penalty"``; a method given is kept (its combinations
    are checked before: ``validation``).

    Measured (``benchmarks/model_suite.py``, n = 1e4, epsilon 1 and 2, five models, 4 data
    sets per cell; docs/benchmarks/model-suite-taylor.md): the Taylor path's 90% intervals
    covered the truth in 0.85-1.00 of the cases in every cell (the plain walk's 0.17-1.00,
    below 0.85 in 7 of 10 cells), its chains reached "converged" in 14 of the 20 runs at
    epsilon 2 and 12 of 20 at epsilon 1 (the plain walk in none of 40), and its RMS error was
    lower in 8 of 10 cells.
    """
    if method != "auto":
        return method
    applies = warm_start > 0 and backend == "pymc" and parties is None and clip_mode == "metric"
    return "taylor" if applies else "penalty"


def resolve_warm_start(
    warm_start: float | str,
    model: pm.Model,
    pm_sample_kwargs: dict,
    owners: Any,
    neighbours: Any,
) -> float:
    """The warm start's share of the budget. ``"auto"`` is :data:`AUTO_WARM_START_SHARE`, and 0
    with ``initvals`` or ``owners`` given or for a model without gradients.

    Under add/remove-one ``neighbours`` too: there n is private, and the warm start's first
    step releases a noisy count of it (charged to the same share), from which
    ``pymc_penalty.sample`` starts the chains' found clip and makes its forecast. Measured
    (add/remove-one, draws 300-500, 2 chains, RMS error of the posterior mean in posterior sd
    and largest R-hat, without / with the warm start): gauss n = 1e4, epsilon = 6: 12-45 sd,
    R-hat 2.7-3.2 (seeds 1-4) / 0.08-0.81 sd (median 0.23), R-hat 1.18-1.88 (23 runs with
    fresh noise); Normal mean, n = 2e4, seeds
    1-8: epsilon = 1: 0.0-6.9 (median 0.23), R-hat 1.1-3.0 / 0.07-0.57, R-hat 1.09-1.65;
    epsilon = 2: 0.04-0.27, R-hat 1.04-1.39 / 0.02-0.24, R-hat 1.03-1.13.

    Also when the forecast is poor or hopeless: there the budget cannot give a converged
    posterior whatever the split (``pp.sample`` warns before spending), but chains started
    from the model's initial point never reach the posterior at all. Measured with the
    defaults otherwise (`benchmarks/utility_table.py`, one seed per cell), RMS error in
    posterior sd without / with the warm start: gauss n = 1e4, epsilon = 2: 27.6 / 1.14;
    epsilon = 0.5: 28.4 / 15.3; logistic n = 1e4, epsilon = 1: 10.9 / 1.00; n = 1e5,
    epsilon = 0.5: 20.9 / 1.69."""
    if not (isinstance(warm_start, str) and warm_start == "auto"):
        return float(warm_start)
    if owners is not None or "initvals" in pm_sample_kwargs:
        return 0.0
    Neighbours.parse(neighbours)  # a valid relation (either gets the warm start)
    if any(v.dtype in pm.discrete_types for v in model.value_vars):
        return 0.0  # refused by the step; the warm start needs gradients
    return AUTO_WARM_START_SHARE


#: Tuning steps per chain with ``tune="auto"`` and no warm start (``pm.sample``'s default).
_COLD_TUNE = 1000
#: With a warm start, ``tune="auto"`` tunes for this share of the draws, within the bounds.
#: Measured (``benchmarks/defaults_seeds.py``, draws 1000, 4 chains, RMS error of the posterior
#: mean in posterior sd over seeds, +- one standard error; a third of the draws, 333 steps,
#: against 100): gauss n = 1e5, epsilon 2: 0.43 (0.486 +- 0.080 over 9 seeds, 0.395 +- 0.046
#: over 8 earlier) against 0.295 +- 0.028 over 20; logistic n = 1e5, epsilon 1: 0.342 +- 0.013
#: against 0.328 +- 0.021 (24 seeds each; 50 steps: 0.371 +- 0.029 over 14); gauss n = 1e4,
#: epsilon 6: 0.322 +- 0.047 against 0.323 +- 0.032; logistic n = 1e4, epsilon 1: 0.78 +- 0.10
#: against 0.73 +- 0.15 (8 seeds each). Started at the warm start's
#: estimate (centred, :func:`chain_starts`), a noise-limited chain drifts from it as it tunes:
#: the chains' first draws after 333 tuning steps were 0.60 sd from the posterior mean where
#: the warm start was 0.22 (gauss, epsilon 2), after 100 steps 0.40 (0.20).
#: The cost: the found clip, which starts at its Gaussian-tail value and only rises, has less
#: time to rise where the rows' ratios have heavier tails, and clips more. ``peer_probe.py``
#: at n = 1e4, epsilon 6 (8 seeds each, 100 against 333 steps): poisson_reg 0.537 +- 0.056
#: against 0.408 +- 0.040 (the clip ending at 0.048 against 0.059), linreg_sigma 0.661 +-
#: 0.082 against 0.445 +- 0.038, heights 0.692 +- 0.087 against 0.539 +- 0.075, logistic_raw
#: 0.502 +- 0.090 against 0.604 +- 0.098; over the four 0.60 against 0.50. The found clip
#: now starts from the warm start's released tail (:func:`clip_tail`), and with it the four
#: gave 0.383 at 100 steps (0.388, 0.264, 0.390, 0.464; clips 0.057, 0.043, 0.053, 0.059).
_WARM_TUNE_SHARE = 0.1
_WARM_TUNE_BOUNDS = (100, 1000)


def resolve_tune(tune: int | str, draws: int, warm_start: float) -> int:
    """Tuning steps per chain: ``"auto"`` is 1000 without a warm start (the chains travel
    from the model's initial point) and a tenth of ``draws`` within [100, 1000] with one.

    Every tuning step costs as much privacy as a draw, and the budget buys a fixed total
    squared distance, so the tuning share is taken from the draws' effective sample size.
    Started from the warm start's approximation with its metric kept, the chains need no
    travel, only the scaling and the clip: on the gauss workload (n = 1e5, d = 10,
    epsilon = 2) the scaling settled within 50 steps. The clip starts at its Gaussian-tail
    value in the warm start's metric and moves only up, on heavier tails (it settled within
    300 steps there, one chain of four moving it once more at 500-700); tuning that long cost
    more than those moves gained (:data:`_WARM_TUNE_SHARE`)."""
    if not (isinstance(tune, str) and tune == "auto"):
        return int(tune)
    if warm_start <= 0:
        return _COLD_TUNE
    low, high = _WARM_TUNE_BOUNDS
    return int(min(max(round(draws * _WARM_TUNE_SHARE), low), high))


#: Chains with ``chains="auto"``: ``pm.sample``'s usual 4, and 8 after a warm start where the
#: forecast (for 4 chains) promises between :data:`_MANY_CHAINS_ESS` effective draws (inclusive)
#: and :data:`_MIXING_ESS` (exclusive). The
#: budget buys a fixed total squared distance, split over the chains; started at centred
#: draws from the warm start's approximation (:func:`chain_starts`), each chain then moves
#: less, and the random-walk error its moves add to the pooled mean falls about as one over
#: the number of chains, while the warm start's own error stays. Where the warm start is far
#: off (a small budget) the chains' moves are what corrects it, and fewer, longer-moving
#: chains correct more. Measured (``benchmarks/defaults_seeds.py``, 1000 draws, RMS error of
#: the posterior mean in posterior sd over seeds +- one standard error, the warm start's own
#: RMS error in brackets; 4 -> 8 chains; the forecast's ESS first):
#:
#: - 2.2, logistic n = 1e5, epsilon 1: 0.341 +- 0.015 (0.313; 44 seeds) -> 0.268 +- 0.020
#:   (0.270; 20 seeds; 8 chains of 500 draws: 0.310 +- 0.025 (0.329)); 2 chains 0.399 +-
#:   0.024 (0.247);
#: - 7.7, epsilon 2: 0.207 (0.190) -> 0.194 (0.203; 10 seeds each); 52, epsilon 6: 0.108 +-
#:   0.010 (0.059) -> 0.098 +- 0.006 (0.057; 10 seeds each);
#: - 8.0, gauss n = 1e4, epsilon 6: 0.323 +- 0.032 (0.248) -> 0.211 (0.180; 8 seeds each);
#:   7.9, gauss n = 1e5, epsilon 2: 0.295 +- 0.028 (0.196; 20 seeds) -> 0.239 (0.155; 3);
#: - below 2, 4 chains did better: 0.39, logistic n = 1e4, epsilon 1: 0.734 +- 0.153 (0.869)
#:   -> 0.962 (1.044; 8 seeds each); 1.17, gauss n = 1e4, epsilon 2: 1.39 -> 3.97 and 1.33,
#:   logistic n = 1e4, epsilon 2: 0.255 -> 0.385 (``benchmarks/utility_table.py``, 4 seeds
#:   each).
#:
#: - from 20 up the chains mix (R-hat about 1.1) and forget their starts, so their number no
#:   longer matters to the error, while 8 compute twice the steps of 4: 52, logistic n = 1e5,
#:   epsilon 6: 0.108 -> 0.098 (above); 56, gauss n = 1e5, epsilon 6: 0.162 +- 0.007 ->
#:   0.192 +- 0.043 (``benchmarks/utility_table.py``, 4 seeds each).
#:
#: The thresholds sit between the cells measured on either side (1.33 and 2.2; 8 and 52).
_COLD_CHAINS = 4
_WARM_CHAINS = 8
_MANY_CHAINS_ESS = 2.0
_MIXING_ESS = 20.0


def resolve_chains(chains: int | str, warm_start: float, forecast_ess: float | None) -> int:
    """Chains: ``"auto"`` is 8 after a warm start when the forecast for 4 chains
    (``forecast_ess``, None where there is none) is at least 2 and below 20 effective draws,
    otherwise 4 (:data:`_WARM_CHAINS`); a number is kept."""
    if not (isinstance(chains, str) and chains == "auto"):
        return int(chains)
    if warm_start > 0 and forecast_ess is not None:
        if _MANY_CHAINS_ESS <= forecast_ess < _MIXING_ESS:
            return _WARM_CHAINS
    return _COLD_CHAINS


#: Power of the warm start's clip ratio that starts the sampler's found clip
#: (:func:`clip_tail`). Measured (``benchmarks/peer_probe.py``'s models, n = 1e4, epsilon 6):
#: the warm start's found gradient clip over its Gaussian start was 1.8-2.4 (poisson_reg),
#: 1.9-2.3 (linreg_sigma), 1.73-1.81 (heights), 1.29-1.42 (logistic_raw), 1.0-1.12
#: (student_t), 1.0-1.4 (beta_bernoulli; 4 seeds each), and the sampler's found clip after
#: 333 tuning steps over its own start 1.71, 1.59, 1.57, 1.26, 1.0 and 1.0 (8 seeds' mean):
#: about the 0.75th power. On the utility table's gauss and logistic workloads the ratio was
#: exactly 1 (n = 1e4, epsilon 6; n = 1e5, epsilon 2 and 1; 3 seeds each): no change there.
#: The ratio is taken against the clip Gaussian scores would settle at: the chi quantile at the
#: warm start's own target
#: (:func:`~pymc_penalty.sampling.adaptation.clip.clip_target_fraction`, which falls below
#: the start's 0.1% where its ``mu n`` is over 2.4e4: gauss n = 1e5 at epsilon 6,
#: n = 1e6), never below the start; there the found clip rises even on Gaussian scores (d = 5 at
#: 0.01%: by 1.14), which says nothing about heavier tails.
CLIP_TAIL_POWER = 0.75


def clip_tail(warm: WarmStart) -> float:
    """The factor on the sampler's found clip's start after a warm start: the warm start's
    found gradient clip over the clip Gaussian scores would settle at, to the power
    :data:`CLIP_TAIL_POWER`; 1 when the warm start released no clipped count (its clip was
    given, not found).

    The sampler's found clip starts at its Gaussian-tail value in the posterior-shaped metric
    and only rises (it holds), so on rows with heavier tails it clips more than its target
    until the released counts have moved it, which a short tuning leaves unfinished. The warm
    start's own found clip, released, says how much heavier the rows' tails are. Gaussian
    scores settle at the chi quantile of the warm start's clip target (the Gaussian start, or
    above it where the target is below the start's tail): a function of released and public
    values only (no privacy cost)."""
    if warm.clipped_fraction is None:
        return 1.0
    gaussian = settled_clip(warm.point.size, clip_target_fraction(warm.n_rows, mu=warm.mu))
    return max(float(warm.clip) / gaussian, 1.0) ** CLIP_TAIL_POWER


def positive_definite(cov: np.ndarray) -> np.ndarray:
    """``cov`` symmetrised, its eigenvalues floored at ``1e-12`` of the largest: the inverse of
    a released precision can lose definiteness to rounding when it is ill conditioned."""
    vals, vecs = np.linalg.eigh(0.5 * (cov + cov.T))
    vals = np.maximum(vals, 1e-12 * max(float(vals.max()), 1e-300))
    out = (vecs * vals) @ vecs.T
    return 0.5 * (out + out.T)


def chain_starts(warm: WarmStart, chains: int, random_seed: Any) -> list[dict[str, np.ndarray]]:
    """One start per chain from the warm start's Gaussian approximation ``N(point,
    covariance)``, centred on its point (post-processing of released values: no privacy cost).

    Each start is marginally a draw from the approximation, and the starts' mean is the
    point itself: the standard normal offsets have their mean removed and are rescaled by
    ``sqrt(chains / (chains - 1))`` (one chain starts at the point). Chains that all start at
    the estimated mode begin with no spread, and a noise-limited chain moves too little in one
    run to build it: on the gauss workload (epsilon = 2) their sd was 0.71 of the posterior's
    and R-hat 3.9. Independent draws give the spread but, where the chains barely move, their
    mean keeps the draws' own error, ``1 / sqrt(chains)`` posterior sd on top of the warm
    start's: centring removes it."""
    seed = random_seed if isinstance(random_seed, int | np.integer) else None
    rng = np.random.default_rng(None if seed is None else [int(seed), 0x5EED])
    vals, vecs = np.linalg.eigh(positive_definite(warm.covariance))
    root = vecs * np.sqrt(vals)
    offsets = rng.standard_normal((chains, warm.point.size))
    if chains > 1:
        offsets = (offsets - offsets.mean(axis=0)) * math.sqrt(chains / (chains - 1.0))
    else:
        offsets[:] = 0.0
    return [split_point(warm.point + root @ z, warm.initvals) for z in offsets]


def warm_start_report(warm: Any, share: float) -> dict[str, Any]:
    """The report's ``dp_warm_start_*`` keys from a warm start's ``mu`` and ``releases``
    (a :class:`~pymc_penalty.warmstart.WarmStart`, or what a run journal kept of one), zeros
    without one."""
    return {
        "dp_warm_start_share": float(share) if warm is not None else 0.0,
        "dp_warm_start_mu": float(warm.mu) if warm is not None else 0.0,
        "dp_warm_start_releases": int(warm.releases) if warm is not None else 0,
    }


def phase_report(step: PenaltyMetropolis, plan: RunPlan) -> dict[str, Any]:
    """What the plan gives tuning and the draws: the tuning steps per chain and the Gaussian-DP
    ``mu`` of each phase over every chain (``sqrt(moves) * mu``; the warm start's is
    ``dp_warm_start_mu``). Planned values: a ledger that refuses earlier spends less."""
    mu = step.mu if step.mu is not None else math.nan
    return {
        "dp_tune": int(plan.tune),
        "dp_tuning_mu": float(mu * math.sqrt(plan.tune * plan.chains)),
        "dp_draws_mu": float(mu * math.sqrt(plan.draws * plan.draw_moves * plan.chains)),
    }


def warm_step_kwargs(
    warm: WarmStart, neighbours: Any, step_kwargs: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The :class:`PenaltyMetropolis` arguments a warm start sets, merged under
    ``step_kwargs`` (grouped, :func:`~pymc_penalty.sampling.options.group_step_options`; a
    value given there is kept): the proposal metric, its scaling and ``ProposalPolicy.adapt``,
    the found clip's ``ClipPolicy.tail`` and, under add/remove-one, the released row count
    (``PrivacyPolicy.released_rows``). Public values only (no privacy cost);
    ``pymc_penalty.sample`` and a budgeted step's own warm start both use it."""
    kwargs = dict(step_kwargs or {})
    if "S" not in kwargs:
        # Keep the warm start's metric: only the scaling adapts. The chain's own
        # covariance is a worse metric while the privacy noise holds it nearly still
        # (gauss, epsilon = 2: adapt="full" left sd ratio 0.71, R-hat 3.9; scaling-only
        # 1.04, 2.6), and a proposal frozen at the posterior's shape is what the metric
        # clip assumes. The step starts at the random-walk scale 2.38 / sqrt(d).
        kwargs["S"] = positive_definite(warm.covariance)
        proposal = kwargs.get("proposal") or ProposalPolicy()
        kwargs["proposal"] = fill_defaults(proposal, adapt="scaling")
        kwargs.setdefault("scaling", RW_SCALE / math.sqrt(warm.point.size))
    # Rows with heavier tails than Gaussian: the found clip starts higher, by the warm
    # start's own found clip (released values only).
    kwargs["clip"] = fill_defaults(kwargs.get("clip") or ClipPolicy(), tail=clip_tail(warm))
    if Neighbours.parse(neighbours) is Neighbours.ADD_REMOVE:
        # n is private: a found clip starts from the warm start's released count (from
        # 1, the chains' noise stayed too large through the 200 tuning steps a warm
        # start gets: gauss n = 1e4, epsilon = 6, R-hat 2.4-3.1).
        privacy = kwargs.get("privacy") or PrivacyPolicy()
        kwargs["privacy"] = fill_defaults(privacy, released_rows=warm.n_rows)
    return kwargs
