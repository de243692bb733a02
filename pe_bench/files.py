"""Files every package writes or holds: the lock one writer of a file or folder takes
(``exclusive_lock``)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def exclusive_lock(path: Path, busy: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold ``path`` alone (``flock``): a folder by the folder itself, so no lock file is left
    behind; a file is made if missing. If another holds it, ``busy`` is called first: it raises
    to refuse (the lock is not taken), or returns to wait for the holder to end. The kernel
    releases the lock when the holder closes it or dies, so a killed holder never leaves it
    held."""
    flags = os.O_RDONLY if path.is_dir() else os.O_WRONLY | os.O_CREAT | os.O_APPEND
    fd = os.open(path, flags, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if busy is not None:
                busy()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
