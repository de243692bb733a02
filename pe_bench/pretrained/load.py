"""Loading a pretrained HF causal LM and its tokenizer (hub name or local folder), and the
corpus tokenized by it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from pe_bench.data.tokenizer import HF_PREFIX, HFTokenizer
from pe_bench.errors import UserError
from pe_bench.pretrained.rope import ATTENTION, _transformers, register_attention, rotary_modules
from pe_bench.run.config import PretrainedConfig
from pe_bench.run.weights import ModelSource, resolve


def _one_line(err: BaseException) -> str:
    text = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    return f"{type(err).__name__}: {text}"


def _load_error(what: str, name: str, err: BaseException) -> UserError:
    if isinstance(err, ImportError) or "accelerate" in str(err):  # GGUF: gguf, accelerate
        return UserError(
            f"cannot load the {what} of {name!r} ({_one_line(err)[:200]}): GGUF models need "
            "the gguf and accelerate packages: pip install -e '.[hf]'"
        )
    return UserError(
        f"cannot load the {what} of Hugging Face model {name!r} ({_one_line(err)[:300]}); "
        "allowed: a hub id reachable from here (or in the HF cache), a local folder with "
        "config.json (e.g. one experiments/make_tiny_hf.py writes), a .gguf file or "
        "pkg:<distribution>/<file>"
    )


def source(cfg: PretrainedConfig) -> ModelSource:
    """Where ``cfg``'s weights are (``run.weights``)."""
    return resolve(cfg.name, cfg.gguf_file)


@dataclass(frozen=True)
class TokenStream:
    """Token ids of a text, with the UTF-8 bytes of the text up to the end of each token."""

    ids: Tensor  # [n] int64
    byte_ends: Tensor  # [n] int64

    def target_bytes(self, start: int, stop: int) -> int:
        """UTF-8 bytes of targets ``start + 1 .. stop`` (a window scoring the targets after
        input ``start`` up to token ``stop``): the sum of those tokens' own bytes."""
        return int(self.byte_ends[stop] - self.byte_ends[start])


def load_tokenizer(cfg: PretrainedConfig) -> Any:
    """The model's own tokenizer (at ``revision``, as the weights; a GGUF file's own): passkey
    prompts are encoded with its special tokens, as the originals' pipelines do, and answers
    decoded by it."""
    transformers = _transformers()
    where = source(cfg)
    try:
        return transformers.AutoTokenizer.from_pretrained(
            where.where, revision=cfg.revision, **where.kwargs()
        )
    except Exception as err:
        raise _load_error("tokenizer", cfg.name, err) from err


def corpus_tokenizer(tokenizer: Any, name: str) -> HFTokenizer:
    """The model's tokenizer behind pe-bench's interface (``pe_bench.data.tokenizer``): the corpus's
    ids (no special tokens), each token's UTF-8 bytes for bits per byte, and the name, size and
    fingerprint that records carry for every tokenized run."""
    if not tokenizer.is_fast:
        raise UserError(f"{name}: pe-bench reads a fast tokenizer (tokenizer.json); it has none")
    return HFTokenizer(f"{HF_PREFIX}{name}", tokenizer.backend_tokenizer)


def tokenizer_fields(tokenizer: HFTokenizer) -> dict[str, Any]:
    """What records say about the tokenizer (the fields of pe-bench's tokenized runs)."""
    return {
        "tokenizer": tokenizer.name,
        "tokenizer_vocab": tokenizer.vocab_size,
        "tokenizer_sha": tokenizer.fingerprint,
    }


def encode(tokenizer: HFTokenizer, text: str) -> TokenStream:
    """``text`` as tokens with their byte ends (the running sum of the tokens' bytes)."""
    ids = tokenizer.encode(text)
    ends = np.cumsum(tokenizer.token_bytes[ids]) if len(ids) else np.zeros(0, dtype=np.int64)
    return TokenStream(torch.from_numpy(ids), torch.from_numpy(ends.astype(np.int64)))


def encode_prefix(tokenizer: HFTokenizer, data: bytes, n_tokens: int, what: str) -> TokenStream:
    """The first ``n_tokens`` tokens of UTF-8 ``data`` (invalid bytes replaced), tokenizing a
    growing prefix; a margin of tokens is dropped at the cut so that it cannot change them."""
    margin, size = 256, max(4096, 8 * n_tokens)
    while True:
        text = data[:size].decode("utf-8", errors="replace")
        stream = encode(tokenizer, text)
        if size >= len(data) or len(stream.ids) >= n_tokens + margin:
            break
        size *= 2
    keep = len(stream.ids) if size >= len(data) else len(stream.ids) - margin
    if keep < n_tokens:
        raise UserError(
            f"{what} has {keep:,} tokens but evaluation needs {n_tokens:,}; lower eval.tokens "
            "or model.test_slices, or use more data"
        )
    return TokenStream(stream.ids[:n_tokens], stream.byte_ends[:n_tokens])


class LogitsOnly(nn.Module):
    """An HF causal LM as pe-bench's scorers call a model: token ids in, logits out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor, keep: int = 0) -> Tensor:
        """Logits of every position, or of the last ``keep`` (HF's ``logits_to_keep``)."""
        return self.model(input_ids=x, use_cache=False, logits_to_keep=keep).logits


def load_config(cfg: PretrainedConfig) -> Any:
    """The model's HF config (from the hub, the HF cache or a local folder)."""
    transformers = _transformers()
    where = source(cfg)
    try:
        return transformers.AutoConfig.from_pretrained(
            where.where, revision=cfg.revision, **where.kwargs()
        )
    except Exception as err:
        raise _load_error("config", cfg.name, err) from err


def load_model(cfg: PretrainedConfig, device: torch.device) -> nn.Module:
    """The pretrained weights in float32 (a GGUF file's dequantized), in eval mode, with the
    ``pe_bench`` attention."""
    transformers = _transformers()
    register_attention()
    where = source(cfg)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            where.where,
            revision=cfg.revision,
            dtype=torch.float32,
            attn_implementation=ATTENTION,
            **where.kwargs(),
        )
    except Exception as err:
        raise _load_error("weights", cfg.name, err) from err
    if not rotary_modules(model):
        raise UserError(f"{cfg.name}: no rotary embedding found; model=hf evaluates RoPE models")
    return model.to(device).eval()
