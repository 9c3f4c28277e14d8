"""Buffers that live on the device: the DeviceBuffer table (rows x capacity, written by
columns, read by column indices), the ReplayBuffer built on it and its prioritized variant."""

from rlkit.buffers.device_buffer import DeviceBuffer
from rlkit.buffers.prioritized import DevicePrioritizedReplayBuffer, PrioritizedReplayBuffer, SumTree
from rlkit.buffers.replay import ReplayBuffer, ReplaySamples, SequenceSamples

__all__ = ["DeviceBuffer", "ReplayBuffer", "ReplaySamples", "SequenceSamples", "PrioritizedReplayBuffer", "DevicePrioritizedReplayBuffer",
           "SumTree"]
