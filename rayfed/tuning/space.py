"""Search spaces: which config fields a study varies, and over which values.

A search space maps dotted config paths (the same paths as ``RunConfig.override`` and
``rayfed run field=value``) to a distribution::

    space = SearchSpace({
        "train.lr": FloatParam(1e-4, 1e-1, log=True),
        "algorithm.params.wdr_lambda": FloatParam(1, 5000, log=True),
        "algorithm.params.variant": CategoricalParam(["wdr", "no_wdr"]),
        "train.local_epochs": IntParam(1, 5),
    })

The same space in a YAML file (TOML works too, with the dotted keys quoted)::

    train.lr: {type: float, low: 1.0e-4, high: 0.1, log: true}
    algorithm.params.wdr_lambda: {type: float, low: 1, high: 5000, log: true}
    algorithm.params.variant: [wdr, no_wdr]   # a list is a categorical
    train.local_epochs: {type: int, low: 1, high: 5}

:meth:`SearchSpace.validate` checks every entry against a base config before any trial
runs: unknown paths (with the closest known one suggested), a distribution that does
not fit the field's type, and end points the field itself rejects (``train.lr`` must be
> 0, so ``FloatParam(0, 1)`` is refused).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Union, get_args, get_origin

from rayfed.config import RunConfig, read_table_file
from rayfed.util.errors import ConfigError
from rayfed.util.registry import closest

if TYPE_CHECKING:  # pragma: no cover
    import optuna

__all__ = ["FloatParam", "IntParam", "CategoricalParam", "Param", "SearchSpace", "load_space"]

Choice = None | bool | int | float | str
_SPEC_KEYS = frozenset({"type", "low", "high", "log", "step", "choices"})


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class FloatParam:
    """A real value in ``[low, high]``, uniform or log-uniform, optionally on a grid of ``step``."""

    low: float
    high: float
    log: bool = False
    step: float | None = None

    def __post_init__(self) -> None:
        if not (_is_number(self.low) and _is_number(self.high)):
            raise ConfigError(f"FloatParam needs finite numbers, but got low={self.low!r}, high={self.high!r}")
        if self.low >= self.high:
            raise ConfigError(f"FloatParam needs low < high, but got low={self.low!r}, high={self.high!r}")
        if self.log and self.low <= 0:
            raise ConfigError(f"FloatParam with log=True needs low > 0, but got low={self.low!r}")
        if self.step is not None:
            if self.log:
                raise ConfigError(f"FloatParam takes log=True or a step, not both, but got step={self.step!r}")
            if not (_is_number(self.step) and self.step > 0):
                raise ConfigError(f"FloatParam step must be a number > 0, but got step={self.step!r}")

    def suggest(self, trial: optuna.Trial, name: str) -> float:
        return trial.suggest_float(name, self.low, self.high, log=self.log, step=self.step)


@dataclass(frozen=True)
class IntParam:
    """An integer in ``[low, high]`` (both included), every ``step``-th one, or log-uniform."""

    low: int
    high: int
    step: int = 1
    log: bool = False

    def __post_init__(self) -> None:
        for name in ("low", "high", "step"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"IntParam {name} must be an integer, but got {name}={value!r}")
        if self.low >= self.high:
            raise ConfigError(f"IntParam needs low < high, but got low={self.low!r}, high={self.high!r}")
        if self.step < 1:
            raise ConfigError(f"IntParam step must be >= 1, but got step={self.step!r}")
        if self.log and self.low < 1:
            raise ConfigError(f"IntParam with log=True needs low >= 1, but got low={self.low!r}")
        if self.log and self.step != 1:
            raise ConfigError(f"IntParam takes log=True or a step, not both, but got step={self.step!r}")

    def suggest(self, trial: optuna.Trial, name: str) -> int:
        return trial.suggest_int(name, self.low, self.high, step=self.step, log=self.log)


@dataclass(frozen=True)
class CategoricalParam:
    """One of ``choices``: None, booleans, numbers or strings (what Optuna stores)."""

    choices: tuple[Choice, ...]

    def __post_init__(self) -> None:
        if isinstance(self.choices, (str, bytes)) or not isinstance(self.choices, Sequence):
            raise ConfigError(f"CategoricalParam needs a list of choices, but got choices={self.choices!r}")
        object.__setattr__(self, "choices", tuple(self.choices))
        if not self.choices:
            raise ConfigError("CategoricalParam needs at least one choice, but got choices=[]")
        bad = [c for c in self.choices if c is not None and not isinstance(c, (bool, int, float, str))]
        if bad:
            raise ConfigError(
                f"CategoricalParam choices must be None, booleans, numbers or strings, but got {bad[0]!r}"
            )
        if len(set(map(repr, self.choices))) != len(self.choices):
            raise ConfigError(f"CategoricalParam choices must be distinct, but got choices={list(self.choices)!r}")

    def suggest(self, trial: optuna.Trial, name: str) -> Choice:
        return trial.suggest_categorical(name, self.choices)


Param = FloatParam | IntParam | CategoricalParam
_KINDS: dict[str, type] = {"float": FloatParam, "int": IntParam, "categorical": CategoricalParam}


class SearchSpace(Mapping[str, Param]):
    """An ordered, read-only mapping ``dotted config path -> Param``."""

    def __init__(self, entries: Mapping[str, Param | Mapping[str, Any] | Sequence[Any]]) -> None:
        if not isinstance(entries, Mapping):
            raise ConfigError(f"a search space must be a table of field.path -> distribution, but got {entries!r}")
        self._entries: dict[str, Param] = {str(path): _param(str(path), spec) for path, spec in _leaves(entries)}
        if not self._entries:
            raise ConfigError("the search space is empty: name at least one config field to vary")

    # --- Mapping -------------------------------------------------------------------------
    def __getitem__(self, path: str) -> Param:
        return self._entries[path]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"SearchSpace({self._entries!r})"

    # --- use -----------------------------------------------------------------------------
    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        """Ask ``trial`` for one value per entry; Optuna's parameter names are the dotted paths."""
        return {path: param.suggest(trial, path) for path, param in self._entries.items()}

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The file format: ``{path: {"type": kind, ...fields}}`` (JSON-ready)."""
        kind_of = {cls: kind for kind, cls in _KINDS.items()}
        return {
            path: {
                "type": kind_of[type(p)],
                **{k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(p).items()},
            }
            for path, p in self._entries.items()
        }

    def validate(self, base: RunConfig) -> None:
        """Raise :class:`ConfigError` naming the first entry that cannot apply to ``base``.

        Checks that each path names a field, that the distribution fits the field's type,
        and that the field accepts the distribution's end points (or every choice).
        """
        for path, param in self._entries.items():
            hint = _field_type(base, path)
            _check_kind(path, param, hint)
            for value in param.choices if isinstance(param, CategoricalParam) else (param.low, param.high):
                try:
                    base.override({path: value})
                except ConfigError as e:
                    raise ConfigError(f"search space entry {path!r}: the field rejects the value {value!r}: {e}") from e


def load_space(path: str | Path) -> SearchSpace:
    """Read a search space from a YAML, TOML or JSON file (see the module docstring)."""
    return SearchSpace(read_table_file(path, "search space file"))


# --- parsing ---------------------------------------------------------------------------------


def _is_spec(node: Any) -> bool:
    return isinstance(node, Mapping) and any(k in _SPEC_KEYS and not isinstance(v, Mapping) for k, v in node.items())


def _leaves(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Flatten nested tables (TOML's unquoted ``train.lr`` is ``{train: {lr: ...}}``) down to the specs."""
    for key, node in tree.items():
        path = f"{prefix}{key}"
        if isinstance(node, Mapping) and not _is_spec(node):
            if not node:
                raise ConfigError(f"search space entry {path!r} is an empty table; give it a distribution")
            yield from _leaves(node, path + ".")
        else:
            yield path, node


def _param(path: str, spec: Any) -> Param:
    if isinstance(spec, (FloatParam, IntParam, CategoricalParam)):
        return spec
    allowed = "a table with type = float | int | categorical, or a list of choices"
    try:
        if isinstance(spec, Sequence) and not isinstance(spec, (str, bytes)):
            return CategoricalParam(tuple(spec))
        if not isinstance(spec, Mapping):
            raise ConfigError(f"it must be {allowed}, but got {spec!r}")
        fields = dict(spec)
        kind = fields.pop("type", None)
        if kind not in _KINDS:
            got = "no type" if kind is None else f"type={kind!r}{closest(str(kind), list(_KINDS))}"
            raise ConfigError(f"it has {got}; allowed types: {', '.join(_KINDS)}")
        cls = _KINDS[kind]
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = [k for k in fields if k not in known]
        if unknown:
            raise ConfigError(
                f"a {kind} distribution has no option {unknown[0]!r}{closest(unknown[0], known)}; "
                f"its options: {', '.join(known)}"
            )
        return cls(**fields)
    except ConfigError as e:
        raise ConfigError(f"search space entry {path!r}: {e}") from None
    except TypeError as e:  # a required option (low, high, choices) is missing
        raise ConfigError(f"search space entry {path!r}: {e}") from None


# --- checking against a config ---------------------------------------------------------------


def _field_type(base: RunConfig, path: str) -> Any:
    """The type hint of the field at ``path``, or ``Any`` inside free-form tables (``data.options``)."""
    node: Any = base
    keys = path.split(".")
    for depth, key in enumerate(keys):
        where = ".".join(keys[:depth]) or "the config"
        if isinstance(node, Mapping):  # data.options and other free-form tables: any key is allowed
            return Any
        if not dataclasses.is_dataclass(node):
            raise ConfigError(f"search space entry {path!r}: {where} is a value, not a table of fields")
        names = [f.name for f in dataclasses.fields(node)]
        if key not in names and where == "algorithm.params":
            raise ConfigError(_not_a_param(base, path, key, names))
        if key not in names:
            raise ConfigError(
                f"search space entry {path!r} names no config field{_suggest_path(base, path)}; "
                f"fields of {where}: {', '.join(names)}"
            )
        hint = typing.get_type_hints(type(node))[key]
        node = getattr(node, key)
    if dataclasses.is_dataclass(node):
        fields = ", ".join(f"{path}.{f.name}" for f in dataclasses.fields(node))
        raise ConfigError(f"search space entry {path!r} names a section, not a field; its fields: {fields}")
    return hint


def _not_a_param(base: RunConfig, path: str, key: str, names: list[str]) -> str:
    """Why ``algorithm.params.<key>`` is no field of the base config's algorithm, and which algorithms have it."""
    from rayfed.algorithms import ALGORITHMS

    algorithm = base.algorithm.name
    takes = f"its params: {', '.join(names)}" if names else "it takes no params"
    having = [
        n for n in ALGORITHMS.shipped() if key in {f.name for f in dataclasses.fields(ALGORITHMS.get(n).params_type)}
    ]
    fix = (
        f"set algorithm.name to one that has it ({', '.join(having)}), e.g. algorithm.name={having[0]}"
        if having
        else f"no registered algorithm has a param {key!r}{_suggest_path(base, path)}"
    )
    return f"search space entry {path!r} is no param of algorithm.name={algorithm!r} ({takes}); {fix}"


def _suggest_path(base: RunConfig, path: str) -> str:
    known = list(_field_paths(base))
    hint = closest(path, known)
    if not hint:  # e.g. "lr" or "params.wdr_lambda": match on the last part
        tails = [p for p in known if p.rsplit(".", 1)[-1] == path.rsplit(".", 1)[-1]]
        hint = f" (did you mean {tails[0]!r}?)" if tails else ""
    return hint


def _field_paths(node: Any, prefix: str = "") -> Iterator[str]:
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            yield from _field_paths(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}"


def _base_types(hint: Any) -> set[type]:
    if get_origin(hint) in (Union, types.UnionType):
        return {t for arg in get_args(hint) for t in _base_types(arg)} - {type(None)}
    origin = get_origin(hint)
    return {origin if origin is not None else hint}


def _check_kind(path: str, param: Param, hint: Any) -> None:
    if hint is Any:
        return
    kinds = _base_types(hint)
    numeric = kinds & {int, float}
    if isinstance(param, FloatParam) and float not in kinds:
        use = "IntParam (type = int)" if int in kinds else "CategoricalParam (a list of choices)"
        raise ConfigError(
            f"search space entry {path!r}: the field holds {_describe(hint, kinds)}, so a float distribution "
            f"does not fit; use {use}"
        )
    if isinstance(param, IntParam) and not numeric:
        raise ConfigError(
            f"search space entry {path!r}: the field holds {_describe(hint, kinds)}, so an int distribution "
            "does not fit; use CategoricalParam (a list of choices)"
        )


def _describe(hint: Any, kinds: set[type]) -> str:
    if get_origin(hint) is Literal:
        return "one of " + ", ".join(map(repr, get_args(hint)))
    names = sorted(getattr(k, "__name__", str(k)) for k in kinds)
    return " or ".join(names) + " values"
