"""The compiled per-step function: per-datapoint log-likelihood ratios, clipped and summed.

One compiled PyTensor call per step evaluates, at the proposal only, the per-datapoint
log-likelihood vector, the clipped sum of its differences from the current state's vector,
the number of clipped datapoints and the log prior (transform Jacobians and data-free
Potentials included), and returns only those scalars. Both per-datapoint vectors, the current
state's and the proposal's, live in the compiled function's storage (PyTensor shared
variables; the call writes the proposal's through ``updates``), never in the caller:
:meth:`PenaltyLikelihood.commit` makes the proposal's vector the current one on acceptance by
swapping two references, without copying. Caching the current state's vector halves the work
of a naive ``logp(theta') - logp(theta)``.

The outputs are exact and data-dependent: only :mod:`pymc_penalty.sampling.step` sees them, and only
after the release's privacy cost is committed; it releases them with noise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from pymc.logprob.utils import CheckParameterValue, local_remove_check_parameter
from pymc.pytensorf import compile as pm_compile
from pymc.pytensorf import join_nonshared_inputs, make_shared_replacements
from pytensor.compile.mode import Mode, get_mode
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.rewriting.basic import in2out
from pytensor.graph.traversal import ancestors
from pytensor.link.basic import JITLinker

from pymc_penalty.errors import DataChangedError, LikelihoodEvaluationError
from pymc_penalty.model.rewrites import (
    BRANCHLESS_SIGN_SWITCH,
    LIFT_UNARY_THROUGH_SWITCH,
    VECTORISED_SOFTPLUS,
)

__all__ = [
    "DataChangedError",
    "LikelihoodEvaluationError",
    "PenaltyLikelihood",
    "RowControl",
    "taylor_features",
    "clipped_ratio_sum",
    "likelihood_coordinates",
    "per_datapoint_terms",
    "step_mode",
]


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
    :func:`pymc_penalty.model.locality.check_row_locality` refuses.

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


class RowControl:
    """Per-row control variates subtracted from the per-datapoint log-likelihood.

    Each row's model ``m_i(x) = c_i . phi(w)``, ``w = L^{-1} (x - t)[index]``, with
    ``phi`` = :func:`taylor_features` (the first-order terms ``w``, then, for a second-order
    model, ``w_j^2 / 2`` and ``w_j w_k`` for ``j < k``). The step then clips and sums the rows'
    residuals ``[l_i(x') - m_i(x')] - [l_i(x) - m_i(x)]``
    (:mod:`pymc_penalty.privacy.taylor`). ``t`` and ``L`` are public; the coefficients
    ``c_i`` are per-row functions of row ``i`` alone (private, like the data: they live in
    the compiled function's storage and never in an output).

    Parameters
    ----------
    t : ndarray, shape (d,)
        Reference point on the raveled unconstrained space.
    L : ndarray, shape (d, d)
        Whitening factor (lower triangular, invertible).
    coef : ndarray, shape (n, k)
        Each row's coefficients: ``k = d`` (first order) or ``d + d (d + 1) / 2``, ``d`` the
        size of ``w``.
    index : ndarray of int, optional
        The coordinates of ``x`` the model lives on (``L`` is then ``d x d`` on them); None:
        every coordinate.
    """

    def __init__(
        self, t: np.ndarray, L: np.ndarray, coef: np.ndarray, index: np.ndarray | None = None
    ) -> None:
        self.t = np.asarray(t, dtype=np.float64)
        self.L = np.asarray(L, dtype=np.float64)
        self.coef = np.asarray(coef, dtype=np.float64)
        self.index = None if index is None else np.asarray(index, dtype=np.int64)
        d = self.L.shape[0]
        if (
            self.L.shape != (d, d)
            or self.coef.ndim != 2
            or (self.t.size != d if self.index is None else self.index.size != d)
        ):
            raise ValueError("RowControl: t, L and coef have inconsistent shapes")
        if self.coef.shape[1] not in (d, d + d * (d + 1) // 2):
            raise ValueError(f"RowControl: coef needs {d} or {d + d * (d + 1) // 2} columns")
        self.second_order = self.coef.shape[1] > d

    def values(self, w: np.ndarray) -> np.ndarray:
        """The rows' models at the whitened point ``w`` (NumPy), shape (n,): what
        :meth:`graph` computes inside the compiled likelihood."""
        d = self.L.shape[0]
        return self.coef @ taylor_features(np.asarray(w, dtype=float), d, self.second_order)

    def graph(self, flat: pt.TensorVariable) -> pt.TensorVariable:
        """The rows' models at ``flat`` as a graph, shape (n,)."""
        x = pt.cast(flat, "float64")
        t = self.t
        if self.index is not None:
            x, t = x[pt.constant(self.index)], t[self.index]
        L_inv = pt.constant(np.linalg.inv(self.L))
        w = pt.dot(L_inv, x - pt.constant(t))
        coef = pytensor.shared(self.coef, name="taylor_coef", shape=(None, self.coef.shape[1]))
        return pt.dot(coef, taylor_features(w, self.L.shape[0], self.second_order))


def taylor_features(w: Any, d: int, second_order: bool) -> Any:
    """``phi(w)``: ``w``, then ``w_j^2 / 2`` and ``w_j w_k`` (``j < k``) for a second-order model.

    Works on NumPy arrays (shape (d,) or (m, d)) and on PyTensor vectors alike, so a row's
    model ``c_i . phi(w)`` equals ``g_i . w + w' H_i w / 2`` with ``c_i = (g_i, H_i[iu])``
    (``iu``: the upper triangle, diagonal included, row by row).
    """
    if not second_order:
        return w
    j, k = np.triu_indices(d)
    half = np.where(j == k, 0.5, 1.0)
    if isinstance(w, np.ndarray):
        return np.concatenate([w, w[..., j] * w[..., k] * half], axis=-1)
    return pt.concatenate([w, w[j] * w[k] * pt.constant(half)])


def likelihood_coordinates(
    model: pm.Model, value_vars: Sequence[Variable], point: dict[str, np.ndarray]
) -> np.ndarray:
    """Which raveled coordinates the per-datapoint log-likelihood depends on (bool mask).

    A coordinate of a value variable that no observed variable's density reads (a
    hyperparameter seen only by the prior, such as a hierarchical model's group mean and
    scale) moves no row's log-likelihood. Model structure only, no data.
    """
    return _reading_mask(per_datapoint_terms(model), value_vars, point)


def _reading_mask(
    terms: Sequence[pt.TensorVariable],
    value_vars: Sequence[Variable],
    point: dict[str, np.ndarray],
) -> np.ndarray:
    """The raveled coordinates whose value variable is an ancestor of ``terms``."""
    reached = set(ancestors(terms))
    return np.concatenate(
        [np.full(np.size(point[v.name]), v in reached, dtype=bool) for v in value_vars]
    )


def step_mode(mode: str | Mode | None = None) -> Mode:
    """The compile mode of the step's likelihood: ``mode`` with the package's rewrites.

    Always the exact switch lift (evaluate ``f`` once in ``switch(c, f(a), f(b))``); on
    PyTensor's C backend also the branch-free ``switch(c, -a, a)`` (exact) and the vectorised
    softplus (NumPy's SIMD loops instead of scalar calls in the fused C loop). JIT backends
    (NUMBA, JAX) vectorise on their own and get only the lift. See
    :mod:`pymc_penalty.model.rewrites`.
    """
    resolved = get_mode(mode).including(LIFT_UNARY_THROUGH_SWITCH)
    if not isinstance(resolved.linker, JITLinker):
        resolved = resolved.including(BRANCHLESS_SIGN_SWITCH, VECTORISED_SOFTPLUS)
    return resolved


def clipped_ratio_sum(
    ll: pt.TensorVariable,
    ll_current: pt.TensorVariable,
    bound: pt.TensorVariable,
    segments: tuple[np.ndarray, int] | None = None,
) -> tuple[pt.TensorVariable, pt.TensorVariable]:
    """Graph of the clipped sum of the per-datapoint ratios and the number clipped.

    The ratios ``ll - ll_current`` are clipped to ``[-bound, bound]``. A NaN ratio is a row
    the likelihood cannot evaluate at either point (a NaN or infinite value, or a value
    outside a fixed support, so ``-inf - -inf``): it adds 0 and counts as clipped. Zero, not
    ``-bound``, keeps the released difference antisymmetric in the two points, as the
    penalty test's exactness needs, and lies inside ``[-bound, bound]``, so the sensitivity
    bound holds.

    Parameters
    ----------
    ll, ll_current : TensorVariable
        Per-datapoint log-likelihood vectors at the proposal and at the current state.
    bound : TensorVariable
        Scalar clip bound ``B`` (``inf`` for none), a runtime input.
    segments : tuple of (ndarray, int), optional
        ``(index, n_segments)``: per-segment sums and counts instead of totals.

    Returns
    -------
    clipped_sum, n_clipped : TensorVariable
        float64 and int64; scalars, or vectors of length ``n_segments``.
    """
    ratio = pt.cast(ll - ll_current, "float64")
    invalid = pt.isnan(ratio)
    ratio = pt.switch(invalid, 0.0, ratio)
    clipped = pt.clip(ratio, -bound, bound)
    over = pt.or_(pt.abs(ratio) > bound, invalid)
    if segments is None:
        return clipped.sum(), over.sum()
    index = pt.constant(np.asarray(segments[0], dtype=np.int64))
    n_seg = int(segments[1])
    clipped_sum = pt.inc_subtensor(pt.zeros(n_seg, dtype="float64")[index], clipped)
    counts = pt.zeros(n_seg, dtype="int64")[index]
    return clipped_sum, pt.inc_subtensor(counts, over.astype("int64"))


def _key(x: np.ndarray, dtype: np.dtype) -> bytes:
    """A state's identity: its bytes in the compiled input dtype."""
    return np.asarray(x, dtype=dtype).tobytes()


class PenaltyLikelihood:
    """Compiled evaluation of the clipped log-likelihood difference and the log prior.

    The step uses the cached interface: :meth:`reset` fills the current state's per-datapoint
    vector, :meth:`propose` evaluates a proposal against it and returns scalars only, and
    :meth:`commit` records the decision. Both vectors stay in the compiled function's storage.
    :meth:`initial` and :meth:`evaluate` take and return the vectors explicitly (for callers
    that keep their own caches); they run the same compiled function and leave no cached
    state behind, so :meth:`propose` refuses to run until :meth:`reset` is called again.

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
    control : RowControl, optional
        Per-row control variates: every per-datapoint value is then ``l_i - m_i``, so the
        ratios clipped and summed are the rows' residuals (the Taylor path).
    """

    def __init__(
        self,
        model: pm.Model,
        value_vars: Sequence[Variable],
        point: dict[str, np.ndarray],
        compile_kwargs: dict[str, Any] | None = None,
        segments: tuple[np.ndarray, int] | None = None,
        control: RowControl | None = None,
    ) -> None:
        obs_terms = per_datapoint_terms(model)
        #: Which raveled coordinates the rows' log-likelihood reads (model structure only:
        #: :func:`likelihood_coordinates` of this graph, built once).
        self.reads = _reading_mask(obs_terms, value_vars, point)
        per_point = obs_terms[0]
        for term in obs_terms[1:]:
            per_point = per_point + term
        prior = model.logp(vars=list(model.free_RVs) + list(model.potentials), jacobian=True)
        shared = make_shared_replacements(point, value_vars, model)
        (ll, logprior), flat = join_nonshared_inputs(
            point=point, outputs=[per_point, prior], inputs=value_vars, shared_inputs=shared
        )
        if control is not None:  # the rows' residuals after their Taylor models
            ll = pt.cast(ll, "float64") - control.graph(flat)
        # The two per-datapoint vectors: the current state's (read by the call) and the last
        # proposal's (written by it). Their length is set by the first reset or evaluate.
        empty = np.zeros(0, dtype=ll.dtype)
        ll_current = pytensor.shared(empty, name="ll_current", shape=(None,))
        ll_proposal = pytensor.shared(empty.copy(), name="ll_proposal", shape=(None,))
        bound = pt.dscalar("bound")
        clipped_sum, n_clipped = clipped_ratio_sum(ll, ll_current, bound, segments)
        self.segmented = segments is not None
        kwargs = dict(compile_kwargs or {})
        kwargs["mode"] = step_mode(kwargs.get("mode"))
        self._fn = pm_compile(
            [flat, bound],
            [clipped_sum, n_clipped, pt.cast(logprior, "float64")],
            updates={ll_proposal: ll},
            **kwargs,
        )
        self._fn.trust_input = True
        # The storage cells of the two vectors, found by position in the compiled function's
        # input storage (``_fn`` may be wrapped, e.g. by a test's spy; ``_function`` is not).
        self._function = self._fn
        # The log prior alone (no data: the gate refuses priors and Potentials that read
        # data), compiled on first use by :meth:`log_prior`.
        self._prior_graph = (flat, pt.cast(logprior, "float64"), kwargs)
        self._prior_fn: Any = None
        inputs = [i.variable for i in self._fn.maker.expanded_inputs]
        self._slots = (inputs.index(ll_current), inputs.index(ll_proposal))
        self._has_current = False
        self._pending = False
        # Which state the current vector belongs to, its log prior, and the data arrays it
        # was computed from (held, so a replaced array is told apart by identity).
        self._current_key: bytes | None = None
        self._proposal_key: bytes | None = None
        self._proposal_logprior = math.nan
        self.current_logprior = math.nan
        self._data_refs: tuple = ()
        # The gate (row locality, data recognition) ran on the data's shapes at construction;
        # pm.set_data or set_value may swap in arrays of another shape later. The layout is
        # checked again before each chain touches the data.
        self._shared = [v for v in ancestors([ll, logprior]) if isinstance(v, SharedVariable)]
        self._layout = _layout(self._shared)
        self.input_dtype = np.dtype(flat.dtype)
        self.ll_dtype = np.dtype(ll.dtype)

    # --- the compiled call -------------------------------------------------------------

    def _cells(self) -> tuple[list, list]:
        storage = self._function.input_storage
        return storage[self._slots[0]].storage, storage[self._slots[1]].storage

    def _call(self, x: np.ndarray, bound: float) -> tuple[Any, Any, float]:
        try:
            clipped_sum, n_clipped, logprior = self._fn(
                np.asarray(x, dtype=self.input_dtype), np.asarray(bound, np.float64)
            )
        except Exception as exc:
            self._has_current = self._pending = False
            # PyTensor's messages print input values, data constants among them.
            raise LikelihoodEvaluationError(
                f"Evaluating the model's log-likelihood failed ({type(exc).__name__}); the "
                "details are withheld because they may contain data values. Reproduce the "
                "failure outside PenaltyMetropolis (e.g. model.compile_logp()) to debug it."
            ) from None
        if self.segmented:
            return clipped_sum, n_clipped, float(logprior)
        return float(clipped_sum), int(n_clipped), float(logprior)

    # --- the cached interface (the step's) -----------------------------------------------

    def reset(self, x: np.ndarray, n: int) -> float:
        """Make ``x`` the current state: fill the cached vector; return the log prior at ``x``.

        Parameters
        ----------
        x : ndarray
            Raveled parameter vector (cast to the compiled input dtype).
        n : int
            Number of datapoints (the length of the per-datapoint vector).

        Returns
        -------
        float
            Log prior density at ``x`` with Jacobians and data-free Potentials.
        """
        self.check_layout()
        current, _ = self._cells()
        if current[0] is None or current[0].shape != (n,):
            current[0] = np.zeros(n, dtype=self.ll_dtype)
        self._has_current = self._pending = False
        _, _, logprior = self._call(x, np.inf)
        self._proposal_key, self._proposal_logprior = _key(x, self.input_dtype), logprior
        self._make_proposal_current()
        self._data_refs = self._data_arrays()
        return logprior

    def holds(self, x: np.ndarray) -> bool:
        """Whether the cached current vector is the one at ``x`` on the data as they are now.

        False after :meth:`initial`/:meth:`evaluate` or a failed call, for another state,
        and when a data container's array was replaced (``pm.set_data`` with the same shape,
        which the layout check cannot see): the step then calls :meth:`reset`. The state
        lives here, with the vector, so shallow copies of a step that share this object
        never compare against each other's state.
        """
        return (
            self._has_current
            and not self._pending
            and self._current_key == _key(x, self.input_dtype)
            and all(a is b for a, b in zip(self._data_arrays(), self._data_refs, strict=True))
        )

    def _data_arrays(self) -> tuple:
        return tuple(v.get_value(borrow=True) for v in self._shared)

    def propose(self, x: np.ndarray, bound: float) -> tuple[Any, Any, float]:
        """Evaluate the proposal ``x`` against the cached current state; scalars only.

        The proposal's per-datapoint vector is kept until :meth:`commit`.

        Parameters
        ----------
        x : ndarray
            Raveled parameter vector (cast to the compiled input dtype).
        bound : float
            Clip bound ``B`` (``inf`` for none).

        Returns
        -------
        clipped_sum : float (ndarray per segment when segmented)
            Sum of the ratios clipped to ``[-bound, bound]``.
        n_clipped : int (ndarray per segment when segmented)
            Number of ratios outside ``[-bound, bound]`` (NaN ratios included).
        logprior : float
            Log prior density at ``x`` with Jacobians and data-free Potentials.

        Raises
        ------
        RuntimeError
            Without a current state (no :meth:`reset` since construction, since a failed
            call or since :meth:`initial` or :meth:`evaluate`), or with a proposal that was
            not committed.
        """
        if not self._has_current or self._pending:
            raise RuntimeError(
                "PenaltyLikelihood.propose needs a current state (reset) and the previous "
                "proposal committed"
            )
        out = self._call(x, bound)
        self._pending = True
        self._proposal_key, self._proposal_logprior = _key(x, self.input_dtype), out[2]
        return out

    def commit(self, accepted: bool) -> None:
        """Record the decision on the last proposal: on acceptance its vector becomes current.

        Parameters
        ----------
        accepted : bool
        """
        if not self._pending:
            raise RuntimeError("PenaltyLikelihood.commit without a proposal to decide on")
        self._pending = False
        if accepted:
            self._make_proposal_current()

    def _make_proposal_current(self) -> None:
        # Each call writes a new array into the proposal's cell (also with allow_gc off:
        # tests/test_likelihood.py checks it), so swapping the references is enough.
        current, proposal = self._cells()
        current[0], proposal[0] = proposal[0], current[0]
        self._has_current = True
        self._current_key, self.current_logprior = self._proposal_key, self._proposal_logprior

    def log_prior(self, x: np.ndarray) -> float:
        """The log prior at ``x`` (Jacobians and data-free Potentials), without the
        likelihood: a function of no data. Compiled on first use."""
        if self._prior_fn is None:
            flat, logprior, kwargs = self._prior_graph
            self._prior_fn = pm_compile([flat], logprior, **kwargs)
        return float(self._prior_fn(np.asarray(x, dtype=self.input_dtype)))

    def shift_current(self, x: np.ndarray, logprior: float) -> None:
        """Make ``x`` the current state without evaluating the likelihood: valid only when
        ``x`` differs from the current state in coordinates no row's log-likelihood reads
        (:func:`likelihood_coordinates`), whose per-datapoint vector is then the same.

        Raises
        ------
        RuntimeError
            Without a current state, or with a proposal not committed.
        """
        if not self._has_current or self._pending:
            raise RuntimeError("PenaltyLikelihood.shift_current needs a committed current state")
        self._current_key, self.current_logprior = _key(x, self.input_dtype), float(logprior)

    # --- the explicit interface ----------------------------------------------------------

    def evaluate(
        self, x: np.ndarray, ll_current: np.ndarray, bound: float
    ) -> tuple[np.ndarray, Any, Any, float]:
        """Evaluate at the raveled point ``x`` against a given current vector.

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
        current, proposal = self._cells()
        self._has_current = self._pending = False
        current[0] = np.asarray(ll_current, dtype=self.ll_dtype)
        try:
            clipped_sum, n_clipped, logprior = self._call(x, bound)
        finally:
            current[0] = None  # the caller's array: not kept
        return proposal[0], clipped_sum, n_clipped, logprior

    def initial(self, x: np.ndarray, n: int) -> tuple[np.ndarray, float]:
        """Per-datapoint log-likelihood and log prior at ``x`` (to fill a cache)."""
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
