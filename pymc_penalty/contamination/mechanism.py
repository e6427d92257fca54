"""The contamination mechanism: replace records, then model them with ``(1 - p) f + p g``.

``contaminate`` is the release-side randomisation (Hu et al., section 2.2): each response is
replaced, independently with probability ``rate``, by a draw from the public density g. The
mask of replaced records is secret; the generator is seeded by OS entropy unless the caller
passes a seed, which makes the contamination reproducible and therefore not private.

``contaminated_likelihood`` writes the contaminated likelihood into a PyMC model as an
*observed* variable (a ``pm.Mixture``, or a Bernoulli with the mixed probability), so that
prior and posterior predictive sampling, ``log_likelihood`` and the package's data stripping
treat it like any other likelihood.
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
        ``pm.Bernoulli`` with ``p = (1 - rate) p_f + rate q``. Never a Potential.

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
    if isinstance(density, BernoulliContamination):
        if p_f is None:
            raise ValueError(
                "A BernoulliContamination needs a Bernoulli `base_dist` (pm.Bernoulli.dist)."
            )
        p = (1.0 - rate) * p_f + rate * density.q
        rv = pm.Bernoulli(name, p=p, observed=observed, **kwargs)
    else:
        g = density.pm_dist(covariates)
        w = np.array([1.0 - rate, rate])
        rv = pm.Mixture(name, w=w, comp_dists=[base_dist, g], observed=observed, **kwargs)
    if not isinstance(rv, Variable) or rv not in model.observed_RVs:
        raise ModelNotPrivateError(f"`{name}` did not become an observed variable.")
    setattr(
        rv.tag,
        TAG,
        {"rate": rate, "density": type(density).__name__, "params": density.params},
    )
    return rv
