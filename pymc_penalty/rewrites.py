"""Exact graph rewrites applied when compiling the step's likelihood.

PyMC writes some log-likelihoods as ``switch(y, f(a), f(b))`` (Bernoulli becomes
``switch(y, -softplus(-eta), -softplus(eta))``); the compiled elementwise loop evaluates both
branches, so every datapoint pays for ``f`` twice. Selecting first and applying ``f`` once,
``f(switch(y, a, b))``, gives identical values for any unary elementwise ``f`` at half the
cost. The rewrite is registered under its own name and only runs where the step asks for it.
"""

from __future__ import annotations

import pytensor.scalar as ps
import pytensor.tensor as pt
from pytensor.compile import optdb
from pytensor.graph.rewriting.basic import node_rewriter
from pytensor.tensor.elemwise import Elemwise

__all__ = ["LIFT_UNARY_THROUGH_SWITCH", "lift_unary_through_switch"]

LIFT_UNARY_THROUGH_SWITCH = "pymc_penalty_lift_unary_through_switch"


@node_rewriter([Elemwise])
def lift_unary_through_switch(fgraph, node):  # noqa: ANN001, ANN201 (PyTensor's signature)
    """Rewrite ``switch(c, f(a), f(b))`` as ``f(switch(c, a, b))`` for a unary Elemwise f."""
    if not isinstance(node.op.scalar_op, ps.Switch):
        return None
    cond, left, right = node.inputs
    if left.owner is None or right.owner is None:
        return None
    op = left.owner.op
    if not (
        isinstance(op, Elemwise)
        and op == right.owner.op
        and op.scalar_op.nin == 1
        and not op.inplace_pattern
    ):
        return None
    (inner_left,), (inner_right,) = left.owner.inputs, right.owner.inputs
    if inner_left.type != inner_right.type:
        return None
    new = op(pt.switch(cond, inner_left, inner_right))
    if new.type != node.outputs[0].type:
        return None
    return [new]


if LIFT_UNARY_THROUGH_SWITCH not in optdb["specialize"]:
    optdb["specialize"].register(
        LIFT_UNARY_THROUGH_SWITCH, lift_unary_through_switch, use_db_name_as_tag=False
    )
