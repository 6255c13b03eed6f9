"""Extracting a dataset's tar archive into its data root without writing anywhere else: :func:`extract_tar`.

rayfed extracts an archive only where a dataset loader finds one in ``data.root`` (CIFAR's
``cifar-*-python.tar.gz``, AG News' ``ag_news_csv.tar.gz``), when a run loads that dataset. A member that would
land outside the root (an absolute name, a ``..`` that climbs out of it, a link that points out of it or a
member written through such a link, a device or a pipe) is refused in one line naming the archive and the member,
before anything is extracted, on every Python rayfed supports; where Python's ``tarfile`` has its ``"data"``
extraction filter (3.10.12+, 3.11.4+, 3.12+), extraction runs under it as well.

Reading a run directory never calls this: ``rayfed plot`` and the results API never load a run's dataset
(:func:`rayfed.results.run_data.finished_run`).
"""

from __future__ import annotations

import logging
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

from rayfed.util.errors import DatasetError

__all__ = ["extract_tar", "unsafe_member"]

logger = logging.getLogger(__name__)


def extract_tar(name: str, archive: Path, target: Path, wanted: Callable[[str], bool] = lambda member: True) -> None:
    """Extract the members of ``archive`` whose names are ``wanted`` into ``target``, refusing the whole archive
    (DatasetError naming it, the member and the fix) if one would land outside ``target``."""
    logger.info("%s: extracting %s offline", name, archive)
    try:
        with tarfile.open(archive) as tar:
            members = [member for member in tar.getmembers() if wanted(member.name)]
            for member in members:
                why = unsafe_member(member, target, members)
                if why is not None:
                    raise DatasetError(
                        f"dataset {name!r}: refusing to extract {str(archive)!r}: its member {member.name!r} would "
                        f"land outside {str(target)!r} ({why}); delete the archive and put the one the dataset's "
                        "site publishes there"
                    )
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(target, members=members, **safe)  # type: ignore[arg-type]
    except (OSError, EOFError, tarfile.TarError) as error:
        raise DatasetError(f"dataset {name!r}: cannot extract {str(archive)!r} ({error})") from error


def unsafe_member(member: tarfile.TarInfo, target: Path, members: list[tarfile.TarInfo]) -> str | None:
    """Why extracting ``member`` of an archive holding ``members`` into ``target`` would write outside it, or
    None when it stays inside."""
    root = os.path.realpath(target)
    if member.name.startswith(("/", os.sep)) or os.path.isabs(member.name):
        return "an absolute name"
    if not _inside(os.path.join(root, member.name), root):
        return "'..' or a link already there climbs out of it"
    if member.issym() or member.islnk():
        start = os.path.dirname(os.path.join(root, member.name)) if member.issym() else root
        if os.path.isabs(member.linkname) or not _inside(os.path.join(start, member.linkname), root):
            return f"a link to {member.linkname!r}"
    elif not (member.isfile() or member.isdir()):
        return "a device or a pipe, which no dataset holds"
    links = {other.name.rstrip("/") for other in members if other.issym() or other.islnk()}
    parts = member.name.rstrip("/").split("/")
    through = next(("/".join(parts[:n]) for n in range(1, len(parts)) if "/".join(parts[:n]) in links), None)
    if through is not None:
        return f"written through its link {through!r}"
    return None


def _inside(path: str, root: str) -> bool:
    """Whether ``path`` (links already on disk followed) lies in the folder ``root``."""
    resolved = os.path.realpath(path)
    return resolved == root or resolved.startswith(root.rstrip(os.sep) + os.sep)
