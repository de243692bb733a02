"""Every RoPE family users load, offline on a tiny random checkpoint of each
(tests/pretrained/hf_helpers.py ``FAMILIES``: Llama, Mistral, Qwen2, Qwen3, Gemma 3, Phi-3, OLMo 2,
GPT-NeoX): it loads, and every eval-time variant patches it. The methods HF has a rope type
for give the logits of HF's own ``rope_parameters`` on the same checkpoint; static NTK and
NTK-by-parts those of HF's equivalents (``dynamic`` at factor 1, ``yarn`` without its
attention factor); log-n changes only the queries past the context; the windowed variants
(ReRoPE, leaky ReRoPE, Self-Extend, DCA, StreamingLLM, LM-Infinite, STRING) give the logits of
the whole-matrix references of tests/pretrained/test_windowed.py, cached decoding included.

What sets the families apart, and what it does to the patch: Qwen3's and OLMo 2's RMSNorm of
q and k runs before the rotation, so the patched rotation (or the identity a windowed variant
gets) follows it as in the model; Phi-3 (0.75 here, as Phi-4-mini) and GPT-NeoX rotate part of
each head, which the rotary spec reads; Gemma 3's sliding layers have a rope of their own and
never see a key past their window, so the variants change the full-attention layers' rope
only, as HF's per-layer-type ``rope_parameters`` do. Gemma 2 soft-caps its attention logits,
which pe-bench's attention does not compute: refused in one line."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from pe_bench.errors import UserError
from pe_bench.pretrained import load, rope
from pe_bench.pretrained.load import load_config
from pe_bench.run.config import PretrainedConfig
from tests.helpers import fast_lane
from tests.pretrained.hf_helpers import CONTEXT, FAMILIES, tiny_checkpoint
from tests.pretrained.test_hf import ATOL, HF_VARIANTS, LENGTH, RTOL, logits, tokens, variant
from tests.pretrained.test_windowed import VARIANTS as WINDOWED
from tests.pretrained.test_windowed import reference_logits

SAMPLE = ["llama", "gemma3"]  # the fast lane's families: the plainest and the most apart
# The windowed settings run on every family: the defaults, and ones that make the far
# branches matter at 4x the tiny context.
WINDOWED_HERE = [
    "rerope_plain",
    "leaky_rerope",
    "self_extend",
    "dca",
    "streaming_llm",
    "lm_infinite",
    "string",
]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory) -> dict[str, tuple[torch.nn.Module, rope.RopeSpec]]:
    root = tmp_path_factory.mktemp("families")
    out = {}
    for arch in FAMILIES:
        folder = str(tiny_checkpoint(arch, root / arch))
        model = load.load_model(PretrainedConfig(name=folder), torch.device("cpu"))
        out[arch] = (model, rope.rope_spec(model.config, None, folder))
    return out


def changed(ours: torch.Tensor, plain: torch.Tensor) -> bool:
    return bool((ours - plain).abs().max() > 100 * ATOL)


@pytest.mark.parametrize("arch", FAMILIES)
def test_each_family_loads_with_its_rotary_spec(loaded, arch):
    model, spec = loaded[arch]
    head_dim = {"gpt_neox": 8, "phi3": 12}.get(arch, 16)  # partial rotary: 0.5, 0.75 of 16
    assert (spec.dims.head_dim, spec.dims.train_len) == (head_dim, CONTEXT)
    assert spec.layer_type == ("full_attention" if arch == "gemma3" else None)
    assert len(rope.rotary_modules(model)) == 1
    assert torch.isfinite(logits(model, tokens(model))).all()


@pytest.mark.parametrize("arch", fast_lane(list(FAMILIES), SAMPLE))
def test_hf_rope_types_give_hfs_own_logits(loaded, arch):
    model, spec = loaded[arch]
    x = tokens(model)
    plain = logits(model, x)
    for name, cfg in HF_VARIANTS.items():
        v = variant(spec, cfg)
        ours = logits(model, x, v, spec, "pe_bench")
        torch.testing.assert_close(
            ours, logits(model, x, v, spec, "hf"), atol=ATOL, rtol=RTOL, msg=name
        )
        assert changed(ours, plain), name


@pytest.mark.parametrize("arch", fast_lane(list(FAMILIES), SAMPLE))
def test_hook_only_variants_give_their_hf_equivalents(loaded, arch):
    model, spec = loaded[arch]
    x = tokens(model)
    ntk = logits(model, x, variant(spec, {"name": "ntk"}), spec)
    dynamic = variant(spec, {"name": "dynamic_ntk", "factor": 1.0})
    torch.testing.assert_close(ntk, logits(model, x, dynamic, spec, "hf"), atol=ATOL, rtol=RTOL)
    by_parts = logits(model, x, variant(spec, {"name": "ntk_by_parts"}), spec)
    params = {
        **spec.params,
        "rope_type": "yarn",
        "factor": LENGTH / CONTEXT,
        "original_max_position_embeddings": CONTEXT,
        "attention_factor": 1.0,
    }
    if spec.layer_type is not None:
        params = {**model.config.rope_parameters, spec.layer_type: params}
    with torch.no_grad(), rope.hf_rope(model, params, CONTEXT):
        yarn = model(input_ids=x).logits
    torch.testing.assert_close(by_parts, yarn, atol=ATOL, rtol=RTOL)
    plain = logits(model, x)
    logn = logits(model, x, variant(spec, {"name": "logn"}), spec)
    torch.testing.assert_close(logn[:, :CONTEXT], plain[:, :CONTEXT])
    assert (logn[:, CONTEXT:] - plain[:, CONTEXT:]).abs().amax(dim=(0, 2)).min() > 100 * ATOL


@pytest.mark.parametrize("arch", fast_lane(list(FAMILIES), SAMPLE))
def test_windowed_variants_give_the_whole_matrix_references_logits(loaded, arch):
    model, spec = loaded[arch]
    x = tokens(model)
    plain = logits(model, x)
    for name in WINDOWED_HERE:
        cfg = WINDOWED[name]
        ours = logits(model, x, variant(spec, cfg), spec)
        theirs = reference_logits(model, spec, cfg, x)
        torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=RTOL, msg=name)
        assert changed(ours, plain), name


@pytest.mark.parametrize("arch", fast_lane(list(FAMILIES), SAMPLE))
def test_cached_decoding_of_a_windowed_variant_is_the_whole_sequences(loaded, arch):
    """DCA in its paper's form (no mscale, which grows with the keys a step sees): the last
    token after a cached prefix gets the whole sequence's logits (Gemma 3's sliding layers
    decode through their own cache as pretrained)."""
    model, spec = loaded[arch]
    x = tokens(model)[:1]
    v = variant(spec, WINDOWED["dca_paper"])
    with torch.no_grad(), rope.rope_variant(model, v, spec, x.shape[1], "pe_bench"):
        whole = model(input_ids=x).logits[:, -1]
        prefix = model(input_ids=x[:, :-1], use_cache=True)
        step = model(input_ids=x[:, -1:], past_key_values=prefix.past_key_values, use_cache=True)
    torch.testing.assert_close(step.logits[:, -1], whole, atol=ATOL, rtol=RTOL)


def test_gemma3_variants_change_the_full_attention_layers_rope_only(loaded):
    """The sliding layers' rotary output and attention stay the pretrained model's; the
    full-attention layers get the variant (frequencies, or the windowed attention)."""
    model, spec = loaded["gemma3"]
    (_, _, rotary) = rope.rotary_modules(model)[0]
    x = torch.zeros(1, 8, 32)
    positions = torch.arange(8)[None]
    sliding = rotary(x, positions, "sliding_attention")
    full = rotary(x, positions, "full_attention")
    for cfg in ({"name": "yarn"}, {"name": "dca"}):
        with rope.rope_variant(model, variant(spec, cfg), spec, LENGTH, "pe_bench"):
            for got, want in zip(rotary(x, positions, "sliding_attention"), sliding, strict=True):
                torch.testing.assert_close(got, want, atol=0, rtol=0)
            assert not torch.equal(rotary(x, positions, "full_attention")[1], full[1])
            marked = [m.layer_type for m in model.modules() if hasattr(m, rope.WINDOWED_ATTR)]
            assert marked == ([] if cfg["name"] == "yarn" else ["full_attention"])


def test_gemma2_is_refused_in_one_line(tmp_path):
    folder = tiny_checkpoint("gemma2", tmp_path / "gemma2")
    with pytest.raises(UserError) as caught:
        rope.rope_spec(load_config(PretrainedConfig(name=str(folder))), None, "tiny-gemma2")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("tiny-gemma2 (gemma2) soft-caps its attention logits")
