"""PoPE: logits and attention output pinned to the authors' code, the widened q and k through
the model, the relative shift, the bias clamp, the conformance kit."""

from __future__ import annotations

import math

import pytest
import torch

from pe_bench.conformance import assert_conforms
from pe_bench.model.attention import attention_logits, causal_attention, widened
from pe_bench.model.gpt import CausalSelfAttention, ForwardContext, ModelConfig
from pe_bench.positions import ModelDims, build_scheme
from pe_bench.positions.fingerprint import class_key
from pe_bench.positions.polar import PoPE

DIMS = ModelDims(d_model=8, num_heads=2, head_dim=4, num_layers=1, train_len=16)
BIAS = [[-0.5, -3.0, 0.4, -7.0], [-1.0, 0.0, -6.0, -2.5]]  # 0.4 and -7 exercise the clamp

# lucidrains/PoPE-pytorch at ee11cab (PoPE_pytorch/pope.py, attention.py): PoPE(4, heads=2)
# with its bias set to BIAS, pos_emb = pope(5), apply_pope_to_qk(pos_emb, q, k) and
# logits = q'.k' * 4 ** -0.5; out = flash_attn_with_pope(q, k, v, pos_emb, causal=True,
# fused=False), q, k, v as ``inputs()`` makes them. pope(5, offset=100) gave the same numbers
# to 3e-7.
LOGITS = [
    [
        [1.2225878, 0.3964715, 0.6489449, 0.9079990, -0.3078049],
        [0.0404165, 0.2046065, 0.1659204, 0.1407196, -0.3847553],
        [0.8266410, 0.2672896, 0.8651446, 1.9132298, 0.4747152],
        [-1.0829737, -0.4346073, 0.0459573, 0.5147552, 0.5406165],
        [0.9929045, 0.1837883, 0.6779184, 1.5094260, 0.5777831],
    ],
    [
        [0.3666563, 1.0536706, 1.8551568, 0.1139608, 0.0452640],
        [-0.0545453, -0.1660771, 0.2253686, 0.0546653, -0.1510404],
        [0.0511557, 0.7258136, 2.3037477, 0.9966627, 0.5003312],
        [-0.0405468, -0.1326817, 0.0128079, 0.0879631, -0.0038838],
        [0.2856408, 0.5507979, 0.8880367, 0.3253789, 0.3677320],
    ],
]
OUTPUT = [
    [
        [0.0000000, 0.9635582, 0.5155014, -0.6877661],
        [-0.4779097, 0.5586864, 0.7768056, -0.1430969],
        [-0.5229312, 0.1128457, 0.5833036, 0.1992204],
        [-0.3395551, -0.5091009, 0.0671871, 0.5450463],
        [-0.0451387, -0.2495551, -0.0883728, 0.2022761],
    ],
    [
        [0.7625585, 0.8273283, -0.3199385, -0.9984950],
        [0.3013606, 0.8540244, 0.1555409, -0.7708101],
        [-0.7070976, 0.2060887, 0.8173554, 0.2311928],
        [-0.3001435, 0.1535613, 0.3822985, 0.0509672],
        [-0.2632703, 0.0260803, 0.2772231, 0.1222328],
    ],
]


def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v ``[1, 2, 5, 4]`` from fixed formulas (no generator: the same everywhere)."""
    n = torch.arange(40, dtype=torch.float32)
    shape = (1, 2, 5, 4)
    q = (1.5 * torch.sin(0.7 * n + 0.3)).reshape(shape)
    k = (1.2 * torch.cos(0.45 * n - 0.2)).reshape(shape)
    return q, k, torch.sin(1.3 * n).reshape(shape)


def pinned_pope() -> PoPE:
    pope = build_scheme({"name": "pope"}, DIMS)
    with torch.no_grad():
        pope.phase_bias[0].copy_(torch.tensor(BIAS))
    return pope


@pytest.mark.parametrize("offset", [0, 100])
def test_logits_and_output_equal_the_authors_code(offset):
    pope, (q, k, v) = pinned_pope(), inputs()
    pos = torch.arange(5) + offset
    logits = attention_logits(pope, q, k, pos, pos)
    torch.testing.assert_close(logits[0], torch.tensor(LOGITS), rtol=0, atol=2e-6)
    tq, tk = pope.transform_qk(q, k, pos, pos, 0)
    out = causal_attention(tq, tk, widened(v, tq.shape[-1]))[..., :4]
    torch.testing.assert_close(out[0], torch.tensor(OUTPUT), rtol=0, atol=2e-6)


def test_the_model_layer_attends_as_the_authors_code():
    """CausalSelfAttention with q, k, v projected to ``inputs()``: v padded to q and k's
    width 8 for the fused kernel, the output cut back to 4 columns, as the reference's."""
    pope, (q, k, v) = pinned_pope(), inputs()
    layer = CausalSelfAttention(ModelConfig(d_model=8, num_layers=1, num_heads=2), 0)
    x = torch.eye(8)[:5].unsqueeze(0)  # token t is the unit vector e_t
    with torch.no_grad():
        # row (head h, dim c) of each projection maps e_t to that tensor's value at t
        rows = [t[0].permute(0, 2, 1).reshape(8, 5) for t in (q, k, v)]
        layer.qkv.weight.copy_(torch.cat([torch.cat([r, torch.zeros(8, 3)], 1) for r in rows]))
        layer.proj.weight.copy_(torch.eye(8))
        got = layer(x, ForwardContext(pope, torch.arange(5), flex=False, bias_cache=None))
    expected = torch.tensor(OUTPUT).transpose(0, 1).reshape(5, 8)  # heads side by side
    torch.testing.assert_close(got[0], expected, rtol=0, atol=2e-6)


def test_frequencies_and_the_clamped_bias():
    """h_d frequencies base^(-c/h_d) (RoPE has h_d/2); the bias enters clamped to [-2 pi, 0]:
    a bias of 0.4 acts as 0, one of -7 as -2 pi."""
    pope = pinned_pope()
    assert pope.theta.tolist() == pytest.approx([10000 ** (-c / 4) for c in range(4)], rel=1e-6)
    clamped = build_scheme({"name": "pope"}, DIMS)
    with torch.no_grad():
        clamped.phase_bias[0].copy_(torch.tensor(BIAS).clamp(-2 * math.pi, 0))
    q, k, _ = inputs()
    pos = torch.arange(5)
    torch.testing.assert_close(
        attention_logits(pope, q, k, pos, pos), attention_logits(clamped, q, k, pos, pos)
    )


def test_magnitudes_carry_content_and_phases_position():
    """The bias 0 at init: q = k gives logits sum_c softplus(q_c)^2 cos((i-j) theta_c) / 2,
    the largest at distance 0 for every content (phases alone order the keys)."""
    pope = build_scheme({"name": "pope"}, DIMS)
    q = torch.randn(1, 2, 1, 4).expand(1, 2, 9, 4)
    logits = attention_logits(pope, q, q, torch.arange(9), torch.arange(9))[0, :, -1]
    m2 = torch.nn.functional.softplus(q[0, :, 0]) ** 2  # [n_h, h_d]
    distance = torch.arange(8, -1, -1).float()
    expected = (m2.unsqueeze(1) * torch.cos(distance.unsqueeze(-1) * pope.theta)).sum(-1) / 2
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-6)
    assert (logits.argmax(-1) == 8).all()


def test_uniform_init_draws_the_bias_in_its_range():
    pope = build_scheme({"name": "pope", "bias_uniform_init": True}, DIMS)
    assert (pope.phase_bias >= -2 * math.pi).all() and (pope.phase_bias <= 0).all()
    assert pope.phase_bias.std() > 1


def test_pope_conforms():
    report = assert_conforms("pope")
    assert report["relative"].status == "PASS" and report["causality"].status == "PASS"


def test_key_computes():
    assert len(class_key(PoPE)) == 12
    assert class_key(PoPE) != class_key(PoPE, {"base": 500.0})
