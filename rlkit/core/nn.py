"""Modules: layers with named parameters, train/eval modes and state dicts.

Inputs are column-major ``[features, batch]``. A module registers the parameters, buffers
(non-trained state such as running statistics) and sub-modules assigned to its attributes, in
assignment order; ``parameters()`` returns them as an ordered ``{dotted name: param}`` and
each parameter's ``name`` is that dotted name, so ``grads["0.W"]`` finds it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np

from rlkit.core import _runtime, ops
from rlkit.core._checks import positive_int
from rlkit.core.tensor import _NUMPY_DTYPES, Tensor, param, tensor


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
            target._impl.write(np.asfortranarray(value, dtype=_NUMPY_DTYPES[target.dtype]))

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
    if x.shape[0] != n:
        raise ValueError(f"{layer}: input has {x.shape[0]} features (rows), expected {n}; shape {x.shape}")


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
            bias_values = _runtime.host_rng().uniform(-bound, bound, size=(self.out_features, 1))
        self.b = param(bias_values) if bias else None  # [out, 1]

    def _initial_weight(self, init, gain: float) -> np.ndarray:
        shape = (self.out_features, self.in_features)
        if isinstance(init, str):
            if init not in INITIALISERS:
                raise ValueError(f"Linear: unknown init {init!r}; expected one of {sorted(INITIALISERS)}")
            return INITIALISERS[init](*shape, float(gain), _runtime.host_rng())
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
        self.W = param(_runtime.host_rng().uniform(-limit, limit, size=(dim, vocab_size)))  # [dim, vocab]

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
        rng = _runtime.host_rng()
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


class _RecurrentBlock(Module):
    """What the recurrent blocks share: tokens in columns, x [d_model, seq, batch] (or
    [d_model, seq]), a state carried between calls (``initial_state`` gives the zeros a sequence
    starts from) and ``step``, one token at a time for acting."""

    d_model: int

    state_type: type  # the NamedTuple of the state's tensors

    def _state_shapes(self, batch_size: int) -> tuple[tuple[int, ...], ...]:
        """The shape of each state tensor, in state_type's field order."""
        raise NotImplementedError

    def initial_state(self, batch_size: int = 1):
        """Zeros: the state before a sequence's first token."""
        batch_size = positive_int(batch_size, f"{type(self).__name__}.initial_state: batch_size")
        like = next(iter(self.parameters().values()))
        return self.state_type(*[ops.full(shape, 0.0, dtype=like.dtype, device=like.device)
                                 for shape in self._state_shapes(batch_size)])

    def _sequence_and_state(self, x, state) -> tuple[Tensor, tuple, int, int]:
        """x as [d_model, seq, batch], the state (zeros for None, else checked), seq and batch."""
        layer = type(self).__name__
        x = ops.as_tensor(x, op=layer)
        _check_rows(layer, x, self.d_model)
        if x.ndim == 2:
            x = ops.reshape(x, (self.d_model, x.shape[1], 1))
        if x.ndim != 3:
            raise ValueError(f"{layer}: x must be [d_model, seq] or [d_model, seq, batch], got {x.shape}")
        seq, batch = x.shape[1], x.shape[2]
        if state is None:
            return x, self.initial_state(batch), seq, batch
        if type(state) is not self.state_type:
            raise TypeError(f"{layer}: state must be a {self.state_type.__name__} (see initial_state), "
                            f"got {type(state).__name__}")
        for name, have, want in zip(self.state_type._fields, state, self._state_shapes(batch)):
            if tuple(have.shape) + (1,) * (len(want) - len(have.shape)) != want:
                raise ValueError(f"{layer}: state.{name} has shape {have.shape}, expected {want} for batch {batch}")
        return x, state, seq, batch

    def step(self, x_t, state):
        """One token per sequence, x_t [d_model, batch] -> (y_t [d_model, batch], new state)."""
        layer = f"{type(self).__name__}.step"
        x_t = ops.as_tensor(x_t, op=layer)
        _check_rows(layer, x_t, self.d_model)
        batch = x_t.shape[1] if x_t.ndim > 1 else 1
        y, state = self.forward(ops.reshape(x_t, (self.d_model, 1, batch)), state)
        return ops.reshape(y, (self.d_model, batch)), state


class MambaState(NamedTuple):
    """The recurrent state a MambaBlock carries between calls: the last d_conv - 1 inputs of
    its convolution [d_conv - 1, d_inner, batch] and the scan's state
    [d_state, head_dim, n_heads, batch]."""

    conv: Tensor
    ssm: Tensor


class MambaBlock(_RecurrentBlock):
    """A Mamba block over tokens in columns, x [d_model, seq, batch] (or [d_model, seq]):
    input projection to the inner width and the gate z, causal depthwise convolution with SiLU,
    selective projections of dt (per head), B and C (per group) from the convolved sequence, the
    selective scan (one decay rate per head, Mamba-2's), a per-channel skip D, the gate
    y * silu(z) and the output projection back to d_model.

    ``forward(x, state=None)`` returns ``(y [d_model, seq, batch], new_state)`` as PyTorch's
    recurrent modules do; ``state`` None starts from zeros. ``step(x_t, state)`` runs one token
    x_t [d_model, batch] for acting; carrying the state through steps gives the same outputs as
    the whole sequence at once.
    """

    def __init__(self, d_model: int, d_state: int, d_conv: int = 4, expand: int = 2, head_dim: int | None = None,
                 n_groups: int = 1, dt_min: float = 0.001, dt_max: float = 0.1):
        super().__init__()
        self.d_model = positive_int(d_model, "MambaBlock: d_model")
        self.d_state = positive_int(d_state, "MambaBlock: d_state")
        self.d_conv = positive_int(d_conv, "MambaBlock: d_conv")
        self.d_inner = positive_int(expand, "MambaBlock: expand") * self.d_model
        self.head_dim = positive_int(min(64, self.d_inner) if head_dim is None else head_dim, "MambaBlock: head_dim")
        self.n_groups = positive_int(n_groups, "MambaBlock: n_groups")
        if self.d_inner % self.head_dim:
            raise ValueError(f"MambaBlock: d_inner = expand * d_model = {self.d_inner} is not a multiple of head_dim = {self.head_dim}")
        self.n_heads = self.d_inner // self.head_dim
        if self.n_heads % self.n_groups:
            raise ValueError(f"MambaBlock: n_heads = {self.n_heads} is not a multiple of n_groups = {self.n_groups}")
        if not 0 < dt_min <= dt_max:
            raise ValueError(f"MambaBlock: expected 0 < dt_min <= dt_max, got {dt_min} and {dt_max}")
        rng = _runtime.host_rng()
        d, n, bc = self.d_inner, self.n_heads, self.n_groups * self.d_state
        self.W_in = param(_fan_in_uniform(2 * d, self.d_model, 1.0, rng))  # [x; z] from the input
        self.conv_weight = param(_fan_in_uniform(self.d_conv, d, 1.0, rng) * math.sqrt(d))  # [d_conv, d_inner], fan-in d_conv
        self.conv_bias = param(rng.uniform(-1, 1, size=(d, 1)) / math.sqrt(self.d_conv))
        self.W_B = param(_fan_in_uniform(bc, d, 1.0, rng))
        self.W_C = param(_fan_in_uniform(bc, d, 1.0, rng))
        self.W_dt = param(_fan_in_uniform(n, d, 1.0, rng))
        # dt starts log-uniform in [dt_min, dt_max] (after softplus), A = -[1, 16], as Mamba does
        dt = np.exp(rng.uniform(math.log(dt_min), math.log(dt_max), size=(n, 1)))
        self.dt_bias = param(dt + np.log(-np.expm1(-dt)))  # the inverse of softplus
        self.A_log = param(np.log(rng.uniform(1.0, 16.0, size=(1, n))))
        self.D = param(np.ones((d, 1)))
        self.W_out = param(_fan_in_uniform(self.d_model, d, 1.0, rng))

    state_type = MambaState

    def _state_shapes(self, batch_size: int) -> tuple[tuple[int, ...], ...]:
        return (self.d_conv - 1, self.d_inner, batch_size), (self.d_state, self.head_dim, self.n_heads, batch_size)

    def forward(self, x, state: MambaState | None = None) -> tuple[Tensor, MambaState]:
        x, state, seq, batch = self._sequence_and_state(x, state)
        d = self.d_inner
        xz = ops.matmul(self.W_in, x)  # [2 d_inner, seq, batch]
        x_in, z = ops.slice_rows(xz, 0, d), ops.slice_rows(xz, d, d)
        sx = ops.concat_rows(state.conv, ops.transpose(x_in))  # [d_conv - 1 + seq, d_inner, batch], time first
        xc = ops.silu(ops.add(ops.ssm_conv(sx, self.conv_weight), self.conv_bias))  # [d_inner, seq, batch]
        B = ops.reshape(ops.matmul(self.W_B, xc), (self.d_state, self.n_groups, seq, batch))
        C = ops.reshape(ops.matmul(self.W_C, xc), (self.d_state, self.n_groups, seq, batch))
        dt = ops.add(ops.matmul(self.W_dt, xc), self.dt_bias)  # [n_heads, seq, batch], softplus inside the scan
        A = ops.neg(ops.exp(self.A_log))  # [1, n_heads]
        x_heads = ops.reshape(xc, (self.head_dim, self.n_heads, seq, batch))
        y, ssm_state = ops.ssm_scan(state.ssm, x_heads, dt, A, B, C)
        y = ops.add(ops.reshape(y, (d, seq, batch)), ops.mul(xc, self.D))  # [d_inner, seq, batch]
        out = ops.matmul(self.W_out, ops.mul(y, ops.silu(z)))  # [d_model, seq, batch]
        conv_state = ops.slice_rows(sx, seq, self.d_conv - 1)  # the last d_conv - 1 inputs
        return out, MambaState(conv_state, ssm_state)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, d_state={self.d_state}, d_conv={self.d_conv}, d_inner={self.d_inner}, "
                f"head_dim={self.head_dim}, n_heads={self.n_heads}, n_groups={self.n_groups}")


class RWKVState(NamedTuple):
    """The recurrent state an RWKVBlock carries between calls: the last token's normalised input
    to the time mixing and to the channel mixing [d_model, batch] (token shift), and the
    RWKV-7 state [head_size * head_size * n_heads, batch]."""

    time_shift: Tensor
    wkv: Tensor
    channel_shift: Tensor


def _token_shift(x: Tensor, last: Tensor) -> tuple[Tensor, Tensor]:
    """(each token's previous token, the last token) of x [d, seq, batch], the previous of the
    first token being ``last`` [d, batch]."""
    d, seq, batch = x.shape
    by_time = ops.transpose(x)  # [seq, d, batch]
    first = ops.reshape(last, (1, d, batch))
    previous = first if seq == 1 else ops.concat_rows(first, ops.slice_rows(by_time, 0, seq - 1))
    return ops.transpose(previous), ops.reshape(ops.slice_rows(by_time, seq - 1, 1), (d, batch))


class RWKVBlock(_RecurrentBlock):
    """An RWKV-7 block over tokens in columns, x [d_model, seq, batch] (or [d_model, seq]):
    LayerNorm, time mixing (token shift, r, k, v, the decay w = exp(-0.606531 sigmoid(.)) in
    [0.545, 1], the in-context learning rate a, the normalised key kk, the rwkv_wkv7 recurrence
    with a = -kk and b = kk a, a sigmoid gate and the output projection), a residual, then
    LayerNorm, channel mixing (token shift and a squared-ReLU MLP of width 4 d_model) and a
    residual.

    ``forward(x, state=None)`` returns ``(y [d_model, seq, batch], new_state)``; ``step(x_t,
    state)`` runs one token x_t [d_model, batch], carrying the state as the whole sequence does.
    """

    def __init__(self, d_model: int, head_size: int = 64):
        super().__init__()
        self.d_model = positive_int(d_model, "RWKVBlock: d_model")
        self.head_size = min(positive_int(head_size, "RWKVBlock: head_size"), self.d_model)
        if self.d_model % self.head_size:
            raise ValueError(f"RWKVBlock: d_model = {self.d_model} is not a multiple of head_size = {self.head_size}")
        self.n_heads = self.d_model // self.head_size
        rng = _runtime.host_rng()
        d = self.d_model
        self.ln_time = LayerNorm(d)
        for name in ("mu_r", "mu_w", "mu_k", "mu_v", "mu_a", "mu_g"):  # token-shift mixing per channel
            setattr(self, name, param(rng.uniform(0.0, 1.0, size=(d, 1))))
        for name in ("W_r", "W_k", "W_v", "W_g", "W_o"):
            setattr(self, name, param(_fan_in_uniform(d, d, 1.0, rng)))
        self.W_w = param(_fan_in_uniform(d, d, 0.1, rng))
        self.w0 = param(rng.uniform(-2.0, 2.0, size=(d, 1)))  # decays spread over [0.55, 0.95]
        self.W_a = param(_fan_in_uniform(d, d, 0.1, rng))
        self.a0 = param(np.zeros((d, 1)))
        self.k_k = param(np.full((d, 1), 0.85))
        self.k_a = param(np.ones((d, 1)))
        self.ln_channel = LayerNorm(d)
        self.mu_ffn = param(rng.uniform(0.0, 1.0, size=(d, 1)))
        self.W_ffn_in = param(_fan_in_uniform(4 * d, d, 1.0, rng))
        self.W_ffn_out = param(_fan_in_uniform(d, 4 * d, 1.0, rng))

    state_type = RWKVState

    def _state_shapes(self, batch_size: int) -> tuple[tuple[int, ...], ...]:
        return (self.d_model, batch_size), (self.head_size * self.d_model, batch_size), (self.d_model, batch_size)

    def forward(self, x, state: RWKVState | None = None) -> tuple[Tensor, RWKVState]:
        x, state, seq, batch = self._sequence_and_state(x, state)
        d, tokens = self.d_model, seq * batch
        x = ops.reshape(x, (d, tokens))  # sequence b owns columns [b seq, (b + 1) seq), as rwkv_wkv7 reads them
        attention, time_last, wkv = self._time_mixing(self.ln_time(x), state, seq, batch)
        x = ops.add(x, attention)
        ffn, channel_last = self._channel_mixing(self.ln_channel(x), state, seq, batch)
        x = ops.add(x, ffn)
        return ops.reshape(x, (d, seq, batch)), RWKVState(time_last, wkv, channel_last)

    def _time_mixing(self, h: Tensor, state: RWKVState, seq: int, batch: int):
        d, tokens = self.d_model, seq * batch
        previous, last = _token_shift(ops.reshape(h, (d, seq, batch)), state.time_shift)
        delta = ops.sub(ops.reshape(previous, (d, tokens)), h)  # [d, tokens]

        def mixed(mu):
            return ops.add(h, ops.mul(delta, mu))

        r = ops.matmul(self.W_r, mixed(self.mu_r))
        k = ops.matmul(self.W_k, mixed(self.mu_k))
        v = ops.matmul(self.W_v, mixed(self.mu_v))
        w = ops.exp(ops.scale(ops.sigmoid(ops.add(self.w0, ops.matmul(self.W_w, mixed(self.mu_w)))), -0.606531))
        a = ops.sigmoid(ops.add(self.a0, ops.matmul(self.W_a, mixed(self.mu_a))))  # in-context learning rate
        gate = ops.sigmoid(ops.matmul(self.W_g, mixed(self.mu_g)))
        heads = (self.head_size, self.n_heads, tokens)
        kk = ops.reshape(ops.mul(k, self.k_k), heads)
        kk = ops.div(kk, ops.sqrt(ops.add(ops.sum(ops.square(kk), dim=0, keepdim=True), 1e-12)))  # unit per head
        k = ops.mul(k, ops.add(ops.mul(ops.sub(a, 1.0), self.k_a), 1.0))
        y, wkv = ops.rwkv_wkv7(ops.reshape(r, heads), ops.reshape(w, heads), ops.reshape(k, heads),
                               ops.reshape(v, heads), ops.neg(kk), ops.mul(kk, ops.reshape(a, heads)), state.wkv)
        return ops.matmul(self.W_o, ops.mul(y, gate)), last, wkv  # y: [d, tokens]

    def _channel_mixing(self, h: Tensor, state: RWKVState, seq: int, batch: int):
        d, tokens = self.d_model, seq * batch
        previous, last = _token_shift(ops.reshape(h, (d, seq, batch)), state.channel_shift)
        mixed = ops.add(h, ops.mul(ops.sub(ops.reshape(previous, (d, tokens)), h), self.mu_ffn))
        hidden = ops.square(ops.relu(ops.matmul(self.W_ffn_in, mixed)))  # [4 d, tokens]
        return ops.matmul(self.W_ffn_out, hidden), last

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, head_size={self.head_size}, n_heads={self.n_heads}"

