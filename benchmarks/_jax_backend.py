"""The JAX backend's column of the speed benchmark: the device chain ``pp.sample`` runs.

What is timed is what ``pymc_penalty.sample(..., backend="jax")`` runs after tuning, through
the same function (:func:`pymc_penalty.backends.jax.driver.run_device_draws`): per call, one block
committed to a :class:`~pymc_penalty.PrivacyLedger` release by release, its noise drawn on
the host from OS entropy, its proposals and uniforms from a seeded NumPy generator, one
jitted ``lax.scan`` on the device (per-row terms at the proposal, ratio to the cached current
terms, metric clip, sum, noise, penalty test) and the released outputs copied back. The chain
continues across calls (the per-row cache stays on the device). Configuration: per-step
``mu = 10`` (5 % of ``mu^2`` on the clipped count), metric clip constant 1, proposal
``scale * I``, substitute-one: a large ``mu``, so that the noise sd (about 0.65) and the
acceptance rate are close to the BlackJAX chain's; the work per step does not depend on it.

Same logistic model, prior, scale and start as the BlackJAX chain, float64, one XLA thread.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from _blackjax import skip_reason
from _common import LogisticData, logistic_model

__all__ = ["PenaltyDeviceChain"]

STEP_MU = 10.0
CLIP = 1.0


class PenaltyDeviceChain:
    """The JAX backend's frozen penalty chain on the benchmark's logistic model.

    Parameters
    ----------
    data : LogisticData
    scale : float
        Proposal standard deviation of each coefficient.
    chunk_sizes : iterable of int
        Numbers of steps per call to compile in advance (the scan length is static).
    seed : int
        Seed of the proposals and uniforms (never of the noise).
    """

    def __init__(
        self, data: LogisticData, *, scale: float, chunk_sizes: Iterable[int], seed: int = 0
    ) -> None:
        reason = skip_reason()  # sets one XLA thread before JAX is imported
        if reason:
            raise RuntimeError(reason)
        from pymc_penalty import PrivacyLedger
        from pymc_penalty.accounting.sensitivity import ClipMode, Neighbours
        from pymc_penalty.backends.jax.driver import run_device_draws
        from pymc_penalty.backends.jax.kernel import DeviceChain, model_function

        model = logistic_model(data)
        self._run = run_device_draws
        self.chain = DeviceChain(
            model_function(model, model.value_vars),
            clip_mode=ClipMode.METRIC,
            neighbours=Neighbours.SUBSTITUTE,
            step_mu=STEP_MU,
            clip_count_share=0.05,
        )
        self.proposal = (np.eye(data.d) * float(scale), 1.0, CLIP)
        self.ledger = PrivacyLedger(1e6)  # far more than any run here spends
        self.noise = np.random.default_rng()  # OS entropy, as the step's
        self.rng = np.random.default_rng(seed)
        self.x = np.asarray(data.beta_true, dtype=np.float64)
        self.carry = None
        self.accepted = 0
        self.steps = 0
        for k in sorted({int(k) for k in chunk_sizes if k > 0}):
            self.run(k)  # compile (and warm up) every scan length used later
        self.accepted = self.steps = 0

    def run(self, steps: int) -> None:
        """Advance the chain by ``steps`` paid-for steps (one block, one jitted call)."""
        out, self.carry = self._run(
            self.chain,
            self.x,
            int(steps),
            proposal=self.proposal,
            ledger=self.ledger,
            step_mu=STEP_MU,
            noise=self.noise,
            rng=self.rng,
            block=int(steps),
            carry=self.carry,
        )
        self.x = out["x"][-1]
        self.accepted += int(out["accepted"].sum())
        self.steps += int(steps)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / max(self.steps, 1)
