"""The job graph (operators and the edges between them) and its execution plan.

A :class:`JobGraph` is what the API builds: :class:`Operator` nodes, each with
its input :class:`Edge` s. An edge is ``forward`` (subtask ``i`` feeds subtask
``i`` of the next operator) or ``hash`` (every record goes to the subtask that
owns its key's key group: a shuffle).

:func:`plan` turns it into the execution plan that the runtime runs, as in
Flink:

* **chains**: an operator joins its input's chain when its only input is a
  forward edge from an operator that feeds nothing else. A chain runs as one
  loop (one subtask per slot) with no channel inside it.
* **channels**: every other edge becomes channels between subtasks of two
  chains: ``parallelism`` of them for a forward edge, ``parallelism²`` for a
  hash or a broadcast edge. A channel's id names both ends.

**Two inputs**: an operator that takes two streams apart (``connect``, a join) has two
*ports*: each input edge says which one it feeds (:attr:`Edge.port`: 0, the left or first;
1, the right or second), and the plan tells the subtask which port each input channel feeds
(:meth:`ExecutionPlan.input_ports`). Such an operator heads its chain (it has two inputs).

Every operator runs at the job's parallelism, and slot ``i`` runs subtask ``i``
of every chain.

**Loops**: :meth:`JobGraph.close_loop` adds a *back edge* from an operator of a
loop's body to the loop's head (forward). Back edges are the only cycles a
graph may have; chaining and channel layout ignore their direction, and the
plan marks their channels (:meth:`ExecutionPlan.back_edge_channels`) so that
the head never waits for a barrier on them but records what they carry until it
comes round (SEMANTICS §3, "Cycles").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, assert_never

_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")

KeySelector = str | Callable[[Any], Hashable]
"""A column name (records are dicts or Arrow rows), or a function of the record."""


class Partitioning(StrEnum):
    """How an edge deals its records to the subtasks of its downstream operator."""

    FORWARD = "forward"
    """Subtask ``i`` feeds subtask ``i``."""
    HASH = "hash"
    """Every record goes to the subtask that owns its key's key group (a shuffle)."""
    BROADCAST = "broadcast"
    """Every record goes to every subtask (``broadcast()``: the rules every subtask needs)."""


class GraphError(ValueError):
    """A job graph that cannot run: no source, a repeated operator id, a cycle."""


@dataclass(frozen=True)
class Edge:
    upstream: str
    """The uid of the operator the records come from."""
    partitioning: Partitioning = Partitioning.FORWARD
    """(Given as its name, ``"forward"`` or ``"hash"``, it is made the :class:`Partitioning`.)"""
    key: KeySelector | None = None
    """For ``hash`` edges: how to get a record's key."""
    back: bool = False
    """A loop's back edge (from the loop's body to its head)."""
    side: str | None = None
    """It carries a side output of its upstream operator (``"late"``: the records a window
    found too late), not its main output. Never chained."""
    port: int = 0
    """The input of a two-input operator it feeds (0: the left or first, 1: the right or
    second); 0 for every other operator."""

    def __post_init__(self) -> None:
        if not isinstance(self.partitioning, Partitioning):
            try:
                object.__setattr__(self, "partitioning", Partitioning(self.partitioning))
            except ValueError:
                raise GraphError(f"unknown partitioning {self.partitioning!r}") from None


@dataclass
class Operator:
    """One node of the job graph.

    :param uid: stable id: names the operator's state in checkpoints (letters, digits, ``_``,
        ``.``).
    :param name: what messages call it, e.g. ``map(parse)``.
    :param logic: the runtime object that does the work (a source, a transformation, a sink),
        see :mod:`cutline.runtime.operators`.
    """

    uid: str
    name: str
    logic: Any
    inputs: list[Edge] = field(default_factory=list)

    @property
    def is_source(self) -> bool:
        return not self.inputs


class JobGraph:
    def __init__(self) -> None:
        self.operators: dict[str, Operator] = {}

    def add(self, operator: Operator) -> Operator:
        if not _UID.fullmatch(operator.uid):
            raise GraphError(
                f"operator id {operator.uid!r} must be letters, digits, '_', '-' and '.' (it names "
                "files)"
            )
        if operator.uid in self.operators:
            raise GraphError(f"two operators have the id {operator.uid!r}: ids must be unique")
        upstreams = [(edge.upstream, edge.port) for edge in operator.inputs]
        if len(set(upstreams)) != len(upstreams):
            raise GraphError(
                f"{operator.name} reads the same operator twice: "
                f"{[upstream for upstream, _ in upstreams]}"
            )
        for edge in operator.inputs:
            if edge.upstream not in self.operators:
                raise GraphError(f"{operator.name} reads from unknown operator {edge.upstream!r}")
        self.operators[operator.uid] = operator
        return operator

    def close_loop(self, head: str, feedback: str) -> None:
        """Add the back edge ``feedback -> head``: ``feedback`` must be downstream of ``head``
        (inside the loop's body), and ``head`` gets one back edge only."""
        op = self.operators[head]
        if any(e.back for e in op.inputs):
            raise GraphError(f"{op.name} already has a back edge")
        if feedback == head or head not in self._upstream_of(feedback):
            raise GraphError(
                f"the feedback of {op.name} must come from inside its loop body (an operator "
                f"downstream of it), not from {self.operators[feedback].name}"
            )
        op.inputs.append(Edge(feedback, Partitioning.FORWARD, back=True))

    def _upstream_of(self, uid: str) -> set[str]:
        seen: set[str] = set()
        stack = [uid]
        while stack:
            for edge in self.operators[stack.pop()].inputs:
                if not edge.back and edge.upstream not in seen:
                    seen.add(edge.upstream)
                    stack.append(edge.upstream)
        return seen

    @property
    def has_loops(self) -> bool:
        return any(e.back for o in self.operators.values() for e in o.inputs)

    def consumers(self, uid: str) -> list[str]:
        return [o.uid for o in self.operators.values() if any(e.upstream == uid for e in o.inputs)]


@dataclass(frozen=True)
class OutputEdge:
    """Where a chain's tail sends its records: the channels of one edge."""

    downstream: str
    """The uid of the downstream chain."""
    partitioning: Partitioning
    key: KeySelector | None
    edge_id: str
    """Names the edge in channel ids: ``UPSTREAM>DOWNSTREAM``."""
    back: bool = False
    """A loop's back edge."""
    side: str | None = None
    """The side output of the tail it carries (``None``: the main output)."""
    port: int = 0
    """The input of the downstream chain's head it feeds (:attr:`Edge.port`)."""


@dataclass(frozen=True)
class Chain:
    """Operators that run in one loop, head first."""

    uid: str
    """The head operator's uid."""
    operators: tuple[Operator, ...]
    inputs: tuple[Edge, ...]
    """The head's input edges (empty for a source chain); their upstream is a chain uid."""
    outputs: tuple[OutputEdge, ...]

    @property
    def is_source(self) -> bool:
        return not self.inputs

    @property
    def name(self) -> str:
        return " -> ".join(o.name for o in self.operators)


def channel_id(edge_id: str, upstream: int, downstream: int) -> str:
    return f"{edge_id}:{upstream}>{downstream}"


@dataclass(frozen=True)
class ExecutionPlan:
    chains: tuple[Chain, ...]
    parallelism: int
    max_parallelism: int

    def chain(self, uid: str) -> Chain:
        for chain in self.chains:
            if chain.uid == uid:
                return chain
        raise KeyError(uid)

    def subtasks(self) -> list[str]:
        """Every subtask of the job (each acknowledges each checkpoint)."""
        return [subtask_name(c.uid, i) for c in self.chains for i in range(self.parallelism)]

    def source_subtasks(self) -> list[str]:
        return [
            subtask_name(c.uid, i)
            for c in self.chains
            if c.is_source
            for i in range(self.parallelism)
        ]

    @property
    def has_loops(self) -> bool:
        return any(out.back for chain in self.chains for out in chain.outputs)

    def back_edge_channels(self, chain: Chain, index: int) -> list[str]:
        """The channel ids subtask ``index`` of ``chain`` reads that are back edges of a loop."""
        return self.input_channels(chain, index, back_only=True)

    def input_channels(self, chain: Chain, index: int, *, back_only: bool = False) -> list[str]:
        """The channel ids subtask ``index`` of ``chain`` reads."""
        return [
            channel
            for out in self._edges_into(chain)
            if out.back or not back_only
            for channel in self._channels_to(out, index)
        ]

    def input_ports(self, chain: Chain, index: int) -> dict[str, int]:
        """The input channels of subtask ``index`` of ``chain``, each with the port of the
        chain's head it feeds (all 0 unless the head takes two inputs)."""
        return {
            channel: out.port
            for out in self._edges_into(chain)
            for channel in self._channels_to(out, index)
        }

    def _edges_into(self, chain: Chain) -> list[OutputEdge]:
        return [
            out
            for upstream in self.chains
            for out in upstream.outputs
            if out.downstream == chain.uid
        ]

    def _channels_to(self, out: OutputEdge, index: int) -> list[str]:
        """The channels of edge ``out`` into subtask ``index``."""
        match out.partitioning:
            case Partitioning.FORWARD:
                return [channel_id(out.edge_id, index, index)]
            case Partitioning.HASH | Partitioning.BROADCAST:
                return [channel_id(out.edge_id, i, index) for i in range(self.parallelism)]
            case unknown:
                assert_never(unknown)

    def output_channels(self, out: OutputEdge, index: int) -> list[tuple[str, int]]:
        """The channels of edge ``out`` from subtask ``index``, with the downstream subtask."""
        match out.partitioning:
            case Partitioning.FORWARD:
                return [(channel_id(out.edge_id, index, index), index)]
            case Partitioning.HASH | Partitioning.BROADCAST:
                return [(channel_id(out.edge_id, index, j), j) for j in range(self.parallelism)]
            case unknown:
                assert_never(unknown)


def subtask_name(chain_uid: str, index: int) -> str:
    return f"{chain_uid}-{index}"


def plan(graph: JobGraph, parallelism: int, max_parallelism: int) -> ExecutionPlan:
    """Chain the operators of ``graph`` and lay out the channels between the chains."""
    if not graph.operators:
        raise GraphError("the job has no operators: read a source first")
    if not any(o.is_source for o in graph.operators.values()):
        raise GraphError("the job has no source")
    if not 1 <= parallelism <= max_parallelism:
        raise GraphError(
            f"parallelism {parallelism} must be between 1 and max_parallelism {max_parallelism}"
        )
    consumers = {uid: graph.consumers(uid) for uid in graph.operators}
    head_of: dict[str, str] = {}
    members: dict[str, list[Operator]] = {}
    for op in graph.operators.values():  # insertion order: inputs come first
        chained = (
            len(op.inputs) == 1
            and op.inputs[0].partitioning is Partitioning.FORWARD
            and op.inputs[0].side is None
            and len(consumers[op.inputs[0].upstream]) == 1
        )
        if chained:
            head = head_of[op.inputs[0].upstream]
            head_of[op.uid] = head
            members[head].append(op)
        else:
            head_of[op.uid] = op.uid
            members[op.uid] = [op]
    chains = []
    for head, ops in members.items():
        tail = ops[-1]
        outputs = []
        for consumer in consumers[tail.uid]:
            if head_of[consumer] == head:
                continue
            for edge in graph.operators[consumer].inputs:
                if edge.upstream == tail.uid:
                    outputs.append(
                        OutputEdge(
                            consumer,
                            edge.partitioning,
                            edge.key,
                            f"{tail.uid}>{consumer}" + (f"/{edge.port}" if edge.port else ""),
                            edge.back,
                            edge.side,
                            edge.port,
                        )
                    )
        inputs = tuple(
            Edge(head_of[e.upstream], e.partitioning, e.key, e.back, e.side, e.port)
            for e in graph.operators[head].inputs
        )
        chains.append(Chain(head, tuple(ops), inputs, tuple(outputs)))
    return ExecutionPlan(tuple(chains), parallelism, max_parallelism)
