"""Config trees in and out: mappings to dataclasses and back, dotted paths, config files.

Generic: nothing here knows the config's sections, so the section types of every layer build on it
(:mod:`rayfed.config` gathers them).
A value from TOML, YAML, JSON or a command-line string is coerced to its field's type
(:func:`coerce`), a nested mapping becomes a dataclass (:func:`from_mapping`) and an
unknown key suggests the closest known one. Config files and search-space files name
fields the same way: by nested tables, by flat dotted keys (``"train.lr" = 0.02``), or
both (:func:`nest_dotted_keys`).

>>> nest_dotted_keys({"train.lr": 0.02, "train": {"rounds": 5}}, "config file")
{'train': {'lr': 0.02, 'rounds': 5}}
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from rayfed.util.errors import ConfigError
from rayfed.util.registry import closest
from rayfed.util.validation import check_choice, fail

__all__ = [
    "get_path",
    "tree_differences",
    "to_plain",
    "from_mapping",
    "coerce",
    "parse_override",
    "set_path",
    "nest_dotted_keys",
    "read_table_file",
    "TABLE_SUFFIXES",
]

TABLE_SUFFIXES = (".toml", ".yaml", ".yml", ".json")
"""The endings of the files :func:`read_table_file` reads (config files, search spaces)."""


def to_plain(obj: Any) -> Any:
    """Dataclasses, mappings and tuples as JSON-ready dicts and lists."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        return [to_plain(v) for v in obj]
    return obj


def from_mapping(cls: type, data: Mapping[str, Any], prefix: str, *, strict: bool = False) -> Any:
    """Build dataclass ``cls`` from ``data``; errors name fields as ``prefix.key``. ``strict``: the values come
    from a typed file (TOML, YAML, JSON), where a number, a boolean or a list written as a string is a mistake
    to name rather than a value to convert (:func:`coerce`)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix or 'config'} must be a table of fields, but got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            raise ConfigError(
                f"unknown config key {path!r}{closest(str(key), list(fields))}; "
                f"known keys{' of ' + prefix if prefix else ''}: {', '.join(fields)}"
            )
        kwargs[key] = coerce(hints[key], value, path, strict=strict)
    try:
        return cls(**kwargs)
    except TypeError as e:  # a field without a default is missing
        raise ConfigError(f"{prefix or 'config'}: {e}") from e


_TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number"}


def coerce(hint: Any, value: Any, path: str, *, strict: bool = False) -> Any:
    """Convert ``value`` (from TOML, JSON or a command-line string) to the field's type; with ``strict`` (a
    typed file), a string is refused for a number, a boolean or a list, naming the field and its type (``none``
    still stands for null, which TOML cannot write)."""
    origin = get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = get_args(hint)
        if value is None and type(None) in options:
            return None
        if isinstance(value, str) and value.lower() in ("none", "null") and type(None) in options:
            return None
        non_none = [o for o in options if o is not type(None)]
        return coerce(non_none[0], value, path, strict=strict) if len(non_none) == 1 else value
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return value if isinstance(value, hint) else from_mapping(hint, value, path, strict=strict)
    if strict and isinstance(value, str) and (hint in _TYPE_NAMES or origin is tuple):
        what = _TYPE_NAMES.get(hint, "a list")
        yaml = " (YAML reads an exponent without a dot as a string: write 1.0e-2)" if "e" in value.lower() else ""
        raise ConfigError(
            f"{path} is the string {value!r} in the config file, but the field takes {what}; write it without "
            f"quotes{' as [a, b]' if what == 'a list' else ''}{yaml}"
        )
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        fail(path, value, "true or false")
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            fail(path, value, "an integer")
        try:
            as_float = float(value)
        except ValueError:
            fail(path, value, "an integer")
        if not as_float.is_integer():
            fail(path, value, "an integer")
        return int(as_float)
    if hint is float:
        if isinstance(value, bool):
            fail(path, value, "a number")
        try:
            return float(value)
        except (TypeError, ValueError):
            fail(path, value, "a number")
    if hint is str:
        if not isinstance(value, str):
            fail(path, value, "a string")
        return value
    if origin is tuple:
        if isinstance(value, str):  # a,b or [a, b] or ['a', 'b']: a list as a shell passes it on
            inner = value.strip().removeprefix("[").removesuffix("]")
            value = [item.strip().strip("'\"") for item in inner.split(",") if item.strip()]
        if not isinstance(value, (list, tuple)):
            fail(path, value, "a list")
        return tuple(value)
    if origin in (Mapping, dict) and not isinstance(value, Mapping):
        fail(path, value, 'a table, e.g. {"key": 1} (JSON on the command line, with its keys in double quotes)')
    if origin is Literal:
        check_choice(path, value, get_args(hint))
    return value


def parse_override(text: str) -> tuple[str, Any]:
    """Parse a command-line override ``path=value``; the value is read as JSON when it parses."""
    if "=" not in text:
        raise ConfigError(f"an override must look like field.path=value, but got {text!r}")
    path, raw = text.split("=", 1)
    try:
        value: Any = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return path.strip(), value


def get_path(tree: Any, path: str, default: Any = None) -> Any:
    """The value at the dotted ``path`` (``"a.b.c"``) of nested mappings or config sections (dataclasses);
    ``default`` where a part of it is missing."""
    for key in path.split("."):
        if isinstance(tree, Mapping) and key in tree:
            tree = tree[key]
        elif dataclasses.is_dataclass(tree) and not isinstance(tree, type) and hasattr(tree, key):
            tree = getattr(tree, key)
        else:
            return default
    return tree


def tree_differences(old: Any, new: Any, *, ignore: tuple[str, ...] = (), path: str = "") -> list[str]:
    """The leaves in which two nested mappings differ, as ``"path: old -> new"`` lines, skipping dotted paths that
    start with one of ``ignore`` (what two configs' trees differ in: :meth:`rayfed.config.RunConfig.diff`)."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        keys = sorted(set(old) | set(new))
        return [
            line
            for key in keys
            for line in tree_differences(old.get(key), new.get(key), ignore=ignore, path=f"{path}{key}.")
        ]
    here = path.rstrip(".")
    return [] if old == new or here.startswith(ignore) else [f"{here}: {old!r} -> {new!r}"]


def set_path(tree: dict[str, Any], path: str, value: Any) -> None:
    """Set ``tree[a][b][c] = value`` for ``path="a.b.c"``; ``a`` and ``b`` must exist in ``tree``."""
    keys = path.split(".")
    node: Any = tree
    for depth, key in enumerate(keys[:-1]):
        if not isinstance(node, dict) or key not in node:
            known = list(node) if isinstance(node, dict) else []
            where = ".".join(keys[:depth]) or "config"
            raise ConfigError(f"unknown config key {path!r}: {where} has no field {key!r}{closest(key, known)}")
        if not isinstance(node[key], dict):
            node[key] = {}
        node = node[key]
    node[keys[-1]] = value


def nest_dotted_keys(table: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Expand the top-level dotted keys of a config file (``train.lr: 0.02``) into nested tables.

    They merge with the file's tables; a field set twice (once flat, once in a table)
    raises ConfigError naming ``source`` and the field.
    """
    nested: dict[str, Any] = {}
    for key, value in table.items():
        _put(nested, str(key).split("."), value, "", source)
    return nested


def _put(node: dict[str, Any], keys: list[str], value: Any, prefix: str, source: str) -> None:
    head, rest = keys[0], keys[1:]
    path = f"{prefix}{head}"
    if rest or (isinstance(value, Mapping) and isinstance(node.get(head), dict)):
        child = node.setdefault(head, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{source} sets {path} twice: as a value and as a table")
        if rest:
            _put(child, rest, value, f"{path}.", source)
        else:
            for key, item in value.items():
                _put(child, [str(key)], item, f"{path}.", source)
    elif head in node:
        raise ConfigError(f"{source} sets {path} twice; keep one")
    else:
        node[head] = dict(value) if isinstance(value, Mapping) else value


def _read_utf8(path: Path, kind: str) -> str:
    """The text of a UTF-8 file (a byte-order mark is accepted); ConfigError naming the first byte that is not."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise ConfigError(
            f"{kind} {str(path)!r} is not UTF-8 text: byte 0x{data[error.start]:02x} on line {line} is not UTF-8 "
            "(a file saved as Latin-1 or Windows-1252?); save it as UTF-8"
        ) from None


def read_table_file(path: str | Path, kind: str = "config file") -> Any:
    """Parse a TOML, YAML or JSON file, by suffix; errors call the file a ``kind``."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{kind} {str(path)!r} does not exist")
    text = _read_utf8(path, kind)
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            if sys.version_info >= (3, 11):
                import tomllib
            else:  # the same parser, before it joined the standard library
                import tomli as tomllib

            return tomllib.loads(text)
        if suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError as e:
                raise ConfigError(f"YAML {kind}s need PyYAML: pip install 'rayfed[tune]'") from e
            return yaml.safe_load(text) or {}
        if suffix == ".json":
            return json.loads(text)
        raise ConfigError(f"{kind} {str(path)!r} must end in {', '.join(TABLE_SUFFIXES)}")
    except ConfigError:
        raise
    except Exception as e:  # a syntax error in the file
        raise ConfigError(f"{kind} {str(path)!r} cannot be parsed: {e}") from e
