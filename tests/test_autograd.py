"""The tape and backward: gradient mappings, accumulation, broadcasting, deep graphs, tape
scoping, the memory report and gradcheck. Gradients are compared with hand-derived numpy
formulas."""

import itertools

import numpy as np
import pytest

import rlkit._native
import rlkit.core as rc
import rlkit.core.vjp
from rlkit.core import optim


def rand(shape, seed):
    return np.asfortranarray(np.random.default_rng(seed).standard_normal(shape))


@pytest.fixture(autouse=True)
def _fresh_tape():
    # Each test starts with no tape open and nothing recorded from an earlier test.
    previous = rc.dtype()
    yield
    rc.dtype(previous)
    with rc.grad_tape():
        pass


# ---- the mapping backward returns ---------------------------------------------------------

def test_gradients_keyed_by_parameter_and_by_name():
    W0, b0, X = rand((2, 3), 0), rand((2, 1), 1), rand((3, 5), 2)
    W = rc.param(W0, name="W", dtype="f64")
    b = rc.param(b0, name="b", dtype="f64")
    with rc.grad_tape():
        y = W @ rc.tensor(X, dtype="f64") + b
        loss = rc.sum(y * y)
    grads = rc.backward(loss)
    Y = W0 @ X + b0
    np.testing.assert_allclose(grads[W], 2 * Y @ X.T, rtol=1e-12)
    np.testing.assert_allclose(grads["W"], 2 * Y @ X.T, rtol=1e-12)
    np.testing.assert_allclose(grads[b], 2 * Y.sum(axis=1, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(grads["b"], grads[b])
    assert grads[W].shape == (2, 3) and grads[W].flags.f_contiguous
    assert len(grads) == 2
    assert set(grads.names()) == {"W", "b"}
    assert W in grads and "W" in grads and "nope" not in grads
    assert isinstance(grads.tensor(W), rc.Tensor)
    np.testing.assert_array_equal(grads.tensor("W").numpy(), grads[W])
    # .grad holds the same values after the first backward
    np.testing.assert_array_equal(W.grad, grads[W])


def test_shared_name_lookup_by_name_is_a_key_error():
    a = rc.param(np.array([1.0, 2.0]), name="w", dtype="f64")
    b = rc.param(np.array([3.0, 4.0]), name="w", dtype="f64")
    with rc.grad_tape():
        loss = rc.sum(a * b)
    grads = rc.backward(loss)
    with pytest.raises(KeyError, match="several parameters"):
        grads["w"]
    np.testing.assert_array_equal(grads[a].ravel(), [3.0, 4.0])
    np.testing.assert_array_equal(grads[b].ravel(), [1.0, 2.0])


def test_missing_keys():
    used = rc.param(np.ones(2), name="used")
    unused = rc.param(np.ones(2), name="unused")
    with rc.grad_tape():
        loss = rc.sum(used * 2.0)
    grads = rc.backward(loss)
    with pytest.raises(KeyError):
        grads[unused]
    with pytest.raises(KeyError):
        grads["unused"]
    with pytest.raises(TypeError):
        grads[3]


def test_grad_accumulates_until_zero_grad():
    x0 = np.array([1.0, -2.0, 3.0])
    x = rc.param(x0, dtype="f64")
    opt = optim.SGD([x], lr=0.0)
    for _ in range(2):
        with rc.grad_tape():
            loss = rc.sum(x * x)
        grads = rc.backward(loss)
        np.testing.assert_allclose(grads[x].ravel(), 2 * x0)  # this pass alone
    np.testing.assert_allclose(x.grad.ravel(), 4 * x0)  # the sum of the two passes
    opt.zero_grad()
    assert x.grad is None
    with rc.grad_tape():
        loss = rc.sum(x * x * x)
    rc.backward(loss)
    np.testing.assert_allclose(x.grad.ravel(), 3 * x0**2)


def test_param_used_twice_gets_the_summed_gradient():
    w0, v0 = rand((3, 1), 3), rand((3, 1), 4)
    w = rc.param(w0, dtype="f64")
    v = rc.tensor(v0, dtype="f64")
    with rc.grad_tape():
        loss = rc.sum(w * v + rc.exp(w))  # w appears in two branches
    np.testing.assert_allclose(rc.backward(loss)[w], v0 + np.exp(w0), rtol=1e-12)
    with rc.grad_tape():
        loss = rc.sum(w * w)  # the same tensor as both inputs of one op
    np.testing.assert_allclose(rc.backward(loss)[w], 2 * w0, rtol=1e-12)


def test_diamond_graph():
    a0 = rand((4, 2), 5)
    a = rc.param(a0, dtype="f64")
    with rc.grad_tape():
        h = rc.tanh(a)
        loss = rc.sum(h * rc.sigmoid(h) + h)
    t = np.tanh(a0)
    s = 1 / (1 + np.exp(-t))
    dl_dh = s + t * s * (1 - s) + 1
    np.testing.assert_allclose(rc.backward(loss)[a], dl_dh * (1 - t**2), rtol=1e-10)


def test_broadcast_bias_gradient_is_summed_over_the_batch():
    X, b0, T = rand((3, 8), 6), rand((3, 1), 7), rand((3, 8), 8)
    b = rc.param(b0, name="b", dtype="f64")
    row = rc.param(rand((1, 8), 9), name="row", dtype="f64")
    scalar = rc.param(np.array([[0.3]]), name="s", dtype="f64")
    with rc.grad_tape():
        y = rc.tensor(X, dtype="f64") + b + row + scalar
        loss = rc.sum((y - rc.tensor(T, dtype="f64")) ** 2.0)
    grads = rc.backward(loss)
    residual = X + b0 + row.numpy() + 0.3 - T
    assert grads[b].shape == (3, 1) and grads["row"].shape == (1, 8) and grads["s"].shape == (1, 1)
    np.testing.assert_allclose(grads[b], 2 * residual.sum(axis=1, keepdims=True), rtol=1e-10)
    np.testing.assert_allclose(grads["row"], 2 * residual.sum(axis=0, keepdims=True), rtol=1e-10)
    np.testing.assert_allclose(grads["s"], 2 * residual.sum(keepdims=True), rtol=1e-10)


def test_a_packed_outputs_gradient_is_passed_on_not_summed(monkeypatch):
    """A recurrence packs its outputs into one column whose blocks are reshaped views of it:
    their gradient reaches it with the same elements, which is no broadcast. It had been summed
    back by sum_to, an op as large as the outputs (44 ms of a 68 ms backward pass on the H200 at
    bench_ssm's sizes), while the packed outputs were 1-D (n,) against their views' (n, 1)."""
    from rlkit.core import ops
    summed_back = ops.sum_to

    def sum_to(x, shape):
        assert x.numel != int(np.prod(shape)), f"sum_to of {x.shape} to {shape} sums nothing"
        return summed_back(x, shape)

    monkeypatch.setattr(ops, "sum_to", sum_to)
    rng = np.random.default_rng(0)
    S, H, T = 4, 2, 6
    r, w, k, v, a, b = (rng.normal(size=(S, H, T)) / 2 for _ in range(6))
    w = rng.uniform(0.5, 1.0, size=(S, H, T))  # decays
    inputs = [rc.param(x.astype(np.float32)) for x in (r, w, k, v, a, b)]
    state = rc.param(rng.normal(size=(S * S * H, 2)).astype(np.float32))
    with rc.grad_tape():
        y, final = rc.rwkv_wkv7(*inputs, state, chunk_size=3)  # wkv7_chunk_states packs the states
        loss = rc.add(rc.sum(y), rc.sum(final))
    grads = rc.backward(loss)
    assert grads[state].shape == (S * S * H, 2) and np.isfinite(grads[state]).all()


def test_mlp_gradients_match_numpy():
    rng = np.random.default_rng(10)
    X = np.asfortranarray(rng.standard_normal((4, 16)))
    T = np.asfortranarray(rng.standard_normal((2, 16)))
    W1, b1 = rng.standard_normal((8, 4)) * 0.5, rng.standard_normal((8, 1)) * 0.1
    W2, b2 = rng.standard_normal((2, 8)) * 0.5, rng.standard_normal((2, 1)) * 0.1
    P = {k: rc.param(v, name=k, dtype="f64") for k, v in dict(W1=W1, b1=b1, W2=W2, b2=b2).items()}
    with rc.grad_tape():
        h = rc.tanh(P["W1"] @ rc.tensor(X, dtype="f64") + P["b1"])
        loss = rc.mse_loss(P["W2"] @ h + P["b2"], T)
    grads = rc.backward(loss)
    # numpy reference
    H = np.tanh(W1 @ X + b1)
    Y = W2 @ H + b2
    assert loss.item() == pytest.approx(np.mean((Y - T) ** 2), rel=1e-12)
    dY = 2 * (Y - T) / Y.size
    dW2, db2 = dY @ H.T, dY.sum(1, keepdims=True)
    dZ = (W2.T @ dY) * (1 - H**2)
    dW1, db1 = dZ @ X.T, dZ.sum(1, keepdims=True)
    for name, ref in dict(W1=dW1, b1=db1, W2=dW2, b2=db2).items():
        np.testing.assert_allclose(grads[name], ref, rtol=1e-10, atol=1e-14)


def test_slices_of_rows_give_their_summed_gradient_in_every_layout_of_blocks(device):
    """slice_rows' gradients of one tensor are kept as blocks and assembled once (vjp.RowBlock):
    blocks that tile the rows, blocks with gaps (zero there), one range read twice (added), and
    overlapping ranges (padded and added), each against numpy's sum of the padded gradients."""
    rng = np.random.default_rng(40)
    rows, cols = 24, 3
    layouts = {
        "tiling": [(0, 16), (16, 8)], "three tiling": [(8, 8), (0, 8), (16, 8)], "gaps": [(2, 5), (12, 4)],
        "one range twice": [(4, 8), (4, 8), (12, 12)], "overlapping": [(0, 10), (6, 10)], "one block": [(5, 3)],
    }
    for (name, ranges), factor in itertools.product(layouts.items(), (1.0, 2.0)):
        X = rng.normal(size=(rows, cols)).astype(np.float32)
        weights = [rng.normal(size=(n, cols)).astype(np.float32) for _, n in ranges]
        x = rc.param(X)
        with rc.grad_tape():
            h = x if factor == 1.0 else rc.scale(x, factor)  # the leaf itself, or an intermediate (a packed op's output)
            parts = [rc.sum(rc.mul(rc.slice_rows(h, start, n), rc.tensor(w))) for (start, n), w in zip(ranges, weights)]
            loss = parts[0]
            for part in parts[1:]:
                loss = rc.add(loss, part)
        expected = np.zeros((rows, cols))
        for (start, n), w in zip(ranges, weights):
            expected[start:start + n] += factor * w
        np.testing.assert_allclose(np.asarray(rc.backward(loss)[x]), expected, rtol=1e-6, atol=1e-6,
                                   err_msg=f"{name}, factor {factor}")


def test_the_gradient_of_a_packed_output_is_one_concatenation():
    """Two slices that tile an intermediate's rows (a packed op's outputs): the backward pass
    writes their gradients side by side, one concat_rows, rather than padding each to the whole
    and adding them (the nodes of a captured CPU program, profiled, are the ops that run)."""
    x = rc.param(np.arange(6, dtype=np.float32).reshape(6, 1))

    def gradient():
        with rc.grad_tape():
            packed = rc.scale(x, 2.0)
            loss = rc.add(rc.sum(rc.square(rc.slice_rows(packed, 0, 4))), rc.sum(rc.slice_rows(packed, 4, 2)))
        return rc.backward(loss).tensor(x)

    rlkit._native.set_cpu_profiling(True)
    try:
        step = rc.capture(gradient, [x])
        got = step()
    finally:
        rlkit._native.set_cpu_profiling(False)
    np.testing.assert_allclose(got.ravel(), [0.0, 8.0, 16.0, 24.0, 2.0, 2.0])  # d/dx (2x)^2 = 8x, d/dx 2x = 2
    (program,) = step._programs.values()
    ran = [label.split()[0] for _, label in program.native.level_times()]
    assert ran.count("concat_rows") == 1 and "pad_rows" not in ran


def test_explicit_output_gradient():
    W0, X = rand((2, 3), 11), rand((3, 4), 12)
    G = rand((2, 4), 13)
    W = rc.param(W0, dtype="f64")
    with rc.grad_tape():
        y = W @ rc.tensor(X, dtype="f64")
    np.testing.assert_allclose(rc.backward(y, grad=G)[W], G @ X.T, rtol=1e-12)
    with rc.grad_tape():
        y = W @ rc.tensor(X, dtype="f64")
    with pytest.raises(ValueError, match="grad has shape"):
        rc.backward(y, grad=np.ones((4, 2)))


# ---- deep graphs -------------------------------------------------------------------------

def test_deep_chain_backpropagates_without_recursion_error():
    n = 5000
    x = rc.param(np.array([1.5]), name="x", dtype="f64")
    with rc.grad_tape():
        y = x
        for _ in range(n):
            y = y * 1.0001
        loss = rc.sum(y)
    grads = rc.backward(loss)
    assert loss.item() == pytest.approx(1.5 * 1.0001**n, rel=1e-10)
    assert grads[x].item() == pytest.approx(1.0001**n, rel=1e-10)
    del y, loss, grads  # dropping a deep chain must not overflow either


def test_deep_chain_of_mixed_ops():
    n = 3000
    x0 = np.array([0.3, -0.2])
    x = rc.param(x0, dtype="f64")
    with rc.grad_tape():
        y = x
        for _ in range(n):
            y = rc.tanh(y) + 0.001 * y
        loss = rc.sum(y)
    # numpy reference: forward and the chain rule, iteratively
    v, d = x0.copy(), np.ones_like(x0)
    for _ in range(n):
        t = np.tanh(v)
        d = d * (1 - t**2 + 0.001)
        v = t + 0.001 * v
    np.testing.assert_allclose(loss.item(), v.sum(), rtol=1e-10)
    np.testing.assert_allclose(rc.backward(loss)[x].ravel(), d, rtol=1e-8)


# ---- errors ------------------------------------------------------------------------------

def test_backward_of_a_non_scalar_is_a_value_error():
    W = rc.param(np.ones((2, 3)))
    with rc.grad_tape():
        y = W * 2.0
    with pytest.raises(ValueError, match="scalar"):
        rc.backward(y)


def test_backward_of_an_unrecorded_tensor_is_a_runtime_error():
    W = rc.param(np.ones((2, 3)))
    loss = rc.sum(W * 2.0)  # no tape open
    with pytest.raises(RuntimeError, match="not recorded"):
        rc.backward(loss)
    with rc.grad_tape():
        const = rc.sum(rc.tensor(np.ones(3)) * 2.0)  # no input requires gradients
    with pytest.raises(RuntimeError, match="not recorded"):
        rc.backward(const)


def test_backward_of_a_non_tensor_is_a_type_error():
    with pytest.raises(TypeError):
        rc.backward(np.ones((1, 1)))


# ---- what is recorded ----------------------------------------------------------------------

def test_ops_outside_a_tape_are_not_recorded():
    W = rc.param(np.ones((2, 2)))
    y = W * 3.0
    assert y.is_leaf and not y.requires_grad
    assert rc.tape_memory(top=10) == []


def test_no_grad_pauses_recording():
    W0 = np.array([[2.0]])
    W = rc.param(W0, dtype="f64")
    with rc.grad_tape():
        a = W * 3.0
        with rc.no_grad():
            b = W * 5.0
        c = W * 7.0
        loss = rc.sum(a + b + c)
    assert not a.is_leaf and not c.is_leaf
    assert b.is_leaf and not b.requires_grad
    assert rc.backward(loss)[W].item() == pytest.approx(10.0)  # 3 + 7: b is a constant
    assert not rc.tape.TAPE.recording


def test_stop_gradient_blocks_the_gradient():
    w0 = np.array([1.5, -0.5])
    w = rc.param(w0, dtype="f64")
    with rc.grad_tape():
        a = w * w
        loss = rc.sum(a * rc.stop_gradient(a))  # d/dw = 2 w * a = 2 w^3 (not 4 w^3)
    np.testing.assert_allclose(rc.backward(loss)[w].ravel(), 2 * w0**3)
    with rc.grad_tape():
        loss = rc.sum(rc.stop_gradient(w) * 3.0)
    with pytest.raises(RuntimeError):
        rc.backward(loss)


def test_new_tape_releases_the_previous_one():
    W = rc.param(np.ones((2, 2)))
    with rc.grad_tape():
        h = W * 2.0
        old_loss = rc.sum(h)
    assert not h.is_leaf
    with rc.grad_tape():
        new_loss = rc.sum(W * 3.0)
    assert h.is_leaf and not h.requires_grad  # the old intermediate became a constant
    assert len(rc.tape_memory(top=100)) == 2  # W * 3 and its sum; nothing of the old tape
    with pytest.raises(RuntimeError):
        rc.backward(old_loss)
    np.testing.assert_array_equal(rc.backward(new_loss)[W], np.full((2, 2), 3.0))


def test_tapes_do_not_nest():
    with rc.grad_tape():
        with pytest.raises(RuntimeError, match="already open"):
            with rc.grad_tape():
                pass
    assert not rc.tape.TAPE.recording


def test_tape_closes_on_an_exception():
    with pytest.raises(KeyError):
        with rc.grad_tape():
            raise KeyError("boom")
    assert not rc.tape.TAPE.recording


def test_tape_memory_lists_the_largest_outputs_first():
    W = rc.param(np.ones((8, 4)))  # f32
    x = rc.tensor(np.ones((4, 32)))
    with rc.grad_tape():
        big = W @ x  # [8, 32] f32: 1024 bytes
        col = rc.sum(big, 1)  # [8, 1]: 32 bytes
        small = rc.sum(col)  # [1, 1]: 4 bytes
        wide = rc.cast(big, "f64")  # [8, 32] f64: 2048 bytes
    rows = rc.tape_memory(top=3)
    assert [r["bytes"] for r in rows] == [8 * 32 * 8, 8 * 32 * 4, 8 * 4]
    assert rows[0]["op"] == "cast" and rows[0]["shape"] == (8, 32) and rows[0]["dtype"] == "f64"
    assert rows[1]["op"] == "matmul" and rows[1]["dtype"] == "f32"
    assert rows[2]["shape"] == (8, 1)
    assert len(rc.tape_memory(top=10)) == 4
    assert rc.tape_memory(top=0) == []
    with pytest.raises(ValueError):
        rc.tape_memory(top=-1)
    del wide  # an output nothing uses any more is no longer held...
    assert [r["bytes"] for r in rc.tape_memory(top=10)] == [1024, 32, 4]
    del big  # ...but one saved as an input of a recorded op still is
    assert [r["bytes"] for r in rc.tape_memory(top=10)] == [1024, 32, 4]
    del col, small


# ---- gradcheck ------------------------------------------------------------------------------

def test_gradcheck_passes_for_a_correct_composite_function():
    A, B = rand((3, 4), 20), rand((4, 5), 21)

    def fn(a, b):
        h = a @ b
        return rc.sum(rc.tanh(h) * rc.sigmoid(h) + rc.softplus(h) * 0.5, 0)

    assert rc.gradcheck(fn, [A, B]) is True


def test_gradcheck_raises_for_a_wrong_gradient(monkeypatch):
    A = rand((3, 4), 22)

    def fn(a):
        return rc.tanh(a) * 2.0

    assert rc.gradcheck(fn, [A]) is True
    # a deliberately wrong rule: d tanh = g * y instead of g * (1 - y^2)
    monkeypatch.setitem(rlkit.core.vjp.VJP, "tanh", lambda g, out, x: (rc.mul(g, out),))
    with pytest.raises(rc.GradcheckError, match="input 0"):
        rc.gradcheck(fn, [A])


def test_gradcheck_error_is_an_assertion_error():
    assert issubclass(rc.GradcheckError, AssertionError)
    with pytest.raises(TypeError):
        rc.gradcheck("not callable", [np.ones(2)])


def test_gradcheck_does_not_pass_when_the_numeric_gradient_is_undefined():
    # sqrt at 1e-7 with eps = 1e-6: f(x - eps) is NaN, so nothing was checked
    with pytest.raises(rc.GradcheckError, match="nan"):
        rc.gradcheck(lambda x: rc.sqrt(x), [np.array([1.0, 1e-7])])
    assert rc.gradcheck(lambda x: rc.sqrt(x), [np.array([1.0, 1e-3])]) is True


def test_gradient_of_a_scalar_base_power():
    x0 = np.array([-1.0, 0.5, 2.0])
    x = rc.param(x0, dtype="f64")
    with rc.grad_tape():
        loss = rc.sum(3.0**x)
    np.testing.assert_allclose(rc.backward(loss)[x].ravel(), np.log(3.0) * 3.0**x0, rtol=1e-12)


def test_gradcheck_defaults_suit_single_precision():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal((4, 2)).astype(np.float32)
    assert rc.gradcheck(lambda x, y: rc.tanh(x @ y), [a, b])
