"""Speed of the state-space and RWKV recurrences against the memory-bandwidth floor, and of the
Mamba demo, on each device present.

    python scripts/bench_ssm.py [--device cpu|gpu|all] [--tokens N] [--demo-epochs N] [--chunk-size N] [--gla-chunk-size N]
                                [--wkv7-chunk-size N] [--profile]

For ssm_scan (Mamba-2 shapes: d_state 128, head_dim 64, 32 heads, 4 sequences) and rwkv_wkv7
(head size 64, 32 heads, 4 sequences): the median time of the forward op, and of the forward op
plus its backward helper (every gradient); then each as a user runs it, by its recurrence and by
its chunked form (ssm_scan's as Mamba-2's SSD), the forward alone and the forward on a tape plus
backward(), and gated_linear_attn (head size 64, 32 heads, 4 sequences) the same way. Each
beside its floor: the bytes an ideal kernel must move (inputs read once, outputs and true
gradients written once; no scratch) over the copy bandwidth measured on the same device in the
same run (a large elementwise op that reads and writes every element). "of floor" = floor time
/ measured time. Then the Mamba demo (scripts/mamba_train_demo.py, default sizes) trained for a
few epochs: seconds per epoch. ``--profile`` prints instead where each form's forward+backward
spends its time, by kernel (captured, with a timestamp after every dependency level on the GPU,
every node on the CPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import statistics
import sys
import time
from typing import Callable

import numpy as np

import rlkit.core as rc
from rlkit import _native
from rlkit.core import ops

F32 = 4  # bytes


def median_seconds(fn, rounds: int = 7, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
        rc.synchronize()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        rc.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Bytes per second of an op reading and writing 256 MiB (the device's copy bandwidth)."""
    x = rc.full((64 * 1024 * 1024, 1), 1.0)
    seconds = median_seconds(lambda: rc.scale(x, 1.0))
    return 2 * x.numel * F32 / seconds


def tensors(rng, shapes: dict) -> dict:
    return {name: rc.tensor(np.asfortranarray(gen(rng, shape), dtype=np.float32)) for name, (shape, gen) in shapes.items()}


def normal(rng, shape):
    return rng.normal(size=shape)


def timed(description: str, forward, forward_backward, read: int, written: int) -> dict:
    """The median times of ``forward()`` and ``forward_backward()``, with the bytes an ideal
    kernel moves: forward, the float inputs in (``read``) and the outputs out (``written``);
    backward, the outputs' gradients and the inputs in, a gradient per float input out."""
    return {
        "op": description,
        "forward": median_seconds(forward),
        "forward_backward": median_seconds(forward_backward),
        "bytes_forward": read + written,
        "bytes_forward_backward": (read + written) + (written + read) + read,
    }


def time_op(op: str, inputs: list, description: str) -> dict:
    """The forward op alone, and the forward op plus its backward helper (every gradient)."""
    out = ops.apply(op, tuple(inputs))
    grad = rc.full(out.shape, 1.0)
    return timed(description, lambda: ops.apply(op, tuple(inputs)),
                 lambda: (ops.apply(op, tuple(inputs)), ops.apply(f"{op}_back", (grad, *inputs))),
                 sum(t.numel for t in inputs if t.dtype != "i32") * F32, out.numel * F32)


@dataclasses.dataclass
class TapeCase:
    """A recurrence as a user runs it: ``run(*params)`` gives (y, final state)."""
    description: str
    run: Callable
    inputs: list
    outputs_numel: int


def forward_backward_step(run, params: list):
    """``run(*params)`` on a tape, the sum of its outputs' backward(), the gradients returned."""
    with rc.grad_tape():
        y, final = run(*params)
        loss = rc.add(rc.sum(y), rc.sum(final))
    grads = rc.backward(loss)
    return tuple(grads.tensor(p) for p in params)


def time_on_tape(case: TapeCase) -> dict:
    """The forward alone (no tape), and the forward on a tape plus backward() for the gradient
    of every float input (the recurrence's backward op and the sums of its per-token gradients;
    a chunked form's composed backward)."""
    params = [rc.param(t) for t in case.inputs]

    def forward():
        with rc.no_grad():
            case.run(*params)

    return timed(case.description, forward, lambda: forward_backward_step(case.run, params),
                 sum(t.numel for t in case.inputs) * F32, case.outputs_numel * F32)


def ssm_scan_inputs(rng, n_tok: int) -> tuple[list, object, str]:
    d_state, head_dim, n_head, n_seqs = 128, 64, 32, 4
    t = tensors(rng, {
        "s": ((d_state, head_dim, n_head, n_seqs), normal),
        "x": ((head_dim, n_head, n_tok, n_seqs), normal),
        "dt": ((n_head, n_tok, n_seqs), lambda r, s: r.normal(size=s) - 2.0),
        "A": ((1, n_head), lambda r, s: -np.exp(r.normal(size=s))),
        "B": ((d_state, 1, n_tok, n_seqs), normal),
        "C": ((d_state, 1, n_tok, n_seqs), normal),
    })
    ids = rc.tensor(np.arange(n_seqs, dtype=np.int32))
    return list(t.values()), ids, f"d_state {d_state}, head_dim {head_dim}, {n_head} heads, {n_tok} tokens x {n_seqs}"


def ssm_scan_cases(rng, n_tok: int, chunk_size: int) -> tuple[list[tuple], list[TapeCase]]:
    """The recurrence's op (for its op and backward op), then the recurrence and the chunked
    form as tape cases."""
    inputs, ids, shapes = ssm_scan_inputs(rng, n_tok)
    outputs = inputs[1].numel + inputs[0].numel  # y like x, final states like s
    return [("ssm_scan", inputs + [ids], f"ssm_scan {shapes}")], [
        TapeCase(f"ssm_scan {'recurrence' if size is None else f'chunk_size={size}'}, on a tape",
                 lambda *p, size=size: rc.ssm_scan(*p, ids=ids, chunk_size=size), inputs, outputs)
        for size in (None, chunk_size)]


def gated_linear_attn_cases(rng, n_tok: int, chunk_size: int) -> tuple[list[tuple], list[TapeCase]]:
    """gated_linear_attn (head size 64, 32 heads, 4 sequences, gates in [0.5, 1)), by its
    recurrence and by its chunked form."""
    S, H, n_seqs = 64, 32, 4
    t = tensors(rng, {
        "k": ((S, H, n_tok * n_seqs), lambda r, s: r.normal(size=s) / 8), "v": ((S, H, n_tok * n_seqs), normal),
        "q": ((S, H, n_tok * n_seqs), lambda r, s: r.normal(size=s) / 8),
        "g": ((S, H, n_tok * n_seqs), lambda r, s: r.uniform(0.5, 1.0, size=s)),
        "state": ((S * S * H, n_seqs), normal),
    })
    inputs = list(t.values())
    outputs = inputs[1].numel + inputs[4].numel  # y like v, the final state like state
    return [], [TapeCase(f"gated_linear_attn {'recurrence' if size is None else f'chunk_size={size}'}, on a tape",
                         lambda *p, size=size: rc.gated_linear_attn(*p, scale=0.125, chunk_size=size), inputs, outputs)
                for size in (None, chunk_size)]


def rwkv_wkv7_cases(rng, n_tok: int, chunk_size: int) -> tuple[list[tuple], list[TapeCase]]:
    """rwkv_wkv7's op (for its op and backward op), then the recurrence and the chunked form."""
    S, H, n_seqs = 64, 32, 4
    T = n_tok * n_seqs

    def unit(r, shape):
        x = r.normal(size=shape)
        return x / np.linalg.norm(x, axis=0, keepdims=True)

    t = tensors(rng, {
        "r": ((S, H, T), normal), "w": ((S, H, T), lambda r, s: r.uniform(0.5, 1.0, size=s)),
        "k": ((S, H, T), normal), "v": ((S, H, T), normal),
        "a": ((S, H, T), lambda r, s: -unit(r, s)), "b": ((S, H, T), unit),
        "state": ((S * S * H, n_seqs), normal),
    })
    inputs = list(t.values())
    outputs = inputs[3].numel + inputs[6].numel  # y like v, the final state like state
    return [("rwkv_wkv7", inputs, f"rwkv_wkv7 head size {S}, {H} heads, {n_tok} tokens x {n_seqs}")], [
        TapeCase(f"rwkv_wkv7 {'recurrence' if size is None else f'chunk_size={size}'}, on a tape",
                 lambda *p, size=size: rc.rwkv_wkv7(*p, chunk_size=size), inputs, outputs)
        for size in (None, chunk_size)]


def all_cases(rng, n_tok: int, args) -> tuple[list[tuple], list[TapeCase]]:
    op_rows, tape_cases = [], []
    for make, chunk_size in ((ssm_scan_cases, args.chunk_size), (rwkv_wkv7_cases, args.wkv7_chunk_size),
                             (gated_linear_attn_cases, args.gla_chunk_size)):
        ops_of, cases_of = make(rng, n_tok, chunk_size)
        op_rows += ops_of
        tape_cases += cases_of
    return op_rows, tape_cases


def kernel_profile(case: TapeCase, device: str, replays: int = 10, top: int = 12) -> str:
    """Where ``case``'s forward+backward spends its time: captured, replayed with a timestamp
    after every dependency level (GPU) or node (CPU), the mean microseconds summed by kernel,
    the costliest ``top`` first."""
    params = [rc.param(t) for t in case.inputs]
    set_profiling = _native.set_cpu_profiling if device == "cpu" else _native.set_gpu_profiling
    if set_profiling(True) is False:
        return f"  {case.description}: this device cannot time its queue"
    try:
        step = rc.capture(lambda: forward_backward_step(case.run, params), params)
        for _ in range(replays):
            step()
        rc.synchronize()
    finally:
        set_profiling(False)
    spent: dict[str, list[float]] = {}
    for program in step._programs.values():
        for us, label in program.native.level_times():
            spent.setdefault(label, []).append(us)
    total = sum(sum(times) for times in spent.values())
    lines = [f"  {case.description}: {total / 1e3:.2f} ms captured, {sum(map(len, spent.values()))} levels"]
    for label in sorted(spent, key=lambda label: -sum(spent[label]))[:top]:
        lines.append(f"    {sum(spent[label]) / 1e3:8.3f} ms {100 * sum(spent[label]) / max(total, 1e-9):5.1f}%"
                     f"  x{len(spent[label]):<4} {label}")
    return "\n".join(lines)


def bench_demo(device: str, epochs: int) -> float:
    """Seconds per epoch of the Mamba demo at its default sizes (training time only)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mamba_train_demo.py")
    spec = importlib.util.spec_from_file_location("mamba_train_demo", path)
    demo = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = demo  # its dataclasses look their module up
    spec.loader.exec_module(demo)
    sizes = dataclasses.replace(demo.DEFAULT, n_epoch=epochs)
    rng = np.random.default_rng(20260819)
    batches = [demo.make_batch(rng, sizes) for _ in range(sizes.n_samples)]
    result = demo.train_once(device.upper(), device, sizes, batches, demo.initial_params(rng, sizes), show_trace=False)
    return result["elapsed"] / epochs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="all", choices=["cpu", "gpu", "all"])
    parser.add_argument("--tokens", type=int, default=None, help="tokens per sequence (default: 256 CPU, 2048 GPU)")
    parser.add_argument("--demo-epochs", type=int, default=None, help="demo epochs timed (default: 3 CPU, 60 GPU)")
    parser.add_argument("--chunk-size", type=int, default=64, help="ssm_scan's chunked form: tokens per chunk")
    parser.add_argument("--gla-chunk-size", type=int, default=16, help="gated_linear_attn's chunked form: tokens per chunk")
    parser.add_argument("--wkv7-chunk-size", type=int, default=16, help="rwkv_wkv7's chunked form: tokens per chunk")
    parser.add_argument("--profile", action="store_true",
                        help="instead of the timings: each form's forward+backward by kernel (captured, timestamped)")
    args = parser.parse_args()
    present = [d["device"] for d in rc.devices()]
    devices = [d for d in ("cpu", "gpu") if d in present and args.device in (d, "all")]
    for device in devices:
        previous = rc.device(device)
        try:
            bandwidth = copy_bandwidth()
            n_tok = args.tokens or (2048 if device == "gpu" else 256)
            name = rc.devices()[present.index(device)]["name"]
            print(f"\n{device}: {name}, copy bandwidth {bandwidth / 1e9:.0f} GB/s")
            rng = np.random.default_rng(0)
            op_rows, tape_cases = all_cases(rng, n_tok, args)
            if args.profile:
                for case in tape_cases:
                    print(kernel_profile(case, device))
                continue
            results = ([time_op(*row) for row in op_rows]
                       + [time_on_tape(case) for case in tape_cases])
            for result in results:
                for kind in ("forward", "forward_backward"):
                    floor = result[f"bytes_{kind}"] / bandwidth
                    print(f"  {result['op']:<62} {kind.replace('_', '+'):<17} {result[kind] * 1e3:9.2f} ms"
                          f"   floor {floor * 1e3:7.3f} ms   {100 * floor / result[kind]:5.1f}% of floor")
            epochs = args.demo_epochs or (60 if device == "gpu" else 3)
            per_epoch = bench_demo(device, epochs)
            print(f"  mamba_train_demo (default sizes), {epochs} epochs: {per_epoch:.3f} s per epoch, "
                  f"{60 * per_epoch:.1f} s for the demo's 60")
        finally:
            rc.device(previous)


if __name__ == "__main__":
    main()
