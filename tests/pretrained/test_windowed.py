"""The windowed variants on pretrained HF models (pe_bench/pretrained/windowed.py), offline on
the tiny checkpoints of tests/pretrained/hf_helpers.py: the logits pe-bench's blocked attention
gives are those of an independent computation over the whole L x L matrix, within ``ATOL`` +
``RTOL`` x |logit|: for ReRoPE, leaky ReRoPE and Self-Extend the reference patches' attention
transcribed (bojone/rerope ``rerope_patch.py`` and ``leaky_rerope_patch.py``, datamllab/LongLM
``self_extend_patch/Llama.py``: both rotations, merged by distance); for DCA, StreamingLLM,
LM-Infinite and STRING each branch's rotation of the whole matrix merged by the scheme's own
masks (their formulas are pinned to the authors' code in tests/positions/test_long_context.py).
Cached decoding gives the logits of the whole sequence; labels that compute the same function
at a length share one record."""

from __future__ import annotations

import contextlib
import functools
import math

import pytest
import torch

pytest.importorskip("transformers")

from pe_bench.cli import bench
from pe_bench.pretrained import load, rope, windowed
from tests.helpers import compose
from tests.pretrained.hf_helpers import ARCHS, CONTEXT, tiny_checkpoint
from tests.pretrained.test_hf import ATOL, LENGTH, RTOL, logits, tokens, variant

WINDOW = 8  # a quarter of the tiny models' context, as the defaults
VARIANTS = {  # the tested settings: defaults, and ones that make the far positions matter
    "rerope": {"name": "rerope"},
    "rerope_plain": {"name": "rerope", "window": WINDOW, "logn": False},
    "leaky_rerope": {"name": "leaky_rerope", "k": 4.0},
    "self_extend": {"name": "self_extend", "group_size": 4, "window": WINDOW},
    "self_extend_default": {"name": "self_extend"},
    "dca": {"name": "dca"},  # chunks of 20 (chunk_size 24, local_window 4): 7 in 128 tokens
    "dca_paper": {"name": "dca", "mscale": False},
    "streaming_llm": {"name": "streaming_llm"},  # 4 sinks, 27 recent tokens
    "lm_infinite": {"name": "lm_infinite", "global_branch": 3},  # local_branch 32
    "string": {"name": "string"},  # S = 10, W = 2
}
BRANCHED = ("dca", "streaming_llm", "lm_infinite", "string")  # checked by their own branches
# Cached decoding: DCA's mscale grows with the keys a step sees (as ChunkLlama's), so a prefix's
# states differ from the whole sequence's; its paper's form has none.
DECODED = ["rerope", "leaky_rerope", "self_extend", "dca_paper", *BRANCHED[1:]]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory) -> dict[str, tuple[torch.nn.Module, rope.RopeSpec]]:
    root = tmp_path_factory.mktemp("hf_windowed")
    out = {}
    for arch in ARCHS:
        folder = str(tiny_checkpoint(arch, root / arch))
        model = load.load_model(load.PretrainedConfig(name=folder), torch.device("cpu"))
        out[arch] = (model, rope.rope_spec(model.config, None, folder))
    return out


# ---- the reference: the patches' attention over the whole matrix --------------------------


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rotated(x: torch.Tensor, positions: torch.Tensor, theta: float, rot: int) -> torch.Tensor:
    """HF's rotary embedding at real-valued positions (the first ``rot`` dims)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rot, 2, dtype=torch.int64).float() / rot))
    freqs = positions.float()[:, None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    part = x[..., :rot] * emb.cos() + rotate_half(x[..., :rot]) * emb.sin()
    return torch.cat([part, x[..., rot:]], dim=-1)


def reference(cfg: dict, train_len: int, theta: float, rot: int):
    """An HF attention function computing ``cfg``'s method as its patch does, given q and k
    unrotated."""

    def attention(module, query, key, value, mask, scaling=None, **kwargs):
        s = query.shape[-2]
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
        pos = torch.arange(s)
        w = cfg.get("window") or max(1, train_len // 4)
        if cfg["name"] != "self_extend" and cfg.get("logn", True):
            query = query * ((pos + 1).log() / math.log(train_len)).clip(1)[:, None]
        q1, k1 = rotated(query, pos, theta, rot), rotated(key, pos, theta, rot)
        if cfg["name"] == "rerope":  # rerope_patch.py: q at w, k unrotated
            q2, k2 = rotated(query, pos * 0 + w, theta, rot), key
        elif cfg["name"] == "leaky_rerope":  # linear scaling by k of positions + w (k - 1)
            k_ = cfg.get("k", 16.0)
            q2 = rotated(query, (pos + w * (k_ - 1)) / k_, theta, rot)
            k2 = rotated(key, pos / k_, theta, rot)
        else:  # LongLM self_extend_forward, group_size_1 = G, group_size_2 = w
            g = cfg.get("group_size", 32)
            shift = 0 if pos.max() < w else w
            q2 = rotated(query, pos // g + shift - shift / g, theta, rot)
            k2 = rotated(key, pos // g, theta, rot)
        scale = query.shape[-1] ** -0.5
        near, far = (q1 @ k1.transpose(2, 3)) * scale, (q2 @ k2.transpose(2, 3)) * scale
        neighbor = torch.tril(torch.ones(s, s))
        if s - w > 0:
            neighbor[w:, :-w] -= torch.tril(torch.ones(s - w, s - w))
        weights = torch.where(neighbor.bool(), near, far)
        weights = weights.masked_fill(torch.ones(s, s).triu(1).bool(), float("-inf"))
        probs = torch.softmax(weights, dim=-1, dtype=torch.float32)
        return (probs @ value).transpose(1, 2).contiguous(), None

    return attention


def branched_reference(scheme, theta: float, rot: int):
    """An HF attention function computing ``scheme`` over the whole matrix, given q and k
    unrotated: each branch's rotation (cos and sin times its factor) of every pair, the
    scheme's masks choosing among them, the pairs none scores hidden."""

    def attention(module, query, key, value, mask, scaling=None, **kwargs):
        s = query.shape[-2]
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
        pos = torch.arange(s)
        factor = scheme.rotary_factor(s)
        weights = torch.full((s, s), float("-inf")).expand(*query.shape[:2], s, s)
        for (q_at, k_at), scores in zip(
            scheme.branch_positions(pos, pos), scheme.branch_scores(pos, pos), strict=True
        ):
            q_b, k_b = (
                factored(x, at, theta, rot, factor) for x, at in ((query, q_at), (key, k_at))
            )
            weights = torch.where(
                scores, q_b @ k_b.transpose(2, 3) * query.shape[-1] ** -0.5, weights
            )
        weights = weights.masked_fill(torch.ones(s, s).triu(1).bool(), float("-inf"))
        probs = torch.softmax(weights, dim=-1, dtype=torch.float32)
        return (probs @ value).transpose(1, 2).contiguous(), None

    return attention


def factored(x: torch.Tensor, positions: torch.Tensor, theta: float, rot: int, factor: float):
    """``rotated`` with cos and sin times ``factor`` (the rotated dims times it)."""
    turned = rotated(x, positions, theta, rot)
    return torch.cat([turned[..., :rot] * factor, turned[..., rot:]], dim=-1)


@contextlib.contextmanager
def unrotated_with(model: torch.nn.Module, attention, spec: rope.RopeSpec):
    """The rotary embeddings made the identity and ``attention`` in place of pe-bench's, in
    the layers a variant changes (``spec.layer_type``'s where each type has its own rope, as
    Gemma 3's; the others rotate and attend by SDPA as pretrained): the patches rotate q and k
    themselves."""
    import transformers
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def identity(module, x, position_ids, *args, **kwargs):
        if spec.layer_type is not None and args[:1] != (spec.layer_type,):
            return type(module).forward(module, x, position_ids, *args, **kwargs)
        shape = (*position_ids.shape, spec.dims.head_dim)
        return torch.ones(shape, dtype=x.dtype), torch.zeros(shape, dtype=x.dtype)

    def routed(module, *args, **kwargs):
        if spec.layer_type in (None, getattr(module, "layer_type", None)):
            return attention(module, *args, **kwargs)
        return sdpa_attention_forward(module, *args, **kwargs)

    modules = [module for _, _, module in rope.rotary_modules(model)]
    try:
        for module in modules:
            module.forward = functools.partial(identity, module)
        transformers.AttentionInterface.register(rope.ATTENTION, routed)
        yield
    finally:
        for module in modules:
            del module.forward
        rope.register_attention()


def reference_logits(model, spec, cfg, x) -> torch.Tensor:
    if cfg["name"] in BRANCHED:
        scheme = variant(spec, cfg).scheme
        attention = branched_reference(scheme, spec.theta, spec.dims.head_dim)
    else:
        attention = reference(cfg, spec.dims.train_len, spec.theta, spec.dims.head_dim)
    with torch.no_grad(), unrotated_with(model, attention, spec):
        return model(input_ids=x).logits


# ---- the checks ---------------------------------------------------------------------------


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "explicit"])
@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("arch", ARCHS)
def test_windowed_variants_give_the_reference_patches_logits(
    loaded, arch, name, fused, monkeypatch
):
    """In blocks of a few queries (so that every piece of the split is used) against the
    whole-matrix reference, at 4x the context; each piece through the CPU's fused kernel and
    through the explicit computation other devices use."""
    model, spec = loaded[arch]
    monkeypatch.setattr(windowed, "BLOCK", 12)
    monkeypatch.setattr(windowed, "FUSED", ("cpu",) if fused else ())
    x = tokens(model)
    ours = logits(model, x, variant(spec, VARIANTS[name]), spec)
    theirs = reference_logits(model, spec, VARIANTS[name], x)
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=RTOL)
    assert (ours - logits(model, x)).abs().max() > 100 * ATOL  # the variant changed something


@pytest.mark.parametrize(
    "cfg",
    [
        {"name": "self_extend", "group_size": 1, "window": WINDOW},  # G = 1: RoPE
        {"name": "leaky_rerope", "k": 1.0, "window": WINDOW, "logn": False},  # k = 1: RoPE
        {"name": "rerope", "window": LENGTH, "logn": False},  # no key past the window
    ],
    ids=["self_extend_g1", "leaky_k1", "rerope_wide"],
)
@pytest.mark.parametrize("arch", ARCHS)
def test_windowed_variants_that_are_rope_give_the_models_logits(loaded, arch, cfg):
    model, spec = loaded[arch]
    x = tokens(model)
    ours = logits(model, x, variant(spec, cfg), spec)
    torch.testing.assert_close(ours, logits(model, x), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("name", DECODED)
def test_cached_decoding_gives_the_logits_of_the_whole_sequence(loaded, name):
    """Passkey decodes with a KV cache: the last token's logits after a cached prefix are the
    whole sequence's (the cache holds k unrotated; each step rotates it both ways)."""
    model, spec = loaded["llama"]
    x = tokens(model)[:1]
    v = variant(spec, VARIANTS[name])
    with torch.no_grad(), rope.rope_variant(model, v, spec, x.shape[1], "pe_bench"):
        whole = model(input_ids=x).logits[:, -1]
        prefix = model(input_ids=x[:, :-1], use_cache=True)
        cache = {"past_key_values": prefix.past_key_values}
        step = model(input_ids=x[:, -1:], use_cache=True, **cache).logits[:, -1]
    torch.testing.assert_close(step, whole, atol=ATOL, rtol=RTOL)


def test_windowed_variants_are_undone_after_use(loaded):
    model, spec = loaded["qwen2"]
    x = tokens(model)
    before = logits(model, x)
    for cfg in VARIANTS.values():
        logits(model, x, variant(spec, cfg), spec)
    assert torch.equal(logits(model, x), before)
    assert not any(hasattr(m, rope.WINDOWED_ATTR) for m in model.modules())


def test_labels_that_compute_the_same_function_share_a_record(loaded):
    """At or below the pretraining context every frequency method is RoPE (scale 1), and
    ReRoPE and Self-Extend are while no key is past their window; dynamic NTK at factor 1 is
    NTK at every length; past the context each method is its own."""
    model, spec = loaded["llama"]
    cfgs = {
        "pi": {"name": "pi"},
        "ntk": {"name": "ntk"},
        "dynamic_ntk": {"name": "dynamic_ntk"},
        "yarn": {"name": "yarn"},
        "logn": {"name": "logn"},
        "llama3": {"name": "llama3"},
        "rerope": VARIANTS["rerope"],
        "self_extend": VARIANTS["self_extend"],
    }
    built = [variant(spec, cfg) for cfg in cfgs.values()]
    for v, key in zip(built, cfgs, strict=True):
        object.__setattr__(v, "key", key)
    same = rope.same_as(built, spec, [WINDOW, CONTEXT, 2 * CONTEXT])
    frequency = ["pi", "ntk", "dynamic_ntk", "yarn", "logn", "llama3"]
    assert {k for k, n in same if n == WINDOW} == set(cfgs)
    assert all(same[(k, WINDOW)] == "none" for k in cfgs)
    assert {k for k, n in same if n == CONTEXT} == set(frequency)
    assert same.get(("dynamic_ntk", 2 * CONTEXT)) == "ntk"
    assert [k for k, n in same if n == 2 * CONTEXT] == ["dynamic_ntk"]
    # and they do compute the same logits there
    x = tokens(model, CONTEXT)
    plain = logits(model, x)
    for v in built[:6]:
        torch.testing.assert_close(logits(model, x, v, spec), plain, atol=ATOL, rtol=RTOL)


@pytest.mark.slow
def test_a_run_copies_the_records_of_labels_that_compute_the_same_numbers(tmp_path):
    """cli.run: the copies carry ``same_as`` and their source's numbers, the others are
    computed; Self-Extend past its window is computed."""
    folder = tiny_checkpoint("llama", tmp_path / "llama")
    cfg = compose(
        "model=hf",
        f"model.name={folder}",
        "model.test_slices=1",
        "model.passkey.lengths=[160,192]",
        "model.passkey.trials=1",
        "eval.factors=[0.5,1,2]",
        "eval.tokens=128",
        "+pe@eval.variants.yarn=yarn",
        "+pe@eval.variants.self_extend=self_extend",
        "+pe@eval.variants.dynamic_ntk=dynamic_ntk",
    )
    records = bench.run(cfg, tmp_path / "job")
    text = {(r["variant"], r["eval_len"]): r for r in records if r["mode"] == "nonoverlap"}
    copies = {k: r["same_as"] for k, r in text.items() if "same_as" in r}
    assert copies == {
        ("pi", 16): "none",
        ("pi", 32): "none",
        ("ntk", 16): "none",
        ("ntk", 32): "none",
        ("yarn", 16): "none",
        ("yarn", 32): "none",
        ("dynamic_ntk", 16): "none",
        ("dynamic_ntk", 32): "none",
        ("dynamic_ntk", 64): "ntk",
    }
    for key, source in copies.items():
        assert text[key]["nll"] == text[(source, key[1])]["nll"] and "time_s" not in text[key]
    assert "same_as" not in text[("self_extend", 16)] and "same_as" not in text[("yarn", 64)]
    keys = {(r["variant"], r["eval_len"]): r for r in records if r["mode"] == "passkey"}
    assert len(keys) == 6 * 2
    assert {k: r["same_as"] for k, r in keys.items() if "same_as" in r} == {
        ("dynamic_ntk", 160): "ntk",
        ("dynamic_ntk", 192): "ntk",
    }
    assert keys[("dynamic_ntk", 160)]["answer"] == keys[("ntk", 160)]["answer"]
