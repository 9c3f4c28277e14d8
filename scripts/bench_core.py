"""Benchmarks of the CPU engine against numpy and PyTorch, measured side by side in one run.

    python scripts/bench_core.py [--quick] [--markdown BENCHMARKS.md]
    python scripts/bench_core.py --gpu [--markdown BENCHMARKS.md]   # the GPU column, on a GPU machine
    python scripts/bench_core.py --gpu-matmul [--quick]              # the GPU matmul table alone

Figures: dispatch overhead of a tiny eager op; matmul GFLOP/s at 64, 256 and 1024 (f32; on the GPU,
TFLOP/s at 1024 to 8192, f32 and f16; `--gpu-matmul` runs that table alone);
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
from rlkit import _native

try:
    import torch
except ImportError:
    torch = None


def median_seconds(fn, iters: int, rounds: int, sync=lambda: None) -> float:
    """Median over rounds of the mean time per call of fn; ``sync`` drains a device before
    and after each round (a GPU's queue), so queued work is counted where it is done."""
    for _ in range(max(3, iters // 10)):
        fn()
    sync()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        times.append((time.perf_counter() - start) / iters)
    return statistics.median(times)


def gpu_seconds(fn, sync, iters: int, rounds: int) -> float:
    """median_seconds with a device to drain."""
    return median_seconds(fn, iters, rounds, sync)


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


def rlkit_step_fn(layers, x_np, y_np, device="cpu"):
    params = [(rc.param(W, device=device), rc.param(b, device=device)) for W, b in layers]
    opt = rc.optim.Adam([p for pair in params for p in pair], lr=1e-3)
    x, y = rc.tensor(x_np, device=device), rc.tensor(y_np, device=device)

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


def rlkit_captured_step_fn(layers, x_np, y_np, device="cpu"):
    """The same step as one captured program (rc.capture_step): the batch is uploaded and the
    loss read back at every call, as in a training loop."""
    previous = rc.device(device)
    params = [(rc.param(W), rc.param(b)) for W, b in layers]
    flat = [p for pair in params for p in pair]
    opt = rc.optim.Adam(flat, lr=1e-3)

    def forward(x):
        h = x
        for i, (W, b) in enumerate(params):
            h = W @ h + b
            if i < len(params) - 1:
                h = rc.relu(h)
        return h

    step = rc.capture_step(lambda x, y: rc.mse_loss(forward(x), y), flat, opt)
    rc.device(previous)

    def run():
        previous = rc.device(device)
        step(x=x_np, y=y_np)
        rc.device(previous)

    return run


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


def torch_step_fn(layers, x, y, device="cpu", upload_and_read=False):
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2)
    )
    with torch.no_grad():
        for lin, (W, b) in zip([model[0], model[2], model[4]], layers):
            lin.weight.copy_(torch.from_numpy(W))
            lin.bias.copy_(torch.from_numpy(b[:, 0]))
    model = model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    hx, hy = torch.from_numpy(np.ascontiguousarray(x.T)), torch.from_numpy(np.ascontiguousarray(y.T))
    tx, ty = hx.to(device), hy.to(device)

    def step():
        bx, by = (hx.to(device), hy.to(device)) if upload_and_read else (tx, ty)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(bx), by)
        loss.backward()
        opt.step()
        if upload_and_read:
            loss.item()

    return step


def bench_mlp(iters: int, rounds: int) -> dict:
    rng = np.random.default_rng(0)
    layers = mlp_init(rng)
    x = rng.standard_normal((4, BATCH)).astype(np.float32)
    y = rng.standard_normal((2, BATCH)).astype(np.float32)
    xf, yf = np.asfortranarray(x), np.asfortranarray(y)
    row = {"rlkit": median_seconds(rlkit_step_fn(layers, xf, yf), iters, rounds),
           "numpy": median_seconds(numpy_step_fn(layers, x, y), iters, rounds),
           "captured": median_seconds(rlkit_captured_step_fn(layers, xf, yf), iters, rounds)}
    if torch is not None:
        row["torch"] = median_seconds(torch_step_fn(layers, x, y), iters, rounds)
        row["torch_read"] = median_seconds(torch_step_fn(layers, x, y, upload_and_read=True), iters, rounds)
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
    read_cells = (f"{ms['torch_read']:.3f}", f"{ms['torch_read'] / ms['captured']:.2f}x") if has_torch else ("-", "-")
    lines.append(f"| captured step (rc.capture_step; batch sent, loss read each step) vs torch eager doing the same "
                 f"(ms) | {ms['captured']:.3f} | - | {read_cells[0]} | - | {read_cells[1]} |")
    return "\n".join(lines)


# ---- the GPU column (rlkit's Vulkan backend against PyTorch CUDA on the same machine) -----------

def gpu_matmul_table(rounds: int, cuda_sync) -> list[str]:
    """TFLOP/s of n x n @ n x n on the GPU, f32 and f16, against cuBLAS (true f32: no TF32) where
    PyTorch CUDA is given (cuda_sync), with the kernel rlkit chose for each."""
    lines = ["| matmul, n x n @ n x n | rlkit TFLOP/s | cuBLAS TFLOP/s | rlkit / cuBLAS | rlkit kernel |",
             "|---|---|---|---|---|"]
    for dtype in ("f32", "f16"):
        np_dtype = np.float16 if dtype == "f16" else np.float32
        for n in (1024, 2048, 4096, 8192):
            x = np.random.default_rng(n).standard_normal((n, n)).astype(np_dtype)
            ga = rc.tensor(x, dtype=dtype, device="gpu")
            gb = rc.tensor(x.T.copy(order="F"), dtype=dtype, device="gpu")
            iters = max(2, int((4e12 if dtype == "f16" else 4e11) / n**3))
            ours = 2.0 * n**3 / gpu_seconds(lambda: rc.matmul(ga, gb), rc.synchronize, iters, rounds) / 1e12
            kernel = _native.gpu_matmul_kernel(dtype, n, n)
            if cuda_sync is not None:
                torch.backends.cuda.matmul.allow_tf32 = False  # a true f32 reference
                tx = torch.from_numpy(x).cuda()
                theirs = 2.0 * n**3 / gpu_seconds(lambda: torch.mm(tx, tx), cuda_sync, iters, rounds) / 1e12
                lines.append(f"| {dtype}, n = {n} | {ours:.2f} | {theirs:.2f} | {ours / theirs:.2f}x | {kernel} |")
            else:
                lines.append(f"| {dtype}, n = {n} | {ours:.2f} | - | - | {kernel} |")
    return lines


def bench_gpu(rounds: int) -> str:
    has_cuda = torch is not None and torch.cuda.is_available()
    cuda_sync = torch.cuda.synchronize if has_cuda else None
    lines = [f"GPU: {rc.devices()[1]['name']} (Vulkan) against "
             + (f"PyTorch {torch.__version__} CUDA on {torch.cuda.get_device_name()}" if has_cuda else "no PyTorch CUDA"), ""]

    a = rc.tensor(np.ones((4, 1), np.float32), device="gpu")
    ours = gpu_seconds(lambda: rc.add(a, a), rc.synchronize, 2000, rounds) * 1e6
    row = f"| op dispatch, add of 4 elements (us per op) | {ours:.2f} |"
    if has_cuda:
        ta = torch.ones(4, device="cuda")
        theirs = gpu_seconds(lambda: torch.add(ta, ta), cuda_sync, 2000, rounds) * 1e6
        row += f" {theirs:.2f} | {ours / theirs:.2f}x |"
    else:
        row += " - | - |"
    lines += ["| | rlkit Vulkan | PyTorch CUDA | rlkit / torch |", "|---|---|---|---|", row]

    lines += [""] + gpu_matmul_table(rounds, cuda_sync if has_cuda else None)

    rng = np.random.default_rng(0)
    layers = mlp_init(rng)
    x = rng.standard_normal((4, BATCH)).astype(np.float32)
    y = rng.standard_normal((2, BATCH)).astype(np.float32)
    ours = gpu_seconds(rlkit_step_fn(layers, np.asfortranarray(x), np.asfortranarray(y), "gpu"), rc.synchronize,
                       200, rounds) * 1e3
    lines += ["", "| MLP 4-256-256-2, batch 64: forward + backward + Adam (ms per step) | rlkit Vulkan | torch CUDA eager | torch / rlkit |",
              "|---|---|---|---|"]
    captured = gpu_seconds(rlkit_captured_step_fn(layers, np.asfortranarray(x), np.asfortranarray(y), "gpu"),
                           rc.synchronize, 200, rounds) * 1e3
    if has_cuda:
        theirs = gpu_seconds(torch_step_fn(layers, x, y, "cuda"), cuda_sync, 200, rounds) * 1e3
        theirs_read = gpu_seconds(torch_step_fn(layers, x, y, "cuda", upload_and_read=True), cuda_sync, 200,
                                  rounds) * 1e3
        lines.append(f"| time per step | {ours:.3f} | {theirs:.3f} | {theirs / ours:.2f}x |")
        lines.append(f"| captured step (batch sent, loss read each step) vs torch eager doing the same | "
                     f"{captured:.3f} | {theirs_read:.3f} | {theirs_read / captured:.2f}x |")
    else:
        lines.append(f"| time per step | {ours:.3f} | - | - |")
        lines.append(f"| captured step (batch sent, loss read each step) | {captured:.3f} | - | - |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    parser.add_argument("--markdown", help="also write the tables into this file, between the bench_core markers")
    parser.add_argument("--gpu", action="store_true", help="measure the Vulkan backend against PyTorch CUDA instead")
    parser.add_argument("--gpu-matmul", action="store_true", help="only the GPU matmul table (f32 and f16)")
    args = parser.parse_args()
    rounds = 3 if args.quick else 9
    if args.gpu_matmul:
        has_cuda = torch is not None and torch.cuda.is_available()
        print("\n".join(gpu_matmul_table(rounds, torch.cuda.synchronize if has_cuda else None)))
        return
    if args.gpu:
        text = bench_gpu(rounds)
        print(text)
        if args.markdown:
            write_section(args.markdown, text, "bench_gpu")
        return
    if torch is not None:
        torch.set_num_threads(rc.get_num_threads())

    dispatch = bench_dispatch(2000 if args.quick else 20000, rounds)
    matmuls = {n: bench_matmul(n, rounds) for n in (64, 256, 1024)}
    mlp = bench_mlp(50 if args.quick else 300, rounds)
    text = report(dispatch, matmuls, mlp)
    print(text)
    if args.markdown:
        write_section(args.markdown, text, "bench_core")


def write_section(path: str, text: str, marker: str) -> None:
    begin, end = f"<!-- {marker} begin -->", f"<!-- {marker} end -->"
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
