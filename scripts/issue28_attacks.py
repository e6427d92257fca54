"""Issue 28, items 1, 2 and 4: run the red team's attacks and print their outcomes.

Usage (from the repository root; PYTHONPATH chooses which checkout is measured)::

    PYTHONPATH=. python scripts/issue28_attacks.py

Prints one line per attack. On e48aff3 the bisection recovers the record, the n / n + 1
outcomes differ, and the chunks publish every record; after issue 28 none of that happens
(item 2 with ``min_rows``; without it, now that ``min_rows`` is required under add/remove-one,
the step is refused with the same message for every n, which the script prints).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pymc as pm

import pymc_penalty as pp

SECRET = 7.3
#: Refusals of an argument (``min_rows`` missing under add/remove-one): a subclass of
#: TypeError, told apart from an older checkout's TypeError for an unknown keyword.
_ARGUMENT_ERROR = getattr(pp, "InvalidArgumentError", ())


def _outcome(build, **kwargs) -> str:
    with pm.Model():
        build()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                pp.PenaltyMetropolis(**kwargs)
        except _ARGUMENT_ERROR as exc:
            return f"refused: {type(exc).__name__}: {str(exc)[:60]}"
        except TypeError as exc:
            return f"TypeError ({exc})"
        except Exception as exc:  # noqa: BLE001 (the outcome is what is printed)
            return f"refused: {type(exc).__name__}: {str(exc)[:60]}"
    return "built"


def bisection() -> None:
    y = np.concatenate([[SECRET], np.random.default_rng(1).uniform(20.0, 30.0, size=59)])
    lo, hi, outcomes = 0.0, 20.0, set()
    for _ in range(26):
        c = 0.5 * (lo + hi)

        def build(c: float = c) -> None:
            pm.Poisson("z", pm.Exponential("lam", 1.0), observed=np.round(y - (c + 0.5)))

        out = _outcome(build, epsilon=1.0, delta=1e-5)
        outcomes.add(out.split(":")[0])
        lo, hi = (lo, c) if out.startswith("refused") else (c, hi)
    print(
        f"item 1, bisection (26 constructions): outcomes {sorted(outcomes)}, estimate "
        f"{0.5 * (lo + hi):.6f} (secret {SECRET}), |error| {abs(0.5 * (lo + hi) - SECRET):.2e}"
    )


Y = np.random.default_rng(0).normal(size=100)


def _add_remove(build_y, n: int, **kwargs) -> str:
    y = np.resize(Y, n)
    return _outcome(lambda: build_y(y), mu=1.0, neighbours="add_remove", **kwargs)


def _params42(y: np.ndarray) -> None:
    pm.Normal("y", pm.Normal("b", shape=42).sum(), 1.0, observed=y)


def _prior6(y: np.ndarray) -> None:
    pm.Normal("y", pm.Normal("b", mu=np.arange(6.0), shape=6).sum(), 1.0, observed=y)


def _coupled(y: np.ndarray) -> None:
    yd = pm.Data("yd", y)
    pm.Normal("y", pm.Normal("m") + yd.mean(), 1.0, observed=yd)


def n_against_n_plus_one() -> None:
    cases = [
        ("42 parameters", _params42, (40, 41), {}, {"min_rows": 10}),
        ("prior mean of length 6", _prior6, (11, 12, 13, 14), {}, {"min_rows": 11}),
        ("coupled model, tiny n", _coupled, (0, 1, 2), {}, {"min_rows": 3}),
    ]
    for label, build, ns, old, new in cases:
        for name, kwargs in (("no bound", old), (f"min_rows={new['min_rows']}", new)):
            outs = [_add_remove(build, n, **kwargs) for n in ns]
            distinct = len({o.split(":")[0] + o[:40] for o in outs})
            short = [o[:34] for o in outs]
            print(f"item 2, {label}, {name}, n = {ns}: {distinct} distinct outcome(s) {short}")


def chunks() -> None:
    y = np.random.default_rng(5).normal(size=300)
    with pm.Model():
        a = pm.Normal("a", 0.0, 1.0)
        for i in range(3):
            pm.Deterministic(f"leak{i}", a * 0.0 + y[100 * i : 100 * (i + 1)])
        pm.Normal("y", a, 1.0, observed=y)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata = pp.sample(
                epsilon=1.0, delta=1e-5, draws=5, tune=5, chains=1, warm_start=0,
                progressbar=False, random_seed=2,
            )  # fmt: skip
    values = np.concatenate([np.ravel(idata[g].to_array().values) for g in idata.groups()])
    found = np.isin(np.round(y, 12), np.round(values.astype(float), 12)).sum()
    print(f"item 4, three chunks: published {sorted(idata.posterior.data_vars)}; "
          f"{found} of 300 records in the result")  # fmt: skip


def screen_noise() -> None:
    try:
        from pymc_penalty.model.screen import SCREEN_SHARE, count_noise_sd
    except ImportError:
        print("item 1, screen: not in this checkout")
        return
    mu = math.sqrt(SCREEN_SHARE) * pp.PrivacyBudget(1.0, 1e-5).mu
    print(f"item 1, screen at (1, 1e-5), one observed variable: mu {mu:.4f}, noise sd "
          f"{count_noise_sd(1, mu):.1f} rows")  # fmt: skip


if __name__ == "__main__":
    bisection()
    n_against_n_plus_one()
    chunks()
    screen_noise()
