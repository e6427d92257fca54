"""Algorithm 1 of Hu et al.: an empirical (epsilon, delta) for one contaminated posterior draw.

For neighbours X = D + {x} and Y = D + {y}, and the ball N = {||theta - theta_ref|| <= r},
Proposition 2 gives, for every set A, pi(A | X) <= e^eps pi(A | Y) + delta with

    eps = log sup_x max_N f_p(x|.) / E f_p(x|.)  +  log sup_y E f_p(y|.) / min_N f_p(y|.)
    delta = pi(N^c | X),

where E is the expectation under pi_{n-1}, the posterior given D. Here D is **synthetic**:
n - 1 contaminated records simulated at a public theta_ref. E is estimated by self-normalised
importance sampling from the Laplace approximation of pi_{n-1}; the ball's max and min use
the GLM interval of ``mu = x^T theta``; the sup is a grid search over the public record domain.
The result is an estimate, not a bound (see ``EmpiricalPrivacy``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import special

from pymc_penalty.contamination._search import _chunked_loglik, _laplace, _Search, _sup
from pymc_penalty.contamination.densities import check_rate
from pymc_penalty.contamination.models import ContaminationModel, RecordDomain, check_tails
from pymc_penalty.errors import ModelNotPrivateError
from pymc_penalty.model.checks import carries_records

__all__ = [
    "EmpiricalPrivacy",
    "PrivacyCurve",
    "estimate_privacy",
    "privacy_curve",
    "privacy_on_dataset",
]

#: What an estimate means, in words (copied into every report).
STATEMENT = (
    "Empirical (epsilon, delta) of one exact posterior draw under the contaminated likelihood "
    "(Hu et al., Algorithm 1). It is an estimate, not a certified bound: average case (the "
    "other n-1 records are assumed drawn from the model at theta_ref), asymptotic (the theory "
    "holds almost surely for large n only), and estimated by Monte Carlo with a finite search "
    "over records, which can underestimate the supremum. It is not composed with any "
    "differential-privacy ledger and is not part of dp_epsilon."
)


@dataclass(frozen=True)
class EmpiricalPrivacy:
    """Mean and maximum over repetitions of Algorithm 1's epsilon-hat and delta-hat.

    Attributes
    ----------
    eps_mean, eps_max, delta_mean, delta_max : float
        Over repetitions (``inf`` when a likelihood ratio grows without bound on the domain).
    per_rep : numpy.ndarray, shape (reps, 2)
        Columns epsilon-hat and delta-hat of each repetition.
    settings : dict
        The public inputs (n, rate, radius, reps, mc_draws, model, density...).
    """

    eps_mean: float
    eps_max: float
    delta_mean: float
    delta_max: float
    per_rep: np.ndarray
    settings: dict[str, Any] = field(default_factory=dict)

    def report(self, draws: int = 1, statistic: str = "mean") -> dict[str, Any]:
        """The ``attrs["contamination_privacy"]`` entry for a release of ``draws`` draws.

        ``draws`` draws compose basically: ``(draws * eps, draws * delta)``, delta capped at 1.
        ``statistic`` is ``"mean"`` or ``"max"`` over repetitions.
        """
        if statistic not in ("mean", "max"):
            raise ValueError("`statistic` must be 'mean' or 'max'.")
        eps = self.eps_mean if statistic == "mean" else self.eps_max
        delta = self.delta_mean if statistic == "mean" else self.delta_max
        s = self.settings
        return {
            "kind": "empirical, model-based, asymptotic (Hu et al.)",
            "eps_hat": float(draws * eps),
            "delta_hat": float(min(1.0, draws * delta)),
            "statistic": f"{statistic} over {s.get('reps', len(self.per_rep))} repetitions",
            "n": int(s.get("n", -1)),
            "rate": float(s.get("rate", math.nan)),
            "radius": float(s.get("radius", math.nan)),
            "reps": int(s.get("reps", len(self.per_rep))),
            "draws_covered": int(draws),
            "certified": False,
            "statement": STATEMENT,
        }


@dataclass(frozen=True)
class PrivacyCurve:
    """Epsilon-hat and delta-hat against n (from :func:`privacy_curve`)."""

    ns: np.ndarray
    rates: np.ndarray
    radii: np.ndarray
    eps_mean: np.ndarray
    eps_max: np.ndarray
    delta_mean: np.ndarray
    delta_max: np.ndarray
    results: tuple[EmpiricalPrivacy, ...]


def privacy_on_dataset(
    model: ContaminationModel,
    y: np.ndarray,
    x: np.ndarray | None,
    theta_ref: Any,
    rate: float,
    radius: float,
    domain: RecordDomain | tuple[float, float] | None = None,
    mc_draws: int = 2000,
    rng: Any = None,
    *,
    fresh: tuple[float, np.ndarray] | None = None,
    importance: bool = True,
    worst_case_delta: bool = False,
) -> tuple[float, float]:
    """One repetition of Algorithm 1 on a given **synthetic** shared dataset D.

    Never run this on real records: the Laplace fit, the draws and the result are exact
    functions of D. :func:`estimate_privacy` calls it on data simulated at ``theta_ref``.

    Parameters
    ----------
    model : ContaminationModel
    y, x : numpy.ndarray
        The n - 1 shared (contaminated) records; ``x`` of shape (n - 1, dim), or None for
        the location model.
    theta_ref, rate, radius, domain, mc_draws, rng
        As in :func:`estimate_privacy`.
    fresh : (float, numpy.ndarray), optional
        The differing record ``(y_n, x_n)`` for delta-hat; simulated when omitted.
    importance : bool, default True
        Self-normalised importance weights; False uses the Laplace draws unweighted (a
        reading of the paper's eq. 18).
    worst_case_delta : bool, default False
        Delta-hat as ``max_z pi(N^c | D + {z})`` over the searched records.

    Returns
    -------
    (float, float)
        Epsilon-hat and delta-hat.
    """
    rng = np.random.default_rng(rng)
    domain = _as_domain(model, domain)
    theta_ref = np.asarray(theta_ref, dtype=float).reshape(model.dim)
    y = np.asarray(y, dtype=float)
    x = np.ones((len(y), 1)) if x is None else np.asarray(x, dtype=float)
    gx = x if (model.density is not None and model.density.uses_covariates) else None
    lg = model.log_g(y, gx)
    mode, vecs, vals = _laplace(model, y, x, lg, rate, theta_ref)
    z = rng.standard_normal((mc_draws, model.dim))
    thetas = mode + (z / np.sqrt(vals)) @ vecs.T
    if importance:
        log_q = -0.5 * np.sum(z**2, axis=1)  # up to a constant, cancelled by normalising
        dev = thetas - model.prior_mean
        log_prior = -0.5 * np.sum(dev**2, axis=1) / model.prior_sd**2
        logw = log_prior + _chunked_loglik(model, y, x, lg, rate, thetas) - log_q
    else:
        logw = np.zeros(mc_draws)
    logw = logw - special.logsumexp(logw)
    out_ball = np.linalg.norm(thetas - theta_ref, axis=1) > radius
    search = _Search(model, thetas, logw, theta_ref, radius, rate, out_ball)
    up = down = delta_z = -math.inf
    for xz in model.search_covariates(domain, rng):
        u, d, dz = _sup(search, xz, domain, model)
        up, down, delta_z = max(up, u), max(down, d), max(delta_z, dz)
    eps = up + down
    if worst_case_delta:
        return float(eps), float(delta_z)
    if fresh is None:
        yn, xn = model.simulate(1, theta_ref, rate, rng, domain)
        fresh = (float(yn[0]), xn[0])
    yn, xn = fresh
    xn = np.asarray(xn, dtype=float).reshape(model.dim)
    lgn = model.log_g(np.array([yn]), xn[None, :] if gx is not None else None)
    lw = logw + model.log_fp(yn, thetas @ xn, lgn, rate)
    lw = lw - special.logsumexp(lw)
    delta = float(np.exp(special.logsumexp(lw[out_ball]))) if out_ball.any() else 0.0
    return float(eps), delta


def _as_domain(model, domain) -> RecordDomain:
    if domain is None:
        return model.default_domain()
    if isinstance(domain, RecordDomain):
        return domain
    return RecordDomain(y=tuple(domain))


def _positive(name: str, value: Any, integer: bool = False) -> None:
    bad = isinstance(value, bool) or not np.isscalar(value) or not value > 0
    if bad or (integer and int(value) != value) or not math.isfinite(value):
        kind = "a positive integer" if integer else "positive and finite, in (0, inf)"
        raise ValueError(f"`{name}` must be {kind}.")


def estimate_privacy(
    model_builder: ContaminationModel,
    theta_ref: Any,
    n: int,
    rate: float,
    radius: float,
    domain: RecordDomain | tuple[float, float] | None = None,
    reps: int = 20,
    mc_draws: int = 2000,
    *,
    rng: Any = None,
    importance: bool = True,
    worst_case_delta: bool = False,
) -> EmpiricalPrivacy:
    """Algorithm 1 (Hu et al.): empirical (epsilon, delta) of one contaminated posterior draw.

    Each repetition simulates n - 1 contaminated records at ``theta_ref`` (synthetic data
    only: nothing here reads a real record), fits the Laplace approximation, weights its
    draws by self-normalised importance sampling, and searches the record domain for the
    worst ratios (see the module docstring).

    Parameters
    ----------
    model_builder : ContaminationModel
        :class:`LocationModel`, :class:`LinearRegression` or :class:`LogisticRegression`
        (the model f, its prior and the public density g).
    theta_ref : array_like, shape (dim,)
        Public reference parameter (the paper's theta*). Not an estimate from the real data:
        that would leak it.
    n : int
        Dataset size (n - 1 shared records plus the differing one), n >= 2.
    rate : float
        Contamination rate p, in [0, 1].
    radius : float
        Radius r of the L2 ball around ``theta_ref``, in (0, inf).
    domain : RecordDomain or (float, float), optional
        Public record domain searched (the model's default when omitted).
    reps : int, default 20
        Repetitions (fresh synthetic datasets).
    mc_draws : int, default 2000
        Laplace draws per repetition.
    rng : None, int or Generator, optional
        Seed for the synthetic data and draws (nothing private: the data are synthetic).
    importance, worst_case_delta : bool
        See :func:`privacy_on_dataset`.

    Returns
    -------
    EmpiricalPrivacy
        ``eps_*`` is ``inf`` when a likelihood ratio grows without bound on the domain (for
        instance a Gaussian likelihood with ``rate = 0`` and an unbounded response).

    Raises
    ------
    ModelNotPrivateError
        If g is lighter-tailed than the model's score or not positive on the domain
        (Assumption 4), or ``theta_ref`` could carry records.
    """
    if not isinstance(model_builder, ContaminationModel):
        raise TypeError(
            "`model_builder` must be a ContaminationModel (LocationModel, LinearRegression "
            "or LogisticRegression)."
        )
    model = model_builder
    _positive("n", n, integer=True)
    if n < 2:
        raise ValueError("`n` must be at least 2.")
    rate = check_rate(rate)
    _positive("radius", radius)
    _positive("reps", reps, integer=True)
    _positive("mc_draws", mc_draws, integer=True)
    theta = np.asarray(theta_ref, dtype=float)
    if carries_records(theta.shape, int(n)) and theta.size > model.dim:
        raise ModelNotPrivateError("`theta_ref` has a record axis: it must be a public vector.")
    if theta.size != model.dim or not np.all(np.isfinite(theta)):
        raise ValueError("`theta_ref` must be a finite vector with one entry per coefficient.")
    if rate > 0 and model.density is None:
        raise ValueError("`rate` > 0 needs a contamination `density` on the model.")
    domain = _as_domain(model, domain)
    if model.density is not None:
        model.density.check_public(int(n))
    check_tails(model, rate, domain, theta.reshape(-1))
    gen = np.random.default_rng(rng)
    per_rep = np.empty((int(reps), 2))
    for k in range(int(reps)):
        y, x = model.simulate(int(n) - 1, theta.reshape(-1), rate, gen, domain)
        per_rep[k] = privacy_on_dataset(
            model, y, x, theta, rate, radius, domain, int(mc_draws), gen,
            importance=importance, worst_case_delta=worst_case_delta,
        )  # fmt: skip
    settings = {
        "model": type(model).__name__,
        "density": repr(model.density),
        "theta_ref": theta.reshape(-1).tolist(),
        "n": int(n),
        "rate": rate,
        "radius": float(radius),
        "domain_y": list(domain.y),
        "x_radius": domain.x_radius,
        "reps": int(reps),
        "mc_draws": int(mc_draws),
        "importance": bool(importance),
        "worst_case_delta": bool(worst_case_delta),
    }
    eps, delta = per_rep[:, 0], per_rep[:, 1]
    return EmpiricalPrivacy(
        float(eps.mean()), float(eps.max()), float(delta.mean()), float(delta.max()),
        per_rep, settings,
    )  # fmt: skip


def _schedule(value: float | Callable[[int], float], n: int) -> float:
    return float(value(n)) if callable(value) else float(value)


def privacy_curve(
    ns: Sequence[int],
    rate_fn: float | Callable[[int], float],
    radius_fn: float | Callable[[int], float],
    model_builder: ContaminationModel,
    theta_ref: Any,
    domain: RecordDomain | tuple[float, float] | None = None,
    reps: int = 20,
    mc_draws: int = 2000,
    *,
    rng: Any = None,
    **kwargs: Any,
) -> PrivacyCurve:
    """Epsilon-hat and delta-hat against n, for choosing the schedules p_n and r_n.

    Parameters
    ----------
    ns : sequence of int
        Dataset sizes.
    rate_fn, radius_fn : float or callable
        ``p_n`` and ``r_n``: a constant or a function of n (the paper's eq. 21 uses
        ``c n**(-a)``; the theory needs r_n -> 0, p_n -> 0, r_n / p_n -> 0, n r_n^2 -> inf).
    model_builder, theta_ref, domain, reps, mc_draws, rng, **kwargs
        As in :func:`estimate_privacy`.

    Returns
    -------
    PrivacyCurve
    """
    gen = np.random.default_rng(rng)
    results = []
    for n in ns:
        results.append(
            estimate_privacy(
                model_builder,
                theta_ref,
                int(n),
                _schedule(rate_fn, n),
                _schedule(radius_fn, n),
                domain,
                reps,
                mc_draws,
                rng=gen,
                **kwargs,
            )  # fmt: skip
        )
    col = lambda attr: np.array([getattr(r, attr) for r in results])  # noqa: E731
    return PrivacyCurve(
        ns=np.asarray(ns, dtype=int),
        rates=np.array([r.settings["rate"] for r in results]),
        radii=np.array([r.settings["radius"] for r in results]),
        eps_mean=col("eps_mean"), eps_max=col("eps_max"),
        delta_mean=col("delta_mean"), delta_max=col("delta_max"),
        results=tuple(results),
    )  # fmt: skip
