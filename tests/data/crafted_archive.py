"""A crafted dataset archive (tests of :mod:`rayfed.data.archives` and of reading crafted run directories): one
member inside the target beside members that would land outside it, each way a tar member can climb out."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

__all__ = ["ESCAPES", "crafted_archive", "tree_state"]

ESCAPES = ("absolute", "dotdot", "symlink", "through_link", "hardlink")
"""The ways a member of :func:`crafted_archive` climbs out of the folder it is extracted into."""


def crafted_archive(path: Path, outside: Path, escapes: tuple[str, ...] = ESCAPES, *, inside: str = "") -> Path:
    """Write ``path`` (a ``.tar.gz``): a harmless ``<inside>readme`` and, per name in ``escapes``, a member that
    would write ``evil.pth`` under ``outside`` (an absolute name, a ``..`` path, a link to it and a member written
    through that link, a hard link to a file there)."""
    outside.mkdir(parents=True, exist_ok=True)
    up = os.path.relpath(outside, path.parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        _add_file(tar, f"{inside}readme", b"a dataset")
        if "absolute" in escapes:
            _add_file(tar, str(outside / "absolute" / "evil.pth"), b"import os")
        if "dotdot" in escapes:
            _add_file(tar, f"{inside}../{up}/dotdot/evil.pth", b"import os")
        if "symlink" in escapes or "through_link" in escapes:
            link = tarfile.TarInfo(f"{inside}link")
            link.type, link.linkname = tarfile.SYMTYPE, str(outside)
            tar.addfile(link)
        if "through_link" in escapes:
            _add_file(tar, f"{inside}link/evil.pth", b"import os")
        if "hardlink" in escapes:
            hard = tarfile.TarInfo(f"{inside}hard")
            hard.type, hard.linkname = tarfile.LNKTYPE, f"../{up}/target"
            tar.addfile(hard)
    return path


def _add_file(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def tree_state(root: Path, leave_out: Path | None = None) -> dict[str, object]:
    """Every file, folder and link under ``root`` (its bytes, or where it points), but ``leave_out``'s."""
    state: dict[str, object] = {}
    for path in sorted(root.rglob("*")):
        if leave_out is not None and (path == leave_out or leave_out in path.parents):
            continue
        name = str(path.relative_to(root))
        if path.is_symlink():
            state[name] = ("link", os.readlink(path))
        elif path.is_file():
            state[name] = path.read_bytes()
        else:
            state[name] = "folder"
    return state
