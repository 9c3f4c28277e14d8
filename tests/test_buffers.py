"""DeviceBuffer on both backends: column writes and reads against numpy, gathers that send only
the indices, ring wrap by two writes, device switches, and every documented error."""


import numpy as np
import pytest

import rlkit.core as rc
from rlkit.buffers import DeviceBuffer

NP = {"f32": np.float32, "f16": np.float16, "i32": np.int32, "u8": np.uint8}


def _columns(rows, k, dtype, seed=0):
    values = np.random.default_rng(seed).integers(0, 200, size=(rows, k))
    return np.asfortranarray(values.astype(NP[dtype]))


@pytest.mark.parametrize("dtype", ["f32", "f16", "i32", "u8"])
def test_write_read_and_gather_match_numpy(device, dtype):
    rows, capacity = 8, 20
    buf = DeviceBuffer(rows, capacity, dtype=dtype)
    assert buf.device == device and buf.nbytes == rows * capacity * np.dtype(NP[dtype]).itemsize
    reference = np.zeros((rows, capacity), NP[dtype])
    data = _columns(rows, 5, dtype)
    buf.write(data, col_offset=7)
    reference[:, 7:12] = data
    buf.write(data[:, 0], col_offset=19)  # one column as a 1-D array
    reference[:, 19] = data[:, 0]
    np.testing.assert_array_equal(buf.read(), reference)
    np.testing.assert_array_equal(buf.read(6, 3), reference[:, 6:9])
    index = np.array([19, 7, 7, 11, 0])
    gathered = rc.get_rows(buf, index)
    assert gathered.device == device and gathered.dtype == dtype
    np.testing.assert_array_equal(gathered.numpy(), reference[:, index])


def test_a_ring_wraps_with_two_writes(device):
    buf = DeviceBuffer(2, 5)
    reference = np.zeros((2, 5), np.float32)
    position = 0
    for step in range(4):
        chunk = np.full((2, 3), float(step + 1), np.float32)
        first = min(3, 5 - position)
        buf.write(chunk[:, :first], position)
        reference[:, position:position + first] = chunk[:, :first]
        if first < 3:
            buf.write(chunk[:, first:], 0)
            reference[:, :3 - first] = chunk[:, first:]
        position = (position + 3) % 5
    np.testing.assert_array_equal(buf.read(), reference)


def test_only_new_columns_and_indices_cross(device):
    buf = DeviceBuffer(16, 1000)
    rc.transfer_stats(reset=True)
    buf.write(np.ones((16, 4), np.float32), 100)
    gathered = rc.get_rows(buf, np.arange(32))
    stats = rc.transfer_stats()
    if device == "gpu":
        assert stats["uploads"] == 2 and stats["upload_bytes"] == 16 * 4 * 4 + 32 * 4  # 4 columns, 32 indices
        assert stats["downloads"] == 0
        gathered.numpy()
        assert rc.transfer_stats()["download_bytes"] == 16 * 32 * 4
    else:
        assert stats == {"uploads": 0, "downloads": 0, "upload_bytes": 0, "download_bytes": 0}


def test_u8_frames_widen_to_f32_on_the_device(device):
    frames = DeviceBuffer(84 * 84 * 4, 6, dtype="u8")
    data = _columns(84 * 84 * 4, 6, "u8", seed=3)
    frames.write(data)
    batch = rc.cast(rc.get_rows(frames, np.array([5, 0, 2])), "f32")
    np.testing.assert_array_equal(batch.numpy(), data[:, [5, 0, 2]].astype(np.float32))


@pytest.mark.requires_gpu
def test_switching_the_default_device_moves_the_contents():
    previous = rc.device("cpu")
    try:
        buf = DeviceBuffer(3, 4, dtype="i32")
        data = np.arange(12, dtype=np.int32).reshape(3, 4, order="F")
        buf.write(data)
        generation = buf.generation
        rc.device("gpu")
        assert buf.device == "gpu" and buf.generation > generation
        np.testing.assert_array_equal(buf.read(), data)
        rc.device("cpu")
        assert buf.device == "cpu"
        np.testing.assert_array_equal(buf.read(), data)
        buf.to("gpu")
        np.testing.assert_array_equal(rc.get_rows(buf, [3]).numpy(), data[:, [3]])
    finally:
        rc.device(previous)


@pytest.mark.requires_gpu
def test_a_buffer_made_on_a_device_stays_there():
    """An agent on the GPU pins its buffers there: switching the default device back and forth
    (as acting on the agent's device does) moves nothing."""
    previous = rc.device("cpu")
    try:
        buf = DeviceBuffer(2, 3, device="gpu")
        buf.write(np.ones((2, 3), np.float32))
        generation = buf.generation
        rc.device("gpu")
        rc.device("cpu")
        assert buf.device == "gpu" and buf.generation == generation
        np.testing.assert_array_equal(buf.read(), np.ones((2, 3), np.float32))
    finally:
        rc.device(previous)


def test_errors(device):
    buf = DeviceBuffer(4, 10)
    with pytest.raises(ValueError, match=r"shape \(3, 2\), expected \(4, k\)"):
        buf.write(np.zeros((3, 2)))
    with pytest.raises(IndexError, match=r"columns \[9, 11\) are past the end of a buffer of capacity 10"):
        buf.write(np.zeros((4, 2)), 9)
    with pytest.raises(ValueError, match="col_offset must be >= 0"):
        buf.write(np.zeros((4, 1)), -1)
    with pytest.raises(TypeError, match="col_offset must be an int"):
        buf.write(np.zeros((4, 1)), 1.5)
    with pytest.raises(TypeError, match="numeric"):
        buf.write(np.array([["a"] * 2] * 4))
    with pytest.raises(IndexError, match=r"valid columns: 0..9"):
        buf.read(8, 5)
    with pytest.raises(IndexError, match=r"get_rows: index 10 at position 1 is out of range for 10 columns \(valid: 0..9\)"):
        rc.get_rows(buf, np.array([0, 10]))
    with pytest.raises(IndexError, match="out of range"):
        rc.get_rows(buf, np.array([-1]))
    buf.free()
    assert buf.freed
    for use in (lambda: buf.write(np.zeros((4, 1))), lambda: buf.read(), lambda: rc.get_rows(buf, [0]),
                lambda: buf.device):
        with pytest.raises(RuntimeError, match="freed"):
            use()


@pytest.mark.parametrize("dtype, data, message", [
    ("u8", [[300, -1]], r"^DeviceBuffer.write: value 300 at position 0 does not convert to u8 "
                        r"\(whole numbers from 0 to 255\)$"),
    ("u8", [[1, -1]], "value -1 at position 1 does not convert to u8"),
    ("u8", [[0.5, 1.0]], "value 0.5 at position 0"),
    ("i32", [[2**32 + 1, 0]], "value 4294967297 at position 0 does not convert to i32"),
    ("i32", [[1.0, np.nan]], "value nan at position 1 does not convert to i32"),
    ("i32", [[1.5, 0.0]], "value 1.5 at position 0"),
])
def test_integer_tables_refuse_values_they_cannot_hold(device, dtype, data, message):
    buf = DeviceBuffer(1, 4, dtype=dtype)
    buf.write(np.array([[1, 2, 3, 4]]))
    with pytest.raises(ValueError, match=message):
        buf.write(np.array(data), 1)
    np.testing.assert_array_equal(buf.read(), [[1, 2, 3, 4]])  # nothing written
    buf.write(np.array([[0.0, 255.0]]), 2)  # whole numbers in range, from floats too, are stored exactly
    np.testing.assert_array_equal(buf.read(), [[1, 2, 0, 255]])


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(rows=0, capacity=4), ValueError, "rows must be a positive int"),
    (dict(rows=2, capacity=-1), ValueError, "capacity must be a positive int"),
    (dict(rows=2.0, capacity=4), ValueError, "rows"),
    (dict(rows=2, capacity=4, dtype="f64"), ValueError, "dtype must be one of"),
    (dict(rows=2, capacity=4, device="tpu"), ValueError, "unknown device"),
    (dict(rows=2**20, capacity=2**20), MemoryError, "85% of the"),
])
def test_bad_construction(kwargs, error, message):
    with pytest.raises(error, match=message):
        DeviceBuffer(**kwargs)


@pytest.mark.requires_gpu
def test_gpu_u8_gathers_need_whole_words():
    buf = DeviceBuffer(6, 3, dtype="u8", device="gpu")
    with pytest.raises(TypeError, match="rows a multiple of 4"):
        rc.get_rows(buf, [0])


@pytest.mark.requires_gpu
@pytest.mark.parametrize("rows, n", [(32, 6), (32, 12), (8, 32), (7 * 4, 9)])
def test_gpu_u8_gathers_write_only_their_output(rows, n):
    """A u8 gather moves 32-bit words: it once ran a word per byte of its output, writing 4x past
    its end into whatever was allocated next (here the copy a reshape made of an earlier gather)."""
    data = np.random.default_rng(0).integers(0, 256, (rows, 6)).astype(np.uint8)
    first, second = DeviceBuffer(rows, 6, "u8", device="gpu"), DeviceBuffer(rows, 6, "u8", device="gpu")
    first.write(data)
    second.write(255 - data)
    index = np.arange(n) % 6
    kept = rc.reshape(rc.get_rows(first, index), (rows // 4, 4, n))  # the gather it copies is freed now
    again = rc.get_rows(second, index)
    np.testing.assert_array_equal(kept.numpy().reshape(rows, n, order="F"), data[:, index])
    np.testing.assert_array_equal(again.numpy(), 255 - data[:, index])
