"""The exponential families :class:`~pymc_penalty.variants.ExpFamPenaltyMetropolis` recognises
from a PyMC likelihood, and their clipped sufficient statistics.

Each :class:`Family` gives the natural parameter ``phi`` and log-partition ``A`` in terms of
the PyMC op's own parameters, the clipped per-datapoint statistic ``T(y)`` and the L2
sensitivity of its sum. :func:`recognise_family` matches a model's observed variable to one of
them (shapes and constants only: it reads no data).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pymc as pm
from pytensor.graph.basic import Variable
from pytensor.graph.traversal import ancestors

from pymc_penalty.accounting.sensitivity import Neighbours
from pymc_penalty.errors import ModelNotPrivateError
from pymc_penalty.model.checks import data_sources, depends_on_data

__all__ = ["FAMILIES", "Family", "RecognisedFamily", "recognise_family"]


@dataclass(frozen=True)
class Family:
    """One exponential family, in terms of the PyMC op's own parameters.

    ``phi(params)`` and ``A(params)`` take the op's varying parameter (a float or a small
    vector) and its constant parameters; ``stat(y, const, bound)`` returns the clipped
    per-datapoint statistics (shape (n, k)) and the number of clipped datapoints;
    ``sens(const, bound, neighbours)`` the L2 sensitivity of their sum.
    """

    op_name: str
    varying: int  # index of the sampled parameter among the op's dist params
    needs_bound: bool
    phi: Callable[..., np.ndarray]
    A: Callable[..., float]
    stat: Callable[..., tuple[np.ndarray, int]]
    sens: Callable[..., float]


def _clip_scalar(y: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, int]:
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    n_clipped = int(np.count_nonzero((y < lo) | (y > hi) | np.isnan(y)))
    return np.clip(np.nan_to_num(y, nan=lo), lo, hi)[:, None], n_clipped


def _nonneg_stat(y, const, bound):
    return _clip_scalar(y, 0.0, bound)


def _nonneg_sens(const, bound, nb):
    return float(bound)  # both relations: |T(y) - T(y')| <= bound and |T(y)| <= bound


def _logit(p):
    p = np.asarray(p, dtype=np.float64)
    return np.log(p) - np.log1p(-p)


def _binomial_stat(y, const, bound):
    return _clip_scalar(y, 0.0, float(const[0]))


def _normal_stat(y, const, bound):
    return _clip_scalar(y, -bound, bound)


def _categorical_stat(y, const, bound):
    k = int(bound)
    y = np.asarray(y).reshape(-1)
    valid = (y >= 0) & (y < k)
    counts = np.bincount(y[valid].astype(np.int64), minlength=k).astype(np.float64)
    return counts[None, :], int(np.count_nonzero(~valid))


def _multinomial_stat(y, const, bound):
    # A row that is not a valid count vector (negative, non-integer, wrong total) contributes
    # zero: ||0 - y'|| <= N keeps the sensitivity bound whatever the data hold.
    y = np.asarray(y, dtype=np.float64)
    y = y.reshape(-1, y.shape[-1])
    with np.errstate(invalid="ignore"):
        valid = (
            np.all(np.isfinite(y), axis=1)
            & np.all(y >= 0, axis=1)
            & np.all(y == np.round(y), axis=1)
            & (y.sum(axis=1) == const[0])
        )
    total = np.where(valid[:, None], y, 0.0).sum(axis=0)
    return total[None, :], int(np.count_nonzero(~valid))


FAMILIES: dict[str, Family] = {
    # Poisson(mu): phi = log mu, A = mu, T = y in [0, y_max].
    "poisson": Family(
        "poisson",
        0,
        True,
        lambda mu, c: np.log(np.atleast_1d(mu)),
        lambda mu, c: float(mu),
        _nonneg_stat,
        _nonneg_sens,
    ),
    # Bernoulli(p): phi = logit p, A = -log(1 - p), T = y in {0, 1}.
    "bernoulli": Family(
        "bernoulli",
        0,
        False,
        lambda p, c: np.atleast_1d(_logit(p)),
        lambda p, c: float(-np.log1p(-p)),
        lambda y, c, b: _clip_scalar(y, 0.0, 1.0),
        lambda c, b, nb: 1.0,
    ),
    # Binomial(N, p) with fixed N: phi = logit p, A = -N log(1 - p), T = y in [0, N].
    "binomial": Family(
        "binomial",
        1,
        False,
        lambda p, c: np.atleast_1d(_logit(p)),
        lambda p, c: float(-c[0] * np.log1p(-p)),
        _binomial_stat,
        lambda c, b, nb: float(c[0]),
    ),
    # Normal(mu, sigma) with constant sigma: phi = mu / sigma^2, A = mu^2 / (2 sigma^2),
    # T = y in [-y_max, y_max].
    "normal": Family(
        "normal",
        0,
        True,
        lambda mu, c: np.atleast_1d(mu / c[1] ** 2),
        lambda mu, c: float(mu**2 / (2.0 * c[1] ** 2)),
        _normal_stat,
        lambda c, b, nb: float(b) * nb.factor,
    ),
    # Exponential(scale s = 1 / lam): phi = -1 / s, A = log s, T = y in [0, y_max].
    "exponential": Family(
        "exponential",
        0,
        True,
        lambda s, c: np.atleast_1d(-1.0 / s),
        lambda s, c: float(np.log(s)),
        _nonneg_stat,
        _nonneg_sens,
    ),
    # Gamma(alpha, scale s) with constant alpha: phi = -1 / s, A = alpha log s, T = y.
    "gamma": Family(
        "gamma",
        1,
        True,
        lambda s, c: np.atleast_1d(-1.0 / s),
        lambda s, c: float(c[0] * np.log(s)),
        _nonneg_stat,
        _nonneg_sens,
    ),
    # Categorical(p) over k classes: phi = log p, A = 0, T = one-hot(y).
    "categorical": Family(
        "categorical",
        0,
        False,
        lambda p, c: np.log(np.asarray(p, dtype=np.float64).reshape(-1)),
        lambda p, c: 0.0,
        _categorical_stat,
        lambda c, b, nb: math.sqrt(2.0) if nb is Neighbours.SUBSTITUTE else 1.0,
    ),
    # Multinomial(N, p) with fixed N: phi = log p, A = 0, T = y (counts summing to N);
    # ||y - y'|| <= sqrt(2) N (all trials moved between two classes), ||y|| <= N.
    "multinomial": Family(
        "multinomial",
        1,
        False,
        lambda p, c: np.log(np.asarray(p, dtype=np.float64).reshape(-1)),
        lambda p, c: 0.0,
        _multinomial_stat,
        lambda c, b, nb: float(c[0]) * (math.sqrt(2.0) if nb is Neighbours.SUBSTITUTE else 1.0),
    ),
}


def _depends_on_free(var: Any, model: pm.Model) -> bool:
    free = set(model.free_RVs) | set(model.value_vars)
    return any(a in free for a in ancestors([var]))


class RecognisedFamily(NamedTuple):
    """A model's likelihood as one of the :data:`FAMILIES`."""

    family: Family
    const: tuple  # the op's constant parameters (None at the sampled one's index)
    bound: float  # the data bound the statistic is clipped to (NaN: the family's own)
    varying: Variable  # the sampled parameter, in terms of the model's random variables


def recognise_family(
    model: pm.Model, obs: Variable, family: str | None, data_bound: float | None, n: int
) -> RecognisedFamily:
    """Match the observed variable ``obs`` to one of the :data:`FAMILIES`.

    Raises
    ------
    ValueError
        The likelihood is not a supported family (or not ``family``), a parameter other than
        the supported one is sampled or not a scalar constant, the sampled parameter is not
        shared by every datapoint, or ``data_bound`` is missing where the family needs one.
    ModelNotPrivateError
        A parameter of the likelihood depends on data.
    """
    op_name = getattr(obs.owner.op, "name", type(obs.owner.op).__name__)
    if op_name not in FAMILIES:
        raise ValueError(
            f"The observed variable {obs.name!r} has likelihood {op_name!r}, not a supported "
            f"exponential family ({sorted(FAMILIES)}); `family` cannot override this. Use "
            "pymc_penalty.PenaltyMetropolis."
        )
    if family is not None and family != op_name:
        raise ValueError(
            f"`family`={family!r} but the observed variable {obs.name!r} is {op_name!r}."
        )
    fam = FAMILIES[op_name]
    params = list(obs.owner.op.dist_params(obs.owner))
    if depends_on_data(params, data_sources(model), n):
        # A parameter read from covariates would enter n * (A(theta') - A(theta)), and the
        # statistic's own terms, without noise.
        raise ModelNotPrivateError(
            f"A parameter of the {op_name} likelihood of {obs.name!r} depends on data "
            "(pm.Data, observed values, or an array that could hold records): "
            "ExpFamPenaltyMetropolis needs parameters that are functions of the free "
            "variables alone, the same for every datapoint. Use PenaltyMetropolis for "
            "regressions and exposures."
        )
    const = []
    for i, p in enumerate(params):
        if i == fam.varying:
            continue
        if _depends_on_free(p, model):
            raise ValueError(
                f"The {op_name} likelihood of {obs.name!r} has a sampled parameter other "
                "than the supported one (e.g. Normal sigma, Gamma alpha, Binomial n): it "
                "must be a constant."
            )
        val = np.asarray(p.eval(), dtype=np.float64)
        if val.size != 1:
            raise ValueError(f"The constant parameters of {obs.name!r} must be scalars.")
        const.append(float(val.reshape(-1)[0]))
    const_full = [None] * len(params)
    j = 0
    for i in range(len(params)):
        if i != fam.varying:
            const_full[i] = const[j]
            j += 1
    varying = params[fam.varying]

    if fam.needs_bound:
        if data_bound is None:
            raise ValueError(
                f"`data_bound` is required for the {op_name} family: declare a bound on the "
                "data (it sets the sensitivity; values beyond it are clipped)."
            )
        if not (np.isfinite(float(data_bound)) and float(data_bound) > 0):
            raise ValueError("`data_bound` must be a finite positive number.")
        bound = float(data_bound)
    else:
        bound = math.nan
    if op_name in ("categorical", "multinomial"):
        shape = tuple(int(s) for s in varying.shape.eval())
        k = shape[-1] if shape else 0
        if k < 2 or int(np.prod(shape)) != k:
            raise ValueError(f"The {op_name} `p` must be one vector shared by all datapoints.")
        if op_name == "categorical":
            bound = float(k)
    else:
        shape = tuple(int(s) for s in varying.shape.eval())
        if int(np.prod(shape)) != 1:
            raise ValueError(
                f"The {op_name} parameter of {obs.name!r} must be one scalar shared by "
                "all datapoints (it has more than one value): use PenaltyMetropolis for "
                "regressions."
            )
    return RecognisedFamily(fam, tuple(const_full), bound, varying)
