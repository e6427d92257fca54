"""The privacy invariants of DESIGN.md section 4, each with a check that can fail.

Where it makes sense a test also runs a negative control: the same check applied to a
configuration that breaks the invariant (no ledger, the raw ``pm.sample`` result, a raw
PyTensor error) must fail, so the check is known to have power.
"""

from __future__ import annotations

import logging
import math
import traceback
import warnings

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from conftest import leaked_strings
from pymc.step_methods.compound import Competence

import pymc_penalty
from pymc_penalty import (
    ModelNotPrivateError,
    PenaltyMetropolis,
    PrivacyBudget,
    PrivacyCallback,
    PrivacyLedger,
    attach_report,
    build_report,
)
from pymc_penalty.model.likelihood import PenaltyLikelihood

QUIET = dict(progressbar=False, compute_convergence_checks=False)
pytestmark = pytest.mark.filterwarnings("ignore::pymc_penalty.FrozenChainWarning")
STEP_STATS = {
    "accept",
    "accepted",
    "scaling",
    "dp_noise_sd",
    "dp_sensitivity",
    "dp_mu",
    "dp_clipped_fraction",
    "dp_clipped_count",
    "dp_released",
    "dp_clip",  # clip="auto": a function of the released noisy counts (and public n)
    "proposal",  # data-independent: the current state plus a move from the step's generator
}
DATA_GROUPS = {"observed_data", "constant_data", "log_likelihood", "predictions_constant_data"}


# --------------------------------------------------------------------------------------------
# models and helpers
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def normal_data():
    return np.random.default_rng(0).normal(1.0, 1.0, size=40)


@pytest.fixture(scope="module")
def normal_model(normal_data):
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, 5.0)
        pm.Normal("y", m, 1.0, observed=normal_data)
    return model


@pytest.fixture(scope="module")
def logistic():
    """Logistic regression with a ``pm.Data`` covariate, a raw-NumPy covariate copy and
    Deterministics that do and do not depend on data."""
    rng = np.random.default_rng(1)
    n = 60
    X = rng.normal(size=(n, 2))
    y = (rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-X @ np.array([1.0, -1.0])))).astype(int)
    with pm.Model() as model:
        Xd = pm.Data("X", X)
        beta = pm.Normal("beta", 0.0, 2.0, shape=2)
        pm.Deterministic("eta", Xd @ beta)  # data (pm.Data)
        pm.Deterministic("eta_raw", pt.as_tensor_variable(X.copy()) @ beta)  # data (raw array)
        pm.Deterministic("b2", beta * 2.0)  # data-free
        pm.Bernoulli("y", logit_p=Xd @ beta, observed=y)
    return model, X


class StubLedger:
    """Grants the first ``allow`` requests, refuses the rest, and logs every decision."""

    def __init__(self, allow: int, events: list[str]) -> None:
        self.allow = allow
        self.granted = 0
        self.events = events

    def try_spend(self, mu2: float) -> bool:
        ok = self.granted < self.allow
        self.granted += ok
        self.events.append("grant" if ok else "refuse")
        return ok


def find_leaks(idata, data_values: np.ndarray, leaky_names=("eta", "eta_raw", "X")) -> list[str]:
    """Everything in ``idata`` that is data or an exact function of it."""
    found = []
    exact = {"lp", "model_logp", "logp", "log_likelihood", "energy"}
    for group in idata.groups():
        if group in DATA_GROUPS:
            found.append(group)
        ds = getattr(idata, group)
        for name in list(ds.data_vars) + list(ds.coords):
            if name in leaky_names or name in exact:
                found.append(f"{group}/{name}")
            values = np.asarray(ds[name].values)
            if values.dtype.kind == "f" and np.isin(values, data_values).any():
                found.append(f"{group}/{name} holds data values")
    if "sample_stats" in idata.groups():
        extra = set(idata.sample_stats.data_vars) - STEP_STATS
        found += [f"sample_stats/{name}" for name in sorted(extra)]
    return found


# --------------------------------------------------------------------------------------------
# Invariant 1: every data access is a noisy release committed before use; no overspend
# --------------------------------------------------------------------------------------------


def test_refused_release_never_touches_the_data(normal_model, monkeypatch):
    events: list[str] = []
    with normal_model:
        step = PenaltyMetropolis(mu=0.5, ledger=StubLedger(0, events))

    def boom(*args, **kwargs):
        raise AssertionError("the likelihood was evaluated after a refused release")

    monkeypatch.setattr(step._lik, "evaluate", boom)
    monkeypatch.setattr(step._lik, "_fn", boom)
    start = normal_model.initial_point()["m"]
    with normal_model:
        idata = pm.sample(
            draws=10,
            tune=10,
            chains=1,
            cores=1,
            step=step,
            random_seed=1,
            discard_tuned_samples=False,
            **QUIET,
        )
    released = np.concatenate(
        [idata.warmup_sample_stats["dp_released"].values, idata.sample_stats["dp_released"].values],
        axis=1,
    )
    assert released.size == 20 and not released.any()
    assert events == ["refuse"] * 20
    np.testing.assert_array_equal(idata.posterior["m"].values, start)
    assert np.all(idata.sample_stats["dp_mu"].values == 0.0)


@pytest.mark.parametrize("allow", [0, 1, 7, None])
def test_k_grants_give_exactly_k_likelihood_releases(normal_model, allow):
    """``allow=None`` is the control: without a ledger every step evaluates the data."""
    events: list[str] = []
    with normal_model:
        ledger = None if allow is None else StubLedger(allow, events)
        step = PenaltyMetropolis(mu=0.5, clip=2.0, clip_mode="constant", ledger=ledger)
    fn = step._lik._fn
    release_bounds: list[float] = []

    def spy(x, bound):
        events.append("eval")
        if np.isfinite(bound):  # a release (the cache refresh uses an infinite bound)
            release_bounds.append(float(bound))
        return fn(x, bound)

    step._lik._fn = spy
    with normal_model:
        idata = pm.sample(
            draws=10,
            tune=5,
            chains=1,
            cores=1,
            step=step,
            random_seed=2,
            discard_tuned_samples=False,
            **QUIET,
        )
    n_released = int(idata.warmup_sample_stats["dp_released"].sum()) + int(
        idata.sample_stats["dp_released"].sum()
    )
    if allow is None:
        assert n_released == len(release_bounds) == 15
        return
    assert n_released == len(release_bounds) == allow
    # Every compiled evaluation happens after a grant and before the next ledger decision.
    last = None
    for event in events:
        if event == "eval":
            assert last == "grant", events
        else:
            last = event
    assert events.count("eval") <= 2 * allow


def _run_over_budget(model, *, cores, mp_ctx=None, ledger=True, share=0.6):
    """Low-level run whose ledger covers only ``share`` of the planned releases."""
    chains, tune, draws = 2, 30, 30
    planned = chains * (tune + draws)
    budget = PrivacyBudget(1.0, 1e-5)
    step_mu = budget.mu / math.sqrt(share * planned)
    led = PrivacyLedger(budget.mu) if ledger else None
    with model:
        step = PenaltyMetropolis(mu=step_mu, ledger=led)
    cb = PrivacyCallback(budget, led)
    kwargs = {} if mp_ctx is None else {"mp_ctx": mp_ctx}
    with model:
        idata = pm.sample(
            draws=draws,
            tune=tune,
            chains=chains,
            cores=cores,
            step=step,
            callback=cb,
            random_seed=3,
            **kwargs,
            **QUIET,
        )
    return idata, budget, led, cb, step, planned, step_mu


@pytest.mark.parametrize(
    ("cores", "mp_ctx"),
    [
        (1, None),
        (2, None),
        pytest.param(2, "spawn", marks=pytest.mark.slow),
        pytest.param(2, "forkserver", marks=pytest.mark.slow),
    ],
)
def test_no_chain_or_process_spends_past_the_budget(normal_model, cores, mp_ctx):
    idata, budget, ledger, cb, step, planned, step_mu = _run_over_budget(
        normal_model, cores=cores, mp_ctx=mp_ctx
    )
    ledger.release_unused()
    snap = ledger.snapshot()
    assert snap["spent_mu2"] <= budget.mu**2 * (1 + 1e-12)
    assert snap["remaining_mu2"] >= 0.0
    affordable = math.floor(budget.mu**2 / step_mu**2 * (1 + 1e-12))
    # (A worker that PyMC terminates may not report its grant count: the file can only
    # under-count releases, never their spent mu^2.)
    assert snap["releases"] <= affordable < planned
    assert 0 < cb.releases <= affordable
    assert cb.mu2 <= snap["spent_mu2"] * (1 + 1e-12)
    cb.check_against_ledger()

    report = build_report(
        step=step,
        budget=budget,
        spent_mu2=snap["spent_mu2"],
        releases_by_chain=dict(cb.releases_by_chain),
        clipped_fraction=float("nan"),
    )
    attach_report(idata, report, model=normal_model)
    assert idata.attrs["dp_epsilon"] <= budget.epsilon * (1 + 1e-9)
    kept = idata.posterior.sizes["chain"] * idata.posterior.sizes["draw"]
    assert kept < 2 * 30 or idata.attrs["dp_trimmed_draws"] > 0
    assert bool(idata.sample_stats["dp_released"].all())  # nothing unreleased is published


def test_without_a_ledger_the_same_run_overspends(normal_model):
    """Control for the test above: its checks fail when nothing enforces the budget."""
    _, budget, _, cb, _, planned, step_mu = _run_over_budget(normal_model, cores=1, ledger=False)
    assert cb.releases == planned
    assert cb.mu > budget.mu * 1.2
    assert cb.epsilon > budget.epsilon


# --------------------------------------------------------------------------------------------
# Invariant 2: tuning steps, every chain and every process count
# --------------------------------------------------------------------------------------------


def _pld_epsilon(step_mu: float, count: int, delta: float) -> float:
    dpa = pytest.importorskip("dp_accounting")
    from dp_accounting.pld import PLDAccountant

    # Unit sensitivity with noise multiplier 1 / mu: each release is mu-GDP.
    pld = PLDAccountant(
        dpa.NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=1e-4
    )
    pld.compose(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(1.0 / step_mu), count))
    return pld.get_epsilon(delta)


def test_callback_composes_every_chain_and_party_through_the_accountant():
    from types import SimpleNamespace

    from scipy.stats import norm

    from pymc_penalty import BudgetExhausted

    budget = PrivacyBudget(1.0, 1e-5)
    cb = PrivacyCallback(budget)
    rng = np.random.default_rng(3)
    mus = {0: rng.uniform(0.001, 0.02, 50), 1: rng.uniform(0.001, 0.02, 30)}
    for chain, chain_mus in mus.items():
        for t, m in enumerate(chain_mus):
            stats = [{"dp_released": True, "dp_mu": m, "dp_mu_owner_0": m, "dp_mu_outsider": m / 2}]
            cb(draw=SimpleNamespace(chain=chain, tuning=t < 10, stats=stats))
    # A draw of another step method (no release) still makes its chain count, with 0 releases.
    cb(draw=SimpleNamespace(chain=2, tuning=False, stats=[{"accept": 1.0}]))
    # Independent composition and conversion (closed-form delta written with scipy).
    mu2 = math.fsum(float(m) ** 2 for ms in mus.values() for m in ms)
    assert cb.mu2 == pytest.approx(mu2, rel=1e-14)
    mu = math.sqrt(mu2)
    delta = norm.cdf(-cb.epsilon / mu + mu / 2) - math.exp(cb.epsilon) * norm.cdf(
        -cb.epsilon / mu - mu / 2
    )
    assert delta == pytest.approx(1e-5, rel=1e-6)
    assert cb.releases_by_chain == {0: 50, 1: 30, 2: 0}
    assert cb.tuning_releases == 20
    assert cb.component_mu2["dp_mu_owner_0"] == pytest.approx(mu2, rel=1e-14)
    assert cb.component_mu2["dp_mu_outsider"] == pytest.approx(mu2 / 4, rel=1e-14)
    # One chain less must read as less spent: the comparison above can fail.
    assert cb.chain_accountants[1].get_epsilon(1e-5) < cb.epsilon - 1e-3
    # A refused release stops the run and costs nothing.
    with pytest.raises(BudgetExhausted):
        cb(
            draw=SimpleNamespace(
                chain=0, tuning=False, stats=[{"dp_released": False, "dp_mu": 0.5}]
            )
        )
    assert cb.releases == 80 and cb.mu2 == pytest.approx(mu2, rel=1e-14)


@pytest.mark.parametrize("cores", [1, 2])
def test_tuning_steps_chains_and_processes_are_all_composed(normal_model, cores):
    chains, tune, draws, step_mu = 2, 7, 5, 0.06
    n = chains * (tune + draws)
    budget = PrivacyBudget(2.0, 1e-5)
    ledger = PrivacyLedger(budget.mu)
    with normal_model:
        step = PenaltyMetropolis(mu=step_mu, ledger=ledger)
    cb = PrivacyCallback(budget, ledger)
    with normal_model:
        pm.sample(
            draws=draws,
            tune=tune,
            chains=chains,
            cores=cores,
            step=step,
            callback=cb,
            random_seed=4,
            **QUIET,
        )
    ledger.release_unused()
    assert cb.releases == n
    assert dict(cb.releases_by_chain) == {c: tune + draws for c in range(chains)}
    assert cb.tuning_releases == chains * tune
    if cores == 1:
        assert ledger.releases == n
        assert ledger.spent_mu2 == pytest.approx(n * step_mu**2, rel=1e-9)
    else:  # a worker terminated by PyMC keeps its reservation counted: conservative
        assert ledger.releases <= n
        assert ledger.spent_mu2 >= n * step_mu**2 * (1 - 1e-9)
    assert cb.mu == pytest.approx(math.sqrt(n) * step_mu, rel=1e-12)

    reference = _pld_epsilon(step_mu, n, budget.delta)
    assert abs(cb.epsilon - reference) < 1e-5
    # Control: leaving out the tuning steps (or a chain) is visibly wrong.
    assert abs(cb.epsilon - _pld_epsilon(step_mu, chains * draws, budget.delta)) > 0.1
    assert abs(cb.epsilon - _pld_epsilon(step_mu, tune + draws, budget.delta)) > 0.1


def test_sample_reports_every_release_of_the_plan(normal_model):
    chains, tune, draws = 2, 15, 10
    idata = pymc_penalty.sample(
        method="penalty",
        epsilon=1.0,
        delta=1e-5,
        draws=draws,
        tune=tune,
        chains=chains,
        cores=1,
        random_seed=5,
        model=normal_model,
        **QUIET,
    )
    attrs = idata.attrs
    assert attrs["dp_releases"] == chains * (draws + tune)
    assert list(attrs["dp_releases_per_chain"]) == [draws + tune] * chains
    step_mu = float(idata.sample_stats["dp_mu"].values[0, 0])
    assert np.all(idata.sample_stats["dp_mu"].values == step_mu)
    # Every release: the chains', the default private warm start's (its own mu) and the
    # screen's of unevaluable rows (issue 28).
    chains_mu2 = chains * (draws + tune) * step_mu**2
    assert attrs["dp_warm_start_mu"] > 0 and attrs["dp_screen_mu"] > 0
    assert attrs["dp_mu"] == pytest.approx(
        math.sqrt(chains_mu2 + attrs["dp_warm_start_mu"] ** 2 + attrs["dp_screen_mu"] ** 2),
        rel=1e-9,
    )
    assert attrs["dp_mu"] <= PrivacyBudget(1.0, 1e-5).mu
    assert attrs["dp_epsilon"] == pytest.approx(1.0, abs=1e-6)
    assert attrs["dp_epsilon"] <= 1.0


# --------------------------------------------------------------------------------------------
# Invariant 3: nothing exact and data-dependent leaves the package
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_published_result_holds_no_data(logistic):
    model, X = logistic
    idata = pymc_penalty.sample(
        method="penalty",
        epsilon=2.0,
        delta=1e-5,
        draws=10,
        tune=10,
        chains=2,
        cores=1,
        random_seed=6,
        model=model,
        discard_tuned_samples=False,
        idata_kwargs={"log_likelihood": True},
        **QUIET,
    )
    assert find_leaks(idata, X) == []
    assert not DATA_GROUPS & set(idata.groups())
    assert "b2" in idata.posterior and "b2" in idata.warmup_posterior
    np.testing.assert_allclose(idata.posterior["b2"], 2.0 * idata.posterior["beta"])
    assert set(idata.sample_stats.data_vars) == STEP_STATS
    assert idata.attrs["dp_data_removed"] == 1


def test_the_leak_finder_sees_the_raw_pm_sample_result(logistic):
    """Control: the unprocessed ``pm.sample`` output of the same model leaks."""
    model, X = logistic
    with model:
        step = PenaltyMetropolis(mu=0.1)
        idata = pm.sample(
            draws=5,
            tune=5,
            chains=1,
            step=step,
            random_seed=6,
            idata_kwargs={"log_likelihood": True},
            **QUIET,
        )
    leaks = find_leaks(idata, X)
    for expected in ("observed_data", "constant_data", "log_likelihood", "posterior/eta"):
        assert expected in leaks
    assert "posterior/eta_raw" in leaks and "constant_data/X holds data values" in leaks


def test_keep_data_keeps_the_data_and_says_so(logistic):
    model, X = logistic
    idata = pymc_penalty.sample(
        method="penalty",
        epsilon=2.0,
        delta=1e-5,
        draws=5,
        tune=5,
        chains=1,
        cores=1,
        random_seed=6,
        model=model,
        keep_data=True,
        **QUIET,
    )
    assert {"observed_data", "constant_data"} <= set(idata.groups())
    assert "eta" in idata.posterior and "eta_raw" in idata.posterior
    np.testing.assert_array_equal(idata.constant_data["X"].values, X)
    assert idata.attrs["dp_data_removed"] == 0


def test_exact_log_likelihood_difference_is_not_recoverable(normal_model):
    """Same seed, same proposals (hence the same noise sd): the acceptance probabilities, a
    function of the released difference, must still differ because fresh noise is added."""

    def run():
        idata = pymc_penalty.sample(
            method="penalty",
            epsilon=5.0,
            delta=1e-5,
            draws=20,
            tune=0,
            chains=1,
            cores=1,
            random_seed=7,
            model=normal_model,
            warm_start=0,  # the default warm start's noisy mode moves every proposal a little
            step_kwargs={"reproducible_noise": False},
            **QUIET,
        )
        return idata.sample_stats

    a, b = run(), run()
    np.testing.assert_allclose(a["dp_noise_sd"].values, b["dp_noise_sd"].values, rtol=1e-9)
    assert not np.array_equal(a["accept"].values, b["accept"].values)


def test_warnings_logs_and_errors_hold_no_data_values(normal_data, caplog, monkeypatch):
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, 5.0)
        pm.Deterministic("resid", normal_data - m)  # data: named in a warning, never valued
        pm.Normal("y", m, 1.0, observed=normal_data)

    # Control: a raw PyTensor error from the same compiled likelihood prints data values.
    with model:
        step = PenaltyMetropolis(mu=0.5)
    x = np.zeros(1)
    current, _ = step._lik._cells()  # the cached current vector, one entry short
    current[0] = np.zeros(normal_data.size - 1)
    with pytest.raises(Exception) as raw:
        step._lik._fn(x, np.asarray(1.0))
    assert leaked_strings(str(raw.value), normal_data)

    # The same failure mid-run, through the package: nothing of the data in any message.
    original = PenaltyLikelihood.propose
    calls = {"n": 0}

    def failing_propose(self, x, bound):
        calls["n"] += 1
        if calls["n"] > 12:
            current, _ = self._cells()
            current[0] = current[0][:-1]  # PyTensor raises, printing its inputs
        return original(self, x, bound)

    monkeypatch.setattr(PenaltyLikelihood, "propose", failing_propose)
    caplog.set_level(logging.DEBUG)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(pymc_penalty.PrivateSamplingError) as err:
            pymc_penalty.sample(
                method="penalty",
                epsilon=1.0,
                delta=1e-5,
                draws=20,
                tune=20,
                chains=1,
                cores=1,
                random_seed=8,
                model=model,
                progressbar=False,
            )
    assert any("resid" in str(w.message) for w in caught)
    texts = [str(w.message) for w in caught]
    texts += [r.getMessage() for r in caplog.records]
    texts.append("".join(traceback.format_exception(err.value)))
    texts.append(repr(err.value.privacy_report))
    for text in texts:
        assert leaked_strings(text, normal_data) == [], text


# --------------------------------------------------------------------------------------------
# Invariant 4: privacy noise from OS entropy unless reproducibility is asked for
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_noise_is_fresh_by_default_and_reproducible_only_on_request(normal_model):
    def run(**step_kwargs):
        return pymc_penalty.sample(
            method="penalty",
            epsilon=5.0,
            delta=1e-5,
            draws=15,
            tune=15,
            chains=1,
            cores=1,
            random_seed=9,
            model=normal_model,
            step_kwargs=step_kwargs,
            **QUIET,
        )

    a, b = run(), run()
    assert a.attrs["dp_noise_private"] == 1
    assert not np.array_equal(a.sample_stats["accept"].values, b.sample_stats["accept"].values)

    c, d = run(reproducible_noise=True), run(reproducible_noise=True)
    assert c.attrs["dp_noise_private"] == 0
    assert c.attrs["dp_epsilon"] == math.inf
    np.testing.assert_array_equal(c.posterior["m"].values, d.posterior["m"].values)
    for name in STEP_STATS:
        np.testing.assert_array_equal(c.sample_stats[name].values, d.sample_stats[name].values)


# --------------------------------------------------------------------------------------------
# Invariant 5: steps the package does not control are refused
# --------------------------------------------------------------------------------------------


def test_other_step_methods_on_some_variables_are_refused():
    y = np.random.default_rng(2).normal(size=30)
    with pm.Model():
        a = pm.Normal("a", 0.0, 1.0)
        s = pm.HalfNormal("s", 1.0)
        pm.Normal("y", a, s, observed=y)
        with pytest.raises(ModelNotPrivateError, match="not assigned to PenaltyMetropolis"):
            PenaltyMetropolis(vars=[a], mu=0.5)
        with pytest.raises(ModelNotPrivateError, match="'s_log__'"):
            pm.sample(step=[PenaltyMetropolis(vars=[a], mu=0.5), pm.NUTS([s])], **QUIET)
        # The step is never chosen automatically either.
        assert PenaltyMetropolis.competence(a, True) == Competence.INCOMPATIBLE


@pytest.mark.parametrize("kwarg", ["step", "callback"])
def test_sample_refuses_step_and_callback(normal_model, kwarg, tmp_path):
    path = tmp_path / "ledger.bin"
    value = pm.Metropolis if kwarg == "step" else (lambda trace, draw: None)
    with pytest.raises(ValueError, match=f"`{kwarg}`"):
        pymc_penalty.sample(
            method="penalty",
            epsilon=1.0,
            delta=1e-5,
            model=normal_model,
            ledger_path=path,
            **{kwarg: value},
        )
    assert not path.exists() or PrivacyLedger.open(path).spent_mu2 == 0.0
