"""``pp.report(idata)``: the privacy report and what a reader needs beside it, for people.

The machine-readable report lives in ``idata.attrs`` (``dp_*`` keys, written by
:func:`~pymc_penalty.attach_report`). :func:`report` reads it, and only released quantities
(the chain and its per-step statistics), into one page: the budget and what was spent, what
each phase (warm start, tuning, sampling) cost, whether the chains converged, how much was
clipped, the forecast made before spending, and the Monte Carlo error to expect. It prints
as text and renders as HTML in notebooks. Nothing here evaluates the model or reads data.
"""

from __future__ import annotations

import html as _html
import math
from dataclasses import dataclass
from typing import Any

import arviz as az
import numpy as np

from pymc_penalty.accounting import composed_epsilon
from pymc_penalty.results.diagnostics import (
    ESS_NOTE,
    R_HAT_NOTE,
    convergence_verdict,
    phase_costs,
    privacy_report,
)

__all__ = ["ReportView", "convergence", "report"]


def convergence(idata: az.InferenceData) -> dict[str, Any]:
    """The convergence verdict (:func:`pymc_penalty.convergence_verdict`): the one
    :func:`pymc_penalty.sample` stored in ``attrs`` (``dp_convergence``, ``dp_r_hat_max``,
    ``dp_ess_bulk_min``), else computed here from the released posterior.

    Returns
    -------
    dict
        ``r_hat_max``, ``ess_bulk_min``, ``verdict`` (``"converged"``, ``"doubtful"`` or
        ``"not converged"``) and ``source`` (``"sampler"`` or ``"computed by pp.report"``).
    """
    attrs = idata.attrs
    if isinstance(attrs.get("dp_convergence"), str) and "dp_ess_bulk_min" in attrs:
        found, source = attrs, "sampler"
    else:
        found, source = convergence_verdict(idata), "computed by pp.report"
    return {
        "r_hat_max": float(found["dp_r_hat_max"]),
        "ess_bulk_min": float(found["dp_ess_bulk_min"]),
        "verdict": found["dp_convergence"],
        "source": source,
    }


def _fmt(x: Any, spec: str = ".4g") -> str:
    try:
        value = float(x)
    except (TypeError, ValueError):
        return str(x)
    return "n/a" if math.isnan(value) else format(value, spec)


@dataclass(frozen=True)
class ReportView:
    """A private result's report, for people: ``print`` it, or display it in a notebook.

    Attributes
    ----------
    sections : list of (title, rows)
        Each row a ``(label, text)`` pair.
    warnings : list of str
        What a reader must not miss (not converged, budget not private, ...).
    """

    sections: list[tuple[str, list[tuple[str, str]]]]
    warnings: list[str]

    def __str__(self) -> str:
        width = max((len(label) for _, rows in self.sections for label, _ in rows), default=0)
        out = ["Privacy report", "=============="]
        for text in self.warnings:
            out.append(f"WARNING: {text}")
        for title, rows in self.sections:
            out += ["", title, "-" * len(title)]
            out += [f"  {label:<{width}}  {text}" for label, text in rows]
        return "\n".join(out)

    def _repr_html_(self) -> str:
        esc = _html.escape
        parts = ["<div class='pymc-penalty-report'><h3>Privacy report</h3>"]
        for text in self.warnings:
            parts.append(f"<p style='color:#a00'><b>Warning:</b> {esc(text)}</p>")
        for title, rows in self.sections:
            body = "".join(f"<tr><th>{esc(a)}</th><td>{esc(b)}</td></tr>" for a, b in rows)
            parts.append(f"<h4>{esc(title)}</h4><table>{body}</table>")
        parts.append("</div>")
        return "".join(parts)


def _budget_rows(p: dict[str, Any]) -> list[tuple[str, str]]:
    budget = p.get("dp_epsilon_budget", math.nan)
    share = p["dp_epsilon"] / budget if budget and math.isfinite(budget) else math.nan
    return [
        (
            "epsilon spent",
            f"{_fmt(p['dp_epsilon'])} of {_fmt(budget)} ({_fmt(100 * share, '.1f')}%)",
        ),
        ("delta", _fmt(p["dp_delta"], "g")),
        ("Gaussian-DP mu", _fmt(p["dp_mu"])),
        ("releases", f"{p.get('dp_releases')} (per chain {p.get('dp_releases_per_chain')})"),
        ("neighbours", str(p.get("dp_neighbours"))),
        ("sensitivity", str(p.get("dp_sensitivity"))),
        ("accountant", str(p.get("dp_accountant"))),
        ("noise", "private (OS entropy)" if p.get("dp_noise_private") else "NOT private (seeded)"),
        ("removed from the result", str(p.get("dp_removed", "n/a"))),
    ]


def _phase_rows(idata: az.InferenceData, delta: float) -> list[tuple[str, str]]:
    costs = phase_costs(idata)
    total = costs.total_mu2
    phases = [
        ("screen", costs.screen_mu2, int(costs.screen_mu2 > 0)),  # unevaluable rows' count
        ("warm start", costs.warm_start_mu2, costs.warm_start_releases),
        *(
            [("Taylor one-shot", costs.taylor_mu2, costs.taylor_releases)]
            * bool(costs.taylor_releases)
        ),
        ("tuning", float(costs.tuning_mu2.sum()), int(costs.tuning_releases.sum())),
        ("sampling", float(costs.sampling_mu2.sum()), int(costs.sampling_releases.sum())),
    ]
    if costs.removed_releases:  # spent, but their draws are not in the result
        phases.append(("removed draws", costs.removed_mu2, costs.removed_releases))
    rows = []
    for name, mu2, releases in phases:
        share = 100.0 * mu2 / total if total > 0 else 0.0
        note = "" if name != "tuning" or costs.tuning_stored else ", counted from the report"
        rows.append(
            (
                name,
                f"{releases} releases, {share:.1f}% of the spent mu^2 "
                f"(epsilon {_fmt(composed_epsilon(mu2, delta))} alone{note})",
            )
        )
    return rows


def _clip_rows(idata: az.InferenceData, p: dict[str, Any]) -> list[tuple[str, str]]:
    frac = float(p.get("dp_clipped_fraction", math.nan))
    if math.isfinite(frac):
        return [("clipped rows per step", f"{100 * frac:.2f}% (mean of the noisy released share)")]
    stats = idata.sample_stats
    text = "not published: under add/remove-one neighbours n is private"
    if "dp_clipped_count" in stats:
        count = np.asarray(stats["dp_clipped_count"].values, dtype=float)
        if np.isfinite(count).any():
            text += f"; mean noisy clipped count {np.nanmean(count):.3g} per step"
    return [("clipped rows per step", text)]


def report(idata: az.InferenceData, *, html: bool = False) -> ReportView | str:
    """A readable report of a private result.

    Shows the budget and what was spent, what each phase cost (warm start, tuning,
    sampling; composition adds their ``mu^2``), the convergence verdict (the sampler's
    ``dp_convergence`` if stored, else largest R-hat and smallest bulk ESS computed from the
    released draws), the clipped share, the utility forecast made before spending
    (``dp_forecast_*``) and the Monte Carlo error to expect of a posterior mean.

    Parameters
    ----------
    idata : InferenceData
        A private result (:func:`pymc_penalty.sample`, or :func:`pymc_penalty.finalize`).
    html : bool, default False
        Return the HTML string instead of the object.

    Returns
    -------
    ReportView or str
        ``print`` it for text; notebooks render it as HTML.

    Raises
    ------
    ValueError
        If ``idata`` has no privacy report (a raw ``pm.sample`` result).
    """
    p = privacy_report(idata)
    delta = float(p["dp_delta"])
    conv = convergence(idata)
    ess = float(conv.get("ess_bulk_min", math.nan))
    notes: list[str] = []
    if conv["verdict"] != "converged":
        state = "not converged" if conv["verdict"] == "not converged" else "not clearly converged"
        notes.append(
            f"the chains have {state} (largest R-hat {_fmt(conv.get('r_hat_max'), '.3g')}, "
            f"smallest bulk ESS {_fmt(ess, '.3g')}): do not report these draws as the "
            "posterior. See the 'Is my chain converged?' page of the documentation."
        )
    if not p.get("dp_noise_private", 1):
        notes.append("the privacy noise was seeded: this result is NOT private.")
    if not p.get("dp_data_removed", 1):
        notes.append("the data-bearing groups were kept (keep_data=True): NOT private.")

    conv_rows = [
        ("verdict", f"{conv['verdict']} ({conv['source']})"),
        (
            "largest R-hat",
            f"{_fmt(conv.get('r_hat_max'), '.3g')} ({R_HAT_NOTE})",
        ),
        ("smallest bulk ESS", f"{_fmt(ess, '.3g')} ({ESS_NOTE})"),
    ]
    error = 1.0 / math.sqrt(ess) if math.isfinite(ess) and ess > 0 else math.nan
    utility = [
        (
            "Monte Carlo error",
            f"about {_fmt(error, '.2g')} posterior sds on a posterior mean (1/sqrt(ESS)), "
            "beside the posterior's own width",
        )
    ]
    if "dp_forecast_ess" in p:
        # The Taylor path forecasts after its one-shot release, before its chains spend.
        taylor = p.get("dp_method") == "taylor"
        utility.append(
            (
                "forecast before the chains" if taylor else "forecast before spending",
                f"ESS about {_fmt(p['dp_forecast_ess'], '.3g')} "
                f"({p.get('dp_forecast_verdict', 'n/a')})",
            )
        )
    sections = [
        ("Budget", _budget_rows(p)),
        ("Cost per phase", _phase_rows(idata, delta)),
        ("Convergence", conv_rows),
        ("Clipping", _clip_rows(idata, p)),
        ("Utility", utility),
    ]
    view = ReportView(sections=sections, warnings=notes)
    return view._repr_html_() if html else view
