"""A private warm start: a noisy estimate of the posterior mode and curvature.

From a data-independent point (the model's initial point), a few steps of Fisher scoring move
toward the posterior mode. Every per-datapoint bound is stated in a public metric, the
per-datapoint Fisher information estimated from earlier releases, so one clip fits every
direction of an anisotropic posterior and none needs the data's scale
(:func:`fisher_scoring`; the statistics and their sensitivities are in
:mod:`pymc_penalty.warmstart.releases`). Per step:

- a curvature release: the outer-product sum of differences of rows (centred, so it estimates
  the Fisher information wherever the iterate is), normalised in the first step (no metric
  yet; a second release, of the mean log length in that shape, gives the scale) and clipped
  in the previous step's metric afterwards, pooled with the curvature releases before it
  (each weighted by its noise in the current metric; one that disagrees beyond the noise
  starts the pool anew);
- the sum of the per-datapoint gradients clipped in the new metric;
- with ``clip="auto"``, from the second step, a noisy count of the rows that gradient clip
  clipped, from which the next step's clip moves toward clipping 0.2% of the rows
  (:func:`fisher_scoring`). The fixed ``chi^2`` clip it starts from assumes Gaussian scores;
  a logistic regression's are heavier-tailed, and that clip cut 4% of them into a bias.

Measured (``benchmarks/warm_start_error.py``, the warm start alone, error of its point in
posterior sd, five noise seeds; logistic regression of ``benchmarks/utility.py``, n = 1e5,
d = 5, epsilon = 1, a 20% warm start; the gauss workload, d = 10, n = 1e5, epsilon = 2):
the fixed ``chi^2`` clip (before) against the found one (after), RMS over coordinates
(largest coordinate): logistic 4.19-4.89 (7.66-9.04, same sign every seed) before, 0.32-0.81
(0.58-1.39) after, the clip found at 7.3-7.8 against 4.53; gauss 0.10-0.24 (0.17-0.43)
before, 0.15-0.39 (0.25-0.64) after, the clip staying at its start. Over 80 seeds (NumPy
gradients, same workloads): gauss 0.223 before, 0.242 after (the count's share of the
gradient's ``mu^2``); logistic 4.58 before (40 seeds), 0.56 after, largest coordinate at
most 1.7.

From a start far from the mode (in per-datapoint sds) every row's gradient is clipped in one
direction, so each step moves at most about the clip: a Normal mean started at 50 for data
centred on 3 (n = 2e4, 6600 posterior sds) ended 3070-3810 sds short after 8 steps (8 seeds,
epsilon 1 and 2, a 20% warm start). After three such steps the gradient clip grows 16 times per
far step (:func:`fisher_scoring`; from released values only, no extra release): 0.02-2.6 sds
(RMS 1.07) at epsilon 1, 0.02-0.57 (RMS 0.28) at 2. Starts that are not far run exactly as
before.

A scale started far from its mode is harder: there the rows' spread underestimates its
curvature many times (heights, ``y ~ N(170, 10)``, n = 1e4, ``sigma ~ HalfNormal(50)`` started
at 50 with the mean at 0: the log-scale scores are nearly all equal, and with no noise a step
in ``log sigma`` reached -30). A step then moves a transformed coordinate by at most 0.5, the
next metric is released scale-free again (for a step over twice the cap) and the next step of
the schedule runs as two at the same total ``mu^2`` (:func:`fisher_scoring`, ``transformed``;
no extra privacy cost). There, with a 20% warm start (8 seeds): RMS error over coordinates
2.05 posterior sds at epsilon 1 and 1.22 at 2 (largest 3.2), against 300-6400 before; a
Poisson log rate started at 2 for 40 (its metric right everywhere) 1.54 and 0.46, against
1.91 and 0.47 (``tests/test_warmstart_scale.py``).

At small budgets an anisotropic metric is what limits the warm start: the pilot's metric
overestimates the flat directions many times (1000 on the gauss workload, condition number
1e4), and each curvature release corrects them by about the inverse of its eigenvalue floor
(3 times). Pooling the releases and taking 12 steps rather than 8 (measured with
``private_warm_start`` alone, 12-24 noise seeds, RMS over seeds of the RMS error in posterior
sd): gauss n = 1e4 at epsilon 2 8.7 before, 2.3 after; at epsilon 6 0.77 and 0.25; n = 1e5 at
epsilon 2 0.26 and 0.21; logistic n = 1e4 at epsilon 1 2.1 and 2.0, at 2 1.1 and 0.90; n = 1e5 at
epsilon 1 0.62 and 0.62.

Under add/remove-one, where ``n`` is private, the first step also releases a noisy count.
Per-datapoint gradients are central finite differences of the compiled per-datapoint
log-likelihood vector. Their accuracy does not matter for privacy: clipping bounds the
sensitivity whatever the rows are, and non-finite rows are set to zero before clipping.
Each step's releases are committed to the run's ledger (``mu_t^2 = (Delta_t / sigma_t)^2``
each) before the data are evaluated; the prior's gradient and Hessian carry no data and are
exact. Each release is rounded to its grid where its noise is added (the continuous ones to
the grid of their noise sd, :func:`pymc_penalty.privacy.precision.gaussian_release`; the
counts to the integers), so no noisy value exists at full float precision. Everything
returned is post-processing of the releases and of the data-independent start.

Restrictions: the model must pass the same checks as :class:`PenaltyMetropolis`; the
curvature estimates the Fisher information (the covariance of the per-datapoint scores),
which equals the Hessian of the log-likelihood for a correctly specified model near the mode
(otherwise it is only a proposal shape, which tuning refines: the chain's target is
unaffected). Each step costs ``2 d`` evaluations of the per-datapoint log-likelihood (``d``
the number of unconstrained parameters).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pymc.pytensorf import compile as pm_compile
from pymc.pytensorf import join_nonshared_inputs, make_shared_replacements
from pytensor.gradient import hessian

from pymc_penalty.accounting import GDPAccountant
from pymc_penalty.accounting.sensitivity import Neighbours
from pymc_penalty.errors import InvalidArgumentError, WarmStartRefused
from pymc_penalty.model.checks import check_min_rows, validate_model
from pymc_penalty.model.likelihood import PenaltyLikelihood
from pymc_penalty.validation import (
    NEIGHBOUR_NAMES,
    check_choice,
    check_integer,
    check_ledger,
    check_real,
)
from pymc_penalty.warmstart.scoring import (
    WARM_START_STEPS,
    Scoring,
    fisher_scoring,
    warm_start_clips,
    warm_start_schedule,
)
from pymc_penalty.warmstart.statistics import RowGradients, RowStatistics

__all__ = [
    "LogPrior",
    "WarmStartTarget",
    "prepare_warm_start",
    "WARM_START_STEPS",
    "Scoring",
    "WarmStart",
    "WarmStartRefused",
    "fisher_scoring",
    "per_datapoint_gradients",
    "private_warm_start",
    "split_point",
    "warm_start_clips",
    "warm_start_on",
    "warm_start_schedule",
]


@dataclass(frozen=True)
class WarmStart:
    """Result of :func:`private_warm_start` (all of it is private post-processing).

    Attributes
    ----------
    point : ndarray, shape (d,)
        Estimated posterior mode on the raveled unconstrained space.
    covariance : ndarray, shape (d, d)
        Estimated posterior covariance there (inverse of the noisy curvature plus the
        prior's).
    initvals : dict
        ``point`` split per value variable (transformed names), for ``pm.sample(initvals=)``.
    mu : float
        Gaussian-DP ``mu`` of all warm-start releases together.
    releases : int
        Number of Gaussian releases made.
    clip : float
        The gradient clip a further step would use, in the metric of the estimated
        per-datapoint Fisher information (``clip="auto"``: found from the released counts;
        otherwise the clip given).
    metric_clip : float
        ``clip`` as the sampler's ``clip_mode="metric"`` constant for a proposal whose
        Cholesky factor ``L`` is that of ``covariance``: a row's log-likelihood ratio per unit
        of whitened step ``||L^-1 (theta' - theta)||`` is at most its score's length in that
        metric, ``clip / sqrt(n)`` for a row the warm start did not clip (``n`` the released
        count under add/remove-one). So it clips at most the rows the warm start's clip did
        (about ``clipped_fraction``), in any proposal direction; a projection on one
        direction is shorter than the length (about ``sqrt(d)`` times for Gaussian scores),
        so it is an upper start which the sampler's clip adaptation can lower.
    clipped_fraction : float or None
        The last released clipped fraction (noisy count over ``n`` or its released count),
        with ``clip="auto"`` and ``steps >= 2``; None otherwise (no count released).
    clip_history : tuple of float
        The gradient clip of each step (then ``clip``); a step taken far from the mode shows
        the larger clip it travelled with (:func:`fisher_scoring`).
    n_rows : float
        ``n`` under substitute-one (public); under add/remove-one the released noisy count
        of the rows (public: the exact ``n`` is not kept).
    """

    point: np.ndarray
    covariance: np.ndarray
    initvals: dict[str, np.ndarray]
    mu: float
    releases: int
    clip: float
    metric_clip: float
    clipped_fraction: float | None
    clip_history: tuple[float, ...]
    n_rows: float = math.nan


class LogPrior:
    """Compiled log prior (with Jacobians), its gradient and Hessian on the raveled space."""

    def __init__(self, model: pm.Model, value_vars: list, point: dict[str, np.ndarray]) -> None:
        prior = model.logp(vars=list(model.free_RVs) + list(model.potentials), jacobian=True)
        shared = make_shared_replacements(point, value_vars, model)
        (prior,), flat = join_nonshared_inputs(
            point=point, outputs=[prior], inputs=value_vars, shared_inputs=shared
        )
        grad = pt.grad(prior, flat)
        self._fn = pm_compile([flat], [grad, hessian(prior, flat), prior])
        self.dtype = np.dtype(flat.dtype)

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        grad, hess, _ = self._fn(np.asarray(x, dtype=self.dtype))
        return np.asarray(grad, np.float64), np.asarray(hess, np.float64)

    def value(self, x: np.ndarray) -> float:
        """The log prior at ``x`` (Jacobians included)."""
        return float(self._fn(np.asarray(x, dtype=self.dtype))[2])


def per_datapoint_gradients(lik: PenaltyLikelihood, x: np.ndarray, n: int) -> np.ndarray:
    """Central finite differences of the per-datapoint log-likelihood: shape (n, d); rows
    that are not finite are set to zero (they then add nothing but stay bounded)."""
    h_rel = np.finfo(lik.input_dtype).eps ** (1.0 / 3.0)
    grads = np.empty((n, x.size))
    for j in range(x.size):
        h = h_rel * max(1.0, abs(float(x[j])))
        up, down = x.copy(), x.copy()
        up[j] += h
        down[j] -= h
        ll_up, _ = lik.initial(up, n)
        ll_down, _ = lik.initial(down, n)
        with np.errstate(invalid="ignore", over="ignore"):
            grads[:, j] = (np.asarray(ll_up, np.float64) - ll_down) / (2.0 * h)
    grads[~np.all(np.isfinite(grads), axis=1)] = 0.0
    return grads


def _transformed(model: pm.Model, value_vars: list, point: dict[str, Any]) -> np.ndarray:
    """Which raveled coordinates belong to a transformed value variable (``log``,
    ``logodds``, ...): model structure, no data."""
    return np.concatenate(
        [
            np.full(
                np.size(point[v.name]),
                model.rvs_to_transforms.get(model.values_to_rvs[v]) is not None,
            )
            for v in value_vars
        ]
    )


def split_point(x: np.ndarray, template: dict[str, Any]) -> dict[str, np.ndarray]:
    """A raveled point split per value variable, in ``template``'s order, shapes and dtypes
    (the layout of ``WarmStart.initvals``)."""
    values, start = {}, 0
    for name, like in template.items():
        shape = np.shape(like)
        size = int(np.prod(shape, dtype=int))
        values[name] = x[start : start + size].reshape(shape).astype(np.asarray(like).dtype)
        start += size
    return values


@dataclass(frozen=True)
class WarmStartTarget:
    """A model checked by the privacy gate and compiled for the warm start (no data released).

    Built by :func:`prepare_warm_start`; reusable across :func:`private_warm_start` calls on
    the same model and neighbour relation.
    """

    model: pm.Model
    relation: Neighbours
    min_rows: int | None
    point: dict[str, np.ndarray]
    value_vars: list
    n: int
    likelihood: PenaltyLikelihood
    prior: LogPrior


def prepare_warm_start(
    model: pm.Model | None = None,
    *,
    neighbours: str | Neighbours = "substitute",
    compile_kwargs: dict[str, Any] | None = None,
    min_rows: int | None = None,
) -> WarmStartTarget:
    """Run the privacy gate on ``model`` and compile its likelihood and prior, once.

    Everything here happens before any release: the gate refuses a model that would leak,
    and nothing is charged. ``min_rows`` is as in :func:`private_warm_start`.
    """
    model = pm.modelcontext(model)
    relation = Neighbours.parse(getattr(neighbours, "value", neighbours))
    min_rows = check_min_rows(min_rows)
    point = model.initial_point()
    value_vars = list(model.value_vars)
    adds = relation is Neighbours.ADD_REMOVE
    n = validate_model(model, value_vars, add_remove=adds, min_rows=min_rows)
    return WarmStartTarget(
        model=model,
        relation=relation,
        min_rows=min_rows,
        point=point,
        value_vars=value_vars,
        n=n,
        likelihood=PenaltyLikelihood(model, value_vars, point, compile_kwargs),
        prior=LogPrior(model, value_vars, point),
    )


def private_warm_start(
    model: pm.Model | None = None,
    *,
    mu: float,
    ledger: Any,
    clip: float | str = "auto",
    steps: int = WARM_START_STEPS,
    neighbours: str = "substitute",
    noise_rng: np.random.Generator | None = None,
    compile_kwargs: dict[str, Any] | None = None,
    target: WarmStartTarget | None = None,
    min_rows: int | None = None,
) -> WarmStart:
    """Estimate the posterior mode and covariance privately, spending ``mu`` from ``ledger``.

    Parameters
    ----------
    model : pm.Model, optional
    mu : float
        Gaussian-DP ``mu`` to spend in total (``mu^2`` is split over the releases by
        :func:`warm_start_schedule`).
    ledger : object
        A privacy ledger with ``try_spend(mu2) -> bool``; every release's cost is committed
        to it before the data are evaluated.
    clip : float or "auto", default "auto"
        Clip of each per-datapoint gradient's length in the metric of the estimated
        per-datapoint Fisher information (:func:`warm_start_clips`; released, so public):
        ``"auto"`` starts at the 99.9% quantile of that length at the mode for Gaussian
        scores (``sqrt`` of the ``chi^2_d`` quantile), which needs no knowledge of the data's
        scale, and moves it toward clipping 0.2% of the rows using a noisy clipped count
        released with each gradient from the second step (:func:`fisher_scoring`), so tails
        heavier than Gaussian (a logistic regression's scores) are not clipped into a bias.
    steps : int, default 12 (:data:`WARM_START_STEPS`)
        Fisher-scoring steps (two releases each, one more in the first step, two more under
        add/remove-one; with ``clip="auto"`` one more, the clipped count, in every step after
        the first).
    neighbours : {"substitute", "add_remove"}
    noise_rng : numpy.random.Generator, optional
        Source of the privacy noise; a fresh OS-entropy generator by default (pass a seeded
        one only for reproducible, non-private runs).
    compile_kwargs : dict, optional
        Passed to PyTensor's compile.
    target : WarmStartTarget, optional
        The model checked and compiled once by :func:`prepare_warm_start` (for callers that
        run many warm starts on one model, as the auditor does); built here when omitted.
    min_rows : int, optional
        Under add/remove-one, where it is required, the public lower bound on the rows the
        model gate's shape rules use instead of the private count
        (:func:`pymc_penalty.model.checks.rule_rows`); without it the warm start is refused
        before any release. Ignored under substitute-one.

    Returns
    -------
    WarmStart

    Raises
    ------
    WarmStartRefused
        If the ledger refuses a release (nothing more is evaluated).
    ValueError
        If an argument is out of range.
    """
    model = pm.modelcontext(model)
    mu = check_real("mu", mu, low=0.0, low_open=True)
    if not (isinstance(clip, str) and clip == "auto"):
        clip = check_real("clip", clip, low=0.0, low_open=True)
    steps = check_integer("steps", steps, low=1)
    check_ledger(ledger)
    check_choice("neighbours", getattr(neighbours, "value", neighbours), NEIGHBOUR_NAMES)
    relation = Neighbours.parse(neighbours)
    noise = np.random.default_rng() if noise_rng is None else noise_rng

    if target is None:
        target = prepare_warm_start(
            model, neighbours=relation, compile_kwargs=compile_kwargs, min_rows=min_rows
        )
    elif (
        target.model is not model
        or target.relation is not relation
        or target.min_rows != check_min_rows(min_rows)
    ):
        raise InvalidArgumentError(
            "`target` was prepared for another model, neighbour relation or `min_rows`: pass "
            "the same ones to prepare_warm_start."
        )
    point, value_vars, n, lik = target.point, target.value_vars, target.n, target.likelihood
    data = RowGradients(lambda at: per_datapoint_gradients(lik, at, n), n, relation)
    return warm_start_on(
        data, model, value_vars, point, target.prior,
        mu=mu, ledger=ledger, clip=clip, steps=steps, noise=noise,
    )  # fmt: skip


def warm_start_on(
    data: RowStatistics,
    model: pm.Model,
    value_vars: list,
    point: dict[str, np.ndarray],
    prior: Any,
    *,
    mu: float,
    ledger: Any,
    clip: float | str,
    steps: int,
    noise: np.random.Generator,
) -> WarmStart:
    """The private warm start on the rows that ``data`` reads (checked arguments): Fisher
    scoring from the model's point ``point`` with every release committed to ``ledger``
    before ``data`` is read, then its result as a :class:`WarmStart`.

    :func:`private_warm_start` reads the rows of ``model`` in this process
    (:class:`~pymc_penalty.warmstart.statistics.RowGradients`); a sharded table sums its
    shards' statistics (:class:`~pymc_penalty.warmstart.statistics.SummedStatistics`,
    :func:`pymc_penalty.distributed.sample_sharded`). ``prior`` is the compiled log prior
    (``prior(x) -> (gradient, Hessian)``, no data), ``model`` gives the transformed
    coordinates (structure only)."""
    x = np.concatenate([np.ravel(point[v.name]) for v in value_vars]).astype(np.float64)
    spent = GDPAccountant()  # what this warm start committed, release by release

    def commit(release_mu: float) -> None:
        if not ledger.try_spend(release_mu**2):
            raise WarmStartRefused(
                "The privacy ledger refused a warm-start release; lower `warm_start`."
            )
        spent.spend(release_mu)

    scoring = fisher_scoring(
        data,
        prior,
        x,
        None,
        schedule=warm_start_schedule(float(mu), int(steps)),
        neighbours=data.neighbours,
        clip=clip,
        noise=noise,
        commit=commit,
        transformed=_transformed(model, value_vars, point),
    )
    x = scoring.mode
    covariance = np.linalg.inv(scoring.precision)
    covariance = 0.5 * (covariance + covariance.T)
    initvals = split_point(x, {v.name: point[v.name] for v in value_vars})
    return WarmStart(
        point=x,
        covariance=covariance,
        initvals=initvals,
        mu=spent.mu,
        releases=spent.releases,
        clip=scoring.clip,
        metric_clip=scoring.clip / math.sqrt(scoring.n_rows),
        clipped_fraction=scoring.clipped_fraction,
        clip_history=scoring.clip_history,
        n_rows=float(scoring.n_rows),
    )
