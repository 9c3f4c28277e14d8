"""Checkpoints: every stateful object of a run in one safetensors file.

Each object's ``state_dict()`` (nested dicts of numpy arrays and JSON values: a model's
parameters, an optimizer's moments and step counts, a scheduler's step, RNG states) is split
into tensors, stored as safetensors entries ``<object>/<path>``, and a JSON tree kept in the
file's metadata together with a SHA-256 of everything. Saving is atomic (a temporary file in
the same folder, fsync, rename): a crash mid-save leaves the previous checkpoint intact.
Loading verifies the whole file before touching any object and rolls every object back if
one of them refuses its state, so a checkpoint is never half-loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile

import ml_dtypes
import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as st_load, save as st_save

FORMAT = "rlkit.checkpoint"
VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint file that is missing, truncated, corrupt or of another format."""


def _flatten(value, path: str, tensors: dict):
    """JSON-able tree of ``value`` with arrays moved into ``tensors`` under their path."""
    if isinstance(value, np.ndarray):
        if path in tensors:
            raise ValueError(f"checkpoint: two arrays of the state map to the same entry {path!r}")
        if value.dtype == ml_dtypes.bfloat16:  # safetensors' numpy reader has no BF16: stored as its bits
            tensors[path] = np.ascontiguousarray(value).view(np.uint16)
            return {"__tensor__": path, "bits_of": "bf16"}
        tensors[path] = np.ascontiguousarray(value)
        return {"__tensor__": path}
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise TypeError(f"checkpoint: state keys must be strings, got {key!r} in {path!r}")
        return {key: _flatten(v, f"{path}/{key}", tensors) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_flatten(v, f"{path}/{i}", tensors) for i, v in enumerate(value)]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"checkpoint: cannot store a {type(value).__name__} at {path!r}")


def _unflatten(tree, tensors: dict):
    if isinstance(tree, dict):
        if set(tree) == {"__tensor__"}:
            return tensors[tree["__tensor__"]]
        if set(tree) == {"__tensor__", "bits_of"} and tree["bits_of"] == "bf16":
            return tensors[tree["__tensor__"]].view(ml_dtypes.bfloat16)
        return {key: _unflatten(v, tensors) for key, v in tree.items()}
    if isinstance(tree, list):
        return [_unflatten(v, tensors) for v in tree]
    return tree


def _digest(tree_json: str, tensors: dict) -> str:
    h = hashlib.sha256(tree_json.encode())
    for key in sorted(tensors):
        arr = tensors[key]
        h.update(f"{key}|{arr.dtype.str}|{arr.shape}".encode())
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def save_checkpoint(path: str, objects: dict, step: int = 0, metadata: dict | None = None) -> None:
    """Writes ``{name: obj.state_dict()}`` of every object, the step and JSON metadata into
    one safetensors file at ``path``, atomically."""
    if not isinstance(objects, dict) or not objects:
        raise ValueError("save_checkpoint: objects must be a non-empty {name: object with state_dict()}")
    tensors: dict[str, np.ndarray] = {}
    states = {}
    for name, obj in objects.items():
        if not hasattr(obj, "state_dict"):
            raise TypeError(f"save_checkpoint: {name!r} has no state_dict()")
        states[name] = _flatten(obj.state_dict(), name, tensors)
    tree = json.dumps({"format": FORMAT, "version": VERSION, "step": int(step), "metadata": metadata or {},
                       "states": states})
    payload = st_save(tensors, metadata={"rlkit": tree, "sha256": _digest(tree, tensors)})

    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".ckpt-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_checkpoint(path: str) -> dict:
    """The verified contents: ``{"step", "metadata", "states": {name: state}}``. Raises
    CheckpointError for a missing, truncated, corrupt or foreign file."""
    try:
        with open(path, "rb") as f:
            payload = f.read()
    except FileNotFoundError:
        raise CheckpointError(f"no checkpoint at {path!r}") from None
    try:
        tensors = st_load(payload)
        header_len = int.from_bytes(payload[:8], "little")
        header = json.loads(payload[8:8 + header_len])
    except (SafetensorError, ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path!r} is not a readable safetensors file (truncated or corrupt): {exc}") from None
    meta = header.get("__metadata__") or {}
    if "rlkit" not in meta or "sha256" not in meta:
        raise CheckpointError(f"{path!r} is a safetensors file but not an rlkit checkpoint")
    if _digest(meta["rlkit"], tensors) != meta["sha256"]:
        raise CheckpointError(f"{path!r} is corrupt: its contents do not match the checksum written with them")
    tree = json.loads(meta["rlkit"])
    if tree.get("format") != FORMAT or tree.get("version") != VERSION:
        raise CheckpointError(f"{path!r} has format {tree.get('format')} v{tree.get('version')}, "
                              f"expected {FORMAT} v{VERSION}")
    return {"step": tree["step"], "metadata": tree["metadata"],
            "states": {name: _unflatten(state, tensors) for name, state in tree["states"].items()}}


def load_checkpoint(path: str, objects: dict) -> dict:
    """Restores every object of ``{name: obj}`` from the checkpoint (all or none) and returns
    ``{"step", "metadata"}``. A name missing from the file raises KeyError."""
    contents = read_checkpoint(path)
    missing = [name for name in objects if name not in contents["states"]]
    if missing:
        raise KeyError(f"load_checkpoint: {path!r} holds no state for {missing}; it has {sorted(contents['states'])}")
    before = {name: obj.state_dict() for name, obj in objects.items()}
    try:
        for name, obj in objects.items():
            obj.load_state_dict(contents["states"][name])
    except BaseException:
        for name, obj in objects.items():
            obj.load_state_dict(before[name])
        raise
    return {"step": contents["step"], "metadata": contents["metadata"]}
