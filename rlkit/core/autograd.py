"""The tape and the backward pass.

Inside ``with grad_tape():`` every differentiable op whose inputs require gradients records a
:class:`Node` on its output. :func:`backward` walks those nodes from the loss in reverse
topological order (an iterative walk: deep graphs cannot overflow the stack), applies one vjp
rule per op (``vjp.py``), sums broadcast gradients back to their input's shape in one place,
records the whole backward pass as one native graph, and runs it once.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Mapping

import numpy as np

from rlkit import _native
from rlkit.core.tensor import Tensor


class Node:
    """How a tensor was made: the op, its inputs and the attributes its vjp rule needs."""

    __slots__ = ("op", "inputs", "attrs", "tape_id")

    def __init__(self, op: str, inputs: tuple, attrs: dict, tape_id: int):
        self.op = op
        self.inputs = inputs
        self.attrs = attrs
        self.tape_id = tape_id


class _Tape:
    """The open tape (if any) and the outputs it recorded, so that opening the next tape can
    release the previous pass's activations."""

    def __init__(self):
        self.recording = False
        self.tape_id = 0
        self.recorded: list[weakref.ref] = []

    def open(self) -> None:
        if self.recording:
            raise RuntimeError("grad_tape: a tape is already open (tapes do not nest)")
        self.release()
        self.tape_id += 1
        self.recording = True

    def release(self) -> None:
        """Drops the nodes of the previous pass: their saved activations are freed."""
        for ref in self.recorded:
            t = ref()
            if t is not None:  # an intermediate of a finished pass becomes a constant
                t._node = None
                t.requires_grad = False
        self.recorded = []

    def record(self, out: Tensor, op: str, inputs: tuple, attrs: dict) -> None:
        out.requires_grad = True
        out._node = Node(op, inputs, attrs, self.tape_id)
        self.recorded.append(weakref.ref(out))


TAPE = _Tape()


@contextlib.contextmanager
def grad_tape():
    """Records differentiable ops for :func:`backward`.

    Opening a tape releases what the previous one recorded (its activations and nodes); the
    gradients accumulated on parameters stay until ``zero_grad``.
    """
    TAPE.open()
    try:
        yield TAPE
    finally:
        TAPE.recording = False


@contextlib.contextmanager
def no_grad():
    """Pauses recording inside an open tape (for acting, targets, metrics)."""
    was_recording = TAPE.recording
    TAPE.recording = False
    try:
        yield
    finally:
        TAPE.recording = was_recording


class DeviceGradient:
    """A gradient that lives on the GPU, valid until the next tape opens.

    It is a handle, not an array: ``numpy()`` downloads it (as does ``np.asarray``), and
    arithmetic on it raises TypeError rather than computing something from a pointer. Hold the
    values (``numpy()``) before the next ``grad_tape`` if they are needed later.
    """

    __slots__ = ("_tensor", "_tape_id")

    def __init__(self, tensor: Tensor):
        self._tensor = tensor
        self._tape_id = TAPE.tape_id

    def _live(self) -> Tensor:
        if self._tape_id != TAPE.tape_id:
            raise RuntimeError(
                "this GPU gradient belonged to an earlier pass: a new grad_tape has opened since, and "
                "gradients live only until then. Call .numpy() on it before the next tape opens"
            )
        return self._tensor

    def numpy(self) -> np.ndarray:
        """The values, downloaded to a Fortran-ordered array."""
        return self._live().numpy()

    def tensor(self) -> Tensor:
        """The gradient as an engine tensor on the GPU."""
        return self._live()

    @property
    def shape(self) -> tuple[int, ...]:
        """The gradient's shape."""
        return self._tensor.shape

    @property
    def device(self) -> str:
        """Always "gpu"."""
        return self._tensor.device

    def __array__(self, dtype=None, copy=None):
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype)

    def _no_arithmetic(self, *args):
        raise TypeError("a GPU gradient is a handle without arithmetic: call .numpy() to download it, "
                        "or use it through the optimizer")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _no_arithmetic
    __truediv__ = __rtruediv__ = __matmul__ = __rmatmul__ = __neg__ = __pow__ = _no_arithmetic

    def __repr__(self) -> str:
        return f"DeviceGradient(shape={self.shape}, tape={self._tape_id})"


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
    from rlkit.core import ops
    from rlkit.core.vjp import VJP

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
                if gi.shape != inp.shape:  # the one place broadcast gradients are summed back
                    gi = ops.sum_to(gi, inp.shape)
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


def tape_memory(top: int = 5) -> list[dict]:
    """What the current tape holds, largest first: one row per recorded output still alive
    (op, shape, dtype, bytes), at most ``top`` rows."""
    if isinstance(top, bool) or not isinstance(top, int) or top < 0:
        raise ValueError(f"tape_memory: top must be a non-negative int, got {top!r}")
    rows = []
    for ref in TAPE.recorded:
        t = ref()
        if t is not None and t._node is not None:
            rows.append({"op": t._node.op, "shape": t.shape, "dtype": t.dtype, "bytes": t._impl.nbytes})
    rows.sort(key=lambda row: row["bytes"], reverse=True)
    return rows[:top]
