"""The tape: what ``with grad_tape():`` records for the backward pass.

Inside an open tape every differentiable op whose inputs require gradients records a
:class:`Node` on its output (``ops.apply``); :func:`rlkit.core.backward` walks those nodes.
Opening the next tape releases what the previous one recorded, so a pass's activations live
until then, and so do the GPU gradients it produced (:class:`DeviceGradient`).
"""

from __future__ import annotations

import contextlib
import weakref

import numpy as np


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

    def record(self, out, op: str, inputs: tuple, attrs: dict) -> None:
        """Marks the tensor ``out`` as made by ``op`` from ``inputs`` on this tape."""
        out.requires_grad = True
        out._node = Node(op, inputs, attrs, self.tape_id)
        self.recorded.append(weakref.ref(out))


TAPE = _Tape()


@contextlib.contextmanager
def grad_tape():
    """Records differentiable ops for :func:`rlkit.core.backward`.

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

    def __init__(self, tensor):
        self._tensor = tensor
        self._tape_id = TAPE.tape_id

    def _live(self):
        if self._tape_id != TAPE.tape_id:
            raise RuntimeError(
                "this GPU gradient belonged to an earlier pass: a new grad_tape has opened since, and "
                "gradients live only until then. Call .numpy() on it before the next tape opens"
            )
        return self._tensor

    def numpy(self) -> np.ndarray:
        """The values, downloaded to a Fortran-ordered array."""
        return self._live().numpy()

    def tensor(self):
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
