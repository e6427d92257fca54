"""The public :class:`PenaltyMetropolis`: with a budget, ``pymc_penalty.sample``'s defaults.

``with model: step = pp.PenaltyMetropolis(epsilon=2, delta=1e-5); idata = pm.sample(step=step)``
must be as good as ``pp.sample`` (issue 29 item 1). The low-level step
(:class:`pymc_penalty.sampling.step.PenaltyMetropolis`) takes every setting as given; this
subclass, built in a model context with a budget, first runs on its own ledger what
``pp.sample`` runs before its chains (the screen, the private warm start and, on the Taylor
path, the one-shot release of the rows' Taylor sums), with ``pp.sample``'s share rules, and
hands the step what ``pp.sample`` hands it. It lives above :mod:`pymc_penalty.warmstart` and
:mod:`pymc_penalty.planning` (the layering: ``tests/test_layout.py``), next to
:mod:`pymc_penalty.api`, which shares :func:`screen_before_sampling`,
:func:`run_private_start`, :func:`taylor_step_settings` and the report helpers with it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import warnings
from typing import Any

import numpy as np
import pymc as pm

from pymc_penalty.accounting.calibration import calibrate
from pymc_penalty.accounting.sensitivity import Neighbours
from pymc_penalty.errors import InvalidArgumentError, UnevaluableRowsWarning
from pymc_penalty.model.checks import check_min_rows, one_model_gate, validate_model
from pymc_penalty.model.screen import SCREEN_SHARE, RowScreen, flag_unevaluable, screen_rows
from pymc_penalty.planning.plan import (
    chain_starts,
    resolve_method,
    resolve_tune,
    resolve_warm_start,
    warm_start_report,
    warm_step_kwargs,
)
from pymc_penalty.planning.taylor_forecast import start_offset
from pymc_penalty.privacy.budget import PrivacyBudget, RunPlan, available_mu
from pymc_penalty.privacy.ledger import PrivacyLedger
from pymc_penalty.results.publish import taylor_posterior
from pymc_penalty.sampling.options import (
    PrivacyPolicy,
    ProposalPolicy,
    check_no_other_keywords,
    fill_defaults,
    group_step_options,
)
from pymc_penalty.sampling.setup import (
    DEFAULT_PLAN,
    check_noise_arguments,
    check_top_arguments,
)
from pymc_penalty.sampling.step import PenaltyMetropolis as _Step
from pymc_penalty.sampling.taylor import (
    TaylorModel,
    TaylorPenaltyMetropolis,
    with_chains_clip,
)
from pymc_penalty.validation import (
    check_method,
    check_step_arguments,
    check_taylor_arguments,
    check_warm_start_arguments,
)
from pymc_penalty.warmstart import (
    WARM_START_STEPS,
    WarmStart,
    WarmStartTarget,
    prepare_warm_start,
    private_warm_start,
)
from pymc_penalty.warmstart.taylor import (
    TAYLOR_FIRST_STAGE,
    TAYLOR_SHARE,
    TAYLOR_TUNE,
    staged_oneshot,
    taylor_moves_per_draw,
    taylor_oneshot,
)

__all__ = [
    "PenaltyMetropolis",
    "run_private_start",
    "run_taylor_oneshot",
    "run_warm_start",
    "screen_before_sampling",
    "screen_report",
    "taylor_posterior",
    "taylor_step_settings",
    "warm_start_report",
]


def run_warm_start(
    model: pm.Model,
    *,
    mu: float,
    ledger: Any,
    warm_start_clip: float | None,
    steps: int,
    neighbours: str,
    noise_rng: np.random.Generator | None,
    compile_kwargs: dict[str, Any] | None,
    min_rows: int | None,
    target: WarmStartTarget | None = None,
) -> WarmStart:
    """:func:`~pymc_penalty.warmstart.private_warm_start` spending ``mu`` from ``ledger``, its
    gradient clip ``"auto"`` unless ``warm_start_clip`` is given; the ledger's unused
    reservation is returned after it (also when it is refused), so what follows gets exactly
    what the warm start left."""
    try:
        return private_warm_start(
            model,
            mu=float(mu),
            ledger=ledger,
            clip="auto" if warm_start_clip is None else float(warm_start_clip),
            steps=int(steps),
            neighbours=neighbours,
            noise_rng=noise_rng,
            compile_kwargs=compile_kwargs,
            min_rows=min_rows,
            target=target,
        )
    finally:
        ledger.release_unused()


def run_taylor_oneshot(
    target: WarmStartTarget,
    warm: WarmStart,
    *,
    mu: float,
    ledger: Any,
    noise_rng: np.random.Generator | None,
    **stage: Any,
) -> TaylorModel:
    """:func:`~pymc_penalty.warmstart.taylor.taylor_oneshot` spending ``mu`` from ``ledger``
    (``stage``: its ``previous``, ``residual``, ``clip_mu`` and ``shares``); the ledger's
    unused reservation is returned after it (also when it is refused)."""
    try:
        return taylor_oneshot(
            target, warm, mu=float(mu), ledger=ledger, noise_rng=noise_rng, **stage
        )
    finally:
        ledger.release_unused()


def screen_before_sampling(
    model: pm.Model,
    ledger: Any,
    *,
    add_remove: bool,
    min_rows: int | None,
    noise_rng: np.random.Generator | None,
    stacklevel: int = 3,
) -> RowScreen:
    """The run's first spend, after the model gate (a model it refuses spends nothing):
    :data:`~pymc_penalty.model.screen.SCREEN_SHARE` of the ledger's ``mu^2`` on the noisy
    count of rows each observed variable cannot evaluate; warn
    (:class:`~pymc_penalty.UnevaluableRowsWarning`), naming the variable, where it is far
    above zero. Such rows are clipped, never refused (issue 28). ``pymc_penalty.sample``
    and a budgeted step both run it."""
    validate_model(model, list(model.value_vars), add_remove=add_remove, min_rows=min_rows)
    try:
        screen = screen_rows(
            model,
            mu=math.sqrt(available_mu(ledger) ** 2 * SCREEN_SHARE),
            ledger=ledger,
            noise_rng=noise_rng,
        )
    finally:
        ledger.release_unused()  # the rest of the reservation goes back to the run
    flagged = flag_unevaluable(screen.counts, screen.noise_sd)
    if flagged:
        counts = ", ".join(f"{name!r}: {screen.counts[name]:.0f}" for name in flagged)
        warnings.warn(
            f"Observed variables {flagged} have many rows their likelihood cannot evaluate "
            f"(NaN or infinite values, or values outside the support; released noisy counts "
            f"{counts}, noise sd {screen.noise_sd:.0f}). Such rows add nothing and count as "
            "clipped. Check the data's coding and missing values before spending more.",
            UnevaluableRowsWarning,
            stacklevel=stacklevel,
        )
    return screen


def screen_report(screen: RowScreen | None) -> dict[str, Any]:
    """The report's ``dp_screen_mu`` and ``dp_unevaluable_rows`` keys."""
    if screen is None:
        return {"dp_screen_mu": 0.0, "dp_unevaluable_rows": float("nan")}
    return {"dp_screen_mu": screen.mu, "dp_unevaluable_rows": float(sum(screen.counts.values()))}


def run_private_start(
    model: pm.Model,
    *,
    share: float,
    taylor: bool,
    ledger: Any,
    neighbours: str,
    min_rows: int | None,
    warm_start_clip: float | None,
    steps: int,
    noise_rng: np.random.Generator | None,
    compile_kwargs: dict[str, Any] | None,
) -> tuple[WarmStart, TaylorModel | None]:
    """The private warm start on ``share`` of what the ledger has left and, with ``taylor``,
    the one-shot release of the rows' Taylor sums at its point on
    :data:`~pymc_penalty.warmstart.taylor.TAYLOR_SHARE` of what it leaves. With the Taylor
    model the returned warm start's point and covariance are the released model's (the
    chains start and move in its metric: public values)."""
    target = None
    if taylor:  # the gate and the compiled likelihood, shared with the one-shot
        target = prepare_warm_start(
            model, neighbours=neighbours, compile_kwargs=compile_kwargs, min_rows=min_rows
        )
    warm = run_warm_start(
        model,
        mu=math.sqrt(available_mu(ledger) ** 2 * share),
        ledger=ledger,
        warm_start_clip=warm_start_clip,
        steps=int(steps),
        neighbours=neighbours,
        noise_rng=noise_rng,
        compile_kwargs=compile_kwargs,
        min_rows=min_rows,
        target=target,
    )
    if not taylor:
        return warm, None
    oneshot_mu2 = available_mu(ledger) ** 2 * TAYLOR_SHARE
    if TAYLOR_FIRST_STAGE >= 1.0:  # one stage (the comparison in the diagnostics script)
        expand_at = warm
        model_release = run_taylor_oneshot(
            target, warm, mu=math.sqrt(oneshot_mu2), ledger=ledger, noise_rng=noise_rng
        )
    else:
        model_release, expand_at = staged_oneshot(
            functools.partial(run_taylor_oneshot, target, ledger=ledger, noise_rng=noise_rng),
            warm,
            oneshot_mu2,
            TAYLOR_FIRST_STAGE,  # the module's (scripts set it here)
        )
    # Where the chains start, in the expansion's metric (public; for the forecast).
    offset = start_offset(model_release, expand_at.covariance)
    model_release = dataclasses.replace(model_release, start_offset=offset)
    warm = dataclasses.replace(warm, point=model_release.point, covariance=model_release.covariance)
    return warm, model_release


def taylor_step_settings(
    taylor: TaylorModel,
    step_kwargs: dict[str, Any],
    *,
    adapt: str | None,
    step_mu: float,
) -> tuple[TaylorModel, dict[str, Any]]:
    """What the Taylor path's chains run with, from the step's grouped arguments
    (``step_kwargs["clip"]`` a :class:`~pymc_penalty.ClipPolicy`): the full covariance
    adapted (unless the caller gave ``ProposalPolicy.adapt``: ``adapt``), no found clip's
    tail factor (the residual clip is released, not found) and, for ``clip="auto"``, the
    released residual clip raised to what the chains' noise can carry
    (:func:`~pymc_penalty.sampling.taylor.noise_limited_clip`; public inputs: the per-step
    ``step_mu``). Returns the model with that clip and the step's arguments."""
    kwargs = dict(step_kwargs)
    proposal = kwargs.get("proposal") or ProposalPolicy()
    kwargs["proposal"] = dataclasses.replace(proposal, adapt=adapt or "full")
    clip = dataclasses.replace(kwargs["clip"], tail=None)
    if isinstance(clip.value, str) and clip.value == "auto":
        neighbours = (kwargs.get("privacy") or PrivacyPolicy()).neighbours
        taylor = with_chains_clip(taylor, step_mu, float(clip.count_share), neighbours)
        clip = dataclasses.replace(clip, value=taylor.residual_clip)
    kwargs["clip"] = clip
    return taylor, kwargs


#: The low-level step's arguments (its groups included), which the budgeted step passes on.
_STEP_ARGUMENTS = frozenset(
    name
    for name, p in inspect.signature(_Step.__init__).parameters.items()
    if name not in ("self", "vars") and p.kind is inspect.Parameter.KEYWORD_ONLY
)


def _seed(rng: Any) -> int | None:
    return int(rng) if isinstance(rng, int | np.integer) else None


class PenaltyMetropolis(TaylorPenaltyMetropolis):
    """Metropolis-Hastings with differentially private moves (the penalty algorithm).

    Takes every argument of :class:`pymc_penalty.sampling.step.PenaltyMetropolis` (the
    low-level step, documented there) and four more. With a budget (``epsilon`` and
    ``delta``) its defaults are :func:`pymc_penalty.sample`'s, and it runs what
    ``pymc_penalty.sample`` runs before the chains::

        with model:
            step = pp.PenaltyMetropolis(epsilon=2.0, delta=1e-5)
            idata = pm.sample(step=step)
        idata = pp.finalize(idata, step)

    When the step is built, inside the model context and before ``pm.sample`` starts, it
    spends on its own ledger, in this order:

    1. the screen: the model gate, then a noisy count of the rows each observed variable
       cannot evaluate (:func:`screen_before_sampling`; such rows are clipped, never
       refused);
    2. ``warm_start="auto"``: a private estimate of the posterior mode and covariance
       (:func:`~pymc_penalty.warmstart.private_warm_start`) on the share of the ledger's
       ``mu^2`` that ``pymc_penalty.sample`` gives it
       (:func:`~pymc_penalty.planning.plan.resolve_warm_start`);
    3. ``method="auto"`` (the Taylor path wherever it applies, as in ``pymc_penalty.sample``:
       a warm start and the clip's mode ``"metric"``): one release of the rows' Taylor sums at
       the warm start's point (:func:`~pymc_penalty.warmstart.taylor.taylor_oneshot`). The
       chains then release only each row's clipped residual after that model
       (:class:`~pymc_penalty.sampling.taylor.TaylorPenaltyMetropolis`), start from the
       released model's mode and adapt their full covariance from its metric, and
       :func:`pymc_penalty.finalize` integrates the one-shot noise out of their draws (the
       raw chain is kept as ``posterior_tilted``). Each chain releases only its first
       :data:`~pymc_penalty.warmstart.taylor.TAYLOR_TUNE` tuning steps.

    The chains are calibrated to what is left. Each chain moves at its first step to its own
    start, a centred draw from the estimate's Gaussian approximation
    (:func:`~pymc_penalty.planning.plan.chain_starts`): ``pm.sample``'s ``initvals`` are then
    not used. ``pm.sample``'s tuning steps past the released ones release nothing and do
    not move, and the step is calibrated to that shorter run (its ``plan``;
    ``tune_release_cap``). On the plain path (``method="penalty"``) the clip is found in
    tuning from released clipped counts in the proposal's own metric
    (``ClipPolicy("auto", mode="metric")``), the warm start's covariance is the proposal
    metric ``S``
    (only the scaling adapts, from ``2.38 / sqrt(d)``) and each chain releases its first
    ``resolve_tune("auto", draws)`` tuning steps
    (:func:`~pymc_penalty.planning.plan.resolve_tune`). The report of
    :func:`pymc_penalty.finalize` includes every phase (``dp_screen_*``,
    ``dp_warm_start_*``, ``dp_method``, ``dp_taylor_*``).

    Without a budget (``mu`` or ``noise_sd`` only) nothing changes: ``clip=1.0`` in mode
    ``"distance"``, no screen, no warm start.
    ``clip=pp.ClipPolicy(1.0, mode="distance"), warm_start=0`` gives a budgeted step the
    earlier defaults (with the screen). A number for ``clip`` is the constant alone, in
    mode ``"metric"`` with a budget.

    Parameters
    ----------
    vars : list of Variable, optional
        As the low-level step: all free variables.
    warm_start : float or "auto", default "auto"
        Share, in ``[0, 1)``, of the ledger's ``mu^2`` spent on the warm start (with a budget
        only). ``"auto"``: 0.2, or 0 for a model with discrete variables; ``0`` opts out.
    warm_start_clip : float, optional
        The warm start's gradient clip in its Fisher metric; by default found
        (:func:`pymc_penalty.warmstart.warm_start_clips`).
    warm_start_steps : int, default 12
        Fisher-scoring steps of the warm start (two releases each).
    method : {"auto", "taylor", "penalty"}, default "auto"
        As :func:`pymc_penalty.sample`'s: ``"auto"`` is ``"taylor"`` with a budget, a warm
        start and the clip's mode ``"metric"``, else ``"penalty"`` (the plain penalty walk).
    **kwargs
        The low-level step's arguments (``epsilon``, ``delta``, ``plan``, ``S``, ``rng``, the
        groups ``clip``, ``proposal``, ``privacy``, ...; the old keywords such as
        ``clip_mode`` with a ``FutureWarning``, once, here). With
        ``PrivacyPolicy(reproducible_noise=True)`` the screen's, warm start's and one-shot's
        noise is seeded from an integer ``rng``, as is the noise-aware posterior of
        ``finalize``.

    Raises
    ------
    InvalidArgumentError or ValueError
        On a bad argument, or a warm start or the Taylor path asked for without a budget,
        before anything is spent.
    """

    def __init__(
        self,
        vars: list | None = None,
        *,
        warm_start: float | str = "auto",
        warm_start_clip: float | None = None,
        warm_start_steps: int = WARM_START_STEPS,
        method: str = "auto",
        **kwargs: Any,
    ) -> None:
        model = pm.modelcontext(kwargs.pop("model", None))
        budgeted = kwargs.get("epsilon") is not None or kwargs.get("delta") is not None
        check_warm_start_arguments(warm_start, warm_start_clip, warm_start_steps)
        check_method(method)
        # pp.sample's clip with a budget, else the low-level step's (also for an old
        # `clip_mode=` given without `clip`).
        kwargs.setdefault("clip", "auto" if budgeted else 1.0)
        # The old keywords into their groups, once, here (FutureWarning): everything below
        # and the steps it builds read the groups.
        kwargs = group_step_options(kwargs)
        check_no_other_keywords(kwargs, type(self).__name__, accepted=_STEP_ARGUMENTS)
        given_adapt = (kwargs.get("proposal") or ProposalPolicy()).adapt
        auto = isinstance(warm_start, str)
        if not budgeted and not (auto or float(warm_start) == 0.0):
            raise InvalidArgumentError(
                "`warm_start` needs a budget (`epsilon` and `delta`): it spends part of it."
            )
        if not budgeted and method == "taylor":
            raise InvalidArgumentError(
                "method='taylor' needs a budget (`epsilon` and `delta`): its one-shot release "
                "spends part of it."
            )
        if budgeted:
            clip = kwargs["clip"] = fill_defaults(kwargs["clip"], mode="metric")
            neighbours = (kwargs.get("privacy") or PrivacyPolicy()).neighbours
            share = resolve_warm_start(warm_start, model, {}, None, neighbours)
            if method == "taylor":
                check_taylor_arguments(
                    "pymc", clip.value, clip.mode, warm_start if share else 0, {}
                )
            method = resolve_method(
                method, share, backend="pymc", parties=None, clip_mode=clip.mode
            )
        else:
            share, method = 0.0, "penalty"
        self.noise_aware_seed = _seed(kwargs.get("rng"))
        screen = warm = taylor = None
        plan = kwargs.get("plan") or DEFAULT_PLAN
        tune_cap = None
        # The screen, the warm start and the step share one gate decision (as in
        # pymc_penalty.sample): the model's checks run once.
        with one_model_gate():
            if budgeted:
                screen, warm, taylor, kwargs = self._private_start(
                    model, share, method == "taylor", warm_start_clip, warm_start_steps, kwargs
                )
                self.other_releases = int(kwargs["ledger"].releases)
            if warm is not None:
                # pp.sample's tuning after a warm start: the Taylor path's chains tune
                # TAYLOR_TUNE steps; the plain walk's a tenth of the draws, within [100, 1000].
                # pm.sample's further tuning steps (1000 by default) release nothing, so their
                # share of the budget goes to the draws.
                released = (
                    TAYLOR_TUNE if taylor is not None else resolve_tune("auto", plan.draws, share)
                )
                tune_cap = min(released, plan.tune)
                moves = plan.moves_per_draw
                if moves is None and taylor is not None:
                    moves = taylor_moves_per_draw(plan.draws)
                kwargs["plan"] = RunPlan(plan.draws, tune_cap, plan.chains, moves_per_draw=moves)
            if taylor is not None:
                step_mu = calibrate(available_mu(kwargs["ledger"]), kwargs["plan"], warn_below=0.0)
                taylor, kwargs = taylor_step_settings(
                    taylor, kwargs, adapt=given_adapt, step_mu=step_mu
                )
            # The step's construction warnings point at its caller's caller: one frame up here.
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                super().__init__(vars, taylor=taylor, model=model, **kwargs)
            for w in caught:
                warnings.warn(w.message, w.category, stacklevel=2)
        self.tune_release_cap = tune_cap
        if warm is not None:
            self._chain_starts = chain_starts(warm, plan.chains, _seed(kwargs.get("rng")))
        #: The screen's, warm start's and one-shot's report keys, added by
        #: :func:`pymc_penalty.finalize`.
        self.extra_report = {
            **warm_start_report(warm, share),
            **(screen_report(screen) if budgeted else {}),
            **(taylor.report() if taylor is not None else {"dp_method": "penalty"}),
            "dp_moves_per_draw": self.plan.draw_moves if self.plan else 1,
        }

    @staticmethod
    def _private_start(
        model: pm.Model,
        share: float,
        taylor: bool,
        warm_start_clip: float | None,
        steps: int,
        kwargs: dict[str, Any],
    ) -> tuple[RowScreen, WarmStart | None, TaylorModel | None, dict[str, Any]]:
        """Check every argument, then spend on the step's ledger (made here unless given):
        the screen, the warm start with ``share``, the one-shot with ``taylor``; the step's
        arguments with what they set (and the ledger)."""
        get = kwargs.get
        clip = kwargs["clip"]
        privacy = get("privacy") or PrivacyPolicy()
        check_step_arguments(
            epsilon=get("epsilon"),
            delta=get("delta"),
            plan=get("plan"),
            clip=clip.value,
            clip_count_share=clip.count_share,
            neighbours=privacy.neighbours,
            clip_mode=clip.mode,
        )
        check_noise_arguments(
            get("epsilon"), get("delta"), get("plan"), get("mu"), get("noise_sd"),
            clip.value, get("ledger"),
        )  # fmt: skip
        check_top_arguments(kwargs, model.initial_point())
        min_rows = check_min_rows(privacy.min_rows)
        neighbours = privacy.neighbours
        ledger = get("ledger")
        if ledger is None:
            ledger = PrivacyLedger(PrivacyBudget(float(get("epsilon")), float(get("delta"))).mu)
        kwargs = {**kwargs, "ledger": ledger}
        noise_rng = None
        if privacy.reproducible_noise:
            noise_rng = np.random.default_rng(_seed(get("rng")))
        add_remove = Neighbours.parse(neighbours) is Neighbours.ADD_REMOVE
        screen = screen_before_sampling(
            model, ledger, add_remove=add_remove, min_rows=min_rows, noise_rng=noise_rng,
            stacklevel=4,
        )  # fmt: skip
        if share <= 0:
            return screen, None, None, kwargs
        warm, taylor = run_private_start(
            model,
            share=share,
            taylor=taylor,
            ledger=ledger,
            neighbours=neighbours,
            min_rows=min_rows,
            warm_start_clip=warm_start_clip,
            steps=steps,
            noise_rng=noise_rng,
            compile_kwargs=get("compile_kwargs"),
        )
        return screen, warm, taylor, warm_step_kwargs(warm, neighbours, kwargs)
