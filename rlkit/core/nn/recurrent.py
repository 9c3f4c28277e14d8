"""The recurrent blocks of rlkit.core.nn: MambaBlock (a selective scan) and RWKVBlock
(RWKV-7). Each takes tokens in columns, x [d_model, seq, batch], carries a state between calls
(a NamedTuple of tensors) and runs one token at a time with ``step`` for acting."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from rlkit.core import ops, recurrences, runtime
from rlkit.core.checks import positive_int
from rlkit.core.nn.layers import LayerNorm, Module, _check_rows, _fan_in_uniform
from rlkit.core.tensor import Tensor, param


class _RecurrentBlock(Module):
    """What the recurrent blocks share: tokens in columns, x [d_model, seq, batch] (or
    [d_model, seq]), a state carried between calls (``initial_state`` gives the zeros a sequence
    starts from) and ``step``, one token at a time for acting."""

    d_model: int

    state_type: type  # the NamedTuple of the state's tensors

    def state_shapes(self, batch_size: int) -> tuple[tuple[int, ...], ...]:
        """The shape of each state tensor, in state_type's field order."""
        raise NotImplementedError

    def initial_state(self, batch_size: int = 1):
        """Zeros: the state before a sequence's first token."""
        batch_size = positive_int(batch_size, f"{type(self).__name__}.initial_state: batch_size")
        like = next(iter(self.parameters().values()))
        return self.state_type(*[ops.full(shape, 0.0, dtype=like.dtype, device=like.device)
                                 for shape in self.state_shapes(batch_size)])

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
        for name, have, want in zip(self.state_type._fields, state, self.state_shapes(batch)):
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

    ``chunk_size`` None scans token by token (the exact recurrence); an int (1 to 64) runs the scan
    in Mamba-2's chunked form with chunks of that many tokens (:func:`rlkit.core.ssm_scan`): matrix
    products in place of the loop over tokens, for long sequences on a GPU.
    """

    def __init__(self, d_model: int, d_state: int, d_conv: int = 4, expand: int = 2, head_dim: int | None = None,
                 n_groups: int = 1, dt_min: float = 0.001, dt_max: float = 0.1, chunk_size: int | None = None):
        super().__init__()
        self.d_model = positive_int(d_model, "MambaBlock: d_model")
        self.d_state = positive_int(d_state, "MambaBlock: d_state")
        self.d_conv = positive_int(d_conv, "MambaBlock: d_conv")
        self.d_inner = positive_int(expand, "MambaBlock: expand") * self.d_model
        self.head_dim = positive_int(min(64, self.d_inner) if head_dim is None else head_dim, "MambaBlock: head_dim")
        self.n_groups = positive_int(n_groups, "MambaBlock: n_groups")
        self.chunk_size = None if chunk_size is None else positive_int(chunk_size, "MambaBlock: chunk_size")
        if self.chunk_size is not None and self.chunk_size > recurrences.SSD_MAX_CHUNK:
            raise ValueError(f"MambaBlock: chunk_size must be at most {recurrences.SSD_MAX_CHUNK}, got {chunk_size}")
        if self.d_inner % self.head_dim:
            raise ValueError(f"MambaBlock: d_inner = expand * d_model = {self.d_inner} is not a multiple of head_dim = {self.head_dim}")
        self.n_heads = self.d_inner // self.head_dim
        if self.n_heads % self.n_groups:
            raise ValueError(f"MambaBlock: n_heads = {self.n_heads} is not a multiple of n_groups = {self.n_groups}")
        if not 0 < dt_min <= dt_max:
            raise ValueError(f"MambaBlock: expected 0 < dt_min <= dt_max, got {dt_min} and {dt_max}")
        rng = runtime.host_rng()
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

    def state_shapes(self, batch_size: int) -> tuple[tuple[int, ...], ...]:
        return (self.d_conv - 1, self.d_inner, batch_size), (self.d_state, self.head_dim, self.n_heads, batch_size)

    def forward(self, x, state: MambaState | None = None) -> tuple[Tensor, MambaState]:
        x, state, seq, batch = self._sequence_and_state(x, state)
        d = self.d_inner
        xz = ops.matmul(self.W_in, x)  # [2 d_inner, seq, batch]
        x_in, z = ops.slice_rows(xz, 0, d), ops.slice_rows(xz, d, d)
        sx = ops.concat_rows(state.conv, ops.transpose(x_in))  # [d_conv - 1 + seq, d_inner, batch], time first
        xc = ops.silu(ops.add(recurrences.ssm_conv(sx, self.conv_weight), self.conv_bias))  # [d_inner, seq, batch]
        B = ops.reshape(ops.matmul(self.W_B, xc), (self.d_state, self.n_groups, seq, batch))
        C = ops.reshape(ops.matmul(self.W_C, xc), (self.d_state, self.n_groups, seq, batch))
        dt = ops.add(ops.matmul(self.W_dt, xc), self.dt_bias)  # [n_heads, seq, batch], softplus inside the scan
        A = ops.neg(ops.exp(self.A_log))  # [1, n_heads]
        x_heads = ops.reshape(xc, (self.head_dim, self.n_heads, seq, batch))
        y, ssm_state = recurrences.ssm_scan(state.ssm, x_heads, dt, A, B, C, chunk_size=self.chunk_size)
        y = ops.add(ops.reshape(y, (d, seq, batch)), ops.mul(xc, self.D))  # [d_inner, seq, batch]
        out = ops.matmul(self.W_out, ops.mul(y, ops.silu(z)))  # [d_model, seq, batch]
        conv_state = ops.slice_rows(sx, seq, self.d_conv - 1)  # the last d_conv - 1 inputs
        return out, MambaState(conv_state, ssm_state)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, d_state={self.d_state}, d_conv={self.d_conv}, d_inner={self.d_inner}, "
                f"head_dim={self.head_dim}, n_heads={self.n_heads}, n_groups={self.n_groups}"
                + (f", chunk_size={self.chunk_size}" if self.chunk_size is not None else ""))


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

    ``chunk_size`` None runs rwkv_wkv7 token by token (the exact recurrence); an int runs its
    chunked form with chunks of that many tokens (:func:`rlkit.core.rwkv_wkv7`).
    """

    def __init__(self, d_model: int, head_size: int = 64, chunk_size: int | None = None):
        super().__init__()
        self.d_model = positive_int(d_model, "RWKVBlock: d_model")
        self.head_size = min(positive_int(head_size, "RWKVBlock: head_size"), self.d_model)
        self.chunk_size = None if chunk_size is None else positive_int(chunk_size, "RWKVBlock: chunk_size")
        if self.d_model % self.head_size:
            raise ValueError(f"RWKVBlock: d_model = {self.d_model} is not a multiple of head_size = {self.head_size}")
        self.n_heads = self.d_model // self.head_size
        rng = runtime.host_rng()
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

    def state_shapes(self, batch_size: int) -> tuple[tuple[int, ...], ...]:
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
        y, wkv = recurrences.rwkv_wkv7(ops.reshape(r, heads), ops.reshape(w, heads), ops.reshape(k, heads),
                               ops.reshape(v, heads), ops.neg(kk), ops.mul(kk, ops.reshape(a, heads)), state.wkv,
                               chunk_size=self.chunk_size)
        return ops.matmul(self.W_o, ops.mul(y, gate)), last, wkv  # y: [d, tokens]

    def _channel_mixing(self, h: Tensor, state: RWKVState, seq: int, batch: int):
        d, tokens = self.d_model, seq * batch
        previous, last = _token_shift(ops.reshape(h, (d, seq, batch)), state.channel_shift)
        mixed = ops.add(h, ops.mul(ops.sub(ops.reshape(previous, (d, tokens)), h), self.mu_ffn))
        hidden = ops.square(ops.relu(ops.matmul(self.W_ffn_in, mixed)))  # [4 d, tokens]
        return ops.matmul(self.W_ffn_out, hidden), last

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, head_size={self.head_size}, n_heads={self.n_heads}"
                + (f", chunk_size={self.chunk_size}" if self.chunk_size is not None else ""))

