"""The attention op: every fast path equals the written-out reference; shift invariance of
the logits of every relative scheme."""

from __future__ import annotations

import pytest
import torch

from pe_bench.model.attention import attention_logits, causal_attention, reference_attention
from pe_bench.model.gpt import GPT, ModelConfig, seeded_scheme
from pe_bench.positions import ModelDims, PositionScheme, build_scheme
from pe_bench.positions.bias import ALiBi
from tests.helpers import LOGIT_HOOKS, RELATIVE, TRAINABLE, VARIANTS

DIMS = ModelDims(d_model=32, num_heads=4, head_dim=8, num_layers=2, train_len=16)


def test_fast_path_equals_reference():
    q, k, v = (torch.randn(2, 4, 20, 8) for _ in range(3))
    assert torch.allclose(causal_attention(q, k, v), reference_attention(q, k, v, None), atol=1e-5)


@pytest.mark.parametrize("bias_shape", [(4, 20, 20), (2, 4, 20, 20)])
@pytest.mark.parametrize("chunk", [20, 7])  # one chunk of queries, or chunks of 7
def test_biased_path_equals_reference(bias_shape, chunk, monkeypatch):
    from pe_bench.model import attention

    monkeypatch.setattr(attention, "MASK_BUDGET", 2 * 4 * 20 * chunk)
    q, k, v = (torch.randn(2, 4, 20, 8) for _ in range(3))
    bias = torch.randn(bias_shape)

    def bias_fn(q_chunk, k_prefix, q_pos, k_pos):  # the rows and columns of the chunk
        return bias[..., q_pos.unsqueeze(-1), k_pos]

    got = attention.biased_attention(q, k, v, torch.arange(20), bias_fn)
    assert torch.allclose(got, reference_attention(q, k, v, bias), atol=1e-5)


def test_queries_that_are_the_last_keys():
    """s_q < s_k (chunked evaluation): the queries are the last s_q positions."""
    q, k, v = torch.randn(1, 4, 20, 8), torch.randn(1, 4, 20, 8), torch.randn(1, 4, 20, 8)
    full = causal_attention(q, k, v)
    tail = causal_attention(q[:, :, -6:], k, v)
    assert torch.allclose(full[:, :, -6:], tail, atol=1e-5)


def test_reference_is_causal():
    q, k, v = (torch.randn(1, 1, 5, 8) for _ in range(3))
    out = reference_attention(q, k, v, None)
    v2 = v.clone()
    v2[..., 4, :] += 10
    assert torch.allclose(out[..., :4, :], reference_attention(q, k, v2, None)[..., :4, :])


def _random_scheme(name: str):
    scheme = build_scheme({"name": name}, DIMS)
    with torch.no_grad():
        for p in scheme.parameters():
            p.normal_(0, 0.5)
    return scheme


@pytest.mark.parametrize("name", RELATIVE)
@pytest.mark.parametrize("shift", [1, 37, 1000])
def test_relative_scheme_logits_do_not_change_when_positions_shift(name, shift):
    scheme = _random_scheme(name)
    q, k = torch.randn(2, 4, 24, 8), torch.randn(2, 4, 24, 8)
    pos = torch.arange(24)
    base = attention_logits(scheme, q, k, pos, pos)
    shifted = attention_logits(scheme, q, k, pos + shift, pos + shift)
    assert torch.allclose(base, shifted, atol=2e-4), f"{name} depends on absolute position"


def test_xl_reference_formula_is_shift_invariant():
    scheme = _random_scheme("xl")
    q, k, pos = torch.randn(1, 4, 10, 8), torch.randn(1, 4, 10, 8), torch.arange(10)
    assert torch.allclose(
        scheme.score_bias_reference(q, k, pos, pos, 1),
        scheme.score_bias_reference(q, k, pos + 50, pos + 50, 1),
        atol=1e-5,
    )


@pytest.mark.parametrize("name", ["sinusoidal", "learned"])
def test_absolute_schemes_do_depend_on_position(name):
    """The invariance test can fail: an absolute scheme changes the model's output on a shift."""
    from tests.helpers import tiny_model

    model = tiny_model(name)
    x = torch.randint(0, 256, (1, 8))
    pe = model.pe
    with torch.no_grad():
        h0 = pe.embed(model.tok_emb(x), torch.arange(8))
        h1 = pe.embed(model.tok_emb(x), torch.arange(8) + 5)
    assert not torch.allclose(h0, h1)


@pytest.mark.parametrize("name", ["alibi", "t5", "xl"])
def test_query_chunked_attention_equals_one_chunk(name, monkeypatch):
    """Long windows are computed by query chunks; the result must not depend on the chunking."""
    from pe_bench.model import attention
    from tests.helpers import tiny_model

    model = tiny_model(name)
    x = torch.randint(0, 256, (2, 100))
    with torch.no_grad():
        whole = model(x)
        monkeypatch.setattr(attention, "MASK_BUDGET", 2 * 4 * 100 * 7)  # chunks of 7 queries
        chunked = model(x)
    assert torch.allclose(whole, chunked, atol=1e-5)


@pytest.mark.parametrize("name", ["alibi", "t5"])
def test_mask_shared_across_layers_equals_one_per_layer(name, monkeypatch):
    """A shared bias with no table by distance (a plugin's) is masked once per pass."""
    from tests.helpers import tiny_model

    model = tiny_model(name)
    monkeypatch.setattr(PositionScheme, "tabulated_by_distance", property(lambda s: False))
    x = torch.randint(0, 256, (2, 40))
    with torch.no_grad():
        shared = model(x)
        monkeypatch.setattr(type(model.pe), "shared_bias", False)
        per_layer = model(x)
    assert torch.equal(shared, per_layer)


FLEX_SCHEMES = ["alibi", "t5", "kerple_log", "kerple_power", "sandwich"]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")
@pytest.mark.parametrize("name", FLEX_SCHEMES)
@pytest.mark.parametrize("s", [40, 200])  # within one block, and across blocks of 128
def test_flex_score_mod_equals_the_bias_path(name, s):
    """FlexAttention (eager: the same kernel logic as compiled, slowly) with the scheme's
    score_mod gives what the float-mask path gives, on more than one 128-token block."""
    from pe_bench.model.attention import flex_attention
    from tests.helpers import tiny_model

    pe = tiny_model(name).pe
    pos = torch.arange(s)
    q, k, v = (torch.randn(1, 4, s, 8) for _ in range(3))
    expected = reference_attention(q, k, v, pe.score_bias(q, k, pos, pos, 1))
    with torch.no_grad():
        got = flex_attention(q, k, v, pe.score_mod(pos, pos, 1), compiled=False)
    assert torch.allclose(got, expected, atol=1e-5)


def bf16_ulps(got: torch.Tensor, expected: torch.Tensor) -> float:
    """The largest error of ``got`` in units of bf16's resolution at ``expected``."""
    eps = torch.finfo(torch.bfloat16).eps
    return ((got.float() - expected).abs() / (expected.abs().clamp(min=1e-3) * eps)).max().item()


@pytest.mark.parametrize("name", FLEX_SCHEMES)
def test_position_terms_stay_fp32_under_bf16_autocast(name):
    """Under bf16 autocast (the GPU path) the bias path attends with its term in float32: at
    1024 tokens the output is the fp32 reference rounded once to bf16 (<= 1 ulp). A bf16 mask
    was 68 (alibi) to 350 (kerple_power) ulps off, ALiBi's term by up to 1 at far keys."""
    from functools import partial

    from pe_bench.model.attention import biased_attention
    from tests.helpers import tiny_model

    pe, s = tiny_model(name).pe, 1024
    pos = torch.arange(s)
    q, k, v = (torch.randn(1, 4, s, 8).bfloat16() for _ in range(3))
    expected = reference_attention(
        q.float(), k.float(), v.float(), pe.score_bias(q.float(), k.float(), pos, pos, 1)
    )
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = biased_attention(q, k, v, pos, partial(pe.score_bias, layer=1))
    assert got.dtype == torch.bfloat16
    assert bf16_ulps(got, expected) <= 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", FLEX_SCHEMES)
def test_flex_and_mask_paths_agree_under_cuda_bf16_autocast(name):
    """On GPU in bf16 autocast, FlexAttention (fp32 scores in the kernel) and the mask path
    (fp32 term) give the same output up to bf16 rounding: the attention setting does not
    change the numbers."""
    from functools import partial

    from pe_bench.model.attention import biased_attention, flex_attention
    from tests.helpers import tiny_model

    pe, s = tiny_model(name).pe.cuda(), 1024
    pos = torch.arange(s, device="cuda")
    q, k, v = (torch.randn(1, 4, s, 8, device="cuda").bfloat16() for _ in range(3))
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        mask_path = biased_attention(q, k, v, pos, partial(pe.score_bias, layer=1))
        flex_path = flex_attention(q, k, v, pe.score_mod(pos, pos, 1))
    expected = reference_attention(
        q.float(), k.float(), v.float(), pe.score_bias(q.float(), k.float(), pos, pos, 1)
    )
    assert bf16_ulps(mask_path, expected) <= 1
    assert bf16_ulps(flex_path, expected) <= 4  # the kernel's own bf16 P @ V


@pytest.mark.parametrize("name", ["nope", "rope", "xl", "shaw", "fire", "cope"])
def test_no_score_mod_without_a_content_free_relative_bias(name):
    """Content-dependent (XL, Shaw, CoPE) and absolute (FIRE) terms keep the bias path."""
    from tests.helpers import tiny_model

    pe = tiny_model(name).pe
    assert pe.score_mod(torch.arange(8), torch.arange(8), 0) is None


@pytest.mark.slow  # 29 s on 2 cores: FlexAttention compiles its kernels on the CPU
def test_flex_evaluation_equals_sdpa_and_auto_keeps_sdpa_on_the_cpu(monkeypatch):
    """model.attention=flex evaluates through compiled FlexAttention with the same outputs as
    SDPA; model.attention=auto never takes it on the CPU, however long the window (the masks
    of cache-sized chunks were measured faster there), nor while gradients are on."""
    from pe_bench.model import attention
    from tests.helpers import tiny_model

    calls = []
    real = attention.flex_attention

    def counted(*args, **kwargs):
        calls.append(args[0].shape[-2])
        return real(*args, **kwargs)

    monkeypatch.setattr(attention, "flex_attention", counted)
    monkeypatch.setattr(attention, "SHARED_MASK_BUDGET", 4 * 100**2)
    model = tiny_model("alibi")
    assert model.cfg.attention == "auto"
    x = torch.randint(0, 256, (2, 150))
    model(x[:, :20]).sum().backward()  # training: SDPA
    with torch.no_grad():
        sdpa = model(x)  # long, but on the CPU: SDPA
        assert calls == []
        model.cfg.attention = "flex"
        flex = model(x)
        assert calls == [150, 150]  # both layers
    assert torch.allclose(flex, sdpa, atol=1e-4)


def test_flex_refuses_to_train_on_cpu():
    """Refused when the run is planned (it always trains), not inside the forward pass."""
    from pe_bench.errors import UserError
    from pe_bench.model.gpt import ModelConfig, check_attention

    cfg = ModelConfig(attention="flex")
    with pytest.raises(UserError, match="FlexAttention has no backward on CPU"):
        check_attention(cfg, torch.device("cpu"))
    check_attention(cfg, torch.device("cuda"))  # a GPU trains through it
    for mode in ("auto", "sdpa"):
        check_attention(ModelConfig(attention=mode), "cpu")


@pytest.mark.parametrize(
    ("mode", "seq_len", "grad", "device", "expected"),
    [
        ("flex", 16, True, "cpu", True),
        ("sdpa", 100_000, False, "cuda", False),
        ("auto", 5792, False, "cuda", False),  # 4 x 5792^2 < SHARED_MASK_BUDGET = 2^27
        ("auto", 5793, False, "cuda", True),
        ("auto", 8192, True, "cuda", False),  # never while training
        ("auto", 100_000, False, "cpu", False),  # never on the CPU
    ],
)
def test_use_flex(mode, seq_len, grad, device, expected):
    from pe_bench.model.attention import use_flex

    assert use_flex(mode, 4, seq_len, grad, device) is expected


# ---- the hooks of the explicit path: modify_logits, attention_weights, scales_bias ----------


class PassThroughLogits(ALiBi):
    """ALiBi whose modify_logits is the default's: the explicit path, the same numbers."""

    def modify_logits(self, logits, bias, q, k, q_pos, k_pos, layer):
        return super().modify_logits(logits, bias, q, k, q_pos, k_pos, layer)


class SoftmaxWeights(PositionScheme):
    """NoPE with the default softmax written as an override: the explicit path."""

    def attention_weights(self, logits, allowed):
        return super().attention_weights(logits, allowed)


class HeadScaledALiBi(ALiBi):
    """ALiBi whose whole logit (q . k and bias) is scaled per layer and head, as SSMax on
    ALiBi needs."""

    scales_bias = True

    def logit_scale(self, q_pos, k_pos, layer):
        heads = torch.arange(1, self.dims.num_heads + 1, dtype=torch.float32)
        return (heads * (layer + 1) / 4).unsqueeze(-1).expand(-1, q_pos.shape[-1])


class ScaledAndPassedThrough(HeadScaledALiBi):
    def modify_logits(self, logits, bias, q, k, q_pos, k_pos, layer):
        return super().modify_logits(logits, bias, q, k, q_pos, k_pos, layer)


def tiny_model(make, seed=0):
    cfg = ModelConfig(d_model=32, num_layers=2, num_heads=4, mlp_ratio=2)
    pe = seeded_scheme(make, cfg.dims(16), seed)
    torch.manual_seed(seed)
    return GPT(cfg, pe).eval()


@pytest.mark.parametrize("name", [n for n in TRAINABLE + VARIANTS if n not in LOGIT_HOOKS])
def test_built_in_schemes_keep_their_fused_paths(name):
    scheme = build_scheme({"name": name}, DIMS)
    assert not scheme.has_logits_hook and not scheme.scales_bias


@pytest.mark.parametrize("name", LOGIT_HOOKS)
def test_schemes_of_the_logit_hooks_leave_the_fused_paths(name):
    scheme = build_scheme({"name": name}, DIMS)
    assert scheme.has_logits_hook or scheme.scales_bias


@pytest.mark.parametrize(
    ("fused", "explicit"), [(ALiBi, PassThroughLogits), (PositionScheme, SoftmaxWeights)]
)
@pytest.mark.parametrize("budget", [None, 4 * 4 * 40 * 7])  # one chunk, or chunks of 7 queries
def test_explicit_path_equals_the_fused_one(fused, explicit, budget, monkeypatch):
    from pe_bench.model import attention

    if budget:
        monkeypatch.setattr(attention, "MASK_BUDGET", budget)
    idx = torch.randint(0, 256, (4, 40))
    calls = []
    real = attention.explicit_attention
    monkeypatch.setattr(
        "pe_bench.model.attention.explicit_attention", lambda *a: calls.append(1) or real(*a)
    )
    with torch.no_grad():
        expected = tiny_model(fused)(idx)
        assert not calls
        got = tiny_model(explicit)(idx)
    assert len(calls) == 2  # one per layer
    assert torch.allclose(got, expected, atol=1e-5)


def test_modify_logits_gets_the_scaled_logits_and_the_bias():
    seen = {}

    class Recording(ALiBi):
        def modify_logits(self, logits, bias, q, k, q_pos, k_pos, layer):
            seen.update(logits=logits, bias=bias, q=q, k=k)
            return 2 * logits

    scheme = Recording(DIMS)
    q, k = torch.randn(2, 4, 12, 8), torch.randn(2, 4, 12, 8)
    pos = torch.arange(12)
    got = attention_logits(scheme, q, k, pos, pos)
    assert torch.allclose(seen["logits"], q @ k.transpose(-2, -1) / 8**0.5, atol=1e-5)
    assert torch.equal(seen["bias"], ALiBi(DIMS).score_bias(q, k, pos, pos, 0))
    assert torch.equal(seen["q"], q) and torch.equal(got, 2 * seen["logits"])


def test_scales_bias_scales_the_whole_logit_per_layer_and_head():
    scheme = HeadScaledALiBi(DIMS)
    q, k = torch.randn(2, 4, 12, 8), torch.randn(2, 4, 12, 8)
    pos = torch.arange(12)
    plain = attention_logits(ALiBi(DIMS), q, k, pos, pos)
    for layer in (0, 1):
        scale = scheme.logit_scale(pos, pos, layer).unsqueeze(-1)  # [n_h, s_q, 1]
        got = attention_logits(scheme, q, k, pos, pos, layer)
        assert torch.allclose(got, scale * plain, atol=1e-5)
    assert scheme.score_mod(pos, pos, 0) is None  # the tabulated bias would miss the scale


def test_a_bias_scaled_per_layer_is_not_shared_across_layers():
    """ALiBi's mask is built once per pass and shared; scaled per layer it must not be: the
    bias path gives what the explicit path (no sharing) gives."""
    idx = torch.randint(0, 256, (2, 40))
    with torch.no_grad():
        got, expected = tiny_model(HeadScaledALiBi)(idx), tiny_model(ScaledAndPassedThrough)(idx)
        unscaled = tiny_model(ALiBi)(idx)
    assert torch.allclose(got, expected, atol=1e-5)
    assert not torch.allclose(got, unscaled, atol=1e-3)
