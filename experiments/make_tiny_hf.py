"""A tiny pretrained Llama checkpoint, made offline, for ``experiment=yarn_paper_mini``.

The CPU twin of ``experiment=yarn_paper`` needs what the hub would give it: a RoPE causal LM
in a folder with ``config.json``, weights and ``tokenizer.json``. This script makes one from
nothing but the running Python: a byte-level BPE tokenizer (``tokenizers``, vocabulary 1024)
trained on the train split of pe-bench's standard-library corpus, and a 2-layer
``LlamaForCausalLM`` (d_model 64, 4 heads, 2 key/value heads, RoPE base 10000) trained on the
same split at a context of 256 tokens (``max_position_embeddings``), so that the twin's
variants have a pretraining context to extend, as the YaRN paper's models do. The test split
is never seen. 81 s of CPU time on one thread (a 2-core Xeon, AVX512; 32 minutes of wall time
there under a load of 10).
Deterministic for a seed, thread count and CPU kind: two builds on one machine give the same
bytes, but an AVX2 and an AVX512 machine train different weights (final loss 3.0949 against
3.0911). ``made_by.json`` names those inputs and no timing, so the folder's hash (the
``weights_sha`` of every record made with it) is the same for every build that gives the same
weights.

    OMP_NUM_THREADS=1 python experiments/make_tiny_hf.py     # -> outputs/tiny_hf/llama-tiny-256
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from pe_bench.data.corpus import load_corpus

CONTEXT = 256
SPECIALS = ["<|endoftext|>"]  # BOS and EOS both, as GPT-2's and Pythia's tokenizers


def train_tokenizer(text: str, vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE (GPT-2's byte alphabet and pre-tokenizer) trained on ``text``."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([text], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=SPECIALS[0], eos_token=SPECIALS[0]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="outputs/tiny_hf/llama-tiny-256")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    start = time.time()
    torch.manual_seed(args.seed)
    train = load_corpus({"source": "stdlib"}).splits["train"].numpy().tobytes()
    text = train[: 4 << 20].decode("utf-8", errors="replace")  # 4 MB: enough for 1024 merges
    tokenizer = train_tokenizer(text, args.vocab)
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"])
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT,
        rope_theta=10000.0,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    generator = torch.Generator().manual_seed(args.seed)
    model.train()
    for step in range(args.steps):
        starts = torch.randint(0, len(ids) - CONTEXT, (args.batch,), generator=generator)
        batch = torch.stack([ids[s : s + CONTEXT] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss  # HF shifts the labels itself
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.3f}")
    out = Path(args.out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    made = {
        "script": "experiments/make_tiny_hf.py",
        "args": vars(args),
        "corpus": "stdlib train split (first 4 MB)",
        "final_loss": round(loss.item(), 4),
        "tokens": len(ids),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    (out / "made_by.json").write_text(json.dumps(made, indent=2) + "\n")
    print(f"wrote {out} in {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
