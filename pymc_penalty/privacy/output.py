"""What PyMC prints while the package samples: nothing that measures time.

Wall-clock time grows with the number of records, which is private under add/remove-one
neighbours. PyMC logs ``Sampling 4 chains for ... took N seconds.`` at INFO after every
``pm.sample``, and its progress bar shows draws per second, the elapsed and the remaining time
(issue 28: 0 s at n = 2,000, 4 s at n = 400,000). :func:`hidden_timing` removes the clause from
PyMC's log line (the rest of the line, public counts of draws, is kept) for the duration of a
``with`` block; :func:`progressbar_allowed` says whether PyMC's progress bar may be shown.
``pp.sample`` uses both; wrap ``pm.sample(step=PenaltyMetropolis(...))`` in
``hidden_timing()`` yourself on the low-level path.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager

from pymc_penalty.accounting.sensitivity import Neighbours

__all__ = ["TIMING_LOGGERS", "HideTiming", "hidden_timing", "progressbar_allowed"]

#: The loggers whose records can hold a duration: PyMC's sampling loggers. A logger's filter
#: sees only the records created on that logger (not its children's), so each is named.
TIMING_LOGGERS = ("pymc", "pymc.sampling.mcmc", "pymc.sampling.population", "pymc.sampling.jax")

_TOOK = re.compile(r"\s*\btook\s+[-+0-9.eE]+\s*(?:seconds?|s)\b")


class HideTiming(logging.Filter):
    """Rewrites a record that states a duration (``took N seconds``) without it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if _TOOK.search(message):
            record.msg, record.args = _TOOK.sub("", message), ()
        return True


@contextmanager
def hidden_timing() -> Iterator[None]:
    """Within the block, PyMC's log lines carry no duration.

    Examples
    --------
    >>> import pymc_penalty as pp
    >>> from pymc_penalty.privacy.output import hidden_timing
    >>> with model, hidden_timing():  # doctest: +SKIP
    ...     idata = pm.sample(step=pp.PenaltyMetropolis(epsilon=1.0, delta=1e-5))
    """
    hide = HideTiming()
    loggers = [logging.getLogger(name) for name in TIMING_LOGGERS]
    for logger in loggers:
        logger.addFilter(hide)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(hide)


def progressbar_allowed(neighbours: str | Neighbours) -> bool:
    """Whether PyMC's progress bar may be shown: not under add/remove-one neighbours, where
    its draws per second and its elapsed and remaining times measure the private n."""
    return Neighbours.parse(neighbours) is not Neighbours.ADD_REMOVE
