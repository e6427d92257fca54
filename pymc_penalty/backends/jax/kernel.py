"""The JAX backend's device kernel: frozen penalty steps under ``jax.jit`` + ``lax.scan``.

Pure JAX apart from building the model's function: no ledger, no noise source, no PyMC
sampling machinery. :mod:`pymc_penalty.backends.jax.driver` drives it (commits each block to the
ledger, draws the block's noise on the host, passes both in).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pymc as pm

from pymc_penalty.accounting.sensitivity import ClipMode, Neighbours
from pymc_penalty.errors import InvalidArgumentError
from pymc_penalty.model.likelihood import per_datapoint_terms
from pymc_penalty.model.rewrites import LIFT_UNARY_THROUGH_SWITCH
from pymc_penalty.privacy.mechanism import release_noise

__all__ = ["VARIADIC_REDUCE_ROWS", "DeviceChain", "import_jax", "model_function"]


def import_jax() -> Any:
    """``jax``, or an error naming the extra to install."""
    try:
        import jax
    except ImportError:
        raise InvalidArgumentError(
            "`backend='jax'` needs JAX: pip install 'pymc-penalty[jax]' (jax and jaxlib)."
        ) from None
    return jax


def _step_length(jnp: Any, mode: ClipMode, move: Any, chol: Any) -> Any:
    """:func:`pymc_penalty.accounting.sensitivity.step_length` in JAX (same norms, same factor
    ``L``)."""
    if mode is ClipMode.LIPSCHITZ:
        return jnp.abs(move).sum()
    if mode is ClipMode.METRIC:
        from jax.scipy.linalg import solve_triangular

        white = solve_triangular(chol, move, lower=True)
        return jnp.sqrt(white @ white)
    return jnp.sqrt(move @ move)


#: From this many rows on, the clipped sum and the clipped count are one variadic reduction.
#: Measured on the project's machine (ms per evaluation, BlackJAX's log density in brackets):
#: two reductions 0.15 (0.15) at n = 1e4, 5.4 (4.8) at 3e5, 38 (15) at 1e6; one variadic
#: reduction 0.17 to 0.22 at 1e4, 5.8 at 3e5, 17 at 1e6. With the data out of cache, two
#: reductions cost about two more passes over the rows.
VARIADIC_REDUCE_ROWS = 500_000


def _sum_and_count(jax: Any, clipped: Any, inside: Any) -> tuple[Any, Any]:
    """``(clipped.sum(), inside.sum())``: two reductions, or one over both for many rows."""
    if clipped.shape[0] < VARIADIC_REDUCE_ROWS:
        return clipped.sum(), inside.sum()
    return jax.lax.reduce(
        (clipped, inside), (0.0, 0.0), lambda a, b: (a[0] + b[0], a[1] + b[1]), (0,)
    )


def model_function(model: pm.Model, value_vars: list) -> Callable:
    """JAX function of the raveled unconstrained point: (per-row log-likelihood, log prior).

    The per-row terms are :func:`per_datapoint_terms`' (the graph the default path compiles,
    PyMC's parameter checks removed); the prior is the model's, Jacobians and data-free
    Potentials included. Compiled as :func:`pymc.sampling.jax.get_jaxified_graph` does (data
    containers become constants), with the default path's exact rewrite
    (:mod:`pymc_penalty.model.rewrites`: one softplus per Bernoulli row instead of two).
    """
    import pytensor.tensor as pt
    from pymc.pytensorf import join_nonshared_inputs
    from pymc.sampling.jax import _replace_shared_variables
    from pytensor.compile.mode import get_mode
    from pytensor.graph.fg import FunctionGraph
    from pytensor.link.jax.dispatch import jax_funcify

    terms = per_datapoint_terms(model)
    per_row = functools.reduce(lambda a, b: a + b, terms)
    prior = model.logp(vars=list(model.free_RVs) + list(model.potentials), jacobian=True)
    point = model.initial_point()
    (ll, logprior), flat = join_nonshared_inputs(
        point=point, outputs=[per_row, prior], inputs=value_vars, shared_inputs={}
    )
    outputs = _replace_shared_variables([pt.cast(ll, "float64"), pt.cast(logprior, "float64")])
    fgraph = FunctionGraph(inputs=[flat], outputs=outputs, clone=True)
    get_mode("JAX").including(LIFT_UNARY_THROUGH_SWITCH).optimizer.rewrite(fgraph)
    fn = jax_funcify(fgraph)
    return lambda x: fn(x)


class DeviceChain:
    """Frozen penalty steps on the device: one jitted ``lax.scan`` per block.

    One compilation serves every chain: the frozen proposal and clip are arguments.

    Parameters
    ----------
    model_fn : callable
        ``x -> (per-row log-likelihood, log prior)`` in JAX (:func:`model_function`).
    clip_mode : ClipMode
    neighbours : Neighbours
    step_mu : float
        Per-step Gaussian-DP ``mu`` (likelihood release and clipped count together).
    clip_count_share : float
        Share of ``step_mu**2`` spent on the clipped count.
    """

    def __init__(
        self,
        model_fn: Callable,
        *,
        clip_mode: ClipMode,
        neighbours: Neighbours,
        step_mu: float,
        clip_count_share: float,
    ) -> None:
        jax = import_jax()
        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp

        self._jax = jax
        # The count's noise does not depend on the move: mechanism.release_noise at length 0.
        count_sd = release_noise(
            1.0, clip_mode, neighbours, 0.0, mu=step_mu, count_share=clip_count_share
        ).count_sd

        def body(carry: tuple, inputs: tuple) -> tuple:
            (chol, scaling, clip), x, ll, logprior = carry
            z, log_u, noise = inputs
            move = scaling * (chol @ z)
            x1 = x + move
            length = _step_length(jnp, clip_mode, move, chol)
            bound, delta, sigma, _, _ = release_noise(
                clip, clip_mode, neighbours, length, mu=step_mu, count_share=clip_count_share
            )
            ll1, logprior1 = model_fn(x1)
            # As likelihood.clipped_ratio_sum: ratios clipped to [-B, B]; a NaN ratio (a row
            # that cannot be evaluated) fails `inside`, so it counts as clipped, and adds 0.
            ratio = ll1 - ll
            inside = jnp.abs(ratio) <= bound
            clipped = jnp.where(inside, ratio, jnp.where(ratio > 0, bound, -bound))
            clipped = jnp.where(jnp.isnan(ratio), 0.0, clipped)
            clipped_sum, n_inside = _sum_and_count(jax, clipped, inside.astype(jnp.float64))
            n_over = jnp.size(ratio) - n_inside
            d_hat = clipped_sum + sigma * noise[0]
            count = n_over + count_sd * noise[1] if math.isfinite(count_sd) else jnp.nan
            # kernel.penalised_log_ratio and penalty_decision, traced.
            log_ratio = d_hat + (logprior1 - logprior) - 0.5 * sigma**2
            log_ratio = jnp.where(jnp.isnan(log_ratio), -jnp.inf, log_ratio)
            accepted = log_u < log_ratio
            # A select, not lax.cond: XLA fuses it with the pass that writes the cache (n = 1e6,
            # ms per step, BlackJAX in brackets: select 17 to 18.5 (14.4 to 14.9), cond 19.7
            # to 21.9 (14.3 to 15.8), in the same session).
            x_new = jnp.where(accepted, x1, x)
            carry = (
                carry[0],
                x_new,
                jnp.where(accepted, ll1, ll),
                jnp.where(accepted, logprior1, logprior),
            )
            prob = jnp.exp(jnp.minimum(0.0, log_ratio))
            count = jnp.asarray(count, dtype=jnp.float64)
            return carry, (x_new, x1, accepted, prob, sigma, delta, count)

        @jax.jit
        def run_block(carry: tuple, z: Any, log_u: Any, noise: Any) -> tuple:
            return jax.lax.scan(body, carry, (z, log_u, noise))

        @jax.jit
        def start(params: tuple, x: Any) -> tuple:
            ll, logprior = model_fn(x)
            return params, x, ll, logprior

        self._run_block = run_block
        self._start = start

    def start(self, x0: np.ndarray, chol: np.ndarray, scaling: float, clip: float) -> tuple:
        """The device state at ``x0``: the frozen proposal and clip, the point, its per-row
        cache (which stays on the device) and its log prior. Touches the data: call it only
        once a release is paid for."""
        f64 = np.float64
        params = (np.asarray(chol, f64), np.asarray(scaling, f64), np.asarray(clip, f64))
        return self._start(params, np.asarray(x0, dtype=f64))

    def run(self, carry: tuple, z: np.ndarray, log_u: np.ndarray, noise: np.ndarray) -> tuple:
        """Run ``len(z)`` steps whose releases are already paid for; return the new carry and
        the released outputs as host arrays: states, proposals, accepted, acceptance
        probability, noise sd, sensitivity, noisy clipped count."""
        carry, outs = self._run_block(carry, z, log_u, noise)
        return carry, tuple(np.asarray(o) for o in outs)
