"""What a budget can buy: the expected effective sample size and error, before anything is spent.

Pure functions of public quantities (the budget, the number of parameters ``d``, the number of
rows ``n`` where it is public, the run plan); nothing here reads data or charges a ledger.

Where the limit comes from (``../shared/DESIGN.md`` section 6, re-derived here). Write a move
in the posterior's whitened coordinates, ``w = L^-1 (theta' - theta)``, and bound every row's
log-likelihood ratio by ``c ||w||``. For iid rows, one row's ratio along a direction is about a
standard normal over ``sqrt(n)``, so a bound that clips a fraction ``2 Phi(-q)`` of the rows is
``c = q / sqrt(n)`` (``q = 3.29`` clips 0.1%). The release's sensitivity is ``f c ||w||``
(``f = 2`` substituting a row, ``1`` adding or removing one), so at noise sd ``sigma`` a step of
per-release ``mu_t`` moves ``||w|| = sigma mu_t / (f c)``. Over ``T`` steps the composed budget
``mu^2 = sum_t mu_t^2`` therefore buys a fixed total squared distance,

    sum_t ||w_t||^2 = sigma^2 mu^2 n / (f^2 q^2),

whatever ``T`` is. A random walk in ``d`` dimensions accepting a fraction ``alpha`` of its
moves turns squared distance into effective samples at about ``alpha / (4 d)`` per unit (the
optimal random walk's ``0.33 / d`` per step at step length 2.38 and acceptance 0.234), and
noise of sd ``sigma`` accepts a small move with probability ``2 Phi(-sigma / 2)``. Hence

    ESS ~= sigma^2 2 Phi(-sigma/2) mu^2 n / (4 f^2 q^2 d),

largest at ``sigma ~= 2.4`` and flat within 15% over ``sigma`` in [1.7, 3.2]. The chain's RMS
error of a posterior mean, in posterior sds, is about ``1 / sqrt(ESS)``.

Checked against measured runs (a whitened-bound penalty random walk on the anisotropic
Gaussian problem of the DP-HMC experiments, d = 10, n = 1e5, epsilon = 2, delta = 1e-6, three
seeds): forecast 0.37 / 0.28 / 0.26 / 0.28 sd at sigma = 1 / 1.7 / 2.4 / 3.2, measured 0.33 /
0.23 / 0.23-0.26 / 0.28; at n = 1e4 forecast 0.8, measured 0.65-0.88.

The likelihood's tail. ``q`` is the quantile of one row's whitened ratio (in units of
``1 / sqrt(n)``) at the clipped fraction, and the rows' ratios are Gaussian only for a Gaussian
likelihood with Gaussian residuals. A Bernoulli likelihood's rows are heavier-tailed: rows
whose outcome was unlikely have ``|y - p|`` near 1 where the Fisher weight ``p (1 - p)`` is
small, so at the same clipped fraction ``q`` is 1.5 times the Gaussian's at 0.1% and 1.76
times at 0.001% (logistic regression with standard normal covariates, d = 5, one logit sd of
signal). ESS goes as ``1 / q^2``: with Gaussian rows the forecast over-promised a logistic
regression's ESS about 3 times. ``likelihood=`` names the family (public: the model's
structure, see :func:`likelihood_family`; :func:`row_quantile` holds the tails); the
clipped fraction defaults to the one ``pymc_penalty.sample``'s clip adaptation aims at,
``min(0.002, 0.06 / sqrt(n))``. How strong the effects are changes the Bernoulli tail (the
data do, which the forecast must not read): at the same fraction, ``q`` is about 1.3 times the
Gaussian's with half a logit sd of signal and 2 times with two; a user who knows better
passes ``per_row_quantile``. Checked against a measured whitened penalty walk on a logistic
regression (d = 5, n = 1e4, epsilon = 8, 24 seeds, 0.01% clipped): measured / forecast
squared error 1.4 with the Bernoulli tail, 3.8 with Gaussian rows.

The forecast is what the budget allows a sampler that states its bound in the posterior's
metric and clips a fraction ``2 Phi(-q)`` of rows; a bound in raw parameter units on an
anisotropic posterior, a poor proposal shape or a short run gets less. It is a ceiling to plan
with, not a promise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr, ndtri

from pymc_penalty.accounting import gdp_epsilon, gdp_mu
from pymc_penalty.accounting.gdp import likelihood_mu2
from pymc_penalty.accounting.sensitivity import Neighbours
from pymc_penalty.errors import InvalidArgumentError, UtilityWarning
from pymc_penalty.sampling.adaptation import clip_target_fraction
from pymc_penalty.validation import check_integer, check_real

__all__ = [
    "UtilityForecast",
    "UtilityWarning",
    "forecast_run",
    "forecast_utility",
    "forecast_verdict",
    "likelihood_family",
    "row_quantile",
]

#: Effective samples per unit of whitened squared distance, per acceptance and dimension.
_ESS_PER_DISTANCE = 0.25
#: Best effective samples per step of a random walk in ``d`` dimensions, times ``d``.
_ESS_PER_STEP_D = 0.33
#: Longest useful whitened move (the optimal random walk's total step length).
_LONGEST_STEP = 2.38
#: Verdict thresholds on the forecast ESS: 100 is 0.1 sd, 11 is 0.3 sd, 1 is 1 sd.
_VERDICTS = ((100.0, "good"), (11.0, "usable"), (1.0, "poor"), (0.0, "hopeless"))
#: The bound on a row's whitened ratio when neither its family nor its fraction is given:
#: Gaussian rows, 0.1% clipped.
_DEFAULT_QUANTILE = 3.29

#: Each family's whitened-ratio quantile over a Gaussian's at the same clipped fraction, on a
#: grid of log10(fraction). Bernoulli: logistic regression, 1e6 rows of standard normal
#: covariates (d = 5), coefficients (1, 0, 0, 0, 0) (one logit sd of signal), whitened by the
#: Fisher information, 30 random unit directions (seed 2026); measured once, never from the
#: user's data.
_TAIL_LOG10_FRACTION = (-5.0, -4.5, -4.0, -3.5, -3.0, -2.5, -2.0, -1.5)
_TAIL_RATIO = {
    "gaussian": (1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0),
    "bernoulli": (1.760, 1.707, 1.644, 1.572, 1.488, 1.385, 1.263, 1.123),
}
#: Names ``likelihood=`` accepts, and the family each means.
_FAMILY_NAMES = {
    "gaussian": "gaussian",
    "normal": "gaussian",
    "bernoulli": "bernoulli",
    "logistic": "bernoulli",
}
#: PyMC likelihoods (their ops' class names) whose family's tail is known here. A binomial
#: row is a sum of Bernoulli trials, no heavier-tailed than one.
_FAMILY_OF_OP = {
    "NormalRV": "gaussian",
    "MvNormalRV": "gaussian",
    "BernoulliRV": "bernoulli",
    "BinomialRV": "bernoulli",
}


@dataclass(frozen=True)
class UtilityForecast:
    """The expected utility of a private run, computed from public quantities only.

    Attributes
    ----------
    ess : float
        Expected effective sample size of a posterior mean, at best.
    rms_error_sd : float
        Expected RMS error of a posterior mean in posterior sds, ``1 / sqrt(ess)``.
    verdict : {"good", "usable", "poor", "hopeless"}
        ``ess`` of at least 100 (0.1 sd), 11 (0.3 sd), 1 (1 sd), or less.
    sampling_mu : float
        The Gaussian-DP ``mu`` spent on the likelihood releases of the kept draws.
    noise_sd : float
        The noise sd the forecast assumes the sampler keeps.
    steps_needed : int
        Fewest kept steps (all chains) that can use the budget's distance with moves no
        longer than a random walk's best (2.38 whitened units); fewer steps waste budget.
    limited_by : {"budget", "steps"}
        What caps ``ess``: the budget's distance, or the number of kept steps.
    epsilon_for_target : float
        The epsilon (at the same delta and plan) whose forecast reaches ``target_ess``.
    n_factor_for_target : float
        How many times more rows would reach ``target_ess`` at this budget.
    target_ess : float
        The effective sample size the two suggestions aim at.
    """

    ess: float
    rms_error_sd: float
    verdict: str
    sampling_mu: float
    noise_sd: float
    steps_needed: int
    limited_by: str
    epsilon_for_target: float
    n_factor_for_target: float
    target_ess: float

    def __str__(self) -> str:
        error = (
            f"about {self.rms_error_sd:.2g} posterior sd"
            if self.ess >= 1.0
            else "more than a posterior sd: the draws will say little beyond the prior"
        )
        lines = [
            f"Forecast: effective sample size about {self.ess:.3g} at best (RMS error of a "
            f"posterior mean {error}): {self.verdict}.",
        ]
        if self.limited_by == "steps":
            lines.append(
                f"The run is too short to use the budget: about {self.steps_needed} kept steps "
                "(all chains) would."
            )
        if self.ess < self.target_ess:
            lines.append(
                f"To reach about {self.target_ess:g} effective samples: epsilon about "
                f"{self.epsilon_for_target:.3g} at the same delta, or about "
                f"{self.n_factor_for_target:.3g} times more rows, or fewer parameters."
            )
        return "\n".join(lines)


def forecast_verdict(ess: float) -> str:
    """The verdict on a forecast ESS: ``"good"`` from 100 (0.1 sd of Monte Carlo error),
    ``"usable"`` from 11 (0.3 sd), ``"poor"`` from 1, else ``"hopeless"`` (both paths)."""
    return next(name for floor, name in _VERDICTS if ess >= floor)


def _budget_ess(mu: float, n: float, d: int, factor: float, noise_sd: float, q: float) -> float:
    accept = 2.0 * float(ndtr(-noise_sd / 2.0))
    distance = noise_sd**2 * mu**2 * n / (factor**2 * q**2)
    return _ESS_PER_DISTANCE * accept * distance / d


def _family(likelihood: str) -> str:
    name = _FAMILY_NAMES.get(likelihood.lower()) if isinstance(likelihood, str) else None
    if name is None:
        raise InvalidArgumentError(
            f"`likelihood` must be one of {sorted(_FAMILY_NAMES)}; for another family pass "
            "`per_row_quantile` instead."
        )
    return name


def row_quantile(likelihood: str, clipped_fraction: float) -> float:
    """The bound on one row's whitened log-likelihood ratio, per unit whitened step and in
    units of ``1 / sqrt(n)``, that clips ``clipped_fraction`` of a family's rows.

    Parameters
    ----------
    likelihood : {"gaussian", "bernoulli"}
        The family (``"normal"`` and ``"logistic"`` are accepted as aliases).
    clipped_fraction : float
        Fraction of rows clipped, in ``(0, 0.5)``.

    Returns
    -------
    float
        The Gaussian quantile ``Phi^-1(1 - fraction / 2)`` times the family's tail ratio
        (interpolated in ``log10`` of the fraction; extrapolated linearly below 1e-5, held
        above 10^-1.5).
    """
    family = _family(likelihood)
    fraction = check_real(
        "clipped_fraction", clipped_fraction, low=0.0, high=0.5, low_open=True, high_open=True
    )
    x, table = np.asarray(_TAIL_LOG10_FRACTION), np.asarray(_TAIL_RATIO[family])
    at = math.log10(fraction)
    if at < x[0]:
        slope = (table[1] - table[0]) / (x[1] - x[0])
        ratio = float(table[0] + slope * (at - x[0]))
    else:
        ratio = float(np.interp(at, x, table))
    return float(-ndtri(fraction / 2.0)) * ratio


def likelihood_family(model) -> str | None:
    """The tail family of a PyMC model's likelihood, from its structure alone (public).

    Returns ``"gaussian"`` or ``"bernoulli"`` when every observed variable's distribution has
    a known tail (the heaviest of them), ``None`` otherwise (:func:`forecast_utility` then
    assumes Gaussian rows clipped at 0.1%).
    """
    families = set()
    for rv in model.observed_RVs:
        op = getattr(getattr(rv, "owner", None), "op", None)
        family = _FAMILY_OF_OP.get(type(op).__name__)
        if family is None:
            return None
        families.add(family)
    if not families:
        return None
    return "bernoulli" if "bernoulli" in families else "gaussian"


def _resolve_quantile(
    per_row_quantile: float | None,
    likelihood: str | None,
    clipped_fraction: float | None,
    n: float,
) -> float:
    """The per-row quantile ``q`` the forecast uses (see :func:`forecast_utility`)."""
    if per_row_quantile is not None:
        if likelihood is not None or clipped_fraction is not None:
            raise InvalidArgumentError(
                "Give `per_row_quantile` or `likelihood` / `clipped_fraction`, not both: the "
                "quantile already states the likelihood's tail at its clipped fraction."
            )
        return check_real("per_row_quantile", per_row_quantile, low=0.0, low_open=True)
    if likelihood is None and clipped_fraction is None:
        return _DEFAULT_QUANTILE
    fraction = clip_target_fraction(n) if clipped_fraction is None else clipped_fraction
    return row_quantile("gaussian" if likelihood is None else likelihood, fraction)


def forecast_utility(
    epsilon: float,
    delta: float,
    *,
    n: float,
    d: int,
    draws: int = 1000,
    tune: int = 1000,
    chains: int = 4,
    neighbours: str = "substitute",
    clip_count_share: float = 0.05,
    noise_sd: float = 2.0,
    per_row_quantile: float | None = None,
    target_ess: float = 100.0,
    likelihood: str | None = None,
    clipped_fraction: float | None = None,
) -> UtilityForecast:
    """Forecast the effective sample size and error a private run can reach.

    Parameters
    ----------
    epsilon, delta : float
        The run's whole budget (``epsilon > 0``, ``0 < delta < 1``).
    n : float
        Number of rows (``>= 1``). Public under substitute-one neighbours; under add/remove-one
        it is private: pass a noisy count released for the purpose, never the exact ``n``.
    d : int
        Number of free parameters on the sampler's (unconstrained) space (``>= 1``).
    draws, tune, chains : int
        The run plan: every step of every chain, tuning included, is a release of the same
        per-step ``mu``; only the kept draws count toward the effective sample size.
    neighbours : {"substitute", "add_remove"}
    clip_count_share : float, default 0.05
        Share of each step's ``mu^2`` spent on the noisy clipped count, in ``[0, 1)``.
    noise_sd : float, default 2.0
        Noise sd the sampler keeps (``> 0``); the forecast is flat within 15% over [1.7, 3.2].
    per_row_quantile : float, optional
        The bound on one row's whitened ratio in units of ``1 / sqrt(n)`` (``> 0``): 3.29 clips
        0.1% of Gaussian-like rows; a heavy-tailed likelihood needs more. Given, it is used as
        is (not with ``likelihood`` or ``clipped_fraction``). Omitted, it is
        :func:`row_quantile` of ``likelihood`` at ``clipped_fraction``, or 3.29 when neither
        is given.
    target_ess : float, default 100
        The effective sample size the suggestions aim at (``> 0``).
    likelihood : {"gaussian", "bernoulli"}, optional
        The likelihood's family, whose tail sets the bound (public: the model's structure;
        :func:`likelihood_family` reads it off a PyMC model). Gaussian when only
        ``clipped_fraction`` is given.
    clipped_fraction : float, optional
        Fraction of the rows the sampler clips, in ``(0, 0.5)``; by default the fraction
        ``pymc_penalty.sample``'s clip adaptation aims at, ``min(0.002, 0.06 / sqrt(n))``.

    Returns
    -------
    UtilityForecast
    """
    epsilon = check_real("epsilon", epsilon, low=0.0, low_open=True)
    delta = check_real("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
    n = check_real("n", n, low=1.0)
    d = check_integer("d", d, low=1)
    draws = check_integer("draws", draws, low=1)
    tune = check_integer("tune", tune, low=0)
    chains = check_integer("chains", chains, low=1)
    Neighbours.parse(neighbours)
    share = check_real("clip_count_share", clip_count_share, low=0.0, high=1.0, high_open=True)
    noise_sd = check_real("noise_sd", noise_sd, low=0.0, low_open=True)
    q = _resolve_quantile(per_row_quantile, likelihood, clipped_fraction, n)
    target_ess = check_real("target_ess", target_ess, low=0.0, low_open=True)

    mu = gdp_mu(epsilon=epsilon, delta=delta)
    kept = draws / (draws + tune)
    return forecast_run(
        math.sqrt(likelihood_mu2(mu, kept, share)),
        budget_mu=mu,
        delta=delta,
        n=n,
        d=d,
        steps=draws * chains,
        neighbours=neighbours,
        noise_sd=noise_sd,
        per_row_quantile=q,
        target_ess=target_ess,
    )


def forecast_run(
    sampling_mu: float,
    *,
    budget_mu: float,
    delta: float,
    n: float,
    d: int,
    steps: int,
    neighbours: str = "substitute",
    noise_sd: float = 2.0,
    per_row_quantile: float | None = None,
    target_ess: float = 100.0,
    likelihood: str | None = None,
    clipped_fraction: float | None = None,
) -> UtilityForecast:
    """The forecast of a planned run from its ``mu``: ``sampling_mu`` spent on the likelihood
    releases of the ``steps`` kept draws (all chains), ``budget_mu`` the whole run's; the
    suggestion scales the whole budget. Arguments as in :func:`forecast_utility`."""
    factor = Neighbours.parse(neighbours).factor
    per_row_quantile = _resolve_quantile(per_row_quantile, likelihood, clipped_fraction, n)
    budget_ess = _budget_ess(sampling_mu, n, d, factor, noise_sd, per_row_quantile)
    step_ess = _ESS_PER_STEP_D * steps / d
    ess = min(budget_ess, step_ess)
    limited_by = "budget" if budget_ess <= step_ess else "steps"
    # The whitened move per step is sigma mu_t sqrt(n) / (f q) with mu_t = mu_s / sqrt(steps).
    reach = noise_sd * sampling_mu * math.sqrt(n) / (factor * per_row_quantile * _LONGEST_STEP)
    verdict = forecast_verdict(ess)
    # ESS grows as mu^2 and as n: the suggestions scale the budget's part.
    scale = target_ess / budget_ess if budget_ess > 0 else math.inf
    epsilon_target = (
        gdp_epsilon(delta=delta, mu=budget_mu * math.sqrt(scale))
        if math.isfinite(scale)
        else math.inf
    )
    return UtilityForecast(
        ess=ess,
        rms_error_sd=1.0 / math.sqrt(ess) if ess > 0 else math.inf,
        verdict=verdict,
        sampling_mu=sampling_mu,
        noise_sd=noise_sd,
        steps_needed=max(math.ceil(reach**2), 1),
        limited_by=limited_by,
        epsilon_for_target=epsilon_target,
        n_factor_for_target=scale,
        target_ess=target_ess,
    )
