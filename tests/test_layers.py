"""The package's layers, as docs/architecture.md draws them, hold in the code.

Every ``import`` of a rayfed module (at module level, inside a function, or under ``if TYPE_CHECKING:``,
which type checkers and readers follow as much as the interpreter follows the others) must point to the
importing module's own layer or one below it; no modules import each other in a circle; the root holds only
the package's face; and an algorithm module imports another algorithm's module only to build on one of its
classes.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "rayfed"
PAGE = PACKAGE.parent / "docs" / "architecture.md"

LAYERS = (
    ("util",),
    ("models", "data", "system", "privacy"),
    ("train",),
    ("algorithms",),
    ("config",),
    ("execution",),
    ("actors",),
    ("engine", "provenance", "scheduling", "results"),
    ("tracking", "checking", "packs"),
    ("reproduce", "tuning"),
    ("",),  # the root: __init__, __main__, cli
)
"""Sub-packages from the bottom up; a module may import its own layer and the layers below it."""

EXTENDS = {
    ("fedprox", "fedavg"),
    ("feduv", "fedavg"),
    ("sgdm", "fedavg"),
    ("ditto", "fedavg"),
    ("fedclassavg", "fedavg"),
    ("fedadam", "fedavg"),
    ("fedawa", "sgdm"),
    ("feddyn", "sgdm"),
    ("feddisco", "fedawa_weights"),
}
"""(algorithm, algorithm it builds on): FedAvg's server under other clients (and FedAdam's, which names its central
optimiser), the persistent-momentum client of FedAWA and FedDyn, FedAWA's registry of initial weights that FedDisco
registers into."""

FAMILY_SUFFIXES = ("_equations", "_params", "_objective", "_solvers", "_figures", "_weights", "_private")
"""A method's own modules beside its main one (``cwfedavg_equations`` belongs to ``cwfedavg``)."""
SHARED = {"hooks", "declarations", "registry", "sizing", "contributions", "figures", "common", "private_uploads"}
"""Modules of rayfed.algorithms that are not an algorithm: the contract and what algorithms share."""


def _layer(module: str) -> int:
    parts = module.split(".")
    package = parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else ""
    for index, names in enumerate(LAYERS):
        if package in names:
            return index
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS and to docs/architecture.md")


def _module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
    return ".".join(parts)


def _imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of every rayfed import, type-only and lazy ones included."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rayfed"):
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names if alias.name.startswith("rayfed"))
    return sorted(found)


def _modules() -> dict[str, ast.Module]:
    return {_module_name(path): ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = [
        f"{module}:{line} imports {target} (layer {_layer(target)} above {_layer(module)})"
        for module, tree in _modules().items()
        for line, target in _imports(tree)
        if _layer(target) > _layer(module)
    ]
    assert not upward, "\n".join(upward)


def _home(target: str, modules: dict[str, ast.Module]) -> str:
    """The module that ``import target`` runs: ``target`` itself, or the package whose name it is in."""
    while target not in modules:
        target = target.rpartition(".")[0]
    return target


def test_no_modules_import_each_other_in_a_circle() -> None:
    modules = _modules()
    edges = {
        module: {_home(target, modules) for _, target in _imports(tree)} - {module} for module, tree in modules.items()
    }
    circles, done = [], set()

    def walk(module: str, path: list[str]) -> None:
        if module in path:
            circles.append(" -> ".join([*path[path.index(module) :], module]))
            return
        if module in done:
            return
        for target in sorted(edges[module]):
            walk(target, [*path, module])
        done.add(module)

    for module in sorted(modules):
        walk(module, [])
    assert not circles, "\n".join(circles)


def test_the_root_holds_only_the_face_of_the_package() -> None:
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py", "__main__.py", "cli.py"]


def _owner(name: str) -> str:
    """The algorithm a module of rayfed.algorithms belongs to (``cwfedavg_params`` -> ``cwfedavg``)."""
    for suffix in FAMILY_SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def test_no_algorithm_imports_another_for_a_helper() -> None:
    helpers = []
    for module, tree in _modules().items():
        parts = module.split(".")
        if parts[:2] != ["rayfed", "algorithms"] or len(parts) != 3 or parts[2] in SHARED:
            continue
        for line, target in _imports(tree):
            target_parts = target.split(".")
            if target_parts[:2] != ["rayfed", "algorithms"] or len(target_parts) < 3 or target_parts[2] in SHARED:
                continue
            importer, imported = parts[2], target_parts[2]
            if _owner(importer) == _owner(imported) or (importer, imported) in EXTENDS:
                continue
            helpers.append(f"{module}:{line} imports {target}")
    assert not helpers, "move what they share into rayfed.algorithms.common:\n" + "\n".join(helpers)


def test_the_pages_picture_of_the_layers_is_this_one() -> None:
    """docs/architecture.md's picture: its floors from the top, each the packages named there (``name/``; the root
    as ``cli.py``), are :data:`LAYERS` from the top."""
    picture = PAGE.read_text(encoding="utf-8").split("```")[1]
    floors = [
        {"" if name == "cli.py" else name.rstrip("/") for name in re.findall(r"\b(\w+/|cli\.py)(?=\s)", floor)}
        for floor in re.split(r"\n\s*─+\n", picture)
    ]
    assert floors == [set(names) for names in reversed(LAYERS)]
