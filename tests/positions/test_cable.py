"""CABLE: the attention layer's output pinned to the authors' code, the bias by hand, causality,
long windows, its weights in the attention probe, the conformance kit."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pe_bench.conformance import assert_conforms
from pe_bench.model.attention import attention_path, causal_allowed
from pe_bench.model.gpt import GPT, CausalSelfAttention, ForwardContext, ModelConfig
from pe_bench.positions import ModelDims, build_scheme
from pe_bench.positions.fingerprint import class_key
from pe_bench.positions.gates import Cable
from pe_bench.run.attention_weights import (
    layer_qkv,
    observed_attention,
    own_attention_weights,
)

DIMS = ModelDims(d_model=8, num_heads=2, head_dim=4, num_layers=1, train_len=16)

# axiomlab/Cable at 8bc6b83, src/Cable.py: CausalSelfAttention(n_embd 8, n_head 2, block_size
# 6) with c_attn's weight and h_attn's weight and bias as ``pinned_layer`` sets them (c_attn's
# bias 0, c_proj the identity with bias 0), on the input ``inputs()``: y [6, 8].
OUTPUT = [
    [-0.2168830, 0.1372543, -0.0531118, -0.0327762, 0.1175870, -0.1985305, 0.2729469, -0.3383838],
    [-0.1245716, 0.0649142, -0.0031214, -0.0587729, 0.1184551, -0.1805808, 0.2367674, -0.2851672],
    [0.0487912, -0.0483975, 0.0464131, -0.0429018, 0.0610214, -0.0748971, 0.0863072, -0.0948817],
    [0.1657817, -0.1111258, 0.0528157, 0.0072308, -0.0334967, 0.0721569, -0.1084465, 0.1411662],
    [0.1283304, -0.0725732, 0.0144289, 0.0441888, -0.0597944, 0.1000702, -0.1370559, 0.1695328],
    [-0.0033145, 0.0165926, -0.0293259, 0.0410940, -0.0287869, 0.0384736, -0.0468943, 0.0537736],
]


def inputs() -> torch.Tensor:
    return torch.sin(1.7 * torch.arange(48, dtype=torch.float32) + 0.2).reshape(1, 6, 8)


def pinned_layer(options: dict | None = None) -> tuple[CausalSelfAttention, Cable]:
    """pe-bench's attention layer and CABLE with the reference's weights."""
    cable = build_scheme({"name": "cable", **(options or {})}, DIMS)
    layer = CausalSelfAttention(ModelConfig(d_model=8, num_layers=1, num_heads=2), 0)
    n, m = torch.arange(192, dtype=torch.float32), torch.arange(16, dtype=torch.float32)
    with torch.no_grad():
        layer.qkv.weight.copy_((0.4 * torch.sin(0.37 * n + 0.5)).reshape(24, 8))
        layer.proj.weight.copy_(torch.eye(8))
        cable.weight[0].copy_((0.8 * torch.cos(0.9 * m - 0.3)).reshape(2, 8))
        cable.bias[0].copy_(torch.tensor([0.5, -1.0]))
    return layer, cable


def test_the_layer_output_equals_the_authors_code():
    layer, cable = pinned_layer()
    assert attention_path(cable) == "scheme"
    with torch.no_grad():
        y = layer(inputs(), ForwardContext(cable, torch.arange(6), flex=False, bias_cache=None))
    torch.testing.assert_close(y[0], torch.tensor(OUTPUT), rtol=0, atol=2e-6)


def test_scaled_is_the_papers_one_over_sqrt_h_d():
    """``scaled: true`` divides q . k by sqrt(h_d) = 2: the same output as the code's
    unscaled logits with the queries halved, and not the pinned output."""
    layer, cable = pinned_layer({"scaled": True})
    x = inputs()
    q, k, v = (t.view(1, 6, 2, 4).transpose(1, 2) for t in layer.qkv(x).split(8, dim=2))
    pos = torch.arange(6)
    unscaled = build_scheme({"name": "cable"}, DIMS)
    unscaled.load_state_dict(cable.state_dict())
    torch.testing.assert_close(
        cable.attend(x, q, k, v, pos, 0), unscaled.attend(x, q / 2, k, v, pos, 0)
    )
    ctx = ForwardContext(cable, pos, flex=False, bias_cache=None)
    assert (layer(x, ctx)[0] - torch.tensor(OUTPUT)).abs().max() > 1e-2
    assert "unscaled" not in cable.caveat and "unscaled" in unscaled.caveat
    assert "44M-334M parameters" in cable.caveat  # the scale this model cannot show, both ways


def test_weights_by_hand():
    """z = 0 except at token 3: c_t falls by ln 2 a token, by softplus(2) at token 3; the
    weights are softmax(q.k + c_i - c_j) over earlier keys, read back through the probe's
    identity values."""
    cable = build_scheme({"name": "cable"}, DIMS)
    with torch.no_grad():
        cable.weight.zero_()
        cable.weight[0, :, 0] = 1.0  # z_t = x_t[0]
    x = torch.zeros(1, 5, 8)
    x[0, 3, 0] = 2.0  # softplus(2) at token 3, softplus(0) = ln 2 elsewhere
    # c_t = -sum_{l<=t} softplus(z_l): ln 2 a token, softplus(2) at token 3 instead
    c = -torch.tensor([1, 2, 3, 3, 4]) * math.log(2) - torch.tensor([0, 0, 0, 1, 1]) * F.softplus(
        torch.tensor(2.0)
    )
    q, k = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    logits = q @ k.transpose(-1, -2) + (c.view(-1, 1) - c.view(1, -1))
    expected = logits.masked_fill(~causal_allowed(5, 5, x.device), float("-inf")).softmax(-1)
    eye = torch.eye(5).expand(1, 2, 5, 5)
    torch.testing.assert_close(cable.attend(x, q, k, eye, torch.arange(5), 0), expected)


def test_causal_and_stable_far_past_training():
    """A change of token 7's input changes no output before it; at 8192 tokens of a strong
    decay the outputs are finite and the last query attends within a few tokens."""
    cable = build_scheme({"name": "cable"}, DIMS)
    x, q, k, v = torch.randn(1, 12, 8), *torch.randn(3, 1, 2, 12, 4)
    changed = x.clone()
    changed[0, 7] += 5.0
    pos = torch.arange(12)
    before, after = cable.attend(x, q, k, v, pos, 0), cable.attend(changed, q, k, v, pos, 0)
    assert torch.equal(before[..., :7, :], after[..., :7, :])
    with torch.no_grad():
        cable.bias.fill_(3.0)  # softplus(3) ~ 3 a token
    s = 8192
    x, q, k = torch.randn(1, s, 8) * 0.1, torch.randn(1, 2, s, 4), torch.randn(1, 2, s, 4)
    eye = torch.eye(s)[-64:].T.expand(1, 2, s, 64)  # values: the last 64 keys' indicators
    out = cable.attend(x, q, k, eye, torch.arange(s), 0)
    assert torch.isfinite(out).all()
    assert out[0, :, -1, -8:].sum(-1).min() > 0.99  # the last query's weight on its 8 nearest


def test_the_attention_probe_sees_the_bias():
    """The probe's weights of a CABLE model are those its layer attends with (the identity as
    values), rows summing to 1, and differ from its logits without the bias."""
    cfg = ModelConfig(d_model=8, num_layers=1, num_heads=2, mlp_ratio=2)
    model = GPT(cfg, build_scheme({"name": "cable"}, DIMS))
    with torch.no_grad():
        model.pe.bias.fill_(2.0)
    tokens = torch.randint(0, 256, (2, 20))
    seen = {}

    def keep(attn, args, output):
        seen["x"], seen["ctx"] = args

    handle = model.blocks[0].attn.register_forward_hook(keep)
    with observed_attention(model) as sums, torch.no_grad():
        model(tokens)
    handle.remove()
    attn, x, ctx = model.blocks[0].attn, seen["x"], seen["ctx"]
    q, k, _ = layer_qkv(attn, x, ctx)
    weights = own_attention_weights(attn, x, q, k, ctx)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 20))
    i, j = torch.arange(20).float(), torch.arange(20).float()
    distance = (i.unsqueeze(-1) - weights @ j.unsqueeze(-1)).sum().item() / (2 * 2 * 20)
    assert sums.distance[0] / sums.queries[0] == pytest.approx(distance, rel=1e-5)
    assert distance < 1.0  # softplus(2) a token: attention stays near the diagonal


def test_cable_conforms():
    report = assert_conforms("cable")
    assert report["causality"].status == "PASS" and report["attend"].status == "PASS"


def test_key_computes():
    assert len(class_key(Cable)) == 12
    assert class_key(Cable) != class_key(Cable, {"scaled": True})
