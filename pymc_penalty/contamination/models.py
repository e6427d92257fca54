"""Model builders for the empirical privacy estimate: f(y | mu = x^T theta), prior, g.

Algorithm 1 (Hu et al., section 4) needs the record density f in closed form, vectorised over
many parameter draws, a prior, the contamination density g, a way to simulate synthetic
records and the public record domain. Every built-in model is a GLM in ``mu = x^T theta``
(the location model has ``x = 1``), so the maximum and minimum of f_p(z | theta) over the
ball ``||theta - theta_ref|| <= r`` are those over the interval
``mu in [x^T theta_ref - r ||x||, x^T theta_ref + r ||x||]`` (the paper's Lemmas 21, 25).
Each builder also writes the same model in PyMC (:meth:`ContaminationModel.pymc_model`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pymc as pm
from scipy import special, stats

from pymc_penalty.contamination.densities import (
    BernoulliContamination,
    ContaminationDensity,
    log_mix,
)
from pymc_penalty.contamination.mechanism import contaminated_likelihood
from pymc_penalty.errors import ModelNotPrivateError

__all__ = [
    "ContaminationModel",
    "LinearRegression",
    "LocationModel",
    "LogisticRegression",
    "RecordDomain",
    "check_tails",
]


@dataclass(frozen=True)
class RecordDomain:
    """The public domain searched for the worst record z = (x, y).

    Parameters
    ----------
    y : (float, float)
        Interval of the response; infinite ends are searched on a growing box, and a ratio
        still growing at its edge gives epsilon-hat = inf. Ignored for a binary response.
    x_radius : float
        Bound on the Euclidean norm of the covariates other than the intercept (the paper's
        ``||x_i|| <= 1``, Remark 15; the intercept is outside the bound).
    directions : int
        Covariate directions searched (the coordinate axes both ways, then random ones).
    grid : int
        Points on the response grid before refinement.
    """

    y: tuple[float, float] = (-math.inf, math.inf)
    x_radius: float = 1.0
    directions: int = 16
    grid: int = 801

    def __post_init__(self) -> None:
        lo, hi = (float(v) for v in self.y)
        if not lo < hi:
            raise ValueError(
                "`y` of a RecordDomain must be an interval (lower, upper), lower < upper."
            )
        if not (self.x_radius >= 0 and math.isfinite(self.x_radius)):
            raise ValueError("`x_radius` must be finite and non-negative, in [0, inf).")
        if self.directions < 1 or self.grid < 3:
            raise ValueError("`directions` must be >= 1 and `grid` >= 3.")
        object.__setattr__(self, "y", (lo, hi))


def _norm_logpdf(y: Any, mu: Any, sigma: float) -> np.ndarray:
    z = (np.asarray(y, dtype=float) - mu) / sigma
    return -0.5 * z * z - (math.log(sigma) + 0.5 * math.log(2 * math.pi))


class ContaminationModel:
    """A public model f(y | x^T theta) with a Normal prior and a contamination density g.

    Subclasses define :meth:`base_logpdf`, :meth:`base_rvs` and :meth:`base_pm_dist`.
    """

    binary = False
    #: Response scale: sets the search box (50 scales each side) and difference steps.
    scale = 1.0

    def __init__(
        self,
        dim: int,
        density: ContaminationDensity | None,
        prior_sd: float,
        prior_mean: float,
        intercept: bool,
    ) -> None:
        if isinstance(dim, bool) or int(dim) != dim or dim < 1:
            raise ValueError("`dim` must be a positive integer.")
        if not (prior_sd > 0 and math.isfinite(prior_sd)):
            raise ValueError("`prior_sd` must be positive and finite, in (0, inf).")
        if density is not None and not isinstance(density, ContaminationDensity):
            raise TypeError("`density` must be a ContaminationDensity or None.")
        self.dim = int(dim)
        self.density = density
        self.prior_sd = float(prior_sd)
        self.prior_mean = float(prior_mean)
        self.intercept = bool(intercept)

    # --- the record density f(y | mu) ------------------------------------------------------
    def base_logpdf(self, y: np.ndarray, mu: np.ndarray) -> np.ndarray:
        """``log f(y | mu)``, broadcasting ``y`` against ``mu``."""
        raise NotImplementedError

    def base_rvs(self, mu: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One record per entry of ``mu``."""
        raise NotImplementedError

    def base_pm_dist(self, mu: Any) -> Any:
        """f as an unregistered PyMC distribution with mean parameter ``mu``."""
        raise NotImplementedError

    def mode(self, y: np.ndarray) -> np.ndarray | None:
        """The ``mu`` maximising ``f(y | mu)`` (None when f is monotone in ``mu``)."""
        return None

    # --- contamination ---------------------------------------------------------------------
    def log_g(self, y: np.ndarray, x: np.ndarray | None) -> np.ndarray:
        if self.density is None:
            return np.full(np.shape(y), -np.inf)
        return self.density.logpdf(y, x if self.density.uses_covariates else None)

    def log_fp(self, y: Any, mu: Any, log_g: Any, rate: float) -> np.ndarray:
        """``log((1 - rate) f(y | mu) + rate g(y))`` from a precomputed ``log g``."""
        return log_mix(self.base_logpdf(y, mu), log_g, rate)

    def simulate(
        self, n: int, theta: np.ndarray, rate: float, rng: np.random.Generator, domain: RecordDomain
    ) -> tuple[np.ndarray, np.ndarray]:
        """``n`` synthetic contaminated records ``(y, x)`` at ``theta``."""
        x = self.covariates(n, rng, domain)
        y = self.base_rvs(x @ theta, rng)
        mask = rng.random(n) < rate
        if mask.any():
            gx = x[mask] if self.density.uses_covariates else None
            y[mask] = self.density.rvs(int(mask.sum()), x=gx, rng=rng)
        return y, x

    def covariates(self, n: int, rng: np.random.Generator, domain: RecordDomain) -> np.ndarray:
        """Public synthetic covariates: intercept, then uniform in the ``x_radius`` ball."""
        k = self.dim - self.intercept
        u = rng.standard_normal((n, k))
        u *= (
            domain.x_radius
            * rng.random((n, 1)) ** (1.0 / max(k, 1))
            / np.maximum(np.linalg.norm(u, axis=1, keepdims=True), 1e-300)
        )
        return np.hstack([np.ones((n, 1)), u]) if self.intercept else u

    def search_covariates(self, domain: RecordDomain, rng: np.random.Generator) -> np.ndarray:
        """Covariate points searched: the centre, axes both ways and random directions."""
        k = self.dim - self.intercept
        if k == 0:
            return np.ones((1, 1))
        eye = np.eye(k)
        dirs = [np.zeros(k), *eye, *(-eye)]
        extra = max(domain.directions - 2 * k, 0)
        if extra:
            v = rng.standard_normal((extra, k))
            dirs += list(v / np.linalg.norm(v, axis=1, keepdims=True))
        u = np.array(dirs) * domain.x_radius
        return np.hstack([np.ones((len(u), 1)), u]) if self.intercept else u[1:]

    def default_domain(self) -> RecordDomain:
        return RecordDomain()

    def pymc_model(self, y: Any, x: Any = None, rate: float = 0.0) -> pm.Model:
        """The same model in PyMC, with the contaminated likelihood, for data ``(y, x)``."""
        x = np.ones((np.shape(y)[0], 1)) if x is None else x
        with pm.Model() as model:
            theta = pm.Normal("theta", self.prior_mean, self.prior_sd, shape=self.dim)
            mu = pm.math.dot(x, theta)
            base = self.base_pm_dist(mu)
            if self.density is None:
                model.register_rv(base, "y", observed=y)
            else:
                cov = x if self.density.uses_covariates else None
                contaminated_likelihood("y", base, self.density, rate, y, covariates=cov)
        return model


class LocationModel(ContaminationModel):
    """``y_i ~ Normal(theta, sigma)`` truncated to ``[lower, upper]`` (section 2.3).

    Parameters
    ----------
    sigma : float
        Noise sd, in (0, inf).
    density : ContaminationDensity, optional
        The public g (the paper: a scaled t truncated to ``[lower, upper]``).
    prior_sd, prior_mean : float
        Normal prior on theta.
    lower, upper : float
        Truncation of the response (infinite by default: an untruncated Normal).
    """

    def __init__(
        self,
        sigma: float,
        density: ContaminationDensity | None = None,
        *,
        prior_sd: float = 100.0,
        prior_mean: float = 0.0,
        lower: float = -math.inf,
        upper: float = math.inf,
    ) -> None:
        super().__init__(1, density, prior_sd, prior_mean, intercept=True)
        if not (sigma > 0 and math.isfinite(sigma)):
            raise ValueError("`sigma` must be positive and finite, in (0, inf).")
        if not lower < upper:
            raise ValueError("`lower` must be below `upper`.")
        self.sigma = self.scale = float(sigma)
        self.lower, self.upper = float(lower), float(upper)

    def base_logpdf(self, y: Any, mu: Any) -> np.ndarray:
        y, mu = np.asarray(y, dtype=float), np.asarray(mu, dtype=float)
        out = _norm_logpdf(y, mu, self.sigma)
        if math.isinf(self.lower) and math.isinf(self.upper):
            return out
        a, b = (self.lower - mu) / self.sigma, (self.upper - mu) / self.sigma
        # log(Phi(b) - Phi(a)) on the side that keeps precision.
        flip = a > 0
        hi = np.where(flip, special.log_ndtr(-a), special.log_ndtr(b))
        lo = np.where(flip, special.log_ndtr(-b), special.log_ndtr(a))
        out = out - (hi + np.log1p(-np.exp(lo - hi)))
        return np.where((y >= self.lower) & (y <= self.upper), out, -np.inf)

    def base_rvs(self, mu: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        a, b = (self.lower - mu) / self.sigma, (self.upper - mu) / self.sigma
        return stats.truncnorm.rvs(
            a, b, loc=mu, scale=self.sigma, size=np.shape(mu), random_state=rng
        )

    def base_pm_dist(self, mu: Any) -> Any:
        base = pm.Normal.dist(mu=mu, sigma=self.sigma)
        if math.isinf(self.lower) and math.isinf(self.upper):
            return base
        return pm.Truncated.dist(base, lower=self.lower, upper=self.upper)

    def mode(self, y: np.ndarray) -> np.ndarray:
        return np.asarray(y, dtype=float)

    def default_domain(self) -> RecordDomain:
        return RecordDomain(y=(self.lower, self.upper))


class LinearRegression(ContaminationModel):
    """``y_i ~ Normal(x_i^T theta, sigma)``, sigma known (the paper's section 4.2 model).

    Parameters
    ----------
    dim : int
        Number of coefficients, the intercept included.
    sigma : float
        Noise sd, in (0, inf).
    density : ContaminationDensity, optional
        The public g; the paper's is a t with scale sigma shifted by ``x^T theta*``:
        ``StudentTContamination(nu, sigma, beta=theta_ref)``.
    prior_sd, prior_mean : float
        Normal prior on each coefficient.
    intercept : bool
        Whether the first covariate is a column of ones (outside ``x_radius``).
    """

    def __init__(
        self,
        dim: int,
        sigma: float = 1.0,
        density: ContaminationDensity | None = None,
        *,
        prior_sd: float = 10.0,
        prior_mean: float = 0.0,
        intercept: bool = True,
    ) -> None:
        super().__init__(dim, density, prior_sd, prior_mean, intercept)
        if not (sigma > 0 and math.isfinite(sigma)):
            raise ValueError("`sigma` must be positive and finite, in (0, inf).")
        self.sigma = self.scale = float(sigma)

    def base_logpdf(self, y: Any, mu: Any) -> np.ndarray:
        return _norm_logpdf(y, mu, self.sigma)

    def base_rvs(self, mu: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return mu + self.sigma * rng.standard_normal(np.shape(mu))

    def base_pm_dist(self, mu: Any) -> Any:
        return pm.Normal.dist(mu=mu, sigma=self.sigma)

    def mode(self, y: np.ndarray) -> np.ndarray:
        return np.asarray(y, dtype=float)


class LogisticRegression(ContaminationModel):
    """``y_i ~ Bernoulli(invlogit(x_i^T theta))``; g is Bernoulli(q) (the paper: q = 1/2).

    Parameters
    ----------
    dim : int
        Number of coefficients, the intercept included.
    density : BernoulliContamination, optional
        Default ``BernoulliContamination(0.5)``.
    prior_sd, prior_mean : float
        Normal prior on each coefficient.
    intercept : bool
        Whether the first covariate is a column of ones.
    """

    binary = True

    def __init__(
        self,
        dim: int,
        density: BernoulliContamination | None = None,
        *,
        prior_sd: float = 10.0,
        prior_mean: float = 0.0,
        intercept: bool = True,
    ) -> None:
        density = BernoulliContamination(0.5) if density is None else density
        if not isinstance(density, BernoulliContamination):
            raise TypeError("A logistic model's `density` must be a BernoulliContamination.")
        super().__init__(dim, density, prior_sd, prior_mean, intercept)

    def base_logpdf(self, y: Any, mu: Any) -> np.ndarray:
        y, mu = np.asarray(y, dtype=float), np.asarray(mu, dtype=float)
        # log invlogit(mu) = -log(1 + e^-mu); log(1 - invlogit(mu)) = -log(1 + e^mu)
        return -np.logaddexp(0.0, np.where(y == 1, -mu, mu))

    def base_rvs(self, mu: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return (rng.random(np.shape(mu)) < special.expit(mu)).astype(float)

    def base_pm_dist(self, mu: Any) -> Any:
        return pm.Bernoulli.dist(logit_p=mu)


def check_tails(
    model: ContaminationModel, rate: float, domain: RecordDomain, theta_ref: np.ndarray
) -> None:
    """Refuse a g that violates the tail condition (Assumption 4) on the record domain.

    Needs ``sup_y |d f(y | mu) / d mu| / g(y) < inf``: checked numerically at ``theta_ref``
    for each searched covariate point, on a geometric sequence of far responses on each
    unbounded side of the domain; on a bounded domain g must be positive throughout.

    Raises
    ------
    ModelNotPrivateError
        If g has no mass somewhere on the domain, or the ratio grows in a tail.
    """
    if rate == 0.0 or model.binary:
        return
    rng = np.random.default_rng(0)
    lo, hi = domain.y
    for x in model.search_covariates(domain, rng)[:3]:
        gx = x[None, :] if model.density.uses_covariates else None
        mu0 = float(x @ theta_ref)
        inner = np.linspace(max(lo, mu0 - 50 * model.scale), min(hi, mu0 + 50 * model.scale), 201)
        if not np.all(np.isfinite(model.log_g(inner, gx))):
            raise ModelNotPrivateError(
                "The contamination density g must be positive on the whole record `domain` "
                "(full support, Assumption 4 of Hu et al.); it vanishes somewhere on it."
            )
        steps = mu0 + model.scale * np.array([10.0, 20, 40, 80, 160, 320])
        for side, far in ((hi, steps), (lo, 2 * mu0 - steps)):
            if math.isfinite(side):
                continue
            h = 1e-3 * model.scale
            lf = model.base_logpdf(far, mu0)
            dlf = (model.base_logpdf(far, mu0 + h) - model.base_logpdf(far, mu0 - h)) / (2 * h)
            with np.errstate(divide="ignore"):
                ratio = lf + np.log(np.abs(dlf)) - model.log_g(far, gx)
            if not np.all(np.isfinite(ratio) | (ratio == -np.inf)) or np.all(np.diff(ratio) > 0):
                raise ModelNotPrivateError(
                    "The contamination density g is lighter-tailed than the model's score "
                    "(sup_y |df/dtheta| / g = inf, Assumption 4 of Hu et al.): use a "
                    "heavier-tailed g (a Student-t) or a bounded record `domain`."
                )
