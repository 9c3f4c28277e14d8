"""The original's data-parallel demo (inst/examples/dp_train_demo.R) on rlkit: a synthetic
regression y = W x + noise (4 inputs, 16 hidden, 2 outputs, 128 samples) trained by rc.dp_train
for 100 iterations with 1, 2 and 4 replicas, then its checks.

    python scripts/dp_train_demo.py                  # 1 replica here, 2 and 4 under mpiexec
    rlkit launch -n 2 scripts/dp_train_demo.py       # one run with 2 replicas

Unlike the original, whose replicas take turns in one process, each replica here is its own
process (an MPI rank) computing at the same time; each sees a different sample per iteration,
so the effective batch is the number of replicas.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

import rlkit.core as rc
from rlkit import cli
from rlkit.core import nn, parallel

D_IN, D_HID, D_OUT, N_SAMPLES, N_ITER, LR, MAX_NORM = 4, 16, 2, 128, 100, 5e-3, 5.0


def make_data() -> list[dict]:
    rng = np.random.default_rng(42)
    w_true = rng.normal(size=(D_OUT, D_IN))
    samples = []
    for _ in range(N_SAMPLES):
        x = rng.normal(size=(D_IN, 1))
        samples.append({"x": x, "y": w_true @ x + 0.1 * rng.normal(size=(D_OUT, 1))})
    return samples


def make_model() -> nn.Module:
    """He-initialised weights, zero biases: relu(W1 x + b1) -> W2 h + b2."""
    rc.manual_seed(42)
    return nn.Sequential(nn.Linear(D_IN, D_HID, activation="relu", init="he"), nn.Linear(D_HID, D_OUT, init="he"))


def train(data: list[dict]) -> rc.parallel.DPTrainResult:
    return rc.dp_train(make_model, data, loss_fn=lambda out, y: rc.mse_loss(out, rc.tensor(y)),
                       forward_fn=lambda model, s: model(rc.tensor(s["x"])), target_fn=lambda s: s["y"],
                       n_iter=N_ITER, lr=LR, max_norm=MAX_NORM, verbose=25)


def run_replicas(n: int) -> dict:
    """The loss history and a prediction of a run with n replicas, as n MPI processes."""
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "result.json")
        command = cli.mpiexec_command(n, os.path.abspath(__file__), ["--save", out])
        finished = subprocess.run(command, capture_output=True, text=True)
        sys.stdout.write(finished.stdout)
        if finished.returncode != 0:
            raise RuntimeError(f"the {n}-replica run failed:\n{finished.stderr}")
        with open(out) as f:
            return json.load(f)


def summary(result: rc.parallel.DPTrainResult) -> dict:
    x_new = np.array([[0.5], [-1.0], [0.25], [2.0]])
    prediction = result.model(rc.tensor(x_new)).numpy()
    return {"loss_history": result.loss_history, "prediction": prediction.ravel().tolist(), "device": rc.device()}


def check(results: dict[int, dict]) -> list[str]:
    """The original's checks; the failures, empty when all pass."""
    failures = []
    for n, r in results.items():
        history = np.array(r["loss_history"])
        third = N_ITER // 3
        if len(history) != N_ITER:
            failures.append(f"{n} replicas: {len(history)} losses, expected {N_ITER}")
        if not np.isfinite(history).all():
            failures.append(f"{n} replicas: a loss is not finite")
        if not history[-third:].mean() < history[:third].mean():
            failures.append(f"{n} replicas: the last third's mean loss is not below the first third's")
        if not np.isfinite(r["prediction"]).all():
            failures.append(f"{n} replicas: the prediction is not finite")
        if r["device"] != "cpu":
            failures.append(f"{n} replicas: the default device was left at {r['device']!r}")
    last = {n: np.mean(r["loss_history"][-(N_ITER // 3):]) for n, r in results.items()}
    if 2 in last and not last[2] <= 1.5 * last[1]:
        failures.append(f"2 replicas end at {last[2]:.4f}, above 1.5x the single replica's {last[1]:.4f}")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--save", help=argparse.SUPPRESS)  # one of the runs the single process launches
    save = parser.parse_args().save
    comm = parallel.world()
    data = make_data()
    if save is not None:
        result = summary(train(data))
        if comm.is_root:
            with open(save, "w") as f:
                json.dump(result, f)
        return 0
    if comm.size > 1:  # launched by the user under mpiexec: one run with that many replicas
        result = summary(train(data))
        if comm.is_root:
            print(f"{comm.size} replicas: final loss {result['loss_history'][-1]:.5f}, prediction {result['prediction']}")
        return 0
    print(f"Synthetic regression: {N_SAMPLES} samples, {D_IN} -> {D_HID} -> {D_OUT}, {N_ITER} iterations, lr {LR}")
    results = {}
    for n in (1, 2, 4):
        print(f"\n=== {n} replica{'s' if n > 1 else ''} ===", flush=True)
        results[n] = summary(train(data)) if n == 1 else run_replicas(n)
    print(f"\n{'replicas':>8} {'first loss':>11} {'last-third mean':>16}  prediction for x_new")
    for n, r in results.items():
        history = r["loss_history"]
        print(f"{n:>8} {history[0]:11.5f} {np.mean(history[-(N_ITER // 3):]):16.5f}  "
              f"{np.round(r['prediction'], 4).tolist()}")
    failures = check(results)
    for failure in failures:
        print(f"CHECK FAILED: {failure}")
    if not failures:
        print("all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
