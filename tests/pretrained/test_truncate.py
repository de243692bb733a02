"""The papers' perplexity protocol (pe_bench/pretrained/truncate.py): documents truncated to
the window, BOS first, every position scored, pinned to jquesnelle/yarn eval/perplexity.py
``compute_perplexity(..., truncate=True)``; per-document buckets of positions; the mode planned,
stored and reported for a pretrained model only."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

pytest.importorskip("transformers")

from pe_bench.errors import UserError
from pe_bench.pretrained import truncate
from pe_bench.stats import log_buckets

from .hf_helpers import tiny_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    folder = tiny_checkpoint("llama", tmp_path_factory.mktemp("tiny") / "llama", context=256)
    return AutoModelForCausalLM.from_pretrained(folder).eval()


def yarn_truncated_perplexity(model, docs: list[list[int]], max_length: int, bos: int | None):
    """jquesnelle/yarn eval/perplexity.py ``compute_perplexity`` with ``truncate=True`` (MIT),
    its loop as written there for documents ``docs`` (``add_start_token`` when ``bos``):
    truncate each to ``max_length - 1`` tokens (``max_length`` without BOS), put BOS first,
    take HF's loss over the window, and return exp of the mean over documents."""
    add_start_token = bos is not None
    max_tokenized_len = max_length - 1 if add_start_token else max_length
    encoded_texts = [x[0:max_tokenized_len] for x in docs]
    sliding_window = max_tokenized_len
    nlls = []
    for encoding_index in range(0, len(encoded_texts)):
        labels = torch.tensor(encoded_texts[encoding_index : encoding_index + 1])
        seq_len = labels.size(1)
        prev_end_loc = 0
        for begin_loc in range(0, seq_len, sliding_window):
            end_loc = min(begin_loc + max_tokenized_len, seq_len)
            trg_len = end_loc - prev_end_loc
            input_ids = labels[:, begin_loc:end_loc]
            if add_start_token:
                bos_tokens_tensor = torch.tensor([[bos]] * input_ids.size(dim=0))
                input_ids = torch.cat([bos_tokens_tensor, input_ids], dim=1)
            target_ids = input_ids.clone()
            target_ids[:, :-trg_len] = -100
            with torch.no_grad():
                nlls.append(model(input_ids, labels=target_ids).loss)
            prev_end_loc = end_loc
            if end_loc == seq_len:
                break
    return float(torch.exp(torch.stack(nlls).mean()))


class Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(input_ids=x).logits


@pytest.mark.parametrize("bos", [0, None])
@pytest.mark.parametrize("length", [16, 40, 64])
def test_the_perplexity_is_yarns_truncate(tiny, bos, length):
    torch.manual_seed(0)
    documents, doc_len = 3, 64
    ids = torch.randint(1, 290, (documents * doc_len + 1,))
    docs = ids[: documents * doc_len].view(documents, doc_len).tolist()
    theirs = yarn_truncated_perplexity(tiny, docs, length, bos)
    ours, buckets = truncate.score_truncated(
        Logits(tiny), ids, documents, doc_len, length, bos, 10_000, torch.device("cpu")
    )
    assert ours.tokens == documents * (length - 1)
    assert math.exp(ours.nll) == pytest.approx(theirs, rel=1e-5)
    assert ours.position_count.tolist() == [documents] * (length - 1) + [0]
    assert len(buckets) == documents and len(buckets[0]) == len(log_buckets(length)) - 1


def test_windows_put_bos_first_and_cut_every_document_to_the_window():
    ids = torch.arange(1, 31)
    x = truncate.windows(ids, 3, 10, 4, bos=0)
    assert x.tolist() == [[0, 1, 2, 3], [0, 11, 12, 13], [0, 21, 22, 23]]
    assert truncate.windows(ids, 3, 10, 4, bos=None).tolist()[1] == [11, 12, 13, 14]
    with pytest.raises(ValueError, match="window 11"):
        truncate.windows(ids, 3, 10, 11, bos=0)


def test_bucket_means_average_each_bucket_of_positions():
    nll = torch.arange(7, dtype=torch.float64).unsqueeze(0)  # positions 1..7 of a window of 8
    edges = log_buckets(8).tolist()
    assert edges == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert truncate.bucket_means(nll, 8) == [[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, None]]


def test_scored_bytes_are_the_scored_tokens_own():
    byte_ends = torch.tensor([2, 5, 6, 10, 11, 15, 16, 20])  # 8 tokens; their bytes 2,3,1,4,...
    own = torch.diff(byte_ends, prepend=torch.tensor([0])).tolist()
    # two documents of 4 tokens, window 3: with BOS tokens 0-1 and 4-5; without, 1-2 and 5-6
    assert truncate.scored_bytes(byte_ends, 0, 2, 4, 3, bos=0) == sum(own[0:2] + own[4:6])
    assert truncate.scored_bytes(byte_ends, 0, 2, 4, 3, bos=None) == sum(own[1:3] + own[5:7])


def test_truncate_is_refused_for_a_trained_model():
    from ..helpers import compose

    with pytest.raises(UserError, match="eval.modes: truncate .* is for model=hf"):
        from pe_bench.run.config import RunConfig
        from pe_bench.run.plan import plan

        plan(RunConfig.parse(compose("eval.modes=[truncate]")))


@pytest.mark.slow  # about 15 s: a tiny checkpoint, two modes, one variant
def test_truncate_is_planned_stored_and_reported_with_position_intervals(tmp_path):
    from pe_bench.cli import bench as cli
    from pe_bench.files import read_jsonl
    from pe_bench.records import POSITIONS
    from pe_bench.report.build import build_report
    from pe_bench.report.inputs import Options

    from ..helpers import compose

    folder = tiny_checkpoint("llama", tmp_path / "model", context=64)
    cfg = compose(
        "model=hf",
        f"model.name={folder}",
        "model.test_slices=2",
        "model.passkey=null",
        "eval.factors=[1,2]",
        "eval.modes=[tail,truncate]",
        "eval.stride=32",
        "eval.tokens=64",
        "+eval.documents=3",
        "eval.variants=null",
    )
    out = tmp_path / "job"
    records = cli.run(cfg, out)
    cut = [r for r in records if r["mode"] == "truncate"]
    assert sorted((r["test_slice"], r["eval_len"]) for r in cut) == [
        (0, 64), (0, 128), (1, 64), (1, 128)
    ]  # fmt: skip
    assert all(r["documents"] == 3 and r["scored"] == 3 * (r["eval_len"] - 1) for r in cut)
    assert {r["mode"] for r in records} == {"tail", "truncate"}
    rows = [r for r in read_jsonl(out / POSITIONS) if r["mode"] == "truncate"]
    assert all(len(r["window_loss"]) == 3 for r in rows)
    report = build_report(out, echo=False, options=Options(mode="truncate"))
    bands = pd.read_csv(out / "figures" / "position_loss_windows.csv")
    assert set(bands["windows"]) == {6}  # 3 documents x 2 slices, pooled
    assert (bands["ci_low"] <= bands["loss"]).all() and (bands["loss"] <= bands["ci_high"]).all()
    assert "truncate" in report.path.read_text()
