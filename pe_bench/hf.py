"""Pretrained Hugging Face causal LMs with RoPE under pe-bench's protocol (``model=hf``).

``model=hf model.name=<hub id or local folder>`` loads a pretrained causal LM (Llama, Mistral,
Qwen2, GPT-NeoX/Pythia and any other model whose rotary embedding is HF's standard module) in
float32 and evaluates it, without training, as pe-bench evaluates its own models: the same
windows (``pe_bench.evaluate.score``), records, reports and CIs, with the model's own tokenizer,
then passkey retrieval (``pe_bench.passkey``).

Eval-time RoPE variants (``eval.variants``: pi, ntk, dynamic_ntk, yarn, logn, ...) are
pe-bench's scheme classes, built for the model's rotary dims, ``rope_theta`` and pretraining
context, and applied in one of two ways (``model.rope_impl``):

- ``pe_bench`` (default): the model's rotary embedding takes its frequencies from the scheme's
  ``frequencies`` (its ``inv_freq`` at the evaluated context length) and its cos/sin factor
  from the scheme's ``attention_factor`` where it has one (YaRN: HF's ``attention_scaling``);
  a scheme with any other ``logit_scale`` (log-n) has its queries scaled in the attention
  function ``pe_bench`` registered with HF's ``AttentionInterface`` (SDPA otherwise).
- ``hf``: where Hugging Face has a ``rope_type`` for the method (``HF_ROPE_TYPES``: linear =
  PI, dynamic, yarn, llama3, longrope), the rotary embedding is rebuilt from the model's config
  with those ``rope_parameters``; the other variants fall back to the pe-bench hook. Each
  record's ``rope_impl`` says which one computed it.

``tests/test_hf.py`` holds both ways to the same logits on tiny random-weight models, so a
result can be trusted either way. On a partial-rotary model (Pythia rotates a quarter of each
head) an attention factor on cos and sin scales only the rotated part of q . k: HF does so,
and pe-bench follows it (an ``attention_factor`` goes on cos and sin, not on q).

The confidence intervals of a pretrained model are over ``model.test_slices`` disjoint slices
of the test split (one model, so no seeds): slice k is scored as its own run, with ``seed`` =
``test_slice`` = k, so the report's intervals over seeds are intervals over slices (the run
id is ``<model>-<hash>:slice-<k>``, one job folder for the model). The corpus is tokenized by
the model's tokenizer behind ``pe_bench.tokenizer``'s interface, as any tokenized run: bits
per byte divide by the summed UTF-8 bytes of exactly the scored targets (``target_bytes``).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import inspect
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from pe_bench.config import Range, config_hash, from_node, to_dict
from pe_bench.data import check_config, load_corpus
from pe_bench.errors import UserError
from pe_bench.evaluate import (
    OUT_OF_MEMORY,
    EvalConfig,
    EvalTask,
    eval_tasks,
    is_out_of_memory,
    score,
)
from pe_bench.positions import META_KEYS, ModelDims, PositionScheme, build_scheme, scheme_class
from pe_bench.positions.rotary import RoPE
from pe_bench.results import make_record, provenance
from pe_bench.store import RunStore, job_lock
from pe_bench.tokenizer import HF_PREFIX, HFTokenizer
from pe_bench.train import resolve_device

log = logging.getLogger(__name__)

SOURCE = "hf"  # model.source of a pretrained model
IMPLS = ("pe_bench", "hf")
ATTENTION = "pe_bench"  # the attention function registered with HF (SDPA + query scale)
SCALE_ATTR = "_pe_bench_logit_scale"  # set on attention modules while a variant scales q


@dataclass
class HFConfig:
    """``conf/model/hf.yaml``: which pretrained model, and how it is evaluated."""

    source: str = SOURCE
    name: str = ""  # hub id (needs a network or the HF cache) or local folder
    revision: str | None = None  # hub branch, tag or commit
    train_len: Annotated[int, Range(ge=2)] | None = None  # null: from the model's config
    rope_impl: str = "pe_bench"  # pe_bench | hf: how variants with an HF rope_type are applied
    test_slices: Annotated[int, Range(ge=1)] = 4  # disjoint test slices: the CIs are over them
    passkey: dict[str, Any] | None = None  # pe_bench.passkey.PasskeyConfig; null: no passkey

    def __post_init__(self) -> None:
        if self.name in ("", "???"):
            raise UserError("model=hf needs model.name=<hub id or local folder>")
        if self.rope_impl not in IMPLS:
            raise UserError(f"model.rope_impl={self.rope_impl!r}; allowed: {', '.join(IMPLS)}")


def is_pretrained(cfg: DictConfig) -> bool:
    """Whether a composed config evaluates a pretrained HF model (``model=hf``)."""
    return OmegaConf.select(cfg, "model.source", default=None) == SOURCE


def _transformers():
    """The ``transformers`` module, or one line saying how to install it."""
    try:
        import transformers
    except ImportError as err:
        raise UserError("model=hf needs transformers: pip install -e '.[hf]'") from err
    return transformers


def _one_line(err: BaseException) -> str:
    text = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    return f"{type(err).__name__}: {text}"


def _load_error(what: str, name: str, err: BaseException) -> UserError:
    return UserError(
        f"cannot load the {what} of Hugging Face model {name!r} ({_one_line(err)[:300]}); "
        "allowed: a hub id reachable from here (or in the HF cache) or a local folder with "
        "config.json, e.g. one experiments/make_tiny_hf.py writes"
    )


# ---- tokenizer ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenStream:
    """Token ids of a text, with the UTF-8 bytes of the text up to the end of each token."""

    ids: Tensor  # [n] int64
    byte_ends: Tensor  # [n] int64

    def target_bytes(self, start: int, stop: int) -> int:
        """UTF-8 bytes of targets ``start + 1 .. stop`` (a window scoring the targets after
        input ``start`` up to token ``stop``): the sum of those tokens' own bytes."""
        return int(self.byte_ends[stop] - self.byte_ends[start])


def load_tokenizer(name: str, revision: str | None = None) -> Any:
    """The model's own tokenizer (at ``revision``, as the weights): passkey prompts are encoded
    with its special tokens, as the originals' pipelines do, and answers decoded by it."""
    transformers = _transformers()
    try:
        return transformers.AutoTokenizer.from_pretrained(name, revision=revision)
    except Exception as err:
        raise _load_error("tokenizer", name, err) from err


def corpus_tokenizer(tokenizer: Any, name: str) -> HFTokenizer:
    """The model's tokenizer behind pe-bench's interface (``pe_bench.tokenizer``): the corpus's
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


# ---- the model --------------------------------------------------------------------------------


class LogitsOnly(nn.Module):
    """An HF causal LM as pe-bench's scorers call a model: token ids in, logits out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Tensor:
        return self.model(input_ids=x, use_cache=False).logits


def load_config(cfg: HFConfig) -> Any:
    """The model's HF config (from the hub, the HF cache or a local folder)."""
    transformers = _transformers()
    try:
        return transformers.AutoConfig.from_pretrained(cfg.name, revision=cfg.revision)
    except Exception as err:
        raise _load_error("config", cfg.name, err) from err


def load_model(cfg: HFConfig, device: torch.device) -> nn.Module:
    """The pretrained weights in float32, in eval mode, with the ``pe_bench`` attention."""
    transformers = _transformers()
    register_attention()
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            cfg.name, revision=cfg.revision, dtype=torch.float32, attn_implementation=ATTENTION
        )
    except Exception as err:
        raise _load_error("weights", cfg.name, err) from err
    if not rotary_modules(model):
        raise UserError(f"{cfg.name}: no rotary embedding found; model=hf evaluates RoPE models")
    return model.to(device).eval()


@dataclass(frozen=True)
class RopeSpec:
    """What a pe-bench scheme needs to know about a pretrained model's RoPE."""

    dims: ModelDims  # head_dim is the rotary dim; train_len the pretraining context
    theta: float  # rope_theta
    params: dict[str, Any]  # the model's own rope_parameters


def rope_spec(config: Any, train_len: int | None, name: str) -> RopeSpec:
    """The rotary dims, base and context of an HF config; a model whose config already scales
    its RoPE (a rope_type other than default) is refused: its variants would stack."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    if "rope_theta" not in params:
        raise UserError(f"{name}: its config has no rope_theta; model=hf evaluates RoPE models")
    if params.get("rope_type", "default") != "default":
        raise UserError(
            f"{name} already scales its RoPE (rope_type {params['rope_type']!r}); allowed: "
            "models with rope_type default, whose variants pe-bench applies"
        )
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    rotary = int(head_dim * params.get("partial_rotary_factor", 1.0))
    context = train_len or params.get("original_max_position_embeddings")
    context = context or config.max_position_embeddings
    dims = ModelDims(config.hidden_size, heads, rotary, config.num_hidden_layers, int(context))
    return RopeSpec(dims, float(params["rope_theta"]), params)


def rotary_modules(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute, module) of each HF rotary embedding (a module with ``inv_freq``
    and ``attention_scaling``), so that it can be patched or replaced."""
    found = []
    for name, module in model.named_modules():
        if hasattr(module, "inv_freq") and hasattr(module, "attention_scaling"):
            parent_name, _, attr = name.rpartition(".")
            found.append((model.get_submodule(parent_name), attr, module))
    return found


# ---- applying a variant ------------------------------------------------------------------------


def scaled_attention(
    module: nn.Module, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, **kwargs
):
    """SDPA, with the queries first multiplied by the variant's ``logit_scale`` when one is set
    on ``module``: row i of q . k times its scale, as ``PositionScheme.transform_qk`` does.
    Positions are taken to be consecutive from 0 (pe-bench's windows and prompts), so the
    queries are the last ``s_q`` of the ``s_k`` keys."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

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
        if cls.variant_of != "rope" or not frequencies_only(cls):
            raise UserError(
                f"{where}: {cls.name!r} is not a RoPE variant of frequencies and logit scales; "
                "model=hf applies those (pi, ntk, dynamic_ntk, yarn, logn, ntk_by_parts, "
                "llama3, longrope)"
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
        with hf_rope(model, params, spec.dims.train_len):
            yield "hf"
        return
    with pe_bench_rope(model, variant.scheme, length):
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
            device = module.inv_freq.device
            setattr(parent, attr, type(module)(config).to(device))
        yield
    finally:
        for parent, attr, module in originals:
            setattr(parent, attr, module)


@contextlib.contextmanager
def pe_bench_rope(model: nn.Module, scheme: RoPE, length: int) -> Iterator[None]:
    """The rotary embeddings' frequencies from ``scheme`` at context ``length`` (fixed for the
    whole use, generation included), cos and sin times its ``attention_factor`` where it has
    one; a scheme's other ``logit_scale`` set on the attention modules for ``scaled_attention``.
    """
    device = next(model.parameters()).device
    scheme = scheme.to(device)
    k_pos = torch.arange(length, device=device)
    inv_freq = scheme.frequencies(k_pos)  # [rotary/2] float32
    attention_factor = getattr(scheme, "attention_factor", None)
    factor = float(attention_factor(length)) if attention_factor is not None else 1.0
    scales_q = attention_factor is None and (
        type(scheme).logit_scale is not PositionScheme.logit_scale
    )

    def forward(x: Tensor, position_ids: Tensor, **kwargs: Any) -> tuple[Tensor, Tensor]:
        freqs = position_ids[..., None].float() * inv_freq  # as HF: float32 angles
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * factor).to(x.dtype), (emb.sin() * factor).to(x.dtype)

    rotaries = [module for _, _, module in rotary_modules(model)]
    layers = [m for m in model.modules() if hasattr(m, "layer_idx")] if scales_q else []
    try:
        for module in rotaries:
            module.forward = forward
        for module in layers:
            setattr(module, SCALE_ATTR, scheme.logit_scale)
        yield
    finally:
        for module in rotaries:
            del module.forward  # the class's forward again
        for module in layers:
            delattr(module, SCALE_ATTR)


# ---- the run ------------------------------------------------------------------------------------


@dataclass
class HFRun:
    """A parsed ``model=hf`` config: what to evaluate, and the identity of its records."""

    model: HFConfig
    eval: EvalConfig
    data: dict[str, Any]
    device: torch.device
    force: bool
    run_hash: str
    yaml: str
    resolved: dict[str, Any] = field(default_factory=dict)

    @property
    def short_name(self) -> str:
        """The model's name in labels: the last part of its hub id or folder."""
        return Path(self.model.name.rstrip("/")).name

    def run_id(self, test_slice: int) -> str:
        """One model, several test slices: ``<model>-<hash>:slice-<k>``, the form of a
        fine-tune's id (one job folder, one model), though with no fine-tune."""
        return f"{self.short_name}-{self.run_hash}:slice-{test_slice}"


def parse(cfg: DictConfig) -> HFRun:
    """The ``model=hf`` config, checked before anything is loaded."""
    if "hydra" in cfg:
        cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    resolved = to_dict(cfg)
    model = from_node(HFConfig, resolved["model"], "model")
    eval_cfg = from_node(EvalConfig, resolved["eval"], "eval")
    data = resolved["data"]
    check_config(data)
    if data.get("source") == "task":
        raise UserError("model=hf evaluates text; allowed data: stdlib, text, hf")
    device = resolve_device(resolved["train"]["device"])
    identity = {"model": {k: v for k, v in resolved["model"].items() if k != "passkey"}}
    return HFRun(
        model=model,
        eval=eval_cfg,
        data=data,
        device=device,
        force=bool(resolved.get("force", False)),
        run_hash=config_hash({**identity, "data": data}),
        yaml=OmegaConf.to_yaml(cfg, resolve=True),
        resolved=resolved,
    )


def code_hash() -> str:
    """A hash of the code that computes a pretrained model's numbers (this module, the
    passkey test and the rotary schemes): records made by other code are recomputed."""
    from pe_bench import passkey
    from pe_bench.positions import rotary

    digest = hashlib.sha256()
    for path in (__file__, passkey.__file__, rotary.__file__):
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()[:12]


def run(cfg: DictConfig, out_dir: Path) -> list[dict[str, Any]]:
    """Evaluate the pretrained model of ``cfg`` (perplexity per test slice, then passkey) and
    write its records into ``out_dir``; only missing records are computed."""
    from pe_bench import passkey

    job = parse(cfg)
    if job.eval.probes:
        log.info("eval.probes (%s): not run on a pretrained model", ", ".join(job.eval.probes))
    hf_config = load_config(job.model)
    spec = rope_spec(hf_config, job.model.train_len, job.model.name)
    variants = build_variants(job.eval, spec)
    train_len = spec.dims.train_len
    lengths = job.eval.eval_lengths(train_len)
    n_targets = job.eval.n_targets(lengths)
    schemes = [("none", "", None)] + [
        (v.key, config_hash(job.eval.variants[v.key]), v.scheme) for v in variants
    ]
    tasks = eval_tasks(schemes, lengths, job.eval, train_len)
    by_key = {v.key: v for v in variants}
    slices = list(range(job.model.test_slices))
    pk_cfg = passkey.parse_config(job.model.passkey)
    pk_tasks = passkey.tasks(pk_cfg, schemes, train_len) if pk_cfg else []
    with job_lock(out_dir):
        corpus = load_corpus(job.data)
        tokenizer = load_tokenizer(job.model.name, job.model.revision)
        corpus_tokens = corpus_tokenizer(tokenizer, job.model.name)
        token_fields = tokenizer_fields(corpus_tokens)
        store = RunStore(
            out_dir,
            [job.run_id(k) for k in slices],
            corpus.sha,
            job.force,
            variants={key: digest for key, digest, _ in schemes},
            probes={passkey.MODE: passkey.settings_hash(pk_cfg)} if pk_cfg else {},
            pe_source=code_hash(),
            tokenizer_sha=token_fields["tokenizer_sha"],
        )
        todo = {k: store.missing(job.run_id(k), tasks, n_targets) for k in slices}
        pk_todo = store.missing(job.run_id(0), pk_tasks, pk_cfg.trials) if pk_cfg else []
        if not any(todo.values()) and not pk_todo:
            log.info("%s: all %d records are there: skipped", out_dir, len(store.records))
            return store.records
        store.write_config(job.yaml)
        passkey.check_lengths(tokenizer.encode, [t.eval_len for t in pk_todo])
        test = corpus.splits["test"].numpy().tobytes()
        stream = encode_prefix(corpus_tokens, test, len(slices) * n_targets + 1, corpus.name)
        model = load_model(job.model, job.device)
        fields = _run_fields(job, model, spec, corpus) | token_fields
        log.info(
            "%s: %d perplexity and %d passkey records to compute, %s",
            job.model.name,
            sum(map(len, todo.values())),
            len(pk_todo),
            corpus.describe(),
        )
        lm = LogitsOnly(model)
        for k in slices:
            start = k * n_targets
            piece = stream.ids[start : start + n_targets + 1]
            n_bytes = stream.target_bytes(start, start + n_targets)
            slice_fields = {**fields, "run_id": job.run_id(k), "seed": k, "test_slice": k}
            slice_fields["target_bytes"] = n_bytes
            for task in todo[k]:
                store.add(*_score(job, lm, by_key, spec, task, piece, slice_fields))
        if pk_todo:
            pk_fields = {**fields, "run_id": job.run_id(0), "seed": 0, "test_slice": 0}
            for record in passkey.run(model, tokenizer, pk_todo, by_key, spec, job, pk_cfg):
                store.add({**pk_fields, **record})
    return store.records


def _score(
    job: HFRun,
    lm: LogitsOnly,
    variants: dict[str, Variant],
    spec: RopeSpec,
    task: EvalTask,
    stream: Tensor,
    fields: dict[str, Any],
) -> tuple[dict[str, Any], list[float | None] | None]:
    """One perplexity record (ok, or skipped when the length does not fit in memory) and its
    per-position loss; bits per byte over the ``target_bytes`` of the scored targets."""
    n_targets = len(stream) - 1
    variant = variants.get(task.variant)
    label = job.short_name + ("" if variant is None else f"+{variant.key}")
    key = task.fields(n_targets)
    start = time.perf_counter()
    try:
        with rope_variant(lm.model, variant, spec, task.eval_len, job.model.rope_impl) as impl:
            result = score(
                lm,
                stream,
                task.eval_len,
                task.mode,
                task.stride,
                job.eval.batch_tokens,
                job.device,
                f"eval {label} L={task.eval_len} slice {fields['test_slice']}",
            )
    except OUT_OF_MEMORY as err:
        if not is_out_of_memory(err):
            raise
        reason = f"out of memory at L={task.eval_len}: {str(err).splitlines()[0][:200]}"
        log.error("%s: %s; recorded as skipped", label, reason)
        return make_record(fields, key, "skipped", reason=reason), None
    elapsed = round(time.perf_counter() - start, 3)
    bytes_per_token = fields["target_bytes"] / n_targets  # exact: their sum is target_bytes
    record = make_record(
        fields, key, "ok", result.nll, bytes_per_token, rope_impl=impl, time_s=elapsed
    )
    log.info(
        "%s L=%d %s slice %d: nll %.4f",
        label,
        task.eval_len,
        task.mode,
        fields["test_slice"],
        result.nll,
    )
    return record, result.position_loss()


def _run_fields(job: HFRun, model: nn.Module, spec: RopeSpec, corpus: Any) -> dict[str, Any]:
    """The fields every record of the pretrained model shares."""
    config = model.config
    return {
        "scheme": job.short_name,
        "model": job.model.name,
        "revision": job.model.revision,
        "pretrained": True,
        "train_len": spec.dims.train_len,
        "params": sum(p.numel() for p in model.parameters()),
        "d_model": config.hidden_size,
        "num_layers": config.num_hidden_layers,
        "num_heads": spec.dims.num_heads,
        "rotary_dim": spec.dims.head_dim,
        "rope_theta": spec.theta,
        "corpus": corpus.name,
        "corpus_sha": corpus.sha,
        "config_hash": job.run_hash,
        "pe_source": code_hash(),
        **provenance(job.device),
    }
