"""The lock one writer of a file or folder takes: refused or waited for while another holds
it, released when its holder ends."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

import pytest

from pe_bench.files import exclusive_lock


def taken(path: Path) -> bool:
    """Whether another open file of ``path`` holds its lock now (a second ``open`` is another
    holder to ``flock``, even in this process)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


class Refused(Exception):
    pass


def refuse() -> None:
    raise Refused


@pytest.mark.parametrize("name", ["folder", ".lock"])
def test_the_lock_is_held_inside_and_released_after(tmp_path, name):
    path = tmp_path / name
    if name == "folder":
        path.mkdir()
    with exclusive_lock(path, refuse):
        assert taken(path)
    assert not taken(path)
    with pytest.raises(ValueError), exclusive_lock(path, refuse):
        raise ValueError  # a holder that fails releases it too
    assert not taken(path)


def test_a_folder_is_locked_by_itself_and_a_file_is_made(tmp_path):
    with exclusive_lock(tmp_path):
        assert list(tmp_path.iterdir()) == []  # no lock file left in the folder
    with exclusive_lock(tmp_path / ".lock"):
        assert (tmp_path / ".lock").is_file()


def test_a_second_holder_is_refused_by_busy(tmp_path):
    first = os.open(tmp_path, os.O_RDONLY)
    fcntl.flock(first, fcntl.LOCK_EX)  # another holder (which ends in 5 s: a lock that
    threading.Timer(5, os.close, [first]).start()  # waited instead of refusing fails, not hangs)
    calls = []

    def busy() -> None:
        calls.append(taken(tmp_path))
        refuse()

    with pytest.raises(Refused), exclusive_lock(tmp_path, busy):
        pytest.fail("the lock was taken while another held it")
    assert calls == [True]
    assert taken(tmp_path)  # the first holder still holds it


def test_busy_is_not_called_when_nobody_holds_it(tmp_path):
    with exclusive_lock(tmp_path, refuse):
        pass


@pytest.mark.parametrize("busy", [None, lambda: None])
def test_a_second_holder_waits_for_the_first(tmp_path, busy):
    first = os.open(tmp_path, os.O_RDONLY)
    fcntl.flock(first, fcntl.LOCK_EX)  # another holder, which ends in half a second
    threading.Timer(0.5, os.close, [first]).start()
    start = time.monotonic()
    with exclusive_lock(tmp_path, busy):
        assert time.monotonic() - start >= 0.4
        assert taken(tmp_path)
