"""Data-parallel training over MPI: one process per replica, each computing at once.

Launch a script with ``rlkit launch -n 4 script.py`` (which runs ``mpiexec -n 4 python -m mpi4py
script.py``) or with mpiexec directly; run without mpiexec, a script is a job of one rank and
everything here still works. MPI comes from PyPI (mpi4py over the mpich wheel).

    comm = parallel.world()                  # this job's ranks
    model = make_model()
    parallel.broadcast_parameters(model)     # every rank starts from rank 0's weights
    optimizer = rc.optim.Adam(model.parameters())
    ... each rank computes gradients on its own shard ...
    grads = parallel.all_reduce_gradients(grads, model.parameters())   # the mean over ranks
    optimizer.step(grads)                    # the same update on every rank

Gradients are averaged in buckets (one flat buffer of at most ``bucket_bytes`` per all-reduce,
as PyTorch's DistributedDataParallel does), after the backward pass (not overlapped with it).
With several ranks, an uncaught exception on any rank aborts the whole job (MPI_Abort) after
printing its traceback, so no rank waits forever for one that died.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import numpy as np

from rlkit.core import runtime, ops
from rlkit.core.autograd import Gradients, backward
from rlkit.core.clip import clip_grad_norm
from rlkit.core.optim import Adam
from rlkit.core.tape import grad_tape
from rlkit.core.tensor import NUMPY_DTYPES, Tensor

DEFAULT_BUCKET_BYTES = 25 * 2**20  # PyTorch DDP's default bucket size


class Communicator:
    """The ranks of one job: an mpi4py communicator, or (``comm=None``) a job of one rank.
    Arrays are reduced and broadcast as numpy arrays; ``is_root`` is rank 0, the rank that
    logs and writes checkpoints."""

    def __init__(self, comm=None):
        self._comm = comm

    @property
    def rank(self) -> int:
        return 0 if self._comm is None else self._comm.Get_rank()

    @property
    def size(self) -> int:
        return 1 if self._comm is None else self._comm.Get_size()

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        """Waits until every rank gets here."""
        if self._comm is not None:
            self._comm.Barrier()

    def all_reduce(self, values, average: bool = False) -> np.ndarray:
        """The element-wise sum (or mean) over ranks of an array every rank passes with the same
        shape and dtype; a new array."""
        values = np.ascontiguousarray(values)
        if self._comm is None:
            return values.copy()
        total = np.empty_like(values)
        self._comm.Allreduce(values, total)
        return total / self.size if average else total

    def broadcast(self, values, root: int = 0) -> np.ndarray:
        """Rank ``root``'s array on every rank (each passes an array of the same shape and dtype)."""
        values = np.array(values, order="C")  # a copy: Bcast writes into it
        if self._comm is not None:
            self._comm.Bcast(values, root=root)
        return values

    def gather(self, obj, root: int = 0) -> list | None:
        """Every rank's picklable object, in rank order, on rank ``root`` (None elsewhere)."""
        return [obj] if self._comm is None else self._comm.gather(obj, root=root)

    def all_gather(self, obj) -> list:
        """Every rank's picklable object, in rank order, on every rank."""
        return [obj] if self._comm is None else self._comm.allgather(obj)

    def broadcast_object(self, obj, root: int = 0):
        """Rank ``root``'s picklable object on every rank."""
        return obj if self._comm is None else self._comm.bcast(obj, root=root)

    def abort(self, code: int = 1) -> None:
        """Ends every rank of the job at once."""
        if self._comm is not None:
            self._comm.Abort(code)
        raise SystemExit(code)


_world: Communicator | None = None


def world() -> Communicator:
    """This job's ranks: MPI's COMM_WORLD when launched by mpiexec, a job of one rank when run
    without it (or where mpi4py is not installed). With several ranks, the k-th rank of a
    machine computes on its k-th GPU (modulo their number; RLKIT_VK_DEVICE overrides) when it
    first uses one: call world() before any GPU work."""
    global _world
    if _world is None:
        try:
            from mpi4py import MPI
        except ImportError:
            _world = Communicator(None)
        else:
            comm = MPI.COMM_WORLD
            _world = Communicator(comm if comm.Get_size() > 1 else None)
            if _world.size > 1:
                _abort_on_uncaught_exception(_world)
                # one GPU per rank of a machine, round robin (read when the GPU is first used)
                local_rank = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
                os.environ.setdefault("RLKIT_VK_DEVICE_FOR_RANK", str(local_rank))
    return _world


def _abort_on_uncaught_exception(comm: Communicator) -> None:
    previous = sys.excepthook

    def hook(kind, value, traceback):
        sys.stderr.write(f"[rlkit.parallel] rank {comm.rank} of {comm.size} failed with {kind.__name__}: {value}; "
                         "aborting every rank\n")
        previous(kind, value, traceback)
        sys.stderr.flush()
        # The abort also ends mpiexec's forwarding of this rank's output: on a loaded machine
        # the lines above were lost without a moment for them to go through.
        time.sleep(0.2)
        comm.abort(1)

    sys.excepthook = hook


def manual_seed(seed: int, comm: Communicator | None = None) -> None:
    """Seeds rlkit's generators with ``seed + rank``: each rank draws its own stream (shards,
    dropout, exploration), reproducibly. Weights made from it differ per rank: broadcast them."""
    comm = comm or world()
    runtime.manual_seed(int(seed) + comm.rank)


# ---- parameters, optimizer state and gradients ---------------------------------------------

def _parameter_list(params) -> list[Tensor]:
    if hasattr(params, "parameters") and callable(params.parameters):
        params = params.parameters()
    entries = list(params.values()) if isinstance(params, Mapping) else list(params)
    if not entries or not all(isinstance(p, Tensor) for p in entries):
        raise TypeError("parallel: expected a module, or a non-empty list or dict of parameters")
    return entries


def broadcast_parameters(params, comm: Communicator | None = None, root: int = 0) -> None:
    """Overwrites the parameters of a module (its buffers too) or a list/dict of parameters on
    every rank with rank ``root``'s values."""
    comm = comm or world()
    if comm.size == 1:
        return
    if hasattr(params, "state_dict") and hasattr(params, "load_state_dict"):
        state = params.state_dict()
        params.load_state_dict({name: comm.broadcast(value, root) for name, value in state.items()})
        return
    for p in _parameter_list(params):
        p._impl.write(np.asfortranarray(comm.broadcast(p.numpy(), root)))


def broadcast_optimizer_state(optimizer, comm: Communicator | None = None, root: int = 0) -> None:
    """Gives every rank's optimizer rank ``root``'s state (step counts, moments, settings)."""
    comm = comm or world()
    if comm.size > 1:
        optimizer.load_state_dict(comm.broadcast_object(optimizer.state_dict(), root))


def all_reduce_gradients(grads: Gradients, params, comm: Communicator | None = None,
                         bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Gradients:
    """The mean over ranks of each parameter's gradient, for ``optimizer.step``. Every rank
    passes the same parameters; one without a gradient on a rank counts as zeros there. The
    gradients travel packed into flat buckets of at most ``bucket_bytes`` (per dtype), one
    all-reduce per bucket."""
    comm = comm or world()
    if not isinstance(grads, Gradients):
        raise TypeError(f"all_reduce_gradients: expected the Gradients backward() returned, got {type(grads).__name__}")
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 1:
        raise ValueError(f"all_reduce_gradients: bucket_bytes must be a positive int, got {bucket_bytes!r}")
    params = _parameter_list(params)
    averaged: dict[int, Tensor] = {}
    for bucket in _buckets(params, bucket_bytes):
        flat = None  # the bucket's gradients packed on their device: one download, one upload
        for p in bucket:
            g = grads.tensor(p) if p in grads else ops.full(p.shape, 0.0, dtype=p.dtype, device=p.device)
            column = ops.reshape(g, (g.numel, 1))
            flat = column if flat is None else ops.concat_rows(flat, column)
        host = flat.numpy().ravel(order="F")
        mean = comm.all_reduce(host, average=True).astype(host.dtype, copy=False)
        packed = ops.as_tensor(mean.reshape(-1, 1), like=flat)
        for p, g in zip(bucket, ops._unpack_columns(packed, [(p.numel, p.shape) for p in bucket])):
            averaged[id(p)] = g
    return Gradients({p: averaged[id(p)] for p in params})


def _buckets(params: Sequence[Tensor], bucket_bytes: int) -> list[list[Tensor]]:
    """Parameters in order, grouped by dtype into runs of at most bucket_bytes (a parameter
    larger than that is a bucket of its own)."""
    buckets: list[list[Tensor]] = []
    open_bucket: dict[str, tuple[list[Tensor], int]] = {}
    for p in params:
        size = p.numel * np.dtype(NUMPY_DTYPES[p.dtype]).itemsize
        members, used = open_bucket.get(p.dtype, ([], 0))
        if members and used + size > bucket_bytes:
            buckets.append(members)
            members, used = [], 0
        open_bucket[p.dtype] = (members + [p], used + size)
    buckets += [members for members, _ in open_bucket.values() if members]
    return buckets


# ---- dp_train ---------------------------------------------------------------------------------

class DPTrainResult(NamedTuple):
    """What dp_train returns: the trained model (rank 0's, the same on every rank), its
    parameters, and the loss of each iteration averaged over the ranks."""

    model: object
    params: dict
    loss_history: list[float]


def dp_train(make_model: Callable, data: Sequence, loss_fn: Callable | None = None, forward_fn: Callable | None = None,
             target_fn: Callable | None = None, n_iter: int = 10, lr: float = 1e-3, max_norm: float = math.inf,
             verbose: int | bool = 10, comm: Communicator | None = None) -> DPTrainResult:
    """Data-parallel Adam, as the original's dp_train: each rank (one per process) builds the
    model with ``make_model()`` (rank 0's weights are broadcast), and at iteration i rank r
    trains on sample ``data[(i * n_ranks + r) % len(data)]``: ``forward_fn(model, sample)`` (or
    ``model(sample)``), then ``loss_fn(output, target_fn(sample))`` (or the output itself is the
    loss). The gradients are averaged over the ranks, clipped to ``max_norm``, and every rank
    takes the same Adam step. Rank 0 prints the mean loss at the first iteration and every
    ``verbose`` iterations (False: never). Without mpiexec it is a single replica."""
    comm = comm or world()
    if isinstance(n_iter, bool) or not isinstance(n_iter, int) or n_iter < 1:
        raise ValueError(f"dp_train: n_iter must be a positive int, got {n_iter!r}")
    if not isinstance(data, Sequence) or len(data) == 0:
        raise ValueError("dp_train: data must be a non-empty sequence of samples")
    model = make_model()
    params = model.parameters()
    broadcast_parameters(model, comm)
    optimizer = Adam(params, lr=lr)
    every = int(verbose)
    history: list[float] = []
    for i in range(n_iter):
        sample = data[(i * comm.size + comm.rank) % len(data)]
        with grad_tape():
            output = forward_fn(model, sample) if forward_fn is not None else model(sample)
            loss = output if loss_fn is None else loss_fn(output, target_fn(sample) if target_fn is not None else sample)
        grads = all_reduce_gradients(backward(loss), params, comm)
        if math.isfinite(max_norm):
            clip_grad_norm(params, grads, max_norm)
        optimizer.step(grads)
        history.append(float(comm.all_reduce(np.array([loss.item()]), average=True)[0]))
        if every and comm.is_root and (i == 0 or (i + 1) % every == 0):
            print(f"[dp_train] iter {i + 1:4d} / {n_iter}  loss = {history[-1]:.6f}", flush=True)
    return DPTrainResult(model, params, history)
