"""The sampling callback: composes every chain's releases, stops when the budget is out.

``pm.sample`` calls the callback in the main process for every draw of every chain, tuning
draws included, with the step's statistics. Each released draw carries its ``dp_mu``; the
callback composes ``sum mu_t^2`` per chain and overall. The ledger, not the callback, is what
keeps a run from overspending (workers may run ahead of the callback); the callback stops the
run once a step reports that the ledger refused a release, and cross-checks its own total
against the ledger's.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from typing import Any

from pymc_penalty.budget import PrivacyBudget

__all__ = ["BudgetExhausted", "PrivacyAccountingError", "PrivacyCallback"]

_log = logging.getLogger("pymc.penalty")


class BudgetExhausted(KeyboardInterrupt):
    """Raised inside ``pm.sample`` to stop sampling once the privacy budget is spent.

    A ``KeyboardInterrupt`` subclass, because that is what ``pm.sample`` treats as a request
    to stop and still return the draws so far.
    """


class PrivacyAccountingError(RuntimeError):
    """The composed releases disagree with the ledger: the run must not be published."""


def _released_costs(stats: list[dict[str, Any]]) -> list[float]:
    costs = []
    for method_stats in stats:
        if "dp_released" in method_stats and method_stats["dp_released"]:
            costs.append(float(method_stats["dp_mu"]) ** 2)
    return costs


def _released_components(stats: list[dict[str, Any]]) -> dict[str, float]:
    """``mu^2`` of per-party statistics (``dp_mu_owner_<j>``, ``dp_mu_outsider``) released."""
    out: dict[str, float] = {}
    for method_stats in stats:
        if method_stats.get("dp_released"):
            for key, value in method_stats.items():
                if key.startswith("dp_mu_"):
                    out[key] = out.get(key, 0.0) + float(value) ** 2
    return out


def _was_refused(stats: list[dict[str, Any]]) -> bool:
    return any("dp_released" in s and not s["dp_released"] for s in stats)


class PrivacyCallback:
    """Compose the privacy cost of every release of a run, across chains and tuning.

    Pass it as ``pm.sample(callback=...)``. It raises :class:`BudgetExhausted` (a
    ``KeyboardInterrupt``) as soon as any chain reports a release refused by the ledger, which
    stops all chains with ``cores > 1`` and the current chain with ``cores = 1``.

    Parameters
    ----------
    budget : PrivacyBudget
        The budget, used to show the spent epsilon while sampling.
    ledger : object, optional
        The run's ledger (``spent_mu2``); checked against the composed total by
        :meth:`check_against_ledger`.
    log_every : int, default 0
        Log the spent epsilon every this many draws (over all chains); 0 to stay quiet.
    """

    def __init__(self, budget: PrivacyBudget, ledger: Any = None, *, log_every: int = 0) -> None:
        self.budget = budget
        self.ledger = ledger
        self.log_every = int(log_every)
        self.mu2_by_chain: dict[int, float] = defaultdict(float)
        #: Composed ``sum mu_t^2`` of each per-party statistic (several-owners runs).
        self.component_mu2: dict[str, float] = defaultdict(float)
        self.releases_by_chain: dict[int, int] = defaultdict(int)
        self.tuning_releases = 0
        self.draws_seen = 0
        self.refused = False

    def __call__(self, trace: Any = None, draw: Any = None) -> None:
        """Record one draw (the signature ``pm.sample`` calls)."""
        self.draws_seen += 1
        costs = _released_costs(draw.stats)
        self.mu2_by_chain[draw.chain] += sum(costs)
        self.releases_by_chain[draw.chain] += len(costs)
        for key, value in _released_components(draw.stats).items():
            self.component_mu2[key] += value
        if draw.tuning:
            self.tuning_releases += len(costs)
        if self.log_every and self.draws_seen % self.log_every == 0:
            _log.info(
                "privacy: epsilon spent %.4g of %.4g (delta %.3g) after %d releases",
                self.epsilon,
                self.budget.epsilon,
                self.budget.delta,
                self.releases,
            )
        if _was_refused(draw.stats):
            self.refused = True
            raise BudgetExhausted("privacy budget exhausted")

    @property
    def mu2(self) -> float:
        """Composed ``sum mu_t^2`` of the releases seen so far."""
        return math.fsum(self.mu2_by_chain.values())

    @property
    def mu(self) -> float:
        """Composed Gaussian-DP ``mu`` of the releases seen so far."""
        return math.sqrt(self.mu2)

    @property
    def epsilon(self) -> float:
        """Tight epsilon (at the budget's delta) of the releases seen so far."""
        return self.budget.epsilon_spent(self.mu)

    @property
    def releases(self) -> int:
        """Number of releases seen so far, over all chains and tuning."""
        return sum(self.releases_by_chain.values())

    def check_against_ledger(self) -> None:
        """Raise :class:`PrivacyAccountingError` if the draws seen cost more than the ledger.

        The ledger may show more (workers run ahead of the callback; reserved chunks count as
        spent), never less.
        """
        if self.ledger is None:
            return
        ledger_mu2 = self.ledger.spent_mu2
        if self.mu2 > ledger_mu2 * (1.0 + 1e-9) + 1e-300:
            raise PrivacyAccountingError(
                "The releases reported by the chains cost more than the ledger recorded; the "
                "result must not be published."
            )
