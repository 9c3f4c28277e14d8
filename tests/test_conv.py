"""conv2d and max_pool2d at the shapes of the image networks of RL (NatureCNN, IMPALA) on both
backends: values and gradients against PyTorch (skipped where torch is not installed) and
against the numpy references of tests/op_references.py (everywhere), at sizes large enough for
the kernels' blocked and split paths; the tie and NaN rules of max pooling. The op table's cases
(tests/test_ops.py) cover the small awkward shapes, gradchecks and bad inputs."""

from __future__ import annotations

import numpy as np
import pytest

import rlkit.core as rc
from rlkit import _native

from conftest import DEVICES, GPU_UNAVAILABLE
from op_references import np_conv2d, np_conv2d_backward, np_max_pool2d

# (kernel [KW, KH, C_in, C_out], stride) of NatureCNN (Mnih et al. 2015) on 84 x 84 x 4 frames
NATURE_LAYERS = [((8, 8, 4, 32), 4), ((4, 4, 32, 64), 2), ((3, 3, 64, 64), 1)]
# IMPALA's (Espeholt et al. 2018) stacks on 64 x 64 x 3: a 3 x 3 conv (padding 1), then a 3 x 3
# max pool (stride 2, padding 1), channels 16, 32, 32
IMPALA_CHANNELS = [(3, 16), (16, 32), (32, 32)]


def _weights(rng, shapes):
    # He-scaled weights and small biases: activations stay O(1) through the layers
    return [(rng.normal(size=s) * np.sqrt(2.0 / np.prod(s[:3])), rng.normal(size=s[3]) * 0.1) for s in shapes]


def _nature_rlkit(x, params):
    for (w, b), (_, stride) in zip(params, NATURE_LAYERS):
        x = rc.relu(rc.conv2d(x, w, b, stride=stride))
    return x


def _impala_rlkit(x, params):
    for w, b in params:
        x = rc.max_pool2d(rc.conv2d(x, w, b, padding=1), 3, stride=2, padding=1)
    return x


def _rlkit_run(net, x, params, g, device):
    """(output, gradients of x and of every weight and bias) of sum(g * net(x)) in f32."""
    px = rc.param(x.astype(np.float32), device=device)
    pp = [(rc.param(w.astype(np.float32), device=device), rc.param(b.astype(np.float32), device=device)) for w, b in params]
    with rc.grad_tape():
        out = net(px, pp)
        loss = rc.sum(rc.mul(out, rc.tensor(g.astype(np.float32), device=device)))
    grads = rc.backward(loss)
    return out.numpy(), [np.asarray(grads[px])] + [np.asarray(grads[p]).reshape(p.shape) for pair in pp for p in pair]


def _torch_run(torch, net, x, params, g):
    """The same in PyTorch's layout: x.T is its (N, C, H, W) batch, w.T its (C_out, C_in, KH, KW)
    weights; results transposed back to rlkit's."""
    tx = torch.tensor(x.T.astype(np.float32), requires_grad=True)
    tp = [(torch.tensor(w.T.astype(np.float32), requires_grad=True), torch.tensor(b.astype(np.float32), requires_grad=True))
          for w, b in params]
    out = net(torch, tx, tp)
    (out * torch.tensor(g.T.astype(np.float32))).sum().backward()
    grads = [tx.grad.numpy().T] + [t.grad.numpy().T.reshape(-1, 1) if t.ndim == 1 else t.grad.numpy().T for pair in tp for t in pair]
    return out.detach().numpy().T, grads


def _nature_torch(torch, x, params):
    for (w, b), (_, stride) in zip(params, NATURE_LAYERS):
        x = torch.relu(torch.nn.functional.conv2d(x, w, b, stride=stride))
    return x


def _impala_torch(torch, x, params):
    for w, b in params:
        x = torch.nn.functional.max_pool2d(torch.nn.functional.conv2d(x, w, b, padding=1), 3, stride=2, padding=1)
    return x


NETWORKS = {
    "nature": (_nature_rlkit, _nature_torch, (84, 84, 4, 32), [s for s, _ in NATURE_LAYERS], (7, 7, 64, 32)),
    "impala": (_impala_rlkit, _impala_torch, (64, 64, 3, 4), [(3, 3, a, b) for a, b in IMPALA_CHANNELS], (8, 8, 32, 4)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_networks_match_torch(name, device):
    torch = pytest.importorskip("torch")
    ours, theirs, x_shape, w_shapes, out_shape = NETWORKS[name]
    rng = np.random.default_rng(7)
    x, params = rng.random(x_shape), _weights(rng, w_shapes)
    g = rng.normal(size=out_shape)
    out, grads = _rlkit_run(ours, x, params, g, device)
    expected_out, expected_grads = _torch_run(torch, theirs, x, params, g)
    assert out.shape == out_shape
    np.testing.assert_allclose(out, expected_out, rtol=1e-4, atol=1e-4)
    for k, (got, expected) in enumerate(zip(grads, expected_grads)):
        scale = np.abs(expected).max()
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * scale, err_msg=f"gradient {k}")


@pytest.mark.parametrize("device", DEVICES)
def test_nature_first_layer_matches_numpy(device):
    """NatureCNN's first layer at batch 32: several blocks of the CPU's patch matrix, and the
    GPU's weight gradient split along its 12800 output pixels; values and both gradients."""
    rng = np.random.default_rng(3)
    x, w, g = rng.random((84, 84, 4, 32)), rng.normal(size=(8, 8, 4, 32)) * 0.1, rng.normal(size=(20, 20, 32, 32))
    x, w, g = (a.astype(np.float32).astype(np.float64) for a in (x, w, g))  # what the f32 engine sees
    px, pw = rc.param(x.astype(np.float32), device=device), rc.param(w.astype(np.float32), device=device)
    with rc.grad_tape():
        out = rc.conv2d(px, pw, stride=4)
        loss = rc.sum(rc.mul(out, rc.tensor(g.astype(np.float32), device=device)))
    grads = rc.backward(loss)
    expected_dx, expected_dw = np_conv2d_backward(x, w, g, stride=4)
    np.testing.assert_allclose(out.numpy(), np_conv2d(x, w, stride=4), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(grads[px]), expected_dx, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(grads[pw]), expected_dw, rtol=1e-4, atol=1e-2)  # sums of 12800 terms


@pytest.mark.parametrize("device", DEVICES)
def test_strided_dilated_backward_matches_numpy(device):
    """Both backward helpers at stride (2, 3), padding (1, 2), dilation (2, 1) in f32, against the
    numpy reference (the f64 gradchecks of test_ops are CPU-only)."""
    rng = np.random.default_rng(5)
    x, w = rng.normal(size=(29, 31, 5, 3)), rng.normal(size=(3, 4, 5, 33))
    x, w = (a.astype(np.float32).astype(np.float64) for a in (x, w))
    out_shape = np_conv2d(x, w, stride=(3, 2), padding=(2, 1), dilation=(1, 2)).shape
    g = rng.normal(size=out_shape).astype(np.float32).astype(np.float64)
    px, pw = rc.param(x.astype(np.float32), device=device), rc.param(w.astype(np.float32), device=device)
    with rc.grad_tape():
        out = rc.conv2d(px, pw, stride=(3, 2), padding=(2, 1), dilation=(1, 2))
        loss = rc.sum(rc.mul(out, rc.tensor(g.astype(np.float32), device=device)))
    grads = rc.backward(loss)
    expected_dx, expected_dw = np_conv2d_backward(x, w, g, stride=(3, 2), padding=(2, 1), dilation=(1, 2))
    np.testing.assert_allclose(np.asarray(grads[px]), expected_dx, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(grads[pw]), expected_dw, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("x_shape, w_shape", [((20, 20, 32, 32), (4, 4, 32, 64)),  # k = 512: the GPU splits it
                                              ((9, 9, 8, 3), (3, 3, 8, 16)),      # k = 72: one pass
                                              ((30, 30, 64, 4), (3, 3, 64, 3))])  # 3 output channels, split
@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_bias_and_activation_in_the_kernel_keep_nan(device, x_shape, w_shape, activation):
    """conv2d's epilogue (the bias, then the activation; on the GPU in the kernel, or after the sum
    of a split reduction's slices) gives what the unfused ops give, NaN where the window holds one."""
    rng = np.random.default_rng(9)
    x, w, b = rng.random(x_shape), rng.normal(size=w_shape) * 0.1, rng.normal(size=w_shape[3])
    x[3, 5, 0, 0] = np.nan
    x, w, b = (a.astype(np.float32) for a in (x, w, b))
    got = rc.conv2d(rc.tensor(x, device=device), rc.tensor(w, device=device), rc.tensor(b, device=device), stride=2,
                    activation=activation).numpy()
    expected = {"relu": lambda z: np.maximum(z, 0), "tanh": np.tanh}[activation](np_conv2d(x, w, b, stride=2))
    assert np.isnan(got).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


F16_CASES = {  # name: (x shape, w shape, conv2d's keywords)
    "nature1": ((84, 84, 4, 32), (8, 8, 4, 32), {"stride": 4}),  # the weight gradient splits 12800 pixels
    "nature2": ((20, 20, 32, 32), (4, 4, 32, 64), {"stride": 2}),
    "nature3": ((9, 9, 64, 32), (3, 3, 64, 64), {"stride": 1}),
    "awkward": ((29, 31, 5, 3), (3, 4, 5, 33), {"stride": (3, 2), "padding": (2, 1), "dilation": (1, 2)}),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", sorted(F16_CASES))
def test_f16_conv_and_gradients_match_numpy(device, case):
    """conv2d on f16 images, kernels and bias (with ReLU), and both gradients in f16: on a GPU with
    cooperative matrices the f16 kernels (f32 sums, split reductions summed in f32, each result
    rounded once), elsewhere f32 copies; against the float64 reference of the f16 inputs, within
    f16's rounding."""
    x_shape, w_shape, conv = F16_CASES[case]
    rng = np.random.default_rng(11)
    x = rng.random(x_shape).astype(np.float16)
    w = (rng.normal(size=w_shape) * np.sqrt(2.0 / np.prod(w_shape[:3]))).astype(np.float16)
    b = (rng.normal(size=w_shape[3]) * 0.1).astype(np.float16)
    out_shape = np_conv2d(x.astype(np.float64), w.astype(np.float64), **conv).shape
    g = rng.normal(size=out_shape).astype(np.float16)
    px, pw, pb = (rc.param(a, dtype="f16", device=device) for a in (x, w, b))
    with rc.grad_tape():
        out = rc.conv2d(px, pw, pb, activation="relu", **conv)
        loss = rc.sum(rc.mul(out, rc.tensor(g, dtype="f16", device=device)))
    grads = rc.backward(loss)
    got = out.numpy()
    assert got.dtype == np.float16 and np.asarray(grads[px]).dtype == np.float16

    def check(name, got, expected):
        scale = np.abs(expected).max()
        np.testing.assert_allclose(got.astype(np.float64), expected, rtol=2e-3, atol=2e-3 * scale, err_msg=name)

    check("output", got, np.maximum(np_conv2d(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), **conv), 0))
    g_inside = g.astype(np.float64) * (got > 0)  # ReLU's mask, as the tape takes it from the output
    expected_dx, expected_dw = np_conv2d_backward(x.astype(np.float64), w.astype(np.float64), g_inside, **conv)
    check("d x", np.asarray(grads[px]), expected_dx)
    check("d w", np.asarray(grads[pw]).reshape(w_shape), expected_dw)
    check("d b", np.asarray(grads[pb]).reshape(-1), g_inside.sum(axis=(0, 1, 3)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["nature2", "awkward"])  # split and unsplit reductions on the GPU
def test_f16_conv_keeps_nan(device, case):
    """A NaN in an f16 image reaches every output whose window holds it, through the f16 kernel's
    bias and ReLU, as the unfused ops give it."""
    x_shape, w_shape, conv = F16_CASES[case]
    rng = np.random.default_rng(12)
    x, w = rng.random(x_shape).astype(np.float16), (rng.normal(size=w_shape) * 0.1).astype(np.float16)
    b = (rng.normal(size=w_shape[3]) * 0.1).astype(np.float16)
    x[3, 5, 0, 0] = np.nan
    got = rc.conv2d(*(rc.tensor(a, dtype="f16", device=device) for a in (x, w, b)), activation="relu", **conv).numpy()
    expected = np_conv2d(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), **conv)
    assert np.isnan(got).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))


def test_gpu_conv2d_kernel_is_named():
    """rlkit info's conv2d line: f32 on SIMT tiles; f16 on cooperative matrices exactly where f16
    matmul is, else widened to f32; None without a GPU; a clear error for a dtype conv2d lacks."""
    with pytest.raises(TypeError, match="dtype must be 'f32', 'f16' or 'bf16', got 'i32'"):
        _native.gpu_conv2d_kernel("i32")
    if GPU_UNAVAILABLE:
        assert _native.gpu_conv2d_kernel("f32") is None
        return
    assert "f32 SIMT" in _native.gpu_conv2d_kernel("f32")
    f16 = _native.gpu_conv2d_kernel("f16")
    on_cooperative_matrices = "cooperative matrices" in _native.gpu_matmul_kernel("f16", 256, 256)
    assert ("cooperative matrices" in f16) == on_cooperative_matrices
    assert on_cooperative_matrices or "f16 operands widened to f32" in f16


def _check_cpu_conv(rng, x, w, conv: dict, thread_counts: tuple[int, ...], dw_atol: float) -> None:
    """The CPU conv2d of f32-exact x and w, its output and both gradients, against the numpy
    reference, and the same bits again with each of ``thread_counts`` threads."""
    x, w = (a.astype(np.float32).astype(np.float64) for a in (x, w))
    g = rng.normal(size=np_conv2d(x, w, **conv).shape).astype(np.float32).astype(np.float64)
    out, dx, dw = _conv_value_and_grads(x, w, g, "cpu", **conv)
    expected_dx, expected_dw = np_conv2d_backward(x, w, g, **conv)
    np.testing.assert_allclose(out, np_conv2d(x, w, **conv), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dx, expected_dx, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, expected_dw, rtol=1e-4, atol=dw_atol)
    threads = rc.get_num_threads()
    try:
        for n in thread_counts:
            rc.set_num_threads(n)
            for got, want in zip(_conv_value_and_grads(x, w, g, "cpu", **conv), (out, dx, dw)):
                np.testing.assert_array_equal(got, want)
    finally:
        rc.set_num_threads(threads)


def _conv_value_and_grads(x, w, g, device, **conv):
    px, pw = rc.param(x.astype(np.float32), device=device), rc.param(w.astype(np.float32), device=device)
    with rc.grad_tape():
        out = rc.conv2d(px, pw, **conv)
        loss = rc.sum(rc.mul(out, rc.tensor(g.astype(np.float32), device=device)))
    grads = rc.backward(loss)
    return out.numpy(), np.asarray(grads[px]), np.asarray(grads[pw])


def test_banded_images_match_numpy_and_repeat_bit_for_bit():
    """Images too large for one band of the CPU's patch matrix (each cut into several bands of
    output rows, which overlap in the input's gradient), more bands than the weight gradient's
    groups, a stride width of 3 (no constant-stride copy) with padding: values and both gradients
    against the numpy reference, and the same bits again with one thread and with two."""
    rng = np.random.default_rng(7)
    conv = dict(stride=(2, 3), padding=(2, 1))
    x, w = rng.normal(size=(70, 80, 8, 10)), rng.normal(size=(5, 5, 8, 6)) * 0.1  # 2 bands an image
    _check_cpu_conv(rng, x, w, conv, thread_counts=(1, 2), dw_atol=1e-2)


@pytest.fixture(params=["avx512", "blas"])
def cpu_products(request):
    """The CPU convolution with its AVX-512 products (where the CPU has them) and with the BLAS."""
    previous = _native.set_strided_products(request.param == "avx512")
    yield request.param
    _native.set_strided_products(previous)


@pytest.mark.parametrize(
    "x_shape, w_shape, conv",
    [
        ((84, 84, 4, 3), (8, 8, 4, 32), dict(stride=4)),  # NatureCNN: 400 pixels, 8 columns a tile
        ((20, 20, 32, 2), (4, 4, 32, 64), dict(stride=2)),
        ((9, 9, 64, 2), (3, 3, 64, 64), dict(stride=1)),
        ((13, 11, 3, 2), (3, 2, 3, 37), dict(stride=(1, 2), padding=(1, 1), dilation=(2, 1))),  # tile edges
        ((7, 6, 2, 1), (5, 1, 2, 3), dict(stride=1, padding=(2, 0))),  # no constant kernel width
    ],
)
def test_cpu_products_match_numpy(cpu_products, x_shape, w_shape, conv):
    rng = np.random.default_rng(11)
    x, w = rng.normal(size=x_shape), rng.normal(size=w_shape) * 0.1
    _check_cpu_conv(rng, x, w, conv, thread_counts=(1, 3), dw_atol=1e-3)


def test_cpu_products_propagate_nan(cpu_products):
    rng = np.random.default_rng(12)
    x, w = rng.normal(size=(9, 9, 3, 2)), rng.normal(size=(3, 3, 3, 5))
    x[4, 4, 1, 0] = np.nan
    g = rng.normal(size=(7, 7, 5, 2))
    out, dx, dw = _conv_value_and_grads(x, w, g, "cpu")
    reads_nan = np.zeros((7, 7), bool)
    reads_nan[2:5, 2:5] = True  # the outputs whose windows hold x[4, 4]
    assert np.isnan(out[:, :, :, 0][reads_nan]).all() and not np.isnan(out[:, :, :, 0][~reads_nan]).any()
    assert not np.isnan(out[:, :, :, 1]).any()
    assert np.isnan(dw[:, :, 1]).all()  # every tap of channel 1 meets the NaN at some output
    assert not np.isnan(dw[:, :, [0, 2]]).any()
    assert not np.isnan(dx).any()  # dx reads g and w alone


def _pool_gradient(x, device, **pool):
    p = rc.param(np.asarray(x, np.float32), device=device)
    with rc.grad_tape():
        out = rc.max_pool2d(p, **pool)
        loss = rc.sum(out)
    return out.numpy(), np.asarray(rc.backward(loss)[p])


@pytest.mark.parametrize("device", DEVICES)
def test_max_pool2d_gradient_goes_to_the_first_maximum(device):
    """Ties: each window's gradient goes to its first maximum in memory order (ne order: along W,
    then H); overlapping windows that keep the same element add up."""
    x = np.array([[3.0, 1.0, 3.0],
                  [3.0, 3.0, 0.0],
                  [0.0, 2.0, 3.0]])  # [W, H]: x[w, h]
    out, grad = _pool_gradient(x, device, kernel=2, stride=1)
    np.testing.assert_array_equal(out[:, :, 0, 0], [[3.0, 3.0], [3.0, 3.0]])
    # windows at (w, h) = (0, 0), (1, 0), (0, 1), (1, 1) keep x[0, 0], x[1, 0], x[1, 1], x[1, 1] (window (0, 1)
    # reads x[0, 1] = 1, x[1, 1] = 3, x[0, 2] = 3, x[1, 2] = 0 in that order)
    np.testing.assert_array_equal(grad, [[1.0, 0.0, 0.0], [1.0, 2.0, 0.0], [0.0, 0.0, 0.0]])
    # padding is -inf: never kept, even where every element of x is negative
    out, grad = _pool_gradient(-np.ones((3, 3)), device, kernel=3, stride=3, padding=1)
    np.testing.assert_array_equal(out[:, :, 0, 0], [[-1.0]])
    np.testing.assert_array_equal(grad, [[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])


@pytest.mark.parametrize("device", DEVICES)
def test_max_pool2d_nan_propagates_and_takes_the_gradient(device):
    """A window holding a NaN gives NaN (as np.max), and its gradient goes to its first NaN (none
    to its larger numbers); windows without one are untouched."""
    x = np.array([[1.0, np.nan, 5.0, 0.0],
                  [7.0, np.nan, 2.0, 1.0]])  # [W 2, H 4]
    out, grad = _pool_gradient(x, device, kernel=(2, 2), stride=(2, 1))  # (h, w): windows of h 0-1 and h 2-3
    expected = np_max_pool2d(x, (2, 2), stride=(2, 1))
    np.testing.assert_array_equal(out, expected)
    assert np.isnan(out[0, 0, 0, 0]) and out[0, 1, 0, 0] == 5.0
    np.testing.assert_array_equal(grad, [[0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
