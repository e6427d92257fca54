"""What the Dask benchmarks share (``owners.py``: several owners; ``shards.py``: one table in
shards): the logistic model with ``D = 10`` coefficients and its synthetic rows, loaders that
make the rows on a worker, the interval between a pool's successive steps, quiet logs and the
provenance line of the printed table.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from typing import Any

import cloudpickle
import numpy as np
import pymc as pm
from _common import command_line, machine_info

# The loaders travel by value, with the row maker they call: a worker needs no file of this
# folder (as when the loaders were defined in the benchmark script, __main__).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

__all__ = [
    "D",
    "data_model",
    "logistic_rows",
    "median_interval_ms",
    "median_release_ms",
    "print_provenance",
    "quiet_logs",
    "rows_loader",
    "step_starts",
]

#: Coefficients of the logistic regression.
D = 10


def logistic_rows(
    n: int, seed: int, base_seed: int, unit_norm: bool = False
) -> dict[str, np.ndarray]:
    """``n`` synthetic rows of the logistic regression, from fixed seeds: ``X`` standard
    normal (divided by ``sqrt(D)`` with ``unit_norm``: rows of expected norm 1), ``y`` drawn
    with coefficients evenly spaced in [-1, 1]."""
    rng = np.random.default_rng([base_seed, seed, n])
    x = rng.normal(size=(n, D))
    if unit_norm:
        x = x / np.sqrt(D)
    beta = np.linspace(-1.0, 1.0, D)
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-x @ beta))).astype(np.float64)
    return {"X": x, "y": y}


def rows_loader(n: int, seed: int, **options: Any):
    """A loader of :func:`logistic_rows` (``options``: its keyword arguments), pickled by
    value: it runs on the party's worker, where the rows are made."""

    def load():
        return logistic_rows(n, seed, **options)

    return load


def data_model(rows: dict[str, np.ndarray] | None = None) -> pm.Model:
    """Bayesian logistic regression on ``pm.Data`` containers ``X`` and ``y``: ``beta ~ N(0,
    1)``, ``y ~ Bernoulli(logit_p=X @ beta)``. Without ``rows`` the containers hold one-row
    placeholders (the model that travels to the workers)."""
    rows = rows or {"X": np.zeros((1, D)), "y": np.zeros(1)}
    with pm.Model() as model:
        X = pm.Data("X", rows["X"])
        y = pm.Data("y", rows["y"])
        beta = pm.Normal("beta", 0.0, 1.0, shape=D)
        pm.Bernoulli("obs", logit_p=pm.math.dot(X, beta), observed=y)
    return model


@contextlib.contextmanager
def step_starts(pool: Any) -> Iterator[list[tuple[float, float]]]:
    """The ``(start, end)`` times of each ``pool.release`` call inside the block (one call
    per step: proposals, ledger charge and journal, the parties' calls, the decisions all
    fall between two starts; the call itself is the parties' round trip plus the driver's
    noise and journal). ``pool.release`` is restored after."""
    spans: list[tuple[float, float]] = []
    release = pool.release

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return release(*args, **kwargs)
        finally:
            spans.append((start, time.perf_counter()))

    pool.release = timed
    try:
        yield spans
    finally:
        pool.release = release


def median_interval_ms(spans: list[tuple[float, float]]) -> float:
    """Median milliseconds between successive steps' starts (:func:`step_starts`)."""
    return float(np.median(np.diff([start for start, _ in spans]))) * 1e3


def median_release_ms(spans: list[tuple[float, float]]) -> float:
    """Median milliseconds of one ``pool.release`` call (:func:`step_starts`)."""
    return float(np.median([end - start for start, end in spans])) * 1e3


def quiet_logs() -> None:
    """Only errors from PyMC's and Dask's loggers."""
    logging.getLogger("pymc").setLevel(logging.ERROR)
    logging.getLogger("distributed").setLevel(logging.ERROR)


def print_provenance(script: str, argv: list[str]) -> None:
    """The line above a printed table: the command that made it and the machine."""
    info = machine_info()
    print(f"\nProduced by `{command_line(script, argv)}`; {info['cpu']}, "
          f"{info['cpu_count']} CPUs.\n")  # fmt: skip
