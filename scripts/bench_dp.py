"""Scaling of data-parallel training over MPI: the same per-rank work with 1 rank and with N.

    python scripts/bench_dp.py [--ranks 2] [--device cpu|gpu] [--steps 40] [--model mlp|mamba]

Each rank trains a model for the given steps, averaging its gradients with the others' every
step (rlkit.core.parallel): an MLP (256 -> 1024 -> 1024 -> 16, batch 256 per rank, Adam), or a
Mamba model (a linear embedding to width 512, a MambaBlock with d_state 64 and 64-wide heads,
a linear readout; 8 sequences of 512 tokens per rank, Adam). The figure is samples (MLP) or
tokens (Mamba) per second over all ranks, median of 3 runs, and the scaling efficiency is the N-rank
throughput over N times the 1-rank throughput (1.0 is perfect). On the CPU the machine's cores
are split between the ranks (each rank gets cores / N threads), so the 1-rank run uses them all;
on the GPU the ranks share the one device.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import rlkit.core as rc
from rlkit import cli
from rlkit.core import nn, parallel

WIDTH, BATCH, N_IN, N_OUT = 1024, 256, 256, 16
D_MODEL, D_STATE, TOKENS, SEQUENCES = 512, 64, 512, 8  # the Mamba model's sizes, per rank


class MambaModel(nn.Module):
    """A linear embedding, a Mamba block and a linear readout over [N_IN, TOKENS, SEQUENCES]."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(N_IN, D_MODEL)
        self.block = nn.MambaBlock(D_MODEL, D_STATE, head_dim=64)
        self.readout = nn.Linear(D_MODEL, N_OUT)

    def forward(self, x):
        h = self.embed(x)  # [D_MODEL, TOKENS, SEQUENCES]
        y, _ = self.block(h)  # [D_MODEL, TOKENS, SEQUENCES]
        return self.readout(rc.add(h, y))  # [N_OUT, TOKENS, SEQUENCES]


def model_and_batch(kind: str) -> tuple[nn.Module, tuple[int, ...]]:
    """The model and the shape of one rank's input batch (after its feature rows)."""
    if kind == "mamba":
        return MambaModel(), (TOKENS, SEQUENCES)
    mlp = nn.Sequential(nn.Linear(N_IN, WIDTH, activation="relu"), nn.Linear(WIDTH, WIDTH, activation="relu"),
                        nn.Linear(WIDTH, N_OUT))
    return mlp, (BATCH,)


def timed_run(device: str, steps: int, kind: str) -> float:
    """Seconds for `steps` data-parallel steps on this rank (all ranks start together)."""
    comm = parallel.world()
    rc.set_num_threads(max(1, (os.cpu_count() or 1) // comm.size))
    rc.device(device)
    rc.manual_seed(0)
    rng = np.random.default_rng(comm.rank)
    model, batch_shape = model_and_batch(kind)
    parallel.broadcast_parameters(model, comm)
    optimizer = rc.optim.Adam(model.parameters(), lr=1e-3)
    x = rc.tensor(rng.normal(size=(N_IN, *batch_shape)).astype(np.float32))
    y = rc.tensor(rng.normal(size=(N_OUT, *batch_shape)).astype(np.float32))

    def step():
        with rc.grad_tape():
            loss = rc.mse_loss(model(x), y)
        optimizer.step(parallel.all_reduce_gradients(rc.backward(loss), model.parameters(), comm))

    for _ in range(3):
        step()
    rc.synchronize()
    comm.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    rc.synchronize()
    comm.barrier()
    return time.perf_counter() - start


def run(n_ranks: int, device: str, steps: int, kind: str) -> float:
    """Samples (or tokens) per second of a run with n_ranks processes."""
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "seconds.json")
        command = cli.mpiexec_command(n_ranks, os.path.abspath(__file__),
                                      ["--rank-run", out, device, str(steps), kind])
        finished = subprocess.run(command, capture_output=True, text=True)
        if finished.returncode != 0:
            raise RuntimeError(f"the {n_ranks}-rank run failed:\n{finished.stderr}")
        with open(out) as f:
            seconds = json.load(f)
    return n_ranks * model_and_batch_size(kind) * steps / seconds


def model_and_batch_size(kind: str) -> int:
    """Samples (MLP) or tokens (Mamba) one rank trains on per step."""
    return TOKENS * SEQUENCES if kind == "mamba" else BATCH


def main() -> None:
    if "--rank-run" in sys.argv:  # one rank of a run that main() launched
        at = sys.argv.index("--rank-run")
        out, device, steps, kind = sys.argv[at + 1], sys.argv[at + 2], int(sys.argv[at + 3]), sys.argv[at + 4]
        seconds = timed_run(device, steps, kind)
        if parallel.world().is_root:
            with open(out, "w") as f:
                json.dump(seconds, f)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--model", default="mlp", choices=["mlp", "mamba"])
    args = parser.parse_args()
    if args.model == "mamba":
        what, unit = (f"Mamba d_model {D_MODEL}, d_state {D_STATE}, {SEQUENCES} x {TOKENS} tokens per rank",
                      "tokens/s")
    else:
        what, unit = f"MLP {N_IN}-{WIDTH}-{WIDTH}-{N_OUT}, batch {BATCH} per rank", "samples/s"
    print(f"{what}, Adam, {args.steps} steps, device {args.device}, {os.cpu_count()} cores")
    one = statistics.median(run(1, args.device, args.steps, args.model) for _ in range(3))
    many = statistics.median(run(args.ranks, args.device, args.steps, args.model) for _ in range(3))
    print(f"1 rank:  {one:9.0f} {unit}")
    print(f"{args.ranks} ranks: {many:9.0f} {unit}   scaling efficiency {many / (args.ranks * one):.2f}")


if __name__ == "__main__":
    main()
