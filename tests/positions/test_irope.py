"""Llama 4's iRoPE (``irope``): RoPE layers that attend within chunks (or a sliding window),
NoPE layers with Llama 4's attention temperature. Pinned against HF transformers' own code:
its mask functions (``masking_utils``) and a ``Llama4TextAttention`` layer with the same
weights, whose outputs pe-bench's attention layer reproduces; then what the attention_mask
hook does in every path that computes attention weights."""

from __future__ import annotations

import math

import pytest
import torch

from pe_bench.conformance import assert_conforms
from pe_bench.errors import UserError
from pe_bench.model.attention import allowed_keys, causal_allowed, explicit_attention
from pe_bench.model.gpt import CausalSelfAttention, ForwardContext, ModelConfig
from pe_bench.positions import ModelDims, build_scheme
from pe_bench.positions.fingerprint import class_key
from pe_bench.positions.rotary_zoo import IRoPE

DIMS = ModelDims(d_model=32, num_heads=4, head_dim=8, num_layers=4, train_len=16)
MODEL = ModelConfig(d_model=32, num_layers=4, num_heads=4, mlp_ratio=2)


def hf_config(chunk: int, floor_scale: int, interval: int = 4):
    """A 4-layer Llama 4 text config of pe-bench's test shape: heads 4 x 8, no QK norm,
    default RoPE at base 10000, eager attention."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Llama4TextConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=8,
        num_hidden_layers=4,
        intermediate_size=64,
        intermediate_size_mlp=64,
        vocab_size=64,
        use_qk_norm=False,
        no_rope_layer_interval=interval,
        attention_chunk_size=chunk,
        floor_scale=floor_scale,
        attn_scale=0.1,
        attn_temperature_tuning=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        attention_bias=False,
    )
    config._attn_implementation = "eager"
    return config


def half_split(weight: torch.Tensor, head_dim: int) -> torch.Tensor:
    """q_proj or k_proj rows reordered from HF Llama 4's interleaved pairs (2i, 2i + 1) to
    pe-bench's half-split ones (i, i + h_d/2), head by head: the same q . k after rotation."""
    order = torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])
    heads = weight.shape[0] // head_dim
    index = (torch.arange(heads).unsqueeze(-1) * head_dim + order).flatten()
    return weight[index]


def hf_and_ours(config, layer: int, scheme: IRoPE, s: int):
    """HF's ``Llama4TextAttention`` for ``layer`` and its output on random hidden states, and
    pe-bench's attention layer with the same weights and its output."""
    from transformers.masking_utils import create_causal_mask, create_chunked_causal_mask
    from transformers.models.llama4.modeling_llama4 import (
        Llama4TextAttention,
        Llama4TextRotaryEmbedding,
    )

    torch.manual_seed(0)
    hf = Llama4TextAttention(config, layer).eval()
    x = torch.randn(2, s, 32)
    position_ids = torch.arange(s).unsqueeze(0)
    make = create_chunked_causal_mask if config.no_rope_layers[layer] else create_causal_mask
    mask = make(config=config, inputs_embeds=x, attention_mask=None, cache=None,
                position_ids=position_ids)  # fmt: skip
    freqs = Llama4TextRotaryEmbedding(config)(x, position_ids)
    with torch.no_grad():
        expected, _ = hf(x, position_embeddings=freqs, attention_mask=mask)
        ours = CausalSelfAttention(MODEL, layer)
        ours.qkv.weight.copy_(
            torch.cat(
                [
                    half_split(hf.q_proj.weight, 8),
                    half_split(hf.k_proj.weight, 8),
                    hf.v_proj.weight,
                ]
            )
        )
        ours.proj.weight.copy_(hf.o_proj.weight)
        got = ours(x, ForwardContext(scheme, torch.arange(s), flex=False, bias_cache=None))
    return expected, got


@pytest.mark.slow
@pytest.mark.parametrize("layer", [0, 3])
def test_irope_layers_equal_hf_llama4_attention(layer):
    """Layer 0 (RoPE, attention within chunks of 8) and layer 3 (NoPE, queries times the
    temperature, 1 + 0.1 ln 2 from position 7, 1 + 0.1 ln 5 at 39) of a 40-token window:
    pe-bench's attention layer gives HF ``Llama4TextAttention``'s output."""
    irope = build_scheme({"name": "irope", "window": 8}, DIMS)
    assert irope.floor_scale == 8.0 and irope.is_nope(3) and not irope.is_nope(0)
    expected, got = hf_and_ours(hf_config(chunk=8, floor_scale=8), layer, irope, 40)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_without_the_chunks_and_the_temperature_hf_and_irope_differ():
    """The pin above has teeth: the plain hybrid (global RoPE layers, no temperature) is not
    what HF's Llama 4 layer computes."""
    hybrid = build_scheme({"name": "rope_nope_hybrid"}, DIMS)
    config = hf_config(chunk=8, floor_scale=8)
    for layer in (0, 3):
        expected, got = hf_and_ours(config, layer, hybrid, 40)
        assert (got - expected).abs().max() > 1e-3


def test_irope_temperature_is_hfs_formula():
    """HF: log1p(floor((p + 1) / floor_scale)) * attn_scale + 1 on the NoPE layers' queries
    (none on the RoPE layers); Llama 4's floor_scale 8192 leaves p < 8191 at 1."""
    irope = build_scheme({"name": "irope", "floor_scale": 8192.0}, DIMS)
    pos = torch.tensor([0, 8190, 8191, 16383, 100_000])
    expected = [1.0, 1.0, 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(3), 1 + 0.1 * math.log(13)]
    assert irope.logit_scale(pos, pos, 3).tolist() == pytest.approx(expected, rel=1e-6)
    assert irope.logit_scale(pos, pos, 0) is None
    off = build_scheme({"name": "irope", "temperature_tuning": False}, DIMS)
    assert off.logit_scale(pos, pos, 3) is None


@pytest.mark.parametrize("rope_attention", ["chunked", "sliding"])
def test_irope_masks_equal_hfs_mask_functions(rope_attention):
    """RoPE layers: HF's ``chunked_causal_mask_function`` (``attention_chunk_size``) or
    ``sliding_window_causal_mask_function``; NoPE layers: the causal mask alone. Also for
    query chunks (the last s_q queries)."""
    pytest.importorskip("transformers")
    from transformers.masking_utils import (
        causal_mask_function,
        chunked_causal_mask_function,
        sliding_window_causal_mask_function,
    )

    irope = build_scheme({"name": "irope", "rope_attention": rope_attention, "window": 6}, DIMS)
    s, b, h = 27, torch.tensor(0), torch.tensor(0)
    q_idx, kv_idx = torch.arange(s).unsqueeze(-1), torch.arange(s)
    if rope_attention == "chunked":
        hf = chunked_causal_mask_function(6, torch.zeros(1, dtype=torch.long))
    else:
        hf = sliding_window_causal_mask_function(6)
    pos = torch.arange(s)
    assert torch.equal(allowed_keys(irope, pos, pos, 0), hf(b, h, q_idx, kv_idx))
    assert torch.equal(allowed_keys(irope, pos, pos, 3), causal_mask_function(b, h, q_idx, kv_idx))
    assert torch.equal(allowed_keys(irope, pos[-5:], pos, 0), hf(b, h, q_idx, kv_idx)[-5:])


def test_irope_defaults_follow_the_training_length():
    """window = floor_scale = L_train (Llama 4's config: both 8192): training windows are
    whole chunks, so the RoPE layers there are plain RoPE, and the temperature touches only
    the last position."""
    irope = build_scheme({"name": "irope"}, DIMS)
    assert (irope.window, irope.floor_scale, irope.attn_scale) == (16, 16.0, 0.1)
    assert (irope.nope_every, irope.rope_attention, irope.relative) == (4, "chunked", False)
    pos = torch.arange(16)
    assert torch.equal(allowed_keys(irope, pos, pos, 0), causal_allowed(16, 16, pos.device))
    assert (irope.logit_scale(pos, pos, 3) > 1).tolist() == [False] * 15 + [True]
    assert irope.caveat.startswith("window 16 >= L_train: no training window crosses a chunk")
    shorter = build_scheme({"name": "irope", "window": 8}, DIMS)
    assert shorter.caveat == ""  # training crosses its chunks, as Llama 4's does


def test_irope_refuses_an_unknown_rope_attention():
    with pytest.raises(UserError, match=r"irope: rope_attention='global' is not one of "):
        build_scheme({"name": "irope", "rope_attention": "global"}, DIMS)
    with pytest.raises(UserError, match=r"pe.window must be >= 1, got 0"):
        build_scheme({"name": "irope", "window": 0}, DIMS)


def test_the_plain_hybrids_caveat_says_it_is_not_llama4s_recipe():
    hybrid = build_scheme({"name": "rope_nope_hybrid"}, DIMS)
    assert "not Llama 4's iRoPE (irope)" in hybrid.caveat
    assert "iRoPE" not in (type(hybrid).__doc__ or "").split(".")[0]


@pytest.mark.parametrize("options", [{}, {"nope_every": 2, "rope_attention": "sliding"}])
def test_irope_conforms(options):
    report = assert_conforms("irope", options=options)
    assert report["attention_mask"].status == "PASS"


# ---- the attention_mask hook in every path ------------------------------------------------


class ExplicitIRoPE(IRoPE):
    """irope through the explicit path: a ``modify_logits`` that changes nothing."""

    def modify_logits(self, logits, bias, q, k, q_pos, k_pos, layer):
        return super().modify_logits(logits, bias, q, k, q_pos, k_pos, layer)


def test_the_float_mask_and_explicit_paths_hide_the_same_keys():
    """The model's float-mask path (``biased_attention`` with ``masked_logit_bias``) and the
    explicit one (``explicit_attention`` with ``allowed_keys``) give the same outputs, and a
    key the mask hides gets no weight: changing it changes nothing."""
    irope, explicit = IRoPE(DIMS, window=5), ExplicitIRoPE(DIMS, window=5)
    assert explicit.has_logits_hook and not irope.has_logits_hook
    torch.manual_seed(0)
    x = torch.randn(2, 23, 32)
    for layer in (0, 3):
        attn = CausalSelfAttention(MODEL, layer)
        fast = attn(x, ForwardContext(irope, torch.arange(23), flex=False, bias_cache=None))
        slow = attn(x, ForwardContext(explicit, torch.arange(23), flex=False, bias_cache=None))
        torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)
    q, k, v = torch.randn(3, 1, 4, 23, 8).unbind(0)
    out = explicit_attention(q, k, v, torch.arange(23), irope, 0)
    hidden = k.clone()
    hidden[..., 12, :] += 1.0  # in chunk 2 (positions 10-14): seen by queries 12-14 only
    moved = explicit_attention(q, hidden, v, torch.arange(23), irope, 0)
    others = torch.cat([torch.arange(0, 12), torch.arange(15, 23)])
    torch.testing.assert_close(moved[..., others, :], out[..., others, :])
    assert not torch.allclose(moved[..., 12:15, :], out[..., 12:15, :])


def test_the_attention_probe_sees_the_mask():
    """The context-use probe's attention weights (``run.attention_weights``) are the
    model's: none on a key the chunk hides."""
    from pe_bench.run.attention_weights import attention_weights, layer_qkv

    irope = IRoPE(DIMS, window=5)
    torch.manual_seed(0)
    attn = CausalSelfAttention(MODEL, 0)
    ctx = ForwardContext(irope, torch.arange(23), flex=False, bias_cache=None)
    q, k, _ = layer_qkv(attn, torch.randn(1, 23, 32), ctx)
    weights = attention_weights(attn, q, k, ctx)
    hidden = ~allowed_keys(irope, torch.arange(23), torch.arange(23), 0)
    assert weights[..., hidden].abs().max() == 0
    assert torch.allclose(weights.sum(-1), torch.ones(()))


def test_the_code_key_covers_the_mask():
    """The cache key's probe computes attention weights with the mask: another window is
    other numbers, hence another key; the hybrid's key is not irope's."""
    keys = {class_key(IRoPE, {"window": w}) for w in (4, 8)}
    assert len(keys) == 2
    assert class_key(IRoPE, {"window": 4}) != class_key(IRoPE, {"window": 4, "attn_scale": 0.2})
