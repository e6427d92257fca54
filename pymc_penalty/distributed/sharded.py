"""The penalty chain of one curator's table sharded over Dask workers (:func:`sample_sharded`).

The same chain as :func:`pymc_penalty.sample` on the concatenated table, after the same
private warm start where one is asked for (:mod:`pymc_penalty.distributed._warm`: each shard
returns only its sums over its rows, the driver charges each release first and adds one
noise): per step the driver
draws every chain's proposal, charges its ledger ``chains * mu^2`` *before* asking the
shards, receives their exact clipped partial sums (one float and one count per chain and
shard), adds one noise draw per release (:class:`~pymc_penalty.distributed.shards.ShardPool`)
calibrated for the whole table by the one mechanism
(:func:`~pymc_penalty.privacy.mechanism.release_noise`, through
:func:`~pymc_penalty.distributed._setup.owner_noise` with the curator as the only party), and
runs the one kernel transition (:func:`~pymc_penalty.distributed._driver.run_chains`). The
result is finalized (report, stripping) by the same code as :func:`pymc_penalty.sample`.

The model gate runs once, on the driver, before any shard is read: on a copy of the model
whose placeholder ``pm.Data`` containers are filled with :data:`GATE_ROWS` rows of zeros (a
public stand-in of the right shape; the row-locality probes bring their own synthetic data;
under add/remove-one at least ``min_rows`` rows, the public lower bound that the gate's shape
rules then compare lengths with, as in-process). It reveals nothing about the table. The data
checks that depend on values (finite, support of count likelihoods) run on each worker after
loading, with messages that name the array only.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any

import arviz as az
import cloudpickle
import numpy as np
import pymc as pm
from pymc.blocking import DictToArrayBijection

from pymc_penalty.accounting.sensitivity import Neighbours
from pymc_penalty.distributed._run import Party, drive
from pymc_penalty.distributed._setup import Run
from pymc_penalty.distributed._warm import (
    found_clip_start,
    sharded_taylor_oneshot,
    sharded_warm_start,
    taylor_header,
    warm_header,
    warm_report,
)
from pymc_penalty.distributed.pool import DEFAULT_TIMEOUT
from pymc_penalty.distributed.shards import (
    ShardPool,
    driver_secret,
    shard_loaders,
    shard_names,
)
from pymc_penalty.errors import ShardError
from pymc_penalty.model.checks import check_min_rows, n_datapoints, validate_model
from pymc_penalty.planning.plan import resolve_method
from pymc_penalty.results.publish import finalize_result
from pymc_penalty.sampling.adaptation import RW_SCALE
from pymc_penalty.sampling.taylor import with_chains_clip
from pymc_penalty.validation import (
    check_method,
    check_share,
    check_taylor_arguments,
    check_warm_start_arguments,
)
from pymc_penalty.warmstart import WARM_START_STEPS

__all__ = ["GATE_ROWS", "gate_on_placeholders", "sample_sharded"]

#: Rows of the public stand-in the gate runs on (odd, above the 20 rows from which
#: ``n +- 1`` axes are refused too, and unlikely to be a parameter's length).
GATE_ROWS = 257


def gate_on_placeholders(
    model: pm.Model,
    value_vars: list[Any],
    neighbours: Neighbours,
    min_rows: int | None = None,
) -> None:
    """Run the model gate (:func:`~pymc_penalty.model.checks.validate_model`, row locality
    included) on a copy of ``model`` whose row-carrying ``pm.Data`` placeholders hold
    :data:`GATE_ROWS` rows of zeros: public values, so the gate reveals nothing about the
    shards, and it runs before any of them is read.

    A container counts as row-carrying when its leading axis has the placeholder model's
    datapoint count (give placeholders of one row, as in the docs).

    Parameters
    ----------
    model : pm.Model
        The model with placeholder ``pm.Data`` containers.
    value_vars : list
        The value variables the chain samples.
    neighbours : Neighbours
    min_rows : int, optional
        Under add/remove-one, where it is required, the public lower bound on the table's
        rows (:func:`~pymc_penalty.model.checks.rule_rows`): the gate's shape rules compare
        lengths with it, and the placeholders hold ``max(GATE_ROWS, min_rows)`` rows. The
        driver never sees the table, so its rows are not compared with the bound: fix it
        from what is public about the table. Ignored under substitute-one.

    Raises
    ------
    InvalidArgumentError
        Under add/remove-one without ``min_rows``, or ``min_rows`` not an integer ``>= 2``.
    ModelNotPrivateError
        For a model that cannot be sampled privately.
    """
    min_rows = check_min_rows(min_rows)
    adds = neighbours is Neighbours.ADD_REMOVE
    rows = GATE_ROWS if not adds or min_rows is None else max(GATE_ROWS, min_rows)
    copy = cloudpickle.loads(cloudpickle.dumps(model))
    n0 = n_datapoints(copy)
    filled = {}
    for var in copy.data_vars:
        value = np.asarray(var.get_value(borrow=True))
        if value.ndim >= 1 and value.shape[0] == n0:
            filled[var.name] = np.zeros((rows, *value.shape[1:]), dtype=value.dtype)
    with copy:
        pm.set_data(filled)
    by_name = {v.name: v for v in copy.value_vars}
    validate_model(
        copy,
        [by_name[v.name] for v in value_vars],
        add_remove=adds,
        min_rows=min_rows,
    )


def sample_sharded(
    shards: Any,
    *,
    epsilon: float,
    delta: float,
    draws: int = 1000,
    tune: int = 1000,
    chains: int = 4,
    model: pm.Model | None = None,
    cluster: Any = None,
    neighbours: str = "substitute",
    min_rows: int | None = None,
    clip: float | str = 1.0,
    clip_mode: str = "distance",
    clip_count_share: float = 0.05,
    S: np.ndarray | None = None,
    scaling: float | None = None,
    adapt: str | None = None,
    target_accept: float = 0.234,
    adapt_window: int | None = None,
    tune_interval: int | None = None,
    random_seed: int | None = None,
    ledger_path: str | os.PathLike[str] | None = None,
    run: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    compile_kwargs: dict[str, Any] | None = None,
    pool: ShardPool | None = None,
    warm_start: float = 0.0,
    warm_start_clip: float | None = None,
    warm_start_steps: int = WARM_START_STEPS,
    method: str = "auto",
) -> az.InferenceData:
    """Sample one curator's table sharded over Dask workers, with one noise draw per release.

    Each shard's loader runs on its worker; the rows never reach the driver. Per step every
    shard returns its exact clipped partial sums for all chains in one call, and the driver
    adds the noise once, for the whole table's sensitivity (one row moves one shard's sum by
    at most the clip bound, as in-process), after charging its ledger.

    Parameters
    ----------
    shards : sequence of callable or path, or dict of dask arrays
        One loader per shard, run on the workers: a callable returning
        ``{pm.Data container name: array}`` (the shard's rows), or the path of an ``.npz``
        file of arrays so named. Or ``{pm.Data container name: dask.array.Array}`` with the
        same row chunks: row block ``k`` of every array is shard ``k``, computed on the
        workers.
    epsilon, delta : float
        The run's budget (the whole table's: the shards are one party).
    draws, tune, chains : int
        As in ``pm.sample``; every tuning step of every chain is a release.
    model : pm.Model, optional
        The model with placeholder ``pm.Data`` containers (the right columns, one row): it
        travels without rows. Without a warm start all chains start at its initial point.
    cluster : None, str or distributed.Client
        ``None`` starts a ``LocalCluster`` (one worker process per shard, at most one per
        CPU); a scheduler address (``"tcp://host:8786"``) or a ``Client`` uses that cluster.
    neighbours, clip_mode, clip_count_share, target_accept
        As :class:`~pymc_penalty.PenaltyMetropolis` (block proposals).
    clip : float or "auto", default 1.0
        The clip constant, or ``"auto"``: each chain's clip is found in tuning from its
        released noisy clipped counts, by the penalty step's rule
        (:class:`~pymc_penalty.sampling.adaptation.ClipAdapter`), aiming at a fraction of the
        shards' total row count under substitute-one (public there) and at one clipped row
        per release under add/remove-one; it starts as :func:`pymc_penalty.sample`'s does
        (after a warm start at the Gaussian tail in its metric, raised by its found clip, and
        from its released count under add/remove-one). Per chain and step in
        ``sample_stats["dp_clip"]``; the start is journaled with the run.
    S : ndarray, optional
        The proposal's sds ``(d,)`` or covariance ``(d, d)``; by default the warm start's
        estimated covariance, or ones without a warm start.
    scaling : float, optional
        The proposal's starting scale: ``2.38 / sqrt(d)`` after a warm start whose
        covariance is the metric, else 1.
    adapt : {"full", "diag", "scaling", "none"}, optional
        What tuning adapts: ``"scaling"`` after a warm start whose covariance is the metric
        (as :func:`pymc_penalty.sample`), else ``"full"``.
    min_rows : int, optional
        Under add/remove-one neighbours, where it is required, a public lower bound (``>= 2``)
        on the number of rows of the whole table, fixed without looking at it: the model
        gate's shape rules compare lengths with it (:func:`gate_on_placeholders`), and so
        does the stripping of the result. Recorded as ``dp_min_rows``. Ignored under
        substitute-one.
    adapt_window, tune_interval
        As :class:`~pymc_penalty.PenaltyMetropolis`.
    random_seed : int, optional
        Seed of the proposals and uniforms (from OS entropy when omitted; kept in the run
        journal for a resume). The privacy noise never depends on it.
    ledger_path : path, optional
        The driver's run ledger. Needed to resume; beside it are the run journal
        (``<ledger_path>.runs``: per-step mu, seed, charged steps and the digest of each
        released step's points) and the noise key (``<ledger_path>.key``).
    run : str, optional
        The id of a stopped run to resume (with the same ``ledger_path`` and shards): its
        completed steps are replayed with the identical noise and charged nothing again.
    timeout : float, default 60
        Seconds a shard may take per call before the run stops.
    compile_kwargs : dict, optional
        Passed to each shard's compiled likelihood.
    pool : ShardPool, optional
        A pool already started for these shards and this model (not closed here).
    warm_start : float, default 0
        Share, in ``[0, 1)``, of the ledger's remaining ``mu^2`` spent on the private warm
        start before the chains (:func:`pymc_penalty.warmstart.private_warm_start`'s
        releases, each shard returning only its sums over its rows, pairs formed within the
        shard; one noise per release at the driver, charged to its ledger before any shard is
        asked; see docs/distributed.md). The chains are calibrated to the rest; each starts
        at its own centred draw of the warm start's Gaussian approximation. The warm start's
        public result is journaled with the run, so a resumed run reuses it (nothing of it is
        released again); a run stopped during its warm start cannot be resumed.
        ``pymc_penalty.sample(shards=...)`` passes its own (``"auto"``: 0.2).
    warm_start_clip : float, optional
        The warm start's gradient clip in its metric; found from its noisy counts by default.
    warm_start_steps : int, default 12
        The warm start's Fisher-scoring steps.
    method : {"auto", "taylor", "penalty"}, default "auto"
        The chains' path. ``"penalty"``: the plain penalty walk. ``"taylor"`` (needs a
        ``warm_start`` and ``clip_mode="metric"``): after the warm start, the one-shot
        release of the rows' Taylor sums at its point on
        :data:`~pymc_penalty.warmstart.taylor.TAYLOR_SHARE` of what it leaves
        (:func:`~pymc_penalty.distributed._warm.sharded_taylor_oneshot`), then chains that
        release only each row's clipped residual after that model, computed on the shards
        (:meth:`ShardPool.taylor_control`), as in-process ``pymc_penalty.sample`` runs them
        (:class:`~pymc_penalty.sampling.taylor.TaylorPenaltyMetropolis`): they start from
        the released model's Gaussian approximation, adapt their full covariance, draw
        independent moves after tuning where public probes find them better, and
        ``clip="auto"`` is the released residual clip raised to the chains' noise
        (:func:`~pymc_penalty.sampling.taylor.noise_limited_clip`). The published posterior
        integrates the one-shot noise out (the raw chains: ``posterior_tilted``); the
        report has ``dp_method`` and the ``dp_taylor_*`` keys. The released model is
        journaled with the run: a resumed run rebuilds the shards' residuals from it and
        releases nothing of the one-shot again; a resume with another method is refused.
        ``"auto"``: ``"taylor"`` where ``pymc_penalty.sample`` would choose it in-process
        (a warm start and ``clip_mode="metric"``), else ``"penalty"``
        (:func:`~pymc_penalty.planning.plan.resolve_method`); with this function's
        defaults (no warm start, ``clip_mode="distance"``) that is the plain walk.

    Returns
    -------
    InferenceData
        Posterior (tuning draws in ``warmup_*`` groups) and the privacy report in ``attrs``
        (``dp_shards``: the number of shards; ``dp_run_id``; ``dp_warm_start_share``,
        ``dp_warm_start_mu``, ``dp_warm_start_releases``).

    Raises
    ------
    DistributedSamplingError
        A shard was lost, hung or failed mid-run; names the shard and what the ledger
        committed; its ``run`` resumes the run.
    ShardError
        A shard was lost, hung or failed during the warm start (the run cannot be resumed).
    ValueError
        Bad arguments or a model the gate refuses, before anything is spent or started.
    """
    check_method(method)  # before anything is opened, started or spent
    min_rows = check_min_rows(min_rows)
    check_warm_start_arguments(warm_start, warm_start_clip, warm_start_steps)
    warm_start = check_share("warm_start", warm_start)  # a number ("auto" is pp.sample's)
    method = resolve_method(method, warm_start, backend="pymc", parties=None, clip_mode=clip_mode)
    if method == "taylor":
        check_taylor_arguments("pymc", clip, clip_mode, warm_start, {})
    # After a warm start the chains keep its metric and adapt their scaling only, from the
    # random-walk scale (as pymc_penalty.sample's); without one, the full covariance from 1.
    # The Taylor path's chains adapt the full covariance from the released model's
    # (pymc_penalty.budgeted.taylor_step_settings).
    if adapt is None:
        adapt = "scaling" if warm_start > 0 and S is None and method != "taylor" else "full"
    if scaling is None:
        d = DictToArrayBijection.map(pm.modelcontext(model).initial_point()).data.size
        scaling = RW_SCALE / math.sqrt(d) if warm_start > 0 and S is None else 1.0
    idata, r, extra = drive(_Shards(shard_loaders(shards), min_rows), locals())
    return finalize_result(idata, r.config, callback=None, model=r.model, extra=extra)


class _Shards(Party):
    """One curator's table in shards, with one noise draw per release (:class:`ShardPool`)."""

    argument = "shards"
    pool_class = ShardPool
    resume_mismatch = "`shards` differ in number from those of the run being resumed."
    party_stats = False  # one party: the curator

    def __init__(self, parties: Any, min_rows: int | None = None) -> None:
        super().__init__(parties)
        self.min_rows = min_rows

    @property
    def names(self) -> list[str]:
        return shard_names(len(self.parties))

    def identity(self) -> int:
        """The number of shards."""
        return len(self.names)

    def check(self, r: Run) -> None:
        gate_on_placeholders(r.model, r.value_vars, r.neighbours, self.min_rows)

    def pool_options(self, r: Run, args: Mapping[str, Any]) -> dict[str, Any]:
        """The run's journal and the driver's noise key."""
        return {"journal": r.journal, "secret": driver_secret(args["ledger_path"])}

    def reuse(self, pool: ShardPool, r: Run, args: Mapping[str, Any]) -> None:
        """A pool the caller started takes this run's journal and noise key."""
        super().reuse(pool, r, args)
        options = self.pool_options(r, args)
        pool.journal, pool._secret = options["journal"], options["secret"]

    def release_mu(self, pool: ShardPool, mu: float, r: Run, args: Mapping[str, Any]) -> list:
        return [mu]

    def warm_share(self, args: Mapping[str, Any]) -> float:
        return float(args["warm_start"])

    def method(self, args: Mapping[str, Any]) -> str:
        return str(args["method"])

    def warm_start(
        self,
        pool: ShardPool,
        r: Run,
        args: Mapping[str, Any],
        mu: float,
        seed: int,
        *,
        oneshot_mu: float = 0.0,
        step_mu: float = 0.0,
    ) -> dict[str, Any]:
        """The private warm start on the shards (:func:`sharded_warm_start`) and, with
        ``oneshot_mu``, the Taylor one-shot at its point (:func:`sharded_taylor_oneshot`),
        as the run journal keeps them (:func:`warm_header`; the released model, its residual
        clip set for the chains as in-process by
        :func:`~pymc_penalty.sampling.taylor.with_chains_clip`, under ``"taylor"``). The
        chains then start from the released model's Gaussian approximation, as in-process
        (:func:`~pymc_penalty.budgeted.run_private_start`)."""
        clip = args["warm_start_clip"]
        try:
            warm = sharded_warm_start(
                pool,
                r,
                mu=mu,
                clip="auto" if clip is None else float(clip),
                steps=int(args["warm_start_steps"]),
            )
            model_release = None
            if oneshot_mu > 0:
                model_release = sharded_taylor_oneshot(pool, r, warm, mu=oneshot_mu)
        except ShardError as exc:
            spent = r.budget.epsilon_spent(math.sqrt(r.ledger.spent_mu2))
            raise ShardError(
                f"{exc} The warm start of run {pool.run!r} stopped before the run was "
                f"journaled (the driver's ledger has committed epsilon = {spent:.4g} of "
                f"{r.budget.epsilon:g}): it cannot be resumed; a new run releases its warm "
                "start anew, charged again."
            ) from None
        share = float(args["warm_start"])
        if model_release is None:
            self.header = warm_header(warm, r, share, seed, args["S"])
            return self.header
        if r.config.clip_auto:  # as in-process (budgeted.taylor_step_settings)
            model_release = with_chains_clip(model_release, step_mu, r.share, r.neighbours.value)
        at_model = dataclasses.replace(
            warm, point=model_release.point, covariance=model_release.covariance
        )
        self.header = warm_header(at_model, r, share, seed, args["S"])
        return {**self.header, "taylor": taylor_header(model_release)}

    def found_clip(
        self, pool: ShardPool, r: Run, args: Mapping[str, Any], warm: dict[str, Any] | None
    ) -> dict[str, Any]:
        """The chains' found clip's start (:func:`found_clip_start`)."""
        return found_clip_start(pool, r, warm, args["S"])

    def report(self, pool: ShardPool, idata: az.InferenceData, r: Run) -> dict[str, Any]:
        out: dict[str, Any] = {"dp_shards": len(self.names), "dp_run_id": pool.run}
        out.update(warm_report(r.resumed or {"warm_start": getattr(self, "header", None)}))
        if r.neighbours is Neighbours.ADD_REMOVE and self.min_rows is not None:
            out["dp_min_rows"] = int(self.min_rows)  # the public bound the gate used
        return out
