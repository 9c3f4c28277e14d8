"""Capture: trace a function once per input signature into a native program, then replay it
with no Python per op.

``rc.capture(fn, params=[...])`` traces ``fn(**inputs)`` (any ops, a backward pass, optimizer
steps, gathers from device buffers) and returns a callable taking the same named numpy inputs
and returning ``fn``'s outputs as numpy arrays. ``rc.capture_step(loss_fn, params, optimizer,
max_grad_norm=None)`` captures a whole training step: forward, backward, the global gradient
norm (and clipping), and the optimizer update; it returns the loss and the norm. On the GPU a
replay is one upload of all inputs, one submission and one download of all outputs, all in a
command buffer recorded once and re-submitted (random ops draw fresh streams at every replay).

A replay re-records when an input's shape or dtype, the device, or a listed parameter or buffer
(freed, moved, or written from the host with load_state_dict) changes. Host work inside the
captured function that a replay would not repeat (reading a value, making a tensor from host
data) raises CaptureError naming it. Inputs are checked at every replay as the eager ops check
host data: an integer input must hold values that fit in i32, and an input that an op takes as
indices (get_rows, gather, ...) or as a bound (randint, a replay buffer's ``stored``) gets that
op's checks and messages. A non-finite gradient norm skips the update: weights, moments and the
step counter stay as they were.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from rlkit import _native
from rlkit.core import runtime, ops
from rlkit.core.checks import check_integer_values
from rlkit.core.runtime import CaptureError
from rlkit.core.autograd import backward
from rlkit.core.tape import grad_tape
from rlkit.core.tensor import NUMPY_DTYPES, Tensor


class Capture:
    """A capture being recorded: what it collects besides its ops. Inputs computed on the host
    at every replay (optimizer coefficients), extra outputs, what to do with them after each
    replay, host work each replay needs first, and checks of the inputs' values. Ops, optimizers
    and buffers reach it through ``runtime.active_capture()``."""

    def __init__(self):
        self.host_inputs: list[tuple[Tensor, Callable[[], np.ndarray]]] = []
        self.extra_outputs: list[Tensor] = []
        self.after_replay: list[Callable[[list[np.ndarray]], None]] = []
        self.before_replay: list[Callable[[], None]] = []  # host work a replay depends on
        self.while_running: list[tuple[Callable[[], None], Callable[[], None]]] = []  # (at launch, once over)
        self.grad_scale: Tensor | None = None  # set by capture_step for the optimizer's update
        # None: grad_scale is the gradients' factor; a number: grad_scale is their sum of squares,
        # and the update computes the factor that clips them to this norm (0: no clipping)
        self.grad_clip: float | None = None
        self.updates_recorded: dict[int, int] = {}  # per optimizer (by id): its updates in this capture so far
        self.input_checks: list[tuple[object, Callable[[np.ndarray], None]]] = []  # (a tensor's impl, its check)

    def host_input(self, shape: tuple[int, ...], compute: Callable[[], np.ndarray]) -> Tensor:
        """A placeholder filled with ``compute()`` before every replay (f32)."""
        t = Tensor(_native.placeholder(list(shape), "f32", runtime.device()))
        self.host_inputs.append((t, compute))
        return t

    def before_each_replay(self, prepare: Callable[[], None]) -> None:
        """Calls ``prepare()`` before every replay of the program (once however often the capture
        asks): host work the recorded ops depend on and a replay would not repeat, such as
        sending the columns a buffer staged on the host since the last replay."""
        if prepare not in self.before_replay:
            self.before_replay.append(prepare)

    def count_running(self, begin: Callable[[], None], end: Callable[[], None]) -> None:
        """Calls ``begin()`` as each launch of the program is submitted (after the host inputs
        are computed) and ``end()`` once it has finished or failed, before the work after it: how
        an optimizer counts its steps in flight, so that a replay launched while another still
        runs takes the coefficients of the step after that one. (A call, which returns once the
        program has run, is never in flight when another replay's inputs are computed.)"""
        self.while_running.append((begin, end))

    def check_input(self, t: Tensor, check: Callable[[np.ndarray], None]) -> None:
        """Calls ``check(values)`` on the host values given for ``t`` before every replay, when
        ``t`` is one of the captured function's inputs (a tensor computed in the capture has no
        host values, and is not checked)."""
        self.input_checks.append((t._impl, check))

    def extra_output(self, t: Tensor, after: Callable[[np.ndarray], None]) -> None:
        """Downloads ``t`` with the outputs and calls ``after(value)`` after each replay."""
        index = len(self.extra_outputs)
        self.extra_outputs.append(t)
        self.after_replay.append(lambda values: after(values[index]))


def _flatten(result) -> tuple[list[Tensor], Callable[[list], object]]:
    """The tensors of fn's result and a function rebuilding its structure from values."""
    if isinstance(result, Tensor):
        return [result], lambda values: values[0]
    if isinstance(result, (tuple, list)) and all(isinstance(t, Tensor) for t in result):
        kind = type(result)
        return list(result), lambda values: kind(values)
    if isinstance(result, dict) and all(isinstance(t, Tensor) for t in result.values()):
        keys = list(result)
        return [result[k] for k in keys], lambda values: dict(zip(keys, values))
    raise CaptureError(f"capture: the traced function must return a Tensor, or a tuple, list or dict of them; "
                       f"got {type(result).__name__}")


def _input_array(name: str, value) -> tuple[np.ndarray, str]:
    """An input as given (bools as f32) and the dtype it is captured as: u8 for bytes (images
    travel as bytes), i32 for other integers, the default float dtype for floats."""
    arr = np.asarray(value)
    if arr.dtype.kind == "b":
        arr = arr.astype(np.float32)
    if arr.dtype == np.uint8:
        return arr, "u8"
    if arr.dtype.kind in "iu":
        return arr, "i32"
    if arr.dtype.kind == "f":
        return arr, runtime.dtype()
    raise TypeError(f"capture: input {name!r} must be numeric, got {arr.dtype}")


def _input_key(inputs: dict) -> tuple | None:
    """The names, shapes and dtypes of a call's inputs where all are numpy arrays that need no
    conversion (no bools), else None."""
    key = []
    for name, value in inputs.items():
        if type(value) is not np.ndarray or value.dtype.kind == "b":
            return None
        key.append((name, value.shape, value.dtype))
    return tuple(key)


def _matches_key(inputs: dict, key: tuple) -> bool:
    """Whether a call's inputs are numpy arrays of ``key``'s names, shapes and dtypes (what
    ``_input_key`` would return for them, without building it)."""
    if len(inputs) != len(key):
        return False
    for (name, value), (key_name, shape, dtype) in zip(inputs.items(), key):
        if name != key_name or type(value) is not np.ndarray or value.shape != shape or value.dtype != dtype:
            return False
    return True


class _LastCall:
    """What a captured function's last call used, so that a loop's next call with the same
    kind of inputs takes its program without the lookup: the input key, (device, float dtype),
    the parameters' storages, the count of host writes then (``_native.host_writes``) and the
    full identity, compared only where some tensor was written since. ``direct``: whether such
    a call can hand its arrays to the native replay as they are (``_CapturedProgram.direct``)."""

    def __init__(self, key: tuple, settings: tuple, impls: list, identity: tuple, program: "_CapturedProgram"):
        self.key, self.settings, self.impls, self.identity, self.program = key, settings, impls, identity, program
        self.host_writes = _native.host_writes()
        self.direct = program.takes_as_given(key)


def _host_array(name: str, arr: np.ndarray, dtype: str) -> np.ndarray:
    """An input converted for the program: Fortran-ordered, of the captured dtype and shape
    (integers checked to fit in i32 first)."""
    if dtype == "i32":
        check_integer_values(arr, "i32", f"capture: input {name!r}")
    host = np.asfortranarray(arr, dtype=NUMPY_DTYPES[dtype])
    if host.ndim != 2:  # (a 2-D array keeps its shape: no reshape at every replay of the common case)
        host = host.reshape(_tensor_shape(arr), order="F")
    return host


def _tensor_shape(arr: np.ndarray) -> tuple[int, ...]:
    if arr.ndim == 0:
        return (1, 1)
    if arr.ndim == 1:
        return (arr.shape[0], 1)
    if arr.ndim > 4:
        raise ValueError(f"capture: inputs have at most 4 dimensions, got shape {arr.shape}")
    return arr.shape


class _CapturedProgram:
    """One captured program (``native``) and what its replays need."""

    def __init__(self, native, names, dtypes, placeholders, input_checks, host_inputs, outputs, n_user_outputs,
                 rebuild, before_replay, after_replay, while_running):
        self.native, self.names, self.dtypes, self.placeholders = native, names, dtypes, placeholders
        self.input_checks = input_checks  # (input name, check of its values)
        self.host_inputs, self.outputs = host_inputs, outputs
        self.n_user_outputs, self.rebuild = n_user_outputs, rebuild
        self.before_replay, self.after_replay = before_replay, after_replay
        self.while_running = while_running
        # nothing runs around the native replay but the inputs' conversion (an acting forward)
        self.bare = not (input_checks or host_inputs or before_replay or after_replay)

    def takes_as_given(self, key: tuple) -> bool:
        """Whether inputs of ``key`` (names, shapes, dtypes, in the call's order) are the program's
        inputs as they are, so that a call may skip ``_inputs``: a bare program, the names in its
        order, each input 2-D and of its captured float or byte dtype (an i32 input has its
        values checked)."""
        return self.bare and [name for name, _, _ in key] == self.names and all(
            len(shape) == 2 and dtype != "i32" and value_dtype == NUMPY_DTYPES[dtype]
            for (_, shape, value_dtype), dtype in zip(key, self.dtypes))

    def direct(self, arrays) -> object:
        """:meth:`replay` for arrays that ``takes_as_given`` (their order, shapes and dtypes
        checked by the caller): the native replay alone, Fortran order its only conversion
        (none for a column or a Fortran array). About half the Python of a call, where a
        policy's forward on one observation runs at every environment step."""
        return self.rebuild(self.native.replay([np.asfortranarray(a) for a in arrays]))

    def replay(self, arrays: dict[str, np.ndarray]):
        """Runs the program on the named input arrays (converted to the dtypes it was captured
        for) and returns the captured function's outputs, in the structure it returned them."""
        # no begin / end (count_running) here: no other replay's host inputs are computed while
        # this one runs, so it is never seen running
        return self._outputs(self.native.replay(self._inputs(arrays)))

    def launch(self, arrays: dict[str, np.ndarray]) -> None:
        """Starts :meth:`replay` (on the GPU it returns while the program runs); :meth:`finish`
        completes it."""
        values = self._inputs(arrays)
        self._begin()
        try:
            self.native.launch(values)
        except BaseException:
            self._end()
            raise

    def early(self) -> list[np.ndarray]:
        """The launched replay's early outputs (the first of its flattened outputs), once computed."""
        return self.native.early()

    def finish(self):
        """The outputs of the launched replay, once it has run (what :meth:`replay` returns)."""
        try:
            results = self.native.finish()
        finally:
            self._end()
        return self._outputs(results)

    def _begin(self) -> None:
        for begin, _ in self.while_running:
            begin()

    def _end(self) -> None:
        for _, end in self.while_running:
            end()

    def _inputs(self, arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The program's input arrays, in order, after the inputs' checks and the work each replay
        runs before it (a buffer's staged writes)."""
        for name, check in self.input_checks:  # the ops' own checks, before anything is converted
            check(arrays[name])
        values = [_host_array(name, arrays[name], dtype) for name, dtype in zip(self.names, self.dtypes)]
        values += [np.asfortranarray(compute(), dtype=np.float32) for _, compute in self.host_inputs]
        for prepare in self.before_replay:
            prepare()
        return values

    def _outputs(self, results: list[np.ndarray]):
        """The captured function's outputs from the program's (its own first, in order), after
        the work each replay runs after it (an optimizer's step counts)."""
        if self.after_replay:
            extra = results[self.n_user_outputs:]
            for after in self.after_replay:
                after(extra)
        return self.rebuild(results[:self.n_user_outputs])


class CapturedFunction:
    """What :func:`capture` returns: call it with ``fn``'s inputs, by name, to replay the program
    captured for them."""

    def __init__(self, fn: Callable, params=(), early_outputs: int = 0):
        if not callable(fn):
            raise TypeError(f"capture: fn must be callable, got {type(fn).__name__}")
        if isinstance(early_outputs, bool) or not isinstance(early_outputs, int) or early_outputs < 0:
            raise ValueError(f"capture: early_outputs must be a count of fn's first outputs (an int >= 0), "
                             f"got {early_outputs!r}")
        self.fn = fn
        self.early_outputs = early_outputs
        self.params = list(params.values()) if isinstance(params, dict) else list(params)
        for p in self.params:
            if not (isinstance(p, Tensor) or hasattr(p, "__rlkit_buffer__")):
                raise TypeError(f"capture: params lists parameters and device buffers, got {type(p).__name__}")
        self._tensors = [p for p in self.params if isinstance(p, Tensor)]  # the rest are buffers
        self._buffers = [p for p in self.params if not isinstance(p, Tensor)]
        self._programs: dict[tuple, _CapturedProgram] = {}
        self._last: _LastCall | None = None
        self._pending: PendingReplay | None = None  # launched, its result not read yet
        self.traces = 0  # how many times fn was traced (re-recordings included)

    def reset(self) -> None:
        """Forgets every program: the next call captures ``fn`` anew (after what it reads was
        replaced by an object the params list does not know, such as a loaded replay buffer)."""
        self._check_settled("reset")
        self._programs, self._last = {}, None

    def _identity(self) -> tuple:
        """What a listed parameter or buffer is now: its storage, and for a parameter its
        host-write version (a buffer's column writes are its data, read where it is)."""
        impls = [p._impl for p in self._tensors]
        return (tuple([(id(impl), impl.version) for impl in impls]),
                tuple([id(b.__rlkit_buffer__()._impl) for b in self._buffers]))  # a freed buffer raises here

    def __call__(self, **inputs):
        if self._pending is not None:
            self._check_settled("a call")
        last = self._last
        if last is not None and last.direct and _matches_key(inputs, last.key) and self._unchanged_since(last):
            return last.program.direct(inputs.values())
        program, arrays = self._program_for(inputs)
        return program.replay(arrays)

    def launch(self, **inputs) -> PendingReplay:
        """Starts a call and returns at once where the device runs it apart from the host (a
        GPU): the host goes on while the program runs, and work submitted later (another
        program, an eager op, a read) runs after it. ``result()`` of what it returns waits and
        gives what the call would have returned. On the CPU the program runs here, whole. Until
        that result is read, this function can be neither called nor launched again
        (RuntimeError)."""
        self._check_settled("launch")
        program, arrays = self._program_for(inputs)
        program.launch(arrays)
        self._pending = PendingReplay(self, program)
        return self._pending

    def _check_settled(self, what: str) -> None:
        if self._pending is not None:
            raise RuntimeError(f"capture: {what} while an earlier launch's result was not read; call result() on "
                               "what launch returned first")

    def _program_for(self, inputs: dict) -> tuple[_CapturedProgram, dict[str, np.ndarray]]:
        """The program for a call's inputs and those inputs as arrays (bools as f32). Numpy arrays
        of the last call's names, shapes and dtypes, with the same device, default float dtype
        and parameters (a loop's calls), take the last call's program as given, without the
        lookup: most of a call's Python."""
        last = self._last
        if last is not None and _matches_key(inputs, last.key) and self._unchanged_since(last):
            return last.program, inputs
        key = _input_key(inputs)
        arrays = {name: _input_array(name, value) for name, value in sorted(inputs.items())}
        program = self._program(arrays)
        self._last = None if key is None else _LastCall(key, (runtime.device(), runtime.dtype()),
                                                         [p._impl for p in self._tensors], self._identity(), program)
        return program, {name: arr for name, (arr, _) in arrays.items()}

    def _unchanged_since(self, last: _LastCall) -> bool:
        """Whether the device, the float dtype and the listed parameters and buffers are as at
        the ``last`` call: the same storages and, where no tensor was written from the host since
        (one native counter), the same versions without reading them one by one."""
        if last.settings != (runtime.device(), runtime.dtype()) or last.impls != [p._impl for p in self._tensors]:
            return False
        writes = _native.host_writes()
        if writes == last.host_writes and not self._buffers:
            return True
        if last.identity != self._identity():
            return False
        last.host_writes = writes  # the writes were to other tensors
        return True

    def _program(self, arrays: dict[str, tuple[np.ndarray, str]]) -> _CapturedProgram:
        """The program for these inputs, the device and the listed parameters and buffers as they
        are now: captured anew when one changed (dropping those of the inputs' old identity)."""
        shapes = {name: _tensor_shape(a) for name, (a, _) in arrays.items()}
        signature = (runtime.device(), tuple([(n, shapes[n], d) for n, (_, d) in arrays.items()]), self._identity())
        program = self._programs.get(signature)
        if program is None:
            self._programs = {k: v for k, v in self._programs.items() if k[:2] != signature[:2]}
            program = self._capture({name: (shapes[name], d) for name, (_, d) in arrays.items()})
            self._programs[signature] = program
        return program

    def _capture(self, signature: dict[str, tuple[tuple[int, ...], str]]) -> _CapturedProgram:
        """Runs fn on placeholders of the inputs' (shape, dtype), recording its ops into a program."""
        device = runtime.device()
        names = list(signature)
        placeholders = [Tensor(_native.placeholder(list(signature[n][0]), signature[n][1], device)) for n in names]
        active = Capture()
        graph = _native.Graph()
        with runtime.capture_scope(active), graph:
            result = self.fn(**dict(zip(names, placeholders)))
        outputs, rebuild = _flatten(result)
        if self.early_outputs > len(outputs):
            raise CaptureError(f"capture: early_outputs is {self.early_outputs}, but the traced function returns "
                               f"{len(outputs)} tensors")
        all_outputs = outputs + active.extra_outputs
        inputs = placeholders + [t for t, _ in active.host_inputs]
        native = _native.Program(graph, [t._impl for t in inputs], [t._impl for t in all_outputs],
                                 n_early=self.early_outputs)
        self.traces += 1
        input_checks = [(name, check) for impl, check in active.input_checks
                        for name, p in zip(names, placeholders) if p._impl is impl]
        return _CapturedProgram(native, names, [signature[n][1] for n in names], placeholders, input_checks,
                                active.host_inputs, all_outputs, len(outputs), rebuild, active.before_replay,
                                active.after_replay, active.while_running)


_NOT_READ = object()  # a PendingReplay's outputs before result() reads them


class PendingReplay:
    """A launched call of a :class:`CapturedFunction` (``launch``): ``result()`` waits for it."""

    def __init__(self, captured: CapturedFunction, program: _CapturedProgram):
        self._captured, self._program = captured, program
        self._outputs = _NOT_READ
        self._early: list[np.ndarray] | None = None

    def early_result(self) -> list[np.ndarray]:
        """The call's first ``early_outputs`` outputs (capture's argument; flattened, as arrays),
        as soon as the program has computed them: on the GPU it copies them out and signals the
        host midway, while the rest of it runs (an agent's actions, read before its update ends);
        on the CPU the program has run whole. Read it before ``result()``; the same list on later
        calls."""
        if self._early is None:
            if self._outputs is not _NOT_READ:
                raise RuntimeError("capture: early_result() after result(): read the early outputs first")
            self._early = self._program.early()
        return self._early

    def result(self):
        """The call's outputs, once the program has run (what calling the function returns);
        the same object on later calls."""
        if self._outputs is _NOT_READ:
            self._captured._pending = None  # settled even if the wait fails: the function may run again
            self._outputs = self._program.finish()
        return self._outputs


def capture(fn: Callable, params=(), early_outputs: int = 0) -> CapturedFunction:
    """Traces ``fn(**inputs)`` on its first call (and again for a new input signature) into a
    native program; later calls replay it. ``params`` lists the parameters and device buffers
    the capture reads, so that freeing, moving or reloading one records the program anew. A
    tensor fn reads that is not listed is read where it is at every replay: a write into it in
    place (``load_state_dict``, ``write_columns``) is seen without a new trace, but a move to new
    storage is not: the replays go on reading the old one (list a tensor that may move).
    ``early_outputs``: how many of fn's first outputs a launched call hands over as soon as they
    are computed (``launch(...).early_result()``), before the rest of the program ends."""
    return CapturedFunction(fn, params, early_outputs)


class CapturedStep:
    """A captured training step: call it with the loss function's inputs, by name; it returns
    ``(loss, grad_norm)`` as floats. ``captured`` is the underlying CapturedFunction."""

    def __init__(self, captured: CapturedFunction):
        self.captured = captured

    def __call__(self, **inputs) -> tuple[float, float]:
        loss, norm = self.captured(**inputs)
        return float(np.asarray(loss).reshape(-1)[0]), float(np.asarray(norm).reshape(-1)[0])


def _check_max_grad_norm(max_grad_norm, where: str) -> None:
    if max_grad_norm is not None and not (isinstance(max_grad_norm, (int, float)) and max_grad_norm > 0):
        raise ValueError(f"{where}: max_grad_norm must be a positive number or None, got {max_grad_norm!r}")


def update_step(loss_fn: Callable[[], Tensor | tuple], params, optimizer, max_grad_norm: float | None = None):
    """Inside a captured function: ``loss_fn()`` on its own tape, its backward pass, the global
    gradient norm of ``params`` (clipped to ``max_grad_norm`` when given) and ``optimizer``'s
    update. Returns ``(loss [1, 1], norm [1, 1])`` as tensors of the capture. A captured function
    may make several (critic, then actor, then entropy updates); a non-finite norm skips its own.
    ``loss_fn`` may return a tuple ``(loss, *aux)``: the step then returns ``(loss, norm, *aux)``,
    aux as given (what the loss was computed from that later work reads, such as the sampled
    actions' log-probabilities; ``rc.stop_gradient`` them before another loss uses them).
    With an optimizer's loss scale, the step scales the loss (``loss_fn`` returns it unscaled)
    by the scale of each replay, and the update unscales the gradients."""
    active = runtime.active_capture()
    if active is None:
        raise CaptureError("update_step: only inside a captured function (rc.capture)")
    _check_max_grad_norm(max_grad_norm, "update_step")
    param_list = list(params.values()) if isinstance(params, dict) else list(params)
    loss_scale = optimizer._captured_loss_scale(active)  # None, or the scale and its inverse, [1, 1] each
    with grad_tape():
        result = loss_fn()
        loss = result[0] if isinstance(result, tuple) else result
        scaled = loss if loss_scale is None else ops.mul(loss, loss_scale[0])
    grads = backward(scaled)
    listed = [grads.tensor(p) for p in param_list if p in grads]
    if not listed:
        raise CaptureError("capture_step: no listed parameter received a gradient from the loss")
    listed = [ops.cast(g, "f32") if g.dtype in runtime.HALF_DTYPES else g for g in listed]  # f16 / bf16 summed in f32
    sum_squares = ops.sum_squares(listed)  # [1, 1]
    if loss_scale is not None:  # of the unscaled gradients
        sum_squares = ops.mul(sum_squares, ops.square(loss_scale[1]))
    norm = ops.sqrt(sum_squares)  # [1, 1]
    if loss_scale is None:  # the update computes the clipping factor from the sum: no op in between
        clips = max_grad_norm is not None and math.isfinite(max_grad_norm)  # an infinite norm clips nothing
        active.grad_scale, active.grad_clip = sum_squares, float(max_grad_norm) if clips else 0.0
    else:  # the update unscales
        active.grad_scale = ops.mul(_gradient_factor(sum_squares, max_grad_norm), loss_scale[1])
    optimizer.step(grads)
    active.grad_scale, active.grad_clip = None, None
    outputs = (ops.reshape(loss, (1, 1)), norm)
    return outputs + result[1:] if isinstance(result, tuple) else outputs


def _gradient_factor(sum_squares: Tensor, max_grad_norm: float | None) -> Tensor:
    """What the optimizer multiplies every gradient by: the clipping factor
    min(max_grad_norm / (norm + 1e-6), 1), or 1 without clipping; NaN where the norm is not
    finite, so the update skips itself. Written as one run of elementwise ops, each reading the
    op before it and the sum of squares, which a captured GPU program fuses into one kernel.
    Without a loss scale the update op computes the same factor itself (native/optim.cpp's
    gradient_factor, op for op): this is the loss-scaled steps'."""
    nan_if_infinite = ops.scale(sum_squares, 0.0)  # [1, 1]: 0, or NaN where the sum is inf or NaN
    if not max_grad_norm:
        return ops.add(nan_if_infinite, 1.0)
    checked = ops.add(nan_if_infinite, sum_squares)  # the sum itself, or NaN
    return ops.minimum(ops.div(float(max_grad_norm), ops.add(ops.sqrt(checked), 1e-6)), 1.0)


def skipped_count(norms) -> Tensor:
    """Inside a captured function: [1, 1], how many of ``norms`` (the gradient norms update_step
    returned) are not finite, that is how many of those updates skipped themselves."""
    skipped = [ops.sub(1.0, ops.gt(math.inf, norm)) for norm in norms]  # gt is 0 for NaN and inf
    total = skipped[0]
    for one in skipped[1:]:
        total = ops.add(total, one)
    return total


def capture_step(loss_fn: Callable, params, optimizer, max_grad_norm: float | None = None) -> CapturedStep:
    """A captured training step: ``loss_fn(**inputs)`` (a scalar loss), its backward pass, the
    global gradient norm (clipped to ``max_grad_norm`` when given) and ``optimizer``'s update.
    Calling it returns ``(loss, grad_norm)`` as floats; a non-finite norm skips the update."""
    _check_max_grad_norm(max_grad_norm, "capture_step")  # when made, not at the first call
    param_list = list(params.values()) if isinstance(params, dict) else list(params)

    def step(**inputs):
        return update_step(lambda: loss_fn(**inputs), param_list, optimizer, max_grad_norm)

    return CapturedStep(CapturedFunction(step, param_list))
