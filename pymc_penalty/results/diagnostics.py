"""ArviZ-facing diagnostics of private InferenceData: a summary beside the report, the
epsilon curve, the cost per phase and the convergence verdict (plots:
:mod:`pymc_penalty.results.plots`).

Everything shown is already released: the chain, the per-step statistics (noisy acceptance
probabilities, noise sd and sensitivity, which depend only on the released states and
data-independent proposals, and the noisy clipped fraction) and the privacy report in
``idata.attrs``. Nothing here evaluates the model or reads data.

The epsilon curve composes the per-step ``dp_mu`` statistics in Gaussian DP,
``mu(t) = sqrt(sum_{s <= t} mu_s^2)`` (:func:`~pymc_penalty.accounting.compose_mu2`), and
converts with :func:`~pymc_penalty.accounting.composed_epsilon` at the report's ``delta``.
Tuning draws count: they are included when ``warmup_sample_stats`` is stored
(``discard_tuned_samples=False``); otherwise they are one lump at draw -1, counted from the
report, and the plot says so.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import arviz as az
import numpy as np
import pandas as pd
import xarray as xr

from pymc_penalty.accounting import GDPAccountant, compose_mu2, composed_epsilon
from pymc_penalty.errors import ConvergenceWarning
from pymc_penalty.results.report import DATA_GROUPS
from pymc_penalty.validation import check_integer, check_real

__all__ = [
    "CONVERGENCE_RULES",
    "ESS_GOOD",
    "ESS_MIN",
    "ESS_NOTE",
    "R_HAT_MAX",
    "R_HAT_NOTE",
    "ConvergenceWarning",
    "EpsilonCurve",
    "PhaseCosts",
    "PrivateSummary",
    "convergence_verdict",
    "epsilon_curve",
    "phase_costs",
    "privacy_report",
    "summary",
]


#: Largest rank-normalised split R-hat of a converged run (Vehtari et al. 2021).
R_HAT_MAX = 1.01
#: Smallest bulk effective sample size (over all chains) below which a run has not converged.
ESS_MIN = 100.0
#: Bulk ESS from which a run with a good R-hat counts as converged (100 per chain for four
#: chains, ibid.); between ESS_MIN and this it is "doubtful".
ESS_GOOD = 400.0

#: The verdict's rules, in words: the one text the report, the ConvergenceWarning and the
#: documentation (docs/convergence.md, checked by a test) quote.
CONVERGENCE_RULES = {
    "converged": f"largest R-hat <= {R_HAT_MAX:g} and smallest bulk ESS >= {ESS_GOOD:g}",
    "doubtful": (
        f"largest R-hat <= {R_HAT_MAX:g} and smallest bulk ESS from {ESS_MIN:g} to below "
        f"{ESS_GOOD:g}"
    ),
    "not converged": f"largest R-hat > {R_HAT_MAX:g}, or smallest bulk ESS < {ESS_MIN:g}",
}
#: What the report and the ConvergenceWarning print beside the largest R-hat ...
R_HAT_NOTE = f"converged: <= {R_HAT_MAX:g}"
#: ... and beside the smallest bulk ESS.
ESS_NOTE = f"converged: >= {ESS_GOOD:g}; not converged: < {ESS_MIN:g}"


def convergence_verdict(idata: az.InferenceData) -> dict[str, Any]:
    """The convergence verdict of a released chain: post-processing, no data read.

    Returns ``dp_r_hat_max`` (largest R-hat over the posterior's scalar components, NaN with
    one chain), ``dp_ess_bulk_min`` (smallest bulk ESS) and ``dp_convergence``:
    ``"not converged"``, ``"doubtful"`` or ``"converged"`` by :data:`CONVERGENCE_RULES`
    (R-hat above :data:`R_HAT_MAX` or bulk ESS below :data:`ESS_MIN`: not converged; bulk ESS
    below :data:`ESS_GOOD`: doubtful), and ``"unknown"`` without posterior draws. These are
    flat ``attrs`` entries, so the InferenceData still writes to netCDF.
    """
    post = idata.posterior if "posterior" in idata.groups() else None
    if post is None or not post.data_vars or post.sizes.get("draw", 0) < 4:
        return {"dp_r_hat_max": math.nan, "dp_ess_bulk_min": math.nan, "dp_convergence": "unknown"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # short or single chains: NaN, said in the verdict
        ess = az.ess(post, method="bulk")
        rhat = az.rhat(post) if post.sizes.get("chain", 1) > 1 else None
    ess_values = np.concatenate([np.ravel(v.values) for v in ess.data_vars.values()])
    ess_min = float(np.nanmin(ess_values)) if np.isfinite(ess_values).any() else math.nan
    rhat_max = math.nan
    if rhat is not None:
        values = np.concatenate([np.ravel(v.values) for v in rhat.data_vars.values()])
        rhat_max = float(np.nanmax(values)) if np.isfinite(values).any() else math.nan
    if not ess_min >= ESS_MIN or rhat_max > R_HAT_MAX:  # NaN ESS: not converged
        verdict = "not converged"
    elif ess_min < ESS_GOOD:
        verdict = "doubtful"
    else:
        verdict = "converged"
    return {"dp_r_hat_max": rhat_max, "dp_ess_bulk_min": ess_min, "dp_convergence": verdict}


def privacy_report(idata: az.InferenceData) -> dict[str, Any]:
    """The privacy report (``dp_*`` keys and the package version) from ``idata.attrs``.

    Raises
    ------
    ValueError
        If ``idata`` carries no report: a raw ``pm.sample`` result, which still holds the
        data and must first go through :func:`pymc_penalty.finalize`.
    """
    report = {
        key: value
        for key, value in idata.attrs.items()
        if key.startswith("dp_") or key == "pymc_penalty_version"
    }
    if "dp_epsilon" not in report:
        raise ValueError(
            "`idata` has no privacy report in its attrs (no `dp_epsilon`): it is a raw "
            "pm.sample result, not a private one. Pass it through "
            "pymc_penalty.finalize(idata, step) first, or use pymc_penalty.sample."
        )
    return report


def released_stats(idata: az.InferenceData) -> xr.Dataset:
    """Step statistics with tuning draws first (negative draw index), chains outer-joined."""
    if "sample_stats" not in idata.groups():
        raise ValueError("`idata` has no sample_stats group.")
    post = idata.sample_stats
    if "warmup_sample_stats" not in idata.groups() or not idata.warmup_sample_stats.sizes.get(
        "draw", 0
    ):
        return post
    warm = idata.warmup_sample_stats
    warm = warm.assign_coords(draw=np.arange(-warm.sizes["draw"], 0))
    names = [name for name in post.data_vars if name in warm.data_vars]
    return xr.concat([warm[names], post[names]], dim="draw", join="outer")


@dataclass(frozen=True)
class PhaseCosts:
    """What each phase of a run spent, in Gaussian-DP ``mu^2`` (composition adds them).

    Attributes
    ----------
    warm_start_mu2 : float
        The private warm start's ``mu^2`` (0 without one).
    warm_start_releases : int
    tuning_mu2, sampling_mu2 : ndarray, shape (chains,)
        Per chain: the tuning steps' and the kept draws' ``mu^2``.
    tuning_releases, sampling_releases : ndarray of int, shape (chains,)
    tuning_stored : bool
        Whether the tuning steps' statistics are stored (``discard_tuned_samples=False``);
        otherwise their releases are counted from the report and priced at the chain's
        per-step ``mu`` (the calibration is fixed for the run).
    screen_mu2 : float
        The ``mu^2`` of ``pp.sample``'s noisy count of rows the likelihood cannot evaluate
        (``dp_screen_mu``; 0 without one).
    removed_mu2 : float
        Releases whose draws are not in the result (``dp_releases_removed``: draws past the
        plan or the budget, cut so every chain has the same length, and chains that
        released no draw), priced at the per-step ``mu``. They were spent all the same.
    removed_releases : int
    taylor_mu2 : float
        The Taylor path's one-shot release (``dp_taylor_mu``; 0 on the plain path).
    taylor_releases : int
    """

    warm_start_mu2: float
    warm_start_releases: int
    tuning_mu2: np.ndarray
    sampling_mu2: np.ndarray
    tuning_releases: np.ndarray
    sampling_releases: np.ndarray
    tuning_stored: bool
    screen_mu2: float = 0.0
    removed_mu2: float = 0.0
    removed_releases: int = 0
    taylor_mu2: float = 0.0
    taylor_releases: int = 0

    @property
    def total_mu2(self) -> float:
        """Everything the run spent: the screen, the warm start, the Taylor path's one-shot,
        tuning and sampling of every chain, and the releases whose draws were removed."""
        return float(
            self.screen_mu2
            + self.warm_start_mu2
            + self.taylor_mu2
            + self.tuning_mu2.sum()
            + self.sampling_mu2.sum()
            + self.removed_mu2
        )


def _released_mu(stats: xr.Dataset) -> np.ndarray:
    """Per-step ``dp_mu`` of each stored step, 0 where nothing was released."""
    mu = np.nan_to_num(np.asarray(stats["dp_mu"].values, dtype=np.float64), nan=0.0)
    if "dp_released" in stats:
        mu = np.where(np.asarray(stats["dp_released"].values, dtype=bool), mu, 0.0)
    return mu


def phase_costs(idata: az.InferenceData) -> PhaseCosts:
    """Split what a private result spent into warm start, tuning and sampling.

    Parameters
    ----------
    idata : InferenceData
        A private result (privacy report in ``attrs``, ``dp_mu`` in ``sample_stats``).

    Returns
    -------
    PhaseCosts
    """
    report = privacy_report(idata)
    stats = idata.sample_stats
    if "dp_mu" not in stats:
        raise ValueError("`idata.sample_stats` has no `dp_mu`: not a penalty-step result.")
    mu = _released_mu(stats)
    sampling_mu2 = compose_mu2(mu, axis=1)
    sampling_releases = np.count_nonzero(mu, axis=1)
    warm = idata.warmup_sample_stats if "warmup_sample_stats" in idata.groups() else None
    stored = warm is not None and "dp_mu" in warm and warm.sizes.get("draw", 0) > 0
    if stored:
        warm_mu = _released_mu(warm)
        tuning_mu2 = compose_mu2(warm_mu, axis=1)
        tuning_releases = np.count_nonzero(warm_mu, axis=1)
    else:
        # The kept chains' releases that are in the result (a removed chain published none).
        per_chain = _published_per_chain(report)
        if per_chain.shape != sampling_releases.shape:
            per_chain = sampling_releases.copy()
        tuning_releases = np.maximum(per_chain - sampling_releases, 0)
        step_mu = mu.max(axis=1) if mu.size else np.zeros(len(tuning_releases))
        tuning_mu2 = [
            GDPAccountant().spend(float(m), int(k)).mu_squared
            for m, k in zip(step_mu, tuning_releases, strict=True)
        ]
    removed = int(report.get("dp_releases_removed", 0))
    run_mu = float(mu.max()) if mu.size and mu.max() > 0 else 0.0
    return PhaseCosts(
        warm_start_mu2=float(report.get("dp_warm_start_mu", 0.0)) ** 2,
        warm_start_releases=int(report.get("dp_warm_start_releases", 0)),
        tuning_mu2=np.asarray(tuning_mu2, dtype=np.float64),
        sampling_mu2=np.asarray(sampling_mu2, dtype=np.float64),
        tuning_releases=np.asarray(tuning_releases, dtype=np.int64),
        sampling_releases=np.asarray(sampling_releases, dtype=np.int64),
        tuning_stored=bool(stored),
        screen_mu2=float(report.get("dp_screen_mu", 0.0)) ** 2,
        removed_mu2=GDPAccountant().spend(run_mu, removed).mu_squared if removed else 0.0,
        removed_releases=removed,
        taylor_mu2=float(report.get("dp_taylor_mu", 0.0)) ** 2,
        taylor_releases=int(report.get("dp_taylor_releases", 0)),
    )


def _published_per_chain(report: dict[str, Any]) -> np.ndarray:
    """Releases per chain whose draws are in the result (tuning included), for the chains
    kept in it: the report's ``dp_releases_per_chain`` less ``dp_releases_removed_per_chain``
    (a kept chain published at least one released draw, a removed one none)."""
    per_chain = np.asarray(report.get("dp_releases_per_chain", []), dtype=np.int64)
    removed = np.asarray(report.get("dp_releases_removed_per_chain", []), dtype=np.int64)
    if removed.shape != per_chain.shape:
        return per_chain
    published = per_chain - removed
    return published[published > 0]


@dataclass(frozen=True)
class EpsilonCurve:
    """Epsilon spent against draw.

    Attributes
    ----------
    draw : ndarray, shape (k,)
        Draw index of each point (tuning draws negative, the last tuning draw at -1).
    per_chain : ndarray, shape (chains, k)
        Epsilon of each chain's releases alone (tuning included), up to and including that
        draw.
    total : ndarray, shape (k,)
        Epsilon of everything the run spent up to that draw: the screen and the warm start
        (from the start),
        and every chain's releases, tuning included. It ends at the report's ``dp_epsilon``.
    chains : ndarray
        Chain labels.
    delta : float
        The ``delta`` of the conversion.
    includes_tuning : bool
        Whether tuning releases are in the curve (always, since 0.2: stored tuning draws one
        by one, otherwise as one lump at draw -1).
    missing_tuning : int
        Tuning draws per chain whose statistics are not stored: they are in the curve as one
        lump at draw -1, not draw by draw.
    warm_start_epsilon : float
        Epsilon of the warm start alone (0 without one), the start of ``total``.
    """

    draw: np.ndarray
    per_chain: np.ndarray
    total: np.ndarray
    chains: np.ndarray
    delta: float
    includes_tuning: bool
    missing_tuning: int
    warm_start_epsilon: float = 0.0


def epsilon_curve(
    idata: az.InferenceData, delta: float | None = None, max_points: int = 1000
) -> EpsilonCurve:
    """Compose the per-step ``dp_mu`` cumulatively per chain and over the whole run.

    Everything the report counts is in the curve, so its last point is the report's
    ``dp_epsilon``: the screen of unevaluable rows, the warm start and the Taylor path's
    one-shot (``total`` starts at them), and the tuning steps, draw by
    draw when their statistics are stored (``discard_tuned_samples=False``), otherwise as one
    lump at draw -1 (their number from the report, their cost the chain's fixed per-step
    ``mu``).

    Parameters
    ----------
    idata : InferenceData
        A private result (``sample_stats`` with ``dp_mu``).
    delta : float, optional
        Conversion ``delta``; default the report's ``dp_delta``.
    max_points : int, default 1000
        Evaluate at most this many draws (evenly spaced, the last draw always included).

    Returns
    -------
    EpsilonCurve
    """
    check_integer("max_points", max_points, low=2)
    if delta is None:
        delta = float(privacy_report(idata)["dp_delta"])
    delta = check_real("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
    costs = phase_costs(idata)
    stats = released_stats(idata)
    # A refused release has dp_mu = 0; a chain absent from one group (trimmed) adds nothing.
    mu = _released_mu(stats)
    draws = np.asarray(stats["draw"].values)
    tuning = int(idata.sample_stats.attrs.get("tuning_steps", 0) or 0)
    if not costs.tuning_stored:
        # The tuning releases as one lump at draw -1 (before the first kept draw).
        mu = np.concatenate([np.sqrt(costs.tuning_mu2)[:, None], mu], axis=1)
        draws = np.concatenate([[-1], draws])
    cum = compose_mu2(mu, axis=1, cumulative=True)
    total = costs.screen_mu2 + costs.warm_start_mu2 + costs.taylor_mu2 + np.sum(cum, axis=0)
    idx = np.unique(np.linspace(0, draws.size - 1, min(int(max_points), draws.size)).round())
    idx = idx.astype(int)
    return EpsilonCurve(
        draw=draws[idx],
        per_chain=np.array([[composed_epsilon(c[i], delta) for i in idx] for c in cum]),
        total=np.array([composed_epsilon(total[i], delta) for i in idx]),
        chains=np.asarray(stats["chain"].values),
        delta=float(delta),
        includes_tuning=True,
        missing_tuning=0 if costs.tuning_stored else tuning,
        warm_start_epsilon=composed_epsilon(costs.warm_start_mu2, delta),
    )


def _per_chain(idata: az.InferenceData) -> pd.DataFrame:
    stats = idata.sample_stats

    def mean_of(name: str, finite_only: bool = False) -> np.ndarray:
        if name not in stats:
            return np.full(stats.sizes["chain"], np.nan)
        values = np.asarray(stats[name].values, dtype=np.float64)
        if "dp_released" in stats:
            values = np.where(np.asarray(stats["dp_released"].values, bool), values, np.nan)
        if finite_only:
            values = np.where(np.isfinite(values), values, np.nan)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a chain with no finite value
            return np.nanmean(values, axis=1)

    return pd.DataFrame(
        {
            "draws": np.full(stats.sizes["chain"], stats.sizes["draw"]),
            "acceptance_rate": mean_of("accepted"),
            "mean_accept_prob": mean_of("accept"),
            "mean_noise_sd": mean_of("dp_noise_sd"),
            "clipped_fraction": mean_of("dp_clipped_fraction", finite_only=True),
        },
        index=pd.Index(np.asarray(stats["chain"].values), name="chain"),
    )


@dataclass(frozen=True)
class PrivateSummary:
    """ArviZ's summary of a private result, beside its privacy report.

    Attributes
    ----------
    table : pandas.DataFrame
        ``az.summary`` of the posterior.
    privacy : dict
        The privacy report (``dp_*`` attrs).
    chains : pandas.DataFrame
        Per chain, over the stored post-tuning draws: ``acceptance_rate`` (mean of
        ``accepted``), ``mean_accept_prob`` (mean of the noisy ``accept``), ``mean_noise_sd``
        and ``clipped_fraction`` (mean of the noisy released clipped fraction).
    """

    table: pd.DataFrame
    privacy: dict[str, Any]
    chains: pd.DataFrame

    def _privacy_lines(self) -> list[str]:
        p = self.privacy
        lines = [
            f"epsilon {p['dp_epsilon']:.4g} (budget {p.get('dp_epsilon_budget', float('nan')):g}),"
            f" delta {p['dp_delta']:g}, mu {p['dp_mu']:.4g}",
            f"neighbours: {p.get('dp_neighbours')}; sensitivity: {p.get('dp_sensitivity')}",
            f"releases: {p.get('dp_releases')} (per chain {p.get('dp_releases_per_chain')})",
            f"accountant: {p.get('dp_accountant')}",
            "noise: " + ("private (OS entropy)" if p.get("dp_noise_private") else "NOT private"),
        ]
        if p.get("dp_trimmed_draws"):
            lines.append(f"trimmed draws (budget ran out): {p['dp_trimmed_draws']}")
        return lines

    def __str__(self) -> str:
        return "\n".join(
            ["Privacy report", *("  " + line for line in self._privacy_lines()), ""]
            + ["Per chain (released statistics)", self.chains.to_string(), ""]
            + ["Posterior", self.table.to_string()]
        )

    def _repr_html_(self) -> str:
        items = "".join(f"<li>{line}</li>" for line in self._privacy_lines())
        return (
            f"<h4>Privacy report</h4><ul>{items}</ul>"
            f"<h4>Per chain (released statistics)</h4>{self.chains.to_html()}"
            f"<h4>Posterior</h4>{self.table.to_html()}"
        )


def summary(idata: az.InferenceData, **arviz_kwargs: Any) -> PrivateSummary:
    """``az.summary`` of a private result beside its privacy report and per-chain statistics.

    Parameters
    ----------
    idata : InferenceData
        From :func:`pymc_penalty.sample`, or ``pm.sample`` followed by
        :func:`pymc_penalty.attach_report`.
    **arviz_kwargs
        Passed to ``az.summary`` (``var_names``, ``hdi_prob``, ...).

    Returns
    -------
    PrivateSummary
        Printable (``str``) and rendered in notebooks (``_repr_html_``).

    Raises
    ------
    ValueError
        If ``idata`` has no privacy report (a raw ``pm.sample`` result: see
        :func:`pymc_penalty.finalize`), or still holds data-bearing content (its data groups,
        or ``keep_data=True``): a summary of it could show exact functions of the data.
    """
    report = privacy_report(idata)
    if not report.get("dp_data_removed", 1):
        raise ValueError(
            "`idata` kept its data-bearing content (attach_report(keep_data=True)); summarise "
            "it with az.summary directly, knowing the result is not private."
        )
    held = [group for group in DATA_GROUPS if group in idata.groups()]
    if held:
        raise ValueError(
            f"`idata` still holds data ({', '.join(held)}): it is not a private result. Pass "
            "pm.sample's result through pymc_penalty.finalize(idata, step)."
        )
    table = az.summary(idata, **arviz_kwargs)
    return PrivateSummary(table=table, privacy=report, chains=_per_chain(idata))
