"""DCA, StreamingLLM, LM-Infinite and STRING (pe_bench/positions/long_context.py): their
attention outputs pinned to the numbers of the authors' own code, their position maps at and
past the training length, where they reduce to RoPE, the conformance kit.

The pinned numbers (``long_context_pins.json``) are made by ``experiments/pin_long_context.py``,
which runs each method's attention function from its repository (HKUNLP/ChunkLlama
``chunkllama_attn_replace.forward``; mit-han-lab/streaming-llm's pos-shift attention decoding
one token at a time through ``StartRecentKVCache``; Glaciohound/LM-Infinite's
``attn_forward_factory`` with ``lambda_matmul``; HKUNLP/STRING ``string_for_llama.forward``,
prefill then decoding), at the commits the file names, on the probe's q, k and v (float64);
flash-attn's kernels written out exactly stand in for the GPU ones."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from pe_bench.conformance import assert_conforms
from pe_bench.errors import UserError
from pe_bench.model.attention import allowed_keys, attention_logits
from pe_bench.positions import ModelDims, build_scheme
from pe_bench.positions.long_context import chunkllama_mscale

ROOT = Path(__file__).parents[2]
PINS = json.loads((Path(__file__).parent / "long_context_pins.json").read_text())
METHODS = ["dca", "streaming_llm", "lm_infinite", "string"]
WINDOWED = ["rerope", "leaky_rerope", "self_extend", *METHODS]
PIN_DIMS = ModelDims(d_model=16, num_heads=2, head_dim=8, num_layers=1, train_len=16)
ZOO = ModelDims(d_model=128, num_heads=4, head_dim=32, num_layers=4, train_len=64)


def pin_script():
    """experiments/pin_long_context.py as a module (its ``probe`` makes the pinned inputs)."""
    path = ROOT / "experiments" / "pin_long_context.py"
    spec = importlib.util.spec_from_file_location("pin_long_context", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def attention_output(scheme, q, k, v) -> torch.Tensor:
    """softmax over the keys the scheme keeps of its logits, times v: ``[b, n_h, s, h_d]``."""
    pos = torch.arange(q.shape[-2])
    logits = attention_logits(scheme, q, k, pos, pos)
    return scheme.attention_weights(logits, allowed_keys(scheme, pos, pos, 0)) @ v


@pytest.mark.parametrize("name", METHODS)
def test_attention_is_the_authors_code(name):
    """Within float32 rounding (the authors' code ran in float64 with float32 angles)."""
    script = pin_script()
    assert [round(float(x.sum()), 9) for x in script.probe(26)] == pytest.approx(
        PINS["probe_sum"], abs=1e-9
    )
    pinned = PINS[name]
    q, k, v = (x.float() for x in script.probe(pinned["seq"]))
    scheme = build_scheme({"name": name, "base": PINS["base"], **pinned["options"]}, PIN_DIMS)
    ours = attention_output(scheme, q, k, v)[0]
    theirs = torch.tensor(pinned["output"])
    torch.testing.assert_close(ours, theirs, atol=2e-6, rtol=0)
    pos = torch.arange(pinned["seq"])
    rope = build_scheme({"name": "rope"}, PIN_DIMS)
    plain = (
        rope.attention_weights(
            attention_logits(rope, q, k, pos, pos), allowed_keys(rope, pos, pos, 0)
        )
        @ v
    )
    assert (plain[0] - theirs).abs().max() > 0.05  # the probe tells the method from RoPE


def test_string_prefill_counts_the_key_at_the_offset_twice():
    """STRING's prefill (a flash window of S + 1 keys beside the shifted branch) and its
    decoding differ from the offset on: pe-bench computes the decoding's (the paper's)."""
    pinned = PINS["string"]
    prefill, decoding = torch.tensor(pinned["prefill"]), torch.tensor(pinned["output"])
    offset = pinned["options"]["shifted_offset"]
    same = (prefill - decoding).abs().amax(dim=(0, 2)) < 1e-6
    assert same[:offset].all() and not same[offset:].any()


# ---- position maps -------------------------------------------------------------------------


def relative_positions(scheme, n: int) -> torch.Tensor:
    """The relative position (q_at - k_at) each causal pair of a window of ``n`` tokens is
    scored at; -1 where the pair is hidden."""
    pos = torch.arange(n)
    found = torch.full((n, n), -1.0)
    for (q_at, k_at), scores in zip(
        scheme.branch_positions(pos, pos), scheme.branch_scores(pos, pos), strict=True
    ):
        found = torch.where(scores, q_at.float().unsqueeze(-1) - k_at.float(), found)
    return found.masked_fill(pos.unsqueeze(-1) < pos, -1.0)


def test_dca_positions_for_a_small_example():
    """ChunkLlama with chunk_size 6, local_window 2 (chunks of c = 4): the query at 13 (chunk
    3, i mod c = 1) sees its chunk at i - j, chunk 2 at min(1 + 4, 6) - j mod 4, chunks 0 and 1
    at min(2c - 1, 6) = 6 - j mod 4."""
    dca = build_scheme({"name": "dca", "chunk_size": 6, "local_window": 2}, PIN_DIMS)
    row = relative_positions(dca, 14)[13].tolist()
    assert row == [6, 5, 4, 3, 6, 5, 4, 3, 5, 4, 3, 2, 1, 0]


def test_streaming_llm_positions_for_a_small_example():
    """2 sinks, 3 recent tokens: the query at 9 sees keys 6..9 at their distance and the sinks
    at 2 + 3 - j (its cache: sinks at 0, 1, recent at 2..4, the query at 5)."""
    streaming = build_scheme({"name": "streaming_llm", "start_size": 2, "recent_size": 3}, PIN_DIMS)
    assert relative_positions(streaming, 10)[9].tolist() == [5, 4, -1, -1, -1, -1, 3, 2, 1, 0]


def test_lm_infinite_positions_for_a_small_example():
    """local_branch 4, global_branch 2: the last 4 keys at their distance, keys 0 and 1 at the
    cap, 4; the rest hidden."""
    lambda_ = build_scheme({"name": "lm_infinite", "local_branch": 4, "global_branch": 2}, PIN_DIMS)
    assert relative_positions(lambda_, 10)[9].tolist() == [4, 4, -1, -1, -1, -1, 3, 2, 1, 0]


def test_string_positions_for_a_small_example():
    """S = 5, W = 2: distances below 5 as they are, the rest shifted down by 3."""
    string = build_scheme({"name": "string", "shifted_offset": 5, "local_value": 2}, PIN_DIMS)
    assert relative_positions(string, 10)[9].tolist() == [6, 5, 4, 3, 2, 4, 3, 2, 1, 0]


@pytest.mark.parametrize(
    ("name", "bound"),
    [
        ("dca", 48),  # chunk_size, 3 L_train / 4
        ("streaming_llm", 63),  # the cache: L_train keys at 0 .. L_train - 1
        ("lm_infinite", 64),  # the cap: local_branch = L_train
        ("self_extend", 1023 // 32 + 16 - 16 / 32),  # floor(i / G) + w - w / G
    ],
)
def test_relative_positions_stay_bounded_far_past_training(name, bound):
    """At the zoo's L_train = 64, 16x its length: the largest relative position any pair is
    scored at is the method's bound (STRING's grows with the window: it shifts, not caps)."""
    scheme = build_scheme({"name": name}, ZOO)
    seen = relative_positions(scheme, 16 * 64)
    assert seen.max() <= bound + 1e-4
    string = build_scheme({"name": "string"}, ZOO)  # S = 21, W = 5
    assert relative_positions(string, 256).max() == 255 - 21 + 5


def test_every_query_sees_its_own_key_and_hidden_keys_are_the_middle():
    streaming = build_scheme({"name": "streaming_llm"}, ZOO)  # 4 sinks, 59 recent
    seen = relative_positions(streaming, 300) >= 0
    assert seen.diagonal().all()
    assert seen.sum(dim=-1)[-1] == 4 + 60  # sinks, recent and itself
    assert not seen[299, 4 : 299 - 59].any()


# ---- RoPE where the method reduces to it ----------------------------------------------------


@pytest.mark.parametrize("name", WINDOWED)
def test_windowed_variants_are_rope_up_to_where_they_say(dims, name):
    """At ``plain_up_to`` tokens (log-n off) the logits are RoPE's; well past it they are not."""
    options = {"name": name, "logn": False} if "rerope" in name else {"name": name}
    if name == "string":
        options["attention_factor"] = 1.0
    scheme = build_scheme(options, dims)
    rope = build_scheme({"name": "rope"}, dims)
    n = scheme.plain_up_to
    q, k, v = (
        torch.randn(1, 4, 4 * n + 8, 8),
        torch.randn(1, 4, 4 * n + 8, 8),
        torch.randn(1, 4, 4 * n + 8, 8),
    )
    torch.testing.assert_close(
        attention_output(scheme, q[..., :n, :], k[..., :n, :], v[..., :n, :]),
        attention_output(rope, q[..., :n, :], k[..., :n, :], v[..., :n, :]),
    )
    assert (attention_output(scheme, q, k, v) - attention_output(rope, q, k, v)).abs().max() > 1e-3


def test_string_attention_factor_scales_every_logit(dims):
    """The code's factor 0.1 ln 2 + 1 on cos and sin: the logits times its square, at every
    length, RoPE's below S."""
    string = build_scheme({"name": "string"}, dims)
    plain = build_scheme({"name": "string", "attention_factor": 1.0}, dims)
    assert string.plain_up_to == 0 and string.cos_sin_factor == pytest.approx(1.0693147)
    q, k, pos = torch.randn(1, 4, 12, 8), torch.randn(1, 4, 12, 8), torch.arange(12)
    torch.testing.assert_close(
        attention_logits(string, q, k, pos, pos),
        attention_logits(plain, q, k, pos, pos) * string.cos_sin_factor**2,
    )


def test_dca_mscale_is_chunkllamas_past_training_and_off_in_the_papers_form(dims):
    code = build_scheme({"name": "dca"}, dims)  # L_train 16: chunk_size 12, local_window 2
    paper = build_scheme({"name": "dca", "mscale": False}, dims)
    assert (code.chunk_size, code.local_window, code.chunk_len) == (12, 2, 10)
    assert chunkllama_mscale(1.0) == 1.0 and chunkllama_mscale(4.0) == pytest.approx(
        1 + 0.05 * math.log(4)
    )
    assert "mscale: false" in code.caveat and paper.caveat == ""
    q, k = torch.randn(1, 4, 64, 8), torch.randn(1, 4, 64, 8)
    for n in (16, 64):
        pos = torch.arange(n)
        ratio = chunkllama_mscale(n / 16) ** 2
        torch.testing.assert_close(
            attention_logits(code, q[..., :n, :], k[..., :n, :], pos, pos),
            attention_logits(paper, q[..., :n, :], k[..., :n, :], pos, pos) * ratio,
        )


# ---- contract -------------------------------------------------------------------------------


@pytest.mark.slow  # 4 x 3 s
@pytest.mark.parametrize("name", METHODS)
def test_conforms(name):
    """Causality, query chunks, lengths, masks keeping each query's own key, STRING's
    relativity: the conformance kit."""
    assert_conforms(name)


@pytest.mark.parametrize("name", METHODS)
def test_finite_at_sixty_four_times_training(dims, name):
    scheme = build_scheme({"name": name}, dims)
    q, k, v = torch.randn(1, 4, 1024, 8), torch.randn(1, 4, 1024, 8), torch.randn(1, 4, 1024, 8)
    assert torch.isfinite(attention_output(scheme, q, k, v)).all()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"name": "dca", "chunk_size": 4, "local_window": 4},
            r"dca: chunk_size \(4\) must exceed local_window \(4\)",
        ),
        ({"name": "streaming_llm", "start_size": 16}, "streaming_llm: start_size 16 leaves no"),
        (
            {"name": "string", "shifted_offset": 4, "local_value": 5},
            r"string: local_value \(5\) must be at most shifted_offset \(4\)",
        ),
        ({"name": "lm_infinite", "local_branch": 0}, "pe.local_branch must be >= 1, got 0"),
    ],
)
def test_bad_options_are_refused_in_one_line(dims, options, message):
    with pytest.raises(UserError, match=message) as caught:
        build_scheme(options, dims)
    assert "\n" not in str(caught.value)
