"""A ReplayBuffer's save and load: a folder of one .npy per device field and the host arrays,
each with its SHA-256, written beside the earlier save and swapped in (save_folders.py)."""

from __future__ import annotations

import hashlib
import json
import math
import os

import numpy as np

from rlkit.buffers.device_buffer import DeviceBuffer
from rlkit.buffers.save_folders import SAVE_FORMAT, SAVE_VERSION, file_sha256, save_folder, saved_folder
from rlkit.core.files import fsync_path
from rlkit.core.tensor import NUMPY_DTYPES


class ReplayFiles:
    """ReplayBuffer's saving and loading (a base class of it: they read and restore its tables,
    ring and settings)."""

    CHUNK_BYTES = 64 << 20

    def save(self, path: str) -> None:
        """Writes the buffer to the folder ``path``: one .npy per field, copied in chunks of at
        most 64 MiB (memory stays bounded), with a SHA-256 of every field's data and of the
        host arrays in meta.json. ``path`` must be absent or an earlier buffer save (anything
        else raises FileExistsError and is left as it is); the save is written beside it and
        swapped in (save_folders.save_folder), so a process killed at any moment leaves the
        earlier save or this one loadable."""
        save_folder(path, self._write_files)

    def _write_files(self, folder: str) -> None:
        """Every file of a save, written into ``folder`` and fsynced, meta.json last."""
        digests = {}
        for name, buffer in self._device_fields().items():
            file = os.path.join(folder, f"{name}.npy")
            out = np.lib.format.open_memmap(file, mode="w+", dtype=NUMPY_DTYPES[buffer.dtype],
                                            shape=(buffer.rows, buffer.capacity), fortran_order=True)
            digest = hashlib.sha256()
            for col, k in self._chunks(buffer, out.itemsize):
                block = np.asfortranarray(buffer.read(col, k))
                out[:, col:col + k] = block
                digest.update(block.tobytes(order="F"))
            out.flush()
            del out
            fsync_path(file)
            digests[name] = digest.hexdigest()
        columns = sorted(self._final_obs)
        final_obs = np.zeros((len(columns), 0 if self._keyed is not None else math.prod(self.obs_shape)), np.float32)
        for row, column in enumerate(columns):
            final_obs[row] = self._final_obs[column]
        host = os.path.join(folder, "host.npz")
        np.savez(host, reward=self._reward, terminated=self._terminated, truncated=self._truncated,
                 final_columns=np.array(columns, np.int64), final_obs=final_obs, newest_next=self._newest_next,
                 **self._extra_host_arrays(),
                 **(self._stacks.host_state() if self._stacks is not None else {}))
        fsync_path(host)
        digests["host.npz"] = file_sha256(host)
        with open(os.path.join(folder, "meta.json"), "w") as f:
            json.dump({"format": SAVE_FORMAT, "version": SAVE_VERSION, **self._settings(), "sha256": digests}, f)
            f.flush()
            os.fsync(f.fileno())

    @classmethod
    def _chunks(cls, buffer: DeviceBuffer, itemsize: int):
        """(first column, columns) of each chunk of at most CHUNK_BYTES."""
        step = max(1, cls.CHUNK_BYTES // max(1, buffer.rows * itemsize))
        for col in range(0, buffer.capacity, step):
            yield col, min(step, buffer.capacity - col)

    @classmethod
    def load(cls, path: str, device: str | None = None):
        """A buffer saved by save(), on ``device`` (the default device when None), filled in
        chunks of at most 64 MiB. A missing, truncated or corrupt save (any field's data not
        matching its SHA-256) raises ValueError saying which file. Where ``path`` is missing
        because a save was killed between its two renames, the whole save it left beside
        ``path`` is loaded (the newer one where both are whole)."""
        def refuse(what: str):
            return ValueError(f"ReplayBuffer.load: {path!r} is not a saved replay buffer, or not a whole one: "
                              f"{what}")

        folder = saved_folder(os.path.realpath(path))
        try:
            with open(os.path.join(folder, "meta.json")) as f:
                settings = json.load(f)
            marker = settings.pop("format", SAVE_FORMAT), settings.pop("version", SAVE_VERSION)  # older saves: none
            if marker != (SAVE_FORMAT, SAVE_VERSION):
                raise refuse(f"meta.json gives format {marker[0]} v{marker[1]}, expected {SAVE_FORMAT} v{SAVE_VERSION}")
            digests, state = settings.pop("sha256"), settings.pop("state")
            if file_sha256(os.path.join(folder, "host.npz")) != digests["host.npz"]:
                raise refuse("host.npz is truncated or corrupt (its SHA-256 differs from the one saved)")
            with np.load(os.path.join(folder, "host.npz")) as archive:
                host = {key: archive[key] for key in archive.files}
            buf = cls(**settings, device=device)
        except ValueError as exc:
            if str(exc).startswith("ReplayBuffer.load"):
                raise
            raise refuse(str(exc)) from None
        except (OSError, KeyError, TypeError, json.JSONDecodeError) as exc:
            raise refuse(f"{type(exc).__name__}: {exc}") from None
        for name, buffer in buf._device_fields().items():
            try:
                data = np.load(os.path.join(folder, f"{name}.npy"), mmap_mode="r")
            except (OSError, ValueError) as exc:
                raise refuse(f"{name}.npy cannot be read ({exc})") from None
            if data.shape != (buffer.rows, buffer.capacity) or data.dtype != NUMPY_DTYPES[buffer.dtype]:
                raise refuse(f"{name}.npy holds {data.dtype} {data.shape}, expected {buffer.dtype} "
                             f"{(buffer.rows, buffer.capacity)}")
            digest = hashlib.sha256()
            for col, k in cls._chunks(buffer, data.itemsize):
                block = np.asfortranarray(data[:, col:col + k])
                digest.update(block.tobytes(order="F"))
                buffer.write(block, col)
            if digest.hexdigest() != digests.get(name):
                raise refuse(f"{name}.npy is corrupt (its SHA-256 differs from the one saved)")
        try:
            buf._reward, buf._terminated, buf._truncated = host["reward"], host["terminated"], host["truncated"]
            buf._final_obs = {int(c): row for c, row in zip(host["final_columns"], host["final_obs"])}
            if "newest_next" in host:  # (saves before it have none)
                np.copyto(buf._newest_next, host["newest_next"])
            buf.pos, buf.full = state["pos"], state["full"]
            buf._rng.bit_generator.state = state["rng"]
            buf._restore_extra_host_arrays(host)
            if buf._stacks is not None:
                buf._steps_added, buf._first_sampled = state["steps_added"], state["first_sampled"]
                buf._stacks.restore(host)
        except (KeyError, TypeError, ValueError) as exc:
            raise refuse(f"host state is incomplete ({type(exc).__name__}: {exc})") from None
        buf._restore_device_rows()
        return buf

    def _extra_host_arrays(self) -> dict[str, np.ndarray]:
        """Host state a subclass saves beside the base's (priorities, for the prioritized buffer)."""
        return {}

    def _restore_extra_host_arrays(self, host) -> None:
        """Restores what ``_extra_host_arrays`` saved."""

    def _restore_device_rows(self) -> None:
        """The device copies of rewards, terminations and stop flags, rebuilt from the host's
        (row t, lane e is column t * n_envs + e, the row-major order of the host arrays)."""
        self._reward_row.write(self._reward.reshape(1, -1))
        self._terminated_row.write(self._terminated.reshape(1, -1).astype(np.float32))
        self._ended_row.write((self._terminated | self._truncated).reshape(1, -1).astype(np.float32))
        if self._stop_row is not None:
            stop = (self._terminated | self._truncated).astype(np.float32)
            if len(self) > 0:
                stop[(self.pos - 1) % self.lane_length] = 1.0  # the newest step
            self._stop_row.write(stop.reshape(1, -1))
        if self._stacks is not None:
            self._first_column_sent = self._first_sampled_column()
            self._first_column_row.write(np.array([[self._first_column_sent]], np.float32))

    def _device_fields(self) -> dict[str, DeviceBuffer]:
        if self._stacks is not None:
            return {"frames": self._stacks.frames, "stack_index": self._stacks.stack_index, "action": self._action}
        if self._keyed is not None:
            return {**self._keyed.fields(), "action": self._action}
        fields = {"obs": self._obs, "action": self._action}
        if self._next_obs is not None:
            fields["next_obs"] = self._next_obs
        return fields

    def _settings(self) -> dict:
        obs_shape = ({key: list(shape) for key, shape in self.obs_shape.items()} if self._keyed is not None
                     else list(self.obs_shape))
        settings = {"capacity": self.capacity, "obs_shape": obs_shape,
                    "action_shape": list(self.action_shape), "n_envs": self.n_envs, "obs_dtype": self.obs_dtype,
                    "action_dtype": self._action.dtype, "optimize_memory": self.optimize_memory,
                    "n_step": self.n_step, "gamma": self.gamma,
                    "state": {"pos": self.pos, "full": self.full, "rng": self._rng.bit_generator.state}}
        if self._stacks is not None:  # (saves of other buffers keep the settings they always had)
            settings.update(frame_stack=self.frame_stack, start_frames=self.start_frames)
            settings["state"].update(steps_added=self._steps_added, first_sampled=self._first_sampled)
        return settings
