"""The privacy auditor's engine: results, neighbouring data sets, and the audit of any
release function. :mod:`pymc_penalty.audit` builds the step and warm-start audits on it."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from pymc_penalty.audit.stats import (
    WHITE_BOX_FALSE_FAIL,
    _as_column,
    _epsilon,
    _gaussian_estimate,
    _threshold_audit,
    white_box_z,
)

#: Gaussian fits the step outputs get: ``accept`` is ``exp(min(0, log ratio))`` with a
#: Gaussian log ratio, so ``log(accept)`` is a Gaussian censored at 0; the clip count is a
#: Gaussian release (and its fraction, that release divided by n).
STEP_GAUSSIAN_FITS = {
    "accept": "log-censored",
    "dp_clipped_fraction": "identity",
    "dp_clipped_count": "identity",
}

Release = Callable[[], Mapping[str, Any]]


# --- results --------------------------------------------------------------------------------


class OutputAudit(NamedTuple):
    """The audit of one released output.

    Attributes
    ----------
    name : str
        The output (outputs identical in every run are merged: ``"accepted = chain"``).
    epsilon_lb : float
        Lower bound on epsilon from this output's threshold test (0 when the test shows
        nothing).
    alpha_upper, beta_upper : float
        Upper confidence bounds of the chosen test's false positive and false negative rates
        on the evaluation half.
    mu_estimate : float
        White-box Gaussian-fit estimate of the release's ``mu`` (NaN when not fitted). An
        estimate, not a bound.
    epsilon_estimate : float
        ``gdp_epsilon(mu=mu_estimate, delta=delta)`` (NaN when not fitted).
    mu_se : float
        Standard error of ``mu_estimate``, from the fit's own information (NaN when not
        fitted).
    mu_lower : float
        ``mu_estimate - z * mu_se``, a lower confidence bound on the release's ``mu``; ``z``
        makes the chance that any fitted output of an honest mechanism lands above its
        ``mu`` at most ``WHITE_BOX_FALSE_FAIL`` (1e-3) in all (NaN when not fitted).
    """

    name: str
    epsilon_lb: float
    alpha_upper: float
    beta_upper: float
    mu_estimate: float
    epsilon_estimate: float
    mu_se: float = math.nan
    mu_lower: float = math.nan


@dataclass(frozen=True)
class AuditResult:
    """What an audit found; ``str(result)`` is a readable table.

    Attributes
    ----------
    label : str
        What was audited.
    delta : float
        The ``delta`` at which epsilon is bounded and claimed.
    claimed_mu : float
        The largest per-release Gaussian-DP ``mu`` the mechanism claims at the audited pairs.
    claimed_epsilon : float
        ``gdp_epsilon(mu=claimed_mu, delta=delta)``: the claimed per-release epsilon.
    epsilon_lb : float
        The empirical lower bound: the largest over all outputs and pairs.
    outputs : tuple of OutputAudit
        One entry per informative output (and pair).
    uninformative : tuple of str
        Outputs that took one and the same value in every run on both data sets.
    runs : int
        Runs per data set and pair.
    pairs : int
        Number of audited ``(theta, theta')`` pairs.
    confidence : float
        Confidence of ``epsilon_lb`` (of the maximum, after Bonferroni's correction).
    """

    label: str
    delta: float
    claimed_mu: float
    claimed_epsilon: float
    epsilon_lb: float
    outputs: tuple[OutputAudit, ...]
    uninformative: tuple[str, ...]
    runs: int
    pairs: int
    confidence: float

    @property
    def bound_exceeds_claim(self) -> bool:
        """True when the black-box lower bound refutes the claim
        (``epsilon_lb > claimed_epsilon``)."""
        return self.epsilon_lb > self.claimed_epsilon

    @property
    def estimate_exceeds_claim(self) -> bool:
        """True when a white-box estimate exceeds the claim beyond its own uncertainty
        (``mu_lower > claimed_mu``): an honest mechanism does so with probability at most
        ``WHITE_BOX_FALSE_FAIL`` (1e-3)."""
        return self.mu_lower > self.claimed_mu

    @property
    def exceeds_claim(self) -> bool:
        """The verdict: True (the audit fails) when the black-box lower bound refutes the
        claim or a white-box estimate exceeds it beyond its own uncertainty."""
        return self.bound_exceeds_claim or self.estimate_exceeds_claim

    @property
    def mu_lower(self) -> float:
        """The largest white-box lower confidence bound on a release's ``mu`` (NaN if none)."""
        values = [o.mu_lower for o in self.outputs if not math.isnan(o.mu_lower)]
        return max(values) if values else math.nan

    @property
    def mu_estimate(self) -> float:
        """The largest per-output white-box estimate of ``mu`` (NaN if none); not a bound."""
        values = [o.mu_estimate for o in self.outputs if math.isfinite(o.mu_estimate)]
        return max(values) if values else math.nan

    def table(self) -> str:
        """The audit as a plain-text table (no data values: rates and bounds only)."""
        head = (
            f"Privacy audit: {self.label}\n"
            f"  delta = {self.delta:.3g}; {self.runs} runs per data set at each of "
            f"{self.pairs} pair(s); bound at {self.confidence:.0%} confidence\n"
            f"  claimed per-release epsilon {_fmt(self.claimed_epsilon)} "
            f"(mu = {_fmt(self.claimed_mu)})\n"
        )
        rows = [
            ("output", "eps lower bound", "alpha_upper", "beta_upper", "mu estimate", "mu lower")
        ]
        for o in self.outputs:
            rows.append(
                (
                    o.name,
                    _fmt(o.epsilon_lb),
                    f"{o.alpha_upper:.3g}",
                    f"{o.beta_upper:.3g}",
                    "-" if math.isnan(o.mu_estimate) else _fmt(o.mu_estimate),
                    "-" if math.isnan(o.mu_lower) else _fmt(o.mu_lower),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [
            ("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))).rstrip()
            for r in rows
        ]
        verdict = "EXCEEDS the claim" if self.bound_exceeds_claim else "below the claim"
        tail = f"\n  empirical lower bound {_fmt(self.epsilon_lb)}: {verdict}"
        if not math.isnan(self.mu_lower):
            verdict = "EXCEEDS the claim" if self.estimate_exceeds_claim else "below the claim"
            tail += (
                f"\n  white-box mu lower bound {_fmt(self.mu_lower)} (false fail <= "
                f"{WHITE_BOX_FALSE_FAIL:g}): {verdict}"
            )
        if self.uninformative:
            tail += f"\n  constant and equal on both data sets: {', '.join(self.uninformative)}"
        return head + "\n".join(lines) + tail

    def __str__(self) -> str:
        return self.table()


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.3g}"


# --- neighbouring data sets -----------------------------------------------------------------


def substitute_record(dataset: Any, index: int, record: Any) -> Any:
    """A copy of ``dataset`` with row ``index`` replaced by ``record``.

    Parameters
    ----------
    dataset : ndarray or mapping of ndarray
        Records along the leading axis (for a mapping, of every value: ``{"x": X, "y": y}``).
    index : int
        Row to replace.
    record : array_like or mapping
        The new row (for a mapping dataset, a mapping with the same keys).

    Returns
    -------
    ndarray or dict
    """
    if isinstance(dataset, Mapping):
        _check_keys(dataset, record)
        return {k: substitute_record(v, index, record[k]) for k, v in dataset.items()}
    out = np.array(dataset, copy=True)
    out[index] = record
    return out


def add_record(dataset: Any, record: Any) -> Any:
    """A copy of ``dataset`` with ``record`` appended as a new last row.

    Parameters
    ----------
    dataset : ndarray or mapping of ndarray
        Records along the leading axis.
    record : array_like or mapping
        The new row.

    Returns
    -------
    ndarray or dict
    """
    if isinstance(dataset, Mapping):
        _check_keys(dataset, record)
        return {k: add_record(v, record[k]) for k, v in dataset.items()}
    arr = np.asarray(dataset)
    row = np.asarray(record, dtype=arr.dtype).reshape((1, *arr.shape[1:]))
    return np.concatenate([arr, row], axis=0)


def _check_keys(dataset: Mapping, record: Any) -> None:
    if not isinstance(record, Mapping) or set(record) != set(dataset):
        raise ValueError("`record` must be a mapping with the same keys as `dataset`.")


def _neighbour(dataset: Any, neighbour: Any, record: Any, index: int, relation: str) -> Any:
    if (neighbour is None) == (record is None):
        raise ValueError("Give exactly one of `neighbour` (a data set) and `record`.")
    if neighbour is not None:
        return neighbour
    if relation == "substitute":
        return substitute_record(dataset, index, record)
    if relation == "add":
        return add_record(dataset, record)
    raise ValueError(f"`relation` must be 'substitute' or 'add'; got {relation!r}.")


# --- the engine -----------------------------------------------------------------------------


def _collect(release: Release, runs: int) -> dict[str, np.ndarray]:
    """Call ``release`` ``runs`` times; one float column per scalar (flattened) output."""
    rows = [release() for _ in range(runs)]
    columns: dict[str, np.ndarray] = {}
    for name, first in rows[0].items():
        if np.ndim(first) == 0:
            try:
                columns[name] = np.fromiter((r[name] for r in rows), np.float64, count=runs)
                continue
            except (TypeError, ValueError):
                pass  # not numeric, or not a scalar in every run: see below
        try:
            vals = [np.asarray(r[name], dtype=np.float64).ravel() for r in rows]
        except (TypeError, ValueError):
            continue  # not numeric: nothing to threshold
        if len({v.size for v in vals}) != 1:
            # The length itself could tell the data sets apart; refuse rather than skip it.
            raise ValueError(f"Output {name!r} changes its length between runs.")
        arr = np.stack(vals)
        if arr.shape[1] == 1:
            columns[name] = arr[:, 0]
        else:
            for k in range(arr.shape[1]):
                columns[f"{name}[{k}]"] = arr[:, k]
    return columns


def _merge_identical(
    cols_a: dict[str, np.ndarray], cols_b: dict[str, np.ndarray]
) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """Group outputs identical in every run on both data sets; set aside the constant ones."""
    groups: list[tuple[str, list[str]]] = []
    constant: list[str] = []
    for name in cols_a:
        a, b = _as_column(cols_a[name]), _as_column(cols_b[name])
        if np.all(a == a[0]) and np.all(b == a[0]):
            constant.append(name)
            continue
        for _, members in groups:
            ref = members[0]
            if np.array_equal(_as_column(cols_a[ref]), a) and np.array_equal(
                _as_column(cols_b[ref]), b
            ):
                members.append(name)
                break
        else:
            groups.append((name, [name]))
    return groups, constant


def _audit_columns(
    per_pair: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]],
    *,
    claimed_mu: float,
    delta: float,
    confidence: float,
    runs: int,
    label: str,
    gaussian: Mapping[str, str],
    seed: int | None,
) -> AuditResult:
    prepared = []
    uninformative: list[str] = []
    for p, (cols_a, cols_b) in enumerate(per_pair):
        if set(cols_a) != set(cols_b):
            raise ValueError("The two data sets' releases have different outputs.")
        groups, constant = _merge_identical(cols_a, cols_b)
        prefix = f"pair {p}: " if len(per_pair) > 1 else ""
        uninformative += [prefix + c for c in constant]
        prepared += [(prefix, members, cols_a, cols_b) for _, members in groups]
    # Bonferroni: two rates per informative output share 1 - confidence.
    level = 1.0 - (1.0 - confidence) / (2.0 * max(len(prepared), 1))
    rng = np.random.default_rng(seed)
    kinds = [
        next((gaussian[m] for m in members if m in gaussian), None) for _, members, *_ in prepared
    ]
    # The white-box verdict's z: WHITE_BOX_FALSE_FAIL shared over every fitted output.
    z = white_box_z(sum(k is not None for k in kinds))
    outputs = []
    for (prefix, members, cols_a, cols_b), kind in zip(prepared, kinds, strict=True):
        a, b = _as_column(cols_a[members[0]]), _as_column(cols_b[members[0]])
        eps_lb, alpha_u, beta_u = _threshold_audit(a, b, delta=delta, level=level, rng=rng)
        mu_hat, mu_se = math.nan, math.nan
        if kind is not None:
            mu_hat, mu_se = _gaussian_estimate(kind, cols_a[members[0]], cols_b[members[0]])
        outputs.append(
            OutputAudit(
                prefix + " = ".join(members),
                eps_lb,
                alpha_u,
                beta_u,
                mu_hat,
                _epsilon(delta, mu_hat),
                mu_se,
                mu_hat - z * mu_se,
            )
        )
    outputs.sort(key=lambda o: -o.epsilon_lb)
    return AuditResult(
        label=label,
        delta=float(delta),
        claimed_mu=float(claimed_mu),
        claimed_epsilon=_epsilon(delta, float(claimed_mu)),
        epsilon_lb=max((o.epsilon_lb for o in outputs), default=0.0),
        outputs=tuple(outputs),
        uninformative=tuple(uninformative),
        runs=int(runs),
        pairs=len(per_pair),
        confidence=float(confidence),
    )


def _check_common(runs: int, delta: float, confidence: float) -> None:
    if int(runs) < 100:
        raise ValueError("`runs` must be at least 100 (a lower bound needs many runs).")
    if not 0.0 < float(delta) < 1.0:
        raise ValueError("`delta` must be in (0, 1).")
    if not 0.0 < float(confidence) < 1.0:
        raise ValueError("`confidence` must be in (0, 1).")


def audit_releases(
    release: Release | Sequence[Release],
    release_prime: Release | Sequence[Release],
    *,
    claimed_mu: float,
    runs: int = 20_000,
    delta: float = 1e-5,
    confidence: float = 0.95,
    gaussian: Mapping[str, str] | None = None,
    label: str = "mechanism",
    seed: int | None = 0,
) -> AuditResult:
    """Audit any mechanism given as two release callables, one per neighbouring data set.

    Parameters
    ----------
    release, release_prime : callable or sequence of callables
        ``release() -> mapping`` of output name to a number, boolean or array (arrays are
        audited per element), making one release with fresh noise on the first and on the
        second data set. A sequence gives one callable per audited pair (same length for
        both).
    claimed_mu : float
        The per-release Gaussian-DP ``mu`` the mechanism claims.
    runs : int, default 20000
        Runs per data set (and pair).
    delta : float, default 1e-5
    confidence : float, default 0.95
        Confidence of the overall bound (the maximum over outputs and pairs).
    gaussian : mapping, optional
        Outputs to fit with a Gaussian for the white-box estimate of ``mu``: name to
        ``"identity"`` or ``"log-censored"`` (a value ``exp(min(0, g))`` of a Gaussian ``g``,
        such as the ``accept`` statistic).
    label : str
        Name of the mechanism in the result.
    seed : int, optional
        Seed of the random split into selection and evaluation halves only.

    Returns
    -------
    AuditResult
    """
    _check_common(runs, delta, confidence)
    rel_a = [release] if callable(release) else list(release)
    rel_b = [release_prime] if callable(release_prime) else list(release_prime)
    if len(rel_a) != len(rel_b) or not rel_a:
        raise ValueError("Give one release callable per pair for each data set.")
    per_pair = [
        (_collect(ra, int(runs)), _collect(rb, int(runs)))
        for ra, rb in zip(rel_a, rel_b, strict=True)
    ]
    return _audit_columns(
        per_pair,
        claimed_mu=float(claimed_mu),
        delta=float(delta),
        confidence=float(confidence),
        runs=int(runs),
        label=label,
        gaussian=dict(gaussian or {}),
        seed=seed,
    )
