"""A product and relu_back of it in one op (matmul_relu_mask): on both backends it equals the
product then relu_back (numpy, float64), NaN included, through the GPU's fused kernel (16 x 16
tiles, unsplit) and its fallback (other kernels: the product, then relu_back), and on the CPU
through every path of its products (blocks of rows or of columns, one column); a captured
program gives each matmul read only by relu_back that epilogue (on the GPU with the CPU
program's results, one dependency level fewer per ReLU layer of a backward pass; on the CPU
with the eager ops' results), and never where the product is read elsewhere, is an output, or
would move past an in-place write. The CPU's linear gives each block of its product its bias and
activation: the eager ops' values at the shapes of each path."""

import numpy as np
import pytest

import rlkit.core as rc
from rlkit import _native
from conftest import AVAILABLE_DEVICES
from test_elementwise_chain import _captured, _level_labels, _run, gpu_profiling  # noqa: F401 (a fixture)


def _product_then_relu_back(a, b, y, ta, tb):
    """The reference, in float64: op(a) @ op(b) per batch slice where y > 0, else 0 (y NaN: 0)."""
    op_a = np.swapaxes(a, 0, 1) if ta else a
    op_b = np.swapaxes(b, 0, 1) if tb else b
    product = np.einsum("ik...,kj...->ij...", op_a.astype(np.float64), op_b.astype(np.float64))
    return np.where(y > 0, product, 0.0)


# (m, k, n, batch dims, ta, tb): the GPU's fused 16 x 16 kernel for small outputs at awkward sizes
# and batches; its fallback for a product it splits along k (3136 x 32 at n 32) and one of 64 x 64
# tiles (300 x 700 x 300 goes to the 16 x 16 kernel; 1024 x 64 x 1024 does not).
SHAPES = [(37, 29, 5, (), False, False), (1, 1, 1, (), True, False), (256, 256, 256, (), True, False),
          (17, 33, 9, (3,), False, True), (16, 64, 16, (2, 2), True, True), (32, 3136, 32, (), False, False),
          (1024, 64, 1024, (), False, False),
          # the CPU's products in blocks of rows (400 x 23: four blocks), of columns (300 x 256),
          # one column (gemv), and A^T B with few columns
          (400, 256, 23, (), False, True), (300, 400, 256, (), False, False), (300, 400, 1, (), False, False),
          (400, 300, 7, (), True, False)]


def _operands(m, k, n, batch, ta, tb, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(((k, m) if ta else (m, k)) + batch).astype(np.float32)
    b = rng.standard_normal(((n, k) if tb else (k, n)) + batch).astype(np.float32)
    y = rng.standard_normal((m, n) + batch).astype(np.float32)
    y.flat[0] = np.nan  # masks its element: relu_back gives 0 there
    y.flat[-1] = 0.0  # not > 0
    if m > 1 and n > 1:
        y[1, 1] = 1.0
        a[((0, 1) if ta else (1, 0)) + (0,) * len(batch)] = np.nan  # op(a)[1, 0]: NaN products where y > 0 stay NaN
    return a, b, y


@pytest.mark.parametrize("device", AVAILABLE_DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:3])) + f"-b{s[3]}-t{int(s[4])}{int(s[5])}")
def test_matmul_relu_mask_is_the_product_then_relu_back(device, shape):
    m, k, n, batch, ta, tb = shape
    a, b, y = _operands(m, k, n, batch, ta, tb, seed=m + k + n)
    tensors = [rc.tensor(np.asfortranarray(v), device=device) for v in (a, b, y)]
    got = rc.ops.apply("matmul_relu_mask", tuple(tensors), ints=[int(ta), int(tb)]).numpy()
    expected = _product_then_relu_back(a, b, y, ta, tb)
    assert got.shape == expected.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.sqrt(k))
    assert np.all(got[~(y > 0)] == 0.0)


def test_matmul_relu_mask_checks_its_inputs():
    ones = lambda *shape, dtype="f32": rc.tensor(np.ones(shape), dtype=dtype)  # noqa: E731
    with pytest.raises(ValueError, match=r"matmul_relu_mask: y is \[3, 4\]; expected the product's shape"):
        rc.ops.apply("matmul_relu_mask", (ones(3, 2), ones(2, 5), ones(3, 4)), ints=[0, 0])
    with pytest.raises(TypeError, match="matmul_relu_mask: a, b and y must be f32"):
        rc.ops.apply("matmul_relu_mask", (ones(3, 2), ones(2, 5), ones(3, 5, dtype="f64")), ints=[0, 0])
    with pytest.raises(ValueError, match="matmul_relu_mask: inner dimensions differ"):
        rc.ops.apply("matmul_relu_mask", (ones(3, 2), ones(3, 5), ones(3, 5)), ints=[0, 0])


def _relu_network_gradients(ws):
    """fn(x): the gradients of sum((W_last relu(... relu(W_1 x)))^2) with respect to ws, on a tape."""
    def fn(x):
        with rc.grad_tape():
            h = x
            for w in ws[:-1]:
                h = rc.relu(rc.matmul(w, h))
            loss = rc.sum(rc.square(rc.matmul(ws[-1], h)))
        grads = rc.backward(loss)
        return [grads.tensor(w) for w in ws]
    return fn


@pytest.mark.requires_gpu
def test_a_captured_backward_pass_gives_its_products_the_relu_back(gpu_profiling):
    """The gradients of a ReLU network with three hidden layers: each hidden layer's relu_back is
    the epilogue of the product that gives its input gradient (no relu_back kernel is left, so a
    level fewer each), and every gradient equals the CPU program's."""
    rng = np.random.default_rng(0)
    sizes = [7, 64, 48, 33, 3]
    initial = [rng.standard_normal((o, i)).astype(np.float32) / np.sqrt(i) for i, o in zip(sizes[:-1], sizes[1:])]
    weights = {device: [rc.param(w, device=device) for w in initial] for device in ("cpu", "gpu")}

    programs = {device: _captured(_relu_network_gradients(weights[device]), device, weights[device])
                for device in ("cpu", "gpu")}
    for seed in (1, 2):
        x = np.asfortranarray(np.random.default_rng(seed).standard_normal((7, 45)), np.float32)
        results = {device: _run(programs[device], device, x=x) for device in ("cpu", "gpu")}
        for g_cpu, g_gpu in zip(results["cpu"], results["gpu"]):
            np.testing.assert_allclose(g_gpu, g_cpu, rtol=1e-4, atol=1e-4)
    labels = " ".join(_level_labels(programs["gpu"]))
    assert labels.count("matmul_small_relu_mask") == 3, labels  # the hidden layers' input gradients
    assert "relu_back" not in labels.replace("matmul_small_relu_mask", ""), labels


def test_a_captured_cpu_backward_pass_masks_its_products_in_place():
    """On the CPU too each hidden layer's relu_back becomes its product's epilogue (applied to each
    block of the product as it is computed), with the eager tape's gradients, NaN included: a NaN
    in an input reaches the gradients the eager ops give it."""
    rng = np.random.default_rng(4)
    sizes = [23, 400, 300, 1]  # TD3's critic: its products split into blocks of columns and of rows
    ws = [rc.param(rng.standard_normal((o, i)).astype(np.float32) / np.sqrt(i), device="cpu")
          for i, o in zip(sizes[:-1], sizes[1:])]

    gradients = _relu_network_gradients(ws)
    assert _native.set_cpu_profiling(True) is not False
    try:
        program = _captured(gradients, "cpu", ws)
        for seed, nan_at in ((1, None), (2, (3, 17))):
            x = np.asfortranarray(np.random.default_rng(seed).standard_normal((23, 256)), np.float32)
            if nan_at:
                x[nan_at] = np.nan
            got = _run(program, "cpu", x=x)
            expected = [g.numpy() for g in gradients(rc.tensor(x, device="cpu"))]
            for g, e in zip(got, expected):
                np.testing.assert_array_equal(np.isnan(g), np.isnan(e))
                np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
        labels = " ".join(_level_labels(program))
    finally:
        _native.set_cpu_profiling(False)
    assert labels.count("matmul_relu_mask") == 2 and "relu_back" not in labels.replace("matmul_relu_mask", ""), labels


@pytest.mark.parametrize("activation", [None, "relu", "tanh", "sigmoid"])
@pytest.mark.parametrize("shape", [(400, 23, 256), (300, 400, 256), (24, 300, 1), (400, 23, 5), (5, 7, 3)],
                         ids=lambda s: "x".join(map(str, s)))
def test_cpu_linear_gives_each_block_its_bias_and_activation(shape, activation):
    """The CPU's linear applies its bias and activation to each block of the product (blocks of
    columns, of rows, one column): the values of the unfused ops, NaN included."""
    out, inp, n = shape
    rng = np.random.default_rng(out + inp + n)
    w, x, b = (rng.standard_normal(s).astype(np.float32) for s in ((out, inp), (inp, n), (out, 1)))
    x[0, n - 1] = np.nan
    fused = rc.linear(rc.tensor(w), rc.tensor(x), rc.tensor(b), activation=activation).numpy()
    unfused = rc.add(rc.matmul(rc.tensor(w), rc.tensor(x)), rc.tensor(b))
    unfused = {None: lambda t: t, "relu": rc.relu, "tanh": rc.tanh, "sigmoid": rc.sigmoid}[activation](unfused).numpy()
    np.testing.assert_array_equal(np.isnan(fused), np.isnan(unfused))
    assert np.isnan(fused[:, n - 1]).all()
    if activation in (None, "relu"):  # the same float operations
        np.testing.assert_array_equal(fused, unfused)
    else:  # the elementwise op's loop may be the AVX2 + FMA build of the same function
        np.testing.assert_allclose(fused, unfused, rtol=1e-6, atol=1e-7)


@pytest.mark.requires_gpu
def test_a_product_read_elsewhere_an_output_or_before_an_in_place_write_keeps_its_relu_back(gpu_profiling):
    target = rc.param(np.full((4, 6), 2.0, np.float32), device="gpu")
    columns = rc.tensor(np.arange(6, dtype=np.int32)[None, :], device="gpu")
    w = rc.tensor(np.asfortranarray(np.arange(16, dtype=np.float32).reshape(4, 4) - 7.5), device="gpu")

    def step(x, y):  # y an input: a small elementwise op making it would be copied into a chain with a relu_back
        read_twice = rc.matmul(w, target, transpose_a=True)  # [4, 6], read by relu_back and exp
        masked_once = rc.ops.apply("relu_back", (read_twice, y))
        other = rc.exp(rc.scale(read_twice, 0.01))
        before_write = rc.matmul(w, target, transpose_a=True)  # reads target before the write
        rc.ops.apply("put_cols", (target, columns, rc.stop_gradient(x)))
        masked_after_write = rc.ops.apply("relu_back", (before_write, y))
        output_too = rc.matmul(w, x, transpose_a=True)  # also an output of the program
        return [masked_once, other, masked_after_write, rc.ops.apply("relu_back", (output_too, y)), output_too]

    previous = rc.device("gpu")
    try:
        program = rc.capture(step, [target])
        for value in (0.25, 1.5):
            old = target.numpy().copy()
            x = np.asfortranarray(np.full((4, 6), value, np.float32) + np.arange(6, dtype=np.float32) / 4)
            y = x - 0.5
            masked_once, other, masked_after_write, masked_output, output_too = program(x=x, y=y)
            w_np = w.numpy().astype(np.float64)
            np.testing.assert_allclose(masked_once, np.where(y > 0, w_np.T @ old, 0), rtol=1e-6)
            np.testing.assert_allclose(other, np.exp(0.01 * (w_np.T @ old)), rtol=1e-6)
            np.testing.assert_allclose(masked_after_write, np.where(y > 0, w_np.T @ old, 0), rtol=1e-6)
            np.testing.assert_allclose(masked_output, np.where(y > 0, w_np.T @ x, 0), rtol=1e-6)
            np.testing.assert_allclose(output_too, w_np.T @ x, rtol=1e-6)
    finally:
        rc.device(previous)
    labels = " ".join(_level_labels(program))
    assert labels.count("binary_relu_back") == 3 and "matmul_small_relu_mask" not in labels, labels
