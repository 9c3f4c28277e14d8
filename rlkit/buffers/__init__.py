"""Buffers that live on the device: the DeviceBuffer table (rows x capacity, written by
columns, read by column indices), the ReplayBuffer built on it (u8 images, and frame stacks
stored frame by frame: frames.py) and its prioritized variants."""

from rlkit.buffers.device_buffer import DeviceBuffer
from rlkit.buffers.prioritized import DevicePrioritizedReplayBuffer, PrioritizedReplayBuffer, SumTree
from rlkit.buffers.replay import ReplayBuffer, ReplaySamples, SequenceSamples

__all__ = ["DeviceBuffer", "ReplayBuffer", "ReplaySamples", "SequenceSamples", "PrioritizedReplayBuffer", "DevicePrioritizedReplayBuffer",
           "SumTree"]
