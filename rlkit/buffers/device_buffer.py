"""DeviceBuffer: a rows x capacity table on a device, written by columns, read by column index.

One column is one transition (or one frame). Writing sends only the new columns; gathering
(``rc.get_rows(buffer, index)``) sends only the indices and returns a tensor on the buffer's
device. A buffer made without a device follows the default device (``rc.device(...)`` moves
its contents); one made with a device stays there until ``.to()`` moves it.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable

import numpy as np

from rlkit.core import runtime
from rlkit.core import ops
from rlkit.core.checks import check_integer_values, positive_int
from rlkit.core.tensor import NUMPY_DTYPES, Tensor

DTYPES = ("f32", "f16", "i32", "u8")
MAX_FRACTION_OF_FREE_MEMORY = 0.85


class DeviceBuffer:
    """A ``rows`` x ``capacity`` table of ``dtype`` (f32, f16, i32 or u8) on the current device.

    ``write(data, col_offset)`` stores columns, ``read(col_offset, k)`` returns them as a numpy
    array, ``rc.get_rows(buffer, index)`` gathers columns on the device, ``free()`` releases the
    memory now. An allocation beyond 85% of the device's free memory is refused (MemoryError).
    """

    def __init__(self, rows: int, capacity: int, dtype: str = "f32", device: str | None = None):
        self.rows = positive_int(rows, "DeviceBuffer: rows")
        self.capacity = positive_int(capacity, "DeviceBuffer: capacity")
        if dtype not in DTYPES:
            raise ValueError(f"DeviceBuffer: dtype must be one of {DTYPES}, got {dtype!r}")
        self.dtype = dtype
        follows = device is None
        device = runtime.check_device(device if device is not None else runtime.device())
        nbytes = self.rows * self.capacity * np.dtype(NUMPY_DTYPES[dtype]).itemsize
        free = runtime.free_memory(device)
        if nbytes > MAX_FRACTION_OF_FREE_MEMORY * free:
            raise MemoryError(
                f"DeviceBuffer: {self.rows} x {self.capacity} {dtype} needs {nbytes / 2**20:.1f} MiB, more than "
                f"85% of the {free / 2**20:.1f} MiB free on the {device}"
            )
        self._tensor: Tensor | None = ops.full((self.rows, self.capacity), 0, dtype=dtype, device=device)
        self.generation = 0  # bumped by every write, move and free (captures re-record on it)
        self.before_read: Callable[[], None] | None = None
        """Called before the table's data is read: by a gather, by ``read``, and before every
        replay of a captured program that gathers from it. An owner that stages columns on the
        host sets it to send them, so no reader can miss one."""
        if follows:
            runtime.follow_device(self._follow_device)

    # ---- state -----------------------------------------------------------------------------

    def _live(self, what: str) -> Tensor:
        if self._tensor is None:
            raise RuntimeError(f"DeviceBuffer.{what}: the buffer was freed; make a new one")
        return self._tensor

    @property
    def device(self) -> str:
        """The device holding the table."""
        return self._live("device").device

    @property
    def nbytes(self) -> int:
        """Bytes of the table."""
        return self._live("nbytes").nbytes

    @property
    def freed(self) -> bool:
        """True after free()."""
        return self._tensor is None

    def __rlkit_buffer__(self) -> Tensor:
        """The table as a tensor, for rc.get_rows (no gradient flows into a buffer); runs
        ``before_read`` now, or inside a capture before every replay of the captured program."""
        table = self._live("get_rows")
        if self.before_read is not None:
            capture = runtime.active_capture()
            if capture is None:
                self.before_read()
            else:  # a replay runs no Python: the program calls the hook itself
                capture.before_each_replay(self.before_read)
        return table

    # ---- columns ---------------------------------------------------------------------------

    def write(self, data, col_offset: int = 0) -> None:
        """Stores ``data`` [rows, k] (or one column of ``rows`` values) into columns
        ``col_offset`` .. ``col_offset + k - 1``; only those columns are sent. An i32 or u8 table
        takes whole numbers in its dtype's range (ValueError otherwise, nothing written)."""
        self._live("write")  # a freed buffer says so before anything else is checked
        if isinstance(col_offset, bool) or not isinstance(col_offset, numbers.Integral):
            raise TypeError(f"DeviceBuffer.write: col_offset must be an int, got {type(col_offset).__name__}")
        if col_offset < 0:
            raise ValueError(f"DeviceBuffer.write: col_offset must be >= 0, got {col_offset}")
        arr = np.asarray(data)
        if arr.dtype.kind not in "fiub":
            raise TypeError(f"DeviceBuffer.write: expected numeric data, got {arr.dtype}")
        if arr.ndim == 1:
            arr = arr.reshape(-1, 1)
        if arr.ndim != 2 or arr.shape[0] != self.rows:
            raise ValueError(f"DeviceBuffer.write: data has shape {arr.shape}, expected ({self.rows}, k) columns "
                             f"of {self.rows} rows")
        k = arr.shape[1]
        if k == 0:
            raise ValueError("DeviceBuffer.write: no columns to write")
        if col_offset + k > self.capacity:
            raise IndexError(f"DeviceBuffer.write: columns [{col_offset}, {col_offset + k}) are past the end of a "
                             f"buffer of capacity {self.capacity} (write in two parts to wrap a ring)")
        check_integer_values(arr, self.dtype, "DeviceBuffer.write")
        self._write_checked(arr, int(col_offset))

    def _write_checked(self, columns: np.ndarray, col_offset: int) -> None:
        """``write`` without its checks, for an owner whose columns are known to be good: a
        [rows, k] array of values the dtype holds, to columns inside the table. A replay buffer
        sends six such runs per flush, once a step for SAC, where the checks took half the time."""
        self._live("write").write_columns(np.asfortranarray(columns, dtype=NUMPY_DTYPES[self.dtype]), col_offset)
        self.generation += 1

    def read(self, col_offset: int = 0, k: int | None = None) -> np.ndarray:
        """A copy of columns ``col_offset`` .. ``col_offset + k - 1`` (to the end when k is None),
        Fortran-ordered [rows, k]."""
        table = self._live("read")
        k = self.capacity - col_offset if k is None else k
        for name, value in (("col_offset", col_offset), ("k", k)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"DeviceBuffer.read: {name} must be an int, got {type(value).__name__}")
        if col_offset < 0 or k < 1 or col_offset + k > self.capacity:
            raise IndexError(f"DeviceBuffer.read: columns [{col_offset}, {col_offset + k}) are not inside a buffer "
                             f"of capacity {self.capacity} (valid columns: 0..{self.capacity - 1})")
        if self.before_read is not None:
            self.before_read()
        return table.read_columns(int(col_offset), int(k))

    # ---- lifetime and devices --------------------------------------------------------------

    def free(self) -> None:
        """Releases the memory now; any later use raises RuntimeError."""
        self._tensor = None
        self.generation += 1

    def to(self, device: str) -> "DeviceBuffer":
        """Moves the contents to ``device`` (nothing is lost); returns self."""
        table = self._live("to")
        if device != table.device:
            self._tensor = table.to(device)
            self.generation += 1
        return self

    def _follow_device(self, device: str) -> None:
        if self._tensor is not None:
            self.to(device)

    def __repr__(self) -> str:
        where = "freed" if self.freed else self.device
        return f"DeviceBuffer(rows={self.rows}, capacity={self.capacity}, dtype={self.dtype}, {where})"
