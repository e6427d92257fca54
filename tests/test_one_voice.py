"""One voice (issue 29, item 3): ``pp.sample`` and ``pp.finalize`` speak with the package's
verdict only, one threshold set is quoted everywhere, the progress line's epsilon is the
report's, and ``progressbar=False`` is quiet."""

from __future__ import annotations

import logging
import re
import warnings
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm
import pytest

import pymc_penalty as pp
from pymc_penalty.results.diagnostics import (
    CONVERGENCE_RULES,
    ESS_GOOD,
    ESS_MIN,
    ESS_NOTE,
    R_HAT_MAX,
    R_HAT_NOTE,
    convergence_verdict,
)
from pymc_penalty.results.publish import verdict_after_sampling

pytestmark = [
    pytest.mark.filterwarnings("ignore::pymc_penalty.FrozenChainWarning"),
    pytest.mark.filterwarnings("ignore::pymc_penalty.UtilityWarning"),
    pytest.mark.filterwarnings("ignore::pymc_penalty.ConvergenceWarning"),
]
DOCS = Path(__file__).resolve().parents[1] / "docs"
#: PyMC's own convergence messages (pymc.stats.convergence); with chains=2 the first is
#: always logged when PyMC's checks run, so its absence is not luck.
PYMC_MESSAGES = (
    "We recommend running at least 4 chains",
    "The rhat statistic is larger than",
    "The effective sample size per chain is smaller than",
)
PROGRESS = re.compile(r"privacy: epsilon spent (\S+) of (\S+)")


class _Records(logging.Handler):
    """Collects the messages logged to the ``pymc`` logger (PyMC's and ``pymc.penalty``'s)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _sample(**kwargs) -> tuple[az.InferenceData, list[str]]:
    """A small pp.sample run (2 chains, warm start on) and what it logged."""
    y = np.random.default_rng(5).normal(0.5, 1.0, size=500)
    logger = logging.getLogger("pymc")
    handler, level = _Records(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with pm.Model():
            m = pm.Normal("m", 0.0, 5.0)
            pm.Normal("y", m, 1.0, observed=y)
            kwargs = {"draws": 100, "tune": 50, "chains": 2, "cores": 1, "random_seed": 2, **kwargs}
            idata = pp.sample(epsilon=3.0, delta=1e-5, **kwargs)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return idata, handler.messages


@pytest.fixture(scope="module")
def shown() -> tuple[az.InferenceData, list[str]]:
    """One default run (progress bar on) and what it logged."""
    return _sample()


def test_pp_sample_shows_no_pymc_convergence_warnings(shown):
    _, messages = shown
    assert not [m for m in messages if any(p in m for p in PYMC_MESSAGES)], messages


@pytest.mark.slow
def test_control_pymc_warnings_come_back_when_asked():
    """Control: the capture sees PyMC's messages when its checks run (an explicit True is
    kept), so their absence above is a finding."""
    _, messages = _sample(compute_convergence_checks=True, progressbar=False)
    assert any(PYMC_MESSAGES[0] in m for m in messages), messages


def test_last_progress_line_shows_the_reports_epsilon(shown):
    idata, messages = shown
    lines = [PROGRESS.search(m) for m in messages]
    lines = [found for found in lines if found]
    assert len(lines) >= 10, messages
    assert idata.attrs["dp_warm_start_releases"] > 0  # spent before the chains: included
    assert lines[-1].group(1) == f"{idata.attrs['dp_epsilon']:.4g}"
    assert lines[-1].group(2) == f"{idata.attrs['dp_epsilon_budget']:.4g}"
    # The first line already counts the warm start's spending.
    first = float(lines[0].group(1))
    warm_eps = pp.accounting.composed_epsilon(idata.attrs["dp_warm_start_mu"] ** 2, 1e-5)
    assert first > warm_eps


def test_progressbar_false_is_quiet():
    idata, messages = _sample(progressbar=False)
    assert "dp_epsilon" in idata.attrs
    assert not [m for m in messages if "privacy:" in m], messages
    assert any("Sampling 2 chains" in m for m in messages)  # control: the capture works


def _idata(means: list[float], draws: int = 200, seed: int = 0) -> az.InferenceData:
    """Independent normal draws per chain around the given means."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(len(means), draws)) + np.asarray(means)[:, None]
    stats = {"dp_released": np.ones_like(x, dtype=bool)}
    return az.from_dict(posterior={"m": x}, sample_stats=stats)


def test_convergence_warning_quotes_the_reports_thresholds():
    idata = _idata([0.0, 5.0])  # two chains far apart: R-hat far above the threshold
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        verdict_after_sampling(idata)
    found = [w for w in caught if issubclass(w.category, pp.ConvergenceWarning)]
    assert len(found) == 1
    message = str(found[0].message)
    assert f"({R_HAT_NOTE})" in message and f"({ESS_NOTE})" in message
    text = str(pp.report(_with_report(idata)))
    assert f"({R_HAT_NOTE})" in text and f"({ESS_NOTE})" in text


def _with_report(idata: az.InferenceData) -> az.InferenceData:
    """The smallest attrs ``pp.report`` reads."""
    idata.attrs.update(
        dp_epsilon=1.0,
        dp_delta=1e-5,
        dp_mu=0.3,
        dp_epsilon_budget=1.0,
        dp_neighbours="substitute",
        dp_sensitivity="clip",
        dp_releases=400,
        dp_releases_per_chain=[200, 200],
        dp_accountant="GDP",
        dp_noise_private=1,
        dp_clipped_fraction=0.0,
        pymc_penalty_version="test",
    )
    idata.sample_stats["dp_mu"] = idata.sample_stats["dp_released"] * 0.01
    return idata


@pytest.mark.parametrize(
    ("means", "draws", "expected"),
    [
        ([0.0, 5.0], 200, "not converged"),  # R-hat
        ([0.0, 0.0, 0.0, 0.0], 2000, "converged"),  # iid: ESS about 8000
        ([0.0, 0.0], 100, "doubtful"),  # iid: ESS about 200, in [ESS_MIN, ESS_GOOD)
    ],
)
def test_verdict_follows_the_rules_it_quotes(means, draws, expected):
    verdict = convergence_verdict(_idata(means, draws))
    assert verdict["dp_convergence"] == expected, verdict
    rhat, ess = verdict["dp_r_hat_max"], verdict["dp_ess_bulk_min"]
    holds = {
        "converged": rhat <= R_HAT_MAX and ess >= ESS_GOOD,
        "doubtful": rhat <= R_HAT_MAX and ESS_MIN <= ess < ESS_GOOD,
        "not converged": rhat > R_HAT_MAX or ess < ESS_MIN,
    }
    assert holds[expected] and sum(holds.values()) == 1


def test_docs_table_is_the_code_rules():
    """docs/convergence.md's table says what CONVERGENCE_RULES says (it said R-hat > 1.1)."""
    text = (DOCS / "convergence.md").read_text()
    rows = dict(re.findall(r"^\| (converged|doubtful|not converged) \| (.+?) \|$", text, re.M))
    assert set(rows) == set(CONVERGENCE_RULES)
    for verdict, rule in CONVERGENCE_RULES.items():
        assert rows[verdict].startswith(rule), (verdict, rows[verdict], rule)
