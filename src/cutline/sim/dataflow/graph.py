"""The graphs of the dataflow model (:mod:`cutline.sim.dataflow.model`) and what moves on
their channels: records, barriers, ends of input.

**Graph.** A :class:`DataflowGraph` is a set of *subtasks* joined by one-way FIFO *channels*.
Sources have no inputs; every other subtask (an *operator*) has a barrier handler. A
subtask with several inputs is a union; one with several outputs hash-partitions its
records over them (the output is a fixed function of the record, so the path of every
record through the graph is fixed). A graph may have a loop: an *iteration head* has
*back edges* coming from *tail* subtasks further on. A record carries a round counter;
a tail sends a record with ``rounds > 0`` back round a back edge with the counter
decremented, and any other record on (or drops it, if it has no other output).

:func:`dag_topology` and :func:`loop_topology` draw random graphs, acyclic or with a loop.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple, TypeAlias

ChannelId: TypeAlias = tuple[str, str]
"""A channel is named by its ``(sender, receiver)`` pair: at most one channel per pair."""


class Record(NamedTuple):
    """A record: emitted by source number ``source`` at offset ``seq``; ``rounds`` is the
    number of times it still goes round the loop."""

    source: int
    seq: int
    rounds: int

    def __str__(self) -> str:
        return f"r{self.source}.{self.seq}" + (f"^{self.rounds}" if self.rounds else "")


@dataclass(frozen=True, slots=True)
class BarrierItem:
    """``BarrierItem(checkpoint_id)`` on a channel. In an input buffer, ``overtakes`` is the
    number of records behind an unaligned barrier that it jumped over there (the next ones
    after it, not counting the unaligned barriers that arrived later and jumped too)."""

    checkpoint_id: int
    unaligned: bool = False
    overtakes: int = 0

    def __str__(self) -> str:
        return f"B{self.checkpoint_id}" + ("u" if self.unaligned else "")


class EndItem:
    """The end of a channel: nothing follows it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "END"


END = EndItem()
Item: TypeAlias = Record | BarrierItem | EndItem


@dataclass(frozen=True)
class DataflowGraph:
    """A dataflow graph and its input.

    :param sources: the source subtasks; source ``i`` emits ``Record(i, 0..records-1, r)``.
    :param operators: the other subtasks, in an order where each comes after the
        senders of its regular (not back-edge) inputs.
    :param channels: every channel, as ``(sender, receiver)``.
    :param back_edges: the channels that close a loop (from a tail to an iteration head).
    :param records: how many records each source emits.
    :param max_rounds: a record's initial round counter is ``seq % (max_rounds + 1)``.
    """

    sources: tuple[str, ...]
    operators: tuple[str, ...]
    channels: tuple[ChannelId, ...]
    back_edges: frozenset[ChannelId] = frozenset()
    records: int = 8
    max_rounds: int = 0

    def __post_init__(self) -> None:
        names = (*self.sources, *self.operators)
        if len(set(names)) != len(names):
            raise ValueError(f"a subtask name is used twice: {names!r}")
        if len(set(self.channels)) != len(self.channels):
            raise ValueError("a channel is listed twice")
        known = set(names)
        for sender, receiver in self.channels:
            if sender not in known or receiver not in known:
                raise ValueError(f"channel {sender}->{receiver} names an unknown subtask")
            if receiver in self.sources:
                raise ValueError(f"channel {sender}->{receiver} goes into a source")
        if not self.back_edges <= set(self.channels):
            raise ValueError("a back edge is not a channel")
        order = {name: i for i, name in enumerate(names)}
        for c in self.channels:
            if c not in self.back_edges and order[c[0]] >= order[c[1]]:
                raise ValueError(f"channel {c[0]}->{c[1]} goes backwards but is no back edge")

    @property
    def subtasks(self) -> tuple[str, ...]:
        return (*self.sources, *self.operators)

    def inputs(self, name: str) -> tuple[ChannelId, ...]:
        return tuple(c for c in self.channels if c[1] == name)

    def outputs(self, name: str) -> tuple[ChannelId, ...]:
        return tuple(c for c in self.channels if c[0] == name)

    @property
    def heads(self) -> tuple[str, ...]:
        """The iteration heads: the subtasks with a back-edge input."""
        return tuple(n for n in self.operators if any(c[1] == n for c in self.back_edges))

    @property
    def loop(self) -> frozenset[str]:
        """The subtasks on a cycle through a head (reachable from a head and reaching one)."""
        heads = set(self.heads)
        forward = _reach(heads, _adjacency(self.channels, 0))
        backward = _reach(heads, _adjacency(self.channels, 1))
        return frozenset(forward & backward)

    @cached_property
    def _split_outputs(self) -> dict[str, tuple[tuple[ChannelId, ...], tuple[ChannelId, ...]]]:
        """Per subtask, its regular outputs and its back-edge outputs."""
        return {
            name: (
                tuple(c for c in self.outputs(name) if c not in self.back_edges),
                tuple(c for c in self.outputs(name) if c in self.back_edges),
            )
            for name in self.subtasks
        }

    def route(self, name: str, record: Record) -> tuple[ChannelId, Record] | None:
        """Where subtask ``name`` sends ``record`` (after processing it), or ``None``."""
        outputs, back = self._split_outputs[name]
        if record.rounds > 0 and back:
            record = record._replace(rounds=record.rounds - 1)
            return back[_key(record) % len(back)], record
        if not outputs:
            return None
        return outputs[_key(record) % len(outputs)], record

    def first_record(self, source: int, seq: int) -> Record:
        return Record(source, seq, seq % (self.max_rounds + 1))

    def describe(self) -> str:
        """The graph on one line, for failure messages."""
        edges = ", ".join(
            f"{s}->{r}" + (" (back)" if (s, r) in self.back_edges else "") for s, r in self.channels
        )
        return f"{self.records} records/source, max_rounds {self.max_rounds}: {edges}"


def _key(record: Record) -> int:
    return record.seq * 31 + record.source * 7 + record.rounds * 3


def _adjacency(channels: Iterable[ChannelId], side: int) -> dict[str, list[str]]:
    adj: dict[str, list[str]] = {}
    for c in channels:
        adj.setdefault(c[side], []).append(c[1 - side])
    return adj


def _reach(start: set[str], adj: Mapping[str, list[str]]) -> set[str]:
    seen = set(start)
    todo = list(start)
    while todo:
        for nxt in adj.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def dag_topology(
    rng: random.Random,
    *,
    sources: int = 2,
    layers: int = 2,
    width: int = 3,
    records: int = 8,
) -> DataflowGraph:
    """A random layered acyclic graph: ``sources`` sources, then ``layers`` layers of 1 to
    ``width`` subtasks, each with 1 to 3 inputs from the layer before (and now and then one
    from further back), so that there are unions, partitions and diamonds."""
    src = [f"src{i}" for i in range(sources)]
    levels: list[list[str]] = [src]
    channels: list[ChannelId] = []
    for depth in range(1, layers + 1):
        level = [f"op{depth}.{i}" for i in range(rng.randint(1, width))]
        prev = levels[-1]
        for name in level:
            k = rng.randint(1, min(3, len(prev)))
            ins = rng.sample(prev, k)
            earlier = [n for lv in levels[:-1] for n in lv]
            if earlier and rng.random() < 0.3:
                ins.append(rng.choice(earlier))
            channels.extend((s, name) for s in ins)
        # every subtask of the layer before sends somewhere
        for s in prev:
            if not any(c[0] == s for c in channels):
                channels.append((s, rng.choice(level)))
        levels.append(level)
    operators = [n for lv in levels[1:] for n in lv]
    return DataflowGraph(tuple(src), tuple(operators), tuple(channels), records=records)


def loop_topology(
    rng: random.Random,
    *,
    sources: int = 2,
    heads: int = 1,
    body: int = 1,
    tails: int = 1,
    records: int = 6,
    max_rounds: int = 2,
) -> DataflowGraph:
    """A random graph with a loop: sources feed ``heads`` iteration heads, then an
    optional ``body`` layer, then ``tails`` tails; each tail has back edges to some heads
    and a channel to the sink ``out``. A head may take back edges from a tail that none of
    its own records reach (so a barrier can come round before the head snapshotted)."""
    src = [f"src{i}" for i in range(sources)]
    hs = [f"head{i}" for i in range(heads)]
    bs = [f"body{i}" for i in range(body)]
    ts = [f"tail{i}" for i in range(tails)]
    channels: list[ChannelId] = []

    def connect(senders: list[str], receivers: list[str]) -> None:
        for r in receivers:
            for s in rng.sample(senders, rng.randint(1, min(3, len(senders)))):
                channels.append((s, r))
        for s in senders:
            if not any(c[0] == s for c in channels):
                channels.append((s, rng.choice(receivers)))

    connect(src, hs)
    connect(hs, bs or ts)
    if bs:
        connect(bs, ts)
    back: list[ChannelId] = []
    for t in ts:
        for h in rng.sample(hs, rng.randint(1, len(hs))):
            back.append((t, h))
        channels.append((t, "out"))
    if rng.random() < 0.3:
        channels.append((rng.choice(src), "out"))
    channels.extend(back)
    return DataflowGraph(
        tuple(src),
        (*hs, *bs, *ts, "out"),
        tuple(channels),
        frozenset(back),
        records=records,
        max_rounds=max_rounds,
    )
