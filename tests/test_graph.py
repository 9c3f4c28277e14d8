"""Native graphs (rlkit._native.Graph): recording, execution, the liveness memory planner and
the errors around pending tensors."""

import numpy as np
import pytest

import rlkit.core as rc
from rlkit import _native


def rand(shape, seed):
    return np.asfortranarray(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


@pytest.fixture(autouse=True)
def _no_graph_left_recording():
    yield
    assert not _native.is_recording()


def chain(x, n):
    h = x
    for _ in range(n):
        h = rc.tanh(h * 0.9 + 0.1)
    return h


def chain_numpy(x, n):
    h = x.astype(np.float64)
    for _ in range(n):
        h = np.tanh(h * 0.9 + 0.1)
    return h


def test_recorded_ops_are_pending_until_run():
    X = rand((16, 32), 0)
    x = rc.tensor(X)
    g = _native.Graph()
    with g:
        assert _native.is_recording()
        a = x * 2.0
        b = rc.exp(a)
        c = rc.sum(b, 0)
    assert not _native.is_recording()
    assert a._impl.pending and b._impl.pending and c._impl.pending
    assert not x._impl.pending
    assert len(g) == 3
    assert c.shape == (1, 32)  # shapes are known when the op is called
    stats = g.run()
    assert stats["n_nodes"] == 3
    assert len(g) == 0
    assert not c._impl.pending
    np.testing.assert_allclose(a.numpy(), X * 2.0, rtol=1e-6)
    np.testing.assert_allclose(c.numpy(), np.exp(2.0 * X.astype(np.float64)).sum(0, keepdims=True), rtol=1e-5)


def test_graph_results_equal_eager_results():
    X = rand((24, 40), 1)
    eager = chain(rc.tensor(X), 30).numpy()
    g = _native.Graph()
    with g:
        lazy = chain(rc.tensor(X), 30)
    g.run()
    np.testing.assert_array_equal(lazy.numpy(), eager)
    np.testing.assert_allclose(eager, chain_numpy(X, 30), atol=1e-5)


def test_mixed_ops_in_a_graph_match_eager():
    X, W = rand((8, 10), 2), rand((5, 8), 3)

    def model(x, w):
        h = rc.relu(w @ x)
        return rc.softmax(h - rc.max(h)), rc.mean(rc.square(h), 1)

    eager = [t.numpy() for t in model(rc.tensor(X), rc.tensor(W))]
    g = _native.Graph()
    with g:
        lazy = model(rc.tensor(X), rc.tensor(W))
    g.run()
    for e, t in zip(eager, lazy):
        np.testing.assert_array_equal(t.numpy(), e)


def test_planner_reuses_memory_along_a_chain():
    X = rand((64, 128), 4)  # 32 KiB per intermediate
    nbytes = X.nbytes
    n = 40
    g = _native.Graph()
    with g:
        out = chain(rc.tensor(X), n)  # per step: scale, the constant 0.1 (a [1, 1] op), add, tanh
    stats = g.run()
    assert stats["n_nodes"] == 4 * n
    assert stats["kept_bytes"] == nbytes  # only `out` outlives the graph
    assert stats["intermediate_bytes"] == (3 * n - 1) * nbytes + n * 4
    # liveness: at most an input and an output of one step (and a constant) are alive at a time
    assert stats["arena_bytes"] <= 2 * nbytes + 128
    assert stats["arena_bytes"] * 20 < stats["intermediate_bytes"]
    np.testing.assert_allclose(out.numpy(), chain_numpy(X, n), atol=1e-5)


def test_tensors_referenced_from_python_keep_their_storage():
    X = rand((32, 16), 5)  # 2 KiB
    nbytes = X.nbytes
    g = _native.Graph()
    with g:
        a = rc.tensor(X) + 1.0
        b = a * 3.0
        c = b - 2.0
        d = rc.exp(c * 0.1)
    del b, c  # intermediates nothing outside the graph refers to
    stats = g.run()
    assert stats["kept_bytes"] == 2 * nbytes  # a and d
    assert stats["intermediate_bytes"] == 2 * nbytes + nbytes + 2 * 4  # b, c, c * 0.1 and the [1, 1] constants
    ref_a = X.astype(np.float64) + 1
    np.testing.assert_allclose(a.numpy(), ref_a, rtol=1e-6)
    np.testing.assert_allclose(d.numpy(), np.exp((ref_a * 3 - 2) * 0.1), rtol=1e-5)
    # kept tensors do not share the arena: a later graph cannot overwrite them
    g2 = _native.Graph()
    with g2:
        e = chain(rc.tensor(X), 5)
    g2.run()
    np.testing.assert_allclose(a.numpy(), ref_a, rtol=1e-6)
    np.testing.assert_allclose(e.numpy(), chain_numpy(X, 5), atol=1e-5)


def test_reshapes_and_aligned_column_slices_of_intermediates_read_their_bytes_in_place(device):
    """native/views.hpp: a reshape of an intermediate, and slices of its one column at multiples of
    64 bytes, run no kernel and read the intermediate's bytes, which the planner keeps until the
    views' last reader (a chain of intermediates of the same size runs in between, which would
    take those bytes were they free); a slice 12 bytes in and a reshape held outside the graph
    copy."""
    X = rand((64, 32), 7)

    def results(x):  # its locals are the graph's intermediates: nothing outside holds them
        flat = rc.reshape(rc.tanh(x), (64 * 32, 1))  # a view of tanh's output
        first, second = rc.slice_rows(flat, 0, 1024), rc.slice_rows(flat, 1024, 1024)  # views, 0 and 4096 bytes in
        unaligned = rc.slice_rows(flat, 3, 16)  # copies
        later = chain(x, 3)
        return rc.add(rc.scale(first, 2.0), second), rc.sum(unaligned), rc.reshape(later, (32, 64))

    g = _native.Graph()
    with g:
        combined, total, held = results(rc.tensor(X))  # held: a reshape referenced from Python copies
    stats = g.run()
    assert stats["n_views"] == 3
    column = np.tanh(X.astype(np.float64)).reshape(-1, 1, order="F")
    np.testing.assert_allclose(combined.numpy(), 2.0 * column[:1024] + column[1024:], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(total.numpy(), column[3:19].sum(keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(held.numpy(), chain_numpy(X, 3).reshape(32, 64, order="F"), rtol=1e-5, atol=1e-6)


def test_a_reshape_of_a_tensor_written_in_place_keeps_its_copy(device):
    """An op that writes its input in place (put_cols) after a reshape of it: the reshape copies,
    so what reads it later sees the values from before the write."""
    X = rand((8, 6), 8)

    def sums(x):
        h = rc.exp(x)
        snapshot = rc.reshape(h, (6, 8))
        rc.put_cols(h, np.array([[1]], dtype=np.int32), rc.tensor(np.zeros((8, 1), np.float32)))
        return rc.sum(snapshot), rc.sum(h)

    g = _native.Graph()
    with g:
        before, after = sums(rc.tensor(X))
    stats = g.run()
    assert stats["n_views"] == 0
    np.testing.assert_allclose(before.numpy(), np.exp(X.astype(np.float64)).sum(keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(after.numpy(), np.exp(X.astype(np.float64)).sum(keepdims=True) - np.exp(X[:, 1]).sum(),
                               rtol=1e-5)


def test_reading_a_pending_tensor_is_an_error():
    g = _native.Graph()
    with g:
        y = rc.tensor(rand((3, 4), 6)) * 2.0
    with pytest.raises(RuntimeError, match="pending"):
        y.numpy()
    g.run()
    assert y.numpy().shape == (3, 4)


def test_eager_op_on_a_pending_tensor_is_an_error():
    g = _native.Graph()
    with g:
        y = rc.tensor(rand((3, 4), 7)) * 2.0
    with pytest.raises(RuntimeError, match="pending"):
        rc.exp(y)
    with pytest.raises(RuntimeError, match="pending"):
        y + 1.0
    g.run()
    np.testing.assert_allclose((y + 1.0).numpy(), rand((3, 4), 7) * 2.0 + 1.0, rtol=1e-6)


def test_running_a_graph_whose_input_is_pending_elsewhere_is_an_error():
    X = rand((3, 4), 8)
    first, second = _native.Graph(), _native.Graph()
    with first:
        a = rc.tensor(X) + 1.0
    with second:
        b = a * 2.0
    with pytest.raises(RuntimeError, match="pending"):
        second.run()
    assert len(second) == 1  # nothing ran: the graph keeps its nodes
    first.run()
    np.testing.assert_allclose(a.numpy(), X + 1.0)
    second.run()
    np.testing.assert_allclose(b.numpy(), (X + 1.0) * 2.0)


def test_a_failing_node_leaves_no_uninitialised_results():
    # An index is checked when the kernel runs: the failure must not leave later outputs
    # readable with whatever their memory held.
    X = rand((3, 4), 10)
    index = rc.tensor(np.array([0, 7], dtype=np.int32))  # a tensor: checked by the kernel, not at the call
    g = _native.Graph()
    with g:
        a = rc.tensor(X) * 2.0
        y = rc.get_rows(a, index)  # column 7 does not exist
        z = y * 2.0 + 1.0
    with pytest.raises(IndexError, match="out of range"):
        g.run()
    np.testing.assert_allclose(a.numpy(), X * 2.0)  # computed before the failure
    for t in (y, z):
        assert t._impl.pending
        with pytest.raises(RuntimeError, match="pending"):
            t.numpy()


def test_nested_recording_is_an_error():
    outer, inner = _native.Graph(), _native.Graph()
    with outer:
        with pytest.raises(RuntimeError, match="already recording"):
            with inner:
                pass
        with pytest.raises(RuntimeError, match="already recording"):
            with outer:
                pass
        assert _native.is_recording()  # the outer graph still records
        y = rc.tensor(np.ones(3, np.float32)) + 1.0
    assert len(outer) == 2 and len(inner) == 0  # the constant 1.0 and the add
    outer.run()
    np.testing.assert_array_equal(y.numpy().ravel(), [2.0, 2.0, 2.0])


def test_recording_stops_when_the_block_raises():
    with pytest.raises(KeyError):
        with _native.Graph():
            raise KeyError("boom")
    assert not _native.is_recording()


def test_shape_errors_are_raised_at_record_time():
    g = _native.Graph()
    with g:
        with pytest.raises(ValueError, match="broadcast"):
            rc.tensor(np.ones((2, 3), np.float32)) + rc.tensor(np.ones((3, 2), np.float32))
    assert len(g) == 0


def test_backward_runs_as_one_graph_with_planned_memory():
    # The backward pass of a long chain runs through the planner: its gradient is right.
    rng = np.random.default_rng(9)
    X = rng.standard_normal((4, 8))
    w = rc.param(np.full((4, 1), 0.5), dtype="f64")
    with rc.grad_tape():
        h = rc.tensor(X, dtype="f64")
        for _ in range(20):
            h = rc.tanh(h * w)
        loss = rc.sum(h)
    grad = rc.backward(loss)[w]
    # numpy reference: forward saving each step, then the chain rule backwards
    hs = [X]
    for _ in range(20):
        hs.append(np.tanh(hs[-1] * 0.5))
    gh, gw = np.ones_like(X), np.zeros((4, 1))
    for k in range(20, 0, -1):
        gz = gh * (1 - hs[k] ** 2)
        gw += (gz * hs[k - 1]).sum(1, keepdims=True)
        gh = gz * 0.5
    np.testing.assert_allclose(grad, gw, rtol=1e-10)
