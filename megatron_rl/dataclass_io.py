"""Typed dataclass <-> dict conversion, shared by the run config and the model's checkpoint meta.

A leaf module (it imports no component), so ``megatron_rl/model/`` can read and write its own
config sections without importing the root :mod:`megatron_rl.config`. ``from_dict`` coerces YAML
/ JSON / CLI values to the annotated field types and raises ``ValueError`` naming the dotted key,
the bad value and what is allowed; unknown keys are refused with the list of allowed ones.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Convert a YAML/CLI value to the annotated type ``tp`` or raise a ValueError naming key."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        allowed = get_args(tp)
        if isinstance(value, bool):  # YAML 1.1 reads off/on/no/yes as booleans
            words = ("off", "no", "false") if not value else ("on", "yes", "true")
            value = next((w for w in words if w in allowed), value)
        if value not in allowed:
            raise ValueError(f"{key}={value!r} is not allowed; choose one of {list(allowed)}")
        return value
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if value is None:
            return None
        errors = []
        for a in args:
            try:
                return _coerce(value, a, key)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError(f"{key}={value!r} does not match any of {[_type_name(a) for a in args]}")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"{key} must be a mapping of {tp.__name__} fields, got {value!r}")
        return from_dict(tp, value, prefix=key)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{key} must be a list, got {value!r}")
        (item_tp, *_) = get_args(tp) or (Any,)
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{key} must be a mapping, got {value!r}")
        kt, vt = get_args(tp) or (Any, Any)
        return {_coerce(k, kt, key): _coerce(v, vt, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ValueError(f"{key} must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ValueError(f"{key} must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{key} must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"{key} must be a string, got {value!r}")
        return value
    return value


def from_dict(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a nested dict; unknown keys raise with the allowed ones."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"{prefix}." if prefix else ""
        raise ValueError(
            f"unknown config key {where}{unknown[0]!r}; allowed keys"
            f"{' under ' + prefix if prefix else ''}: {sorted(fields)}"
        )
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else name
        kwargs[name] = _coerce(value, hints[name], key)
    return cls(**kwargs)


def to_dict(obj: Any) -> Any:
    """Plain nested dict of a config (for YAML, checkpoints and W&B)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj
