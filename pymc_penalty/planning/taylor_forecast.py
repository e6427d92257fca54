"""The Taylor path's forecast: the effective sample size its chains will reach.

``pp.sample(method="taylor")`` spends most of its budget once (the one-shot release of the
rows' Taylor sums); its chains pay per step only for the clipped residual sum, and the
residual clip is raised until a typical move's noise sd is about
:data:`~pymc_penalty.sampling.taylor.RESIDUAL_NOISE_SD`
(:func:`~pymc_penalty.sampling.taylor.noise_limited_clip`). Their effective sample size is
therefore set by the random walk itself, not by the budget's distance as on the plain path
(:mod:`pymc_penalty.planning.forecast`): a random-walk Metropolis chain in ``d`` dimensions,
tuned to acceptance 0.234 with its full covariance adapted over ``tune`` steps, whose log
ratio carries Gaussian noise of sd proportional to the move's length.

Where the noise enters (the random walk's diffusion limit, Roberts, Gelman and Gilks 1997, with
the penalty test's noise, Ceperley and Dewing 1999). A move of whitened length ``l`` changes a
Gaussian target's log density by about ``N(-l^2 / 2, l^2)``; the penalty test adds noise of
variance ``s^2`` and subtracts ``s^2 / 2``, so it accepts with probability
``2 Phi(-sqrt(l^2 + s^2) / 2)``, and the chain's efficiency is proportional to ``l^2`` times
that. The residual bound grows with the move (``B = r max(|u|, |u'|, 1)^order |u' - u|``), so
``s = a l``: at the package's probe moves (``l = 2.38``) the noise sd is ``sigma``, hence
``a = sigma / 2.38``. Then ``l^2 + s^2 = l^2 (1 + a^2)``: tuning to acceptance 0.234 still
finds the best step, ``l = 2.38 / sqrt(1 + a^2)``, and the efficiency is the noise-free one
over

    1 + kappa sigma^2,   kappa = 1 / 2.38^2 * k / median(chi^2_k),

where the last factor (1 for large ``k``, 2.2 for ``k = 1``) turns the probes' median move
into the chains' mean squared one (``k`` the coordinates the likelihood reads). A noise sd of
1 costs about 15%.

The noise-free efficiency is measured, not derived: the smallest bulk ESS over the
coordinates (what ``dp_ess_bulk_min`` reports) per kept draw of the package's own tuning
(:class:`~pymc_penalty.sampling.adaptation.ProposalAdapter`, full covariance, first window
100 steps) on a Gaussian target, by ``scripts/taylor_ess_sim.py`` (6 runs of 4 chains per
cell). It is about ``0.25 / d`` for the mean over coordinates; the smallest falls further
below as ``d`` grows, since 500 tuning steps estimate a covariance in ``d`` dimensions from
few effective draws (0.93 of the mean at ``d = 4``, 0.63 at 10, 0.23 at 30). The table holds
it for ``d`` from 1 to 30, tuning 200 to 2000 steps and 1000 to 4000 draws per chain,
interpolated in the logarithms and held at the edges (beyond ``d = 30`` extrapolated as
``1 / d^2``).

Where the chains start. They start at draws around the released model's mode (the exact
prior times the released model, found by a damped Newton search within ``NEWTON_RADIUS
sqrt(d)`` whitened units of the expansion point, :data:`~pymc_penalty.warmstart.taylor.
NEWTON_RADIUS`). A start on that bound is not a mode: the released model and the warm start
disagree by more than the search's reach, and the chains begin an unknown distance from the
posterior. Measured (``benchmarks/model_suite.py``'s hierarchical model and
``scripts/taylor_forecast_check.py``'s gamma and negative binomial regressions, n = 1e4,
epsilon 1 and 2, 4 chains of 4000 draws): of 13 runs whose start lay on the bound, 11 never
converged (R-hat 1.31-4.19, smallest bulk ESS 4.3-10.5), 2 did in part (R-hat 1.02-1.04,
ESS 74-171); every run off the bound reached R-hat 1.05 or less. (Those runs had a bound
of 10 and a search model that could curve upward; with the concave search and a bound of
100 no run of ``scripts/taylor_start_diagnostics.py`` stops on it.) ArviZ's bulk ESS of chains
held apart is about one per chain (4.4 for 4), and chains that drift part of the way reach a
few more, so there the forecast is two effective draws per chain (``start_found=False``),
whatever the run's length: a warning that the run will not converge, not a measurement.

The forecast is of the raw chain's draws (the ``posterior_tilted`` group): their Monte Carlo
error is ``1 / sqrt(ESS)`` of their sds. The published posterior adds the one-shot noise's
spread, which no number of draws removes. A posterior far from Gaussian (a funnel, a
boundary, several modes) mixes slower than this model: the forecast is what the chains reach
on a posterior the released model describes well.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import chi2

from pymc_penalty.accounting.gdp import likelihood_mu2
from pymc_penalty.accounting.sensitivity import Neighbours
from pymc_penalty.errors import UtilityWarning
from pymc_penalty.planning.forecast import forecast_verdict
from pymc_penalty.privacy.budget import RunPlan
from pymc_penalty.sampling.adaptation import RW_SCALE
from pymc_penalty.sampling.taylor import TaylorModel, compare_moves
from pymc_penalty.validation import check_integer, check_real
from pymc_penalty.warmstart.taylor import NEWTON_RADIUS

__all__ = [
    "TaylorForecast",
    "forecast_taylor",
    "start_offset",
    "taylor_forecast_report",
    "typical_noise_sd",
]

#: The grid of the noise-free efficiency table: dimensions, tuning steps, draws per chain.
_DIMS = (1, 2, 3, 4, 6, 8, 10, 14, 20, 30)
_TUNES = (200, 500, 1000, 2000)
_DRAWS = (1000, 4000)
#: Smallest bulk ESS over the coordinates (4 chains, all draws), noise-free, by
#: ``[tune][draws][d]`` (``scripts/taylor_ess_sim.py --table``; 6 runs per cell).
_ESS_MIN = {
    200: {
        1000: (600.2, 364.7, 282.4, 190.0, 125.9, 73.2, 40.9, 32.8, 14.3, 9.5),
        4000: (2551.9, 1675.7, 1214.8, 881.9, 511.1, 370.4, 278.3, 131.8, 63.2, 34.8),
    },
    500: {
        1000: (623.0, 454.4, 295.9, 214.1, 120.4, 73.7, 59.4, 34.3, 12.4, 7.2),
        4000: (2402.0, 1800.8, 1231.3, 924.5, 580.7, 446.3, 260.2, 143.0, 73.9, 29.8),
    },
    1000: {
        1000: (601.6, 449.3, 303.9, 218.9, 134.5, 97.0, 58.4, 39.5, 13.6, 11.0),
        4000: (2413.0, 1791.5, 1263.5, 977.1, 631.0, 433.8, 324.8, 169.4, 88.2, 39.0),
    },
    2000: {
        1000: (561.8, 399.7, 314.2, 250.2, 145.3, 110.0, 71.0, 34.2, 15.6, 8.6),
        4000: (2531.2, 1840.4, 1314.6, 1008.9, 705.4, 481.0, 368.1, 230.2, 91.1, 34.7),
    },
}
_TABLE_CHAINS = 4
#: The probes' move length (whitened units) at which the typical noise sd is stated.
_PROBE_STEP = RW_SCALE
#: Effective draws per chain forecast where the start is on the search's bound.
_LOST_ESS_PER_CHAIN = 2.0
#: A start offset (:func:`start_offset`) from this on is on the search's bound (rounding).
_ON_THE_BOUND = 1.0 - 1e-6
#: Verdict thresholds are the plain forecast's (:func:`~pymc_penalty.planning.forecast.
#: forecast_verdict`): 100 effective draws is 0.1 sd of Monte Carlo error, 11 is 0.3, 1 is 1.


def _log_interp(x: float, grid: tuple, values: np.ndarray) -> float:
    """Linear interpolation of ``log(values)`` in ``log(x)``, held at the grid's ends."""
    lx = np.log(np.asarray(grid, dtype=np.float64))
    at = min(max(math.log(x), float(lx[0])), float(lx[-1]))
    return float(np.exp(np.interp(at, lx, np.log(values))))


def _ess_per_draw(d: int, tune: int, draws: int) -> float:
    """The table's noise-free smallest bulk ESS per kept draw (all chains)."""
    per_draw = np.array(
        [[np.asarray(_ESS_MIN[t][n]) / (_TABLE_CHAINS * n) for n in _DRAWS] for t in _TUNES]
    )  # (tunes, draws, dims)
    by_dim = np.array(
        [
            _log_interp(float(d) if d <= _DIMS[-1] else float(_DIMS[-1]), _DIMS, per_draw[i, j])
            for i in range(len(_TUNES))
            for j in range(len(_DRAWS))
        ]
    ).reshape(len(_TUNES), len(_DRAWS))
    by_draws = np.array([_log_interp(float(draws), _DRAWS, row) for row in by_dim])
    value = _log_interp(float(max(tune, 1)), _TUNES, by_draws)
    if d > _DIMS[-1]:  # beyond the table: the smallest ESS falls as 1 / d^2 there
        value *= (_DIMS[-1] / d) ** 2
    return value


def _noise_kappa(likelihood_dim: int) -> float:
    """``kappa``: the efficiency is the noise-free one over ``1 + kappa sigma^2``."""
    k = float(likelihood_dim)
    return k / (float(chi2.median(k)) * _PROBE_STEP**2)


@dataclass(frozen=True)
class TaylorForecast:
    """The expected effective sample size of the Taylor path's chains (public inputs only).

    Attributes
    ----------
    ess : float
        Expected smallest bulk ESS over the parameters, all chains' kept draws.
    rms_error_sd : float
        The chains' Monte Carlo error of a posterior mean, ``1 / sqrt(ess)`` of the raw
        chain's sd (the published posterior adds the one-shot noise's spread).
    verdict : {"good", "usable", "poor", "hopeless"}
        As the plain forecast's: ``ess`` of at least 100, 11, 1, or less.
    noise_sd : float
        The noise sd of the residual release at the probes' median move.
    ess_per_draw : float
        ``ess`` over the kept draws of all chains.
    draws_for_target : int
        Draws per chain that would reach ``target_ess`` (same chains, tuning and noise); 0
        where no number of draws would (``start_found`` False).
    target_ess : float
    start_found : bool
        False where the chains' start is on the released mode search's bound (not a mode):
        the chains are then forecast not to meet, about two effective draws each.
    """

    ess: float
    rms_error_sd: float
    verdict: str
    noise_sd: float
    ess_per_draw: float
    draws_for_target: int
    target_ess: float
    start_found: bool = True

    def __str__(self) -> str:
        lines = [
            f"Forecast (Taylor path): effective sample size about {self.ess:.3g} (Monte Carlo "
            f"error of a posterior mean about {self.rms_error_sd:.2g} of the chain's sd, at a "
            f"residual noise sd of {self.noise_sd:.2g}): {self.verdict}."
        ]
        if not self.start_found:
            lines.append(
                "The released model has no mode within reach of the warm start's point (the "
                "chains' start is on the search's bound): the chains start an unknown distance "
                "from the posterior and are not expected to meet, whatever their length. A "
                "larger epsilon gives a closer warm start and a less noisy model."
            )
        elif self.ess < self.target_ess:
            lines.append(
                f"To reach about {self.target_ess:g} effective samples: about "
                f"{self.draws_for_target} draws per chain (the residual steps cost little)."
            )
        return "\n".join(lines)


def forecast_taylor(
    *,
    d: int,
    draws: int,
    tune: int,
    chains: int,
    noise_sd: float,
    likelihood_dim: int | None = None,
    target_ess: float = 100.0,
    start_found: bool = True,
    independent_share: float = 0.0,
    independent_per_draw: float = 0.0,
) -> TaylorForecast:
    """Forecast the smallest bulk ESS of the Taylor path's chains.

    Parameters
    ----------
    d : int
        Number of free parameters on the sampler's (unconstrained) space (``>= 1``).
    draws, tune, chains : int
        The chains' plan (per chain; ``draws >= 1``).
    noise_sd : float
        The residual release's noise sd at a typical move (the probes' median,
        :func:`typical_noise_sd`), ``>= 0``.
    likelihood_dim : int, optional
        How many of the ``d`` coordinates the likelihood reads (default ``d``).
    target_ess : float, default 100
        The ESS ``draws_for_target`` aims at (``> 0``).
    start_found : bool, default True
        False where the chains' start lies on the released mode search's bound
        (:func:`start_offset`): the forecast is then two effective draws per chain.
    independent_share, independent_per_draw : float, default 0
        The share of the draws' moves that are independent moves and their effective draws
        per step (:func:`pymc_penalty.sampling.taylor.compare_moves`): the draws' effective
        draws per step are the two kernels' mixed in that share.

    Returns
    -------
    TaylorForecast
    """
    d = check_integer("d", d, low=1)
    draws = check_integer("draws", draws, low=1)
    tune = check_integer("tune", tune, low=0)
    chains = check_integer("chains", chains, low=1)
    noise_sd = check_real("noise_sd", noise_sd, low=0.0)
    k = d if likelihood_dim is None else check_integer("likelihood_dim", likelihood_dim, low=1)
    target_ess = check_real("target_ess", target_ess, low=0.0, low_open=True)
    if start_found:
        per_draw = _ess_per_draw(d, tune, draws) / (1.0 + _noise_kappa(min(k, d)) * noise_sd**2)
        share = check_real("independent_share", independent_share, low=0.0, high=1.0)
        per_draw = (1.0 - share) * per_draw + share * float(independent_per_draw)
        more = max(math.ceil(target_ess / (per_draw * chains)), 1)
    else:  # chains that never meet, or barely: about two effective draws each
        per_draw, more = _LOST_ESS_PER_CHAIN / draws, 0
    ess = per_draw * draws * chains
    return TaylorForecast(
        ess=ess,
        rms_error_sd=1.0 / math.sqrt(ess),
        verdict=forecast_verdict(ess),
        noise_sd=noise_sd,
        ess_per_draw=per_draw,
        draws_for_target=more,
        target_ess=target_ess,
        start_found=bool(start_found),
    )


def start_offset(taylor: TaylorModel, warm_covariance: np.ndarray) -> float:
    """The chains' start's distance from the expansion point over the released mode search's
    reach: ``|L^-1 (point - t)| / (NEWTON_RADIUS sqrt(d))`` with ``L`` the Cholesky factor of
    the warm start's covariance (the search's own coordinates). 1 means the search stopped on
    its bound. Public values only."""
    t = np.asarray(taylor.t, dtype=np.float64)
    v = np.linalg.solve(
        np.linalg.cholesky(np.asarray(warm_covariance, dtype=np.float64)),
        (np.asarray(taylor.point, dtype=np.float64) - t),
    )
    return float(np.linalg.norm(v)) / (NEWTON_RADIUS * math.sqrt(t.size))


def typical_noise_sd(
    taylor: TaylorModel, step_mu: float, neighbours: Any, clip_count_share: float, clip: float
) -> float:
    """The residual release's noise sd at the probes' median move: ``k clip L_p / mu``, with
    ``L_p`` the probes' median residual length (``taylor.probe_length``), ``mu`` the step's
    likelihood ``mu`` and ``k`` 2 substitute-one, 1 add/remove-one (public inputs only).
    NaN where the model has no probe length."""
    k = Neighbours.parse(neighbours).factor
    lik_mu = math.sqrt(likelihood_mu2(float(step_mu), 1.0, float(clip_count_share)))
    length = float(taylor.probe_length)
    if not (math.isfinite(length) and length > 0.0 and lik_mu > 0.0):
        return math.nan
    return k * float(clip) * length / lik_mu


def taylor_forecast_report(
    taylor: TaylorModel,
    run: RunPlan,
    step_mu: float,
    *,
    neighbours: Any,
    clip_count_share: float,
    clip: float,
    offset: float = 0.0,
) -> dict[str, Any]:
    """The Taylor path's forecast keys for the report, made after the one-shot release and
    before the chains spend: ``dp_forecast_ess`` and ``dp_forecast_verdict`` (as on the plain
    path), ``dp_taylor_noise_sd`` (the residual noise sd at a typical move) and
    ``dp_taylor_start_offset`` (``offset``, :func:`start_offset`; at 1 the chains' start is on
    the released mode search's bound). Warns (:class:`~pymc_penalty.UtilityWarning`) when the
    verdict is poor or hopeless. Public inputs only: the plan, the released model's dimension,
    order, probes and start, the clip."""
    noise = typical_noise_sd(taylor, step_mu, neighbours, clip_count_share, clip)
    d = int(taylor.t.size)
    k = d if taylor.index is None else int(np.size(taylor.index))
    # The draws' independent moves, as the step will choose them (from its starting walk:
    # the released covariance at the random-walk scale; public inputs only).
    factor = Neighbours.parse(neighbours).factor
    lik_mu = math.sqrt(likelihood_mu2(float(step_mu), 1.0, float(clip_count_share)))
    walk = (RW_SCALE / math.sqrt(d)) * np.linalg.cholesky(
        np.asarray(taylor.covariance, dtype=np.float64)
    )
    choice = compare_moves(taylor, walk, lambda length: factor * float(clip) * length / lik_mu)
    forecast = forecast_taylor(
        d=d,
        draws=int(run.draws),
        tune=int(run.tune),
        chains=int(run.chains),
        noise_sd=noise if math.isfinite(noise) else 0.0,
        likelihood_dim=k,
        start_found=offset < _ON_THE_BOUND,
        independent_share=choice.share,
        independent_per_draw=choice.independent_per_draw,
    )
    if forecast.verdict in ("poor", "hopeless"):
        # stacklevel: warn -> this -> pymc_penalty.sample -> the user's call
        warnings.warn(str(forecast), UtilityWarning, stacklevel=3)
    return {
        "dp_forecast_ess": float(forecast.ess),
        "dp_forecast_verdict": forecast.verdict,
        "dp_taylor_noise_sd": float(noise),
        "dp_taylor_start_offset": float(offset),
    }
