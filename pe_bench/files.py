"""Files every package writes, reads or holds, below the record schema (``records``) that is
one of what they hold.

Files are rewritten whole through a temporary file and ``os.replace`` (``atomic_write``), so a
crash leaves the old file or the new one, never a half line (records, curves, checkpoints, the
report's tables and figures alike). JSON-lines files are read with each corrupt line skipped
and named once (``read_jsonl``), or moved aside by the run that holds their folder. One writer
of a file or folder at a time holds its lock (``exclusive_lock``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from pe_bench.errors import UserError

log = logging.getLogger(__name__)


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Call ``write`` on a binary file that then replaces ``path`` whole, so that readers see
    the old file or the new one: a unique temporary file beside it (two writers never share
    one), flushed to disk, then ``os.replace``; removed if anything fails or interrupts. An
    ``OSError`` names ``path`` (a write that fails on a full disk names no file of its own)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are meant to be shared
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        cause = _os_error(err)  # torch.save's RuntimeError on a full disk hides an OSError
        if cause is not None and cause.filename is None:
            raise OSError(cause.errno, cause.strerror or str(cause), str(path)) from err
        raise


def _os_error(err: BaseException | None) -> OSError | None:
    """``err`` if it is an ``OSError``, else the one it was raised while handling."""
    while err is not None and not isinstance(err, OSError):
        err = err.__context__
    return err


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """``atomic_write`` of ``data``."""
    atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: Path, text: str) -> None:
    """``atomic_write_bytes`` of ``text`` as UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


def write_jsonl(path: Path, rows: Iterable[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(row, allow_nan=True) + "\n" for row in rows))


def read_jsonl(path: Path, move_aside: bool = False) -> list[dict]:
    """Rows of a JSON-lines file; corrupt lines are skipped with one log line naming the file
    and the first of them (once a process). With ``move_aside`` (the run that holds the job
    folder), they are moved to ``<name>.corrupt`` beside it, so that no later run or report
    meets them again and nothing is lost."""
    return [row for _, row in numbered_rows(path, move_aside)]


CORRUPT = ".corrupt"  # suffix of the file beside a JSON-lines file that holds its corrupt lines
_warned: set[tuple[str, tuple[int, ...]]] = set()  # (file, its corrupt lines) said once


def numbered_rows(path: Path, move_aside: bool = False) -> list[tuple[int, dict]]:
    """(line number, row) of each JSON object line of ``path``. Lines that are not a JSON
    object are skipped with one log line naming the file and the first of them (moved aside
    with ``move_aside``: ``read_jsonl``); a file that is not UTF-8 text (binary) is a
    ``UserError`` naming it."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(
            f"{path}: not a JSON-lines file (byte {err.start} is not UTF-8 text); "
            "pe-bench writes one JSON object per line"
        ) from None
    except OSError as err:
        raise UserError(f"{path}: cannot be read: {err.strerror}") from None
    rows, bad = [], []
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")  # as open() reads
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict):
            rows.append((number, row))
        else:
            bad.append((number, line))
    if bad and move_aside:
        _move_aside(Path(path), [line for _, line in bad], [row for _, row in rows])
    elif bad and (str(path), tuple(n for n, _ in bad)) not in _warned:
        _warned.add((str(path), tuple(n for n, _ in bad)))
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        log.warning(
            "%s:%d: corrupt line skipped%s; the next pe-bench run of its job moves it to %s",
            path,
            bad[0][0],
            more,
            Path(path).name + CORRUPT,
        )
    return rows


def _move_aside(path: Path, lines: list[str], rows: list[dict]) -> None:
    """Append ``lines`` to ``path``'s ``.corrupt`` file, then rewrite ``path`` with ``rows``
    alone (in that order: a kill between the two leaves a line in both, never in neither)."""
    aside = path.with_name(path.name + CORRUPT)
    kept = aside.read_text(encoding="utf-8") if aside.exists() else ""
    atomic_write_text(aside, kept + "".join(f"{line}\n" for line in lines))
    write_jsonl(path, rows)
    more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
    log.warning("%s: a corrupt line%s moved to %s", path, more, aside.name)


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
