"""What a sharded run settles before its chains: the private warm start
(:func:`sharded_warm_start`) and the found clip's start (:func:`found_clip_start`), each as
the run journal keeps it (:func:`warm_header`), so a resumed run reuses them instead of
releasing anything again.

The warm start is the in-process one (:func:`~pymc_penalty.warmstart.warm_start_on`, the same
Fisher scoring on the same released statistics), reading the table through
:meth:`~pymc_penalty.distributed.shards.ShardPool.warm_statistics`: each release is committed
to the driver's ledger before any shard is asked, every shard returns its exact sums (pairs
formed within the shard) and the driver adds one noise to their total, calibrated for the
whole table (one row sits in one shard: the sensitivities of
:mod:`~pymc_penalty.warmstart.releases` hold for the total). Under add/remove-one the first
step's noisy count of the rows is the shards' counts summed plus one noise, and the pair
terms are estimated from it and the public number of shards; under substitute-one the
shards' row counts are public (the relation keeps every shard's size) and give the pairs.
"""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace
from typing import Any

import numpy as np

from pymc_penalty.accounting.sensitivity import Neighbours
from pymc_penalty.distributed._setup import Run
from pymc_penalty.distributed.shards import ShardPool
from pymc_penalty.model.likelihood import likelihood_coordinates
from pymc_penalty.planning.plan import (
    chain_starts,
    clip_tail,
    positive_definite,
    warm_start_report,
)
from pymc_penalty.planning.taylor_forecast import start_offset
from pymc_penalty.privacy.taylor import TaylorRelease
from pymc_penalty.sampling.adaptation.state import starting_proposal
from pymc_penalty.sampling.taylor import TaylorModel
from pymc_penalty.warmstart import LogPrior, WarmStart, warm_start_on
from pymc_penalty.warmstart.taylor import TAYLOR_FIRST_STAGE, staged_oneshot, taylor_oneshot_on
from pymc_penalty.warmstart.taylor_terms import Expansion

__all__ = [
    "found_clip_start",
    "sharded_taylor_oneshot",
    "sharded_warm_start",
    "taylor_expansion",
    "taylor_from_header",
    "taylor_header",
    "warm_header",
    "warm_report",
]


def sharded_warm_start(
    pool: ShardPool,
    r: Run,
    *,
    mu: float,
    clip: float | str,
    steps: int,
    noise_rng: np.random.Generator | None = None,
) -> WarmStart:
    """The private warm start on the table of ``pool``'s shards, spending ``mu`` from the
    run's ledger (its unused reservation returned after it, also when it stops).

    Parameters
    ----------
    pool : ShardPool
        The started shards.
    r : Run
        The run (its model, relation and ledger).
    mu : float
        Gaussian-DP ``mu`` of all the warm start's releases.
    clip : float or "auto"
        The warm start's gradient clip (:func:`~pymc_penalty.warmstart.warm_start_clips`).
    steps : int
        Fisher-scoring steps.
    noise_rng : numpy.random.Generator, optional
        Source of the privacy noise; fresh from OS entropy by default (a seeded one only for
        reproducible, non-private comparisons).

    Returns
    -------
    WarmStart
    """
    data = pool.warm_statistics(r.neighbours, int(r.x_init.data.size))
    prior = LogPrior(r.model, r.value_vars, r.point)
    noise = np.random.default_rng() if noise_rng is None else noise_rng
    try:
        return warm_start_on(
            data, r.model, r.value_vars, r.point, prior,
            mu=float(mu), ledger=r.ledger, clip=clip, steps=int(steps), noise=noise,
        )  # fmt: skip
    finally:
        r.ledger.release_unused()


def sharded_taylor_oneshot(
    pool: ShardPool,
    r: Run,
    warm: WarmStart,
    *,
    mu: float,
    noise_rng: np.random.Generator | None = None,
) -> TaylorModel:
    """The Taylor path's one-shot release on the table of ``pool``'s shards, at the private
    warm start's point, spending ``mu`` from the run's ledger in stages, as
    :func:`pymc_penalty.sample` does in-process
    (:func:`~pymc_penalty.warmstart.taylor.staged_oneshot`; its unused reservation
    returned after each stage, also when it stops).

    Each release is committed to the driver's ledger before any shard is asked for the sum
    it feeds; every shard returns its exact sum (histogram counts, or the clipped ``G`` and
    ``H`` packed: rows clipped on the shard before they are summed) and the driver adds one
    noise to the total, calibrated for the whole table (one row sits in one shard, every
    term is one row's: the in-process sensitivities hold). The only row count used is the
    warm start's public ``n_rows`` (``n``, or its released count under add/remove-one).

    Parameters
    ----------
    pool : ShardPool
        The started shards.
    r : Run
        The run (its model, relation and ledger).
    warm : WarmStart
        The private warm start (public): the expansion point and metric.
    mu : float
        Gaussian-DP ``mu`` of all the one-shot's releases.
    noise_rng : numpy.random.Generator, optional
        Source of the privacy noise; fresh from OS entropy by default (a seeded one only for
        reproducible, non-private comparisons).

    Returns
    -------
    TaylorModel
        Its ``control`` is None: the rows' clipped coefficients stay on the shards.
    """
    data = pool.taylor_statistics()
    reads = likelihood_coordinates(r.model, r.value_vars, r.point)
    prior = LogPrior(r.model, r.value_vars, r.point)
    noise = np.random.default_rng() if noise_rng is None else noise_rng

    def stage(at: WarmStart, **kwargs: Any) -> TaylorModel:
        try:
            return taylor_oneshot_on(
                data, at, reads=reads, prior=prior, relation=r.neighbours, ledger=r.ledger,
                noise_rng=noise, **kwargs,
            )  # fmt: skip
        finally:
            r.ledger.release_unused()

    model, expand_at = staged_oneshot(stage, warm, float(mu) ** 2, TAYLOR_FIRST_STAGE)
    # Where the chains start, in the expansion's metric (public; for the forecast).
    return dataclasses.replace(model, start_offset=start_offset(model, expand_at.covariance))


#: The TaylorModel fields a run journal keeps as arrays (the others are numbers).
_TAYLOR_ARRAYS = ("t", "L", "point", "covariance")


def taylor_header(model: TaylorModel) -> dict[str, Any]:
    """What the run journal keeps of the released Taylor model: its public fields (never
    ``control``, the rows' coefficients, which stay on the shards), so that a resumed run
    rebuilds it (:func:`taylor_from_header`) and releases nothing of the one-shot again."""
    out: dict[str, Any] = {}
    for field in dataclasses.fields(model):
        value = getattr(model, field.name)
        if field.name == "control":
            continue
        if field.name == "release":
            value = {k: None if v is None else np.asarray(v, float).tolist()
                     for k, v in value._asdict().items()}  # fmt: skip
        elif isinstance(value, np.ndarray):
            value = value.tolist()
        elif isinstance(value, np.integer | int):
            value = int(value)
        elif value is not None:
            value = float(value)
        out[field.name] = value
    return out


def taylor_from_header(header: dict[str, Any]) -> TaylorModel:
    """The released Taylor model a run journal kept (:func:`taylor_header`), without
    ``control``: the shards rebuild their residuals from its public expansion
    (:func:`taylor_expansion`, :meth:`ShardPool.taylor_control`)."""
    kept = dict(header)
    release = {
        k: v if k in ("sd_G", "sd_H", "mu2") or v is None else np.asarray(v, dtype=np.float64)
        for k, v in kept.pop("release").items()
    }
    for name in _TAYLOR_ARRAYS:
        kept[name] = np.asarray(kept[name], dtype=np.float64)
    if kept.get("index") is not None:
        kept["index"] = np.asarray(kept["index"], dtype=np.int64)
    return TaylorModel(release=TaylorRelease(**release), control=None, **kept)


def taylor_expansion(model: TaylorModel) -> tuple[Expansion, float, float | None]:
    """``(expansion, c_g, c_H)`` of a released Taylor model: what
    :meth:`ShardPool.taylor_control` builds the shards' residuals from (public values)."""
    index = np.arange(model.t.size) if model.index is None else model.index
    e = Expansion(model.t, model.L, index, int(model.order))
    return e, float(model.clip_g), None if model.order == 1 else float(model.clip_H)


def warm_header(
    warm: WarmStart, r: Run, share: float, seed: int, S: np.ndarray | None
) -> dict[str, Any]:
    """What the run journal keeps of a warm start (public post-processing of its releases):
    its share, ``mu`` and release count (for the report), each chain's start and the
    proposal metric ``S``.

    Each chain starts at a draw of the warm start's Gaussian approximation, the draws centred
    on its point (:func:`~pymc_penalty.planning.plan.chain_starts`, seeded by the run's
    ``seed``); ``S`` is the caller's, or the warm start's covariance when none was given.
    """
    starts = chain_starts(warm, r.plan.chains, seed)
    xs = [
        np.concatenate([np.ravel(start[v.name]) for v in r.value_vars]).astype(float).tolist()
        for start in starts
    ]
    metric = positive_definite(warm.covariance) if S is None else np.asarray(S, dtype=float)
    header = {
        "share": float(share),
        "mu": float(warm.mu),
        "releases": int(warm.releases),
        "starts": xs,
        "S": metric.tolist(),
        # The chains' found clip starts higher on heavier tails (released values only).
        "clip_tail": float(clip_tail(warm)),
    }
    if r.neighbours is Neighbours.ADD_REMOVE:  # its released (noisy) count of the rows
        header["n_rows"] = float(warm.n_rows)
    return header


def found_clip_start(
    pool: ShardPool, r: Run, warm: dict[str, Any] | None, S: np.ndarray | None
) -> dict[str, Any]:
    """The start of the chains' found clip (``clip="auto"``), as the run journal keeps it,
    by :func:`pymc_penalty.sample`'s rules (public values only).

    The row count it aims with is ``n`` under substitute-one (the shards' sizes, public
    there); under add/remove-one the clip aims at one clipped row per release and starts from
    the warm start's released count (or from no count without one). After a warm start, or
    with ``S`` given, the metric is taken for the posterior's shape and the clip starts at its
    Gaussian tail times the warm start's ``clip_tail`` and never probes down; otherwise it
    probes from :func:`~pymc_penalty.sampling.adaptation.starting_clip` with the proposal's
    sds at :func:`~pymc_penalty.sampling.adaptation.starting_sd` (``S``)."""
    adds = r.neighbours is Neighbours.ADD_REMOVE
    size = int(r.x_init.data.size)
    n_public = None if adds else int(pool.warm_statistics(r.neighbours, size).rows())
    start_rows = n_public if not adds else (None if warm is None else warm.get("n_rows"))
    shaped = warm is not None or S is not None
    given = np.asarray(warm["S"]) if warm is not None else S
    metric, clip = starting_proposal(
        given, size, "auto", start_rows, 1.0 if warm is None else float(warm["clip_tail"])
    )
    return {
        "start": float(clip),
        "n_public": n_public,
        "probe": not shaped,
        "S": None if shaped else np.asarray(metric, dtype=float).tolist(),
    }


def warm_report(header: dict[str, Any]) -> dict[str, Any]:
    """The report's ``dp_warm_start_*`` keys from a run's journaled warm start (zeros
    without one), as :func:`pymc_penalty.sample` reports its own."""
    warm = header.get("warm_start")
    if not warm:
        return warm_start_report(None, 0.0)
    kept = SimpleNamespace(mu=warm["mu"], releases=warm["releases"])
    return warm_start_report(kept, warm["share"])


def split_mu(available: float, share: float) -> tuple[float, float]:
    """``(warm start's mu, chains' mu)`` of what the ledger has left, ``share`` of its
    ``mu^2`` to the warm start (fixed before anything is spent)."""
    return available * math.sqrt(share), available * math.sqrt(1.0 - share)
