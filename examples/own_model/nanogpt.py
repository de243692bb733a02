"""A nanoGPT-style model (https://github.com/karpathy/nanoGPT/blob/master/model.py) whose
position encoding is any pe-bench scheme, chosen by name: ``python nanogpt.py alibi``.

Three lines differ from nanoGPT: the scheme is built in ``GPT.__init__`` (no ``wpe`` table),
``GPT.forward`` takes its positions and embedding from it, and each attention layer calls
``pe_bench.api.attention`` where nanoGPT calls ``F.scaled_dot_product_attention``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pe_bench.api import attention, position_scheme
from pe_bench.positions import PositionScheme


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, layer: int) -> None:
        super().__init__()
        self.n_head, self.layer = n_head, layer
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=False)

    def forward(self, x: Tensor, pe: PositionScheme, pos: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        # nanoGPT: y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = attention(q, k, v, pe, x=x, pos=pos, layer=self.layer)  # the scheme rotates q, k
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, layer: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, layer)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd)
        )

    def forward(self, x: Tensor, pe: PositionScheme, pos: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x), pe, pos)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(
        self,
        scheme: str = "rope",
        vocab_size: int = 256,
        block_size: int = 64,
        n_layer: int = 4,
        n_head: int = 4,
        n_embd: int = 128,
        **options,
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        # one scheme for the whole model, a submodule so that its parameters train with it
        self.pe = position_scheme(
            scheme,
            num_heads=n_head,
            head_dim=n_embd // n_head,
            num_layers=n_layer,
            train_len=block_size,
            **options,
        )
        self.h = nn.ModuleList(Block(n_embd, n_head, layer) for layer in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> Tensor:
        pos = self.pe.positions(idx.shape[1], idx.device)  # once per pass, for every layer
        self.pe.read_tokens(idx)  # BiPE reads its segments from the tokens; others: nothing
        x = self.pe.embed(self.wte(idx), pos)  # sinusoidal and learned add here; others: x
        for block in self.h:
            x = block(x, self.pe, pos)
        self.pe.read_tokens(None)  # the pass is over
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def main(scheme: str = "rope", steps: int = 200) -> None:
    """Train on this file's bytes at 64 tokens, then evaluate at 64 and at 256."""
    torch.manual_seed(0)
    data = torch.tensor(list(Path(__file__).read_bytes()), dtype=torch.long)
    model = GPT(scheme)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(steps):
        starts = torch.randint(0, len(data) - 65, (16,))
        batch = torch.stack([data[s : s + 65] for s in starts])
        loss = model(batch[:, :-1], batch[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            print(f"step {step}: loss {loss.item():.3f}")
    model.eval()
    with torch.no_grad():
        for length in (64, 256):
            window = data[: length + 1].unsqueeze(0)
            print(f"loss at {length} tokens: {model(window[:, :-1], window[:, 1:]).item():.3f}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
