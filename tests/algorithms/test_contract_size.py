"""The named things a method author meets, counted from the code as docs/methods.md counts them ("How many names an
author meets"). The mandatory surface: the members of ``ClientHalf`` and ``ServerHalf`` (with their constructors and
the attributes these set), the fields of ``Phase`` and the keywords of ``register_algorithm``; it holds 40 names at
most. The whole surface adds every type an author may meet beside them (the opt-in declarations, ``Reporting``,
``Samples``, ``Contribution`` and the companion types), each counted as its name and its own public members; it
holds 123 names at most (102 before issue 66, which took 2 out, 16 opt-in names that issues 65 and 67 added, and 7
that privacy's FedDyn, asynchronous and part-by-part adaptive cases added, as docs/methods.md says). The page's
tables are the code's."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

from rayfed.algorithms import (
    ClientHalf,
    Contribution,
    Reporting,
    RoundContext,
    ServerHalf,
    Start,
    declarations,
    private_uploads,
    register_algorithm,
)
from rayfed.algorithms.contributions import WeightedState
from rayfed.algorithms.sizing import StateSizes
from rayfed.train.phase import Kept, Phase, Samples, Trainable

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


BESIDE: tuple[type, ...] = (
    declarations.SharedBodyEvaluation,
    declarations.NormalizedFeatures,
    declarations.EvaluationReadsTrain,
    declarations.FastPathLimits,
    declarations.HeldOutData,
    declarations.AsynchronousAggregation,
    declarations.VaryingWork,
    private_uploads.ModelUpload,
    private_uploads.ModelRowsUpload,
    private_uploads.PartwiseUpload,
    private_uploads.PartwiseClient,
    private_uploads.UploadPart,
    private_uploads.PrivateParts,
    private_uploads.UploadBeyondModel,
    StateSizes,
    Reporting,
    Samples,
    Contribution,
    RoundContext,
    Start,
    declarations.SharedBody,
    WeightedState,
    Trainable,
    Kept,
)
"""Every type an author may meet beside the mandatory surface: the opt-in declarations, what only reports read, the
samples a phase trains on, the upload's base, and the companion types."""
WHOLE_BOUND = 123
"""The whole surface: 102 before issue 66 (``DeferredUpdates`` with 1 member, ``RoundContext`` with 5 more), 100
after it, 16 opt-in names beside (issue 65's ``VaryingWork``, issue 67's part-by-part privacy), and 7 more of
privacy (FedDyn, the asynchronous uploads, adaptive clipping part by part); docs/methods.md says which."""


def _own(cls: type) -> set[str]:
    """``cls``'s own public members, its own dataclass fields among them."""
    names = {name for name in vars(cls) if not name.startswith("_")}
    if dataclasses.is_dataclass(cls):
        inherited = {
            f.name for base in cls.__mro__[1:] if dataclasses.is_dataclass(base) for f in dataclasses.fields(base)
        }
        names |= {f.name for f in dataclasses.fields(cls)} - inherited
    return names


def counted_beside() -> dict[str, set[str]]:
    """Each type of :data:`BESIDE`: its name and its own public members."""
    return {cls.__name__: {cls.__name__} | _own(cls) for cls in BESIDE}


def _page_table() -> dict[str, tuple[set[str], int]]:
    rows = re.findall(r"^\| `(\w+)` \| (.+?) \| (\d+) \|$", PAGE.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return {where: (set(re.findall(r"`(\w+)`", names)), int(count)) for where, names, count in rows}


def _page_beside() -> dict[str, tuple[set[str], int]]:
    rows = re.findall(r"^\| \+ `(\w+)` \| (.+?) \| (\d+) \|$", PAGE.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return {where: (set(re.findall(r"`(\w+)`", names)), int(count)) for where, names, count in rows}


def test_the_pages_count_is_the_codes() -> None:
    code, page = counted(), _page_table()
    assert sorted(page) == sorted(code)
    for where, names in code.items():
        assert page[where] == (names, len(names)), where
    (total,) = re.findall(r"^\| \*\*the contract\*\* \| \| \*\*(\d+)\*\* \|$", PAGE.read_text(), flags=re.MULTILINE)
    assert int(total) == sum(len(names) for names in code.values()) <= 40  # issue 55's target


def test_the_whole_surface_is_the_codes_and_no_larger_than_before() -> None:
    mandatory, beside, page = counted(), counted_beside(), _page_beside()
    assert sorted(page) == sorted(beside)
    for where, names in beside.items():
        assert (page[where][0] | {where}, page[where][1]) == (names, len(names)), where
    (total,) = re.findall(
        r"^\| \*\*the whole surface\*\* \| \| \*\*(\d+)\*\* \|$", PAGE.read_text(), flags=re.MULTILINE
    )
    whole = sum(len(names) for names in mandatory.values()) + sum(len(names) for names in beside.values())
    assert int(total) == whole <= WHOLE_BOUND
