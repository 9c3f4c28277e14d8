"""The supervised Trainer: fit / evaluate / predict over column-major data.

One epoch of ``fit`` is: for each batch, a taped forward, the loss, backward, optional
gradient clipping, the optimizer step; then validation, the epoch's scalars to TensorBoard
(train/loss, val/loss, val/<metric>, lr), the scheduler step and the callbacks. A run
resumed from a checkpoint continues exactly as the uninterrupted run would on the CPU: the
checkpoint holds the model, optimizer, scheduler, epoch and every random generator.

``Trainer(distributed=True)`` trains data-parallel over MPI (rlkit.core.parallel; launch the
script with ``rlkit launch -n N``): every rank starts from rank 0's weights and optimizer
state, trains on its own shard of the training data (columns rank, rank + N, ...), averages its
gradients with the others' every step, and logs, reduces and reports the same figures (losses
and metrics over all ranks' examples); only rank 0 writes TensorBoard logs and checkpoints.
With its shards' batches of B, N ranks train as one rank would on batches of N * B.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

import rlkit.core as rc
from rlkit.core import parallel
from rlkit.checkpoint import load_checkpoint, save_checkpoint
from rlkit.logger import SummaryWriter


def accuracy(pred: np.ndarray, target: np.ndarray) -> float:
    """Fraction of columns whose argmax matches the target: class indices [1, n] or
    one-hot / probabilities [classes, n]."""
    predicted = pred.argmax(axis=0)
    truth = target.reshape(-1) if target.shape[0] == 1 and pred.shape[0] > 1 else target.argmax(axis=0)
    return float((predicted == truth.astype(np.int64)).mean())


METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {"accuracy": accuracy}


class Callback:
    """Hooks into fit; every method is optional. Set ``trainer.stop_training`` to stop."""

    def on_fit_begin(self, trainer: "Trainer") -> None:
        """Before the first epoch."""

    def on_epoch_end(self, trainer: "Trainer", epoch: int, logs: dict) -> None:
        """After an epoch's validation and logging; ``logs`` holds its figures."""

    def on_fit_end(self, trainer: "Trainer") -> None:
        """After the last epoch (also after an early stop)."""


class EarlyStopping(Callback):
    """Stops when ``monitor`` has not improved by ``min_delta`` for ``patience`` epochs and,
    with ``restore_best``, puts back the weights of the best epoch."""

    def __init__(self, monitor: str = "val/loss", patience: int = 5, mode: str = "min", min_delta: float = 0.0,
                 restore_best: bool = True):
        if mode not in ("min", "max"):
            raise ValueError(f"EarlyStopping: mode must be 'min' or 'max', got {mode!r}")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 0:
            raise ValueError(f"EarlyStopping: patience must be an int >= 0, got {patience!r}")
        self.monitor, self.patience, self.mode = monitor, patience, mode
        self.min_delta, self.restore_best = float(min_delta), restore_best
        self.best: float | None = None
        self.best_epoch = -1
        self._best_state: dict | None = None
        self._waited = 0

    def _improved(self, value: float) -> bool:
        if self.best is None:
            return True
        return value < self.best - self.min_delta if self.mode == "min" else value > self.best + self.min_delta

    def on_epoch_end(self, trainer, epoch, logs):
        if self.monitor not in logs:
            raise KeyError(f"EarlyStopping: {self.monitor!r} is not logged; logged: {sorted(logs)}")
        value = logs[self.monitor]
        if self._improved(value):
            self.best, self.best_epoch, self._waited = value, epoch, 0
            if self.restore_best:
                self._best_state = trainer.model.state_dict()
            return
        self._waited += 1
        if self._waited > self.patience:
            trainer.stop_training = True

    def on_fit_end(self, trainer):
        if self.restore_best and self._best_state is not None:
            trainer.model.load_state_dict(self._best_state)


class ModelCheckpoint(Callback):
    """Saves a checkpoint (model, optimizer, scheduler, epoch, RNG states) every ``every``
    epochs to ``path`` (may contain ``{epoch}``)."""

    def __init__(self, path: str, every: int = 1):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"ModelCheckpoint: every must be a positive int, got {every!r}")
        self.path, self.every = path, every

    def on_epoch_end(self, trainer, epoch, logs):
        if (epoch + 1) % self.every == 0:
            trainer.save_checkpoint(self.path.format(epoch=epoch + 1))


class SchedulerStep(Callback):
    """Steps a scheduler after every epoch (the Trainer's own ``scheduler`` does this too)."""

    def __init__(self, scheduler):
        self.scheduler = scheduler

    def on_epoch_end(self, trainer, epoch, logs):
        self.scheduler.step()


class _RunState:
    """What a checkpoint saves besides the model, optimizer and scheduler."""

    def __init__(self, trainer: "Trainer"):
        self.trainer = trainer

    def state_dict(self) -> dict:
        t = self.trainer
        loader_rng = t._train_loader.rng.bit_generator.state if t._train_loader is not None else None
        return {"epoch": t.epoch, "rng": rc.get_rng_state(), "loader_rng": loader_rng,
                "history": {k: list(v) for k, v in t.history.items()}}

    def load_state_dict(self, state: dict) -> None:
        t = self.trainer
        t.epoch = int(state["epoch"])
        rc.set_rng_state(state["rng"])
        t._pending_loader_rng = state["loader_rng"]
        t.history = {k: [float(x) for x in v] for k, v in state["history"].items()}


def _loader(data, batch_size: int, shuffle: bool, drop_last: bool, seed, comm=None) -> rc.DataLoader:
    """A DataLoader over ``data``; with a communicator of several ranks, over this rank's shard:
    columns rank, rank + N, ... of the first N * (n // N) (every rank gets as many)."""
    if isinstance(data, rc.DataLoader):
        if comm is not None and comm.size > 1:
            raise TypeError("Trainer(distributed=True) shards the data itself: pass an (x, y) tuple, not a DataLoader")
        return data
    if isinstance(data, tuple) and len(data) == 2:
        x, y = data
        if comm is not None and comm.size > 1:
            x, y = (_shard(a, comm) for a in (x, y))
            seed = None if seed is None else seed + comm.rank
        return rc.DataLoader(x, y, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed)
    raise TypeError(f"expected a DataLoader or an (x, y) tuple of column-major arrays, got {type(data).__name__}")


def _shard(a, comm):
    a = a.numpy() if isinstance(a, rc.Tensor) else np.asarray(a)
    if a.ndim == 1:
        a = a.reshape(1, -1)
    n = a.shape[1] - a.shape[1] % comm.size
    return np.asfortranarray(a[:, comm.rank:n:comm.size])


class Trainer:
    """Trains ``model`` (a Module or any callable with ``parameters()``) on ``loss_fn(pred, y)``.

    ``metrics`` are names ("accuracy") or functions (pred, target) -> float of numpy arrays;
    ``logdir`` turns on TensorBoard logging; ``max_grad_norm`` clips by global norm.
    """

    def __init__(self, model, loss_fn: Callable, optimizer, scheduler=None, metrics: Sequence = (),
                 callbacks: Sequence[Callback] = (), logdir: str | None = None, max_grad_norm: float | None = None,
                 progress_bar: bool = False, hparams: dict | None = None, distributed: bool = False):
        if not callable(loss_fn):
            raise TypeError(f"Trainer: loss_fn must be callable, got {type(loss_fn).__name__}")
        self.model, self.loss_fn, self.optimizer, self.scheduler = model, loss_fn, optimizer, scheduler
        self.metrics = {}
        for m in metrics:
            if isinstance(m, str):
                if m not in METRICS:
                    raise ValueError(f"Trainer: unknown metric {m!r}; expected one of {sorted(METRICS)} or a function")
                self.metrics[m] = METRICS[m]
            elif callable(m):
                self.metrics[getattr(m, "__name__", "metric")] = m
            else:
                raise TypeError(f"Trainer: a metric is a name or a function, got {type(m).__name__}")
        for cb in callbacks:
            if not isinstance(cb, Callback):
                raise TypeError(f"Trainer: callbacks must be Callback instances, got {type(cb).__name__}")
        self.callbacks = list(callbacks)
        self.max_grad_norm = max_grad_norm
        self.comm = parallel.world() if distributed else None
        if self.comm is not None:
            parallel.broadcast_parameters(model, self.comm)  # every rank starts from rank 0's state
            parallel.broadcast_optimizer_state(optimizer, self.comm)
        self.is_root = self.comm is None or self.comm.is_root
        self.progress_bar = progress_bar and self.is_root
        self.writer = SummaryWriter(logdir) if logdir and self.is_root else None
        self.hparams = dict(hparams or {})
        self.epoch = 0
        self.history: dict[str, list[float]] = {}
        self.stop_training = False
        self._train_loader: rc.DataLoader | None = None
        self._pending_loader_rng = None

    # ---- training --------------------------------------------------------------------------

    def fit(self, train, val=None, epochs: int = 1, batch_size: int = 32, shuffle: bool = True,
            seed: int | None = None) -> dict[str, list[float]]:
        """Trains until ``epochs`` epochs in all have run (a resumed run counts the epochs it
        already has); returns the history of every logged figure per epoch."""
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ValueError(f"fit: epochs must be a positive int, got {epochs!r}")
        self._train_loader = _loader(train, batch_size, shuffle, True, seed, self.comm)
        if self._pending_loader_rng is not None:
            self._train_loader.rng.bit_generator.state = self._pending_loader_rng
            self._pending_loader_rng = None
        val_loader = None if val is None else _loader(val, batch_size, False, False, None, self.comm)
        self.stop_training = False
        if self.writer is not None and self.epoch == 0:
            self.writer.add_hparams({**self._default_hparams(epochs), **self.hparams})
        for cb in self.callbacks:
            cb.on_fit_begin(self)
        epochs_bar = self._bar(range(self.epoch, epochs), "epochs")
        for _ in epochs_bar:
            logs = {"train/loss": self._train_epoch(self._train_loader)}
            if val_loader is not None:
                logs.update({f"val/{k}": v for k, v in self._evaluate(val_loader).items()})
            logs["lr"] = float(self.optimizer.lr)
            self._log(logs)
            if self.scheduler is not None:
                self.scheduler.step()
            epoch = self.epoch
            self.epoch += 1
            for cb in self.callbacks:
                cb.on_epoch_end(self, epoch, logs)
            if hasattr(epochs_bar, "set_postfix"):
                epochs_bar.set_postfix({k: f"{v:.4g}" for k, v in logs.items()})
            if self.stop_training:
                break
        for cb in self.callbacks:
            cb.on_fit_end(self)
        if self.writer is not None:
            self.writer.flush()
        return self.history

    def _train_epoch(self, loader: rc.DataLoader) -> float:
        self._set_mode(True)
        params = self._parameters()
        total, count = 0.0, 0
        for batch in loader.epoch():
            with rc.grad_tape():
                loss = self.loss_fn(self.model(batch.x), batch.y)
            grads = rc.backward(loss)
            if self.comm is not None:
                grads = parallel.all_reduce_gradients(grads, params, self.comm)
            if self.max_grad_norm is not None:
                rc.clip_grad_norm(params, grads, self.max_grad_norm)
            self.optimizer.step(grads)
            self.optimizer.zero_grad()
            n = batch.x.shape[1]
            total += loss.item() * n
            count += n
        total, count = self._summed(total, count)
        return total / count

    def _summed(self, *values: float) -> tuple[float, ...]:
        """The sums over the ranks (the values themselves without distributed training)."""
        if self.comm is None:
            return values
        return tuple(float(v) for v in self.comm.all_reduce(np.array(values, np.float64)))

    def _log(self, logs: dict) -> None:
        for key, value in logs.items():
            self.history.setdefault(key, []).append(value)
            if self.writer is not None:
                self.writer.add_scalar(key, value, self.epoch)

    # ---- evaluation ------------------------------------------------------------------------

    def evaluate(self, data, batch_size: int = 256) -> dict[str, float]:
        """Mean loss and the metrics over ``data`` (a DataLoader or an (x, y) tuple), in eval mode;
        distributed, each rank evaluates its shard and the figures cover every rank's."""
        return self._evaluate(_loader(data, batch_size, False, False, None, self.comm))

    def _evaluate(self, loader: rc.DataLoader) -> dict[str, float]:
        self._set_mode(False)
        total, count, preds, targets = 0.0, 0, [], []
        with rc.no_grad():
            for batch in loader.epoch():
                pred = self.model(batch.x)
                n = batch.x.shape[1]
                total += self.loss_fn(pred, batch.y).item() * n
                count += n
                if self.metrics:
                    preds.append(pred.numpy())
                    targets.append(batch.y.numpy())
        total, count = self._summed(total, count)
        results = {"loss": total / count}
        if self.metrics:
            if self.comm is not None:  # every rank's predictions, in rank order
                preds = [p for rank_preds in self.comm.all_gather(preds) for p in rank_preds]
                targets = [t for rank_targets in self.comm.all_gather(targets) for t in rank_targets]
            pred_all, target_all = np.concatenate(preds, axis=1), np.concatenate(targets, axis=1)
            results.update({name: float(fn(pred_all, target_all)) for name, fn in self.metrics.items()})
        self._set_mode(True)
        return results

    def predict(self, x, batch_size: int = 256) -> np.ndarray:
        """The model's outputs for column-major ``x`` [features, n], in eval mode, as one array."""
        x = np.asarray(x) if not isinstance(x, rc.Tensor) else x.numpy()
        if x.ndim != 2:
            raise ValueError(f"predict: x must be 2-D [features, n], got shape {x.shape}")
        self._set_mode(False)
        outputs = []
        with rc.no_grad():
            for start in range(0, x.shape[1], batch_size):
                outputs.append(self.model(rc.tensor(np.asfortranarray(x[:, start:start + batch_size]))).numpy())
        self._set_mode(True)
        return np.concatenate(outputs, axis=1)

    # ---- checkpoints -----------------------------------------------------------------------

    def _stateful(self) -> dict:
        objects = {"model": self.model, "optimizer": self.optimizer, "run": _RunState(self)}
        if self.scheduler is not None:
            objects["scheduler"] = self.scheduler
        return objects

    def save_checkpoint(self, path: str) -> None:
        """Everything needed to resume: model, optimizer, scheduler, epoch, RNG states, history
        (distributed: rank 0 writes it, the others wait until it is written)."""
        if self.is_root:
            save_checkpoint(path, self._stateful(), step=self.epoch)
        if self.comm is not None:
            self.comm.barrier()

    def load_checkpoint(self, path: str) -> None:
        """Restores what save_checkpoint wrote; the next fit continues from that epoch."""
        load_checkpoint(path, self._stateful())

    # ---- helpers ---------------------------------------------------------------------------

    def _parameters(self) -> list:
        params = self.model.parameters()
        return list(params.values()) if isinstance(params, dict) else list(params)

    def _set_mode(self, training: bool) -> None:
        if hasattr(self.model, "train"):
            self.model.train(training)

    def _default_hparams(self, epochs: int) -> dict:
        return {"optimizer": type(self.optimizer).__name__, "lr": float(self.optimizer.lr), "epochs": epochs,
                "scheduler": type(self.scheduler).__name__ if self.scheduler is not None else "none",
                "max_grad_norm": self.max_grad_norm if self.max_grad_norm is not None else "none"}

    def _bar(self, iterable, desc: str):
        if not self.progress_bar:
            return iterable
        from tqdm import tqdm

        return tqdm(iterable, desc=desc, leave=False)
