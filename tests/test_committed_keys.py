"""The committed records under the key of their scheme's code (experiments/migrate_keys.py):
every one is fresh for today's code, and a sample recomputed with today's code gives the
stored numbers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from pe_bench.cli import bench
from pe_bench.files import read_jsonl
from pe_bench.positions import load_plugin, options_label
from pe_bench.records import RECORDS
from pe_bench.run.store import BYTES, RunStore

ROOT = Path(__file__).parents[1]
RESULTS = ROOT / "results"
# The cheapest committed job (flip-flop, d_model 64, 600 steps: 15 s on one thread), made at
# 2a615fa (GENERATOR_VERSION 2) on one thread under today's key.
SAMPLE = RESULTS / "tasks_quick" / "pe=sinusoidal,task=flip_flop"
RTOL = 1e-3  # records differ by up to 8e-4 across CPU types


def migrate_keys():
    """experiments/migrate_keys.py as a module (it is a script, not part of the package)."""
    path = ROOT / "experiments" / "migrate_keys.py"
    spec = importlib.util.spec_from_file_location("migrate_keys", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Committed folders known to be stale, the only ones allowed, each with the command that
# refreshes it: b0242d0 rewrote pretrained/windowed.py and rope.py (DCA, StreamingLLM,
# LM-Infinite, STRING), and migrate_keys cannot prove a pretrained pipeline's numbers unchanged.
# (yarn_paper_mini was rerun under today's code.)
AWAITING_RERUN: dict[str, str] = {}


@pytest.mark.slow  # 10 s: a plan for each of the ~200 committed job folders
def test_every_committed_record_is_fresh_for_todays_code(example_plugin):
    """A run of any committed job folder but AWAITING_RERUN's would find all its records: each
    carries the key today's code gives its config, the scheme's, each variant's and each
    fine-tune's (the placed plugin's, results/quick_place_my_pe, imported from examples/my_pe)."""
    folder_of = migrate_keys().Folder
    stale = []
    for path in sorted(RESULTS.glob("**/records.jsonl")):
        folder = folder_of(path.parent)
        store = RunStore(
            path.parent,
            sorted({r["run_id"] for r in folder.records}),
            folder.records[0]["corpus_sha"],
            fresh=False,
            writer=False,
            variants={key: digest for key, (digest, _) in folder.variants.items()},
            pe_source=folder.pe_source,
            tokenizer_sha=folder.records[0].get("tokenizer_sha", BYTES),
            variant_sources={key: source for key, (_, source) in folder.variants.items()},
            finetune_sources=folder.finetune_sources,
        )
        if len(store.records) != len(folder.records):
            stale.append(path.parent.relative_to(RESULTS).as_posix())
    # code that computes numbers changed: experiments/migrate_keys.py gives the records
    # today's key where it proves their numbers unchanged (a new function in pretrained/ is);
    # a folder rerun must leave AWAITING_RERUN too
    assert sorted(stale) == sorted(AWAITING_RERUN), (
        "stale: run python experiments/migrate_keys.py (its docstring says why)"
    )


@pytest.mark.slow  # 30 s on a loaded core: every committed record
def test_every_committed_record_is_labelled_as_its_config_is_today(example_plugin):
    """Each record's ``pe_options`` (the options its label shows) are what today's code gives
    its folder's config.yaml: a default edited since (bipe's separators) is followed by
    experiments/migrate_keys.py, or a report would label one configuration two ways."""
    wrong = []
    for path in sorted(RESULTS.glob("**/records.jsonl")):
        cfg = OmegaConf.to_container(OmegaConf.load(path.parent / "config.yaml"), resolve=True)
        if cfg["model"].get("source") == "hf":  # a pretrained model: no scheme options
            continue
        if cfg["pe"].get("plugin"):
            load_plugin(cfg["pe"]["plugin"])
        found = {r.get("pe_options", "") for r in read_jsonl(path)}
        if found != {options_label(cfg["pe"])}:
            wrong.append(f"{path.parent.relative_to(RESULTS)}: {sorted(found)}")
    assert not wrong, "run python experiments/migrate_keys.py"


@pytest.mark.slow  # 15 s
def test_a_committed_record_recomputed_by_todays_code_gives_its_numbers(tmp_path):
    """The sample job trained and evaluated again from its config.yaml: the same numbers
    (within ``RTOL``, which allows another CPU type) under the same key."""
    stored = read_jsonl(SAMPLE / RECORDS)
    cfg = OmegaConf.load(SAMPLE / "config.yaml")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        again = {(r["variant"], r["eval_len"], r["mode"]): r for r in bench.run(cfg, tmp_path)}
    finally:
        torch.set_num_threads(threads)
    assert len(again) == len(stored) and {r["git_sha"][:7] for r in stored} == {"2a615fa"}
    for old in stored:
        new = again[(old["variant"], old["eval_len"], old["mode"])]
        assert new["pe_source"] == old["pe_source"]
        for field in ("answer_nll", "token_acc", "exact_match", "final_train_loss"):
            assert new[field] == pytest.approx(old[field], rel=RTOL), (old["eval_len"], field)
