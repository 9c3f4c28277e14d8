"""Replay-buffer save folders, replaced whole: ``save_folder`` writes a new save beside the old
one and swaps it in, so that a process killed at any moment leaves the earlier save or the new
one loadable; ``saved_folder`` finds the whole save a killed swap left (what ``load`` reads). A
save folder holds only the files its meta.json lists (``meta.json``, ``host.npz``, ``*.npy``),
each with its SHA-256: a folder holding anything else is not a save, and is never replaced.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import stat
from typing import Callable

import numpy as np

from rlkit.core.files import fsync_path, kind_of

SAVE_FORMAT, SAVE_VERSION = "rlkit.replay_buffer", 1  # meta.json's marker (saves before it have none)
_SAVE_FILE = re.compile(r"meta\.json|host\.npz|\w+\.npy")  # the names of the files a save writes


def _leftover(target: str) -> re.Pattern:
    """The names of the folders saves of ``target`` write beside it: ``kind`` tmp (being
    written) or old (an earlier save moved aside)."""
    return re.compile(rf"\.{re.escape(os.path.basename(target))}\.replay-(?P<kind>tmp|old)-[0-9a-f]{{8}}")


def _new_sibling(target: str, kind: str) -> str:
    """A new empty folder ``.<name>.replay-<kind>-XXXXXXXX`` beside ``target`` (mode from the umask)."""
    parent, name = os.path.split(target)
    while True:
        folder = os.path.join(parent, f".{name}.replay-{kind}-{secrets.token_hex(4)}")
        try:
            os.mkdir(folder)
            return folder
        except FileExistsError:
            continue


def _save_meta(folder: str) -> dict | None:
    """meta.json of the buffer save in ``folder``, or None where the folder is not one: no meta.json
    of a save, or any entry that is not one of the regular files that meta.json lists (a file it
    lists may be missing: the folder is still a save, a damaged one, and nothing else)."""
    try:
        with open(os.path.join(folder, "meta.json")) as f:
            meta = json.load(f)
        names = {entry.name: entry.is_file(follow_symlinks=False) for entry in os.scandir(folder)}
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or not isinstance(meta.get("sha256"), dict):
        return None
    marked = meta.get("format") == SAVE_FORMAT or ("format" not in meta and {"capacity", "state"} <= meta.keys())
    files = {"meta.json"} | {key if key.endswith(".npz") else f"{key}.npy" for key in meta["sha256"]}
    return meta if marked and all(name in files and regular for name, regular in names.items()) else None


def _replaceable_save(path: str, target: str) -> int | None:
    """The mode of the earlier save at ``target`` that a save may replace, None when nothing is
    there; FileExistsError for anything else, which a save leaves as it is."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        raise FileExistsError(f"ReplayBuffer.save: {path!r} is {kind_of(st.st_mode)}, not the folder of a replay "
                              "buffer save; a save replaces only an earlier save")
    if _save_meta(target) is None:
        held = sorted(os.listdir(target))
        listed = ", ".join(map(repr, held[:3])) + (", ..." if len(held) > 3 else "") if held else "nothing"
        raise FileExistsError(f"ReplayBuffer.save: {path!r} exists and is not a replay-buffer save (it holds "
                              f"{listed}); a save replaces only an earlier save and deletes nothing else: "
                              "save elsewhere, or move that folder away")
    return stat.S_IMODE(st.st_mode)


def saved_folder(target: str) -> str:
    """Where the save of ``target`` is: ``target`` itself when it exists; where a save was killed
    between its two renames, the whole save it left beside it (the new one first, then the earlier
    one; checksums decide which is whole); ``target`` again when there is none."""
    if os.path.lexists(target):
        return target
    parent = os.path.dirname(target)
    pattern = _leftover(target)
    found = [(m.group("kind") != "tmp", -entry.stat().st_mtime, entry.path) for entry in os.scandir(parent)
             if (m := pattern.fullmatch(entry.name)) and entry.is_dir(follow_symlinks=False)]
    return next((folder for *_, folder in sorted(found) if _whole_save(folder)), target)


def _remove_leftovers(target: str) -> None:
    """Removes what killed saves of ``target`` left beside it: folders with a name of the saves'
    pattern that hold nothing but files of a save (whole or part written); nothing else."""
    pattern = _leftover(target)
    for entry in os.scandir(os.path.dirname(target)):
        if not pattern.fullmatch(entry.name) or not entry.is_dir(follow_symlinks=False):
            continue
        inside = list(os.scandir(entry.path))
        if all(_SAVE_FILE.fullmatch(item.name) and item.is_file(follow_symlinks=False) for item in inside):
            shutil.rmtree(entry.path)


def _whole_save(folder: str) -> bool:
    """Whether ``folder`` holds a save whose every file matches the SHA-256 in its meta.json."""
    meta = _save_meta(folder)
    if meta is None:
        return False
    for key, expected in meta["sha256"].items():
        file = os.path.join(folder, key if key.endswith(".npz") else f"{key}.npy")
        try:
            digest = file_sha256(file) if key.endswith(".npz") else _npy_data_sha256(file)
        except (OSError, ValueError):
            return False
        if digest != expected:
            return False
    return True


def _npy_data_sha256(path: str) -> str:
    """The SHA-256 of a saved field's data (a Fortran-order .npy: the bytes after its header, as
    save hashes them), read in 1 MiB pieces."""
    data = np.load(path, mmap_mode="r")
    if not data.flags.f_contiguous:
        raise ValueError(f"{path} is not in Fortran order, as saves write their fields")
    flat = data.ravel(order="F").view(np.uint8)  # a view of the file's data bytes, no copy
    digest = hashlib.sha256()
    for start in range(0, flat.size, 1 << 20):
        digest.update(flat[start:start + (1 << 20)])
    return digest.hexdigest()


def file_sha256(path: str) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB pieces."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for piece in iter(lambda: f.read(1 << 20), b""):
            digest.update(piece)
    return digest.hexdigest()


def save_folder(path: str, write_files: Callable[[str], None]) -> None:
    """Writes a save with ``write_files(folder)`` into ``.<name>.replay-tmp-XXXXXXXX`` beside
    ``path`` and swaps it in (an earlier save renamed to ``.<name>.replay-old-XXXXXXXX``, the new
    one into place, then the old one removed), the folders fsynced. ``path`` must be absent or an
    earlier save (FileExistsError otherwise, leaving it as it is); what a killed save left beside
    it is removed first; the new folder keeps the mode of the one it replaces."""
    target = os.path.realpath(path)
    mode = _replaceable_save(path, target)
    if mode is None:  # absent: a killed save may have left the only whole copy beside it
        found = saved_folder(target)
        if found != target:
            os.rename(found, target)
            mode = stat.S_IMODE(os.stat(target).st_mode)
    _remove_leftovers(target)
    tmp = _new_sibling(target, "tmp")
    try:
        if mode is not None:
            os.chmod(tmp, mode)
        write_files(tmp)
        fsync_path(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # tmp is a whole save from here: a failure or a kill below leaves a state that load and
    # the next save recover from (the earlier save, this one, or both, beside or at target)
    old = None
    if mode is not None:
        old = _new_sibling(target, "old")
        os.rename(target, old)  # onto the empty folder just made: a name no one else holds
    os.rename(tmp, target)
    fsync_path(os.path.dirname(target))
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)  # what fails to go is a leftover the next save removes
