"""What a distributed run is before its first step: the argument checks, the view of the step
the privacy report reads (:class:`RunConfig`), each owner's noise (:func:`owner_noise`) and the
driver's journal of runs and charged steps (:class:`Journal`)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pymc as pm
from pymc.blocking import DictToArrayBijection, RaveledVars

from pymc_penalty.accounting.gdp import split_step_mu
from pymc_penalty.accounting.sensitivity import ClipMode, Neighbours
from pymc_penalty.privacy.budget import PrivacyBudget, RunPlan
from pymc_penalty.privacy.ledger import PrivacyLedger
from pymc_penalty.privacy.mechanism import release_noise
from pymc_penalty.sampling.adaptation import ADAPT_MODES
from pymc_penalty.sampling.setup import resolve_adapt_window
from pymc_penalty.sampling.taylor import TaylorModel

__all__ = ["Journal", "Run", "RunConfig", "check_args", "owner_noise", "prepare_run"]


@dataclass(frozen=True)
class RunConfig:
    """What the report needs to know about the step (the attributes ``build_report`` and
    ``_finalize`` read from a step)."""

    budget: PrivacyBudget
    ledger: PrivacyLedger
    neighbours: Neighbours
    clip: float
    clip_mode: ClipMode
    _model: pm.Model
    private: bool = True
    #: The clip constant is found in tuning (``clip="auto"``: per chain, ``dp_clip``).
    clip_auto: bool = False
    #: The released Taylor model the chains release residuals after (the Taylor path on
    #: shards; ``finalize_result`` integrates its noise out, as after the in-process step).
    taylor: TaylorModel | None = None

    def describe_sensitivity(self) -> str | None:
        """The Taylor path's residual bound in words (None: the clip's, as the report says
        it for the plain walk)."""
        return None if self.taylor is None else self.taylor.describe_bound()


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
    bounds = np.asarray(bounds, dtype=np.float64)
    # The one mechanism, each owner's mu against each chain's bound (already computed).
    noise = release_noise(
        bounds[None, :],
        ClipMode.CONSTANT,
        neighbours,
        0.0,
        mu=owner_mu[:, None],
        count_share=clip_count_share,
    )
    sigmas = np.broadcast_to(noise.sigma, (owner_mu.size, bounds.size)).astype(np.float64)
    count_sds = np.broadcast_to(noise.count_sd, (owner_mu.size, 1))[:, 0].astype(np.float64)
    out_count2 = 1.0 / float(np.sum(count_sds**2)) if clip_count_share > 0 else 0.0
    # Delta^2 / sum_k sigma_k^2 = 1 / sum_k mu_ll_k^-2, whatever Delta is.
    mu_ll, _ = split_step_mu(owner_mu, clip_count_share)
    out_ll2 = 1.0 / float(np.sum(mu_ll**-2.0))
    mu_out = np.full(bounds.shape, math.sqrt(out_ll2 + out_count2))
    return sigmas, count_sds, mu_out


class Journal:
    """The driver's record of a run: its per-step mus and seed, and the steps it charged.

    A file beside the run ledger (``<ledger>.runs``); without a ledger path it lives in
    memory only, and a run cannot be resumed.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.runs: dict[str, dict[str, Any]] = {}
        self.charged: dict[str, set[int]] = {}
        #: ``(run, step) -> digest`` of the points a sharded run released a step for.
        self.points: dict[tuple[str, int], str] = {}
        if path is not None and path.exists():
            for line in path.read_text().splitlines():
                self._note(json.loads(line))

    def _note(self, entry: dict[str, Any]) -> None:
        if "digest" in entry:
            self.points[(entry["run"], int(entry["step"]))] = entry["digest"]
        elif "step" in entry:
            self.charged.setdefault(entry["run"], set()).add(int(entry["step"]))
        else:
            self.runs[entry["run"]] = entry

    def add(self, entry: dict[str, Any]) -> None:
        self._note(entry)
        if self.path is not None:
            # A step line is flushed, not synced: the ledger's charge is what must survive; a
            # line lost to a power failure only makes a resumed run charge that step again.
            with open(self.path, "a") as f:
                f.write(json.dumps(entry) + "\n")
                f.flush()
                if "step" not in entry:
                    os.fsync(f.fileno())


def _positive_number(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def check_args(
    draws: int,
    tune: int,
    chains: int,
    clip: float,
    share: float,
    adapt: str,
    scaling: float,
    target_accept: float,
) -> None:
    if not (_positive_number(clip) or (isinstance(clip, str) and clip == "auto")):
        raise ValueError("`clip` must be a finite positive number, in (0, inf), or 'auto'.")
    if not _positive_number(scaling):
        raise ValueError("`scaling` must be a finite positive number, in (0, inf).")
    if not (isinstance(target_accept, int | float) and 0.0 < target_accept < 1.0):
        raise ValueError("`target_accept` must be in (0, 1).")
    if not 0.0 <= float(share) < 1.0:
        raise ValueError("`clip_count_share` must be in [0, 1).")
    if adapt not in ADAPT_MODES:
        raise ValueError(f"`adapt` must be one of {ADAPT_MODES}; got {adapt!r}.")
    RunPlan(int(draws), int(tune), int(chains))  # validates the three


class Run(NamedTuple):
    """A distributed run's checked arguments and opened ledger, before any party starts."""

    model: pm.Model
    budget: PrivacyBudget
    plan: RunPlan
    adapt_window: int
    neighbours: Neighbours
    clip_mode: ClipMode
    share: float
    value_vars: list[Any]
    point: dict[str, np.ndarray]
    x_init: RaveledVars
    S: np.ndarray
    ledger: PrivacyLedger
    journal: Journal
    resumed: dict[str, Any] | None
    config: RunConfig


def prepare_run(
    model: pm.Model | None,
    *,
    epsilon: float,
    delta: float,
    draws: int,
    tune: int,
    chains: int,
    neighbours: str,
    clip: float,
    clip_mode: str,
    clip_count_share: float,
    S: np.ndarray | None,
    scaling: float,
    adapt: str,
    target_accept: float,
    adapt_window: int | None,
    tune_interval: int | None,
    ledger_path: str | os.PathLike[str] | None,
    run: str | None,
) -> Run:
    """Check a distributed run's arguments (a ValueError naming the argument), open its
    ledger and journal and find the run it resumes, before anything is spent or started."""
    model = pm.modelcontext(model)
    budget = PrivacyBudget(float(epsilon), float(delta))
    plan = RunPlan(int(draws), int(tune), int(chains))
    check_args(draws, tune, chains, clip, clip_count_share, adapt, scaling, target_accept)
    window = resolve_adapt_window(adapt_window, tune_interval)
    relation = Neighbours.parse(neighbours)
    mode = ClipMode.parse(clip_mode)
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
    journal = Journal(None if ledger_path is None else Path(str(ledger_path) + ".runs"))
    if run is not None and run not in journal.runs:
        raise ValueError(f"`run`={run!r} is not in the journal of `ledger_path`: no run to resume.")
    resumed = journal.runs.get(run) if run is not None else None
    auto = isinstance(clip, str)  # "auto": found in tuning (shards only; owners refuse it)
    if auto and float(clip_count_share) <= 0.0:
        raise ValueError("`clip='auto'` needs a positive `clip_count_share` (its counts).")
    config = RunConfig(
        budget, ledger, relation, math.nan if auto else float(clip), mode, model, clip_auto=auto
    )
    return Run(
        model, budget, plan, window, relation, mode, float(clip_count_share), value_vars, point,
        x_init, S, ledger, journal, resumed, config,
    )  # fmt: skip
