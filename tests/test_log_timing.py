"""Red-team issue 28, item 6: under add/remove-one nothing printed or logged depends on n.

At main e48aff3 ``pp.sample`` let PyMC log ``Sampling ... took N seconds.`` (0 s at n = 2,000,
4 s at n = 400,000) and show its progress bar's draws per second and elapsed and remaining
times: n, private under add/remove-one, was readable from a log. The test runs the same call
at n = 2,000 and n = 1,000,000 and compares everything logged by PyMC and this package, and
everything written to stdout and stderr. Nothing needs normalising: the only numbers left
(epsilon spent after so many releases, counts of draws) come from the public plan.
"""

from __future__ import annotations

import logging

import numpy as np
import pymc as pm
import pytest

import pymc_penalty as pp
from pymc_penalty.privacy.output import HideTiming, hidden_timing, progressbar_allowed


def _run(n: int, caplog, capfd) -> tuple[list[tuple[str, str]], str, object]:
    y = np.random.default_rng(0).normal(1.0, 1.0, n)
    caplog.clear()
    capfd.readouterr()
    # The pymc logger's own level too: an earlier test (the demo) may have raised it.
    with (
        pm.Model(),
        caplog.at_level(logging.DEBUG, logger="pymc"),
        pytest.warns(pp.ConvergenceWarning),
    ):
        pm.Normal("y", pm.Normal("mu", 0.0, 10.0), 1.0, observed=y)
        idata = pp.sample(
            epsilon=1.0, delta=1e-5, neighbours="add_remove", min_rows=1000, warm_start=0,
            draws=100, tune=100, chains=1, progressbar=True, random_seed=1,
        )  # fmt: skip
    logs = [(r.name, r.getMessage()) for r in caplog.records if r.name.startswith("pymc")]
    out, err = capfd.readouterr()
    return logs, out + err, idata


@pytest.mark.slow
def test_logs_and_output_are_the_same_for_n_and_a_much_larger_n(caplog, capfd):
    small_logs, small_out, _ = _run(2_000, caplog, capfd)
    large_logs, large_out, idata = _run(1_000_000, caplog, capfd)
    assert any("Sampling 1 chain" in m for _, m in small_logs)  # PyMC's line is still there
    assert small_logs == large_logs
    assert small_out == large_out
    for text in [m for _, m in large_logs] + [large_out]:
        assert "second" not in text and "draws/s" not in text and "Elapsed" not in text
    # Nor in what is published: PyMC's sampling_time attribute is stripped (n is private).
    for group in idata.groups():
        assert "sampling_time" not in idata[group].attrs


def test_hide_timing_removes_the_duration_only():
    record = logging.LogRecord(
        "pymc.sampling.mcmc", logging.INFO, __file__, 1,
        "Sampling %d chains for 1_000 tune and 1_000 draw iterations (4_000 + 4_000 draws "
        "total) took %.0f seconds.", (4, 37.0), None,
    )  # fmt: skip
    assert HideTiming().filter(record)
    assert record.getMessage() == (
        "Sampling 4 chains for 1_000 tune and 1_000 draw iterations (4_000 + 4_000 draws total)."
    )
    other = logging.LogRecord("pymc", logging.INFO, __file__, 1, "took part in %s", ("x",), None)
    assert HideTiming().filter(other) and other.getMessage() == "took part in x"


def test_hidden_timing_filters_pymcs_logger_only_inside_the_block(caplog):
    log = logging.getLogger("pymc.sampling.mcmc")
    with caplog.at_level(logging.INFO, logger="pymc"):
        with hidden_timing():
            log.info("Sampling 1 chain took 3 seconds.")
        log.info("Sampling 1 chain took 3 seconds.")
    messages = [r.getMessage() for r in caplog.records if r.name == "pymc.sampling.mcmc"]
    assert messages == ["Sampling 1 chain.", "Sampling 1 chain took 3 seconds."]


def test_the_progress_bar_is_shown_only_where_n_is_public():
    assert progressbar_allowed("substitute")
    assert not progressbar_allowed("add_remove")
    with pytest.raises(ValueError):
        progressbar_allowed("swap")
