"""Completeness of the op table: every native op marked ``grad`` in native/ops.def has a vjp
rule and no ``no_grad`` op has one, and every op is exercised by the case table of test_ops.py.

Adding an op to native/ops.def makes these tests fail until it has a rule (rlkit/core/vjp.py)
where it is marked ``grad``, and a case in tests/test_ops.py.
"""

from __future__ import annotations

import inspect

import rlkit.core as rc
from rlkit import _native
from rlkit.core import losses, ops, recurrences
from rlkit.core.vjp import VJP

try:  # tests/ is on sys.path when pytest imports it without a package
    import test_ops
except ImportError:  # tests/ became a package
    from tests import test_ops

# Backward helper ops are only ever called inside vjp rules: the gradient cases of their forward
# op exercise them (a wrong helper fails that op's gradcheck). The elementwise list's helpers
# (native/elementwise.def, kind backward) are <forward>_back; the others are named here.
BACKWARD_HELPER_OF = {
    **{name: name.removesuffix("_back") for name, kind, _, _ in _native.elementwise_ops() if kind == "backward"},
    "softmax_back": "softmax",
    "log_softmax_back": "log_softmax",
    "ssm_conv_sx_back": "ssm_conv",
    "ssm_conv_c_back": "ssm_conv",
    "ssm_scan_back": "ssm_scan",
    "rwkv_wkv6_back": "rwkv_wkv6",
    "gated_linear_attn_back": "gated_linear_attn",
    "rwkv_wkv7_back": "rwkv_wkv7",
    "wkv7_chunk_states_back": "wkv7_chunk_states",
    "wkv7_chunk_terms_back": "wkv7_chunk_terms",
    "ssd_chunks_back": "ssd_chunks",
    "gla_chunks_back": "gla_chunks",
    "conv2d_input_back": "conv2d",
    "conv2d_weight_back": "conv2d",
    "max_pool2d_back": "max_pool2d",
}

# Native ops reached through a public function of another name.
PUBLIC_NAME_OF = {"softmax_cross_entropy": "softmax_cross_entropy_loss", "huber": "huber_loss",
                  "wkv7_chunk_states": "rwkv_wkv7",  # rwkv_wkv7's chunked form
                  "wkv7_chunk_terms": "rwkv_wkv7",  # rwkv_wkv7's chunked form
                  "ssd_chunks": "ssm_scan",  # ssm_scan's chunked form (SSD)
                  "gla_chunks": "gated_linear_attn"}  # gated_linear_attn's chunked form

NATIVE_OPS = list(_native.op_names())
NOT_DIFFERENTIABLE = {name for i, name in enumerate(NATIVE_OPS) if not _native.op_differentiable(i)}


def test_op_names_are_unique():
    assert len(NATIVE_OPS) == len(set(NATIVE_OPS))
    assert len(NATIVE_OPS) >= 50


def test_every_op_marked_grad_has_a_vjp_rule_and_no_other_has():
    both = [name for name in NATIVE_OPS if name in VJP and name in NOT_DIFFERENTIABLE]
    neither = [name for name in NATIVE_OPS if name not in VJP and name not in NOT_DIFFERENTIABLE]
    assert not both, f"ops marked no_grad in ops.def that have a vjp rule: {both}"
    assert not neither, f"ops marked grad in ops.def without a vjp rule: {neither}"
    assert ops.DIFFERENTIABLE == set(NATIVE_OPS) - NOT_DIFFERENTIABLE


def test_the_tape_records_exactly_the_ops_marked_grad():
    """ops.apply records a grad op whose input requires gradients, and never a no_grad op."""
    x = rc.param(rc.tensor([[1.0, -2.0], [3.0, 0.5]]))
    with rc.grad_tape():
        y = rc.relu(x)
        mask = rc.ge(x, y)
    assert y.requires_grad and not mask.requires_grad


def test_no_rule_or_entry_for_an_unknown_op():
    assert set(VJP) - set(NATIVE_OPS) == set(), "vjp rules for ops that are not in ops.def"


def test_every_op_has_a_test_case():
    missing = []
    for name in NATIVE_OPS:
        if name in BACKWARD_HELPER_OF:
            forward = BACKWARD_HELPER_OF[name]
            if PUBLIC_NAME_OF.get(forward, forward) not in test_ops.GRAD_COVERED_OPS:
                missing.append(f"{name} (through the gradient of {BACKWARD_HELPER_OF[name]})")
        elif PUBLIC_NAME_OF.get(name, name) not in test_ops.COVERED_OPS:
            missing.append(name)
    assert not missing, f"ops without a case in tests/test_ops.py: {missing}"


def test_backward_helpers_are_what_the_rules_call():
    """The mapping above is the real one: each helper is not differentiable, is called by the
    vjp rule of its forward op, and no other op ends in _back."""
    helpers = {name for name in NATIVE_OPS if name.endswith("_back")}
    assert helpers == set(BACKWARD_HELPER_OF)
    for helper, forward in BACKWARD_HELPER_OF.items():
        assert helper in NOT_DIFFERENTIABLE
        assert f'"{helper}"' in inspect.getsource(VJP[forward]), f"the vjp rule of {forward} does not call {helper}"


def test_every_differentiable_op_has_gradient_cases():
    """Ops with a vjp rule are gradchecked (directly or through the public op that reaches them)."""
    missing = [name for name in VJP if PUBLIC_NAME_OF.get(name, name) not in test_ops.GRAD_COVERED_OPS]
    assert not missing, f"differentiable ops without a gradcheck case: {missing}"


def test_every_public_op_has_a_case():
    """Every op and loss exported by rlkit.core (rc.__all__) has cases in test_ops.py."""
    not_ops = {"as_tensor", "tensor", "ones", "zeros"}
    public = {
        name for name in rc.__all__
        if callable(getattr(rc, name, None))
        and getattr(getattr(rc, name), "__module__", None) in (ops.__name__, recurrences.__name__, losses.__name__)
        and name not in not_ops
    }
    assert len(public) >= 50
    assert public - test_ops.COVERED_OPS == set(), public - test_ops.COVERED_OPS
    assert test_ops.COVERED_OPS - public - test_ops.INTERNAL_OPS == set(), "cases name ops that rlkit.core does not export"


def test_cases_name_the_op_they_cover():
    for case in test_ops.CASES:
        assert hasattr(rc, case.op), case.id
