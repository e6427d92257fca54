"""The public :class:`PenaltyMetropolis`: with a budget, ``pymc_penalty.sample``'s defaults.

``with model: step = pp.PenaltyMetropolis(epsilon=2, delta=1e-5); idata = pm.sample(step=step)``
must be as good as ``pp.sample`` (issue 29 item 1). The low-level step
(:class:`pymc_penalty.sampling.step.PenaltyMetropolis`) takes every setting as given; this
subclass, built in a model context with a budget, first runs the private warm start on its own
ledger, with ``pp.sample``'s share rule, and hands the step what ``pp.sample`` hands it: a found
clip in the proposal's metric, the warm start's covariance as the metric with only the scaling
tuned, the found clip's tail factor, and one start per chain, centred draws from the warm
start's approximation, which each chain moves to at its first step. It lives above
:mod:`pymc_penalty.warmstart` and :mod:`pymc_penalty.planning` (the layering:
``tests/test_layout.py``), next to :mod:`pymc_penalty.api`, which shares
:func:`run_warm_start` and :func:`warm_start_report` with it.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pymc as pm

from pymc_penalty.errors import InvalidArgumentError, UtilityWarning
from pymc_penalty.model.checks import check_min_rows
from pymc_penalty.planning.plan import (
    chain_starts,
    resolve_tune,
    resolve_warm_start,
    warm_step_kwargs,
)
from pymc_penalty.privacy.budget import PrivacyBudget, RunPlan, available_mu
from pymc_penalty.privacy.ledger import PrivacyLedger
from pymc_penalty.results.noise_aware import NOISE_AWARE_ATTR, noise_aware_posterior
from pymc_penalty.results.report import remember_model
from pymc_penalty.sampling.setup import (
    DEFAULT_PLAN,
    SET_BY_SAMPLE,
    check_noise_arguments,
    check_step_kwargs,
)
from pymc_penalty.sampling.step import PenaltyMetropolis as _Step
from pymc_penalty.sampling.taylor import TaylorModel
from pymc_penalty.validation import check_step_arguments, check_warm_start_arguments
from pymc_penalty.warmstart import (
    WARM_START_STEPS,
    WarmStart,
    WarmStartTarget,
    private_warm_start,
)
from pymc_penalty.warmstart.taylor import taylor_oneshot

__all__ = [
    "PenaltyMetropolis",
    "run_taylor_oneshot",
    "run_warm_start",
    "taylor_posterior",
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
) -> TaylorModel:
    """:func:`~pymc_penalty.warmstart.taylor.taylor_oneshot` spending ``mu`` from ``ledger``;
    the ledger's unused reservation is returned after it (also when it is refused)."""
    try:
        return taylor_oneshot(target, warm, mu=float(mu), ledger=ledger, noise_rng=noise_rng)
    finally:
        ledger.release_unused()


def taylor_posterior(
    idata: Any, model: pm.Model, taylor: TaylorModel, random_seed: Any, keep_data: bool = False
) -> Any:
    """The Taylor path's published posterior: the chain's draws with the one-shot noise
    integrated out (:func:`~pymc_penalty.results.noise_aware.noise_aware_posterior`), the
    raw chain's draws (the tilted target's) kept as ``posterior_tilted``. Post-processing of
    released values and the release's public noise law: no privacy cost.

    Where the chain's draws cannot give the tilted posterior's Gaussian approximation (too
    few draws, a stuck chain: a singular covariance) the result keeps the chain's draws as its
    posterior (``dp_noise_aware`` 0) and warns (:class:`~pymc_penalty.UtilityWarning`): its
    intervals then leave the one-shot noise out. The budget is spent by then; failing would
    lose it.
    """
    seed = _seed(random_seed)
    rng = np.random.default_rng(None if seed is None else [seed, 0x7A7])
    try:
        out = noise_aware_posterior(
            idata,
            model,
            t=taylor.t,
            L=taylor.L,
            sd_G=taylor.release.sd_G,
            sd_H=taylor.release.sd_H,
            rng=rng,
            var_names=list(idata.posterior.data_vars),
            index=taylor.index,
            allow_data=keep_data,
        )
    except ValueError:  # its text is not quoted: only the package's own words leave
        warnings.warn(
            "The one-shot noise could not be integrated out of the chains' draws (too few "
            "draws, or a chain that did not move: their covariance is singular). The "
            "posterior is the chains' own, which targets the posterior tilted by that noise: "
            "its intervals are too narrow by about the report's dp_taylor_noise_sd_g (in "
            "posterior sds). Run longer chains.",
            UtilityWarning,
            stacklevel=3,
        )
        idata.posterior.attrs[NOISE_AWARE_ATTR] = 0
        return idata
    out.add_groups({"posterior_tilted": idata.posterior})
    remember_model(out, model)  # the result's functions find its model, as pp.sample's do
    return out


def warm_start_report(warm: WarmStart | None, share: float) -> dict[str, Any]:
    """The report's ``dp_warm_start_*`` keys (zeros without a warm start)."""
    return {
        "dp_warm_start_share": float(share) if warm is not None else 0.0,
        "dp_warm_start_mu": warm.mu if warm is not None else 0.0,
        "dp_warm_start_releases": warm.releases if warm is not None else 0,
    }


def _seed(rng: Any) -> int | None:
    return int(rng) if isinstance(rng, int | np.integer) else None


class PenaltyMetropolis(_Step):
    """Metropolis-Hastings with differentially private moves (the penalty algorithm).

    Takes every argument of :class:`pymc_penalty.sampling.step.PenaltyMetropolis` (the
    low-level step, documented there) and three more. With a budget (``epsilon`` and
    ``delta``) its defaults are :func:`pymc_penalty.sample`'s::

        with model:
            step = pp.PenaltyMetropolis(epsilon=2.0, delta=1e-5)
            idata = pm.sample(step=step)
        idata = pp.finalize(idata, step)

    - ``clip="auto"`` with ``clip_mode="metric"``: the clip is found in tuning from released
      clipped counts, in the proposal's own metric;
    - ``warm_start="auto"``: when the step is built, before anything else is spent, a
      private estimate of the posterior mode and covariance
      (:func:`~pymc_penalty.warmstart.private_warm_start`) spends the share of the ledger's
      ``mu^2`` that ``pymc_penalty.sample`` gives it
      (:func:`~pymc_penalty.planning.plan.resolve_warm_start`); the step is calibrated to the
      rest. Its covariance becomes the proposal metric ``S`` (only the scaling adapts, from
      ``2.38 / sqrt(d)``) and its found clip the clip's tail factor
      (:func:`~pymc_penalty.planning.plan.warm_step_kwargs`), and each chain moves at its
      first step to its own start, a centred draw from the estimate's Gaussian approximation
      (:func:`~pymc_penalty.planning.plan.chain_starts`): ``pm.sample``'s ``initvals`` are
      then not used. As in ``pymc_penalty.sample``, each chain then releases only its first
      ``resolve_tune("auto", draws)`` tuning steps (a tenth of the draws, within [100,
      1000]; :func:`~pymc_penalty.planning.plan.resolve_tune`): ``pm.sample``'s further
      tuning steps release nothing and do not move, and the step is calibrated to that
      shorter run (its ``plan``; ``tune_release_cap``). The report of
      :func:`pymc_penalty.finalize` includes the warm start (``dp_warm_start_*``).

    Without a budget (``mu`` or ``noise_sd`` only) nothing changes: ``clip=1.0``,
    ``clip_mode="distance"``, no warm start. ``clip=1.0, clip_mode="distance",
    warm_start=0`` gives a budgeted step the earlier defaults.

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
    **kwargs
        The low-level step's arguments (``epsilon``, ``delta``, ``plan``, ``clip``,
        ``clip_mode``, ``S``, ``reproducible_noise``, ``rng``, ...). With
        ``reproducible_noise=True`` the warm start's noise is seeded from an integer ``rng``.

    Raises
    ------
    InvalidArgumentError or ValueError
        On a bad argument, or a warm start asked for without a budget, before anything is
        spent.
    """

    def __init__(
        self,
        vars: list | None = None,
        *,
        warm_start: float | str = "auto",
        warm_start_clip: float | None = None,
        warm_start_steps: int = WARM_START_STEPS,
        **kwargs: Any,
    ) -> None:
        model = pm.modelcontext(kwargs.pop("model", None))
        budgeted = kwargs.get("epsilon") is not None or kwargs.get("delta") is not None
        check_warm_start_arguments(warm_start, warm_start_clip, warm_start_steps)
        auto = isinstance(warm_start, str)
        if not budgeted and not (auto or float(warm_start) == 0.0):
            raise InvalidArgumentError(
                "`warm_start` needs a budget (`epsilon` and `delta`): it spends part of it."
            )
        if budgeted:
            kwargs.setdefault("clip", "auto")
            kwargs.setdefault("clip_mode", "metric")
        share = 0.0
        if budgeted:
            neighbours = kwargs.get("neighbours", "substitute")
            share = resolve_warm_start(warm_start, model, {}, None, neighbours)
        warm = None
        if share > 0:
            warm, kwargs = self._warm_start(model, share, warm_start_clip, warm_start_steps, kwargs)
        tune_cap = None
        if warm is not None:
            # pp.sample's tuning after a warm start (a tenth of the draws, within [100,
            # 1000]): the chains start near the posterior with its metric and tune only the
            # scaling and the clip. pm.sample's further tuning steps (1000 by default)
            # release nothing, so their share of the budget goes to the draws.
            plan = kwargs.get("plan") or DEFAULT_PLAN
            tune_cap = min(resolve_tune("auto", plan.draws, share), plan.tune)
            kwargs["plan"] = RunPlan(draws=plan.draws, tune=tune_cap, chains=plan.chains)
        # The step's construction warnings point at its caller's caller: one frame up here.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            super().__init__(vars, model=model, **kwargs)
        for w in caught:
            warnings.warn(w.message, w.category, stacklevel=2)
        self.tune_release_cap = tune_cap
        if warm is not None:
            self._chain_starts = chain_starts(warm, plan.chains, _seed(kwargs.get("rng")))
        #: The warm start's report keys, added by :func:`pymc_penalty.finalize`.
        self.extra_report = warm_start_report(warm, share)

    @staticmethod
    def _warm_start(
        model: pm.Model,
        share: float,
        warm_start_clip: float | None,
        steps: int,
        kwargs: dict[str, Any],
    ) -> tuple[WarmStart, dict[str, Any]]:
        """Check every argument, then run the warm start on the step's ledger (made here
        unless given); the step's arguments with what the warm start sets."""
        get = kwargs.get
        check_step_arguments(
            epsilon=get("epsilon"),
            delta=get("delta"),
            plan=get("plan"),
            clip=get("clip"),
            clip_count_share=get("clip_count_share", 0.05),
            neighbours=get("neighbours", "substitute"),
            clip_mode=get("clip_mode"),
        )
        check_noise_arguments(
            get("epsilon"), get("delta"), get("plan"), get("mu"), get("noise_sd"),
            get("clip"), get("ledger"),
        )  # fmt: skip
        size = int(sum(np.size(v) for v in model.initial_point().values()))
        others = {k: v for k, v in kwargs.items() if k not in SET_BY_SAMPLE}
        check_step_kwargs(others, _Step, size)
        min_rows = check_min_rows(get("min_rows"))
        ledger = get("ledger")
        if ledger is None:
            ledger = PrivacyLedger(PrivacyBudget(float(get("epsilon")), float(get("delta"))).mu)
        noise_rng = None
        if get("reproducible_noise"):
            noise_rng = np.random.default_rng(_seed(get("rng")))
        warm = run_warm_start(
            model,
            mu=math.sqrt(available_mu(ledger) ** 2 * share),
            ledger=ledger,
            warm_start_clip=warm_start_clip,
            steps=steps,
            neighbours=get("neighbours", "substitute"),
            noise_rng=noise_rng,
            compile_kwargs=get("compile_kwargs"),
            min_rows=min_rows,
        )
        neighbours = get("neighbours", "substitute")
        return warm, warm_step_kwargs(warm, neighbours, {**kwargs, "ledger": ledger})
