"""The supervised Trainer: learning, TensorBoard scalars read back, callbacks, exact resume."""

import importlib.util
import os

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import rlkit.core as rc
from rlkit.core import nn, optim, sched
from rlkit.train import Callback, EarlyStopping, ModelCheckpoint, Trainer


def _blobs(n=240, seed=0):
    """Three Gaussian blobs in 2-D: x [2, n], labels [n]."""
    rng = np.random.default_rng(seed)
    centers = np.array([[0.0, 3.0, -3.0], [3.0, -2.0, -2.0]])
    labels = rng.integers(0, 3, n)
    x = centers[:, labels] + rng.standard_normal((2, n))
    return np.asfortranarray(x.astype(np.float32)), labels


def _make(seed=0, lr=0.05):
    rc.manual_seed(seed)
    model = nn.Sequential(nn.Linear(2, 16, activation="relu"), nn.Dropout(0.1), nn.Linear(16, 3))
    opt = optim.Adam(model.parameters(), lr=lr)
    return model, opt


def _loss(pred, y):
    return rc.softmax_cross_entropy_loss(pred, y)


def test_fit_learns_and_logs_to_tensorboard(tmp_path):
    x, y = _blobs()
    xv, yv = _blobs(90, seed=1)
    model, opt = _make()
    scheduler = sched.StepLR(opt, step_size=2, gamma=0.5)
    trainer = Trainer(model, _loss, opt, scheduler=scheduler, metrics=["accuracy"], logdir=str(tmp_path),
                      hparams={"hidden": 16})
    history = trainer.fit((x, y), val=(xv, yv), epochs=5, batch_size=32, seed=0)
    assert set(history) == {"train/loss", "val/loss", "val/accuracy", "lr"}
    assert history["train/loss"][-1] < history["train/loss"][0]
    assert history["val/accuracy"][-1] >= 0.9
    assert history["lr"] == pytest.approx([0.05, 0.05, 0.025, 0.025, 0.0125])
    trainer.writer.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    for tag in ("train/loss", "val/loss", "val/accuracy", "lr"):
        events = acc.Scalars(tag)
        assert [e.step for e in events] == [0, 1, 2, 3, 4]
        assert [e.value for e in events] == pytest.approx(history[tag], rel=1e-6)
    assert "_hparams_/session_start_info" in acc.PluginTagToContent("hparams")


def test_evaluate_and_predict_match_a_manual_computation():
    x, y = _blobs(50)
    model, opt = _make()
    trainer = Trainer(model, _loss, opt, metrics=["accuracy"])
    pred = trainer.predict(x, batch_size=16)
    assert pred.shape == (3, 50)
    model.eval()
    expected = model(rc.tensor(x)).numpy()
    np.testing.assert_allclose(pred, expected, rtol=1e-6)
    result = trainer.evaluate((x, y))
    assert result["accuracy"] == pytest.approx((expected.argmax(0) == y).mean())
    logsumexp = np.log(np.exp(expected - expected.max(0)).sum(0)) + expected.max(0)
    assert result["loss"] == pytest.approx(np.mean(logsumexp - expected[y, np.arange(50)]), rel=1e-5)


class _Explode(Callback):
    """Makes the learning rate absurd after the second epoch, so validation loss gets worse."""

    def on_epoch_end(self, trainer, epoch, logs):
        if epoch == 1:
            trainer.optimizer.lr = 50.0


def test_early_stopping_restores_the_best_weights():
    x, y = _blobs()
    xv, yv = _blobs(90, seed=1)
    model, opt = _make()
    stop = EarlyStopping(monitor="val/loss", patience=1)
    trainer = Trainer(model, _loss, opt, callbacks=[_Explode(), stop])
    history = trainer.fit((x, y), val=(xv, yv), epochs=20, seed=0)
    assert len(history["val/loss"]) < 20  # stopped early
    assert stop.best == min(history["val/loss"])
    assert trainer.evaluate((xv, yv))["loss"] == pytest.approx(stop.best, rel=1e-5)


def test_model_checkpoint_and_exact_resume(tmp_path):
    x, y = _blobs()
    path = str(tmp_path / "epoch{epoch}.safetensors")

    model_a, opt_a = _make(seed=3)
    trainer_a = Trainer(model_a, _loss, opt_a, scheduler=sched.StepLR(opt_a, 2), callbacks=[ModelCheckpoint(path, every=2)])
    history_a = trainer_a.fit((x, y), epochs=6, seed=7)
    assert sorted(os.listdir(tmp_path)) == ["epoch2.safetensors", "epoch4.safetensors", "epoch6.safetensors"]

    model_b, opt_b = _make(seed=99)  # different initial weights and generator: all overwritten
    trainer_b = Trainer(model_b, _loss, opt_b, scheduler=sched.StepLR(opt_b, 2))
    trainer_b.load_checkpoint(str(tmp_path / "epoch4.safetensors"))
    assert trainer_b.epoch == 4
    history_b = trainer_b.fit((x, y), epochs=6, seed=7)
    for name, value in model_a.state_dict().items():
        np.testing.assert_array_equal(model_b.state_dict()[name], value, err_msg=name)
    assert history_b == history_a


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda m, o: Trainer(m, "mse", o), TypeError, "loss_fn"),
        (lambda m, o: Trainer(m, _loss, o, metrics=["f1"]), ValueError, "unknown metric"),
        (lambda m, o: Trainer(m, _loss, o, callbacks=[print]), TypeError, "Callback"),
        (lambda m, o: Trainer(m, _loss, o).fit(_blobs(), epochs=0), ValueError, "epochs"),
        (lambda m, o: Trainer(m, _loss, o).fit([1, 2]), TypeError, "DataLoader"),
        (lambda m, o: Trainer(m, _loss, o).predict(np.zeros(3)), ValueError, "2-D"),
        (lambda m, o: EarlyStopping(mode="up"), ValueError, "mode"),
        (lambda m, o: ModelCheckpoint("x", every=0), ValueError, "every"),
    ],
)
def test_bad_input(make, error, message):
    model, opt = _make()
    with pytest.raises(error, match=message):
        make(model, opt)


def test_early_stopping_needs_a_logged_figure():
    model, opt = _make()
    trainer = Trainer(model, _loss, opt, callbacks=[EarlyStopping(monitor="val/loss")])
    with pytest.raises(KeyError, match="val/loss"):
        trainer.fit(_blobs(), epochs=2)


def test_iris_demo_reaches_ninety_percent():
    path = os.path.join(os.path.dirname(__file__), "..", "scripts", "iris_demo.py")
    spec = importlib.util.spec_from_file_location("iris_demo", path)
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    accuracies = demo.main()
    assert set(accuracies) == {"sequential", "layer_norm", "after_dataloader", "raw_params"}
    assert min(accuracies.values()) >= 0.9, accuracies


def test_progress_bar_runs(capsys):
    model, opt = _make()
    Trainer(model, _loss, opt, progress_bar=True).fit(_blobs(64), epochs=2)
    assert "epochs" in capsys.readouterr().err
