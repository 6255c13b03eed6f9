"""The summation tree over a round's calls (``rayfed.execution.summation``): the same bits whoever adds which
subtree, the rows of concatenated uploads in call order, pieces that do not fit the tree refused, and the server's
check of the total."""

from __future__ import annotations

import numpy as np
import pytest

from rayfed.algorithms import ClientVectors, RoundContext, WeightedSum
from rayfed.execution.server import Server
from rayfed.execution.summation import CallTree, tree_sum


def _sums(calls: int, seed: int = 0) -> list[WeightedSum]:
    """Call sums whose float32 additions round differently in different orders."""
    rng = np.random.default_rng(seed)
    scales = 10.0 ** rng.integers(-3, 4, size=calls)
    return [
        WeightedSum.of((rng.standard_normal(257) * s).astype(np.float32), float(w))
        for s, w in zip(scales, rng.integers(1, 9, size=calls))
    ]


def _bits(total: WeightedSum | None) -> tuple[bytes, float, int]:
    assert total is not None
    return total.total.tobytes(), total.weight, total.count


def test_the_tree_adds_aligned_halves() -> None:
    s = _sums(5)
    by_hand = ((s[0] + s[1]) + (s[2] + s[3])) + s[4]
    assert _bits(tree_sum(s)) == _bits(by_hand)
    left_to_right = (((s[0] + s[1]) + s[2]) + s[3]) + s[4]
    assert _bits(tree_sum(s))[0] != _bits(left_to_right)[0]  # the order the tree replaced rounds otherwise


@pytest.mark.parametrize("calls", [1, 2, 3, 5, 8, 13, 32, 37])
@pytest.mark.parametrize("layout", ["one node", "blocks", "interleaved", "random"])
def test_any_placement_gives_the_bits_of_one_process(calls: int, layout: str) -> None:
    # Prepare: the calls spread over three nodes as a pool might place them.
    parts = _sums(calls, seed=calls)
    rng = np.random.default_rng(calls)
    node_of = {
        "one node": [0] * calls,
        "blocks": [3 * i // calls for i in range(calls)],
        "interleaved": [i % 3 for i in range(calls)],
        "random": rng.integers(0, 3, size=calls).tolist(),
    }[layout]
    tree = CallTree(calls)
    # Execute: each node adds the largest subtrees it holds; the server completes the tree from their sums.
    received: dict[range, WeightedSum | None] = {}
    for node in set(node_of):
        leaves = {range(i, i + 1): parts[i] for i in range(calls) if node_of[i] == node}
        received.update(tree.reduce(leaves))
    # Check
    assert _bits(tree.total(received)) == _bits(tree_sum(parts))


def test_a_node_sends_one_sum_per_largest_subtree_it_holds() -> None:
    tree = CallTree(32)
    assert tree.subtrees(range(8, 16)) == [range(8, 16)]  # an aligned block: one sum
    assert tree.subtrees(range(0, 20)) == [range(0, 16), range(16, 20)]
    assert tree.subtrees(range(20, 32)) == [range(20, 24), range(24, 32)]
    assert CallTree(5).subtrees([4]) == [range(4, 5)]
    assert CallTree(5).subtrees(range(5)) == [range(0, 5)]
    assert len(tree.reduce({range(i, i + 1): s for i, s in enumerate(_sums(32)) if 8 <= i < 16})) == 1


def test_the_originals_are_not_changed() -> None:
    parts = _sums(6)
    before = [p.total.copy() for p in parts]
    tree_sum(parts)
    tree_sum(parts)  # twice: the same bits
    assert all(np.array_equal(p.total, b) for p, b in zip(parts, before))


def test_calls_without_a_sum_add_nothing() -> None:
    s = _sums(4)
    assert _bits(tree_sum([s[0], None, s[2], s[3]])) == _bits(s[0] + (s[2] + s[3]))
    assert tree_sum([None, None, None]) is None
    assert tree_sum([]) is None


def test_concatenated_uploads_keep_call_order_wherever_they_are_joined() -> None:
    rows = [ClientVectors.of(np.full(3, i, np.float32), i, 10.0 + i) for i in range(7)]
    tree = CallTree(7)
    received = {}
    for node in ([0, 1, 5], [2, 3, 4, 6]):
        received.update(tree.reduce({range(i, i + 1): rows[i] for i in node}))
    joined = tree.total(received)
    assert joined is not None
    assert joined.client_ids.tolist() == list(range(7))
    assert joined.matrix()[:, 0].tolist() == list(range(7))


@pytest.mark.parametrize(
    ("pieces", "message"),
    [
        ({range(0, 1): None, range(1, 2): None}, r"calls \[2, 3, 4\] of 5 are missing"),
        ({range(1, 3): None}, r"range\(1, 3\) is not a subtree"),
        ({range(0, 5): None, range(4, 5): None}, "overlap"),
        ({range(0, 6): None}, r"range\(0, 6\) is not a subtree"),
    ],
)
def test_pieces_that_do_not_fit_the_tree_are_refused(pieces, message) -> None:
    with pytest.raises(ValueError, match=message):
        CallTree(5).total(pieces)


def test_a_tree_has_calls() -> None:
    with pytest.raises(ValueError, match="calls=0"):
        CallTree(0)
    with pytest.raises(ValueError, match="call 5 is not one of the round's 5 calls"):
        CallTree(5).subtrees([5])


class _Half:
    """A server half that records what it is given to aggregate."""

    def __init__(self) -> None:
        self.given: list[object] = []

    def aggregate(self, ctx: RoundContext, total: object) -> dict[str, float]:
        self.given.append(total)
        return {}


def test_the_server_reads_a_sum_again_for_overflow_but_not_the_rows_of_a_concatenation(monkeypatch) -> None:
    # Prepare: a server around a recording half; is_finite counted per kind of upload.
    server, half = Server.__new__(Server), _Half()
    server.half = half  # type: ignore[assignment]
    ctx = RoundContext(round=0, seed=0, lr=0.1, sampled=np.arange(4))
    checked: list[str] = []
    is_finite = WeightedSum.is_finite
    monkeypatch.setattr(ClientVectors, "is_finite", lambda self: checked.append("rows") or True)
    monkeypatch.setattr(WeightedSum, "is_finite", lambda self: checked.append("sum") or is_finite(self))
    big = np.full(3, 3e38, np.float32)  # finite parts whose sum overflows float32
    # Execute
    server.aggregate(ctx, *[ClientVectors.of(np.full(3, i, np.float32), i, 1.0) for i in range(4)])
    with np.errstate(over="ignore"):
        refused = server.aggregate(ctx, WeightedSum(big, 1.0), WeightedSum(big, 1.0))
    # Assert: the rows, each found finite on its worker, are not read again; the overflowing sum is refused
    # (answered by the server, never handed to the half).
    assert checked == ["sum"]
    assert len(half.given) == 1 and isinstance(half.given[0], ClientVectors) and half.given[0].count == 4
    assert refused["clients_aggregated"] == 0.0
