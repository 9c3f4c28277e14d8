"""The ops of the engine, each a thin call into the native op table.

Every op checks its arguments when it is called (a ValueError naming the op and the shapes, a
TypeError for a wrong dtype or kind of argument), then runs on the CPU at once, or is recorded
when a native graph is recording (the backward pass). Under an open tape, ops whose inputs
require gradients record a node for :func:`rlkit.core.backward`; their vjp rules are in vjp.py.

Elementwise binary ops broadcast any dimension of size 1 ([m, 1] over columns, [1, n] over
rows, [1, 1] everywhere). Per-column ops (softmax, log_softmax, max, argmax) work over dim 0.
"""

from __future__ import annotations

import builtins
import math
import numbers

import numpy as np

from rlkit import _native
from rlkit.core import runtime
from rlkit.core.checks import check_index_values, check_integer_values, number_in_range
from rlkit.core.tape import TAPE
from rlkit.core.tensor import Tensor, tensor

_OP_ID = {name: i for i, name in enumerate(_native.op_names())}
# ops.def's third column: the ops the tape records (each has its rule in rlkit/core/vjp.py).
DIFFERENTIABLE = frozenset(name for name, i in _OP_ID.items() if _native.op_differentiable(i))
_DTYPE_CODE = {"f32": 0, "f16": 1, "i32": 2, "f64": 3, "u8": 4, "bf16": 5}


def apply(op: str, inputs: tuple, ints=(), floats=(), **attrs) -> Tensor:
    """Runs one op of the native table; records it on the open tape when it is
    differentiable and an input requires gradients. ``attrs`` are what its vjp rule reads."""
    device = runtime.device() if not inputs else "cpu"  # an op with inputs runs on theirs
    out = Tensor(_native.apply(_OP_ID[op], [t._impl for t in inputs], list(ints), list(floats), device))
    if TAPE.recording and op in DIFFERENTIABLE and any(t.requires_grad for t in inputs):
        TAPE.record(out, op, inputs, attrs)
    return out


def check_inputs(op: str, inputs: tuple, floats=()) -> None:
    """Raises what :func:`apply` would raise for these inputs, without running the op: a form of
    an op composed of other ops refuses what the op refuses, in its words."""
    _native.check_inputs(_OP_ID[op], [t._impl for t in inputs], [], list(floats))


def as_tensor(x, like: Tensor | None = None, op: str = "op", arg: str = "x") -> Tensor:
    """x as a Tensor: tensors pass through; numbers and numpy arrays become constants of
    ``like``'s dtype and device (or the defaults). A number is made on the device, never
    uploaded."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (numbers.Number, np.ndarray)) and not isinstance(x, bool):
        device = like.device if like is not None else None
        dtype = like.dtype if like is not None and like.dtype != "i32" else None
        if isinstance(x, numbers.Number) and not isinstance(x, complex):
            return full((1, 1), float(x), dtype=dtype, device=device)
        if isinstance(x, np.ndarray) and x.size == 0:
            raise ValueError(f"{op}: {arg} is empty (shape {x.shape}); tensors need at least one element in every dimension")
        if isinstance(x, np.ndarray) and x.dtype.kind in "iu" and like is None:
            return tensor(x)
        return tensor(x, dtype=dtype, device=device)
    raise TypeError(f"{op}: {arg} must be a Tensor, a numpy array or a number, got {type(x).__name__}")


def _pair(a, b, op: str) -> tuple[Tensor, Tensor]:
    like = a if isinstance(a, Tensor) else b if isinstance(b, Tensor) else None
    return as_tensor(a, like, op, "a"), as_tensor(b, like, op, "b")


def _index(index, op: str, device: str | None = None, limit: int | None = None, what: str = "") -> Tensor:
    """Index arguments: i32 tensors or integer arrays (0-based). Host arrays, and the index
    inputs of a captured function at each replay, are checked against [0, limit) before they go
    to ``device`` (indices computed on the GPU are clamped there instead)."""
    if isinstance(index, Tensor):
        if index.dtype != "i32":
            raise TypeError(f"{op}: index must be an i32 tensor, got {index.dtype}")
        # an input of a captured function is host data too: checked at every replay
        runtime.check_replay_input(index, lambda values: check_index_values(values, op, limit, what))
        return index
    if isinstance(index, (list, tuple)):
        index = np.asarray(index)
    if isinstance(index, np.ndarray) and index.dtype.kind in "iu":
        check_index_values(index, op, limit, what)
        return tensor(index.astype(np.int32), device=device)
    raise TypeError(f"{op}: index must be an i32 tensor or an integer array, got {type(index).__name__}")


def _number(x, op: str, arg: str) -> float:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{op}: {arg} must be a real number, got {type(x).__name__}")
    return float(x)


_INT64 = (-2**63, 2**63 - 1)  # what the native ops take as an int attribute


def _int_arg(n, op: str, arg: str) -> int:
    """An int argument, checked to fit the native ops' 64-bit attributes."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"{op}: {arg} must be an int, got {type(n).__name__}")
    n = int(n)
    if not _INT64[0] <= n <= _INT64[1]:
        raise ValueError(f"{op}: {arg} = {n} does not fit in 64 bits")
    return n


def _shape(shape, op: str) -> tuple[int, ...]:
    """A shape argument: an int n (a column [n, 1]) or 1 to 4 ints, each at least 1 and within 64
    bits (the engine then checks what they multiply to: a ValueError past 2^48 bytes)."""
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape = (shape, 1)
    if not isinstance(shape, (tuple, list)):
        raise TypeError(f"{op}: shape must be a tuple of ints, got {shape!r}")
    shape = tuple(_int_arg(n, op, "shape") for n in shape)
    if not 1 <= len(shape) <= 4 or builtins.any(n < 1 for n in shape):
        raise ValueError(f"{op}: shape must have 1 to 4 positive sizes, got {shape}")
    return shape


def _shape_attrs(shape: tuple[int, ...]) -> list[int]:
    """A shape as the native ops take it: ne[0..3] then ndim (at least 2)."""
    dims = list(shape) + [1] * (4 - len(shape))
    return dims + [builtins.max(2, len(shape))]


# ---- elementwise binary ----------------------------------------------------------------

def add(a, b) -> Tensor:
    """a + b, broadcasting."""
    return apply("add", _pair(a, b, "add"))


def sub(a, b) -> Tensor:
    """a - b, broadcasting."""
    return apply("sub", _pair(a, b, "sub"))


def mul(a, b) -> Tensor:
    """a * b elementwise, broadcasting (a tensor times a number is one scale op)."""
    if isinstance(a, Tensor) and isinstance(b, numbers.Real) and not isinstance(b, bool):
        return scale(a, b)
    if isinstance(b, Tensor) and isinstance(a, numbers.Real) and not isinstance(a, bool):
        return scale(b, a)
    return apply("mul", _pair(a, b, "mul"))


def div(a, b) -> Tensor:
    """a / b elementwise, broadcasting."""
    return apply("div", _pair(a, b, "div"))


def minimum(a, b) -> Tensor:
    """Elementwise minimum, broadcasting (on ties the gradient goes to a)."""
    return apply("minimum", _pair(a, b, "minimum"))


def maximum(a, b) -> Tensor:
    """Elementwise maximum, broadcasting (on ties the gradient goes to a)."""
    return apply("maximum", _pair(a, b, "maximum"))


def ge(a, b) -> Tensor:
    """1 where a >= b, else 0 (float; not differentiable)."""
    return apply("ge", _pair(a, b, "ge"))


def gt(a, b) -> Tensor:
    """1 where a > b, else 0 (float; not differentiable)."""
    return apply("gt", _pair(a, b, "gt"))


# ---- elementwise unary -----------------------------------------------------------------

def _unary(op: str):
    def fn(x) -> Tensor:
        return apply(op, (as_tensor(x, op=op),))

    fn.__name__ = op
    return fn


neg = _unary("neg")
neg.__doc__ = "-x."
relu = _unary("relu")
relu.__doc__ = "max(x, 0)."
sigmoid = _unary("sigmoid")
sigmoid.__doc__ = "1 / (1 + exp(-x)), computed stably."
tanh = _unary("tanh")
tanh.__doc__ = "Hyperbolic tangent."
softplus = _unary("softplus")
softplus.__doc__ = "log(1 + exp(x)), computed stably."
silu = _unary("silu")
silu.__doc__ = "x * sigmoid(x)."
exp = _unary("exp")
exp.__doc__ = "e ** x."
log = _unary("log")
log.__doc__ = "Natural logarithm (NaN below 0, -inf at 0)."
sqrt = _unary("sqrt")
sqrt.__doc__ = "Square root (NaN below 0)."
square = _unary("square")
square.__doc__ = "x * x."
abs = _unary("abs")  # noqa: A001  (the op's public name)
abs.__doc__ = "|x| (gradient sign(x), 0 at 0)."
sign = _unary("sign")
sign.__doc__ = "-1, 0 or 1 (not differentiable)."


def leaky_relu(x, negative_slope: float = 0.01) -> Tensor:
    """x where x > 0, else negative_slope * x (PyTorch's; NaN stays NaN, the gradient at 0 is
    negative_slope)."""
    negative_slope = _number(negative_slope, "leaky_relu", "negative_slope")
    return apply("leaky_relu", (as_tensor(x, op="leaky_relu"),), floats=(negative_slope,),
                 negative_slope=negative_slope)


def scale(x, s) -> Tensor:
    """x * s for a number s."""
    s = _number(s, "scale", "s")
    return apply("scale", (as_tensor(x, op="scale"),), floats=(s,), s=s)


def pow(x, p) -> Tensor:  # noqa: A001  (the op's public name)
    """x ** p for a number p."""
    p = _number(p, "pow", "p")
    return apply("pow", (as_tensor(x, op="pow"),), floats=(p,), p=p)


def clamp(x, lo=-math.inf, hi=math.inf) -> Tensor:
    """x limited to [lo, hi]; the gradient is 1 strictly inside and 0 on or outside."""
    lo, hi = _number(lo, "clamp", "lo"), _number(hi, "clamp", "hi")
    return apply("clamp", (as_tensor(x, op="clamp"),), floats=(lo, hi), lo=lo, hi=hi)


def cast(x, dtype: str, scale: float | None = None) -> Tensor:
    """x converted to another dtype (f32, f16, bf16, f64, i32): floats rounded to nearest even;
    to i32 toward zero and saturating, NaN becoming 0, on both backends (a device value is not
    read back to be checked). ``scale`` multiplies the converted values, for casts from u8 or i32
    to f32 or f64 only: the bits of ``scale(cast(x, dtype), scale)`` in one pass (images: bytes to
    [0, 1] with ``scale=1/255``)."""
    if dtype not in _DTYPE_CODE:
        raise ValueError(f"cast: unknown dtype {dtype!r}; expected one of {tuple(_DTYPE_CODE)}")
    x = as_tensor(x, op="cast")
    floats = () if scale is None else (float(scale),)
    return apply("cast", (x,), ints=(_DTYPE_CODE[dtype],), floats=floats, dtype=x.dtype)


# ---- linear algebra --------------------------------------------------------------------

def matmul(a, b, transpose_a: bool = False, transpose_b: bool = False) -> Tensor:
    """op(a) @ op(b) for a [m, k] and b [k, n] giving [m, n]; op transposes when asked.
    Dimensions 2 and 3 are batch dimensions (broadcast when one side has 1)."""
    a, b = _pair(a, b, "matmul")
    ta, tb = bool(transpose_a), bool(transpose_b)
    try:
        return apply("matmul", (a, b), ints=(int(ta), int(tb)), transpose_a=ta, transpose_b=tb)
    except ValueError as error:
        hint = _row_major_hint(a, b) if not (ta or tb) else ""
        if hint:
            raise ValueError(f"{error}; {hint}") from None
        raise


def _row_major_hint(a: Tensor, b: Tensor) -> str:
    """For a @ b whose inner dimensions differ: how to fix a b that is a row-major (batch, k)
    batch given where [k, batch] is expected, when its transpose would fit; else ""."""
    if len(a.shape) == 2 and len(b.shape) == 2 and b.shape[1] == a.shape[1] != b.shape[0]:
        return (f"b looks like a row-major (batch, features) array: rlkit tensors are column-major "
                f"[features, batch], transpose it (b.T) to get [{b.shape[1]}, {b.shape[0]}]")
    return ""


LINEAR_ACTIVATIONS = (None, "relu", "tanh", "sigmoid")  # the fused activations, in the native op's order


def linear(w, x, b, activation: str | None = None) -> Tensor:
    """activation(w @ x + b) in one kernel: w [out, in], x [in, n] (dims 2 and 3 of x are batch
    dimensions, as in :func:`matmul`), b [out, 1]; activation None, "relu", "tanh" or "sigmoid"."""
    if activation not in LINEAR_ACTIVATIONS:
        raise ValueError(f"linear: activation must be one of {LINEAR_ACTIVATIONS}, got {activation!r}")
    w = as_tensor(w, op="linear", arg="w")
    x, b = as_tensor(x, like=w, op="linear", arg="x"), as_tensor(b, like=w, op="linear", arg="b")
    return apply("linear", (w, x, b), ints=(LINEAR_ACTIVATIONS.index(activation),), activation=activation)


# ---- reductions and broadcasting -------------------------------------------------------

def sum_to(x: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Sums x over the dimensions where ``shape`` has 1 (the adjoint of :func:`expand`)."""
    return apply("sum_to", (as_tensor(x, op="sum_to"),), ints=_shape_attrs(_shape(shape, "sum_to")))


def expand(x: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Repeats x along its dimensions of size 1 to ``shape``."""
    return apply("expand", (as_tensor(x, op="expand"),), ints=_shape_attrs(_shape(shape, "expand")))


def _reduced_shape(x: Tensor, dim, op: str) -> tuple[tuple[int, ...], int]:
    if x.dtype == "i32":
        raise TypeError(f"{op}: x must be a float tensor (f32, f16, bf16 or f64), got i32")
    if dim is None:
        return (1, 1), x.numel
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"{op}: dim must be an int or None, got {type(dim).__name__}")
    if not -x.ndim <= dim < x.ndim:
        raise ValueError(f"{op}: dim {dim} is out of range for x {x.shape} ({x.ndim} dimensions)")
    dim = int(dim) % x.ndim
    shape = list(x.shape)
    count = shape[dim]
    shape[dim] = 1
    return tuple(shape), count


def sum(x, dim=None, keepdim: bool = False) -> Tensor:  # noqa: A001  (the op's public name)
    """Sum of all elements ([1, 1]) or along ``dim`` (0 gives [1, batch], 1 gives [features, 1]).

    Results keep at least 2 dimensions; with ``keepdim=False`` a 3-D or 4-D input loses the
    reduced dimension.
    """
    x = as_tensor(x, op="sum")
    shape, _ = _reduced_shape(x, dim, "sum")
    out = apply("sum_to", (x,), ints=_shape_attrs(shape))
    if dim is not None and not keepdim and x.ndim > 2:
        kept = tuple(n for d, n in enumerate(x.shape) if d != int(dim) % x.ndim)
        out = reshape(out, kept)
    return out


def sum_squares(tensors) -> Tensor:
    """[1, 1]: the sum of the squares of every element of ``tensors`` (a sequence of tensors on
    one device; f16 and bf16 ones are summed in f32), in one pass over all of them: a global gradient
    norm's square without one reduction per tensor."""
    tensors = [as_tensor(t, op="sum_squares") for t in tensors]
    if not tensors:
        raise ValueError("sum_squares: expected at least one tensor, got none")
    return apply("sum_squares", tuple(cast(t, "f32") if t.dtype in runtime.HALF_DTYPES else t for t in tensors))


def mean(x, dim=None, keepdim: bool = False) -> Tensor:
    """Mean of all elements or along ``dim`` (shapes as :func:`sum`)."""
    x = as_tensor(x, op="mean")
    _, count = _reduced_shape(x, dim, "mean")
    return scale(sum(x, dim, keepdim), 1.0 / count)


def softmax(x) -> Tensor:
    """Softmax of each column (over dim 0), computed stably."""
    return apply("softmax", (as_tensor(x, op="softmax"),))


def log_softmax(x) -> Tensor:
    """Log-softmax of each column (over dim 0), computed stably."""
    return apply("log_softmax", (as_tensor(x, op="log_softmax"),))


def max(x) -> Tensor:  # noqa: A001  (the op's public name)
    """Maximum of each column: [1, batch]; the gradient goes to the first maximum."""
    return apply("max", (as_tensor(x, op="max"),))


def argmax(x) -> Tensor:
    """0-based index of the first maximum of each column: i32 [1, batch] (not differentiable)."""
    return apply("argmax", (as_tensor(x, op="argmax"),))


# ---- layout and indexing ---------------------------------------------------------------

def transpose(x) -> Tensor:
    """Swaps dimensions 0 and 1."""
    return apply("transpose", (as_tensor(x, op="transpose"),))


def permute(x, dims) -> Tensor:
    """x with its dimensions reordered, as torch.permute: out.shape[d] = x.shape[dims[d]], dims a
    permutation of 0 .. x.ndim - 1 (ne order). One pass over the elements."""
    x = as_tensor(x, op="permute")
    if not isinstance(dims, (tuple, list)) or not all(isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in dims):
        raise TypeError(f"permute: dims must be a tuple of ints, got {dims!r}")
    dims = tuple(int(d) for d in dims)
    if sorted(dims) != list(range(x.ndim)):
        raise ValueError(f"permute: dims must be a permutation of 0..{x.ndim - 1} for x {x.shape}, got {dims}")
    return apply("permute", (x,), ints=dims + tuple(range(x.ndim, 4)), dims=dims)


def reshape(x, shape) -> Tensor:
    """The same values (column-major order) in a new shape of 1 to 4 sizes; one -1 is inferred."""
    x = as_tensor(x, op="reshape")
    if isinstance(shape, numbers.Integral):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)) or not all(
        isinstance(n, numbers.Integral) and not isinstance(n, bool) for n in shape
    ):
        raise TypeError(f"reshape: shape must be a tuple of ints, got {shape!r}")
    shape = [_int_arg(n, "reshape", "shape") for n in shape]
    if not 1 <= len(shape) <= 4:
        raise ValueError(f"reshape: a shape has 1 to 4 sizes, got {len(shape)}")
    if shape.count(-1) > 1:
        raise ValueError("reshape: only one size can be -1")
    if -1 in shape:
        known = math.prod(n for n in shape if n != -1)
        if known <= 0 or x.numel % known:
            raise ValueError(f"reshape: cannot infer -1 in {tuple(shape)} for {x.numel} elements")
        shape[shape.index(-1)] = x.numel // known
    if any(n < 1 for n in shape):
        raise ValueError(f"reshape: sizes must be positive, got {tuple(shape)}")
    if len(shape) == 1:
        shape.append(1)
    return apply("reshape", (x,), ints=_shape_attrs(tuple(shape)))


def slice_rows(x, start: int, n: int) -> Tensor:
    """Rows start .. start+n-1 (0-based) of every column."""
    start, n = _int_arg(start, "slice_rows", "start"), _int_arg(n, "slice_rows", "n")
    return apply("slice_rows", (as_tensor(x, op="slice_rows"),), ints=(start, n), start=start, n=n)


def pad_rows(x, before: int, after: int) -> Tensor:
    """x with ``before`` zero rows above and ``after`` below."""
    before, after = _int_arg(before, "pad_rows", "before"), _int_arg(after, "pad_rows", "after")
    return apply("pad_rows", (as_tensor(x, op="pad_rows"),), ints=(before, after), before=before, after=after)


def concat_rows(a, b) -> Tensor:
    """Rows of a then rows of b (the same number of columns)."""
    return apply("concat_rows", _pair(a, b, "concat_rows"))


def gather(x, index) -> Tensor:
    """out[0, j] = x[index[j], j]: one row per column, 0-based. Gives [1, batch]."""
    x = as_tensor(x, op="gather")
    return apply("gather", (x, _index(index, "gather", x.device, x.shape[0], "rows")))


def one_hot(index, classes: int, dtype: str | None = None, device: str | None = None) -> Tensor:
    """[classes, n] with a 1 at row index[j] of column j (not differentiable). A host index
    array goes to ``device`` (the default device when None); a tensor index decides itself."""
    classes = _int_arg(classes, "one_hot", "classes")
    dtype = dtype or runtime.dtype()
    if dtype not in runtime.FLOAT_DTYPES:
        raise ValueError(f"one_hot: dtype must be a float dtype, got {dtype!r}")
    return apply("one_hot", (_index(index, "one_hot", device, classes, "classes"),), ints=(classes, _DTYPE_CODE[dtype]))


def cumsum(x) -> Tensor:
    """Inclusive prefix sums down each column (dim 0), accumulated in order (not differentiable)."""
    return apply("cumsum", (as_tensor(x, op="cumsum"),))


def searchsorted(sorted_column, query) -> Tensor:
    """For each query value, how many values of the ascending column [n, 1] are <= it (at most
    n - 1): i32, shaped like the query (not differentiable)."""
    sorted_column = as_tensor(sorted_column, op="searchsorted", arg="sorted_column")
    return apply("searchsorted", (sorted_column, as_tensor(query, like=sorted_column, op="searchsorted", arg="query")))


def get_rows(x, index) -> Tensor:
    """Columns of x [rows, n] chosen by 0-based index (ggml's get_rows): [rows, len(index)].
    x may be a tensor (the gradient flows into it, summed over repeated indices) or a device
    buffer (no gradient; only the indices are sent)."""
    if hasattr(x, "__rlkit_buffer__"):
        x = x.__rlkit_buffer__()
    x = as_tensor(x, op="get_rows")
    return apply("get_rows", (x, _index(index, "get_rows", x.device, x.shape[1], "columns")), columns=x.shape[1])


def put_cols(x: Tensor, index, values) -> None:
    """In place: ``x[:, index[j]] = values[:, j]`` for each j in order (a later repeat wins), on
    x's device; x [rows, c], index [1, k] of i32 column numbers, values [rows, k]. Runs inside a
    captured function too (as a side effect, never skipped). Not differentiable."""
    if hasattr(x, "__rlkit_buffer__"):
        x = x.__rlkit_buffer__()
    x = as_tensor(x, op="put_cols")
    apply("put_cols", (x, _index(index, "put_cols", x.device, x.shape[1], "columns"), as_tensor(values, like=x, op="put_cols", arg="values")))


def polyak_update(targets, sources, tau: float) -> None:
    """In place: ``target = tau * source + (1 - tau) * target`` for each pair of tensors of the
    same shape (SB3's polyak_update, with the targets first), every pair in one pass (one
    dispatch on the GPU). The targets keep their storage, so captured programs that read them
    see the update. Runs inside a captured function too. Not differentiable."""
    targets, sources = list(targets), list(sources)
    if len(targets) != len(sources) or not targets:
        raise ValueError(f"polyak_update: expected as many targets as sources (at least one), got {len(targets)} and {len(sources)}")
    for i, (target, source) in enumerate(zip(targets, sources)):
        if target.shape != source.shape or target.dtype != source.dtype:
            raise ValueError(f"polyak_update: target {i} is {list(target.shape)} {target.dtype} but its source is "
                             f"{list(source.shape)} {source.dtype}; expected the same shape and dtype")
    paired = tuple(x for target, source in zip(targets, sources) for x in (target, source))  # target, source, ...
    apply("polyak_step", paired, floats=(number_in_range(tau, "polyak_update: tau", 0.0, 1.0),))


def where(condition, x, y) -> Tensor:
    """x where ``condition`` is 1, y where it is 0 (condition holds 0s and 1s, as ge and gt
    give; x and y broadcast to its shape). A select, not arithmetic: a NaN or an infinity in the branch not
    taken does not reach the result (``condition * x`` would make it NaN). Not differentiable:
    it refuses inputs that require gradients on an open tape."""
    condition = as_tensor(condition, op="where", arg="condition")
    x, y = as_tensor(x, like=condition, op="where", arg="x"), as_tensor(y, like=condition, op="where", arg="y")
    dtypes = [t.dtype for t in (condition, x, y)]
    if "i32" in dtypes or len(set(dtypes)) > 1:
        raise TypeError(f"where: condition, x and y must be float tensors of one dtype, got {', '.join(dtypes)}")
    if TAPE.recording and any(t.requires_grad for t in (condition, x, y)):
        raise ValueError("where: not differentiable; pass stop_gradient(...) of inputs that require gradients")
    x = x if x.shape == condition.shape else expand(x, condition.shape)
    y = y if y.shape == condition.shape else expand(y, condition.shape)
    # clamp_back(g, v, lo, hi) is g where lo < v < hi and 0 elsewhere, without reading g there
    taken = apply("clamp_back", (x, condition), floats=(0.5, math.inf))
    other = apply("clamp_back", (y, sub(1.0, condition)), floats=(0.5, math.inf))
    return add(taken, other)


def scatter_cols(g, index, columns: int) -> Tensor:
    """The adjoint of get_rows: [rows, columns] with column index[j] += g[:, j]."""
    columns = _int_arg(columns, "scatter_cols", "columns")
    g = as_tensor(g, op="scatter_cols")
    return apply("scatter_cols", (g, _index(index, "scatter_cols", g.device, columns, "columns")), ints=(columns,))


# ---- constants and random values -------------------------------------------------------

def arange(n: int, device: str | None = None) -> Tensor:
    """f32 [n, 1]: 0, 1, ..., n - 1, computed on the device (no upload, so a capture can
    hold it); exact for n up to 2^24."""
    n = _int_arg(n, "arange", "n")
    if n < 1:
        raise ValueError(f"arange: n must be at least 1, got {n}")
    return add(cumsum(full((n, 1), 1.0, dtype="f32", device=device)), -1.0)  # 1 .. n, less one


def full(shape, value: float, dtype: str | None = None, device: str | None = None) -> Tensor:
    """A tensor of ``shape`` (ne order) filled with ``value``, made on the device (no upload).
    For i32 and u8, ``value`` must be a whole number in the dtype's range (ValueError)."""
    shape = _shape(shape, "full")
    dtype = dtype or runtime.dtype()
    if dtype not in _DTYPE_CODE:
        raise ValueError(f"full: unknown dtype {dtype!r}; expected one of {tuple(_DTYPE_CODE)}")
    value = _number(value, "full", "value")
    check_integer_values(value, dtype, "full")
    device = runtime.check_device(device if device is not None else runtime.device())
    ints = _shape_attrs(shape) + [_DTYPE_CODE[dtype]]
    return Tensor(_native.apply(_OP_ID["full"], [], ints, [value], device))


def zeros(shape, dtype: str | None = None, device: str | None = None) -> Tensor:
    """A tensor of zeros of the given shape (ne order), made on the device (no upload)."""
    return full(shape, 0.0, dtype=dtype, device=device)


def ones(shape, dtype: str | None = None, device: str | None = None) -> Tensor:
    """A tensor of ones of the given shape (ne order), made on the device (no upload)."""
    return full(shape, 1.0, dtype=dtype, device=device)


def _random(op: str, shape, dtype: str | None, device: str | None) -> Tensor:
    shape = _shape(shape, op)
    dtype = dtype or runtime.dtype()
    if dtype not in runtime.FLOAT_DTYPES:
        raise ValueError(f"{op}: dtype must be a float dtype, got {dtype!r}")
    device = runtime.check_device(device if device is not None else runtime.device())
    return Tensor(_native.apply(_OP_ID[op], [], _shape_attrs(shape) + [_DTYPE_CODE[dtype]], [], device))


def rand(shape, dtype: str | None = None, device: str | None = None) -> Tensor:
    """Uniform values in [0, 1) from the engine's generator (``rc.manual_seed``)."""
    return _random("rand", shape, dtype, device)


def randn(shape, dtype: str | None = None, device: str | None = None) -> Tensor:
    """Standard normal values from the engine's generator."""
    return _random("randn", shape, dtype, device)


def randint(high, shape, device: str | None = None) -> Tensor:
    """i32 values uniform in [0, high) from the engine's generator: floor(u * high) for the u
    that ``rand`` draws in high's dtype. ``high`` is a number, or a one-element float tensor
    (inside a captured function, a bound that changes between replays: a replay buffer's size).
    A number, and a captured function's input at each replay, must be finite and > 0
    (ValueError); a tensor computed on the device gives all zeros where high < 1."""
    if isinstance(high, Tensor):
        if high.numel != 1 or high.dtype == "i32":
            raise ValueError(f"randint: high must be a number or a one-element float tensor, got {high.dtype} "
                             f"{high.shape}")
        runtime.check_replay_input(high, lambda values: _check_randint_high(float(values.reshape(-1)[0])))
    elif isinstance(high, bool) or not isinstance(high, numbers.Real):
        raise TypeError(f"randint: high must be a finite number or a one-element float tensor, got {high!r}")
    else:
        _check_randint_high(float(high))
    shape = _shape(shape, "randint")
    device = runtime.check_device(device if device is not None else (
        high.device if isinstance(high, Tensor) else runtime.device()))
    bound = high if isinstance(high, Tensor) else full((1, 1), float(high), dtype="f32", device=device)
    if bound.device != device:
        raise ValueError(f"randint: high is on the {bound.device}, the draws are asked for on the {device}")
    return apply("randint", (bound,), ints=_shape_attrs(shape))


def _check_randint_high(high: float) -> None:
    if not (math.isfinite(high) and high > 0):
        raise ValueError(f"randint: high must be a finite number > 0 (the draws lie in [0, high)), got {high!r}")


def sample_categorical(logits) -> Tensor:
    """One 0-based class per column drawn from softmax(logits) (Gumbel-max): i32 [1, batch]."""
    return apply("sample_categorical", (as_tensor(logits, op="sample_categorical"),))


def sample_normal(mu, log_std) -> Tensor:
    """mu + exp(log_std) * eps with eps ~ N(0, 1): differentiable in mu and log_std
    (reparameterised). log_std broadcasts against mu."""
    mu = as_tensor(mu, op="sample_normal", arg="mu")
    log_std = as_tensor(log_std, like=mu, op="sample_normal", arg="log_std")
    if mu.dtype == "i32" or log_std.dtype != mu.dtype:
        raise TypeError(f"sample_normal: mu and log_std must have the same float dtype, got {mu.dtype} and {log_std.dtype}")
    ndim = builtins.max(mu.ndim, log_std.ndim)
    sizes = [(a, b) for a, b in zip(mu.shape + (1,) * (ndim - mu.ndim), log_std.shape + (1,) * (ndim - log_std.ndim))]
    if builtins.any(a != b and 1 not in (a, b) for a, b in sizes):
        raise ValueError(f"sample_normal: mu {mu.shape} and log_std {log_std.shape} do not broadcast")
    eps = randn(tuple(builtins.max(a, b) for a, b in sizes), dtype=mu.dtype, device=mu.device)  # one per output element
    return add(mu, mul(exp(log_std), eps))


# ---- images: [W, H, C, N] (ne0 = W), as ggml's conv_2d ---------------------------------------

def _hw_pair(value, op: str, arg: str) -> tuple[int, int]:
    """An int or a pair in PyTorch's order (height, width), returned in ne order (w, h), as the
    native ops take it. Its range is checked by the op's shape rule."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"{op}: {arg} must be an int or a pair (height, width), got {tuple(value)!r}")
        h, w = (_int_arg(v, op, arg) for v in value)
        return w, h
    n = _int_arg(value, op, arg)
    return n, n


def conv2d(x, w, b=None, stride=1, padding=0, dilation=1, activation: str | None = None) -> Tensor:
    """2-D convolution (cross-correlation, as PyTorch's ``conv2d``) of images in ggml's layout:
    ``x`` [W, H, C_in, N] (ne0 = W), ``w`` [KW, KH, C_in, C_out], result [W', H', C_out, N] with
    W' = (W + 2 padding_w - dilation_w (KW - 1) - 1) // stride_w + 1, and H' alike. A C-order
    numpy batch (N, C, H, W) passed as ``rc.tensor(arr.T)``, and PyTorch's weights (C_out, C_in,
    KH, KW) as ``w.T``, are exactly these bytes (no copy).

    ``b`` is None or C_out biases, shaped [C_out] or [C_out, 1] (PyTorch's bias as is), added to
    every pixel of its output channel. ``stride``, ``padding`` (zeros) and ``dilation`` are each
    an int or a pair in PyTorch's order, (height, width). ``activation`` (None, "relu", "tanh"
    or "sigmoid", as :func:`linear`) is applied after the bias in the same kernel: a layer's
    convolution, bias and activation are one op. Differentiable in x, w and b. f16 operands are
    multiplied on cooperative matrices on a GPU that has them (f32 sums, each result rounded once;
    ``rlkit info`` names the kernel), elsewhere on f32 copies."""
    if activation not in LINEAR_ACTIVATIONS:
        raise ValueError(f"conv2d: activation must be one of {LINEAR_ACTIVATIONS}, got {activation!r}")
    x = as_tensor(x, op="conv2d", arg="x")
    w = as_tensor(w, like=x, op="conv2d", arg="w")
    conv = _hw_pair(stride, "conv2d", "stride") + _hw_pair(padding, "conv2d", "padding") + \
        _hw_pair(dilation, "conv2d", "dilation")  # (w, h) pairs, ne order
    inputs = (x, w)
    if b is not None:
        b = as_tensor(b, like=x, op="conv2d", arg="b")
        if x.dtype == w.dtype and b.dtype != w.dtype:  # (x and w of different dtypes: the op says so)
            raise TypeError(f"conv2d: b is {b.dtype} but x and w are {w.dtype} (expected the same float dtype)")
        c_out = _ne4(w)[3]
        if b.shape not in ((c_out,), (c_out, 1)):
            raise ValueError(f"conv2d: b must hold C_out = {c_out} biases, shaped [{c_out}] or [{c_out}, 1] "
                             f"(w is {list(w.shape)}), got {list(b.shape)}")
        inputs = (x, w, b)
    ints = conv + ((LINEAR_ACTIVATIONS.index(activation),) if activation else ())
    return apply("conv2d", inputs, ints=ints, conv=conv, activation=activation)  # [W', H', C_out, N]


def max_pool2d(x, kernel, stride=None, padding=0) -> Tensor:
    """The maximum of each window of images ``x`` [W, H, C, N] (ne0 = W): [W', H', C, N] with
    W' = (W + 2 padding_w - kernel_w) // stride_w + 1 (PyTorch's ``max_pool2d``, floor mode).
    ``kernel``, ``stride`` (None: the kernel) and ``padding`` are each an int or a pair in
    PyTorch's order, (height, width); padding counts as -inf and may be at most half the kernel.

    A window holding a NaN gives NaN (as an unfused max would). The gradient of each window goes
    to its first maximum in memory order (window rows top to bottom, each left to right), or to
    its first NaN where it holds one; where windows overlap, their gradients add up."""
    x = as_tensor(x, op="max_pool2d", arg="x")
    kernel_wh = _hw_pair(kernel, "max_pool2d", "kernel")
    stride_wh = kernel_wh if stride is None else _hw_pair(stride, "max_pool2d", "stride")
    ints = kernel_wh + stride_wh + _hw_pair(padding, "max_pool2d", "padding")  # (w, h) pairs, ne order
    return apply("max_pool2d", (x,), ints=ints, pool=ints)


def _unpack_columns(packed: Tensor, layout: list[tuple[int, tuple[int, ...]]]) -> list[Tensor]:
    """Consecutive blocks of a packed tensor (column-major), each of ``size`` elements reshaped
    to ``shape``: [(size, shape), ...] in order. Differentiable layout ops only, so the tape
    carries the gradient of every block back to the one op that packed them."""
    flat = reshape(packed, (packed.numel, 1))
    blocks, start = [], 0
    for size, shape in layout:
        blocks.append(reshape(slice_rows(flat, start, size), shape))
        start += size
    return blocks


def _ne4(t: Tensor) -> tuple[int, int, int, int]:
    """A tensor's sizes in ne order, padded to four."""
    return tuple(t.shape) + (1,) * (4 - len(t.shape))


def stop_gradient(x) -> Tensor:
    """The same values, cut from the tape: no gradient flows back through it."""
    x = as_tensor(x, op="stop_gradient")
    return Tensor(x._impl)
