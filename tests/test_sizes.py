"""Sizes that overflow: every op of the op table, given huge, negative and overflowing sizes in
its inputs' shapes and its size attributes, gives a clean ValueError (or, for a legal size too
large for the machine, a MemoryError) and never crashes, hangs or makes a tensor of a wrapped
shape.

Each op is driven through the native table directly (``_native.apply``), with sizes drawn by
hypothesis, twice per draw:

- in a recording graph, with pending inputs (placeholders: no memory behind them, so their sizes
  can be anything a tensor may have): only the shape rules run, and nothing is allocated. The op
  must refuse with a ValueError naming it, or give a pending output whose shape is valid (every
  size >= 1, at most 2^48 bytes), computed here exactly;
- where that output is small or too large for the machine, eagerly with real (zero) inputs: the
  same ValueError, a MemoryError, or a result of that shape.

The draws run in child processes, one per device, so that a crash or a hang is counted instead of
ending the test run: a child that dies or goes silent is restarted after the op it was running.
The public entry points the issue names run there too.
"""

from __future__ import annotations

import collections
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest

import rlkit.core as rc
from rlkit import _native
from rlkit.core.tensor import NUMPY_DTYPES

from conftest import DEVICES

CASES_RUN: collections.Counter = collections.Counter()  # reported by conftest's terminal summary
MAX_BYTES = 2**48  # the native kMaxTensorBytes
F, I = "f32", "i32"
ITEMSIZE = {"f32": 4, "f16": 2, "bf16": 2, "i32": 4, "f64": 8, "u8": 1}
SMALL_BYTES = 1 << 22  # eager runs of outputs up to this; larger legal ones are left to the graph run
# draws per op: the shape rules are the CPU's and the GPU's alike; on the GPU (lavapipe in CI) what
# is added is the eager runs, each slower there
DRAWS_PER_OP = {"cpu": 40, "gpu": 15}
OP_TIMEOUT_S = 60  # a child silent this long on one op is hung


def _shape5(*dims: int) -> list[int]:
    """A shape attribute as the native ops read it: ne[0..3] then ndim."""
    return list(dims) + [1] * (4 - len(dims)) + [max(2, len(dims))]


def _recurrence(n_vectors: int, back: bool, floats: list[float]):
    """Builder of a linear-attention recurrence: vectors [S, H, T], state [S*S*H, n_seqs]; the
    backward helper first takes g [S*H, T + S*n_seqs]."""
    def build(s, h, t, n):
        inputs = [((s, h, t), F)] * n_vectors + [((s * s * h, n), F)]
        if n_vectors == 5:  # rwkv_wkv6: tf [S, H] is the fourth input
            inputs[3] = ((s, h), F)
        if back:
            inputs = [((s * h, t + s * n), F)] + inputs
        return inputs, [], floats
    return build


def _gla_chunks(back: bool):
    """gla_chunks: k, v, q, log_gate [S, H, T], state [S*S*H, n_seqs], chunks of 2 tokens; the
    backward helper takes g first and the forward's output last, each one column [y, final, starts]."""
    def build(s, h, t, n):
        inputs = [((s, h, t), F)] * 4 + [((s * s * h, n), F)]
        if back:
            n_tok = t // n if n and t % n == 0 else max(1, t)
            total = s * h * t + s * s * h * n * (1 + -(-n_tok // 2))
            inputs = [((total,), F)] + inputs + [((total,), F)]
        return inputs, [2], [0.5]
    return build


def _ssd_chunks(back: bool):
    """ssd_chunks: u [P, H, T, N], log_decay [H, T, N], B, C [D, 1, T, N], first [D, P, H, N], chunks
    of 2 tokens; the backward helper takes g first, one column [y, final]."""
    def build(d, p, t, n):
        inputs = [((p, 2, t, n), F), ((2, t, n), F), ((d, 1, t, n), F), ((d, 1, t, n), F), ((d, p, 2, n), F)]
        if back:
            inputs = [((p * 2 * t * n + d * p * 2 * n,), F)] + inputs
        return inputs, [2], []
    return build


def _chunk_terms(back: bool):
    """wkv7_chunk_terms: r, k, v, a, b, log_decay [S, H, T], chunks of 2 tokens, 1 sequence; the
    backward helper takes g first and the forward's output last, each one column."""
    def build(s, h, t, d):
        total = 6 * s * 2 * h * -(-t // 2) + 4 * 4 * h * -(-t // 2) + s * h * -(-t // 2)
        inputs = [((s, h, t), F)] * 6
        if back:
            inputs = [((total,), F)] + inputs + [((total,), F)]
        return inputs, [2, 1], []
    return build


def _chunk_states_inputs(L, S, N, c):
    """wkv7_chunk_states' inputs: W, U, B, K, V [L, S, N, c], decay [S, N, c], Z0 [S, S, N]."""
    return [((L, S, N, c), F)] * 5 + [((S, N, c), F), ((S, S, N), F)]


def _scan(back: bool):
    """Builder of ssm_scan (and its backward helper): d_state a, head_dim b, n_head c, n_tok d."""
    def build(a, b, c, d):
        inputs = [((a, b, c, 1), F), ((b, c, d, 1), F), ((c, d, 1), F), ((1, c), F), ((a, 1, d, 1), F),
                  ((a, 1, d, 1), F), ((1, 1), I)]
        if back:
            inputs = [((b * c * d + a * b * c, 1), F)] + inputs
        return inputs, [], []
    return build


def _chain(a, b, c, d):
    return [((a, b), F)], _shape5(a, b, c, d) + [_native.op_id("neg"), 0, -2], [0.0, 0.0]


def _builders() -> dict:
    """op -> build(a, b, c, d): (inputs [(shape, dtype)], ints, floats), the four drawn sizes placed
    where the op reads sizes (its inputs' shapes and its size attributes)."""
    binary = lambda a, b, c, d: ([((a, b), F), ((c, d), F)], [], [])  # noqa: E731  broadcast both ways
    pair = lambda floats: lambda a, b, c, d: ([((a, b, c, d), F)] * 2, [], floats)  # noqa: E731
    unary = lambda floats: lambda a, b, c, d: ([((a, b, c, d), F)], [], floats)  # noqa: E731
    one = lambda a, b, c, d: ([((a, b), F)], [], [])  # noqa: E731
    by_kind = {"unary": unary, "binary": lambda floats: binary, "backward": pair}  # the elementwise ops
    b = {name: by_kind[kind]([0.0, 1.0][:n_floats]) for name, kind, _, n_floats in _native.elementwise_ops()}
    b["cast"] = lambda a, b_, c, d: ([((a, b_, c, d), F)], [1], [])
    b.update({name: pair([]) for name in ("softmax_back", "log_softmax_back", "softmax_cross_entropy")})
    b["elementwise_chain"] = _chain
    b["matmul"] = lambda m, k, n, d: ([((m, k, d), F), ((k, n), F)], [0, 0], [])
    b["matmul_relu_mask"] = lambda m, k, n, d: ([((m, k, d), F), ((k, n), F), ((m, n, d), F)], [0, 0], [])
    b["linear"] = lambda m, k, n, d: ([((m, k), F), ((k, n, d), F), ((m, 1), F)], [0], [])
    b["sum_to"] = lambda a, b_, c, d: ([((a, b_), F)], _shape5(c, d), [])
    b["expand"] = lambda a, b_, c, d: ([((1, a), F)], _shape5(b_, a, c, d), [])
    b.update(softmax=one, log_softmax=one, max=one, argmax=one, transpose=one, cumsum=one, sample_categorical=one)
    b["permute"] = lambda a, b_, c, d: ([((a, b_, c, d), F)], [3, 1, 0, 2], [])
    b["reshape"] = lambda a, b_, c, d: ([((2, 3), F)], _shape5(a, b_, c, d), [])
    b["slice_rows"] = lambda a, b_, c, d: ([((a, b_), F)], [c, d], [])
    b["pad_rows"] = lambda a, b_, c, d: ([((a, b_), F)], [c, d], [])
    b["concat_rows"] = lambda a, b_, c, d: ([((a, b_), F), ((c, b_), F)], [], [])
    b["gather"] = lambda a, b_, c, d: ([((a, b_), F), ((b_, 1), I)], [], [])
    b["one_hot"] = lambda a, b_, c, d: ([((a, b_), I)], [c, 0], [])
    b["get_rows"] = lambda a, b_, c, d: ([((a, b_), F), ((c, d), I)], [], [])
    b["scatter_cols"] = lambda a, b_, c, d: ([((a, b_), F), ((b_, 1), I)], [c], [])
    b["searchsorted"] = lambda a, b_, c, d: ([((a, 1), F), ((b_, c, d), F)], [], [])
    b["put_cols"] = lambda a, b_, c, d: ([((a, b_), F), ((c, 1), I), ((a, c), F)], [], [])
    b["adam_step"] = lambda a, b_, c, d: ([((8, 1), F), ((1, 1), F)] + [((a, b_), F)] * 4 + [((c, d), F)] * 4, [], [])
    b["sgd_step"] = lambda a, b_, c, d: ([((8, 1), F), ((1, 1), F)] + [((a, b_), F)] * 3 + [((c, d), F)] * 3, [], [])
    b["polyak_step"] = lambda a, b_, c, d: ([((a, b_), F), ((a, b_), F), ((c, d), F), ((c, d), F)], [], [0.5])
    b["cast_into"] = lambda a, b_, c, d: ([((a, b_), "f16"), ((a, b_), F), ((c, d), "bf16"), ((c, d), F)], [], [])
    b["sum_squares"] = lambda a, b_, c, d: ([((a, b_), F), ((c, d), F)], [], [])
    b["full"] = lambda a, b_, c, d: ([], _shape5(a, b_, c, d) + [0], [1.0])
    b["rand"] = lambda a, b_, c, d: ([], _shape5(a, b_, c, d) + [0], [])
    b["randn"] = lambda a, b_, c, d: ([], _shape5(a, b_, c, d) + [0], [])
    b["randint"] = lambda a, b_, c, d: ([((1, 1), F)], _shape5(a, b_, c, d), [])
    b["ssm_conv"] = lambda k, n, t, s: ([((k - 1 + t, n, s), F), ((k, n), F)], [], [])
    b["ssm_conv_sx_back"] = lambda k, n, t, s: ([((n, t, s), F), ((k, n), F)], [], [])
    b["ssm_conv_c_back"] = lambda k, n, t, s: ([((n, t, s), F), ((k - 1 + t, n, s), F)], [], [])
    b["ssm_scan"], b["ssm_scan_back"] = _scan(False), _scan(True)
    b["rwkv_wkv6"], b["rwkv_wkv6_back"] = _recurrence(5, False, []), _recurrence(5, True, [])
    b["gated_linear_attn"], b["gated_linear_attn_back"] = _recurrence(4, False, [0.5]), _recurrence(4, True, [0.5])
    b["rwkv_wkv7"], b["rwkv_wkv7_back"] = _recurrence(6, False, []), _recurrence(6, True, [])
    b["wkv7_chunk_terms"], b["wkv7_chunk_terms_back"] = _chunk_terms(False), _chunk_terms(True)
    b["wkv7_chunk_states"] = lambda a, b_, c, d: (_chunk_states_inputs(a, b_, c, d), [], [])
    b["wkv7_chunk_states_back"] = lambda a, b_, c, d: (
        [((b_ * b_ * c * (d + 1) + a * b_ * c * d,), F)] + _chunk_states_inputs(a, b_, c, d)
        + [((b_ * b_ * c * (d + 1) + a * b_ * c * d,), F)], [], [])
    b["gla_chunks"], b["gla_chunks_back"] = _gla_chunks(False), _gla_chunks(True)
    b["ssd_chunks"], b["ssd_chunks_back"] = _ssd_chunks(False), _ssd_chunks(True)
    # images: x [W, H, C, N], kernels [KW, KH, C_in, C_out]; ints: stride, padding, dilation (w, h), then sizes
    b["conv2d"] = lambda a, b_, c, d: ([((a, b_, 2, 2), F), ((3, 2, 2, 3), F)], [c, d, d, c, 1, 2], [])
    b["conv2d_input_back"] = lambda a, b_, c, d: ([((1, 1, 3, 2), F), ((3, 2, 2, 3), F)], [a, b_, 0, 0, 1, 1, c, d], [])
    b["conv2d_weight_back"] = lambda a, b_, c, d: ([((1, 1, 3, 1), F), ((a, b_, 2, 1), F)], [a, b_, 0, 0, 1, 1, c, d], [])
    b["max_pool2d"] = lambda a, b_, c, d: ([((a, b_, 2, 1), F)], [c, d, c, d, 0, 1], [])
    b["max_pool2d_back"] = lambda a, b_, c, d: ([((1, 1, 2, 1), F), ((a, b_, 2, 1), F)], [c, d, a, b_, 0, 0], [])
    return b


BUILDERS = _builders()


def _valid_shape(shape, dtype) -> bool:
    """Every size >= 1 and at most MAX_BYTES bytes, computed exactly (Python ints)."""
    return all(n >= 1 for n in shape) and int(np.prod([int(n) for n in shape], dtype=object)) * ITEMSIZE[dtype] <= MAX_BYTES


def _outcome(call) -> tuple[str, object]:
    try:
        return "ok", call()
    except ValueError as e:
        return "ValueError", str(e)
    except MemoryError as e:
        return "MemoryError", str(e)
    except RuntimeError as e:  # the GPU's documented refusals (lavapipe's loop budget); never expected on the CPU
        return "RuntimeError", str(e)


def _fits(shape: tuple[int, ...]) -> bool:
    """Whether a shape can be passed to the native side at all (64-bit sizes)."""
    return all(-(2**63) <= n < 2**63 for n in shape)


def check_op(op: str, sizes: list[int], device: str, physical: int) -> str:
    """One draw: the op on pending inputs in a recording graph, then (small or too large outputs)
    eagerly. Returns how it ended; raises AssertionError where it ended wrongly."""
    inputs, ints, floats = BUILDERS[op](*sizes)
    if not all(_fits(shape) for shape, _ in inputs) or not _fits(tuple(ints)):
        return "skipped: a size beyond 64 bits (the Python entry points refuse those)"
    op_id = _native.op_id(op)
    kind, made = _outcome(lambda: [_native.placeholder(list(shape), dtype, device) for shape, dtype in inputs])
    if kind != "ok":  # pending tensors are checked like any other
        assert kind == "ValueError" and not all(_valid_shape(s, d) for s, d in inputs), made
        return "inputs refused (ValueError)"
    assert all(_valid_shape(s, d) for s, d in inputs), f"placeholders of shapes {inputs} were made"
    with _native.Graph():
        kind, out = _outcome(lambda: _native.apply(op_id, made, ints, floats, device))
    if kind == "ValueError":
        assert out.startswith(op + ":"), f"the error does not name {op}: {out}"
        return "ValueError"
    assert kind == "ok", f"{op} on pending inputs: {kind}: {out}"
    assert _valid_shape(out.shape, out.dtype), f"{op} made a tensor of shape {out.shape} {out.dtype}"
    out_bytes = int(np.prod(out.shape, dtype=object)) * ITEMSIZE[out.dtype]
    in_bytes = sum(int(np.prod(s, dtype=object)) * ITEMSIZE[d] for s, d in inputs)
    if in_bytes > SMALL_BYTES or SMALL_BYTES < out_bytes <= physical:
        return "legal pending output (not run: large)"
    real = [_native.from_numpy(np.zeros(shape, NUMPY_DTYPES[dtype], order="F"), dtype, True, device)
            for shape, dtype in inputs]
    kind, result = _outcome(lambda: _native.apply(op_id, real, ints, floats, device))
    if kind == "ok":
        assert result.shape == out.shape, f"{op}: eager shape {result.shape}, pending {out.shape}"
        _native.synchronize(device)
        return "run"
    if device == "gpu" and kind in ("ValueError", "RuntimeError"):  # 32-bit indexing, loop budgets
        return f"refused by the GPU kernel ({kind})"
    assert kind == "MemoryError" and out_bytes > physical, f"{op}: {kind} for an output of {out_bytes} bytes: {result}"
    return "too large for the machine (MemoryError)"


PUBLIC_CASES = {  # the entry points of issue 23, item 3, and others that take sizes from Python: (call, error, text)
    "rc.sum(rc.zeros((2**31, 2**31)))": (lambda: rc.sum(rc.zeros((2**31, 2**31))), "ValueError",
                                         "full: shape [2147483648, 2147483648] of f32 would take about 1.84e+19 bytes"),
    "rc.expand(ones (1, 1), (2**32, 2**32))": (
        lambda: rc.expand(rc.tensor(np.ones((1, 1), np.float32)), (2**32, 2**32)), "ValueError",
        "expand: shape [4294967296, 4294967296] of f32 would take"),
    "randint(5.0, (2**31, 2**31))": (lambda: rc.ops.randint(5.0, (2**31, 2**31)), "ValueError",
                                     "randint: shape [2147483648, 2147483648] of i32"),
    "reshape [2, 3] to (1048579, 1281024138342825986)": (
        lambda: rc.reshape(rc.tensor(np.ones((2, 3), np.float32)), (1048579, 1281024138342825986)), "ValueError",
        "reshape: cannot reshape [2, 3] (6 elements) into [1048579, 1281024138342825986] (more than 2^48 elements)"),
    "rc.sum(rc.one_hot(zeros (1, 4), 2**62))": (lambda: rc.sum(rc.one_hot(np.zeros((1, 4), np.int32), 2**62)),
                                                "ValueError", "one_hot: shape [4611686018427387904, 4] of f32"),
    "rc.randn((2**31, 2**31))": (lambda: rc.randn((2**31, 2**31)), "ValueError",
                                 "randn: shape [2147483648, 2147483648] of f32"),
    "pad_rows(x, 2**62, 2**62)": (lambda: rc.pad_rows(rc.ones((2, 2)), 2**62, 2**62), "ValueError",
                                  "pad_rows: 4611686018427387904 + 2 is more than 2^48"),
    "slice_rows(x, 2**63 - 1, 1)": (lambda: rc.slice_rows(rc.ones((2, 2)), 2**63 - 1, 1), "ValueError",
                                    "slice_rows: rows from 9223372036854775807, 1 of them, are not inside x [2, 2]"),
    "rc.zeros((2**64, 1))": (lambda: rc.zeros((2**64, 1)), "ValueError",
                             "full: shape = 18446744073709551616 does not fit in 64 bits"),
    "rc.rand((-1, 2))": (lambda: rc.rand((-1, 2)), "ValueError", "rand: shape must have 1 to 4 positive sizes"),
    "rc.full((2**20, 2**20), 1.0)": (lambda: rc.full((2**20, 2**20), 1.0), "MemoryError", "out of "),
    "rc.expand(ones (1, 1), (2**100,))": (lambda: rc.expand(rc.ones((1, 1)), (2**100,)), "ValueError",
                                          "expand: shape = 1267650600228229401496703205376 does not fit in 64 bits"),
    "rc.one_hot([0], 2**64)": (lambda: rc.one_hot([0], 2**64), "ValueError",
                               "one_hot: classes = 18446744073709551616 does not fit in 64 bits"),
    "rc.scatter_cols(ones (2, 1), [0], 2**62)": (lambda: rc.scatter_cols(rc.ones((2, 1)), [0], 2**62), "ValueError",
                                                 "scatter_cols: shape [2, 4611686018427387904] of f32"),
    "rc.arange(2**63)": (lambda: rc.arange(2**63), "ValueError", "arange: n = 9223372036854775808 does not fit"),
    "matmul of [2^31, 1] and [1, 2^31] pending": (
        lambda: _pending_product(), "ValueError", "matmul: a dimension of [2147483648, 1] and [1, 2147483648] exceeds"),
    "mul of [2^30, 1] and [1, 2^30] pending": (
        lambda: _pending_broadcast(), "ValueError", "mul: shape [1073741824, 1073741824] of f32 would take"),
}


def _pending_product():
    with _native.Graph():
        a, b = _native.placeholder([2**31, 1], "f32", "cpu"), _native.placeholder([1, 2**31], "f32", "cpu")
        return _native.apply(_native.op_id("matmul"), [a, b], [0, 0], [], "cpu")


def _pending_broadcast():
    with _native.Graph():
        a, b = _native.placeholder([2**30, 1], "f32", "cpu"), _native.placeholder([1, 2**30], "f32", "cpu")
        return _native.apply(_native.op_id("mul"), [a, b], [], [], "cpu")


def _child(device: str, first_op: int, public_first: int) -> None:
    """Runs the draws of every op from index first_op, then the public cases; one JSON line per
    op or case on stdout (a 'start' line before each, so the parent knows what was running)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    rc.device(device)
    physical = (_native.gpu_info() or {}).get("memory") if device == "gpu" else None
    physical = physical or os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    edge = [0, -1, -(2**63), 1, 2, 3, 2**31 - 1, 2**31, 2**32, 2**40, 2**47, 2**48, 2**48 + 1, 2**62, 2**63 - 1]
    # mostly sizes a tensor may have (small, or powers of two up to past the limit), so that a draw's
    # four sizes often make valid inputs and the op's own rule is what is tested
    kinds = [st.integers(1, 8)] * 6 + [st.sampled_from(edge), st.integers(0, 62).map(lambda e: 2**e),
                                       st.integers(-(2**63), 2**63 - 1)]
    size = st.integers(0, len(kinds) - 1).flatmap(lambda k: kinds[k])  # one_of would not weigh repeats
    ops = list(_native.op_names())

    def emit(**record):
        print(json.dumps(record), flush=True)

    for index in range(first_op, len(ops)):
        op, ends = ops[index], collections.Counter()
        emit(start=op, index=index)

        @settings(max_examples=DRAWS_PER_OP[device], derandomize=True, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck))
        @given(st.lists(size, min_size=4, max_size=4))
        def draw(sizes):
            ends[check_op(op, sizes, device, physical)] += 1

        try:
            draw()
            emit(op=op, index=index, ends=dict(ends))
        except Exception as e:  # noqa: BLE001  (hypothesis has shrunk it to a minimal draw; reported by the parent)
            emit(op=op, index=index, ends=dict(ends), failure=f"{type(e).__name__}: {e}"[:2000])
    names = list(PUBLIC_CASES)
    for index in range(public_first, len(names)):
        emit(start=names[index], public=index)
        kind, message = _outcome(PUBLIC_CASES[names[index]][0])
        emit(public=index, name=names[index], kind=kind, message=str(message)[:500])


def _run_children(device: str) -> dict:
    """Runs _child until every op and public case has reported, restarting after one that crashed
    or hung; returns the records, the crashes and the hangs."""
    ops, publics = list(_native.op_names()), list(PUBLIC_CASES)
    done_ops, done_public, crashes, hangs = {}, {}, [], []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.abspath(__file__))] + sys.path))
    while len(done_ops) < len(ops) or len(done_public) < len(publics):
        code = f"import test_sizes; test_sizes._child({device!r}, {len(done_ops)}, {len(done_public)})"
        with tempfile.TemporaryFile("w+") as stderr:
            child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=stderr, text=True,
                                     env=env)
            lines: queue.Queue = queue.Queue()
            threading.Thread(target=lambda: [lines.put(line) for line in child.stdout] + [lines.put(None)],
                             daemon=True).start()
            running, hung = None, False
            while True:
                try:
                    line = lines.get(timeout=OP_TIMEOUT_S)
                except queue.Empty:  # silent for a whole op's time: hung
                    child.kill()
                    hung = True
                    break
                if line is None:
                    break
                record = json.loads(line)
                if "start" in record:
                    running = record
                elif "op" in record:
                    done_ops[record["op"]], running = record, None
                else:
                    done_public[record["name"]], running = record, None
            child.wait()
            stderr.seek(0)
            if hung:
                hangs.append(running)
            elif child.returncode != 0:
                crashes.append({"case": running, "returncode": child.returncode, "stderr": stderr.read()[-2000:]})
        if running is None:
            if child.returncode != 0 or hung:  # died between cases: nothing more would come
                break
            continue
        if "index" in running:  # the op that crashed or hung counts as done, with that ending
            done_ops[running["start"]] = {"op": running["start"], "ends": {}, "failure": "crashed or hung"}
        else:
            done_public[running["start"]] = {"name": running["start"], "kind": "crashed or hung", "message": ""}
    return {"ops": done_ops, "public": done_public, "crashes": crashes, "hangs": hangs}


@pytest.mark.parametrize("device", DEVICES)
def test_every_op_refuses_overflowing_sizes_cleanly(device):
    start = time.monotonic()
    result = _run_children(device)
    ends = collections.Counter()
    for record in result["ops"].values():
        ends.update(record["ends"])
    draws = sum(ends.values())
    CASES_RUN[f"sizes on the {device}: op draws ({len(result['ops'])} ops)"] += draws
    CASES_RUN[f"sizes on the {device}: public entry points"] += len(result["public"])
    CASES_RUN[f"sizes on the {device}: crashes"] += len(result["crashes"])
    CASES_RUN[f"sizes on the {device}: hangs"] += len(result["hangs"])
    print(f"\n{device}: {draws} draws over {len(result['ops'])} ops + {len(result['public'])} public cases in "
          f"{time.monotonic() - start:.1f} s; crashes {len(result['crashes'])}, hangs {len(result['hangs'])}")
    for end, count in sorted(ends.items()):
        print(f"  {count:5d}  {end}")
    assert not result["crashes"], result["crashes"]
    assert not result["hangs"], result["hangs"]
    failures = {op: r["failure"] for op, r in result["ops"].items() if "failure" in r}
    assert not failures, failures
    assert set(result["ops"]) == set(_native.op_names())
    assert ends["ValueError"] > 0 and ends["run"] > 0  # both the refusals and real runs were reached
    for name, (_, kind, text) in PUBLIC_CASES.items():
        record = result["public"][name]
        assert record["kind"] == kind and text in record["message"], (name, record)
