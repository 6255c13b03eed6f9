"""Config keys rayfed no longer has: refused in a config a user writes, left out of one rayfed saved before.

A key is retired when what it switched no longer exists; a run directory or a study saved by an earlier version
still names it, and none of these keys changed a run's numbers, so such a saved config is read without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rayfed.util.config_tree import get_path
from rayfed.util.errors import ConfigError

__all__ = ["RETIRED_KEYS", "refuse_retired", "without_retired"]

RETIRED_KEYS = {
    "engine.fold_sums": "every run now adds the calls' sums along a fixed tree over the calls, each worker node "
    "adding up the calls it ran (docs/cluster.md, 'Sums added up on their nodes'), so nothing is left to switch; "
    "delete the key",
}
"""Retired dotted key -> why it went and what to do."""
_MISSING = object()


def refuse_retired(tree: Any) -> None:
    """ConfigError naming the first retired key that nested mappings ``tree`` set, and why it went."""
    for path, why in RETIRED_KEYS.items():
        if isinstance(tree, Mapping) and get_path(tree, path, _MISSING) is not _MISSING:
            raise ConfigError(f"{path} was removed: {why}")


def without_retired(tree: Mapping[str, Any]) -> dict[str, Any]:
    """``tree`` (nested mappings) without the retired keys it sets."""
    kept = dict(tree)
    for path in RETIRED_KEYS:
        kept = _without(kept, path)
    return kept


def _without(tree: Mapping[str, Any], path: str) -> dict[str, Any]:
    head, _, rest = path.partition(".")
    if not rest:
        return {key: value for key, value in tree.items() if key != head}
    if not isinstance(tree.get(head), Mapping):
        return dict(tree)
    return {**tree, head: _without(tree[head], rest)}
