"""TensorBoard event files read back with tensorboard's own EventAccumulator."""

import math
import os

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from rlkit.logger import SummaryWriter, run_dir


def _load(logdir):
    acc = EventAccumulator(logdir, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_scalars_round_trip(tmp_path):
    with SummaryWriter(str(tmp_path)) as w:
        for step in range(5):
            w.add_scalar("train/loss", 1.0 / (step + 1), step)
        w.add_scalar("val/accuracy", 0.75, 4)
    acc = _load(str(tmp_path))
    assert set(acc.Tags()["scalars"]) >= {"train/loss", "val/accuracy"}
    events = acc.Scalars("train/loss")
    assert [e.step for e in events] == list(range(5))
    assert [e.value for e in events] == pytest.approx([1.0, 0.5, 1 / 3, 0.25, 0.2])


def test_non_finite_scalars_are_written_as_they_are(tmp_path):
    """TensorBoard shows NaN and infinities; a writer that dropped them would hide a diverged loss."""
    with SummaryWriter(str(tmp_path)) as w:
        for step, value in enumerate([1.0, float("nan"), float("inf"), float("-inf")]):
            w.add_scalar("train/loss", value, step)
    values = [e.value for e in _load(str(tmp_path)).Scalars("train/loss")]
    assert values[0] == 1.0 and math.isnan(values[1]) and values[2:] == [math.inf, -math.inf]


def test_hparams_and_text_are_written(tmp_path):
    with SummaryWriter(str(tmp_path)) as w:
        w.add_hparams({"lr": 1e-3, "batch_size": 64, "algo": "DQN", "double": True, "net": [64, 64]}, {"val/loss": 0.0})
        w.add_text("config", "lr = 0.001")
    acc = _load(str(tmp_path))
    plugin = acc.PluginTagToContent("hparams")
    session = plugin_data_pb2.HParamsPluginData.FromString(plugin["_hparams_/session_start_info"]).session_start_info
    assert session.hparams["lr"].number_value == pytest.approx(1e-3)
    assert session.hparams["batch_size"].number_value == 64
    assert session.hparams["algo"].string_value == "DQN"
    assert session.hparams["double"].bool_value is True
    assert session.hparams["net"].string_value == "[64, 64]"
    assert "config" in acc.Tags()["tensors"]


def test_run_dir_numbers_runs(tmp_path):
    first = run_dir(str(tmp_path), "DQN")
    second = run_dir(str(tmp_path), "DQN")
    other = run_dir(str(tmp_path), "SAC")
    assert [os.path.basename(p) for p in (first, second, other)] == ["DQN_1", "DQN_2", "SAC_1"]


def test_bad_arguments(tmp_path):
    w = SummaryWriter(str(tmp_path))
    with pytest.raises(ValueError, match="tag"):
        w.add_scalar("", 1.0, 0)
    with pytest.raises(TypeError, match="value"):
        w.add_scalar("x", "1", 0)
    w.close()
    with pytest.raises(TypeError, match="logdir"):
        SummaryWriter(42)
