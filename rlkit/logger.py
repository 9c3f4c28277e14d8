"""TensorBoard logging through the tensorboard package's own event-file writer.

``SummaryWriter(logdir)`` writes scalars, text and a hyperparameter table that TensorBoard's
scalar and HParams dashboards show; ``run_dir(root, name)`` picks the next free
``<root>/<name>_<N>`` folder, as Stable-Baselines3 names its runs.
"""

from __future__ import annotations

import math
import numbers
import os
import re
import time

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
from tensorboard.plugins.hparams import api_pb2, metadata as hparams_metadata, plugin_data_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter


def run_dir(root: str, name: str, reuse_latest: bool = False) -> str:
    """The next free folder ``<root>/<name>_<N>`` (N from 1), created; with ``reuse_latest``
    the latest existing one (as SB3 goes on writing a run that does not reset its timesteps),
    or the first where none exists."""
    os.makedirs(root, exist_ok=True)
    pattern = re.compile(rf"^{re.escape(name)}_(\d+)$")
    taken = [int(m.group(1)) for entry in os.listdir(root) if (m := pattern.match(entry))]
    if reuse_latest and taken:
        return os.path.join(root, f"{name}_{max(taken)}")
    path = os.path.join(root, f"{name}_{max(taken, default=0) + 1}")
    os.makedirs(path)
    return path


class SummaryWriter:
    """Writes TensorBoard event files into ``logdir`` (created if needed)."""

    def __init__(self, logdir: str, flush_secs: float = 10.0):
        if not isinstance(logdir, (str, os.PathLike)):
            raise TypeError(f"SummaryWriter: logdir must be a path, got {type(logdir).__name__}")
        self.logdir = os.fspath(logdir)
        os.makedirs(self.logdir, exist_ok=True)
        self._writer = EventFileWriter(self.logdir, flush_secs=flush_secs)

    def _write(self, summary: Summary, step: int | None) -> None:
        event = Event(wall_time=time.time(), summary=summary)
        if step is not None:
            event.step = int(step)
        self._writer.add_event(event)

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        """One point of the curve ``tag`` at ``step``."""
        if not isinstance(tag, str) or not tag:
            raise ValueError(f"add_scalar: tag must be a non-empty str, got {tag!r}")
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"add_scalar: value must be a number, got {type(value).__name__}")
        self._write(Summary(value=[Summary.Value(tag=tag, simple_value=float(value))]), step)

    def add_text(self, tag: str, text: str, step: int = 0) -> None:
        """A text entry (markdown) for the Text dashboard."""
        meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto

        proto = TensorProto(dtype=7, string_val=[text.encode()], tensor_shape=TensorShapeProto(dim=[]))  # DT_STRING
        self._write(Summary(value=[Summary.Value(tag=tag, metadata=meta, tensor=proto)]), step)

    def add_hparams(self, hparams: dict, metrics: dict | None = None) -> None:
        """The run's hyperparameters (numbers, strings, bools; others as their str) for the
        HParams dashboard, and the metric tags it should show beside them."""
        values = {}
        for key, value in hparams.items():
            if isinstance(value, bool):
                values[key] = api_pb2.HParamInfo(name=key), {"bool_value": value}
            elif isinstance(value, numbers.Real) and math.isfinite(value):
                values[key] = api_pb2.HParamInfo(name=key), {"number_value": float(value)}
            else:
                values[key] = api_pb2.HParamInfo(name=key), {"string_value": str(value)}
        experiment = api_pb2.Experiment(
            hparam_infos=[info for info, _ in values.values()],
            metric_infos=[api_pb2.MetricInfo(name=api_pb2.MetricName(tag=tag)) for tag in (metrics or {})],
        )
        self._write_plugin(hparams_metadata.EXPERIMENT_TAG, plugin_data_pb2.HParamsPluginData(experiment=experiment))
        session = plugin_data_pb2.SessionStartInfo()
        for key, (_, value) in values.items():
            field, v = next(iter(value.items()))
            setattr(session.hparams[key], field, v)
        self._write_plugin(hparams_metadata.SESSION_START_INFO_TAG,
                           plugin_data_pb2.HParamsPluginData(session_start_info=session))
        for tag, value in (metrics or {}).items():
            self.add_scalar(tag, value, 0)

    def _write_plugin(self, tag: str, content: plugin_data_pb2.HParamsPluginData) -> None:
        content.version = hparams_metadata.PLUGIN_DATA_VERSION
        meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(
            plugin_name=hparams_metadata.PLUGIN_NAME, content=content.SerializeToString()))
        self._write(Summary(value=[Summary.Value(tag=tag, metadata=meta)]), None)

    def flush(self) -> None:
        """Writes pending events to disk."""
        self._writer.flush()

    def close(self) -> None:
        """Flushes and closes the event file."""
        self._writer.close()

    def __enter__(self) -> "SummaryWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
