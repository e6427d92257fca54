"""The private warm start's iterates against the exact mode (a diagnosis; not private).

For a model of ``scripts/taylor_forecast_check.py`` (``gamma``, ``probit``, ``negbin``) or of
``benchmarks/model_suite.py`` and a data set, this runs
:func:`pymc_penalty.warmstart.private_warm_start` with a ledger that grants everything and
seeded noise (``--seeds``) at ``--mu``, and prints, per Fisher-scoring step (the points its
log prior is evaluated at, one per step):

- ``dist``: the iterate's distance from the exact mode in the exact posterior's sds (its
  Laplace covariance at the mode, ``exact_laplace`` of
  ``scripts/taylor_start_diagnostics.py``; RMS over coordinates);
- ``log posterior``: the exact log posterior there less its value at the mode (a step that
  lowered it went downhill on the model's own posterior);
- ``corr``: the largest correlation, in the exact posterior's whitening, of the rows' score
  covariance at the iterate (the spread the warm start's metric estimates, from the exact
  per-row gradients) and, after the slash, of the exact log posterior's Hessian there (what
  a Newton step would use; with the absolute values of its diagonal, so a figure above 1
  says the Hessian is not negative definite there); at the mode both are about 0;
- ``cos``: the cosine between the move to the next iterate and the exact log posterior's
  gradient at this one, in the exact posterior's whitening (negative: the move went
  downhill on the model's own posterior; a step that overshot is taken back in part, so a
  move is not always the step as proposed);
- ``released``: what the step rules read there (:func:`trace`): the released slope along
  the step that led here against the slope at its start, whether that step was a guess and
  the share it went back to, and the stretch set for the next step.

Then the warm start's point (``dist``), its clip history, and the exact gradient's whitened
norm at its point (0 at the mode). With ``--newton``, first the exact, noise-free Newton
method with a backtracking line search from the same start (the model's initial point),
for comparison: its distance after each step. The exact values read the data: a diagnosis, not a
release.

Run ``python scripts/warm_start_trace.py --model gamma --datasets 1 --mu 0.22 100``
(``--quiet``: the warm start's line only; ``--damping L [L ...]``: the warm start's steps
damped, ``warmstart.scoring.DAMPING``, each value on the same data sets and seeds;
``--variant SPEC [SPEC ...]``: other values of ``warmstart.scoring``'s constants, each
``NAME=VALUE[,NAME=VALUE]`` or ``package``, e.g. ``_GUESS_SES=inf`` for the
warm start before the guessed steps' backtrack). Last, one ``SUMMARY`` line per budget,
damping and variant: the median, RMS and largest distance.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pymc as pm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import model_suite as ms  # noqa: E402
import taylor_forecast_check as unseen  # noqa: E402
from taylor_start_diagnostics import exact_laplace  # noqa: E402

import pymc_penalty.warmstart as ws  # noqa: E402
from pymc_penalty.warmstart import scoring  # noqa: E402


class _Unlimited:
    """A ledger that grants every spend (non-private diagnosis)."""

    def try_spend(self, mu2: float) -> bool:
        return True


#: The warm start's own hard starts (``tests/test_warmstart_scale.py``'s, on fresh data):
#: ``heights_far``, ``y ~ N(170, 10)`` with ``mu ~ Normal(0, 100)`` and ``sigma ~
#: HalfNormal(50)`` (location and scale far); ``small_scale``, ``y ~ N(0, 10)`` with ``m ~
#: Normal(0, 10)`` and ``s ~ HalfNormal(1)`` (a scale started far too small).
STARTS = ("heights_far", "small_scale")


def build(name: str, n: int, index: int) -> pm.Model:
    """A model outside the suite (``taylor_forecast_check``), one of :data:`STARTS` (data
    seed ``[13, start, index]``) or one of the suite's."""
    if name in unseen.MODELS:
        return unseen.build(name, n, index)
    if name in STARTS:
        rng = np.random.default_rng([13, STARTS.index(name), index])
        with pm.Model() as model:
            if name == "heights_far":
                loc = pm.Normal("mu", 0.0, 100.0)
                scale = pm.HalfNormal("sigma", 50.0)
                y = rng.normal(170.0, 10.0, size=n)
            else:
                loc = pm.Normal("m", 0.0, 10.0)
                scale = pm.HalfNormal("s", 1.0)
                y = rng.normal(0.0, 10.0, size=n)
            pm.Normal("y", loc, scale, observed=y)
        return model
    return ms.build_model(ms.make_dataset(name, n, index))


class Exact:
    """A model's exact log posterior on the raveled value space (reads the data): its
    compiled value, gradient and Hessian at a raveled point (``split_point`` on the warm
    start's template), its exact mode and Laplace covariance (``exact_laplace`` of
    ``scripts/taylor_start_diagnostics.py``) and that covariance's Cholesky factor."""

    def __init__(self, model: pm.Model) -> None:
        self.target = ws.prepare_warm_start(model)
        self.template = self.target.point
        self.start = np.concatenate(
            [np.ravel(self.template[v.name]) for v in self.target.value_vars]
        ).astype(np.float64)
        self._logp = model.compile_logp(jacobian=True)
        self._dlogp = model.compile_dlogp(jacobian=True)
        self._hess = model.compile_d2logp(jacobian=True, negate_output=False)
        self.mode, cov = exact_laplace(model, self.template, self.start)
        self.chol = np.linalg.cholesky(0.5 * (cov + cov.T))

    def logp(self, x: np.ndarray) -> float:
        return float(self._logp(ws.split_point(x, self.template)))

    def grad(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self._dlogp(ws.split_point(x, self.template)), dtype=np.float64)

    def hess(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self._hess(ws.split_point(x, self.template)), dtype=np.float64)


def _largest_correlation(m: np.ndarray) -> float:
    """The largest absolute off-diagonal correlation of a symmetric matrix."""
    s = np.sqrt(np.abs(np.diag(m)))
    c = np.abs(m / np.outer(s, s))
    np.fill_diagonal(c, 0.0)
    return float(c.max()) if c.size > 1 else 0.0


def metrics(exact: Exact):
    """``(score covariance, Hessian)`` largest correlations at a point, in the exact
    posterior's whitening (exact per-row gradients: reads the data)."""
    chol, target = exact.chol, exact.target

    def at(x: np.ndarray) -> tuple[float, float]:
        rows = ws.per_datapoint_gradients(target.likelihood, x, target.n) @ chol
        spread = np.cov(rows, rowvar=False)
        return _largest_correlation(spread), _largest_correlation(chol.T @ exact.hess(x) @ chol)

    return at


def exact_newton(exact: Exact, steps: int = 15) -> list[np.ndarray]:
    """Exact Newton steps on the log posterior from the model's initial point, each halved
    until the log posterior does not fall (at most 14 times): the iterates (reads the
    data)."""
    x = exact.start
    out = [x]
    for _ in range(steps):
        step = -np.linalg.solve(exact.hess(x), exact.grad(x))
        t = 1.0
        for _ in range(14):
            if exact.logp(x + t * step) >= exact.logp(x):
                break
            t *= 0.5
        x = x + t * step
        out.append(x)
    return out


def trace(
    model: pm.Model, mu: float, seed: int, steps: int | None
) -> tuple[list, object, dict[int, str]]:
    """The iterates of one warm start (the points its log prior was evaluated at), its
    result, and per iterate the released figures its step rules read there: the released
    slope along the step that led to it against the slope at that step's start (``slope``,
    with the slope's noise sd), whether that step was a guess and the share it went back to
    (``warmstart.scoring._backtrack``), and the stretch set for the next step
    (``_stretch``)."""
    seen: list[np.ndarray] = []
    notes: dict[int, list[str]] = {}
    call, backtrack, stretch = ws.LogPrior.__call__, scoring._backtrack, scoring._stretch

    def keep(self, x):
        seen.append(np.array(x, dtype=np.float64))
        return call(self, x)

    def back(ascent, step, last_slope, noise_dir, guess):
        share = backtrack(ascent, step, last_slope, noise_dir, guess)
        notes.setdefault(len(seen) - 1, []).append(
            f"slope {float(ascent @ step):.4g} of {last_slope:.4g} (noise sd "
            f"{float(np.linalg.norm(noise_dir)):.3g}){', a guess' if guess else ''}"
            + ("" if share is None else f", back to {share:.2f} of it")
        )
        return share

    def stretched(*args):
        factor = stretch(*args)
        if factor > 1.0:
            notes.setdefault(len(seen) - 1, []).append(f"next step stretched {factor:.3g}x")
        return factor

    kw = {} if steps is None else {"steps": steps}
    with (
        mock.patch.object(ws.LogPrior, "__call__", keep),
        mock.patch.object(scoring, "_backtrack", back),
        mock.patch.object(scoring, "_stretch", stretched),
    ):
        warm = ws.private_warm_start(
            model, mu=mu, ledger=_Unlimited(), noise_rng=np.random.default_rng(seed), **kw
        )
    return seen, warm, {k: "; ".join(v) for k, v in notes.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gamma", choices=ms.MODELS + unseen.MODELS + STARTS)
    parser.add_argument("--datasets", type=int, nargs="+", default=[1])
    parser.add_argument("--n", type=int, default=10000)
    parser.add_argument("--mu", type=float, nargs="+", default=[0.22, 100.0])
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=None, help="default: the package's")
    parser.add_argument("--quiet", action="store_true", help="only the warm start's line")
    parser.add_argument("--newton", action="store_true", help="exact Newton for comparison")
    parser.add_argument(
        "--damping",
        type=float,
        nargs="+",
        default=[0.0],
        help="Levenberg-Marquardt damping of the warm start's steps (warmstart.scoring.DAMPING;"
        " default 0, the package's)",
    )
    parser.add_argument(
        "--variant",
        nargs="+",
        default=["package"],
        help="warmstart.scoring constants, NAME=VALUE[,NAME=VALUE] or 'package' (default)",
    )
    args = parser.parse_args(argv)
    for spec in args.variant:
        _constants(spec)  # a bad spec fails here, before any run
    logging.getLogger("pymc").setLevel(logging.ERROR)
    found: dict[tuple[float, float, str], list[float]] = {}
    for index in args.datasets:
        for key, dists in run(args, index).items():
            found.setdefault(key, []).extend(dists)
    for (mu, damping, variant), dists in found.items():
        d = np.asarray(dists)
        print(
            f"SUMMARY {args.model} mu {mu:g} damping {damping:g} variant {variant}: "
            f"{d.size} warm starts, "
            f"distance from the mode (sd) median {np.median(d):.2f}, RMS "
            f"{np.sqrt(np.mean(d**2)):.2f}, largest {d.max():.2f}"
        )
    return 0


def _constants(spec: str) -> dict[str, float]:
    """``warmstart.scoring`` constants from ``NAME=VALUE[,NAME=VALUE]`` (``package``: none)."""
    if spec == "package":
        return {}
    out = {}
    for item in spec.split(","):
        name, _, value = item.partition("=")
        if not hasattr(scoring, name) or not value:
            raise SystemExit(f"--variant: {item!r} is not NAME=VALUE of warmstart.scoring")
        out[name] = float(value)
    return out


def run(args: argparse.Namespace, index: int) -> dict[tuple[float, float, str], list[float]]:
    """One data set's traces (``main``'s arguments): the warm starts' distances from the
    exact mode by ``(mu, damping, variant)``."""
    model = build(args.model, args.n, index)
    exact = Exact(model)
    mode, chol, grad = exact.mode, exact.chol, exact.grad
    corr = metrics(exact)

    def dist(x: np.ndarray) -> float:
        z = np.linalg.solve(chol, x - mode)
        return float(np.sqrt(np.mean(z**2)))

    top = exact.logp(mode)
    print(f"# {args.model} data set {index}, n = {args.n}: exact mode {np.round(mode, 3)}")
    if args.newton:
        path = ", ".join(f"{dist(x):.1f}" for x in exact_newton(exact))
        print(f"exact Newton with line search, dist per step (sd): {path}")
    found: dict[tuple[float, float, str], list[float]] = {}
    runs = itertools.product(args.mu, args.damping, args.variant, range(args.seeds))
    for mu, damping, variant, seed in runs:
        with mock.patch.multiple(scoring, DAMPING=damping, **_constants(variant)):
            seen, warm, notes = trace(model, mu, seed, args.steps)
        print(f"mu {mu:g} damping {damping:g} variant {variant} seed {seed}:")
        for k, x in enumerate([] if args.quiet else seen):
            spread, curvature = corr(x)
            line = (
                f"  step {k:2d} dist {dist(x):9.2f} sd, log posterior {exact.logp(x) - top:+.1f},"
                f" corr {spread:.2f}/{curvature:.2f}"
            )
            if k + 1 < len(seen):
                step = np.linalg.solve(chol, seen[k + 1] - x)  # in the posterior's whitening
                g = chol.T @ grad(x)
                cos = float(step @ g / (np.linalg.norm(step) * np.linalg.norm(g) + 1e-300))
                line += f", cos {cos:+.2f}"
            if k in notes:
                line += f"; released: {notes[k]}"
            print(line)
        g_end = float(np.linalg.norm(chol.T @ grad(warm.point)))
        found.setdefault((mu, damping, variant), []).append(dist(warm.point))
        print(
            f"  warm start: dist {dist(warm.point):.2f} sd, clips "
            f"{[round(c, 1) for c in warm.clip_history]}, |whitened gradient| {g_end:.3g}",
            flush=True,
        )
    return found


if __name__ == "__main__":
    raise SystemExit(main())
