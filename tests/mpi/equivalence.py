"""Run by tests/test_parallel.py under mpiexec: each rank trains the same MLP on its own shard of
every batch (rows [rank * B, (rank + 1) * B) of a batch of n_ranks * B) with averaged gradients
and Adam, then rank 0 saves the parameters and losses to the file named by argv[1].

    mpiexec -n N python -m mpi4py tests/mpi/equivalence.py OUT.npz [BATCH_PER_RANK] [STEPS] [DEVICE]
"""

import sys

import numpy as np

import rlkit.core as rc
from rlkit.core import nn, parallel


def make_model():
    return nn.Sequential(nn.Linear(3, 8, activation="tanh"), nn.Linear(8, 2))


def batches(n_total: int, steps: int):
    """The same data on every rank: [3, n_total] inputs and [2, n_total] targets per step."""
    rng = np.random.default_rng(123)
    for _ in range(steps):
        x = rng.normal(size=(3, n_total))
        yield x, np.vstack([np.sin(x[0]) + x[1], x[2] * x[0]])


def train(comm, batch_per_rank: int, steps: int, seed: int = 7):
    """Trains on this rank's shards; returns the model's state and the losses (the mean over
    ranks of each step's loss)."""
    rc.manual_seed(seed + comm.rank)  # each rank's weights differ until the broadcast
    model = make_model()
    parallel.broadcast_parameters(model, comm)
    optimizer = rc.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for x, y in batches(batch_per_rank * comm.size, steps):
        shard = slice(comm.rank * batch_per_rank, (comm.rank + 1) * batch_per_rank)
        with rc.grad_tape():
            loss = rc.mse_loss(model(rc.tensor(np.asfortranarray(x[:, shard]))), rc.tensor(np.asfortranarray(y[:, shard])))
        optimizer.step(parallel.all_reduce_gradients(rc.backward(loss), model.parameters(), comm, bucket_bytes=200))
        losses.append(float(comm.all_reduce(np.array([loss.item()]), average=True)[0]))
    return model.state_dict(), losses


if __name__ == "__main__":
    comm = parallel.world()
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 6
    rc.device(sys.argv[4] if len(sys.argv) > 4 else "cpu")
    state, losses = train(comm, batch, steps)
    if comm.is_root:
        np.savez(sys.argv[1], losses=np.array(losses), size=comm.size, **state)
