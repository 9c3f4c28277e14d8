"""Optimizers: each update rule is one native op over a parameter set (adam_step, sgd_step: one
pass over all their elements, one dispatch on the GPU), applied by eager steps and recorded by
captured ones alike, its coefficients computed once per step on the host (``_coefficients``).

Hyperparameters are plain numbers passed at every step, so changing ``lr`` (a schedule) never
rebuilds anything. Parameters may be split into groups with their own settings, PyTorch style:
``Adam([{"params": body, "lr": 1e-4}, {"params": head}], lr=1e-3)``. ``optimizer.lr`` reads the
first group's rate; setting it rescales every group by the same factor, so their ratios stay.

With ``accumulate_steps=k`` the optimizer sums the gradients of k calls of ``step()`` and
updates on the k-th (by their mean when ``average``); ``step()`` returns whether it updated.

Mixed precision: with ``master_weights=True`` the update of an f16 (or bf16) parameter is applied
to an f32 copy (its optimizer state is f32 too) and the parameter becomes that copy rounded to
f16 (bf16). bf16 has f32's exponent range and needs no loss scale. A captured step
(``rc.capture_step``) with master weights updates the masters and rounds them into the parameters
on the device.
``loss_scale`` multiplies the loss before backward (``optimizer.scale_loss(loss)``) so small
f16 gradients do not flush to zero; ``step`` divides the gradients by it again. With
``loss_scale="dynamic"`` the scale starts at 2**15 (the largest power of two f16 holds: the
gradient entering an f16 graph is the scale itself), a step whose gradients hold an Inf or a NaN
is skipped and halves it, and every ``growth_interval`` clean steps double it (PyTorch's
GradScaler rule). A captured step scales the loss itself (its ``loss_fn`` returns the unscaled
loss), by the scale of each replay, and skips and halves in the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from rlkit import _native
from rlkit.core import runtime, ops
from rlkit.core.autograd import Gradients
from rlkit.core.tensor import NUMPY_DTYPES, Tensor

update_hyper_size = 8  # the coefficients an update op reads (native/optim.hpp kHyperSize)


def _param_list(params, where: str) -> list[Tensor]:
    if isinstance(params, Mapping):
        params = params.values()
    if isinstance(params, Tensor):
        raise TypeError(f"{where}: pass a list (or dict) of parameters, not a single tensor")
    params = list(params)
    for p in params:
        if not isinstance(p, Tensor) or not p.requires_grad or not p.is_leaf:
            raise TypeError(f"{where}: expected parameters made by rc.param, got {p!r}")
    return params


def _non_negative(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or math.isinf(value):
        raise ValueError(f"optimizer: {what} must be a finite number >= 0, got {value!r}")
    return float(value)


def _is_finite(value: np.ndarray) -> bool:
    """Whether a downloaded scalar is finite."""
    return math.isfinite(float(np.asarray(value).reshape(-1)[0]))


def _zeros_like(p: Tensor) -> Tensor:
    return ops.zeros(p.shape, dtype=p.dtype, device=p.device)


class Optimizer:
    """Parameter groups, gradient lookup and accumulation, zero_grad and the state dict.

    Subclasses set ``defaults`` (hyperparameter name -> default), ``slots`` (per-parameter
    state tensors, in the order the update op takes them), ``update_op`` (the native op that
    updates a parameter set) and implement ``_coefficients(group, t)``.
    """

    defaults: dict = {}
    slots: tuple[str, ...] = ()
    update_op = ""

    def __init__(self, params, accumulate_steps: int = 1, average: bool = True, master_weights: bool = False,
                 loss_scale: float | str | None = None, growth_interval: int = 2000, **hyper):
        if isinstance(accumulate_steps, bool) or not isinstance(accumulate_steps, int) or accumulate_steps < 1:
            raise ValueError(f"optimizer: accumulate_steps must be a positive int, got {accumulate_steps!r}")
        self._scaling = _LossScale(loss_scale, growth_interval)
        self.accumulate_steps = accumulate_steps
        self.average = bool(average)
        settings = {name: self._check(name, hyper[name]) for name in self.defaults}
        self.param_groups: list[dict] = []
        entries = list(params.values()) if isinstance(params, Mapping) else params
        if isinstance(entries, Tensor):
            raise TypeError("optimizer: pass a list (or dict) of parameters, not a single tensor")
        entries = list(entries)
        groups = entries if entries and all(isinstance(e, dict) for e in entries) else [{"params": entries}]
        seen: set[int] = set()
        for group in groups:
            unknown = set(group) - {"params"} - set(self.defaults)
            if unknown:
                raise ValueError(f"optimizer: unknown settings {sorted(unknown)} in a parameter group")
            members = []
            for p in _param_list(group["params"], "optimizer"):
                if id(p) not in seen:  # a parameter listed twice is updated once
                    seen.add(id(p))
                    members.append(p)
            full = {**settings, **{k: self._check(k, v) for k, v in group.items() if k != "params"}}
            self.param_groups.append({"params": members, **full})
        if not seen:
            raise ValueError("optimizer: got an empty parameter list")
        self._base_lrs = [g["lr"] for g in self.param_groups]
        self.master: dict[int, Tensor] = {}  # f32 copies of f16 / bf16 parameters, by the parameter's id
        if master_weights:
            self.master = {id(p): ops.cast(p, "f32") for p in self.params if p.dtype in runtime.HALF_DTYPES}
        self.state: dict[int, dict] = {}
        for p in self.params:
            target = self.master.get(id(p), p)
            self.state[id(p)] = {"step": 0, **{slot: _zeros_like(target) for slot in self.slots}}
            self.state[id(target)] = self.state[id(p)]  # the update rules look the state up by what they update
        self._pending = 0  # calls of step() accumulated so far
        self._running: dict[int, int] = {}  # captured updates launched and not finished, by the parameter's id
        self._sums: dict[int, Tensor] = {}

    def _check(self, name: str, value) -> float:
        if name == "betas":
            if not (isinstance(value, (tuple, list)) and len(value) == 2 and all(0 <= b < 1 for b in value)):
                raise ValueError(f"optimizer: betas must be two numbers in [0, 1), got {value!r}")
            return (float(value[0]), float(value[1]))
        return _non_negative(value, name)

    @property
    def params(self) -> list[Tensor]:
        """Every parameter, in group order."""
        return [p for g in self.param_groups for p in g["params"]]

    @property
    def lr(self) -> float:
        """The first group's learning rate."""
        return self.param_groups[0]["lr"]

    @lr.setter
    def lr(self, value: float) -> None:
        value = _non_negative(value, "lr")
        base = self._base_lrs[0]
        for group, group_base in zip(self.param_groups, self._base_lrs):
            group["lr"] = value if base == 0 else value * group_base / base

    def _current_gradients(self, grads: Gradients | None) -> dict[int, Tensor]:
        if grads is not None and not isinstance(grads, Gradients):
            raise TypeError(f"step: expected the gradients backward() returned (or None), got {type(grads).__name__}")
        found = {}
        for p in self.params:
            g = p._grad if grads is None else (grads.tensor(p) if p in grads else None)
            if g is not None:
                found[id(p)] = g
        return found

    @property
    def loss_scale(self) -> float:
        """The factor ``scale_loss`` multiplies the loss by (1.0 without loss scaling)."""
        return self._scaling.scale

    def scale_loss(self, loss: Tensor) -> Tensor:
        """The loss times the loss scale: call backward on this (``step`` undoes the factor).
        For eager steps: a captured step scales the loss itself."""
        if runtime.active_capture() is not None and self._scaling.mode is not None:
            raise runtime.CaptureError("capture: return the unscaled loss; a captured step (rc.capture_step, "
                                         "rc.update_step) scales it by the loss scale of each replay")
        return loss if self._scaling.scale == 1.0 else ops.scale(loss, self._scaling.scale)

    def _captured_loss_scale(self, capture) -> tuple[Tensor, Tensor] | None:
        """Inside a capture: the loss scale and its inverse, [1, 1] inputs filled before every
        replay with the scale of that moment; None without loss scaling."""
        if self._scaling.mode is None:
            return None
        scale = capture.host_input((1, 1), lambda: np.full((1, 1), self._scaling.scale, np.float32))
        inverse = capture.host_input((1, 1), lambda: np.full((1, 1), 1.0 / self._scaling.scale, np.float32))
        return scale, inverse

    def _in_update_dtype(self, current: dict[int, Tensor]) -> dict[int, Tensor]:
        """The gradients, those of parameters with an f32 master in f32 (the update's dtype)."""
        return {key: ops.cast(g, "f32") if key in self.master and g.dtype in runtime.HALF_DTYPES else g
                for key, g in current.items()}

    def _unscaled(self, current: dict[int, Tensor]) -> dict[int, Tensor] | None:
        """The gradients in f32 where the update is applied to an f32 master, divided by the loss
        scale; None when dynamic scaling finds an Inf or NaN among them (the step is skipped)."""
        if self._scaling.mode is None and not self.master:
            return current
        factor = 1.0 / self._scaling.scale
        out = {}
        for key, g in self._in_update_dtype(current).items():
            out[key] = g if factor == 1.0 else ops.scale(g, factor)
        if self._scaling.mode == "dynamic":
            total = ops.sum_squares(list(out.values())).item()
            if not self._scaling.update(math.isfinite(total)):
                return None
        return out

    def step(self, grads: Gradients | None = None) -> bool:
        """Updates the parameters from ``grads`` (or their accumulated ``.grad``); with
        accumulation, only every ``accumulate_steps``-th call updates. Returns whether it did.
        Inside a capture, records the update into the captured program instead."""
        capture = runtime.active_capture()
        if capture is not None:
            return self._record_step(capture, grads)
        current = self._unscaled(self._current_gradients(grads))
        if current is None:
            return False
        if self.accumulate_steps > 1:
            for key, g in current.items():
                self._sums[key] = g if key not in self._sums else ops.add(self._sums[key], g)
            self._pending += 1
            if self._pending < self.accumulate_steps:
                return False
            scale = 1.0 / self._pending if self.average else 1.0
            current = {k: ops.scale(g, scale) for k, g in self._sums.items()}
            self._pending, self._sums = 0, {}
        for group in self.param_groups:
            members = [p for p in group["params"] if id(p) in current]
            if members:
                for p in members:
                    self.state[id(p)]["step"] += 1
                self._check_dtypes(members)
                self._update(group, [self.master.get(id(p), p) for p in members], [current[id(p)] for p in members])
                for p in members:
                    if id(p) in self.master:  # the parameter: its f32 master rounded to f16 / bf16
                        p._impl = ops.cast(self.master[id(p)], p.dtype)._impl
        if any(p.device == "gpu" for p in self.params):
            _native.submit("gpu")  # a step ends: the GPU starts on it while the host goes on
        return True

    def _check_dtypes(self, params: list[Tensor]) -> None:
        for p in params:
            if p.dtype in runtime.HALF_DTYPES and id(p) not in self.master:
                raise TypeError(f"optimizer: the {p.dtype} parameter {p.name or tuple(p.shape)} needs master_weights=True "
                                "(f32 copies the update is applied to)")

    def _update(self, group: dict, params: list[Tensor], grads: list[Tensor]) -> None:
        """An eager update of a group's parameters (their steps counted already): parameters
        whose coefficients are equal (Adam's: those at the same step) share one op. The
        coefficients go to the device with the op's work, not as a transfer; f64 on the CPU,
        so that f64 parameters keep their precision."""
        device = params[0].device
        by_coefficients: dict[tuple[float, ...], list[int]] = {}
        for k, p in enumerate(params):
            by_coefficients.setdefault(tuple(self._coefficients(group, self.state[id(p)]["step"])), []).append(k)
        scale = ops.full((1, 1), 1.0, dtype="f32", device=device)
        dtype = "f64" if device == "cpu" else "f32"
        for coefficients, members in by_coefficients.items():
            hyper = np.asfortranarray(np.array(coefficients, NUMPY_DTYPES[dtype])[:, None])
            self._apply_update([params[k] for k in members], [grads[k] for k in members],
                               Tensor(_native.inline_constant(hyper, dtype, device)), scale)

    def _apply_update(self, params: list[Tensor], grads: list[Tensor], hyper: Tensor, scale: Tensor,
                      clip: float | None = None) -> None:
        """The update op over ``params``: runs it, or records it inside a capture. ``scale``
        multiplies the gradients; where ``clip`` is a number, it is their sum of squares instead,
        and the op multiplies them by the factor that clips their norm to ``clip`` (0: none)."""
        tensors = [t for p, g in zip(params, grads) for t in (p, g, *(self.state[id(p)][s] for s in self.slots))]
        attrs = ((1,), (clip,)) if clip is not None else ((), ())
        ops.apply(self.update_op, (hyper, scale, *tensors), *attrs)

    # ---- inside a capture --------------------------------------------------------------------

    def _record_step(self, capture, grads: Gradients | None) -> bool:
        """Records one in-place update op per parameter group (one dispatch on the GPU), reading
        coefficients the capture computes on the host before every replay; steps are counted
        after replays whose gradient scale was finite. With master weights the update applies to
        the f32 masters, and one more op rounds them into their f16 / bf16 parameters."""
        if self.accumulate_steps > 1:
            raise runtime.CaptureError("capture: an optimizer with accumulate_steps > 1 cannot be captured")
        if self._scaling.mode is not None and capture.grad_scale is None:
            raise runtime.CaptureError("capture: an optimizer with loss scaling steps inside rc.capture_step or "
                                         "rc.update_step, which scale the loss")
        current = self._in_update_dtype(self._current_gradients(grads))
        earlier = capture.updates_recorded.get(id(self), 0)  # a capture may hold several steps of one optimizer
        capture.updates_recorded[id(self)] = earlier + 1
        scale, clip = capture.grad_scale, capture.grad_clip  # clip: scale is the sum of squares
        if scale is None:
            scale = ops.full((1, 1), 1.0, dtype="f32", device=runtime.device())
        updated = []
        for group in self.param_groups:
            members = [p for p in group["params"] if id(p) in current]
            if not members:
                continue
            if len({self.state[id(p)]["step"] for p in members}) > 1:
                raise runtime.CaptureError("capture: the parameters of a group must share their step count")
            hyper = capture.host_input((update_hyper_size, 1), lambda group=group, first=members[0], earlier=earlier:
                                     np.array(self._coefficients(group, self._step_to_take(first) + earlier),
                                              np.float32))  # at the step the replay takes
            self._check_dtypes(members)
            self._apply_update([self.master.get(id(p), p) for p in members], [current[id(p)] for p in members],
                               hyper, scale, clip)
            updated += members
        rounded = [t for p in updated if id(p) in self.master for t in (p, self.master[id(p)])]
        if rounded:  # after the updates: the parameters are their masters rounded to f16 / bf16
            ops.apply("cast_into", tuple(rounded))

        def count_steps(value, updated=updated):
            finite = _is_finite(value)
            if finite:
                for p in updated:
                    self.state[id(p)]["step"] += 1
            if self._scaling.mode == "dynamic":  # halve after a skipped step, grow after clean ones
                self._scaling.update(finite)

        def begin(updated=updated):
            for p in updated:
                self._running[id(p)] = self._running.get(id(p), 0) + 1

        def end(updated=updated):
            for p in updated:
                self._running[id(p)] -= 1

        capture.count_running(begin, end)
        capture.extra_output(scale, count_steps)  # the factor, or the sum of squares: finite alike
        return True

    def _step_to_take(self, p: Tensor) -> int:
        """The step (1-based) that the next replay updating ``p`` takes: after its counted steps
        and those of replays still running (launched, not finished). Where one of those is
        skipped (a non-finite gradient), the replay launched after it has taken the
        coefficients of one step further (bias correction, for Adam), as a device that counts
        steps only once they finish cannot know sooner."""
        return self.state[id(p)]["step"] + self._running.get(id(p), 0) + 1

    def _coefficients(self, group: dict, t: int) -> list[float]:
        """The update op's update_hyper_size coefficients for ``group``'s parameters taking their
        t-th step (1-based)."""
        raise NotImplementedError

    def zero_grad(self) -> None:
        """Forgets the accumulated ``.grad`` of every parameter."""
        for p in self.params:
            p._grad = None

    # ---- state dict ------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Hyperparameters of each group, and per parameter (by position) its step count and
        state tensors as numpy arrays."""
        index = {id(p): i for i, p in enumerate(self.params)}
        groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [index[id(p)] for p in g["params"]]}
                  for g in self.param_groups]
        state = {str(i): {"step": self.state[id(p)]["step"], **{s: self.state[id(p)][s].numpy() for s in self.slots},
                          **({"master": self.master[id(p)].numpy()} if id(p) in self.master else {})}
                 for i, p in enumerate(self.params)}
        return {"type": type(self).__name__, "param_groups": groups, "state": state,
                "accumulate_steps": self.accumulate_steps, "loss_scale": self._scaling.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restores what state_dict returned (hyperparameters included), after checking that it
        belongs to an optimizer of this type over parameters of the same shapes."""
        if state.get("type") != type(self).__name__:
            raise ValueError(f"load_state_dict: a {state.get('type')} state cannot load into {type(self).__name__}")
        params = self.params
        groups = state["param_groups"]
        if [len(g["params"]) for g in groups] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError("load_state_dict: the parameter groups differ in number or size from this optimizer's")
        per_param = state["state"]
        for i, p in enumerate(params):
            entry = per_param.get(str(i))
            if entry is None:
                raise KeyError(f"load_state_dict: no state for parameter {i}")
            for slot in self.slots:
                if tuple(entry[slot].shape) != p.shape:
                    raise ValueError(f"load_state_dict: {slot} of parameter {i} has shape {entry[slot].shape}, "
                                     f"the parameter is {p.shape}")
        for group, saved in zip(self.param_groups, groups):
            group.update({k: self._check(k, v) for k, v in saved.items() if k != "params"})
        for i, p in enumerate(params):
            entry = per_param[str(i)]
            self.state[id(p)]["step"] = int(entry["step"])
            for slot in self.slots:
                slot_tensor = self.state[id(p)][slot]
                slot_tensor._impl.write(entry[slot].astype(NUMPY_DTYPES[slot_tensor.dtype], order="F"))
            if id(p) in self.master and "master" in entry:
                self.master[id(p)]._impl.write(np.asfortranarray(entry["master"], dtype=np.float32))
        if "loss_scale" in state:
            self._scaling.load_state_dict(state["loss_scale"])
        self._pending, self._sums = 0, {}


class _LossScale:
    """The loss scale of an optimizer: none (1.0), a fixed factor, or "dynamic"."""

    def __init__(self, loss_scale, growth_interval: int):
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, int) or growth_interval < 1:
            raise ValueError(f"optimizer: growth_interval must be a positive int, got {growth_interval!r}")
        self.growth_interval, self.clean_steps = growth_interval, 0
        if loss_scale is None:
            self.mode, self.scale = None, 1.0
        elif loss_scale == "dynamic":
            self.mode, self.scale = "dynamic", 2.0**15  # the largest power of two f16 holds
        elif isinstance(loss_scale, (int, float)) and not isinstance(loss_scale, bool) and 0 < loss_scale < math.inf:
            self.mode, self.scale = "static", float(loss_scale)
        else:
            raise ValueError(f"optimizer: loss_scale must be None, a positive number or 'dynamic', got {loss_scale!r}")

    def update(self, finite: bool) -> bool:
        """After a step's gradients were checked: halves the scale on Inf/NaN (returns False:
        skip the step), doubles it after growth_interval clean steps."""
        if not finite:
            self.scale, self.clean_steps = self.scale * 0.5, 0
            return False
        self.clean_steps += 1
        if self.clean_steps % self.growth_interval == 0:
            self.scale *= 2.0
        return True

    def state_dict(self) -> dict:
        return {"mode": self.mode, "scale": self.scale, "clean_steps": self.clean_steps}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self.clean_steps = float(state["scale"]), int(state["clean_steps"])


class SGD(Optimizer):
    """Stochastic gradient descent: v = momentum v + (g + weight_decay w); w -= lr v
    (with momentum 0, w -= lr (g + weight_decay w))."""

    defaults = {"lr": 0.01, "momentum": 0.0, "weight_decay": 0.0}
    slots = ("velocity",)
    update_op = "sgd_step"

    def __init__(self, params, lr: float = 0.01, momentum: float = 0.0, weight_decay: float = 0.0,
                 accumulate_steps: int = 1, average: bool = True, master_weights: bool = False,
                 loss_scale: float | str | None = None, growth_interval: int = 2000):
        super().__init__(params, accumulate_steps, average, master_weights, loss_scale, growth_interval,
                         lr=lr, momentum=momentum, weight_decay=weight_decay)

    @property
    def momentum(self) -> float:
        """The first group's momentum (OneCycleLR cycles it)."""
        return self.param_groups[0]["momentum"]

    @momentum.setter
    def momentum(self, value: float) -> None:
        for group in self.param_groups:
            group["momentum"] = _non_negative(value, "momentum")

    def _coefficients(self, group, t):
        return [group["momentum"], group["weight_decay"], group["lr"], 0.0, 0.0, 0.0, 0.0, 0.0]


class Adam(Optimizer):
    """Adam (Kingma and Ba, 2015) with bias correction counted per parameter (as PyTorch);
    weight_decay adds wd * w to the gradient."""

    defaults = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
    slots = ("m", "v")
    update_op = "adam_step"
    decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, accumulate_steps: int = 1, average: bool = True,
                 master_weights: bool = False, loss_scale: float | str | None = None, growth_interval: int = 2000):
        super().__init__(params, accumulate_steps, average, master_weights, loss_scale, growth_interval,
                         lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)

    @property
    def betas(self) -> tuple[float, float]:
        """The first group's (beta1, beta2) (OneCycleLR cycles beta1)."""
        return self.param_groups[0]["betas"]

    @betas.setter
    def betas(self, value: tuple[float, float]) -> None:
        for group in self.param_groups:
            group["betas"] = self._check("betas", value)

    def _coefficients(self, group, t):
        """beta1, beta2, eps, the gradient's weight decay (Adam's), the weights' decay factor
        (AdamW's), the step lr / (1 - beta1^t) and 1 / (1 - beta2^t) (bias correction)."""
        beta1, beta2 = group["betas"]
        coupled = 0.0 if self.decoupled else group["weight_decay"]
        decay = 1.0 - group["lr"] * group["weight_decay"] if self.decoupled else 1.0
        return [beta1, beta2, group["eps"], coupled, decay, group["lr"] / (1.0 - beta1**t), 1.0 / (1.0 - beta2**t), 0.0]


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov and Hutter, 2019): w *= 1 - lr * wd."""

    defaults = {**Adam.defaults, "weight_decay": 0.01}
    decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, accumulate_steps: int = 1, average: bool = True,
                 master_weights: bool = False, loss_scale: float | str | None = None, growth_interval: int = 2000):
        super().__init__(params, lr, betas, eps, weight_decay, accumulate_steps, average, master_weights, loss_scale,
                         growth_interval)
