"""Benchmarks of the CPU engine against numpy and PyTorch, measured side by side in one run.

    python scripts/bench_core.py [--quick] [--markdown BENCHMARKS.md]

Figures: dispatch overhead of a tiny eager op; matmul GFLOP/s at 64, 256 and 1024 (f32);
forward + backward + Adam of a 4-256-256-2 MLP at batch 64. Every figure is the median of
several rounds; the PyTorch column is left out where torch is not installed
(`pip install torch==2.13.0`).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np

import rlkit.core as rc

try:
    import torch
except ImportError:
    torch = None


def median_seconds(fn, iters: int, rounds: int) -> float:
    """Median over rounds of the mean time per call of fn."""
    for _ in range(max(3, iters // 10)):
        fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        times.append((time.perf_counter() - start) / iters)
    return statistics.median(times)


# ---- dispatch overhead -------------------------------------------------------------------

def bench_dispatch(iters: int, rounds: int) -> dict:
    a_np = np.random.rand(4, 1).astype(np.float32)
    b_np = np.random.rand(4, 1).astype(np.float32)
    a, b = rc.tensor(a_np), rc.tensor(b_np)
    row = {"rlkit": median_seconds(lambda: rc.add(a, b), iters, rounds),
           "numpy": median_seconds(lambda: np.add(a_np, b_np), iters, rounds)}
    if torch is not None:
        ta, tb = torch.from_numpy(a_np), torch.from_numpy(b_np)
        row["torch"] = median_seconds(lambda: torch.add(ta, tb), iters, rounds)
    return row


# ---- matmul ------------------------------------------------------------------------------

def bench_matmul(n: int, rounds: int) -> dict:
    a_np = np.asfortranarray(np.random.rand(n, n).astype(np.float32))
    b_np = np.asfortranarray(np.random.rand(n, n).astype(np.float32))
    a, b = rc.tensor(a_np), rc.tensor(b_np)
    iters = max(3, int(2e8 / n**3))
    flops = 2.0 * n**3
    row = {"rlkit": flops / median_seconds(lambda: rc.matmul(a, b), iters, rounds) / 1e9,
           "numpy": flops / median_seconds(lambda: a_np @ b_np, iters, rounds) / 1e9}
    if torch is not None:
        ta, tb = torch.from_numpy(np.ascontiguousarray(a_np)), torch.from_numpy(np.ascontiguousarray(b_np))
        row["torch"] = flops / median_seconds(lambda: torch.mm(ta, tb), iters, rounds) / 1e9
    return row


# ---- MLP training step -------------------------------------------------------------------

SIZES = [4, 256, 256, 2]
BATCH = 64


def mlp_init(rng) -> list[tuple[np.ndarray, np.ndarray]]:
    layers = []
    for n_in, n_out in zip(SIZES[:-1], SIZES[1:]):
        limit = np.sqrt(6.0 / (n_in + n_out))
        layers.append((rng.uniform(-limit, limit, (n_out, n_in)).astype(np.float32), np.zeros((n_out, 1), np.float32)))
    return layers


def rlkit_step_fn(layers, x_np, y_np):
    params = [(rc.param(W), rc.param(b)) for W, b in layers]
    opt = rc.optim.Adam([p for pair in params for p in pair], lr=1e-3)
    x, y = rc.tensor(x_np), rc.tensor(y_np)

    def step():
        with rc.grad_tape():
            h = x
            for i, (W, b) in enumerate(params):
                h = W @ h + b
                if i < len(params) - 1:
                    h = rc.relu(h)
            loss = rc.mse_loss(h, y)
        rc.backward(loss)
        opt.step()
        opt.zero_grad()

    return step


def numpy_step_fn(layers, x, y):
    """The same step written by hand in numpy: forward, backward, Adam."""
    params = [p.copy() for pair in layers for p in pair]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    state = {"t": 0}
    lr, b1, b2, eps = 1e-3, 0.9, 0.999, 1e-8

    def step():
        Ws, bs = params[0::2], params[1::2]
        acts, pre = [x], []
        for i, (W, b) in enumerate(zip(Ws, bs)):
            z = W @ acts[-1] + b
            pre.append(z)
            acts.append(np.maximum(z, 0) if i < len(Ws) - 1 else z)
        g = 2.0 * (acts[-1] - y) / y.size
        grads = [None] * len(params)
        for i in reversed(range(len(Ws))):
            if i < len(Ws) - 1:
                g = g * (pre[i] > 0)
            grads[2 * i] = g @ acts[i].T
            grads[2 * i + 1] = g.sum(axis=1, keepdims=True)
            g = Ws[i].T @ g
        state["t"] += 1
        t = state["t"]
        for p, gp, mp, vp in zip(params, grads, m, v):
            mp *= b1
            mp += (1 - b1) * gp
            vp *= b2
            vp += (1 - b2) * gp * gp
            p -= lr / (1 - b1**t) * mp / (np.sqrt(vp / (1 - b2**t)) + eps)

    return step


def torch_step_fn(layers, x, y):
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2)
    )
    with torch.no_grad():
        for lin, (W, b) in zip([model[0], model[2], model[4]], layers):
            lin.weight.copy_(torch.from_numpy(W))
            lin.bias.copy_(torch.from_numpy(b[:, 0]))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    tx, ty = torch.from_numpy(np.ascontiguousarray(x.T)), torch.from_numpy(np.ascontiguousarray(y.T))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(tx), ty)
        loss.backward()
        opt.step()

    return step


def bench_mlp(iters: int, rounds: int) -> dict:
    rng = np.random.default_rng(0)
    layers = mlp_init(rng)
    x = rng.standard_normal((4, BATCH)).astype(np.float32)
    y = rng.standard_normal((2, BATCH)).astype(np.float32)
    row = {"rlkit": median_seconds(rlkit_step_fn(layers, np.asfortranarray(x), np.asfortranarray(y)), iters, rounds),
           "numpy": median_seconds(numpy_step_fn(layers, x, y), iters, rounds)}
    if torch is not None:
        row["torch"] = median_seconds(torch_step_fn(layers, x, y), iters, rounds)
    return row


# ---- report ------------------------------------------------------------------------------

def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    versions = f"numpy {np.__version__}" + (f", torch {torch.__version__}" if torch is not None else ", torch absent")
    return f"{cpu}, {os.cpu_count()} cores, {rc.get_num_threads()} rlkit threads; {versions}"


def report(dispatch: dict, matmuls: dict, mlp: dict) -> str:
    has_torch = "torch" in dispatch
    lines = [f"Machine: {machine()}.", ""]

    lines += ["| tiny eager op (add, 4 elements) | rlkit | numpy | torch | rlkit / numpy | rlkit / torch |",
              "|---|---|---|---|---|---|"]
    us = {k: v * 1e6 for k, v in dispatch.items()}
    lines.append(f"| time per call (us) | {us['rlkit']:.2f} | {us['numpy']:.2f} | "
                 f"{us['torch']:.2f} | {us['rlkit'] / us['numpy']:.2f}x | {us['rlkit'] / us['torch']:.2f}x |"
                 if has_torch else
                 f"| time per call (us) | {us['rlkit']:.2f} | {us['numpy']:.2f} | - | {us['rlkit'] / us['numpy']:.2f}x | - |")

    lines += ["", "| matmul f32, n x n @ n x n | rlkit GFLOP/s | numpy GFLOP/s | torch GFLOP/s | rlkit / numpy | rlkit / torch |",
              "|---|---|---|---|---|---|"]
    for n, row in matmuls.items():
        torch_cells = (f"{row['torch']:.1f} | {row['rlkit'] / row['torch']:.2f}x") if has_torch else "- | -"
        lines.append(f"| n = {n} | {row['rlkit']:.1f} | {row['numpy']:.1f} | "
                     f"{torch_cells.split(' | ')[0]} | {row['rlkit'] / row['numpy']:.2f}x | {torch_cells.split(' | ')[1]} |")

    lines += ["", "| MLP 4-256-256-2, batch 64: forward + backward + Adam | rlkit | numpy (by hand) | torch eager | numpy / rlkit | torch / rlkit |",
              "|---|---|---|---|---|---|"]
    ms = {k: v * 1e3 for k, v in mlp.items()}
    torch_cells = (f"{ms['torch']:.3f}", f"{ms['torch'] / ms['rlkit']:.2f}x") if has_torch else ("-", "-")
    lines.append(f"| time per step (ms) | {ms['rlkit']:.3f} | {ms['numpy']:.3f} | {torch_cells[0]} | "
                 f"{ms['numpy'] / ms['rlkit']:.2f}x | {torch_cells[1]} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    parser.add_argument("--markdown", help="also write the tables into this file, between the bench_core markers")
    args = parser.parse_args()
    rounds = 3 if args.quick else 9
    if torch is not None:
        torch.set_num_threads(rc.get_num_threads())

    dispatch = bench_dispatch(2000 if args.quick else 20000, rounds)
    matmuls = {n: bench_matmul(n, rounds) for n in (64, 256, 1024)}
    mlp = bench_mlp(50 if args.quick else 300, rounds)
    text = report(dispatch, matmuls, mlp)
    print(text)
    if args.markdown:
        write_section(args.markdown, text)


def write_section(path: str, text: str) -> None:
    begin, end = "<!-- bench_core begin -->", "<!-- bench_core end -->"
    with open(path) as f:
        doc = f.read()
    if begin not in doc or end not in doc:
        raise SystemExit(f"{path} has no {begin} ... {end} section to fill")
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(path, "w") as f:
        f.write(f"{head}{begin}\n{text}\n{end}{tail}")


if __name__ == "__main__":
    main()
