"""Bad input is refused before anything is spent, by one validation module (issue 17, item 1).

Each row of the table is a bad argument (or bad data) passed to a public entry point. It must
raise the stated error, name the argument (or the variable), quote no data value (a planted
covariate value, the Bernoulli value 123, or n under add/remove-one), and leave a persistent
ledger byte-for-byte as it was. A control row with good arguments must change the ledger, or
the ledger check proves nothing.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pymc as pm
import pytest

import pymc_penalty as pp
from pymc_penalty import PenaltyMetropolis, PrivacyBudget, PrivacyLedger, RunPlan
from pymc_penalty.accounting import calibrate_step_mu, gdp_delta, plan_releases
from pymc_penalty.errors import InvalidArgumentError, InvalidDataError, ModelNotPrivateError
from pymc_penalty.model.screen import SCREEN_SHARE
from pymc_penalty.warmstart import private_warm_start

pytestmark = [
    pytest.mark.filterwarnings("ignore::pymc_penalty.FrozenChainWarning"),
    pytest.mark.filterwarnings("ignore::pymc_penalty.UtilityWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

EPS, DELTA = 1.0, 1e-5
N = 137  # printed nowhere: under add/remove-one n is private
MARKER = 31.4159265  # a planted covariate value that no message may quote
QUIET = dict(progressbar=False, compute_convergence_checks=False, cores=1)


def _data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N, 2))
    X[7, 0] = MARKER
    y = rng.binomial(1, 0.4, size=N)
    return X, y


def _logistic(X: np.ndarray | None = None, y: np.ndarray | None = None, data: bool = False):
    X0, y0 = _data()
    X = X0 if X is None else X
    y = y0 if y is None else y
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 2.0, shape=2)
        xs = pm.Data("X", X) if data else X
        pm.Bernoulli("y", logit_p=pm.math.dot(xs, beta), observed=y)
    return model


def _bernoulli_123():
    X, y = _data()
    y = y.copy()
    y[3] = 123
    return _logistic(y=y)


def _nan_covariate():
    X, y = _data()
    X = X.copy()
    X[11, 1] = np.nan
    return _logistic(X=X)


def _inf_in_pm_data():
    model = _logistic(data=True)
    X, _ = _data()
    X = X.copy()
    X[5, 0] = np.inf
    with model:
        pm.set_data({"X": X})  # set_data does not check values
    return model


def _negative_poisson():
    rng = np.random.default_rng(1)
    counts = rng.poisson(3.0, size=N)
    counts[2] = -4
    with pm.Model() as model:
        rate = pm.LogNormal("rate", 0.0, 1.0)
        pm.Poisson("k", rate, observed=counts)
    return model


def _inf_normal_response():
    rng = np.random.default_rng(2)
    y = rng.normal(size=N)
    y[9] = np.inf
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, 1.0)
        pm.Normal("z", m, 1.0, observed=y)
    return model


# ---- entry points: each takes (model, ledger path) and the bad keyword arguments -----------


def _sample(model, path, **bad):
    kwargs = dict(epsilon=EPS, delta=DELTA, draws=5, tune=5, chains=1, ledger_path=path)
    kwargs.update(QUIET)
    kwargs.update(bad)
    return pp.sample(model=model, **kwargs)


def _step(model, path, **bad):
    kwargs = dict(epsilon=EPS, delta=DELTA, plan=RunPlan(5, 5, 1), ledger=PrivacyLedger.open(path))
    kwargs.update(bad)
    with model:
        return PenaltyMetropolis(**kwargs)


def _cold_step(model, path, **kwargs):
    """A budgeted step without its warm start (which spends when the step is built)."""
    return _step(model, path, warm_start=0, **kwargs)


def _warm(model, path, **bad):
    kwargs = dict(mu=0.1, ledger=PrivacyLedger.open(path), clip=1.0, steps=2)
    kwargs.update(bad)
    return private_warm_start(model, **kwargs)


def _bernoulli_p(y: np.ndarray | None = None):
    _, y0 = _data()
    with pm.Model() as model:
        p = pm.Beta("p", 1.0, 1.0)
        pm.Bernoulli("y", p=p, observed=y0 if y is None else y)
    return model


def _bernoulli_p_123():
    _, y = _data()
    y = y.copy()
    y[0] = 123
    return _bernoulli_p(y)


def _expfam(model, path, **bad):
    from pymc_penalty.variants import ExpFamPenaltyMetropolis

    kwargs = dict(mu=0.1, ledger=PrivacyLedger.open(path))
    kwargs.update(bad)
    with model:
        return ExpFamPenaltyMetropolis(**kwargs)


def _calibrate(model, path, **bad):
    kwargs = dict(available_mu=0.5, plan=RunPlan(5, 5, 1))
    kwargs.update(bad)
    return pp.calibrate(kwargs.pop("available_mu"), kwargs.pop("plan"), **kwargs)


def _calibrate_step_mu(model, path, **bad):
    kwargs = dict(epsilon=EPS, delta=DELTA, n_releases=10)
    kwargs.update(bad)
    return calibrate_step_mu(**kwargs)


def _gdp_epsilon(model, path, **bad):
    kwargs = dict(mu=0.5, delta=DELTA)
    kwargs.update(bad)
    return pp.gdp_epsilon(**kwargs)


def _gdp_mu(model, path, **bad):
    kwargs = dict(epsilon=EPS, delta=DELTA)
    kwargs.update(bad)
    return pp.gdp_mu(**kwargs)


def _gdp_delta(model, path, **bad):
    kwargs = dict(epsilon=EPS, mu=0.5)
    kwargs.update(bad)
    return gdp_delta(**kwargs)


def _plan_releases(model, path, **bad):
    kwargs = dict(draws=5, tune=5, chains=1)
    kwargs.update(bad)
    return plan_releases(**kwargs)


def _forecast(model, path, **bad):
    kwargs = dict(epsilon=EPS, delta=DELTA, n=1000, d=2)
    kwargs.update(bad)
    return pp.forecast_utility(**kwargs)


def _contaminated(model, path, **bad):
    return pp.sample_contaminated(model=model, **bad)


def _budget(model, path, **bad):
    kwargs = dict(epsilon=EPS, delta=DELTA)
    kwargs.update(bad)
    return PrivacyBudget(**kwargs)


def _run_plan(model, path, **bad):
    kwargs = dict(draws=5, tune=5, chains=1)
    kwargs.update(bad)
    return RunPlan(**kwargs)


Case = tuple[str, Callable[..., Any], Callable[[], Any], dict[str, Any], type, str]
ARG = InvalidArgumentError

CASES: list[Case] = [
    # pp.sample: types
    ("sample-eps-str", _sample, _logistic, dict(epsilon="1"), ARG, "epsilon"),
    ("sample-eps-bool", _sample, _logistic, dict(epsilon=True), ARG, "epsilon"),
    ("sample-eps-nan", _sample, _logistic, dict(epsilon=math.nan), ARG, "epsilon"),
    ("sample-eps-inf", _sample, _logistic, dict(epsilon=math.inf), ARG, "epsilon"),
    ("sample-eps-0", _sample, _logistic, dict(epsilon=0.0), ARG, "epsilon"),
    ("sample-eps-neg", _sample, _logistic, dict(epsilon=-1.0), ARG, "epsilon"),
    ("sample-delta-0", _sample, _logistic, dict(delta=0.0), ARG, "delta"),
    ("sample-delta-1", _sample, _logistic, dict(delta=1.0), ARG, "delta"),
    ("sample-delta-str", _sample, _logistic, dict(delta="1e-5"), ARG, "delta"),
    ("sample-draws-0", _sample, _logistic, dict(draws=0), ARG, "draws"),
    ("sample-draws-float", _sample, _logistic, dict(draws=5.0), ARG, "draws"),
    ("sample-tune-neg", _sample, _logistic, dict(tune=-1), ARG, "tune"),
    ("sample-chains-2.5", _sample, _logistic, dict(chains=2.5), ARG, "chains"),
    ("sample-chains-0", _sample, _logistic, dict(chains=0), ARG, "chains"),
    ("sample-chains-bool", _sample, _logistic, dict(chains=True), ARG, "chains"),
    ("sample-chains-str", _sample, _logistic, dict(chains="eight"), ARG, "chains"),
    ("sample-tune-str", _sample, _logistic, dict(tune="fast"), ARG, "tune"),
    ("sample-clip-none", _sample, _logistic, dict(clip=None), ARG, "clip"),
    ("sample-clip-neg", _sample, _logistic, dict(clip=-1.0), ARG, "clip"),
    ("sample-clip-inf", _sample, _logistic, dict(clip=math.inf), ARG, "clip"),
    ("sample-clip-str", _sample, _logistic, dict(clip="big"), ARG, "clip"),
    ("sample-share-1", _sample, _logistic, dict(clip_count_share=1.0), ARG, "clip_count_share"),
    ("sample-share-neg", _sample, _logistic, dict(clip_count_share=-0.1), ARG, "clip_count_share"),
    ("sample-neighbours", _sample, _logistic, dict(neighbours="swap"), ARG, "neighbours"),
    ("sample-clip-mode", _sample, _logistic, dict(clip_mode="l1"), ARG, "clip_mode"),
    ("sample-warm-1", _sample, _logistic, dict(warm_start=1.0), ARG, "warm_start"),
    ("sample-warm-clip", _sample, _logistic, dict(warm_start_clip=0.0), ARG, "warm_start_clip"),
    ("sample-warm-steps", _sample, _logistic, dict(warm_start_steps=0), ARG, "warm_start_steps"),
    ("sample-cores-0", _sample, _logistic, dict(cores=0), ARG, "cores"),
    ("sample-seed-float", _sample, _logistic, dict(random_seed=1.5), ARG, "random_seed"),
    ("sample-seed-negative", _sample, _logistic, dict(random_seed=-1), ARG, "random_seed"),
    ("sample-keep-data", _sample, _logistic, dict(keep_data="no"), ARG, "keep_data"),
    ("sample-ledger-path", _sample, _logistic, dict(ledger_path=3), ARG, "ledger_path"),
    ("sample-step-kwargs", _sample, _logistic, dict(step_kwargs=[1]), ARG, "step_kwargs"),
    # The default warm start spends before the step is built: its arguments are checked first.
    (
        "sample-step-scaling",
        _sample,
        _logistic,
        dict(step_kwargs={"scaling": -1.0}),
        ARG,
        "scaling",
    ),
    ("sample-step-unknown", _sample, _logistic, dict(step_kwargs={"bogus": 1}), ARG, "bogus"),
    ("sample-step-sets-clip", _sample, _logistic, dict(step_kwargs={"clip": 2.0}), ARG, "clip"),
    (
        "sample-step-clip-tail",
        _sample,
        _logistic,
        dict(step_kwargs={"clip_tail": 0.5}),
        ARG,
        "clip_tail",
    ),
    (
        "sample-step-adapt",
        _sample,
        _logistic,
        dict(step_kwargs={"adapt": "no"}),
        ValueError,
        "adapt",
    ),
    # pp.sample: data
    # PenaltyMetropolis
    ("step-eps-str", _step, _logistic, dict(epsilon="1"), ARG, "epsilon"),
    ("step-delta-2", _step, _logistic, dict(delta=2.0), ARG, "delta"),
    ("step-plan-draws-0", _step, _logistic, dict(plan=RunPlan(0, 5, 1)), ARG, "draws"),
    ("step-plan-tuple", _step, _logistic, dict(plan=(5, 5, 1)), ARG, "plan"),
    ("step-clip-zero", _step, _logistic, dict(clip=0.0), ARG, "clip"),
    ("step-released-rows", _step, _logistic, dict(released_rows=-5.0), ARG, "released_rows"),
    ("step-clip-tail", _step, _logistic, dict(clip_tail=0.5), ARG, "clip_tail"),
    ("step-share", _step, _logistic, dict(clip_count_share=2.0), ARG, "clip_count_share"),
    ("step-target-accept", _step, _logistic, dict(target_accept=1.5), ARG, "target_accept"),
    ("step-tune-interval", _step, _logistic, dict(tune_interval=0.5), ARG, "tune_interval"),
    # ExpFamPenaltyMetropolis
    ("expfam-mu-str", _expfam, _bernoulli_p, dict(mu="0.1"), ARG, "mu"),
    ("expfam-target-accept", _expfam, _bernoulli_p, dict(target_accept=0.0), ARG, "target_accept"),
    # private_warm_start
    ("warm-mu-0", _warm, _logistic, dict(mu=0.0), ARG, "mu"),
    ("warm-clip-str", _warm, _logistic, dict(clip="1"), ARG, "clip"),
    ("warm-steps-float", _warm, _logistic, dict(steps=2.5), ARG, "steps"),
    ("warm-neighbours", _warm, _logistic, dict(neighbours="all"), ARG, "neighbours"),
    ("warm-ledger-none", _warm, _logistic, dict(ledger=None), ARG, "ledger"),
    # calibration and accounting
    ("calibrate-mu-0", _calibrate, _logistic, dict(available_mu=0.0), ARG, "available_mu"),
    ("calibrate-clip", _calibrate, _logistic, dict(clip=-2.0), ARG, "clip"),
    ("calibrate-share", _calibrate, _logistic, dict(clip_count_share=1.0), ARG, "clip_count_share"),
    ("calibrate-plan", _calibrate, _logistic, dict(plan=(1, 1, 1)), ARG, "plan"),
    ("calibrate-step-mu-n", _calibrate_step_mu, _logistic, dict(n_releases=2.5), ARG, "n_releases"),
    ("calibrate-step-mu-eps", _calibrate_step_mu, _logistic, dict(epsilon="2"), ARG, "epsilon"),
    ("gdp-epsilon-delta", _gdp_epsilon, _logistic, dict(delta=1.5), ARG, "delta"),
    ("gdp-epsilon-mu", _gdp_epsilon, _logistic, dict(mu=-1.0), ARG, "mu"),
    ("gdp-epsilon-mu-str", _gdp_epsilon, _logistic, dict(mu="0.5"), ARG, "mu"),
    ("gdp-mu-eps-bool", _gdp_mu, _logistic, dict(epsilon=False), ARG, "epsilon"),
    ("gdp-delta-mu-nan", _gdp_delta, _logistic, dict(mu=math.nan), ARG, "mu"),
    ("plan-releases-chains", _plan_releases, _logistic, dict(chains=1.5), ARG, "chains"),
    ("budget-eps-str", _budget, _logistic, dict(epsilon="1"), ARG, "epsilon"),
    ("run-plan-tune-float", _run_plan, _logistic, dict(tune=2.5), ARG, "tune"),
    # forecast_utility
    ("forecast-n-0", _forecast, _logistic, dict(n=0), ARG, "n"),
    ("forecast-d-float", _forecast, _logistic, dict(d=1.5), ARG, "d"),
    ("forecast-draws-0", _forecast, _logistic, dict(draws=0), ARG, "draws"),
    ("forecast-neighbours", _forecast, _logistic, dict(neighbours="x"), ValueError, "neighbours"),
    # sample_contaminated
    ("contaminated-draws-0", _contaminated, _logistic, dict(draws=0), ARG, "draws"),
    ("contaminated-thin", _contaminated, _logistic, dict(thin=1.5), ARG, "thin"),
    ("contaminated-tune", _contaminated, _logistic, dict(tune=-3), ARG, "tune"),
    (
        "contaminated-statistic",
        _contaminated,
        _logistic,
        dict(statistic="median"),
        ARG,
        "statistic",
    ),
    # a model the gate refuses (NaN in an observed Normal is imputed: exact data in the trace)
    ("sample-nan-response", _sample, None, {}, ModelNotPrivateError, "z"),
]


def _nan_normal_response():
    rng = np.random.default_rng(3)
    y = rng.normal(size=N)
    y[4] = np.nan
    with pm.Model() as model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = pm.Normal("m", 0.0, 1.0)
        pm.Normal("z", m, 1.0, observed=y)
    return model


CASES[-1] = CASES[-1][:2] + (_nan_normal_response,) + CASES[-1][3:]


@pytest.fixture
def ledger_file(tmp_path: Path) -> Path:
    """A persistent ledger that has already spent part of its budget."""
    path = tmp_path / "ledger.bin"
    ledger = PrivacyLedger(PrivacyBudget(EPS, DELTA).mu, path)
    assert ledger.try_spend(0.01)
    ledger.release_unused()
    return path


def _state(path: Path) -> tuple[bytes, float, int]:
    ledger = PrivacyLedger.open(path)
    return path.read_bytes(), ledger.spent_mu2, ledger.releases


def test_the_table_is_large_enough():
    assert len(CASES) >= 40
    assert len({case[0] for case in CASES}) == len(CASES)


@pytest.mark.parametrize(
    ("call", "make_model", "bad", "error", "argument"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
@pytest.mark.slow
def test_bad_input_is_refused_before_anything_is_spent(
    ledger_file, call, make_model, bad, error, argument
):
    model = make_model()
    before = _state(ledger_file)
    with pytest.raises(error) as err:
        call(model, ledger_file, **bad)
    message = str(err.value)
    assert re.search(rf"`{re.escape(argument)}`|'{re.escape(argument)}'", message), message
    for value in ("31.41", "123", str(N)):  # planted data values, and n
        assert value not in message, (value, message)
    assert _state(ledger_file) == before


def test_control_good_arguments_do_spend(ledger_file):
    """The ledger check can fail: the same call with good arguments changes the file."""
    before = _state(ledger_file)
    _sample(_logistic(), ledger_file)
    after = _state(ledger_file)
    assert after[1] > before[1] and after[2] > before[2]


def test_old_value_error_handlers_still_catch_argument_errors():
    with pytest.raises(ValueError):
        pp.gdp_mu(epsilon="1", delta=DELTA)
    with pytest.raises(TypeError):
        pp.gdp_mu(epsilon="1", delta=DELTA)


def test_clip_auto_is_accepted_by_the_validator():
    from pymc_penalty.validation import check_clip

    assert check_clip("auto") == "auto"
    with pytest.raises(InvalidArgumentError, match="`clip`"):
        check_clip("auto", allow_auto=False)


# Rows the likelihood cannot evaluate (NaN, inf, a value outside a fixed support): before
# issue 28 each was refused with InvalidDataError, a free answer about the data. Now every
# entry point accepts them (the rows are clipped); building a step spends what it spends on
# any rows: a budgeted step its screen (one release of a fixed share), the others nothing.
UNEVALUABLE = [
    ("step-bernoulli-123", _cold_step, _bernoulli_123),
    ("step-nan-covariate", _cold_step, _nan_covariate),
    ("step-inf-pm-data", _cold_step, _inf_in_pm_data),
    ("step-negative-count", _cold_step, _negative_poisson),
    ("step-inf-response", _cold_step, _inf_normal_response),
    (
        "step-add-remove-123",
        lambda m, p: _cold_step(m, p, neighbours="add_remove", min_rows=100),  # public, < N
        _bernoulli_123,
    ),
    ("expfam-bernoulli-123", _expfam, _bernoulli_p_123),
]


@pytest.mark.parametrize(
    ("call", "make_model"),
    [case[1:] for case in UNEVALUABLE],
    ids=[case[0] for case in UNEVALUABLE],
)
def test_rows_that_cannot_be_evaluated_are_not_refused(ledger_file, call, make_model):
    before = _state(ledger_file)
    left = PrivacyLedger.open(ledger_file)
    available = left.budget_mu**2 - left.spent_mu2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = call(make_model(), ledger_file)
    assert step is not None
    after = _state(ledger_file)
    if getattr(step, "budget", None) is None:  # no budget, no screen: nothing spent
        assert after == before
    else:  # the screen: one release of its share of what was left, whatever the rows
        assert after[2] == before[2] + 1
        assert after[1] - before[1] == pytest.approx(SCREEN_SHARE * available, rel=1e-6)


def test_the_warm_start_accepts_rows_that_cannot_be_evaluated(ledger_file):
    before = _state(ledger_file)
    warm = _warm(_bernoulli_123(), ledger_file)
    assert np.all(np.isfinite(warm.point))
    assert _state(ledger_file)[1] > before[1]  # it spent, as on clean data


def test_a_refusal_cannot_be_steered_by_the_model_to_probe_records():
    """A support set by the model's own constants (``Uniform(-100, t)``) is not checked
    against the data: otherwise building the step (which spends nothing) would tell, exactly
    and for free, whether the largest record exceeds a threshold ``t`` of the author's choice,
    and a bisection would recover it. Both sides of the record must behave the same."""
    y = np.random.default_rng(0).normal(5.0, 1.0, size=200)
    outcomes = []
    for t in (y.max() - 1e-3, y.max() + 1e-3):
        with pm.Model():
            m = pm.Normal("m", 0.0, 1.0)
            pm.Uniform("y", -100.0, t + 0.0 * m, observed=y)
            try:
                pp.PenaltyMetropolis(epsilon=1.0, delta=1e-5)
                outcomes.append("built")
            except InvalidDataError:
                outcomes.append("refused")
    assert outcomes == ["built", "built"]
