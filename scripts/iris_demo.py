"""The autograd guide's iris example (the seed vignette, sections 3-9) on rlkit.

Standardised iris measurements in columns ([4, 150]), one-hot species ([3, 150]), a 120/30
split; then: a Sequential model with BatchNorm and Dropout trained with Adam in a manual
loop, the LayerNorm variant, the LR schedulers, gradient clipping and the anomaly check, the
DataLoader, eval-mode prediction in chunks, and the raw-parameter network. Prints each
model's validation accuracy.

    python scripts/iris_demo.py
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

import rlkit.core as rc
from rlkit.core import nn

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "iris.csv")
SPECIES = ("setosa", "versicolor", "virginica")


def load_iris() -> tuple[np.ndarray, np.ndarray]:
    """x [4, 150] standardised per feature, y one-hot [3, 150]."""
    raw = np.genfromtxt(DATA, delimiter=",", skip_header=1, dtype=str)
    x = raw[:, :4].astype(np.float64)
    x = (x - x.mean(axis=0)) / x.std(axis=0, ddof=1)  # R's scale()
    labels = np.array([SPECIES.index(s) for s in raw[:, 4]])
    return np.asfortranarray(x.T), np.asfortranarray(np.eye(3)[labels].T)


def accuracy(probs: np.ndarray, y_onehot: np.ndarray) -> float:
    return float((probs.argmax(axis=0) == y_onehot.argmax(axis=0)).mean())


def predict(model, x: np.ndarray, chunk: int = 64) -> np.ndarray:
    """Section 8: softmax probabilities, forwarded in chunks."""
    outs = []
    with rc.no_grad():
        for start in range(0, x.shape[1], chunk):
            outs.append(rc.softmax(model(rc.tensor(x[:, start:start + chunk]))).numpy())
    return np.concatenate(outs, axis=1)


def train_manual(model, opt, x_tr, y_tr, epochs: int, batch: int, rng, label: str) -> None:
    """Section 4's loop: shuffle, slice batches, tape, backward, step, zero_grad."""
    n = x_tr.shape[1]
    model.train()
    for epoch in range(1, epochs + 1):
        perm = rng.permutation(n)
        for b in range(int(np.ceil(n / batch))):
            idx = perm[b * batch:(b + 1) * batch]
            with rc.grad_tape():
                loss = rc.softmax_cross_entropy_loss(model(rc.tensor(x_tr[:, idx])), y_tr[:, idx])
            grads = rc.backward(loss)
            opt.step(grads)
            opt.zero_grad()
        if epoch % 50 == 0:
            print(f"  [{label}] epoch {epoch:3d}  loss {loss.item():.4f}")


def main(seed: int = 42) -> dict[str, float]:
    rc.manual_seed(seed)
    rng = np.random.default_rng(seed)
    x_all, y_all = load_iris()
    idx = rng.permutation(150)
    x_tr, y_tr = np.asfortranarray(x_all[:, idx[:120]]), np.asfortranarray(y_all[:, idx[:120]])
    x_vl, y_vl = np.asfortranarray(x_all[:, idx[120:]]), np.asfortranarray(y_all[:, idx[120:]])
    results = {}

    # 3. Sequential with BatchNorm and Dropout; 4. Adam and the training loop
    model = nn.Sequential(
        nn.Linear(4, 64, activation="relu"), nn.BatchNorm(64), nn.Dropout(0.3),
        nn.Linear(64, 32, activation="relu"), nn.Linear(32, 3),
    )
    print(f"Parameter tensors: {len(model.parameters())}")
    opt = rc.optim.Adam(model.parameters(), lr=1e-3)
    train_manual(model, opt, x_tr, y_tr, epochs=150, batch=32, rng=rng, label="batch norm")
    model.eval()  # 8. eval mode: dropout off, batch norm on running statistics
    results["sequential"] = accuracy(predict(model, x_vl), y_vl)

    # The LayerNorm variant
    model_ln = nn.Sequential(nn.Linear(4, 64, activation="relu"), nn.LayerNorm(64),
                             nn.Linear(64, 32, activation="relu"), nn.Linear(32, 3))
    print(f"LayerNorm model parameters: {len(model_ln.parameters())}")
    opt_ln = rc.optim.SGD(model_ln.parameters(), lr=0.05, momentum=0.9)
    train_manual(model_ln, opt_ln, x_tr, y_tr, epochs=100, batch=32, rng=rng, label="layer norm")
    results["layer_norm"] = accuracy(predict(model_ln, x_vl), y_vl)

    # 5. LR schedulers (each drives its own optimizer here; call step() once per epoch)
    for make in (lambda o: rc.sched.CosineLR(o, T_max=150, lr_min=1e-5),
                 lambda o: rc.sched.StepLR(o, step_size=30, gamma=0.5),
                 lambda o: rc.sched.CosineLR(o, T_max=20, lr_min=1e-5, restart=True, T_mult=2),
                 lambda o: rc.sched.OneCycleLR(o, max_lr=1e-2, total_steps=150),
                 lambda o: rc.sched.CyclicLR(o, base_lr=1e-4, max_lr=1e-2, step_size_up=25),
                 lambda o: rc.sched.WarmupCosineLR(o, warmup_steps=10, total_steps=150)):
        scheduler = make(rc.optim.Adam(model.parameters(), lr=1e-3))
        lrs = [scheduler.step() for _ in range(150)]
        print(f"  {type(scheduler).__name__:15s} lr: first {lrs[0]:.2e}, max {max(lrs):.2e}, last {lrs[-1]:.2e}")

    # 6. Gradient clipping and the anomaly check
    model.train()
    params = list(model.parameters().values())
    with rc.grad_tape():
        loss = rc.softmax_cross_entropy_loss(model(rc.tensor(x_tr)), y_tr)
    grads = rc.backward(loss)
    norm = rc.clip_grad_norm(params, grads, max_norm=5.0)
    largest = rc.clip_grad_value(params, grads, clip_value=1.0)
    report = rc.check_grad_anomaly(params, grads, action="warn")
    print(f"  gradient norm {norm:.4f}, largest |g| {largest:.4f}, statuses {sorted({r['status'] for r in report})}")
    opt.step(grads)
    opt.zero_grad()

    # 7. The DataLoader
    loader = rc.DataLoader(x_tr, y_tr, batch_size=32, shuffle=True, seed=seed)
    for _ in range(100):
        for batch in loader.epoch():
            with rc.grad_tape():
                loss = rc.softmax_cross_entropy_loss(model(batch.x), batch.y)
            opt.step(rc.backward(loss))
            opt.zero_grad()
    model.eval()
    results["after_dataloader"] = accuracy(predict(model, x_vl), y_vl)

    # 9. Raw parameters: full manual control
    W1 = rc.param(rng.standard_normal((64, 4)) * np.sqrt(2 / 4), name="W1")
    b1 = rc.param(np.zeros((64, 1)), name="b1")
    W2 = rc.param(rng.standard_normal((3, 64)) * np.sqrt(2 / 64), name="W2")
    b2 = rc.param(np.zeros((3, 1)), name="b2")

    def forward(x):
        return rc.add(rc.matmul(W2, rc.relu(rc.add(rc.matmul(W1, x), b1))), b2)

    opt_raw = rc.optim.Adam({"W1": W1, "b1": b1, "W2": W2, "b2": b2}, lr=1e-3)
    n = x_tr.shape[1]
    for _ in range(200):
        perm = rng.permutation(n)
        for b in range(int(np.ceil(n / 32))):
            bidx = perm[b * 32:(b + 1) * 32]
            with rc.grad_tape():
                loss_r = rc.softmax_cross_entropy_loss(forward(rc.tensor(x_tr[:, bidx])), y_tr[:, bidx])
            opt_raw.step(rc.backward(loss_r))
            opt_raw.zero_grad()
    results["raw_params"] = accuracy(predict(forward, x_vl), y_vl)

    for name, acc in results.items():
        print(f"Val accuracy ({name}): {acc:.4f}")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=42, help="the split's and the weights' seed (default 42)")
    accuracies = main(parser.parse_args().seed)
    sys.exit(0 if min(accuracies.values()) >= 0.9 else 1)
