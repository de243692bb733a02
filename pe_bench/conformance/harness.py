"""The harness every conformance check runs in: the scheme under test and the tiny model built
around it (``Setup``), the outcomes a check raises (``Failed``, ``Skipped``), and the helpers
the checks share (perturbed parameters, seeded forward passes, tolerances)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from pe_bench.model.attention import causal_allowed
from pe_bench.model.gpt import GPT, ModelConfig, seeded_scheme
from pe_bench.positions import (
    ModelDims,
    PositionScheme,
    build_scheme,
    load_plugin,
    scheme_class,
)


class Failed(Exception):
    """A check found a broken contract; the message says what is wrong."""


class Skipped(Exception):
    """A check does not apply to this scheme; the message says why."""


@dataclass
class Setup:
    """How to build the scheme under test, and the tiny model it is checked in."""

    label: str
    make: Callable[[ModelDims], PositionScheme]
    model_cfg: ModelConfig
    train_len: int

    @property
    def dims(self) -> ModelDims:
        return self.model_cfg.dims(self.train_len)

    def scheme(self, seed: int = 0) -> PositionScheme:
        """The scheme as the model builds it: under its own seed (``build_model``)."""
        return seeded_scheme(self.make, self.dims, seed)

    def model(self, seed: int = 0) -> GPT:
        scheme = self.scheme(seed)
        torch.manual_seed(seed)
        return GPT(self.model_cfg, scheme)

    @property
    def long(self) -> int:
        """3x the training length (eval-time variants are active), within max_positions."""
        limit = self.scheme().max_positions
        return 3 * self.train_len if limit is None else min(3 * self.train_len, limit)


def perturbed(scheme: PositionScheme, seed: int = 0) -> PositionScheme:
    """A copy with N(0, 0.5) noise on every parameter, so zero-initialised terms count."""
    scheme = copy.deepcopy(scheme)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in scheme.parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float32)
            p.add_(0.5 * noise.to(p.device, p.dtype))
    return scheme


def scheme_under_test(setup: Setup) -> tuple[PositionScheme, int, Tensor]:
    """The scheme with perturbed parameters in eval mode, the length checked at
    (``Setup.long``), and the scheme's positions for it (on CPU)."""
    scheme = perturbed(setup.scheme()).eval()
    s = setup.long
    return scheme, s, scheme.positions(s, torch.device("cpu"))


def with_perturbed_scheme(model: GPT) -> GPT:
    model.pe = perturbed(model.pe)
    return model


def forward(model: GPT, idx: Tensor, seed: int = 0) -> Tensor:
    """Logits, with torch's generator and the scheme's evaluation draw reset first (randomized
    schemes sample positions, in training from the former, in evaluation from the latter)."""
    torch.manual_seed(seed)
    model.pe.seed_eval_positions(seed)
    with torch.no_grad():
        return model(idx)


def allowed_entries(x: Tensor, s_q: int, s_k: int) -> Tensor:
    """The entries of ``[..., s_q, s_k]`` the causal mask keeps (queries are the last keys)."""
    return x[..., causal_allowed(s_q, s_k, x.device)]


def max_diff(a: Tensor, b: Tensor) -> float:
    """The largest difference of two outputs (infinities equal where both have the same one,
    as a mask's -inf); a NaN in either fails the check that reads them: NaN compares false
    with any tolerance, so every comparison would pass, and 'differ by nan' says nothing."""
    a, b = a.float(), b.float()
    for x in (a, b):
        if x.isnan().any():
            raise Failed(
                f"the output holds NaN ({int(x.isnan().sum()):,} of {x.numel():,} values), so "
                "nothing can be compared: look for 0/0, log(0) or sqrt(-x) in the scheme's hooks"
            )
    same_infinity = (a == b) & a.isinf()
    return (a - b).abs().masked_fill(same_infinity, 0.0).max().item()


def tolerance(reference: Tensor, rel: float) -> float:
    return rel * max(1.0, reference.abs().max().item())


def qk(setup: Setup, s_q: int, s_k: int, seed: int = 0, **kw: Any) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    d = setup.dims
    q = torch.randn(2, d.num_heads, s_q, d.head_dim, generator=generator)
    k = torch.randn(2, d.num_heads, s_k, d.head_dim, generator=generator)
    return q.to(**kw), k.to(**kw)


def build_setup(
    scheme: str | type[PositionScheme],
    options: Mapping[str, Any],
    plugin: str | None,
    model: ModelConfig | None,
    train_len: int,
) -> Setup:
    """The ``Setup`` of ``check_scheme``'s arguments: a registered name (its plugin imported
    first) or a class, built with ``options`` in ``model`` (default: a tiny one)."""
    if plugin:
        load_plugin(plugin)
    if isinstance(scheme, str):
        cfg = {"name": scheme, **options}
        scheme_class(scheme)  # an unknown name is a UserError, not a failed check

        def make(dims: ModelDims) -> PositionScheme:
            return build_scheme(cfg, dims)

        label = scheme
    else:
        cls = scheme

        def make(dims: ModelDims) -> PositionScheme:
            return cls(dims, **options)

        label = cls.name or cls.__qualname__
    model_cfg = model or ModelConfig(d_model=32, num_layers=2, num_heads=4, mlp_ratio=2)
    return Setup(label, make, model_cfg, train_len)
