"""The sampling callback: composes every chain's releases, stops when the budget is out.

``pm.sample`` calls the callback in the main process for every draw of every chain, tuning
draws included, with the step's statistics. Each released draw carries its ``dp_mu``; the
callback composes it in one :class:`~pymc_penalty.accounting.GDPAccountant` per chain (and one
per party of a several-owners run) and overall. The ledger, not the callback, is what
keeps a run from overspending (workers may run ahead of the callback); the callback stops the
run once a step reports that the ledger refused a release, and cross-checks its own total
against the ledger's.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

from pymc_penalty.accounting import GDPAccountant, composed_epsilon
from pymc_penalty.errors import BudgetExhausted, PrivacyAccountingError
from pymc_penalty.privacy.budget import PrivacyBudget

__all__ = ["BudgetExhausted", "PrivacyAccountingError", "PrivacyCallback"]

_log = logging.getLogger("pymc.penalty")


def _released(stats: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The statistics of the step methods that released this draw."""
    return [method_stats for method_stats in stats if method_stats.get("dp_released")]


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
    total_draws : int, optional
        The draws the run will report over all chains, tuning included: the line is also
        logged at the last one, so the last line is the run's total.

    Notes
    -----
    The epsilon each line shows is the figure the report will show (``dp_epsilon``): the
    ledger's spending before the callback was made (a warm start, earlier analyses on a
    persistent ledger) composed with every release the chains reported since.
    """

    def __init__(
        self,
        budget: PrivacyBudget,
        ledger: Any = None,
        *,
        log_every: int = 0,
        total_draws: int | None = None,
    ) -> None:
        self.budget = budget
        self.ledger = ledger
        self.log_every = int(log_every)
        self.total_draws = None if total_draws is None else int(total_draws)
        #: ``mu^2`` the ledger had granted before this run's chains (rounded down).
        self.before_mu2 = 0.0 if ledger is None else float(getattr(ledger, "used_mu2", 0.0))
        #: One accountant per chain: its releases, tuning included.
        self.chain_accountants: dict[int, GDPAccountant] = defaultdict(GDPAccountant)
        #: One accountant per per-party statistic (``dp_mu_owner_<j>``, ``dp_mu_outsider``).
        self.party_accountants: dict[str, GDPAccountant] = defaultdict(GDPAccountant)
        self.tuning_releases = 0
        self.draws_seen = 0
        self.refused = False

    def __call__(self, trace: Any = None, draw: Any = None) -> None:
        """Record one draw (the signature ``pm.sample`` calls)."""
        self.draws_seen += 1
        released = _released(draw.stats)
        chain = self.chain_accountants[draw.chain]  # a chain counts from its first draw
        for method_stats in released:
            chain.spend(float(method_stats["dp_mu"]))
            for key, value in method_stats.items():
                if key.startswith("dp_mu_"):
                    self.party_accountants[key].spend(float(value))
        if draw.tuning:
            self.tuning_releases += len(released)
        if self.log_every and (
            self.draws_seen % self.log_every == 0 or self.draws_seen == self.total_draws
        ):
            self._log_progress()
        if _was_refused(draw.stats):
            self.refused = True
            raise BudgetExhausted("privacy budget exhausted")

    def _log_progress(self) -> None:
        before = ""
        if self.before_mu2 > 0:
            earlier = composed_epsilon(self.before_mu2, self.budget.delta)
            before = f"; {earlier:.4g} before the chains"
        _log.info(
            "privacy: epsilon spent %.4g of %.4g (delta %.3g%s) after %d chain releases",
            self.spent_epsilon,
            self.budget.epsilon,
            self.budget.delta,
            before,
            self.releases,
        )

    @property
    def spent_epsilon(self) -> float:
        """Tight epsilon of everything the ledger had spent before this callback was made
        (a warm start, earlier analyses) and the chains' releases seen since: the report's
        ``dp_epsilon`` once the run ends."""
        return composed_epsilon(self.before_mu2 + self.mu2, self.budget.delta)

    @property
    def accountant(self) -> GDPAccountant:
        """A new accountant composing every chain's releases seen so far."""
        return GDPAccountant.total(self.chain_accountants.values())

    @property
    def mu2_by_chain(self) -> dict[int, float]:
        """Composed ``sum mu_t^2`` of each chain's releases."""
        return {c: acc.mu_squared for c, acc in self.chain_accountants.items()}

    @property
    def releases_by_chain(self) -> dict[int, int]:
        """Releases of each chain (every chain that reported a draw, tuning included)."""
        return {c: acc.releases for c, acc in self.chain_accountants.items()}

    @property
    def component_mu2(self) -> dict[str, float]:
        """Composed ``sum mu_t^2`` of each per-party statistic (several-owners runs)."""
        return {key: acc.mu_squared for key, acc in self.party_accountants.items()}

    @property
    def mu2(self) -> float:
        """Composed ``sum mu_t^2`` of the releases seen so far."""
        return self.accountant.mu_squared

    @property
    def mu(self) -> float:
        """Composed Gaussian-DP ``mu`` of the releases seen so far."""
        return self.accountant.mu

    @property
    def epsilon(self) -> float:
        """Tight epsilon (at the budget's delta) of the releases seen so far."""
        return self.accountant.get_epsilon(self.budget.delta)

    @property
    def releases(self) -> int:
        """Number of releases seen so far, over all chains and tuning."""
        return self.accountant.releases

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
