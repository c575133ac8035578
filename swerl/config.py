"""Typed configs: dataclasses whose field docstrings are the `--help` text, loaded from YAML with
dotted `key=value` overrides. Unknown keys are errors (a typo must never silently do nothing), and
each dataclass checks its invariants in `__post_init__`.

A key that moved is rejected with its new name: a config class may define a classmethod
`renamed(key, data) -> tuple[str, ...]` that gives, for a key it no longer has, its new name(s)
relative to the class, or none for a key it never had (`data`: the rest of the mapping, so the answer
may depend on a sibling such as a kind).

A field whose YAML key cannot be its attribute name (a Python keyword such as `async`) names its key in
its metadata: `field(..., metadata={"key": "async"})`; loading, `--help`, unknown-key errors and
`to_dict` (what a run writes to config.yaml) all use the key.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import re
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


@dataclasses.dataclass(frozen=True)
class _Plain:
    """A plain (unquoted) YAML scalar that YAML read as a number, bool or null, with the text it was
    written as: a string field takes the text (`run_name: 007` is "007", not 7), any other field the
    value."""

    value: Any
    text: str

    def __repr__(self) -> str:
        return self.text


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with two changes for configs: floats as people write them (`1e-6`, `5e-7`:
    YAML 1.2, Python and JSON read them as floats; PyYAML's YAML 1.1 rules need a dot and read them as
    strings), and plain scalars keep their text (`_Plain`)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def _keep_text(tag: str) -> None:
    base = yaml.SafeLoader.yaml_constructors[tag]

    def construct(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> _Plain:
        return _Plain(base(loader, node), node.value)

    _Loader.add_constructor(tag, construct)


for _tag in ("int", "float", "bool", "null"):
    _keep_text(f"tag:yaml.org,2002:{_tag}")


def _yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass: no arbitrary objects


def _plain(value: Any) -> Any:
    """`value` with every `_Plain` replaced by its value (what plain YAML would have given)."""
    if isinstance(value, _Plain):
        return value.value
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


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


def _coerce(tp: Any, value: Any, key: str, base: Any = None) -> Any:
    origin = typing.get_origin(tp)
    if isinstance(value, _Plain) and origin not in (typing.Union, types.UnionType):
        if tp in (str, Path) and value.value is not None:
            return tp(value.text)  # a scalar into a string field: the text as written
        value = value.value
    if tp is Any:
        return _plain(value)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if _plain(value) is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(a, value, key, base)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}: {value!r} does not fit {tp}")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping for {tp.__name__}, got {value!r}")
        return from_dict(tp, value, prefix=f"{key}.", base=base if isinstance(base, tp) else None)
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
    if tp is float and isinstance(value, str):
        try:
            return float(value.replace("_", "")) if value.strip() else _not_float(key, value)
        except ValueError:
            _not_float(key, value)
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp is str and isinstance(value, str):
        return value
    if tp is Path and isinstance(value, str):
        return Path(value)
    raise ConfigError(f"{key}: expected {getattr(tp, '__name__', tp)}, got {value!r}")


def _not_float(key: str, value: str) -> float:
    raise ConfigError(f"{key}: expected a number, got {value!r}")


def config_key(f: dataclasses.Field[Any]) -> str:
    """The YAML key of a dataclass field: its metadata `key` (for a name Python reserves), else its name."""
    return str(f.metadata.get("key", f.name))


def to_dict(obj: Any) -> Any:
    """`dataclasses.asdict` under the YAML keys (`config_key`), so `from_dict` reads back what it wrote."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {config_key(f): to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list | tuple):
        return type(obj)(to_dict(v) for v in obj)
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def from_dict(cls: type[T], data: dict[str, Any], *, prefix: str = "", base: T | None = None) -> T:
    """Build dataclass `cls` from a mapping; unknown keys and wrong types raise ConfigError. A key the
    mapping leaves out keeps its value in `base` where given, else the field's default; so a section
    given in part keeps the rest of its parent's default for it (which may differ from the section
    class's own defaults)."""
    hints = typing.get_type_hints(cls)
    attr = {config_key(f): f.name for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    names = set(attr)
    data = {str(k.text if isinstance(k, _Plain) else k): v for k, v in data.items()}
    unknown = sorted(set(data) - names)
    renamed = getattr(cls, "renamed", None)
    for k in unknown if callable(renamed) else ():
        if new := renamed(k, _plain(data)):
            raise ConfigError(f"config key {prefix}{k} was renamed to {' or '.join(prefix + n for n in new)}")
    if unknown:
        raise ConfigError(
            f"unknown config key(s) {', '.join(prefix + k for k in unknown)}; "
            f"valid keys of {prefix or cls.__name__ + '.'}: {', '.join(sorted(names))}"
        )
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    # only a mapping (a section) is built over a default
    kwargs = {attr[k]: _coerce(hints[attr[k]], v, prefix + k,
                               _default(fields[attr[k]], base) if isinstance(v, dict) else None)
              for k, v in data.items()}
    try:
        return dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)
    except (ValueError, TypeError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{prefix.rstrip('.') or cls.__name__}: {e}") from e


def _default(f: dataclasses.Field[Any], base: Any) -> Any:
    """Field `f`'s value in `base`, else its default (None where it has none)."""
    if base is not None:
        return getattr(base, f.name)
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


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
    try:
        node[parts[-1]] = _yaml(raw)
    except yaml.YAMLError as e:
        raise ConfigError(f"override {override!r}: the value is not valid YAML ({e.problem or e})") from e


def load(cls: type[T], path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> T:
    """Load `cls` from a YAML file (optional) plus dotted overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            loaded = _yaml(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {p} is not valid YAML: {e}") from e
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
            rows += help_text(tp, prefix=f"{prefix}{config_key(f)}.")
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            "(required)" if f.default_factory is dataclasses.MISSING else f.default_factory())
        rows.append((prefix + config_key(f), repr(default), docs.get(f.name, "")))
    return rows
