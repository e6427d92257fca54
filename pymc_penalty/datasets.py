"""Datasets shipped with the package."""

from __future__ import annotations

from importlib.resources import files
from typing import NamedTuple

import numpy as np

__all__ = ["Screening", "load_screening"]

#: Public, data-independent centring and scale of each covariate. Standardising with the
#: data's own mean and sd would release those statistics without noise.
SCREENING_SCALING = {"age": (55.0, 15.0), "bmi": (27.0, 4.0), "sbp": (130.0, 15.0)}
#: The coefficients the synthetic outcome was drawn with (on the scaled covariates).
SCREENING_TRUTH = {"intercept": -1.0, "age": 0.8, "bmi": 0.5, "smoker": 0.7, "sbp": 0.3}


class Screening(NamedTuple):
    """The synthetic screening table.

    Attributes
    ----------
    X : ndarray, shape (20000, 5)
        Design matrix: intercept column, then age, bmi, smoker, sbp scaled by
        ``SCREENING_SCALING`` (smoker is 0/1).
    y : ndarray, shape (20000,)
        Binary outcome.
    columns : tuple of str
        Names of the columns of ``X``.
    truth : dict
        Coefficients the outcome was simulated with.
    """

    X: np.ndarray
    y: np.ndarray
    columns: tuple[str, ...]
    truth: dict[str, float]


def load_screening() -> Screening:
    """Load the embedded synthetic screening dataset (20000 made-up patients).

    The table was simulated by ``scripts/make_screening_data.py`` from a logistic model with
    known coefficients: a stand-in for a sensitive table, so examples can compare a private
    posterior with the truth.

    Returns
    -------
    Screening
    """
    text = files("pymc_penalty.data").joinpath("screening.csv").read_text()
    table = np.loadtxt(text.splitlines(), delimiter=",", skiprows=1)
    age, bmi, smoker, sbp, outcome = table.T
    scaled = [
        (col - c) / s
        for col, (c, s) in zip((age, bmi, sbp), SCREENING_SCALING.values(), strict=True)
    ]
    X = np.column_stack([np.ones_like(age), scaled[0], scaled[1], smoker, scaled[2]])
    columns = ("intercept", "age", "bmi", "smoker", "sbp")
    return Screening(X, outcome.astype(np.int64), columns, dict(SCREENING_TRUTH))
