"""Issue 28's faster paths equal the code they replaced (``tests/model/old_paths.py``) within float
tolerance: in one query chunk and in several, in evaluation and in training (the loss and
every gradient), through the whole model with the scheme's parameters perturbed so that
every term counts."""

from __future__ import annotations

import pytest
import torch

from pe_bench.conformance.harness import perturbed
from pe_bench.model import attention
from pe_bench.model.gpt import GPT, ModelConfig, seeded_scheme
from pe_bench.positions import PositionScheme, build_scheme
from pe_bench.positions.contextual import CoPE
from pe_bench.positions.fire import FIRE
from pe_bench.positions.gates import ForgetGate, StickBreaking
from pe_bench.positions.logits import DAPE
from pe_bench.positions.relative import TransformerXL
from tests.model import old_paths

# scheme -> (class, hook, the hook's old code)
MOVED_HOOKS = {
    "stickbreaking": (StickBreaking, "attention_weights", old_paths.stickbreaking_weights),
    "cope": (CoPE, "score_bias", old_paths.cope_bias),
    "dape_alibi": (DAPE, "modify_logits", old_paths.dape_logits),
    "dape_kerple": (DAPE, "modify_logits", old_paths.dape_logits),
    "xl": (TransformerXL, "score_bias", old_paths.xl_bias),
    "fire": (FIRE, "score_bias", old_paths.fire_bias),
}
# Schemes whose attention path moved (the hook the new path reads, switched off for the old).
DISTANCE = ["alibi", "t5", "kerple_log", "kerple_power", "sandwich"]
MOVED_PATHS = {name: "bias_by_distance" for name in DISTANCE} | {"fox": "key_bias"}
LENGTH = 100  # 6x the training length of 16
CHUNKS = {"one chunk": None, "chunks of 7 queries": 2 * 4 * LENGTH * 7}


def model_of(name: str) -> GPT:
    cfg = ModelConfig(d_model=32, num_layers=2, num_heads=4, mlp_ratio=2)
    pe = perturbed(seeded_scheme(lambda d: build_scheme({"name": name}, d), cfg.dims(16), 0))
    torch.manual_seed(0)
    return GPT(cfg, pe)


def use_old_code(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Put the old code back for ``name``: its hook, the old masks, the old chunk size."""
    monkeypatch.setattr(attention, "masked_bias", old_paths.masked_bias)
    monkeypatch.setattr(attention, "CACHE_BUDGET", attention.MASK_BUDGET)
    if name in MOVED_HOOKS:
        cls, hook, old = MOVED_HOOKS[name]
        monkeypatch.setattr(cls, hook, old)
    elif MOVED_PATHS[name] == "bias_by_distance":
        monkeypatch.setattr(PositionScheme, "tabulated_by_distance", property(lambda s: False))
    else:
        monkeypatch.setattr(ForgetGate, "key_bias", PositionScheme.key_bias)


def outputs(model: GPT, idx: torch.Tensor, train: bool) -> list[torch.Tensor]:
    """Evaluation logits; or the training loss and the gradient of every parameter."""
    if not train:
        with torch.no_grad():
            return [model.eval()(idx)]
    model.train().zero_grad()
    loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    return [loss.detach()] + [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("name", [*MOVED_HOOKS, *MOVED_PATHS])
@pytest.mark.parametrize("chunks", CHUNKS)
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_moved_path_equals_the_old_code(name, chunks, train, monkeypatch):
    idx = torch.randint(0, 256, (2, LENGTH + 1), generator=torch.Generator().manual_seed(0))
    if CHUNKS[chunks]:
        monkeypatch.setattr(attention, "MASK_BUDGET", CHUNKS[chunks])
    model = model_of(name)
    new = outputs(model, idx, train)
    with monkeypatch.context() as old:
        use_old_code(name, old)
        before = outputs(model, idx, train)
    assert len(new) == len(before) > (2 if train else 0)
    for got, expected in zip(new, before, strict=True):
        assert torch.allclose(got, expected, rtol=1e-4, atol=1e-5), (got - expected).abs().max()


# ---- the paths themselves ---------------------------------------------------------------------


@pytest.mark.parametrize(("s_q", "s_k"), [(20, 20), (7, 20), (1, 5)])
def test_masks_equal_a_masked_fill(s_q, s_k):
    """The future keys are masked in the last s_q columns only: the same mask as before."""
    q = torch.randn(2, 4, s_q, 8)
    for bias in (None, torch.randn(4, s_q, s_k), torch.randn(2, 4, s_q, s_k)):
        got, expected = attention.masked_bias(bias, q, s_k), old_paths.masked_bias(bias, q, s_k)
        assert got.shape[-2:] == (s_q, s_k) and torch.equal(got.expand_as(expected), expected)


@pytest.mark.parametrize("budget", [None, 4 * 50 * 7, 4 * 50 * 50 - 1])  # 1, 8 or 2 chunks
def test_distance_path_equals_the_reference(budget, monkeypatch):
    """Masks copied from a table by distance, with their rows and queries reversed, give the
    bias written out, whatever the chunks (the last one shorter)."""
    if budget:
        monkeypatch.setattr(attention, "MASK_BUDGET", budget)
    q, k, v = (torch.randn(1, 4, 50, 8) for _ in range(3))
    table = torch.randn(4, 50)  # [n_h, s]: entry n at distance n
    distance = (torch.arange(50).unsqueeze(-1) - torch.arange(50)).clamp(min=0)
    expected = attention.reference_attention(q, k, v, table[:, distance])
    got = attention.distance_attention(q, k, v, table)
    assert torch.allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("s_q", [30, 9])  # the whole window, or its last queries
def test_key_biased_path_equals_the_reference(s_q):
    q, k, v = torch.randn(2, 4, s_q, 8), torch.randn(2, 4, 30, 8), torch.randn(2, 4, 30, 8)
    term = 10 * torch.randn(2, 4, 30).cumsum(-1)  # large, as FoX's cumulative log gates
    bias = torch.randn(2, 4, s_q, 1) + term.unsqueeze(-2)  # a term of the query as well
    got = attention.key_biased_attention(q, k, v, term)
    assert torch.allclose(got, attention.reference_attention(q, k, v, bias), atol=1e-5)


def test_key_biased_path_stays_fp32_under_bf16_autocast():
    """The term rides on q and k: in bf16 a term of -300 would be off by 1."""
    q, k, v = (torch.randn(1, 4, 64, 8).bfloat16() for _ in range(3))
    term = -torch.rand(1, 4, 64).cumsum(-1) * 10
    expected = attention.reference_attention(
        q.float(), k.float(), v.float(), term.unsqueeze(-2).expand(1, 4, 64, 64)
    )
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = attention.key_biased_attention(q, k, v, term)
    assert got.dtype == torch.bfloat16
    assert torch.allclose(got.float(), expected, atol=1e-2, rtol=1e-2)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")
def test_key_score_mod_equals_the_key_biased_path():
    """model.attention=flex: the key term as a FlexAttention score_mod (eager here)."""
    q, k, v = (torch.randn(2, 4, 40, 8) for _ in range(3))
    term = torch.randn(2, 4, 40).cumsum(-1)
    with torch.no_grad():
        got = attention.flex_attention(q, k, v, attention.key_score_mod(term), compiled=False)
    assert torch.allclose(got, attention.key_biased_attention(q, k, v, term), atol=1e-5)


def test_fox_attends_without_building_a_mask(monkeypatch):
    """FoX's D_ij = c_i - c_j reaches the model as -c_j (key_bias): no mask at all."""

    def no_mask(*args, **kwargs):
        raise AssertionError("a mask was built")

    monkeypatch.setattr(attention, "masked_bias", no_mask)
    model = model_of("fox")
    assert model.pe.has_key_bias
    model(torch.randint(0, 256, (2, 40))).sum().backward()  # training
    with torch.no_grad():
        model.eval()(torch.randint(0, 256, (2, LENGTH)))


@pytest.mark.parametrize("name", DISTANCE)
def test_relative_biases_are_copied_from_a_table(name, monkeypatch):
    calls = []
    real = attention.distance_attention
    monkeypatch.setattr(
        "pe_bench.model.attention.distance_attention", lambda *a: calls.append(1) or real(*a)
    )
    with torch.no_grad():
        model_of(name).eval()(torch.randint(0, 256, (2, LENGTH)))
    assert len(calls) == 2  # one per layer


def test_xl_projects_its_sinusoids_once_per_layer_and_window(monkeypatch):
    """The query chunks of a long window reuse one projected table (the longest chunk first);
    with gradients on every call projects its own (the graph needs it)."""
    monkeypatch.setattr(attention, "MASK_BUDGET", 2 * 4 * LENGTH * 7)  # 15 chunks
    model = model_of("xl").eval()
    calls = []
    for layer in model.pe.r_net:
        layer.register_forward_hook(lambda *a: calls.append(1))
    with torch.no_grad():
        model(torch.randint(0, 256, (2, LENGTH)))
    assert len(calls) == 2  # one per layer
    model.train()(torch.randint(0, 256, (2, 20))).sum().backward()
    assert len(calls) == 4
    with torch.no_grad():
        model.pe.r_net[0].weight.add_(1.0)  # as an optimizer step: layer 0's table is stale
        model.eval()(torch.randint(0, 256, (2, LENGTH)))
    assert len(calls) == 5


@pytest.mark.parametrize(
    ("device", "expected"), [("cpu", 2**21 // (8 * 4 * 1024)), ("cuda", 2**25 // (8 * 4 * 1024))]
)
def test_query_chunks_fit_the_cache_on_the_cpu(device, expected):
    assert attention.query_chunk(8, 4, 1024, torch.device(device)) == expected


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (FlexAttention)")
def test_key_paths_agree_under_cuda_bf16_autocast():
    """On a GPU in bf16 autocast the key path (fp32 SDPA) and FlexAttention's score_mod give
    the written-out attention up to bf16 rounding. Head dim 16: FlexAttention's CUDA kernel
    refuses less (torch 2.11 on an H200: 'NYI: embedding dimension ... at least 16 but got E=8')."""
    q, k, v = (torch.randn(1, 4, 1024, 16, device="cuda").bfloat16() for _ in range(3))
    term = -torch.rand(1, 4, 1024, device="cuda").cumsum(-1)
    expected = attention.reference_attention(
        q.float(), k.float(), v.float(), term.unsqueeze(-2).expand(1, 4, 1024, 1024)
    )
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        fused = attention.key_biased_attention(q, k, v, term)
        flex = attention.flex_attention(q, k, v, attention.key_score_mod(term))
    for got in (fused, flex):
        assert torch.allclose(got.float(), expected, atol=2e-2, rtol=2e-2)
