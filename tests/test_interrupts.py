"""Ctrl-C during ``pp.sample`` (issue 17, item 2): a real SIGINT sent to a subprocess's
process group, as a terminal does (the run and, with ``cores=2``, its workers).

Before the fix, ``pm.sample`` swallowed the interrupt: with ``cores=1`` the next chain started
and spent the rest of the plan, and the run returned as if nothing had happened. Now every
chain stops, the run raises :class:`~pymc_penalty.sampling.interrupts.SamplingInterrupted` saying
what
was spent (public figures only), and the ledger file is consistent.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pymc_penalty import PrivacyBudget, PrivacyLedger, RunPlan
from pymc_penalty.accounting import calibrate_step_mu, gdp_mu

EPS, DELTA = 1.0, 1e-5
PLAN = RunPlan(draws=20_000, tune=1_000, chains=2)
MARKER = "27.18281828"  # a planted covariate value: it must appear in no output

CHILD = textwrap.dedent(
    f"""
    import sys, warnings
    warnings.simplefilter("ignore")
    import numpy as np, pymc as pm, pymc_penalty as pp

    rng = np.random.default_rng(0)
    X = rng.normal(size=(500, 2))
    X[3, 0] = {MARKER}
    y = rng.binomial(1, 0.4, size=500)
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 2.0, shape=2)
        pm.Bernoulli("y", logit_p=pm.math.dot(X, beta), observed=y)
    idata = pp.sample(
        method="penalty", epsilon={EPS}, delta={DELTA}, draws={PLAN.draws}, tune={PLAN.tune},
        chains={PLAN.chains},
        cores=int(sys.argv[1]), ledger_path=sys.argv[2], progressbar=True,
        compute_convergence_checks=False, model=model,
    )
    print("RETURNED NORMALLY", idata.attrs["dp_epsilon"], flush=True)
    """
)


def _run_and_interrupt(cores: int, tmp_path: Path) -> tuple[int, str, Path]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    ledger = tmp_path / "ledger.bin"
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(
        [sys.executable, "-u", str(script), str(cores), str(ledger)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        # A background job may inherit SIGINT ignored; a user's terminal delivers it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    lines = []
    deadline = time.monotonic() + 240
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        # The callback logs every 10% of the plan (with the progress bar on, as in the
        # child): the first chain is sampling now.
        if "epsilon spent" in line:
            # Ctrl-C in a terminal signals the whole foreground process group: the run and,
            # with cores=2, PyMC's worker processes.
            os.killpg(proc.pid, signal.SIGINT)
            break
        assert time.monotonic() < deadline, "".join(lines)
    try:
        rest, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return proc.returncode, "".join(lines) + rest, ledger


@pytest.mark.parametrize("cores", [1, 2])
@pytest.mark.slow
def test_ctrl_c_stops_every_chain_and_says_what_was_spent(cores, tmp_path):
    code, output, path = _run_and_interrupt(cores, tmp_path)
    assert "RETURNED NORMALLY" not in output, output[-2000:]
    assert code != 0
    assert "SamplingInterrupted" in output, output[-2000:]
    found = re.search(
        r"Sampling interrupted after spending epsilon = ([0-9.eE+-]+) of 1 "
        r"\(delta 1e-05, (\d+) releases\)",
        output,
    )
    assert found, output[-2000:]
    eps_said, releases_said = float(found.group(1)), int(found.group(2))
    assert MARKER[:5] not in output  # no data value anywhere in the output

    # The ledger is readable and consistent: what it committed covers every release it
    # granted, at the calibrated per-step cost, and stays within the budget.
    ledger = PrivacyLedger.open(path)
    budget = PrivacyBudget(EPS, DELTA)
    step_mu2 = calibrate_step_mu(EPS, DELTA, PLAN.releases) ** 2
    assert ledger.releases >= releases_said >= 1
    assert ledger.spent_mu2 >= ledger.releases * step_mu2 * (1 - 1e-9)
    assert ledger.spent_mu2 <= budget.mu**2 * (1 + 1e-12)
    # The message's epsilon is the ledger's, to its 4 significant digits.
    assert eps_said == pytest.approx(budget.epsilon_spent(ledger.spent_mu), rel=1e-3)
    # Stopped early: the interrupt landed in the first 10-20% of the plan, and no chain went
    # on spending (before the fix, cores=1 ran the whole second chain: > 50% of the plan).
    assert ledger.releases < 0.5 * PLAN.releases
    assert eps_said < 0.8 * EPS
    assert math.sqrt(ledger.spent_mu2) < gdp_mu(EPS, DELTA)
