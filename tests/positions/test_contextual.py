"""CoPE: contextual positions and their interpolated embeddings, pinned by hand."""

from __future__ import annotations

import pytest
import torch

from pe_bench.model.attention import causal_allowed
from pe_bench.positions import build_scheme


def test_npos_max_defaults_to_training_length_plus_one(dims):
    cope = build_scheme({"name": "cope"}, dims)
    assert cope.npos_max == 17  # the authors' default: block size + 1
    assert cope.pos_emb.shape == (dims.num_layers, dims.head_dim, 17)
    assert not cope.pos_emb.any()  # zero-initialised, as the reference


def test_positions_count_gates_by_hand(dims):
    # Keys of zeros: every gate is sigmoid(0) = 1/2, so p_ij = (i - j + 1) / 2, capped at 16.
    cope = build_scheme({"name": "cope"}, dims)
    torch.nn.init.normal_(cope.pos_emb)
    q, k = torch.randn(1, 4, 40, 8), torch.zeros(1, 4, 40, 8)
    pos = torch.arange(40)
    bias = cope.score_bias(q, k, pos, pos, 1)
    e = cope.pos_emb[1].T  # [npos, h_d]
    for i, j, p in [(4, 1, 2.0), (4, 2, 1.5), (0, 0, 0.5), (39, 0, 16.0)]:
        lo, w = int(p), p - int(p)
        e_p = e[lo] * (1 - w) + e[min(lo + 1, 16)] * w
        assert bias[0, 2, i, j].item() == pytest.approx(
            (q[0, 2, i] @ e_p).item() / 8**0.5, rel=1e-5
        )


@pytest.mark.parametrize(("s_q", "s_k"), [(10, 10), (3, 24)])
def test_fast_path_equals_reference(dims, s_q, s_k):
    cope = build_scheme({"name": "cope", "npos_max": 6}, dims)
    torch.nn.init.normal_(cope.pos_emb)
    q, k = torch.randn(2, 4, s_q, 8), torch.randn(2, 4, s_k, 8)
    pos = torch.arange(s_k)
    allowed = causal_allowed(s_q, s_k, q.device)
    fast = cope.score_bias(q, k, pos[-s_q:], pos, 0)
    reference = cope.score_bias_reference(q, k, pos[-s_q:], pos, 0)
    assert torch.allclose(fast[..., allowed], reference[..., allowed], atol=1e-5)


@pytest.mark.parametrize(
    ("scale", "s_q"),
    [(0.0, 8), (-1.0, 8), (0.0, 700)],
    ids=["capped-in-the-first-block", "never-capped", "queries-past-a-block"],
)
def test_blocks_of_keys_equal_one_sum_over_the_row(dims, scale, s_q):
    """The gates summed by blocks of ``KEY_BLOCK`` keys, stopped once every query's position
    reaches the cap (``npos_max`` - 1), give the code before it (one reversed cumulative sum
    over the whole row, tests/model/old_paths.py) within float tolerance, at every key the
    queries see: positions capped early (gates near 1/2), never capped (gates of
    sigmoid(-5.3) = 0.005 at every key: the whole row summed, to about 8), and more queries
    than a block."""
    from pe_bench.positions.base import KEY_BLOCK
    from tests.model.old_paths import cope_bias

    cope = build_scheme({"name": "cope"}, dims)
    torch.nn.init.normal_(cope.pos_emb)
    s = 3 * KEY_BLOCK + 100
    generator = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, s_q, 8, generator=generator)
    k = torch.randn(2, 4, s, 8, generator=generator)
    if scale:  # q . k / sqrt(8) = -5.3: every gate 0.005
        q, k = torch.ones_like(q), torch.full_like(k, -5.3 * 8**0.5 / 8)
    pos = torch.arange(s)
    allowed = causal_allowed(s_q, s, q.device)
    got = cope.score_bias(q, k, pos[-s_q:], pos, 0)
    expected = cope_bias(cope, q, k, pos[-s_q:], pos, 0)
    assert torch.allclose(got[..., allowed], expected[..., allowed], rtol=1e-5, atol=1e-5)
