"""Plots of a private result's released statistics: epsilon spent, noise, acceptance and the
clipped fraction against draw. Everything drawn is already released (see
:mod:`pymc_penalty.results.diagnostics`); nothing here evaluates the model or reads data."""

from __future__ import annotations

from typing import Any

import arviz as az
import numpy as np
import pandas as pd
import xarray as xr

from pymc_penalty.results.diagnostics import epsilon_curve, privacy_report, released_stats

__all__ = ["plot_epsilon", "plot_privacy"]


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
        title += f"\n{curve.missing_tuning} tuning draws/chain not stored: one step at draw -1"
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
    stats = released_stats(idata)
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
