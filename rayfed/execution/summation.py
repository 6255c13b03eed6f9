"""The order in which a round's partial sums are added: a fixed binary tree over the calls' indices.

A round's clients are split into calls (:func:`rayfed.execution.executor.make_chunks`), each call returns the sum of
its clients' contributions, and float addition is not associative: the order in which the calls' sums are added
decides the last bits of the aggregate. rayfed adds them along one tree that depends on the number of calls alone,
never on where the calls ran, so ``engine.backend=local``, one worker and any pool of any cluster give the same bits,
before and after a node is lost. The tree is the dyadic one over call indices ``0 .. n-1``: its nodes are the
aligned blocks ``[j 2^k, (j+1) 2^k)`` cut at ``n``, and each node's sum is its left half's plus its right half's
(the right half of a block cut at ``n`` may be empty, and the node is then its left half)::

    n = 5:   ((s0 + s1) + (s2 + s3)) + s4          n = 8:   ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))

Any node of the tree can be added by whoever holds the calls under it. A Ray node that ran calls adds the largest
subtrees whose calls it ran (:meth:`CallTree.reduce`) and sends those sums on; the server completes the tree from
whatever sums it receives, subtrees or single calls (:meth:`CallTree.total`). Every addition is the same one, with
the same operands, wherever it happens, so the result is the same to the last bit. A call whose sum is ``None`` (no
client of it was accepted) adds nothing. Uploads that concatenate rather than add (``ClientVectors``,
``Contribution.sum_is_one_part = False``) are joined along the same tree, which keeps their rows in call order.

A tree rather than a chain: the left-to-right order ``((s0 + s1) + s2) + ...`` that rayfed used before made every
partial sum depend on all the calls before it, so a node could only add its calls onto the total of the nodes
before it, one node after another; in the tree, the nodes add their subtrees at the same time. The change moved
every run's numbers once, by float rounding (benchmarks/README.md, "Control plane": ``benchmarks/digest.py`` before
and after). Within a call, a worker sums its clients' uploads in client order (:mod:`rayfed.execution.settlement`),
except a stack's declared weighted state (FedAvg's), which is one matrix product Σ_i n_i θ_i over the stack's
clients (:meth:`~rayfed.algorithms.contributions.WeightedState.of_stack`), rounded as the product rounds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import iadd
from typing import Any, TypeVar, cast

from rayfed.algorithms import Contribution

__all__ = ["CallTree", "tree_sum", "pieces_of"]

C = TypeVar("C", bound=Contribution)


@dataclass(frozen=True)
class CallTree:
    """The summation tree of a round of ``calls`` calls; a subtree is named by the calls it spans (a ``range``)."""

    calls: int

    def __post_init__(self) -> None:
        if self.calls < 1:
            raise ValueError(f"a round's tree needs at least one call, but got calls={self.calls}")

    @property
    def root(self) -> range:
        return range(0, self.calls)

    @property
    def _width(self) -> int:
        """The root block's size: the smallest power of two that holds every call."""
        return 1 << (self.calls - 1).bit_length()

    def subtrees(self, calls: Iterable[int]) -> list[range]:
        """The largest subtrees whose every call is in ``calls``, in call order: what a holder of those calls can
        add by itself. A run of consecutive calls that starts and ends on block edges is one subtree.

        >>> CallTree(8).subtrees([0, 1, 2, 3, 5, 6, 7])
        [range(0, 4), range(5, 6), range(6, 8)]
        """
        held = [False] * self.calls
        for call in calls:
            held[self._index(call)] = True
        before = [0]  # before[i]: calls held among 0 .. i-1
        for is_held in held:
            before.append(before[-1] + is_held)
        found: list[range] = []
        self._collect(0, self._width, before, found)
        return found

    def _collect(self, lo: int, size: int, before: list[int], found: list[range]) -> None:
        span = range(lo, min(lo + size, self.calls))
        if before[span.stop] - before[span.start] == len(span):
            found.append(span)
        elif size > 1:
            half = size // 2
            self._collect(lo, half, before, found)
            if lo + half < self.calls:
                self._collect(lo + half, half, before, found)

    def reduce(self, pieces: Mapping[range, C | None]) -> dict[range, C | None]:
        """The sums of the largest subtrees that ``pieces`` (sums of subtrees, or single calls' ``range(i, i + 1)``)
        cover entirely, each added along the tree: what a node sends on in place of the calls it ran."""
        covered = self._check(pieces)
        return {span: self._sum(span.start, self._size_of(span), pieces)[0] for span in self.subtrees(covered)}

    def total(self, pieces: Mapping[range, C | None]) -> C | None:
        """The round's sum, the tree completed from ``pieces`` (sums of disjoint subtrees covering every call)."""
        covered = self._check(pieces)
        if len(covered) < self.calls:
            missing = sorted(set(range(self.calls)) - set(covered))
            raise ValueError(f"the sums of calls {missing[:8]} of {self.calls} are missing; every call must be summed")
        return self._sum(0, self._width, pieces)[0]

    def _sum(self, lo: int, size: int, pieces: Mapping[range, C | None]) -> tuple[C | None, bool]:
        """The sum of the tree node ``[lo, lo + size)`` cut at ``calls``, and whether it was made here (so that it
        may be added to in place: the pieces themselves are never changed)."""
        span = range(lo, min(lo + size, self.calls))
        if span in pieces:
            return pieces[span], False
        half = size // 2
        left, made_here = self._sum(lo, half, pieces)
        if lo + half >= self.calls:
            return left, made_here
        right, right_made_here = self._sum(lo + half, half, pieces)
        if left is None or right is None:
            return (right, right_made_here) if left is None else (left, made_here)
        # Only a sum made here is added to in place (the same bits as ``+``); a piece received is never changed.
        added = iadd(left, right) if made_here else left + right
        return cast(C, added), True  # a contribution's ``+`` gives one of its own type

    def _size_of(self, span: range) -> int:
        """The block size of the tree node spanning ``span`` (the smallest, where a cut block spans the same)."""
        return 1 << (len(span) - 1).bit_length()

    def _check(self, pieces: Mapping[range, object]) -> list[int]:
        """The calls ``pieces`` cover; ValueError if a piece is not a subtree of this tree or two overlap."""
        covered: list[int] = []
        for span in pieces:
            size = self._size_of(span) if len(span) else 0
            if not size or span.step != 1 or span.start % size or span.stop != min(span.start + size, self.calls):
                raise ValueError(f"{span} is not a subtree of the summation tree of {self.calls} calls")
            covered.extend(span)
        if len(set(covered)) < len(covered):
            raise ValueError(f"the pieces {sorted(pieces, key=lambda s: s.start)} overlap: a call would count twice")
        return covered

    def _index(self, call: int) -> int:
        if not 0 <= call < self.calls:
            raise ValueError(f"call {call} is not one of the round's {self.calls} calls")
        return call


def tree_sum(parts: Sequence[C | None]) -> C | None:
    """The calls' sums ``parts`` (in call order) added along their :class:`CallTree`; ``None`` if there is none."""
    if not parts:
        return None
    return CallTree(len(parts)).total({range(i, i + 1): part for i, part in enumerate(parts)})


def pieces_of(spans: Sequence[range | None], received: Sequence[object]) -> dict[range, Any]:
    """The subtree sums that ``received`` objects hold: each the sum of the calls its span names, or, where its span
    is None, a mapping of sums by their spans (what a node added up: :meth:`CallTree.reduce`)."""
    pieces: dict[range, Any] = {}
    for span, value in zip(spans, received, strict=True):
        if span is None:
            pieces.update(value)  # type: ignore[call-overload]
        else:
            pieces[span] = value
    return pieces
