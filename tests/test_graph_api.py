"""rlkit.core.graph, the explicit graph API of the Mamba demo: values and gradients against
eager rlkit and finite differences, the same numbers on both backends, placement reports, one
trace for many computes, and misuse."""

import numpy as np
import pytest

import rlkit.core as rc
from conftest import DEVICES
from rlkit.core.graph import Graph


def _conv_graph():
    """sx -> ssm_conv with a param filter -> a param linear map -> mean squared error."""
    g = Graph()
    sx = g.input("sx", (6, 4, 2))  # d_conv - 1 + n_t = 3 + 3, d_inner 4, 2 sequences
    cw = g.param("conv", (4, 4))
    w = g.param("w", (2, 4))
    target = g.input("target", (2, 6))
    conv = g.node("conv_out", rc.ssm_conv, sx, cw)  # [4, 3, 2]
    flat = g.node("flat", rc.reshape, conv, (4, 6))
    y = g.node("y", rc.matmul, w, flat)  # [2, 6]
    loss = g.node("loss", lambda y, t: rc.mean(rc.square(y - t)), y, target)
    g.set_loss(loss)
    g.build_backward()
    return g


def _data(seed=0):
    rng = np.random.default_rng(seed)
    return {"sx": rng.standard_normal((6, 4, 2)), "conv": rng.standard_normal((4, 4)),
            "w": rng.standard_normal((2, 4)), "target": rng.standard_normal((2, 6))}


def _eager(data):
    sx = rc.tensor(np.asfortranarray(data["sx"], np.float32))
    cw, w = rc.param(data["conv"]), rc.param(data["w"])
    with rc.grad_tape():
        y = rc.matmul(w, rc.reshape(rc.ssm_conv(sx, cw), (4, 6)))
        loss = rc.mean(rc.square(y - rc.tensor(np.asfortranarray(data["target"], np.float32))))
    grads = rc.backward(loss)
    return float(loss.numpy().ravel()[0]), grads[cw], grads[w]


@pytest.mark.parametrize("backend", DEVICES)
def test_values_and_gradients_match_eager_rlkit(backend):
    g = _conv_graph()
    g.allocate(backend)
    data = _data()
    for name, values in data.items():
        g.set_data(name, values)
    g.compute()
    loss, g_conv, g_w = _eager(data)
    assert float(g.get_data("loss").ravel()[0]) == pytest.approx(loss, rel=1e-5)
    np.testing.assert_allclose(g.get_grad("conv"), g_conv, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(g.get_grad("w"), g_w, rtol=1e-4, atol=1e-6)
    assert g.get_data("conv_out").shape == (4, 3, 2)
    assert g.backend_of("conv_out") == ("CPU" if backend == "cpu" else g.backend_of("loss"))
    assert g.backend_of("loss").startswith("CPU" if backend == "cpu" else "Vulkan")
    assert g.n_splits == 1 and g.n_ops > 10


def test_gradient_against_finite_differences():
    g = _conv_graph()
    g.allocate("cpu")
    data = _data(1)
    for name, values in data.items():
        g.set_data(name, values)
    g.compute()
    analytic = g.get_grad("conv")
    step, numeric = 1e-2, np.zeros((4, 4))
    for index in np.ndindex(4, 4):
        losses = []
        for sign in (1, -1):
            moved = data["conv"].copy()
            moved[index] += sign * step
            g.set_data("conv", moved)
            g.compute()
            losses.append(float(g.get_data("loss").ravel()[0]))
        numeric[index] = (losses[0] - losses[1]) / (2 * step)
    np.testing.assert_allclose(analytic, numeric, rtol=2e-2, atol=2e-3)
    assert len(g._captured._programs) == 1 and g._captured.traces == 1  # 33 computes, one trace


def test_misuse_is_refused_with_a_clear_message():
    g = _conv_graph()
    with pytest.raises(RuntimeError, match="allocate a backend before compute"):
        g.compute()
    g.allocate("cpu")
    with pytest.raises(RuntimeError, match=r"set_data for \['sx', 'conv', 'w', 'target'\]"):
        g.compute()
    with pytest.raises(ValueError, match="holds 48 values of shape"):
        g.set_data("sx", np.zeros(5))
    with pytest.raises(ValueError, match="set_data takes inputs and params"):
        g.set_data("y", np.zeros((2, 6)))
    with pytest.raises(RuntimeError, match="compute before reading"):
        g.get_data("y")
    with pytest.raises(ValueError, match="gradients are computed for params"):
        g.get_grad("sx")
    with pytest.raises(KeyError, match="no node named 'nope'"):
        g.get_data("nope")
    with pytest.raises(RuntimeError, match="nodes cannot be added after build_backward"):
        g.node("late", rc.relu, g.nodes["y"])
    other = Graph()
    with pytest.raises(ValueError, match="exists already"):
        other.input("x", (2, 2)) and other.input("x", (2, 2))
    with pytest.raises(ValueError, match="of another graph"):
        other.node("z", rc.relu, g.nodes["y"])
    with pytest.raises(ValueError, match="a shape is 1 to 4 positive ints"):
        other.param("p", (2, 0))
    with pytest.raises(RuntimeError, match="set_loss before build_backward"):
        other.build_backward()
    assert Graph().n_splits == 0
