"""The driver's lockstep loop over steps, all chains at once (:func:`run_chains`), and the
raw InferenceData it returns: per step it draws every chain's proposal, charges the run ledger
for the step's worst case, sends all chains' points to every owner in one call, and runs the
penalty test on the summed releases."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import arviz as az
import numpy as np
import pymc as pm
from pymc.blocking import DictToArrayBijection, RaveledVars
from pymc.pytensorf import compile as pm_compile
from pymc.pytensorf import join_nonshared_inputs, make_shared_replacements

from pymc_penalty.accounting.sensitivity import step_length
from pymc_penalty.distributed._setup import Journal, RunConfig, owner_noise
from pymc_penalty.distributed.pool import OwnerPool
from pymc_penalty.errors import DistributedSamplingError, OwnerError
from pymc_penalty.model.checks import data_dependent_deterministics
from pymc_penalty.privacy.budget import RunPlan
from pymc_penalty.privacy.mechanism import release_noise
from pymc_penalty.results.publish import step_report as _step_report
from pymc_penalty.sampling.adaptation import ProposalAdapter
from pymc_penalty.sampling.adaptation.pending import PendingTuning
from pymc_penalty.sampling.adaptation.state import adapt_found_clip, found_clip_adapter
from pymc_penalty.sampling.kernel import (
    INFO_STATS,
    PenaltyState,
    Release,
    StepNoise,
    info_stats,
    transition,
)
from pymc_penalty.sampling.step import FREE_MOVES, free_factor, free_moves
from pymc_penalty.sampling.taylor import TaylorModel, compare_moves, draw_move

__all__ = ["DistributedSamplingError", "run_chains", "stopped_error"]


def _prior_fn(model: pm.Model, value_vars: Sequence[Any], point: Mapping[str, np.ndarray]):
    """Log prior (Jacobians and Potentials included) of a raveled point: no data."""
    prior = model.logp(vars=list(model.free_RVs) + list(model.potentials), jacobian=True)
    shared = make_shared_replacements(point, value_vars, model)
    [out], flat = join_nonshared_inputs(
        point=point, outputs=[prior], inputs=list(value_vars), shared_inputs=shared
    )
    fn = pm_compile([flat], out)
    return lambda x: float(fn(x))


def run_chains(
    pool: OwnerPool | Any,
    config: RunConfig,
    journal: Journal,
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
    party_stats: bool = True,
    starts: np.ndarray | None = None,
    found_clip: dict[str, Any] | None = None,
    taylor: TaylorModel | None = None,
    free: np.ndarray | None = None,
) -> az.InferenceData:
    """The lockstep loop over steps, all chains at once; returns the raw InferenceData.

    ``pool`` is an :class:`OwnerPool` or a :class:`~pymc_penalty.distributed.shards.ShardPool`
    (one party: the curator, whose noise the pool adds once). ``party_stats`` records each
    owner's and the outsider's ``mu`` per step (off for shards, where there are no parties).
    ``starts`` (chains, d): each chain's first point (a warm start's), else ``x_init``.
    ``found_clip`` (``clip="auto"``, :func:`~pymc_penalty.distributed._warm.found_clip_start`):
    each chain's clip starts there and moves in tuning with the chain's released clipped
    counts, as the penalty step's (``found_clip_adapter`` and ``adapt_found_clip`` of
    :mod:`pymc_penalty.sampling.adaptation.state`), recorded per step as ``dp_clip``.
    ``taylor`` (a released :class:`~pymc_penalty.sampling.taylor.TaylorModel`; shards whose
    :meth:`~pymc_penalty.distributed.shards.ShardPool.taylor_control` was built at its
    expansion): the Taylor path's chains, as
    :class:`~pymc_penalty.sampling.taylor.TaylorPenaltyMetropolis` runs them in-process. The
    bound is ``config.clip`` times :meth:`TaylorModel.residual_length`, the shards release
    the clipped residual sums (``residual=True``), the released model's difference and any
    Hastings term (public) are added to each release, and after tuning each chain draws its
    moves by :func:`~pymc_penalty.sampling.taylor.draw_move`, with the independent moves'
    share chosen once per chain by :func:`~pymc_penalty.sampling.taylor.compare_moves`.
    ``free``: the coordinates no row's log-likelihood reads
    (:func:`~pymc_penalty.model.likelihood.likelihood_coordinates`, model structure); after
    each released step every chain moves them by
    :data:`~pymc_penalty.sampling.step.FREE_MOVES` Metropolis moves on the exact prior
    (:func:`~pymc_penalty.sampling.step.free_moves`, as the in-process step does: no data,
    no release).
    """
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
    # Each chain's last tuning update, applied at the start of the next step if it tunes (as
    # PenaltyMetropolis does): the first draw uses the proposal the last tuning draw recorded.
    pending = [PendingTuning() for _ in range(chains)]
    clips = np.full(chains, config.clip, dtype=np.float64)
    found: list[Any] = []
    if found_clip is not None:
        clips[:] = float(found_clip["start"])
        found = [
            [found_clip_adapter(clips[c], found_clip["n_public"], adapt_window,
                                bool(found_clip["probe"])), adapters[c].chol]
            for c in range(chains)
        ]  # fmt: skip

    def tune_chain(
        c: int, x: np.ndarray, accept: float, accepted: bool, count: tuple | None = None
    ) -> None:
        """A chain's held tuning update: its proposal, then its found clip (released
        values only)."""
        adapters[c].update(x, accept, accepted)
        if count is not None and found:
            found[c][1] = adapt_found_clip(found[c][0], *count, found[c][1], adapters[c].chol)
            clips[c] = found[c][0].clip

    prior = _prior_fn(model, value_vars, model.initial_point())
    xs = (
        np.tile(np.asarray(x_init.data, dtype=np.float64), (chains, 1))
        if starts is None
        else np.array(starts, dtype=np.float64).reshape(chains, -1)
    )
    logpriors = np.array([prior(x) for x in xs])
    # The Taylor path's independent moves: each chain's share, chosen at its first step
    # after tuning (public inputs), and each step's Hastings term.
    move_shares: list[float | None] = [None] * chains
    hastings = np.zeros(chains)

    def sigma_of(length: float) -> float:
        """A move's noise sd for its bound's length (as the in-process step computes it)."""
        noise = release_noise(
            config.clip, config.clip_mode, config.neighbours, length, mu=step_mu, count_share=share
        )
        return float(noise.sigma)

    def propose(c: int, tuning: bool) -> tuple[np.ndarray, float]:
        """Chain ``c``'s proposal and its Hastings term (public: its generator and the
        tuned proposal)."""
        walk = functools.partial(adapters[c].propose, rngs[c], xs[c])
        if taylor is None or tuning:
            return walk(), 0.0
        if move_shares[c] is None:
            scaled = adapters[c].scaling * adapters[c].chol
            move_shares[c] = compare_moves(taylor, scaled, sigma_of).share
        return draw_move(taylor, rngs[c], xs[c], float(move_shares[c]), walk)

    free = np.zeros(0, dtype=int) if free is None else np.asarray(free, dtype=int)
    factors: list[tuple[Any, np.ndarray] | None] = [None] * chains

    def move_free(c: int) -> None:
        """Chain ``c``'s free moves (public: the prior, its generator, its metric)."""
        chol = adapters[c].chol
        if factors[c] is None or factors[c][0] is not chol:
            factors[c] = (chol, free_factor(chol, free))
        xs[c], logpriors[c] = free_moves(
            xs[c], logpriors[c], free, factors[c][1], prior, rngs[c], FREE_MOVES
        )

    whitened: list[tuple[np.ndarray, np.ndarray] | None] = [None] * chains

    def bound_length(c: int, x1: np.ndarray) -> float:
        """The length the bound scales by (public: the two points). On the Taylor path the
        move's two whitened points are kept for the released model's difference (whitened
        once per move)."""
        if taylor is not None:
            whitened[c] = (taylor.whiten(xs[c]), taylor.whiten(x1))
            return taylor.residual_length_of(*whitened[c])
        return step_length(config.clip_mode, x1 - xs[c], adapters[c].chol)

    trace = np.empty((chains, steps, xs.shape[1]))
    names = ["scaling"] + (["dp_clip"] if found else [])
    if party_stats:
        names += [*(f"dp_mu_owner_{k}" for k in range(len(owner_mu))), "dp_mu_outsider"]
    stats = {name: np.zeros((chains, steps)) for name in names}
    stats.update({name: np.zeros((chains, steps), dtype=dt) for name, dt in INFO_STATS.values()})
    stopped = False
    residual = {} if taylor is None else {"residual": True}
    for t in range(steps):
        trace[:, t] = xs
        if stopped:
            continue
        tuning = t < plan.tune
        x1s = np.empty_like(xs)
        lengths = np.empty(chains)
        for c in range(chains):
            pending[c].start_step(tuning, lambda *held, c=c: tune_chain(c, *held))
            x1s[c], hastings[c] = propose(c, tuning)
            lengths[c] = bound_length(c, x1s[c])
        chain_noise = release_noise(
            clips if found else config.clip, config.clip_mode, config.neighbours, lengths,
            mu=step_mu,
        )  # fmt: skip
        bounds = np.broadcast_to(chain_noise.bound, lengths.shape).astype(np.float64)
        delta = np.broadcast_to(chain_noise.sensitivity, lengths.shape)
        sigmas, count_sds, mu_out = owner_noise(bounds, config.neighbours, owner_mu, share)
        stats["scaling"][:, t] = [a.scaling for a in adapters]
        if found:
            stats["dp_clip"][:, t] = clips
        # The worst case of the step, committed before it is sent (a lost reply is counted).
        if t not in charged:
            if not config.ledger.try_spend(chains * step_mu**2):
                stopped = True
                continue
            journal.add({"run": run, "step": t})
        mu2 = np.repeat(owner_mu[:, None] ** 2, chains, axis=1)
        try:
            reply = pool.release(xs, x1s, bounds, sigmas, count_sds, mu2, step=t, **residual)
        except OwnerError as exc:
            raise stopped_error(exc, config, run, t, _released(stats)) from None
        if reply is None:  # an owner's ledger could not pay: nothing more is released
            stopped = True
            continue
        sums, counts = reply
        d_hat, clipped = sums.sum(axis=0), counts.sum(axis=0)
        noise_var = np.sum(sigmas**2, axis=0)
        party = tuple((f"dp_mu_owner_{k}", m) for k, m in enumerate(owner_mu))
        if taylor is not None:  # public: the released model's difference, the Hastings term
            public = [taylor.model_difference(*whitened[c]) for c in range(chains)]
            d_hat = d_hat + np.asarray(public) + hastings
        for c, adapter in enumerate(adapters):
            party_c = (*party, ("dp_mu_outsider", mu_out[c])) if party_stats else ()
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
            if free.size:
                move_free(c)
            if tuning:
                count = (clipped[c], float(count_sds[0])) if found else None
                pending[c].hold(xs[c].copy(), info.accept, info.accepted, count)
            for name, value in info_stats(info).items():
                stats[name][c, t] = value
    return _inference_data(model, value_vars, x_init, trace, stats, plan)


def stopped_error(
    exc: OwnerError, config: RunConfig, run: str, step: int, released: dict[int, int]
) -> DistributedSamplingError:
    """The error of a journaled run that a lost, hung or failed party stopped at ``step``:
    it names the party (``exc``) and what the driver's ledger committed, and its ``run``
    resumes it."""
    report = _step_report(config, config.budget, None, math.nan, released)
    return DistributedSamplingError(
        f"{exc} Run {run!r} stopped at step {step} (the driver's ledger has committed "
        f"epsilon = {report['dp_epsilon']:.4g} of {config.budget.epsilon:g}); resume "
        f"with sample(..., run={run!r}) on the same ledger paths.",
        run,
        step,
        report,
    )


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
