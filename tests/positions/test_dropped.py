"""DroPE: RoPE dropped (no rotation, the authors' cos = 1, sin = 0) from a rope checkpoint and
recalibrated through the fine-tuning stage; the recalibrated model is evaluated unrotated."""

from __future__ import annotations

import pytest
import torch

from pe_bench.cli import bench
from pe_bench.conformance import assert_conforms
from pe_bench.data.corpus import eval_stream, load_corpus
from pe_bench.errors import UserError
from pe_bench.model.attention import attention_path
from pe_bench.model.gpt import ModelConfig, build_model
from pe_bench.positions import build_scheme
from pe_bench.positions.rotary import apply_rotary
from pe_bench.run.evaluate import score
from pe_bench.run.plan import plan

from ..helpers import tiny_model

DROPE = [
    "pe=rope",
    "+finetune@finetunes.drope=drope",
    "finetunes.drope.steps=3",
    "finetunes.drope.warmup_steps=1",
]


def test_drope_is_the_authors_identity_rotation_of_a_rope_checkpoint(dims):
    """SakanaAI/DroPE custom_models/attention.py: the RoPE module applied with cos = 1 and
    sin = 0 leaves q and k as they are, and nothing else changes."""
    drope = build_scheme({"name": "drope"}, dims)
    assert drope.variant_of == "rope" and attention_path(drope) == "causal"
    q, k, pos = torch.randn(2, 4, 20, 8), torch.randn(2, 4, 20, 8), torch.arange(20)
    nulled = apply_rotary(q, torch.zeros(20, 4))  # angle 0: the authors' cos = 1, sin = 0
    assert torch.equal(drope.transform_qk(q, k, pos, pos, 0)[0], nulled)
    assert torch.equal(drope.transform_qk(q, k, pos + 999, pos, 1)[1], k)


def test_a_dropped_rope_model_computes_what_the_same_weights_compute_without_positions():
    rope = tiny_model("rope")
    nope = build_model(
        ModelConfig(d_model=32, num_layers=2, num_heads=4, mlp_ratio=2), {"name": "nope"}, 16, 0
    )
    nope.load_state_dict(rope.state_dict())
    rope.pe = build_scheme({"name": "drope"}, rope.pe.dims)
    x = torch.randint(0, 256, (2, 40))
    with torch.no_grad():
        assert torch.equal(rope(x), nope.eval()(x))


def test_drope_is_not_trained_alone(tiny_config):
    with pytest.raises(UserError, match="pe=drope is an eval-time variant of rope"):
        plan(tiny_config("pe=drope"))


@pytest.mark.slow
def test_recalibration_runs_through_the_finetune_stage_and_is_scored_unrotated(
    tiny_config, tmp_path
):
    """pe=rope +finetune@finetunes.drope=drope: rope's records, then rope:drope's, from a copy
    fine-tuned at the training length (factor 1) with drope; those records are what the
    recalibrated weights score with no rotation, and not what they score with RoPE."""
    rows = bench.run(tiny_config(*DROPE), tmp_path)
    tuned = [r for r in rows if r.get("finetune") == "drope"]
    assert [r["eval_len"] for r in tuned] == [16, 32, 64]
    first = tuned[0]
    assert (first["finetune_pe"], first["finetune_len"], first["finetune_steps"]) == (
        "drope",
        16,
        3,
    )
    assert "no QK norm" in first["caveat"] and "caveat" not in rows[0]
    job = plan(tiny_config(*DROPE))
    corpus = load_corpus(job.cfg.data)
    stream = eval_stream(corpus, job.n_targets)
    state = torch.load(tmp_path / "checkpoint-drope.pt", weights_only=False)["model"]
    for scheme, same in (("drope", True), ("rope", False)):
        model = job.build_model(corpus.tokenizer.vocab_size)
        model.pe = build_scheme({"name": scheme}, model.pe.dims)
        model.load_state_dict(state)
        for row in tuned:
            nll = score(model, stream, row["eval_len"]).nll
            assert (abs(nll - row["nll"]) < 1e-12) == same, (scheme, row["eval_len"], nll)


def test_drope_conforms():
    assert assert_conforms("drope").passed
