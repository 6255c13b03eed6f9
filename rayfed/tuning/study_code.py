"""The code a study runs outside rayfed, recorded when it is made and checked when it resumes.

A study's trials run the code its command line names (its ``plugins``, the modules that registered its method):
the base config in its storage is compared as data and never imported. What the study records is each file's
digest (``rayfed.plugins``, :mod:`rayfed.tuning.attrs`), so that a resumed study whose method's file changed does
not mix two methods' trials: it is refused, naming the file and both digests, unless the change is accepted by its
digest (:func:`rayfed.engine.plugin_seal.accept_plugins`, ``rayfed tune --accept-plugin``), which it records.
"""

from __future__ import annotations

import optuna

import rayfed.tuning.attrs as attrs
from rayfed.config import RunConfig
from rayfed.engine.plugin_seal import check_sources, recorded_sources
from rayfed.util.plugins import run_sources

__all__ = ["record_code", "check_same_code"]


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
