"""Exponential-family penalty step: a fresh noisy sufficient statistic per step.

For a likelihood ``sum_i [phi(theta) . T(y_i) - A(theta)] + const`` the log-likelihood
difference is ``d = (phi(theta') - phi(theta)) . S - n (A(theta') - A(theta))`` with
``S = sum_i T(y_i)``. Each step releases ``S_hat = S + N(0, xi I)`` (fresh noise), so
``d_hat = (phi' - phi) . S_hat - n (A' - A)`` carries Gaussian noise of variance
``sigma^2 = ||phi' - phi||^2 xi``, symmetric in the two points: the penalty test
``d_hat - sigma^2 / 2`` is exact. ``S`` is computed once, from each ``T(y_i)`` clipped to a
declared bound; a step then costs O(dim T), the same at n = 1e3 and n = 1e7.

Privacy per step: the L2 sensitivity of ``S`` is ``Delta_T`` (substitute-one:
``sup ||T(y) - T(y')||``; add/remove-one: ``sup ||T(y)||``) and the release is
``mu_t = Delta_T / sqrt(xi)`` Gaussian-DP. Under substitute-one neighbours the datapoint count
``n`` is the same for both data sets and is used exactly. Under add/remove-one it is not, so the
step releases it with ``S`` as one more coordinate of the statistic, ``(T(y), 1)``: the
sensitivity becomes ``hypot(Delta_T, 1)`` and the noise variance ``(||phi' - phi||^2 +
(A' - A)^2) xi``, still symmetric, so the test stays exact.
"""

from __future__ import annotations

import math
import warnings
from copy import deepcopy
from dataclasses import field
from typing import Any

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from pymc.blocking import RaveledVars
from pymc.pytensorf import compile as pm_compile
from pymc.pytensorf import join_nonshared_inputs, make_shared_replacements
from pymc.step_methods.arraystep import ArrayStepShared
from pymc.step_methods.compound import Competence
from pymc.step_methods.state import dataclass_state
from pymc.util import get_value_vars_from_user_vars

from pymc_penalty.accounting.sensitivity import Neighbours
from pymc_penalty.errors import InvalidArgumentError, ModelNotPrivateError, NotPrivateWarning
from pymc_penalty.model.checks import (
    check_min_rows,
    data_sources,
    depends_on_data,
    rule_rows,
    validate_model,
)
from pymc_penalty.sampling.adaptation import ProposalAdapter
from pymc_penalty.sampling.adaptation.pending import PendingTuning
from pymc_penalty.sampling.adaptation.state import PenaltyMetropolisState
from pymc_penalty.sampling.kernel import PenaltyState, Release, StepNoise, info_stats, transition
from pymc_penalty.sampling.noise_source import PrivateNoiseMixin
from pymc_penalty.sampling.options import PrivacyPolicy, ProposalPolicy, fill_defaults
from pymc_penalty.sampling.setup import (
    PROPOSAL_STAT,
    Ledger,
    begin_step,
    declare_proposal_stat,
)
from pymc_penalty.sampling.step import PenaltyMetropolis
from pymc_penalty.validation import check_real
from pymc_penalty.variants._families import FAMILIES, recognise_family
from pymc_penalty.variants.statistic import SufficientStatistic, check_declaration

__all__ = ["FAMILIES", "ExpFamPenaltyMetropolis"]

#: The step's groups (it has no clip: its sufficient statistic is clipped to a declared bound).
_GROUPS = ("proposal", "privacy")


@dataclass_state
class ExpFamPenaltyState(PenaltyMetropolisState):
    """Sampling state of :class:`ExpFamPenaltyMetropolis`: the proposal's, and the tuning
    update held for the next step."""

    _pending_tuning: PendingTuning = field(metadata={"frozen": False})


class ExpFamPenaltyMetropolis(PrivateNoiseMixin, ArrayStepShared):
    """Penalty Metropolis for an exponential-family likelihood at O(1) cost per step.

    The model must have exactly one observed variable, of one of the :data:`FAMILIES`
    (recognised from its PyMC op: ``pm.Poisson``, ``pm.Bernoulli``, ``pm.Binomial`` with
    fixed ``n``, ``pm.Normal`` with constant ``sigma``, ``pm.Exponential``, ``pm.Gamma`` with
    constant ``alpha``, ``pm.Categorical``, ``pm.Multinomial`` with fixed ``n``), whose sampled
    parameter is a function of the free variables that is the same for every datapoint (a
    scalar; a k-vector for Categorical and Multinomial). Other likelihoods can be declared with
    ``statistic``.

    Parameters
    ----------
    family : str, optional
        Expected family name; a ValueError is raised if the model's likelihood is another.
    statistic : SufficientStatistic, optional
        Declare the exponential family yourself, for a likelihood that is not recognised (any
        single observed variable). ``family`` and ``data_bound`` must then be omitted: the
        declaration's ``bound`` sets the sensitivity.
    check_statistic : bool, default True
        With ``statistic``, check the declaration against the model's log-likelihood on
        synthetic data drawn from the model's prior predictive (never on the real data).
    data_bound : float, optional
        Declared bound on the data: ``0 <= y <= data_bound`` (Poisson, Exponential, Gamma) or
        ``|y| <= data_bound`` (Normal). Required by those families; datapoints outside are
        clipped to it. Bernoulli, Binomial, Categorical and Multinomial have natural bounds.
    xi : float, optional
        Variance of the noise added to each coordinate of the sufficient statistic.
    mu : float, optional
        Per-step Gaussian-DP parameter; ``xi = (Delta_T / mu)^2``. Give exactly one of
        ``xi`` and ``mu``.
    proposal : ProposalPolicy, optional
        Its ``adapt``, ``adapt_window`` and ``target_accept`` (:class:`~pymc_penalty.
        ProposalPolicy`); this step moves all coordinates at once (``kind="block"``, no
        ``max_step``).
    privacy : PrivacyPolicy, optional
        Its ``neighbours``, ``min_rows`` and ``reproducible_noise``
        (:class:`~pymc_penalty.PrivacyPolicy`; ``released_rows`` does not apply here). Under
        add/remove-one ``min_rows``, a public lower bound on the number of rows, is required:
        the model gate's shape rules compare lengths with it instead of the private count.
    S, scaling, tune, ledger, model, rng, initial_point, compile_kwargs, blocked, vars :
        As in :class:`pymc_penalty.PenaltyMetropolis`, as are the old keywords
        (``neighbours``, ``adapt``, ``reproducible_noise``, ...: each with a
        ``FutureWarning``).
    """

    name = "expfam_penalty_metropolis"
    default_blocked = True
    stats_dtypes_shapes = PenaltyMetropolis.stats_dtypes_shapes
    _state_class = ExpFamPenaltyState

    def __init__(
        self,
        vars: list | None = None,
        *,
        family: str | None = None,
        statistic: SufficientStatistic | None = None,
        check_statistic: bool = True,
        data_bound: float | None = None,
        xi: float | None = None,
        mu: float | None = None,
        S: np.ndarray | None = None,
        scaling: float = 1.0,
        tune: bool = True,
        proposal: ProposalPolicy | None = None,
        privacy: PrivacyPolicy | None = None,
        ledger: Ledger | None = None,
        model: pm.Model | None = None,
        rng: Any = None,
        initial_point: dict[str, np.ndarray] | None = None,
        compile_kwargs: dict[str, Any] | None = None,
        blocked: bool = True,
        **moved: Any,
    ) -> None:
        model, groups = begin_step(
            self, model, blocked, {"proposal": proposal, "privacy": privacy, **moved}, _GROUPS
        )
        proposal = fill_defaults(groups.get("proposal", ProposalPolicy()), adapt="full")
        privacy = groups.get("privacy", PrivacyPolicy())
        if proposal.kind != "block" or proposal.max_step is not None:
            raise InvalidArgumentError(
                "ExpFamPenaltyMetropolis moves all coordinates at once: ProposalPolicy.kind "
                "must be 'block' and ProposalPolicy.max_step None."
            )
        if privacy.released_rows is not None:
            raise InvalidArgumentError(
                "PrivacyPolicy.released_rows does not apply to ExpFamPenaltyMetropolis: "
                "leave it None."
            )
        min_rows = check_min_rows(privacy.min_rows)
        adapt, adapt_window = proposal.adapt, proposal.adapt_window
        target_accept, reproducible_noise = proposal.target_accept, privacy.reproducible_noise
        if family is not None and family not in FAMILIES:
            raise ValueError(
                f"`family` must be one of {sorted(FAMILIES)}; got {family!r}. Use "
                "pymc_penalty.PenaltyMetropolis for other likelihoods."
            )
        if (xi is None) == (mu is None):
            raise ValueError("Give exactly one of `xi` (noise variance) and `mu` (per-step GDP).")
        for arg, val in (("xi", xi), ("mu", mu), ("scaling", scaling)):
            if val is not None:
                check_real(arg, val, low=0.0, low_open=True)
        if data_bound is not None:
            check_real("data_bound", data_bound, low=0.0, low_open=True)
        self.neighbours = Neighbours.parse(privacy.neighbours)

        if initial_point is None:
            initial_point = model.initial_point()
        vars = model.value_vars if vars is None else get_value_vars_from_user_vars(vars, model)
        adds = self.neighbours is Neighbours.ADD_REMOVE
        n = validate_model(model, vars, row_locality=False, add_remove=adds, min_rows=min_rows)
        #: The public lower bound on n the gate used (None: substitute-one).
        self.min_rows = min_rows if adds else None
        # The count the shape rules compare lengths with: n, or under add/remove-one the
        # public bound (n is private there: issue 28).
        self._rule_n = rule_rows(n, adds, min_rows)
        if len(model.observed_RVs) != 1:
            raise ModelNotPrivateError(
                "ExpFamPenaltyMetropolis needs exactly one observed variable; the model has "
                f"{len(model.observed_RVs)}."
            )
        obs = model.observed_RVs[0]
        if model.rvs_to_values[obs].owner is not None:
            # Computed in the graph (pt.gt(y, y.mean()), a slice...): each row's statistic
            # could then read other rows, and this step does not probe row locality.
            raise ModelNotPrivateError(
                f"The observed values of {obs.name!r} are computed inside the model; "
                "ExpFamPenaltyMetropolis needs them as an array or a pm.Data container, so "
                "that each row's statistic reads that row only. Compute them before building "
                "the model."
            )
        self._declared = statistic
        if statistic is not None:
            if not isinstance(statistic, SufficientStatistic):
                raise TypeError("`statistic` must be a pymc_penalty.variants.SufficientStatistic.")
            if family is not None or data_bound is not None:
                raise ValueError(
                    "With `statistic`, omit `family` and `data_bound`: the declaration's "
                    "`bound` sets the sensitivity."
                )
            self._init_declared(model, obs, vars, initial_point, n, compile_kwargs)
            if check_statistic:
                self._check_declared(model, obs, vars, initial_point)
            self._finish_init(model, vars, initial_point, xi, mu, reproducible_noise, ledger)
            self._init_proposal(
                initial_point, vars, S, scaling, tune, adapt_window, adapt, target_accept
            )
            super().__init__(vars, shared={}, blocked=True, rng=rng)
            return
        fam, self._const, bound, varying = recognise_family(
            model, obs, family, data_bound, self._rule_n
        )
        self.family = fam.op_name
        self._fam = fam
        self.data_bound = None if fam.needs_bound is False else bound
        self.sensitivity = fam.sens(self._const, bound, self.neighbours)

        # The exact data enter here only: S = sum_i clip(T(y_i)), kept private.
        y = np.asarray(model.rvs_to_values[obs].eval())
        stats_arr, n_clipped = fam.stat(y, self._const, bound)
        self._S = np.asarray(stats_arr.sum(axis=0), dtype=np.float64)
        self._n = int(n)
        self._clipped_fraction_exact = n_clipped / max(n, 1)
        del y, stats_arr, n_clipped

        self._finish_init(model, vars, initial_point, xi, mu, reproducible_noise, ledger)
        # Data-free compiled function: flat point -> (log prior, varying parameter).
        (varying,) = model.replace_rvs_by_values([varying])
        self._compile_params(model, vars, initial_point, [varying], compile_kwargs)
        self._init_proposal(
            initial_point, vars, S, scaling, tune, adapt_window, adapt, target_accept
        )
        super().__init__(vars, shared={}, blocked=True, rng=rng)

    # --- construction helpers ---------------------------------------------------------------

    def _compile_params(self, model, vars, initial_point, params, compile_kwargs) -> None:
        """Compile the data-free map: flat point -> (log prior, *params as float64)."""
        prior = model.logp(vars=list(model.free_RVs) + list(model.potentials), jacobian=True)
        shared = make_shared_replacements(initial_point, vars, model)
        outs, flat = join_nonshared_inputs(
            point=initial_point,
            outputs=[prior, *[pt.cast(p, "float64") for p in params]],
            inputs=vars,
            shared_inputs=shared,
        )
        outs = [pt.cast(outs[0], "float64"), *outs[1:]]
        self._fn = pm_compile([flat], outs, **(compile_kwargs or {}))
        self._fn.trust_input = True
        self._input_dtype = np.dtype(flat.dtype)

    def _init_declared(self, model, obs, vars, initial_point, n, compile_kwargs) -> None:
        """Set up the user-declared family: the clipped sum of ``T`` and the parameter map."""
        declared = self._declared
        self.family = "declared"
        self._fam = None
        self._const = ()
        self.data_bound = float(declared.bound)
        self.sensitivity = declared.sensitivity(self.neighbours is Neighbours.SUBSTITUTE)
        self._param_names = [rv.name for rv in model.free_RVs]
        # The exact data enter here only: S = sum_i clip(T(y_i)), kept private.
        y = np.asarray(model.rvs_to_values[obs].eval())
        total, n_clipped = declared.clipped_sum(y)
        self._S = np.asarray(total, dtype=np.float64)
        self._n = int(n)
        self._clipped_fraction_exact = n_clipped / max(n, 1)
        del y, total, n_clipped
        free = model.replace_rvs_by_values(list(model.free_RVs))
        self._compile_params(model, vars, initial_point, free, compile_kwargs)

    def _check_declared(self, model, obs, vars, initial_point) -> None:
        """Compare the declaration with the model's log-likelihood on prior-predictive data."""
        params = list(obs.owner.op.dist_params(obs.owner))
        if depends_on_data(params, data_sources(model), self._rule_n):
            # Drawing would read covariates, and the check's outcome would depend on them.
            raise ModelNotPrivateError(
                "The likelihood's parameters depend on data (covariates), so the declaration "
                "cannot be checked without reading them; pass check_statistic=False."
            )
        y_syn = np.asarray(pm.draw(obs, random_seed=20261120))
        value = model.rvs_to_values[obs]
        y_sym = value.type()
        (ll,) = model.logp(vars=[obs], sum=False)
        ll = pytensor.graph_replace(ll, {value: y_sym}, strict=False)
        shared = make_shared_replacements(initial_point, vars, model)
        (ll,), flat = join_nonshared_inputs(
            point=initial_point, outputs=[ll], inputs=vars, shared_inputs=shared
        )
        ll_fn = pm_compile([flat, y_sym], ll)
        rng = np.random.default_rng(20261120)
        x0 = np.concatenate([np.ravel(initial_point[v.name]) for v in vars])
        points, lls = [], []
        for _ in range(4):
            x = (x0 + rng.normal(0.0, 0.5, size=x0.shape)).astype(self._input_dtype)
            _, *vals = self._fn(x)
            points.append(dict(zip(self._param_names, vals, strict=True)))
            lls.append(np.asarray(ll_fn(x, y_syn.astype(value.dtype)), dtype=np.float64))
        check_declaration(self._declared, points, lls, y_syn)

    def _finish_init(self, model, vars, initial_point, xi, mu, reproducible_noise, ledger) -> None:
        """Release of n under add/remove; noise scale from ``xi`` or ``mu``; noise; ledger."""
        self._k = int(self._S.size)
        # Under add/remove-one the count n differs between neighbours, and ``n A(theta)``
        # would reveal it: release n with S, as the statistic (T(y), 1). Its row norm is
        # sqrt(||T||^2 + 1), so the sensitivity becomes hypot(Delta_T, 1). Under
        # substitute-one the extra coordinate never changes, and n stays exact and public.
        self._count_released = self.neighbours is Neighbours.ADD_REMOVE
        if self._count_released:
            self._S = np.append(self._S, float(self._n))
            self.sensitivity = math.hypot(self.sensitivity, 1.0)
        if mu is not None:
            self.mu = float(mu)
            self.xi = (self.sensitivity / self.mu) ** 2
        else:
            self.xi = float(xi)
            self.mu = self.sensitivity / math.sqrt(self.xi)
        self.reproducible_noise = bool(reproducible_noise)
        self.private = not self.reproducible_noise
        if self.reproducible_noise:
            warnings.warn(
                "reproducible_noise=True draws the privacy noise from a seeded generator: "
                "NOT differentially private.",
                NotPrivateWarning,
                stacklevel=3,
            )
        self.ledger = ledger

    def _init_proposal(
        self, initial_point, vars, S, scaling, tune, adapt_window, adapt, target_accept
    ) -> None:
        """The adaptive random-walk proposal and the data-free cache."""
        size = sum(initial_point[v.name].size for v in vars)
        S = np.ones(size) if S is None else np.asarray(S, dtype=np.float64)
        self.tune = bool(tune)
        self.adapter = ProposalAdapter.create(
            S, float(scaling), adapt if tune else "none", float(target_accept), int(adapt_window)
        )
        self._untuned_adapter = deepcopy(self.adapter)
        # The last step's tuning update, applied at the start of the next step if it tunes.
        self._pending_tuning = PendingTuning()
        declare_proposal_stat(self, size)
        self._cache_key: bytes | None = None  # data-free: (log prior, phi, A) at the state
        self._cache: tuple[float, np.ndarray, float] = (math.nan, np.zeros(self._k), math.nan)

    # --- helpers ---------------------------------------------------------------------------

    def _eval(self, x: np.ndarray) -> tuple[float, np.ndarray, float]:
        """(log prior, phi, A) at the raveled point x: data-free, O(dim) work."""
        lp, *pars = self._fn(np.asarray(x, dtype=self._input_dtype))
        lp = float(lp)
        if not np.isfinite(lp):
            return -math.inf, np.full(self._k, np.nan), math.nan
        with np.errstate(all="ignore"):
            if self._declared is not None:
                phi, a = self._declared.parameters(dict(zip(self._param_names, pars, strict=True)))
            else:
                par = np.asarray(pars[0], dtype=np.float64)
                arg = float(par.reshape(-1)[0]) if par.size == 1 else par
                phi = np.asarray(self._fam.phi(arg, self._const), dtype=np.float64)
                a = self._fam.A(arg, self._const)
        if not (np.all(np.isfinite(phi)) and np.isfinite(a)):
            return -math.inf, phi, a
        return lp, phi, a

    # --- the step --------------------------------------------------------------------------

    def astep(self, q0: RaveledVars) -> tuple[RaveledVars, list[dict[str, Any]]]:
        """One penalised step releasing a fresh noisy sufficient statistic (the transition is
        :func:`pymc_penalty.sampling.kernel.transition`; the release is :meth:`_release_statistic`).
        The previous step's tuning update is applied first, if this step still tunes, as in
        :class:`pymc_penalty.PenaltyMetropolis`
        (:mod:`pymc_penalty.sampling.adaptation.pending`)."""
        x0 = q0.data
        self._pending_tuning.start_step(self.tune, self.adapter.update)
        adapter = self.adapter
        x1 = adapter.propose(self.rng, x0).astype(x0.dtype, copy=False)
        key = x0.tobytes()
        if self._cache_key != key:
            self._cache = self._eval(x0)
            self._cache_key = key
        lp0, phi0, a0 = self._cache
        lp1, phi1, a1 = self._eval(x1)
        stats: dict[str, Any] = {"scaling": adapter.scaling, PROPOSAL_STAT: x1.copy()}
        # A proposal outside the prior's support is released and rejected like any other
        # (its ratio is NaN -> -inf): ``dp_released=False`` must keep meaning "refused by the
        # ledger", which is what stops the run and trims the result.
        # d = g . S_released + offset; the noise variance ||g||^2 xi is symmetric in the points.
        dphi = phi1 - phi0
        if self._count_released:
            dphi, offset = np.append(dphi, a0 - a1), 0.0
        else:
            offset = self._n * (a0 - a1)
        sigma = math.sqrt(float(dphi @ dphi) * self.xi)
        noise = StepNoise.from_sd(self.sensitivity, sigma, self.mu)

        def release(state: PenaltyState, x: np.ndarray) -> Release:
            return self._release_statistic(x, (lp1, phi1, a1), dphi, offset)

        charge = None if self.ledger is None else self.ledger.try_spend
        state = PenaltyState(x0, lp0, self._cache)
        new, info = transition(self.rng, state, x1, noise, release, charge=charge)
        stats.update(info_stats(info))
        if not info.released:
            return q0, [stats]
        if info.accepted:
            self._cache_key, self._cache = x1.tobytes(), new.cache
        if self.tune:
            self._pending_tuning.hold(new.position.copy(), info.accept, info.accepted)
        return RaveledVars(new.position, q0.point_map_info), [stats]

    def _release_statistic(
        self, x1: np.ndarray, cache1: tuple, dphi: np.ndarray, offset: float
    ) -> Release:
        """Budget committed: release ``S_hat = S + N(0, xi I)`` and use it."""
        s_hat = self._S + math.sqrt(self.xi) * self._noise().standard_normal(self._S.shape)
        d_hat = float(dphi @ s_hat) + offset
        del s_hat
        fraction = math.nan if self.private else self._clipped_fraction_exact
        return Release(d_hat, PenaltyState(x1, cache1[0], cache1), math.nan, fraction)

    def reset_tuning(self) -> None:
        """Restore the untuned proposal and drop a held tuning update."""
        super().reset_tuning()
        self._pending_tuning.clear()

    @staticmethod
    def competence(var: Any, has_grad: bool) -> Competence:
        """Never chosen automatically."""
        return Competence.INCOMPATIBLE
