"""Argument validation for every public entry point, before anything is spent.

One module, so that a bad argument is refused with the same message wherever it is passed:
:func:`pymc_penalty.sample`, :class:`~pymc_penalty.PenaltyMetropolis`, :func:`calibrate`, the
accounting functions, :func:`forecast_utility`, :func:`private_warm_start`,
:func:`sample_contaminated` and the diagnostics helpers all call the checkers below before
they compile a graph, open a ledger or charge it.

Messages name the argument and the accepted range or type. They may quote the value of an
*argument* (a budget, a number of draws: the caller's own settings) but never data. Checks
of a model's structure are the model gate's (:mod:`pymc_penalty.model.checks`), so the pure
accounting layer that uses these checkers sits below the gate.

Nothing here, nor in the gate, reads a data value. A refusal spends nothing, so a refusal
that depended on the data would be a free answer about it: a support check
(``observed=np.round(y - c)`` under a Poisson) bisects a record in a few dozen constructions
(issue 28). A NaN, an infinite value or a value outside the likelihood's support is a row the
likelihood cannot evaluate: its ratio adds 0 and counts as clipped
(:func:`pymc_penalty.model.likelihood.clipped_ratio_sum`), and :func:`pymc_penalty.sample`
tells the user about systematic errors through a charged, noisy count of such rows
(:mod:`pymc_penalty.model.screen`).
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from pymc_penalty.errors import InvalidArgumentError

__all__ = [
    "CLIP_AUTO",
    "NEIGHBOUR_NAMES",
    "check_budget",
    "check_choice",
    "check_clip",
    "check_integer",
    "check_ledger",
    "check_method",
    "check_plan",
    "check_real",
    "check_sample_arguments",
    "check_share",
    "check_step_arguments",
    "check_taylor_arguments",
]


def _interval(low: float, high: float, low_open: bool, high_open: bool) -> str:
    lb = "(" if low_open or low == -math.inf else "["
    rb = ")" if high_open or high == math.inf else "]"
    return f"{lb}{low:g}, {high:g}{rb}"


def _got(value: Any) -> str:
    """The argument's type, and its value where that is a short scalar (never an array)."""
    if isinstance(value, str | numbers.Number | bool) or value is None:
        text = repr(value)
        if len(text) <= 40:
            return f"got {text}"
    return f"got a {type(value).__name__}"


def check_real(
    name: str,
    value: Any,
    *,
    low: float = -math.inf,
    high: float = math.inf,
    low_open: bool = False,
    high_open: bool = False,
    finite: bool = True,
) -> float:
    """``value`` as a float, after checking it is a real number in the stated interval.

    Strings, booleans and arrays of more than one element are refused (a 0-d array is
    accepted).

    Raises
    ------
    InvalidArgumentError
    """
    accepted = _interval(low, high, low_open, high_open)
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise InvalidArgumentError(f"`{name}` must be a real number in {accepted}; {_got(value)}.")
    x = float(value)
    ok = not math.isnan(x) and (math.isfinite(x) or not finite)
    ok = ok and (x > low if low_open else x >= low) and (x < high if high_open else x <= high)
    if not ok:
        raise InvalidArgumentError(
            f"`{name}` must be a {'finite ' if finite else ''}real number in {accepted}; "
            f"{_got(value)}."
        )
    return x


def check_integer(name: str, value: Any, *, low: int = 0) -> int:
    """``value`` as an int, after checking it is an integer (not a float, not a bool)
    ``>= low``.

    Raises
    ------
    InvalidArgumentError
    """
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Integral):
        raise InvalidArgumentError(f"`{name}` must be an integer >= {low}; {_got(value)}.")
    if value < low:
        raise InvalidArgumentError(f"`{name}` must be an integer >= {low}; {_got(value)}.")
    return int(value)


def _integer_or_auto(name: str, value: Any, *, low: int) -> int:
    """``value`` as an int ``>= low`` (``low`` for ``"auto"``); the error names ``"auto"`` as
    accepted too."""
    if isinstance(value, str) and value == "auto":
        return low
    try:
        return check_integer(name, value, low=low)
    except InvalidArgumentError:
        raise InvalidArgumentError(
            f'`{name}` must be an integer >= {low} or "auto"; {_got(value)}.'
        ) from None


def check_choice(name: str, value: Any, options: tuple[str, ...]) -> str:
    """``value`` after checking it is one of ``options`` (strings).

    Raises
    ------
    InvalidArgumentError
    """
    if not isinstance(value, str) or value not in options:
        raise InvalidArgumentError(f"`{name}` must be one of {options}; {_got(value)}.")
    return value


def check_ledger(ledger: Any, name: str = "ledger") -> Any:
    """A privacy ledger: anything with ``try_spend`` (a :class:`~pymc_penalty.PrivacyLedger`)."""
    if not callable(getattr(ledger, "try_spend", None)):
        raise InvalidArgumentError(
            f"`{name}` must be a pymc_penalty.PrivacyLedger (anything with try_spend); "
            f"{_got(ledger)}."
        )
    return ledger


def check_share(name: str, value: Any) -> float:
    """A share of a budget, in ``[0, 1)``."""
    return check_real(name, value, low=0.0, high=1.0, high_open=True)


def check_budget(epsilon: Any, delta: Any) -> tuple[float, float]:
    """An ``(epsilon, delta)`` budget: ``epsilon`` finite and ``> 0``, ``0 < delta < 1``."""
    eps = check_real("epsilon", epsilon, low=0.0, low_open=True)
    dlt = check_real("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
    return eps, dlt


def check_plan(draws: Any, tune: Any, chains: Any) -> tuple[int, int, int]:
    """A sampling plan: ``draws >= 1``, ``tune >= 0``, ``chains >= 1``, all integers."""
    return (
        check_integer("draws", draws, low=1),
        check_integer("tune", tune, low=0),
        check_integer("chains", chains, low=1),
    )


#: ``clip`` may be this string where a caller chooses the constant during tuning.
CLIP_AUTO = "auto"


def check_clip(clip: Any, *, allow_none: bool = False, allow_auto: bool = True) -> Any:
    """The clip constant: a finite number ``> 0``, or ``"auto"`` (and ``None`` only where the
    caller has no budget, so the sensitivity may be infinite)."""
    if clip is None and allow_none:
        return None
    if isinstance(clip, str):
        if allow_auto and clip == CLIP_AUTO:
            return clip
        accepted = "a finite number in (0, inf)" + (' or "auto"' if allow_auto else "")
        raise InvalidArgumentError(f"`clip` must be {accepted}; {_got(clip)}.")
    if clip is None:
        raise InvalidArgumentError(
            "`clip` must be a finite number in (0, inf)"
            + (' or "auto"' if allow_auto else "")
            + "; got None: a budget needs a finite clip (with clip=None the sensitivity is inf)."
        )
    return check_real("clip", clip, low=0.0, low_open=True)


#: Accepted ``neighbours`` values (:class:`~pymc_penalty.accounting.sensitivity.Neighbours`).
NEIGHBOUR_NAMES = ("substitute", "add_remove")
_CLIP_MODES = ("distance", "metric", "constant", "lipschitz")


def _check_enum(name: str, value: Any, options: tuple[str, ...]) -> None:
    # The package's enums (Neighbours, ClipMode) are str subclasses: compare their values.
    raw = getattr(value, "value", value)
    check_choice(name, raw, options)


def check_step_arguments(
    *,
    epsilon: Any = None,
    delta: Any = None,
    plan: Any = None,
    clip: Any = 1.0,
    clip_count_share: Any = 0.05,
    neighbours: Any = "substitute",
    clip_mode: Any = "distance",
    target_accept: Any = 0.234,
    tune_interval: Any = 100,
    scaling: Any = 1.0,
    released_rows: Any = None,
    clip_tail: Any = 1.0,
) -> None:
    """The budget-related arguments of :class:`~pymc_penalty.PenaltyMetropolis`.

    Raises
    ------
    InvalidArgumentError
    """
    if epsilon is not None or delta is not None:
        if epsilon is None or delta is None:
            raise InvalidArgumentError("`epsilon` and `delta` must be given together.")
        check_budget(epsilon, delta)
        check_clip(clip)
        if plan is not None:
            for field in ("draws", "tune", "chains"):
                if not hasattr(plan, field):
                    raise InvalidArgumentError(
                        f"`plan` must be a pymc_penalty.RunPlan(draws, tune, chains); {_got(plan)}."
                    )
            check_plan(plan.draws, plan.tune, plan.chains)
    else:
        check_clip(clip, allow_none=True)
    check_share("clip_count_share", clip_count_share)
    _check_enum("neighbours", neighbours, NEIGHBOUR_NAMES)
    _check_enum("clip_mode", clip_mode, _CLIP_MODES)
    if isinstance(clip, str) and clip == CLIP_AUTO:
        if float(clip_count_share) == 0.0:
            raise InvalidArgumentError(
                "clip='auto' needs `ClipPolicy.count_share` (`clip_count_share`) in (0, 1): "
                "the clip is found from the released clipped counts."
            )
        if clip_mode == "lipschitz":
            raise InvalidArgumentError(
                "clip='auto' cannot be combined with the mode 'lipschitz', where `clip` is a "
                "declared bound; use the mode 'metric' or 'distance' (`ClipPolicy.mode`)."
            )
    check_real("target_accept", target_accept, low=0.0, high=1.0, low_open=True, high_open=True)
    check_integer("tune_interval", tune_interval, low=1)
    check_real("scaling", scaling, low=0.0, low_open=True)
    if released_rows is not None:
        check_real("released_rows", released_rows, low=0.0, low_open=True)
    check_real("clip_tail", clip_tail, low=1.0)


def check_warm_start_arguments(
    warm_start: Any, warm_start_clip: Any, warm_start_steps: Any
) -> None:
    """The private warm start's arguments, as :func:`pymc_penalty.sample` and a budgeted
    :class:`~pymc_penalty.PenaltyMetropolis` take them.

    Raises
    ------
    InvalidArgumentError
    """
    if not (isinstance(warm_start, str) and warm_start == "auto"):
        check_share("warm_start", warm_start)
    if warm_start_clip is not None:
        check_real("warm_start_clip", warm_start_clip, low=0.0, low_open=True)
    check_integer("warm_start_steps", warm_start_steps, low=1)


def check_method(method: Any) -> None:
    """``method`` of :func:`pymc_penalty.sample` and the budgeted step."""
    check_choice("method", method, ("auto", "taylor", "penalty"))


def check_taylor_arguments(
    backend: Any, clip: Any, clip_mode: Any, warm_start: Any, others: Mapping[str, Any]
) -> None:
    """What ``method="taylor"`` cannot be combined with (before anything is spent)."""
    if backend != "pymc":
        raise InvalidArgumentError("method='taylor' runs on backend='pymc' only.")
    if others.get("owners") is not None:  # shards run it (one curator: one noise)
        raise InvalidArgumentError("method='taylor' cannot be combined with `owners`.")
    if not (isinstance(warm_start, str) and warm_start == "auto") and not warm_start > 0:
        raise InvalidArgumentError(
            "method='taylor' expands the likelihood at the warm start's point: `warm_start` "
            "must be 'auto' or positive."
        )
    if clip_mode != "metric":
        raise InvalidArgumentError(
            "method='taylor' bounds the residuals in its own metric: leave `clip_mode` at 'metric'."
        )
    if isinstance(clip, str) and clip != "auto":
        raise InvalidArgumentError(f"`clip` must be 'auto' or positive; {_got(clip)}.")


def check_sample_arguments(
    *,
    epsilon: Any,
    delta: Any,
    draws: Any,
    tune: Any,
    chains: Any,
    neighbours: Any,
    clip: Any,
    clip_mode: Any,
    clip_count_share: Any,
    warm_start: Any,
    warm_start_clip: Any,
    warm_start_steps: Any,
    ledger_path: Any,
    keep_data: Any,
    step_kwargs: Any,
    pm_sample_kwargs: Mapping[str, Any],
    backend: Any = "pymc",
    method: Any = "penalty",
    **others: Any,
) -> None:
    """Every argument of :func:`pymc_penalty.sample` (and ``cores``, ``random_seed`` of
    ``pm.sample``), checked before any ledger is opened. Arguments not named here
    (``others``) are left to the code that uses them.

    Raises
    ------
    InvalidArgumentError
    """
    check_budget(epsilon, delta)
    check_plan(
        _integer_or_auto("draws", draws, low=1),
        _integer_or_auto("tune", tune, low=0),
        _integer_or_auto("chains", chains, low=1),
    )
    check_choice("backend", backend, ("pymc", "jax"))  # "jax": pymc_penalty.backends.jax.driver
    check_method(method)
    if method == "taylor":
        check_taylor_arguments(backend, clip, clip_mode, warm_start, others)
    _check_enum("neighbours", neighbours, NEIGHBOUR_NAMES)
    check_clip(clip)
    _check_enum("clip_mode", clip_mode, _CLIP_MODES)
    check_share("clip_count_share", clip_count_share)
    check_warm_start_arguments(warm_start, warm_start_clip, warm_start_steps)
    if ledger_path is not None and not isinstance(ledger_path, str | os.PathLike):
        raise InvalidArgumentError(
            f"`ledger_path` must be a path (str or os.PathLike) or None; {_got(ledger_path)}."
        )
    if not isinstance(keep_data, bool | np.bool_):
        raise InvalidArgumentError(f"`keep_data` must be True or False; {_got(keep_data)}.")
    if step_kwargs is not None and not isinstance(step_kwargs, Mapping):
        raise InvalidArgumentError(f"`step_kwargs` must be a dict or None; {_got(step_kwargs)}.")
    if "cores" in pm_sample_kwargs and pm_sample_kwargs["cores"] is not None:
        check_integer("cores", pm_sample_kwargs["cores"], low=1)
    seed = pm_sample_kwargs.get("random_seed")
    if isinstance(seed, float | str | bool | np.bool_) or (
        isinstance(seed, numbers.Integral) and seed < 0
    ):
        raise InvalidArgumentError(
            "`random_seed` must be an integer >= 0, a sequence of them, a NumPy Generator or "
            f"None; {_got(seed)}."
        )
