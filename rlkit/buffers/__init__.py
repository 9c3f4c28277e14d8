"""Buffers that live on the device: the DeviceBuffer table (rows x capacity, written by
columns, read by column indices) and the ReplayBuffer built on it."""

from rlkit.buffers.device_buffer import DeviceBuffer
from rlkit.buffers.replay import ReplayBuffer, ReplaySamples

__all__ = ["DeviceBuffer", "ReplayBuffer", "ReplaySamples"]
