"""Tensors: column-major ``[features, batch]`` values of the native engine.

A 2-D tensor of shape ``(features, batch)`` holds one example per column. From numpy, a
Fortran-ordered ``(features, batch)`` array (or, the same bytes, a C-ordered ``(batch,
features)`` array transposed) is taken without a copy by :func:`tensor`.
"""

from __future__ import annotations

import numbers

import ml_dtypes
import numpy as np

from rlkit import _native
from rlkit.core import runtime
from rlkit.core.checks import check_integer_values
from rlkit.core.tape import DeviceGradient

# bf16 arrays are ml_dtypes' bfloat16 (numpy has no such dtype)
NUMPY_DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16, "i32": np.int32, "f64": np.float64,
                 "u8": np.uint8}


class Tensor:
    """A value of the engine: up to 4 dimensions, dtype f32, f16, bf16, i32 or f64.

    ``shape`` is ggml's ``ne`` order (``shape[0]`` is contiguous); a tensor has at least 2
    dimensions. Arithmetic operators build ops (recorded on the tape when one is open).
    """

    __slots__ = ("_impl", "requires_grad", "name", "_node", "_grad", "__weakref__")
    __array_priority__ = 1000  # numpy defers `array + tensor` to Tensor.__radd__

    def __init__(self, impl: _native.Tensor, requires_grad: bool = False, name: str | None = None):
        self._impl = impl
        self.requires_grad = requires_grad
        self.name = name
        self._node = None  # the tape's node that produced this tensor, if recorded
        self._grad = None  # accumulated gradient (a Tensor) of a leaf that requires grad

    @property
    def shape(self) -> tuple[int, ...]:
        """Sizes in ne order: ``(features, batch)`` for a 2-D tensor."""
        return self._impl.shape

    @property
    def ndim(self) -> int:
        """Number of dimensions (2 to 4)."""
        return self._impl.ndim

    @property
    def dtype(self) -> str:
        """"f32", "f16", "bf16", "i32" or "f64"."""
        return self._impl.dtype

    @property
    def device(self) -> str:
        """The device holding the values: "cpu" or "gpu"."""
        return self._impl.device

    @property
    def numel(self) -> int:
        """Number of elements."""
        return self._impl.numel

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor's values."""
        return self._impl.nbytes

    @property
    def version(self) -> int:
        """A counter of in-place writes to this tensor (an optimizer step, a load, a column
        write): equal versions mean the values did not change in between. Writes by a replay of
        a captured program do not count (the program runs without Python)."""
        return self._impl.version

    def write_columns(self, array: np.ndarray, col0: int) -> None:
        """Overwrites columns ``col0`` .. ``col0 + k - 1`` in place from a Fortran-ordered
        [rows, k] array of this tensor's dtype; only those bytes move to the device."""
        self._impl.write_columns(array, col0)

    def read_columns(self, col0: int, k: int) -> np.ndarray:
        """A Fortran-ordered copy of ``k`` columns from ``col0``; only those bytes move."""
        runtime.refuse_host_work("reads a value on the host (Tensor.read_columns())")
        return self._impl.read_columns(col0, k)

    @property
    def is_leaf(self) -> bool:
        """True when no recorded op produced this tensor."""
        return self._node is None

    def numpy(self) -> np.ndarray:
        """A Fortran-ordered copy of the values, shaped like ``shape``."""
        runtime.refuse_host_work("reads a value on the host (Tensor.numpy() or item())")
        return self._impl.numpy()

    def item(self) -> float | int:
        """The value of a one-element tensor as a Python number."""
        if self.numel != 1:
            raise ValueError(f"item: the tensor has {self.numel} elements, expected exactly 1")
        return self.numpy().reshape(-1)[0].item()

    def _scalar(self, conversion: str) -> float | int:
        """The value of a one-element tensor, for ``float()``, ``int()`` and ``bool()``; more
        elements raise, as PyTorch's do (which of them would be meant is ambiguous)."""
        if self.numel != 1:
            raise ValueError(f"{conversion}() of a tensor needs exactly one element, this one has {self.numel} "
                             f"(shape {self.shape}); reduce it first (rc.sum, rc.mean) or read .numpy()")
        return self.item()

    def __float__(self) -> float:
        return float(self._scalar("float"))

    def __int__(self) -> int:
        return int(self._scalar("int"))

    def __bool__(self) -> bool:
        return bool(self._scalar("bool"))

    @property
    def grad(self):
        """The accumulated gradient after backward (None before, and after zero_grad): a numpy
        array on the CPU; on the GPU a DeviceGradient handle (``.numpy()`` downloads it)."""
        if self._grad is None:
            return None
        if self._grad.device == "cpu":
            return self._grad.numpy()
        return DeviceGradient(self._grad)

    @grad.setter
    def grad(self, value) -> None:
        if value is None:
            self._grad = None
            return
        arr = _to_fortran(value, self.dtype)
        g = Tensor(_native.from_numpy(arr, _dtype_of(arr), True, self.device))  # a copy: never aliases the array
        if g.shape != self.shape:
            raise ValueError(f"grad: shape {g.shape} does not match the tensor's {self.shape}")
        self._grad = g

    def to(self, device: str) -> "Tensor":
        """A copy on ``device`` (the same tensor when it is already there). A parameter's copy is
        a parameter with the same name; the copy is not recorded on the tape."""
        device = runtime.check_device(device)
        if device == self.device:
            return self
        impl = _native.from_numpy(self.numpy(), self.dtype, True, device)
        return Tensor(impl, requires_grad=self.requires_grad and self.is_leaf, name=self.name)

    def __array__(self, dtype=None, copy=None):
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype)

    def __repr__(self) -> str:
        flags = ", requires_grad=True" if self.requires_grad else ""
        label = f", name={self.name!r}" if self.name else ""
        return f"Tensor(shape={self.shape}, dtype={self.dtype}{flags}{label})"

    # Operators build ops; the op functions live in ops.py.
    def __add__(self, other):
        return ops.add(self, other)

    def __radd__(self, other):
        return ops.add(other, self)

    def __sub__(self, other):
        return ops.sub(self, other)

    def __rsub__(self, other):
        return ops.sub(other, self)

    def __mul__(self, other):
        return ops.mul(self, other)

    def __rmul__(self, other):
        return ops.mul(other, self)

    def __truediv__(self, other):
        return ops.div(self, other)

    def __rtruediv__(self, other):
        return ops.div(other, self)

    def __matmul__(self, other):
        return ops.matmul(self, other)

    def __rmatmul__(self, other):
        return ops.matmul(other, self)

    def __neg__(self):
        return ops.neg(self)

    def __pow__(self, p):
        return ops.pow(self, p)

    def __rpow__(self, base):
        # base ** x = exp(x * log(base)): defined for a positive number or array base.
        if isinstance(base, bool) or not isinstance(base, (numbers.Real, np.ndarray)):
            return NotImplemented
        base = np.asarray(base, dtype=np.float64)
        if base.dtype.kind not in "fiu" or not np.all(base > 0):
            raise ValueError("base ** tensor: the base must be positive (a number or an array of positive numbers)")
        log_base = float(np.log(base)) if base.ndim == 0 else np.log(base)
        return ops.exp(ops.mul(self, log_base))

    @property
    def T(self) -> "Tensor":
        """The transpose (dims 0 and 1 swapped)."""
        return ops.transpose(self)

    def permute(self, *dims) -> "Tensor":
        """The dims reordered, as torch.Tensor.permute: ``x.permute(2, 0, 1)`` or
        ``x.permute((2, 0, 1))`` (:func:`rlkit.core.permute`)."""
        return ops.permute(self, dims[0] if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims)


def _to_fortran(data, dtype: str | None) -> np.ndarray:
    """Converts array-like data to a Fortran-ordered array of an rlkit dtype (no copy when it
    already is one). Values must convert to an integer dtype unchanged (ValueError)."""
    if isinstance(data, Tensor):
        data = data.numpy()
    if isinstance(data, (bool, np.bool_)) or (isinstance(data, np.ndarray) and data.dtype == np.bool_):
        data = np.asarray(data, dtype=np.float32)
    if not isinstance(data, (np.ndarray, numbers.Number, list, tuple)):
        raise TypeError(f"expected a numpy array, a number or a list of numbers, got {type(data).__name__}")
    arr = np.asarray(data)
    if arr.dtype.kind not in "fiu" and arr.dtype != ml_dtypes.bfloat16:
        raise TypeError(f"expected numeric data, got an array of dtype {arr.dtype}")
    if dtype is None:
        dtype = "i32" if arr.dtype.kind in "iu" else "bf16" if arr.dtype == ml_dtypes.bfloat16 else runtime.dtype()
    if dtype not in NUMPY_DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {tuple(NUMPY_DTYPES)}")
    if arr.ndim > 4:
        raise ValueError(f"rlkit tensors have at most 4 dimensions, got an array of shape {arr.shape}")
    check_integer_values(arr, dtype, "tensor")
    if arr.ndim == 0:
        arr = arr.reshape(1, 1)
    return np.asfortranarray(arr, dtype=NUMPY_DTYPES[dtype])


def _resolve_device(device: str | None) -> str:
    """The device to make a tensor on: the given one or the default, checked."""
    return runtime.check_device(device if device is not None else runtime.device())


def tensor(data, dtype: str | None = None, device: str | None = None) -> Tensor:
    """A non-trainable tensor. A 1-D array becomes one column ``[n, 1]``.

    On the CPU a Fortran-ordered numpy array of the target dtype is shared, not copied:
    writing to the array afterwards changes the tensor (on the GPU the values are uploaded).
    Integer data becomes i32 unless ``dtype`` says otherwise; float data takes the default
    dtype (``rc.dtype()``); the device defaults to ``rc.device()``. Data made i32 or u8 must
    be whole numbers in the dtype's range (NaN, Inf, 2.5 or 300 for u8 raise ValueError).
    """
    device = _resolve_device(device)
    runtime.refuse_host_work("makes a tensor from host data (rc.tensor)")
    arr = _to_fortran(data, dtype)
    return Tensor(_native.from_numpy(arr, _dtype_of(arr), False, device))


def param(data, name: str | None = None, dtype: str | None = None, device: str | None = None) -> Tensor:
    """A trainable tensor (``requires_grad``), holding its own copy of ``data``.

    ``name`` keys its gradient in the mapping :func:`backward` returns.
    """
    device = _resolve_device(device)
    if name is not None and not isinstance(name, str):
        raise TypeError(f"param: name must be a str, got {type(name).__name__}")
    arr = _to_fortran(data, dtype if dtype is not None else _float_dtype_of(data))
    if arr.dtype == np.int32:
        raise TypeError("param: a trainable tensor must be float (f32, f16, bf16 or f64), got i32 data")
    return Tensor(_native.from_numpy(arr, _dtype_of(arr), True, device), requires_grad=True, name=name)


def _float_dtype_of(data) -> str:
    return data.dtype if isinstance(data, Tensor) and data.dtype != "i32" else runtime.dtype()


def _dtype_of(arr: np.ndarray) -> str:
    for name, np_dtype in NUMPY_DTYPES.items():
        if arr.dtype == np_dtype:
            return name
    raise TypeError(f"unsupported array dtype {arr.dtype}")


# Last, once Tensor exists: the operators above call ops, and ops build on Tensor (the one
# import cycle of the engine).
from rlkit.core import ops  # noqa: E402
