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
from collections.abc import Mapping
from typing import Any

from pe_bench.errors import UserError
from pe_bench.positions import (  # noqa: F401  (importing registers the built-ins)
    absolute,
    bias,
    contextual,
    fire,
    randomized,
    relative,
    rotary,
)
from pe_bench.positions.base import ModelDims, PositionScheme, register, registered

__all__ = [
    "ENTRY_POINT_GROUP",
    "ModelDims",
    "PositionScheme",
    "build_scheme",
    "entry_points",
    "load_plugin",
    "register",
    "registered",
    "scheme_class",
]

ENTRY_POINT_GROUP = "pe_bench.positions"

# Keys of a ``pe`` config that are not constructor arguments.
META_KEYS = ("name", "plugin")


def load_plugin(module: str) -> None:
    """Import a user's module so that its ``@register`` decorators run."""
    try:
        importlib.import_module(module)
    except ImportError as err:
        raise UserError(f"pe.plugin={module!r} does not import: {err}") from err


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


def build_scheme(cfg: Mapping[str, Any], dims: ModelDims) -> PositionScheme:
    """Build the scheme a ``pe`` config names, with its options, for a model of ``dims``."""
    if cfg.get("plugin"):
        load_plugin(cfg["plugin"])
    if "name" not in cfg:
        raise UserError("the pe config has no 'name'; pick one with pe=<name>")
    cls = scheme_class(cfg["name"])
    options = {key: value for key, value in cfg.items() if key not in META_KEYS}
    unknown = sorted(set(options) - set(scheme_options(cls)))
    if unknown:
        raise UserError(
            f"scheme {cfg['name']!r} has no option {', '.join(unknown)}; "
            f"allowed: {', '.join(scheme_options(cls)) or 'none'}"
        )
    return cls(dims, **options)
