"""The image modules (rlkit/core/nn/conv.py): Conv2d, MaxPool2d, Flatten, ScaleImages, NatureCNN
and ImpalaCNN against numpy references built from the op references (and PyTorch's modules,
gradients included, where torch is installed)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import rlkit.core as rc
from op_references import np_conv2d, np_max_pool2d  # tests/ is on sys.path when pytest imports a test module

ATARI = (4, 84, 84)


def _images(rng, shape, n, device="cpu"):
    """Random bytes (N, C, H, W) and the same as rlkit's [W, H, C, N] tensor."""
    obs = rng.integers(0, 256, (n, *shape)).astype(np.uint8)
    return obs, rc.tensor(obs.T, dtype="u8", device=device)


def _np(t: rc.Tensor) -> np.ndarray:
    return t.numpy().astype(np.float64)


def _relu(x):
    return np.maximum(x, 0.0)


def _np_nature(cnn: rc.nn.NatureCNN, x: np.ndarray) -> np.ndarray:
    """NatureCNN in numpy: its convolutions, ReLU each, the flatten of (N, C, H, W), Linear, ReLU."""
    h = x / 255.0
    for conv in [m for m in cnn.cnn if isinstance(m, rc.nn.Conv2d)]:
        h = _relu(np_conv2d(h, _np(conv.W), _np(conv.b), stride=conv.stride))
    flat = h.reshape(-1, h.shape[-1], order="F")  # [W H C, N], column-major as rlkit flattens
    return _relu(_np(cnn.linear.W) @ flat + _np(cnn.linear.b))


def test_conv2d_module_is_the_op_with_pytorch_initialisation():
    rc.manual_seed(0)
    conv = rc.nn.Conv2d(3, 5, (3, 2), stride=(2, 1), padding=1)
    assert conv.W.shape == (2, 3, 3, 5) and conv.b.shape == (5, 1)  # [KW, KH, C_in, C_out]
    bound = 1.0 / math.sqrt(3 * 3 * 2)
    assert np.abs(conv.W.numpy()).max() <= bound and np.abs(conv.b.numpy()).max() <= bound
    assert np.abs(conv.W.numpy()).max() > 0.8 * bound  # uniform over the whole range, not a narrower one
    x = np.random.default_rng(1).standard_normal((9, 7, 3, 2)).astype(np.float32)  # [W, H, C, N]
    expected = np_conv2d(x, _np(conv.W), _np(conv.b), stride=(2, 1), padding=1)
    np.testing.assert_allclose(conv(rc.tensor(x)).numpy(), expected, rtol=1e-5, atol=1e-5)
    assert conv.output_shape(7, 9) == expected.shape[1::-1]  # (H', W')
    pool = rc.nn.MaxPool2d(3, stride=2, padding=1)
    np.testing.assert_allclose(pool(rc.tensor(x)).numpy(), np_max_pool2d(x, 3, 2, 1), rtol=0)


def test_flatten_orders_features_as_pytorch_flattens_n_c_h_w():
    obs = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)  # (N, C, H, W)
    flat = rc.nn.Flatten()(rc.tensor(obs.T)).numpy()  # [W H C, N]
    np.testing.assert_array_equal(flat, obs.reshape(2, -1).T)


def test_nature_cnn_matches_numpy_on_atari_bytes():
    rc.manual_seed(1)
    cnn = rc.nn.NatureCNN(ATARI)
    assert cnn.features_dim == 512 and cnn.linear.W.shape == (512, 64 * 7 * 7)
    obs, x = _images(np.random.default_rng(2), ATARI, 3)
    with rc.no_grad():
        out = cnn(x).numpy()
    np.testing.assert_allclose(out, _np_nature(cnn, obs.T.astype(np.float64)), rtol=1e-4, atol=1e-5)


def test_nature_cnn_with_minatar_layers():
    rc.manual_seed(2)
    cnn = rc.nn.NatureCNN((4, 10, 10), features_dim=128, normalize_images=False, conv_layers=((16, 3, 1),))
    assert cnn.linear.W.shape == (128, 16 * 8 * 8)
    x = np.random.default_rng(3).integers(0, 2, (10, 10, 4, 6)).astype(np.float32)
    conv = cnn.cnn[0]
    h = _relu(np_conv2d(x, _np(conv.W), _np(conv.b)))
    expected = _relu(_np(cnn.linear.W) @ h.reshape(-1, 6, order="F") + _np(cnn.linear.b))
    with rc.no_grad():
        np.testing.assert_allclose(cnn(rc.tensor(x)).numpy(), expected, rtol=1e-4, atol=1e-5)


def _np_impala(cnn: rc.nn.ImpalaCNN, x: np.ndarray) -> np.ndarray:
    def conv(module, h):
        return np_conv2d(h, _np(module.W), _np(module.b), padding=module.padding)

    h = x / 255.0
    layers = [m for m in cnn.cnn if not isinstance(m, rc.nn.ScaleImages)]
    for layer in layers:
        if isinstance(layer, rc.nn.Conv2d):
            h = conv(layer, h)
        elif isinstance(layer, rc.nn.MaxPool2d):
            h = np_max_pool2d(h, 3, 2, 1)
        else:  # a residual block
            h = h + conv(layer.conv1, _relu(conv(layer.conv0, _relu(h))))
    flat = _relu(h).reshape(-1, h.shape[-1], order="F")
    return _relu(_np(cnn.linear.W) @ flat + _np(cnn.linear.b))


def test_impala_cnn_matches_numpy():
    rc.manual_seed(3)
    cnn = rc.nn.ImpalaCNN((3, 21, 17), features_dim=32, channels=(4, 6))
    obs, x = _images(np.random.default_rng(4), (3, 21, 17), 2)
    assert cnn.linear.W.shape == (32, 6 * 6 * 5)  # 21 x 17 -> 11 x 9 -> 6 x 5
    with rc.no_grad():
        out = cnn(x).numpy()
    np.testing.assert_allclose(out, _np_impala(cnn, obs.T.astype(np.float64)), rtol=1e-4, atol=1e-5)


def _torch_nature(cnn: rc.nn.NatureCNN):
    """PyTorch's NatureCNN (SB3's layers) holding the same weights."""
    torch = pytest.importorskip("torch", reason="PyTorch is the second reference where installed")
    convs = [m for m in cnn.cnn if isinstance(m, rc.nn.Conv2d)]
    layers = []
    for conv in convs:
        c_out, c_in = conv.out_channels, conv.in_channels
        module = torch.nn.Conv2d(c_in, c_out, conv.kernel_size, stride=conv.stride)
        with torch.no_grad():
            module.weight.copy_(torch.from_numpy(np.ascontiguousarray(conv.W.numpy().T)))
            module.bias.copy_(torch.from_numpy(conv.b.numpy().reshape(-1)))
        layers += [module, torch.nn.ReLU()]
    linear = torch.nn.Linear(cnn.linear.W.shape[1], cnn.features_dim)
    with torch.no_grad():
        linear.weight.copy_(torch.from_numpy(cnn.linear.W.numpy()))
        linear.bias.copy_(torch.from_numpy(cnn.linear.b.numpy().reshape(-1)))
    return torch, torch.nn.Sequential(*layers, torch.nn.Flatten(), linear, torch.nn.ReLU())


def test_nature_cnn_values_and_gradients_match_pytorch(device):
    rc.manual_seed(4)
    cnn = rc.nn.NatureCNN(ATARI, features_dim=64).to(device)
    torch, reference = _torch_nature(cnn)
    obs, x = _images(np.random.default_rng(5), ATARI, 4, device)
    weights = np.random.default_rng(6).standard_normal((64, 4)).astype(np.float32)
    with rc.grad_tape():
        out = cnn(x)
        loss = rc.sum(out * rc.tensor(weights, device=device))
    grads = rc.backward(loss)
    expected = reference(torch.from_numpy(obs.astype(np.float32) / 255.0))
    (expected * torch.from_numpy(weights.T)).sum().backward()
    np.testing.assert_allclose(out.numpy(), expected.detach().numpy().T, rtol=1e-4, atol=1e-5)
    torch_convs = [m for m in reference if isinstance(m, torch.nn.Conv2d)]
    for conv, module in zip([m for m in cnn.cnn if isinstance(m, rc.nn.Conv2d)], torch_convs):
        np.testing.assert_allclose(np.asarray(grads[conv.W.name]), module.weight.grad.numpy().T, rtol=1e-3, atol=1e-5)
        np.testing.assert_allclose(np.asarray(grads[conv.b.name]).reshape(-1), module.bias.grad.numpy(), rtol=1e-3,
                                   atol=1e-5)


def test_bad_input():
    with pytest.raises(ValueError, match="too small"):
        rc.nn.NatureCNN((4, 10, 10))
    with pytest.raises(ValueError, match="conv_layers must be"):
        rc.nn.NatureCNN(ATARI, conv_layers=((16, 3),))
    with pytest.raises(ValueError, match=r"observation_shape must be a channel-first image \(C, H, W\)"):
        rc.nn.NatureCNN((84, 84))
    with pytest.raises(ValueError, match="observation_shape"):
        rc.nn.ImpalaCNN((0, 64, 64))
    with pytest.raises(ValueError, match="channels must name at least one"):
        rc.nn.ImpalaCNN((3, 64, 64), channels=())
    with pytest.raises(ValueError, match="Conv2d: kernel_size must be an int"):
        rc.nn.Conv2d(3, 4, 0)
    with pytest.raises(ValueError, match="Conv2d: stride must be an int"):
        rc.nn.Conv2d(3, 4, 3, stride=(1, 0))
    with pytest.raises(ValueError, match="Conv2d: padding must be an int"):
        rc.nn.Conv2d(3, 4, 3, padding=-1)
    with pytest.raises(ValueError, match="Conv2d: unknown activation"):
        rc.nn.Conv2d(3, 4, 3, activation="gelu")
    conv = rc.nn.Conv2d(3, 4, 3)
    with pytest.raises(ValueError, match="conv2d"):  # the op names the channels that do not match
        conv(rc.tensor(np.zeros((8, 8, 2, 1), np.float32)))
