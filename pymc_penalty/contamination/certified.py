"""The certified combination: the penalty algorithm on the contaminated likelihood.

Contamination bounds every record's likelihood from below, ``f_p = (1 - p) f + p g >= p g``,
so a record's log-likelihood ratio between two parameter values cannot be arbitrarily large
(the bound behind Lemma 15 of Hu et al.). Where that bound holds for **every** record of the
public domain and **every** parameter value, it is a sensitivity: the penalty step can run on
the contaminated model with its clip set to the bound, and then (almost) never clips. The
chain targets the contaminated posterior without clipping bias, and the ledger's
(epsilon, delta) is the usual certified guarantee: the step still clips at the bound, so the
guarantee never rests on the derivation.

Two bounds, for GLMs in ``mu = x^T theta`` with ``f`` Gaussian (known sd) or Bernoulli-logit:

``"constant"`` (``clip_mode="constant"``)
    ``B = sup_{y, theta, theta'} |log f_p(y | theta') - log f_p(y | theta)|
    <= log(1 + (1 - p) sup f / (p inf g))``.
``"lipschitz"`` (``clip_mode="lipschitz"``)
    ``M = sup |d log f_p(y | theta) / d theta_j| = L max|x_j|`` with
    ``L = sup_{y, mu} |d log f_p(y | mu) / d mu|``; the step's bound is then
    ``M ||theta' - theta||_1``, proportional to the step length, as clipping is.

Both need ``p > 0``. For a Gaussian ``f`` both need a **bounded** response domain on which g
is positive: with the parameter unrestricted, ``sup_mu f(y | mu) / g(y)`` grows without bound
as ``|y|`` grows, for every g with tails (the paper's Assumption 4 is local, near
``theta*``; a certified bound must hold for every ``theta``). A truncated-Normal location
model has no bound at all (its normaliser makes ``f(b | theta)`` grow without limit as
``theta -> inf``). These cases are refused with :class:`ModelNotPrivateError`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pymc as pm
from scipy import stats

from pymc_penalty.contamination.densities import (
    BernoulliContamination,
    StudentTContamination,
    TruncatedStudentT,
    check_rate,
)
from pymc_penalty.contamination.mechanism import TAG
from pymc_penalty.contamination.models import (
    ContaminationModel,
    LinearRegression,
    LocationModel,
    LogisticRegression,
    RecordDomain,
)
from pymc_penalty.errors import ModelNotPrivateError
from pymc_penalty.sampling.options import ClipPolicy, group_step_options

__all__ = ["CertifiedBound", "certified_bound", "certified_step"]

KINDS = ("constant", "lipschitz")
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


@dataclass(frozen=True)
class CertifiedBound:
    """A per-record sensitivity of the contaminated likelihood, derived from (p, g, f).

    Attributes
    ----------
    kind : {"constant", "lipschitz"}
        Which bound (see :func:`certified_bound`).
    clip : float
        The step's ``clip``: ``B`` for ``"constant"``; ``M``, the bound on every partial
        derivative of a record's log-likelihood in ``theta``, for ``"lipschitz"``.
    clip_mode : str
        The step's ``clip_mode`` (equal to ``kind``).
    rate : float
        The contamination rate p the bound was derived for.
    density : dict
        The public parameters of g the bound was derived for.
    domain : RecordDomain
        The public record domain it holds on.
    """

    kind: str
    clip: float
    clip_mode: str
    rate: float
    density: dict
    domain: RecordDomain

    def step_kwargs(self) -> dict[str, Any]:
        """``clip=`` for :class:`~pymc_penalty.PenaltyMetropolis`: a
        :class:`~pymc_penalty.ClipPolicy` with this bound as its value and mode."""
        return {"clip": ClipPolicy(self.clip, mode=self.clip_mode)}


def _refuse(reason: str) -> ModelNotPrivateError:
    return ModelNotPrivateError(f"No certified contamination bound: {reason}")


def _loc_range(density: StudentTContamination, model: ContaminationModel, domain: RecordDomain):
    """Range of g's location over the covariate domain."""
    if not density.uses_covariates:
        return density.loc, density.loc
    if density.loc_fn is not None:
        raise _refuse(
            "g's location is a `loc_fn`, whose range over the covariate domain cannot be "
            "bounded; give a linear location (`beta`) or a constant `loc`."
        )
    beta = np.asarray(density.beta, dtype=float)
    if beta.shape != (model.dim,):
        raise ValueError(f"`beta` of the contamination density must have length {model.dim}.")
    centre = beta[0] if model.intercept else 0.0
    rest = beta[1:] if model.intercept else beta
    half = domain.x_radius * float(np.linalg.norm(rest))
    return centre - half, centre + half


def log_density_floor(model: ContaminationModel, domain: RecordDomain) -> float:
    """``log inf g(y | x)`` over the record domain (``-inf`` where g can vanish).

    Every built-in g is unimodal in y about its location, so the infimum over an interval of
    responses is at the end farthest from the location.
    """
    g = model.density
    if isinstance(g, BernoulliContamination):
        return math.log(min(g.q, 1.0 - g.q))
    lo, hi = domain.y
    if isinstance(g, TruncatedStudentT):
        if lo < g.lower or hi > g.upper:
            return -math.inf  # g has no mass on part of the domain
        return float(min(g.logpdf(lo), g.logpdf(hi)))
    if isinstance(g, StudentTContamination):
        loc_lo, loc_hi = _loc_range(g, model, domain)
        far = max(hi - loc_lo, loc_hi - lo)
        if not math.isfinite(far):
            return -math.inf
        z = far / g.scale
        log_z = stats.norm.logpdf(z) if math.isinf(g.nu) else stats.t.logpdf(z, g.nu)
        return float(log_z - math.log(g.scale))
    raise TypeError(f"No certified bound for a {type(g).__name__} contamination density.")


def _logistic_lipschitz(rate: float, q: float) -> float:
    """``sup |d log f_p / d mu|`` for a logit Bernoulli f and a Bernoulli(q) g.

    For ``y = 1`` the derivative is ``a s (1 - s) / (a s + b)`` with ``s = invlogit(mu)``,
    ``a = 1 - p``, ``b = p q``; its maximum over s solves ``a s^2 + 2 b s - b = 0``. ``y = 0``
    is the same with ``b = p (1 - q)``. With ``p = 0`` the supremum is 1 (``s -> 0``).
    """
    a = 1.0 - rate
    best = 0.0
    for b in (rate * q, rate * (1.0 - q)):
        if b == 0.0:
            return 1.0
        s = (-b + math.sqrt(b * b + a * b)) / a
        best = max(best, a * s * (1.0 - s) / (a * s + b))
    return best


def _gaussian_lipschitz_unit(c: float) -> float:
    """Rigorous upper bound on ``sup_{u >= 0} u phi(u) / (phi(u) + c)``, ``c > 0``.

    On ``[0, U]`` the maximum over a grid of step ``h`` is raised by ``h/2 sup|k'|`` with
    ``|k'| <= 1 + U^2 / 4``; beyond ``U >= 1`` the function is below the decreasing
    ``u phi(u) / c``, hence below ``U phi(U) / c``.
    """
    # phi(U) = c * 1e-6 puts U well past the maximum (near phi(u) = c).
    U = max(4.0, math.sqrt(max(2.0 * (-math.log(c * 1e-6) - _LOG_SQRT_2PI), 0.0)))
    u = np.linspace(0.0, U, 400_001)
    phi = np.exp(-0.5 * u * u - _LOG_SQRT_2PI)
    grid_max = float(np.max(u * phi / (phi + c)))
    h = U / 400_000
    tail = U * math.exp(-0.5 * U * U - _LOG_SQRT_2PI) / c
    return max(grid_max + 0.5 * h * (1.0 + U * U / 4.0), tail)


def certified_bound(
    model: ContaminationModel,
    rate: float,
    domain: RecordDomain | None = None,
    *,
    kind: str = "constant",
) -> CertifiedBound:
    """Derive a per-record sensitivity of the contaminated likelihood from (p, g, f).

    Parameters
    ----------
    model : ContaminationModel
        The public model: :class:`LocationModel` (untruncated), :class:`LinearRegression`
        (Gaussian f, known sd) or :class:`LogisticRegression`, with its contamination
        density g (:class:`StudentTContamination` with a constant or linear location,
        :class:`TruncatedStudentT` or :class:`BernoulliContamination`).
    rate : float
        The contamination rate p, in (0, 1).
    domain : RecordDomain, optional
        The public record domain: the response interval ``y`` and the bound ``x_radius`` on
        the covariates other than the intercept. Default ``model.default_domain()``. Records
        outside it are still clipped by the step (the guarantee holds), but the chain then
        has clipping bias.
    kind : {"constant", "lipschitz"}, default "constant"
        ``"constant"``: ``B >= |log f_p(y | theta') - log f_p(y | theta)|`` for every record
        and every pair of parameters, ``B = log(1 + (1 - p) sup f / (p inf g))`` (exact for
        the logistic model, attained at the domain's far end for the Gaussian).
        ``"lipschitz"``: ``M >= |d log f_p(y | theta) / d theta_j|``, so the step's bound
        ``M ||theta' - theta||_1`` shrinks with the step, as clipping's does.

    Returns
    -------
    CertifiedBound
        Pass ``bound.step_kwargs()`` to :class:`~pymc_penalty.PenaltyMetropolis`, or use
        :func:`certified_step`.

    Raises
    ------
    ModelNotPrivateError
        If no finite bound exists: ``p = 0``; a Gaussian f on an unbounded response domain
        (whatever g's tails); g vanishing on part of the domain; a truncated-Normal location
        model; a location function of g that cannot be bounded.
    ValueError
        On a rate outside [0, 1], an unknown ``kind`` or a non-finite result.
    """
    rate = check_rate(rate)
    if kind not in KINDS:
        raise ValueError(f"`kind` must be one of {KINDS}; got {kind!r}.")
    if not isinstance(model, ContaminationModel):
        raise TypeError("`model` must be a ContaminationModel (LocationModel, ...).")
    if model.density is None or rate == 0.0:
        raise _refuse(
            "the contamination rate p is 0 (or g is missing): f_p = f has no lower bound, so "
            "one record's log-likelihood ratio is unbounded. Use `rate` in (0, 1)."
        )
    if rate == 1.0:
        raise ValueError("`rate` must be below 1: with p = 1 the data carry no information.")
    domain = model.default_domain() if domain is None else domain
    if not isinstance(domain, RecordDomain):
        raise TypeError("`domain` must be a RecordDomain.")
    x_max = max(1.0 if model.intercept else 0.0, domain.x_radius)
    if isinstance(model, LocationModel):
        if math.isfinite(model.lower) or math.isfinite(model.upper):
            raise _refuse(
                "a truncated-Normal location model's density at the truncation point grows "
                "without limit as theta -> +-inf (its normaliser vanishes). Use an "
                "untruncated LocationModel with a bounded RecordDomain(y=(lower, upper))."
            )
        x_max = 1.0
    log_g = log_density_floor(model, domain)
    if isinstance(model, LogisticRegression):
        q = model.density.q
        if kind == "constant":
            # sup_mu f_p(1 | mu) = 1 - p + p q, inf = p q (mu -> +-inf); likewise for y = 0.
            value = math.log1p((1.0 - rate) / (rate * min(q, 1.0 - q)))
        else:
            value = _logistic_lipschitz(rate, q) * x_max
    elif isinstance(model, LocationModel | LinearRegression):
        if not math.isfinite(log_g):
            raise _refuse(
                "g's density has no positive lower bound on the response domain (an unbounded "
                "`domain.y`, or g vanishing on part of it): with theta unrestricted, "
                "sup_theta f(y | theta) / g(y) grows without bound for a Gaussian f. Give a "
                "bounded RecordDomain(y=(lower, upper)) on which g is positive."
            )
        sigma = model.sigma
        if kind == "constant":
            # sup_mu f(y | mu) = 1 / (sigma sqrt(2 pi)); inf_mu f = 0.
            log_ratio = math.log1p(-rate) - math.log(rate) - math.log(sigma) - _LOG_SQRT_2PI
            value = float(np.logaddexp(0.0, log_ratio - log_g))
        else:
            # |d log f_p / d mu| = (|u| / sigma) phi(u) / (phi(u) + c(y)), u = (y - mu) / sigma,
            # c(y) = p sigma g(y) / (1 - p) >= c: decreasing in c.
            c = rate * sigma * math.exp(log_g) / (1.0 - rate)
            if c <= 0.0:
                raise _refuse("g's density underflows on the response domain.")
            value = _gaussian_lipschitz_unit(c) / sigma * x_max
    else:
        raise TypeError(f"No certified bound for a {type(model).__name__}.")
    if not (math.isfinite(value) and value > 0):
        raise ValueError("The derived bound is not a finite positive number.")
    return CertifiedBound(
        kind=kind,
        clip=float(value),
        clip_mode=kind,
        rate=rate,
        density=model.density.params,
        domain=domain,
    )


def _check_tags(pymc_model: pm.Model, bound: CertifiedBound) -> None:
    """Every observed variable must be a contaminated likelihood with the bound's p and g."""
    if not pymc_model.observed_RVs:
        raise ValueError("The model has no observed variable to bound.")
    for rv in pymc_model.observed_RVs:
        tag = getattr(rv.tag, TAG, None)
        if tag is None:
            raise ValueError(
                f"Observed variable `{rv.name}` is not a contaminated likelihood "
                "(contaminated_likelihood): the certified bound does not apply to it."
            )
        if tag["rate"] != bound.rate or tag["params"] != bound.density:
            raise ValueError(
                f"Observed variable `{rv.name}` was built with another contamination rate or "
                "density than the certified bound: derive the bound for the model you sample."
            )


def certified_step(
    model: ContaminationModel,
    rate: float,
    *,
    domain: RecordDomain | None = None,
    kind: str = "lipschitz",
    pymc_model: pm.Model | None = None,
    **step_kwargs: Any,
):
    """A :class:`~pymc_penalty.PenaltyMetropolis` step clipped at the certified bound.

    Call it in the context of the PyMC model of the contaminated likelihood (for instance
    ``model.pymc_model(y_tilde, x, rate)``), with a budget (``epsilon``, ``delta``, ``plan``)
    or any other privacy argument of :class:`~pymc_penalty.PenaltyMetropolis`.

    Parameters
    ----------
    model : ContaminationModel
        The public model and g the bound is derived from (:func:`certified_bound`).
    rate : float
        The contamination rate p, in (0, 1).
    domain : RecordDomain, optional
        The public record domain (default ``model.default_domain()``).
    kind : {"constant", "lipschitz"}, default "lipschitz"
        Which bound sets the clip (see :func:`certified_bound`). The Lipschitz bound scales
        with the step, as clipping does; the constant one does not, and at epsilon up to 10
        over 1000 steps its noise froze every chain measured (``benchmarks/contamination.py``).
    pymc_model : pm.Model, optional
        The PyMC model (default: the context's). Every observed variable must come from
        :func:`contaminated_likelihood` with the same ``rate`` and g. The bound is derived for
        ``model`` (its f, its fixed sd, a coefficient vector with a Normal prior): a PyMC
        model that differs (a free sd, a transformed coefficient) stays private, since the
        step clips at the bound, but its chain may clip and be biased.
    **step_kwargs
        Passed to :class:`~pymc_penalty.PenaltyMetropolis` (``epsilon``, ``delta``,
        ``plan``, ``privacy``...); the clip's value and mode are set here (a ``clip``
        group may give its ``count_share``).

    Returns
    -------
    PenaltyMetropolis
        The step, with ``certified_bound`` (the :class:`CertifiedBound`) attached.

    Raises
    ------
    ModelNotPrivateError
        If no finite bound exists (see :func:`certified_bound`); before any ledger exists.
    ValueError
        If the clip's value or mode is given (``clip``, ``clip_mode``), or the PyMC model's
        likelihood does not match ``(rate, g)``.
    """
    from pymc_penalty.sampling.step import PenaltyMetropolis

    step_kwargs = group_step_options(step_kwargs)  # the old keywords (FutureWarning)
    clip = step_kwargs.pop("clip", None) or ClipPolicy()
    if clip.value != ClipPolicy().value or clip.mode is not None:
        raise ValueError(
            "`clip` is set by certified_step from the certified bound (ClipPolicy.value and "
            "mode; `clip_mode` too)."
        )
    bound = certified_bound(model, rate, domain, kind=kind)
    pymc_model = pm.modelcontext(pymc_model)
    _check_tags(pymc_model, bound)
    clip = replace(clip, value=bound.clip, mode=bound.clip_mode)
    step = PenaltyMetropolis(model=pymc_model, clip=clip, **step_kwargs)
    step.certified_bound = bound
    return step
