"""The cost table: throughput, memory and parameters read from the records (medians over
seeds), the hardware named, and what the records lack said rather than made up."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from pe_bench.provenance import device_name
from pe_bench.report import cost
from pe_bench.report.build import build_report
from tests.helpers import prepared, record, write_runs


def costly(scheme: str, seed: int, length: int, time_s: float, mem: float, **fields) -> dict:
    fields = {"train_time_s": 2.0 + seed, "pe_params": 8, **fields}
    return record(scheme, seed, length, 1.0, time_s=time_s, peak_mem_mb=mem, **fields)


def rows() -> list[dict]:
    """alibi: 3 seeds with training times 2, 3, 4 s (192 tokens each) and evaluation times
    0.5/1.0/2.0 s at 16 and 1, 2, 4 s at 32 (256 tokens); rope: one seed and its pi variant."""
    found = []
    for seed, (short, long) in enumerate([(0.5, 1.0), (1.0, 2.0), (2.0, 4.0)]):
        found += [
            costly("alibi", seed, 16, short, 600.0 + seed),
            costly("alibi", seed, 32, long, 700.0 + seed),
        ]
    found += [costly("rope", 0, 16, 0.25, 500.0, pe_params=0), costly("rope", 0, 32, 0.5, 550.0)]
    found += [costly("rope", 0, 32, 0.4, 560.0, variant="pi", pe_params=0)]
    return found


def test_costs_are_medians_of_what_the_records_hold():
    table = cost.cost_table(prepared(rows())).set_index("label")
    alibi = table.loc["alibi"]
    assert alibi["n"] == 3
    assert alibi["train_tokens_per_s"] == pytest.approx(192 / 3.0)  # median of 192/2, /3, /4
    assert alibi[f"{cost.EVAL_PREFIX}16"] == pytest.approx(256 / 1.0)
    assert alibi[f"{cost.EVAL_PREFIX}32"] == pytest.approx(256 / 2.0)
    assert alibi["peak_mem_mb"] == 701.0  # the most of any length, median over seeds
    assert alibi["pe_params"] == 8 and alibi["params"] == 1000
    assert list(table.index) == ["rope", "rope+pi", "alibi"]  # the report's label order
    assert pd.isna(table.loc["rope+pi", f"{cost.EVAL_PREFIX}16"])
    assert table.loc["rope+pi", "train_tokens_per_s"] == pytest.approx(96.0)  # its checkpoint's


def test_a_task_column_no_perplexity_record_fills_leaves_every_row():
    """A pretrained run's RULER records, read with its perplexity ones, leave a ``task`` column
    that is empty on every perplexity record: the table grouped by it and had no row."""
    table = cost.cost_table(prepared(rows()).assign(task=None))
    assert list(table["label"]) == ["rope", "rope+pi", "alibi"] and "task" not in table
    assert table.set_index("label").loc["alibi", "n"] == 3


def test_the_notes_name_the_hardware_and_what_is_missing():
    df = prepared([{k: v for k, v in r.items() if k != "peak_mem_mb"} for r in rows()])
    table = cost.cost_table(df)
    assert "peak_mem_mb" not in table
    notes = " ".join(cost.cost_notes(df, table))
    assert "Measured on cpu (x86_64, 2 threads), device cpu, torch 2.13.0: one" in notes
    assert "Not in the records, so not shown: peak memory (`peak_mem_mb`)." in notes
    assert "eval-time variant" in notes
    assert "fine-tuning" not in notes  # nothing is fine-tuned: its absence is no gap


def test_records_from_two_machines_are_said_to_be(tmp_path):
    found = rows()
    for r in found:
        if r["scheme"] == "rope":
            r["hardware"] = "NVIDIA H100 80GB HBM3"
    notes = cost.cost_notes(prepared(found), cost.cost_table(prepared(found)))
    assert "The records come from 2 machines" in " ".join(notes)


def test_one_thread_count_on_two_cpu_models_is_two_machines():
    """Records that differ only by CPU model (an AMD EPYC seed beside an Intel Xeon seed, as in
    results/mqar_cpu) are two machines: their hardware strings alone read as one."""
    found = rows()
    for r in found:
        r["cpu_model"] = "AMD EPYC" if r["seed"] == 0 else "Intel(R) Xeon(R) Processor"
    notes = " ".join(cost.cost_notes(prepared(found), cost.cost_table(prepared(found))))
    assert "The records come from 2 machines (thread count and CPU model)" in notes


def test_the_report_has_a_cost_section_and_table(tmp_path):
    write_runs(tmp_path, rows())
    build_report(tmp_path, echo=False)
    text = (tmp_path / "report.md").read_text()
    section = text.split("\n## Cost\n")[1].split("\n## ")[0]
    assert (
        "| scheme  | n | params | PE params | train tok/s | peak eval MB | eval 16 | eval 32 |"
        in (section)
    )
    assert (
        "| alibi   | 3 |  1,000 |         8 |          64 |          701 |     256 |     128 |"
        in (section)
    )
    saved = pd.read_csv(tmp_path / "tables" / "cost.csv")
    assert saved.loc[saved["label"] == "alibi", "train_tokens_per_s"].item() == pytest.approx(64.0)
    assert (tmp_path / "tables" / "cost.md").read_text().startswith("| scheme")


def test_one_thread_is_singular(tmp_path, monkeypatch):
    """Issue 41: reports said "1 threads"; records made before the fix still say it."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert device_name(torch.device("cpu")).endswith(", 1 thread)")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert device_name(torch.device("cpu")).endswith(", 2 threads)")
    found = [{**r, "hardware": "cpu (x86_64, 1 threads)"} for r in rows()]
    write_runs(tmp_path, found[:2])  # one trained model (alibi, seed 0)
    build_report(tmp_path, echo=False)
    text = (tmp_path / "report.md").read_text()
    assert "Measured on cpu (x86_64, 1 thread), device cpu" in text
    assert "1 threads" not in text
    assert text.split("\n\n")[1].startswith("1 trained model (alibi; seeds 0)")
