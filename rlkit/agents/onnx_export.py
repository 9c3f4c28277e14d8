"""``agent.export_onnx(path)``: the acting policy as an ONNX model (the ``onnx`` extra).

The model maps a batch of observations as the environment gives them, ``obs`` of shape
(N, *observation shape) (float32; uint8 for images, int64 for Discrete and MultiDiscrete), to the deterministic actions
``agent.predict(obs, deterministic=True)`` returns: ``actions`` of shape (N,) int64 for a
Discrete action space, (N, *action shape) float32 rescaled to the space's bounds for a Box.
ONNX is row-major: a layer's rlkit [features, N] is ONNX's (N, features), an image batch
[W, H, C, N] is (N, C, H, W), and a convolution's [KW, KH, C_in, C_out] weights are written as
(C_out, C_in, KH, KW): the same bytes. Each agent names the modules its action goes through
(``_onnx_policy``); this file turns each kind of module into ONNX nodes.
"""

from __future__ import annotations

import numpy as np

import rlkit.core as rc
from rlkit.agents.observations import Identity, ImageEncoder, OneHot

ACTIVATION_OPS = {"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid", "softplus": "Softplus"}
"""rlkit activations that are one ONNX op each (silu, softmax and log_softmax have their own lines)."""


class OnnxGraph:
    """The nodes and weights of the model being written."""

    def __init__(self, helper, numpy_helper):
        self.helper, self.numpy_helper = helper, numpy_helper
        self.nodes, self.initializers, self._count = [], [], 0

    def name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def const(self, array: np.ndarray, hint: str = "w") -> str:
        name = self.name(hint)
        self.initializers.append(self.numpy_helper.from_array(np.array(array, order="C"), name))  # 0-d stays 0-d
        return name

    def node(self, op: str, inputs: list[str], **attributes) -> str:
        out = self.name(op.lower())
        self.nodes.append(self.helper.make_node(op, inputs, [out], **attributes))
        return out


def _f32(t: rc.Tensor) -> np.ndarray:
    return np.asarray(t.numpy(), np.float32)


def _activation(g: OnnxGraph, x: str, activation: str | None) -> str:
    if activation is None:
        return x
    if activation in ACTIVATION_OPS:
        return g.node(ACTIVATION_OPS[activation], [x])
    if activation == "silu":
        return g.node("Mul", [x, g.node("Sigmoid", [x])])
    if activation in ("softmax", "log_softmax"):
        return g.node("Softmax" if activation == "softmax" else "LogSoftmax", [x], axis=1)
    raise ValueError(f"export_onnx: no ONNX form for the activation {activation!r}")


def _linear(g: OnnxGraph, m: rc.nn.Linear, x: str) -> str:
    bias = _f32(m.b).reshape(-1) if m.b is not None else np.zeros(m.out_features, np.float32)
    y = g.node("Gemm", [x, g.const(_f32(m.W)), g.const(bias, "b")], transB=1)  # (N, out) = x W^T + b
    return _activation(g, y, m.activation)


def _conv(g: OnnxGraph, m: rc.nn.Conv2d, x: str) -> str:
    weight = np.ascontiguousarray(_f32(m.W).T)  # [KW, KH, C_in, C_out] -> (C_out, C_in, KH, KW)
    inputs = [x, g.const(weight)] + ([g.const(_f32(m.b).reshape(-1), "b")] if m.b is not None else [])
    (ph, pw) = m.padding
    y = g.node("Conv", inputs, kernel_shape=list(m.kernel_size), strides=list(m.stride), pads=[ph, pw, ph, pw],
               dilations=list(m.dilation))
    return _activation(g, y, m.activation)


def _scale(g: OnnxGraph, scale: float, x: str) -> str:
    floats = g.node("Cast", [x], to=1)  # FLOAT
    return floats if scale == 1.0 else g.node("Mul", [floats, g.const(np.array(scale, np.float32), "scale")])


def _one_hot(g: OnnxGraph, m: OneHot, x: str) -> str:
    index = g.node("Cast", [x], to=7)  # INT64: (N, k) indices from 0
    values = g.const(np.array([0.0, 1.0], np.float32), "values")
    rows = []
    for i, classes in enumerate(m.nvec):
        entry = g.node("Gather", [index, g.const(np.array(i, np.int64), "i")], axis=1)  # (N,)
        rows.append(g.node("OneHot", [entry, g.const(np.array(classes, np.int64), "depth"), values], axis=-1))
    return rows[0] if len(rows) == 1 else g.node("Concat", rows, axis=1)  # (N, sum(nvec))


EMITTERS: dict[type, object] = {}
"""Module class -> its ONNX form: a function (graph, module, input name) -> output name. An
agent's own modules register theirs where they are defined (``@onnx_form(TheModule)``)."""


def onnx_form(module_class: type):
    """Registers the decorated function as ``module_class``'s ONNX form."""
    def register(function):
        EMITTERS[module_class] = function
        return function
    return register


def emit(g: OnnxGraph, module, x: str) -> str:
    """The ONNX nodes of ``module`` applied to ``x``; the name of the result."""
    for cls in type(module).__mro__:
        if cls in EMITTERS:
            return EMITTERS[cls](g, module, x)
    raise ValueError(f"export_onnx: no ONNX form for the module {type(module).__name__}")


@onnx_form(rc.nn.Sequential)
def _sequential(g: OnnxGraph, module, x: str) -> str:
    for layer in module:
        x = emit(g, layer, x)
    return x


@onnx_form(rc.nn.MaxPool2d)
def _max_pool(g: OnnxGraph, m, x: str) -> str:
    (ph, pw) = m.padding
    return g.node("MaxPool", [x], kernel_shape=list(m.kernel_size), strides=list(m.stride), pads=[ph, pw, ph, pw])


@onnx_form(ImageEncoder)
def _image_encoder(g: OnnxGraph, m, x: str) -> str:
    images = _scale(g, m.layout.scale, x)
    if not m.layout.channels_first:  # (N, H, W, C) -> (N, C, H, W)
        images = g.node("Transpose", [images], perm=[0, 3, 1, 2])
    return emit(g, m.cnn, images)


@onnx_form(rc.nn.ImpalaCNN)
def _impala(g: OnnxGraph, m, x: str) -> str:
    return emit(g, m.linear, emit(g, m.flatten, g.node("Relu", [emit(g, m.cnn, x)])))


@onnx_form(rc.nn.ResidualBlock)
def _residual(g: OnnxGraph, m, x: str) -> str:
    inner = emit(g, m.conv1, g.node("Relu", [emit(g, m.conv0, g.node("Relu", [x]))]))
    return g.node("Add", [x, inner])


EMITTERS.update({
    Identity: lambda g, m, x: x,
    rc.nn.Linear: _linear,
    rc.nn.Conv2d: _conv,
    rc.nn.Flatten: lambda g, m, x: g.node("Flatten", [x], axis=1),
    rc.nn.ScaleImages: lambda g, m, x: _scale(g, m.scale, x),
    rc.nn.NatureCNN: lambda g, m, x: emit(g, m.linear, emit(g, m.cnn, x)),
    OneHot: _one_hot,
})


def export_policy(agent, path: str, opset: int = 17) -> None:
    """Writes ``agent``'s deterministic policy to ``path`` (the module docstring); a Dict
    observation space is refused (ValueError)."""
    if agent.obs_layout.extractor == "dict":
        raise ValueError(f"{agent.algo}.export_onnx: Dict observations are not exported yet (the model has one "
                         f"input, obs; this agent reads the keys {list(agent.obs_layout.keys)})")
    try:
        import onnx
        from onnx import helper, numpy_helper
    except ImportError as error:
        raise ImportError("export_onnx needs the onnx package: pip install 'rlkit[onnx]'") from error
    modules, final = agent._onnx_policy()
    g = OnnxGraph(helper, numpy_helper)
    space = agent.observation_space
    layout = agent.obs_layout
    obs_type = (onnx.TensorProto.UINT8 if layout.image else onnx.TensorProto.INT64 if layout.nvec
                else onnx.TensorProto.FLOAT)
    obs_shape = ["N", *space.shape]
    x = "obs" if not agent.obs_layout.nvec else _from_start(g, agent.obs_layout.start)
    if not agent.obs_layout.image:  # vectors: flattened to (N, n_obs)
        x = g.node("Reshape", [x, g.const(np.array([-1, agent.obs_layout.size], np.int64), "shape")])
    for module in modules:
        x = emit(g, module, x)
    actions, action_type, action_shape = _final(g, agent, final, x, onnx.TensorProto)
    g.nodes.append(helper.make_node("Identity", [actions], ["actions"]))
    graph = helper.make_graph(g.nodes, f"{agent.algo}_policy",
                              [helper.make_tensor_value_info("obs", obs_type, obs_shape)],
                              [helper.make_tensor_value_info("actions", action_type, action_shape)], g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="rlkit", doc_string=f"{agent.algo} deterministic policy")
    onnx.checker.check_model(model)
    onnx.save(model, path)


def _from_start(g: OnnxGraph, start: tuple[int, ...]) -> str:
    """Discrete / MultiDiscrete observations less each entry's start, as floats (N, k)."""
    floats = g.node("Reshape", [g.node("Cast", ["obs"], to=1), g.const(np.array([-1, len(start)], np.int64), "k")])
    return g.node("Sub", [floats, g.const(np.array(start, np.float32), "start")])


def _final(g: OnnxGraph, agent, final: str, x: str, types):
    """(the actions' name, ONNX type from ``types`` (onnx.TensorProto), shape) from the last
    module's output ``x``."""
    if final == "argmax":
        return g.node("ArgMax", [x], axis=1, keepdims=0), types.INT64, ["N"]
    if final != "tanh":
        raise ValueError(f"export_onnx: unknown final step {final!r}")
    space = agent.action_space  # a bounded Box: tanh's [-1, 1] rescaled to [low, high]
    low = space.low.reshape(-1).astype(np.float32)
    half_range = (0.5 * (space.high - space.low)).reshape(-1).astype(np.float32)
    unit = g.node("Tanh", [x])
    scaled = g.node("Add", [g.node("Mul", [g.node("Add", [unit, g.const(np.ones_like(low), "one")]),
                                            g.const(half_range, "half_range")]), g.const(low, "low")])
    shape = g.const(np.array([-1, *space.shape], np.int64), "action_shape")
    return g.node("Reshape", [scaled, shape]), types.FLOAT, ["N", *space.shape]
