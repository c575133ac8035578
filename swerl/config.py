"""Typed configs: dataclasses whose field docstrings are the `--help` text, loaded from YAML with
dotted `key=value` overrides. Unknown keys are errors (a typo must never silently do nothing), and
each dataclass checks its invariants in `__post_init__`.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import textwrap
import types
import typing
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or override is wrong; the message names the key and what was expected."""


@cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass (read from its source)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, nxt in itertools.pairwise(body):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[node.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def _coerce(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(a, value, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}: {value!r} does not fit {tp}")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping for {tp.__name__}, got {value!r}")
        return from_dict(tp, value, prefix=f"{key}.")
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise ConfigError(f"{key}: expected {len(args)} items, got {len(value)}")
        return tuple(_coerce(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp is str and isinstance(value, str):
        return value
    if tp is Path and isinstance(value, str):
        return Path(value)
    raise ConfigError(f"{key}: expected {getattr(tp, '__name__', tp)}, got {value!r}")


def from_dict(cls: type[T], data: dict[str, Any], *, prefix: str = "") -> T:
    """Build dataclass `cls` from a mapping; unknown keys and wrong types raise ConfigError."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(
            f"unknown config key(s) {', '.join(prefix + k for k in unknown)}; "
            f"valid keys of {prefix or cls.__name__ + '.'}: {', '.join(sorted(names))}"
        )
    kwargs = {k: _coerce(hints[k], v, prefix + k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{prefix.rstrip('.') or cls.__name__}: {e}") from e


def apply_override(data: dict[str, Any], override: str) -> None:
    """Apply one `a.b.c=value` override (value parsed as YAML) to a nested mapping in place."""
    if "=" not in override:
        raise ConfigError(f"override {override!r} must look like key.sub=value")
    key, raw = override.split("=", 1)
    parts = key.strip().split(".")
    node = data
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {override!r}: {p} is not a section")
    node[parts[-1]] = yaml.safe_load(raw)


def load(cls: type[T], path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> T:
    """Load `cls` from a YAML file (optional) plus dotted overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        loaded = yaml.safe_load(p.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {p} must hold a mapping at the top level")
        data = loaded
    for o in overrides:
        apply_override(data, o)
    return from_dict(cls, data)


def help_text(cls: type, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, default, doc) for every field, nested sections flattened with dots."""
    rows = []
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            rows += help_text(tp, prefix=f"{prefix}{f.name}.")
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            "(required)" if f.default_factory is dataclasses.MISSING else f.default_factory())
        rows.append((prefix + f.name, repr(default), docs.get(f.name, "")))
    return rows
