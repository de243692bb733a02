"""Records: loading every records file under a folder into a DataFrame, each bad one named."""

from __future__ import annotations

import pytest

from pe_bench.errors import UserError
from pe_bench.files import write_jsonl
from pe_bench.records import load_records


def test_load_records_from_nested_runs(tmp_path):
    write_jsonl(tmp_path / "pe=rope" / "records.jsonl", [{"scheme": "rope", "eval_len": 16}])
    write_jsonl(tmp_path / "pe=alibi" / "records.jsonl", [{"scheme": "alibi", "eval_len": 16}])
    df = load_records(tmp_path)
    assert sorted(df["scheme"]) == ["alibi", "rope"]


def test_no_records_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="no records under"):
        load_records(tmp_path)
    with pytest.raises(UserError, match="does not exist"):
        load_records(tmp_path / "nope")


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


def test_a_check_names_the_file_and_line(tmp_path):
    write_jsonl(tmp_path / "records.jsonl", [{"scheme": "rope"}, {"x": 1}])
    with pytest.raises(UserError, match=r"records.jsonl:2: lacks scheme"):
        load_records(tmp_path, lambda r: "" if "scheme" in r else "lacks scheme")
