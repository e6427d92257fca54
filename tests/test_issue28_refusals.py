"""Issue 28, items 1, 2 and 4: no free answer about the data from a refusal.

Each attack here is the red-team report's, in the same shape: a bisection over a public
shift (item 1), an ``n`` against ``n + 1`` comparison (item 2), three chunks of a column
(item 4). On e48aff3 each of these tests fails.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest

import pymc_penalty as pp
from pymc_penalty.errors import InvalidArgumentError, ScreenRefused, UnevaluableRowsWarning
from pymc_penalty.model.likelihood import clipped_ratio_sum
from pymc_penalty.model.screen import (
    FAR_ABOVE_ZERO,
    SCREEN_SHARE,
    count_noise_sd,
    flag_unevaluable,
    screen_rows,
)

SECRET = 7.3


def _table(n_other: int = 59) -> np.ndarray:
    """A secret record and records the attacker knows, all far above it."""
    others = np.random.default_rng(1).uniform(20.0, 30.0, size=n_other)
    return np.concatenate([[SECRET], others])


def _construct(y: np.ndarray, c: float) -> tuple:
    """What building the step tells the model's author for a shift ``c``: the outcome, the
    public settings of the step, and what the ledger spent."""
    with pm.Model():
        lam = pm.Exponential("lam", 1.0)
        pm.Poisson("z", lam, observed=np.round(y - c))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # Without its warm start (whose noisy released values differ run to run):
                # building the step spends only the screen's fixed share on either side.
                step = pp.PenaltyMetropolis(epsilon=1.0, delta=1e-5, warm_start=0)
        except Exception as exc:  # noqa: BLE001 (the old code refused: that is the leak)
            return ("refused", type(exc).__name__, str(exc))
    return ("built", step._n, step.mu, step.clip, step.ledger.spent_mu2, step.ledger.releases)


# --- item 1: the free bisection ------------------------------------------------------------


def test_a_shift_on_either_side_of_the_record_gives_the_same_outcome():
    """``round(y - c)`` is negative, outside the Poisson's support, exactly when the record
    is below ``c - 0.5``. The two sides must be indistinguishable and nothing refused."""
    y = _table()
    below, above = _construct(y, SECRET + 0.5 - 1e-6), _construct(y, SECRET + 0.5 + 1e-6)
    assert below[0] == "built"
    assert below == above
    # Only the screen was spent: its fixed share of the budget, one release, on both sides.
    budget_mu2 = pp.PrivacyBudget(1.0, 1e-5).mu ** 2
    assert below[-1] == 1 and below[-2] == pytest.approx(SCREEN_SHARE * budget_mu2, rel=1e-9)


@pytest.mark.slow
def test_the_bisection_learns_nothing_in_26_constructions():
    """The red team's attack: 26 constructions over ``c`` recovered the record to 1e-6. Now
    every construction gives one outcome, so the bisection ends where it started."""
    y = _table()
    lo, hi = 0.0, 20.0
    outcomes = set()
    for _ in range(26):
        c = 0.5 * (lo + hi)
        outcome = _construct(y, c + 0.5)
        outcomes.add(outcome)
        if outcome[0] == "refused":  # the record is below c: search the lower half
            hi = c
        else:
            lo = c
    assert len(outcomes) == 1 and next(iter(outcomes))[0] == "built"
    assert abs(lo - SECRET) > 1.0  # the bisection learnt nothing (it ran to the top)


def test_an_unevaluable_row_adds_zero_and_counts_as_clipped():
    """A NaN ratio (a row outside a fixed support at both points) adds 0, inside [-B, B] and
    antisymmetric in the two points, and is counted as clipped; an independent computation
    in NumPy gives the same sum and count."""
    ll = pt.dvector("ll")
    cur = pt.dvector("cur")
    bound = pt.dscalar("bound")
    fn = pytensor.function([ll, cur, bound], clipped_ratio_sum(ll, cur, bound))
    new = np.array([-1.0, -np.inf, np.nan, 0.5, 3.0])
    old = np.array([-1.2, -np.inf, 0.0, 0.0, 0.0])
    total, count = fn(new, old, 1.0)
    with np.errstate(invalid="ignore"):
        ratio = new - old
        bad = np.isnan(ratio)
        expected = np.where(bad, 0.0, np.clip(np.nan_to_num(ratio), -1.0, 1.0)).sum()
        expected_count = int(np.sum(bad | (np.abs(ratio) > 1.0)))
    assert total == pytest.approx(expected)
    assert count == expected_count == 3
    back, back_count = fn(old, new, 1.0)  # the reverse move: the opposite sum
    assert back == pytest.approx(-total) and back_count == count


class _Ledger:
    """A ledger that records what it is asked to spend (or refuses)."""

    def __init__(self, grant: bool = True) -> None:
        self.grant, self.asked = grant, []

    def try_spend(self, mu2: float) -> bool:
        self.asked.append(mu2)
        return self.grant


def _coded_12(n: int, bad: int, seed: int = 0) -> pm.Model:
    """A Bernoulli response with ``bad`` rows coded 2 (outside {0, 1}) and a clean column."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.5).astype(float)
    y[:bad] = 2.0
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 1.0)
        pm.Bernoulli("y", logit_p=b, observed=y)
        pm.Normal("w", b, 1.0, observed=rng.normal(size=n))
    return model


def test_the_screen_charges_first_and_releases_the_count_with_its_noise():
    """Against an independent computation: the count of rows coded 2, plus the noise drawn
    from the same seed with sd sqrt(k) / mu (k = 2 observed variables, one count each)."""
    model, mu = _coded_12(500, 300), 0.05
    ledger = _Ledger()
    screen = screen_rows(model, mu=mu, ledger=ledger, noise_rng=np.random.default_rng(7))
    assert ledger.asked == [pytest.approx(mu**2)]
    sd = math.sqrt(2) / mu
    assert screen.noise_sd == pytest.approx(sd) == count_noise_sd(2, mu)
    z = np.random.default_rng(7).standard_normal(2)
    # On the integers, as every noisy count (pymc_penalty.privacy.precision).
    assert screen.counts["y"] == np.rint(300 + sd * z[0])
    assert screen.counts["w"] == np.rint(0 + sd * z[1])
    assert flag_unevaluable(screen.counts, sd) == ["y"]


def test_a_refused_screen_reads_nothing():
    ledger = _Ledger(grant=False)
    with pytest.raises(ScreenRefused):
        screen_rows(_coded_12(50, 0), mu=0.1, ledger=ledger)
    assert ledger.asked == [pytest.approx(0.01)]


def test_one_bad_row_stays_in_the_noise():
    """The flag is a threshold on a DP release: one bad row moves the noisy count by one,
    far below FAR_ABOVE_ZERO noise sds, so it flags nothing (the same seed, so only the one
    row differs) while 300 bad rows are flagged."""
    mu = 0.05
    flags = []
    for bad in (0, 1, 300):
        screen = screen_rows(
            _coded_12(500, bad), mu=mu, ledger=_Ledger(), noise_rng=np.random.default_rng(3)
        )
        flags.append(flag_unevaluable(screen.counts, screen.noise_sd))
        assert FAR_ABOVE_ZERO * screen.noise_sd > 100
    assert flags == [[], [], ["y"]]


@pytest.mark.slow
def test_pp_sample_reports_a_mostly_bad_column_through_the_charged_count():
    """A response coded 1/2 for a Bernoulli: pp.sample runs (the bad rows are clipped),
    warns naming the variable (never a value), and the screen's cost is in the ledger's
    total that the report states."""
    rng = np.random.default_rng(0)
    n = 2000
    x = rng.normal(size=n)
    y = (rng.random(n) < 0.5).astype(float) + 1.0  # coded 1/2: about half the rows are 2
    with pm.Model():
        b = pm.Normal("b", 0.0, 1.0)
        pm.Bernoulli("y", logit_p=b * x, observed=y)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            idata = pp.sample(
                epsilon=1.0, delta=1e-5, draws=10, tune=10, chains=1, warm_start=0,
                progressbar=False,
            )  # fmt: skip
    flagged = [w for w in caught if issubclass(w.category, UnevaluableRowsWarning)]
    assert len(flagged) == 1 and "'y'" in str(flagged[0].message)
    budget_mu = pp.PrivacyBudget(1.0, 1e-5).mu
    # The count in the message is the released (noisy) one, as in the report.
    assert f"'y': {idata.attrs['dp_unevaluable_rows']:.0f}" in str(flagged[0].message)
    assert idata.attrs["dp_screen_mu"] == pytest.approx(0.1 * budget_mu, rel=1e-6)
    noise_sd = 1.0 / idata.attrs["dp_screen_mu"]
    assert abs(idata.attrs["dp_unevaluable_rows"] - np.sum(y == 2)) < 6 * noise_sd
    assert idata.attrs["dp_mu"] <= budget_mu * (1 + 1e-9)
    # The clean control: the same model with y in {0, 1} gives no warning.
    with pm.Model():
        b = pm.Normal("b", 0.0, 1.0)
        pm.Bernoulli("y", logit_p=b * x, observed=y - 1.0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pp.sample(
                epsilon=1.0, delta=1e-5, draws=10, tune=10, chains=1, warm_start=0,
                progressbar=False,
            )  # fmt: skip
    assert not [w for w in caught if issubclass(w.category, UnevaluableRowsWarning)]


# --- item 2: under add/remove-one, no decision depends on n ---------------------------------

Y = np.random.default_rng(0).normal(size=100)


def _simple(y: np.ndarray) -> None:
    pm.Normal("y", pm.Normal("m"), 1.0, observed=y)


def _coupled(y: np.ndarray) -> None:
    """Each row's term reads the mean of every row: refused by the probes from two rows on
    (the old code skipped them below two rows, so n = 1 and n = 2 differed)."""
    yd = pm.Data("yd", y)
    pm.Normal("y", pm.Normal("m") + yd.mean(), 1.0, observed=yd)


def _params(k: int):
    def build(y: np.ndarray) -> None:
        b = pm.Normal("b", shape=k)
        pm.Normal("y", b.sum(), 1.0, observed=y)

    return build


def _prior_mean_6(y: np.ndarray) -> None:
    """A public prior-mean vector of length 6: the old record rule (an axis of at least
    n / 2 is data) refused it at n = 11, 12 and accepted it at n = 13, 14."""
    b = pm.Normal("b", mu=np.arange(6.0), shape=6)
    pm.Normal("y", b.sum(), 1.0, observed=y)


def _add_remove_outcome(build, n: int, **kwargs) -> tuple:
    """The full outcome of building the step on n rows under add/remove-one: refused with
    its error type and message, or built with what the step publishes about itself."""
    y = np.resize(Y, n)
    with pm.Model():
        build(y)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                step = pp.PenaltyMetropolis(mu=1.0, neighbours="add_remove", **kwargs)
        except Exception as exc:  # noqa: BLE001 (the outcome is what we compare)
            return ("refused", type(exc).__name__, str(exc))
    return ("built", step.min_rows, step.mu, step.clip, len(step.vars))


@pytest.mark.parametrize(
    ("build", "min_rows", "ns", "expected"),
    [
        # the near-n rule: 42 parameters (old: n = 40 accepted, n = 41 refused)
        (_params(42), 10, (40, 41), "refused"),
        (_params(42), 50, (50, 51), "built"),
        # its boundary: lengths of min_rows - 1 and more could be n
        (_params(9), 10, (10, 11), "refused"),
        (_params(8), 10, (10, 11), "built"),
        # the record rule (old: n = 12 refused, n = 13 accepted)
        (_prior_mean_6, 12, (12, 13), "refused"),
        (_prior_mean_6, 13, (13, 14), "built"),
        # tiny n: below the public bound every table gets one refusal (old: three outcomes)
        (_simple, 3, (0, 1, 2), "refused"),
        (_coupled, 3, (0, 1, 2), "refused"),
        (_coupled, 3, (3, 4), "refused"),
        (_simple, 3, (3, 4), "built"),
        (_simple, 3, (40, 41), "built"),
    ],
    ids=[
        "near-n-42",
        "near-n-42-below-bound",
        "near-n-boundary-9",
        "near-n-boundary-8",
        "record-rule-6-at-12",
        "record-rule-6-at-13",
        "tiny-n-simple",
        "tiny-n-coupled",
        "coupled-3-4",
        "simple-3-4",
        "simple-40-41",
    ],
)
def test_under_add_remove_with_min_rows_the_outcome_is_the_same_for_n_and_n_plus_one(
    build, min_rows, ns, expected
):
    outcomes = [_add_remove_outcome(build, n, min_rows=min_rows) for n in ns]
    assert outcomes[0][0] == expected
    if expected == "refused":
        assert outcomes[0][1] == "ModelNotPrivateError", outcomes[0]
    assert all(o == outcomes[0] for o in outcomes), outcomes
    for o in outcomes:  # no message prints n
        assert not any(str(n) in str(o[2:]) for n in ns if n >= 10), o


def test_the_red_team_models_without_the_bound_get_one_refusal():
    """The red team's models without ``min_rows`` (42 parameters accepted at n = 40 and
    refused at n = 41 before): now one refusal naming ``min_rows`` at both n, so the outcome
    is the same for n and n + 1 (a must-fail control: the rule with ``min_rows = None``
    replaced by n would differ, which the test above checks with the bound)."""
    at_40 = _add_remove_outcome(_params(42), 40)
    at_41 = _add_remove_outcome(_params(42), 41)
    assert at_40[0] == "refused" and at_40[1] == "InvalidArgumentError", at_40
    assert at_40 == at_41


def test_min_rows_is_checked_before_anything():
    with pytest.raises(pp.InvalidArgumentError, match="`min_rows`"):
        _add_remove_outcome_raising(_simple, 20, min_rows=1)
    with pytest.raises(pp.InvalidArgumentError, match="`min_rows`"):
        _add_remove_outcome_raising(_simple, 20, min_rows=2.5)


def _add_remove_outcome_raising(build, n: int, **kwargs) -> None:
    with pm.Model():
        build(np.resize(Y, n))
        pp.PenaltyMetropolis(mu=1.0, neighbours="add_remove", **kwargs)


def _published(n: int, min_rows: int) -> tuple:
    """What pp.sample publishes for n rows under add/remove-one: variable names, dims,
    report keys, and dp_min_rows."""
    y = np.resize(Y, n)
    with pm.Model(coords={"k": range(3)}):
        yd = pm.Data("yd", y)
        b = pm.Normal("b", 0.0, 1.0, dims="k")
        pm.Deterministic("fitted", b.sum() + 0.0 * yd)  # reads data: never published
        pm.Deterministic("b2", 2 * b, dims="k")  # public: published at every n
        pm.Normal("y", b.sum(), 1.0, observed=yd)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata = pp.sample(
                epsilon=1.0, delta=1e-5, draws=5, tune=5, chains=1, warm_start=0,
                neighbours="add_remove", min_rows=min_rows, progressbar=False, random_seed=1,
            )  # fmt: skip
    groups = {
        g: (sorted(getattr(idata, g).data_vars), dict(getattr(idata, g).sizes))
        for g in idata.groups()
    }
    return groups, sorted(idata.attrs), idata.attrs["dp_min_rows"]


@pytest.mark.slow
def test_pp_sample_publishes_the_same_for_n_and_n_plus_one_with_min_rows():
    first, second = _published(40, 10), _published(41, 10)
    assert first == second
    assert "fitted" not in first[0]["posterior"][0] and "b2" in first[0]["posterior"][0]
    assert first[2] == 10


# --- item 4: chunked data constants ----------------------------------------------------------


def _three_chunks(container: bool) -> tuple:
    """The red team's attack: three Deterministics, each a chunk of 100 of the 300 records
    (shorter than n / 2, so the old record rule did not see them), through pp.sample."""
    y = np.random.default_rng(5).normal(size=300)
    with pm.Model():
        a = pm.Normal("a", 0.0, 1.0)
        column = pm.Data("yd", y) if container else y
        for i in range(3):
            pm.Deterministic(f"leak{i}", a * 0.0 + column[100 * i : 100 * (i + 1)])
        pm.Deterministic("twice", 2.0 * a)  # the control: public, must be published
        pm.Normal("y", a, 1.0, observed=y)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata = pp.sample(
                epsilon=1.0, delta=1e-5, draws=5, tune=5, chains=1, warm_start=0,
                progressbar=False, random_seed=2,
            )  # fmt: skip
    published = sorted(idata.posterior.data_vars)
    values = np.concatenate([np.ravel(idata[g].to_array().values) for g in idata.groups()])
    leaked = int(np.isin(np.round(y, 12), np.round(values.astype(float), 12)).sum())
    return published, leaked


@pytest.mark.parametrize("container", [False, True], ids=["numpy-slices", "pm-data-slices"])
def test_three_chunks_of_the_column_are_not_published(container):
    published, leaked = _three_chunks(container)
    assert published == ["a", "twice"]
    assert leaked == 0  # no record appears anywhere in the result


def test_a_deterministic_reading_any_constant_array_is_not_published():
    """The rule cannot be fooled by slicing: any length from 2 up (and a filled array or a
    scalar is still published)."""
    from pymc_penalty.model.checks import data_dependent_deterministics

    y = np.random.default_rng(6).normal(size=300)
    with pm.Model() as model:
        a = pm.Normal("a")
        pm.Deterministic("two", a + y[:2])
        pm.Deterministic("filled", a + np.zeros(5))
        pm.Deterministic("scaled", 3.0 * a)
        pm.Normal("y", a, 1.0, observed=y)
    assert data_dependent_deterministics(model) == ["two"]


# --- item 2 by default: under add/remove-one min_rows is required, the same for every n -------


def _gate_refusal(n: int, neighbours: str, min_rows: int | None) -> str | None:
    from pymc_penalty.model.checks import validate_model

    y = np.random.default_rng(n).normal(size=n)
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, 1.0)
        pm.Normal("y", m, 1.0, observed=y)
    try:
        validate_model(
            model,
            list(model.value_vars),
            add_remove=neighbours == "add_remove",
            min_rows=min_rows,
        )
    except InvalidArgumentError as exc:
        return str(exc)
    return None


def test_add_remove_without_min_rows_is_refused_with_a_text_free_of_n():
    at_40, at_41 = _gate_refusal(40, "add_remove", None), _gate_refusal(41, "add_remove", None)
    assert at_40 is not None and at_40 == at_41  # refused, and the same for n and n + 1
    assert "40" not in at_40 and "41" not in at_41 and "min_rows" in at_40
    # Controls: with a public bound, and under substitute-one (n public), accepted.
    assert _gate_refusal(41, "add_remove", 10) is None
    assert _gate_refusal(41, "substitute", None) is None


def test_add_remove_without_min_rows_spends_nothing(tmp_path):
    """pp.sample refuses before its ledger is charged: the ledger file stays empty."""
    y = np.random.default_rng(0).normal(size=200)
    with pm.Model():
        m = pm.Normal("m", 0.0, 1.0)
        pm.Normal("y", m, 1.0, observed=y)
        with pytest.raises(InvalidArgumentError, match="min_rows"):
            pp.sample(
                epsilon=1.0, delta=1e-5, neighbours="add_remove",
                ledger_path=str(tmp_path / "ledger"), progressbar=False,
            )  # fmt: skip
    ledger = tmp_path / "ledger"
    assert not ledger.exists() or pp.PrivacyLedger(1.0, str(ledger)).spent_mu2 == 0.0


# --- item 1 for the contamination mechanism: the start-value bit ------------------------------


def _contaminated(y, *, bernoulli: bool = False, container: bool = False) -> pm.Model:
    from pymc_penalty.contamination import (
        BernoulliContamination,
        StudentTContamination,
        contaminated_likelihood,
    )

    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 2.0)
        data = pm.Data("yd", y) if container else y
        if bernoulli:
            base, g = pm.Bernoulli.dist(logit_p=a), BernoulliContamination(0.5)
        else:
            base, g = pm.Normal.dist(a, 1.0), StudentTContamination(3, 1.0)
        contaminated_likelihood("y", base, g, 0.2, data)
    return model


_RECORDS = {  # (bernoulli, container, the record): what g cannot evaluate
    "nan-array": (False, False, math.nan),
    "inf-array": (False, False, math.inf),
    "inf-data": (False, True, -math.inf),
    "coded-2-array": (True, False, 2.0),
    "coded-2-data": (True, True, 2.0),
}


@pytest.mark.parametrize("case", list(_RECORDS))
def test_a_contaminated_record_that_cannot_be_evaluated_is_modelled_by_g_alone(case):
    """On fb1cadf, NaN in a NumPy array was imputed by PyMC and the variable refused as not
    observed (``ModelNotPrivateError``), and an infinite record or a response coded 2 made
    the start's log density ``-inf``, so ``sample_contaminated`` refused to start: both a free
    answer about a record. Now the record is observed at a public point of g's support by g
    alone: its term is one constant at every parameter value, the model's variables are the
    same as with a valid record, and every other term is unchanged."""
    bernoulli, container, record = _RECORDS[case]
    rng = np.random.default_rng(11)
    clean = (rng.random(30) < 0.4).astype(float) if bernoulli else rng.normal(1.0, 1.0, 30)
    dirty = clean.copy()
    dirty[3] = record
    good, bad = (
        _contaminated(clean, bernoulli=bernoulli, container=container),
        _contaminated(dirty, bernoulli=bernoulli, container=container),
    )
    assert [v.name for v in bad.free_RVs] == [v.name for v in good.free_RVs] == ["a"]
    assert [v.name for v in bad.observed_RVs] == ["y"]
    terms_bad = bad.compile_logp(vars=bad.observed_RVs, sum=False)
    terms_good = good.compile_logp(vars=good.observed_RVs, sum=False)
    at = [{"a": np.array(v)} for v in (-1.0, 0.3, 2.5)]
    rows_bad = np.array([terms_bad(p)[0] for p in at])
    rows_good = np.array([terms_good(p)[0] for p in at])
    assert np.all(np.isfinite(rows_bad))
    np.testing.assert_array_equal(rows_bad[:, 3], rows_bad[0, 3])  # a constant: moves nothing
    others = np.arange(30) != 3
    np.testing.assert_allclose(rows_bad[:, others], rows_good[:, others], rtol=1e-12)
    # Must-fail: a valid record's term does move with the parameter.
    assert np.ptp(rows_good[:, 3]) > 1e-3


@pytest.mark.slow
def test_sample_contaminated_runs_whatever_a_record_is_and_withholds_pymc_messages():
    from pymc_penalty.contamination import sample_contaminated
    from pymc_penalty.errors import LikelihoodEvaluationError

    y = np.random.default_rng(12).normal(1.0, 1.0, 40)
    outcomes = []
    for record in (0.5, math.inf, math.nan):
        dirty = y.copy()
        dirty[3] = record
        with _contaminated(dirty), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata = sample_contaminated(tune=30, thin=1, random_seed=1)
        outcomes.append((idata.groups(), idata.posterior["a"].shape))
    assert outcomes[0] == outcomes[1] == outcomes[2] == (["posterior"], (1, 1))
    # A start PyMC refuses for a public reason: its message (each term's exact log density at
    # the start, the likelihood's a function of every record) is withheld.
    with pm.Model():
        s = pm.HalfNormal("s", 1.0, initval=-1.0)
        from pymc_penalty.contamination import StudentTContamination, contaminated_likelihood

        contaminated_likelihood("y", pm.Normal.dist(0.0, s), StudentTContamination(3), 0.2, y)
        with warnings.catch_warnings(), pytest.raises(LikelihoodEvaluationError) as err:
            warnings.simplefilter("ignore")
            sample_contaminated(tune=30, thin=1)
    assert "withheld" in str(err.value) and not any(ch.isdigit() for ch in str(err.value))
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_a_zero_contamination_rate_is_refused_whatever_the_records(monkeypatch):
    """rate = 0: a record outside f's support made pm.sample fail on the data (a free bit);
    now every such model is refused before pm.sample runs, with the same message for a
    record inside and outside f's support (pm.sample is never called)."""
    from pymc_penalty.contamination import (
        BernoulliContamination,
        contaminated_likelihood,
        sample_contaminated,
    )

    calls = []
    monkeypatch.setattr(pm, "sample", lambda *a, **k: calls.append(1))
    messages = []
    for record in (1.0, 2.0):  # a Bernoulli response coded 2 is outside f's support
        y = np.array([0.0, 1.0, 1.0, 0.0, record])
        with pm.Model():
            a = pm.Normal("a", 0.0, 2.0)
            contaminated_likelihood(
                "y", pm.Bernoulli.dist(logit_p=a), BernoulliContamination(0.5), 0.0, y
            )
            with pytest.raises(InvalidArgumentError, match="rate") as err:
                sample_contaminated(tune=30, thin=1)
        messages.append(str(err.value))
    assert messages[0] == messages[1] and calls == []
    # Control: a positive rate is not refused by this rule (pm.sample is reached).
    with pm.Model():
        a = pm.Normal("a", 0.0, 2.0)
        contaminated_likelihood(
            "y", pm.Bernoulli.dist(logit_p=a), BernoulliContamination(0.5), 0.2, y
        )
        with pytest.raises(Exception):  # noqa: B017 (the stub returns None)
            sample_contaminated(tune=30, thin=1)
    assert calls == [1]


def test_an_invalid_parameter_from_a_record_is_a_nan_row_not_an_error():
    """A row whose distribution parameter is invalid at some parameter value because of its
    own record (``sigma = th - x_i`` below 0) evaluates to NaN in that row alone (clipped
    row by row), never to an exception whose occurrence would depend on the record: the
    finite-difference and probe points of the one-shot evaluate such points after the first
    charge. A valid point gives no NaN (control)."""
    from pymc_penalty.warmstart import prepare_warm_start

    rng = np.random.default_rng(0)
    x, y = rng.uniform(0.0, 1.0, 200), rng.normal(size=200)
    with pm.Model() as model:
        th = pm.Normal("th", 3.0, 1.0)
        pm.Normal("y", 0.0, th - x, observed=y)
    lik = prepare_warm_start(model).likelihood
    ok, _ = lik.initial(np.array([3.0]), 200)
    assert np.isfinite(ok).all()
    mixed, _ = lik.initial(np.array([0.5]), 200)
    bad = ~np.isfinite(mixed)
    np.testing.assert_array_equal(bad, x > 0.5)  # exactly the rows whose own sigma is < 0
