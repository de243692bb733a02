"""DroPE: a model trained with RoPE, its rotation dropped after training and the model
recalibrated briefly at its own training length.

Gelberg et al. 2025, "Extending the Context of Pretrained LLMs by Dropping Their Positional
Embeddings" (https://arxiv.org/abs/2512.12167). The reference is SakanaAI/DroPE:
``custom_models/attention.py`` (``nope``: the attention module called with cos = 1 and sin = 0,
an identity rotation, and the same weights) and ``custom_models/drope.py`` (every attention
layer swapped for it, ``attention_type: nope`` by default), trained further by its run configs
(``cfgs/run_cfg/*_drope.yaml``: ``max_seq_length`` the model's own context, every weight
trained, lr 3e-4 for models pretrained at about 3e-3, ``cfgs/trainer_cfg/base.yaml``: AdamW
with no weight decay, clipping at 1, 3% warmup, cosine decay).

Here the drop is the scheme ``drope``, an eval-time variant of rope that rotates nothing, and
the recalibration is pe-bench's fine-tuning stage with it (``conf/finetune/drope.yaml``: records
``rope:drope``), so that the recalibrated model is evaluated with no rotation at every length.
"""

from __future__ import annotations

from pe_bench.positions.base import PositionScheme, register


@register("drope")
class DroPE(PositionScheme):
    """RoPE dropped: the queries and keys of a rope checkpoint unrotated (the reference's
    cos = 1, sin = 0), nothing else changed. Evaluated alone on a rope checkpoint it is DroPE
    before recalibration; fine-tuned with it at the training length
    (``+finetune@finetunes.drope=drope``) it is DroPE."""

    variant_of = "rope"

    @property
    def caveat(self) -> str:
        return (
            "recalibrated after all of RoPE's training steps (the paper drops RoPE within a "
            "fixed budget) by pe-bench's fine-tune, AdamW with betas 0.9, 0.95 and cosine to "
            "10% (the authors' code: 0.9, 0.999, to 0); no QK norm (its qk_norm_nope types); "
            "the authors recalibrate pretrained LLMs of 360M-7B parameters for thousands of "
            "steps (their run configs: SmolLM 360M and 1.7B 120,000 steps at 2,048-8,192 "
            "tokens, Llama-2 7B 5,000 steps of 512 x 4,096); the zoo's 0.85M parameters at "
            f"L_train {self.dims.train_len} recalibrated for conf/finetune/drope.yaml's 60 "
            "steps cannot show whether recalibration recovers RoPE's perplexity at L_train, "
            "nor the paper's zero-shot extension and long-context retrieval"
        )
