"""Calibration from a run plan, and the expected acceptance of the penalty test.

:func:`plan_releases` counts the releases a run makes (:class:`RunPlan` holds a plan),
:func:`calibrate` spreads a Gaussian-DP ``mu`` evenly over them: the one calibration of the
package (``pymc_penalty.calibrate`` is this function; :func:`calibrate_step_mu` is a
deprecated alias taking a budget). :func:`expected_acceptance` gives the closed-form
acceptance probability that the chosen noise level costs.
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass

import numpy as np
from scipy.special import log_ndtr

from pymc_penalty.accounting.gdp import _gdp_mu, split_step_mu
from pymc_penalty.accounting.sensitivity import ClipMode, Neighbours
from pymc_penalty.errors import FrozenChainWarning, InvalidArgumentError
from pymc_penalty.validation import check_clip, check_integer, check_real, check_share

__all__ = ["calibrate_step_mu", "expected_acceptance", "plan_releases"]


#: Calibrate a hair below the budget: the ledger errs only on the safe side, so an exact
#: calibration could see its last planned release refused after float rounding.
CALIBRATION_MARGIN = 1.0 - 1e-9


@dataclass(frozen=True)
class RunPlan:
    """What a run will do: draws and tuning steps per chain, chains, and moves per draw.

    Parameters
    ----------
    draws, tune : int
        Draws and tuning steps per chain, ``>= 0``, not both 0.
    chains : int
        Number of chains, ``>= 1``.
    moves_per_draw : int, optional
        Metropolis moves behind each draw after tuning (a thinned chain), ``>= 1``; each
        tuning step is one move. The moves of a draw are charged as one release of their
        composed cost, so :attr:`releases` is unchanged and :attr:`moves` is what the noise
        is calibrated to. ``None`` (the default) is one move, except for a budgeted
        :class:`~pymc_penalty.PenaltyMetropolis` on the Taylor path, which picks it
        (``ceil(TAYLOR_DRAWS / draws)``: as many moves per chain as ``pymc_penalty.sample``
        makes).
    """

    draws: int
    tune: int
    chains: int
    moves_per_draw: int | None = None

    def __post_init__(self) -> None:
        if self.releases < 1:  # plan_releases checks each field's type and range
            raise ValueError("`draws + tune` must be at least 1: the plan makes no release.")
        if self.moves_per_draw is not None:
            check_integer("moves_per_draw", self.moves_per_draw, low=1)

    @property
    def releases(self) -> int:
        """Releases the whole run makes: tuning steps and every chain count (a draw's moves
        are one release)."""
        return plan_releases(self.draws, self.tune, self.chains)

    @property
    def draw_moves(self) -> int:
        """Moves behind each draw after tuning: ``moves_per_draw``, ``None`` being 1."""
        return int(self.moves_per_draw or 1)

    @property
    def moves(self) -> int:
        """Moves the whole run makes, each a release of the calibrated ``mu`` (a draw of
        :attr:`draw_moves` moves costs that many)."""
        return plan_releases(self.draws * self.draw_moves, self.tune, self.chains)


def calibrate(
    available_mu: float,
    plan: RunPlan | int,
    *,
    n_datapoints: int | None = None,
    clip: float = 1.0,
    clip_mode: ClipMode | str = ClipMode.DISTANCE,
    neighbours: Neighbours | str = Neighbours.SUBSTITUTE,
    clip_count_share: float = 0.05,
    warn_below: float = 0.05,
) -> float:
    """Per-step ``mu`` so that the whole plan spends at most ``available_mu``.

    Equal releases compose to ``sqrt(R) mu_step`` (``R`` the plan's releases), so
    ``mu_step = available_mu / sqrt(R)``, taken a relative 1e-9 below that so that float
    rounding can never make the last planned release exceed the budget (a
    :class:`~pymc_penalty.PrivacyLedger` rounds every charge up). The noise standard deviation
    is then ``Delta / mu_step``.

    Parameters
    ----------
    available_mu : float
        The Gaussian-DP ``mu`` left to spend (a budget's ``mu``, or a ledger's remainder).
    plan : RunPlan or int
        The run (calibrated to its :attr:`RunPlan.moves`: a draw of several moves is one
        release of their composed cost), or directly the number of releases it makes
        (``>= 1``; see :func:`plan_releases`).
    n_datapoints : int, optional
        Used for the near-frozen warning with ``clip_mode="distance"`` under substitute-one
        neighbours, where ``n`` is public: the typical posterior step length is taken as
        ``1 / sqrt(n)``. Ignored under add/remove-one, where ``n`` itself is private: the
        warning then assumes a step of length 0.1, as it does when ``n`` is not given.
    clip, clip_mode, neighbours, clip_count_share
        The step's settings, to predict its noise.
    warn_below : float, default 0.05
        Warn (:class:`~pymc_penalty.FrozenChainWarning`) when the closed-form expected
        acceptance of a proposal whose true log-likelihood ratio is 0 falls below this
        (``0`` never warns).

    Returns
    -------
    float
        Per-step ``mu``.

    Notes
    -----
    The warning's text is built from public quantities only (the per-step ``mu``, the number
    of planned releases, ``clip`` and the threshold), never from ``n`` or anything computed
    from it, so it is identical for any two datasets; whether it fires depends on ``n`` only
    under substitute-one neighbours, where ``n`` is public.
    """
    available_mu = check_real("available_mu", available_mu, low=0.0, low_open=True)
    if isinstance(plan, RunPlan):
        releases = plan.moves
    elif isinstance(plan, numbers.Integral) and not isinstance(plan, bool):
        releases = check_integer("plan", plan, low=1)
    else:
        raise InvalidArgumentError(
            "`plan` must be a pymc_penalty.RunPlan(draws, tune, chains) or a number of "
            "releases (an integer >= 1)."
        )
    if n_datapoints is not None:
        check_integer("n_datapoints", n_datapoints, low=1)
    clip = check_clip(clip, allow_auto=False)
    clip_count_share = check_share("clip_count_share", clip_count_share)
    warn_below = check_real("warn_below", warn_below, low=0.0, high=1.0)
    mode, relation = ClipMode.parse(clip_mode), Neighbours.parse(neighbours)
    step_mu = available_mu / math.sqrt(releases) * CALIBRATION_MARGIN
    if warn_below > 0.0:
        setting = (clip, mode, relation, clip_count_share)
        _warn_if_frozen(step_mu, releases, n_datapoints, setting, warn_below)
    return step_mu


def _warn_if_frozen(
    step_mu: float,
    releases: int,
    n_datapoints: int | None,
    setting: tuple[float, ClipMode, Neighbours, float],
    warn_below: float,
) -> None:
    """Warn when ``step_mu`` predicts a nearly frozen chain (public figures only);
    ``setting`` is the step's ``(clip, clip_mode, neighbours, clip_count_share)``."""
    clip, mode, relation, clip_count_share = setting
    mu_ll, _ = split_step_mu(step_mu, clip_count_share)
    if mode is ClipMode.CONSTANT:
        length = 1.0
    elif n_datapoints and relation is Neighbours.SUBSTITUTE:
        # n is public under substitute-one only; under add/remove-one it must not decide
        # anything that leaves the package, this warning included.
        length = 1.0 / math.sqrt(n_datapoints)
    else:
        length = 0.1
    sigma = relation.factor * clip * length / mu_ll
    if float(expected_acceptance(0.0, sigma)) < warn_below:
        # Public figures only: neither n nor the predicted noise sd or acceptance (both
        # computed from n) may appear in the message.
        warnings.warn(
            f"The calibrated per-step mu ({step_mu:.3g} for each of {releases} releases, "
            f"clip={clip:g}) predicts an expected acceptance below {warn_below:g} even for a "
            "move that does not change the likelihood: the chain will be nearly frozen. Raise "
            "epsilon, run fewer steps, or lower `clip`.",
            FrozenChainWarning,
            stacklevel=3,
        )


def calibrate_step_mu(epsilon: float, delta: float, n_releases: int) -> float:
    """Per-release ``Delta / sigma`` such that ``n_releases`` releases spend the budget.

    .. deprecated:: 0.2
        A thin alias of :func:`pymc_penalty.calibrate`:
        ``calibrate(gdp_mu(epsilon, delta), n_releases, warn_below=0.0)``, the same figure
        (``gdp_mu(epsilon, delta) / sqrt(n_releases)``, a relative 1e-9 below).

    Parameters
    ----------
    epsilon : float
        Budget ``epsilon``, in ``[0, inf)``.
    delta : float
        Budget ``delta``, in ``(0, 1)``.
    n_releases : int
        Planned releases, ``>= 1`` (see :func:`plan_releases`).

    Returns
    -------
    float
        Per-release GDP parameter.
    """
    epsilon = check_real("epsilon", epsilon, low=0.0)
    delta = check_real("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
    n_releases = check_integer("n_releases", n_releases, low=1)
    return calibrate(_gdp_mu(epsilon, delta), n_releases, warn_below=0.0)


def plan_releases(draws: int, tune: int, chains: int, *, releases_per_step: int = 1) -> int:
    """Number of releases a run makes: ``(draws + tune) * chains * releases_per_step``.

    Tuning steps and every chain count.  ``releases_per_step`` is the number of penalty tests per
    draw (more than one when a step is split per variable).

    Parameters
    ----------
    draws, tune : int
        Draws and tuning steps per chain, ``>= 0``.
    chains : int
        Number of chains, ``>= 1``.
    releases_per_step : int, default 1
        Releases per draw, ``>= 1``.

    Returns
    -------
    int
    """
    draws = check_integer("draws", draws)
    tune = check_integer("tune", tune)
    chains = check_integer("chains", chains, low=1)
    releases_per_step = check_integer("releases_per_step", releases_per_step, low=1)
    return (draws + tune) * chains * releases_per_step


# --------------------------------------------------------------------------------------------
# expected acceptance of the penalty test
# --------------------------------------------------------------------------------------------


def expected_acceptance(r: float | np.ndarray, sigma: float | np.ndarray) -> float | np.ndarray:
    """Expected acceptance probability of the penalty test (published seed, Prop. 1).

    With exact log acceptance ratio ``r`` and noise ``N(0, sigma**2)`` on it, the penalty test
    accepts with ``min(1, exp(r + sigma Z - sigma**2 / 2))``, whose expectation is

        alpha_sigma(r) = Phi(r/sigma - sigma/2) + exp(r) Phi(-r/sigma - sigma/2),

    evaluated here as ``exp(logaddexp(...))`` of log-CDFs, so it neither overflows for large
    ``r`` nor loses the tail for very negative ``r``.  ``sigma = 0`` gives ``min(1, exp(r))``;
    the value decreases in ``sigma``.

    Parameters
    ----------
    r : float or array_like
        Exact log acceptance ratio(s); ``+-inf`` allowed, NaN not.
    sigma : float or array_like
        Noise standard deviation(s), finite and ``>= 0``; broadcast against ``r``.

    Returns
    -------
    float or numpy.ndarray
        Acceptance probabilities in ``[0, 1]`` (a float when both inputs are scalars).
    """
    r_arr = np.asarray(r, dtype=float)
    s_arr = np.asarray(sigma, dtype=float)
    if np.any(np.isnan(r_arr)):
        raise ValueError("r must not contain NaN (use -inf for an impossible proposal)")
    if not np.all(np.isfinite(s_arr) & (s_arr >= 0.0)):
        raise ValueError("sigma must contain only finite real numbers in [0, inf)")
    r_arr, s_arr = np.broadcast_arrays(r_arr, s_arr)
    noisy = s_arr > 0.0
    s_safe = np.where(noisy, s_arr, 1.0)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        x = r_arr / s_safe
        log_first = log_ndtr(x - 0.5 * s_safe)
        log_second = r_arr + log_ndtr(-x - 0.5 * s_safe)
        noisy_value = np.exp(np.minimum(np.logaddexp(log_first, log_second), 0.0))
        exact_value = np.exp(np.minimum(r_arr, 0.0))
    out = np.where(noisy, noisy_value, exact_value)
    out = np.where(np.isposinf(r_arr), 1.0, out)
    if out.ndim == 0:
        return float(out)
    return out
