"""The module base class, weight initialisers and the layers of rlkit.core.nn: Linear,
Sequential, BatchNorm, LayerNorm, Dropout, Embedding and MultiheadAttention."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator

import numpy as np

from rlkit.core import runtime, ops
from rlkit.core.checks import positive_int
from rlkit.core.tensor import NUMPY_DTYPES, Tensor, param, tensor


class Module:
    """Base class: subclasses set parameters and sub-modules as attributes and define forward."""

    def __init__(self):
        object.__setattr__(self, "_params", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)

    def __setattr__(self, name: str, value) -> None:
        if "_params" not in self.__dict__:
            raise RuntimeError(f"{type(self).__name__}.__init__ must call super().__init__() first")
        for registry in (self._params, self._buffers, self._modules):
            registry.pop(name, None)
        if isinstance(value, Module):
            self._modules[name] = value
            for child_name, p in value.named_parameters():
                p.name = f"{name}.{child_name}"
        elif isinstance(value, Tensor) and value.requires_grad:
            self._params[name] = value
            value.name = name
        object.__setattr__(self, name, value)

    def register_buffer(self, name: str, value: Tensor) -> None:
        """Registers non-trained state (saved in state_dict, not returned by parameters())."""
        self._buffers[name] = value
        object.__setattr__(self, name, value)

    def forward(self, *args, **kwargs):
        """The computation; subclasses define it."""
        raise NotImplementedError(f"{type(self).__name__} does not define forward")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        """(dotted name, parameter) pairs in registration order, sub-modules included."""
        for name, p in self._params.items():
            yield prefix + name, p
        for name, child in self._modules.items():
            yield from child.named_parameters(f"{prefix}{name}.")

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        """(dotted name, buffer) pairs in registration order, sub-modules included."""
        for name, b in self._buffers.items():
            yield prefix + name, b
        for name, child in self._modules.items():
            yield from child.named_buffers(f"{prefix}{name}.")

    def parameters(self) -> dict[str, Tensor]:
        """Ordered ``{dotted name: parameter}``."""
        return dict(self.named_parameters())

    def modules(self) -> Iterator["Module"]:
        """This module and every sub-module, depth first."""
        yield self
        for child in self._modules.values():
            yield from child.modules()

    def to(self, device: str) -> "Module":
        """Moves every parameter and buffer to ``device`` in place (the same Python objects, so
        names and references stay valid). Move a model before making its optimizer."""
        for _, t in list(self.named_parameters()) + list(self.named_buffers()):
            if t.device != device:
                t._impl = t.to(device)._impl
                t._grad = None
        return self

    def train(self, mode: bool = True) -> "Module":
        """Training mode (dropout active, batch norm on batch statistics) for every sub-module."""
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self) -> "Module":
        """Evaluation mode for every sub-module."""
        return self.train(False)

    def state_dict(self) -> dict[str, np.ndarray]:
        """Ordered ``{dotted name: array}`` of parameters and buffers (copies)."""
        state = {name: p.numpy() for name, p in self.named_parameters()}
        state.update({name: b.numpy() for name, b in self.named_buffers()})
        return state

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Writes arrays into the parameters and buffers in place (optimizers keep working).

        Raises KeyError naming missing (and, when strict, unexpected) entries and ValueError
        naming a mis-shaped one; nothing is written unless every entry checks out.
        """
        targets = dict(self.named_parameters())
        targets.update(self.named_buffers())
        missing = [name for name in targets if name not in state]
        unexpected = [name for name in state if name not in targets]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing entries {missing}, unexpected entries {unexpected}")
        checked = []
        for name, target in targets.items():
            if name not in state:
                continue
            value = np.asarray(state[name])
            shape = tuple(value.shape) + (1,) * (len(target.shape) - value.ndim)
            if shape != target.shape:
                raise ValueError(f"load_state_dict: {name!r} has shape {value.shape}, the module expects {target.shape}")
            checked.append((target, value))
        for target, value in checked:
            target._impl.write(np.asfortranarray(value, dtype=NUMPY_DTYPES[target.dtype]))

    def extra_repr(self) -> str:
        """The settings shown by repr."""
        return ""

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, child in self._modules.items():
            lines.append(f"  ({name}): " + repr(child).replace("\n", "\n  "))
        return lines[0] + ")" if len(lines) == 1 else "\n".join(lines) + "\n)"


# ---- initialisers ------------------------------------------------------------------------

def _glorot_uniform(n_out: int, n_in: int, gain: float, rng) -> np.ndarray:
    limit = gain * math.sqrt(6.0 / (n_in + n_out))
    return rng.uniform(-limit, limit, size=(n_out, n_in))


def _he_normal(n_out: int, n_in: int, gain: float, rng) -> np.ndarray:
    return rng.standard_normal((n_out, n_in)) * gain * math.sqrt(2.0 / n_in)


def _orthogonal(n_out: int, n_in: int, gain: float, rng) -> np.ndarray:
    """A Haar-random (semi-)orthogonal matrix: QR of a Gaussian, signs fixed by diag(R)."""
    a = rng.standard_normal((max(n_out, n_in), min(n_out, n_in)))
    q, r = np.linalg.qr(a)
    q *= np.sign(np.diag(r))
    return gain * (q if n_out >= n_in else q.T)


def _fan_in_uniform(n_out: int, n_in: int, gain: float, rng) -> np.ndarray:
    """PyTorch's default for nn.Linear: U(-1/sqrt(in), 1/sqrt(in)) (its bias too)."""
    bound = gain / math.sqrt(n_in)
    return rng.uniform(-bound, bound, size=(n_out, n_in))


INITIALISERS: dict[str, Callable] = {"glorot_uniform": _glorot_uniform, "he": _he_normal, "orthogonal": _orthogonal,
                                     "fan_in_uniform": _fan_in_uniform}

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": ops.relu, "sigmoid": ops.sigmoid, "tanh": ops.tanh, "softmax": ops.softmax,
    "log_softmax": ops.log_softmax, "silu": ops.silu, "softplus": ops.softplus,
}


def _check_rows(layer: str, x: Tensor, n: int) -> None:
    """``x`` has ``n`` features (rows). A 2-D batch of the wrong height whose width is ``n`` is
    most likely a row-major (batch, features) array given where [features, batch] is expected:
    the error says so and how to fix it."""
    if x.shape[0] == n:
        return
    hint = ""
    if len(x.shape) == 2 and x.shape[1] == n:
        hint = (f"; it looks like a row-major (batch, features) array: rlkit tensors are column-major "
                f"[features, batch], transpose it (x.T) to get [{n}, {x.shape[0]}]")
    raise ValueError(f"{layer}: input has {x.shape[0]} features (rows), expected {n}; shape {x.shape}{hint}")


# ---- layers ------------------------------------------------------------------------------

class Linear(Module):
    """y = activation(W x + b) with W [out, in] and b [out, 1].

    ``init`` is "glorot_uniform", "orthogonal", "he" (normal, std sqrt(2 / in)),
    "fan_in_uniform" (PyTorch's default: W and b uniform in +-1/sqrt(in)), a function
    (out, in) -> array, or an array; ``gain`` scales the named initialisers.
    """

    def __init__(self, in_features: int, out_features: int, activation: str | None = None,
                 init="glorot_uniform", gain: float = 1.0, bias: bool = True):
        super().__init__()
        self.in_features = positive_int(in_features, "Linear: in_features")
        self.out_features = positive_int(out_features, "Linear: out_features")
        if activation is not None and activation not in ACTIVATIONS:
            raise ValueError(f"Linear: unknown activation {activation!r}; expected one of {sorted(ACTIVATIONS)}")
        self.activation = activation
        self.W = param(self._initial_weight(init, gain))  # [out, in]
        bias_values = np.zeros((self.out_features, 1))
        if isinstance(init, str) and init == "fan_in_uniform":
            bound = gain / math.sqrt(self.in_features)
            bias_values = runtime.host_rng().uniform(-bound, bound, size=(self.out_features, 1))
        self.b = param(bias_values) if bias else None  # [out, 1]

    def _initial_weight(self, init, gain: float) -> np.ndarray:
        shape = (self.out_features, self.in_features)
        if isinstance(init, str):
            if init not in INITIALISERS:
                raise ValueError(f"Linear: unknown init {init!r}; expected one of {sorted(INITIALISERS)}")
            return INITIALISERS[init](*shape, float(gain), runtime.host_rng())
        weight = np.asarray(init(*shape) if callable(init) else init, dtype=np.float64)
        if weight.shape != shape:
            raise ValueError(f"Linear: the initial weight has shape {weight.shape}, expected {shape}")
        return weight

    def forward(self, x: Tensor) -> Tensor:
        x = ops.as_tensor(x, op="Linear")
        _check_rows("Linear", x, self.in_features)
        if self.b is not None and self.activation in ops.LINEAR_ACTIVATIONS:
            return ops.linear(self.W, x, self.b, self.activation)  # one kernel: product, bias, activation
        y = ops.matmul(self.W, x)  # [out, batch]
        if self.b is not None:
            y = ops.add(y, self.b)
        return ACTIVATIONS[self.activation](y) if self.activation else y

    def extra_repr(self) -> str:
        act = f", activation={self.activation!r}" if self.activation else ""
        return f"{self.in_features}, {self.out_features}{act}"


class Sequential(Module):
    """Applies its layers in order; they are named "0", "1", ..."""

    def __init__(self, *layers: Module):
        super().__init__()
        if len(layers) == 1 and isinstance(layers[0], (list, tuple)):
            layers = tuple(layers[0])
        for i, layer in enumerate(layers):
            if not isinstance(layer, Module):
                raise TypeError(f"Sequential: layer {i} is a {type(layer).__name__}, expected a Module")
            setattr(self, str(i), layer)

    def __len__(self) -> int:
        return len(self._modules)

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]

    def forward(self, x):
        for layer in self._modules.values():
            x = layer(x)
        return x


class BatchNorm(Module):
    """Normalises each feature (row) over the batch; in eval mode uses running statistics
    updated with ``momentum`` (new = (1 - momentum) old + momentum batch; the running
    variance is the unbiased batch variance, as in PyTorch)."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__()
        self.num_features = positive_int(num_features, "BatchNorm: num_features")
        if not eps > 0:
            raise ValueError(f"BatchNorm: eps must be positive, got {eps!r}")
        if not 0 <= momentum <= 1:
            raise ValueError(f"BatchNorm: momentum must lie in [0, 1], got {momentum!r}")
        self.eps, self.momentum = float(eps), float(momentum)
        self.gamma = param(np.ones((num_features, 1)))  # [F, 1]
        self.beta = param(np.zeros((num_features, 1)))  # [F, 1]
        self.register_buffer("running_mean", tensor(np.zeros((num_features, 1))))
        self.register_buffer("running_var", tensor(np.ones((num_features, 1))))

    def forward(self, x: Tensor) -> Tensor:
        x = ops.as_tensor(x, op="BatchNorm")
        _check_rows("BatchNorm", x, self.num_features)
        if self.training:
            n = x.shape[1]
            if n < 2:
                raise ValueError("BatchNorm: training needs a batch of at least 2 columns")
            mean = ops.mean(x, dim=1)  # [F, 1]
            centered = ops.sub(x, mean)  # [F, batch]
            var = ops.mean(ops.square(centered), dim=1)  # [F, 1], biased
            self._update_running(mean, var, n)
        else:
            centered = ops.sub(x, self.running_mean)
            var = self.running_var
        normalised = ops.div(centered, ops.sqrt(ops.add(var, self.eps)))
        return ops.add(ops.mul(normalised, self.gamma), self.beta)

    def _update_running(self, mean: Tensor, var: Tensor, n: int) -> None:
        m = self.momentum
        unbiased = ops.scale(ops.stop_gradient(var), n / (n - 1))
        self.register_buffer("running_mean", ops.add(ops.scale(self.running_mean, 1 - m),
                                                     ops.scale(ops.stop_gradient(mean), m)))
        self.register_buffer("running_var", ops.add(ops.scale(self.running_var, 1 - m), ops.scale(unbiased, m)))

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"


class LayerNorm(Module):
    """Normalises each example (column) over its features; the same in train and eval."""

    def __init__(self, normalized_shape: int, eps: float = 1e-5, affine: bool = True):
        super().__init__()
        self.normalized_shape = positive_int(normalized_shape, "LayerNorm: normalized_shape")
        if not eps > 0:
            raise ValueError(f"LayerNorm: eps must be positive, got {eps!r}")
        self.eps = float(eps)
        self.affine = bool(affine)
        if self.affine:
            self.gamma = param(np.ones((normalized_shape, 1)))  # [F, 1]
            self.beta = param(np.zeros((normalized_shape, 1)))  # [F, 1]

    def forward(self, x: Tensor) -> Tensor:
        x = ops.as_tensor(x, op="LayerNorm")
        _check_rows("LayerNorm", x, self.normalized_shape)
        centered = ops.sub(x, ops.mean(x, dim=0, keepdim=True))  # [F, batch, ...]
        var = ops.mean(ops.square(centered), dim=0, keepdim=True)  # [1, batch, ...]
        y = ops.div(centered, ops.sqrt(ops.add(var, self.eps)))
        return ops.add(ops.mul(y, self.gamma), self.beta) if self.affine else y

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, affine={self.affine}"


class Dropout(Module):
    """Inverted dropout: zeroes each element with probability ``rate`` and scales the rest by
    1 / (1 - rate) in training; the identity in eval mode."""

    def __init__(self, rate: float):
        super().__init__()
        if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not 0 <= rate < 1:
            raise ValueError(f"Dropout: rate must lie in [0, 1), got {rate!r}")
        self.rate = float(rate)

    def forward(self, x: Tensor) -> Tensor:
        x = ops.as_tensor(x, op="Dropout")
        if not self.training or self.rate == 0:
            return x
        keep = ops.ge(ops.rand(x.shape, dtype=x.dtype, device=x.device), self.rate)  # 1 with probability 1 - rate
        return ops.mul(x, ops.scale(keep, 1.0 / (1.0 - self.rate)))

    def extra_repr(self) -> str:
        return f"rate={self.rate}"


class Embedding(Module):
    """Looks up columns of W [dim, vocab] by 0-based index: [dim, len(index)]."""

    def __init__(self, vocab_size: int, dim: int):
        super().__init__()
        self.vocab_size = positive_int(vocab_size, "Embedding: vocab_size")
        self.dim = positive_int(dim, "Embedding: dim")
        limit = math.sqrt(1.0 / vocab_size)
        self.W = param(runtime.host_rng().uniform(-limit, limit, size=(dim, vocab_size)))  # [dim, vocab]

    def forward(self, index) -> Tensor:
        return ops.get_rows(self.W, index)

    def extra_repr(self) -> str:
        return f"{self.vocab_size}, {self.dim}"


class MultiheadAttention(Module):
    """Scaled dot-product attention over tokens in columns: x [d_model, seq] or
    [d_model, seq, batch]. ``forward(q, k=q, v=k, causal=False)``; with ``causal`` a query
    attends to keys at its own position and before."""

    def __init__(self, d_model: int, n_heads: int, bias: bool = True):
        super().__init__()
        self.d_model = positive_int(d_model, "MultiheadAttention: d_model")
        self.n_heads = positive_int(n_heads, "MultiheadAttention: n_heads")
        if d_model % n_heads:
            raise ValueError(f"MultiheadAttention: d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.head_dim = d_model // n_heads
        rng = runtime.host_rng()
        for name in ("W_q", "W_k", "W_v", "W_o"):
            setattr(self, name, param(_glorot_uniform(d_model, d_model, 1.0, rng)))  # [d, d]
        self.b_o = param(np.zeros((d_model, 1))) if bias else None

    def forward(self, q, k=None, v=None, causal: bool = False) -> Tensor:
        q = ops.as_tensor(q, op="MultiheadAttention")
        k = q if k is None else ops.as_tensor(k, op="MultiheadAttention")
        v = k if v is None else ops.as_tensor(v, op="MultiheadAttention")
        for name, t in (("q", q), ("k", k), ("v", v)):
            _check_rows(f"MultiheadAttention ({name})", t, self.d_model)
        if k.shape[1:] != v.shape[1:]:
            raise ValueError(f"MultiheadAttention: k {k.shape} and v {v.shape} must have the same tokens")
        Q, K, V = ops.matmul(self.W_q, q), ops.matmul(self.W_k, k), ops.matmul(self.W_v, v)  # [d, seq, (batch)]
        mask = self._causal_mask(K.shape[1], Q.shape[1], q.dtype, q.device) if causal else None
        heads = []
        for h in range(self.n_heads):
            rows = (h * self.head_dim, self.head_dim)
            Qh, Kh, Vh = (ops.slice_rows(t, *rows) for t in (Q, K, V))  # [dk, seq, (batch)]
            scores = ops.scale(ops.matmul(Kh, Qh, transpose_a=True), 1.0 / math.sqrt(self.head_dim))  # [seq_k, seq_q]
            if mask is not None:
                scores = ops.add(scores, mask)
            heads.append(ops.matmul(Vh, ops.softmax(scores)))  # [dk, seq_q, (batch)]
        out = heads[0]
        for head in heads[1:]:
            out = ops.concat_rows(out, head)  # [d, seq_q, (batch)]
        out = ops.matmul(self.W_o, out)
        return ops.add(out, self.b_o) if self.b_o is not None else out

    @staticmethod
    def _causal_mask(n_keys: int, n_queries: int, dtype: str, device: str) -> Tensor:
        """0 where key i may be seen by query j (i <= j), -inf elsewhere: [keys, queries]."""
        keys, queries = np.arange(n_keys)[:, None], np.arange(n_queries)[None, :]
        return tensor(np.where(keys <= queries, 0.0, -np.inf), dtype=dtype, device=device)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}"
