"""The main job (for now): a small MLP learns a synthetic regression task on the CPU.

Targets are y = [sin(2 x0) + x1 x2, cos(3 x3) - x0^2] for x uniform in [-1, 1]^4. The script
prints the training loss as it falls and a held-out loss at the end, and exits non-zero if
the loss did not fall by at least 10x.

    python scripts/train_supervised.py [--steps 1500] [--batch 64] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import rlkit.core as rc


def make_data(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Column-major data: x [4, n], y [2, n]."""
    x = rng.uniform(-1.0, 1.0, size=(4, n))
    y = np.stack([np.sin(2 * x[0]) + x[1] * x[2], np.cos(3 * x[3]) - x[0] ** 2])
    return np.asfortranarray(x, dtype=np.float32), np.asfortranarray(y, dtype=np.float32)


def make_mlp(sizes: list[int], rng: np.random.Generator) -> list[tuple[rc.Tensor, rc.Tensor]]:
    """Weights [out, in] with He-uniform init and zero biases [out, 1]."""
    layers = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        limit = np.sqrt(6.0 / n_in)
        W = rc.param(rng.uniform(-limit, limit, size=(n_out, n_in)), name=f"W{i}")
        b = rc.param(np.zeros((n_out, 1)), name=f"b{i}")
        layers.append((W, b))
    return layers


def forward(layers, x: rc.Tensor) -> rc.Tensor:
    h = x
    for i, (W, b) in enumerate(layers):
        h = W @ h + b  # [out, batch]
        if i < len(layers) - 1:
            h = rc.relu(h)
    return h


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    x_train, y_train = make_data(4096, rng)
    x_test, y_test = make_data(1024, rng)
    layers = make_mlp([4, 64, 64, 2], rng)
    params = [p for layer in layers for p in layer]
    opt = rc.optim.Adam(params, lr=args.lr)

    print(f"rlkit {rc.devices()[0]['name']} backend, {rc.get_num_threads()} threads; MLP 4-64-64-2, Adam lr {args.lr}")
    start = time.perf_counter()
    first = recent = None
    for step in range(1, args.steps + 1):
        idx = rng.integers(0, x_train.shape[1], size=args.batch)
        with rc.grad_tape():
            loss = rc.mse_loss(forward(layers, rc.tensor(x_train[:, idx])), y_train[:, idx])
        rc.backward(loss)
        opt.step()
        opt.zero_grad()
        value = loss.item()
        first = value if first is None else first
        recent = value if recent is None else 0.9 * recent + 0.1 * value
        if step == 1 or step % 100 == 0:
            print(f"step {step:5d}  loss {recent:.5f}")
    with rc.no_grad():
        test_loss = rc.mse_loss(forward(layers, rc.tensor(x_test)), y_test).item()
    elapsed = time.perf_counter() - start
    print(f"held-out loss {test_loss:.5f} (first batch {first:.5f}); {args.steps / elapsed:.0f} steps/s")
    if not test_loss < first / 10:
        print("FAILED: the loss did not fall by 10x", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
