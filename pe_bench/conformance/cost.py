"""What a scheme costs: a training step and a 1024-token evaluation of the quick suite's model
timed against rope's on the same shape and batches, side by side, and the attention path the
scheme's hooks give it, with the fused paths the hooks would allow instead.

``pe-bench-check`` prints it after the checks (``--no-cost`` skips it), so that a plugin's
author learns its cost before a sweep does; ``experiments/bench_schemes.py`` times every
scheme of the zoo with the same functions.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pe_bench.model.attention import attention_path
from pe_bench.model.gpt import GPT, ModelConfig, model_with_scheme, seeded_scheme
from pe_bench.positions import ModelDims, PositionScheme, build_scheme

# The attention paths ``model.attention.attention_path`` names, the most fused first: what
# each costs and which hook would move a scheme to a faster one.
PATHS = {
    "causal": "fused causal SDPA: no logit term, the fastest path",
    "key_bias": "a term of the key alone (key_bias): fused causal SDPA, no mask",
    "distance": "a relative bias by distance (bias_by_distance): masks copied from its table",
    "mask": (
        "a float mask by query chunks (score_bias, or keys hidden by attention_mask, which "
        "no fused path takes): a term of the key alone can use key_bias "
        "(fused SDPA, no mask); a content-free relative bias gets its masks from a table by "
        "distance and a FlexAttention score_mod by itself (declare relative = True)"
    ),
    "scheme": (
        "the scheme's own attention (attend, from the layer's input): no fused path unless "
        "the scheme's attend takes one; a term added to the logits belongs in score_bias"
    ),
    "windowed": (
        "a windowed RoPE's branches (WindowedRoPE's modify_logits) by blocks of queries: "
        "fused SDPA per branch and run of keys, merged by log-sum-exp, no L x L matrix"
    ),
    "explicit": (
        "explicit float32 attention (modify_logits or attention_weights): every fused path is "
        "off; a term that only adds to the logits belongs in score_bias, a factor per query "
        "in logit_scale"
    ),
}


def timed(step: Callable[[], object], device: torch.device, iters: int = 1) -> float:
    """Seconds per call of ``step`` over ``iters`` calls (the caller keeps the best)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


def autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """As ``run.train.autocast``: bf16 on a GPU, nothing on the CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def matmul_params(model: torch.nn.Module) -> int:
    """Parameters that do matmul work per token: all but those only in embedding tables (a
    head tied to the token embedding does the work, so its weight counts)."""
    work = {}
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding) and module.embedding_dim != 1:
            continue
        work |= {id(p): p for p in module.parameters(recurse=False)}
    return sum(p.numel() for p in work.values())


def train_flops_per_token(params: int, num_layers: int, d_model: int, seq_len: int) -> int:
    """FLOPs of a trained token (PaLM, appendix B): 6 N + 12 n_layers d_model s, N the
    ``matmul_params``; the attention term counts every key, as a kernel without causal
    skipping does."""
    return 6 * params + 12 * num_layers * d_model * seq_len


def eval_flops_per_token(params: int, num_layers: int, d_model: int, seq_len: int) -> int:
    """FLOPs of a scored token: the forward third of ``train_flops_per_token``."""
    return 2 * params + 4 * num_layers * d_model * seq_len


def train_step(model: GPT, batch: int, seq_len: int, device: torch.device) -> Callable[[], None]:
    """One training step as ``run.train`` takes it (AdamW, clipping, bf16 autocast on a GPU)
    on fixed random bytes."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (batch, seq_len + 1), generator=generator).to(device)

    def step() -> None:
        model.train()
        with autocast(device):
            loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1).float(), x[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    return step


def eval_pass(model: GPT, batch: int, length: int, device: torch.device) -> Callable[[], None]:
    """One evaluation of ``batch`` windows of ``length`` tokens as ``run.evaluate`` scores them:
    no gradients, every draw of a scheme with random evaluation positions (``eval_draws``)."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (batch, length), generator=generator).to(device)

    @torch.no_grad()
    def step() -> None:
        model.eval()
        for draw in range(model.pe.eval_draws):
            model.pe.seed_eval_positions(draw)
            with autocast(device):
                model(x)

    return step


@dataclass(frozen=True)
class Cost:
    """A scheme's training step and evaluation against rope's, seconds each (best of the
    repeats, timed side by side); ``train_s`` None for an eval-time variant."""

    scheme: str
    path: str  # a key of PATHS
    eval_s: float
    rope_eval_s: float
    train_s: float | None
    rope_train_s: float
    shape: str  # what was timed, in words

    def text(self) -> str:
        """Two or three lines: the ratios to rope, then the path and what would be faster."""
        lines = [f"cost ({self.shape}):"]
        if self.train_s is None:
            lines.append("  training: an eval-time variant, not trained")
        else:
            lines.append(
                f"  training step: {self.train_s / self.rope_train_s:.2f}x rope "
                f"({self.train_s * 1e3:.0f} vs {self.rope_train_s * 1e3:.0f} ms)"
            )
        lines.append(
            f"  evaluation: {self.eval_s / self.rope_eval_s:.2f}x rope "
            f"({self.eval_s * 1e3:.0f} vs {self.rope_eval_s * 1e3:.0f} ms)"
        )
        lines.append(f"  attention path: {PATHS[self.path]}")
        return "\n".join(lines)


def scheme_cost(
    make: Callable[[ModelDims], PositionScheme],
    label: str,
    model_cfg: ModelConfig | None = None,
    train_shape: tuple[int, int] = (32, 64),
    eval_shape: tuple[int, int] = (8, 1024),
    repeats: int = 3,
) -> Cost:
    """Time the scheme ``make`` builds and rope in the same model (default: the quick suite's,
    d_model 128, 4 layers, 4 heads), trained at ``train_shape`` (batch, length: the quick
    suite's) and evaluated at ``eval_shape`` (8 windows of 1024 tokens: the 8192 tokens of one
    evaluation forward pass), on the CPU, the two interleaved ``repeats`` times (a shared
    machine slows both alike); the best of each is kept."""
    cfg = model_cfg or ModelConfig()
    device = torch.device("cpu")
    (batch, train_len), (eval_batch, eval_len) = train_shape, eval_shape
    dims = cfg.dims(train_len)
    models = {
        name: model_with_scheme(cfg, seeded_scheme(factory, dims, 0), 0)
        for name, factory in (
            ("scheme", make),
            ("rope", lambda d: build_scheme({"name": "rope"}, d)),
        )
    }
    variant = models["scheme"].pe.variant_of is not None
    steps = {
        f"{name} eval": eval_pass(m, eval_batch, eval_len, device) for name, m in models.items()
    }
    for name, model in models.items():
        if name == "rope" or not variant:
            steps[f"{name} train"] = train_step(model, batch, train_len, device)
    best = dict.fromkeys(steps, float("inf"))
    for step in steps.values():
        step()  # warm-up
    for _ in range(repeats):
        for key, step in steps.items():
            best[key] = min(best[key], timed(step, device))
    shape = (
        f"d_model {cfg.d_model}, {cfg.num_layers} layers, {cfg.num_heads} heads, "
        f"{torch.get_num_threads()} thread(s): a training step of {batch} x {train_len} tokens, "
        f"an evaluation of {eval_batch} x {eval_len}"
    )
    return Cost(
        scheme=label,
        path=attention_path(models["scheme"].pe),
        eval_s=best["scheme eval"],
        rope_eval_s=best["rope eval"],
        train_s=None if variant else best["scheme train"],
        rope_train_s=best["rope train"],
        shape=shape,
    )
