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
0); an estimate is not a bound. The verdict (:attr:`AuditResult.exceeds_claim`) fails the
mechanism when the black-box bound exceeds the claim, *or* when an estimate exceeds the claimed
``mu`` beyond its own uncertainty: ``mu_estimate - z * mu_se > claimed_mu``, with ``z`` chosen so
that an honest mechanism fails with probability at most ``WHITE_BOX_FALSE_FAIL`` (1e-3) over all
fitted outputs. A step whose noise is 1.5 times too small fails it at 1e4 runs, where the bound
alone would not show it.

Audit synthetic or worst-case data sets, never the real data you mean to protect: every run is
a release outside any ledger.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pymc as pm
from pymc.blocking import DictToArrayBijection, RaveledVars

from pymc_penalty.audit.engine import (
    STEP_GAUSSIAN_FITS,
    AuditResult,
    OutputAudit,
    Release,
    _audit_columns,
    _check_common,
    _collect,
    _neighbour,
    add_record,
    audit_releases,
    substitute_record,
)
from pymc_penalty.audit.stats import epsilon_lower_bound, gaussian_mu_estimate, gaussian_mu_fit
from pymc_penalty.errors import NotPrivateWarning
from pymc_penalty.model.checks import check_min_rows

# The public names defined in the private modules are documented here, under this module.
for _public in (
    AuditResult,
    OutputAudit,
    add_record,
    audit_releases,
    substitute_record,
    epsilon_lower_bound,
    gaussian_mu_estimate,
    gaussian_mu_fit,
):
    _public.__module__ = __name__
del _public

__all__ = [
    "AuditResult",
    "OutputAudit",
    "add_record",
    "audit_step",
    "audit_releases",
    "audit_warm_start",
    "epsilon_lower_bound",
    "gaussian_mu_estimate",
    "gaussian_mu_fit",
    "substitute_record",
]


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
    from pymc_penalty.sampling.step import PenaltyMetropolis

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


def audit_warm_start(
    factory: Callable[[Any], pm.Model],
    dataset: Any,
    neighbour: Any = None,
    *,
    record: Any = None,
    index: int = 0,
    relation: str = "substitute",
    mu: float = 1.0,
    clip: float | str = 1.0,
    steps: int = 1,
    min_rows: int | None = None,
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
    the estimated covariance; with ``clip="auto"`` also the clip it found (and each step's,
    ``clip_history``) and the last released clipped fraction; under add/remove-one the
    released count of the rows. The claim is the warm start's own total ``mu``
    (``WarmStart.mu``).

    Parameters
    ----------
    factory : callable
        ``factory(dataset) -> pm.Model``.
    dataset, neighbour, record, index, relation :
        As in :func:`audit_step`.
    mu, clip, steps : float, float or "auto", int
        Passed to ``private_warm_start`` (``steps=1``: one gradient and one curvature release
        at the initial point). ``clip="auto"`` with ``steps >= 2`` audits the clip found from
        the released clipped counts (a count from the second step on).
    min_rows : int, optional
        Passed to ``private_warm_start``: under add/remove-one (``relation="add"``), where
        it is required, a public lower bound (``>= 2``) on the rows of both data sets (at
        most ``dataset``'s rows), the same for both, so that the audit compares the release
        on ``n`` and ``n + 1`` rows under one public setting. Ignored under substitute-one.
    runs : int, default 10000
    delta, confidence, label, seed :
        As in :func:`audit_step`.

    Returns
    -------
    AuditResult
    """
    from pymc_penalty.warmstart import prepare_warm_start, private_warm_start

    _check_common(runs, delta, confidence)
    if isinstance(clip, str) and clip != "auto":
        raise ValueError('`clip` must be a positive number or "auto".')
    min_rows = check_min_rows(min_rows)
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
        # Checked and compiled once per model: each run then costs only its releases.
        target = prepare_warm_start(model, neighbours=neighbours, min_rows=min_rows)

        def release() -> dict[str, Any]:
            ws = private_warm_start(
                model,
                mu=mu,
                ledger=_Unlimited(),
                clip=clip,
                steps=steps,
                neighbours=neighbours,
                target=target,
                min_rows=min_rows,
            )
            claimed.append(ws.mu)
            iu = np.triu_indices(ws.covariance.shape[0])
            out = {"point": ws.point, "covariance": ws.covariance[iu]}
            if clip == "auto":  # found from released counts: released too
                out["clip"] = ws.clip
                out["clip_history"] = np.asarray(ws.clip_history)
                if ws.clipped_fraction is not None:
                    out["clipped_fraction"] = ws.clipped_fraction
            if neighbours == "add_remove":  # the released count of the rows
                out["n_rows"] = ws.n_rows
            return out

        return release

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
