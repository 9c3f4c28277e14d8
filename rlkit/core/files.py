"""File-system pieces shared by the checkpoint and replay-buffer saves: forcing what was written
to the disk, and naming what kind of thing sits at a path when a save refuses to replace it."""

from __future__ import annotations

import os
import stat

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISLNK, "a symbolic link"))


def kind_of(mode: int) -> str:
    """What ``os.stat(...).st_mode`` describes, in words ("a directory", "a character device")."""
    return next((words for test, words in _KINDS if test(mode)), "a special file")


def fsync_path(path: str) -> None:
    """Forces a written file, or a directory's entries (a rename in it), to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
