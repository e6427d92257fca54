"""The contamination mechanism: replace records, then model them with ``(1 - p) f + p g``.

``contaminate`` is the release-side randomisation (Hu et al., section 2.2): each response is
replaced, independently with probability ``rate``, by a draw from the public density g. The
mask of replaced records is secret; the generator is seeded by OS entropy unless the caller
passes a seed, which makes the contamination reproducible and therefore not private.

``contaminated_likelihood`` writes the contaminated likelihood into a PyMC model as an
*observed* variable (a ``pm.Mixture``, or a Bernoulli with the mixed probability), so that
prior and posterior predictive sampling, ``log_likelihood`` and the package's data stripping
treat it like any other likelihood.

No outcome depends on whether a record can be evaluated (issue 28: a refusal is a free answer
about the data). A record that g cannot evaluate (NaN, infinite, or outside g's public
support: a Bernoulli response coded 2) would make the mixture's log density ``-inf`` or NaN:
PyMC then imputed a NaN in a NumPy array (and the variable was refused as not observed), and
``pm.sample`` refused to start on an infinite one, printing the other terms' exact log
densities. Such a record is now modelled by g alone at a public point of g's support
(:func:`_evaluable`): its term is a constant, the same at every parameter value, so it moves
nothing, as a clipped row adds nothing to the penalty step's sum. The rows are chosen in the
graph from the data, whatever the data (no branch in Python reads a value).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pytensor.graph.basic import Variable
from pytensor.tensor.sharedvar import TensorSharedVariable

from pymc_penalty.contamination.densities import (
    BernoulliContamination,
    ContaminationDensity,
    StudentTContamination,
    TruncatedStudentT,
    check_rate,
)
from pymc_penalty.errors import ModelNotPrivateError, NotPrivateWarning

__all__ = ["contaminate", "contaminated_likelihood"]

#: Key under ``rv.tag`` that marks a likelihood built by :func:`contaminated_likelihood`.
TAG = "contamination"


def _check_density(density: Any) -> ContaminationDensity:
    if not isinstance(density, ContaminationDensity):
        raise TypeError(
            "`density` must be a ContaminationDensity (StudentTContamination, "
            "TruncatedStudentT or BernoulliContamination)."
        )
    return density


def contaminate(
    y: Any,
    rate: float,
    density: ContaminationDensity,
    covariates: Any = None,
    rng: Any = None,
    return_mask: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Replace each response, independently with probability ``rate``, by a draw from g.

    Parameters
    ----------
    y : array_like, shape (n,)
        The responses (one per record). Only these are replaced; covariates never are.
    rate : float
        Contamination probability p, in [0, 1] (public).
    density : ContaminationDensity
        The public density g (given the record's covariates when it uses them).
    covariates : array_like, shape (n, k), optional
        Covariates, read (never changed) when g depends on them.
    rng : None, int, SeedSequence or Generator, optional
        ``None`` (default) draws from a generator seeded by OS entropy. Anything else makes
        the contamination reproducible, hence **not private**: a ``NotPrivateWarning`` says so.
    return_mask : bool, default False
        Also return the boolean mask of replaced records. The mask is secret: whoever holds
        it can undo the contamination. Use it for testing only, never publish it.

    Returns
    -------
    numpy.ndarray or (numpy.ndarray, numpy.ndarray)
        The contaminated responses (a new array), and the mask if requested.
    """
    rate = check_rate(rate)
    density = _check_density(density)
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError("`y` must be one-dimensional: one response per record.")
    n = y.shape[0]
    density.check_public(n)
    x = None
    if covariates is not None:
        x = np.asarray(covariates, dtype=float)
        if x.shape[0] != n:
            raise ValueError("`covariates` must have one row per entry of `y`.")
    if density.uses_covariates and x is None:
        raise ValueError("This contamination density depends on covariates: pass `covariates`.")
    if rng is None:
        gen = np.random.default_rng()  # OS entropy
    else:
        warnings.warn(
            "contaminate(rng=...) is seeded: the contamination is reproducible and therefore "
            "not private. Leave `rng=None` for a release.",
            NotPrivateWarning,
            stacklevel=2,
        )
        gen = np.random.default_rng(rng)
    mask = gen.random(n) < rate
    discrete = isinstance(density, BernoulliContamination)
    out = y.copy() if (discrete or y.dtype.kind == "f") else y.astype(float)
    k = int(mask.sum())
    if k:
        xs = None if x is None else x[mask]
        out[mask] = density.rvs(k, x=xs, rng=gen)
    return (out, mask) if return_mask else out


def _n_rows(observed: Any) -> int:
    if isinstance(observed, TensorSharedVariable):
        shape = np.shape(observed.get_value(borrow=True))
    elif isinstance(observed, Variable):
        shape = tuple(int(s) for s in observed.shape.eval())
    else:
        shape = np.shape(observed)
    return int(shape[0]) if shape else 1


def _inside(density: ContaminationDensity, covariates: Any) -> Any:
    """A public point of g's support (per row when g's location reads the covariates)."""
    if isinstance(density, BernoulliContamination):
        return 0.0
    if isinstance(density, TruncatedStudentT):
        return float(np.clip(density.loc, density.lower, density.upper))
    if isinstance(density, StudentTContamination):
        return density.location(covariates, symbolic=True)
    return 0.0


def _evaluable(
    density: ContaminationDensity, observed: Any, covariates: Any
) -> tuple[pt.TensorVariable, pt.TensorVariable]:
    """``(observed with every record g cannot evaluate replaced by a public point of g's
    support, the mask of those records)``, both graphs of the data (no value is read here).

    A record is replaced when it is not finite or g's log density there is not finite (it is
    outside g's public support). Every other record has a finite mixture density wherever
    ``rate > 0``, since g > 0 there. The mask reads the data and g's public parameters only,
    never a model parameter.
    """
    y = pt.as_tensor_variable(observed)
    if y.dtype not in ("float32", "float64"):
        y = pt.cast(y, "float64")
    inside = pt.as_tensor_variable(_inside(density, covariates))
    finite = ~(pt.isnan(y) | pt.isinf(y))
    probe = pt.where(finite, y, inside)  # g's log density where it can be computed
    log_g = pm.logp(density.pm_dist(covariates), probe)
    bad = ~finite | pt.isnan(log_g) | pt.isinf(log_g)
    return pt.where(bad, inside, y), bad


def _bernoulli_p(base_dist: pt.TensorVariable) -> pt.TensorVariable | None:
    """The success probability of a Bernoulli ``.dist``, or None for any other distribution."""
    owner = base_dist.owner
    if owner is None or getattr(owner.op, "name", None) != "bernoulli":
        return None
    return owner.op.dist_params(owner)[0]


def contaminated_likelihood(
    name: str,
    base_dist: pt.TensorVariable,
    density: ContaminationDensity,
    rate: float,
    observed: Any,
    *,
    covariates: Any = None,
    **kwargs: Any,
) -> pt.TensorVariable:
    """The contaminated likelihood ``(1 - rate) f + rate g`` as an observed variable.

    Parameters
    ----------
    name : str
        Name of the observed variable.
    base_dist : TensorVariable
        The model density f as an unregistered distribution, e.g.
        ``pm.Normal.dist(mu=X @ beta, sigma=1)`` or ``pm.Bernoulli.dist(logit_p=X @ beta)``.
    density : ContaminationDensity
        The public contamination density g.
    rate : float
        The public contamination rate p, in [0, 1].
    observed : array_like or pm.Data
        The (contaminated) responses, one per record.
    covariates : array_like or pm.Data, optional
        Passed to ``density.pm_dist`` when g depends on the covariates (row i for record i).
    **kwargs
        Passed to the PyMC distribution (``dims``, ``shape``...).

    Returns
    -------
    TensorVariable
        The observed variable: a ``pm.Mixture`` of f and g (its log-density is a stable
        log-sum-exp), or, for a Bernoulli f and a :class:`BernoulliContamination` g, a
        ``pm.Bernoulli`` with ``p = (1 - rate) p_f + rate q``. Never a Potential. A record
        g cannot evaluate (NaN, infinite or outside g's support) is observed at a public
        point of g's support with g's weight 1 (``p = q``): its term is a constant, the
        same at every parameter value, and nothing is refused (see the module docstring).
        The observed value is then a graph of the data (``observed`` with those records
        replaced), not ``observed`` itself.

    Raises
    ------
    ModelNotPrivateError
        If a parameter of g carries records or depends on the model's data.
    """
    rate = check_rate(rate)
    density = _check_density(density)
    model = pm.modelcontext(None)
    n = _n_rows(observed)
    density.check_public(n)
    if density.uses_covariates and covariates is None:
        raise ValueError("This contamination density depends on covariates: pass `covariates`.")
    p_f = _bernoulli_p(base_dist)
    if isinstance(density, BernoulliContamination) and p_f is None:
        raise ValueError(
            "A BernoulliContamination needs a Bernoulli `base_dist` (pm.Bernoulli.dist)."
        )
    # Records g cannot evaluate: observed at a point of g's support, by g alone (a constant).
    safe, bad = _evaluable(density, observed, covariates)
    if isinstance(density, BernoulliContamination):
        p = pt.where(bad, density.q, (1.0 - rate) * p_f + rate * density.q)
        rv = pm.Bernoulli(name, p=p, observed=safe, **kwargs)
    else:
        g = density.pm_dist(covariates)
        w = pt.stack([pt.where(bad, 0.0, 1.0 - rate), pt.where(bad, 1.0, rate)], axis=-1)
        rv = pm.Mixture(name, w=w, comp_dists=[base_dist, g], observed=safe, **kwargs)
    if not isinstance(rv, Variable) or rv not in model.observed_RVs:
        raise ModelNotPrivateError(f"`{name}` did not become an observed variable.")
    setattr(
        rv.tag,
        TAG,
        {"rate": rate, "density": type(density).__name__, "params": density.params},
    )
    return rv
