"""Tiny Hugging Face checkpoints and tokenizers built offline, for tests/test_hf.py and
tests/test_passkey.py (callers skip without ``transformers``)."""

from __future__ import annotations

from pathlib import Path

from pe_bench.pretrained import passkey

CONTEXT = 32  # max_position_embeddings of the tiny checkpoints: the pretraining context
ARCHS = ("llama", "qwen2", "gpt_neox")


def tiny_tokenizer():
    """A byte-level BPE (any text tokenizes) of 300 ids trained on the passkey texts, with
    BOS = EOS = <|endoftext|> as GPT-2's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [passkey.TASK, passkey.FILLER, passkey.QUESTION, passkey.key_sentence(12345)]
    tokenizer.train_from_iterator(texts * 4, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>"
    )


def tiny_checkpoint(arch: str, folder: Path, context: int = CONTEXT, seed: int = 0) -> Path:
    """A random-weight causal LM of ``arch`` (hidden 32, 2 layers, 2 heads; weights drawn
    with std 0.2, from ``seed``, so that a RoPE change moves the logits by whole units) and the
    tiny tokenizer, saved into ``folder`` as a hub checkpoint would be."""
    import torch
    from transformers import (
        GPTNeoXConfig,
        GPTNeoXForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    tokenizer = tiny_tokenizer()
    shared = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=context,
        initializer_range=0.2,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    configs = {
        "llama": (LlamaConfig, LlamaForCausalLM, {"num_key_value_heads": 1}),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM, {"num_key_value_heads": 1}),
        "gpt_neox": (GPTNeoXConfig, GPTNeoXForCausalLM, {"rotary_pct": 0.5}),  # as Pythia
    }
    config_cls, model_cls, extra = configs[arch]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**shared, **extra))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
