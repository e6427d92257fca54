"""ArviZ-facing diagnostics of private InferenceData: a summary beside the report, and plots.

Everything shown is already released: the chain, the per-step statistics (noisy acceptance
probabilities, noise sd and sensitivity, which depend only on the released states and
data-independent proposals, and the noisy clipped fraction) and the privacy report in
``idata.attrs``. Nothing here evaluates the model or reads data.

The epsilon curve composes the per-step ``dp_mu`` statistics in Gaussian DP,
``mu(t) = sqrt(sum_{s <= t} mu_s^2)``, and converts with
:func:`~pymc_penalty.accounting.gdp_epsilon` at the report's ``delta``. Tuning draws count:
they are included when ``warmup_sample_stats`` is stored (``discard_tuned_samples=False``);
otherwise the curve misses them and the plot says so.
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

from pymc_penalty.accounting import gdp_epsilon
from pymc_penalty.report import DATA_GROUPS
from pymc_penalty.validation import check_integer, check_real

__all__ = [
    "EpsilonCurve",
    "PrivateSummary",
    "epsilon_curve",
    "plot_epsilon",
    "plot_privacy",
    "privacy_report",
    "summary",
]


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


def _stats(idata: az.InferenceData) -> xr.Dataset:
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
class EpsilonCurve:
    """Epsilon spent against draw.

    Attributes
    ----------
    draw : ndarray, shape (k,)
        Draw index of each point (tuning draws negative, the last tuning draw at -1).
    per_chain : ndarray, shape (chains, k)
        Epsilon of each chain's releases alone, up to and including that draw.
    total : ndarray, shape (k,)
        Epsilon of all chains' releases up to that draw.
    chains : ndarray
        Chain labels.
    delta : float
        The ``delta`` of the conversion.
    includes_tuning : bool
        Whether tuning releases are in the curve.
    missing_tuning : int
        Tuning draws per chain that were made but are not stored (so not in the curve).
    """

    draw: np.ndarray
    per_chain: np.ndarray
    total: np.ndarray
    chains: np.ndarray
    delta: float
    includes_tuning: bool
    missing_tuning: int


def _epsilon(delta: float, mu2: float) -> float:
    if not math.isfinite(mu2):
        return math.inf
    return float(gdp_epsilon(delta, math.sqrt(max(mu2, 0.0))))


def epsilon_curve(
    idata: az.InferenceData, delta: float | None = None, max_points: int = 1000
) -> EpsilonCurve:
    """Compose the per-step ``dp_mu`` cumulatively per chain and over all chains.

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
    stats = _stats(idata)
    if "dp_mu" not in stats:
        raise ValueError("`idata.sample_stats` has no `dp_mu`: not a penalty-step result.")
    # A refused release has dp_mu = 0; a chain absent from one group (trimmed) adds nothing.
    mu = np.nan_to_num(np.asarray(stats["dp_mu"].values, dtype=np.float64), nan=0.0)
    cum = np.cumsum(mu**2, axis=1)
    total = np.cumsum(np.sum(mu**2, axis=0))
    draws = np.asarray(stats["draw"].values)
    idx = np.unique(np.linspace(0, draws.size - 1, min(int(max_points), draws.size)).round())
    idx = idx.astype(int)
    includes = bool(draws.size and draws[0] < 0)
    tuning = int(idata.sample_stats.attrs.get("tuning_steps", 0) or 0)
    return EpsilonCurve(
        draw=draws[idx],
        per_chain=np.array([[_epsilon(delta, c[i]) for i in idx] for c in cum]),
        total=np.array([_epsilon(delta, total[i]) for i in idx]),
        chains=np.asarray(stats["chain"].values),
        delta=float(delta),
        includes_tuning=includes,
        missing_tuning=0 if includes else tuning,
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


def plot_epsilon(idata: az.InferenceData, ax: Any = None) -> Any:
    """Epsilon spent against draw, per chain and for all chains together.

    Parameters
    ----------
    idata : InferenceData
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib Axes
        Lines labelled ``chain <c>`` and ``all chains``; horizontal lines for the report's
        epsilon and the budget.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots()
    curve = epsilon_curve(idata)
    report = privacy_report(idata)
    for label, values in zip(curve.chains, curve.per_chain, strict=True):
        ax.plot(curve.draw, values, lw=1, label=f"chain {label}")
    ax.plot(curve.draw, curve.total, color="k", lw=2, label="all chains")
    ax.axhline(report["dp_epsilon"], color="C3", ls=":", label="report")
    if "dp_epsilon_budget" in report:
        ax.axhline(report["dp_epsilon_budget"], color="C3", ls="--", lw=1, label="budget")
    if curve.includes_tuning:
        ax.axvline(0, color="grey", lw=0.8)
    title = f"epsilon spent (delta = {curve.delta:g})"
    if curve.missing_tuning:
        title += f"\n{curve.missing_tuning} tuning draws/chain not stored: not in the curves"
    ax.set(xlabel="draw (tuning < 0)", ylabel="epsilon", title=title)
    ax.legend(fontsize="small")
    return ax


def _trace(ax: Any, stats: xr.Dataset, name: str, title: str, window: int = 1) -> None:
    draws = np.asarray(stats["draw"].values)
    for label in stats["chain"].values:
        values = np.asarray(stats[name].sel(chain=label).values, dtype=np.float64)
        if window > 1:
            values = pd.Series(values).rolling(window, min_periods=1).mean().to_numpy()
        ax.plot(draws, values, lw=0.8, label=f"chain {label}")
    if draws.size and draws[0] < 0:
        ax.axvline(0, color="grey", lw=0.8)
    ax.set(xlabel="draw (tuning < 0)", title=title)


def plot_privacy(idata: az.InferenceData, figsize: tuple[float, float] = (11.0, 7.0)) -> Any:
    """Four panels: epsilon spent, noise sd, acceptance and clipped fraction against draw.

    Parameters
    ----------
    idata : InferenceData
        A private result with its report.
    figsize : tuple of float

    Returns
    -------
    matplotlib Figure
        Axes in order: epsilon (:func:`plot_epsilon`), ``dp_noise_sd`` per draw, the noisy
        ``accept`` probability (rolling mean over ``max(1, draws // 50)`` draws) and the
        noisy released ``dp_clipped_fraction`` per draw.
    """
    import matplotlib.pyplot as plt

    report = privacy_report(idata)
    stats = _stats(idata)
    fig, axes = plt.subplots(2, 2, figsize=figsize, constrained_layout=True)
    plot_epsilon(idata, ax=axes[0, 0])
    _trace(axes[0, 1], stats, "dp_noise_sd", "noise sd of each release")
    window = max(1, stats.sizes["draw"] // 50)
    _trace(
        axes[1, 0],
        stats,
        "accept",
        f"acceptance probability (rolling mean, {window} draws)",
        window,
    )
    axes[1, 0].set_ylim(-0.02, 1.02)
    _trace(axes[1, 1], stats, "dp_clipped_fraction", "clipped fraction (noisy release)")
    axes[1, 1].axhline(0.0, color="grey", lw=0.8)
    fig.suptitle(
        f"epsilon {report['dp_epsilon']:.3g}, delta {report['dp_delta']:g}, "
        f"{report.get('dp_neighbours', '')} neighbours, {report.get('dp_releases')} releases"
    )
    return fig
