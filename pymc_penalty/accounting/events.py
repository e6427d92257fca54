"""Immutable privacy events and the checkpointable :class:`GDPAccountant`.

Events describe what was released (:class:`GaussianRelease`, :class:`ComposedReleases`,
:class:`RepeatedRelease`); the accountant keeps their composed ``sum mu_t**2`` and answers with
the tight ``mu``-GDP curve of :mod:`pymc_penalty.accounting.gdp`. The sampling callback keeps
one accountant per chain and per party, and the private warm start one for its releases.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pymc_penalty.accounting.gdp import composed_epsilon, gdp_delta
from pymc_penalty.validation import check_integer, check_real

__all__ = [
    "ComposedReleases",
    "GDPAccountant",
    "GaussianRelease",
    "PrivacyEvent",
    "RepeatedRelease",
]


@dataclass(frozen=True)
class GaussianRelease:
    """One release of a statistic plus ``N(0, noise_sd**2)`` noise.

    Parameters
    ----------
    sensitivity : float
        L2 sensitivity ``Delta`` of the statistic under the neighbour relation in use
        (substitute-one with per-datapoint bound ``B``: ``2B``; add/remove-one: ``B``), in
        ``[0, inf)``.
    noise_sd : float
        Noise standard deviation, in ``(0, inf]``.
    """

    sensitivity: float
    noise_sd: float

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "sensitivity", check_real("sensitivity", self.sensitivity, low=0.0)
        )
        noise_sd = check_real("noise_sd", self.noise_sd, low=0.0, low_open=True, finite=False)
        object.__setattr__(self, "noise_sd", noise_sd)

    @property
    def mu(self) -> float:
        """GDP parameter ``sensitivity / noise_sd`` of this release."""
        return self.sensitivity / self.noise_sd


@dataclass(frozen=True)
class ComposedReleases:
    """An adaptive composition of events, in order.

    Parameters
    ----------
    events : sequence of PrivacyEvent
        The composed events (stored as a tuple).
    """

    events: tuple[PrivacyEvent, ...]

    def __post_init__(self) -> None:
        events = tuple(self.events)
        for e in events:
            if not isinstance(e, _EVENT_TYPES):
                raise ValueError(
                    "events must contain only GaussianRelease, ComposedReleases or "
                    f"RepeatedRelease instances; got {type(e).__name__}"
                )
        object.__setattr__(self, "events", events)

    @property
    def mu(self) -> float:
        """GDP parameter of the composition."""
        return math.sqrt(_mu_squared(self))


@dataclass(frozen=True)
class RepeatedRelease:
    """``count`` adaptive repetitions of one event.

    Parameters
    ----------
    event : PrivacyEvent
        The repeated event.
    count : int
        Number of repetitions, ``>= 0``.
    """

    event: PrivacyEvent
    count: int

    def __post_init__(self) -> None:
        if not isinstance(self.event, _EVENT_TYPES):
            raise ValueError(
                "event must be a GaussianRelease, ComposedReleases or RepeatedRelease; "
                f"got {type(self.event).__name__}"
            )
        object.__setattr__(self, "count", check_integer("count", self.count))

    @property
    def mu(self) -> float:
        """GDP parameter of the repetitions."""
        return math.sqrt(_mu_squared(self))


PrivacyEvent = GaussianRelease | ComposedReleases | RepeatedRelease
_EVENT_TYPES = (GaussianRelease, ComposedReleases, RepeatedRelease)


def _mu_squared(event: PrivacyEvent) -> float:
    if isinstance(event, GaussianRelease):
        return event.mu * event.mu
    if isinstance(event, RepeatedRelease):
        return event.count * _mu_squared(event.event)
    return math.fsum(_mu_squared(e) for e in event.events)


def _release_count(event: PrivacyEvent) -> int:
    if isinstance(event, GaussianRelease):
        return 1
    if isinstance(event, RepeatedRelease):
        return event.count * _release_count(event.event)
    return sum(_release_count(e) for e in event.events)


class GDPAccountant:
    """Tight accountant for adaptive compositions of Gaussian releases.

    Keeps ``sum mu_t**2`` (with compensated summation, so millions of small releases do not
    drift) and answers with the exact ``mu``-GDP curve.

    Examples
    --------
    >>> acc = GDPAccountant().compose(GaussianRelease(sensitivity=2.0, noise_sd=40.0), count=100)
    >>> round(acc.mu, 6)
    0.5
    """

    _STATE_FORMAT = "pymc_penalty.GDPAccountant"
    _STATE_VERSION = 1

    def __init__(self) -> None:
        self._mu_sq = 0.0
        self._carry = 0.0
        self._releases = 0

    def compose(self, event: PrivacyEvent, count: int = 1) -> GDPAccountant:
        """Add ``count`` adaptive repetitions of ``event``; returns ``self`` for chaining.

        Parameters
        ----------
        event : PrivacyEvent
            The event to add.
        count : int, default 1
            Number of repetitions, ``>= 0``.

        Returns
        -------
        GDPAccountant
        """
        if not isinstance(event, _EVENT_TYPES):
            raise ValueError(
                "event must be a GaussianRelease, ComposedReleases or RepeatedRelease; "
                f"got {type(event).__name__}"
            )
        count = check_integer("count", count)
        self._add(count * _mu_squared(event))
        self._releases += count * _release_count(event)
        return self

    def spend(self, mu: float, count: int = 1) -> GDPAccountant:
        """Add ``count`` releases of a ``mu``-GDP Gaussian mechanism; returns ``self``.

        The same as ``compose(GaussianRelease(sensitivity=mu, noise_sd=1.0), count)`` without
        building an event (the callback calls it for every draw of every chain), and ``mu``
        may be ``inf`` (a release without a finite sensitivity): the accountant then answers
        ``mu = inf`` and ``epsilon = inf``.

        Parameters
        ----------
        mu : float
            The release's GDP parameter ``Delta / sigma``, in ``[0, inf]``.
        count : int, default 1
            Number of such releases, ``>= 0``.

        Returns
        -------
        GDPAccountant
        """
        mu = check_real("mu", mu, low=0.0, finite=False)
        count = check_integer("count", count)
        self._add(count * (mu * mu) if count else 0.0)
        self._releases += count
        return self

    @classmethod
    def total(cls, accountants: Iterable[GDPAccountant]) -> GDPAccountant:
        """A new accountant holding the composition of ``accountants`` (for instance every
        chain's); the arguments are left as they are.

        Parameters
        ----------
        accountants : iterable of GDPAccountant

        Returns
        -------
        GDPAccountant
        """
        out = cls()
        for acc in accountants:
            if not isinstance(acc, GDPAccountant):
                raise ValueError(f"accountants must be GDPAccountant; got {type(acc).__name__}")
            out._add(acc._mu_sq)
            out._add(acc._carry)
            out._releases += acc._releases
        return out

    def _add(self, x: float) -> None:
        if math.isinf(x) or math.isinf(self._mu_sq):
            # No finite guarantee any more; keep the carry out of inf - inf.
            self._mu_sq, self._carry = math.inf, 0.0
            return
        # Neumaier's compensated summation.
        total = self._mu_sq + x
        if abs(self._mu_sq) >= abs(x):
            self._carry += (self._mu_sq - total) + x
        else:
            self._carry += (x - total) + self._mu_sq
        self._mu_sq = total

    @property
    def mu_squared(self) -> float:
        """``sum mu_t**2`` over everything composed so far."""
        return self._mu_sq + self._carry

    @property
    def mu(self) -> float:
        """Composed GDP parameter ``sqrt(sum mu_t**2)``."""
        return math.sqrt(self.mu_squared)

    @property
    def releases(self) -> int:
        """Number of Gaussian releases composed so far."""
        return self._releases

    def get_epsilon(self, delta: float) -> float:
        """Tight ``epsilon`` at ``delta`` (see :func:`composed_epsilon`); ``inf`` once a release
        without finite sensitivity was composed."""
        return composed_epsilon(self.mu_squared, delta)

    def get_delta(self, epsilon: float) -> float:
        """Tight ``delta`` at ``epsilon`` (see :func:`gdp_delta`)."""
        return gdp_delta(epsilon, self.mu)

    def state_dict(self) -> dict[str, Any]:
        """Plain-Python state for checkpoints (JSON-serialisable, restores bit for bit)."""
        return {
            "format": self._STATE_FORMAT,
            "version": self._STATE_VERSION,
            "mu_squared": self._mu_sq,
            "compensation": self._carry,
            "releases": self._releases,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state produced by :meth:`state_dict`, replacing the current one.

        Raises
        ------
        ValueError
            If ``state`` is not a valid state of this accountant.
        """
        if not isinstance(state, dict) or state.get("format") != self._STATE_FORMAT:
            raise ValueError(f"state must be a dict produced by {type(self).__name__}.state_dict")
        if state.get("version") != self._STATE_VERSION:
            raise ValueError(
                f"state version must be {self._STATE_VERSION}; got {state.get('version')!r}"
            )
        mu_sq = check_real("state['mu_squared']", state.get("mu_squared"), low=0.0)
        carry = check_real("state['compensation']", state.get("compensation"))
        releases = check_integer("state['releases']", state.get("releases"))
        if mu_sq + carry < 0.0:
            raise ValueError("state['mu_squared'] + state['compensation'] must be >= 0")
        self._mu_sq, self._carry, self._releases = mu_sq, carry, releases

    def __repr__(self) -> str:
        return f"{type(self).__name__}(mu={self.mu:.6g}, releases={self._releases})"
