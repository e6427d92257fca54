"""The JAX backend (``pp.sample(..., backend="jax")``): same posterior, same privacy.

Statistical checks compare with the default path within Monte Carlo error (the noise is OS
entropy, so tolerances come from MCSE), with a control on shifted data that the same check
must reject. Privacy checks: each block is committed to the ledger before its noise exists
(a crash inside a block never spends uncounted budget; a ledger that does not count must
fail the check), the noise is the step's OS-entropy generator unless reproducibility is asked
for, and the result is stripped and reported as the default path's is.
"""

from __future__ import annotations

import math
import sys
import warnings

import arviz as az
import numpy as np
import pymc as pm
import pytest

pytest.importorskip("jax", reason="the JAX backend needs the jax extra: pip install '.[jax]'")

from conftest import _mcse  # noqa: E402

import pymc_penalty as pp  # noqa: E402
from pymc_penalty import ModelNotPrivateError, PrivacyLedger  # noqa: E402
from pymc_penalty.accounting.sensitivity import ClipMode, Neighbours  # noqa: E402
from pymc_penalty.backends.jax.driver import run_device_draws  # noqa: E402
from pymc_penalty.backends.jax.kernel import DeviceChain, model_function  # noqa: E402
from pymc_penalty.validation import InvalidArgumentError  # noqa: E402

N = 2000
Y = np.random.default_rng(20261125).normal(1.0, 1.0, N)
RUN = dict(epsilon=20.0, delta=1e-5, draws=2000, tune=1000, chains=2, progressbar=False)


def _normal_mean(y: np.ndarray) -> pm.Model:
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("y", mu, 1.0, observed=y)
    return model


def _sample(y: np.ndarray, backend: str, **kwargs) -> az.InferenceData:
    with _normal_mean(y), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pp.sample(**{**RUN, **kwargs}, backend=backend, method="penalty")


def _agree(a: az.InferenceData, b: az.InferenceData, z: float = 4.0) -> bool:
    """The posterior mean and variance of ``mu`` agree within ``z`` combined Monte Carlo
    standard errors (the variance as the mean of squared deviations from the pooled mean)."""
    xa, xb = a.posterior["mu"].values, b.posterior["mu"].values
    centre = 0.5 * (xa.mean() + xb.mean())
    for fa, fb in ((xa, xb), ((xa - centre) ** 2, (xb - centre) ** 2)):
        if abs(fa.mean() - fb.mean()) > z * math.hypot(_mcse(fa), _mcse(fb)):
            return False
    return True


@pytest.fixture(scope="module")
def runs() -> dict[str, az.InferenceData]:
    return {
        "jax": _sample(Y, "jax", random_seed=1),
        "pymc": _sample(Y, "pymc", random_seed=2, cores=1),
        "shifted": _sample(Y + 0.15, "pymc", random_seed=3, cores=1),
    }


@pytest.mark.slow
def test_posterior_matches_the_default_path_on_a_conjugate_model(runs):
    assert _agree(runs["jax"], runs["pymc"])
    # Control: the same check rejects a posterior on data shifted by about 7 posterior sds.
    assert not _agree(runs["jax"], runs["shifted"])


@pytest.mark.slow
def test_same_statistics_report_and_stripping_as_the_default_path(runs):
    jax_run, default = runs["jax"], runs["pymc"]
    assert set(jax_run.sample_stats.data_vars) == set(default.sample_stats.data_vars)
    assert set(jax_run.attrs) == set(default.attrs)
    assert (
        "observed_data" not in jax_run.groups() and "observed_data" in default.attrs["dp_removed"]
    )
    assert jax_run.attrs["dp_removed"] == default.attrs["dp_removed"]
    expected = (RUN["draws"] + RUN["tune"]) * RUN["chains"]
    assert jax_run.attrs["dp_releases"] == default.attrs["dp_releases"] == expected
    assert jax_run.attrs["dp_epsilon"] <= RUN["epsilon"]
    assert jax_run.attrs["dp_noise_private"] == 1
    assert bool(jax_run.sample_stats["dp_released"].all())
    # The frozen proposal and clip: one value per chain after tuning.
    for name in ("dp_clip", "scaling"):
        values = jax_run.sample_stats[name]
        assert (values.max("draw") == values.min("draw")).all()


# --- the block driver: commit, then noise, then the device ------------------------------------


class _RecordingNoise:
    """Noise generator that records what the ledger had committed when each block was drawn."""

    def __init__(self, ledger) -> None:
        self.ledger, self.gen, self.log = ledger, np.random.default_rng(), []

    def standard_normal(self, shape):
        self.log.append((shape[0], self.ledger.spent_mu2))
        return self.gen.standard_normal(shape)


class _NotCounting:
    """A broken ledger that grants without recording anything."""

    spent_mu2 = 0.0

    def try_spend(self, mu2: float) -> bool:
        return True


class _Crash(RuntimeError):
    pass


def _device(step_mu: float):
    model = _normal_mean(Y[:200])
    chain = DeviceChain(
        model_function(model, model.value_vars),
        clip_mode=ClipMode.METRIC,
        neighbours=Neighbours.SUBSTITUTE,
        step_mu=step_mu,
        clip_count_share=0.05,
    )
    return chain, (np.eye(1) * 0.05, 1.0, 0.5)


def _drive(chain, proposal, ledger, noise, step_mu: float, draws: int):
    """Run ``draws`` device steps from 1.0 in blocks of 20."""
    return run_device_draws(
        chain,
        np.array([1.0]),
        draws,
        proposal=proposal,
        ledger=ledger,
        step_mu=step_mu,
        noise=noise,
        rng=np.random.default_rng(0),
        block=20,
    )


def _run_crashing(ledger, step_mu: float, crash_on_block: int = 3):
    chain, proposal = _device(step_mu)
    noise = _RecordingNoise(ledger)
    blocks = []
    real_run = chain.run

    def run(carry, z, log_u, eps):
        blocks.append(len(z))
        if len(blocks) == crash_on_block:
            raise _Crash
        return real_run(carry, z, log_u, eps)

    chain.run = run
    with pytest.raises(_Crash):
        _drive(chain, proposal, ledger, noise, step_mu, 95)
    return noise.log, blocks


def _check_paid_before_noise(log, spent_mu2: float, step_mu: float) -> None:
    """Every block's noise was drawn after its releases were committed; after the crash the
    ledger holds at least every release whose noise reached the device."""
    cost, drawn = step_mu**2, 0
    for rows, committed in log:
        drawn += rows
        assert committed >= drawn * cost * (1 - 1e-12)
    assert spent_mu2 >= drawn * cost * (1 - 1e-12)


def test_each_block_is_committed_before_its_noise_exists_and_a_crash_overspends_nothing():
    step_mu = 0.02
    ledger = PrivacyLedger(1.0)
    log, blocks = _run_crashing(ledger, step_mu)
    assert blocks == [20, 20, 20] and [rows for rows, _ in log] == [20, 20, 20]
    _check_paid_before_noise(log, ledger.spent_mu2, step_mu)
    # Control: a ledger that does not count fails the same check.
    log, _ = _run_crashing(_NotCounting(), step_mu)
    with pytest.raises(AssertionError):
        _check_paid_before_noise(log, 0.0, step_mu)


def test_refused_releases_leave_the_chain_in_place_and_draw_no_noise():
    step_mu = 0.1
    ledger = PrivacyLedger(math.sqrt(25.5) * step_mu)  # room for 25 releases
    chain, proposal = _device(step_mu)
    noise = _RecordingNoise(ledger)
    out, _ = _drive(chain, proposal, ledger, noise, step_mu, 60)
    assert out["dp_released"].sum() == 25 and not out["dp_released"][25:].any()
    assert [rows for rows, _ in noise.log] == [20, 5]
    assert (out["x"][25:] == out["x"][24]).all() and ledger.releases == 25


@pytest.mark.parametrize("variadic", [False, True])
def test_one_device_step_matches_the_default_paths_compiled_likelihood(variadic, monkeypatch):
    """Clip bound, clipped sum, clipped count and penalty test against PenaltyLikelihood (the
    default path's compiled function), with outliers clipped on both sides; with two
    reductions and with the one variadic reduction used for many rows."""
    from pymc_penalty.backends.jax import kernel as jax_kernel
    from pymc_penalty.model.likelihood import PenaltyLikelihood

    if variadic:
        monkeypatch.setattr(jax_kernel, "VARIADIC_REDUCE_ROWS", 0)

    y = np.concatenate([Y[:300], [40.0, -40.0, 25.0]])
    model = _normal_mean(y)
    sigma_target, clip, step_mu, share = 3.0, 0.05, None, 0.05
    chol, z = np.eye(1) * 0.02, np.array([[1.3]])
    bound = clip * float(np.abs(z[0, 0]))  # metric: ||L^-1 (x1 - x0)|| = |z| at scaling 1
    mu_ll = 2 * bound / sigma_target
    step_mu = mu_ll / math.sqrt(1 - share)
    chain = DeviceChain(
        model_function(model, model.value_vars),
        clip_mode=ClipMode.METRIC,
        neighbours=Neighbours.SUBSTITUTE,
        step_mu=step_mu,
        clip_count_share=share,
    )
    x0 = np.array([0.9])
    carry = chain.start(x0, chol, 1.0, clip)
    _, (xs, x1, accepted, prob, sd, sens, count) = chain.run(
        carry, z, np.array([-np.inf]), np.zeros((1, 2))
    )
    lik = PenaltyLikelihood(model, model.value_vars, model.initial_point())
    ll0, lp0 = lik.initial(x0, y.size)
    _, clipped_sum, n_clipped, lp1 = lik.evaluate(x1[0], ll0, bound)
    assert x1[0, 0] == pytest.approx(0.9 + 0.02 * 1.3, rel=1e-15)
    assert sens[0] == pytest.approx(2 * bound, rel=1e-12)
    assert sd[0] == pytest.approx(sigma_target, rel=1e-12)
    assert count[0] == n_clipped >= 3
    expected = clipped_sum + lp1 - lp0 - 0.5 * sigma_target**2
    assert expected < 0 and math.log(prob[0]) == pytest.approx(expected, rel=1e-10)
    assert accepted[0] and (xs == x1).all()  # log u = -inf: accepted


# --- the noise source -----------------------------------------------------------------------


@pytest.mark.slow
def test_noise_is_os_entropy_unless_reproducibility_is_asked_for():
    short = dict(draws=50, tune=0, chains=1, random_seed=7)

    def counts(**kwargs):
        idata = _sample(Y[:200], "jax", **short, **kwargs)
        return idata.sample_stats["dp_clipped_count"].values

    # Same seed: same proposals and uniforms. Seeded noise repeats (the control); private
    # noise does not.
    seeded = {"step_kwargs": {"reproducible_noise": True}}
    np.testing.assert_array_equal(counts(**seeded), counts(**seeded))
    assert not np.array_equal(counts(), counts())


# --- arguments and the gate, before anything is spent -----------------------------------------


def _refused_before_spending(tmp_path, error, match, **kwargs):
    path = tmp_path / "ledger"
    with _normal_mean(Y[:50]), pytest.raises(error, match=match):
        pp.sample(epsilon=1.0, delta=1e-5, draws=10, tune=10, ledger_path=path, **kwargs)
    assert not path.exists()


def test_unknown_backend_is_refused(tmp_path):
    _refused_before_spending(tmp_path, InvalidArgumentError, "`backend`", backend="numba")


def test_missing_jax_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "jax", None)  # import jax raises ImportError
    _refused_before_spending(tmp_path, InvalidArgumentError, r"pymc-penalty\[jax\]", backend="jax")


def test_unsupported_arguments_are_refused(tmp_path):
    _refused_before_spending(
        tmp_path, InvalidArgumentError, "nuts_sampler", backend="jax", nuts_sampler="x"
    )
    _refused_before_spending(
        tmp_path,
        InvalidArgumentError,
        "block",
        backend="jax",
        step_kwargs={"proposal": "component"},
    )


def test_the_gate_is_the_default_paths():
    x = np.random.default_rng(1).normal(size=N)
    with pm.Model():
        xd = pm.Data("xd", x)
        b = pm.Normal("b", 0, 1)
        pm.Normal("y", b * (xd - xd.mean()), 1.0, observed=Y)
        with pytest.raises(ModelNotPrivateError, match="moves other datapoints"):
            pp.sample(epsilon=1.0, delta=1e-5, draws=10, tune=10, backend="jax")


def test_a_model_jax_cannot_run_is_refused_before_warm_start_and_tuning_spend(tmp_path):
    # A Python-only Op has no JAX conversion. The default path runs it, so before the check
    # the warm start and the tuning on the default path spent their budget and the device
    # conversion then failed; now nothing is spent (no ledger file is even written).
    import pytensor.tensor as pt
    from pytensor.compile.ops import as_op

    @as_op(itypes=[pt.dvector], otypes=[pt.dvector])  # deprecated name; still what 5.28 has
    def py_square(v):
        return v**2

    path = tmp_path / "ledger"
    with pm.Model():
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.CustomDist("y", mu, logp=lambda v, m: -0.5 * py_square(v - m), observed=Y[:50])
        with pytest.raises(InvalidArgumentError, match="cannot convert this model to JAX"):
            pp.sample(
                epsilon=1.0,
                delta=1e-5,
                draws=10,
                tune=10,
                warm_start=0.2,
                ledger_path=path,
                backend="jax",
            )
        assert not path.exists()
        # Control: the same model and arguments on the default path are accepted.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata = pp.sample(
                epsilon=1.0,
                delta=1e-5,
                draws=10,
                tune=10,
                ledger_path=path,
                chains=1,
                progressbar=False,
            )
    assert idata.attrs["dp_releases"] == 20


def test_a_row_the_likelihood_cannot_evaluate_adds_zero_on_the_device_too():
    """Issue 28: an infinite record is not refused; its ratio (``-inf - -inf``) adds 0 and is
    counted as clipped, on the device as in PenaltyLikelihood. Independent check: the same
    step on the table without those rows has the same log acceptance ratio, two fewer
    clipped rows."""
    clean = Y[:300]
    x0, chol, z, clip, share, sigma = (
        np.array([0.9]),
        np.eye(1) * 0.02,
        np.array([[1.3]]),
        0.05,
        0.05,
        3.0,
    )
    step_mu = 2 * clip * 1.3 / sigma / math.sqrt(1 - share)
    out = []
    for y in (clean, np.concatenate([clean, [np.inf, -np.inf]])):
        model = _normal_mean(y)
        chain = DeviceChain(
            model_function(model, model.value_vars),
            clip_mode=ClipMode.METRIC,
            neighbours=Neighbours.SUBSTITUTE,
            step_mu=step_mu,
            clip_count_share=share,
        )
        carry = chain.start(x0, chol, 1.0, clip)
        _, (_, _, _, prob, _, _, count) = chain.run(carry, z, np.array([-np.inf]), np.zeros((1, 2)))
        out.append((math.log(prob[0]), float(count[0])))
    (log_clean, count_clean), (log_bad, count_bad) = out
    assert log_bad == pytest.approx(log_clean, rel=1e-12)
    assert count_bad == count_clean + 2
