"""The penalty step's settings in three groups: the clip, the proposal, the privacy relation.

:class:`~pymc_penalty.PenaltyMetropolis` keeps at its top level what ``pm.Metropolis`` users
expect (``vars``, ``S``, ``proposal_dist``, ``scaling``, ``tune``, ``model``, ``rng``,
``initial_point``, ``compile_kwargs``, ``blocked``) and the noise (``epsilon``, ``delta``,
``plan``, ``ledger``, or ``mu``, ``noise_sd``); the rest comes in three frozen groups, each
documented here once::

    step = pp.PenaltyMetropolis(
        epsilon=1.0,
        delta=1e-5,
        clip=pp.ClipPolicy("auto", mode="metric", count_share=0.05),
        proposal=pp.ProposalPolicy(adapt="diag", target_accept=0.3),
        privacy=pp.PrivacyPolicy(neighbours="add_remove", min_rows=100),
    )

``clip=`` also takes the clip constant alone (a number, ``"auto"`` or ``None``), as before,
and ``proposal=`` the proposal's kind alone (``"block"``, ``"component"``, ``"guided"``).
A field left at ``None`` takes the default of whatever builds the step (listed with each
field). Each group checks its fields when it is made, so a bad one is refused before any
step, ledger or release exists.

The old keywords (``clip_mode=``, ``adapt=``, ``neighbours=``, ...) still work for one
release, each with a :class:`FutureWarning` naming its new home: :data:`MOVED` is the one
table of them, and :func:`group_step_options` the one function that applies it, at the entry
of every step (the variants included) and of ``pymc_penalty.sample``'s ``step_kwargs``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from pymc_penalty.errors import InvalidArgumentError
from pymc_penalty.sampling.adaptation.proposal import ADAPT_MODES, PROPOSAL_KINDS
from pymc_penalty.validation import (
    NEIGHBOUR_NAMES,
    check_choice,
    check_clip,
    check_integer,
    check_real,
    check_share,
)

__all__ = [
    "GROUPS",
    "MOVED",
    "ClipPolicy",
    "PrivacyPolicy",
    "ProposalPolicy",
    "check_no_other_keywords",
    "fill_defaults",
    "group_step_options",
]

#: ``ProposalPolicy.adapt_window``'s default: the first covariance-adaptation window's length.
DEFAULT_ADAPT_WINDOW = 100

#: Why ``tune_interval`` (the old name of ``adapt_window``) is deprecated.
TUNE_INTERVAL_RENAMED = (
    "`tune_interval` is renamed `adapt_window` (the length of the first covariance-adaptation "
    "window; windows then double, and the scaling adapts every step). In pm.Metropolis "
    "`tune_interval` means the steps between scaling updates, which is not what it does here."
)

#: ``ClipPolicy.mode`` values (:class:`~pymc_penalty.accounting.sensitivity.ClipMode`).
CLIP_MODES = ("distance", "metric", "constant", "lipschitz")


def _enum(name: str, value: Any, options: tuple[str, ...]) -> None:
    # The package's enums (Neighbours, ClipMode) are str subclasses: compare their values.
    check_choice(name, getattr(value, "value", value), options)


@dataclass(frozen=True)
class ClipPolicy:
    """How each row's log-likelihood ratio is clipped, and how the clip is found.

    Pass it as ``clip=``; ``clip=2.0`` is ``clip=ClipPolicy(2.0)``.

    Parameters
    ----------
    value : float, "auto" or None, default "auto"
        The clip constant. ``"auto"``: found in tuning from the released noisy clipped
        counts (the value each chain used is in ``sample_stats["dp_clip"]``). ``None``: no
        clipping, exact but with unbounded sensitivity, so not private (with ``noise_sd``
        only; a :class:`~pymc_penalty.NotPrivateWarning` says so). The low-level step given
        no ``clip`` at all uses 1.0.
    mode : {"distance", "metric", "constant", "lipschitz"}, optional
        How the bound ``B`` depends on the proposal. ``"distance"``:
        ``B = value * ||theta' - theta||_2``. ``"metric"``:
        ``B = value * ||L^-1 (theta' - theta)||_2`` where ``L`` is the proposal's Cholesky
        factor (``S``'s, then the tuned one: public, built from released states), so one
        constant fits every direction. ``"constant"``: ``B = value``. ``"lipschitz"``:
        ``value`` is a declared bound ``M`` on every ``|d log p(y_i | theta) / d theta_j|``
        (on the unconstrained space) and ``B = M * ||theta' - theta||_1``; violations are
        still clipped and counted (``dp_clipped_fraction``), so the guarantee never rests on
        the declaration. ``None``: ``"distance"`` for the low-level step, ``"metric"`` for a
        budgeted :class:`~pymc_penalty.PenaltyMetropolis`, ``pymc_penalty.sample`` and the
        Taylor path.
    count_share : float, default 0.05
        Share, in ``[0, 1)``, of each private step's ``mu^2`` spent on releasing the number
        of clipped rows with Gaussian noise (reported as ``dp_clipped_fraction``). 0 spends
        nothing on it (the statistic is then NaN); ``value="auto"`` needs it positive.
    tail : float, optional
        With ``value="auto"``: the found clip starts at this many times its Gaussian-tail
        start (``>= 1``), for rows whose ratios are known, from released values, to have
        heavier tails. Public: it costs no privacy. ``None``: 1, or after a private warm
        start its factor from the warm start's found clip
        (:func:`pymc_penalty.planning.plan.clip_tail`).

    Raises
    ------
    InvalidArgumentError
        A field of the wrong type or outside its range, naming it.
    """

    value: float | str | None = "auto"
    mode: str | None = None
    count_share: float = 0.05
    tail: float | None = None

    def __post_init__(self) -> None:
        check_clip(self.value, allow_none=True)
        if self.mode is not None:
            _enum("ClipPolicy.mode", self.mode, CLIP_MODES)
        check_share("ClipPolicy.count_share", self.count_share)
        if self.tail is not None:
            check_real("ClipPolicy.tail", self.tail, low=1.0)


@dataclass(frozen=True)
class ProposalPolicy:
    """The random-walk proposal and what it adapts during tuning (from released outcomes
    only: no privacy cost).

    Pass it as ``proposal=``; ``proposal="component"`` is
    ``proposal=ProposalPolicy(kind="component")``.

    Parameters
    ----------
    kind : {"block", "component", "guided"}, default "block"
        ``"block"`` moves all coordinates at once; ``"component"`` moves one random
        coordinate per step; ``"guided"`` moves one random coordinate in its persistent
        direction, which flips on rejection (Gustafson's guided walk). Each is one release
        per step.
    adapt : {"full", "diag", "scaling", "none"}, optional
        What the proposal adapts during tuning. ``None``: ``"full"``, or ``"scaling"`` when a
        private warm start sets ``S`` (its covariance is kept; the Taylor path's chains
        adapt ``"full"`` all the same).
    adapt_window : int, default 100
        Length of the first covariance-adaptation window; windows double afterwards (the
        scaling adapts at every tuning step). With a found clip (``ClipPolicy.value="auto"``)
        the clip is re-estimated every ``adapt_window // 2`` tuning steps. (``pm.Metropolis``'s
        ``tune_interval``, the steps between scaling updates, is another thing.)
    target_accept : float, default 0.234
        Target mean acceptance probability, in ``(0, 1)``, of the scaling adaptation.
    max_step : float, optional
        Bound every coordinate's move, ``|theta'_j - theta_j| < max_step`` (moves beyond it
        are redrawn, which keeps the proposal symmetric), as the arXiv paper's Theorem 1
        assumes.

    Raises
    ------
    InvalidArgumentError
        A field of the wrong type or outside its range, naming it.
    """

    kind: str = "block"
    adapt: str | None = None
    adapt_window: int = DEFAULT_ADAPT_WINDOW
    target_accept: float = 0.234
    max_step: float | None = None

    def __post_init__(self) -> None:
        check_choice("ProposalPolicy.kind", self.kind, PROPOSAL_KINDS)
        if self.adapt is not None:
            check_choice("ProposalPolicy.adapt", self.adapt, ADAPT_MODES)
        check_integer("ProposalPolicy.adapt_window", self.adapt_window, low=1)
        check_real(
            "ProposalPolicy.target_accept",
            self.target_accept,
            low=0.0,
            high=1.0,
            low_open=True,
            high_open=True,
        )
        if self.max_step is not None:
            check_real("ProposalPolicy.max_step", self.max_step, low=0.0, low_open=True)


@dataclass(frozen=True)
class PrivacyPolicy:
    """Which data sets are neighbours (what the guarantee protects), what is public about
    the number of rows, and where the noise comes from.

    Pass it as ``privacy=``.

    Parameters
    ----------
    neighbours : {"substitute", "add_remove"}, default "substitute"
        Neighbour relation: one row replaced (the release's sensitivity is ``2B``; the
        number of rows ``n`` is public) or one row added or removed (``B``; ``n`` is private).
    min_rows : int, optional
        Under add/remove-one, a public lower bound (``>= 2``) on the number of rows, fixed
        without looking at the table, and required there. The model gate's shape rules
        (which arrays could hold records, which published lengths could be ``n``) compare
        lengths with it instead of the private ``n``, so no refusal depends on ``n``; a
        table with fewer rows is refused. Without it a step under add/remove-one is refused
        (:class:`~pymc_penalty.InvalidArgumentError`, the same for every table, before
        anything is spent): rules that compared lengths with ``n`` would let a refusal tell
        whether one record is in the table (issue 28). Ignored under substitute-one.
    released_rows : float, optional
        A released (noisy, hence public) count of the rows, e.g. the private warm start's
        under add/remove-one (``WarmStart.n_rows``; ``pymc_penalty.sample`` and a budgeted
        step pass it). Under add/remove-one a found clip (and a default ``S``) then start
        from it as they start from ``n`` under substitute-one, instead of from 1. Ignored
        under substitute-one. It must be public: a count computed from the data without
        noise would publish ``n`` through the clip (``dp_clip``).
    reproducible_noise : bool, default False
        Draw the privacy noise from the step's seeded generator (so ``random_seed``
        reproduces runs; with a budgeted step also the screen's, warm start's and one-shot's
        noise, from an integer ``rng``) instead of a fresh OS-entropy generator. Not
        private: a :class:`~pymc_penalty.NotPrivateWarning` says so, and the report too.

    Raises
    ------
    InvalidArgumentError
        A field of the wrong type or outside its range, naming it.
    """

    neighbours: str = "substitute"
    min_rows: int | None = None
    released_rows: float | None = None
    reproducible_noise: bool = False

    def __post_init__(self) -> None:
        _enum("PrivacyPolicy.neighbours", self.neighbours, NEIGHBOUR_NAMES)
        if self.min_rows is not None:
            check_integer("PrivacyPolicy.min_rows", self.min_rows, low=2)
        if self.released_rows is not None:
            check_real("PrivacyPolicy.released_rows", self.released_rows, low=0.0, low_open=True)
        if not isinstance(self.reproducible_noise, bool | np.bool_):
            raise InvalidArgumentError(
                "`PrivacyPolicy.reproducible_noise` must be True or False; "
                f"got a {type(self.reproducible_noise).__name__}."
            )


#: Each group's keyword and class.
GROUPS: dict[str, type] = {
    "clip": ClipPolicy,
    "proposal": ProposalPolicy,
    "privacy": PrivacyPolicy,
}

#: The step's old keywords, each with its new home: (group keyword, field). They work for one
#: release, each with a FutureWarning (:func:`group_step_options`).
MOVED: dict[str, tuple[str, str]] = {
    "clip_mode": ("clip", "mode"),
    "clip_count_share": ("clip", "count_share"),
    "clip_tail": ("clip", "tail"),
    "adapt": ("proposal", "adapt"),
    "adapt_window": ("proposal", "adapt_window"),
    "tune_interval": ("proposal", "adapt_window"),
    "target_accept": ("proposal", "target_accept"),
    "max_step": ("proposal", "max_step"),
    "neighbours": ("privacy", "neighbours"),
    "min_rows": ("privacy", "min_rows"),
    "released_rows": ("privacy", "released_rows"),
    "reproducible_noise": ("privacy", "reproducible_noise"),
}

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _user_stacklevel() -> int:
    """The ``stacklevel`` that points a warning raised by this function's caller at the
    first frame outside this package: the user's call, whichever step or entry point (and
    however many ``super().__init__`` frames) it went through."""
    frame = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    return level


def _new_home(old: str) -> str:
    group, field = MOVED[old]
    return f"`{group}=pymc_penalty.{GROUPS[group].__name__}({field}=...)`"


def _warn_moved(old: str) -> None:
    if old == "tune_interval":
        text = f"{TUNE_INTERVAL_RENAMED} Pass {_new_home(old)}."
    else:
        text = f"`{old}` is deprecated: pass {_new_home(old)}."
    warnings.warn(
        text + " The old keyword will be removed in a future release.",
        FutureWarning,
        stacklevel=_user_stacklevel(),
    )


def _group(name: str, value: Any) -> Any:
    """A group keyword's value as its group object (None: not given). ``clip`` also takes the
    clip constant and ``proposal`` the proposal's kind, as shorthands."""
    cls = GROUPS[name]
    if value is None and name != "clip" or isinstance(value, cls):
        return value
    if name == "clip":
        return ClipPolicy(value=value)  # checks the value, naming `clip`
    if name == "proposal" and isinstance(value, str):
        return ProposalPolicy(kind=value)
    accepted = "or a proposal kind in " + str(PROPOSAL_KINDS) if name == "proposal" else "or None"
    raise InvalidArgumentError(
        f"`{name}` must be a pymc_penalty.{cls.__name__} {accepted}; got a {type(value).__name__}."
    )


def group_step_options(
    kwargs: Mapping[str, Any], *, groups: tuple[str, ...] = tuple(GROUPS)
) -> dict[str, Any]:
    """``kwargs`` with the step's old keywords moved into their groups (:data:`MOVED`).

    Each old keyword warns once (:class:`FutureWarning`, pointing at the caller outside this
    package), and the group keywords in ``groups`` become group objects (the shorthands
    ``clip=2.0`` and ``proposal="component"`` included); a group that is neither given nor
    set by an old keyword stays absent, and every other key passes through unchanged. So it
    can be called again on its own result, which it returns unchanged and without a warning:
    every step calls it at its entry, and ``pymc_penalty.sample`` on its ``step_kwargs``.
    Old keywords of groups outside ``groups`` are left for the caller to refuse.

    Raises
    ------
    InvalidArgumentError
        An old keyword given with its group's object (give the field there), two old
        keywords for one field (``adapt_window`` and ``tune_interval``), or a field's value
        refused by its group (the message names the field and the old keyword).
    """
    out = dict(kwargs)
    given = {name: isinstance(out.get(name), GROUPS[name]) for name in groups}
    for name in groups:
        if name in out:
            value = _group(name, out.pop(name))
            if value is not None:
                out[name] = value
    moved = [old for old in kwargs if old in MOVED and MOVED[old][0] in groups]
    fields: dict[tuple[str, str], str] = {}
    for old in moved:
        group, field = MOVED[old]
        if given[group]:
            raise InvalidArgumentError(
                f"`{old}` is a field of `{group}`, given as a {GROUPS[group].__name__}: set "
                f"{field}= there instead of passing both."
            )
        if (group, field) in fields:
            raise InvalidArgumentError(
                f"`{fields[group, field]}` and `{old}` both set {GROUPS[group].__name__}."
                f"{field}: give it once, as {_new_home(old)}."
            )
        fields[group, field] = old
    for old in moved:
        _warn_moved(old)
    for (group, field), old in fields.items():
        base = out.get(group) or GROUPS[group]()
        try:
            out[group] = dataclasses.replace(base, **{field: out.pop(old)})
        except InvalidArgumentError as err:
            text = str(err).rstrip(".")
            raise InvalidArgumentError(f"{text} (given as the deprecated `{old}`).") from None
    return out


def fill_defaults(policy: Any, **defaults: Any) -> Any:
    """``policy`` with each field that is None set to ``defaults``' value for it (the
    defaults of whatever builds the step)."""
    unset = {k: v for k, v in defaults.items() if getattr(policy, k) is None}
    return dataclasses.replace(policy, **unset) if unset else policy


def check_no_other_keywords(
    grouped: Mapping[str, Any], owner: str, accepted: Collection[str] = tuple(GROUPS)
) -> None:
    """Refuse the keywords in ``grouped`` (a step's keywords, grouped) that are not
    ``accepted``, naming them, as Python refuses an unknown keyword argument.

    Raises
    ------
    InvalidArgumentError
    """
    other = sorted(set(grouped) - set(accepted))
    if other:
        groups = [
            f"`{g}=pymc_penalty.{c.__name__}(...)`" for g, c in GROUPS.items() if g in accepted
        ]
        raise InvalidArgumentError(
            f"{owner} got unexpected keyword arguments {', '.join(f'`{k}`' for k in other)}; "
            "its settings are grouped in "
            f"{', '.join(groups)}."
        )
