"""The image layers of rlkit.core.nn: Conv2d, MaxPool2d, Flatten, ScaleImages, and the two
encoders reinforcement learning on pixels uses, NatureCNN and ImpalaCNN.

Images are column-major as ggml's: a batch is [W, H, C, N] (ne0 = W), the bytes of a C-order
numpy (N, C, H, W) batch, so ``rc.tensor(batch.T)`` makes one without a copy. Sizes given as
pairs follow PyTorch's order, (height, width); a convolution's weight is [KW, KH, C_in, C_out],
the bytes of PyTorch's (C_out, C_in, KH, KW).
"""

from __future__ import annotations

import math

import numpy as np

from rlkit.core import ops, runtime
from rlkit.core.checks import positive_int
from rlkit.core.nn.layers import ACTIVATIONS, INITIALISERS, Linear, Module, Sequential
from rlkit.core.tensor import Tensor, param


def _pair(value, what: str, minimum: int = 1) -> tuple[int, int]:
    """``value`` (an int or an (height, width) pair) as (height, width), each at least ``minimum``."""
    pair = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    if len(pair) != 2 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= minimum
                                 for v in pair):
        raise ValueError(f"{what} must be an int or an (height, width) pair of ints >= {minimum}, got {value!r}")
    return int(pair[0]), int(pair[1])


def conv_output_size(size: int, kernel: int, stride: int = 1, padding: int = 0, dilation: int = 1) -> int:
    """The output length along one axis of a convolution or pooling (PyTorch's formula); 0 or
    less where the kernel does not fit the padded input."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def _image_shape(layer: str, observation_shape) -> tuple[int, int, int]:
    """``observation_shape`` as channel-first (C, H, W), checked."""
    shape = tuple(int(n) for n in observation_shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"{layer}: observation_shape must be a channel-first image (C, H, W) with every size "
                         f">= 1, got {tuple(observation_shape)}")
    return shape  # type: ignore[return-value]


class Conv2d(Module):
    """A 2-D convolution, as PyTorch's nn.Conv2d: y = conv(x, W) + b on [W, H, C_in, N] images,
    W [KW, KH, C_in, C_out], b [C_out, 1]. ``kernel_size``, ``stride``, ``padding`` and
    ``dilation`` are ints or (height, width) pairs. ``init`` "fan_in_uniform" is PyTorch's
    default (W and b uniform in +-1/sqrt(C_in KH KW)); "orthogonal", "glorot_uniform" and "he"
    are as Linear's, over the fan-in C_in KH KW; ``gain`` scales them. ``activation`` (one of
    nn.ACTIVATIONS, or None) is applied to the result."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 bias: bool = True, init: str = "fan_in_uniform", gain: float = 1.0, activation: str | None = None):
        super().__init__()
        self.in_channels = positive_int(in_channels, "Conv2d: in_channels")
        self.out_channels = positive_int(out_channels, "Conv2d: out_channels")
        self.kernel_size = _pair(kernel_size, "Conv2d: kernel_size")
        self.stride = _pair(stride, "Conv2d: stride")
        self.padding = _pair(padding, "Conv2d: padding", minimum=0)
        self.dilation = _pair(dilation, "Conv2d: dilation")
        if init not in INITIALISERS:
            raise ValueError(f"Conv2d: unknown init {init!r}; expected one of {sorted(INITIALISERS)}")
        if activation is not None and activation not in ACTIVATIONS:
            raise ValueError(f"Conv2d: unknown activation {activation!r}; expected one of {sorted(ACTIVATIONS)}")
        self.activation = activation
        kh, kw = self.kernel_size
        fan_in = self.in_channels * kh * kw
        rng = runtime.host_rng()
        weight = INITIALISERS[init](self.out_channels, fan_in, float(gain), rng)  # [C_out, C_in KH KW]
        # PyTorch's (C_out, C_in, KH, KW) in C order is rlkit's [KW, KH, C_in, C_out]
        self.W = param(weight.reshape(self.out_channels, self.in_channels, kh, kw).T)  # [KW, KH, C_in, C_out]
        bias_values = np.zeros((self.out_channels, 1))
        if init == "fan_in_uniform":
            bound = gain / math.sqrt(fan_in)
            bias_values = rng.uniform(-bound, bound, size=(self.out_channels, 1))
        self.b = param(bias_values) if bias else None  # [C_out, 1]

    def output_shape(self, height: int, width: int) -> tuple[int, int]:
        """(H', W') of the result for an input of ``height`` x ``width``."""
        return tuple(conv_output_size(n, k, s, p, d) for n, k, s, p, d in  # type: ignore[return-value]
                     zip((height, width), self.kernel_size, self.stride, self.padding, self.dilation))

    def forward(self, x: Tensor) -> Tensor:
        x = ops.as_tensor(x, op="Conv2d")
        fused = self.activation in ops.LINEAR_ACTIVATIONS  # one kernel: convolution, bias, activation
        y = ops.conv2d(x, self.W, self.b, stride=self.stride, padding=self.padding, dilation=self.dilation,
                       activation=self.activation if fused else None)  # [W', H', C_out, N]
        return ACTIVATIONS[self.activation](y) if self.activation and not fused else y

    def extra_repr(self) -> str:
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0, 0):
            text += f", padding={self.padding}"
        if self.dilation != (1, 1):
            text += f", dilation={self.dilation}"
        return text + (f", activation={self.activation!r}" if self.activation else "")


class MaxPool2d(Module):
    """2-D max pooling, as PyTorch's nn.MaxPool2d (``stride`` defaults to ``kernel_size``;
    padding counts as -inf). The gradient goes to the first maximum of each window."""

    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        self.kernel_size = _pair(kernel_size, "MaxPool2d: kernel_size")
        self.stride = self.kernel_size if stride is None else _pair(stride, "MaxPool2d: stride")
        self.padding = _pair(padding, "MaxPool2d: padding", minimum=0)

    def output_shape(self, height: int, width: int) -> tuple[int, int]:
        """(H', W') of the result for an input of ``height`` x ``width``."""
        return tuple(conv_output_size(n, k, s, p) for n, k, s, p in  # type: ignore[return-value]
                     zip((height, width), self.kernel_size, self.stride, self.padding))

    def forward(self, x: Tensor) -> Tensor:
        return ops.max_pool2d(x, self.kernel_size, self.stride, self.padding)  # [W', H', C, N]

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class Flatten(Module):
    """[W, H, C, N] (or any shape whose last dim is the batch) to [W H C, N]: PyTorch's
    flatten of (N, C, H, W), feature for feature."""

    def forward(self, x: Tensor) -> Tensor:
        x = ops.as_tensor(x, op="Flatten")
        batch = x.shape[-1]
        return ops.reshape(x, (x.numel // batch, batch))  # [W H C, N]


class ScaleImages(Module):
    """Images to float on the device, scaled by ``scale`` (1/255 for bytes in [0, 255], SB3's
    ``normalize_images``): bytes travel and are stored as bytes, the network sees [0, 1]."""

    def __init__(self, scale: float = 1.0 / 255.0):
        super().__init__()
        self.scale = float(scale)

    def forward(self, x: Tensor) -> Tensor:
        x = ops.as_tensor(x, op="ScaleImages")
        dtype = runtime.dtype()
        if x.dtype in ("u8", "i32") and dtype in ("f32", "f64"):
            return ops.cast(x, dtype, scale=self.scale)  # [W, H, C, N]: one pass, the bits of cast then scale
        floats = ops.cast(x, dtype) if x.dtype in ("u8", "i32") else x  # [W, H, C, N]
        return ops.scale(floats, self.scale) if self.scale != 1.0 else floats

    def extra_repr(self) -> str:
        return f"scale={self.scale:.6g}"


NATURE_CONV_LAYERS = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
"""NatureCNN's convolutions: (output channels, kernel size, stride) each."""


class NatureCNN(Module):
    """The DQN paper's encoder (Mnih et al., 2015), as SB3's NatureCNN: 32 filters 8x8 stride 4,
    64 4x4 stride 2, 64 3x3 stride 1, each followed by ReLU, then Linear to ``features_dim`` and
    ReLU. ``conv_layers`` replaces the convolutions ((channels, kernel, stride) triples; e.g.
    MinAtar's ``((16, 3, 1),)``). Input [W, H, C, N] for a channel-first ``observation_shape``
    (C, H, W); bytes in [0, 255] are scaled to [0, 1] first where ``normalize_images``. Output
    [features_dim, N]."""

    def __init__(self, observation_shape, features_dim: int = 512, normalize_images: bool = True,
                 conv_layers=NATURE_CONV_LAYERS):
        super().__init__()
        channels, height, width = _image_shape("NatureCNN", observation_shape)
        self.features_dim = positive_int(features_dim, "NatureCNN: features_dim")
        self.normalize_images = bool(normalize_images)
        convs, size = [], (height, width)
        for layer in _conv_layers(conv_layers):
            out_channels, kernel, stride = layer
            convs.append(Conv2d(channels, out_channels, kernel, stride=stride, activation="relu"))
            size = convs[-1].output_shape(*size)
            if min(size) < 1:
                raise ValueError(f"NatureCNN: an observation of {height} x {width} (H x W) is too small for the "
                                 f"convolutions {tuple(conv_layers)} ((channels, kernel, stride) each); pass "
                                 "smaller conv_layers (MinAtar's: ((16, 3, 1),)) or use ImpalaCNN")
            channels = out_channels
        self.cnn = Sequential(*([ScaleImages()] if normalize_images else []), *convs, Flatten())
        self.linear = Linear(channels * size[0] * size[1], self.features_dim, activation="relu",
                             init="fan_in_uniform")

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(self.cnn(x))  # [features_dim, N]

    def extra_repr(self) -> str:
        return f"features_dim={self.features_dim}"


def _conv_layers(conv_layers) -> list[tuple[int, int, int]]:
    """``conv_layers`` as (channels, kernel, stride) triples of positive ints, at least one."""
    try:
        layers = [tuple(layer) for layer in conv_layers]
    except TypeError:
        layers = []
    if not layers or not all(len(layer) == 3 and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                                                     and v >= 1 for v in layer) for layer in layers):
        raise ValueError("NatureCNN: conv_layers must be one or more (channels, kernel, stride) triples of ints "
                         f">= 1, got {conv_layers!r}")
    return [tuple(int(v) for v in layer) for layer in layers]  # type: ignore[misc]


class ResidualBlock(Module):
    """x + conv(relu(conv(relu(x)))), both convolutions 3x3 with padding 1 (IMPALA's block)."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = Conv2d(channels, channels, 3, padding=1)
        self.conv1 = Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        y = self.conv1(ops.relu(self.conv0(ops.relu(x))))  # [W, H, C, N]
        return ops.add(x, y)


class ImpalaCNN(Module):
    """The IMPALA encoder (Espeholt et al., 2018): for each of ``channels`` a 3x3 convolution
    (padding 1), a 3x3 max pool of stride 2 (padding 1) and two residual blocks; then ReLU,
    Linear to ``features_dim`` and ReLU. Input [W, H, C, N] for a channel-first
    ``observation_shape`` (C, H, W); output [features_dim, N]."""

    def __init__(self, observation_shape, features_dim: int = 256, channels: tuple[int, ...] = (16, 32, 32),
                 normalize_images: bool = True):
        super().__init__()
        in_channels, height, width = _image_shape("ImpalaCNN", observation_shape)
        self.features_dim = positive_int(features_dim, "ImpalaCNN: features_dim")
        if not channels:
            raise ValueError("ImpalaCNN: channels must name at least one stage's channel count")
        layers: list[Module] = [ScaleImages()] if normalize_images else []
        size = (height, width)
        for out_channels in channels:
            pool = MaxPool2d(3, stride=2, padding=1)
            layers += [Conv2d(in_channels, positive_int(out_channels, "ImpalaCNN: channels"), 3, padding=1), pool,
                       ResidualBlock(out_channels), ResidualBlock(out_channels)]
            size = pool.output_shape(*size)
            in_channels = out_channels
        self.cnn = Sequential(*layers)
        self.flatten = Flatten()
        self.linear = Linear(in_channels * size[0] * size[1], self.features_dim, activation="relu",
                             init="fan_in_uniform")

    def forward(self, x: Tensor) -> Tensor:
        features = ops.relu(self.cnn(x))  # [W', H', C', N]
        return self.linear(self.flatten(features))  # [features_dim, N]

    def extra_repr(self) -> str:
        return f"features_dim={self.features_dim}"
