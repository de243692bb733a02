"""FoX's forget-gate bias and stick-breaking attention: hand-computed numbers for a few
tokens, the reference's formula, causality and long windows."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pe_bench.model.attention import attention_logits, causal_allowed
from pe_bench.positions import build_scheme
from tests.helpers import tiny_model

# ---- FoX -------------------------------------------------------------------------------------

GATES = [0.9, 0.5, 0.8, 0.25]  # f_0 .. f_3 (f_0 is never used: D sums from j + 1)


def fox_with_gates(dims, gates: list[float]) -> tuple[torch.nn.Module, torch.Tensor]:
    """FoX whose gate reads dimension 0 of the key (w = e_0, b = 0), and keys whose first
    entry is logit(f_t), so that f_t are the given gates in every head."""
    fox = build_scheme({"name": "fox"}, dims)
    with torch.no_grad():
        fox.gate_weight.zero_()
        fox.gate_weight[..., 0] = 1.0
    k = torch.randn(1, dims.num_heads, len(gates), dims.head_dim)
    k[..., 0] = torch.logit(torch.tensor(gates))
    return fox, k


def test_fox_bias_for_four_tokens_by_hand(dims):
    fox, k = fox_with_gates(dims, GATES)
    q, pos = torch.randn(1, 4, 4, 8), torch.arange(4)
    bias = fox.score_bias(q, k, pos, pos, 1)  # [1, n_h, 4, 4]
    expected = {  # D_ij = sum_{l=j+1..i} ln f_l
        (0, 0): 0.0,
        (1, 0): math.log(0.5),
        (2, 0): math.log(0.5 * 0.8),
        (3, 0): math.log(0.5 * 0.8 * 0.25),
        (2, 1): math.log(0.8),
        (3, 1): math.log(0.8 * 0.25),
        (3, 2): math.log(0.25),
        (3, 3): 0.0,
    }
    for (i, j), value in expected.items():
        assert torch.allclose(bias[0, :, i, j], torch.tensor(value), atol=1e-6), (i, j)


def test_fox_adds_the_bias_to_nope_logits(dims):
    fox, k = fox_with_gates(dims, GATES)
    q, pos = torch.randn(1, 4, 4, 8), torch.arange(4)
    expected = q @ k.transpose(-2, -1) / math.sqrt(8) + fox.score_bias(q, k, pos, pos, 0)
    assert torch.allclose(attention_logits(fox, q, k, pos, pos), expected, atol=1e-6)


def test_fox_bias_is_causal(dims):
    """Changing token t's key (its gate) leaves every row i < t as it was."""
    fox = build_scheme({"name": "fox"}, dims)
    torch.nn.init.normal_(fox.gate_weight)
    q, k, pos = torch.randn(1, 4, 12, 8), torch.randn(1, 4, 12, 8), torch.arange(12)
    changed = k.clone()
    changed[..., 7, :] += 3.0
    before, after = (fox.score_bias(q, keys, pos, pos, 0) for keys in (k, changed))
    assert torch.equal(before[..., :7, :7], after[..., :7, :7])
    assert not torch.allclose(before[..., 7:, :7], after[..., 7:, :7])


def test_fox_queries_alone_and_shifted_positions_get_the_same_bias(dims):
    fox = build_scheme({"name": "fox"}, dims)
    torch.nn.init.normal_(fox.gate_weight)
    q, k, pos = torch.randn(2, 4, 20, 8), torch.randn(2, 4, 20, 8), torch.arange(20)
    full = fox.score_bias(q, k, pos, pos, 1)
    alone = fox.score_bias(q[..., -5:, :], k, pos[-5:], pos, 1)
    assert torch.allclose(full[..., -5:, :], alone, atol=1e-6)
    assert torch.equal(full, fox.score_bias(q, k, pos + 1000, pos + 1000, 1))  # reads no position


def test_fox_starts_as_the_reference_gate(dims):
    # zhixuan-lin/forgetting-transformer: fgate_proj weights N(0, 0.02), bias 0: f ~ 1/2
    fox = build_scheme({"name": "fox"}, dims)
    assert fox.gate_weight.shape == (2, 4, 8) and not fox.gate_bias.any()
    assert fox.gate_weight.std().item() == pytest.approx(0.02, rel=0.3)
    assert "from each head's key" in fox.caveat


def test_fox_is_stable_far_past_training(dims):
    """8192 tokens of strong forgetting: the cumulative sum stays finite, every allowed entry
    is <= 0, and entries near the diagonal match a float64 sum."""
    fox = build_scheme({"name": "fox"}, dims)
    with torch.no_grad():
        fox.gate_bias.fill_(-3.0)  # f ~ 0.05: c_t ~ -3 t
    s = 8192
    k, pos = torch.randn(1, 4, s, 8), torch.arange(s)
    bias = fox.score_bias(k[..., -4:, :], k, pos[-4:], pos, 0)
    allowed = causal_allowed(4, s, k.device)
    assert torch.isfinite(bias[..., allowed]).all() and (bias[..., allowed] <= 0).all()
    w, b = fox.gate_weight[0].double(), fox.gate_bias[0].double()
    log_f = F.logsigmoid(torch.einsum("bhkd,hd->bhk", k.double(), w) + b.unsqueeze(-1))
    exact = log_f[..., -3:].sum(-1)  # D_{s-1, s-4}: ln f of the last three tokens, in float64
    assert torch.allclose(bias[0, :, -1, -4].double(), exact[0], atol=1e-2)


def test_fox_model_output_depends_on_the_gates():
    model = tiny_model("fox")
    x = torch.randint(0, 256, (1, 32))
    with torch.no_grad():
        before = model(x)
        model.pe.gate_bias.add_(5.0)
        after = model(x)
    assert not torch.allclose(before, after)


# ---- stick-breaking --------------------------------------------------------------------------


def sb_reference(logits: torch.Tensor) -> torch.Tensor:
    """shawntan/stickbreaking-attention ``sb_ref.stickbreaking`` with its tests' ``ref_fwd``
    (mask triu(0), cumulative weights tril(-1)), the remainder put on the query's own key."""
    s = logits.shape[-1]
    mask = torch.ones(s, s).triu(0).bool()
    cum_weight = torch.ones(s, s).tril(-1)
    log_z = F.logsigmoid(logits).masked_fill(mask, -1e5)
    log_beta = F.logsigmoid(-logits).masked_fill(mask, 0)
    re_cum_log_beta = torch.einsum("bhij,jk->bhik", log_beta, cum_weight)
    att = (log_z + re_cum_log_beta).exp()
    return att + torch.diag_embed(1 - att.sum(-1))


def test_stickbreaking_weights_for_three_keys_by_hand(dims):
    sb = build_scheme({"name": "stickbreaking"}, dims)
    logits = torch.zeros(1, 1, 3, 3)
    logits[0, 0, 1, 0] = math.log(4.0)  # beta_10 = 0.8
    logits[0, 0, 2, 0] = 0.0  # beta_20 = 0.5
    logits[0, 0, 2, 1] = math.log(3.0)  # beta_21 = 0.75
    logits[0, 0, 2, 2] = 7.0  # the query's own logit: unused (attend_current=False)
    weights = sb.attention_weights(logits, causal_allowed(3, 3, logits.device))[0, 0]
    expected = torch.tensor(
        [
            [1.0, 0.0, 0.0],  # the first query keeps its whole stick
            [0.8, 0.2, 0.0],  # beta_10, then the rest to itself
            [0.5 * 0.25, 0.75, 0.5 * 0.25],  # beta_20 (1 - beta_21), beta_21, the rest
        ]
    )
    assert torch.allclose(weights, expected, atol=1e-6)


def test_stickbreaking_equals_the_reference_formula(dims):
    sb = build_scheme({"name": "stickbreaking"}, dims)
    logits = 2 * torch.randn(2, 4, 20, 20)
    got = sb.attention_weights(logits, causal_allowed(20, 20, logits.device))
    assert torch.allclose(got, sb_reference(logits), atol=1e-5)


def test_stickbreaking_queries_alone_get_the_last_rows(dims):
    sb = build_scheme({"name": "stickbreaking"}, dims)
    logits = torch.randn(2, 4, 20, 20)
    full = sb.attention_weights(logits, causal_allowed(20, 20, logits.device))
    alone = sb.attention_weights(logits[..., -6:, :], causal_allowed(6, 20, logits.device))
    assert torch.allclose(full[..., -6:, :], alone, atol=1e-6)


def test_stickbreaking_uses_nope_logits_over_sqrt_head_dim(dims):
    """The reference's inverse temperature 1/sqrt(h_d), with no position term."""
    sb = build_scheme({"name": "stickbreaking"}, dims)
    q, k, pos = torch.randn(1, 4, 10, 8), torch.randn(1, 4, 10, 8), torch.arange(10)
    expected = q @ k.transpose(-2, -1) / math.sqrt(8)
    assert torch.allclose(attention_logits(sb, q, k, pos, pos), expected, atol=1e-6)


def test_stickbreaking_rows_far_past_training_are_finite_and_sum_to_one(dims):
    sb = build_scheme({"name": "stickbreaking"}, dims)
    s = 4096
    logits = 3 * torch.randn(1, 2, 8, s)
    weights = sb.attention_weights(logits, causal_allowed(8, s, logits.device))
    allowed = causal_allowed(8, s, logits.device)
    assert torch.isfinite(weights).all() and (weights >= 0).all()
    assert not weights[..., ~allowed].any()
    assert torch.allclose(weights.sum(-1), torch.ones(1, 2, 8), atol=1e-5)


def test_stickbreaking_model_attends_through_its_weights(monkeypatch):
    """The model attends through attention_weights (the explicit path), once per layer."""
    model = tiny_model("stickbreaking")
    calls = []
    real = model.pe.attention_weights
    monkeypatch.setattr(model.pe, "attention_weights", lambda *a: calls.append(1) or real(*a))
    with torch.no_grad():
        out = model(torch.randint(0, 256, (1, 64)))
    assert len(calls) == 2 and torch.isfinite(out).all()


def test_stickbreaking_far_keys_weigh_zero_and_match_the_old_code(dims):
    """Past the training length the stick is spent within a few hundred keys: the far keys'
    weights are exactly 0 (none subnormal, none at the clamp's e tiny), and every weight equals
    the code before the floor (``tests/model/old_paths.py``) within float tolerance, in a long
    window, for the last queries alone and with gradients."""
    from tests.model.old_paths import stickbreaking_weights

    sb = build_scheme({"name": "stickbreaking"}, dims)
    s = 2048
    logits = 3 * torch.randn(1, 2, 8, s, generator=torch.Generator().manual_seed(0))
    allowed = causal_allowed(8, s, logits.device)
    got = sb.attention_weights(logits, allowed)
    expected = stickbreaking_weights(sb, logits, allowed)
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-30)
    tiny = (got > 0) & (got <= 1e-30)
    assert not tiny.any() and (got[..., : s // 2] == 0).all()
    leaf = logits.clone().requires_grad_()
    (sb.attention_weights(leaf, allowed) * torch.randn(1, 2, 8, s)).sum().backward()
    assert torch.isfinite(leaf.grad).all()


@pytest.mark.parametrize(
    ("shift", "s_q"),
    [(-9.0, 8), (-2.3, 8), (0.0, 700), (-2.3, 700)],
    ids=["never-spent", "spent-in-a-later-block", "queries-past-a-block", "both"],
)
def test_stickbreaking_blocks_of_keys_equal_one_sum_over_the_row(dims, shift, s_q):
    """The sum by blocks of ``KEY_BLOCK`` keys, stopped once every stick is spent, gives the
    code before it (one reversed cumulative sum over the whole row, no floor: old_paths)
    within float tolerance: sticks never spent (every block summed, the remainder kept),
    spent a few blocks back (about 0.1 a key), and more queries than a block holds."""
    from pe_bench.positions.base import KEY_BLOCK
    from tests.model.old_paths import stickbreaking_weights

    sb = build_scheme({"name": "stickbreaking"}, dims)
    s = 4 * KEY_BLOCK + 100
    generator = torch.Generator().manual_seed(1)
    logits = shift + torch.randn(2, 2, s_q, s, generator=generator)
    allowed = causal_allowed(s_q, s, logits.device)
    got = sb.attention_weights(logits, allowed)
    expected = stickbreaking_weights(sb, logits, allowed)
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-30)
    assert torch.allclose(got.sum(-1), torch.ones(2, 2, s_q), atol=1e-5)
    if shift == -9.0:  # nothing spent: the remainder is most of every stick
        assert (got.diagonal(s - s_q, dim1=-2, dim2=-1) > 0.1).all()
