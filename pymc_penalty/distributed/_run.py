"""One distributed run from its arguments to its raw result, for both Dask samplers.

:func:`drive` is what :func:`~pymc_penalty.distributed.sample` (several data owners) and
:func:`~pymc_penalty.distributed.sample_sharded` (one curator's table in shards) share: check
the arguments and open the ledger (:func:`~pymc_penalty.distributed._setup.prepare_run`),
refuse a resume that does not match, calibrate the run's ``mu`` and draw its seed, start the
pool (or take the caller's, with step ids of its own), run the private warm start where the
party has one (its share and the chains' ``mu`` fixed before anything is spent), journal the
run with the warm start's public result, run the lockstep loop
(:func:`~pymc_penalty.distributed._driver.run_chains`). The sampler then finalizes the result
itself, with :func:`~pymc_penalty.results.publish.finalize_result` as :func:`pymc_penalty.sample`
does: the report's convergence warning points two frames up, at the line that called the
sampler. A :class:`Party` says what differs between the two.
"""

from __future__ import annotations

import dataclasses
import inspect
import secrets
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import arviz as az
import numpy as np

from pymc_penalty.accounting.sensitivity import ClipMode
from pymc_penalty.distributed._driver import run_chains, stopped_error
from pymc_penalty.distributed._setup import Run, prepare_run
from pymc_penalty.distributed._warm import split_mu, taylor_expansion, taylor_from_header
from pymc_penalty.distributed.pool import ActorPool
from pymc_penalty.errors import OwnerError
from pymc_penalty.model.likelihood import likelihood_coordinates
from pymc_penalty.planning.taylor_forecast import taylor_forecast_report
from pymc_penalty.privacy.budget import available_mu, calibrate
from pymc_penalty.sampling.taylor import TaylorModel
from pymc_penalty.warmstart.taylor import TAYLOR_SHARE

__all__ = ["Party", "drive"]

#: The samplers' arguments that :func:`prepare_run` checks (its parameters, by name).
_PREPARED = tuple(inspect.signature(prepare_run).parameters)


class Party(ABC):
    """What a distributed run's data side is: several owners, or one curator's shards.

    Parameters
    ----------
    parties : sequence
        What :attr:`pool_class` is started with (the owners, or the shards' loaders).
    """

    #: The argument that gives the parties, and its key in the run journal's header.
    argument: str
    #: The pool that serves them.
    pool_class: type[ActorPool]
    #: Why a resume is refused when :meth:`identity` differs from the journal's.
    resume_mismatch: str
    #: Whether each party's and the outsider's ``mu`` are recorded per step (``run_chains``).
    party_stats: bool = True

    def __init__(self, parties: Sequence[Any]) -> None:
        self.parties = parties

    @property
    @abstractmethod
    def names(self) -> list[str]:
        """The parties' names, as their pool names them (:attr:`ActorPool.names`)."""

    def identity(self) -> Any:
        """What the run journal keeps of the parties (a resume must match it): their names."""
        return self.names

    def check(self, r: Run) -> None:  # noqa: B027 - optional: nothing to check by default
        """Refuse what cannot run, before any pool starts or anything is spent."""

    def pool_options(self, r: Run, args: Mapping[str, Any]) -> dict[str, Any]:
        """What :attr:`pool_class` takes besides the arguments every pool takes."""
        return {}

    def start(self, r: Run, args: Mapping[str, Any]) -> ActorPool:
        """Start a pool for the run (``args``: the sampler's arguments)."""
        return self.pool_class(
            self.parties,
            r.model,
            r.value_vars,
            r.point,
            cluster=args["cluster"],
            timeout=args["timeout"],
            compile_kwargs=args["compile_kwargs"],
            run=args["run"],
            **self.pool_options(r, args),
        )

    def reuse(self, pool: ActorPool, r: Run, args: Mapping[str, Any]) -> None:
        """Check that the caller's ``pool`` serves these parties (its step ids are reset by
        :func:`drive`)."""
        if pool.names != self.names:
            raise ValueError(
                f"`{self.argument}` must be the {self.argument} `pool` was started with."
            )

    @abstractmethod
    def release_mu(self, pool: ActorPool, mu: float, r: Run, args: Mapping[str, Any]) -> list:
        """Each party's per-release ``mu`` of a new run whose run-wide ``mu`` is ``mu``."""

    @abstractmethod
    def report(self, pool: ActorPool, idata: az.InferenceData, r: Run) -> dict[str, Any]:
        """The report's entries of the parties (``idata.attrs``), read while ``pool`` runs."""

    def warm_share(self, args: Mapping[str, Any]) -> float:
        """The share of the ledger's ``mu^2`` a private warm start spends (0: none)."""
        return 0.0

    def method(self, args: Mapping[str, Any]) -> str:
        """The chains' path: ``"penalty"`` (the plain walk) or ``"taylor"`` (residuals after
        a released Taylor model; shards only)."""
        return "penalty"

    def warm_start(
        self,
        pool: ActorPool,
        r: Run,
        args: Mapping[str, Any],
        mu: float,
        seed: int,
        *,
        oneshot_mu: float = 0.0,
        step_mu: float = 0.0,
    ) -> dict[str, Any]:  # pragma: no cover - only parties with a warm share run one
        """Run the private warm start on ``mu`` and, with ``oneshot_mu`` (the Taylor path),
        the one-shot release at its point (the chains' per-step ``mu`` is ``step_mu``);
        returns what the run journal keeps of them
        (:func:`~pymc_penalty.distributed._warm.warm_header`, the released model's under
        ``"taylor"``: :func:`~pymc_penalty.distributed._warm.taylor_header`)."""
        raise NotImplementedError

    def found_clip(
        self, pool: ActorPool, r: Run, args: Mapping[str, Any], warm: dict[str, Any] | None
    ) -> dict[str, Any]:  # pragma: no cover - only parties that take clip="auto"
        """The found clip's start (``clip="auto"``), as the run journal keeps it
        (:func:`~pymc_penalty.distributed._warm.found_clip_start`)."""
        raise NotImplementedError


def drive(party: Party, args: Mapping[str, Any]) -> tuple[az.InferenceData, Run, dict[str, Any]]:
    """Run the penalty chain through ``party``'s pool; ``args`` holds the sampler's arguments
    by name (the public function's ``locals()``). Returns the raw InferenceData, the run and
    the parties' report entries, which the sampler passes to ``finalize_result``."""
    r = prepare_run(**{name: args[name] for name in _PREPARED})
    plan = [r.plan.draws, r.plan.tune, r.plan.chains]
    if r.resumed is not None:
        if r.resumed.get(party.argument) != party.identity():
            raise ValueError(party.resume_mismatch)
        if r.resumed.get("plan") != plan:
            raise ValueError("`draws`, `tune` and `chains` differ from the run being resumed.")
    share = party.warm_share(args)
    taylor = party.method(args) == "taylor"
    if r.resumed is not None:
        if float((r.resumed.get("warm_start") or {}).get("share", 0.0)) != share:
            raise ValueError("`warm_start` differs from the run being resumed.")
        if ("taylor" in r.resumed) != taylor:
            raise ValueError("`method` differs from the run being resumed.")
        if ("found_clip" in r.resumed) != (r.config.clip_auto and not taylor):
            raise ValueError("`clip` ('auto' or a number) differs from the run being resumed.")
    party.check(r)
    if r.resumed is None:
        # The warm start's mu and the chains' are fixed here, before anything is spent; on
        # the Taylor path TAYLOR_SHARE of what the warm start leaves goes to the one-shot
        # release, as in-process (pymc_penalty.budgeted.run_private_start).
        warm_mu, chains_mu = split_mu(available_mu(r.ledger), share)
        oneshot_mu = 0.0
        if taylor:
            oneshot_mu, chains_mu = split_mu(chains_mu, TAYLOR_SHARE)
        # A found clip, or the residual clip: not known yet (no warning).
        auto = r.config.clip_auto or taylor
        mu = calibrate(
            chains_mu,
            r.plan,
            clip=1.0 if auto else float(args["clip"]),
            warn_below=0.0 if auto else 0.05,
            clip_mode=r.clip_mode,
            neighbours=r.neighbours,
            clip_count_share=r.share,
        )
        seed = secrets.randbits(63) if args["random_seed"] is None else int(args["random_seed"])
    pool = args["pool"]
    own_pool = pool is None
    if own_pool:
        pool = party.start(r, args)
    else:  # a pool the caller started: this run gets its own step ids
        party.reuse(pool, r, args)
        pool.run, pool._step = args["run"] or uuid.uuid4().hex, 0
    try:
        if r.resumed is None:
            header = {
                "run": pool.run,
                "owner_mu": party.release_mu(pool, mu, r, args),
                "seed": seed,
                party.argument: party.identity(),
                "plan": plan,
            }
            if share > 0:  # released once: a resume reads it from the journal
                header["warm_start"] = party.warm_start(
                    pool, r, args, warm_mu, seed, oneshot_mu=oneshot_mu, step_mu=mu
                )
                if taylor:  # the released Taylor model (public), released once too
                    header["taylor"] = header["warm_start"].pop("taylor")
            if r.config.clip_auto and not taylor:  # the found clip's start (public)
                header["found_clip"] = party.found_clip(pool, r, args, header.get("warm_start"))
            r.journal.add(header)
        else:
            header = r.resumed
        model_release = None
        if "taylor" in header:  # the shards' residuals, rebuilt from public values
            model_release = taylor_from_header(header["taylor"])
            r = _taylor_run(r, model_release)
            try:
                pool.taylor_control(*taylor_expansion(model_release))
            except OwnerError as exc:  # journaled: resumable, as a step's stop
                raise stopped_error(exc, r.config, header["run"], 0, {}) from None
        warm, found = header.get("warm_start"), header.get("found_clip")
        S = r.S if warm is None else np.asarray(warm["S"], dtype=np.float64)
        if found is not None and found.get("S") is not None:
            S = np.asarray(found["S"], dtype=np.float64)
        starts = None if warm is None else np.asarray(warm["starts"], dtype=np.float64)
        idata = run_chains(
            pool, r.config, r.journal, header, r.plan, r.share, r.model, r.value_vars,
            r.x_init, S, scaling=float(args["scaling"]), adapt=args["adapt"],
            target_accept=float(args["target_accept"]), adapt_window=r.adapt_window,
            party_stats=party.party_stats, starts=starts, found_clip=found,
            taylor=model_release, free=_free_coordinates(r),
        )  # fmt: skip
        extra = {"dp_method": "penalty", **party.report(pool, idata, r)}
        if model_release is not None:  # pp.sample's keys, by the same code
            step_mu = float(np.max(header["owner_mu"]))
            extra.update(model_release.report())
            extra.update(taylor_forecast_report(
                model_release, r.plan, step_mu, neighbours=r.neighbours.value,
                clip_count_share=r.share, clip=r.config.clip, offset=model_release.start_offset,
            ))  # fmt: skip
    finally:
        if own_pool:
            pool.close()
    return idata, r, extra


def _free_coordinates(r: Run) -> np.ndarray:
    """The raveled coordinates no row's log-likelihood reads (model structure only), which
    the chains move on the prior alone, as the in-process step does; none where the rows
    read nothing (a model the gate would refuse)."""
    reads = likelihood_coordinates(r.model, r.value_vars, r.point)
    return np.flatnonzero(~reads) if reads.any() else np.zeros(0, dtype=int)


def _taylor_run(r: Run, model_release: TaylorModel) -> Run:
    """The run whose chains release residuals after ``model_release``: its bound's constant
    is the residual clip (the released one raised to what the chains' noise carries, for
    ``clip="auto"``; :func:`~pymc_penalty.budgeted.taylor_step_settings`) or the number
    given, in the Taylor bound's metric; ``finalize_result`` finds the model on the config
    (the noise-aware posterior, the report's bound)."""
    clip = model_release.residual_clip if r.config.clip_auto else r.config.clip
    config = dataclasses.replace(
        r.config, clip=float(clip), clip_mode=ClipMode.METRIC, clip_auto=False, taylor=model_release
    )
    return r._replace(config=config, clip_mode=ClipMode.METRIC)
