"""Tiny Hugging Face checkpoints and tokenizers built offline, for tests/pretrained/test_hf.py,
test_families.py and test_passkey.py (callers skip without ``transformers``)."""

from __future__ import annotations

from pathlib import Path

from pe_bench.pretrained import passkey

CONTEXT = 32  # max_position_embeddings of the tiny checkpoints: the pretraining context
ARCHS = ("llama", "qwen2", "gpt_neox")  # the families every variant's tests run on
# Every RoPE family tests/pretrained/test_families.py patches (each with what sets it apart):
FAMILIES = (
    "llama",
    "mistral",  # Llama's layers; a sliding_window (None here, as v0.2 on)
    "qwen2",  # biases on q, k, v
    "qwen3",  # RMSNorm on each head's q and k before the rotation (qk-norm)
    "gemma3",  # sliding and full-attention layers, each with its own rope and base
    "phi3",  # fused qkv; partial rotary (0.75, as Phi-4-mini)
    "olmo2",  # RMSNorm on the whole q and k projections before the rotation
    "gpt_neox",  # partial rotary (0.5 here; Pythia's 0.25)
)


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
    import transformers

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
    gqa = {"num_key_value_heads": 1}
    pad = {"pad_token_id": tokenizer.eos_token_id}  # their default ids are past the tiny vocab
    configs = {
        "llama": ("Llama", gqa),
        "mistral": ("Mistral", {**gqa, "sliding_window": None}),
        "qwen2": ("Qwen2", gqa),
        "qwen3": ("Qwen3", {**gqa, "head_dim": 16}),
        "gemma3": (
            "Gemma3",
            {
                **gqa,
                "head_dim": 16,
                "query_pre_attn_scalar": 16,
                "sliding_window": 8,
                "layer_types": ["sliding_attention", "full_attention"],
                "rope_parameters": {  # Gemma 3's bases are 1e4 and 1e6; 1e6 barely turns here
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                    "full_attention": {"rope_type": "default", "rope_theta": 20000.0},
                },
            },
        ),
        "phi3": (
            "Phi3",
            {
                **gqa,
                **pad,
                "partial_rotary_factor": 0.75,
                "original_max_position_embeddings": context,
            },
        ),
        "olmo2": ("Olmo2", {**gqa, **pad}),
        "gpt_neox": ("GPTNeoX", {"rotary_pct": 0.5}),  # as Pythia
        "gemma2": ("Gemma2", {**gqa, "head_dim": 16, "query_pre_attn_scalar": 16}),
    }
    prefix, extra = configs[arch]
    config_cls = getattr(
        transformers, f"{prefix}TextConfig" if arch == "gemma3" else f"{prefix}Config"
    )
    model_cls = getattr(transformers, f"{prefix}ForCausalLM")
    torch.manual_seed(seed)
    model = model_cls(config_cls(**shared, **extra))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def permute(weights, n_head: int):
    """llama.cpp's permutation of q and k rows (``convert_hf_to_gguf.py``, LlamaModel.permute):
    HF's rotate_half pairs to GGML's interleaved ones; transformers undoes it on load."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


# GGUF names of a Llama's tensors (llama.cpp's), by HF name (layer i as {i}), and how they are
# stored: Q4_1 as SmolLM2's matrices, Q8_0 its embedding, F32 the norms.
GGUF_TENSORS = {
    "model.embed_tokens.weight": ("token_embd.weight", "Q8_0"),
    "model.norm.weight": ("output_norm.weight", "F32"),
    "lm_head.weight": ("output.weight", "Q4_1"),
    "model.layers.{i}.input_layernorm.weight": ("blk.{i}.attn_norm.weight", "F32"),
    "model.layers.{i}.post_attention_layernorm.weight": ("blk.{i}.ffn_norm.weight", "F32"),
    "model.layers.{i}.self_attn.q_proj.weight": ("blk.{i}.attn_q.weight", "Q4_1"),
    "model.layers.{i}.self_attn.k_proj.weight": ("blk.{i}.attn_k.weight", "Q4_1"),
    "model.layers.{i}.self_attn.v_proj.weight": ("blk.{i}.attn_v.weight", "Q4_1"),
    "model.layers.{i}.self_attn.o_proj.weight": ("blk.{i}.attn_output.weight", "Q4_1"),
    "model.layers.{i}.mlp.gate_proj.weight": ("blk.{i}.ffn_gate.weight", "Q4_1"),
    "model.layers.{i}.mlp.up_proj.weight": ("blk.{i}.ffn_up.weight", "Q4_1"),
    "model.layers.{i}.mlp.down_proj.weight": ("blk.{i}.ffn_down.weight", "Q4_1"),
}


def tiny_gguf(path: Path, context: int = CONTEXT) -> tuple[Path, dict]:
    """The tiny Llama of ``tiny_checkpoint`` (hidden 32, 2 layers, 2 heads, 1 KV head) and the
    tiny tokenizer written as a GGUF file with the ``gguf`` package, its matrices quantized to
    Q4_1 (its embedding to Q8_0, norms in float32) as SmolLM2's release is, q and k permuted
    as llama.cpp writes them. Returns the file and the HF state dict of what it stores (each
    tensor quantized and dequantized by ``gguf``): the weights it should load as."""
    import gguf
    import numpy as np
    import torch

    folder = tiny_checkpoint("llama", path.parent / f"{path.stem}_hf", context)
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(folder)
    config, state = model.config, model.state_dict()
    tokenizer = tiny_tokenizer()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_context_length(context)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _gguf_tokenizer(writer, tokenizer)
    stored = {}
    for i in range(config.num_hidden_layers):
        for hf_name, (name, kind) in GGUF_TENSORS.items():
            hf_name, name = hf_name.format(i=i), name.format(i=i)
            if hf_name in stored:
                continue
            data = state[hf_name].numpy().astype(np.float32)
            if "q_proj" in hf_name:
                data = permute(data, config.num_attention_heads)
            if "k_proj" in hf_name:
                data = permute(data, config.num_key_value_heads)
            qtype = gguf.GGMLQuantizationType[kind]
            packed = gguf.quants.quantize(data, qtype) if kind != "F32" else data
            writer.add_tensor(name, packed, raw_dtype=qtype)
            back = gguf.quants.dequantize(packed, qtype) if kind != "F32" else data
            if "q_proj" in hf_name or "k_proj" in hf_name:  # the permutation's inverse
                heads = config.num_attention_heads if "q_proj" in hf_name else 1
                back = back.reshape(heads, back.shape[0] // heads // 2, 2, -1).swapaxes(1, 2)
                back = back.reshape(data.shape)
            stored[hf_name] = torch.from_numpy(np.ascontiguousarray(back))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, stored


def _gguf_tokenizer(writer, tokenizer) -> None:
    """The tiny byte-level BPE as GGUF's ``gpt2`` tokenizer: tokens by id, their types, the
    merges and the special tokens."""
    import json

    import gguf

    model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda item: item[1])
    special = set(tokenizer.all_special_tokens)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([token for token, _ in vocab])
    writer.add_token_types(
        [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t, _ in vocab]
    )
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
