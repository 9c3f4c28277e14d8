"""The explicit graph API (as ggml's, which the Mamba demo of the original is written in):
declare inputs and parameters by shape, add nodes, name the loss, build the backward pass,
allocate on a backend, set data, compute, and read values and gradients back.

    g = Graph()
    x = g.input("x", (4, 8))                 # [features, batch]
    w = g.param("w", (3, 4))                 # gradients are computed for parameters
    y = g.node("y", rc.matmul, w, x)         # any rlkit op (or function of tensors) on nodes
    loss = g.node("loss", lambda y: rc.mean(rc.square(y)), y)
    g.set_loss(loss)
    g.build_backward()
    g.allocate("gpu")                        # every node runs there: rlkit has no CPU fallback
    g.set_data(x, x_values); g.set_data(w, w_values)
    g.compute()
    g.get_data(loss), g.get_grad(w), g.backend_of(y), g.n_splits

``compute`` replays one captured native program holding the forward and backward passes (on
the GPU: one upload of the data set since the last compute, one submission, one download); it
is traced on the first compute and again only when a shape changes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlkit.core import runtime, autograd, capturing, tape


class Node:
    """A tensor of a Graph: an input, a parameter, or the result of a function of nodes."""

    def __init__(self, graph: "Graph", name: str, kind: str, shape: tuple[int, ...] | None = None,
                 fn: Callable | None = None, args: tuple = ()):
        self.graph, self.name, self.kind = graph, name, kind
        self.shape, self.fn, self.args = shape, fn, args

    def __repr__(self) -> str:
        return f"Node({self.name!r}, {self.kind})"


class Graph:
    """A computation declared node by node, then computed on one backend (see the module
    docstring). Names are unique within a graph; ``set_data`` takes a node or its name."""

    def __init__(self):
        self.nodes: dict[str, Node] = {}
        self.loss: Node | None = None
        self.backend: str | None = None
        self._backward = False
        self._data: dict[str, np.ndarray] = {}
        self._results: dict[str, np.ndarray] = {}
        self._captured: capturing.CapturedFunction | None = None

    # ---- building -----------------------------------------------------------------------------

    def _add(self, node: Node) -> Node:
        if not isinstance(node.name, str) or not node.name:
            raise ValueError(f"graph: a node needs a non-empty str name, got {node.name!r}")
        if node.name in self.nodes:
            raise ValueError(f"graph: a node named {node.name!r} exists already")
        if self._backward:
            raise RuntimeError("graph: the backward pass is built; nodes cannot be added after build_backward")
        self.nodes[node.name] = node
        return node

    def _checked_shape(self, shape) -> tuple[int, ...]:
        shape = tuple(shape)
        if not 1 <= len(shape) <= 4 or any(isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1
                                           for n in shape):
            raise ValueError(f"graph: a shape is 1 to 4 positive ints (ne order), got {shape!r}")
        return tuple(int(n) for n in shape)

    def input(self, name: str, shape, dtype: str = "f32") -> Node:
        """Data set before each compute (an i32 input holds indices)."""
        if dtype not in ("f32", "i32"):
            raise ValueError(f"graph: an input's dtype is 'f32' or 'i32', got {dtype!r}")
        node = self._add(Node(self, name, "input", self._checked_shape(shape)))
        node.dtype = dtype
        return node

    def param(self, name: str, shape) -> Node:
        """An f32 tensor whose gradient the backward pass computes."""
        node = self._add(Node(self, name, "param", self._checked_shape(shape)))
        node.dtype = "f32"
        return node

    def node(self, name: str, fn: Callable, *args) -> Node:
        """The result of ``fn(*args)``: nodes of this graph among ``args`` become their tensors,
        anything else (numbers, arrays) is passed as it is."""
        if not callable(fn):
            raise TypeError(f"graph: node {name!r} needs a callable, got {type(fn).__name__}")
        for arg in args:
            if isinstance(arg, Node) and arg.graph is not self:
                raise ValueError(f"graph: node {name!r} uses {arg.name!r} of another graph")
        return self._add(Node(self, name, "op", fn=fn, args=args))

    def set_loss(self, node: Node) -> None:
        """The scalar the backward pass differentiates."""
        self.loss = self._own(node)

    def build_backward(self) -> None:
        """Adds the backward pass: gradients of the loss for every parameter."""
        if self.loss is None:
            raise RuntimeError("graph: set_loss before build_backward")
        if not any(n.kind == "param" for n in self.nodes.values()):
            raise RuntimeError("graph: build_backward needs at least one param")
        self._backward = True

    def allocate(self, backend: str = "cpu") -> None:
        """Places every node on ``backend`` ("cpu" or "gpu"); a missing GPU raises here."""
        runtime.check_device(backend)
        self.backend = backend
        self._captured = None

    # ---- data in and out --------------------------------------------------------------------

    def _own(self, node) -> Node:
        if isinstance(node, str):
            if node not in self.nodes:
                raise KeyError(f"graph: no node named {node!r}")
            return self.nodes[node]
        if not isinstance(node, Node) or node.graph is not self:
            raise ValueError(f"graph: expected a node of this graph or its name, got {node!r}")
        return node

    def set_data(self, node, values) -> None:
        """The values of an input or a parameter for the next compute: an array of its shape
        (or its number of elements, read in ne order as ggml's set_data reads a vector)."""
        node = self._own(node)
        if node.kind == "op":
            raise ValueError(f"graph: {node.name!r} is computed; set_data takes inputs and params")
        values = np.asarray(values)
        if values.size != int(np.prod(node.shape)):
            raise ValueError(f"graph: {node.name!r} holds {int(np.prod(node.shape))} values of shape {node.shape}, "
                             f"got {values.size} (shape {values.shape})")
        dtype = np.int32 if node.dtype == "i32" else np.float32
        self._data[node.name] = np.asarray(values, dtype).reshape(node.shape, order="F")

    def compute(self) -> None:
        """Runs the forward pass (and the backward pass once built) on the allocated backend."""
        if self.backend is None:
            raise RuntimeError("graph: allocate a backend before compute")
        missing = [n.name for n in self.nodes.values() if n.kind != "op" and n.name not in self._data]
        if missing:
            raise RuntimeError(f"graph: set_data for {missing} before compute")
        if self._captured is None:
            self._captured = capturing.capture(self._forward_and_backward)
        previous = runtime.device(self.backend)
        try:
            self._results = self._captured(**self._data)
        finally:
            runtime.device(previous)

    def get_data(self, node) -> np.ndarray:
        """The value a node had in the last compute (Fortran-ordered, its shape)."""
        node = self._own(node)
        if node.kind != "op":
            return self._data[node.name]
        return self._result(node.name, f"{node.name!r}")

    def get_grad(self, node) -> np.ndarray:
        """The gradient of the loss for a parameter, from the last compute."""
        node = self._own(node)
        if node.kind != "param":
            raise ValueError(f"graph: gradients are computed for params; {node.name!r} is an {node.kind}")
        if not self._backward:
            raise RuntimeError("graph: build_backward before asking for gradients")
        return self._result("grad:" + node.name, f"the gradient of {node.name!r}")

    def _result(self, key: str, what: str) -> np.ndarray:
        if key not in self._results:
            raise RuntimeError(f"graph: compute before reading {what}")
        return self._results[key]

    # ---- placement ----------------------------------------------------------------------------

    def backend_of(self, node) -> str:
        """The backend that runs ``node``: the allocated one, for every node (rlkit has no
        fallback; an op without a kernel there would have failed to build)."""
        self._own(node)
        if self.backend is None:
            return "unassigned"
        return _backend_name(self.backend)

    @property
    def n_splits(self) -> int:
        """Backend changes along the graph plus one, as ggml's scheduler counts them: 1 once
        allocated (the whole graph on one backend), 0 before."""
        return 0 if self.backend is None else 1

    @property
    def n_ops(self) -> int:
        """Native ops in the compiled program (forward and backward), after a compute."""
        if self._captured is None or not self._captured._programs:
            return 0
        program = next(iter(self._captured._programs.values()))
        return program.native.n_live  # the ops that run (dead ones are planned out)

    # ---- the captured program -----------------------------------------------------------------

    def _forward_and_backward(self, **tensors):
        values = {}
        with tape.grad_tape():
            for node in self.nodes.values():
                if node.kind == "op":
                    args = [values[a.name] if isinstance(a, Node) else a for a in node.args]
                    values[node.name] = node.fn(*args)
                else:
                    values[node.name] = tensors[node.name]
                    values[node.name].requires_grad = node.kind == "param" and self._backward
        outputs = {n.name: values[n.name] for n in self.nodes.values() if n.kind == "op"}
        if self._backward:
            grads = autograd.backward(values[self.loss.name])
            for node in self.nodes.values():
                if node.kind == "param":
                    tensor = values[node.name]
                    if tensor not in grads:
                        raise RuntimeError(f"graph: the loss does not depend on the param {node.name!r}")
                    outputs["grad:" + node.name] = grads.tensor(tensor)
        return outputs


def _backend_name(device: str) -> str:
    """"CPU", or the GPU's name as Vulkan reports it."""
    if device == "cpu":
        return "CPU"
    for entry in runtime.devices():
        if entry["device"] == device:
            return f"Vulkan ({entry['name']})"
    return device
