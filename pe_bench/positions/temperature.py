"""NoPE with a softmax temperature per head searched at evaluation on held-out text.

Wang et al. 2024, "Length Generalization of Causal Transformers without Position Encoding"
(https://arxiv.org/abs/2404.12224): a NoPE model's attention spreads out on windows longer than
its training length, and scaling each head's logits back (a temperature per head) recovers
much of the loss. The reference is AntNLP/nope_head_scale: ``models/llama_nope.py``
(``ScaleMixin.query_scale``: with ``softmax_scale_type=HS`` a parameter ``scale_param`` per
head, the queries multiplied by scale_h / sqrt(h_d)) trained with everything else frozen
(``freeze_type: BASE``), by ``scripts/run_hs.sh``: ``--softmax_scale 1.6`` (the initial
scale), AdamW at lr 1e-1 (and 5e-2), no weight decay, 10% warmup then linear decay
(``configs/tnl_hs.yaml``, the HF Trainer's defaults), 200 steps at the target length, and
after every step the scales clamped at >= 1 (``--scale_lb 1``, ``utils/callbacks.py``
``ParamClampCallback``). Its ``CONST`` type, one scale for every head, is the paper's
uniform-scale baseline (``run_ppl.py --scale``, values tried 1.2, 1.5, 1.8).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

import torch
from torch import Tensor

from pe_bench.config import Range
from pe_bench.errors import UserError
from pe_bench.positions.base import ModelDims, PositionScheme, register

SEARCHES = ("head", "uniform")  # the values of nope_temp's search


@register("nope_temp")
class NoPETemperature(PositionScheme):
    """NoPE that trains as NoPE and is evaluated with a temperature per head and length.

    ``calibrate`` fits, for each evaluation length, the scales s_[layer, head] by which the
    logits q . k / sqrt(h_d) are multiplied (``logit_scale``, so the model keeps its fused
    causal path), on held-out text of that length, the model otherwise frozen. ``search``:
    ``head`` is the authors' head scale (AdamW from ``init`` for ``steps`` steps at ``lr``,
    10% warmup then linear decay, clamped at >= ``floor`` after each step); ``uniform`` is
    their constant scale, one for every head, the best of ``candidates`` by held-out loss. A
    window of a length never calibrated takes the scales of the nearest calibrated length
    (by ratio); before any calibration, and in training, the scales are 1 (NoPE).
    """

    option_ranges: ClassVar[dict[str, Range]] = {
        "init": Range(gt=0),
        "floor": Range(ge=0),
        "steps": Range(ge=1),
        "lr": Range(gt=0),
        "held_out_tokens": Range(ge=1),
    }

    def __init__(
        self,
        dims: ModelDims,
        *,
        search: str = "head",
        init: float = 1.6,
        floor: float = 1.0,
        steps: int = 30,
        lr: float = 0.1,
        candidates: list[float] | None = None,
        held_out_tokens: int = 4096,
    ) -> None:
        super().__init__(dims)
        if search not in SEARCHES:
            raise UserError(f"nope_temp: search={search!r} is not one of {', '.join(SEARCHES)}")
        candidates = candidates or [1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.5, 3.0]
        if min(candidates) <= 0:
            raise UserError(f"nope_temp: candidates={candidates} must all be > 0")
        self.search, self.init, self.floor = search, init, floor
        self.steps, self.lr, self.candidates = steps, lr, [float(c) for c in candidates]
        self.calibration_tokens = held_out_tokens
        self.fitted: dict[int, Tensor] = {}  # eval length -> scales [layers, heads]
        self._trying: Tensor | None = None  # the scales a search is trying

    @property
    def caveat(self) -> str:
        search = (
            f"head scales fitted at each eval length on {self.calibration_tokens} held-out "
            f"(validation) tokens in {self.steps} steps (the authors: once, at the target "
            "length, 200 steps of 8 x 8k tokens of training data)"
            if self.search == "head"
            else f"one scale for every head, the best of {list(self.candidates)} per eval length"
        )
        return search + (
            "; scales in float32 (the authors' scale_param is bfloat16); the query scale "
            "transcribed from models/llama_nope.py, not run from it; the authors' NoPE model "
            "is TinyLlama 1.1B, trained at 2k tokens and head-scaled to 8k"
        )

    def scales(self, seq_len: int) -> Tensor | None:
        """The scales ``[layers, heads]`` used on windows of ``seq_len`` tokens (None: 1)."""
        if self._trying is not None:
            return self._trying
        if self.training or not self.fitted:
            return None
        nearest = min(self.fitted, key=lambda n: abs(math.log(n / seq_len)))
        return self.fitted[nearest]

    def logit_scale(self, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor | None:
        scales = self.scales(k_pos.shape[-1])
        if scales is None:
            return None
        return scales[layer].to(q_pos.device).unsqueeze(-1).expand(-1, q_pos.shape[-1])

    def calibrate(self, held_out: Callable[[], Tensor], seq_len: int) -> str:
        shape = (self.dims.num_layers, self.dims.num_heads)
        with torch.no_grad():
            self._trying = torch.ones(shape)
            nope = held_out().item()
        if self.search == "uniform":
            scales, loss = self._best_uniform(held_out, shape)
        else:
            scales, loss = self._fitted_per_head(held_out, shape)
        self._trying = None
        self.fitted[seq_len] = scales
        return (
            f"held-out nll {nope:.4f} at scale 1, {loss:.4f} at scales {scales.min():.2f}-"
            f"{scales.max():.2f} (mean {scales.mean():.2f}; {self.search} search)"
        )

    def _best_uniform(self, held_out: Callable[[], Tensor], shape) -> tuple[Tensor, float]:
        """The candidate scale with the lowest held-out loss (the first of equals)."""
        losses = []
        with torch.no_grad():
            for value in self.candidates:
                self._trying = torch.full(shape, float(value))
                losses.append(held_out().item())
        best = min(range(len(losses)), key=losses.__getitem__)
        return torch.full(shape, float(self.candidates[best])), losses[best]

    def _fitted_per_head(self, held_out: Callable[[], Tensor], shape) -> tuple[Tensor, float]:
        """AdamW on the scales alone, as the authors' head-scale fine-tuning with the HF
        Trainer's linear schedule (``get_linear_schedule_with_warmup``: lr x i / warmup for
        the first 10% of steps, its first step at 0, then decaying linearly to 0)."""
        scales = torch.full(shape, self.init, requires_grad=True)
        optimizer = torch.optim.AdamW([scales], lr=self.lr, weight_decay=0.0)
        warmup = math.ceil(0.1 * self.steps)  # TrainingArguments.get_warmup_steps

        def factor(i: int) -> float:
            return i / warmup if i < warmup else max(0.0, (self.steps - i) / (self.steps - warmup))

        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        self._trying = scales
        for _ in range(self.steps):
            with torch.enable_grad():
                (scales.grad,) = torch.autograd.grad(held_out(), [scales])
            optimizer.step()
            schedule.step()
            with torch.no_grad():
                scales.clamp_(min=self.floor)
        scales = scales.detach()
        with torch.no_grad():
            self._trying = scales
            return scales, held_out().item()
