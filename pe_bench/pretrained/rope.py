"""RoPE variants on a pretrained HF model: the model's rotary spec, each eval-time variant
applied through pe-bench's frequencies or HF's ``rope_parameters``, and the attention function
that scales queries for a variant with a logit scale (log-n) or mixes two rotations by distance
(ReRoPE, leaky ReRoPE, Self-Extend: ``pretrained.windowed``)."""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from pe_bench.errors import UserError
from pe_bench.positions import META_KEYS, ModelDims, PositionScheme, build_scheme, scheme_class
from pe_bench.positions.rerope import WindowedRoPE
from pe_bench.positions.rotary import RoPE
from pe_bench.pretrained.windowed import windowed_attention
from pe_bench.run.evaluate import (
    EvalConfig,
)

log = logging.getLogger(__name__)

ATTENTION = "pe_bench"  # the attention function registered with HF (SDPA + query scale)


SCALE_ATTR = "_pe_bench_logit_scale"  # set on attention modules while a variant scales q
WINDOWED_ATTR = "_pe_bench_windowed"  # set on attention modules while a windowed variant runs


def _transformers():
    """The ``transformers`` module, or one line saying how to install it."""
    try:
        import transformers
    except ImportError as err:
        raise UserError("model=hf needs transformers: pip install -e '.[hf]'") from err
    return transformers


@dataclass(frozen=True)
class RopeSpec:
    """What a pe-bench scheme needs to know about a pretrained model's RoPE."""

    dims: ModelDims  # head_dim is the rotary dim; train_len the pretraining context
    theta: float  # rope_theta
    params: dict[str, Any]  # the model's own rope_parameters (of ``layer_type``'s layers)
    # A model whose layer types have ropes of their own (Gemma 3: sliding and full attention):
    # the type whose rope the variants change, the others left as they are. None: one rope.
    layer_type: str | None = None


LONG_LAYERS = "full_attention"  # the layers of a model with per-type ropes that see far keys


def rope_spec(config: Any, train_len: int | None, name: str) -> RopeSpec:
    """The rotary dims, base and context of an HF config (of its full-attention layers' rope
    where each layer type has its own, as Gemma 3's); refused in one line: a model whose config
    already scales its RoPE (a rope_type other than default: its variants would stack), and
    one that soft-caps its attention logits (Gemma 2), which pe-bench's attention does not."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    layer_type = LONG_LAYERS if isinstance(params.get(LONG_LAYERS), dict) else None
    if layer_type is not None:
        params = dict(params[layer_type])
    if "rope_theta" not in params:
        raise UserError(f"{name}: its config has no rope_theta; model=hf evaluates RoPE models")
    if params.get("rope_type", "default") != "default":
        raise UserError(
            f"{name} already scales its RoPE (rope_type {params['rope_type']!r}); allowed: "
            "models with rope_type default, whose variants pe-bench applies"
        )
    softcap = getattr(config, "attn_logit_softcapping", None)
    if softcap is not None:
        raise UserError(
            f"{name} ({config.model_type}) soft-caps its attention logits "
            f"(attn_logit_softcapping {softcap}), which model=hf's attention (SDPA, the windowed "
            "variants) does not compute; allowed: models without it (Gemma 3, Llama, Qwen, ...)"
        )
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    rotary = int(head_dim * params.get("partial_rotary_factor", 1.0))
    context = train_len or params.get("original_max_position_embeddings")
    # Phi-3 names its pretraining context so in the config, which HF's rope types read too
    context = context or getattr(config, "original_max_position_embeddings", None)
    context = context or config.max_position_embeddings
    dims = ModelDims(config.hidden_size, heads, rotary, config.num_hidden_layers, int(context))
    return RopeSpec(dims, float(params["rope_theta"]), params, layer_type)


def rotary_modules(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute, module) of each HF rotary embedding (a module with ``inv_freq``
    and ``attention_scaling``, or one of each per layer type, as Gemma 3's), so that it can be
    patched or replaced."""
    found = []
    for name, module in model.named_modules():
        per_type = getattr(module, "layer_types", None)
        if (hasattr(module, "inv_freq") and hasattr(module, "attention_scaling")) or (
            per_type and hasattr(module, f"{per_type[0]}_inv_freq")
        ):
            parent_name, _, attr = name.rpartition(".")
            found.append((model.get_submodule(parent_name), attr, module))
    return found


def attention_layers(model: nn.Module, layer_type: str | None) -> list[nn.Module]:
    """The attention modules (those with a ``layer_idx``) whose rope a variant changes: all,
    or those of ``layer_type``."""
    return [
        m
        for m in model.modules()
        if hasattr(m, "layer_idx") and layer_type in (None, getattr(m, "layer_type", None))
    ]


def scaled_attention(
    module: nn.Module, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, **kwargs
):
    """SDPA, with the queries first multiplied by the variant's ``logit_scale`` when one is set
    on ``module``: row i of q . k times its scale, as ``PositionScheme.transform_qk`` does.
    Positions are taken to be consecutive from 0 (pe-bench's windows and prompts), so the
    queries are the last ``s_q`` of the ``s_k`` keys. A windowed variant set on ``module``
    (ReRoPE, Self-Extend) computes its own attention (``windowed.windowed_attention``)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    windowed = getattr(module, WINDOWED_ATTR, None)
    if windowed is not None:
        scaling = kwargs.get("scaling") or query.shape[-1] ** -0.5
        return windowed_attention(module, query, key, value, mask, windowed, scaling), None
    logit_scale = getattr(module, SCALE_ATTR, None)
    if logit_scale is not None:
        s_q, s_k = query.shape[-2], key.shape[-2]
        k_pos = torch.arange(s_k, device=query.device)
        factor = logit_scale(k_pos[s_k - s_q :], k_pos, module.layer_idx)
        if factor is not None:
            query = query * factor.to(query.dtype).unsqueeze(-1)
    return sdpa_attention_forward(module, query, key, value, mask, **kwargs)


def register_attention() -> None:
    """Register ``scaled_attention`` (and SDPA's mask) with HF under ``ATTENTION``."""
    transformers = _transformers()
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    transformers.AttentionInterface.register(ATTENTION, scaled_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)


def scheme_defaults(scheme: PositionScheme) -> dict[str, Any]:
    """The constructor options a scheme was built with (its signature's defaults, overridden
    by the attributes of the same name it keeps)."""
    params = list(inspect.signature(type(scheme).__init__).parameters.values())[2:]
    return {
        p.name: getattr(scheme, p.name, p.default)
        for p in params
        if p.default is not inspect.Parameter.empty
    }


@dataclass(frozen=True)
class Variant:
    """An eval-time variant of a pretrained model: its scheme and config (options)."""

    key: str  # in eval.variants
    scheme: PositionScheme
    options: dict[str, Any]  # the variant's config options, defaults filled in


def _linear(v: Variant, length: int, spec: RopeSpec) -> dict[str, Any]:
    return {"rope_type": "linear", "factor": v.scheme.scale(length)}


def _dynamic(v: Variant, length: int, spec: RopeSpec) -> dict[str, Any]:
    return {"rope_type": "dynamic", "factor": float(v.options["factor"])}


def _yarn(v: Variant, length: int, spec: RopeSpec) -> dict[str, Any]:
    return {
        "rope_type": "yarn",
        "factor": v.scheme.scale(length),
        "original_max_position_embeddings": spec.dims.train_len,
        "beta_fast": float(v.options["beta_fast"]),
        "beta_slow": float(v.options["beta_slow"]),
    }


def _llama3(v: Variant, length: int, spec: RopeSpec) -> dict[str, Any]:
    return {
        "rope_type": "llama3",
        "factor": v.scheme.scale(length),
        "low_freq_factor": float(v.options["low_freq_factor"]),
        "high_freq_factor": float(v.options["high_freq_factor"]),
        "original_max_position_embeddings": spec.dims.train_len,
    }


def _longrope(v: Variant, length: int, spec: RopeSpec) -> dict[str, Any]:
    train_len = spec.dims.train_len  # HF takes the long factors past it, the short ones up to it
    return {
        "rope_type": "longrope",
        "short_factor": v.scheme.factors(train_len).tolist(),
        "long_factor": v.scheme.factors(max(length, train_len + 1)).tolist(),
        "factor": v.scheme.scale(length),
        "original_max_position_embeddings": train_len,
    }


# pe-bench scheme name -> the HF rope_parameters of the same method at an eval length. Static
# NTK, NTK-by-parts and log-n have no HF rope_type: pe-bench's hook applies them either way.
HF_ROPE_TYPES: dict[str, Callable[[Variant, int, RopeSpec], dict[str, Any]]] = {
    "pi": _linear,
    "dynamic_ntk": _dynamic,
    "yarn": _yarn,
    "llama3": _llama3,
    "longrope": _longrope,
}


def frequencies_only(cls: type[PositionScheme]) -> bool:
    """Whether a scheme is RoPE with its own frequencies (``inv_freq``) and at most a logit
    scale: all that the rotary patch and ``scaled_attention`` carry into an HF model. One that
    rotates otherwise or adds to the logits (ReRoPE, Self-Extend) is not."""
    return (
        issubclass(cls, RoPE)
        and cls.rotate is RoPE.rotate
        and cls.transform_qk is PositionScheme.transform_qk
        and cls.score_bias is PositionScheme.score_bias
    )


def windowed(cls: type[PositionScheme]) -> bool:
    """Whether a scheme mixes two rotations by distance through the hooks of
    ``WindowedRoPE`` (ReRoPE, leaky ReRoPE, Self-Extend), which ``windowed_attention``
    computes for an HF model. A subclass that changes any other hook is not."""
    return (
        issubclass(cls, WindowedRoPE)
        and cls.rotate is WindowedRoPE.rotate
        and cls.modify_logits is WindowedRoPE.modify_logits
        and cls.transform_qk is PositionScheme.transform_qk
        and cls.score_bias is PositionScheme.score_bias
    )


def build_variants(eval_cfg: EvalConfig, spec: RopeSpec) -> list[Variant]:
    """The RoPE variants of ``eval.variants``, each built for the pretrained model's rotary
    dims and context with ``base`` = its ``rope_theta`` (the configs' trained-rope base does
    not apply to a pretrained model); a variant of another scheme is refused."""
    variants = []
    for key, variant_cfg in (eval_cfg.variants or {}).items():
        where = f"eval.variants.{key}"
        if not isinstance(variant_cfg, dict) or "name" not in variant_cfg:
            raise UserError(
                f"{where}={variant_cfg!r} must be a variant config, e.g. +pe@{where}=pi"
            )
        cls = scheme_class(variant_cfg["name"])
        if cls.variant_of != "rope" or not (frequencies_only(cls) or windowed(cls)):
            raise UserError(
                f"{where}: {cls.name!r} is not a RoPE variant of frequencies and logit scales "
                "or a windowed one; model=hf applies those (pi, ntk, dynamic_ntk, yarn, "
                "logn, ntk_by_parts, llama3, longrope; rerope, leaky_rerope, self_extend, dca, "
                "streaming_llm, lm_infinite, string)"
            )
        built = {**variant_cfg, "base": spec.theta}
        scheme = build_scheme(built, spec.dims, where + ".")
        options = scheme_defaults(scheme) | {k: v for k, v in built.items() if k not in META_KEYS}
        variants.append(Variant(key, scheme, options))
    return variants


def uses_hf(variant: Variant | None, impl: str) -> bool:
    """Whether ``variant`` is applied through HF's rope_parameters (else pe-bench's hook)."""
    return variant is not None and impl == "hf" and variant.scheme.name in HF_ROPE_TYPES


@contextlib.contextmanager
def rope_variant(
    model: nn.Module, variant: Variant | None, spec: RopeSpec, length: int, impl: str
) -> Iterator[str]:
    """Evaluate ``model`` with ``variant`` at context ``length`` (``None``: as pretrained),
    through HF's rope_parameters where ``impl`` is ``hf`` and HF has the method, else through
    pe-bench's hook; yields which (``hf`` or ``pe_bench``) and restores the model after."""
    if variant is None:
        yield "none"
        return
    if uses_hf(variant, impl):
        params = {**spec.params, **HF_ROPE_TYPES[variant.scheme.name](variant, length, spec)}
        if spec.layer_type is not None:  # the other layer types' ropes as they are
            params = {**model.config.rope_parameters, spec.layer_type: params}
        with hf_rope(model, params, spec.dims.train_len):
            yield "hf"
        return
    with pe_bench_rope(model, variant.scheme, length, spec.layer_type):
        yield "pe_bench"


@contextlib.contextmanager
def hf_rope(model: nn.Module, params: dict[str, Any], train_len: int) -> Iterator[None]:
    """Each rotary embedding rebuilt from a copy of the model's config with ``params`` as its
    ``rope_parameters`` (and ``max_position_embeddings`` = the pretraining context, which HF's
    dynamic scaling reads as such): a fresh module per use, so that no frequencies cached by
    an earlier length carry over (huggingface/transformers#25104)."""
    config = copy.deepcopy(model.config)
    config.rope_parameters = dict(params)
    config.max_position_embeddings = train_len
    originals = rotary_modules(model)
    try:
        for parent, attr, module in originals:
            device = next(iter(module.buffers())).device
            setattr(parent, attr, type(module)(config).to(device))
        yield
    finally:
        for parent, attr, module in originals:
            setattr(parent, attr, module)


@contextlib.contextmanager
def pe_bench_rope(
    model: nn.Module, scheme: RoPE, length: int, layer_type: str | None = None
) -> Iterator[None]:
    """The rotary embeddings' frequencies from ``scheme`` at context ``length`` (fixed for the
    whole use, generation included), cos and sin times its ``attention_factor`` where it has
    one; a scheme's other ``logit_scale`` set on the attention modules for ``scaled_attention``.
    A windowed scheme (ReRoPE, DCA, ...) gets q and k unrotated (cos 1, sin 0) and is set on
    the attention modules, which rotate them its ways (``windowed_attention``). With a
    ``layer_type`` (per-type ropes), only that type's rope and layers.
    """
    device = next(model.parameters()).device
    scheme = scheme.to(device)
    k_pos = torch.arange(length, device=device)
    inv_freq = scheme.frequencies(k_pos)  # [rotary/2] float32
    attention_factor = getattr(scheme, "attention_factor", None)
    factor = float(attention_factor(length)) if attention_factor is not None else 1.0
    two_ways = windowed(type(scheme))
    scales_q = (
        not two_ways
        and attention_factor is None
        and type(scheme).logit_scale is not PositionScheme.logit_scale
    )

    def forward(module: nn.Module, x: Tensor, position_ids: Tensor, *args: Any, **kwargs: Any):
        if layer_type is not None and (args[:1] or [kwargs.get("layer_type")])[0] != layer_type:
            return type(module).forward(module, x, position_ids, *args, **kwargs)
        freqs = position_ids[..., None].float() * inv_freq  # as HF: float32 angles
        emb = torch.cat((freqs, freqs), dim=-1)
        if two_ways:  # the identity: windowed_attention rotates q and k itself
            return torch.ones_like(emb).to(x.dtype), torch.zeros_like(emb).to(x.dtype)
        return (emb.cos() * factor).to(x.dtype), (emb.sin() * factor).to(x.dtype)

    rotaries = [module for _, _, module in rotary_modules(model)]
    attr, value = (WINDOWED_ATTR, scheme) if two_ways else (SCALE_ATTR, scheme.logit_scale)
    layers = attention_layers(model, layer_type) if two_ways or scales_q else []
    try:
        for module in rotaries:
            module.forward = functools.partial(forward, module)
        for module in layers:
            setattr(module, attr, value)
        yield
    finally:
        for module in rotaries:
            del module.forward  # the class's forward again
        for module in layers:
            delattr(module, attr)


@dataclass(frozen=True)
class Effect:
    """What the model computes with a variant at windows of one length: its frequencies
    (float64, ``None`` for a windowed variant past its window), the factor on cos and sin and
    the queries' logit scale at positions 0..L-1 (``None`` where it is 1 everywhere); a
    windowed variant past its window is ``own``, the same as itself only."""

    inv_freq: Tensor | None
    factor: float = 1.0
    scale: Tensor | None = None
    own: str = ""

    def same(self, other: Effect) -> bool:
        """Whether both compute the same numbers: equal factors and scales, and frequencies
        equal to float64 rounding (a method at scale 1 computes theta (1 - r) + theta r)."""
        if self.own or other.own or self.inv_freq is None or other.inv_freq is None:
            return bool(self.own) and self.own == other.own
        if (self.scale is None) != (other.scale is None) or not math.isclose(
            self.factor, other.factor, rel_tol=1e-12
        ):
            return False
        if self.scale is not None and not torch.allclose(self.scale, other.scale, 1e-12, 0.0):
            return False
        return torch.allclose(self.inv_freq, other.inv_freq, rtol=1e-12, atol=0.0)


def effect(variant: Variant | None, spec: RopeSpec, length: int) -> Effect:
    """The ``Effect`` of ``variant`` (None: the model as pretrained) at ``length``: a variant
    at a length where it is plain RoPE (PI, NTK, YaRN, ... at or below the pretraining
    context; ReRoPE and Self-Extend within their window) has the model's own."""
    plain = Effect(RoPE(spec.dims, base=spec.theta).theta)
    if variant is None:
        return plain
    scheme = variant.scheme
    k_pos = torch.arange(length)
    scale = None
    if type(scheme).logit_scale is not PositionScheme.logit_scale:
        scale = scheme.logit_scale(k_pos, k_pos, 0)
        scale = None if scale is None or bool((scale == 1).all()) else scale.double()
    if windowed(type(scheme)):
        plain_here = length <= scheme.plain_up_to and scale is None
        return plain if plain_here else Effect(None, own=variant.key)
    attention_factor = getattr(scheme, "attention_factor", None)
    factor = float(attention_factor(length)) if attention_factor is not None else 1.0
    return Effect(scheme.inv_freq(length).double().cpu(), factor, scale)


def same_as(
    variants: list[Variant], spec: RopeSpec, lengths: list[int]
) -> dict[tuple[str, int], str]:
    """(variant key, length) -> the first label before it ("none": the model as pretrained,
    then ``variants`` in order) that computes the same numbers there: its record is a copy of
    that label's (``Effect.same``), not computed again."""
    found = {}
    for length in lengths:
        seen = [("none", effect(None, spec, length))]
        for variant in variants:
            mine = effect(variant, spec, length)
            first = next((key for key, other in seen if mine.same(other)), None)
            if first is not None:
                found[(variant.key, length)] = first
            seen.append((variant.key, mine))
    return found
