"""Capture: a replayed step equals the same step run eagerly, on both backends; re-recording
rules; host work refused while tracing; a non-finite gradient norm skips the update; one upload,
one submission and one download per replay on the GPU."""

import re

import numpy as np
import pytest

import rlkit.core as rc
from rlkit import _native
from rlkit.buffers import DeviceBuffer


def _model(opt_cls=rc.optim.Adam, **kw):
    rc.manual_seed(0)
    model = rc.nn.Sequential(rc.nn.Linear(4, 16, activation="tanh"), rc.nn.Linear(16, 2))
    return model, opt_cls(model.parameters(), **kw)


def _batches(n, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((4, 32)).astype(np.float32), rng.standard_normal((2, 32)).astype(np.float32))
            for _ in range(n)]


def _eager_steps(model, opt, batches, max_grad_norm=None):
    losses = []
    for x, y in batches:
        with rc.grad_tape():
            loss = rc.mse_loss(model(rc.tensor(x)), y)
        grads = rc.backward(loss)
        if max_grad_norm is not None:
            rc.clip_grad_norm(list(model.parameters().values()), grads, max_grad_norm)
        opt.step(grads)
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("opt_cls, kw, max_norm", [(rc.optim.Adam, dict(lr=1e-2), None),
                                                     (rc.optim.AdamW, dict(lr=1e-2, weight_decay=0.1), 0.5),
                                                     (rc.optim.SGD, dict(lr=0.05, momentum=0.9), 1.0)])
def test_replayed_steps_equal_eager_steps(device, opt_cls, kw, max_norm):
    batches = _batches(6)
    eager_model, eager_opt = _model(opt_cls, **kw)
    eager = _eager_steps(eager_model, eager_opt, batches, max_norm)
    model, opt = _model(opt_cls, **kw)
    step = rc.capture_step(lambda x, y: rc.mse_loss(model(x), y), model.parameters(), opt, max_grad_norm=max_norm)
    captured = [step(x=x, y=y)[0] for x, y in batches]
    assert step.captured.traces == 1
    np.testing.assert_allclose(captured, eager, rtol=2e-5, atol=1e-6)
    for name, value in eager_model.state_dict().items():
        np.testing.assert_allclose(model.state_dict()[name], value, rtol=2e-4, atol=2e-6, err_msg=name)
    first = model.parameters()["0.W"]
    assert opt.state[id(first)]["step"] == 6


def test_a_non_finite_gradient_norm_skips_the_update(device):
    model, opt = _model(lr=1e-2)
    step = rc.capture_step(lambda x, y: rc.mse_loss(model(x), y), model.parameters(), opt)
    x, y = _batches(1)[0]
    step(x=x, y=y)
    before = model.state_dict()
    moments = {k: (s["m"].numpy(), s["v"].numpy(), s["step"]) for k, s in opt.state.items()}
    bad = x.copy()
    bad[0, 0] = np.nan
    loss, norm = step(x=bad, y=y)
    assert np.isnan(loss) and np.isnan(norm)
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    for k, s in opt.state.items():
        np.testing.assert_array_equal(s["m"].numpy(), moments[k][0])
        np.testing.assert_array_equal(s["v"].numpy(), moments[k][1])
        assert s["step"] == moments[k][2]
    assert np.isfinite(step(x=x, y=y)[0])  # and the next good step runs


def test_re_recording_rules(device):
    model, opt = _model(lr=1e-2)
    step = rc.capture_step(lambda x, y: rc.mse_loss(model(x), y), model.parameters(), opt)
    x, y = _batches(1)[0]
    step(x=x, y=y)
    step(x=x, y=y)
    assert step.captured.traces == 1
    step(x=x[:, :8], y=y[:, :8])  # a new batch size: a new signature
    assert step.captured.traces == 2
    model.load_state_dict(model.state_dict())  # parameters re-uploaded from the host
    step(x=x, y=y)
    assert step.captured.traces == 3


def test_repeated_calls_of_one_signature_see_new_values_and_parameter_writes(device):
    """Calls with arrays of the last call's names, shapes and dtypes reuse its lookup: each still
    replays on its own values, sees a host write to a parameter (a new program), converts
    bools and integers as the first call did, and a list, or another dtype, takes the full path."""
    w = rc.tensor(np.array([[2.0, -1.0]], np.float32))  # [1, 2]
    f = rc.capture(lambda x, mask: rc.add(rc.matmul(w, x), rc.cast(mask, "f32")), [w])
    rng = np.random.default_rng(0)
    for _ in range(3):
        x, mask = rng.standard_normal((2, 5)).astype(np.float32), rng.random((1, 5)) < 0.5
        np.testing.assert_allclose(f(x=x, mask=mask), w.numpy() @ x + mask, rtol=1e-6)
    assert f.traces == 1
    w.write_columns(np.array([[0.5, 3.0]], np.float32, order="F"), 0)  # a host write: a new version
    np.testing.assert_allclose(f(x=x, mask=mask), w.numpy() @ x + mask, rtol=1e-6)
    assert f.traces == 2
    np.testing.assert_allclose(f(x=x.tolist(), mask=mask.astype(np.int64)), w.numpy() @ x + mask, rtol=1e-6)
    np.testing.assert_allclose(f(x=x.astype(np.float64), mask=mask), w.numpy() @ x + mask, rtol=1e-6)
    assert f.traces == 3  # the integer mask is an i32 input: another signature
    double = rc.capture(lambda x: rc.scale(x, 2.0))
    assert double(x=x).dtype == np.float32
    previous = rc.dtype("f16")  # another default float dtype: the same arrays make f16 inputs
    try:
        assert double(x=x).dtype == np.float16 and double.traces == 2
    finally:
        rc.dtype(previous)


def test_repeated_calls_hand_arrays_of_any_layout_to_the_replay_as_given(device):
    """A bare program's repeated call (no input checks or host work around it: an acting
    forward) hands its arrays to the native replay as they are: Fortran, C-ordered, strided and
    transposed arrays all replay on their own values; names in another order take the full
    path, as do integer inputs (their values are checked)."""
    w = rc.tensor(np.arange(12, dtype=np.float32).reshape(3, 4) / 7.0)  # [3, 4]
    f = rc.capture(lambda a, b: rc.add(rc.matmul(w, a), b), [w])
    rng = np.random.default_rng(1)
    wide = rng.standard_normal((4, 12)).astype(np.float32)
    layouts = [np.asfortranarray(wide[:, :6]), np.ascontiguousarray(wide[:, :6]), wide[:, ::2],
               np.ascontiguousarray(wide[:, :6].T).T]
    for a in layouts:
        b = rng.standard_normal((3, 6)).astype(np.float32)
        np.testing.assert_allclose(f(a=a, b=b), w.numpy() @ a + b, rtol=1e-5, atol=1e-6)
        assert f._last.direct  # the next call with such arrays takes them as given
    for a in layouts:
        b = rng.standard_normal((3, 6)).astype(np.float32)
        np.testing.assert_allclose(f(b=b, a=a), w.numpy() @ a + b, rtol=1e-5, atol=1e-6)
        assert not f._last.direct
    assert f.traces == 1
    indices = rc.capture(lambda i: rc.scale(rc.cast(i, "f32"), 2.0))
    i = np.array([[1, 2, 3]], np.int32)
    np.testing.assert_array_equal(indices(i=i), 2.0 * i)
    np.testing.assert_array_equal(indices(i=i), 2.0 * i)
    assert not indices._last.direct
    with pytest.raises(ValueError, match="i32"):
        indices(i=np.array([[2**40]], np.int64))


def test_a_native_replay_refuses_arrays_unlike_its_inputs_by_name():
    """The native replay reads its arrays where they are: one of another dtype, order or shape
    (or with too many dimensions) is refused with the input's index and what the capture expects."""
    f = rc.capture(lambda a: rc.scale(a, 2.0))
    a = np.ones((3, 2), np.float32, order="F")
    f(a=a)
    native = f._last.program.native
    np.testing.assert_array_equal(native.replay([a])[0], 2.0 * a)
    with pytest.raises(TypeError, match=r"replay: input 0 has dtype float64, the capture expects f32"):
        native.replay([a.astype(np.float64)])
    with pytest.raises(ValueError, match=r"replay: input 0 must be Fortran-ordered"):
        native.replay([np.ones((3, 2), np.float32)])
    with pytest.raises(ValueError, match=re.escape("replay: input 0 has shape (2, 3), the capture expects [3, 2]")):
        native.replay([np.ones((2, 3), np.float32, order="F")])
    with pytest.raises(ValueError, match=re.escape("has shape (3, 2, 1, 1, 1), the capture expects [3, 2]")):
        native.replay([np.ones((3, 2, 1, 1, 1), np.float32, order="F")])


def test_a_host_write_to_another_tensor_keeps_the_program_and_one_to_a_parameter_does_not(device):
    """A loop's repeated call compares its parameters' versions only where some tensor was written
    from the host since its last call (one native counter of such writes)."""
    model, opt = _model(lr=0.1)
    forward = rc.capture(lambda x: model(x), model.parameters())
    x = _batches(1)[0][0]
    expected = model(rc.tensor(x)).numpy()
    np.testing.assert_allclose(forward(x=x), expected, rtol=1e-6)
    other = rc.tensor(np.zeros((2, 3), np.float32))
    before = _native.host_writes()
    other.write_columns(np.ones((2, 1), np.float32), 1)
    assert _native.host_writes() == before + 1
    np.testing.assert_allclose(forward(x=x), expected, rtol=1e-6)
    np.testing.assert_allclose(forward(x=x), expected, rtol=1e-6)
    assert forward.traces == 1
    _eager_steps(model, opt, _batches(1))  # an eager optimizer step writes every parameter: a new program
    np.testing.assert_allclose(forward(x=x), model(rc.tensor(x)).numpy(), rtol=1e-6)
    assert forward.traces == 2
    layer = model[0]
    layer.W._impl = rc.tensor(layer.W.numpy() * 2.0)._impl  # a new storage, no write counted
    np.testing.assert_allclose(forward(x=x), model(rc.tensor(x)).numpy(), rtol=1e-6)
    assert forward.traces == 3


def test_buffers_are_read_where_they_are(device):
    buf = DeviceBuffer(3, 10)
    buf.write(np.arange(30, dtype=np.float32).reshape(3, 10, order="F"))
    gather = rc.capture(lambda index: rc.sum(rc.get_rows(buf, index), dim=0), params=[buf])
    index = np.array([[1, 4, 9]], dtype=np.int32)
    np.testing.assert_array_equal(gather(index=index), [[12.0, 39.0, 84.0]])
    buf.write(np.ones((3, 1), np.float32), 4)  # a column write: seen without re-recording
    np.testing.assert_array_equal(gather(index=index), [[12.0, 3.0, 84.0]])
    assert gather.traces == 1
    buf.free()
    with pytest.raises(RuntimeError, match="freed"):
        gather(index=index)


def _eager_error(call):
    with pytest.raises(IndexError) as info:
        call()
    return str(info.value)


@pytest.mark.parametrize("bad", [2**32 + 1, -2**32 + 3, 2**40, 4, -1])
def test_index_inputs_are_checked_at_every_replay_as_eager_indices(device, bad):
    """Out-of-range indices given to a replay raise the eager op's error instead of wrapping to
    another column (2**32 + 1 read column 1) or being clamped on the GPU."""
    b = rc.tensor(np.arange(12, dtype=np.float32).reshape(3, 4, order="F"))
    gather = rc.capture(lambda i: rc.get_rows(b, i), [b])
    valid = np.array([[0, 3, 1]])
    np.testing.assert_array_equal(gather(i=valid), rc.get_rows(b, valid).numpy())
    index = np.array([[0, 2, bad]])
    expected = _eager_error(lambda: rc.get_rows(b, index))
    assert expected in ("get_rows: index values must fit in 32 bits",
                        f"get_rows: index {bad} at position 2 is out of range for 4 columns (valid: 0..3)")
    with pytest.raises(IndexError, match=f"^{re.escape(expected)}$"):
        gather(i=index)
    np.testing.assert_array_equal(gather(i=np.array([[2, 2, 0]], np.int64)), rc.get_rows(b, [[2, 2, 0]]).numpy())
    assert gather.traces == 1


def test_every_op_taking_an_input_as_indices_checks_it(device):
    x = rc.tensor(np.arange(12, dtype=np.float32).reshape(3, 4, order="F"))
    rows = rc.capture(lambda i: rc.gather(x, i), [x])
    np.testing.assert_array_equal(rows(i=np.array([[2, 0, 1, 2]])), rc.gather(x, [[2, 0, 1, 2]]).numpy())
    with pytest.raises(IndexError, match=r"^gather: index 3 at position 1 is out of range for 3 rows \(valid: 0..2\)$"):
        rows(i=np.array([[2, 3, 1, 2]]))
    # one input read by two ops: each op's own bound
    both = rc.capture(lambda i: (rc.get_rows(x, i), rc.one_hot(i, 2)), [x])
    np.testing.assert_array_equal(both(i=np.array([[1, 0]]))[1], [[0.0, 1.0], [1.0, 0.0]])
    with pytest.raises(IndexError, match=r"^one_hot: index 3 at position 0 is out of range for 2 classes"):
        both(i=np.array([[3, 0]]))


def test_integer_inputs_must_fit_in_i32(device):
    double = rc.capture(lambda n: rc.scale(rc.cast(n, "f32"), 2.0))
    np.testing.assert_array_equal(double(n=np.array([[2**31 - 1, -7]])), [[2.0**32, -14.0]])
    with pytest.raises(ValueError, match="^capture: input 'n': value 2147483648 at position 1 does not convert to i32"):
        double(n=np.array([[0, 2**31]]))
    with pytest.raises(ValueError, match="value 4294967297 at position 0 does not convert to i32"):
        double(n=np.array([[2**32 + 1, 0]], np.uint64))
    assert double.traces == 1


def test_a_captured_randint_bound_is_checked_as_a_number_is(device):
    draw = rc.capture(lambda high: rc.ops.randint(high, (1, 64)))
    assert draw(high=np.array([[5.0]], np.float32)).max() < 5
    for bad in (0.0, -5.0, np.nan, np.inf):
        message = rf"^randint: high must be a finite number > 0 \(the draws lie in \[0, high\)\), got {bad!r}$"
        with pytest.raises(ValueError, match=message):
            draw(high=np.array([[bad]], np.float32))
        with pytest.raises(ValueError, match="randint: high must be a finite number > 0"):
            rc.ops.randint(float(bad), (1, 64))
    assert draw.traces == 1


def test_host_work_in_a_trace_is_refused(device):
    w = rc.param(np.ones((2, 2), np.float32))
    reads = rc.capture(lambda x: rc.matmul(w, x) * float(w.numpy().sum()), params=[w])
    with pytest.raises(rc.CaptureError, match=r"reads a value on the host \(Tensor.numpy\(\) or item\(\)\)"):
        reads(x=np.ones((2, 1), np.float32))
    uploads = rc.capture(lambda x: rc.matmul(w, x) + rc.tensor(np.ones((2, 1), np.float32)), params=[w])
    with pytest.raises(rc.CaptureError, match=r"makes a tensor from host data \(rc.tensor\)"):
        uploads(x=np.ones((2, 1), np.float32))
    with pytest.raises(rc.CaptureError, match="must return a Tensor"):
        rc.capture(lambda x: 3)(x=np.ones((2, 1), np.float32))
    with pytest.raises(TypeError, match="fn must be callable"):
        rc.capture(3)
    with pytest.raises(ValueError, match="max_grad_norm"):
        rc.capture_step(lambda x: x, [w], rc.optim.SGD([w]), max_grad_norm=-1.0)


@pytest.mark.requires_gpu
def test_a_gpu_replay_is_one_upload_one_submission_one_download():
    previous = rc.device("gpu")
    try:
        model, opt = _model(lr=1e-2)
        step = rc.capture_step(lambda x, y: rc.mse_loss(model(x), y), model.parameters(), opt)
        x, y = _batches(1)[0]
        step(x=x, y=y)
        rc.gpu_stats(reset=True)
        step(x=x, y=y)
        stats = rc.gpu_stats()
        assert (stats["uploads"], stats["submits"], stats["downloads"]) == (1, 1, 1)
    finally:
        rc.device(previous)


def test_cpu_programs_made_with_profiling_on_time_each_node():
    x = rc.param(np.ones((3, 4), np.float32))
    _native.set_cpu_profiling(True)
    try:
        timed = rc.capture(lambda: rc.relu(x * 2.0), [x])
        timed()
        timed()
    finally:
        _native.set_cpu_profiling(False)
    plain = rc.capture(lambda: rc.relu(x * 2.0), [x])
    plain()
    (timed_program,), (plain_program,) = timed._programs.values(), plain._programs.values()
    times = timed_program.native.level_times()
    assert [label for _, label in times] == ["scale [3, 4]", "relu [3, 4]"]
    assert all(us >= 0 for us, _ in times)
    assert plain_program.native.level_times() == []


def test_a_program_reads_reshapes_and_column_slices_of_its_intermediates_in_place(device):
    """native/views.hpp in a program: reshapes of intermediates and aligned slices of a column run
    no kernel (the profile of a CPU program lists the nodes that run), an output keeps its own
    copy, and replays equal the eager function."""
    X = np.random.default_rng(9).standard_normal((16, 8)).astype(np.float32)
    x = rc.param(X)

    def packed_outputs():  # a packed op's output, unpacked as recurrences.py does
        flat = rc.reshape(rc.tanh(x * 2.0), (128, 1))  # a view
        head, tail = rc.slice_rows(flat, 0, 96), rc.slice_rows(flat, 96, 32)  # views (0 and 384 bytes in)
        other = rc.tanh(rc.tanh(x * 3.0) * 0.5)  # would take tanh's bytes, were they free before the views' reads
        return rc.reshape(head, (8, 12)) * 3.0, rc.reshape(tail, (4, 8)), other  # a view; an output: copies

    eager = [t.numpy() for t in packed_outputs()]
    _native.set_cpu_profiling(True)
    try:
        step = rc.capture(packed_outputs, [x])
        replayed = [step() for _ in range(2)][-1]
    finally:
        _native.set_cpu_profiling(False)
    (program,) = step._programs.values()
    assert program.native.n_views == 4
    for got, want in zip(replayed, eager):
        np.testing.assert_array_equal(got, want)
    if device == "cpu":
        labels = [label for _, label in program.native.level_times()]
        assert [label for label in labels if label.split()[0] in ("reshape", "slice_rows")] == ["reshape [4, 8]"]


def test_update_step_outside_a_capture_and_bad_clipping_are_refused():
    w = rc.param(np.ones((2, 2)))
    optimizer = rc.optim.SGD([w], lr=0.1)
    with pytest.raises(rc.CaptureError, match="only inside a captured function"):
        rc.update_step(lambda: rc.sum(w), [w], optimizer)
    with pytest.raises(ValueError, match="max_grad_norm must be a positive number or None, got -1"):
        rc.capture_step(lambda: rc.sum(w), [w], optimizer, max_grad_norm=-1)


def test_update_step_returns_what_the_loss_function_returns_beside_the_loss(device):
    """A loss function returning (loss, *aux) gets aux back after the loss and the norm, the
    tensors of its own forward (here the prediction before the update); the update is the
    loss's alone, as an eager step's."""
    batches = _batches(3)
    eager_model, eager_opt = _model(lr=1e-2)
    model, opt = _model(lr=1e-2)
    params = list(model.parameters().values())

    def step(x, y):
        def loss_fn():
            prediction = model(x)
            return rc.mse_loss(prediction, y), prediction

        loss, _, prediction = rc.update_step(loss_fn, params, opt)
        return loss, prediction

    program = rc.capture(step, params)
    for x, y in batches:
        with rc.no_grad():
            before = eager_model(rc.tensor(x)).numpy()
        eager_loss = _eager_steps(eager_model, eager_opt, [(x, y)])[0]
        loss, prediction = program(x=x, y=y)
        np.testing.assert_allclose(prediction, before, rtol=2e-5, atol=1e-6)
        assert float(loss.reshape(-1)[0]) == pytest.approx(eager_loss, rel=2e-5)
    for name, value in eager_model.state_dict().items():
        np.testing.assert_allclose(model.state_dict()[name], value, rtol=2e-4, atol=2e-6, err_msg=name)


# ---- recorded GPU programs: one command buffer, recorded once, submitted at every replay --------


def _stats_after(fn) -> dict:
    rc.gpu_stats(reset=True)
    fn()
    return rc.gpu_stats()


@pytest.mark.requires_gpu
def test_gpu_replays_record_once_and_equal_eager_steps(on_gpu):
    batches = _batches(8, seed=3)
    eager_model, eager_opt = _model(rc.optim.SGD, lr=0.05, momentum=0.9)
    eager = _eager_steps(eager_model, eager_opt, batches)
    model, opt = _model(rc.optim.SGD, lr=0.05, momentum=0.9)
    step = rc.capture_step(lambda x, y: rc.mse_loss(model(x), y), model.parameters(), opt)
    losses = []
    first = _stats_after(lambda: losses.append(step(x=batches[0][0], y=batches[0][1])[0]))
    assert first["recordings"] == 1  # the first call traces and records
    rest = _stats_after(lambda: losses.extend(step(x=x, y=y)[0] for x, y in batches[1:]))
    assert rest["recordings"] == 0 and rest["submits"] == len(batches) - 1  # re-submitted as recorded
    assert rest["dispatches"] == (len(batches) - 1) * first["dispatches"] > 0  # the same work each replay
    np.testing.assert_allclose(losses, eager, rtol=2e-5, atol=1e-6)
    for name, value in eager_model.state_dict().items():
        np.testing.assert_allclose(model.state_dict()[name], value, rtol=2e-4, atol=2e-6, err_msg=name)


def _random_draws(x):
    noise = x * rc.rand((5, 7)) + rc.randn((5, 7))  # [5, 7]
    classes = rc.sample_categorical(rc.log(rc.rand((4, 7)) + 0.1))  # [1, 7]
    return noise, classes


@pytest.mark.requires_gpu
def test_random_ops_draw_fresh_streams_at_every_replay(on_gpu):
    """Each replay draws new streams from the global generator, in the order the ops ran, with
    eager draws in between: the numbers the CPU backend draws for the same sequence."""
    x = np.full((5, 7), 2.0, np.float32)

    def run(device):
        previous = rc.device(device)
        try:
            rc.manual_seed(21)
            draw = rc.capture(_random_draws)
            results = []
            for _ in range(3):
                results.append(draw(x=x))
                results.append((rc.randn((2, 3)).numpy(),))  # an eager draw between replays
            return results, draw.traces
        finally:
            rc.device(previous)

    rc.gpu_stats(reset=True)
    gpu, traces = run("gpu")
    assert traces == 1 and rc.gpu_stats()["recordings"] == 1
    cpu, _ = run("cpu")
    for got, expected in zip(gpu, cpu):
        for g, e in zip(got, expected):
            if g.dtype.kind == "i":
                np.testing.assert_array_equal(g, e)
            else:
                np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)
    first, second = gpu[0][0], gpu[2][0]
    assert not np.allclose(first, second)  # fresh numbers at every replay


@pytest.mark.requires_gpu
def test_a_relocated_parameter_re_records(on_gpu):
    w = rc.param(np.eye(3, dtype=np.float32))
    apply = rc.capture(lambda x: rc.matmul(w, x), params=[w])
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert _stats_after(lambda: [apply(x=x) for _ in range(3)])["recordings"] == 1
    _native.relocate(w._impl)  # new storage, same tensor and values: only the recording's addresses change
    w_new = np.arange(9, dtype=np.float32).reshape(3, 3)
    stats = _stats_after(lambda: (np.testing.assert_array_equal(apply(x=x), x),
                                  _native.relocate(w._impl), apply(x=x)))
    assert stats["recordings"] == 2 and apply.traces == 1
    model_loaded = _stats_after(lambda: (w._impl.write(np.asfortranarray(w_new)),
                                         np.testing.assert_allclose(apply(x=x), w_new @ x)))
    assert model_loaded["recordings"] == 1 and apply.traces == 2  # a host write re-traces


@pytest.mark.requires_gpu
def test_eager_work_before_and_after_a_replay_is_ordered(on_gpu, submits_only_when_read):
    """An eager in-place write recorded (not yet submitted) before a replay is seen by it, and
    eager work recorded after a replay reads what the replay wrote."""
    model, opt = _model(rc.optim.SGD, lr=0.1)
    w = model.parameters()["0.W"]
    step = rc.capture_step(lambda x, y: rc.mse_loss(model(x), y), model.parameters(), opt)
    forward = rc.capture(lambda x: model(x), params=model.parameters())
    x, y = _batches(1)[0]
    forward(x=x)
    step(x=x, y=y)
    replacement = rc.tensor(np.full(w.shape, 0.25, np.float32))
    columns = rc.tensor(np.arange(w.shape[1], dtype=np.int32)[None, :])
    rc.gpu_stats(reset=True)
    rc.ops.apply("put_cols", (w, columns, replacement))  # eager, in place: recorded, not yet submitted
    out = forward(x=x)
    assert rc.gpu_stats()["submits"] == 1  # the eager work and the replay go in one batch, in order
    reference = model(rc.tensor(x)).numpy()
    np.testing.assert_allclose(out, reference, rtol=1e-5, atol=1e-6)
    assert np.allclose(w.numpy(), 0.25)
    before = w.numpy()
    step(x=x, y=y)
    after_step = rc.sum(w)  # eager, recorded after the replay: reads the updated weights
    assert not np.allclose(w.numpy(), before)
    np.testing.assert_allclose(after_step.numpy(), [[w.numpy().sum()]], rtol=1e-5)
    assert forward.traces == 1 and step.captured.traces == 1


def test_a_recorded_program_runs_independent_kernels_between_fewer_barriers(on_gpu):
    """Kernels that do not depend on each other share a level between two barriers; reads
    before an in-place write still see the old values and reads after it the new ones."""
    rng = np.random.default_rng(3)
    weights = [rc.param(rng.standard_normal((5, 3)).astype(np.float32)) for _ in range(6)]
    target = rc.param(np.zeros((5, 3), np.float32))
    columns = rc.tensor(np.arange(3, dtype=np.int32)[None, :])

    def branches(x):
        before = rc.sum(rc.mul(target, 1.0))  # reads target before the write below
        outs = [rc.sum(rc.tanh(rc.add(rc.mul(w, x), 1.0))) for w in weights]  # six independent chains
        rc.ops.apply("put_cols", (target, columns, rc.stop_gradient(rc.mul(weights[0], x))))
        after = rc.sum(target)  # reads it after
        return [before, after, *outs]

    program = rc.capture(branches, params=[*weights, target])
    x = rng.standard_normal((5, 3)).astype(np.float32)
    program(x=x)  # traces and records
    target_values = target.numpy().copy()
    rc.gpu_stats(reset=True)
    got = program(x=np.full((5, 3), 2.0, np.float32))
    stats = rc.gpu_stats()
    assert stats["barriers"] < stats["dispatches"] / 2, stats
    w = [p.numpy().astype(np.float64) for p in weights]
    np.testing.assert_allclose(got[0], [[target_values.sum()]], rtol=1e-5)
    np.testing.assert_allclose(got[1], [[(w[0] * 2.0).sum()]], rtol=1e-5)
    for k in range(6):
        np.testing.assert_allclose(got[2 + k], [[np.tanh(w[k] * 2.0 + 1.0).sum()]], rtol=1e-5, atol=1e-5)


def test_a_program_recorded_with_profiling_on_times_each_level(on_gpu):
    """With GPU profiling on, a program's levels come with their mean time and their kernels:
    a matmul, then two independent elementwise ops sharing the next level."""
    a = rc.param(np.ones((20, 30), np.float32))

    def fn(x):
        product = rc.matmul(a, x)  # [20, 7]
        return rc.exp(product), rc.sign(product)

    assert _native.set_gpu_profiling(True)  # lavapipe and the H200 both time their queues
    try:
        profiled = rc.capture(fn, params=[a])
        x = np.full((30, 7), 0.01, np.float32)
        for _ in range(3):
            got = profiled(x=x)
    finally:
        _native.set_gpu_profiling(False)
    np.testing.assert_allclose(got[0], np.exp(np.full((20, 7), 0.3)), rtol=1e-5)
    np.testing.assert_array_equal(got[1], np.ones((20, 7)))
    (program,) = profiled._programs.values()
    levels = program.native.level_times()
    labels = [label for _, label in levels]
    assert all(us >= 0.0 for us, _ in levels) and sum(us for us, _ in levels) > 0.0
    matmul_level = next(k for k, label in enumerate(labels) if "matmul" in label)
    assert "unary_exp" in labels[matmul_level + 1] and "unary_sign" in labels[matmul_level + 1], labels
    assert "outputs" in labels[-1]  # the copy of the outputs for the host ends the program
    unprofiled = rc.capture(fn, params=[a])  # recorded after profiling was turned off
    unprofiled(x=x)
    assert next(iter(unprofiled._programs.values())).native.level_times() == []


def test_a_programs_tables_are_written_once_not_at_every_replay(on_gpu):
    """The tables that the gradient norm and Adam read (chunks of every parameter) are written
    when the program is recorded, not by a command of the program: no level of the replayed
    program writes host data, and six replays still equal six eager steps."""
    batches = _batches(6)
    eager_model, eager_opt = _model(rc.optim.Adam, lr=1e-2)
    eager = _eager_steps(eager_model, eager_opt, batches, 0.5)
    model, opt = _model(rc.optim.Adam, lr=1e-2)
    assert _native.set_gpu_profiling(True)
    try:
        step = rc.capture_step(lambda x, y: rc.mse_loss(model(x), y), model.parameters(), opt, max_grad_norm=0.5)
        captured = [step(x=x, y=y)[0] for x, y in batches]
    finally:
        _native.set_gpu_profiling(False)
    np.testing.assert_allclose(captured, eager, rtol=2e-5, atol=1e-6)
    for name, value in eager_model.state_dict().items():
        np.testing.assert_allclose(model.state_dict()[name], value, rtol=2e-4, atol=2e-6, err_msg=name)
    (program,) = step.captured._programs.values()
    labels = " ".join(label for _, label in program.native.level_times())
    assert "sum_squares" in labels and "optim_adam" in labels, labels
    assert "write" not in labels, labels


@pytest.mark.parametrize("max_norm", [None, 0.5])
def test_a_captured_update_follows_the_gradient_norm_with_no_op_between(on_gpu, max_norm):
    """The update reads the gradients' sum of squares and computes its clipping factor itself:
    in the level schedule, the optimizer's update directly follows the sum of squares, with or
    without clipping (the factor's elementwise ops had a level of their own), and the sum is one
    level (its total had a dispatch and a level of its own after the partial sums)."""
    model, opt = _model(rc.optim.Adam, lr=1e-2)
    x, y = _batches(1)[0]
    assert _native.set_gpu_profiling(True)
    try:
        step = rc.capture_step(lambda x, y: rc.mse_loss(model(x), y), model.parameters(), opt, max_grad_norm=max_norm)
        step(x=x, y=y)
    finally:
        _native.set_gpu_profiling(False)
    (program,) = step.captured._programs.values()
    labels = [label for _, label in program.native.level_times()]
    total = next(k for k, label in enumerate(labels) if "sum_squares" in label)
    assert "optim_adam" in labels[total + 1], labels


def test_a_captured_sum_of_squares_is_right_at_every_replay(on_gpu):
    """The GPU's sum of squares counts its workgroups done so that the last one adds the partial
    sums, and sets the count back to 0: a count left behind would make every later replay's total
    go missing. Many chunks (295, more than a workgroup adds in one pass), four replays on new
    values, each numpy's sum, and the same bits again for the same values."""
    rng = np.random.default_rng(0)
    shapes = {"a": (300, 1000), "b": (7, 3), "c": (1, 1)}
    total = rc.capture(lambda a, b, c: rc.sum_squares([a, b, c]))
    for _ in range(4):
        values = {name: np.asfortranarray(rng.standard_normal(shape), np.float32) for name, shape in shapes.items()}
        got = total(**values)  # the captured call returns host arrays
        expected = sum(np.square(v, dtype=np.float64).sum() for v in values.values())
        np.testing.assert_allclose(got, [[expected]], rtol=1e-5)
        assert total(**values).tobytes() == got.tobytes()
    assert total.traces == 1


@pytest.mark.parametrize("steps", [1, 3])
def test_several_steps_of_one_optimizer_in_one_trace_equal_eager_steps(device, steps):
    """Each recorded update takes its own step count (Adam's bias corrections): one replay of a
    trace of `steps` updates equals `steps` eager updates."""
    model, opt = _model(lr=1e-2)
    params = list(model.parameters().values())

    def several(x, y):
        for _ in range(steps):
            loss, _ = rc.update_step(lambda: rc.mse_loss(model(x), y), params, opt)
        return loss

    program = rc.capture(several, params)
    batches = _batches(2)
    for x, y in batches:
        program(x=x, y=y)
    eager_model, eager_opt = _model(lr=1e-2)
    _eager_steps(eager_model, eager_opt, [batch for batch in batches for _ in range(steps)])
    for name, p in model.parameters().items():
        np.testing.assert_allclose(p.numpy(), eager_model.parameters()[name].numpy(), rtol=2e-5, atol=2e-6, err_msg=name)
    assert opt.state[id(params[0])]["step"] == 2 * steps


def test_a_launched_call_gives_what_a_call_gives(device):
    """launch(...).result() is a call in two halves: the same losses, weights and optimizer
    step counts (counted after the program has run) as calling the captured step."""
    batches = _batches(5, seed=4)
    called_model, called_opt = _model(lr=1e-2)
    called = rc.capture_step(lambda x, y: rc.mse_loss(called_model(x), y), called_model.parameters(), called_opt)
    called_losses = [called(x=x, y=y)[0] for x, y in batches]
    model, opt = _model(lr=1e-2)
    step = rc.capture_step(lambda x, y: rc.mse_loss(model(x), y), model.parameters(), opt)
    losses = []
    for x, y in batches:
        pending = step.captured.launch(x=x, y=y)
        loss, _ = pending.result()
        assert pending.result() is pending.result()  # read once, kept
        losses.append(float(np.asarray(loss).reshape(-1)[0]))
    np.testing.assert_array_equal(losses, called_losses)
    for name, value in called_model.state_dict().items():
        np.testing.assert_array_equal(model.state_dict()[name], value, err_msg=name)
    assert opt.state[id(model.parameters()["0.W"])]["step"] == len(batches)


def test_a_step_launched_while_another_runs_takes_the_step_after_it(device):
    """Two captures of one Adam step, launched in turn so that each is launched before the one
    before it is read (a launch at a time per function): the same weights and step counts as
    calling the step, since each launch takes the bias correction of the step after those still
    running (counted only once they finish), not of the last one counted."""
    batches = _batches(6, seed=5)
    called_model, called_opt = _model(lr=1e-2)
    called = rc.capture_step(lambda x, y: rc.mse_loss(called_model(x), y), called_model.parameters(), called_opt)
    called_losses = [called(x=x, y=y)[0] for x, y in batches]
    model, opt = _model(lr=1e-2)
    twins = [rc.capture_step(lambda x, y: rc.mse_loss(model(x), y), model.parameters(), opt) for _ in range(2)]
    running, losses = None, []
    for k, (x, y) in enumerate(batches):
        launched = twins[k % 2].captured.launch(x=x, y=y)
        if running is not None:
            losses.append(float(np.asarray(running.result()[0]).reshape(-1)[0]))
        running = launched
    losses.append(float(np.asarray(running.result()[0]).reshape(-1)[0]))
    np.testing.assert_allclose(losses, called_losses, rtol=1e-6)
    for name, value in called_model.state_dict().items():
        np.testing.assert_allclose(model.state_dict()[name], value, rtol=1e-5, atol=1e-7, err_msg=name)
    assert opt.state[id(model.parameters()["0.W"])]["step"] == len(batches)
    assert opt._step_to_take(model.parameters()["0.W"]) == len(batches) + 1  # nothing left running


class _FailingLaunch:
    """A native program whose launch fails (as a lost device's would); the rest is the program's."""

    def __init__(self, native):
        self.native = native

    def launch(self, values):
        raise RuntimeError("the launch failed")

    def __getattr__(self, name):
        return getattr(self.native, name)


def test_a_launch_that_fails_leaves_no_step_counted_as_running(device):
    """A launch that fails after the optimizer counted it as running takes that count back: the
    steps after it take the coefficients they would have taken without it."""
    batches = _batches(3, seed=6)
    called_model, called_opt = _model(lr=1e-2)
    called = rc.capture_step(lambda x, y: rc.mse_loss(called_model(x), y), called_model.parameters(), called_opt)
    for x, y in batches:
        called(x=x, y=y)
    model, opt = _model(lr=1e-2)
    step = rc.capture_step(lambda x, y: rc.mse_loss(model(x), y), model.parameters(), opt)
    step(x=batches[0][0], y=batches[0][1])
    program = next(iter(step.captured._programs.values()))
    program.native = _FailingLaunch(program.native)
    with pytest.raises(RuntimeError, match="^the launch failed$"):
        step.captured.launch(x=batches[1][0], y=batches[1][1])
    program.native = program.native.native
    assert opt._step_to_take(model.parameters()["0.W"]) == 2
    for x, y in batches[1:]:
        step(x=x, y=y)
    for name, value in called_model.state_dict().items():
        np.testing.assert_allclose(model.state_dict()[name], value, rtol=1e-6, atol=1e-8, err_msg=name)


def test_a_launch_is_read_before_its_function_runs_again(device):
    model, opt = _model(lr=1e-2)
    step = rc.capture_step(lambda x, y: rc.mse_loss(model(x), y), model.parameters(), opt)
    x, y = _batches(1)[0]
    pending = step.captured.launch(x=x, y=y)
    for again in (lambda: step(x=x, y=y), lambda: step.captured.launch(x=x, y=y), step.captured.reset):
        with pytest.raises(RuntimeError, match="earlier launch's result was not read"):
            again()
    pending.result()
    step(x=x, y=y)
    assert opt.state[id(model.parameters()["0.W"])]["step"] == 2


def test_work_submitted_while_a_launch_runs_runs_after_it(on_gpu):
    """While a launched update runs, the host records and submits other work: launches of other
    programs, each with an eager batch ahead of it, until the context's rotation of eager
    batches comes round to the one submitted with the update (the next eager op waits for the
    update there), and reads. Each sees the weights the update wrote, as after a call; no
    validation error (the GPU tests run with the validation layer)."""
    model, opt = _model(rc.optim.SGD, lr=0.1)
    w = model.parameters()["0.W"]
    step = rc.capture_step(lambda x, y: rc.mse_loss(model(x), y), model.parameters(), opt)
    forwards = [rc.capture(lambda x: model(x), params=model.parameters()) for _ in range(3)]
    x, y = _batches(1)[0]
    for forward in forwards:
        forward(x=x)
    step(x=x, y=y)
    before = w.numpy()
    column, first = rc.tensor(np.zeros((1, 1), np.int32)), rc.tensor(before[:, :1])

    def rewrite_first_column():  # eager, in place, the same values: recorded, submitted with the next launch
        rc.ops.apply("put_cols", (w, column, first))

    rewrite_first_column()
    pending = [step.captured.launch(x=x, y=y)]
    for forward in forwards:
        rewrite_first_column()
        pending.append(forward.launch(x=x))
    rewrite_first_column()  # the eager batch the update went with, reused
    total = rc.sum(w).numpy()
    loss, _ = pending[0].result()
    outs = [p.result() for p in pending[1:]]
    updated = w.numpy()
    assert not np.allclose(updated, before)
    np.testing.assert_allclose(total, [[updated.sum()]], rtol=1e-5)
    for out in outs:
        np.testing.assert_allclose(out, model(rc.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)
    assert np.isfinite(loss).all()


def test_a_launch_with_bad_input_raises_as_a_call_and_leaves_nothing_launched(device):
    """A launch checks its inputs as a call does (the same errors), and one refused launches
    nothing: the function can be called right after."""
    model, opt = _model(lr=1e-2)
    step = rc.capture_step(lambda x, y: rc.mse_loss(model(x), y), model.parameters(), opt)
    x, y = _batches(1)[0]
    step(x=x, y=y)
    for bad in (dict(x=x, y=y[:, :5]), dict(x=x.astype(np.int64), y=y), dict(x=x, y="y")):
        with pytest.raises((ValueError, TypeError)) as called:
            step.captured(**bad)
        with pytest.raises(type(called.value)) as launched:
            step.captured.launch(**bad)
        assert str(launched.value) == str(called.value)
    step(x=x, y=y)
    assert opt.state[id(model.parameters()["0.W"])]["step"] == 2


def _act_then_update(model, opt):
    """A policy's actions for `obs` from the weights as they are, then a gradient step on them."""
    def step(obs, x, y):
        actions = model(obs)  # [2, n]: read before the update writes the weights
        loss, _ = rc.update_step(lambda: rc.mse_loss(model(x), y), model.parameters(), opt)
        return actions, loss
    return step


def test_a_launch_hands_over_its_early_outputs_before_its_result(device):
    """capture(..., early_outputs=1): a launch's first output (the actions of an agent's step)
    comes from early_result(), before result(), with each launch's own values (not the run
    before's); actions, losses and weights equal those of calls of the same function captured
    without early outputs."""
    called_model, called_opt = _model(lr=1e-2)
    called = rc.capture(_act_then_update(called_model, called_opt), params=called_model.parameters())
    model, opt = _model(lr=1e-2)
    launched = rc.capture(_act_then_update(model, opt), params=model.parameters(), early_outputs=1)
    rng = np.random.default_rng(6)
    for x, y in _batches(4, seed=7):
        obs = rng.standard_normal((4, 3)).astype(np.float32)
        actions, loss = called(obs=obs, x=x, y=y)
        pending = launched.launch(obs=obs, x=x, y=y)
        early = pending.early_result()
        assert pending.early_result() is early and len(early) == 1
        np.testing.assert_array_equal(early[0], actions)
        got_actions, got_loss = pending.result()
        np.testing.assert_array_equal(got_actions, actions)
        np.testing.assert_array_equal(got_loss, loss)
    for name, value in called_model.state_dict().items():
        np.testing.assert_array_equal(model.state_dict()[name], value, err_msg=name)
    pending = launched.launch(obs=obs, x=x, y=y)
    pending.result()
    with pytest.raises(RuntimeError, match=r"early_result\(\) after result\(\)"):
        pending.early_result()


def test_early_outputs_are_counted_and_checked(device):
    model, opt = _model(lr=1e-2)
    x, y = _batches(1)[0]
    obs = np.zeros((4, 3), np.float32)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="early_outputs must be a count of fn's first outputs"):
            rc.capture(_act_then_update(model, opt), params=model.parameters(), early_outputs=bad)
    too_many = rc.capture(_act_then_update(model, opt), params=model.parameters(), early_outputs=3)
    with pytest.raises(rc.CaptureError, match="early_outputs is 3, but the traced function returns 2 tensors"):
        too_many(obs=obs, x=x, y=y)
    plain = rc.capture(lambda x: rc.exp(x))
    with pytest.raises(RuntimeError, match="early: the program was not launched"):
        plain._program_for({"x": x})[0].early()


def test_a_result_returned_twice_is_read_right_both_times(device):
    """A function returning one tensor twice (or as an early output and again later): both
    places hold its values (each had a place of its own in the outputs' block, and the first was
    never written)."""
    x = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(3, 4)
    def exp_twice(x):
        result = rc.exp(x)
        return result, result

    twice = rc.capture(exp_twice)
    first, second = twice(x=x)
    np.testing.assert_allclose(first, np.exp(x), rtol=1e-6)
    np.testing.assert_array_equal(second, first)
    early = rc.capture(lambda x: [rc.tanh(x)] * 3, early_outputs=1)
    pending = early.launch(x=x)
    (head,) = pending.early_result()
    np.testing.assert_allclose(head, np.tanh(x), rtol=1e-6, atol=1e-7)
    for value in pending.result():
        np.testing.assert_array_equal(value, head)


def test_early_outputs_leave_the_gpu_in_the_level_after_their_kernel(on_gpu):
    """The early outputs' copy to the host and its signal come in the level after the kernels
    that write them, not with the other outputs at the end: the actions of an agent's step
    reach the host while its update runs."""
    model, opt = _model(lr=1e-2)
    x, y = _batches(1)[0]
    assert _native.set_gpu_profiling(True)
    try:
        launched = rc.capture(_act_then_update(model, opt), params=model.parameters(), early_outputs=1)
        for _ in range(2):
            pending = launched.launch(obs=np.ones((4, 3), np.float32), x=x, y=y)
            pending.early_result()
            pending.result()
    finally:
        _native.set_gpu_profiling(False)
    (program,) = launched._programs.values()
    labels = [label for _, label in program.native.level_times()]
    early = next(k for k, label in enumerate(labels) if "early outputs" in label)
    assert "matmul" in labels[early - 1] or "linear" in labels[early - 1], labels  # the actions' last layer
    assert early < len(labels) - 4 and labels[-1].endswith(" outputs"), labels  # the update's levels come after
