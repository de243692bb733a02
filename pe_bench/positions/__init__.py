"""Position schemes: the registry, and ``build_scheme`` that turns a ``pe`` config into one.

Importing this package registers the built-in schemes. A user's scheme registers itself when
its module is imported, which happens

- for ``pe.plugin: my_pkg.my_module`` in the config (``+pe.plugin=...`` on the command line);
- for an installed package that declares an entry point in the group ``pe_bench.positions``
  (``my_pe = "my_pkg.my_module:MyScheme"``): loaded lazily, the first time a name is not
  found among the registered schemes.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import typing
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pe_bench.config import check_value
from pe_bench.errors import UserError, from_ctrl_c
from pe_bench.positions import (  # noqa: F401  (importing registers the built-ins)
    absolute,
    bias,
    bilevel,
    contextual,
    dropped,
    fire,
    fourier,
    gates,
    householder,
    logits,
    long_context,
    polar,
    randomized,
    relative,
    rerope,
    rotary,
    rotary_zoo,
    temperature,
)
from pe_bench.positions.base import ModelDims, PositionScheme, register, registered
from pe_bench.positions.fingerprint import class_key
from pe_bench.positions.rotary import RoPE

__all__ = [
    "ENTRY_POINT_GROUP",
    "ModelDims",
    "PositionScheme",
    "build_scheme",
    "checked_options",
    "entry_points",
    "load_plugin",
    "options_label",
    "register",
    "registered",
    "scheme_class",
    "scheme_family",
    "scheme_key",
]

ENTRY_POINT_GROUP = "pe_bench.positions"

# Keys of a ``pe`` config that are not constructor arguments.
META_KEYS = ("name", "plugin")


def load_plugin(module: str, where: str = "pe.plugin") -> None:
    """Import a user's module so that its ``@register`` decorators run; any error it raises
    (a syntax error, an exception at import, a bad ``@register``) is the user's, one line."""
    if not isinstance(module, str) or not module:
        raise UserError(f"{where}={module!r} must be a module name, e.g. my_pkg.my_pe")
    try:
        importlib.import_module(module)
    except Exception as err:
        if from_ctrl_c(err):  # the user's Ctrl-C during the import, not the module's fault
            raise
        raise UserError(f"{where}={module!r} does not import: {_one_line(err)}") from err


def _one_line(err: BaseException) -> str:
    """An exception as one line: its type, first line, and for a syntax error where it is."""
    text = str(err).splitlines()[0] if str(err) else ""
    if isinstance(err, SyntaxError) and err.filename:
        text = f"{err.msg} ({err.filename}, line {err.lineno})"
    return text if isinstance(err, ImportError) else f"{type(err).__name__}: {text}"


def entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """Installed plugins: entry points of the group ``pe_bench.positions`` by name."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _load_entry_point(ep: importlib.metadata.EntryPoint) -> None:
    """Import an entry point's module; register its object under the entry point's name if
    it is a scheme class its module did not register itself."""
    try:
        obj = ep.load()
    except Exception as err:  # a broken plugin must not stop the benchmark with a traceback
        raise UserError(f"entry point {ep.name!r} = {ep.value!r} does not load: {err}") from err
    if ep.name not in registered() and inspect.isclass(obj) and issubclass(obj, PositionScheme):
        register(ep.name)(obj)


def scheme_class(name: str) -> type[PositionScheme]:
    """The registered class for ``name`` (loading an installed plugin of that name if needed),
    or a ``UserError`` listing the known names."""
    if name not in registered():
        plugins = entry_points()
        if name in plugins:
            _load_entry_point(plugins[name])
        if name not in registered():
            installed = f"; installed plugins: {', '.join(sorted(plugins))}" if plugins else ""
            raise UserError(
                f"unknown scheme {name!r}; registered: {', '.join(sorted(registered()))}{installed}"
            )
    return registered()[name]


def scheme_options(cls: type[PositionScheme]) -> list[str]:
    """Keyword options a scheme's constructor accepts (its config keys besides ``name``)."""
    params = list(inspect.signature(cls.__init__).parameters.values())[2:]  # skip self, dims
    return [p.name for p in params]


def option_hints(cls: type[PositionScheme]) -> dict[str, Any]:
    """Each option's type (its constructor annotation) with its range (``option_ranges``), for
    ``check_value``; options without an annotation (a plugin's, say) are not checked."""
    try:
        hints = typing.get_type_hints(cls.__init__, include_extras=True)
    except Exception:  # a plugin's annotation that does not resolve: check no types
        hints = {}
    ranges = getattr(cls, "option_ranges", {})
    checked = {}
    for name in scheme_options(cls):
        if name in hints:
            hint = hints[name]
            checked[name] = Annotated[hint, ranges[name]] if name in ranges else hint
    return checked


def checked_options(cls: type[PositionScheme], options: Mapping[str, Any], prefix: str) -> dict:
    """``options`` coerced to their types and checked against their ranges, or a ``UserError``
    naming ``<prefix><option>`` (``pe.base``, ``eval.variants.pi.factor``), the value and what
    is allowed; an unknown option lists the allowed ones."""
    allowed = scheme_options(cls)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise UserError(
            f"scheme {cls.name!r} has no option {', '.join(unknown)}; "
            f"allowed: {', '.join(allowed) or 'none'}"
        )
    hints = option_hints(cls)
    return {
        key: check_value(value, hints[key], f"{prefix}{key}") if key in hints else value
        for key, value in options.items()
    }


def options_label(cfg: Mapping[str, Any]) -> str:
    """The options of a ``pe`` config that differ from its scheme's defaults, as ``key=value``
    joined by commas in the constructor's order (``p=0.25``; '' when all are defaults): what
    sets two runs of one scheme apart in a report's labels (``p_rope(p=0.25)``), stable across
    runs and readable."""
    cls = scheme_class(cfg["name"])
    params = list(inspect.signature(cls.__init__).parameters.values())[2:]  # skip self, dims
    parts = []
    for param in params:
        if param.name in cfg and not _is_default(cfg[param.name], param.default):
            parts.append(f"{param.name}={_short(cfg[param.name])}")
    return ",".join(parts)


def _is_default(value: Any, default: Any) -> bool:
    """Whether an option's value is its default; a list (as YAML gives one) is a tuple default
    of the same items (a default cannot be a mutable list)."""
    if isinstance(default, tuple) and isinstance(value, Sequence) and not isinstance(value, str):
        return tuple(value) == default
    return value == default


def scheme_family(name: str) -> str:
    """The family a report groups a trained scheme in when it has too many lines for one
    panel, from what the class is and which hooks it overrides (never from its name): rotary
    (RoPE and its subclasses), additive bias (a content-free ``score_bias``), absolute or
    none (embeddings, NoPE), content-dependent and gated (the rest); an unregistered
    scheme's records (a plugin not imported) are plugins."""
    cls = registered().get(name)
    if cls is None:
        return "plugins"
    if issubclass(cls, RoPE):
        return "rotary"
    if cls.score_bias is not PositionScheme.score_bias and not cls.content_bias:
        return "additive bias"
    attention_hooks = ("transform_qk", "rotate", "logit_scale", "score_bias", "modify_logits")
    overridden = [h for h in (*attention_hooks, "attention_weights") if _overrides(cls, h)]
    if _overrides(cls, "embed") or not overridden:
        return "absolute or none"
    return "content-dependent and gated"


def _overrides(cls: type[PositionScheme], hook: str) -> bool:
    return getattr(cls, hook) is not getattr(PositionScheme, hook)


def _short(value: Any) -> str:
    """An option's value as a label shows it: floats in their shortest form, lists bracketed."""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_short(v) for v in value) + "]"
    return str(value)


def build_scheme(cfg: Mapping[str, Any], dims: ModelDims, prefix: str = "pe.") -> PositionScheme:
    """Build the scheme a ``pe`` config names, with its options, for a model of ``dims``;
    ``prefix`` is where the config sits, for the messages (``pe.``, ``eval.variants.pi.``)."""
    if not isinstance(cfg, Mapping):
        raise UserError(f"{prefix.rstrip('.')}={cfg!r} must be a scheme config with a name")
    if cfg.get("plugin"):
        load_plugin(cfg["plugin"], f"{prefix}plugin")
    if "name" not in cfg:
        raise UserError(f"the {prefix.rstrip('.')} config has no 'name'; pick one with pe=<name>")
    cls = scheme_class(cfg["name"])
    options = checked_options(cls, {k: v for k, v in cfg.items() if k not in META_KEYS}, prefix)
    if cls.__module__.split(".")[0] == "pe_bench":
        return cls(dims, **options)
    try:  # a plugin's constructor: its errors are the user's, one line
        return cls(dims, **options)
    except UserError:
        raise
    except Exception as err:
        raise UserError(
            f"scheme {cls.name!r} ({cls.__module__}.{cls.__qualname__}) raised in __init__ with "
            f"options {options}: {_one_line(err)}"
        ) from err


def scheme_key(cfg: Mapping[str, Any], dims: ModelDims | None = None) -> str:
    """The key of the scheme a ``pe`` config names, with its options (see the module
    docstring). ``dims`` (the model's) are used only when the options cannot be built for
    the probe's dimensions (a list of ``head_dim / 2`` factors, say)."""
    if cfg.get("plugin"):
        load_plugin(cfg["plugin"])
    cls = scheme_class(cfg["name"])
    options = checked_options(cls, {k: v for k, v in cfg.items() if k not in META_KEYS}, "")
    try:
        return class_key(cls, options, dims)
    except UserError:
        raise
    except Exception as err:  # a plugin's hook that fails on the probe: its records cannot be
        reason = (str(err).strip().splitlines() or [""])[0][:200]
        plugin = f" --plugin {cfg['plugin']}" if cfg.get("plugin") else ""
        raise UserError(
            f"{cfg['name']}: its hooks raised {type(err).__name__}: {reason} on the probe that "
            f"keys its records; pe-bench-check {cfg['name']}{plugin} shows which hook"
        ) from err
