"""Releasing contaminated posterior draws, with the empirical estimate in its own report key.

The estimate (:class:`EmpiricalPrivacy`) is average case, asymptotic and Monte Carlo: it is
stored under ``idata.attrs["contamination_privacy"]`` with ``certified = False`` and never
under ``dp_epsilon``, never composed with a :class:`~pymc_penalty.PrivacyLedger`.
"""

from __future__ import annotations

import json
import math
from typing import Any

import arviz as az
import numpy as np
import pymc as pm

from pymc_penalty.contamination.empirical import STATEMENT, EmpiricalPrivacy
from pymc_penalty.contamination.mechanism import TAG
from pymc_penalty.errors import (
    InvalidArgumentError,
    LikelihoodEvaluationError,
    ModelNotPrivateError,
)
from pymc_penalty.model.checks import (
    data_dependent_variables,
    data_dims,
    data_sources,
    depends_on_data,
    n_datapoints,
)
from pymc_penalty.validation import check_choice, check_integer

__all__ = ["REPORT_KEY", "netcdf_safe", "sample_contaminated"]

#: The attrs key of the contamination report.
REPORT_KEY = "contamination_privacy"


def _check_model(model: pm.Model) -> dict[str, Any]:
    """The contamination of every observed variable; refuse data reaching the draw otherwise."""
    n = n_datapoints(model)
    tags = {}
    for rv in model.observed_RVs:
        tag = getattr(rv.tag, TAG, None)
        if tag is None:
            raise ModelNotPrivateError(
                f"Observed variable `{rv.name}` was not built by contaminated_likelihood: "
                "every likelihood of a contaminated release must be contaminated."
            )
        tags[rv.name] = tag
    sources = data_sources(model)
    for var in [*model.free_RVs, *model.potentials]:
        if depends_on_data([var], sources, n):
            raise ModelNotPrivateError(
                f"`{var.name}` depends on data: data may enter a contaminated release only "
                "through the contaminated likelihood."
            )
    return tags


def sample_contaminated(
    draws: int = 1,
    *,
    privacy: EmpiricalPrivacy | None = None,
    statistic: str = "mean",
    model: pm.Model | None = None,
    tune: int = 1000,
    thin: int = 10,
    random_seed: Any = None,
    **sample_kwargs: Any,
) -> az.InferenceData:
    """Release ``draws`` posterior draws (one by default) of a contaminated model.

    Runs ``pm.sample`` with one chain, keeps every ``thin``-th draw after ``tune`` tuning
    steps (draws at stationarity, as the paper's Definition 1 requires), and returns only the
    ``posterior`` group, without Deterministics that read data or record coordinates.

    Parameters
    ----------
    draws : int, default 1
        Number of draws released; ``k`` draws are reported as ``(k eps, k delta)`` (basic
        composition).
    privacy : EmpiricalPrivacy, optional
        From :func:`estimate_privacy` on synthetic data. Without it the report says the
        privacy was not estimated (``eps_hat`` is NaN).
    statistic : {"mean", "max"}
        Which summary over repetitions the report quotes.
    model : pm.Model, optional
        Every observed variable must come from :func:`contaminated_likelihood`.
    tune, thin : int
        Tuning steps and thinning of the single chain.
    random_seed : optional
        ``None`` (default) leaves the sampler on OS entropy. A seed makes the draw a
        deterministic function of the data: not private, and the report says so.
    **sample_kwargs
        Passed to ``pm.sample`` (``chains``, ``cores``, ``draws`` are fixed here).

    Returns
    -------
    InferenceData
        ``posterior`` only, with ``attrs["contamination_privacy"]`` (a dict; see
        :func:`netcdf_safe` before ``to_netcdf``). Never ``dp_epsilon``.

    Raises
    ------
    ModelNotPrivateError
        If a likelihood is not contaminated or data reach the draw another way.
    InvalidArgumentError
        If a likelihood's contamination rate is 0 (before anything runs).
    LikelihoodEvaluationError
        If ``pm.sample`` fails; its message is withheld (PyMC's start check prints each
        term's log density). A record the likelihood cannot evaluate never causes it
        (:func:`~pymc_penalty.contamination.contaminated_likelihood` models it by g alone).
    """
    draws = check_integer("draws", draws, low=1)
    thin = check_integer("thin", thin, low=1)
    tune = check_integer("tune", tune, low=0)
    check_choice("statistic", statistic, ("mean", "max"))
    if privacy is not None and not isinstance(privacy, EmpiricalPrivacy):
        raise TypeError("`privacy` must be an EmpiricalPrivacy from estimate_privacy.")
    for key in ("chains", "cores", "draws"):
        if key in sample_kwargs:
            raise ValueError(f"`{key}` is fixed by sample_contaminated (one chain).")
    model = pm.modelcontext(model)
    tags = _check_model(model)
    zero = sorted(name for name, tag in tags.items() if tag["rate"] <= 0.0)
    if zero:
        # Without contamination the draw is an exact posterior draw: no privacy to report,
        # and a record outside f's support would make pm.sample fail on the data (issue 28).
        raise InvalidArgumentError(
            f"The contamination `rate` of {zero} is 0; sample_contaminated needs a rate in "
            "(0, 1] for every likelihood (the privacy comes from the contamination)."
        )
    n = n_datapoints(model)
    try:
        with model:
            idata = pm.sample(
                draws=int(draws) * int(thin), tune=tune, chains=1, cores=1,
                random_seed=random_seed, progressbar=False, compute_convergence_checks=False,
                **sample_kwargs,
            )  # fmt: skip
    except Exception as exc:
        # PyMC's start check prints every term's exact log density at the start point.
        raise LikelihoodEvaluationError(
            f"pm.sample failed on the contaminated model ({type(exc).__name__}); the details "
            "are withheld because they may quote data values."
        ) from None
    posterior = idata.posterior.isel(draw=slice(int(thin) - 1, None, int(thin)))
    leaky = [v for v in data_dependent_variables(model, n) if v in posterior.data_vars]
    posterior = posterior.drop_vars(leaky)
    dims = [c for c in data_dims(model, n) if c in posterior.coords]
    posterior = posterior.drop_vars(dims)
    posterior.attrs.pop("sampling_time", None)
    posterior = posterior.assign_coords(draw=np.arange(posterior.sizes["draw"]))
    release = az.InferenceData(posterior=posterior)
    if privacy is not None:
        report = privacy.report(draws=int(draws), statistic=statistic)
    else:
        report = {
            "kind": "empirical, model-based, asymptotic (Hu et al.)",
            "eps_hat": math.nan,
            "delta_hat": math.nan,
            "statistic": "not estimated: call estimate_privacy on synthetic data",
            "n": -1,
            "rate": math.nan,
            "radius": math.nan,
            "reps": 0,
            "draws_covered": int(draws),
            "certified": False,
            "statement": STATEMENT,
        }
    rates = sorted({tag["rate"] for tag in tags.values()})
    report["model_rates"] = rates
    report["seeded"] = random_seed is not None
    if random_seed is not None:
        report["statement"] += " The sampler was seeded: this release is not private."
    release.attrs[REPORT_KEY] = report
    return release


def netcdf_safe(idata: az.InferenceData) -> az.InferenceData:
    """Replace the report dict by a JSON string (netCDF attributes cannot hold dicts)."""
    report = idata.attrs.get(REPORT_KEY)
    if isinstance(report, dict):
        idata.attrs[REPORT_KEY] = json.dumps(report, allow_nan=True)
    return idata
