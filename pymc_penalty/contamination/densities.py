"""Public contamination densities g: NumPy ``logpdf``/``rvs`` and a PyMC distribution.

Every parameter of g is public (Hu et al., Remark 3), so it must not be computed from the
data. A plain number cannot be traced, but an array with a record axis can, and so can a
PyTensor expression: a parameter given as a PyTensor variable must be a constant expression
(no shared variable, ``pm.Data`` container or random variable among its inputs), and any
array that could hold the records (:func:`pymc_penalty.model.checks.carries_records`) is
refused once the number of records is known (:meth:`ContaminationDensity.check_public`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.traversal import ancestors, graph_inputs
from scipy import stats

from pymc_penalty.errors import ModelNotPrivateError
from pymc_penalty.model.checks import carries_records

__all__ = [
    "BernoulliContamination",
    "ContaminationDensity",
    "StudentTContamination",
    "TruncatedStudentT",
]


def _constant_shapes(value: Variable) -> list[tuple[int, ...]]:
    return [tuple(np.shape(v.data)) for v in ancestors([value]) if isinstance(v, Constant)]


class ContaminationDensity:
    """Base class of a public contamination density g(y | x).

    Subclasses set ``self._params`` through :meth:`_public` and implement :meth:`logpdf`,
    :meth:`rvs` and :meth:`pm_dist`.
    """

    #: ``"real"``, ``"interval"`` or ``"binary"``.
    support: str = "real"
    #: Whether g depends on the covariates.
    uses_covariates: bool = False

    def __init__(self) -> None:
        self._params: dict[str, Any] = {}
        self._shapes: dict[str, list[tuple[int, ...]]] = {}

    def _public(self, name: str, value: Any, *, vector: bool = False) -> np.ndarray | float:
        """Record a public parameter; refuse one that reads model variables or data."""
        if isinstance(value, Variable):
            roots = [v for v in graph_inputs([value]) if not isinstance(v, Constant)]
            if roots:
                raise ModelNotPrivateError(
                    f"`{name}` of a contamination density must be a public constant; this "
                    "expression reads a model variable or a data container (parameters of g "
                    "computed from the data are refused)."
                )
            shapes = _constant_shapes(value)
            value = value.eval()
        else:
            shapes = [tuple(np.shape(value))]
        arr = np.asarray(value, dtype=float)
        if not vector and arr.ndim != 0:
            raise ValueError(f"`{name}` must be a scalar (an array could carry records).")
        if not np.all(np.isfinite(arr)) and name != "nu":
            raise ValueError(f"`{name}` must be finite.")
        self._shapes[name] = shapes
        self._params[name] = arr if vector else float(arr)
        return self._params[name]

    @property
    def params(self) -> dict[str, Any]:
        """The public parameters (a copy)."""
        return {
            k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in self._params.items()
        }

    def check_public(self, n: int) -> None:
        """Refuse parameters holding an array that could carry the records of ``n`` rows.

        Raises
        ------
        ModelNotPrivateError
            If any parameter's value or constant input has a record axis.
        """
        for name, shapes in self._shapes.items():
            if any(carries_records(s, n) for s in shapes):
                raise ModelNotPrivateError(
                    f"`{name}` of the contamination density holds an array as long as the data: "
                    "parameters of g computed from the data are refused (g must be public)."
                )

    def logpdf(self, y: Any, x: Any = None) -> np.ndarray:
        """Log density (or mass) of ``y`` (given covariates ``x`` when g uses them)."""
        raise NotImplementedError

    def rvs(self, size: int, x: Any = None, rng: Any = None) -> np.ndarray:
        """``size`` draws (row i given ``x[i]`` when g uses covariates)."""
        raise NotImplementedError

    def pm_dist(self, x: Any = None) -> pt.TensorVariable:
        """The density as an unregistered PyMC distribution (``.dist``)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({args})"


def _check_positive(name: str, value: float, *, allow_inf: bool = False) -> None:
    ok = value > 0 and (allow_inf or np.isfinite(value))
    if not ok:
        rng = "(0, inf]" if allow_inf else "(0, inf)"
        raise ValueError(f"`{name}` must be positive, in {rng}.")


class StudentTContamination(ContaminationDensity):
    """Student-t contamination ``g(y | x) = t_nu(y; loc(x), scale)``.

    Parameters
    ----------
    nu : float
        Degrees of freedom, in (0, inf]; ``inf`` gives a Normal (too light-tailed for a
        Gaussian model's score: :func:`estimate_privacy` refuses it there).
    scale : float, default 1.0
        Scale, in (0, inf).
    loc : float, default 0.0
        Location when g does not use covariates.
    loc_fn : callable, optional
        Public location function of the covariates: ``loc_fn(x)``, or ``loc_fn(x, beta)``
        when ``beta`` is given. It must work on NumPy arrays and, for :meth:`pm_dist`, on
        PyTensor tensors. It must not be fitted on the data (this cannot be checked).
    beta : array_like, optional
        Public coefficients; without ``loc_fn`` the location is ``x @ beta`` (the paper's
        shift ``x_i^T theta*``).
    """

    def __init__(
        self,
        nu: float,
        scale: float = 1.0,
        loc: float = 0.0,
        *,
        loc_fn: Callable[..., Any] | None = None,
        beta: Any = None,
    ) -> None:
        super().__init__()
        self.nu = self._public("nu", nu)
        _check_positive("nu", self.nu, allow_inf=True)
        self.scale = self._public("scale", scale)
        _check_positive("scale", self.scale)
        self.loc = self._public("loc", loc)
        self.beta = None if beta is None else self._public("beta", beta, vector=True)
        if loc_fn is not None and not callable(loc_fn):
            raise TypeError("`loc_fn` must be a callable of the covariates.")
        self.loc_fn = loc_fn
        self.uses_covariates = loc_fn is not None or beta is not None

    @property
    def params(self) -> dict[str, Any]:
        out = super().params
        if self.loc_fn is not None:
            out["loc_fn"] = getattr(self.loc_fn, "__name__", "callable")
        return out

    def location(self, x: Any = None, *, symbolic: bool = False) -> Any:
        """Location for covariates ``x`` (the constant ``loc`` when g ignores them)."""
        if not self.uses_covariates:
            return self.loc
        if x is None:
            raise ValueError("This contamination density's location needs `covariates`.")
        if self.loc_fn is not None:
            args = () if self.beta is None else (self.beta,)
            return self.loc_fn(x, *args)
        return pt.dot(x, self.beta) if symbolic else np.asarray(x, dtype=float) @ self.beta

    def logpdf(self, y: Any, x: Any = None) -> np.ndarray:
        z = (np.asarray(y, dtype=float) - self.location(x)) / self.scale
        if np.isinf(self.nu):
            return stats.norm.logpdf(z) - np.log(self.scale)
        return stats.t.logpdf(z, self.nu) - np.log(self.scale)

    def rvs(self, size: int, x: Any = None, rng: Any = None) -> np.ndarray:
        rng = np.random.default_rng(rng)
        draw = rng.standard_normal(size) if np.isinf(self.nu) else rng.standard_t(self.nu, size)
        return self.location(x) + self.scale * draw

    def pm_dist(self, x: Any = None) -> pt.TensorVariable:
        mu = self.location(x, symbolic=True)
        if np.isinf(self.nu):
            return pm.Normal.dist(mu=mu, sigma=self.scale)
        return pm.StudentT.dist(nu=self.nu, mu=mu, sigma=self.scale)


class TruncatedStudentT(ContaminationDensity):
    """Scaled Student-t truncated to ``[lower, upper]`` (the paper's section 2.3 g).

    Parameters
    ----------
    nu : float
        Degrees of freedom, in (0, inf).
    scale : float
        Scale, in (0, inf).
    lower, upper : float
        Truncation bounds, ``lower < upper`` (either may be infinite).
    loc : float, default 0.0
        Location before truncation.
    """

    support = "interval"

    def __init__(
        self, nu: float, scale: float, lower: float, upper: float, *, loc: float = 0.0
    ) -> None:
        super().__init__()
        self.nu = self._public("nu", nu)
        _check_positive("nu", self.nu)
        self.scale = self._public("scale", scale)
        _check_positive("scale", self.scale)
        self.loc = self._public("loc", loc)
        lo = np.asarray(lower.eval() if isinstance(lower, Variable) else lower, dtype=float)
        hi = np.asarray(upper.eval() if isinstance(upper, Variable) else upper, dtype=float)
        if lo.ndim or hi.ndim or not lo < hi:
            raise ValueError("`lower` and `upper` must be scalars with lower < upper.")
        # Recorded after the checks so an infinite bound is allowed.
        self.lower, self.upper = float(lo), float(hi)
        self._params.update(lower=self.lower, upper=self.upper)
        self._shapes.update(lower=[()], upper=[()])
        a, b = (self.lower - self.loc) / self.scale, (self.upper - self.loc) / self.scale
        # log(F(b) - F(a)), computed on the tail that keeps precision.
        if a > 0:
            self._log_mass = float(np.log(stats.t.sf(a, self.nu) - stats.t.sf(b, self.nu)))
        else:
            self._log_mass = float(np.log(stats.t.cdf(b, self.nu) - stats.t.cdf(a, self.nu)))

    def logpdf(self, y: Any, x: Any = None) -> np.ndarray:
        y = np.asarray(y, dtype=float)
        out = stats.t.logpdf((y - self.loc) / self.scale, self.nu) - np.log(self.scale)
        out = out - self._log_mass
        return np.where((y >= self.lower) & (y <= self.upper), out, -np.inf)

    def rvs(self, size: int, x: Any = None, rng: Any = None) -> np.ndarray:
        rng = np.random.default_rng(rng)
        a, b = (self.lower - self.loc) / self.scale, (self.upper - self.loc) / self.scale
        u = rng.random(size)
        if a > 0:  # upper tail: invert the survival function for precision
            sa, sb = stats.t.sf(a, self.nu), stats.t.sf(b, self.nu)
            z = stats.t.isf(sa - u * (sa - sb), self.nu)
        else:
            fa, fb = stats.t.cdf(a, self.nu), stats.t.cdf(b, self.nu)
            z = stats.t.ppf(fa + u * (fb - fa), self.nu)
        return np.clip(self.loc + self.scale * z, self.lower, self.upper)

    def pm_dist(self, x: Any = None) -> pt.TensorVariable:
        base = pm.StudentT.dist(nu=self.nu, mu=self.loc, sigma=self.scale)
        return pm.Truncated.dist(base, lower=self.lower, upper=self.upper)


class BernoulliContamination(ContaminationDensity):
    """Bernoulli(q) contamination of a binary response (the paper's logistic g, q = 1/2).

    Parameters
    ----------
    q : float, default 0.5
        Probability of a one, in (0, 1) (full support).
    """

    support = "binary"

    def __init__(self, q: float = 0.5) -> None:
        super().__init__()
        self.q = self._public("q", q)
        if not 0.0 < self.q < 1.0:
            raise ValueError("`q` must be in (0, 1), so that g has full support.")

    def logpdf(self, y: Any, x: Any = None) -> np.ndarray:
        y = np.asarray(y, dtype=float)
        out = np.where(y == 1, np.log(self.q), np.log1p(-self.q))
        return np.where((y == 0) | (y == 1), out, -np.inf)

    def rvs(self, size: int, x: Any = None, rng: Any = None) -> np.ndarray:
        return (np.random.default_rng(rng).random(size) < self.q).astype(np.int64)

    def pm_dist(self, x: Any = None) -> pt.TensorVariable:
        return pm.Bernoulli.dist(p=self.q)


def log_mix(log_f: Any, log_g: Any, rate: float) -> np.ndarray:
    """``log((1 - rate) f + rate g)`` from ``log f`` and ``log g``, stably (logaddexp)."""
    with np.errstate(divide="ignore"):
        lw1, lw2 = np.log1p(-rate), np.log(rate)
    if rate == 0.0:
        return np.asarray(log_f, dtype=float)
    if rate == 1.0:
        return np.asarray(log_g, dtype=float) + 0.0 * np.asarray(log_f)
    return np.logaddexp(lw1 + log_f, lw2 + log_g)


def check_rate(rate: Any, name: str = "rate") -> float:
    """A contamination rate: a public number in [0, 1]."""
    if isinstance(rate, Variable | bool) or np.ndim(rate) != 0:
        raise ValueError(f"`{name}` must be a public number in [0, 1].")
    value = float(rate)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"`{name}` must be in [0, 1].")
    return value
