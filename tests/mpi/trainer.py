"""Run by tests/test_parallel.py: Trainer(distributed=True) on a regression, each rank on its
shard (batches of 4), TensorBoard logs and a checkpoint in the folder argv[1]; rank 0 saves the
history and the parameters to argv[1]/result.npz, training on the device argv[3] (each rank on
its own GPU where the machine has several). With no mpiexec it is the one-rank reference at the
batch size argv[2]."""

import os
import sys

import numpy as np

import rlkit.core as rc
from rlkit.core import nn
from rlkit.train import ModelCheckpoint, Trainer


def mean_abs_error(pred, target):
    return float(np.mean(np.abs(pred - target)))


def data(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(3, n))
    return np.asfortranarray(x), np.asfortranarray(np.vstack([x[0] * x[1], np.tanh(x[2])]))


def run(folder, batch_size, distributed, device="cpu"):
    rc.device(device)
    rc.manual_seed(11 if not distributed else 11 + int(os.environ.get("PMI_RANK", "0")))  # ranks differ until the broadcast
    model = nn.Sequential(nn.Linear(3, 16, activation="tanh"), nn.Linear(16, 2))
    trainer = Trainer(model, rc.mse_loss, rc.optim.Adam(model.parameters(), lr=0.02), metrics=[mean_abs_error],
                      logdir=os.path.join(folder, "logs"), callbacks=[ModelCheckpoint(os.path.join(folder, "last.ckpt"))],
                      distributed=distributed)
    history = trainer.fit(data(40, 1), val=data(20, 2), epochs=3, batch_size=batch_size, shuffle=False)
    if trainer.is_root:
        np.savez(os.path.join(folder, "result.npz"), **{k.replace("/", "_"): np.array(v) for k, v in history.items()},
                 **model.state_dict())


if __name__ == "__main__":
    run(sys.argv[1], int(sys.argv[2]), distributed=True, device=sys.argv[3])
