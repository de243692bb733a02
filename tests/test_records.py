"""Records: atomic files, loading into a DataFrame, corrupt lines named."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import pytest

from pe_bench.errors import UserError
from pe_bench.records import (
    atomic_write_bytes,
    atomic_write_text,
    load_records,
    read_jsonl,
    write_jsonl,
)


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


def test_load_records_from_nested_runs(tmp_path):
    write_jsonl(tmp_path / "pe=rope" / "records.jsonl", [{"scheme": "rope", "eval_len": 16}])
    write_jsonl(tmp_path / "pe=alibi" / "records.jsonl", [{"scheme": "alibi", "eval_len": 16}])
    df = load_records(tmp_path)
    assert sorted(df["scheme"]) == ["alibi", "rope"]


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


def test_no_records_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="no records under"):
        load_records(tmp_path)
    with pytest.raises(UserError, match="does not exist"):
        load_records(tmp_path / "nope")


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


def test_records_of_two_trained_runs_in_one_file_are_refused(tmp_path):
    path = tmp_path / "pe=rope" / "records.jsonl"
    write_jsonl(path, [{"run_id": "rope-aaa", "seed": 0}, {"run_id": "rope-bbb", "seed": 1}])
    with pytest.raises(
        UserError, match=r"records.jsonl holds records of 2 trained runs \(rope-aaa, rope-bbb\)"
    ):
        load_records(tmp_path)


def test_fine_tunes_are_the_same_trained_run(tmp_path):
    rows = [{"run_id": "rope-aaa"}, {"run_id": "rope-aaa:pi-123"}, {"run_id": "rope-aaa:ft-456"}]
    write_jsonl(tmp_path / "pe=rope" / "records.jsonl", rows)
    assert load_records(tmp_path)["run_id"].tolist() == [r["run_id"] for r in rows]


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


def test_a_check_names_the_file_and_line(tmp_path):
    write_jsonl(tmp_path / "records.jsonl", [{"scheme": "rope"}, {"x": 1}])
    with pytest.raises(UserError, match=r"records.jsonl:2: lacks scheme"):
        load_records(tmp_path, lambda r: "" if "scheme" in r else "lacks scheme")


def test_provenance_names_the_cpu_model_and_its_kernels(monkeypatch):
    """What decides the last bits of a CPU run (docs/reliability.md#determinism): the CPU's
    model and the vector kernels ATen dispatches to, as torch names them."""
    import torch

    from pe_bench import records

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setattr(records, "cpu_model", lambda: "AMD EPYC 9654 96-Core Processor")
    fields = records.provenance(torch.device("cpu"))
    assert fields["cpu_model"] == "AMD EPYC 9654 96-Core Processor"
    assert fields["cpu_capability"] == "AVX512"
    assert fields["hardware"].startswith("cpu (")  # as before: reports group by it


def test_cpu_model_reads_the_model_name_line(monkeypatch, tmp_path):
    from pe_bench import records

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD  EPYC\n")
    real = Path

    def fake_path(*args):
        return cpuinfo if args == ("/proc/cpuinfo",) else real(*args)

    records.cpu_model.cache_clear()
    monkeypatch.setattr(records, "Path", fake_path)
    try:
        assert records.cpu_model() == "AMD EPYC"
    finally:
        records.cpu_model.cache_clear()


def test_a_cpu_s_thread_count_is_singular_for_one(monkeypatch):
    import torch

    from pe_bench.records import device_name

    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert device_name(torch.device("cpu")).endswith(", 1 thread)")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert device_name(torch.device("cpu")).endswith(", 2 threads)")
