"""Empirical privacy auditing: lower bounds on epsilon from repeated releases.

A differential privacy claim says that no test can tell two neighbouring data sets apart
better than the claimed ``(epsilon, delta)`` allows. The auditor runs such tests. It fixes one
pair of points ``(theta, theta')``, builds the step once on each of two neighbouring data sets,
makes the step's release at that pair many times on each (fresh noise every time, from the
step's own noise source), and records everything the step lets out: the chain (whether it
moved to ``theta'``) and every sample statistic (``accept``, ``accepted``,
``dp_clipped_fraction``, per-owner statistics, ...). For each output it then runs a threshold
test:

1. the runs are split at random into a selection half and an evaluation half;
2. on the selection half, the threshold, the side and the roles of the two data sets that
   give the largest bound are chosen;
3. on the evaluation half, that one test's false positive rate ``alpha`` and false negative
   rate ``beta`` get one-sided Clopper-Pearson upper bounds, and
   ``epsilon >= log((1 - delta - beta_upper) / alpha_upper)`` holds for every
   ``(epsilon, delta)``-DP mechanism with the stated confidence.

The bound of each output, and their maximum, is an empirical **lower bound** on the
mechanism's epsilon: a bound above the claimed epsilon proves the claim false (with the
stated confidence); a bound below it proves nothing about the claim, it only fails to refute
it. The confidence is for the overall maximum: Bonferroni's correction splits ``1 - confidence``
over every informative output and both rates.

The claimed per-release epsilon is the step's own per-step ``mu`` (its ``dp_mu`` statistic)
converted with :func:`pymc_penalty.accounting.gdp_epsilon`. Next to the bound the auditor also
gives a white-box *estimate* of each Gaussian release's ``mu``, from Gaussian fits of the
release under both data sets (the ``accept`` statistic is the released log ratio, censored at
0); an estimate is not a bound.

Audit synthetic or worst-case data sets, never the real data you mean to protect: every run is
a release outside any ledger.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pymc as pm
from pymc.blocking import DictToArrayBijection, RaveledVars
from scipy import optimize, stats

from pymc_penalty.accounting import composed_epsilon
from pymc_penalty.step import NotPrivateWarning

__all__ = [
    "AuditResult",
    "OutputAudit",
    "add_record",
    "audit_step",
    "audit_releases",
    "audit_warm_start",
    "epsilon_lower_bound",
    "gaussian_mu_estimate",
    "substitute_record",
]

#: Most candidate thresholds tried per output on the selection half.
_MAX_THRESHOLDS = 2000

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
    """

    name: str
    epsilon_lb: float
    alpha_upper: float
    beta_upper: float
    mu_estimate: float
    epsilon_estimate: float


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
    def exceeds_claim(self) -> bool:
        """True when the lower bound refutes the claim (``epsilon_lb > claimed_epsilon``)."""
        return self.epsilon_lb > self.claimed_epsilon

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
        rows = [("output", "eps lower bound", "alpha_upper", "beta_upper", "mu estimate")]
        for o in self.outputs:
            rows.append(
                (
                    o.name,
                    _fmt(o.epsilon_lb),
                    f"{o.alpha_upper:.3g}",
                    f"{o.beta_upper:.3g}",
                    "-" if math.isnan(o.mu_estimate) else _fmt(o.mu_estimate),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [
            ("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))).rstrip()
            for r in rows
        ]
        verdict = "EXCEEDS the claim" if self.exceeds_claim else "below the claim"
        tail = f"\n  empirical lower bound {_fmt(self.epsilon_lb)}: {verdict}"
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


# --- statistics -----------------------------------------------------------------------------


def _cp_upper(k: np.ndarray, n: int, level: float) -> np.ndarray:
    """One-sided Clopper-Pearson upper bounds at ``level`` for ``k`` successes in ``n``."""
    k = np.asarray(k, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        up = stats.beta.ppf(level, k + 1.0, np.maximum(n - k, 1e-300))
    return np.where(k >= n, 1.0, up)


def _as_column(values: Any) -> np.ndarray:
    col = np.asarray(values, dtype=np.float64).ravel()
    # A NaN is an outcome like any other; +inf sorts it to one end.
    return np.where(np.isnan(col), np.inf, col)


def _test_bounds(
    a: np.ndarray,
    b: np.ndarray,
    thresholds: np.ndarray,
    delta: float,
    level: float,
) -> np.ndarray:
    """Bounds of every test: shape (len(thresholds), 8).

    Columns: rejection region ``{o >= t}``, ``{o < t}``, ``{o <= t}``, ``{o > t}``, each with
    ``a``'s data set as the null and then with ``b``'s.
    """
    sa, sb = np.sort(a), np.sort(b)
    na, nb = sa.size, sb.size
    lt_a = np.searchsorted(sa, thresholds, "left")
    lt_b = np.searchsorted(sb, thresholds, "left")
    le_a = np.searchsorted(sa, thresholds, "right")
    le_b = np.searchsorted(sb, thresholds, "right")
    regions = [  # (count in region under a, under b)
        (na - lt_a, nb - lt_b),  # o >= t
        (lt_a, lt_b),  # o < t
        (le_a, le_b),  # o <= t
        (na - le_a, nb - le_b),  # o > t
    ]
    cols = []
    for in_a, in_b in regions:
        # null a: alpha = P_a(R), beta = P_b(not R); null b: the other way round.
        for alpha_k, n_null, beta_k, n_alt in (
            (in_a, na, nb - in_b, nb),
            (in_b, nb, na - in_a, na),
        ):
            alpha_u = _cp_upper(alpha_k, n_null, level)
            beta_u = _cp_upper(beta_k, n_alt, level)
            cols.append((alpha_u, beta_u))
    alpha = np.stack([c[0] for c in cols], axis=1)
    beta = np.stack([c[1] for c in cols], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        eps = np.log(np.maximum(1.0 - delta - beta, 0.0) / alpha)
    return np.stack([np.nan_to_num(eps, nan=-np.inf), alpha, beta], axis=-1)


def epsilon_lower_bound(
    samples: Any,
    samples_prime: Any,
    *,
    delta: float = 1e-5,
    confidence: float = 0.95,
    seed: int | np.random.Generator | None = 0,
) -> tuple[float, float, float]:
    """Empirical lower bound on epsilon from one output's samples under two data sets.

    The runs of each data set are split at random in halves. On the first halves the best
    threshold test is chosen (threshold, side, and which data set is the null hypothesis);
    on the second halves its false positive and false negative rates get one-sided
    Clopper-Pearson upper bounds ``alpha_u``, ``beta_u``, each at level
    ``1 - (1 - confidence) / 2``, and ``epsilon >= log((1 - delta - beta_u) / alpha_u)``.

    Parameters
    ----------
    samples, samples_prime : array_like
        The output in independent runs on each data set (booleans count as 0 and 1; NaN is a
        value of its own).
    delta : float, default 1e-5
    confidence : float, default 0.95
        Confidence of the bound.
    seed : int or Generator, optional
        Randomness of the split only (it never touches the mechanism).

    Returns
    -------
    tuple of float
        ``(epsilon_lb, alpha_u, beta_u)``; ``epsilon_lb`` is 0 when the test shows nothing.
    """
    return _threshold_audit(
        _as_column(samples),
        _as_column(samples_prime),
        delta=float(delta),
        level=1.0 - (1.0 - float(confidence)) / 2.0,
        rng=np.random.default_rng(seed),
    )


def _threshold_audit(
    a: np.ndarray, b: np.ndarray, *, delta: float, level: float, rng: np.random.Generator
) -> tuple[float, float, float]:
    if a.size < 4 or b.size < 4:
        raise ValueError("Need at least 4 runs per data set.")
    a = a[rng.permutation(a.size)]
    b = b[rng.permutation(b.size)]
    a_sel, a_eval = a[: a.size // 2], a[a.size // 2 :]
    b_sel, b_eval = b[: b.size // 2], b[b.size // 2 :]
    values = np.unique(np.concatenate([a_sel, b_sel]))
    if values.size > _MAX_THRESHOLDS:
        pos = np.linspace(0, values.size - 1, _MAX_THRESHOLDS).round().astype(np.int64)
        values = values[np.unique(pos)]
    sel = _test_bounds(a_sel, b_sel, values, delta, level)[..., 0]
    i, j = np.unravel_index(int(np.argmax(sel)), sel.shape)
    ev = _test_bounds(a_eval, b_eval, values[i : i + 1], delta, level)[0, j]
    return max(0.0, float(ev[0])), float(ev[1]), float(ev[2])


def gaussian_mu_estimate(
    samples: Any, samples_prime: Any, *, censor_above: float | None = None
) -> float:
    """White-box estimate of a Gaussian release's ``mu`` from its samples under two data sets.

    Fits ``N(m, s^2)`` and ``N(m', s^2)`` (one common sd, as a Gaussian mechanism has) by
    maximum likelihood and returns ``|m - m'| / s``. With ``censor_above``, values at or
    above it are treated as right-censored there (a Tobit fit). This is an *estimate* of the
    mechanism's ``mu``, not a bound.

    Parameters
    ----------
    samples, samples_prime : array_like
        The release in independent runs on each data set; non-finite values are dropped.
    censor_above : float, optional
        Censoring point (for ``log(accept)``, which is ``min(0, log ratio)``: 0).

    Returns
    -------
    float
        The estimate (NaN when it cannot be fitted).
    """
    a = np.asarray(samples, dtype=np.float64).ravel()
    b = np.asarray(samples_prime, dtype=np.float64).ravel()
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if a.size < 3 or b.size < 3:
        return math.nan
    if censor_above is None:
        s2 = (np.sum((a - a.mean()) ** 2) + np.sum((b - b.mean()) ** 2)) / (a.size + b.size - 2)
        if s2 <= 0.0:
            return math.inf if a.mean() != b.mean() else math.nan
        return float(abs(a.mean() - b.mean()) / math.sqrt(s2))
    c = float(censor_above)
    obs_a, obs_b = a[a < c], b[b < c]
    cens_a, cens_b = int(np.sum(a >= c)), int(np.sum(b >= c))
    if obs_a.size < 2 or obs_b.size < 2:
        return math.nan

    def nll(p: np.ndarray) -> float:
        m_a, m_b, log_s = p
        s = math.exp(log_s)
        out = 0.0
        for obs, cens, m in ((obs_a, cens_a, m_a), (obs_b, cens_b, m_b)):
            out -= float(np.sum(stats.norm.logpdf(obs, m, s)))
            if cens:
                out -= cens * float(stats.norm.logsf(c, m, s))
        return out

    pooled = np.concatenate([obs_a - obs_a.mean(), obs_b - obs_b.mean()])
    start = np.array([obs_a.mean(), obs_b.mean(), math.log(max(float(pooled.std()), 1e-12))])
    fit = optimize.minimize(
        nll, start, method="Nelder-Mead", options={"xatol": 1e-6, "fatol": 1e-6}
    )
    m_a, m_b, log_s = fit.x
    return float(abs(m_a - m_b) / math.exp(log_s))


def _gaussian_estimate(kind: str, a: np.ndarray, b: np.ndarray) -> float:
    if kind == "identity":
        return gaussian_mu_estimate(a, b)
    if kind == "log-censored":
        with np.errstate(divide="ignore"):
            return gaussian_mu_estimate(np.log(a), np.log(b), censor_above=0.0)
    raise ValueError(f"Unknown Gaussian fit {kind!r}; use 'identity' or 'log-censored'.")


def _epsilon(delta: float, mu: float) -> float:
    """The accountant's conversion of one release's ``mu``; NaN stays NaN (no fit)."""
    return math.nan if math.isnan(mu) else composed_epsilon(mu * mu, delta)


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
    outputs = []
    for prefix, members, cols_a, cols_b in prepared:
        a, b = _as_column(cols_a[members[0]]), _as_column(cols_b[members[0]])
        eps_lb, alpha_u, beta_u = _threshold_audit(a, b, delta=delta, level=level, rng=rng)
        kind = next((gaussian[m] for m in members if m in gaussian), None)
        mu_hat = math.nan
        if kind is not None:
            mu_hat = _gaussian_estimate(kind, cols_a[members[0]], cols_b[members[0]])
        outputs.append(
            OutputAudit(
                prefix + " = ".join(members),
                eps_lb,
                alpha_u,
                beta_u,
                mu_hat,
                _epsilon(delta, mu_hat),
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


# --- steps ----------------------------------------------------------------------------------


class _FixedProposal:
    """Stands in for a step's proposal adapter: always proposes the same point, adapts nothing."""

    def __init__(self, x1: np.ndarray, scaling: float, chol: np.ndarray) -> None:
        self._x1 = x1
        self.scaling = scaling
        self.chol = chol  # the metric of clip_mode="metric" bounds

    def propose(self, rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
        return self._x1.copy()

    def after_decision(self, accepted: bool) -> None:
        pass

    def update(self, x: np.ndarray, accept_prob: float, moved: bool) -> None:
        pass


@contextmanager
def _forced(step: Any, x1: np.ndarray) -> Iterator[None]:
    """Make every ``step.astep`` propose ``x1``, outside the step's ledger, without tuning."""
    saved = {name: getattr(step, name) for name in ("adapter", "tune", "ledger")}
    step.adapter = _FixedProposal(x1, float(saved["adapter"].scaling), saved["adapter"].chol)
    step.tune = False
    step.ledger = None
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(step, name, value)


def _build(factory: Callable[[Any], Any], dataset: Any, step: Callable[[], Any] | None) -> tuple:
    with warnings.catch_warnings():
        # The audit's steps release outside any budget on purpose, and publish nothing.
        warnings.simplefilter("ignore", NotPrivateWarning)
        made = factory(dataset)
        if isinstance(made, pm.Model):
            with made:
                built = step() if step is not None else _default_step()
            return made, built
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], pm.Model):
        if step is not None:
            raise ValueError("`step` is for factories that return a model; yours built a step.")
        return made
    raise TypeError("`factory(dataset)` must return a pm.Model or a (pm.Model, step) tuple.")


def _default_step() -> Any:
    from pymc_penalty.step import PenaltyMetropolis

    return PenaltyMetropolis(mu=1.0)


def _raveled(step: Any, model: pm.Model, point: Any) -> RaveledVars:
    base = model.initial_point()
    names = [v.name for v in step.vars]
    if isinstance(point, Mapping):
        missing = [n for n in names if n not in point]
        if missing:
            raise ValueError(
                f"A point lacks {missing}: give values of the step's value variables "
                "(transformed names, e.g. 'sigma_log__') or one raveled array."
            )
        return DictToArrayBijection.map(
            {n: np.asarray(point[n], dtype=base[n].dtype).reshape(np.shape(base[n])) for n in names}
        )
    ref = DictToArrayBijection.map({n: base[n] for n in names})
    arr = np.asarray(point, dtype=ref.data.dtype).ravel()
    if arr.shape != ref.data.shape:
        raise ValueError(f"A raveled point must have length {ref.data.size}.")
    return RaveledVars(arr, ref.point_map_info)


def _default_pair(step: Any, model: pm.Model) -> tuple[np.ndarray, np.ndarray]:
    x0 = _raveled(step, model, model.initial_point()).data
    return x0, x0 + 0.1


def _step_release(step: Any, q0: RaveledVars, x1: np.ndarray) -> Release:
    def release() -> dict[str, Any]:
        q_new, stats = step.astep(q0)
        out: dict[str, Any] = {}
        for st in stats:
            out.update(st)
        out["chain"] = bool(np.array_equal(q_new.data, x1))
        return out

    return release


def audit_step(
    factory: Callable[[Any], Any],
    dataset: Any,
    neighbour: Any = None,
    *,
    record: Any = None,
    index: int = 0,
    relation: str = "substitute",
    step: Callable[[], Any] | None = None,
    point: Any = None,
    proposal: Any = None,
    pairs: Sequence[tuple[Any, Any]] | None = None,
    runs: int = 20_000,
    delta: float = 1e-5,
    confidence: float = 0.95,
    claim_stat: str = "dp_mu",
    label: str | None = None,
    seed: int | None = 0,
) -> AuditResult:
    """Audit a penalty step empirically at fixed proposals on two neighbouring data sets.

    The step is built once per data set. At each pair ``(theta, theta')`` its ``astep`` is
    called ``runs`` times from ``theta`` with the proposal forced to ``theta'`` (the step's
    proposal adapter is replaced for the audit and restored afterwards; tuning is off and the
    step's ledger is bypassed). Every output that leaves the step is audited: whether the
    chain moved, and every sample statistic.

    Parameters
    ----------
    factory : callable
        ``factory(dataset)`` returns a ``pm.Model`` (the step is then made by ``step`` inside
        the model's context) or a ``(model, step)`` tuple (any penalty step: base,
        ``MultiOwnerPenaltyMetropolis``, ``ExpFamPenaltyMetropolis``, ...).
    dataset : Any
        The first data set, in whatever form ``factory`` takes.
    neighbour : Any, optional
        The neighbouring data set. Give it or ``record``.
    record : Any, optional
        A record that makes the neighbour from ``dataset`` (for arrays or mappings of
        arrays): it replaces row ``index`` (``relation="substitute"``) or is appended
        (``relation="add"``). For a worst-case audit, put the opposite extreme at row
        ``index`` of ``dataset`` (:func:`substitute_record`).
    index : int, default 0
    relation : {"substitute", "add"}, default "substitute"
    step : callable, optional
        ``step() -> step method``, called in the model's context, when ``factory`` returns a
        model. Default: ``PenaltyMetropolis(mu=1.0)``.
    point, proposal : dict or array_like, optional
        One pair ``(theta, theta')`` on the step's (unconstrained) space: a mapping of value
        variable names (``"sigma_log__"``) or one raveled array. Defaults: the model's initial
        point and that point plus 0.1 in every coordinate. Choose a pair at which the
        worst-case record's clipped ratio changes the most between the data sets and at which
        the acceptance probability is below 1.
    pairs : sequence of (point, proposal), optional
        Several pairs instead of ``point`` and ``proposal``.
    runs : int, default 20000
        Releases per data set and pair.
    delta : float, default 1e-5
    confidence : float, default 0.95
        Confidence of the overall lower bound.
    claim_stat : str, default "dp_mu"
        The statistic holding the step's claimed per-release ``mu`` (for instance
        ``"dp_mu_outsider"`` to hold ``MultiOwnerPenaltyMetropolis`` to the outsider's claim).
    label : str, optional
        Name in the result; defaults to the step's class name.
    seed : int, optional
        Seed of the split into selection and evaluation halves (the privacy noise is the
        step's own).

    Returns
    -------
    AuditResult

    Notes
    -----
    Every run is a release that no ledger records: audit synthetic or worst-case data sets,
    never the data you mean to protect.
    """
    _check_common(runs, delta, confidence)
    if pairs is not None and (point is not None or proposal is not None):
        raise ValueError("Give either `pairs` or `point` and `proposal`.")
    other = _neighbour(dataset, neighbour, record, index, relation)
    built = [_build(factory, d, step) for d in (dataset, other)]
    per_pair: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]] = []
    claimed = 0.0
    pair_list = list(pairs) if pairs is not None else [(point, proposal)]
    for theta, theta_prime in pair_list:
        cols = []
        for model, stp in built:
            if theta is None and theta_prime is None:
                x0, x1 = _default_pair(stp, model)
                q0 = _raveled(stp, model, x0)
            else:
                if theta is None or theta_prime is None:
                    raise ValueError("Give both `point` and `proposal` (or neither).")
                q0 = _raveled(stp, model, theta)
                x1 = _raveled(stp, model, theta_prime).data
            if np.array_equal(q0.data, x1):
                raise ValueError("A pair's proposal equals its point: nothing is released.")
            with _forced(stp, x1):
                col = _collect(_step_release(stp, q0, x1), int(runs))
            if claim_stat not in col:
                raise ValueError(f"The step has no statistic {claim_stat!r}.")
            claimed = max(claimed, float(np.nanmax(col[claim_stat])))
            cols.append(col)
        per_pair.append((cols[0], cols[1]))
    return _audit_columns(
        per_pair,
        claimed_mu=claimed,
        delta=float(delta),
        confidence=float(confidence),
        runs=int(runs),
        label=label if label is not None else type(built[0][1]).__name__,
        gaussian=STEP_GAUSSIAN_FITS,
        seed=seed,
    )


# --- the warm start -------------------------------------------------------------------------


class _Unlimited:
    """A ledger that grants every release (the audit's runs are outside any budget)."""

    def try_spend(self, mu2: float) -> bool:
        return True


@contextmanager
def _warm_start_compiled_once(models: Sequence[pm.Model]) -> Iterator[None]:
    """Make repeated ``private_warm_start`` calls on ``models`` compile and check only once.

    ``private_warm_start`` compiles its likelihood and prior and checks the model on every
    call; with the same model and start those are the same every time. They are memoised
    here for the duration of the audit (the module's names are restored afterwards), so each
    run costs only its releases.
    """
    from pymc_penalty import warmstart

    names = ("validate_model", "PenaltyLikelihood", "_Prior")
    saved = {name: getattr(warmstart, name) for name in names}
    cache: dict[tuple[str, int], Any] = {}

    def memo(name: str) -> Callable[..., Any]:
        original = saved[name]

        def wrapper(model: pm.Model, *args: Any, **kwargs: Any) -> Any:
            key = (name, id(model))
            if key not in cache:
                cache[key] = original(model, *args, **kwargs)
            return cache[key]

        return wrapper

    unique = list({id(m): m for m in models}.values())
    for model in unique:
        point = model.initial_point()
        model.initial_point = lambda *a, _p=point, **k: {n: v.copy() for n, v in _p.items()}
    for name in names:
        setattr(warmstart, name, memo(name))
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(warmstart, name, value)
        for model in unique:
            del model.initial_point  # the class's method again


def audit_warm_start(
    factory: Callable[[Any], pm.Model],
    dataset: Any,
    neighbour: Any = None,
    *,
    record: Any = None,
    index: int = 0,
    relation: str = "substitute",
    mu: float = 1.0,
    clip: float = 1.0,
    steps: int = 1,
    runs: int = 10_000,
    delta: float = 1e-5,
    confidence: float = 0.95,
    label: str = "private_warm_start",
    seed: int | None = 0,
) -> AuditResult:
    """Audit :func:`pymc_penalty.warmstart.private_warm_start`'s outcome on two data sets.

    The warm start starts from the model's (data-independent) initial point, so its inputs are
    fixed; each run calls it with fresh noise and an unlimited ledger and audits everything it
    returns: every coordinate of the estimated mode and every entry of the upper triangle of
    the estimated covariance. The claim is the warm start's own total ``mu``
    (``WarmStart.mu``).

    Parameters
    ----------
    factory : callable
        ``factory(dataset) -> pm.Model``.
    dataset, neighbour, record, index, relation :
        As in :func:`audit_step`.
    mu, clip, steps : float, float, int
        Passed to ``private_warm_start`` (``steps=1``: one gradient and one curvature release
        at the initial point).
    runs : int, default 10000
    delta, confidence, label, seed :
        As in :func:`audit_step`.

    Returns
    -------
    AuditResult
    """
    from pymc_penalty.warmstart import private_warm_start

    _check_common(runs, delta, confidence)
    other = _neighbour(dataset, neighbour, record, index, relation)
    neighbours = "substitute" if relation == "substitute" else "add_remove"
    models = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotPrivateWarning)
        for d in (dataset, other):
            made = factory(d)
            if not isinstance(made, pm.Model):
                raise TypeError("`factory(dataset)` must return a pm.Model.")
            models.append(made)
    claimed = []

    def release_on(model: pm.Model) -> Release:
        def release() -> dict[str, Any]:
            ws = private_warm_start(
                model, mu=mu, ledger=_Unlimited(), clip=clip, steps=steps, neighbours=neighbours
            )
            claimed.append(ws.mu)
            iu = np.triu_indices(ws.covariance.shape[0])
            return {"point": ws.point, "covariance": ws.covariance[iu]}

        return release

    with _warm_start_compiled_once(models):
        per_pair = [
            (_collect(release_on(models[0]), int(runs)), _collect(release_on(models[1]), int(runs)))
        ]
    return _audit_columns(
        per_pair,
        claimed_mu=max(claimed),
        delta=float(delta),
        confidence=float(confidence),
        runs=int(runs),
        label=label,
        gaussian={},
        seed=seed,
    )
