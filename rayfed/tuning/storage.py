"""Where a study lives: a SQLite file by default, any Optuna storage URL otherwise.

* ``None``: ``sqlite:///<study_dir>/study.db``, one file beside the trials' run
  directories; watch it with ``optuna-dashboard sqlite:///<study_dir>/study.db``.
* ``sqlite:///...``, ``postgresql://...``, ``mysql://...``: :class:`optuna.storages.RDBStorage`.
* ``journal:///abs/path/study.log`` (or ``journal://relative.log``): an append-only
  :class:`optuna.storages.JournalStorage` file, which suits a shared file system on a
  cluster better than SQLite.
* An ``optuna.storages.BaseStorage`` object is used as given.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import optuna
import sqlalchemy.exc
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend

from rayfed.util.errors import ConfigError

__all__ = ["open_storage", "default_storage_url", "storage_errors"]

_JOURNAL = "journal://"
_SQLITE_TIMEOUT_S = 60  # parallel trials write from several threads; wait for the lock, don't fail


def default_storage_url(study_dir: str | Path) -> str:
    """``sqlite:///<absolute study_dir>/study.db``."""
    return f"sqlite:///{(Path(study_dir).resolve() / 'study.db').as_posix()}"


@contextmanager
def storage_errors(storage: object, study_dir: str | Path) -> Iterator[None]:
    """Turn a storage or study folder that cannot be written (a read-only or missing place, a file where a
    folder should be) into one ConfigError naming it and the fix, instead of a raw OSError or a database
    driver's error."""
    try:
        yield
    except (OSError, sqlalchemy.exc.SQLAlchemyError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error).splitlines()[0]
        where = f"storage={storage!r}" if storage is not None else f"the study's folder {str(study_dir)!r}"
        raise ConfigError(
            f"cannot write the study to {where} ({reason}); choose a writable place with --study-dir "
            "(tune(study_dir=...)) or --storage (tune(storage=...))"
        ) from error


def open_storage(storage: str | BaseStorage | None, study_dir: str | Path) -> BaseStorage:
    """Open (creating if needed) the storage named by ``storage``; see the module docstring. A place that
    cannot be written raises ConfigError (:func:`storage_errors`)."""
    if isinstance(storage, BaseStorage):
        return storage
    with storage_errors(storage, study_dir):
        return _open(storage, study_dir)


def _open(storage: str | None, study_dir: str | Path) -> BaseStorage:
    if storage is None:
        Path(study_dir).mkdir(parents=True, exist_ok=True)
        storage = default_storage_url(study_dir)
    if not isinstance(storage, str) or not storage:
        raise ConfigError(f"storage must be an Optuna storage URL or None, but got storage={storage!r}")
    if storage.startswith(_JOURNAL):
        path = Path(storage[len(_JOURNAL) :])
        if not path.name:
            raise ConfigError(
                f"a journal storage needs a file, e.g. journal:///tmp/study.log, but got storage={storage!r}"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path)))
    if "://" not in storage:
        raise ConfigError(
            f"storage must be a URL such as sqlite:///study.db, postgresql://host/db or journal:///path/study.log, "
            f"but got storage={storage!r}"
        )
    kwargs = {"connect_args": {"timeout": _SQLITE_TIMEOUT_S}} if storage.startswith("sqlite") else None
    try:
        return RDBStorage(storage, engine_kwargs=kwargs)
    except (ImportError, ValueError, optuna.exceptions.StorageInternalError) as e:
        raise ConfigError(f"cannot open storage={storage!r}: {e}") from e
