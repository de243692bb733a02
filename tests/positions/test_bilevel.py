"""BiPE: segment and intra-segment ids, RoPE logits at the segment ids and ALiBi's slopes
pinned to the authors' code; the read_tokens hook through the model; causality, the shift by
whole segments, the table past its rows, the conformance kit."""

from __future__ import annotations

import math

import pytest
import torch

from pe_bench.conformance import assert_conforms
from pe_bench.errors import UserError
from pe_bench.model.attention import attention_logits
from pe_bench.model.gpt import GPT, ModelConfig
from pe_bench.positions import ModelDims, build_scheme
from pe_bench.positions.bilevel import BiPE, BiPEALiBi, bilevel_ids
from pe_bench.positions.fingerprint import class_key

DIMS = ModelDims(d_model=16, num_heads=2, head_dim=8, num_layers=1, train_len=64)

# zhenyuhe00/BiPE at 3dddab3, my_modeling_llama_bipe_rope.py: LlamaModel.get_bilevel_ids on
# Llama ids whose separators are 869 ('▁.') and 13 (newline), train_scale 4 (token_ids, the
# intra-segment ids, clamped to 3) and 1024 (unclamped); position_ids are the segment ids.
LLAMA_IDS = [[5, 869, 7, 8, 13, 13, 9, 869, 4, 4, 4, 4], [13, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 869]]
TOKEN_IDS_4 = [[0, 1, 0, 1, 2, 0, 0, 1, 0, 1, 2, 3], [0, 0, 1, 2, 3, 3, 3, 3, 3, 3, 3, 3]]
TOKEN_IDS = [[0, 1, 0, 1, 2, 0, 0, 1, 0, 1, 2, 3], [0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]
POSITION_IDS = [[0, 0, 1, 1, 1, 2, 3, 3, 4, 4, 4, 4], [0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]]

# The same code on the bytes of TEXT (newline and '.' mapped to 13 and 869): segment ids, then
# LlamaRotaryEmbedding(8) and apply_rotary_pos_emb(q, k, cos, sin, position_ids) on q and k from
# ``inputs()``, logits = q'.k' / sqrt(8): the last two query rows of each head (keys 0-11).
TEXT = b"ab\ncd.e\n\nfgh"
SEGMENTS = [0, 0, 0, 1, 1, 1, 2, 2, 3, 4, 4, 4]  # newline and '.' both separators
LAST_ROWS = [
    [
        [2.3006921, -1.8477777, 1.0133286, -0.1580389, -0.7764159, 1.5505543],
        [-1.7348238, 1.6949587, -1.0289023, 0.2373423, 0.6867749, -1.4690884],
        [1.3719653, -0.9695289, 0.3669016, -0.1754571, -0.296985, 0.7081047],
        [-0.3546677, 0.3061662, 0.5447692, -1.2103841, 1.5283437, -1.530733],
    ],
    [
        [-0.8800023, 1.2707653, -1.399134, 1.0877345, -0.4750686, -0.2356871],
        [1.1036386, -1.7933301, 2.4148731, -2.6205554, 2.5387959, -1.9328218],
        [-1.8077703, 2.2644916, -2.2536292, 1.65341, -0.8042222, -0.2110207],
        [1.2826185, -2.0207231, 2.4868631, -2.513237, 1.9791948, -1.0364821],
    ],
]
# my_modeling_llama_bipe_alibi.py, _init_alibi_mul96: ALiBi's slopes times 96.
SLOPES_X96 = {2: [6.0, 0.375], 4: [24.0, 6.0, 1.5, 0.375]}


def inputs(s: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    n = torch.arange(2 * s * 8, dtype=torch.float32)
    q = (1.5 * torch.sin(0.7 * n + 0.3)).reshape(1, 2, s, 8)
    return q, (1.2 * torch.cos(0.45 * n - 0.2)).reshape(1, 2, s, 8)


def test_ids_equal_the_authors_code():
    intra, segment = bilevel_ids(torch.tensor(LLAMA_IDS), torch.tensor([869, 13]))
    assert intra.tolist() == TOKEN_IDS and segment.tolist() == POSITION_IDS
    bipe = build_scheme({"name": "bipe", "separators": [869, 13], "table_size": 4}, DIMS)
    bipe.read_tokens(torch.tensor(LLAMA_IDS))
    intra, _ = bipe.segments.at(torch.arange(12))
    assert intra.clamp(max=3).tolist() == TOKEN_IDS_4


def test_rope_logits_at_segment_ids_equal_the_authors_code():
    bipe = build_scheme({"name": "bipe", "separators": [10, 46]}, DIMS)
    bipe.read_tokens(torch.tensor([list(TEXT)]))
    pos = torch.arange(12)
    assert bipe.segments.at(pos)[1].tolist() == [SEGMENTS]
    logits = attention_logits(bipe, *inputs(), pos, pos)[0, :, -2:].reshape(2, 4, 6)
    torch.testing.assert_close(logits, torch.tensor(LAST_ROWS), rtol=0, atol=2e-6)


@pytest.mark.parametrize("heads", [2, 4])
def test_alibi_slopes_and_bias_equal_the_authors_code(heads):
    dims = ModelDims(d_model=8 * heads, num_heads=heads, head_dim=8, num_layers=1, train_len=64)
    bipe = build_scheme({"name": "bipe_alibi", "separators": [10, 46]}, dims)
    assert bipe.slopes.tolist() == pytest.approx(SLOPES_X96[heads])
    bipe.read_tokens(torch.tensor([list(TEXT)]))
    pos = torch.arange(12)
    code = torch.tensor(SLOPES_X96[heads]).view(-1, 1) * torch.tensor(SEGMENTS).float()
    assert torch.equal(bipe.key_bias(None, None, pos, pos, 0)[0], code)  # m_h c_j, as the code
    bias = bipe.score_bias(None, None, pos, pos, 0)[0]  # -m_h (c_i - c_j): the same per row
    torch.testing.assert_close(bias - code.unsqueeze(1), -code[:, :, None].expand(-1, -1, 12))


def test_intra_positions_pick_rows_of_the_table_and_clamp_to_its_zero_row():
    """The table has L_train rows; its last is 0 (BiPE's padding row) and gets no gradient,
    and every intra position past it reads it."""
    bipe = build_scheme({"name": "bipe", "table_size": 4}, DIMS)
    assert bipe.segments.table.weight.shape == (4, 16) and not bipe.segments.table.weight[3].any()
    tokens = torch.tensor([[1, 2, 10, 3, 4, 5, 6, 7]])  # intra 0 1 2 0 1 2 3 4
    bipe.read_tokens(tokens)
    x = torch.zeros(1, 8, 16)
    out = bipe.embed(x, torch.arange(8))
    rows = bipe.segments.table.weight[[0, 1, 2, 0, 1, 2, 3, 3]]
    assert torch.equal(out[0], rows)
    out.sum().backward()
    assert not bipe.segments.table.weight.grad[3].any()


def test_the_model_reads_the_tokens_of_each_pass_and_forgets_them():
    model = GPT(ModelConfig(d_model=16, num_layers=1, num_heads=2, mlp_ratio=2), BiPE(DIMS))
    seen = []
    read = model.pe.read_tokens
    model.pe.read_tokens = lambda idx: (seen.append(idx), read(idx))
    tokens = torch.tensor([list(TEXT)])
    model(tokens)
    assert torch.equal(seen[0], tokens) and seen[1] is None and model.pe.segments.levels is None


def test_logits_depend_on_the_segment_difference_only():
    """Two lines more before the same text: every segment index grows by 2, intra positions
    stay, and the logits among the original tokens do not change (relative in segments)."""
    bipe = build_scheme({"name": "bipe"}, DIMS)
    text = torch.tensor([list(b"a = 1\nb.c = 2\nprint(b)")])
    longer = torch.cat([torch.tensor([list(b"x\nyz\n")]), text], dim=1)
    q, k = torch.randn(1, 2, text.shape[1], 8), torch.randn(1, 2, text.shape[1], 8)
    bipe.read_tokens(text)
    pos = torch.arange(text.shape[1])
    short = attention_logits(bipe, q, k, pos, pos)
    x = torch.zeros(1, text.shape[1], 16)
    embedded = bipe.embed(x, pos)
    bipe.read_tokens(longer)
    tail = pos + 5
    torch.testing.assert_close(attention_logits(bipe, q, k, tail, tail), short, atol=1e-5, rtol=0)
    assert torch.equal(bipe.embed(x, tail), embedded)


def test_without_separators_it_is_one_segment():
    """No separator: one segment (no rotation), intra positions 0..s-1, as no tokens read."""
    bipe = build_scheme({"name": "bipe"}, DIMS)
    q, k = inputs()
    pos = torch.arange(12)
    plain = (q @ k.transpose(-1, -2)) / math.sqrt(8)
    bipe.read_tokens(torch.full((1, 12), 65))
    torch.testing.assert_close(attention_logits(bipe, q, k, pos, pos), plain)
    bipe.read_tokens(None)
    torch.testing.assert_close(attention_logits(bipe, q, k, pos, pos), plain)


def test_bad_separators_are_refused():
    with pytest.raises(UserError, match="separators"):
        build_scheme({"name": "bipe", "separators": []}, DIMS)


@pytest.mark.parametrize("name", ["bipe", "bipe_alibi"])
def test_bipe_conforms(name):
    report = assert_conforms(name)
    assert report["causality"].status == "PASS" and report["lengths"].status == "PASS"


def test_keys_compute_and_read_the_tokens():
    assert len(class_key(BiPE)) == 12 and len(class_key(BiPEALiBi)) == 12
    assert class_key(BiPE) != class_key(BiPE, {"separators": [46]})
