"""Checkpoints: every stateful object of a run in one safetensors file.

Each object's ``state_dict()`` (nested dicts of numpy arrays and JSON values: a model's
parameters, an optimizer's moments and step counts, a scheduler's step, RNG states) is split
into tensors, stored as safetensors entries ``<object>/<path>``, and a JSON tree kept in the
file's metadata together with a SHA-256 of everything. Saving is atomic (a temporary file
``.<name>.ckpt-XXXXXXXX`` beside the file, fsync, rename): a crash mid-save leaves the previous
checkpoint intact, and the next save of that file removes the temporary file the crash left. A
save replaces only a regular file, keeping its mode, and writes through a symlink to its target.
Loading reads the bounded safetensors header first (a file that is not a regular file, or whose
header is too long for it or names no rlkit checkpoint, is refused before its data is read),
verifies the whole file before touching any object and rolls every object back if one of them
refuses its state, so a checkpoint is never half-loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import stat

import ml_dtypes
import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as st_load, save as st_save

from rlkit.core.files import fsync_path, kind_of

FORMAT = "rlkit.checkpoint"
VERSION = 1
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit on the JSON header


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
    one safetensors file at ``path``, atomically. ``path`` must be absent or a regular file (or
    a symlink to one, whose target is replaced); anything else raises FileExistsError."""
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
    _write_atomically(path, payload)


def _write_atomically(path: str, payload: bytes) -> None:
    """Replaces the file at ``path`` (through a symlink, its target) by ``payload``: a temporary
    file beside it, fsync, rename, fsync of the folder. The file keeps its mode; a new one gets
    the mode the umask gives. Temporary files that killed saves of the same file left are removed."""
    target = os.path.realpath(path)  # a symlink stays a link to the new checkpoint
    folder, name = os.path.split(target)
    try:
        st = os.stat(target)
    except FileNotFoundError:
        mode = None
    else:
        if not stat.S_ISREG(st.st_mode):
            raise FileExistsError(f"save_checkpoint: {path!r} is {kind_of(st.st_mode)}, not a regular file; "
                                  "a checkpoint replaces only a regular file (or a symlink to one)")
        mode = stat.S_IMODE(st.st_mode)
    os.makedirs(folder, exist_ok=True)
    while True:
        tmp = os.path.join(folder, f".{name}.ckpt-{secrets.token_hex(4)}")
        try:  # 0o666 less the umask: what a new file gets (mkstemp's would be 0600)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(fd, mode)
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    fsync_path(folder)
    stale = re.compile(rf"\.{re.escape(name)}\.ckpt-[0-9a-f]{{8}}")  # the names the loop above gives
    for entry in os.scandir(folder):
        if stale.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
            try:
                os.remove(entry.path)
            except FileNotFoundError:  # removed meanwhile by another save of the same file
                pass


def _read_bounded(path: str) -> tuple[bytes, dict]:
    """The bytes of the checkpoint file at ``path`` and its safetensors metadata, the bytes read
    only once the header is known to fit the file and to name an rlkit checkpoint (a foreign or
    endless file costs 8 bytes and its header, not its size)."""
    try:  # O_NONBLOCK: opening a FIFO would otherwise wait for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise CheckpointError(f"no checkpoint at {path!r}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise CheckpointError(f"{path!r} is {kind_of(st.st_mode)}, not a checkpoint file (a regular file)")
    with os.fdopen(fd, "rb") as f:
        head = f.read(8)
        header_len = int.from_bytes(head, "little")
        if len(head) < 8 or header_len > min(MAX_HEADER_BYTES, st.st_size - 8):
            raise CheckpointError(f"{path!r} is not a readable safetensors file (truncated or corrupt): its first "
                                  f"8 bytes give a header of {header_len} bytes, the file has {st.st_size} bytes "
                                  f"(a header holds at most {MAX_HEADER_BYTES})")
        header_bytes = f.read(header_len)
        try:
            header = json.loads(header_bytes)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError alike
            raise CheckpointError(f"{path!r} is not a readable safetensors file (truncated or corrupt): "
                                  f"its header is not JSON ({exc})") from None
        meta = header.get("__metadata__") if isinstance(header, dict) else None
        if not isinstance(meta, dict) or "rlkit" not in meta or "sha256" not in meta:
            raise CheckpointError(f"{path!r} is a safetensors file but not an rlkit checkpoint")
        return head + header_bytes + f.read(st.st_size - 8 - header_len), meta


def read_checkpoint(path: str) -> dict:
    """The verified contents: ``{"step", "metadata", "states": {name: state}}``. Raises
    CheckpointError for a missing, truncated, corrupt or foreign file, or for a path that is
    not a regular file (a directory, a device such as /dev/zero, a FIFO)."""
    payload, meta = _read_bounded(path)
    try:
        tensors = st_load(payload)
    except (SafetensorError, ValueError) as exc:
        raise CheckpointError(f"{path!r} is not a readable safetensors file (truncated or corrupt): {exc}") from None
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
