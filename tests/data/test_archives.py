"""Extracting a dataset's archive writes nowhere but its data root (:mod:`rayfed.data.archives`): a member that
would land outside it is refused in one line before anything is extracted, with Python's data filter and
without it (Pythons before 3.10.12 and 3.11.4)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from rayfed.data import load_dataset
from rayfed.data.archives import extract_tar
from rayfed.util.errors import DatasetError
from tests.data.crafted_archive import ESCAPES, crafted_archive, tree_state

WHY = {
    "absolute": "an absolute name",
    "dotdot": "'..' or a link already there climbs out of it",
    "symlink": "a link to",
    "through_link": "a link to",  # the link itself is refused first
    "hardlink": "a link to",
}


@pytest.fixture(params=["data filter", "own check only"])
def python(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Extraction as on a Python with tarfile's data filter, and as on one without it."""
    if request.param == "own check only" and hasattr(tarfile, "data_filter"):
        monkeypatch.delattr(tarfile, "data_filter")
    return str(request.param)


@pytest.mark.parametrize("escape", ESCAPES)
def test_a_member_that_would_land_outside_the_target_is_refused_in_one_line(
    tmp_path: Path, python: str, escape: str
) -> None:
    root = tmp_path / "data"
    archive = crafted_archive(root / "set.tar.gz", tmp_path / "outside", (escape,))
    before = tree_state(tmp_path)
    with pytest.raises(DatasetError) as raised:
        extract_tar("set", archive, root)
    message = str(raised.value)
    assert "\n" not in message and f"refusing to extract {str(archive)!r}" in message
    assert f"would land outside {str(root)!r} ({WHY[escape]}" in message
    assert tree_state(tmp_path) == before  # nothing extracted, not even the harmless member


def test_a_member_written_through_a_link_of_the_archive_is_refused(tmp_path: Path, python: str) -> None:
    root = tmp_path / "data"
    root.mkdir()
    archive = root / "set.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:  # a link that stays inside, then a member through it
        link = tarfile.TarInfo("a")
        link.type, link.linkname = tarfile.SYMTYPE, "."
        tar.addfile(link)
        tar.addfile(tarfile.TarInfo("a/x"))
    with pytest.raises(DatasetError, match="written through its link 'a'"):
        extract_tar("set", archive, root)


def test_a_link_already_in_the_target_that_points_out_is_not_followed(tmp_path: Path, python: str) -> None:
    root = tmp_path / "data"
    (tmp_path / "outside").mkdir()
    root.mkdir()
    (root / "sub").symlink_to(tmp_path / "outside")
    archive = root / "set.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.addfile(tarfile.TarInfo("sub/evil.pth"))
    with pytest.raises(DatasetError, match="climbs out of it"):
        extract_tar("set", archive, root)
    assert not (tmp_path / "outside" / "evil.pth").exists()


def test_a_sound_archive_is_extracted_into_the_target(tmp_path: Path, python: str) -> None:
    root = tmp_path / "data"
    archive = crafted_archive(root / "set.tar.gz", tmp_path / "outside", (), inside="folder/")
    extract_tar("set", archive, root)
    assert (root / "folder" / "readme").read_bytes() == b"a dataset"


def test_cifar_refuses_a_crafted_archive_in_its_data_root(tmp_path: Path, python: str) -> None:
    root = tmp_path / "data"
    crafted_archive(root / "cifar-10-python.tar.gz", tmp_path / "outside", inside="cifar-10-batches-py/")
    before = tree_state(tmp_path)
    with pytest.raises(DatasetError, match="refusing to extract .*cifar-10-python.tar.gz.*would land outside"):
        load_dataset("cifar10", str(root))
    assert tree_state(tmp_path) == before
