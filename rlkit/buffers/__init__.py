"""Buffers that live on the device: the DeviceBuffer table (rows x capacity, written by
columns, read by column indices). Replay buffers built on it come next."""

from rlkit.buffers.device_buffer import DeviceBuffer

__all__ = ["DeviceBuffer"]
