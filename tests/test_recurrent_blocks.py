"""The recurrent blocks, nn.MambaBlock and nn.RWKVBlock (each by its recurrence and by its
chunked form): the step-by-step recurrent mode against the whole-sequence pass, states carried
between chunks, causality, gradients against finite differences (float64), the GPU against the
CPU, learning beyond a memoryless map, and bad arguments."""

import numpy as np
import pytest

import rlkit.core as rc
from rlkit.core import nn


BLOCKS = {
    "mamba": lambda: nn.MambaBlock(d_model=6, d_state=4, d_conv=3, expand=2, head_dim=4, n_groups=1),
    "mamba_chunked": lambda: nn.MambaBlock(d_model=6, d_state=4, d_conv=3, expand=2, head_dim=4, n_groups=1, chunk_size=3),
    "rwkv": lambda: nn.RWKVBlock(d_model=6, head_size=3),
    "rwkv_chunked": lambda: nn.RWKVBlock(d_model=6, head_size=3, chunk_size=3),
}


@pytest.fixture(params=sorted(BLOCKS))
def kind(request):
    return request.param


def make_block(kind, seed=0):
    rc.manual_seed(seed)
    return BLOCKS[kind]()


def random_state(block, rng, batch, dtype):
    """A state of the block's shapes with random values (as a previous chunk would leave)."""
    zeros = block.initial_state(batch)
    return type(zeros)(*[rc.tensor(rng.normal(size=t.shape), dtype=dtype) for t in zeros])


def sequence(seed, seq=7, batch=3, d_model=6):
    return np.random.default_rng(seed).normal(size=(d_model, seq, batch)).astype(np.float32)


def test_steps_with_carried_state_match_the_whole_sequence(device, kind):
    block = make_block(kind).to(device)
    x = sequence(1)
    whole, final = block(rc.tensor(x))
    state, outputs = block.initial_state(batch_size=3), []
    for t in range(x.shape[1]):
        y_t, state = block.step(rc.tensor(np.ascontiguousarray(x[:, t, :])), state)
        assert y_t.shape == (6, 3)
        outputs.append(y_t.numpy())
    np.testing.assert_allclose(np.stack(outputs, axis=1), whole.numpy(), rtol=1e-4, atol=1e-5)
    for name, stepped, at_once in zip(final._fields, state, final):
        np.testing.assert_allclose(stepped.numpy(), at_once.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)


def test_chunks_with_carried_state_match_the_whole_sequence(device, kind):
    block = make_block(kind).to(device)
    x = sequence(2, seq=9)
    whole, _ = block(rc.tensor(x))
    first, state = block(rc.tensor(np.ascontiguousarray(x[:, :4])))
    second, _ = block(rc.tensor(np.ascontiguousarray(x[:, 4:])), state)
    np.testing.assert_allclose(np.concatenate([first.numpy(), second.numpy()], axis=1), whole.numpy(), rtol=1e-4, atol=1e-5)


def test_the_output_depends_only_on_the_past(device, kind):
    block = make_block(kind).to(device)
    x = sequence(3)
    changed = x.copy()
    changed[:, 5:] += 1.0  # the future of position 4
    a, _ = block(rc.tensor(x))
    b, _ = block(rc.tensor(changed))
    np.testing.assert_array_equal(a.numpy()[:, :5], b.numpy()[:, :5])
    assert np.abs(a.numpy()[:, 5:] - b.numpy()[:, 5:]).max() > 1e-3


def _loss(block, x, weight, state=None):
    y, new_state = block(x, state)
    return rc.add(rc.sum(rc.mul(y, weight)), rc.sum(new_state[1]))  # and the recurrence's state


def test_gradients_match_finite_differences_in_float64(kind):
    previous = rc.dtype("f64")
    try:
        block = make_block(kind)
        rng = np.random.default_rng(4)
        x = rng.normal(size=(6, 5, 2))
        weight = rc.tensor(rng.normal(size=(6, 5, 2)), dtype="f64")
        start = random_state(block, rng, 2, "f64")
        # the input and the carried state
        assert rc.gradcheck(lambda x, *fields: _loss(block, x, weight, type(start)(*fields)),
                            [x] + [t.numpy() for t in start])
        # every parameter, along a random direction
        params = block.parameters()
        with rc.grad_tape():
            loss = _loss(block, rc.tensor(x, dtype="f64"), weight, start)
        grads = rc.backward(loss)
        values = block.state_dict()
        eps = 1e-6
        for name, p in params.items():
            direction = rng.normal(size=p.shape)

            def loss_at(delta, name=name, direction=direction):
                block.load_state_dict({**values, name: values[name] + delta * direction})
                return float(_loss(block, rc.tensor(x, dtype="f64"), weight, start).numpy().ravel()[0])

            numeric = (loss_at(eps) - loss_at(-eps)) / (2 * eps)
            block.load_state_dict(values)
            analytic = float(np.sum(np.asarray(grads[p]) * direction))
            assert numeric == pytest.approx(analytic, rel=1e-5, abs=1e-7), name
    finally:
        rc.dtype(previous)


@pytest.mark.requires_gpu
def test_gpu_matches_cpu_forward_and_gradients(kind):
    x = sequence(5, seq=12, batch=2)
    weight = np.random.default_rng(6).normal(size=(6, 12, 2)).astype(np.float32)
    results = []
    for device in ("cpu", "gpu"):
        previous = rc.device(device)
        try:
            block = make_block(kind, seed=7)
            with rc.grad_tape():
                loss = _loss(block, rc.tensor(x), rc.tensor(weight))
            grads = rc.backward(loss)
            results.append([loss.numpy()] + [np.asarray(grads[p]) for p in block.parameters().values()])
        finally:
            rc.device(previous)
    for name, a, b in zip(["loss"] + list(make_block(kind).parameters()), *results):
        np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-5 * max(1.0, np.abs(a).max()), err_msg=name)


def exponential_average(x, decay=0.7):
    """y_t = decay y_{t-1} + (1 - decay) x_t along dim 1, from y = 0."""
    y, acc = np.zeros_like(x), np.zeros_like(x[:, 0])
    for t in range(x.shape[1]):
        acc = decay * acc + (1 - decay) * x[:, t]
        y[:, t] = acc
    return y


def test_a_block_learns_what_needs_memory(kind):
    """A linear embedding, the block and a linear readout, trained with Adam, fit an exponential
    moving average of the input far better than the best memoryless map can (a least-squares
    fit of y_t from x_t alone)."""
    rc.manual_seed(1)
    chunk_size = 4 if kind.endswith("_chunked") else None
    block = nn.MambaBlock(d_model=8, d_state=4, d_conv=3, head_dim=4, chunk_size=chunk_size) if kind.startswith("mamba") \
        else nn.RWKVBlock(8, head_size=4, chunk_size=chunk_size)
    embed, readout = nn.Linear(6, 8), nn.Linear(8, 6)
    params = {f"{part}.{name}": p for part, module in (("embed", embed), ("block", block), ("readout", readout))
              for name, p in module.parameters().items()}
    optimizer = rc.optim.Adam(params, lr=0.01)
    rng = np.random.default_rng(8)

    def batch():  # 8 sequences of 10 tokens, tokens in columns: [6, 80]
        x = rng.uniform(-1, 1, size=(6, 10, 8)).astype(np.float32)
        return x.reshape(6, 80, order="F"), exponential_average(x).reshape(6, 80, order="F")

    def loss_of(x, y):
        hidden, _ = block(rc.reshape(embed(rc.tensor(x)), (8, 10, 8)))
        return rc.mean(rc.square(rc.sub(readout(rc.reshape(hidden, (8, 80))), rc.tensor(y))))

    for _ in range(300):
        with rc.grad_tape():
            loss = loss_of(*batch())
        optimizer.step(rc.backward(loss))
    test_x, test_y = batch()
    tokens_x = np.vstack([test_x, np.ones((1, 80))]).T  # [tokens, features + 1]
    fit = np.linalg.lstsq(tokens_x, test_y.T, rcond=None)[0]
    memoryless = float(np.mean((tokens_x @ fit - test_y.T) ** 2))
    learned = float(loss_of(test_x, test_y).numpy().ravel()[0])
    assert learned < 0.2 * memoryless, (learned, memoryless)  # about 0.03 when written


@pytest.mark.parametrize("kwargs, message", [
    (dict(d_model=6, d_state=4, expand=1, head_dim=4), "d_inner = expand \\* d_model = 6 is not a multiple of head_dim = 4"),
    (dict(d_model=8, d_state=4, head_dim=4, n_groups=3), "n_heads = 4 is not a multiple of n_groups = 3"),
    (dict(d_model=0, d_state=4), "d_model must be a positive int"),
    (dict(d_model=4, d_state=4, dt_min=0.1, dt_max=0.01), "0 < dt_min <= dt_max"),
    (dict(d_model=4, d_state=4, chunk_size=0), "chunk_size must be a positive int"),
    (dict(d_model=4, d_state=4, chunk_size=65), "chunk_size must be at most 64, got 65"),
])
def test_bad_mamba_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        nn.MambaBlock(**kwargs)


def test_bad_rwkv_construction():
    with pytest.raises(ValueError, match="d_model = 6 is not a multiple of head_size = 4"):
        nn.RWKVBlock(d_model=6, head_size=4)
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        nn.RWKVBlock(d_model=6, head_size=3, chunk_size=0)


def test_bad_inputs_and_states():
    block = make_block("mamba")
    with pytest.raises(ValueError, match="input has 5 features"):
        block(rc.tensor(np.zeros((5, 3, 2), np.float32)))
    with pytest.raises(TypeError, match="state must be a MambaState"):
        block(rc.tensor(sequence(0)), state=(1, 2))
    wrong = block.initial_state(batch_size=2)
    with pytest.raises(ValueError, match="state.conv has shape \\(2, 12, 2\\), expected \\(2, 12, 3\\) for batch 3"):
        block(rc.tensor(sequence(0)), state=wrong)
    rwkv = make_block("rwkv")
    with pytest.raises(TypeError, match="state must be a RWKVState"):
        rwkv(rc.tensor(sequence(0)), state=block.initial_state(batch_size=3))
    with pytest.raises(ValueError, match="RWKVBlock.step: input has 5 features"):
        rwkv.step(rc.tensor(np.zeros((5, 3), np.float32)), rwkv.initial_state(3))
