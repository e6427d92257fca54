"""BlackJAX baseline of the speed benchmark: a jitted random-walk Metropolis chain.

The chain is what a user who wants raw speed would write: BlackJAX's additive-step random
walk (``blackjax.additive_step_random_walk`` with a Gaussian step, the ``rmh`` family) on
the same logistic model, prior and proposal scale as the penalty step, ``jax.jit`` around a
``jax.lax.scan`` of steps, float64. BlackJAX keeps the current state's log density, so each
step evaluates the model once, at the proposal, as the penalty step does. XLA runs on one
thread (``XLA_FLAGS``, set before JAX is imported), as BLAS does for every other method.

Needs the ``bench`` extra (``pip install 'pymc-penalty[bench]'``); :func:`skip_reason` says
why it cannot run otherwise.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from typing import Any

import numpy as np
from _common import LogisticData

__all__ = ["BlackjaxChain", "skip_reason"]

_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def skip_reason() -> str:
    """Why the BlackJAX baseline cannot run here ('' if it can)."""
    os.environ.setdefault("XLA_FLAGS", _ONE_THREAD)
    try:
        import blackjax  # noqa: F401
        import jax  # noqa: F401
    except ImportError as exc:
        return f"{exc.name} is not installed; pip install 'pymc-penalty[bench]'"
    return ""


class BlackjaxChain:
    """A jitted BlackJAX random-walk Metropolis chain on the benchmark's logistic model.

    Parameters
    ----------
    data : LogisticData
    scale : float
        Proposal standard deviation of each coefficient (the penalty step's).
    chunk_sizes : iterable of int
        Numbers of steps per call to compile in advance (the scan length is static).
    seed : int
    """

    def __init__(
        self, data: LogisticData, *, scale: float, chunk_sizes: Iterable[int], seed: int = 0
    ) -> None:
        os.environ.setdefault("XLA_FLAGS", _ONE_THREAD)
        import blackjax
        import jax
        import jax.numpy as jnp

        jax.config.update("jax_enable_x64", True)
        self._jax = jax
        X = jnp.asarray(np.ascontiguousarray(data.X, dtype=np.float64))
        y = jnp.asarray(data.y, dtype=jnp.float64)

        def logdensity(beta: Any) -> Any:
            eta = X @ beta
            return jnp.sum(y * eta - jnp.logaddexp(0.0, eta)) - 0.5 * jnp.sum(beta**2)

        sigma = jnp.full(data.X.shape[1], float(scale))
        algorithm = blackjax.additive_step_random_walk(
            logdensity, blackjax.mcmc.random_walk.normal(sigma)
        )

        @functools.partial(jax.jit, static_argnums=2)
        def run_chain(state: Any, key: Any, steps: int) -> tuple[Any, Any]:
            def body(s: Any, k: Any) -> tuple[Any, Any]:
                s, info = algorithm.step(k, s)
                return s, info.is_accepted

            return jax.lax.scan(body, state, jax.random.split(key, steps))

        self._run_chain = run_chain
        self.state = algorithm.init(jnp.asarray(data.beta_true, dtype=jnp.float64))
        self.key = jax.random.key(seed)
        self.accepted = 0
        self.steps = 0
        for k in sorted({int(k) for k in chunk_sizes if k > 0}):
            self.run(k)  # compile (and warm up) every scan length used later
        self.accepted = self.steps = 0

    def run(self, steps: int) -> None:
        """Advance the chain by ``steps`` steps (one jitted call)."""
        self.key, sub = self._jax.random.split(self.key)
        self.state, accepted = self._run_chain(self.state, sub, int(steps))
        self._jax.block_until_ready(self.state)
        self.accepted += int(np.sum(np.asarray(accepted)))
        self.steps += int(steps)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / max(self.steps, 1)
