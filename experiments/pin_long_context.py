"""Run the authors' attention code of DCA, StreamingLLM, LM-Infinite and STRING on fixed inputs
and write their outputs: the numbers tests/positions/test_long_context.py holds pe-bench's
schemes to.

    git -C <mirror> archive HEAD <files> | tar -x -C refs/<name>   # each repository's files
    python experiments/pin_long_context.py refs > tests/positions/long_context_pins.json

``refs`` holds the four repositories' files at the commits ``COMMITS`` names (only those
listed there are read). Each method's own function computes the attention output of q, k and v
(``PROBE``, tiny: 2 heads of 8 dims, float64), through a stand-in module whose projections
return them (``Probe``) and a stand-in for what the code imports and this machine lacks:
``flash_attn``'s kernels, written out exactly (``flash_attn_func``: the softmax with its
log-sum-exp, causal and sliding windows aligned to the bottom right as flash-attn does), and
the old transformers' rotary embedding call (``OldRotary``). One line of the authors' code is
changed: ChunkLlama's merge rounds its weights to bfloat16 (``lse_s.to(torch.bfloat16)``),
which would move the numbers by ~1e-3; here it keeps them in float64.

Needs only torch and transformers (for ``rotate_half`` and ``repeat_kv``, which the authors'
files import from it).
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import types
from pathlib import Path

import torch

COMMITS = {  # repository: (commit, the files read)
    "HKUNLP/ChunkLlama": ("2add4d7c99d24dcc1ab03414cc602abb2e28cf2c", "chunkllama_attn_replace.py"),
    "mit-han-lab/streaming-llm": (
        "2e5042606d69933d88fbf909bd77907456b9b4dd",
        "streaming_llm/kv_cache.py streaming_llm/pos_shift/modify_llama.py",
    ),
    "Glaciohound/LM-Infinite": (
        "a0ce64c6b7ae54f6059668c899603a6eb0c94c18",
        "models/lambda_attention.py models/llama.py",
    ),
    "HKUNLP/STRING": ("216cc2f04cee147e8c3cfaa15723b182ecbe321e", "string_for_llama.py"),
}
HEADS, DIM, BASE, TRAIN_LEN = 2, 8, 10000.0, 16


def probe(seq: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v ``[1, HEADS, seq, DIM]`` in float64: smooth, distinct per head and token (the
    same formula as the test's)."""
    t = torch.arange(seq, dtype=torch.float64)[:, None]
    d = torch.arange(DIM, dtype=torch.float64)
    made = []
    for which in range(3):
        heads = [
            torch.sin(0.83 * t * (1 + 0.31 * d) + 1.7 * d + 0.5 * h + 2.1 * which)
            for h in range(HEADS)
        ]
        made.append(torch.stack(heads).unsqueeze(0) * (2.0 if which == 0 else 1.0))
    return made[0], made[1], made[2]


# ---- stand-ins for what the authors' files import ---------------------------------------------


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    return_attn_probs=False,
    **kwargs,
):
    """flash-attn's ``flash_attn_func`` written out: q ``[b, s_q, h, d]``, k and v
    ``[b, s_k, h, d]``; query i sees keys j with i + s_k - s_q - left <= j <= i + s_k - s_q +
    right (causal: right = 0; -1: no limit). Returns (out, lse ``[b, h, s_q]``, None) with
    ``return_attn_probs``."""
    scale = softmax_scale or q.shape[-1] ** -0.5
    logits = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    s_q, s_k = q.shape[1], k.shape[1]
    offset = torch.arange(s_k)[None, :] - torch.arange(s_q)[:, None] - (s_k - s_q)  # j - i'
    left, right = window_size
    right = 0 if causal else right
    allowed = torch.ones(s_q, s_k, dtype=torch.bool)
    if right >= 0:
        allowed &= offset <= right
    if left >= 0:
        allowed &= offset >= -left
    logits = logits.masked_fill(~allowed, -math.inf)
    lse = logits.logsumexp(-1)
    probs = (logits - lse[..., None]).exp().nan_to_num(0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v)
    return (out, lse, None) if return_attn_probs else out


def fwd_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, *args):
    """flash-attn's ``fwd_kvcache`` for one new query and no new keys: attention over the first
    ``cache_seqlens`` keys of the cache (none: output 0, lse -inf)."""
    n = int(cache_seqlens.flatten()[0])
    if n <= 0:
        return torch.zeros_like(q), torch.full(
            (q.shape[0], q.shape[2], q.shape[1]), -math.inf, dtype=q.dtype
        )
    out, lse, _ = flash_attn_func(q, k_cache[:, :n], v_cache[:, :n], return_attn_probs=True)
    return out, lse


def install_flash_attn() -> None:
    """``flash_attn`` and ``flash_attn_2_cuda`` modules holding the stand-ins above."""
    flash = types.ModuleType("flash_attn")
    flash.flash_attn_func = flash_attn_func
    flash.flash_attn_with_kvcache = None
    interface = types.ModuleType("flash_attn.flash_attn_interface")
    interface.flash_attn_func = flash_attn_func
    interface.flash_attn_qkvpacked_func = None
    losses = types.ModuleType("flash_attn.losses")
    entropy = types.ModuleType("flash_attn.losses.cross_entropy")
    entropy.CrossEntropyLoss = torch.nn.CrossEntropyLoss
    cuda = types.ModuleType("flash_attn_2_cuda")
    cuda.fwd_kvcache = fwd_kvcache
    for name, module in [
        ("flash_attn", flash),
        ("flash_attn.flash_attn_interface", interface),
        ("flash_attn.losses", losses),
        ("flash_attn.losses.cross_entropy", entropy),
        ("flash_attn_2_cuda", cuda),
    ]:
        sys.modules[name] = module


def load(path: Path, name: str, edit: tuple[str, str] | None = None) -> types.ModuleType:
    """The module at ``path``, with one textual ``edit`` (old, new) if given."""
    source = path.read_text()
    if edit is not None:
        assert source.count(edit[0]) == 1, f"{path}: {edit[0]!r} not found once"
        source = source.replace(*edit)
    module = types.ModuleType(name)
    module.__file__, module.__package__ = str(path), name.rpartition(".")[0]
    exec(compile(source, str(path), "exec"), module.__dict__)
    return module


class Probe(torch.nn.Module):
    """An attention module whose projections return fixed q, k and v (the tokens selected by
    the hidden states' single feature, their index), o_proj the identity."""

    def __init__(self, q, k, v, rotary) -> None:
        super().__init__()
        self.q, self.k, self.v, self.rotary_emb = q, k, v, rotary
        self.num_heads = self.num_key_value_heads = HEADS
        self.head_dim, self.num_key_value_groups = DIM, 1
        self.hidden_size, self.layer_idx = HEADS * DIM, 0
        self.config = types.SimpleNamespace(pretraining_tp=1)
        self.o_proj = torch.nn.Identity()

    def _take(self, x, which):  # [1, s, 1] token indices -> [1, s, h * d]
        rows = which[0, :, :, :].transpose(0, 1)[x[0, :, 0].long()]  # [s, h, d]
        return rows.reshape(1, -1, HEADS * DIM)

    def q_proj(self, x):
        return self._take(x, self.q)

    def k_proj(self, x):
        return self._take(x, self.k)

    def v_proj(self, x):
        return self._take(x, self.v)


def tokens(first: int, last: int) -> torch.Tensor:
    """Hidden states that select tokens first .. last - 1."""
    return torch.arange(first, last, dtype=torch.float64).reshape(1, -1, 1)


def as_output(out: torch.Tensor) -> torch.Tensor:
    """``[1, s, h * d]`` -> ``[h, s, d]``."""
    return out.reshape(out.shape[1], HEADS, DIM).transpose(0, 1)


class OldRotary(torch.nn.Module):
    """transformers 4.3x's ``LlamaRotaryEmbedding``: float32 frequencies and angles; called
    ``(x, seq_len=n)`` it gives cos and sin ``[1, 1, n, d]``, ``(x, position_ids)``
    ``[1, n, d]``."""

    def __init__(self) -> None:
        super().__init__()
        self.inv_freq = 1.0 / (BASE ** (torch.arange(0, DIM, 2).float() / DIM))

    def forward(self, x, seq_len=None):
        if isinstance(seq_len, torch.Tensor):  # position_ids: the 4.38+ call
            t = seq_len[0].float()
            emb = torch.cat([torch.outer(t, self.inv_freq)] * 2, dim=-1)
            return emb.cos()[None].to(x.dtype), emb.sin()[None].to(x.dtype)
        t = torch.arange(seq_len).float()
        emb = torch.cat([torch.outer(t, self.inv_freq)] * 2, dim=-1)
        return emb.cos()[None, None].to(x.dtype), emb.sin()[None, None].to(x.dtype)


# ---- the four methods ------------------------------------------------------------------------


def chunkllama(refs: Path) -> dict:
    """``forward`` of chunkllama_attn_replace.py (prefill) at ``replace_with_chunkllama(16)``:
    chunk_size 12, local_window 2, over 26 tokens (chunks of 10: intra, successive, inter)."""
    module = load(
        refs / "ChunkLlama" / "chunkllama_attn_replace.py",
        "chunkllama",
        ("lse_s = lse_s.to(torch.bfloat16)", "pass"),
    )
    module.chunk_size, module.local_window = TRAIN_LEN * 3 // 4, TRAIN_LEN // 8
    seq = 26
    rotary = module.ChunkLlamaRotaryEmbedding(DIM, max_position_embeddings=TRAIN_LEN, base=BASE)
    attention = Probe(*probe(seq), rotary)
    out, _, _ = module.forward(attention, tokens(0, seq), position_ids=torch.arange(seq)[None])
    return {"options": {}, "seq": seq, "output": as_output(out)}


def streaming_llm(refs: Path) -> dict:
    """``llama_pos_shift_attention_forward`` decoding one token at a time, the cache evicted by
    ``StartRecentKVCache(start_size=2, recent_size=5)`` after each, as eval_long_ppl.py does."""
    root = refs / "streaming-llm" / "streaming_llm"
    cache = load(root / "kv_cache.py", "kv_cache").StartRecentKVCache(start_size=2, recent_size=5)
    forward = load(
        root / "pos_shift" / "modify_llama.py", "modify_llama"
    ).llama_pos_shift_attention_forward
    seq = 20
    attention = Probe(*probe(seq), OldRotary())
    past, rows = None, []
    for t in range(seq):
        held = 0 if past is None else past[0].shape[-2]
        position_ids = torch.tensor([[held]])  # the model's: the cache's length
        out, _, present = forward(
            attention, tokens(t, t + 1), None, position_ids, past, False, True
        )
        rows.append(out)
        past = cache([present])[0]
    return {
        "options": {"start_size": 2, "recent_size": 5},
        "seq": seq,
        "output": as_output(torch.cat(rows, dim=1)),
    }


def lm_infinite(refs: Path) -> dict:
    """``attn_forward_factory(use_lambda_mask=True, local_branch=6, global_branch=3,
    limit_distance=6)`` of models/llama.py, as ``convert_llama_model(model, 6, 3)`` sets it
    (its ``lambda_matmul`` from models/lambda_attention.py), over 22 tokens (4 blocks of 6, the
    last padded)."""
    package = types.ModuleType("models")
    package.__path__ = [str(refs / "LM-Infinite" / "models")]
    sys.modules.setdefault("models", package)
    base = types.ModuleType("models.model_base")
    base.Model_Base = torch.nn.Module
    sys.modules["models.model_base"] = base
    sys.modules["models.lambda_attention"] = load(
        refs / "LM-Infinite" / "models" / "lambda_attention.py", "models.lambda_attention"
    )
    llama = load(refs / "LM-Infinite" / "models" / "llama.py", "models.llama_ref")
    seq = 22
    attention = Probe(*probe(seq), OldRotary())
    forward = llama.attn_forward_factory(attention, True, 6, 3, 6, 0, None, None, None, None, 0)
    out, _, _ = forward(tokens(0, seq), None, torch.arange(seq)[None])
    return {
        "options": {"local_branch": 6, "global_branch": 3},
        "seq": seq,
        "output": as_output(out),
    }


def string(refs: Path) -> dict:
    """``forward`` of string_for_llama.py at shifted_offset 6, local_value 2: a prefill of the
    first 5 tokens (all within the offset), then decoding one token at a time (its flash
    decoding: the last 6 keys unshifted, the rest shifted) up to 20; and the prefill of all 20
    for the record (``prefill``), which also scores the key at distance 6 unshifted."""
    module = load(refs / "STRING" / "string_for_llama.py", "string_for_llama")
    module.diag_size, module.local_window = 6, 2
    module.attention_factor = 0.1 * math.log(2) + 1
    seq = 20

    def attention() -> tuple[Probe, dict]:
        rotary = module.RotaryEmbedding(DIM, max_position_embeddings=64, base=BASE)
        buffer = torch.zeros(1, 64, 2, HEADS, DIM, dtype=torch.float64)
        return Probe(*probe(seq), rotary), {0: buffer, "cache_seqlens": torch.tensor([0])}

    probe_module, cache = attention()
    rows = [
        module.forward(
            probe_module, tokens(0, 5), position_ids=torch.arange(5)[None], past_key_value=cache
        )[0]
    ]
    for t in range(5, seq):
        step = module.forward(
            probe_module, tokens(t, t + 1), position_ids=torch.tensor([[t]]), past_key_value=cache
        )
        rows.append(step[0])
    probe_module, cache = attention()
    prefill = module.forward(
        probe_module, tokens(0, seq), position_ids=torch.arange(seq)[None], past_key_value=cache
    )
    return {
        "options": {"shifted_offset": 6, "local_value": 2},
        "seq": seq,
        "output": as_output(torch.cat(rows, dim=1)),
        "prefill": as_output(prefill[0]),
    }


def rounded(x: torch.Tensor) -> list:
    return [[[float(f"{v:.9g}") for v in row] for row in head] for head in x.tolist()]


def main() -> None:
    refs = Path(sys.argv[1])
    import transformers.models.llama.modeling_llama  # noqa: F401  (before the stand-ins)

    install_flash_attn()
    pins = {
        "made_by": "experiments/pin_long_context.py",
        "commits": {repo: commit for repo, (commit, _) in COMMITS.items()},
        "train_len": TRAIN_LEN,
        "base": BASE,
        "probe_sum": [float(f"{float(x.sum()):.12g}") for x in probe(26)],
    }
    for name, run in [
        ("dca", chunkllama),
        ("streaming_llm", streaming_llm),
        ("lm_infinite", lm_infinite),
        ("string", string),
    ]:
        with torch.no_grad(), contextlib.redirect_stdout(sys.stderr):  # their prints
            found = run(refs)
        pins[name] = {
            key: rounded(v) if isinstance(v, torch.Tensor) else v for key, v in found.items()
        }
    json.dump(pins, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
