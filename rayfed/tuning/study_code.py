"""The code a study runs outside rayfed, recorded when it is made and checked when it resumes.

A study's trials run the code its command line names (its ``plugins``, the modules that registered its method):
the base config in its storage is compared as data and never imported. What the study records is each file's
digest (``rayfed.plugins``, :mod:`rayfed.tuning.attrs`), so that a resumed study whose method's file changed does
not mix two methods' trials: it is refused, naming the file and both digests, unless the change is accepted by its
digest (:func:`rayfed.util.plugin_check.accept_plugins`, ``rayfed tune --accept-plugin``), which it records.
``rayfed tune`` makes the same comparison for the files its ``plugins`` name before it imports them
(:func:`check_named_code`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import optuna

import rayfed.tuning.attrs as attrs
from rayfed.config import RunConfig
from rayfed.tuning.storage import default_storage_url, open_storage
from rayfed.util.plugin_check import check_named, check_sources, recorded_sources
from rayfed.util.plugin_sources import PluginSource, locate
from rayfed.util.plugins import run_sources

__all__ = ["record_code", "check_same_code", "check_named_code"]


def record_code(study: optuna.Study, base: RunConfig) -> None:
    """Record in ``study`` the files of ``base``'s code outside rayfed, with their digests."""
    study.set_user_attr(attrs.PLUGINS, [source.record() for source in run_sources(base)])


def check_same_code(study: optuna.Study, base: RunConfig) -> None:
    """Refuse a resumed study whose code outside rayfed differs from the files it recorded, byte for byte, unless
    each change is accepted by digest; record what was accepted (and the files of a study made before studies
    recorded them)."""
    where = f"study {study.study_name!r}"
    held = attrs.PLUGINS in study.user_attrs
    recorded = recorded_sources(study.user_attrs.get(attrs.PLUGINS) or [], where)
    note = "" if held else ": it was made before studies recorded them"
    accepted = check_sources(where, recorded, run_sources(base), note=note)
    if accepted or not held:
        record_code(study, base)
        study.set_user_attr(attrs.PLUGINS_ACCEPTED, [*study.user_attrs.get(attrs.PLUGINS_ACCEPTED, []), *accepted])


def check_named_code(entries: Sequence[str], study_name: str, study_dir: Path, storage: str | None) -> None:
    """Before ``rayfed tune`` imports the ``plugins`` its command line names (``entries``): refuse, as
    :func:`check_same_code` would, a resumed study's recorded file that one of them now finds with other bytes, or
    a file it did not record, found without running it (:func:`~rayfed.util.plugin_sources.locate`), so that a
    changed file's top level never runs unless its digest is accepted. A new study, or one that records no files,
    is left to :func:`check_same_code`, which also sees the modules that registered the study's names."""
    recorded = _recorded(study_name, study_dir, storage)
    if not recorded:
        return
    named = [locate(entry, f"plugins[{i}]={entry!r}") for i, entry in enumerate(entries)]
    check_named(f"study {study_name!r}", recorded, named)


def _recorded(study_name: str, study_dir: Path, storage: str | None) -> list[PluginSource]:
    """The files the study ``study_name`` recorded, read from its storage if it exists (creating none)."""
    if storage is None and not (study_dir / "study.db").is_file():
        return []
    url = storage if storage is not None else default_storage_url(study_dir)
    try:
        study = optuna.load_study(study_name=study_name, storage=open_storage(url, study_dir))
    except KeyError:  # no such study there: a new one
        return []
    return recorded_sources(study.user_attrs.get(attrs.PLUGINS) or [], f"study {study_name!r}")
