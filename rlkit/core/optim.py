"""Optimizers: each update rule is one fused native call over the whole parameter set.

Hyperparameters are plain numbers passed at every step, so changing ``lr`` (a schedule) never
rebuilds anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rlkit import _native
from rlkit.core import ops
from rlkit.core.autograd import Gradients
from rlkit.core.tensor import Tensor


def _param_list(params) -> list[Tensor]:
    if isinstance(params, Mapping):
        params = params.values()
    if isinstance(params, Tensor):
        raise TypeError("optimizer: pass a list (or dict) of parameters, not a single tensor")
    params = list(params)
    if not params:
        raise ValueError("optimizer: got an empty parameter list")
    unique: list[Tensor] = []
    for p in params:
        if not isinstance(p, Tensor) or not p.requires_grad or not p.is_leaf:
            raise TypeError(f"optimizer: expected parameters made by rc.param, got {p!r}")
        if all(p is not q for q in unique):
            unique.append(p)
    return unique


def _non_negative(value, what: str) -> float:
    if not value >= 0:
        raise ValueError(f"optimizer: {what} must be >= 0, got {value!r}")
    return float(value)


class Optimizer:
    """Shared parts: the parameter list, the learning rate, gradient lookup and zero_grad."""

    def __init__(self, params: Iterable[Tensor] | Mapping[str, Tensor], lr: float):
        if not lr >= 0:
            raise ValueError(f"optimizer: lr must be >= 0, got {lr!r}")
        self.params = _param_list(params)
        self.lr = float(lr)
        self.step_count = 0

    def _gradients(self, grads: Gradients | None) -> tuple[list[Tensor], list[Tensor]]:
        """(parameters, gradient tensors) of the parameters that have a gradient."""
        with_grad, grad_tensors = [], []
        for p in self.params:
            g = p._grad if grads is None else (grads.tensor(p) if p in grads else None)
            if g is not None:
                with_grad.append(p)
                grad_tensors.append(g)
        return with_grad, grad_tensors

    def zero_grad(self) -> None:
        """Forgets the accumulated gradients of every parameter."""
        for p in self.params:
            p._grad = None


def _zeros_like(p: Tensor) -> Tensor:
    return ops.zeros(p.shape, dtype=p.dtype)


class SGD(Optimizer):
    """Stochastic gradient descent: v = momentum v + (g + weight_decay w); w -= lr v."""

    def __init__(self, params, lr: float = 0.01, momentum: float = 0.0, weight_decay: float = 0.0):
        super().__init__(params, lr)
        self.momentum = _non_negative(momentum, "momentum")
        self.weight_decay = _non_negative(weight_decay, "weight_decay")
        self._velocity = {id(p): _zeros_like(p) for p in self.params}

    def step(self, grads: Gradients | None = None) -> None:
        """Updates the parameters from ``grads`` (or their accumulated ``.grad``)."""
        params, g = self._gradients(grads)
        _native.sgd_update(
            [p._impl for p in params], [t._impl for t in g], [self._velocity[id(p)]._impl for p in params],
            self.lr, self.momentum, self.weight_decay,
        )
        self.step_count += 1


class Adam(Optimizer):
    """Adam (Kingma and Ba, 2015) with bias correction; weight_decay adds wd * w to the gradient."""

    decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        super().__init__(params, lr)
        beta1, beta2 = betas
        if not (0 <= beta1 < 1 and 0 <= beta2 < 1):
            raise ValueError(f"Adam: betas must lie in [0, 1), got {betas!r}")
        self.betas = (float(beta1), float(beta2))
        self.eps = _non_negative(eps, "eps")
        self.weight_decay = _non_negative(weight_decay, "weight_decay")
        self._m = {id(p): _zeros_like(p) for p in self.params}
        self._v = {id(p): _zeros_like(p) for p in self.params}
        # Steps taken by each parameter (PyTorch's per-parameter state["step"]): a parameter
        # without a gradient in a step keeps its bias correction where it was.
        self._steps = {id(p): 0 for p in self.params}

    def step(self, grads: Gradients | None = None) -> None:
        """Updates the parameters from ``grads`` (or their accumulated ``.grad``)."""
        params, g = self._gradients(grads)
        self.step_count += 1
        beta1, beta2 = self.betas
        groups: dict[int, tuple[list[Tensor], list[Tensor]]] = {}
        for p, gp in zip(params, g):
            self._steps[id(p)] += 1
            group = groups.setdefault(self._steps[id(p)], ([], []))
            group[0].append(p)
            group[1].append(gp)
        for t, (ps, gs) in groups.items():
            _native.adam_update(
                [p._impl for p in ps], [x._impl for x in gs],
                [self._m[id(p)]._impl for p in ps], [self._v[id(p)]._impl for p in ps],
                lr=self.lr, beta1=beta1, beta2=beta2, eps=self.eps, weight_decay=self.weight_decay,
                bias_correction1=1.0 - beta1**t, bias_correction2=1.0 - beta2**t,
                decoupled=self.decoupled,
            )


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov and Hutter, 2019): w *= 1 - lr * wd."""

    decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01):
        super().__init__(params, lr, betas, eps, weight_decay)
