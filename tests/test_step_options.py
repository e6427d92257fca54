"""The step's settings in groups (issue 30 item 3): ClipPolicy, ProposalPolicy, PrivacyPolicy.

The old keywords keep working for one release: each warns once (FutureWarning, naming its new
home) and maps to its field, and a seeded run gives the same draws with either form. A bad
group field is refused before anything is spent, and the package's own calls never warn.
"""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest

import pymc_penalty as pp
from pymc_penalty import ClipPolicy, InvalidArgumentError, PrivacyPolicy, ProposalPolicy
from pymc_penalty.sampling.options import MOVED, group_step_options
from pymc_penalty.sampling.step import PenaltyMetropolis as LowLevelStep

QUIET = dict(progressbar=False, compute_convergence_checks=False, cores=1)
SEEDED = PrivacyPolicy(reproducible_noise=True)

#: A valid value for each old keyword, different from its field's default.
OLD_VALUES = {
    "clip_mode": "metric",
    "clip_count_share": 0.1,
    "clip_tail": 1.5,
    "adapt": "diag",
    "adapt_window": 37,
    "tune_interval": 37,
    "target_accept": 0.3,
    "max_step": 2.0,
    "neighbours": "add_remove",
    "min_rows": 10,
    "released_rows": 150.0,
    "reproducible_noise": True,
}


def _model(n: int = 200):
    y = 0.5 + np.random.default_rng(1).normal(size=n)
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, 5.0)
        s = pm.HalfNormal("s", 2.0)
        pm.Normal("y", m, s, observed=y)
    return model


def _future(caught) -> list[warnings.WarningMessage]:
    return [w for w in caught if issubclass(w.category, FutureWarning)]


def test_the_table_covers_every_old_keyword():
    assert set(OLD_VALUES) == set(MOVED)
    groups = {"clip": ClipPolicy, "proposal": ProposalPolicy, "privacy": PrivacyPolicy}
    for group, field in MOVED.values():
        assert field in groups[group].__dataclass_fields__


@pytest.mark.parametrize("old", sorted(MOVED))
def test_each_old_keyword_warns_once_and_maps_to_its_field(old):
    group, field = MOVED[old]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grouped = group_step_options({old: OLD_VALUES[old], "S": None})
    (warning,) = _future(caught)
    assert warning.filename == __file__  # the caller's line, not the package's
    cls = type(grouped[group]).__name__
    assert f"`{old}`" in str(warning.message) and f"{group}=pymc_penalty.{cls}(" in str(
        warning.message
    )
    assert getattr(grouped[group], field) == OLD_VALUES[old]
    assert set(grouped) == {group, "S"}
    # Grouping is idempotent: the package's inner calls never warn again.
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        assert group_step_options(grouped) == grouped


#: Old keywords that make a valid step only with another of their group's: under
#: add/remove-one ``min_rows`` is required (given as its old keyword too, so each warns once).
COMPANIONS = {"neighbours": "min_rows"}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_each_old_keyword_warns_once_through_the_step_and_sets_the_same_step(old):
    group, field = MOVED[old]
    olds = [old, *([COMPANIONS[old]] if old in COMPANIONS else [])]
    assert all(MOVED[o][0] == group for o in olds)
    base = dict(noise_sd=1.0, clip="auto") if group == "clip" else dict(noise_sd=1.0)
    cls = {"clip": ClipPolicy, "proposal": ProposalPolicy, "privacy": PrivacyPolicy}[group]
    new = {group: cls(**{MOVED[o][1]: OLD_VALUES[o] for o in olds})}
    with _model(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with_old = pp.PenaltyMetropolis(**base, **{o: OLD_VALUES[o] for o in olds})
        # Once per old keyword, through pp.PenaltyMetropolis and its bases.
        warned = _future(caught)
        with_new = pp.PenaltyMetropolis(**{**base, **new})
    assert len(_future(caught)) == len(olds)
    assert sorted(str(w.message).split("`")[1] for w in warned) == sorted(olds)
    assert all(w.filename == __file__ for w in warned)
    for name in ("clip", "clip_mode", "clip_count_share", "neighbours", "min_rows"):
        assert getattr(with_old, name) == getattr(with_new, name), name
    for name in ("mode", "window", "target_accept", "kind", "max_step"):
        assert getattr(with_old.adapter, name) == getattr(with_new.adapter, name), name
    assert with_old.reproducible_noise == with_new.reproducible_noise
    assert with_old.clip_adapter == with_new.clip_adapter


def test_shorthands_and_defaults():
    assert group_step_options({"clip": 2.0})["clip"] == ClipPolicy(2.0)
    assert group_step_options({"clip": None})["clip"] == ClipPolicy(None)
    assert group_step_options({"proposal": "guided"})["proposal"] == ProposalPolicy("guided")
    assert group_step_options({"proposal": None, "privacy": None}) == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        with _model():
            low = LowLevelStep(noise_sd=1.0)
            ledger = pp.PrivacyLedger(pp.PrivacyBudget(2.0, 1e-5).mu)
            budgeted = pp.PenaltyMetropolis(epsilon=2.0, delta=1e-5, ledger=ledger, warm_start=0)
    assert (low.clip, low.clip_mode.value, low.clip_count_share) == (1.0, "distance", 0.05)
    assert budgeted.clip_auto and budgeted.clip_mode.value == "metric"
    assert low.adapter.mode == "full" and low.adapter.window == 100


BAD_GROUPS = [
    (lambda: dict(clip=ClipPolicy(mode="l1")), "ClipPolicy.mode"),
    (lambda: dict(clip=ClipPolicy(count_share=1.0)), "ClipPolicy.count_share"),
    (lambda: dict(clip=ClipPolicy(tail=0.5)), "ClipPolicy.tail"),
    (lambda: dict(clip=ClipPolicy("big")), "clip"),
    (lambda: dict(clip=ClipPolicy(None)), "clip"),  # a budget needs a finite clip
    (lambda: dict(clip=ClipPolicy("auto", count_share=0.0)), "ClipPolicy.count_share"),
    (lambda: dict(clip=ClipPolicy("auto", mode="lipschitz")), "ClipPolicy.mode"),
    (lambda: dict(proposal=ProposalPolicy(kind="jump")), "ProposalPolicy.kind"),
    (lambda: dict(proposal=ProposalPolicy(adapt="some")), "ProposalPolicy.adapt"),
    (lambda: dict(proposal=ProposalPolicy(adapt_window=0)), "ProposalPolicy.adapt_window"),
    (lambda: dict(proposal=ProposalPolicy(target_accept=1.0)), "ProposalPolicy.target_accept"),
    (lambda: dict(proposal=ProposalPolicy(max_step=-1.0)), "ProposalPolicy.max_step"),
    (lambda: dict(proposal=7), "proposal"),
    (lambda: dict(privacy=PrivacyPolicy(neighbours="swap")), "PrivacyPolicy.neighbours"),
    (lambda: dict(privacy=PrivacyPolicy(min_rows=1)), "PrivacyPolicy.min_rows"),
    (lambda: dict(privacy=PrivacyPolicy(released_rows=0.0)), "PrivacyPolicy.released_rows"),
    (lambda: dict(privacy=PrivacyPolicy(reproducible_noise="yes")), "reproducible_noise"),
    (lambda: dict(privacy="add_remove"), "privacy"),
    (lambda: dict(clip=ClipPolicy(2.0), clip_mode="metric"), "clip_mode"),
    (lambda: dict(bogus=1), "bogus"),
]


@pytest.mark.parametrize(("make", "name"), BAD_GROUPS)
def test_a_bad_group_field_is_refused_before_anything_is_spent(make, name):
    ledger = pp.PrivacyLedger(pp.PrivacyBudget(2.0, 1e-5).mu)
    with _model(), pytest.raises(InvalidArgumentError) as err:  # noqa: PT012
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            kwargs = make()  # a group refuses a bad field when it is made
        pp.PenaltyMetropolis(epsilon=2.0, delta=1e-5, ledger=ledger, **kwargs)
    assert f"`{name}`" in str(err.value) or f"{name}" in str(err.value), str(err.value)
    assert ledger.spent_mu2 == 0.0 and ledger.releases == 0


def test_pp_sample_refuses_groups_that_set_its_own_arguments():
    model = _model()
    for step_kwargs, name in [
        ({"privacy": PrivacyPolicy(neighbours="add_remove")}, "neighbours"),
        ({"clip": ClipPolicy(mode="distance")}, "clip_mode"),
        ({"clip": 2.0}, "clip"),
    ]:
        with pytest.raises(InvalidArgumentError, match=f"`{name}`"):
            pp.sample(epsilon=1.0, delta=1e-5, model=model, step_kwargs=step_kwargs, **QUIET)


# --- the same draws with either form -----------------------------------------------------


def _draws(idata) -> dict[str, np.ndarray]:
    out = {f"posterior/{k}": v.values for k, v in idata.posterior.data_vars.items()}
    out["accept"] = idata.sample_stats["accept"].values
    return out


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def _run_step(make_step, seed: int = 11):
    with _model() as model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = make_step()
        idata = pm.sample(40, tune=40, chains=2, step=step, random_seed=seed, **QUIET)
    assert model is not None
    return _draws(idata)


STEP_FORMS = {
    "low-level": (
        lambda: LowLevelStep(
            noise_sd=2.0,
            clip=0.5,
            clip_mode="metric",
            adapt="diag",
            adapt_window=15,
            target_accept=0.3,
            reproducible_noise=True,
            rng=5,
        ),
        lambda: LowLevelStep(
            noise_sd=2.0,
            clip=ClipPolicy(0.5, mode="metric"),
            proposal=ProposalPolicy(adapt="diag", adapt_window=15, target_accept=0.3),
            privacy=SEEDED,
            rng=5,
        ),
    ),
    "low-level-auto-component": (
        lambda: LowLevelStep(
            mu=0.5,
            clip="auto",
            clip_count_share=0.1,
            proposal="component",
            max_step=1.0,
            tune_interval=20,
            reproducible_noise=True,
            rng=6,
        ),
        lambda: LowLevelStep(
            mu=0.5,
            clip=ClipPolicy("auto", count_share=0.1),
            proposal=ProposalPolicy("component", max_step=1.0, adapt_window=20),
            privacy=SEEDED,
            rng=6,
        ),
    ),
    "budgeted-taylor-add-remove": (
        lambda: pp.PenaltyMetropolis(
            epsilon=4.0,
            delta=1e-5,
            plan=pp.RunPlan(40, 40, 2),
            neighbours="add_remove",
            min_rows=20,
            reproducible_noise=True,
            rng=7,
        ),
        lambda: pp.PenaltyMetropolis(
            epsilon=4.0,
            delta=1e-5,
            plan=pp.RunPlan(40, 40, 2),
            privacy=PrivacyPolicy("add_remove", min_rows=20, reproducible_noise=True),
            rng=7,
        ),
    ),
    "budgeted-penalty": (
        lambda: pp.PenaltyMetropolis(
            epsilon=4.0,
            delta=1e-5,
            plan=pp.RunPlan(40, 40, 2),
            method="penalty",
            clip_mode="distance",
            clip_count_share=0.1,
            adapt="full",
            reproducible_noise=True,
            rng=8,
        ),
        lambda: pp.PenaltyMetropolis(
            epsilon=4.0,
            delta=1e-5,
            plan=pp.RunPlan(40, 40, 2),
            method="penalty",
            clip=ClipPolicy(mode="distance", count_share=0.1),
            proposal=ProposalPolicy(adapt="full"),
            privacy=SEEDED,
            rng=8,
        ),
    ),
}


@pytest.mark.parametrize(
    "form",
    [
        pytest.param(form, marks=pytest.mark.slow) if form == "budgeted-penalty" else form
        for form in sorted(STEP_FORMS)
    ],
)
def test_a_seeded_run_gives_the_same_draws_with_old_keywords_and_groups(form):
    old, new = STEP_FORMS[form]
    _same(_run_step(old), _run_step(new))


@pytest.mark.parametrize("method", ["taylor", pytest.param("penalty", marks=pytest.mark.slow)])
def test_pp_sample_gives_the_same_draws_with_old_step_kwargs_and_groups(method):
    def run(step_kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata = pp.sample(
                epsilon=4.0,
                delta=1e-5,
                draws=40,
                tune=40,
                chains=2,
                neighbours="add_remove",
                min_rows=20,  # public, below the model's 200 rows
                method=method,
                model=_model(),
                random_seed=3,
                step_kwargs=step_kwargs,
                **QUIET,
            )
        return _draws(idata)

    old = {"reproducible_noise": True, "target_accept": 0.3, "adapt": "diag", "clip_tail": 1.2}
    new = {
        "privacy": SEEDED,
        "proposal": ProposalPolicy(target_accept=0.3, adapt="diag"),
        "clip": ClipPolicy(tail=1.2),
    }
    _same(run(old), run(new))


def test_the_packages_own_calls_never_warn_future():
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("ignore", pp.UnpublishedResultWarning)
        with _model():
            step = pp.PenaltyMetropolis(epsilon=2.0, delta=1e-5, plan=pp.RunPlan(20, 20, 1))
        assert step.taylor is not None  # the default path: screen, warm start, one-shot
        pp.sample(
            epsilon=2.0,
            delta=1e-5,
            draws=20,
            tune=20,
            chains=1,
            model=_model(),
            step_kwargs={"privacy": SEEDED, "proposal": ProposalPolicy(target_accept=0.3)},
            **QUIET,
        )
