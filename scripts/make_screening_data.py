"""Regenerate the embedded synthetic screening dataset (pymc_penalty/data/screening.csv).

The table is synthetic: 20000 made-up patients with four covariates and a binary outcome drawn
from a logistic model with known coefficients, so examples and tests can compare a private
posterior with the truth. Run from the repository root: ``python scripts/make_screening_data.py``.
"""

from pathlib import Path

import numpy as np

TRUE_COEFFICIENTS = {"intercept": -1.0, "age": 0.8, "bmi": 0.5, "smoker": 0.7, "sbp": 0.3}


def main() -> None:
    rng = np.random.default_rng(20261120)
    n = 20000
    age = np.round(rng.uniform(30, 80, n))
    bmi = np.round(rng.normal(27, 4, n), 1)
    smoker = rng.binomial(1, 0.25, n)
    sbp = np.round(rng.normal(130, 15, n))
    c = TRUE_COEFFICIENTS
    # Public, data-independent scaling (the same as pymc_penalty.datasets uses).
    eta = c["intercept"] + c["age"] * (age - 55) / 15 + c["bmi"] * (bmi - 27) / 4
    eta = eta + c["smoker"] * smoker + c["sbp"] * (sbp - 130) / 15
    outcome = rng.binomial(1, 1 / (1 + np.exp(-eta)))
    path = Path(__file__).resolve().parents[1] / "pymc_penalty" / "data" / "screening.csv"
    rows = np.column_stack([age, bmi, smoker, sbp, outcome])
    header = "age,bmi,smoker,sbp,outcome"
    fmt = ["%d", "%.1f", "%d", "%d", "%d"]
    np.savetxt(path, rows, delimiter=",", header=header, comments="", fmt=fmt)


if __name__ == "__main__":
    main()
