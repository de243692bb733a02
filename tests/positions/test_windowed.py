"""The windowed RoPE variants' blockwise attention (positions.windowed) is their explicit
attention (``modify_logits``'s L x L logits): at every length that crosses a branch boundary
and a block, past training, in the model and against the authors' pinned outputs; causal."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from pe_bench.api import attention
from pe_bench.model import attention as model_attention
from pe_bench.model.attention import allowed_keys, attention_path, explicit_attention
from pe_bench.positions import ModelDims, build_scheme, registered
from pe_bench.positions import windowed as blockwise
from pe_bench.positions.rerope import WindowedRoPE
from tests.helpers import with_variant
from tests.positions.test_long_context import METHODS, PIN_DIMS, PINS, WINDOWED, pin_script

DIMS = ModelDims(d_model=16, num_heads=2, head_dim=8, num_layers=1, train_len=16)
# Every variant's branch edges at L_train = 16 lie below 40 (ReRoPE's window 4, DCA's chunks of
# 10, StreamingLLM's 4 sinks and window 12, LM-Infinite's 16 and 10 sinks, STRING's offset 5),
# so lengths 1..40 cross each of them, and blocks of 3 and 7 queries cross them in every phase.
LENGTHS = range(1, 41)
OPTIONS = {"leaky_rerope": {"k": 4.0}}  # serves 4 + 11 * 4 + 1 = 49 tokens, past 40


def scheme(name: str, dims: ModelDims = DIMS) -> WindowedRoPE:
    return build_scheme({"name": name, **OPTIONS.get(name, {})}, dims)


def qkv(s: int, seed: int, dims: ModelDims = DIMS) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(2, dims.num_heads, s, dims.head_dim, generator=gen) for _ in range(3)]


def both(pe: WindowedRoPE, q, k, v) -> tuple[torch.Tensor, torch.Tensor]:
    """(explicit, blockwise) attention of raw q, k, v at positions 0..s-1."""
    pos = torch.arange(q.shape[-2])
    q, k = pe.transform_qk(q, k, pos, pos, 0)
    return explicit_attention(q, k, v, pos, pe, 0), blockwise.windowed_attention(pe, q, k, v)


@pytest.mark.parametrize("block", [3, 7, blockwise.BLOCK])
@pytest.mark.parametrize("name", WINDOWED)
def test_blockwise_is_explicit_at_every_length(name, block, monkeypatch):
    monkeypatch.setattr(blockwise, "BLOCK", block)
    pe = scheme(name)
    for s in LENGTHS:
        explicit, fast = both(pe, *qkv(s, s))
        torch.testing.assert_close(fast, explicit, atol=2e-6, rtol=1e-5, msg=f"{name} at {s}")


@pytest.mark.parametrize("name", WINDOWED)
def test_blockwise_is_explicit_at_the_zoos_shape_past_a_block(name):
    """L_train = 64 (the zoo's defaults), 600 tokens: blocks of 256 queries, every branch."""
    dims = ModelDims(d_model=32, num_heads=2, head_dim=16, num_layers=1, train_len=64)
    options = {"leaky_rerope": {"k": None, "max_len": 600}}.get(name, {})
    pe = build_scheme({"name": name, **options}, dims)
    explicit, fast = both(pe, *qkv(600, 0, dims))
    torch.testing.assert_close(fast, explicit, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("name", METHODS)
def test_blockwise_is_the_authors_code(name, monkeypatch):
    """The pinned outputs of ChunkLlama, streaming-llm, LM-Infinite and STRING (as
    tests/positions/test_long_context.py pins the explicit path), in blocks of 5 queries."""
    monkeypatch.setattr(blockwise, "BLOCK", 5)
    pinned = PINS[name]
    q, k, v = (x.float() for x in pin_script().probe(pinned["seq"]))
    pe = build_scheme({"name": name, "base": PINS["base"], **pinned["options"]}, PIN_DIMS)
    _, fast = both(pe, q, k, v)
    torch.testing.assert_close(fast[0], torch.tensor(pinned["output"]), atol=2e-6, rtol=0)


@pytest.mark.parametrize("name", WINDOWED)
def test_the_model_takes_the_blockwise_path_with_the_explicit_paths_numbers(name, monkeypatch):
    monkeypatch.setattr(blockwise, "BLOCK", 7)
    model = with_variant(name)
    assert attention_path(model.pe) == "windowed"
    x = torch.randint(0, 256, (2, 45))  # past training (16) and every branch edge
    calls = []
    real = model_attention.windowed_attention
    monkeypatch.setattr(
        model_attention, "windowed_attention", lambda *a: calls.append(1) or real(*a)
    )
    with torch.no_grad():
        fast = model(x)
        assert len(calls) == model.cfg.num_layers
        monkeypatch.setattr(model_attention, "blockwise", lambda cls: False)  # explicit
        assert attention_path(model.pe) == "explicit"
        explicit = model(x)
    torch.testing.assert_close(fast, explicit, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", WINDOWED)
def test_blockwise_is_causal(name, monkeypatch):
    monkeypatch.setattr(blockwise, "BLOCK", 4)
    pe = scheme(name)
    q, k, v = qkv(40, 1)
    _, before = both(pe, q, k, v)
    for x in (q, k, v):
        x[:, :, 25:] = torch.randn_like(x[:, :, 25:])  # every later token changed
    _, after = both(pe, q, k, v)
    assert torch.equal(before[:, :, :25], after[:, :, :25])
    assert not torch.allclose(before[:, :, 25:], after[:, :, 25:])


def test_gradients_are_the_explicit_paths():
    """With gradients the pieces are written out (the fused kernel's log-sum-exp has none)."""
    pe = scheme("dca")
    grads = []
    for path in ("explicit", "windowed"):
        q, k, v = (x.requires_grad_() for x in qkv(37, 2))
        pos = torch.arange(37)
        tq, tk = pe.transform_qk(q, k, pos, pos, 0)
        if path == "explicit":
            out = explicit_attention(tq, tk, v, pos, pe, 0)
        else:
            out = blockwise.windowed_attention(pe, tq, tk, v)
        (out * torch.linspace(-1, 1, 8)).sum().backward()
        grads.append([x.grad for x in (q, k, v)])
    for fast, explicit in zip(*grads[::-1], strict=True):
        torch.testing.assert_close(fast, explicit, atol=1e-5, rtol=1e-5)


def test_other_positions_attend_explicitly():
    """The runs are planned for positions 0..s-1; the API's other positions go explicit."""
    pe = scheme("self_extend")
    q, k, v = qkv(30, 3)
    pos = torch.arange(30) + 7
    tq, tk = pe.transform_qk(q, k, pos, pos, 0)
    torch.testing.assert_close(
        attention(q, k, v, pe, pos=pos), explicit_attention(tq, tk, v, pos, pe, 0)
    )


def test_the_models_own_positions_are_not_read():
    """A pass over the scheme's own positions takes the blockwise path without reading them
    (no wait on a GPU: a meta tensor has no values to read); positions from outside are read."""
    pe = scheme("dca")
    unread = torch.empty(40, device="meta")
    assert model_attention.forward_context(pe, unread, "auto", 2, False).windowed
    given = partial(model_attention.forward_context, pe, mode="auto", num_heads=2, grad=False)
    assert given(torch.arange(40), own=False).windowed
    assert not given(torch.arange(40) + 1, own=False).windowed


def test_queries_after_a_prefix_and_a_mask_are_the_explicit_rows():
    """branch_attention's queries may be the last s_q keys (as in cached decoding) and a mask
    may hide keys on top of the branches (as an HF attention mask does)."""
    pe = scheme("dca")
    q, k, v = qkv(33, 4)
    pos = torch.arange(33)
    tq, tk = pe.transform_qk(q, k, pos, pos, 0)
    hidden = torch.rand(33, 33, generator=torch.Generator().manual_seed(5)) < 0.3
    hidden.fill_diagonal_(False)
    with torch.no_grad():
        logits = model_attention.scheme_logits(pe, tq, tk, pos, pos, 0)
        weights = pe.attention_weights(logits, allowed_keys(pe, pos, pos, 0) & ~hidden)
        expected = (weights @ v)[:, :, 20:]
        got = blockwise.branch_attention(pe, tq[:, :, 20:], tk, v, 8**-0.5, mask=~hidden[20:])
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5)


def test_the_branches_decide_the_hidden_keys():
    """``branch_attention`` hides what no branch scores; every windowed scheme's
    ``attention_mask`` says no more than that."""
    found = [cls for cls in registered().values() if blockwise.blockwise(cls)]
    assert {cls.name for cls in found} == set(WINDOWED)
    pos = torch.arange(60)
    for name in WINDOWED:
        pe = scheme(name)
        mask = pe.attention_mask(pos, pos, 0)
        scored = torch.stack(pe.branch_scores(pos, pos)).any(dim=0)
        assert mask is None or torch.equal(mask, scored), name
