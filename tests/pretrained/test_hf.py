"""Pretrained HF models (pe_bench/pretrained/), offline: tiny random-weight checkpoints of three
families. The central claim: a RoPE variant gives the same logits through HF's rope_parameters
as through pe-bench's frequencies, within ``ATOL`` + ``RTOL`` x |logit|."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")

from pe_bench.cli import bench
from pe_bench.errors import UserError
from pe_bench.files import read_jsonl
from pe_bench.positions import register
from pe_bench.positions.rotary import RoPE
from pe_bench.pretrained import key, load, rope
from pe_bench.records import RECORDS
from pe_bench.report.build import build_report
from pe_bench.run.config import ROPE_IMPLS, PretrainedConfig, RunConfig
from pe_bench.run.evaluate import EvalConfig
from tests.helpers import compose
from tests.pretrained.hf_helpers import ARCHS, CONTEXT, tiny_checkpoint

# The stated tolerance of "the same logits": float32 frequencies computed two ways (HF's
# float32 powers, pe-bench's float64 ones rounded) differ by an ulp, which moves the angles
# at position 128 by ~1e-5 rad; the logits, of size ~10 here, agree to ~2e-5.
ATOL, RTOL = 1e-4, 1e-5
LENGTH = 4 * CONTEXT  # the evaluated context: 4x the pretraining context
HF_VARIANTS = {  # the methods Hugging Face has a rope_type for
    "pi": {"name": "pi"},
    "dynamic_ntk": {"name": "dynamic_ntk", "factor": 2.0},
    "yarn": {"name": "yarn"},
    "yarn_static": {"name": "yarn", "factor": 8.0, "beta_fast": 16.0},
    "llama3": {"name": "llama3"},
    "longrope": {"name": "longrope"},
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("hf")
    return {arch: str(tiny_checkpoint(arch, root / arch)) for arch in ARCHS}


@pytest.fixture(scope="module")
def loaded(checkpoints) -> dict[str, tuple[torch.nn.Module, rope.RopeSpec]]:
    out = {}
    for arch, folder in checkpoints.items():
        model = load.load_model(PretrainedConfig(name=folder), torch.device("cpu"))
        out[arch] = (model, rope.rope_spec(model.config, None, folder))
    return out


def variant(spec: rope.RopeSpec, cfg: dict) -> rope.Variant:
    (built,) = rope.build_variants(EvalConfig(variants={"v": cfg}), spec)
    return built


def logits(model, x, variant=None, spec=None, impl="pe_bench") -> torch.Tensor:
    with torch.no_grad(), rope.rope_variant(model, variant, spec, x.shape[1], impl) as used:
        out = model(input_ids=x).logits
    assert used == ("none" if variant is None else impl)
    return out


def tokens(model, length: int = LENGTH) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, model.config.vocab_size, (2, length), generator=generator)


@pytest.mark.parametrize("name", list(HF_VARIANTS))
@pytest.mark.parametrize("arch", ARCHS)
def test_hf_rope_type_and_pe_bench_frequencies_give_the_same_logits(loaded, arch, name):
    model, spec = loaded[arch]
    x = tokens(model)
    v = variant(spec, HF_VARIANTS[name])
    ours = logits(model, x, v, spec, "pe_bench")
    theirs = logits(model, x, v, spec, "hf")
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=RTOL)
    plain = logits(model, x)
    assert (ours - plain).abs().max() > 100 * ATOL  # the variant changed something


@pytest.mark.parametrize("arch", ARCHS)
def test_static_ntk_through_the_hook_equals_hf_dynamic_at_factor_1(loaded, arch):
    """HF has no static NTK; its dynamic NTK at factor 1 and context L is NTK at s = L / L_train."""
    model, spec = loaded[arch]
    x = tokens(model)
    ours = logits(model, x, variant(spec, {"name": "ntk"}), spec)
    dynamic = variant(spec, {"name": "dynamic_ntk", "factor": 1.0})
    torch.testing.assert_close(ours, logits(model, x, dynamic, spec, "hf"), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("arch", ARCHS)
def test_ntk_by_parts_through_the_hook_equals_hf_yarn_without_its_attention_factor(loaded, arch):
    model, spec = loaded[arch]
    x = tokens(model)
    ours = logits(model, x, variant(spec, {"name": "ntk_by_parts"}), spec)
    params = {
        **spec.params,
        "rope_type": "yarn",
        "factor": LENGTH / CONTEXT,
        "original_max_position_embeddings": CONTEXT,
        "attention_factor": 1.0,
    }
    with torch.no_grad(), rope.hf_rope(model, params, CONTEXT):
        theirs = model(input_ids=x).logits
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("arch", ARCHS)
def test_logn_scales_only_the_queries_past_the_pretraining_context(loaded, arch):
    """log-n multiplies the logits of the query at 1-based position p by max(1, ln p /
    ln L_train): up to L_train nothing changes (causal attention: neither do those positions'
    outputs in a longer window); past it every position changes."""
    model, spec = loaded[arch]
    logn = variant(spec, {"name": "logn"})
    short = tokens(model, CONTEXT)
    torch.testing.assert_close(logits(model, short, logn, spec), logits(model, short))
    x = tokens(model)
    ours, plain = logits(model, x, logn, spec), logits(model, x)
    torch.testing.assert_close(ours[:, :CONTEXT], plain[:, :CONTEXT])
    changed = (ours[:, CONTEXT:] - plain[:, CONTEXT:]).abs().amax(dim=(0, 2))
    assert (changed > 100 * ATOL).all()


def test_a_variant_is_undone_after_use(loaded):
    model, spec = loaded["llama"]
    x = tokens(model)
    before = logits(model, x)
    for name in ("yarn", "pi"):
        for impl in ROPE_IMPLS:
            logits(model, x, variant(spec, HF_VARIANTS[name]), spec, impl)
    logits(model, x, variant(spec, {"name": "logn"}), spec)
    assert torch.equal(logits(model, x), before)


def test_the_rope_spec_reads_partial_rotary_dims_base_and_context(loaded):
    spec = loaded["gpt_neox"][1]
    assert (spec.dims.head_dim, spec.dims.train_len, spec.theta) == (8, CONTEXT, 10000.0)
    assert loaded["llama"][1].dims.head_dim == 16
    assert rope.rope_spec(loaded["llama"][0].config, 24, "x").dims.train_len == 24


def test_variants_take_the_models_base_and_refuse_what_the_rotary_patch_cannot_carry(loaded):
    spec = loaded["llama"][1]
    assert variant(spec, {"name": "pi", "base": 10000.0}).scheme.base == spec.theta

    @register("test_hf_rotates_otherwise")
    class RotatesOtherwise(RoPE):
        variant_of = "rope"

        def rotate(self, q, k, q_pos, k_pos, layer):
            return q, k

    with pytest.raises(UserError, match="not a RoPE variant of frequencies"):
        variant(spec, {"name": "test_hf_rotates_otherwise"})
    with pytest.raises(UserError, match="not a RoPE variant"):
        variant(spec, {"name": "alibi"})


def test_a_model_that_already_scales_its_rope_is_refused(loaded):
    config = loaded["llama"][0].config
    scaled = type(config).from_dict(config.to_dict())
    scaled.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    with pytest.raises(UserError, match="already scales its RoPE"):
        rope.rope_spec(scaled, None, "scaled")


def test_bits_per_byte_counts_the_scored_targets_own_bytes(checkpoints):
    auto = load.load_tokenizer(PretrainedConfig(name=checkpoints["llama"]))
    tokenizer = load.corpus_tokenizer(auto, checkpoints["llama"])
    text = "The pass key is 42. Ünïcödé — 🙂 and more text.\n" * 3
    stream = load.encode(tokenizer, text)
    assert stream.ids.tolist() == auto(text, add_special_tokens=False)["input_ids"]
    assert int(stream.byte_ends[-1]) == len(text.encode())
    # the targets after token 0 up to the last: every byte but the first token's
    first = len(auto.decode(stream.ids[:1]).encode())
    assert stream.target_bytes(0, len(stream.ids) - 1) == len(text.encode()) - first
    prefix = load.encode_prefix(tokenizer, text.encode(), 10, "test")
    assert prefix.ids.tolist() == stream.ids[:10].tolist()
    fields = load.tokenizer_fields(tokenizer)
    assert fields["tokenizer"] == f"hf:{checkpoints['llama']}" and fields["tokenizer_vocab"] == 300


def test_an_unknown_model_offline_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # the hub reads the variable once, at import: an earlier test may have imported it
    monkeypatch.setattr(pytest.importorskip("huggingface_hub").constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(UserError) as caught:
        load.load_config(PretrainedConfig(name="no-such-org/no-such-model-pe-bench"))
    message = str(caught.value)
    assert "\n" not in message and "no-such-org/no-such-model-pe-bench" in message


def test_model_hf_needs_a_name_and_a_known_rope_impl():
    with pytest.raises(UserError, match=r"model\.name"):
        RunConfig.parse(compose("model=hf"))
    with pytest.raises(UserError, match="rope_impl"):
        RunConfig.parse(compose("model=hf", "model.name=x", "model.rope_impl=magic"))


@pytest.mark.slow
def test_pe_bench_with_a_missing_network_says_one_line(tmp_path):
    """The command line, offline, with a name that is no folder: exit 2 and one line."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pe_bench.cli",
            "model=hf",
            "model.name=no-such-org/nothing",
            f"out_root={tmp_path}",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    lines = [line for line in done.stderr.splitlines() if line.startswith("pe-bench: error:")]
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1 and "no-such-org/nothing" in lines[0]
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_pretrained_model_is_evaluated_reported_and_cached(checkpoints, tmp_path):
    """bench.run on a tiny checkpoint: a record per slice, variant and length with bits per byte
    from the slice's target bytes, passkey records, a report with the passkey section, and a
    rerun that computes nothing."""
    cfg = compose(
        "model=hf",
        f"model.name={checkpoints['llama']}",
        "model.test_slices=2",
        "model.passkey.lengths=[160,192]",
        "model.passkey.trials=2",
        "eval.factors=[1,2]",
        "eval.tokens=256",
        "+pe@eval.variants.yarn=yarn",
    )
    out = tmp_path / "job"
    records = bench.run(cfg, out)
    text = [r for r in records if r["mode"] == "nonoverlap"]
    assert len(text) == 2 * 4 * 2  # test slices x (none, pi, ntk, yarn) x lengths
    assert {r["variant"] for r in text} == {"none", "pi", "ntk", "yarn"}
    for r in text:
        assert r["bpb"] == pytest.approx(r["nll"] * r["tokens"] / math.log(2) / r["target_bytes"])
        assert r["seed"] == r["test_slice"] and r["tokenizer"].startswith("hf:")
    keys = [r for r in records if r["mode"] == "passkey"]
    assert len(keys) == 4 * 2 and all(len(r["correct"]) == 2 for r in keys)
    assert all(r["prompt_tokens"][0] <= r["eval_len"] for r in keys)
    built = build_report(out, echo=False)
    text_md = built.path.read_text()
    assert "## Passkey retrieval" in text_md and (out / "figures" / "passkey.png").exists()
    lines = len(read_jsonl(out / RECORDS))
    assert bench.run(cfg, out) and len(read_jsonl(out / RECORDS)) == lines
    assert json.loads((out / RECORDS).read_text().splitlines()[0])["pretrained"] is True


@pytest.mark.slow  # 9 s: three evaluations of a tiny checkpoint saved twice
def test_weights_changed_in_place_are_evaluated_again(tmp_path, caplog):
    """Issue 29, item 4: a local model's weights replaced in place (make_tiny_hf.py rerun into
    its folder) served the old records, keyed on the folder's name; records now carry the
    key of the weights there (``weights_sha``), and others are recomputed."""
    caplog.set_level(logging.INFO)
    folder = tiny_checkpoint("llama", tmp_path / "model")
    cfg = compose(
        "model=hf",
        f"model.name={folder}",
        "model.test_slices=1",
        "model.passkey=null",
        "eval.factors=[1]",
        "eval.tokens=64",
        "eval.variants=null",
    )
    first = bench.run(cfg, tmp_path / "job")
    assert [r["weights_sha"] for r in first] == [
        key.weights_key(PretrainedConfig(name=str(folder)))
    ]
    assert bench.run(cfg, tmp_path / "job") == first  # the same weights: found
    tiny_checkpoint("llama", folder, seed=1)  # new weights, same folder
    again = bench.run(cfg, tmp_path / "job")
    assert "1 records stale, recomputed: weights_sha" in caplog.text
    assert again[0]["nll"] != first[0]["nll"] and again[0]["weights_sha"] != first[0]["weights_sha"]


def test_the_weights_key_is_the_files_bytes_or_the_hub_commit(tmp_path, monkeypatch):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "m" / ".cache").mkdir()  # a download's bookkeeping: not the model
    local = PretrainedConfig(name=str(tmp_path / "m"))
    before = key.weights_key(local)
    (tmp_path / "m" / ".cache" / "x.lock").write_text("")
    assert key.weights_key(local) == before
    (tmp_path / "m" / "model.safetensors").write_bytes(b"weightz")
    assert key.weights_key(local) != before
    hub = type("Config", (), {"_commit_hash": "abc123"})()
    monkeypatch.setattr(load, "load_config", lambda cfg: hub)
    assert key.weights_key(PretrainedConfig(name="org/model", revision="v1")) == "commit:abc123"
