"""The penalty chain driven through an :class:`~pymc_penalty.distributed.OwnerPool`.

Algorithm 2 of the source paper with each owner on its own worker: per step the driver draws
every chain's proposal, charges its own run ledger for the step's worst case, sends all
chains' points to every owner in one call, sums the owners' noisy clipped sums, and runs the
penalty test (:func:`~pymc_penalty.kernel.penalised_log_ratio`,
:func:`~pymc_penalty.kernel.penalty_decision`) with the summed noise variance. The proposal
adapts as :class:`~pymc_penalty.PenaltyMetropolis`'s does (:class:`ProposalAdapter`), from
released outcomes only. The result is finalized by the same code as :func:`pymc_penalty.sample`
(report, stripping, trimming of unreleased draws).

A stopped run is resumed by running it again with the same ``run`` id and ledger paths: the
driver is deterministic given its seed and the owners' releases, and a retried step id returns
the identical release at no new cost, so the replay walks the same path to where the run
stopped, charging nothing twice, and goes on from there.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import uuid
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import arviz as az
import numpy as np
import pymc as pm
from pymc.blocking import DictToArrayBijection, RaveledVars
from pymc.pytensorf import compile as pm_compile
from pymc.pytensorf import join_nonshared_inputs, make_shared_replacements

from pymc_penalty.accounting.gdp import split_step_mu
from pymc_penalty.adaptation import ADAPT_MODES, ProposalAdapter
from pymc_penalty.api import _finalize, _step_report
from pymc_penalty.budget import PrivacyBudget, RunPlan, available_mu, calibrate
from pymc_penalty.distributed.pool import DEFAULT_TIMEOUT, Owner, OwnerError, OwnerPool
from pymc_penalty.kernel import (
    INFO_STATS,
    PenaltyState,
    Release,
    StepNoise,
    info_stats,
    transition,
)
from pymc_penalty.ledger import PrivacyLedger
from pymc_penalty.model_checks import data_dependent_deterministics
from pymc_penalty.sensitivity import ClipMode, Neighbours, clip_bound, l2_sensitivity, step_length
from pymc_penalty.step import resolve_adapt_window
from pymc_penalty.variants.owners import owner_report

__all__ = ["DistributedSamplingError", "from_pp_sample", "owner_noise", "sample"]


class DistributedSamplingError(OwnerError):
    """An owner was lost or refused mid-run; the run stopped.

    Attributes
    ----------
    run : str
        The run id: pass it (with the same ledger paths) to :func:`sample` to resume.
    step : int
        The step id that did not complete.
    privacy_report : dict
        What the driver's ledger committed (the report of the stopped run).
    """

    def __init__(self, message: str, run: str, step: int, privacy_report: dict[str, Any]):
        super().__init__(message)
        self.run = run
        self.step = step
        self.privacy_report = privacy_report


@dataclass(frozen=True)
class _Config:
    """What the report needs to know about the step (the attributes ``build_report`` and
    ``_finalize`` read from a step)."""

    budget: PrivacyBudget
    ledger: PrivacyLedger
    neighbours: Neighbours
    clip: float
    clip_mode: ClipMode
    _model: pm.Model
    private: bool = True


def owner_noise(
    bounds: np.ndarray, neighbours: Neighbours, owner_mu: np.ndarray, clip_count_share: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each owner's noise for one step of every chain.

    Parameters
    ----------
    bounds : ndarray, shape (chains,)
        Clip bounds ``B_c``.
    neighbours : Neighbours
    owner_mu : ndarray, shape (owners,)
        Each owner's per-release Gaussian-DP ``mu_k`` (clip count included).
    clip_count_share : float
        Share of ``mu_k^2`` spent on the clip count.

    Returns
    -------
    sigmas : ndarray, shape (owners, chains)
        ``sigma_kc = Delta_c / mu_ll_k`` for the clipped sum.
    count_sds : ndarray, shape (owners,)
        Noise sd of each owner's clip count (``inf``: not released).
    mu_outsider : ndarray, shape (chains,)
        ``mu`` against an outsider, who sees only the sums: the likelihood part
        ``Delta / sqrt(sum_k sigma_k^2)`` and the count part composed.
    """
    owner_mu = np.asarray(owner_mu, dtype=np.float64)
    mu_ll, mu_count = split_step_mu(owner_mu, clip_count_share)
    delta = l2_sensitivity(np.asarray(bounds, dtype=np.float64), neighbours)
    sigmas = delta[None, :] / mu_ll[:, None]
    if clip_count_share > 0:
        count_sds = 1.0 / mu_count
        out_count2 = 1.0 / float(np.sum(count_sds**2))
    else:
        count_sds = np.full(owner_mu.shape, math.inf)
        out_count2 = 0.0
    # Delta^2 / sum_k sigma_k^2 = 1 / sum_k mu_ll_k^-2, whatever Delta is.
    out_ll2 = 1.0 / float(np.sum(mu_ll**-2.0))
    mu_out = np.full(delta.shape, math.sqrt(out_ll2 + out_count2))
    return sigmas, count_sds, mu_out


class _Journal:
    """The driver's record of a run: its per-step mus and seed, and the steps it charged.

    A file beside the run ledger (``<ledger>.runs``); without a ledger path it lives in
    memory only, and a run cannot be resumed.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.runs: dict[str, dict[str, Any]] = {}
        self.charged: dict[str, set[int]] = {}
        if path is not None and path.exists():
            for line in path.read_text().splitlines():
                entry = json.loads(line)
                if "step" in entry:
                    self.charged.setdefault(entry["run"], set()).add(int(entry["step"]))
                else:
                    self.runs[entry["run"]] = entry

    def add(self, entry: dict[str, Any]) -> None:
        if "step" in entry:
            self.charged.setdefault(entry["run"], set()).add(int(entry["step"]))
        else:
            self.runs[entry["run"]] = entry
        if self.path is not None:
            # A step line is flushed, not synced: the ledger's charge is what must survive; a
            # line lost to a power failure only makes a resumed run charge that step again.
            with open(self.path, "a") as f:
                f.write(json.dumps(entry) + "\n")
                f.flush()
                if "step" not in entry:
                    os.fsync(f.fileno())


def _prior_fn(model: pm.Model, value_vars: Sequence[Any], point: Mapping[str, np.ndarray]):
    """Log prior (Jacobians and Potentials included) of a raveled point: no data."""
    prior = model.logp(vars=list(model.free_RVs) + list(model.potentials), jacobian=True)
    shared = make_shared_replacements(point, value_vars, model)
    [out], flat = join_nonshared_inputs(
        point=point, outputs=[prior], inputs=list(value_vars), shared_inputs=shared
    )
    fn = pm_compile([flat], out)
    return lambda x: float(fn(x))


def _positive_number(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _check_args(
    draws: int,
    tune: int,
    chains: int,
    clip: float,
    share: float,
    adapt: str,
    scaling: float,
    target_accept: float,
) -> None:
    if not _positive_number(clip):
        raise ValueError("`clip` must be a finite positive number, in (0, inf).")
    if not _positive_number(scaling):
        raise ValueError("`scaling` must be a finite positive number, in (0, inf).")
    if not (isinstance(target_accept, int | float) and 0.0 < target_accept < 1.0):
        raise ValueError("`target_accept` must be in (0, 1).")
    if not 0.0 <= float(share) < 1.0:
        raise ValueError("`clip_count_share` must be in [0, 1).")
    if adapt not in ADAPT_MODES:
        raise ValueError(f"`adapt` must be one of {ADAPT_MODES}; got {adapt!r}.")
    RunPlan(int(draws), int(tune), int(chains))  # validates the three


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
    model = pm.modelcontext(model)
    budget = PrivacyBudget(float(epsilon), float(delta))
    plan = RunPlan(int(draws), int(tune), int(chains))
    _check_args(draws, tune, chains, clip, clip_count_share, adapt, scaling, target_accept)
    window = resolve_adapt_window(adapt_window, tune_interval)
    relation = Neighbours.parse(neighbours)
    mode = ClipMode.parse(clip_mode)
    share = float(clip_count_share)
    value_vars = list(model.value_vars)
    point = model.initial_point()
    x_init = DictToArrayBijection.map({v.name: point[v.name] for v in value_vars})
    d = x_init.data.size
    S = np.ones(d) if S is None else np.asarray(S, dtype=np.float64)
    if S.shape not in ((d,), (d, d)) or not np.all(np.isfinite(S)):
        raise ValueError(f"`S` must be finite, of shape ({d},) (sds) or ({d}, {d}) (covariance).")
    if ledger_path is None and run is not None:
        raise ValueError("`run` (resume) needs the `ledger_path` of the stopped run.")
    ledger = (
        PrivacyLedger(budget.mu) if ledger_path is None else PrivacyLedger(budget.mu, ledger_path)
    )
    journal = _Journal(None if ledger_path is None else Path(str(ledger_path) + ".runs"))
    if run is not None and run not in journal.runs:
        raise ValueError(f"`run`={run!r} is not in the journal of `ledger_path`: no run to resume.")
    resumed = journal.runs.get(run) if run is not None else None
    config = _Config(budget, ledger, relation, float(clip), mode, model)

    for owner in owners:
        if Neighbours.parse(owner.neighbours).factor > relation.factor:
            raise ValueError(
                f"Owner {owner.name!r} protects {owner.neighbours!r} neighbours, which cost more "
                f"per release than `neighbours`={relation.value!r}: run with "
                f"neighbours={owner.neighbours!r}."
            )
    own_pool = pool is None
    if own_pool:
        pool = OwnerPool(
            owners,
            model,
            value_vars,
            point,
            cluster=cluster,
            timeout=timeout,
            compile_kwargs=compile_kwargs,
            run=run,
        )
    else:  # a pool the caller started: this run gets its own step ids
        if [o.name for o in owners] != [o.name for o in pool.owners]:
            raise ValueError("`owners` must be the owners `pool` was started with.")
        pool.run = run or uuid.uuid4().hex
        pool._step = 0
    try:
        if resumed is None:
            mu_run = calibrate(
                available_mu(ledger),
                plan,
                clip=float(clip),
                clip_mode=mode,
                neighbours=relation,
                clip_count_share=share,
            )
            spent = pool.spent()
            owner_mu = []
            for owner in pool.owners:
                s = spent[owner.name]
                left = max(s["budget_mu"] ** 2 - s["spent_mu2"], 0.0)
                if left <= 1e-9 * s["budget_mu"] ** 2:
                    raise ValueError(f"Owner {owner.name!r} has no budget left on its ledger.")
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # the run's calibration warned already
                    mu_k = calibrate(math.sqrt(left), plan, clip=float(clip), clip_mode=mode)
                owner_mu.append(min(mu_run, mu_k))
            seed = secrets.randbits(63) if random_seed is None else int(random_seed)
            header = {
                "run": pool.run,
                "owner_mu": owner_mu,
                "seed": seed,
                "owners": [o.name for o in pool.owners],
                "plan": [plan.draws, plan.tune, plan.chains],
            }
            journal.add(header)
        else:
            header = resumed
            if header["owners"] != [o.name for o in pool.owners]:
                raise ValueError("`owners` differ from those of the run being resumed.")
            if header["plan"] != [plan.draws, plan.tune, plan.chains]:
                raise ValueError("`draws`, `tune` and `chains` differ from the run being resumed.")
        idata = _run_chains(
            pool, config, journal, header, plan, share, model, value_vars, x_init, S,
            scaling=float(scaling), adapt=adapt, target_accept=float(target_accept),
            adapt_window=window,
        )  # fmt: skip
        extra = _owner_guarantees(pool, idata, budget)
    finally:
        if own_pool:
            pool.close()
    return _finalize(idata, config, callback=None, model=model, extra=extra)


def _run_chains(
    pool: OwnerPool,
    config: _Config,
    journal: _Journal,
    header: dict[str, Any],
    plan: RunPlan,
    share: float,
    model: pm.Model,
    value_vars: list[Any],
    x_init: RaveledVars,
    S: np.ndarray,
    *,
    scaling: float,
    adapt: str,
    target_accept: float,
    adapt_window: int,
) -> az.InferenceData:
    """The lockstep loop over steps, all chains at once; returns the raw InferenceData."""
    chains, steps = plan.chains, plan.tune + plan.draws
    owner_mu = np.asarray(header["owner_mu"], dtype=np.float64)
    step_mu = float(owner_mu.max())
    run = header["run"]
    charged = journal.charged.get(run, set())
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(header["seed"]).spawn(chains)]
    adapters = [
        ProposalAdapter.create(S, scaling, adapt, target_accept, adapt_window)
        for _ in range(chains)
    ]
    prior = _prior_fn(model, value_vars, model.initial_point())
    xs = np.tile(np.asarray(x_init.data, dtype=np.float64), (chains, 1))
    logpriors = np.array([prior(x) for x in xs])
    trace = np.empty((chains, steps, xs.shape[1]))
    names = ["scaling", *(f"dp_mu_owner_{k}" for k in range(len(owner_mu))), "dp_mu_outsider"]
    stats = {name: np.zeros((chains, steps)) for name in names}
    stats.update({name: np.zeros((chains, steps), dtype=dt) for name, dt in INFO_STATS.values()})
    stopped = False
    for t in range(steps):
        trace[:, t] = xs
        if stopped:
            continue
        x1s = np.empty_like(xs)
        lengths = np.empty(chains)
        for c, adapter in enumerate(adapters):
            x1s[c] = adapter.propose(rngs[c], xs[c])
            lengths[c] = step_length(config.clip_mode, x1s[c] - xs[c], adapter.chol)
        bounds = np.array([clip_bound(config.clip, config.clip_mode, ln) for ln in lengths])
        sigmas, count_sds, mu_out = owner_noise(bounds, config.neighbours, owner_mu, share)
        stats["scaling"][:, t] = [a.scaling for a in adapters]
        # The worst case of the step, committed before it is sent (a lost reply is counted).
        if t not in charged:
            if not config.ledger.try_spend(chains * step_mu**2):
                stopped = True
                continue
            journal.add({"run": run, "step": t})
        mu2 = np.repeat(owner_mu[:, None] ** 2, chains, axis=1)
        try:
            reply = pool.release(xs, x1s, bounds, sigmas, count_sds, mu2, step=t)
        except OwnerError as exc:
            report = _step_report(config, config.budget, None, math.nan, _released(stats))
            raise DistributedSamplingError(
                f"{exc} Run {run!r} stopped at step {t} (the driver's ledger has committed "
                f"epsilon = {report['dp_epsilon']:.4g} of {config.budget.epsilon:g}); resume "
                f"with sample(..., run={run!r}) on the same ledger paths.",
                run,
                t,
                report,
            ) from None
        if reply is None:  # an owner's ledger could not pay: nothing more is released
            stopped = True
            continue
        sums, counts = reply
        d_hat, clipped = sums.sum(axis=0), counts.sum(axis=0)
        noise_var = np.sum(sigmas**2, axis=0)
        delta = l2_sensitivity(bounds, config.neighbours)
        party = tuple((f"dp_mu_owner_{k}", m) for k, m in enumerate(owner_mu))
        tuning = t < plan.tune
        for c, adapter in enumerate(adapters):
            party_c = (*party, ("dp_mu_outsider", mu_out[c]))
            noise = StepNoise.from_var(delta[c], noise_var[c], step_mu, party_c)

            def release(
                state: PenaltyState, x1: np.ndarray, d: float = d_hat[c], n: float = clipped[c]
            ) -> Release:
                # The owners' replies, charged above (the clipped fraction would need the row
                # counts, which the driver never receives).
                return Release(d, PenaltyState(x1, prior(x1)), n)

            state = PenaltyState(xs[c].copy(), logpriors[c])
            new, info = transition(rngs[c], state, x1s[c], noise, release)
            xs[c], logpriors[c] = new.position, new.log_prior
            adapter.after_decision(info.accepted)
            if tuning:
                adapter.update(xs[c], info.accept, info.accepted)
            for name, value in info_stats(info).items():
                stats[name][c, t] = value
    return _inference_data(model, value_vars, x_init, trace, stats, plan)


def _released(stats: dict[str, np.ndarray]) -> dict[int, int]:
    return {c: int(n) for c, n in enumerate(stats["dp_released"].sum(axis=1))}


def _inference_data(
    model: pm.Model,
    value_vars: list[Any],
    x_init: RaveledVars,
    trace: np.ndarray,
    stats: dict[str, np.ndarray],
    plan: RunPlan,
) -> az.InferenceData:
    """Posterior draws of the free variables and data-free Deterministics, and the stats."""
    leaky = set(data_dependent_deterministics(model))
    outs = [v for v in [*model.free_RVs, *model.deterministics] if v.name not in leaky]
    fn = pm_compile(value_vars, model.replace_rvs_by_values(outs), on_unused_input="ignore")
    chains, steps = trace.shape[:2]
    values: dict[str, list[np.ndarray]] = {v.name: [] for v in outs}
    for x in trace.reshape(chains * steps, -1):
        pt_ = DictToArrayBijection.rmap(RaveledVars(x, x_init.point_map_info))
        for v, val in zip(outs, fn(*[pt_[v.name] for v in value_vars]), strict=True):
            values[v.name].append(np.asarray(val))
    arrays = {k: np.stack(v).reshape(chains, steps, *v[0].shape) for k, v in values.items()}
    tune = plan.tune
    dims = {k: list(model.named_vars_to_dims[k]) for k in arrays if k in model.named_vars_to_dims}
    used = {dim for ds in dims.values() for dim in ds}
    coords = {k: list(v) for k, v in model.coords.items() if k in used and v is not None}
    idata = az.from_dict(
        posterior={k: v[:, tune:] for k, v in arrays.items()},
        warmup_posterior={k: v[:, :tune] for k, v in arrays.items()},
        sample_stats={k: v[:, tune:] for k, v in stats.items()},
        warmup_sample_stats={k: v[:, :tune] for k, v in stats.items()},
        dims=dims,
        coords=coords,
        save_warmup=True,
    )
    idata.sample_stats.attrs["tuning_steps"] = tune
    return idata


def _owner_guarantees(
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
#: pp.sample's own arguments at their defaults (anything else is refused with owners).
_DEFAULTS = {"warm_start": 0.0, "warm_start_clip": None, "warm_start_steps": 8, "keep_data": False}


def from_pp_sample(args: dict[str, Any]) -> az.InferenceData:
    """``pp.sample(..., owners=[...], cluster=...)``: check that every argument has a meaning
    here (a clear error naming it otherwise, before anything starts), then :func:`sample`."""
    kwargs = {k: args[k] for k in _CARRIED if k in args}
    for name, default in _DEFAULTS.items():
        if args.get(name, default) != default:
            raise ValueError(f"`{name}` is not available with `owners` (distributed sampling).")
    step_kwargs = dict(args.get("step_kwargs") or {})
    unknown = sorted(set(step_kwargs) - set(_STEP_KWARGS))
    if unknown:
        raise ValueError(
            f"`step_kwargs` {unknown} are not available with `owners`; accepted: {_STEP_KWARGS}."
        )
    rest = set(args) - set(_CARRIED) - set(_DEFAULTS) - {"step_kwargs", "progressbar"}
    if rest:
        raise ValueError(
            f"{sorted(rest)} are pm.sample arguments, not available with `owners`; "
            "see pymc_penalty.distributed.sample."
        )
    if isinstance(kwargs.get("clip"), str):
        raise ValueError(
            "`clip` must be a number with `owners`: clip='auto' (pp.sample's default) is not "
            "available in distributed sampling yet; give a finite positive clip (and clip_mode)."
        )
    return sample(**kwargs, **step_kwargs)
