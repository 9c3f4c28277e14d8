"""Modules against numpy references, finite differences and their documented contracts."""

import numpy as np
import pytest

import rlkit.core as rc
from rlkit.core import nn


@pytest.fixture
def f64():
    previous = rc.dtype("f64")
    yield
    rc.dtype(previous)


def _x(*shape, seed=0):
    return np.asfortranarray(np.random.default_rng(seed).standard_normal(shape))


def test_linear_forward_matches_numpy_with_activation():
    layer = nn.Linear(4, 3, activation="tanh")
    x = _x(4, 5).astype(np.float32)
    expected = np.tanh(layer.W.numpy() @ x + layer.b.numpy())
    np.testing.assert_allclose(layer(rc.tensor(x)).numpy(), expected, rtol=1e-5, atol=1e-6)


def test_initialisers():
    rc.manual_seed(0)
    g = nn.Linear(300, 200).W.numpy()
    limit = np.sqrt(6 / 500)
    assert np.abs(g).max() <= limit and np.abs(g).max() > 0.95 * limit
    assert g.std() == pytest.approx(limit / np.sqrt(3), rel=0.02)  # uniform(-l, l) has std l / sqrt(3)
    h = nn.Linear(400, 300, init="he").W.numpy()
    assert h.std() == pytest.approx(np.sqrt(2 / 400), rel=0.02)
    for n_in, n_out in ((6, 4), (4, 6)):
        w = nn.Linear(n_in, n_out, init="orthogonal", gain=2.0).W.numpy().astype(np.float64)
        gram = w @ w.T if n_out <= n_in else w.T @ w
        np.testing.assert_allclose(gram, 4.0 * np.eye(min(n_in, n_out)), atol=1e-5)
    fixed = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(nn.Linear(3, 2, init=fixed).W.numpy(), fixed)
    np.testing.assert_array_equal(nn.Linear(3, 2, init=lambda o, i: np.ones((o, i))).W.numpy(), np.ones((2, 3)))


def test_manual_seed_makes_initialisation_reproducible():
    rc.manual_seed(7)
    a = nn.Linear(5, 5).W.numpy()
    rc.manual_seed(7)
    np.testing.assert_array_equal(a, nn.Linear(5, 5).W.numpy())


def test_parameter_names_order_and_gradient_keys():
    model = nn.Sequential(nn.Linear(4, 8, activation="relu"), nn.LayerNorm(8), nn.Linear(8, 2))
    assert list(model.parameters()) == ["0.W", "0.b", "1.gamma", "1.beta", "2.W", "2.b"]
    x = rc.tensor(_x(4, 6).astype(np.float32))
    with rc.grad_tape():
        loss = rc.mean(rc.square(model(x)))
    grads = rc.backward(loss)
    assert grads["2.W"].shape == (2, 8)
    np.testing.assert_array_equal(grads["0.b"], grads[model[0].b])


def test_nested_sequential_names():
    inner = nn.Sequential(nn.Linear(2, 2))
    outer = nn.Sequential(nn.Linear(2, 2), inner)
    assert list(outer.parameters()) == ["0.W", "0.b", "1.0.W", "1.0.b"]
    assert inner[0].W.name == "1.0.W"


def test_train_and_eval_reach_every_submodule():
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Dropout(0.5), nn.BatchNorm(2)))
    model.eval()
    assert all(not m.training for m in model.modules())
    model.train()
    assert all(m.training for m in model.modules())


def test_batchnorm_training_and_running_statistics_match_numpy():
    bn = nn.BatchNorm(3, momentum=0.1)
    rm, rv = np.zeros((3, 1)), np.ones((3, 1))
    for seed in (1, 2):
        x = (_x(3, 8, seed=seed) * 2 + 1).astype(np.float32)
        mean, var = x.mean(1, keepdims=True), x.var(1, keepdims=True)
        expected = (x - mean) / np.sqrt(var + 1e-5)
        np.testing.assert_allclose(bn(rc.tensor(x)).numpy(), expected, rtol=1e-4, atol=1e-5)
        rm = 0.9 * rm + 0.1 * mean
        rv = 0.9 * rv + 0.1 * x.var(1, ddof=1, keepdims=True)
    np.testing.assert_allclose(bn.running_mean.numpy(), rm, rtol=1e-5)
    np.testing.assert_allclose(bn.running_var.numpy(), rv, rtol=1e-5)
    bn.eval()
    x = _x(3, 4, seed=5).astype(np.float32)
    np.testing.assert_allclose(bn(rc.tensor(x)).numpy(), (x - rm) / np.sqrt(rv + 1e-5), rtol=1e-4, atol=1e-5)


def test_layernorm_matches_numpy_and_gradients(f64):
    ln = nn.LayerNorm(4)
    x = _x(4, 3)
    expected = (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-5)
    np.testing.assert_allclose(ln(rc.tensor(x)).numpy(), expected, rtol=1e-10)
    assert rc.gradcheck(lambda t: ln(t) * rc.tensor(_x(4, 3, seed=9)), [x])


def test_layernorm_normalises_each_column_of_a_sequence_batch(f64):
    """[features, seq, batch]: every (step, sequence) column normalised on its own."""
    ln = nn.LayerNorm(4)
    x = np.random.default_rng(2).standard_normal((4, 3, 2))
    expected = (x - x.mean(0, keepdims=True)) / np.sqrt(x.var(0, keepdims=True) + 1e-5)
    np.testing.assert_allclose(ln(rc.tensor(x)).numpy(), expected, rtol=1e-10)


def test_batchnorm_gradient(f64):
    bn = nn.BatchNorm(3)
    weights = rc.tensor(_x(3, 5, seed=4))
    assert rc.gradcheck(lambda t: bn(t) * weights, [_x(3, 5)])


def test_dropout_rate_scaling_and_eval_identity():
    rc.manual_seed(3)
    drop = nn.Dropout(0.25)
    x = np.ones((100, 200), dtype=np.float32)
    y = drop(rc.tensor(x)).numpy()
    zero_fraction = (y == 0).mean()
    assert zero_fraction == pytest.approx(0.25, abs=0.01)
    np.testing.assert_allclose(np.unique(y), [0.0, 1 / 0.75], rtol=1e-6)
    drop.eval()
    np.testing.assert_array_equal(drop(rc.tensor(x)).numpy(), x)


def test_embedding_lookup_and_scatter_gradient():
    emb = nn.Embedding(5, 3)
    index = np.array([4, 0, 4])
    with rc.grad_tape():
        out = emb(index)
        loss = rc.sum(out * rc.tensor(np.arange(9.0).reshape(3, 3)))
    np.testing.assert_array_equal(out.numpy(), emb.W.numpy()[:, index])
    grad = rc.backward(loss)[emb.W]
    expected = np.zeros((3, 5))
    for j, i in enumerate(index):
        expected[:, i] += np.arange(9.0).reshape(3, 3)[:, j]
    np.testing.assert_allclose(grad, expected)


def _attention_numpy(mha, x, causal):
    Wq, Wk, Wv, Wo, bo = (getattr(mha, n).numpy().astype(np.float64) for n in ("W_q", "W_k", "W_v", "W_o", "b_o"))
    Q, K, V = Wq @ x, Wk @ x, Wv @ x
    d = mha.head_dim
    heads = []
    for h in range(mha.n_heads):
        q, k, v = (t[h * d:(h + 1) * d] for t in (Q, K, V))
        scores = k.T @ q / np.sqrt(d)  # [keys, queries]
        if causal:
            scores = np.where(np.arange(x.shape[1])[:, None] <= np.arange(x.shape[1])[None, :], scores, -np.inf)
        p = np.exp(scores - scores.max(0))
        heads.append(v @ (p / p.sum(0)))
    return Wo @ np.concatenate(heads) + bo


@pytest.mark.parametrize("causal", [False, True])
def test_multihead_attention_matches_numpy(causal):
    mha = nn.MultiheadAttention(8, 2)
    x = _x(8, 5)
    got = mha(rc.tensor(x.astype(np.float32)), causal=causal).numpy()
    np.testing.assert_allclose(got, _attention_numpy(mha, x, causal), rtol=1e-4, atol=1e-5)


def test_multihead_attention_batch_and_causality():
    mha = nn.MultiheadAttention(4, 2)
    x = _x(4, 3, 2).astype(np.float32)
    batched = mha(rc.tensor(x)).numpy()
    for b in range(2):
        np.testing.assert_allclose(batched[:, :, b], mha(rc.tensor(x[:, :, b])).numpy(), rtol=1e-5, atol=1e-6)
    changed = x[:, :, 0].copy()
    changed[:, 2] += 1.0  # a later token cannot change an earlier causal output
    a = mha(rc.tensor(x[:, :, 0]), causal=True).numpy()
    b = mha(rc.tensor(changed), causal=True).numpy()
    np.testing.assert_allclose(a[:, :2], b[:, :2], rtol=1e-6)
    assert not np.allclose(a[:, 2], b[:, 2])


def test_multihead_attention_gradients(f64):
    mha = nn.MultiheadAttention(4, 2)
    assert rc.gradcheck(lambda t: mha(t, causal=True), [_x(4, 3)])


def test_state_dict_round_trip_and_errors():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm(4))
    model(rc.tensor(_x(3, 6).astype(np.float32)))  # moves the running statistics
    state = model.state_dict()
    assert list(state) == ["0.W", "0.b", "1.gamma", "1.beta", "1.running_mean", "1.running_var"]
    fresh = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm(4))
    fresh.load_state_dict(state)
    fresh.eval()
    model.eval()
    x = rc.tensor(_x(3, 2).astype(np.float32))
    np.testing.assert_array_equal(fresh(x).numpy(), model(x).numpy())
    with pytest.raises(KeyError, match="missing entries \\['0.b'\\]"):
        fresh.load_state_dict({k: v for k, v in state.items() if k != "0.b"})
    with pytest.raises(KeyError, match="unexpected entries \\['extra'\\]"):
        fresh.load_state_dict({**state, "extra": np.zeros(1)})
    with pytest.raises(ValueError, match="'0.W' has shape"):
        fresh.load_state_dict({**state, "0.W": np.zeros((3, 3))})
    fresh.load_state_dict({"0.b": np.ones((4, 1))}, strict=False)
    np.testing.assert_array_equal(fresh[0].b.numpy(), np.ones((4, 1)))


def test_optimizer_keeps_working_after_load_state_dict():
    layer = nn.Linear(2, 1)
    opt = rc.optim.SGD(layer.parameters(), lr=0.1)
    layer.load_state_dict({"W": np.ones((1, 2)), "b": np.zeros((1, 1))})
    with rc.grad_tape():
        loss = rc.sum(layer(rc.tensor(np.ones((2, 1)))))
    rc.backward(loss)
    opt.step()
    np.testing.assert_allclose(layer.W.numpy(), np.full((1, 2), 0.9), rtol=1e-6)


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda: nn.Linear(0, 3), ValueError, "in_features"),
        (lambda: nn.Linear(2, 3, init="zeros"), ValueError, "unknown init"),
        (lambda: nn.Linear(2, 3, activation="gelu"), ValueError, "unknown activation"),
        (lambda: nn.Linear(2, 3, init=np.zeros((2, 2))), ValueError, "initial weight"),
        (lambda: nn.Sequential(nn.Linear(2, 2), "relu"), TypeError, "layer 1"),
        (lambda: nn.BatchNorm(3, momentum=2), ValueError, "momentum"),
        (lambda: nn.Dropout(1.0), ValueError, "rate"),
        (lambda: nn.MultiheadAttention(6, 4), ValueError, "divisible"),
        (lambda: nn.Embedding(-1, 2), ValueError, "vocab_size"),
    ],
)
def test_bad_construction(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_bad_input_shapes():
    with pytest.raises(ValueError, match="Linear: input has 3 features"):
        nn.Linear(4, 2)(rc.tensor(np.zeros((3, 2))))
    with pytest.raises(ValueError, match="LayerNorm"):
        nn.LayerNorm(4)(rc.tensor(np.zeros((3, 2))))
    with pytest.raises(ValueError, match="at least 2 columns"):
        nn.BatchNorm(3)(rc.tensor(np.zeros((3, 1))))
    with pytest.raises(IndexError, match="get_rows"):
        nn.Embedding(3, 2)(np.array([3]))
    with pytest.raises(TypeError, match="Linear"):
        nn.Linear(2, 2)("x")
