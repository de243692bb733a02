"""The shared model: causality for every scheme, identical trunks, lengths past training."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from pe_bench.errors import UserError
from pe_bench.model import attention
from pe_bench.model.attention import attention_path
from pe_bench.model.gpt import ModelConfig
from tests.helpers import FAST_LANE, TRAINABLE, VARIANTS, tiny_model, with_variant

ALL = [(name, tiny_model) for name in TRAINABLE] + [(name, with_variant) for name in VARIANTS]


@pytest.mark.parametrize(("name", "make"), ALL, ids=[n for n, _ in ALL])
def test_future_tokens_never_change_past_outputs(name, make):
    model = make(name)
    x = torch.randint(0, 256, (2, 48))  # 3x the training length: variants are active
    changed = x.clone()
    t = 30
    changed[:, t] = (changed[:, t] + 1) % 256
    with torch.no_grad():  # the same evaluation draw of positions for both (randomized)
        model.pe.seed_eval_positions(0)
        before = model(x)
        model.pe.seed_eval_positions(0)
        after = model(changed)
    assert torch.allclose(before[:, :t], after[:, :t], atol=1e-5), f"{name} leaks the future"
    assert not torch.allclose(before[:, t], after[:, t]), "the changed token must matter"


@pytest.mark.parametrize(("name", "make"), ALL, ids=[n for n, _ in ALL])
def test_every_scheme_runs_at_four_times_training_length(name, make):
    model = make(name)
    with torch.no_grad():
        logits = model(torch.randint(0, 256, (1, 64)))
    assert logits.shape == (1, 64, 256)
    assert torch.isfinite(logits).all()


# The function ``attend`` calls on each path ``attention_path`` names.
PATH_FUNCTIONS = {
    "windowed": "windowed_attention",
    "explicit": "explicit_attention",
    "mask": "biased_attention",
    "key_bias": "key_biased_attention",
    "causal": "causal_attention",
    "distance": "distance_attention",
}


@pytest.mark.parametrize(
    ("name", "make"),
    [pytest.param(n, m, marks=[] if n in FAST_LANE else [pytest.mark.slow]) for n, m in ALL],
    ids=[n for n, _ in ALL],
)
def test_the_model_attends_on_the_path_attention_path_names(name, make, monkeypatch):
    """One function names the path (the cost report prints it) and the model takes it."""
    model = make(name)
    taken = []
    own = model.pe.attend  # the scheme's own path: its method
    monkeypatch.setattr(model.pe, "attend", lambda *a: taken.append("scheme") or own(*a))
    if attention_path(model.pe) != "scheme":  # (inside its attend it may call any fused op)
        for path, function in PATH_FUNCTIONS.items():
            real = getattr(attention, function)
            spy = lambda *a, _path=path, _real=real, **k: taken.append(_path) or _real(*a, **k)  # noqa: E731
            monkeypatch.setattr(attention, function, spy)
    with torch.no_grad():
        model(torch.randint(0, 256, (1, 48)))  # 3x the training length: variants are active
    assert set(taken) == {attention_path(model.pe)}


def test_a_scheme_that_attends_itself_gets_each_layers_normed_input(monkeypatch):
    """attend replaces every attention path (no fused function is called), once per layer,
    with the block's ln1 output as x; every built-in scheme keeps its own path."""
    from tests.plugins import input_gate  # noqa: F401  (registers input_gate)

    model = tiny_model("input_gate")
    assert attention_path(model.pe) == "scheme"
    for function in PATH_FUNCTIONS.values():
        monkeypatch.setattr(attention, function, lambda *a, **k: pytest.fail("a fused path ran"))
    seen, normed = [], []
    real = model.pe.attend
    monkeypatch.setattr(model.pe, "attend", lambda x, *a: seen.append((x, a[-1])) or real(x, *a))
    for block in model.blocks:
        block.ln1.register_forward_hook(lambda m, i, out: normed.append(out))
    x = torch.randint(0, 256, (2, 20))
    with torch.no_grad():
        logits = model(x)
    assert [layer for _, layer in seen] == [0, 1]
    assert all(torch.equal(got, want) for (got, _), want in zip(seen, normed, strict=True))
    assert torch.isfinite(logits).all()
    with torch.no_grad():  # the gate reads x: the output depends on it
        model.pe.gate.zero_()
        assert not torch.allclose(model(x), logits)
    assert not any(tiny_model(n).pe.has_own_attention for n in FAST_LANE if n not in VARIANTS)


def test_trunk_initialisation_is_the_same_for_every_scheme():
    cfg = ModelConfig(d_model=32, num_layers=2, num_heads=4, mlp_ratio=2)
    from pe_bench.model.gpt import build_model

    models = {name: build_model(cfg, {"name": name}, 16, seed=3) for name in TRAINABLE}
    reference = {k: v for k, v in models["nope"].state_dict().items() if not k.startswith("pe.")}
    for name, model in models.items():
        trunk = {k: v for k, v in model.state_dict().items() if not k.startswith("pe.")}
        assert trunk.keys() == reference.keys()
        assert all(torch.equal(trunk[k], reference[k]) for k in trunk), name


def test_position_parameters_are_counted():
    counts = {name: tiny_model(name).num_params() for name in ("nope", "learned", "t5")}
    assert counts["nope"]["pe_params"] == 0
    assert counts["learned"]["pe_params"] == 16 * 16 * 32  # 16 x train_len rows of d_model
    assert counts["t5"]["pe_params"] == 32 * 4  # buckets x heads
    assert counts["learned"]["params"] - counts["nope"]["params"] == counts["learned"]["pe_params"]


def test_heads_must_divide_width():
    with pytest.raises(UserError, match=r"num_heads \(3\) must divide model.d_model \(32\)"):
        ModelConfig(d_model=32, num_heads=3)


def test_learned_model_refuses_past_its_table_before_any_forward():
    """The length is refused when the run is planned (``check_length``); the forward pass
    never reads a position back to the host to check it."""
    model = tiny_model("learned", max_positions=20)
    model.pe.check_length(20)
    with pytest.raises(UserError, match="cannot serve length 24"):
        model.pe.check_length(24)


def test_forward_context_is_built_once_per_pass(monkeypatch):
    """Every block gets the same context: the scheme, the positions, the attention path and
    the shared mask cache."""
    from pe_bench.model import gpt as model_module

    seen = []
    forward = model_module.Block.forward
    monkeypatch.setattr(
        model_module.Block,
        "forward",
        lambda self, x, ctx: seen.append(ctx) or forward(self, x, ctx),
    )
    model = tiny_model("alibi")
    with torch.no_grad():
        model(torch.randint(0, 256, (1, 12)))
    assert len(seen) == 2 and seen[0] is seen[1]
    ctx = seen[0]
    assert ctx.pe is model.pe and torch.equal(ctx.pos, torch.arange(12))
    assert ctx.flex is False and ctx.bias_cache == {}  # kept for a shared bias...
    assert model.pe.bias_by_distance(ctx.pos, 0) is not None  # ...alibi's comes by distance


def test_seeded_scheme_leaves_the_global_generator_alone(dims):
    from functools import partial

    from pe_bench.model.gpt import seeded_scheme
    from pe_bench.positions import build_scheme

    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    first = seeded_scheme(partial(build_scheme, {"name": "t5"}), dims, seed=0)
    assert torch.equal(torch.rand(3), expected)
    second = seeded_scheme(partial(build_scheme, {"name": "t5"}), dims, seed=0)
    torch.manual_seed(1)  # seed + 1: what the scheme was built under
    assert torch.equal(first.bias.weight, second.bias.weight)
    third = seeded_scheme(partial(build_scheme, {"name": "kerple_log"}), dims, seed=0)
    torch.manual_seed(1)
    assert torch.equal(third.raw_r1, build_scheme({"name": "kerple_log"}, dims).raw_r1)


def test_unknown_attention_is_a_clear_error():
    with pytest.raises(UserError, match="model.attention='fast' is not one of auto, sdpa, flex"):
        ModelConfig(attention="fast")


# ---- on a CUDA GPU ---------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
GPU_SCHEMES = ["rope", "alibi", "t5", "xl", "learned", "fire", "cope"]


def _loss_and_grads(model, x: torch.Tensor, run=None) -> tuple[torch.Tensor, dict]:
    """One training step's loss and gradients; ``run``: the model as called (compiled)."""
    model.zero_grad(set_to_none=True)
    loss = (model if run is None else run)(x[:, :-1], x[:, 1:])
    loss.backward()
    return loss.detach().float(), {n: p.grad.float() for n, p in model.named_parameters()}


@needs_cuda
@pytest.mark.parametrize("name", GPU_SCHEMES)
def test_bf16_autocast_follows_fp32_on_cuda(name):
    """A training step under bf16 autocast (what pe-bench trains with on a GPU) gives the fp32
    loss and gradients up to bf16 rounding."""
    from pe_bench.run.train import autocast

    device = torch.device("cuda")
    model = tiny_model(name).to(device).train()
    x = torch.randint(0, 256, (4, 65), device=device)
    torch.manual_seed(0)
    loss32, grads32 = _loss_and_grads(model, x)
    torch.manual_seed(0)
    with autocast(device):
        loss16, grads16 = _loss_and_grads(model, x)
    assert torch.isfinite(loss16)
    assert abs(loss16.item() - loss32.item()) < 0.02
    for n, g in grads32.items():
        assert torch.isfinite(grads16[n]).all(), n
        cosine = F.cosine_similarity(g.flatten(), grads16[n].flatten(), dim=0)
        assert cosine > 0.98 or g.abs().max() < 1e-6, (n, cosine.item())


@needs_cuda
@pytest.mark.parametrize("name", ["alibi", "t5", "kerple_log"])
def test_compiled_flex_training_step_matches_sdpa_on_cuda(name):
    """model.attention=flex under torch.compile (the scheme's term as a score_mod in the
    kernel) trains like the float-mask SDPA path: same loss, same gradients."""
    device = torch.device("cuda")
    sdpa = tiny_model(name).to(device).train()
    flex = copy.deepcopy(sdpa)
    sdpa.cfg.attention, flex.cfg.attention = "sdpa", "flex"
    x = torch.randint(0, 256, (4, 257), device=device)  # 256 tokens: two 128-token blocks
    loss_sdpa, grads_sdpa = _loss_and_grads(sdpa, x)
    loss_flex, grads_flex = _loss_and_grads(flex, x, run=torch.compile(flex))
    assert loss_flex.item() == pytest.approx(loss_sdpa.item(), abs=1e-4)
    for n, g in grads_sdpa.items():
        assert torch.allclose(grads_flex[n], g, rtol=1e-3, atol=1e-4), n


@needs_cuda
@pytest.mark.parametrize(("name", "make"), ALL, ids=[n for n, _ in ALL])
def test_forward_on_cuda_keeps_to_the_device(name, make):
    """Every buffer (the schemes' caches too) moves with the model, and a forward pass never
    waits on the GPU to read a value back (``set_sync_debug_mode("error")`` raises if it does),
    in evaluation and, for the schemes whose positions are fixed, in training."""
    device = torch.device("cuda")
    model = make(name).to(device)
    for key, buffer in model.named_buffers():
        assert buffer.device.type == "cuda", key
    x = torch.randint(0, 256, (2, 48), device=device)
    train = not name.startswith("randomized")  # randperm may synchronise

    def passes() -> None:
        with torch.no_grad():
            model.eval()(x)
        if train:
            model.train()(x[:, :-1], x[:, 1:]).backward()

    passes()  # warm-up: lazy initialisation (cuBLAS handles, ...) may synchronise
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        passes()
    finally:
        torch.cuda.set_sync_debug_mode("default")
