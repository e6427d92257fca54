"""PenaltyMetropolis: the penalty algorithm as a PyMC step method.

Each step proposes one blocked random-walk move over all free continuous variables, releases
the clipped log-likelihood difference with Gaussian noise (one release per step) and accepts
with the penalised test of :mod:`pymc_penalty.sampling.kernel`. Prior, Jacobian and proposal terms
carry no data and are exact.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pymc as pm
from pymc.blocking import RaveledVars
from pymc.step_methods.arraystep import ArrayStepShared
from pymc.step_methods.compound import Competence
from pymc.util import get_value_vars_from_user_vars

from pymc_penalty.accounting.sensitivity import ClipMode, Neighbours, step_length
from pymc_penalty.errors import NotPrivateWarning, UnpublishedResultWarning
from pymc_penalty.model.checks import (
    check_min_rows,
    data_dependent_deterministics,
    rule_rows,
    validate_model,
)
from pymc_penalty.model.likelihood import PenaltyLikelihood
from pymc_penalty.privacy.budget import RunPlan, available_mu, calibrate
from pymc_penalty.privacy.chain_slots import ChainSlots
from pymc_penalty.privacy.ledger import PrivacyLedger
from pymc_penalty.privacy.mechanism import release_noise
from pymc_penalty.privacy.precision import snap_count
from pymc_penalty.sampling.adaptation.state import (
    ClippedPenaltyState,
    PenaltyMetropolisState,
    TuningMixin,
    progressbar_config,
    progressbar_update_functions,
    starting_proposal,
)
from pymc_penalty.sampling.kernel import (
    PenaltyState,
    Release,
    StepNoise,
    combine_move_stats,
    info_stats,
    refused_info,
    stats_dtypes_shapes,
    transition,
)
from pymc_penalty.sampling.noise_source import PrivateNoiseMixin
from pymc_penalty.sampling.options import (
    GROUPS,
    ClipPolicy,
    PrivacyPolicy,
    ProposalPolicy,
    fill_defaults,
)
from pymc_penalty.sampling.setup import (
    CLIP_STAT,
    DEFAULT_PLAN,
    PROPOSAL_STAT,
    Ledger,
    begin_step,
    check_blocked,
    check_noise_arguments,
    check_proposal_dist,
    declare_clip_stat,
    declare_proposal_stat,
    warn_data_deterministics,
    warn_not_private,
)
from pymc_penalty.validation import check_step_arguments

__all__ = [
    "DEFAULT_PLAN",
    "FREE_MOVES",
    "PROPOSAL_STAT",
    "Ledger",
    "NotPrivateWarning",
    "PenaltyMetropolis",
    "PenaltyMetropolisState",
    "UnpublishedResultWarning",
    "check_blocked",
    "declare_proposal_stat",
    "free_factor",
    "free_moves",
]


#: Free moves per released step on the coordinates no row's log-likelihood reads
#: (:func:`free_moves`; :attr:`PenaltyMetropolis.free_moves`, the sharded driver's too).
FREE_MOVES = 5


def free_factor(chol: np.ndarray, free: np.ndarray) -> np.ndarray:
    """The free moves' proposal factor: the conditional covariance of the coordinates
    ``free`` given the others under the metric ``chol chol'`` (public), times
    ``2.38^2 / k``, as a Cholesky factor (its diagonal where that fails)."""
    rest = np.setdiff1d(np.arange(chol.shape[0]), free)
    cov = chol @ chol.T
    cond = cov[np.ix_(free, free)]
    if rest.size:
        cross = cov[np.ix_(free, rest)]
        cond = cond - cross @ np.linalg.solve(cov[np.ix_(rest, rest)], cross.T)
    cond = 0.5 * (cond + cond.T) * (2.38**2 / free.size)
    try:
        return np.linalg.cholesky(cond)
    except np.linalg.LinAlgError:
        return np.diag(np.sqrt(np.maximum(np.diag(cond), 1e-12)))


def free_moves(
    x: np.ndarray,
    logprior: float,
    free: np.ndarray,
    factor: np.ndarray,
    log_prior: Callable[[np.ndarray], float],
    rng: np.random.Generator,
    moves: int = FREE_MOVES,
) -> tuple[np.ndarray, float]:
    """``moves`` random-walk Metropolis moves of the coordinates ``free`` (which no row's
    log-likelihood reads), proposed with ``factor`` (:func:`free_factor`) and accepted on
    the exact log prior ``log_prior`` alone (``logprior`` at ``x``): the likelihood, and
    the Taylor path's tilt and released model, are constant along them, so each move leaves
    the target invariant. No data is read, nothing is released or charged; the uniforms come
    from the chain's generator ``rng``. Returns the point and its log prior. The in-process
    step (:meth:`PenaltyMetropolis._free_moves`) and the sharded driver both move so."""
    x = np.array(x, copy=True)
    for _ in range(int(moves)):
        y = x.copy()
        y[free] += factor @ rng.standard_normal(free.size)
        logprior1 = log_prior(y)
        if math.log(max(rng.random(), 1e-300)) < logprior1 - logprior:
            x, logprior = y, logprior1
    return x, logprior


class PenaltyMetropolis(TuningMixin, PrivateNoiseMixin, ArrayStepShared):
    """Metropolis-Hastings with differentially private moves (the penalty algorithm).

    The log-likelihood difference between the proposal and the current point is computed as a
    sum of per-datapoint ratios, each clipped to ``[-B, B]``, released with Gaussian noise of
    standard deviation ``sigma``, and the proposal is accepted with probability
    ``min(1, prior ratio * exp(d_hat - sigma^2 / 2))``. Because ``sigma`` is known and
    symmetric in the two points, the chain targets the exact posterior whenever clipping is
    inactive.

    Parameters
    ----------
    vars : list of Variable, optional
        Variables to sample. Must be all free variables of the model (the default): any other
        step method would evaluate the likelihood without noise.
    S : ndarray, optional
        Proposal standard deviations (1-D) or covariance (2-D) on the unconstrained space.
        Defaults to ones, or with ``clip="auto"`` under substitute-one neighbours to
        ``1 / sqrt(n)``, the scale of a posterior informed by n rows, in which the found clip
        starts (:func:`pymc_penalty.sampling.adaptation.starting_sd`). A given ``S`` is taken
        for the posterior's shape (as ``pymc_penalty.sample`` passes the warm start's
        covariance): a found clip then starts at the Gaussian tail's constant in that metric
        and only moves up, when the released counts show heavier tails
        (:class:`~pymc_penalty.sampling.adaptation.ClipAdapter`, ``probe=False``).
    proposal_dist : type, optional
        ``pm.NormalProposal`` or ``pm.MultivariateNormalProposal`` (picked from ``S``'s
        dimension when omitted). The step always draws one blocked, symmetric move.
    scaling : float, default 1.0
        Initial global scale factor of the proposal.
    tune : bool, default True
        Adapt the proposal during tuning (from released outcomes only: no privacy cost).
    epsilon, delta : float, optional
        The privacy budget, ``epsilon`` in ``(0, inf)`` and ``delta`` in ``(0, 1)``: the
        recommended way to make the step private. The step calibrates its per-step ``mu`` so
        that ``plan`` spends at most the budget (:func:`pymc_penalty.calibrate`) and creates
        its own :class:`~pymc_penalty.PrivacyLedger` (unless ``ledger`` is given), which every
        chain and worker process shares and which refuses any release past the budget. Give
        exactly one of the budget, ``mu`` and ``noise_sd``.
    plan : RunPlan, optional
        The run the budget is spread over, with a budget only. Defaults to
        :data:`~pymc_penalty.sampling.setup.DEFAULT_PLAN`, ``pm.sample``'s own defaults on this
        machine: 1000 draws, 1000 tuning steps and ``max(2, min(4, CPU cores))`` chains.
        Pass the ``draws``, ``tune`` and ``chains`` you give ``pm.sample``. Each chain makes at
        most the plan's ``tune + draws`` releases, and only the first ``plan.chains`` chains
        to release make any (:class:`~pymc_penalty.privacy.chain_slots.ChainSlots`): in a run with
        longer chains every chain stops releasing at the plan's length, and further chains
        release nothing; :func:`pymc_penalty.finalize` then cuts every chain to the same
        length, removes chains that released no draw, and warns
        (:class:`~pymc_penalty.PlanMismatchWarning`). A shorter run leaves budget unspent,
        and ``finalize`` warns too.
    ledger : object, optional
        A privacy ledger with ``try_spend(mu2) -> bool``. Each release's cost ``mu_t^2`` is
        committed before the data is touched; once refused, the step stops touching data
        and returns the current point with ``dp_released=False``. With a budget it must be a
        :class:`~pymc_penalty.PrivacyLedger` whose budget is at most the step's (a persistent
        one, to share a budget between analyses), and the step is calibrated to what it has
        left.
    mu : float, optional
        Per-step Gaussian-DP parameter: ``sigma = Delta / mu`` where ``Delta`` is the L2
        sensitivity of this step's release. Requires a finite clip.
    noise_sd : float, optional
        Fixed noise standard deviation ``sigma``.
    clip : ClipPolicy, float, "auto" or None, default 1.0
        How each row's ratio is clipped (:class:`~pymc_penalty.ClipPolicy`: the constant,
        the bound's mode, the share spent on the clipped count, a found clip's start). A
        number, ``"auto"`` or ``None`` is the constant alone:
        ``ClipPolicy(value=clip)``, its mode ``"distance"``.
    proposal : ProposalPolicy or str, optional
        The proposal and its adaptation (:class:`~pymc_penalty.ProposalPolicy`: its kind,
        what adapts, the first window, the target acceptance, a bound on each move). A string
        is the kind alone. Default ``ProposalPolicy()``: block moves, the full covariance
        adapted.
    privacy : PrivacyPolicy, optional
        The neighbour relation, the public facts about the number of rows, and the noise's
        source (:class:`~pymc_penalty.PrivacyPolicy`). Default ``PrivacyPolicy()``:
        substitute-one, fresh OS-entropy noise. Under add/remove-one its ``min_rows`` is
        required (the step is refused without it, before anything is spent).
    model : pm.Model, optional
    rng : RandomGenerator, optional
        Generator for proposals and uniforms (``pm.sample`` sets one per chain).
    initial_point : dict, optional
    compile_kwargs : dict, optional
        Passed to PyTensor's compile (e.g. ``{"mode": "NUMBA"}``).
    blocked : bool, default True
        Must be True. Each step makes one release, the noisy log-likelihood difference for a
        move of all its variables together, and pays for it once. ``blocked=False`` would make
        PyMC run one step per variable, one release each: the same data released ``d`` times
        per draw, ``d`` times the privacy cost, with each release's noise added to the test of
        a move of one coordinate only. It is refused rather than silently priced so.
    **moved
        The old keywords (``clip_mode``, ``clip_count_share``, ``clip_tail``, ``adapt``,
        ``adapt_window``, ``tune_interval``, ``target_accept``, ``max_step``, ``neighbours``,
        ``min_rows``, ``released_rows``, ``reproducible_noise``): each still works, with a
        ``FutureWarning`` naming its field
        (:data:`pymc_penalty.sampling.options.MOVED`).

    Warns
    -----
    UnpublishedResultWarning
        With a budget. ``pm.sample`` offers no hook after sampling, so its ``InferenceData``
        still holds ``observed_data``, ``constant_data``, ``log_likelihood`` and
        data-dependent Deterministics, and has no privacy report. The warning is raised once,
        when the step is made, rather than never: a raw result must not be mistaken for a
        private one. Publish only what :func:`pymc_penalty.finalize` returns.
    NotPrivateWarning
        Without a budget and without a ledger (``mu`` or ``noise_sd`` alone): the number of
        releases is unlimited and nothing composes them, so no guarantee holds. Also with
        ``clip=None`` or ``PrivacyPolicy(reproducible_noise=True)``.

    Examples
    --------
    The low-level path, private by construction::

        with model:
            plan = pp.RunPlan(draws=500, tune=500, chains=2)
            step = pp.PenaltyMetropolis(epsilon=1.0, delta=1e-5, plan=plan)
            idata = pm.sample(500, tune=500, chains=2, step=step)
        idata = pp.finalize(idata, step)  # strips the data, attaches the report
    """

    name = "penalty_metropolis"
    default_blocked = True
    stats_dtypes_shapes = {
        **stats_dtypes_shapes(),  # the transition's (pymc_penalty.sampling.kernel.INFO_STATS)
        "scaling": (np.float64, []),
        # The step's proposal in the raveled, unconstrained space (its length is set per
        # instance by `declare_proposal_stat`): data-independent, for waste recycling.
        PROPOSAL_STAT: (object, [None]),
    }
    _state_class = ClippedPenaltyState
    # (index, count) to release per-segment clipped sums; set by the owners variant.
    _segments: tuple[np.ndarray, int] | None = None
    # Per-row control variates subtracted in the compiled likelihood (the Taylor path).
    _row_control: Any = None
    #: Free moves per step on the coordinates no row's log-likelihood reads (a hierarchical
    #: model's group mean and scale): Metropolis moves on the exact prior conditional, which
    #: read no data and release nothing (:meth:`_free_moves`).
    free_moves: int = FREE_MOVES

    def __init__(
        self,
        vars: list | None = None,
        *,
        S: np.ndarray | None = None,
        proposal_dist: type | None = None,
        scaling: float = 1.0,
        tune: bool = True,
        epsilon: float | None = None,
        delta: float | None = None,
        plan: RunPlan | None = None,
        ledger: Ledger | None = None,
        mu: float | None = None,
        noise_sd: float | None = None,
        clip: ClipPolicy | float | str | None = 1.0,
        proposal: ProposalPolicy | str | None = None,
        privacy: PrivacyPolicy | None = None,
        model: pm.Model | None = None,
        rng: Any = None,
        initial_point: dict[str, np.ndarray] | None = None,
        compile_kwargs: dict[str, Any] | None = None,
        blocked: bool = True,
        **moved: Any,
    ) -> None:
        # The old keywords go into their groups (FutureWarning); a no-op where a subclass or
        # pymc_penalty.sample has already grouped them.
        model, groups = begin_step(
            self,
            model,
            blocked,
            {"clip": clip, "proposal": proposal, "privacy": privacy, **moved},
            tuple(GROUPS),
        )
        clip_policy = fill_defaults(groups["clip"], mode="distance", tail=1.0)
        proposal_policy = fill_defaults(groups.get("proposal", ProposalPolicy()), adapt="full")
        privacy_policy = groups.get("privacy", PrivacyPolicy())
        clip, clip_mode = clip_policy.value, clip_policy.mode
        clip_count_share, clip_tail = clip_policy.count_share, clip_policy.tail
        neighbours, min_rows = privacy_policy.neighbours, privacy_policy.min_rows
        released_rows = privacy_policy.released_rows
        reproducible_noise = privacy_policy.reproducible_noise
        adapt_window = proposal_policy.adapt_window
        # Everything about the budget is checked before the model is analysed or compiled
        # and before any ledger exists.
        check_step_arguments(
            epsilon=epsilon,
            delta=delta,
            plan=plan,
            clip=clip,
            clip_count_share=clip_count_share,
            neighbours=neighbours,
            clip_mode=clip_mode,
            target_accept=proposal_policy.target_accept,
            tune_interval=adapt_window,
            scaling=scaling,
            released_rows=released_rows,
            clip_tail=clip_tail,
        )
        min_rows = check_min_rows(min_rows)
        budget, plan = check_noise_arguments(epsilon, delta, plan, mu, noise_sd, clip, ledger)
        clip_auto = isinstance(clip, str) and clip == "auto"
        check_proposal_dist(proposal_dist)

        if initial_point is None:
            initial_point = model.initial_point()
        if vars is None:
            vars = model.value_vars
        else:
            vars = get_value_vars_from_user_vars(vars, model)
        adds = Neighbours.parse(neighbours) is Neighbours.ADD_REMOVE
        self._n = validate_model(model, vars, add_remove=adds, min_rows=min_rows)
        #: The public lower bound on n the gate used (None: none, or substitute-one).
        self.min_rows = min_rows if adds else None
        leaky = data_dependent_deterministics(model, rule_rows(self._n, adds, min_rows))
        warn_data_deterministics(leaky)

        size = sum(initial_point[v.name].size for v in vars)
        self.neighbours = Neighbours.parse(neighbours)
        self.clip_mode = ClipMode.parse(clip_mode)
        self.noise_sd = None if noise_sd is None else float(noise_sd)
        n_public = None if self.neighbours is Neighbours.ADD_REMOVE else self._n
        shaped = S is not None  # a given S is taken for the posterior's shape (the clip holds)
        # The start's row count: n where public, else a released count if one was given.
        start_rows = n_public if n_public is not None else released_rows
        S, clip = starting_proposal(S, size, clip, start_rows, float(clip_tail))
        self.clip = clip
        #: True when the clip constant is found in tuning from the released clipped counts.
        self.clip_auto = clip_auto
        self.clip_count_share = float(clip_count_share)
        self.reproducible_noise = bool(reproducible_noise)
        # The model (already held by PyMC's own constructor arguments): finalize's default.
        self._model = model
        #: The ``(epsilon, delta)`` budget and its plan (None when given ``mu`` or ``noise_sd``).
        self.budget = budget
        self.plan = plan
        if budget is not None:
            if ledger is None:
                ledger = PrivacyLedger(budget.mu)  # a file: shared by every chain and process
            mu = calibrate(
                available_mu(ledger),
                plan,
                n_datapoints=self._n,
                clip=self.clip,
                clip_mode=self.clip_mode,
                neighbours=self.neighbours,
                clip_count_share=self.clip_count_share,
            )
        self.mu = None if mu is None else float(mu)
        self.ledger = ledger
        # A chain longer than the plan stops releasing at the plan's length, and chains past
        # the plan's number release nothing (finalize says so).
        if plan is not None:
            self._chain_cap = plan.tune + plan.draws
            self._chain_slots = ChainSlots(plan.chains)
        self.private = self.clip is not None and not self.reproducible_noise
        warn_not_private(
            budget=budget, ledger=ledger, clip=self.clip, reproducible_noise=self.reproducible_noise
        )

        self._init_tuning(
            S,
            scaling,
            tune,
            proposal_policy.adapt,
            proposal_policy.target_accept,
            adapt_window,
            proposal_policy.kind,
            proposal_policy.max_step,
            n_public,
            clip_probe=not shaped,
        )
        self._lik = PenaltyLikelihood(
            model,
            vars,
            initial_point,
            compile_kwargs,
            segments=self._segments,
            control=self._row_control,
        )
        # The coordinates no row reads (model structure only: no data).
        reads = self._lik.reads
        self._free_index = np.flatnonzero(~reads) if reads.any() else np.zeros(0, dtype=int)
        super().__init__(vars, shared={}, blocked=True, rng=rng)
        declare_proposal_stat(self, size)
        if clip_auto:
            declare_clip_stat(self)

    # --- the step ------------------------------------------------------------------------

    def _sensitivity_and_noise(self, step_length: float) -> tuple[float, ...]:
        """Return (bound B, Delta, sigma of the likelihood release, count noise sd, step mu):
        :func:`pymc_penalty.privacy.mechanism.release_noise` with this step's clip and noise."""
        return release_noise(  # a ReleaseNoise, unpacked by the callers as a tuple
            self.clip,
            self.clip_mode,
            self.neighbours,
            step_length,
            mu=self.mu,
            noise_sd=None if self.mu is not None else self.noise_sd,
            count_share=self.clip_count_share,
        )

    def _step_noise(self, length: float) -> tuple[StepNoise, Callable, float | None]:
        """The step's noise (public inputs only), its release function (the one part a variant
        replaces: here one owner's clipped sum) and the clip count's noise sd, which the clip
        adaptation reads (None: the count does not tune the clip)."""
        bound, delta, sigma, count_sd, step_mu = self._sensitivity_and_noise(length)

        def release(state: PenaltyState, x1: np.ndarray) -> Release:
            return self._release_sum(state, x1, bound, sigma, count_sd)

        return StepNoise(delta, sigma, sigma**2, step_mu), release, count_sd

    def _propose(self, x0: np.ndarray) -> tuple[np.ndarray, float]:
        """Draw a proposal in the input dtype; return it with the length its bound scales by.

        The previous step's tuning update is applied here, at the start of a step that still
        tunes (as ``pm.Metropolis`` tunes at the start of its step): the first draw after
        tuning then uses exactly the proposal and clip the last tuning draw recorded.
        """
        self._start_step()
        x1 = self._draw(x0).astype(x0.dtype, copy=False)
        return x1, self._bound_length(x0, x1)

    def _draw(self, x0: np.ndarray) -> np.ndarray:
        """The proposal itself (public: the chain's generator and the tuned proposal); a
        variant with moves of its own overrides it."""
        return self.adapter.propose(self.rng, x0)

    def _bound_length(self, x0: np.ndarray, x1: np.ndarray) -> float:
        """The length the clip bound scales by for the move ``x0 -> x1`` (public inputs only;
        symmetric in the two points). A variant with a bound of its own form overrides it."""
        diff = np.asarray(x1, dtype=np.float64) - x0
        return step_length(self.clip_mode, diff, self.adapter.chol)

    def _current(self, x0: np.ndarray) -> PenaltyState:
        """The state at ``x0`` from the cache; when the cache holds another state (or other
        data), its layout is checked (shapes only, before anything is spent) and the log
        prior is NaN, the mark :meth:`_evaluate` rebuilds the cache on once the budget is paid."""
        if self._lik.holds(x0):
            return PenaltyState(x0, self._lik.current_logprior)
        self._lik.check_layout()
        return PenaltyState(x0, math.nan)

    def _evaluate(self, state: PenaltyState, x1: np.ndarray, bound: float) -> tuple:
        """After the budget is committed: (current state, proposal state, clipped sums,
        clipped counts), rebuilding the cache of the current point first when it is stale
        (a refused step must not evaluate the likelihood)."""
        if math.isnan(state.log_prior):  # stale (see _current): rebuild, the budget is paid
            state = PenaltyState(state.position, self._lik.reset(state.position, self._n))
        sums, n_clipped, logprior1 = self._lik.propose(x1, bound)
        return state, PenaltyState(x1, logprior1), sums, n_clipped

    def _release_sum(
        self, state: PenaltyState, x1: np.ndarray, bound: float, sigma: float, count_sd: float
    ) -> Release:
        """Release the clipped sum (and the clip count) with this step's noise."""
        state, proposal, clipped_sum, n_clipped = self._evaluate(state, x1, bound)
        noise = self._noise()
        d_hat = clipped_sum + sigma * noise.standard_normal()
        if not self.private:
            clipped_count = float(n_clipped)
        elif math.isfinite(count_sd):
            clipped_count = snap_count(n_clipped + count_sd * noise.standard_normal())
        else:
            clipped_count = math.nan
        del n_clipped, clipped_sum  # exact values: never to leave this function
        fraction = self._public_fraction(clipped_count, self._n)
        return Release(d_hat, proposal, float(clipped_count), float(fraction), state)

    def _step_stats(self, x1: np.ndarray) -> dict[str, Any]:
        """The statistics of the proposal and the tuning, known before anything is released."""
        stats = {"scaling": self.adapter.scaling, PROPOSAL_STAT: x1.copy()}
        if self.clip_auto:
            stats[CLIP_STAT] = self.clip
        return stats

    def astep(self, q0: RaveledVars) -> tuple[RaveledVars, list[dict[str, Any]]]:
        """One draw: one penalised Metropolis step in the raveled parameter space (see
        :func:`pymc_penalty.sampling.kernel.transition`), or after tuning the plan's
        ``moves_per_draw`` of them as one release (:meth:`_moves`)."""
        x0 = self._chain_start(q0)  # a chain's first step may move it to its start
        moves = self._moves()
        charge = None if self.ledger is None else self._charge
        taken: list[dict[str, Any]] = []
        for _ in range(moves):
            x1, length = self._propose(x0)
            noise, release, count_sd = self._step_noise(length)
            stats = self._step_stats(x1)
            state = self._current(x0)
            if moves > 1 and charge is not None:
                # The draw's moves are one release: its cost, moves * mu^2 (their Gaussian-DP
                # composition), is committed before the first of them reads the data.
                if not charge(moves * noise.mu**2):
                    return RaveledVars(x0, q0.point_map_info), [
                        {**stats, **info_stats(refused_info(noise))}
                    ]
                charge = None
            new, info = transition(self.rng, state, x1, noise, release, charge=charge)
            stats.update(info_stats(info))
            if not info.released:
                return RaveledVars(x0, q0.point_map_info), [stats]
            self._lik.commit(info.accepted)  # the per-row vectors stay in the compiled storage
            self.adapter.after_decision(info.accepted)
            x0 = self._free_moves(new.position)
            taken.append(stats)
            if self.tune:
                count = None
                if self.clip_adapter is not None and count_sd is not None:
                    count = (info.clipped_count, count_sd)
                self._pending_tuning.hold(x0.copy(), info.accept, info.accepted, count)
        return RaveledVars(x0, q0.point_map_info), [combine_move_stats(taken)]

    def _moves(self) -> int:
        """Moves in this draw: the plan's ``moves_per_draw``, but 1 without a plan, while
        tuning, and for a chain's first ``plan.tune`` releases (the tuning steps the plan
        calibrated as one move each, also where the step's adaptation is off)."""
        if self.plan is None or self.tune or self._chain_releases < self.plan.tune:
            return 1
        return self.plan.draw_moves

    def _free_moves(self, x: np.ndarray) -> np.ndarray:
        """:attr:`free_moves` random-walk Metropolis moves of the coordinates no row reads,
        accepted on the exact log prior alone: the target's likelihood (and the Taylor
        path's tilt and released model, which live on the rows' coordinates) is constant
        along them, so each move leaves the target invariant. The proposal is the
        conditional of the proposal metric's covariance (public) given the other
        coordinates, scaled by ``2.38 / sqrt(k)``; the uniforms come from the chain's
        generator. No data is read and nothing is released or charged."""
        free = self._free_index
        if not free.size or self.free_moves <= 0:
            return x
        x, logprior = free_moves(
            x, self._lik.current_logprior, free, self._free_chol(), self._lik.log_prior,
            self.rng, int(self.free_moves),
        )  # fmt: skip
        self._lik.shift_current(x, logprior)
        return x

    def _free_chol(self) -> np.ndarray:
        """The free moves' proposal factor: the conditional covariance of the free
        coordinates given the others under the metric ``chol chol'``, times ``2.38^2 / k``
        (recomputed when the adapted metric changes)."""
        chol = self.adapter.chol
        kept = getattr(self, "_free_chol_cache", None)
        if kept is not None and kept[0] is chol:
            return kept[1]
        factor = free_factor(chol, self._free_index)
        self._free_chol_cache = (chol, factor)
        return factor

    def _public_fraction(self, clipped_count: float, n: int) -> float:
        """The released clipped count as a fraction of the datapoints, where that count is
        public (substitute-one); NaN under add/remove-one, where dividing by it would
        publish it."""
        if self.neighbours is Neighbours.ADD_REMOVE:
            return math.nan
        return clipped_count / n

    # --- PyMC integration ----------------------------------------------------------------

    @staticmethod
    def competence(var: Any, has_grad: bool) -> Competence:
        """Never chosen automatically: privacy must be asked for explicitly."""
        return Competence.INCOMPATIBLE

    _progressbar_config = staticmethod(progressbar_config)
    _make_progressbar_update_functions = staticmethod(progressbar_update_functions)
