"""Buffers that live on the device: the DeviceBuffer table (rows x capacity, written by
columns, read by column indices), the ReplayBuffer built on it (u8 images, and frame stacks
stored frame by frame: frames.py; dict observations key by key: keyed.py), its prioritized
variants and hindsight relabelling (her.py)."""

from rlkit.buffers.device_buffer import DeviceBuffer
from rlkit.buffers.her import HerReplayBuffer
from rlkit.buffers.prioritized import DevicePrioritizedReplayBuffer, PrioritizedReplayBuffer, SumTree
from rlkit.buffers.replay import ReplayBuffer, ReplaySamples
from rlkit.buffers.replay_sequences import SequenceSamples

__all__ = ["DeviceBuffer", "ReplayBuffer", "ReplaySamples", "SequenceSamples", "PrioritizedReplayBuffer", "DevicePrioritizedReplayBuffer",
           "SumTree", "HerReplayBuffer"]
