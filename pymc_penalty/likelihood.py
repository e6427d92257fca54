"""The compiled per-step function: per-datapoint log-likelihood ratios, clipped and summed.

One compiled PyTensor call per step evaluates, at the proposal only, the per-datapoint
log-likelihood vector (the current state's vector is passed in from a cache), the clipped
sum of the ratios, the number of clipped datapoints and the log prior (transform Jacobians
and data-free Potentials included). Returning the vector costs the same as returning its sum,
and caching it halves the work of a naive ``logp(theta') - logp(theta)``.

The outputs are exact and data-dependent: only :mod:`pymc_penalty.step` sees them, and only
after the release's privacy cost is committed; it releases them with noise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pymc.logprob.utils import CheckParameterValue, local_remove_check_parameter
from pymc.pytensorf import compile as pm_compile
from pymc.pytensorf import join_nonshared_inputs, make_shared_replacements
from pytensor.compile.mode import get_mode
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.rewriting.basic import in2out
from pytensor.graph.traversal import ancestors

from pymc_penalty.rewrites import LIFT_UNARY_THROUGH_SWITCH

__all__ = [
    "DataChangedError",
    "LikelihoodEvaluationError",
    "PenaltyLikelihood",
    "per_datapoint_terms",
]


class LikelihoodEvaluationError(RuntimeError):
    """The compiled likelihood failed; the original message is withheld (it may hold data)."""


class DataChangedError(ValueError):
    """A data container changed shape or dtype after the step's privacy checks ran."""


def _layout(shared: Sequence[Variable]) -> tuple[tuple[str, tuple[int, ...], str], ...]:
    """Name, shape and dtype of each shared variable's current value (no values)."""
    out = []
    for var in shared:
        value = np.asarray(var.get_value(borrow=True))
        out.append((str(var.name), value.shape, value.dtype.str))
    return tuple(out)


def _per_datapoint(term: pt.TensorVariable) -> pt.TensorVariable:
    """Sum an elementwise log-likelihood term over all axes but the leading (datapoint) one."""
    if term.ndim == 0:
        return term[None]
    if term.ndim == 1:
        return term
    return term.reshape((term.shape[0], -1)).sum(axis=1)


def per_datapoint_terms(model: pm.Model) -> list[pt.TensorVariable]:
    """Elementwise log-likelihood of each observed variable, one entry per datapoint.

    Trailing axes of an elementwise ``(n, k)`` term are summed; a term with no datapoint
    axis (one joint density over all rows) comes back as a length-1 vector, which
    :func:`pymc_penalty.locality.check_row_locality` refuses.

    PyMC's parameter checks are removed from these terms. PyMC reduces each check over all
    rows (``switch(all(sigma > 0), logp, -inf)``), so one record with an invalid covariate
    would set every datapoint's term to ``-inf``: one record would move all of them. Without
    the check an invalid row's term is NaN or infinite on its own, and the step counts it as
    clipped (its ratio becomes ``-B``). The prior keeps its checks.
    """
    terms = model.logp(vars=model.observed_RVs, sum=False)
    if any(
        var.owner is not None and isinstance(var.owner.op, CheckParameterValue)
        for var in ancestors(terms)
    ):
        # PyMC's own rewrite, applied outermost-first through the whole graph: checks nested
        # inside other checks' inputs (mixtures, zero-inflated likelihoods) go too.
        fgraph = FunctionGraph(outputs=terms, clone=False)
        in2out(local_remove_check_parameter).rewrite(fgraph)
        terms = list(fgraph.outputs)
    return [_per_datapoint(t) for t in terms]


class PenaltyLikelihood:
    """Compiled evaluation of the clipped log-likelihood difference and the log prior.

    Parameters
    ----------
    model : pm.Model
    value_vars : sequence of Variable
        Value variables of the raveled parameter vector, in order.
    point : dict
        A point giving the shapes of ``value_vars``.
    compile_kwargs : dict, optional
        Passed to :func:`pymc.pytensorf.compile` (e.g. ``mode``).
    segments : tuple of (ndarray, int), optional
        ``(index, n_segments)``: return the clipped sums and clip counts per segment (for
        instance per data owner) instead of their totals, computed in the same call.
    """

    def __init__(
        self,
        model: pm.Model,
        value_vars: Sequence[Variable],
        point: dict[str, np.ndarray],
        compile_kwargs: dict[str, Any] | None = None,
        segments: tuple[np.ndarray, int] | None = None,
    ) -> None:
        obs_terms = per_datapoint_terms(model)
        per_point = obs_terms[0]
        for term in obs_terms[1:]:
            per_point = per_point + term
        prior = model.logp(vars=list(model.free_RVs) + list(model.potentials), jacobian=True)
        shared = make_shared_replacements(point, value_vars, model)
        (ll, logprior), flat = join_nonshared_inputs(
            point=point, outputs=[per_point, prior], inputs=value_vars, shared_inputs=shared
        )
        ll_current = pt.vector("ll_current", dtype=ll.dtype)
        bound = pt.dscalar("bound")
        ratio = pt.cast(ll - ll_current, "float64")
        # A NaN ratio (both points impossible for a datapoint) counts as clipped at -bound.
        invalid = pt.isnan(ratio)
        ratio = pt.switch(invalid, -bound, ratio)
        clipped = pt.clip(ratio, -bound, bound)
        over = pt.or_(pt.abs(ratio) > bound, invalid)
        self.segmented = segments is not None
        if segments is None:
            clipped_sum, n_clipped = clipped.sum(), over.sum()
        else:
            index = pt.constant(np.asarray(segments[0], dtype=np.int64))
            n_seg = int(segments[1])
            clipped_sum = pt.inc_subtensor(pt.zeros(n_seg, dtype="float64")[index], clipped)
            counts = pt.zeros(n_seg, dtype="int64")[index]
            n_clipped = pt.inc_subtensor(counts, over.astype("int64"))
        kwargs = dict(compile_kwargs or {})
        # Exact: evaluate f once after selecting in switch(c, f(a), f(b)) (see rewrites.py).
        kwargs["mode"] = get_mode(kwargs.get("mode")).including(LIFT_UNARY_THROUGH_SWITCH)
        self._fn = pm_compile(
            [flat, ll_current, bound],
            [ll, clipped_sum, n_clipped, pt.cast(logprior, "float64")],
            **kwargs,
        )
        self._fn.trust_input = True
        # The gate (row locality, data recognition) ran on the data's shapes at construction;
        # pm.set_data or set_value may swap in arrays of another shape later. The layout is
        # checked again before each chain touches the data.
        self._shared = [v for v in ancestors([ll, logprior]) if isinstance(v, SharedVariable)]
        self._layout = _layout(self._shared)
        self.input_dtype = np.dtype(flat.dtype)
        self.ll_dtype = np.dtype(ll.dtype)

    def evaluate(
        self, x: np.ndarray, ll_current: np.ndarray, bound: float
    ) -> tuple[np.ndarray, Any, Any, float]:
        """Evaluate at the raveled point ``x`` against the cached current vector.

        Parameters
        ----------
        x : ndarray
            Raveled parameter vector (cast to the compiled input dtype).
        ll_current : ndarray
            Per-datapoint log-likelihood at the current state.
        bound : float
            Clip bound ``B`` (``inf`` for none).

        Returns
        -------
        ll : ndarray
            Per-datapoint log-likelihood at ``x``.
        clipped_sum : float (ndarray per segment when segmented)
            Sum of the ratios clipped to ``[-bound, bound]``.
        n_clipped : int (ndarray per segment when segmented)
            Number of ratios outside ``[-bound, bound]``.
        logprior : float
            Log prior density at ``x`` with Jacobians and data-free Potentials.
        """
        try:
            ll, clipped_sum, n_clipped, logprior = self._fn(
                np.asarray(x, dtype=self.input_dtype), ll_current, np.asarray(bound, np.float64)
            )
        except Exception as exc:
            # PyTensor's messages print input values, data constants among them.
            raise LikelihoodEvaluationError(
                f"Evaluating the model's log-likelihood failed ({type(exc).__name__}); the "
                "details are withheld because they may contain data values. Reproduce the "
                "failure outside PenaltyMetropolis (e.g. model.compile_logp()) to debug it."
            ) from None
        if self.segmented:
            return ll, clipped_sum, n_clipped, float(logprior)
        return ll, float(clipped_sum), int(n_clipped), float(logprior)

    def initial(self, x: np.ndarray, n: int) -> tuple[np.ndarray, float]:
        """Per-datapoint log-likelihood and log prior at ``x`` (to fill the cache)."""
        self.check_layout()
        ll, _, _, logprior = self.evaluate(x, np.zeros(n, dtype=self.ll_dtype), np.inf)
        return ll, logprior

    def check_layout(self) -> None:
        """Refuse data containers whose shape or dtype changed since construction.

        Reads shapes and dtypes only, never values: callers run it before spending.

        Raises
        ------
        DataChangedError
            When ``pm.set_data`` (or ``set_value``) changed a container's layout after the
            step was built and checked.
        """
        layout = _layout(self._shared)
        if layout != self._layout:
            changed = sorted({a[0] for a, b in zip(layout, self._layout, strict=True) if a != b})
            raise DataChangedError(
                f"Data containers {changed} changed shape or dtype after the step was "
                "constructed (pm.set_data?): its privacy checks ran on the old layout. "
                "Construct the step again after changing the data."
            )
