"""Typed views of the Hydra config: dataclasses built from config nodes with clear errors.

``from_node(TrainConfig, cfg.train, "train")`` rejects unknown keys, values of the wrong
type and values out of range with one line naming the key, the value and what is allowed,
instead of a failure deep inside a training loop. ``check_value`` is the one checker: a
field's type hint says the type, ``Annotated[float, Range(gt=0)]`` adds the allowed range, and
the same checker serves the dataclasses' own ``__post_init__`` (``check_fields``) and the
options of position schemes (``positions.build_scheme``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from omegaconf import DictConfig, OmegaConf

from pe_bench.errors import UserError

T = TypeVar("T")


@dataclass(frozen=True)
class Range:
    """The values a number may take, e.g. ``Annotated[float, Range(ge=0, lt=1)]``."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def allows(self, value: float) -> bool:
        """False for a value outside the range, and for NaN (it compares false to anything)."""
        return (
            (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.le is None or value <= self.le)
            and (self.lt is None or value < self.lt)
        )

    def __str__(self) -> str:
        bounds = [(">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt)]
        shown = [(op, f"{b:g}" if isinstance(b, float) else b) for op, b in bounds if b is not None]
        return " and ".join(f"{op} {bound}" for op, bound in shown)

    def check(self, value: Any, where: str) -> None:
        """Raise a ``UserError`` naming ``where``, the value and the range if it is outside."""
        if value is not None and not self.allows(value):
            raise UserError(f"{where} must be {self}, got {value!r}")


def to_dict(node: Any) -> Any:
    """A resolved plain-Python copy of a config node."""
    if isinstance(node, DictConfig) or OmegaConf.is_config(node):
        return OmegaConf.to_container(node, resolve=True)
    return node


def check_value(value: Any, hint: Any, where: str) -> Any:
    """Coerce ``value`` to the type ``hint`` (int, float, bool, str, optional, list, dict,
    ``Annotated[..., Range]``) or raise a ``UserError`` naming ``where`` and what is allowed."""
    origin = typing.get_origin(hint)
    if origin is Annotated:
        value = check_value(value, hint.__origin__, where)
        for rule in hint.__metadata__:
            if isinstance(rule, Range):
                rule.check(value, where)
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return check_value(value, inner[0], where)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise UserError(f"{where}={value!r} must be a list")
        (item,) = typing.get_args(hint)[:1] or (Any,)
        return [check_value(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict or hint is dict:
        if not isinstance(value, Mapping):
            raise UserError(f"{where}={value!r} must be a mapping of keys to values")
        return value
    return _scalar(value, hint, where)


def _scalar(value: Any, hint: Any, where: str) -> Any:
    """``check_value`` for bool, int, float and str (anything else passes as it is)."""
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise UserError(f"{where}={value!r} must be true or false")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise UserError(f"{where}={value!r} must be an integer")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise UserError(f"{where}={value!r} must be a number")
    if hint is str:
        if isinstance(value, str):
            return value
        raise UserError(f"{where}={value!r} must be a string")
    return value


def check_fields(obj: Any, prefix: str) -> None:
    """Check every field of dataclass instance ``obj`` against its type hint and range: the
    ``__post_init__`` of a config built directly in Python, not from a config node."""
    hints = typing.get_type_hints(type(obj), include_extras=True)
    for f in dataclasses.fields(obj):
        check_value(getattr(obj, f.name), hints[f.name], f"{prefix}.{f.name}")


def from_node(cls: type[T], node: Any, prefix: str) -> T:
    """Build dataclass ``cls`` from a config node, checking keys and value types."""
    values = to_dict(node) or {}
    if not isinstance(values, Mapping):
        raise UserError(f"{prefix} must be a mapping, got {values!r}")
    hints = typing.get_type_hints(cls, include_extras=True)
    # a field the constructor does not take (init=False) is no key of the config
    fields = {f.name for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(values) - fields)
    if unknown:
        raise UserError(f"unknown key {prefix}.{unknown[0]}; allowed: {', '.join(sorted(fields))}")
    kwargs = {
        key: check_value(value, hints[key], f"{prefix}.{key}") for key, value in values.items()
    }
    return cls(**kwargs)


def config_hash(node: Any) -> str:
    """Short stable hash of a config subtree: identifies a trained model in records."""
    blob = json.dumps(to_dict(node), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]
