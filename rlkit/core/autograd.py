"""The backward pass.

Inside ``with grad_tape():`` every differentiable op whose inputs require gradients records a
node on its output (``tape.py``). :func:`backward` walks those nodes from the loss in reverse
topological order (an iterative walk: deep graphs cannot overflow the stack), applies one vjp
rule per op (``vjp.py``), sums broadcast gradients back to their input's shape in one place,
records the whole backward pass as one native graph, and runs it once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from rlkit import _native
from rlkit.core import ops
from rlkit.core.tape import TAPE, DeviceGradient, no_grad
from rlkit.core.tensor import Tensor
from rlkit.core.vjp import VJP


class Gradients(Mapping):
    """Gradients of one backward pass, keyed by parameter and by parameter name.

    ``grads[W]`` and ``grads["W"]`` are numpy arrays (Fortran-ordered, shaped like W) on the
    CPU and :class:`DeviceGradient` handles on the GPU; :meth:`tensor` gives the gradient as an
    engine tensor without a copy.
    """

    def __init__(self, by_param: dict):
        self._by_param = by_param
        self._by_name: dict[str, Tensor | None] = {}
        for p in by_param:
            if p.name is not None:
                # None marks a name two parameters share: looking it up is an error.
                self._by_name[p.name] = None if p.name in self._by_name else p

    def _param(self, key) -> Tensor:
        if isinstance(key, Tensor):
            if key not in self._by_param:
                raise KeyError(f"no gradient for {key!r}: it did not contribute to the loss")
            return key
        if isinstance(key, str):
            if key not in self._by_name:
                raise KeyError(f"no gradient for a parameter named {key!r}")
            p = self._by_name[key]
            if p is None:
                raise KeyError(f"several parameters are named {key!r}: index by the parameter itself")
            return p
        raise TypeError(f"gradients are keyed by parameter or name, got {type(key).__name__}")

    def __getitem__(self, key):
        g = self._by_param[self._param(key)]
        return g.numpy() if g.device == "cpu" else DeviceGradient(g)

    def tensor(self, key) -> Tensor:
        """The gradient as an engine tensor (no copy)."""
        return self._by_param[self._param(key)]

    def __contains__(self, key) -> bool:
        try:
            self._param(key)
        except (KeyError, TypeError):
            return False
        return True

    def __iter__(self) -> Iterator[Tensor]:
        return iter(self._by_param)

    def __len__(self) -> int:
        return len(self._by_param)

    def names(self) -> list[str]:
        """Names of the parameters that have one."""
        return [p.name for p in self._by_param if p.name is not None]


def _topological_order(root: Tensor) -> list[Tensor]:
    """Recorded tensors reachable from root, each after all of its recorded inputs."""
    order: list[Tensor] = []
    visited: set[int] = set()
    stack: list[tuple[Tensor, bool]] = [(root, False)]
    while stack:
        t, inputs_done = stack.pop()
        if inputs_done:
            order.append(t)
            continue
        if id(t) in visited:
            continue
        visited.add(id(t))
        stack.append((t, True))
        for inp in t._node.inputs:
            if inp._node is not None and id(inp) not in visited:
                stack.append((inp, False))
    return order


def _check_loss(loss, grad) -> None:
    if not isinstance(loss, Tensor):
        raise TypeError(f"backward: expected a Tensor, got {type(loss).__name__}")
    if loss._node is None:
        raise RuntimeError(
            "backward: the loss was not recorded on a tape: compute it inside `with rc.grad_tape():` "
            "from parameters (or the tape that recorded it was replaced by a newer one)"
        )
    if loss._node.tape_id != TAPE.tape_id:
        raise RuntimeError("backward: the loss belongs to an earlier tape, whose nodes were released")
    if grad is None and loss.numel != 1:
        raise ValueError(f"backward: the loss must be a scalar [1, 1], got shape {loss.shape}; pass grad= otherwise")


def backward(loss: Tensor, grad=None) -> Gradients:
    """Gradients of a scalar loss with respect to every parameter it depends on.

    Each parameter's ``.grad`` accumulates (adds) the new gradient until ``zero_grad``; the
    mapping returned holds this pass's gradients alone.
    """
    _check_loss(loss, grad)
    seed = ops.ones(loss.shape, dtype=loss.dtype, device=loss.device) if grad is None else ops.as_tensor(grad, like=loss)
    if seed.shape != loss.shape:
        raise ValueError(f"backward: grad has shape {seed.shape}, expected the loss's {loss.shape}")

    order = _topological_order(loss)
    grads: dict[int, Tensor] = {id(loss): seed}
    leaves: dict[int, Tensor] = {}
    captured = _native.is_recording()  # inside a capture: the ops join its program, nothing runs now
    graph = contextlib.nullcontext() if captured else _native.Graph()
    with no_grad(), graph:
        for t in reversed(order):
            g = grads.pop(id(t), None)
            if g is None:
                continue
            node = t._node
            input_grads = VJP[node.op](g, t, *node.inputs, **node.attrs)
            for inp, gi in zip(node.inputs, input_grads):
                if gi is None or not inp.requires_grad:
                    continue
                # the one place broadcast gradients are summed back; a shape that differs only in
                # trailing sizes of 1 (a parameter's [5, 6, 2] against [5, 6, 2, 1]) is no
                # broadcast: reshaped, not summed
                if ops._ne4(gi) != ops._ne4(inp):
                    gi = ops.sum_to(gi, inp.shape)
                elif gi.shape != inp.shape:
                    gi = ops.reshape(gi, inp.shape)
                previous = grads.get(id(inp))
                grads[id(inp)] = gi if previous is None else ops.add(previous, gi)
                if inp._node is None:
                    leaves[id(inp)] = inp
        this_pass = {leaf: grads[key] for key, leaf in leaves.items()}
        if captured:  # a captured step uses this pass's gradients; .grad keeps what it had
            return Gradients(this_pass)
        accumulated = {
            leaf: g if leaf._grad is None else ops.add(leaf._grad, g) for leaf, g in this_pass.items()
        }
    graph.run()
    for leaf, total in accumulated.items():
        leaf._grad = total
    return Gradients(this_pass)
