"""The named things a method author meets, counted from the code as docs/methods.md counts them ("How many names an
author meets"): the members of ``ClientHalf`` and ``ServerHalf`` (with their constructors and the attributes these
set), the fields of ``Phase`` and the keywords of ``register_algorithm``. The page's table is the code's, and it
holds 40 names at most."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

from rayfed.algorithms import ClientHalf, ServerHalf, register_algorithm
from rayfed.train.phase import Phase

PAGE = Path(__file__).resolve().parents[2] / "docs" / "methods.md"


def _members(cls: type, *args: object) -> set[str]:
    """``cls``'s own public members, its constructor, and the attributes its constructor sets."""
    concrete = type("Concrete", (cls,), {name: None for name in getattr(cls, "__abstractmethods__", ())})
    instance = concrete(*args)
    own = {name for name in vars(cls) if not name.startswith("_")}
    return own | {"__init__"} | set(vars(instance))


def counted() -> dict[str, set[str]]:
    return {
        "ClientHalf": _members(ClientHalf, None, None),
        "ServerHalf": _members(ServerHalf, None, None, {}),
        "Phase": {f.name for f in dataclasses.fields(Phase)},
        "register_algorithm": set(inspect.signature(register_algorithm).parameters) - {"name"},
    }


def _page_table() -> dict[str, tuple[set[str], int]]:
    rows = re.findall(r"^\| `(\w+)` \| (.+?) \| (\d+) \|$", PAGE.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return {where: (set(re.findall(r"`(\w+)`", names)), int(count)) for where, names, count in rows}


def test_the_pages_count_is_the_codes() -> None:
    code, page = counted(), _page_table()
    assert sorted(page) == sorted(code)
    for where, names in code.items():
        assert page[where] == (names, len(names)), where
    (total,) = re.findall(r"^\| \*\*the contract\*\* \| \| \*\*(\d+)\*\* \|$", PAGE.read_text(), flags=re.MULTILINE)
    assert int(total) == sum(len(names) for names in code.values()) <= 40  # issue 55's target
