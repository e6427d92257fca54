"""The JAX backend of :func:`pymc_penalty.sample` (``backend="jax"``): whole chains on a device.

What runs where:

- **Gate, calibration, tuning: the default path.** The :class:`PenaltyMetropolis` that
  :func:`pymc_penalty.sample` builds runs the model gate (row locality, data recognition),
  calibrates its per-step ``mu`` to the ledger, and tunes the proposal and, with
  ``clip="auto"``, the clip, exactly as under ``pm.sample`` (same ``astep``, same releases,
  same ledger). Its statistics feed the same :class:`~pymc_penalty.PrivacyCallback`.
- **Draws after tuning: the device.** The proposal (scaling and Cholesky factor ``L``) and the
  clip are frozen, as ``pm.sample`` freezes them when tuning stops. The chain then runs in
  blocks, each one ``jax.jit`` + ``lax.scan`` over the model's per-row log-likelihood graph
  (PyMC's model-to-JAX path, :func:`pymc.sampling.jax.get_jaxified_graph`, on the graph of
  :func:`pymc_penalty.model.likelihood.per_datapoint_terms`). Per step the device evaluates the
  proposal's per-row terms, clips their ratios to the cached current ones with the bound of
  :mod:`pymc_penalty.accounting.sensitivity`, sums, adds the host's noise and runs the penalty
  test. The
  per-row cache of the current point never leaves the device; only released quantities come
  back.
- **Noise: the host.** Each block's privacy noise (two standard normals a step: the
  likelihood difference and the clipped count) is drawn from the step's noise generator (OS
  entropy, :mod:`pymc_penalty.sampling.noise_source`) only after the block's releases are committed
  to the
  ledger, one ``try_spend`` per release. A crash inside a block therefore never spends budget
  that was not counted. Proposals and uniforms come from the step's seeded generator (they are
  not private), so ``random_seed`` reproduces them.

The result is built as ``pm.sample``'s is (posterior, the same ``sample_stats``, observed and
constant data) and finalized by :func:`pymc_penalty.results.publish.finalize_result`: same report,
stripping and convergence verdict. The device kernel itself is
:mod:`pymc_penalty.backends.jax.kernel`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np
import pymc as pm

from pymc_penalty.backends.jax.kernel import DeviceChain, import_jax, model_function
from pymc_penalty.errors import BudgetExhausted, InvalidArgumentError
from pymc_penalty.privacy.callback import PrivacyCallback
from pymc_penalty.privacy.precision import snap_accept, snap_count
from pymc_penalty.sampling.options import ProposalPolicy, group_step_options

__all__ = ["check_jax_backend", "run_device_draws", "sample_on_device"]

#: Steps per device block (one ledger commitment and one noise draw per block).
DEFAULT_BLOCK = 1000

#: ``pm.sample`` arguments the JAX backend honours; ``cores`` and ``progressbar`` are accepted
#: and ignored (chains run one after another on the device).
_SAMPLE_KWARGS = ("random_seed", "initvals", "var_names", "progressbar", "cores")


def check_jax_backend(
    pm_sample_kwargs: Mapping[str, Any],
    step_kwargs: Mapping[str, Any] | None,
    owners: Any = None,
    model: pm.Model | None = None,
) -> None:
    """Refuse what the JAX backend cannot run, before anything is opened or spent.

    With ``model``, its log-likelihood and prior are also converted to JAX here (the graph
    only: no data value is computed), so a model with an operation JAX cannot run is refused
    before the warm start and the tuning on the default path spend any budget.

    Raises
    ------
    InvalidArgumentError
        If JAX is not installed, an argument is outside what the backend supports, or the
        model cannot be converted to JAX.
    """
    import_jax()
    if model is not None:
        _check_converts(model)
    if owners is not None:
        raise InvalidArgumentError("`backend='jax'` runs one data owner: omit `owners`.")
    unknown = sorted(set(pm_sample_kwargs) - set(_SAMPLE_KWARGS))
    if unknown:
        raise InvalidArgumentError(
            f"`backend='jax'` accepts only {_SAMPLE_KWARGS} of pm.sample's arguments; got "
            f"{unknown}. Use backend='pymc' for the others."
        )
    step_kwargs = group_step_options(step_kwargs or {})  # a no-op on pp.sample's, grouped
    proposal = step_kwargs.get("proposal") or ProposalPolicy()
    if proposal.kind != "block":
        raise InvalidArgumentError(
            "`backend='jax'` runs the block proposal only (step_kwargs['proposal'] must be "
            "'block')."
        )
    if proposal.max_step is not None:
        raise InvalidArgumentError(
            "`backend='jax'` does not support ProposalPolicy.max_step in step_kwargs."
        )
    if "compile_kwargs" in step_kwargs:
        raise InvalidArgumentError(
            "`backend='jax'` compiles the likelihood itself: omit step_kwargs['compile_kwargs']."
        )


def _check_converts(model: pm.Model) -> None:
    from pymc_penalty.errors import ModelNotPrivateError

    try:
        model_function(model, list(model.value_vars))
    except (ModelNotPrivateError, InvalidArgumentError):
        raise  # the package's own refusals say what is wrong
    except Exception as exc:
        # The conversion's message may print graph constants (the data among them): withheld.
        raise InvalidArgumentError(
            f"`backend='jax'` cannot convert this model to JAX ({type(exc).__name__}); nothing "
            "was spent. Use backend='pymc'."
        ) from None


# --------------------------------------------------------------------------------------------
# the host driver: ledger, noise, tuning on the default path
# --------------------------------------------------------------------------------------------


def _commit(ledger: Any, mu2: float, steps: int) -> int:
    """Commit up to ``steps`` releases of cost ``mu2`` each; return how many were granted."""
    for granted in range(steps):
        if not ledger.try_spend(mu2):
            return granted
    return steps


def run_device_draws(
    chain: DeviceChain,
    x0: np.ndarray,
    draws: int,
    *,
    proposal: tuple[np.ndarray, float, float],
    ledger: Any,
    step_mu: float,
    noise: np.random.Generator,
    rng: np.random.Generator,
    block: int = DEFAULT_BLOCK,
    carry: tuple | None = None,
) -> tuple[dict[str, np.ndarray], tuple | None]:
    """Run ``draws`` frozen steps on the device in blocks, each paid for before its noise is
    drawn and passed to the device. ``proposal`` is the frozen ``(chol, scaling, clip)``.
    Steps the ledger refuses stay at the current point with ``dp_released=False`` (the data
    is not touched for them). ``carry`` continues a chain (the device state this function
    returned); without it the chain starts at ``x0``, whose per-row terms are evaluated once
    the first release is paid for. Returns the outputs and the device state."""
    d = x0.shape[0]
    out = {
        "x": np.tile(np.asarray(x0, dtype=np.float64), (draws, 1)),
        "proposal": np.tile(np.asarray(x0, dtype=np.float64), (draws, 1)),
        "accepted": np.zeros(draws, dtype=bool),
        "accept": np.zeros(draws),
        "dp_noise_sd": np.full(draws, np.nan),
        "dp_sensitivity": np.full(draws, np.nan),
        "dp_clipped_count": np.full(draws, np.nan),
        "dp_released": np.zeros(draws, dtype=bool),
    }
    done = 0
    while done < draws:
        want = min(block, draws - done)
        z = rng.standard_normal((want, d))
        u = rng.random(want)
        granted = _commit(ledger, step_mu**2, want)
        if granted == 0:
            break
        # Paid for: only now is the block's noise drawn and the data touched.
        eps = noise.standard_normal((granted, 2))
        if carry is None:
            carry = chain.start(x0, *proposal)
        with np.errstate(divide="ignore"):
            log_u = np.log(u[:granted])
        carry, (xs, props, acc, prob, sd, sens, count) = chain.run(carry, z[:granted], log_u, eps)
        rows = slice(done, done + granted)
        out["x"][rows], out["proposal"][rows], out["accepted"][rows] = xs, props, acc
        # On the published grids (pymc_penalty.privacy.precision): accept rounded with the
        # decision's own uniforms, the count to an integer.
        out["accept"][rows], out["dp_noise_sd"][rows] = snap_accept(prob, u[:granted]), sd
        out["dp_sensitivity"][rows], out["dp_clipped_count"][rows] = sens, snap_count(count)
        out["dp_released"][rows] = True
        done += granted
        if granted < want:
            break
    if done < draws:  # refused: the chain stays where it is
        out["x"][done:] = out["x"][done - 1] if done else x0
        out["proposal"][done:] = out["x"][done:]
    return out, carry


def _tune_on_default_path(
    step: Any, q: Any, tune: int, chain: int, callback: PrivacyCallback
) -> Any:
    """Tune one chain with the step itself, as ``pm.sample`` does with ``cores=1`` (a refused
    release stops the chain's tuning); return the last point, the proposal frozen."""
    step.tune = bool(tune)
    step.reset_tuning()
    try:
        for _ in range(tune):
            q, stats = step.astep(q)
            callback(None, SimpleNamespace(chain=chain, stats=stats, tuning=True))
    except BudgetExhausted:
        pass
    finally:
        step.stop_tuning()
    return q


def _report_draws(callback: PrivacyCallback, chain: int, released: np.ndarray, mu: float) -> None:
    """Feed the device draws' releases to the callback (it composes them per chain)."""
    for flag in released:
        stats = [{"dp_released": bool(flag), "dp_mu": mu if flag else 0.0}]
        try:
            callback(None, SimpleNamespace(chain=chain, stats=stats, tuning=False))
        except BudgetExhausted:
            return


def _posterior(
    model: pm.Model, value_vars: list, info: Any, xs: np.ndarray, var_names: list[str]
) -> dict[str, np.ndarray]:
    """The stored variables at each raveled state ``xs`` (chains, draws, d)."""
    from pymc.blocking import DictToArrayBijection, RaveledVars

    outs = model.replace_rvs_by_values([model[name] for name in var_names])
    fn = model.compile_fn(outs, inputs=value_vars, on_unused_input="ignore", point_fn=False)
    chains, draws = xs.shape[:2]
    values: dict[str, list] = {name: [] for name in var_names}
    for x in xs.reshape(chains * draws, -1):
        point = DictToArrayBijection.rmap(RaveledVars(x, info))
        for name, value in zip(var_names, fn(*[point[v.name] for v in value_vars]), strict=True):
            values[name].append(value)
    return {
        name: np.asarray(vals).reshape(chains, draws, *np.shape(vals[0]))
        for name, vals in values.items()
    }


def sample_on_device(
    step: Any,
    *,
    draws: int,
    tune: int,
    chains: int,
    callback: PrivacyCallback,
    model: pm.Model,
    random_seed: Any = None,
    initvals: Any = None,
    var_names: list[str] | None = None,
    block: int = DEFAULT_BLOCK,
    **ignored: Any,
) -> Any:
    """Tune on the default path, draw on the device; return InferenceData shaped as
    ``pm.sample``'s (not finalized: :func:`pymc_penalty.sample` finalizes it).

    Parameters
    ----------
    step : PenaltyMetropolis
        The budgeted step :func:`pymc_penalty.sample` built (gate and calibration done).
    draws, tune, chains : int
    callback : PrivacyCallback
        Composes every release, tuning and device draws alike.
    model : pm.Model
    random_seed, initvals, var_names
        As in ``pm.sample`` (proposals, uniforms and initial points; never the noise).
    block : int
        Steps per device block.
    """
    import arviz as az
    from arviz.data.base import make_attrs
    from pymc.backends.arviz import (
        coords_and_dims_for_inferencedata,
        find_constants,
        find_observations,
    )
    from pymc.blocking import DictToArrayBijection
    from pymc.initial_point import make_initial_point_fns_per_chain
    from pymc.util import get_random_generator

    t0 = time.perf_counter()
    step._lik.check_layout()  # shapes only: the data the gate checked are the data compiled
    value_vars = list(step.vars)
    chain_fn = DeviceChain(
        model_function(model, value_vars),
        clip_mode=step.clip_mode,
        neighbours=step.neighbours,
        step_mu=float(step.mu),
        clip_count_share=step.clip_count_share,
    )
    rngs = get_random_generator(random_seed).spawn(chains)
    seeds = [int(r.integers(2**30)) for r in rngs]
    ipfns = make_initial_point_fns_per_chain(
        model=model, overrides=initvals, jitter_rvs=set(), chains=chains
    )
    if var_names is None:
        var_names = [v.name for v in [*model.free_RVs, *model.deterministics]]
    per_chain = []
    info = None
    for c in range(chains):
        point = ipfns[c](seeds[c])
        q = DictToArrayBijection.map({v.name: point[v.name] for v in value_vars})
        info = q.point_map_info
        step.set_rng(rngs[c])
        q = _tune_on_default_path(step, q, tune, c, callback)
        frozen = (step.adapter.chol, float(step.adapter.scaling), float(step.clip))
        # After a refusal the ledger refuses again (nothing spent, the data untouched).
        out, _ = run_device_draws(
            chain_fn,
            np.asarray(q.data, dtype=np.float64),
            draws,
            proposal=frozen,
            ledger=step.ledger,
            step_mu=float(step.mu),
            noise=step._noise(),
            rng=step.rng,
            block=block,
        )
        _report_draws(callback, c, out["dp_released"], float(step.mu))
        out["scaling"] = np.full(draws, frozen[1])
        out["dp_clip"] = np.full(draws, frozen[2])
        per_chain.append(out)
    stacked = {k: np.stack([o[k] for o in per_chain]) for k in per_chain[0]}
    released = stacked["dp_released"]
    stats = {
        "accept": stacked["accept"],
        "accepted": stacked["accepted"],
        "scaling": stacked["scaling"],
        "dp_noise_sd": stacked["dp_noise_sd"],
        "dp_sensitivity": stacked["dp_sensitivity"],
        "dp_mu": np.where(released, float(step.mu), 0.0),
        "proposal": stacked["proposal"],
        "dp_clipped_fraction": step._public_fraction(stacked["dp_clipped_count"], step._n),
        "dp_clipped_count": stacked["dp_clipped_count"],
        "dp_released": released,
    }
    if step.clip_auto:
        stats["dp_clip"] = stacked["dp_clip"]
    posterior = _posterior(model, value_vars, info, stacked["x"], list(var_names))
    coords, dims = coords_and_dims_for_inferencedata(model)
    attrs = make_attrs(
        {"sampling_time": time.perf_counter() - t0, "tuning_steps": int(tune)}, library=pm
    )
    idata = az.from_dict(
        posterior=posterior,
        sample_stats=stats,
        observed_data=find_observations(model),
        constant_data=find_constants(model),
        coords=coords,
        dims=dims,
    )
    for group in ("posterior", "sample_stats"):  # where pm.sample puts them
        idata[group].attrs.update(attrs)
    return idata
