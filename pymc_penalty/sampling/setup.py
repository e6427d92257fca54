"""What a penalty step checks and declares before it runs: arguments, warnings, statistics.

Pure checks on the constructor's arguments (before any model analysis, compilation or
ledger), the step's warnings, and the declaration of its extra sample statistics. Shared by
:class:`pymc_penalty.sampling.step.PenaltyMetropolis` and the variants.
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import pymc as pm
from pymc.step_methods.metropolis import MultivariateNormalProposal, NormalProposal

from pymc_penalty.errors import (
    InvalidArgumentError,
    NotPrivateWarning,
    PlanMismatchWarning,
    UnpublishedResultWarning,
)
from pymc_penalty.model.likelihood import step_mode
from pymc_penalty.privacy.budget import PrivacyBudget, RunPlan
from pymc_penalty.sampling.options import (
    DEFAULT_ADAPT_WINDOW,
    TUNE_INTERVAL_RENAMED,
    check_no_other_keywords,
    group_step_options,
)
from pymc_penalty.validation import check_integer, check_step_arguments

__all__ = [
    "CLIP_STAT",
    "DEFAULT_ADAPT_WINDOW",
    "DEFAULT_PLAN",
    "PlanMismatchWarning",
    "PROPOSAL_STAT",
    "Ledger",
    "NotPrivateWarning",
    "UnpublishedResultWarning",
    "begin_step",
    "check_blocked",
    "check_budget_ledger",
    "check_noise_arguments",
    "check_positive",
    "check_top_arguments",
    "check_proposal_dist",
    "check_proposal_shape",
    "check_step_kwargs",
    "declare_clip_stat",
    "declare_proposal_stat",
    "parse_budget",
    "resolve_adapt_window",
    "warn_data_deterministics",
    "warn_not_private",
]

#: Name of the sample statistic that records each step's proposal.
PROPOSAL_STAT = "proposal"


def pymc_default_chains() -> int:
    """The chains ``pm.sample`` runs when given neither ``chains`` nor ``cores``:
    ``max(2, min(4, CPU cores))`` (PyMC 5's rule, with its own CPU count)."""
    try:
        from pymc.sampling.parallel import _cpu_count
    except ImportError:  # pragma: no cover - PyMC moved it
        cores = os.cpu_count() or 1
    else:
        cores = _cpu_count()
    return max(2, min(4, int(cores)))


#: The plan a budgeted step assumes when given none: ``pm.sample``'s defaults on this
#: machine, 1000 draws, 1000 tuning steps and :func:`pymc_default_chains` chains (a step
#: that assumed 4 left half its budget unspent under ``pm.sample(step=step)`` on 2 cores).
DEFAULT_PLAN = RunPlan(draws=1000, tune=1000, chains=pymc_default_chains())


class Ledger(Protocol):
    """What the step needs from a privacy ledger."""

    def try_spend(self, mu2: float) -> bool:
        """Commit the cost ``mu2`` of one release; False (nothing committed) if over budget."""


def check_positive(name: str, value: float | None, *, allow_none: bool = False) -> None:
    if value is None:
        if allow_none:
            return
        raise ValueError(f"`{name}` is required.")
    try:
        fval = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"`{name}` must be a finite positive number.") from None
    if not np.isfinite(fval) or fval <= 0.0:
        raise ValueError(f"`{name}` must be a finite positive number, in (0, inf).")


def _budget_number(name: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        accepted = "(0, inf)" if name == "epsilon" else "(0, 1)"
        raise ValueError(f"`{name}` must be a real number in {accepted}.") from None


def parse_budget(
    epsilon: Any, delta: Any, plan: Any, mu: Any, noise_sd: Any
) -> tuple[PrivacyBudget | None, RunPlan | None]:
    """Check that exactly one noise specification is given; return the budget and plan."""
    given = [
        name
        for name, present in (
            ("a budget (`epsilon`, `delta`)", epsilon is not None or delta is not None),
            ("`mu`", mu is not None),
            ("`noise_sd`", noise_sd is not None),
        )
        if present
    ]
    if len(given) != 1:
        raise ValueError(
            "Give exactly one of a budget (`epsilon` in (0, inf) and `delta` in (0, 1)), `mu` "
            "(per-step Gaussian-DP parameter) and `noise_sd` (fixed noise sd); got "
            + (" and ".join(given) if given else "none")
            + "."
        )
    if epsilon is None and delta is None:
        if plan is not None:
            raise ValueError("`plan` is used only with a budget (`epsilon` and `delta`).")
        return None, None
    if epsilon is None or delta is None:
        raise ValueError("A budget needs both `epsilon` (in (0, inf)) and `delta` (in (0, 1)).")
    budget = PrivacyBudget(_budget_number("epsilon", epsilon), _budget_number("delta", delta))
    if plan is None:
        plan = DEFAULT_PLAN
    elif not isinstance(plan, RunPlan):
        raise ValueError("`plan` must be a pymc_penalty.RunPlan(draws, tune, chains).")
    return budget, plan


def check_blocked(blocked: Any) -> None:
    """Refuse ``blocked=False`` with the reason (one release per step for all variables).

    Raises
    ------
    InvalidArgumentError
    """
    if not blocked:
        raise InvalidArgumentError(
            "`blocked` must be True: a penalty step makes one private release per step, for a "
            "move of all its variables together. With blocked=False PyMC would run one step "
            "per variable, each a release of the same data: that many times the privacy cost "
            "per draw. Sample all free variables with one penalty step."
        )


def begin_step(
    step: Any, model: Any, blocked: Any, keywords: dict[str, Any], groups: tuple[str, ...]
) -> tuple[Any, dict[str, Any]]:
    """What every penalty step does first: its model (the context's by default), the refusal
    of ``blocked=False``, and its ``keywords`` (its groups and the old keywords) grouped
    (:func:`~pymc_penalty.sampling.options.group_step_options`; anything else refused).

    Raises
    ------
    InvalidArgumentError
    """
    model = pm.modelcontext(model)
    check_blocked(blocked)
    grouped = group_step_options(keywords, groups=groups)
    check_no_other_keywords(grouped, type(step).__name__, accepted=groups)
    return model, grouped


def resolve_adapt_window(adapt_window: Any, tune_interval: Any) -> int:
    """The adaptation window from ``adapt_window`` or its deprecated name ``tune_interval``
    (the arguments of :func:`pymc_penalty.distributed.sample`; the steps take
    ``ProposalPolicy.adapt_window``, :mod:`pymc_penalty.sampling.options`).

    In ``pm.Metropolis``, ``tune_interval`` is the number of steps between updates of the
    scaling; in the penalty steps it has always been the length of the first
    covariance-adaptation window (windows then double, and the scaling adapts every step),
    so it is renamed ``adapt_window``. ``tune_interval`` still works, with a
    ``FutureWarning``, and means what it meant.

    Raises
    ------
    InvalidArgumentError
        Both given, or the value given is not an integer >= 1 (naming the argument).
    """
    if tune_interval is None:
        return check_integer(
            "adapt_window", DEFAULT_ADAPT_WINDOW if adapt_window is None else adapt_window, low=1
        )
    if adapt_window is not None:
        raise InvalidArgumentError(
            "Give `adapt_window` only: `tune_interval` is its deprecated name."
        )
    window = check_integer("tune_interval", tune_interval, low=1)
    warnings.warn(
        TUNE_INTERVAL_RENAMED + " It will be removed in a future release.",
        FutureWarning,
        stacklevel=3,
    )
    return window


def check_budget_ledger(ledger: Any, budget: PrivacyBudget) -> None:
    """A ledger passed with a budget must enforce at most that budget."""
    if not all(hasattr(ledger, name) for name in ("budget_mu", "budget_mu2", "remaining_mu2")):
        raise ValueError(
            "`ledger` given with a budget must be a pymc_penalty.PrivacyLedger (it is read for "
            "what is left to spend)."
        )
    if float(ledger.budget_mu) > budget.mu * (1.0 + 1e-12):
        raise ValueError(
            "`ledger`'s budget is larger than the step's (`epsilon`, `delta`): the step could "
            "then spend more than its budget. Use a ledger created with budget.mu, or omit "
            "`ledger`."
        )


#: Sample statistic holding the clip constant when it is found in tuning (``clip="auto"``).
CLIP_STAT = "dp_clip"


def declare_proposal_stat(step: Any, size: int) -> None:
    """Give the step's ``proposal`` statistic its length (the raveled parameter size).

    The proposal is the current state plus a move drawn from the step's own generator (no data
    enter it), so recording it releases nothing new; :mod:`pymc_penalty.results.recycling` uses it.
    PyMC's default (NDArray) trace stores a non-scalar statistic only with dtype ``object``;
    its InferenceData conversion stacks the entries into a float array with dims
    ``(chain, draw, proposal_dim_0)``.
    """
    _declare_stat(step, PROPOSAL_STAT, object, [int(size)])


def declare_clip_stat(step: Any) -> None:
    """Add the ``dp_clip`` statistic: the clip constant in force at each step (public, found
    from released counts), so the tuned value is in the trace of every chain and process."""
    _declare_stat(step, CLIP_STAT, np.float64, [])


def _declare_stat(step: Any, name: str, dtype: Any, shape: list) -> None:
    """Add (or reshape) one statistic of this step instance."""
    shapes = dict(step.stats_dtypes_shapes)
    shapes[name] = (dtype, shape)
    step.stats_dtypes_shapes = shapes
    step.stats_dtypes = [{key: dt for key, (dt, _) in shapes.items()}]


def check_proposal_dist(proposal_dist: Any) -> None:
    """Check ``proposal_dist`` (the proposal's other options are checked by
    :class:`~pymc_penalty.ProposalPolicy`).

    Raises
    ------
    ValueError
        Naming the argument and the accepted values.
    """
    if proposal_dist not in (None, NormalProposal, MultivariateNormalProposal):
        raise ValueError(
            "`proposal_dist` must be pm.NormalProposal or pm.MultivariateNormalProposal: "
            "the penalty test needs a symmetric proposal with a known density."
        )


#: Step arguments ``pymc_penalty.sample`` sets itself (not accepted in its ``step_kwargs``).
SET_BY_SAMPLE = frozenset({"epsilon", "delta", "plan", "ledger", "model", "vars", "noise_sd", "mu"})

#: Fields of the step's groups that ``pymc_penalty.sample`` sets from its own arguments
#: (group -> field -> argument): a group in its ``step_kwargs`` leaves them at their defaults.
SET_BY_SAMPLE_FIELDS = {
    "clip": {"value": "clip", "mode": "clip_mode", "count_share": "clip_count_share"},
    "privacy": {"neighbours": "neighbours", "min_rows": "min_rows"},
}


def check_step_kwargs(step_kwargs: Any, step_class: type, point: Mapping[str, Any]) -> None:
    """``pymc_penalty.sample``'s ``step_kwargs`` (its old keywords already grouped:
    :func:`~pymc_penalty.sampling.options.group_step_options`), checked as ``step_class``
    checks them but before anything is spent (the warm start spends before the step is
    built): unknown names and the ones ``sample`` sets, the group fields it sets, and the
    step's top-level arguments (:func:`check_top_arguments`; ``point``: the model's initial
    point).

    Raises
    ------
    InvalidArgumentError or ValueError
        Naming the argument and the accepted range.
    """
    kwargs = dict(step_kwargs or {})
    params = inspect.signature(step_class.__init__).parameters
    named = {k for k, p in params.items() if p.kind is not inspect.Parameter.VAR_KEYWORD}
    unknown = sorted(set(kwargs) - (named - {"self"} - SET_BY_SAMPLE))
    if unknown:
        raise InvalidArgumentError(
            f"`step_kwargs` has {unknown}: not arguments of {step_class.__name__} that "
            f"pymc_penalty.sample passes on (it sets {sorted(SET_BY_SAMPLE)} itself)."
        )
    for group, fields in SET_BY_SAMPLE_FIELDS.items():
        policy = kwargs.get(group)
        if policy is None:
            continue
        default = type(policy)()
        for field, argument in fields.items():
            if getattr(policy, field) != getattr(default, field):
                raise InvalidArgumentError(
                    f"`step_kwargs` sets {type(policy).__name__}.{field}, which "
                    f"pymc_penalty.sample sets from its own `{argument}`: pass it there."
                )
    check_top_arguments(kwargs, point)


def check_top_arguments(kwargs: Mapping[str, Any], point: Mapping[str, Any]) -> None:
    """The step's top-level arguments that the step itself would check only after a budgeted
    step or ``pymc_penalty.sample`` has spent (on its screen, warm start and one-shot): the
    proposal's distribution, the shape of ``S`` and ``scaling`` (``point``: the model's
    initial point, for the raveled size), ``tune``, ``blocked``, ``rng``, ``initial_point``
    (every value variable, its size) and ``compile_kwargs``' mode.

    Raises
    ------
    InvalidArgumentError or ValueError
        Naming the argument and the accepted range.
    """
    size = int(sum(np.size(v) for v in point.values()))
    check_proposal_dist(kwargs.get("proposal_dist"))
    if kwargs.get("S") is not None:
        check_proposal_shape(kwargs["S"], size)
    if "scaling" in kwargs:
        check_step_arguments(scaling=kwargs["scaling"])
    if not isinstance(kwargs.get("tune", True), bool | np.bool_):
        raise InvalidArgumentError(f"`tune` must be True or False; got {_type(kwargs['tune'])}.")
    check_blocked(kwargs.get("blocked", True))
    rng = kwargs.get("rng")
    if rng is not None:
        try:
            np.random.default_rng(rng)
        except (TypeError, ValueError):
            raise InvalidArgumentError(
                "`rng` must be None, an integer seed, a SeedSequence or a numpy Generator; "
                f"got {_type(rng)}."
            ) from None
    given = kwargs.get("initial_point")
    if given is not None:
        if not isinstance(given, Mapping) or any(
            name not in given or np.size(given[name]) != np.size(value)
            for name, value in point.items()
        ):
            raise InvalidArgumentError(
                "`initial_point` must map every value variable "
                f"({sorted(point)}) to a value of its size, as model.initial_point() does."
            )
    compile_kwargs = kwargs.get("compile_kwargs")
    if compile_kwargs is not None:
        if not isinstance(compile_kwargs, Mapping):
            raise InvalidArgumentError(
                f"`compile_kwargs` must be a dict or None; got {_type(compile_kwargs)}."
            )
        try:
            step_mode(compile_kwargs.get("mode"))
        except (TypeError, ValueError, KeyError):
            raise InvalidArgumentError(
                "`compile_kwargs['mode']` must be a PyTensor mode or its name (e.g. 'FAST_RUN', "
                "'NUMBA', 'JAX')."
            ) from None


def _type(value: Any) -> str:
    return f"a {type(value).__name__}"


def check_proposal_shape(S: Any, size: int) -> np.ndarray:
    """``S`` as a float array: sds of shape ``(size,)`` or a covariance ``(size, size)``.

    Raises
    ------
    ValueError
        Wrong shape, or not finite.
    """
    S = np.asarray(S, dtype=np.float64)
    if S.ndim == 1 and S.shape != (size,) or S.ndim == 2 and S.shape != (size, size):
        raise ValueError(f"`S` must have shape ({size},) (sds) or ({size}, {size}) (covariance).")
    if S.ndim not in (1, 2) or not np.all(np.isfinite(S)):
        raise ValueError("`S` must be a finite 1-D or 2-D array.")
    return S


def warn_not_private(*, budget: Any, ledger: Any, clip: Any, reproducible_noise: bool) -> None:
    """The step's warnings about what its configuration does not protect (``stacklevel``
    points at the step's constructor's caller)."""
    if budget is None and ledger is None:
        warnings.warn(
            "PenaltyMetropolis without a budget or a ledger is NOT differentially private "
            "as a whole: its releases are unlimited and nothing composes them. Give "
            "`epsilon` and `delta` instead of `mu` or `noise_sd`.",
            NotPrivateWarning,
            stacklevel=3,
        )
    if budget is not None:
        warnings.warn(
            "pm.sample's InferenceData from this step holds observed_data, constant_data, "
            "log_likelihood and data-dependent Deterministics, and has no privacy report: "
            "publish only what pymc_penalty.finalize(idata, step) returns.",
            UnpublishedResultWarning,
            stacklevel=3,
        )
    if clip is None:
        warnings.warn(
            "PenaltyMetropolis with clip=None is exact but NOT differentially private: "
            "the sensitivity of the log-likelihood difference is unbounded.",
            NotPrivateWarning,
            stacklevel=3,
        )
    if reproducible_noise:
        warnings.warn(
            "reproducible_noise=True draws the privacy noise from a seeded generator: "
            "the run is reproducible and NOT differentially private.",
            NotPrivateWarning,
            stacklevel=3,
        )


def check_noise_arguments(
    epsilon: Any, delta: Any, plan: Any, mu: Any, noise_sd: Any, clip: Any, ledger: Any
) -> tuple[PrivacyBudget | None, RunPlan | None]:
    """Check the noise specification (exactly one of a budget, ``mu`` and ``noise_sd``) against
    the clip and the ledger; return the budget and plan (both None without a budget).

    Raises
    ------
    ValueError
        Naming the argument and the accepted range.
    """
    budget, plan = parse_budget(epsilon, delta, plan, mu, noise_sd)
    check_positive("noise_sd", noise_sd, allow_none=True)
    check_positive("mu", mu, allow_none=True)
    if mu is not None and clip is None:
        raise ValueError("`mu` needs a finite `clip`: with clip=None the sensitivity is inf.")
    if budget is not None and clip is None:
        raise ValueError(
            "A budget (`epsilon`, `delta`) needs a finite `clip`: with clip=None the "
            "sensitivity is inf."
        )
    if budget is not None and ledger is not None:
        check_budget_ledger(ledger, budget)
    return budget, plan


def warn_data_deterministics(leaky: list[str]) -> None:
    """Warn that pm.sample would store the exact values of these data-dependent
    Deterministics (``stacklevel`` points at the step's constructor's caller)."""
    if leaky:
        warnings.warn(
            f"Deterministics {leaky} depend on data (or read a constant array, which could "
            "hold records); pm.sample stores their exact values in the trace. Remove them, "
            "or strip them before publishing the result.",
            NotPrivateWarning,
            stacklevel=3,
        )
