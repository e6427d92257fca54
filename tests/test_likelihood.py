"""The compiled likelihood: rewrites, the cached per-datapoint vectors, clipping outputs."""

from __future__ import annotations

import pickle

import numpy as np
import pymc as pm
import pytensor
import pytensor.scalar as ps
import pytensor.tensor as pt
import pytest
from pytensor.compile.mode import Mode, get_mode
from pytensor.tensor.elemwise import Elemwise

from pymc_penalty.model.likelihood import (
    PenaltyLikelihood,
    clipped_ratio_sum,
    per_datapoint_terms,
    step_mode,
)
from pymc_penalty.model.rewrites import (
    BRANCHLESS_SIGN_SWITCH,
    LIFT_UNARY_THROUGH_SWITCH,
    VECTORISED_SOFTPLUS,
    VectorisedSoftplus,
)


@pytest.fixture
def logistic():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 3))
    y = rng.binomial(1, 0.4, size=400)
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 1.0, shape=3)
        pm.Bernoulli("y", logit_p=pm.math.dot(X, beta), observed=y)
    return model, X, y


def test_switch_lift_is_exact(logistic):
    model, X, y = logistic
    term = model.logp(vars=model.observed_RVs, sum=False)[0]
    value = model.rvs_to_values[model["beta"]]
    plain = pytensor.function([value], term, mode=get_mode(None))
    lifted = pytensor.function(
        [value], term, mode=get_mode(None).including(LIFT_UNARY_THROUGH_SWITCH)
    )
    for beta in (np.zeros(3), np.array([0.5, -2.0, 30.0]), np.array([-40.0, 1e3, 0.0])):
        np.testing.assert_array_equal(plain(beta), lifted(beta))
    eta = X @ np.array([0.5, -2.0, 30.0])
    expected = np.where(y == 1, -np.logaddexp(0.0, -eta), -np.logaddexp(0.0, eta))
    np.testing.assert_allclose(lifted(np.array([0.5, -2.0, 30.0])), expected, rtol=1e-12)


def test_evaluate_returns_clipped_sum_and_count(logistic):
    model, X, y = logistic
    point = model.initial_point()
    lik = PenaltyLikelihood(model, model.value_vars, point)
    x0, x1 = np.zeros(3), np.array([0.3, -0.2, 0.1])
    ll0, prior0 = lik.initial(x0, 400)
    ll1, clipped_sum, n_clipped, prior1 = lik.evaluate(x1, ll0, 0.05)
    r = ll1 - ll0
    eta = X @ x1
    np.testing.assert_allclose(ll1, y * eta - np.logaddexp(0.0, eta), rtol=1e-12)
    assert clipped_sum == pytest.approx(np.clip(r, -0.05, 0.05).sum(), rel=1e-12)
    assert n_clipped == int((np.abs(r) > 0.05).sum()) > 0
    # The prior term carries no data: N(0, 1) on each coefficient.
    assert prior1 - prior0 == pytest.approx(-0.5 * (x1 @ x1), rel=1e-12)


# --- the fused step function: cache in the compiled function's storage -------------------


def _unfused_reference(model):
    """The step's function as it was before fusion: the current vector passed in and out.

    Built independently of ``PenaltyLikelihood``'s storage, from the same model terms, clip
    graph and compile mode, so the clipped sums and counts must agree exactly.
    """
    value = model.rvs_to_values[model["beta"]]
    ll = per_datapoint_terms(model)[0]
    ll_current = pt.dvector("ll_current")
    bound = pt.dscalar("bound")
    clipped_sum, n_clipped = clipped_ratio_sum(ll, ll_current, bound)
    return pytensor.function(
        [value, ll_current, bound], [ll, clipped_sum, n_clipped], mode=step_mode()
    )


def _walk(lik, reference, X, y, accepts, seed=3):
    """Propose and commit along ``accepts``; compare every release with the reference.

    Returns the number of steps whose fused outputs differ from the unfused reference
    evaluated against the truly current state (tracked here, in Python).
    """
    rng = np.random.default_rng(seed)
    x_cur = rng.normal(size=3)
    lik.reset(x_cur, 400)
    ll_cur = reference(x_cur, np.zeros(400), np.inf)[0]
    mismatches = 0
    for accepted in accepts:
        x_new = x_cur + 0.3 * rng.normal(size=3)
        bound = float(rng.choice([np.inf, 0.05, 0.5]))
        fused_sum, fused_count, _ = lik.propose(x_new, bound)
        ll_new, ref_sum, ref_count = reference(x_new, ll_cur, bound)
        # An independent NumPy computation of the same release.
        eta = X @ x_new
        ratio = (y * eta - np.logaddexp(0.0, eta)) - ll_cur
        assert float(ref_sum) == pytest.approx(np.clip(ratio, -bound, bound).sum(), rel=1e-10)
        assert int(ref_count) == int((np.abs(ratio) > bound).sum())
        mismatches += (fused_sum != float(ref_sum)) or (fused_count != int(ref_count))
        lik.commit(accepted)
        if accepted:
            x_cur, ll_cur = x_new, ll_new
    return mismatches


def test_fused_step_matches_the_unfused_reference_exactly(logistic):
    model, X, y = logistic
    lik = PenaltyLikelihood(model, model.value_vars, model.initial_point())
    reference = _unfused_reference(model)
    accepts = np.random.default_rng(4).random(30) < 0.5
    assert _walk(lik, reference, X, y, accepts) == 0


def test_a_stale_cache_would_be_detected(logistic, monkeypatch):
    """Rejected then accepted proposals: the cache must follow the accepted state."""
    model, X, y = logistic
    lik = PenaltyLikelihood(model, model.value_vars, model.initial_point())
    reference = _unfused_reference(model)
    accepts = [False, True, False, False, True, True, False, True]
    assert _walk(lik, reference, X, y, accepts) == 0
    # Control: a commit that drops the accepted vector leaves a stale cache; the same
    # comparison catches it at the first release after the first acceptance.
    original = PenaltyLikelihood.commit
    monkeypatch.setattr(PenaltyLikelihood, "commit", lambda self, accepted: original(self, False))
    assert _walk(lik, reference, X, y, accepts) >= 5


def test_the_cache_protocol_is_enforced(logistic):
    model, _, _ = logistic
    lik = PenaltyLikelihood(model, model.value_vars, model.initial_point())
    x = np.zeros(3)
    with pytest.raises(RuntimeError, match="current state"):
        lik.propose(x, 1.0)  # nothing cached yet
    lik.reset(x, 400)
    lik.propose(x + 0.1, 1.0)
    with pytest.raises(RuntimeError, match="committed"):
        lik.propose(x + 0.2, 1.0)  # the previous proposal is undecided
    lik.commit(True)
    with pytest.raises(RuntimeError, match="without a proposal"):
        lik.commit(True)
    lik.initial(x, 400)  # the explicit interface leaves no cached state behind
    with pytest.raises(RuntimeError, match="current state"):
        lik.propose(x, 1.0)


def test_the_fused_likelihood_survives_pickling(logistic):
    model, _, _ = logistic
    lik = PenaltyLikelihood(model, model.value_vars, model.initial_point())
    x0, x1, x2 = np.zeros(3), np.array([0.2, -0.1, 0.3]), np.array([0.1, 0.1, -0.2])
    lik.reset(x0, 400)
    lik.propose(x1, 0.05)
    lik.commit(True)
    copy = pickle.loads(pickle.dumps(lik))
    assert copy.propose(x2, 0.05) == lik.propose(x2, 0.05)
    copy.commit(True)
    lik.commit(True)
    assert copy.propose(x0, np.inf) == lik.propose(x0, np.inf)


# --- the vectorised softplus (C backend) ----------------------------------------------------


def test_vectorised_softplus_agrees_with_pytensor_to_a_few_ulp():
    x = pt.dvector("x")
    plain = pytensor.function([x], pt.softplus(x), mode=get_mode(None))
    fast = pytensor.function(
        [x], pt.softplus(x), mode=get_mode(None).including(VECTORISED_SOFTPLUS)
    )
    assert any(isinstance(node.op, VectorisedSoftplus) for node in fast.maker.fgraph.apply_nodes)
    assert not any(
        isinstance(node.op, VectorisedSoftplus) for node in plain.maker.fgraph.apply_nodes
    )
    edges = [-np.inf, -1e300, -746.0, -745.0, -40.0, -37.0, -1.0, 0.0, 1e-300, 18.0, 33.3, 40.0]
    edges += [800.0, 1e300, np.inf]
    values = np.concatenate([edges, np.random.default_rng(5).normal(0.0, 30.0, 100_000)])
    np.testing.assert_allclose(fast(values), plain(values), rtol=4 * np.finfo(float).eps, atol=0)
    assert np.isnan(fast(np.array([np.nan])))[0]
    # float32 keeps its dtype.
    x32 = pt.fvector("x32")
    fast32 = pytensor.function([x32], pt.softplus(x32), mode=step_mode())
    assert fast32(np.array([0.0, 50.0], dtype=np.float32)).dtype == np.float32


def test_step_mode_vectorises_softplus_only_on_the_c_backend(logistic):
    model, _, _ = logistic
    lik = PenaltyLikelihood(model, model.value_vars, model.initial_point())
    ops = [node.op for node in lik._function.maker.fgraph.apply_nodes]
    assert sum(isinstance(op, VectorisedSoftplus) for op in ops) == 1  # one, after the lift
    assert VECTORISED_SOFTPLUS in step_mode().provided_optimizer.include
    assert VECTORISED_SOFTPLUS not in step_mode("NUMBA").provided_optimizer.include
    assert LIFT_UNARY_THROUGH_SWITCH in step_mode("NUMBA").provided_optimizer.include


def test_branchless_sign_switch_is_exact():
    c = pt.dvector("c")
    a = pt.dvector("a")
    outs = [pt.switch(c, -a, a), pt.switch(c, a, -a)]
    plain = pytensor.function([c, a], outs, mode=get_mode(None))
    fast = pytensor.function([c, a], outs, mode=get_mode(None).including(BRANCHLESS_SIGN_SWITCH))
    assert not any(
        isinstance(node.op, Elemwise) and isinstance(node.op.scalar_op, ps.Switch)
        for node in fast.maker.fgraph.toposort()
    )
    values = np.array([0.0, -0.0, 1.5, -2.5, np.inf, -np.inf, np.nan, 1e-310, 1e308])
    conds = np.array([0.0, 1.0, 2.0, -1.0, np.nan, 0.5, -0.0, 1.0, 0.0])
    for got, want in zip(fast(conds, values), plain(conds, values), strict=True):
        np.testing.assert_array_equal(got, want)  # NaN where NaN, same values
        numbers = ~np.isnan(want)  # a NaN's sign bit carries no meaning
        np.testing.assert_array_equal(np.signbit(got[numbers]), np.signbit(want[numbers]))


def test_the_step_mode_keeps_the_logistic_terms_exact_but_for_softplus(logistic):
    """With the C rewrites the per-datapoint terms equal the lifted graph's to a few ulp,
    and bit for bit when only the exact rewrites (lift, branch-free sign) run."""
    model, _, _ = logistic
    term = model.logp(vars=model.observed_RVs, sum=False)[0]
    value = model.rvs_to_values[model["beta"]]
    lifted = pytensor.function(
        [value], term, mode=get_mode(None).including(LIFT_UNARY_THROUGH_SWITCH)
    )
    exact = pytensor.function(
        [value],
        term,
        mode=get_mode(None).including(LIFT_UNARY_THROUGH_SWITCH, BRANCHLESS_SIGN_SWITCH),
    )
    full = pytensor.function([value], term, mode=step_mode())
    for beta in (np.zeros(3), np.array([0.5, -2.0, 30.0]), np.array([-40.0, 1e3, 0.0])):
        np.testing.assert_array_equal(exact(beta), lifted(beta))
        np.testing.assert_allclose(full(beta), lifted(beta), rtol=4 * np.finfo(float).eps)


def test_the_cache_stays_right_when_pytensor_keeps_its_buffers(logistic):
    """With ``allow_gc=False`` PyTensor keeps buffers between calls; the swap on acceptance
    must still leave the accepted vector intact (no later call may write into it)."""
    model, X, y = logistic
    no_gc = {"mode": Mode(linker="cvm_nogc", optimizer="fast_run")}
    lik = PenaltyLikelihood(model, model.value_vars, model.initial_point(), no_gc)
    assert not lik._function.vm.allow_gc
    accepts = [True, False, True, True, False, True, True, True]
    assert _walk(lik, _unfused_reference(model), X, y, accepts) == 0


def test_holds_names_the_cached_state_and_sees_replaced_data():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 2))
    y = rng.binomial(1, 0.5, size=300)
    with pm.Model() as model:
        xd = pm.Data("X", X)
        beta = pm.Normal("beta", 0.0, 1.0, shape=2)
        pm.Bernoulli("y", logit_p=pm.math.dot(xd, beta), observed=y)
    lik = PenaltyLikelihood(model, model.value_vars, model.initial_point())
    x0, x1 = np.zeros(2), np.array([0.3, -0.2])
    assert not lik.holds(x0)  # nothing cached
    prior0 = lik.reset(x0, 300)
    assert lik.holds(x0) and not lik.holds(x1) and lik.current_logprior == prior0
    _, _, prior1 = lik.propose(x1, np.inf)
    assert not lik.holds(x0)  # undecided proposal
    lik.commit(False)
    assert lik.holds(x0) and lik.current_logprior == prior0
    lik.propose(x1, np.inf)
    lik.commit(True)
    assert lik.holds(x1) and not lik.holds(x0) and lik.current_logprior == prior1
    # pm.set_data with the same shape: the layout check passes, but the cached vector was
    # computed on the old rows; holds() must say so (it compared shapes only before).
    with model:
        pm.set_data({"X": X[::-1].copy()})
    lik.check_layout()
    assert not lik.holds(x1)
    lik.reset(x1, 300)
    assert lik.holds(x1)
