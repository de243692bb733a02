"""A decoder-only language model shared by every position scheme, all of it in this file.

Pre-norm blocks (LayerNorm, causal self-attention, GELU MLP), as nanoGPT
(https://github.com/karpathy/nanoGPT/blob/master/model.py). The model holds no scheme-specific
code: the injected ``PositionScheme`` acts through its hooks (see ``positions/base.py``).
``GPT.forward`` builds one ``ForwardContext`` (the scheme, the positions, the attention path,
the mask shared across layers) and hands it to every block; it never reads a value back to
the host. What can be refused is refused before any training: lengths by the scheme's
``check_length``, the attention mode by ``check_attention``. ``build_model`` builds a model
with a seeded trunk and its scheme under its own seed (``seeded_scheme``).

Notation used for tensor shapes:
    b: batch, s: sequence, d: d_model, n_h: heads, h_d: head dim, V: vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pe_bench.config import Range, check_fields
from pe_bench.errors import UserError
from pe_bench.model.attention import ATTENTION, ForwardContext, attend, forward_context
from pe_bench.positions import ModelDims, PositionScheme, build_scheme


@dataclass
class ModelConfig:
    vocab_size: Annotated[int, Range(ge=1)] = 256  # byte-level tokenizer (plan: >= 256)
    d_model: Annotated[int, Range(ge=1)] = 128
    num_layers: Annotated[int, Range(ge=1)] = 4
    num_heads: Annotated[int, Range(ge=1)] = 4
    mlp_ratio: Annotated[int, Range(ge=1)] = 4  # MLP hidden width = mlp_ratio * d_model
    tie_embeddings: bool = False  # share the input embedding with the output head
    # How schemes with a logit term attend: "sdpa" (float masks, by query chunks), "flex"
    # (FlexAttention score_mod, no mask; no backward on CPU) or "auto" (flex for long
    # evaluation windows on a GPU, see attention.use_flex). Not part of a run's identity: the
    # numbers are the same.
    attention: str = "auto"

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION:
            raise UserError(
                f"model.attention={self.attention!r} is not one of {', '.join(ATTENTION)}"
            )
        check_fields(self, "model")
        if self.d_model % self.num_heads:
            raise UserError(
                f"model.num_heads ({self.num_heads}) must divide model.d_model ({self.d_model})"
            )

    def dims(self, train_len: int) -> ModelDims:
        return ModelDims(
            d_model=self.d_model,
            num_heads=self.num_heads,
            head_dim=self.d_model // self.num_heads,
            num_layers=self.num_layers,
            train_len=train_len,
        )


def check_attention(cfg: ModelConfig, device: torch.device | str) -> None:
    """Refuse, before any training, a ``model.attention`` the run's device cannot train with:
    FlexAttention has no backward on CPU (a run always trains)."""
    if cfg.attention == "flex" and torch.device(device).type == "cpu":
        raise UserError(
            "model.attention=flex: FlexAttention has no backward on CPU; train with "
            "model.attention=auto or sdpa (evaluation then uses flex where it is faster)"
        )


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads = cfg.num_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        b, s, d = x.shape
        pe, pos = ctx.pe, ctx.pos
        q, k, v = self.qkv(x).split(d, dim=2)
        # [b, s, d] -> [b, n_h, s, h_d]
        q, k, v = (t.view(b, s, self.num_heads, -1).transpose(1, 2) for t in (q, k, v))
        q, k = pe.transform_qk(q, k, pos, pos, self.layer)
        y = attend(q, k, v, ctx, self.layer, x)  # [b, n_h, s, h_d]
        return self.proj(y.transpose(1, 2).reshape(b, s, d))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model, bias=False)
        self.down = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg, layer)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        x = x + self.attn(self.ln1(x), ctx)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Decoder-only LM; ``pe`` is the position scheme, built and initialised by the caller so
    that the trunk's initial weights are the same for every scheme at a given seed."""

    def __init__(self, cfg: ModelConfig, pe: PositionScheme) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, layer) for layer in range(cfg.num_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init_weights)
        # GPT-2: scale the residual projections by 1/sqrt(2 * layers).
        for block in self.blocks:
            for proj in (block.attn.proj, block.mlp.down):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * cfg.num_layers))
        if cfg.tie_embeddings:
            self.head.weight = self.tok_emb.weight
        self.pe = pe  # attached after init: the trunk's init does not touch its parameters

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> Tensor:
        """Token ids ``[b, s]`` -> next-token logits ``[b, s, V]``; with ``targets`` ``[b, s]``,
        the mean next-token cross-entropy in nats instead (what training and DDP call)."""
        self.pe.read_tokens(idx)  # a scheme whose positions depend on the tokens keeps them
        try:
            return self._forward(idx, targets)
        finally:
            self.pe.read_tokens(None)

    def _forward(self, idx: Tensor, targets: Tensor | None) -> Tensor:
        seq_len = idx.shape[1]
        pos = self.pe.positions(seq_len, idx.device)  # [s]
        x = self.pe.embed(self.tok_emb(idx), pos)  # [b, s, d]
        grad = torch.is_grad_enabled()
        ctx = forward_context(self.pe, pos, self.cfg.attention, self.cfg.num_heads, grad)
        for block in self.blocks:
            x = block(x, ctx)
        logits = self.head(self.ln_f(x))  # [b, s, V]
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    def num_params(self) -> dict[str, int]:
        """Parameter counts: all, and those of the position scheme (learned, T5, XL add some)."""
        unique = {id(p): p for p in self.parameters()}
        position = sum(p.numel() for p in self.pe.parameters())
        return {"params": sum(p.numel() for p in unique.values()), "pe_params": position}


SchemeFactory = Callable[[ModelDims], PositionScheme]


def seeded_scheme(make: SchemeFactory, dims: ModelDims, seed: int) -> PositionScheme:
    """``make(dims)`` under its own seed (``seed + 1``), leaving torch's global generator as it
    was: a scheme with parameters does not shift the stream the trunk is initialised from."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        return make(dims)


def build_model(cfg: ModelConfig, pe_cfg: Mapping[str, Any], train_len: int, seed: int) -> GPT:
    """Build the model for a ``pe`` config with seeded, scheme-independent trunk init.

    The scheme is built under its own seed (``seeded_scheme``), so every scheme starts from
    the same trunk.
    """
    pe = seeded_scheme(partial(build_scheme, pe_cfg), cfg.dims(train_len), seed)
    return model_with_scheme(cfg, pe, seed)


def model_with_scheme(cfg: ModelConfig, pe: PositionScheme, seed: int) -> GPT:
    """The model around a scheme built by ``seeded_scheme`` with the same ``seed``: the trunk
    initialised from ``seed``, whatever the scheme."""
    torch.manual_seed(seed)
    return GPT(cfg, pe)
