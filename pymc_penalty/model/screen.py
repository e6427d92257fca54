"""A charged, noisy count of the rows each observed variable's likelihood cannot evaluate.

A refusal spends nothing, so no refusal may depend on data values (issue 28: a support check
on ``observed=np.round(y - c)`` bisected a record for free). A NaN, an infinite value or a
value outside the likelihood's support is therefore not refused: its row's ratio adds 0 and
counts as clipped (:func:`pymc_penalty.model.likelihood.clipped_ratio_sum`). Users must still hear
about *systematic* errors (a Bernoulli response coded 1/2, a covariate that is mostly NaN):
:func:`screen_rows` releases, per observed variable, the number of rows whose log-likelihood
term is not finite at the model's initial point, with Gaussian noise, after charging the
ledger; :func:`flag_unevaluable` names the variables whose noisy count is far above zero.
A single bad row stays hidden in the noise, as it must.

Sensitivity: one record is one row of every observed variable, so it moves each of the ``k``
counts by at most one, under substitute-one and add/remove-one alike: L2 sensitivity
``sqrt(k)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pymc as pm

from pymc_penalty.errors import LikelihoodEvaluationError, ScreenRefused
from pymc_penalty.model.likelihood import per_datapoint_terms
from pymc_penalty.privacy.precision import snap_count

__all__ = [
    "FAR_ABOVE_ZERO",
    "SCREEN_SHARE",
    "RowScreen",
    "count_noise_sd",
    "flag_unevaluable",
    "screen_rows",
]

#: Share of the budget's ``mu^2`` (of what the ledger has left) that :func:`pymc_penalty.sample`
#: spends on the screen. At (epsilon, delta) = (1, 1e-5) with one observed variable the count's
#: noise sd is 1 / (0.268 * 0.1) = 37 rows.
SCREEN_SHARE = 0.01

#: A noisy count this many noise sds above zero is flagged (a false flag on a clean table has
#: probability 2.9e-7 per variable).
FAR_ABOVE_ZERO = 5.0


@dataclass(frozen=True)
class RowScreen:
    """What :func:`screen_rows` released.

    Attributes
    ----------
    counts : dict of str to float
        Noisy count of unevaluable rows per observed variable (a DP release).
    mu : float
        Gaussian-DP parameter of the release (charged to the ledger).
    noise_sd : float
        Standard deviation of each count's noise.
    """

    counts: dict[str, float]
    mu: float
    noise_sd: float


def count_noise_sd(n_variables: int, mu: float) -> float:
    """Noise sd of the screen's counts: L2 sensitivity ``sqrt(k)`` over ``mu``.

    Parameters
    ----------
    n_variables : int
        Number of observed variables ``k`` (one count each).
    mu : float
        Gaussian-DP parameter of the release, > 0.

    Returns
    -------
    float
    """
    if n_variables < 1 or not (mu > 0 and math.isfinite(mu)):
        raise ValueError("count_noise_sd needs n_variables >= 1 and a finite mu > 0")
    return math.sqrt(n_variables) / mu


def flag_unevaluable(
    counts: Mapping[str, float], noise_sd: float, far: float = FAR_ABOVE_ZERO
) -> list[str]:
    """Names of the variables whose noisy count exceeds ``far`` noise sds (post-processing).

    Parameters
    ----------
    counts : mapping of str to float
        Released noisy counts.
    noise_sd : float
        Their noise sd.
    far : float, default :data:`FAR_ABOVE_ZERO`

    Returns
    -------
    list of str
    """
    return [name for name, value in counts.items() if value > far * noise_sd]


def _exact_counts(model: pm.Model) -> np.ndarray:
    """Rows per observed variable whose term is not finite at the initial point (exact and
    data-dependent: only :func:`screen_rows` calls it, after charging)."""
    terms = per_datapoint_terms(model)
    try:
        fn = model.compile_fn(terms, inputs=model.value_vars, on_unused_input="ignore")
        values = fn(model.initial_point())
    except Exception as exc:
        raise LikelihoodEvaluationError(
            f"Evaluating the model's log-likelihood failed ({type(exc).__name__}); the "
            "details are withheld because they may contain data values."
        ) from None
    with np.errstate(invalid="ignore"):
        return np.array(
            [np.count_nonzero(~np.isfinite(np.asarray(v))) for v in values], dtype=np.float64
        )


def screen_rows(
    model: pm.Model,
    *,
    mu: float,
    ledger: Any,
    noise_rng: np.random.Generator | None = None,
) -> RowScreen:
    """Release, per observed variable, a noisy count of the rows its likelihood cannot
    evaluate (a term that is NaN or infinite at the model's initial point).

    The release's cost ``mu^2`` is committed to ``ledger`` before the data are read.

    Parameters
    ----------
    model : pm.Model
    mu : float
        Gaussian-DP parameter of the release, > 0.
    ledger : PrivacyLedger
        Charged ``mu^2`` first.
    noise_rng : numpy.random.Generator, optional
        OS entropy by default (a seeded generator is not private).

    Returns
    -------
    RowScreen

    Raises
    ------
    ScreenRefused
        If the ledger refuses the release (nothing is computed).
    """
    names = [rv.name for rv in model.observed_RVs]
    sd = count_noise_sd(len(names), float(mu))
    if not ledger.try_spend(float(mu) ** 2):
        raise ScreenRefused("The privacy ledger refused the screen of unevaluable rows.")
    noise = np.random.default_rng() if noise_rng is None else noise_rng
    # On the integers, as every published noisy count (pymc_penalty.privacy.precision).
    noisy = snap_count(_exact_counts(model) + sd * noise.standard_normal(len(names)))
    return RowScreen(dict(zip(names, (float(v) for v in noisy), strict=True)), float(mu), sd)
