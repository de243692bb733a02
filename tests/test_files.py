"""Files: written whole or not at all, JSON lines read with corrupt lines named or moved
aside, and the lock one writer of a file or folder takes (refused or waited for while another
holds it, released when its holder ends)."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import threading
import time
from pathlib import Path

import pytest

from pe_bench.errors import UserError
from pe_bench.files import (
    atomic_write_bytes,
    atomic_write_text,
    exclusive_lock,
    read_jsonl,
    write_jsonl,
)


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


def test_atomic_write_replaces_whole_file(tmp_path):
    path = tmp_path / "a" / "records.jsonl"
    write_jsonl(path, [{"x": 1}, {"x": 2}])
    write_jsonl(path, [{"x": 3}])
    assert read_jsonl(path) == [{"x": 3}]
    assert [p.name for p in path.parent.iterdir()] == ["records.jsonl"]  # no temp files left


def test_new_file_is_complete_before_it_replaces_the_old(tmp_path, monkeypatch):
    """The target is never written in place: up to the one ``os.replace`` it holds the old
    text, and the file that replaces it, beside it, already holds the whole new text."""
    path = tmp_path / "records.jsonl"
    atomic_write_text(path, "old\n")
    seen = []
    real_replace = os.replace

    def replace(src, dst):
        seen.append((Path(src).parent, Path(dst), path.read_text(), Path(src).read_text()))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    write_jsonl(path, [{"x": 1}, {"x": 2}])
    assert seen == [(tmp_path, path, "old\n", '{"x": 1}\n{"x": 2}\n')]
    assert path.read_text() == '{"x": 1}\n{"x": 2}\n'


@pytest.mark.parametrize("step", ["fsync", "replace"])
def test_failed_write_keeps_the_old_file(tmp_path, monkeypatch, step):
    """A write that fails inside the writer (disk full at fsync, or at the rename) leaves the
    old file whole and no temporary file behind."""
    path = tmp_path / "records.jsonl"
    atomic_write_text(path, "old\n")

    def fail(*args):
        raise OSError(28, f"no space left on device ({step})")

    monkeypatch.setattr(os, step, fail)
    with pytest.raises(OSError, match=rf"no space left on device \({step}\)"):
        write_jsonl(path, [{"x": 1}])
    monkeypatch.undo()
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["records.jsonl"]


def test_corrupt_line_is_skipped_with_one_log_line_once(tmp_path, caplog, recwarn):
    """One line naming the file and the line, once a process, and no Python warning (two
    lines with the source line under it, on every later run)."""
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps({"a": 1}) + "\n{broken\n" + json.dumps({"a": 2}) + "\n")
    with caplog.at_level(logging.WARNING, logger="pe_bench"):
        assert read_jsonl(path) == [{"a": 1}, {"a": 2}]
        assert read_jsonl(path) == [{"a": 1}, {"a": 2}]
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith(f"{path}:2: corrupt line skipped")
    assert "\n" not in said[0] and "records.jsonl.corrupt" in said[0]
    assert len(recwarn) == 0


def test_the_run_that_holds_a_folder_moves_corrupt_lines_aside(tmp_path, caplog):
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps({"a": 1}) + "\n{broken\n" + json.dumps({"a": 2}) + "\n")
    with caplog.at_level(logging.WARNING, logger="pe_bench"):
        assert read_jsonl(path, move_aside=True) == [{"a": 1}, {"a": 2}]
    assert caplog.messages == [f"{path}: a corrupt line moved to records.jsonl.corrupt"]
    assert (tmp_path / "records.jsonl.corrupt").read_text() == "{broken\n"
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]
    assert path.read_text().count("\n") == 2


def test_atomic_write_bytes_keeps_the_old_file_when_it_fails(tmp_path, monkeypatch):
    path = tmp_path / "figure.png"
    atomic_write_bytes(path, b"old")

    def fail(src, dst):
        raise OSError("full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="full"):
        atomic_write_bytes(path, b"new figure")
    monkeypatch.undo()
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["figure.png"]


def test_a_binary_file_is_a_one_line_error_naming_it(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_bytes(b'{"a": 1}\n\xff\xfe\x00binary')
    with pytest.raises(UserError, match=rf"{path}: not a JSON-lines file \(byte 9 is not UTF-8"):
        read_jsonl(path)


def test_lines_that_are_not_objects_are_skipped_with_one_warning(tmp_path, caplog):
    path = tmp_path / "records.jsonl"
    path.write_text('[1, 2]\n{"a": 1}\n3\n"text"\n')
    with caplog.at_level(logging.WARNING, logger="pe_bench"):
        assert read_jsonl(path) == [{"a": 1}]
    assert re.match(r".*records.jsonl:1: corrupt line skipped \(and 2 more\)", caplog.text)
