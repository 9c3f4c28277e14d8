"""The backward pass.

Inside ``with grad_tape():`` every differentiable op whose inputs require gradients records a
node on its output (``tape.py``). :func:`backward` walks those nodes from the loss in reverse
topological order (an iterative walk: deep graphs cannot overflow the stack), applies one vjp
rule per op (``vjp.py``), sums broadcast gradients back to their input's shape in one place,
records the whole backward pass as one native graph, and runs it once.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping

from rlkit import _native
from rlkit.core import ops
from rlkit.core.tape import TAPE, DeviceGradient, no_grad
from rlkit.core.tensor import Tensor
from rlkit.core.vjp import VJP, RowBlock


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


def _concat_blocks(blocks: list[RowBlock]) -> Tensor:
    """The gradient of a tensor read only through slices of its rows: the blocks' sum. Blocks of
    one range are added at their size; blocks apart are concatenated (in pairs, so that each row
    is copied about log2(blocks) times), zero rows filling the gaps; blocks that overlap without
    being equal are padded to the whole and added, as slice_rows' plain rule does."""
    by_range: dict[tuple[int, int], Tensor] = {}
    for b in blocks:
        key = (b.start, b.stop)
        by_range[key] = b.g if key not in by_range else ops.add(by_range[key], b.g)
    ranges, rows = sorted(by_range), blocks[0].rows
    if any(stop > next_start for (_, stop), (next_start, _) in zip(ranges, ranges[1:])):
        return functools.reduce(ops.add, (RowBlock(by_range[r], r[0], rows).dense() for r in ranges))
    pieces, end = [], 0
    for start, stop in ranges:
        g = by_range[(start, stop)]
        pieces.append(g if start == end else ops.pad_rows(g, start - end, 0))
        end = stop
    if end < rows:
        pieces[-1] = ops.pad_rows(pieces[-1], 0, rows - end)
    while len(pieces) > 1:
        pieces = [ops.concat_rows(*pieces[i:i + 2]) if i + 1 < len(pieces) else pieces[i]
                  for i in range(0, len(pieces), 2)]
    return pieces[0]


def _shaped_like(g: Tensor, x: Tensor) -> Tensor:
    """The one place broadcast gradients are summed back to their input's shape; a shape that
    differs only in trailing sizes of 1 (a parameter's [5, 6, 2] against [5, 6, 2, 1]) is no
    broadcast: reshaped, not summed."""
    if ops._ne4(g) != ops._ne4(x):
        return ops.sum_to(g, x.shape)
    return g if g.shape == x.shape else ops.reshape(g, x.shape)


def _summed(g) -> Tensor:
    """A tensor's gradient as one tensor: itself, or its row blocks concatenated."""
    return _concat_blocks(g) if isinstance(g, list) else g


def _accumulated(previous, g):
    """previous + g, where either may be row blocks (a list of RowBlock, kept apart until the
    tensor's gradient is read) and previous may be None."""
    if isinstance(g, RowBlock):
        if previous is None or isinstance(previous, list):
            return (previous or []) + [g]
        return ops.add(previous, g.dense())
    return g if previous is None else ops.add(_summed(previous), g)


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
            g = _summed(g)
            node = t._node
            input_grads = VJP[node.op](g, t, *node.inputs, **node.attrs)
            for inp, gi in zip(node.inputs, input_grads):
                if gi is None or not inp.requires_grad:
                    continue
                if not isinstance(gi, RowBlock):  # a RowBlock is of its input's shape
                    gi = _shaped_like(gi, inp)
                grads[id(inp)] = _accumulated(grads.get(id(inp)), gi)
                if inp._node is None:
                    leaves[id(inp)] = inp
        this_pass = {leaf: _summed(grads[key]) for key, leaf in leaves.items()}
        if captured:  # a captured step uses this pass's gradients; .grad keeps what it had
            return Gradients(this_pass)
        accumulated = {
            leaf: g if leaf._grad is None else ops.add(leaf._grad, g) for leaf, g in this_pass.items()
        }
    graph.run()
    for leaf, total in accumulated.items():
        leaf._grad = total
    return Gradients(this_pass)
