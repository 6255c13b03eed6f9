"""Typed scratch keys: what one hook of an algorithm hands to a later hook of the same job."""

from __future__ import annotations

import pytest

from rayfed.train.scratch import Scratch, ScratchKey

CLUSTER = ScratchKey[int]("ifca.cluster")


def test_a_value_set_under_a_key_is_read_and_removed_under_the_same_key() -> None:
    scratch = Scratch()
    scratch[CLUSTER] = 2
    assert CLUSTER in scratch and scratch[CLUSTER] == 2 and scratch.get(CLUSTER) == 2
    assert scratch.pop(CLUSTER) == 2
    assert CLUSTER not in scratch and scratch.get(CLUSTER) is None and scratch.get(CLUSTER, -1) == -1
    assert scratch.pop(CLUSTER, None) is None


def test_keys_compare_by_identity_so_two_modules_cannot_collide_on_a_name() -> None:
    scratch = Scratch()
    scratch[CLUSTER] = 2
    assert ScratchKey[int]("ifca.cluster") not in scratch


def test_reading_a_value_no_hook_set_names_the_key() -> None:
    with pytest.raises(KeyError, match=r"no scratch value 'ifca.cluster' in this job"):
        Scratch()[CLUSTER]
    with pytest.raises(KeyError, match=r"no scratch value 'ifca.cluster' in this job"):
        Scratch().pop(CLUSTER)
