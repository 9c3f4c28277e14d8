"""rlkit.core: the autograd engine.

Tensors are column-major ``[features, batch]``; ``with grad_tape():`` records ops and
``backward(loss)`` returns gradients keyed by parameter and by name. See API.md for the
contract.
"""

# The engine in reading order, each module importing only those above it (tensor and ops import
# each other: Tensor's operators are ops): runtime, tape, tensor, ops, recurrences, vjp, autograd,
# capturing.
from rlkit.core.runtime import (
    CaptureError, device, devices, dtype, get_num_threads, get_rng_state, gpu_stats, manual_seed, set_num_threads, set_rng_state,
    synchronize, transfer_stats,
)
from rlkit.core.tape import grad_tape, no_grad, tape_memory
from rlkit.core.tensor import Tensor, param, tensor
from rlkit.core.ops import (
    abs, add, arange, argmax, as_tensor, cast, conv2d, cumsum, full, searchsorted, clamp, concat_rows, div, exp, expand, gather, ge, get_rows, gt, leaky_relu, log,
    linear, log_softmax, matmul, max, max_pool2d, maximum, mean, minimum, mul, neg, one_hot, ones, pad_rows, permute, polyak_update, pow,
    put_cols,
    rand, randn, relu,
    reshape, sample_categorical, sample_normal, scale, scatter_cols, sigmoid, sign, silu, slice_rows, softmax,
    softplus, sqrt, square, stop_gradient, sub, sum, sum_squares, sum_to, tanh, transpose, where, zeros,
)
from rlkit.core.recurrences import gated_linear_attn, rwkv_wkv6, rwkv_wkv7, ssm_conv, ssm_scan
from rlkit.core.autograd import Gradients, backward
from rlkit.core.capturing import capture, capture_step, update_step
from rlkit.core.data import Batch, DataLoader
from rlkit.core.clip import check_grad_anomaly, clip_grad_norm, clip_grad_value
from rlkit.core.gradcheck import GradcheckError, gradcheck
from rlkit.core.losses import cross_entropy_loss, huber_loss, mse_loss, softmax_cross_entropy_loss
from rlkit.core import checks, files, graph, nn, optim, parallel, runtime, sched
from rlkit.core.parallel import dp_train

__all__ = [
    "Tensor", "tensor", "param", "zeros", "ones", "full", "arange", "as_tensor", "synchronize", "gpu_stats",
    "grad_tape", "no_grad", "backward", "Gradients", "tape_memory", "gradcheck", "GradcheckError",
    "device", "devices", "dtype", "set_num_threads", "get_num_threads", "manual_seed", "get_rng_state", "set_rng_state", "transfer_stats",
    "add", "sub", "mul", "div", "minimum", "maximum", "ge", "gt", "neg", "relu", "leaky_relu", "sigmoid", "tanh", "softplus",
    "silu", "exp", "log", "sqrt", "square", "abs", "sign", "scale", "pow", "clamp", "cast", "matmul", "linear", "sum",
    "sum_squares", "mean", "sum_to", "expand", "softmax", "log_softmax", "max", "argmax", "transpose", "permute", "reshape",
    "slice_rows", "pad_rows", "concat_rows", "cumsum", "searchsorted", "gather", "one_hot", "get_rows", "scatter_cols", "rand", "randn",
    "sample_categorical", "sample_normal", "ssm_conv", "ssm_scan", "rwkv_wkv6", "rwkv_wkv7", "gated_linear_attn",
    "conv2d", "max_pool2d",
    "stop_gradient", "where", "put_cols", "polyak_update",
    "mse_loss", "huber_loss", "cross_entropy_loss", "softmax_cross_entropy_loss",
    "DataLoader", "Batch", "capture", "capture_step", "update_step", "CaptureError", "clip_grad_norm", "clip_grad_value", "check_grad_anomaly", "graph", "nn", "optim", "sched", "checks", "files", "runtime",
    "parallel", "dp_train",
]
