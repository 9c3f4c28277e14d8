"""nn.MambaBlock: the step-by-step recurrent mode against the whole-sequence pass, states carried
between chunks, gradients against finite differences (float64), the GPU against the CPU, and
bad arguments."""

import numpy as np
import pytest

import rlkit.core as rc
from rlkit.core import nn

from conftest import DEVICES


def make_block(seed=0, **kw):
    rc.manual_seed(seed)
    return nn.MambaBlock(d_model=6, d_state=4, d_conv=3, expand=2, head_dim=4, n_groups=1, **kw)


def sequence(seed, seq=7, batch=3, d_model=6):
    return np.random.default_rng(seed).normal(size=(d_model, seq, batch)).astype(np.float32)


def test_steps_with_carried_state_match_the_whole_sequence(device):
    block = make_block().to(device)
    x = sequence(1)
    whole, final = block(rc.tensor(x))
    state, outputs = block.initial_state(batch_size=3), []
    for t in range(x.shape[1]):
        y_t, state = block.step(rc.tensor(np.ascontiguousarray(x[:, t, :])), state)
        assert y_t.shape == (6, 3)
        outputs.append(y_t.numpy())
    np.testing.assert_allclose(np.stack(outputs, axis=1), whole.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.ssm.numpy(), final.ssm.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.conv.numpy(), final.conv.numpy(), rtol=1e-6, atol=1e-6)


def test_chunks_with_carried_state_match_the_whole_sequence(device):
    block = make_block().to(device)
    x = sequence(2, seq=9)
    whole, _ = block(rc.tensor(x))
    first, state = block(rc.tensor(np.ascontiguousarray(x[:, :4])))
    second, _ = block(rc.tensor(np.ascontiguousarray(x[:, 4:])), state)
    np.testing.assert_allclose(np.concatenate([first.numpy(), second.numpy()], axis=1), whole.numpy(), rtol=1e-4, atol=1e-5)


def test_the_output_depends_only_on_the_past(device):
    block = make_block().to(device)
    x = sequence(3)
    changed = x.copy()
    changed[:, 5:] += 1.0  # the future of position 4
    a, _ = block(rc.tensor(x))
    b, _ = block(rc.tensor(changed))
    np.testing.assert_array_equal(a.numpy()[:, :5], b.numpy()[:, :5])
    assert np.abs(a.numpy()[:, 5:] - b.numpy()[:, 5:]).max() > 1e-3


def _loss(block, x, weight, state=None):
    y, new_state = block(x, state)
    return rc.add(rc.sum(rc.mul(y, weight)), rc.sum(new_state.ssm))


def test_gradients_match_finite_differences_in_float64():
    previous = rc.dtype("f64")
    try:
        block = make_block()
        rng = np.random.default_rng(4)
        x = rng.normal(size=(6, 5, 2))
        weight = rc.tensor(rng.normal(size=(6, 5, 2)), dtype="f64")
        start = nn.MambaState(rc.tensor(rng.normal(size=(2, 12, 2)), dtype="f64"),
                              rc.tensor(rng.normal(size=(4, 4, 3, 2)), dtype="f64"))
        # the input and the carried state
        assert rc.gradcheck(lambda x, conv, ssm: _loss(block, x, weight, nn.MambaState(conv, ssm)),
                            [x, start.conv.numpy(), start.ssm.numpy()])
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


@pytest.mark.skipif("gpu" not in DEVICES, reason="no Vulkan device")
def test_gpu_matches_cpu_forward_and_gradients():
    x = sequence(5, seq=12, batch=2)
    weight = np.random.default_rng(6).normal(size=(6, 12, 2)).astype(np.float32)
    results = []
    for device in ("cpu", "gpu"):
        previous = rc.device(device)
        try:
            block = make_block(seed=7)
            with rc.grad_tape():
                loss = _loss(block, rc.tensor(x), rc.tensor(weight))
            grads = rc.backward(loss)
            results.append([loss.numpy()] + [np.asarray(grads[p]) for p in block.parameters().values()])
        finally:
            rc.device(previous)
    for name, a, b in zip(["loss"] + list(make_block().parameters()), *results):
        np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-5 * max(1.0, np.abs(a).max()), err_msg=name)


def exponential_average(x, decay=0.7):
    """y_t = decay y_{t-1} + (1 - decay) x_t along dim 1, from y = 0."""
    y, acc = np.zeros_like(x), np.zeros_like(x[:, 0])
    for t in range(x.shape[1]):
        acc = decay * acc + (1 - decay) * x[:, t]
        y[:, t] = acc
    return y


def test_a_mamba_block_learns_what_needs_memory():
    """Adam on the block alone fits an exponential moving average of its input better than the
    best memoryless map can (a least-squares fit of y_t from x_t alone)."""
    block = make_block(seed=1)
    optimizer = rc.optim.Adam(block.parameters(), lr=0.01)
    rng = np.random.default_rng(8)

    def batch():
        x = rng.uniform(-1, 1, size=(6, 10, 8)).astype(np.float32)
        return x, exponential_average(x)

    def loss_of(x, y):
        out, _ = block(rc.tensor(x))
        return rc.mean(rc.square(rc.sub(out, rc.tensor(y))))

    for _ in range(1000):
        x, y = batch()
        with rc.grad_tape():
            loss = loss_of(x, y)
        optimizer.step(rc.backward(loss))
    test_x, test_y = batch()
    tokens_x = np.vstack([test_x.reshape(6, -1), np.ones((1, 80))]).T  # [tokens, features + 1]
    tokens_y = test_y.reshape(6, -1).T
    fit = np.linalg.lstsq(tokens_x, tokens_y, rcond=None)[0]
    memoryless = float(np.mean((tokens_x @ fit - tokens_y) ** 2))
    learned = float(loss_of(test_x, test_y).numpy().ravel()[0])
    assert learned < 0.85 * memoryless, (learned, memoryless)  # 0.70 when written


@pytest.mark.parametrize("kwargs, message", [
    (dict(d_model=6, d_state=4, expand=1, head_dim=4), "d_inner = expand \\* d_model = 6 is not a multiple of head_dim = 4"),
    (dict(d_model=8, d_state=4, head_dim=4, n_groups=3), "n_heads = 4 is not a multiple of n_groups = 3"),
    (dict(d_model=0, d_state=4), "d_model must be a positive int"),
    (dict(d_model=4, d_state=4, dt_min=0.1, dt_max=0.01), "0 < dt_min <= dt_max"),
])
def test_bad_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        nn.MambaBlock(**kwargs)


def test_bad_inputs_and_states():
    block = make_block()
    with pytest.raises(ValueError, match="input has 5 features"):
        block(rc.tensor(np.zeros((5, 3, 2), np.float32)))
    with pytest.raises(TypeError, match="state must be a MambaState"):
        block(rc.tensor(sequence(0)), state=(1, 2))
    wrong = block.initial_state(batch_size=2)
    with pytest.raises(ValueError, match="state.conv has shape \\(2, 12, 2\\), expected \\(2, 12, 3\\) for batch 3"):
        block(rc.tensor(sequence(0)), state=wrong)
