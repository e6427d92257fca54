"""The penalty chain driven through an :class:`~pymc_penalty.distributed.OwnerPool`.

Algorithm 2 of the source paper with each owner on its own worker: per step the driver draws
every chain's proposal, charges its own run ledger for the step's worst case, sends all
chains' points to every owner in one call, sums the owners' noisy clipped sums, and runs the
penalty test (:func:`~pymc_penalty.sampling.kernel.penalised_log_ratio`,
:func:`~pymc_penalty.sampling.kernel.penalty_decision`) with the summed noise variance. The proposal
adapts as :class:`~pymc_penalty.PenaltyMetropolis`'s does (:class:`ProposalAdapter`), from
released outcomes only. The result is finalized by the same code as :func:`pymc_penalty.sample`
(report, stripping, trimming of unreleased draws).

A stopped run is resumed by running it again with the same ``run`` id and ledger paths: the
driver is deterministic given its seed and the owners' releases, and a retried step id returns
the identical release at no new cost, so the replay walks the same path to where the run
stopped, charging nothing twice, and goes on from there.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import arviz as az
import numpy as np
import pymc as pm

from pymc_penalty.accounting.sensitivity import Neighbours
from pymc_penalty.distributed._run import Party, drive
from pymc_penalty.distributed._setup import Run, owner_noise
from pymc_penalty.distributed.pool import DEFAULT_TIMEOUT, Owner, OwnerPool
from pymc_penalty.errors import DistributedSamplingError
from pymc_penalty.privacy.budget import PrivacyBudget, calibrate
from pymc_penalty.results.publish import finalize_result
from pymc_penalty.sampling.options import group_step_options
from pymc_penalty.variants.owners import owner_report
from pymc_penalty.warmstart import WARM_START_STEPS

__all__ = ["DistributedSamplingError", "from_pp_sample", "owner_noise", "sample"]


def sample(
    owners: Sequence[Owner],
    *,
    epsilon: float,
    delta: float,
    draws: int = 1000,
    tune: int = 1000,
    chains: int = 4,
    model: pm.Model | None = None,
    cluster: Any = None,
    neighbours: str = "substitute",
    clip: float = 1.0,
    clip_mode: str = "distance",
    clip_count_share: float = 0.05,
    S: np.ndarray | None = None,
    scaling: float = 1.0,
    adapt: str = "full",
    target_accept: float = 0.234,
    adapt_window: int | None = None,
    tune_interval: int | None = None,
    random_seed: int | None = None,
    ledger_path: str | os.PathLike[str] | None = None,
    run: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    compile_kwargs: dict[str, Any] | None = None,
    pool: OwnerPool | None = None,
) -> az.InferenceData:
    """Sample with each owner's rows on its own worker (Algorithm 2 on a Dask cluster).

    Every step of every chain releases, per owner, its clipped log-likelihood difference plus
    the owner's own noise; the driver sums the releases and runs the penalty test with the
    summed noise variance. All chains of a step travel in one call per owner.

    Privacy. ``(epsilon, delta)`` is the run's budget, enforced by the driver's ledger, which
    charges each step's worst case (``chains * max_k mu_k^2``) *before* sending it, so a reply
    that never arrives is counted. Each owner's per-release ``mu_k`` is calibrated to the
    smaller of the run's per-step ``mu`` and what its own ledger has left for the plan; each
    owner charges its own ledger before reading a row. The report (``idata.attrs``) holds the
    run's ``dp_epsilon`` (the driver's ledger), each owner's guarantee with its own delta
    (``dp_owner_names``, ``dp_owner_epsilon``, ``dp_owner_delta``: from what the owner's ledger
    committed), each owner's epsilon against the other owners and the outsider's
    (``dp_epsilon_vs_owners``, ``dp_epsilon_vs_outsider``, at ``delta``).

    Parameters
    ----------
    owners : sequence of Owner
        The data owners (their loaders run on their workers).
    epsilon, delta : float
        The run's budget.
    draws, tune, chains : int
        As in ``pm.sample``; every tuning step of every chain is a release.
    model : pm.Model, optional
        The model with placeholder ``pm.Data`` containers (the right number of columns): it
        travels without rows. All chains start at its initial point.
    cluster : None, str or distributed.Client
        ``None`` starts a ``LocalCluster`` with one worker process per owner; see
        :class:`OwnerPool`.
    neighbours, clip, clip_mode, clip_count_share, S, scaling, adapt, target_accept
        As :class:`~pymc_penalty.PenaltyMetropolis` (block proposals).
    adapt_window, tune_interval
        As :class:`~pymc_penalty.PenaltyMetropolis` (``tune_interval`` is the deprecated name
        of ``adapt_window``).
    random_seed : int, optional
        Seed of the proposals and uniforms (drawn from OS entropy when omitted; kept in the
        run journal so that a resumed run replays the same path). The owners' noise never
        depends on it.
    ledger_path : path, optional
        The driver's run ledger (persistent). Needed to resume; its journal
        (``<ledger_path>.runs``) keeps each run's per-step mus, seed and charged steps.
    run : str, optional
        A run id. A new id starts a run; the id of a stopped run (with the same
        ``ledger_path`` and owners' ledgers) resumes it: completed steps are replayed at no
        new cost on any ledger.
    timeout : float, default 60
        Seconds an owner may take per call before the run stops.
    compile_kwargs : dict, optional
        Passed to each owner's compiled likelihood.
    pool : OwnerPool, optional
        A pool already started for these owners and this model (it is not closed); by
        default one is started and closed.

    Returns
    -------
    InferenceData
        Posterior (tuning draws in ``warmup_*`` groups), and the privacy report in ``attrs``.

    Raises
    ------
    DistributedSamplingError
        An owner was lost, hung or refused mid-run; its message names the owner and what was
        spent, and its ``run`` resumes the run.
    ValueError
        Bad arguments, before anything is spent.
    """
    if isinstance(clip, str):  # before anything is opened, started or spent
        raise ValueError("`clip` must be a finite positive number with several owners.")
    idata, r, extra = drive(_Owners(owners), locals())
    return finalize_result(idata, r.config, callback=None, model=r.model, extra=extra)


class _Owners(Party):
    """Several data owners, each adding its own noise (:class:`OwnerPool`)."""

    argument = "owners"
    pool_class = OwnerPool
    resume_mismatch = "`owners` differ from those of the run being resumed."

    @property
    def names(self) -> list[str]:
        return [o.name for o in self.parties]

    def check(self, r: Run) -> None:
        for owner in self.parties:
            if Neighbours.parse(owner.neighbours).factor > r.neighbours.factor:
                raise ValueError(
                    f"Owner {owner.name!r} protects {owner.neighbours!r} neighbours, which cost "
                    f"more per release than `neighbours`={r.neighbours.value!r}: run with "
                    f"neighbours={owner.neighbours!r}."
                )

    def release_mu(
        self, pool: OwnerPool, mu: float, r: Run, args: Mapping[str, Any]
    ) -> list[float]:
        """Each owner's ``mu_k``: the run's, or less where the owner's ledger has less left
        for the plan."""
        spent = pool.spent()
        owner_mu = []
        for owner in pool.owners:
            s = spent[owner.name]
            left = max(s["budget_mu"] ** 2 - s["spent_mu2"], 0.0)
            if left <= 1e-9 * s["budget_mu"] ** 2:
                raise ValueError(f"Owner {owner.name!r} has no budget left on its ledger.")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the run's calibration warned already
                mu_k = calibrate(
                    math.sqrt(left), r.plan, clip=float(args["clip"]), clip_mode=r.clip_mode
                )
            owner_mu.append(min(mu, mu_k))
        return owner_mu

    def report(self, pool: OwnerPool, idata: az.InferenceData, r: Run) -> dict[str, Any]:
        return owner_guarantees(pool, idata, r.budget)


def owner_guarantees(
    pool: OwnerPool, idata: az.InferenceData, budget: PrivacyBudget
) -> dict[str, Any]:
    """Each owner's guarantee: its own (epsilon_k, delta_k) from what its ledger committed,
    and this run's epsilons against the other owners and an outsider (at the run's delta)."""
    spent = pool.spent()
    eps, deltas, mus = [], [], []
    for owner in pool.owners:
        mu_k = math.sqrt(max(spent[owner.name]["spent_mu2"], 0.0))
        own = PrivacyBudget(owner.epsilon, owner.delta)
        eps.append(float(own.epsilon_spent(mu_k)))
        deltas.append(float(owner.delta))
        mus.append(mu_k)
    parties = owner_report(idata, budget.delta)
    return {
        "dp_owner_names": ", ".join(o.name for o in pool.owners),
        "dp_owner_epsilon": eps,
        "dp_owner_delta": deltas,
        "dp_owner_epsilon_budget": [float(o.epsilon) for o in pool.owners],
        "dp_owner_mu": mus,
        "dp_epsilon_vs_owners": parties["epsilon_vs_owners"],
        "dp_epsilon_vs_outsider": parties["epsilon_vs_outsider"],
        "dp_run_id": pool.run,
    }


#: pp.sample's arguments that carry over to the distributed sampler as they are.
_CARRIED = (
    "owners",
    "cluster",
    "epsilon",
    "delta",
    "draws",
    "tune",
    "chains",
    "neighbours",
    "min_rows",  # shards only: pymc_penalty.sample refuses it with owners
    "clip",
    "clip_mode",
    "clip_count_share",
    "ledger_path",
    "model",
    "random_seed",
    "run",
    "timeout",
)
#: ``step_kwargs`` the distributed sampler takes.
_STEP_KWARGS = (
    "S",
    "scaling",
    "adapt",
    "target_accept",
    "adapt_window",
    "tune_interval",
    "compile_kwargs",
)
#: pp.sample's warm-start arguments, which carry over to shards (refused with owners).
_WARM_START = ("warm_start", "warm_start_clip", "warm_start_steps")
#: pp.sample's own arguments at their defaults (anything else is refused with owners).
_DEFAULTS = {
    "warm_start": 0.0,
    "warm_start_clip": None,
    "warm_start_steps": WARM_START_STEPS,
    "keep_data": False,
}


def _flat_proposal(step_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """pp.sample's ``step_kwargs`` (grouped: the step's old keywords warn there) with a
    ``ProposalPolicy`` of block moves as the distributed sampler's own arguments (``adapt``,
    ``target_accept``, ``adapt_window``); another stays, to be refused by name."""
    kwargs = group_step_options(step_kwargs)
    proposal = kwargs.get("proposal")
    if proposal is None or proposal.kind != "block" or proposal.max_step is not None:
        return kwargs
    del kwargs["proposal"]
    if proposal.adapt is not None:
        kwargs["adapt"] = proposal.adapt
    kwargs["target_accept"] = proposal.target_accept
    kwargs["adapt_window"] = proposal.adapt_window
    return kwargs


def from_pp_sample(args: dict[str, Any]) -> az.InferenceData:
    """``pp.sample(..., owners=[...] or shards=[...], cluster=...)``: check that every
    argument has a meaning here (a clear error naming it otherwise, before anything starts),
    then :func:`sample` (owners) or :func:`~pymc_penalty.distributed.sample_sharded`
    (shards)."""
    party = "shards" if args.get("shards") is not None else "owners"
    if party == "shards" and args.get("owners") is not None:
        raise ValueError("Give `owners` (several parties) or `shards` (one curator), not both.")
    carried = tuple(party if k == "owners" else k for k in _CARRIED)
    if party == "shards":  # the private warm start runs on the shards' summed statistics
        carried += (*_WARM_START, "method")
    kwargs = {k: args[k] for k in carried if k in args}
    for name, default in _DEFAULTS.items():
        if name in carried:
            continue
        if args.get(name, default) != default:
            raise ValueError(f"`{name}` is not available with `{party}` (distributed sampling).")
    step_kwargs = _flat_proposal(args.get("step_kwargs") or {})
    unknown = sorted(set(step_kwargs) - set(_STEP_KWARGS))
    if unknown:
        raise ValueError(
            f"`step_kwargs` {unknown} are not available with `{party}`; accepted: {_STEP_KWARGS}."
        )
    # `method` is "penalty" with owners (pymc_penalty.sample resolved and checked it).
    ignored = {"step_kwargs", "progressbar", "owners", "shards", "method"}
    rest = set(args) - set(carried) - set(_DEFAULTS) - ignored
    if rest:
        raise ValueError(
            f"{sorted(rest)} are pm.sample arguments, not available with `{party}`; "
            "see pymc_penalty.distributed."
        )
    if party == "owners" and isinstance(kwargs.get("clip"), str):
        raise ValueError(
            "`clip` must be a number with `owners`: clip='auto' (pp.sample's default) is not "
            "available with several owners yet; give a finite positive clip (and clip_mode)."
        )
    if party == "shards":
        from pymc_penalty.distributed.sharded import sample_sharded

        return sample_sharded(**kwargs, **step_kwargs)
    return sample(**kwargs, **step_kwargs)
