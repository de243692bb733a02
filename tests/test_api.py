"""The public API (``pe_bench.api``): a scheme built by name is the benchmark's scheme, and
``attention`` of a layer's q, k, v equals what the benchmark's model computes in that layer,
for every registered scheme (a plugin's too), in evaluation and in training."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

from pe_bench.api import attention, position_scheme
from pe_bench.errors import UserError
from pe_bench.model.gpt import GPT, ModelConfig, model_with_scheme, seeded_scheme
from pe_bench.positions import build_scheme, registered, scheme_class
from tests.helpers import tiny_model
from tests.plugins import input_gate  # noqa: F401  (registers input_gate: the attend hook)

SIZES = {"num_heads": 4, "head_dim": 8, "num_layers": 2, "train_len": 16}


def layer_inputs_and_outputs(model: GPT, idx: torch.Tensor) -> tuple[torch.Tensor, list]:
    """One forward pass of ``model``: its positions, and for each layer its normed input
    ``[b, s, d]``, the q, k, v its projection made ``[b, n_h, s, h_d]`` and the attention
    output it projected ``[b, s, d]``."""
    seen: dict = {}
    positions = model.pe.positions

    def spy(seq_len: int, device: torch.device) -> torch.Tensor:
        seen["pos"] = positions(seq_len, device)
        return seen["pos"]

    layers, hooks = [], []
    for block in model.blocks:
        entry: dict = {}
        attn = block.attn
        hooks.append(block.ln1.register_forward_hook(lambda m, i, o, e=entry: e.update(x=o)))
        hooks.append(attn.qkv.register_forward_hook(lambda m, i, o, e=entry: e.update(qkv=o)))
        hooks.append(attn.proj.register_forward_pre_hook(lambda m, i, e=entry: e.update(y=i[0])))
        layers.append(entry)
    model.pe.positions = spy
    try:
        model(idx)
    finally:
        del model.pe.positions
        for hook in hooks:
            hook.remove()
    b, s = idx.shape
    heads = model.cfg.num_heads
    split = []
    for entry in layers:
        qkv = entry["qkv"].detach().split(model.cfg.d_model, dim=2)
        q, k, v = (t.view(b, s, heads, -1).transpose(1, 2) for t in qkv)
        split.append((entry["x"].detach(), q, k, v, entry["y"].detach()))
    return seen["pos"], split


def assert_api_equals_the_model(model: GPT, train: bool) -> None:
    idx = torch.randint(0, 256, (2, 40))  # 2.5x the training length: variants are active
    model.train(train)
    with torch.set_grad_enabled(train):
        pos, layers = layer_inputs_and_outputs(model, idx)
        model.pe.read_tokens(idx)  # as a model around a scheme that reads the tokens does
        for layer, (x, q, k, v, expected) in enumerate(layers):
            y = attention(q, k, v, model.pe, x=x, pos=pos, layer=layer)
            got = y.transpose(1, 2).reshape(expected.shape)
            assert torch.equal(got, expected), (layer, (got - expected).abs().max())
        model.pe.read_tokens(None)


# Every registered scheme but the deliberately broken plugins of the conformance tests, which
# are registered when tests/conformance/ is collected first.
SCHEMES = sorted(n for n in registered() if scheme_class(n).__module__ != "tests.plugins.broken_pe")


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_attention_equals_the_models_for_every_registered_scheme(name, train):
    assert_api_equals_the_model(tiny_model(name), train)


def test_a_plugin_scheme_is_built_by_name_and_attends_as_in_the_model(example_plugin):
    pe = position_scheme("my_pe", plugin="my_pe", init_scale=4.0, **SIZES)
    assert type(pe).__name__ == "LearnedSlopes" and "my_pe" in registered()
    model = model_with_scheme(ModelConfig(d_model=32, num_layers=2, num_heads=4), pe, seed=0)
    assert_api_equals_the_model(model, train=True)


@pytest.mark.parametrize("name", ["learned", "fire", "yarn", "t5"])
def test_a_scheme_built_by_name_is_the_benchmarks(name):
    """The same class, options and parameters as the benchmark builds from ``pe=<name>``
    under the same seed (the model builds its scheme under seed + 1)."""
    options = {"factor": 4.0} if name == "yarn" else {}
    dims = ModelConfig(d_model=32, num_layers=2, num_heads=4).dims(16)
    expected = seeded_scheme(lambda d: build_scheme({"name": name, **options}, d), dims, 0)
    torch.manual_seed(1)
    got = position_scheme(name, **SIZES, **options)
    assert type(got) is type(expected) and got.dims == expected.dims
    ours, theirs = got.state_dict(), expected.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[key], theirs[key]) for key in ours)
    q, k, v = torch.randn(3, 1, 4, 24, 8).unbind(0)
    assert torch.equal(attention(q, k, v, got, layer=1), attention(q, k, v, expected, layer=1))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: position_scheme("rop", **SIZES), r"unknown scheme 'rop'; registered: alibi"),
        (lambda: position_scheme("rope", bse=2.0, **SIZES), r"no option bse; allowed: base"),
        (lambda: position_scheme("rope", **(SIZES | {"num_heads": 0})), r"num_heads=0 must be"),
        (lambda: position_scheme("rope", base=-1.0, **SIZES), r"base must be > 1, got -1.0"),
    ],
    ids=["unknown scheme", "unknown option", "no heads", "option out of range"],
)
def test_bad_schemes_are_one_line(call, message):
    with pytest.raises(UserError, match=message):
        call()


def test_bad_attention_inputs_are_one_line():
    pe = position_scheme("learned", max_positions=16, **SIZES)
    q = torch.randn(1, 4, 10, 8)
    bad = {
        r"share one shape .* v \(1, 4, 10, 4\)": lambda: attention(q, q, q[..., :4], pe),
        r"q has 2 heads of 8; scheme 'learned' was built for 4 heads of 8": lambda: attention(
            q[:, :2], q[:, :2], q[:, :2], pe
        ),
        r"layer=2 must be 0 .. 1": lambda: attention(q, q, q, pe, layer=2),
        r"mode='fast' is not one of auto, sdpa, flex": lambda: attention(q, q, q, pe, mode="fast"),
        r"pos has shape \(9,\); it must be \[s\] = \[10\]": lambda: attention(
            q, q, q, pe, pos=torch.arange(9)
        ),
        r"cannot serve length 20": lambda: attention(*torch.randn(3, 1, 4, 20, 8), pe),
        r"must be a PositionScheme": lambda: attention(q, q, q, "rope"),
        r"x has shape \(1, 10, 8\); it must be \[b, s, d\] = \[1, 10, 32\]": lambda: attention(
            q, q, q, pe, x=torch.randn(1, 10, 8)
        ),
    }
    for message, call in bad.items():
        with pytest.raises(UserError, match=message):
            call()


def test_a_scheme_that_reads_the_layers_input_needs_it():
    pe = position_scheme("input_gate", **SIZES)
    q = torch.randn(1, 4, 10, 8)
    with pytest.raises(UserError, match=r"scheme 'input_gate' computes its attention from the"):
        attention(q, q, q, pe)


def test_default_positions_are_the_schemes():
    """Without ``pos`` the scheme's own positions: 0 .. s-1 for a scheme that keeps them."""
    pe = tiny_model("alibi").pe
    q, k, v = torch.randn(3, 2, 4, 30, 8).unbind(0)
    assert torch.equal(attention(q, k, v, pe), attention(q, k, v, pe, pos=torch.arange(30)))


# ---- docs/your_model.md and its example ------------------------------------------------------

DOC = Path(__file__).parents[1] / "docs" / "your_model.md"
NANOGPT = Path(__file__).parents[1] / "examples" / "own_model" / "nanogpt.py"


@pytest.fixture(scope="module")
def nanogpt():
    """The example module, imported from its file."""
    spec = importlib.util.spec_from_file_location("nanogpt_example", NANOGPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_lines_are_the_examples():
    """The page shows lines of the example as they are, so that it cannot drift from the
    code the next tests run."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    example = {line.rstrip() for line in NANOGPT.read_text().splitlines()}
    shown = [line.rstrip() for block in blocks for line in block.splitlines() if line.strip()]
    assert len(shown) > 30 and [line for line in shown if line not in example] == []


# one scheme of each attention path (fused causal, key term, distance table, float mask with
# hidden keys, explicit, the scheme's own from the layer's input) and an absolute embedding
EXAMPLE_SCHEMES = [
    "rope",
    "fox",
    "alibi",
    "fire",
    "irope",
    "stickbreaking",
    "input_gate",
    "learned",
]


@pytest.mark.parametrize("name", EXAMPLE_SCHEMES)
def test_the_example_model_learns_with_each_path(nanogpt, name):
    torch.manual_seed(0)
    model = nanogpt.GPT(name, block_size=16, n_layer=2, n_head=2, n_embd=32)
    before = [p.detach().clone() for p in model.pe.parameters()]
    batch = torch.randint(0, 256, (4, 17))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(15):
        loss = model(batch[:, :-1], batch[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses
    after = list(model.pe.parameters())  # the scheme's own parameters train with the model
    assert all(not torch.equal(old, new) for old, new in zip(before, after, strict=True))


def test_the_example_serves_longer_windows_with_an_eval_time_variant(nanogpt):
    """A rope model with YaRN swapped in, as docs/your_model.md says, serves 4x the training
    length with another rotation than RoPE's."""
    model = nanogpt.GPT("rope", block_size=16, n_layer=2, n_head=2, n_embd=32).eval()
    idx = torch.randint(0, 256, (1, 64))
    with torch.no_grad():
        rope = model(idx)
        model.pe = position_scheme(
            "yarn", factor=4.0, num_heads=2, head_dim=16, num_layers=2, train_len=16
        )
        yarn = model(idx)
    assert torch.isfinite(yarn).all() and not torch.allclose(rope, yarn)
