"""A deterministic, seeded, I/O-free model of a small dataflow that drives the real barrier
handlers (:class:`~cutline.protocol.BarrierAligner`, :class:`~cutline.protocol.BarrierTracker`)
through random schedules, and an independent checker of the checkpoints they take.

The model
=========

**Graph.** A :class:`Topology` is a set of *subtasks* joined by one-way FIFO *channels*.
Sources have no inputs; every other subtask (an *operator*) has a barrier handler. A
subtask with several inputs is a union; one with several outputs hash-partitions its
records over them (the output is a fixed function of the record, so the path of every
record through the graph is fixed). A graph may have a loop: an *iteration head* has
*back edges* coming from *tail* subtasks further on. A record carries a round counter;
a tail sends a record with ``rounds > 0`` back round a back edge with the counter
decremented, and any other record on (or drops it, if it has no other output).

**Channels.** A record on a channel is in one of three places, in FIFO order: the
sender's *output buffer* (at most ``buffer_capacity`` records; unbounded on back edges,
as a loop with bounded buffers all round can deadlock), the *wire* (unbounded, FIFO like
TCP), or the receiver's *input buffer* (at most ``input_capacity`` records). Barriers and
end-of-input markers do not count against the bounds.

**Steps.** A run is a sequence of steps, each chosen at random (from
``random.Random(seed)``) among those enabled:

* a source emits its next record (if the output buffer it goes to has room), or, once
  it emitted them all, its end of input;
* the head of an output buffer moves onto the wire; the head of a wire moves into the
  input buffer (a record only if there is room);
* a subtask consumes the head of one of its input buffers, on a channel its handler
  does not block (a record only if the output buffer it goes to has room): a record is
  added to the subtask's state (a multiset of the records it processed), passed to
  ``message_received`` and forwarded; a barrier is passed to ``barrier_received``; an
  end of input to ``end_of_input``; a subtask whose inputs have all ended sends its own
  end of input on. The iteration heads end together, when the census found the loop quiet
  and none of them is aligning or recording;
* the census of a loop (:class:`~cutline.protocol.TerminationDetector`, as the runtime's
  driver runs it): once every input into the loop from outside it ended, the coordinator
  starts a wave; each subtask of the loop answers at a random later step with its own
  counts of the records and barriers it sent on channels of the loop and consumed from
  them (what a restore put on such a channel counts as sent by its sender); when a wave
  does not find the loop quiet the coordinator starts the next one, at a random step.
  When nothing but the census can move, two waves are enough (the detector's liveness):
  after two such waves the run stops, and a loop that did not end is a deadlock;
* the coordinator triggers checkpoint ``n`` (ids 1, 2, ...): each source records its
  offset and emits ``Barrier(n)`` (a source that already ended just keeps its final
  state); in an acyclic graph while one source is still running, in a loop only while
  every source is (a loop head whose inputs ended cannot take part any more);
* an alignment timer fires (``aligned_timeout`` mode): every alignment that blocked a
  channel arms a timer that fires at a random later step and calls
  ``alignment_timed_out(n)``, which does nothing if the alignment ended meanwhile. With
  ``trigger_timers``, a subtask may also arm the timer of ``n`` when ``n`` is triggered
  (as the runtime does), so that it may fire before any barrier of ``n`` came; a
  subtask whose inputs have all ended has stopped, and its timers no longer fire;
* the coordinator aborts an in-flight checkpoint (``abort_weight > 0``), or delivers the
  notice of an abort to one subtask (``abort(n)``). A checkpoint is aborted when some
  subtask declines it.

**Unaligned barriers.** ``ForwardBarrier(n, unaligned=True)`` puts the barrier ahead of
the records in the sender's output buffer (behind any barrier or end of input still
there: barriers of one channel never pass each other). The records it jumped over are
the *output side* of the channel state of ``n``, and are delivered afterwards as usual.
When it reaches the receiver's input buffer it jumps over the records there in the same
way; the subtask passes those as ``overtaken=`` with the barrier (they too are consumed
afterwards). Records on the wire are never overtaken.

**Actions.** The subtask carries out what its handler returns: ``SnapshotState`` copies
its state and notes how many records it has consumed from each input and emitted on each
output; ``ForwardBarrier`` emits the barrier on every output; ``RecordMessage`` appends to
the *input side* of the channel state; ``SnapshotComplete`` marks its snapshot whole;
``DeclineCheckpoint`` drops it and makes the coordinator abort the checkpoint;
``BlockChannel``/``UnblockChannels`` are checked against what the handler reports. A
subtask that ends without ever hearing of a checkpoint counts as having completed it
with its final state (the cut passes after its end). Anything out of order (a second
snapshot, a recording for a snapshot not taken, a handler error, a deadlock) is a
*problem* of the run.

The checker
===========

:func:`check_checkpoints` checks every checkpoint at every channel ``S -> R`` where both
``S`` and ``R`` completed it: the records ``S`` emitted on the channel before its snapshot
must be exactly, in order, the records ``R`` consumed from it before its snapshot, then
``R``'s recorded input state of the channel, then ``S``'s recorded output state
(exactly-once modes). In ``at_least_once`` mode they must be a prefix of the records ``R``
consumed before its snapshot and recorded (nothing lost, duplicates allowed).

:func:`check_replay` restores every subtask from a globally completed checkpoint (the
states, the sources' offsets, the subtasks that had ended), puts on every channel first
the receiver's recorded input state then the sender's recorded output state, runs to the
end without checkpoints, and compares the final states with those of a failure-free run
(:func:`reference_states`): equal in exactly-once modes, covering them with duplicates
allowed in ``at_least_once``. :func:`check_run` does all of this at once, and also checks
that the run itself ends with the failure-free states.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Literal, NamedTuple, TypeAlias, assert_never

from cutline.protocol import (
    BarrierAligner,
    BarrierTracker,
    BlockChannel,
    DeclineCheckpoint,
    ForwardBarrier,
    NextWave,
    ProtocolError,
    RecordMessage,
    SnapshotComplete,
    SnapshotState,
    Terminated,
    TerminationDetector,
    UnblockChannels,
)

Mode: TypeAlias = Literal["aligned", "unaligned", "aligned_timeout", "at_least_once"]
MODES: tuple[Mode, ...] = ("aligned", "unaligned", "aligned_timeout", "at_least_once")
"""The checkpointing modes: the three exactly-once ones, then at-least-once."""

ChannelId: TypeAlias = tuple[str, str]
"""A channel is named by its ``(sender, receiver)`` pair: at most one channel per pair."""

Handler: TypeAlias = BarrierAligner[ChannelId] | BarrierTracker[ChannelId]
HandlerFactory: TypeAlias = Callable[
    [str, Sequence[ChannelId], frozenset[ChannelId], Mode], Handler
]
"""``(subtask name, inputs, back edges, mode) -> handler``."""


class Record(NamedTuple):
    """A record: emitted by source number ``source`` at offset ``seq``; ``rounds`` is the
    number of times it still goes round the loop."""

    source: int
    seq: int
    rounds: int

    def __str__(self) -> str:
        return f"r{self.source}.{self.seq}" + (f"^{self.rounds}" if self.rounds else "")


@dataclass(frozen=True, slots=True)
class Barrier:
    """``Barrier(checkpoint_id)`` on a channel. In an input buffer, ``overtakes`` is the
    number of records behind an unaligned barrier that it jumped over there (the next ones
    after it, not counting the unaligned barriers that arrived later and jumped too)."""

    checkpoint_id: int
    unaligned: bool = False
    overtakes: int = 0

    def __str__(self) -> str:
        return f"B{self.checkpoint_id}" + ("u" if self.unaligned else "")


class EndOfInput:
    """The end of a channel: nothing follows it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "END"


END = EndOfInput()
Item: TypeAlias = Record | Barrier | EndOfInput


def default_handler(
    name: str, inputs: Sequence[ChannelId], back_edges: frozenset[ChannelId], mode: Mode
) -> Handler:
    """The real handler for ``mode``."""
    if mode == "at_least_once":
        return BarrierTracker(inputs, back_edges=back_edges, name=name)
    return BarrierAligner(inputs, unaligned=mode == "unaligned", back_edges=back_edges, name=name)


# ---------------------------------------------------------------------------- topology


@dataclass(frozen=True)
class Topology:
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
) -> Topology:
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
    return Topology(tuple(src), tuple(operators), tuple(channels), records=records)


def loop_topology(
    rng: random.Random,
    *,
    sources: int = 2,
    heads: int = 1,
    body: int = 1,
    tails: int = 1,
    records: int = 6,
    max_rounds: int = 2,
) -> Topology:
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
    return Topology(
        tuple(src),
        (*hs, *bs, *ts, "out"),
        tuple(channels),
        frozenset(back),
        records=records,
        max_rounds=max_rounds,
    )


def reference_states(topology: Topology) -> dict[str, Counter[Record]]:
    """The final state of every operator in a failure-free run.

    A record's path is a fixed function of the record, and a state is the multiset of
    records processed, so every failure-free schedule ends in these states.
    """
    states: dict[str, Counter[Record]] = {name: Counter() for name in topology.operators}
    for i, source in enumerate(topology.sources):
        for seq in range(topology.records):
            hop = topology.route(source, topology.first_record(i, seq))
            while hop is not None:
                (_, receiver), record = hop
                states[receiver][record] += 1
                hop = topology.route(receiver, record)
    return states


# ------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class DataflowConfig:
    """How one run is scheduled."""

    mode: Mode = "aligned"
    seed: int = 0
    buffer_capacity: int = 2
    """Records an output buffer holds (back edges: unbounded)."""
    input_capacity: int = 2
    """Records an input buffer holds."""
    max_checkpoints: int = 3
    trigger_weight: float = 0.05
    """Weight of the coordinator's trigger step against 1 for a record or barrier step."""
    timeout_weight: float = 0.1
    """Weight of each armed alignment timer (``aligned_timeout`` mode)."""
    trigger_timers: float = 0.0
    """``aligned_timeout`` mode: the chance that an operator subtask arms the timer of a
    checkpoint when it is triggered, rather than when its alignment blocks a channel."""
    abort_weight: float = 0.0
    """Weight of the coordinator aborting the oldest in-flight checkpoint."""
    notice_weight: float = 0.3
    """Weight of delivering each pending abort notice to its subtask."""
    census_weight: float = 0.2
    """Weight of the coordinator starting the next census wave of a loop."""
    count_weight: float = 0.5
    """Weight of each subtask of the loop answering the census wave (counting then)."""
    unaligned_sources: bool = True
    """In ``unaligned`` mode, sources also emit their barriers ahead of their output buffers."""
    max_steps: int = 200_000
    trace: bool = False
    """Keep a line per step in :attr:`DataflowRun.trace` (for debugging)."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; one of {MODES}")
        if self.buffer_capacity < 1 or self.input_capacity < 1:
            raise ValueError("buffer capacities must be at least 1")
        weights = (
            self.trigger_weight,
            self.timeout_weight,
            self.notice_weight,
            self.census_weight,
            self.count_weight,
        )
        if min(weights) <= 0:
            raise ValueError(
                "the trigger, timeout, notice, census and count weights must be positive"
            )
        if self.abort_weight < 0:
            raise ValueError("abort_weight must not be negative")
        if not 0 <= self.trigger_timers <= 1:
            raise ValueError("trigger_timers is a probability")

    @property
    def exactly_once(self) -> bool:
        return self.mode != "at_least_once"


# ------------------------------------------------------------------------------ results


@dataclass
class TaskSnapshot:
    """What one subtask took for one checkpoint."""

    checkpoint_id: int
    state: Counter[Record]
    """The operator's state (empty for a source)."""
    offset: int
    """For a source, the records emitted so far (its read position)."""
    consumed: dict[ChannelId, int]
    """Per input, how many records the subtask had consumed from it."""
    emitted: dict[ChannelId, int]
    """Per output, how many records the subtask had emitted on it."""
    input_state: dict[ChannelId, list[Record]] = field(default_factory=dict)
    """The recorded input side of the channel state (``RecordMessage``)."""
    output_state: dict[ChannelId, list[Record]] = field(default_factory=dict)
    """The records an unaligned barrier overtook in the output buffers."""
    ended: frozenset[ChannelId] = frozenset()
    """The inputs whose end of input the subtask had consumed."""
    finished: bool = False
    """The subtask had ended without hearing of the checkpoint: the cut is at its end."""
    forwarded: bool = False
    complete: bool = False
    declined: bool = False


@dataclass
class DataflowRun:
    """Everything a run did, for the checkers."""

    topology: Topology
    config: DataflowConfig
    consumed: dict[str, dict[ChannelId, list[Record]]]
    """Per subtask and input, every record consumed, in order."""
    emitted: dict[str, dict[ChannelId, list[Record]]]
    """Per subtask and output, every record emitted, in order."""
    snapshots: dict[str, dict[int, TaskSnapshot]]
    triggered: list[int]
    completed: list[int]
    """The checkpoints every subtask completed and the coordinator did not abort."""
    aborted: set[int]
    final_states: dict[str, Counter[Record]]
    problems: list[str]
    """What went wrong while running (handler errors, out-of-order actions, deadlock)."""
    stats: Counter[str]
    steps: int
    trace: list[str]


# -------------------------------------------------------------------------------- model


class _Channel:
    __slots__ = (
        "arrive_step",
        "back_edge",
        "cid",
        "consume_step",
        "in_buf",
        "in_capacity",
        "in_loop",
        "in_records",
        "out_buf",
        "out_capacity",
        "out_records",
        "receiver",
        "send_step",
        "sender",
        "wire",
    )

    def __init__(
        self, cid: ChannelId, back_edge: bool, in_loop: bool, out_capacity: int, in_capacity: int
    ):
        self.cid = cid
        self.sender, self.receiver = cid
        self.back_edge = back_edge
        self.in_loop = in_loop
        """Both ends are in the loop: what moves on it is counted for the census."""
        self.out_capacity: int | None = None if back_edge else out_capacity
        self.in_capacity = in_capacity
        self.out_buf: deque[Item] = deque()
        self.wire: deque[Item] = deque()
        self.in_buf: deque[Item] = deque()
        self.out_records = 0
        self.in_records = 0
        self.send_step = ("send", cid)
        self.arrive_step = ("arrive", cid)
        self.consume_step = ("consume", cid)

    def has_room(self) -> bool:
        return self.out_capacity is None or self.out_records < self.out_capacity

    def empty(self) -> bool:
        return not (self.out_buf or self.wire or self.in_buf)

    def __str__(self) -> str:
        def show(q: deque[Item]) -> str:
            return " ".join(map(str, q))

        return (
            f"{self.sender}->{self.receiver} [{show(self.out_buf)} | {show(self.wire)} | "
            f"{show(self.in_buf)}]"
        )


def _after_last_control(buf: deque[Item]) -> int:
    """The index just after the last barrier or end of input in ``buf`` (0 if none)."""
    for i in range(len(buf) - 1, -1, -1):
        if not isinstance(buf[i], Record):
            return i + 1
    return 0


class _Task:
    def __init__(
        self,
        name: str,
        index: int,
        inputs: tuple[ChannelId, ...],
        outputs: tuple[ChannelId, ...],
        handler: Handler | None,
    ) -> None:
        self.name = name
        self.index = index
        """The source number (sources only)."""
        self.inputs = inputs
        self.outputs = outputs
        self.handler = handler
        self.state: Counter[Record] = Counter()
        self.offset = 0
        self.ended: set[ChannelId] = set()
        self.finished = False
        """It sent its end of input on."""
        self.consumed: dict[ChannelId, list[Record]] = {c: [] for c in inputs}
        self.emitted: dict[ChannelId, list[Record]] = {c: [] for c in outputs}
        self.snapshots: dict[int, TaskSnapshot] = {}
        self.heard: set[int] = set()
        """Checkpoints it received a barrier, an abort notice or an action of."""
        self.blocked: list[ChannelId] = []
        """The channels blocked by ``BlockChannel`` and not unblocked since."""
        self.loop_sent = 0
        """Records and barriers it put on a channel of the loop (its count for the census)."""
        self.loop_processed = 0
        """Records and barriers it consumed from a channel of the loop."""

    @property
    def is_source(self) -> bool:
        return self.handler is None

    def take(self, checkpoint_id: int, finished: bool) -> TaskSnapshot:
        snap = TaskSnapshot(
            checkpoint_id,
            Counter(self.state),
            self.offset,
            {c: len(v) for c, v in self.consumed.items()},
            {c: len(v) for c, v in self.emitted.items()},
            ended=frozenset(self.ended),
            finished=finished,
        )
        self.snapshots[checkpoint_id] = snap
        return snap


class _Halt(Exception):
    """The run cannot go on (a problem was recorded)."""


_Step: TypeAlias = tuple[Any, ...]


class DataflowModel:
    """One run of a :class:`Topology` under a :class:`DataflowConfig`.

    :param handler_factory: makes each operator's handler (the real ones by default).
    :param restore: start from these snapshots (one per subtask, all of the same checkpoint,
        from :func:`restore_point`) and this content of each channel, instead of from
        scratch.
    """

    def __init__(
        self,
        topology: Topology,
        config: DataflowConfig,
        *,
        handler_factory: HandlerFactory = default_handler,
        restore: tuple[Mapping[str, TaskSnapshot], Mapping[ChannelId, Sequence[Item]]]
        | None = None,
    ) -> None:
        self.topology = topology
        self.config = config
        self.rng = random.Random(config.seed)
        loop = topology.loop
        self.channels = {
            c: _Channel(
                c,
                c in topology.back_edges,
                c[0] in loop and c[1] in loop,
                config.buffer_capacity,
                config.input_capacity,
            )
            for c in topology.channels
        }
        self.channel_list = list(self.channels.values())
        self.tasks: dict[str, _Task] = {}
        for i, name in enumerate(topology.sources):
            self.tasks[name] = _Task(name, i, (), topology.outputs(name), None)
        back = topology.back_edges
        for name in topology.operators:
            inputs = topology.inputs(name)
            handler = handler_factory(name, inputs, back & set(inputs), config.mode)
            self.tasks[name] = _Task(name, -1, inputs, topology.outputs(name), handler)
        self.sources = [self.tasks[n] for n in topology.sources]
        self.heads = [self.tasks[n] for n in topology.heads]
        self.loop_channels = [ch for ch in self.channel_list if ch.in_loop]
        self.loop_entries = [c for c in topology.channels if c[0] not in loop and c[1] in loop]
        self.loop_ended = not self.heads
        self.loop_names = tuple(n for n in topology.subtasks if n in loop)
        self.census: TerminationDetector[str] | None = (
            TerminationDetector(self.loop_names) if self.heads else None
        )
        """The coordinator's termination detector of the loop (``None``: no loop)."""
        self.census_asked: list[tuple[str, int]] = []
        """The census questions not yet answered: (subtask, wave)."""
        self.census_open = False
        self.loop_quiet = False
        """The detector said ``Terminated``: nothing moves in the loop, nor ever will."""
        self.frozen = False
        """Nothing but the census could move at the last pick."""
        self.frozen_waves = 0
        """Census waves started while nothing else could move (two show a quiet loop)."""
        self.next_id = 1
        self.triggered: list[int] = []
        self.completed: list[int] = []
        self.aborted: set[int] = set()
        self.timers: list[tuple[str, int]] = []
        self.notices: list[tuple[str, int]] = []
        self.problems: list[str] = []
        self.stats: Counter[str] = Counter()
        self.trace: list[str] = []
        self.steps = 0
        self._routes: dict[tuple[str, Record], tuple[ChannelId, Record] | None] = {}
        if restore is not None:
            self._restore(*restore)

    # ---------------------------------------------------------------------- restore

    def _restore(
        self, snapshots: Mapping[str, TaskSnapshot], contents: Mapping[ChannelId, Sequence[Item]]
    ) -> None:
        for name, task in self.tasks.items():
            snap = snapshots[name]
            task.state = Counter(snap.state)
            task.offset = snap.offset
            if snap.finished:
                task.finished = True
                task.ended = set(task.inputs)
        for cid, items in contents.items():
            ch = self.channels[cid]
            ch.wire.extend(items)
            # in flight at the checkpoint, so sent again in this run: the census must see them
            if ch.in_loop:
                self.tasks[ch.sender].loop_sent += sum(not isinstance(i, EndOfInput) for i in items)
        if self.heads and all(h.finished for h in self.heads):
            self.loop_ended = True

    # ------------------------------------------------------------------------- run

    def run(self) -> DataflowRun:
        """Run to the end (or to the first problem that stops it) and return the results."""
        cfg = self.config
        try:
            while self.steps < cfg.max_steps:
                step = self._pick()
                if step is None:
                    break
                self.steps += 1
                if cfg.trace:
                    self.trace.append(f"{self.steps}: {' '.join(map(str, step))}")
                self._do(step)
            else:
                self._problem(f"no end after {cfg.max_steps} steps")
            self._check_end()
        except _Halt:
            pass
        return DataflowRun(
            topology=self.topology,
            config=cfg,
            consumed={n: t.consumed for n, t in self.tasks.items()},
            emitted={n: t.emitted for n, t in self.tasks.items()},
            snapshots={n: t.snapshots for n, t in self.tasks.items()},
            triggered=self.triggered,
            completed=self.completed,
            aborted=self.aborted,
            final_states={t.name: t.state for t in self.tasks.values() if not t.is_source},
            problems=self.problems,
            stats=self.stats,
            steps=self.steps,
            trace=self.trace,
        )

    def _problem(self, text: str, halt: bool = False) -> None:
        self.problems.append(f"step {self.steps}: {text}")
        if halt:
            raise _Halt

    def _check_end(self) -> None:
        for task in self.tasks.values():
            if not task.finished or len(task.ended) != len(task.inputs):
                waiting = [f"{c[0]}->{c[1]}" for c in task.inputs if c not in task.ended]
                blocked = [f"{c[0]}->{c[1]}" for c in task.blocked]
                stuck = [str(ch) for ch in self.channel_list if not ch.empty()]
                self._problem(
                    f"deadlock: {task.name} has not ended (inputs not ended: {waiting}, "
                    f"blocked: {blocked}); channels: {stuck}"
                )
                return
        if any(task.offset != self.topology.records for task in self.sources):
            self._problem("a source ended before emitting all its records")

    # ----------------------------------------------------------------------- steps

    def _enabled(self) -> tuple[list[_Step], list[_Step], list[float]]:
        """The steps that can be taken now: those of weight 1 (records and barriers moving),
        then the others with their weights."""
        cfg = self.config
        topo = self.topology
        unit: list[_Step] = []
        for task in self.sources:
            if task.finished:
                continue
            if task.offset < topo.records:
                hop = self._route(task.name, topo.first_record(task.index, task.offset))
                if hop is None or self.channels[hop[0]].has_room():
                    unit.append(("emit", task.name))
            else:
                unit.append(("end", task.name))
        tasks = self.tasks
        for ch in self.channel_list:
            if ch.out_buf:
                unit.append(ch.send_step)
            if ch.wire and (not isinstance(ch.wire[0], Record) or ch.in_records < ch.in_capacity):
                unit.append(ch.arrive_step)
            if ch.in_buf:
                task = tasks[ch.receiver]
                handler = task.handler
                assert handler is not None
                if handler.is_blocked(ch.cid):
                    continue
                head = ch.in_buf[0]
                if isinstance(head, Record):
                    hop = self._route(task.name, head)
                    if hop is not None and not self.channels[hop[0]].has_room():
                        continue
                unit.append(ch.consume_step)
        if not self.loop_ended and self.loop_quiet and self._heads_idle():
            unit.append(("loop_end",))
        rare: list[_Step] = []
        weights: list[float] = []
        if self.next_id <= cfg.max_checkpoints and self._may_trigger():
            rare.append(("trigger",))
            weights.append(cfg.trigger_weight)
        for name, n in self.timers:
            rare.append(("timeout", name, n))
            weights.append(cfg.timeout_weight)
        for name, n in self.notices:
            rare.append(("notice", name, n))
            weights.append(cfg.notice_weight)
        if cfg.abort_weight > 0 and self._in_flight():
            rare.append(("abort",))
            weights.append(cfg.abort_weight)
        self.frozen = not (unit or rare)
        for name, wave in self.census_asked:
            rare.append(("count", name, wave))
            weights.append(cfg.count_weight)
        if self._census_may_start() and (not self.frozen or self.frozen_waves < 2):
            rare.append(("census",))
            weights.append(cfg.census_weight)
        return unit, rare, weights

    def _pick(self) -> _Step | None:
        """A step chosen at random among the enabled ones, by weight; ``None`` if none is."""
        unit, rare, weights = self._enabled()
        if not rare:
            return unit[int(self.rng.random() * len(unit))] if unit else None
        x = self.rng.random() * (len(unit) + sum(weights))
        if x < len(unit):
            return unit[int(x)]
        x -= len(unit)
        for step, weight in zip(rare, weights, strict=True):
            if x < weight:
                return step
            x -= weight
        return rare[-1]

    def _route(self, name: str, record: Record) -> tuple[ChannelId, Record] | None:
        key = (name, record)
        try:
            return self._routes[key]
        except KeyError:
            hop = self._routes[key] = self.topology.route(name, record)
            return hop

    def _may_trigger(self) -> bool:
        live = [not s.finished for s in self.sources]
        return all(live) if self.heads else any(live)

    def _in_flight(self) -> list[int]:
        done = set(self.completed)
        return [n for n in self.triggered if n not in done and n not in self.aborted]

    def _census_may_start(self) -> bool:
        """The coordinator may start the next census wave of the loop: none is open, the loop
        was not found quiet yet, and every input into the loop from outside it ended (the
        subtasks that consumed those ends told it, as the runtime's sources say they are
        exhausted): from then on, only what moves in the loop makes anything move in it."""
        if self.census is None or self.census_open or self.loop_quiet:
            return False
        tasks = self.tasks
        return all(cid in tasks[cid[1]].ended for cid in self.loop_entries)

    def _heads_idle(self) -> bool:
        """Each head, told the loop is quiet, ends its outputs once it is neither aligning nor
        recording (the model has no final checkpoint to wait for, as the runtime has)."""
        for head in self.heads:
            handler = head.handler
            if handler is None or handler.recording:
                return False
            if isinstance(handler, BarrierAligner) and handler.pending_checkpoint is not None:
                return False
            if isinstance(handler, BarrierTracker) and handler.pending_checkpoints:
                return False
        return True

    def _do(self, step: _Step) -> None:
        kind = step[0]
        if kind not in ("census", "count"):
            self.frozen_waves = 0
        if kind == "emit":
            task = self.tasks[step[1]]
            record = self.topology.first_record(task.index, task.offset)
            task.offset += 1
            self._forward(task, record)
        elif kind == "end":
            self._finish(self.tasks[step[1]])
        elif kind == "send":
            self._send(self.channels[step[1]])
        elif kind == "arrive":
            self._arrive(self.channels[step[1]])
        elif kind == "consume":
            self._consume(self.channels[step[1]])
        elif kind == "trigger":
            self._trigger()
        elif kind == "timeout":
            self.timers.remove((step[1], step[2]))
            self._timeout(self.tasks[step[1]], step[2])
        elif kind == "notice":
            self.notices.remove((step[1], step[2]))
            task = self.tasks[step[1]]
            assert task.handler is not None
            task.heard.add(step[2])
            self._call(task, f"abort({step[2]})", task.handler.abort, step[2])
        elif kind == "abort":
            self._abort(self._in_flight()[0], "the coordinator aborted it")
        elif kind == "census":
            self._census()
        elif kind == "count":
            self.census_asked.remove((step[1], step[2]))
            self._count(self.tasks[step[1]], step[2])
        elif kind == "loop_end":
            self.loop_ended = True
            for head in self.heads:
                self._finish(head)
        else:  # pragma: no cover - the steps above are all there are
            raise AssertionError(kind)

    # ---------------------------------------------------------------- record flow

    def _forward(self, task: _Task, record: Record) -> None:
        hop = self._route(task.name, record)
        if hop is None:
            return
        cid, out = hop
        ch = self.channels[cid]
        ch.out_buf.append(out)
        ch.out_records += 1
        task.emitted[cid].append(out)
        task.loop_sent += ch.in_loop

    def _send(self, ch: _Channel) -> None:
        item = ch.out_buf.popleft()
        if isinstance(item, Record):
            ch.out_records -= 1
        ch.wire.append(item)

    def _arrive(self, ch: _Channel) -> None:
        item = ch.wire.popleft()
        if isinstance(item, Record):
            ch.in_records += 1
            ch.in_buf.append(item)
        elif isinstance(item, Barrier) and item.unaligned:
            at = _after_last_control(ch.in_buf)
            ch.in_buf.insert(at, replace(item, overtakes=len(ch.in_buf) - at))
        else:
            ch.in_buf.append(item)

    def _consume(self, ch: _Channel) -> None:
        task = self.tasks[ch.receiver]
        handler = task.handler
        assert handler is not None
        item = ch.in_buf.popleft()
        cid = ch.cid
        if isinstance(item, Record):
            if task.finished:
                self._problem(f"{task.name} consumes {item} after its end of input", halt=True)
            ch.in_records -= 1
            task.consumed[cid].append(item)
            task.state[item] += 1
            self._call(task, f"message_received({item})", handler.message_received, cid, item)
            self._forward(task, item)
            task.loop_processed += ch.in_loop
        elif isinstance(item, Barrier):
            n = item.checkpoint_id
            # the records it jumped over are right behind it, but for the barriers that
            # arrived after it and jumped over them too
            behind = (r for r in ch.in_buf if isinstance(r, Record))
            overtaken = [next(behind) for _ in range(item.overtakes)]
            task.heard.add(n)
            if overtaken:
                self.stats["overtaken records"] += len(overtaken)
            if (
                item.unaligned
                and isinstance(handler, BarrierAligner)
                and handler.pending_checkpoint == n
            ):
                self.stats["alignments switched by an unaligned barrier"] += 1
            if isinstance(handler, BarrierTracker) and len(handler.pending_checkpoints) > 1:
                self.stats["barriers with several checkpoints pending"] += 1
            self._call(
                task,
                f"barrier_received({n}, {cid[0]}->{cid[1]}, unaligned={item.unaligned}, "
                f"overtaken={[str(r) for r in overtaken]})",
                handler.barrier_received,
                n,
                cid,
                unaligned=item.unaligned,
                overtaken=overtaken,
            )
            task.loop_processed += ch.in_loop
        else:
            task.ended.add(cid)
            actions = self._call(
                task, f"end_of_input({cid[0]}->{cid[1]})", handler.end_of_input, cid
            )
            if any(isinstance(a, SnapshotComplete) for a in actions):
                self.stats["snapshots completed by an end of input"] += 1
            if len(task.ended) == len(task.inputs) and not task.finished and task not in self.heads:
                self._finish(task)

    def _finish(self, task: _Task) -> None:
        """``task`` sends its end of input on; checkpoints it never heard of count as taken
        with its final state."""
        task.finished = True
        for cid in task.outputs:
            self.channels[cid].out_buf.append(END)
        for n in self.triggered:
            if n not in task.heard and n not in task.snapshots:
                task.take(n, finished=True).complete = True
                self.stats["finished snapshots"] += 1
                self._check_global(n)

    # ---------------------------------------------------------------- checkpoints

    def _trigger(self) -> None:
        n = self.next_id
        self.next_id += 1
        self.triggered.append(n)
        unaligned = self.config.mode == "unaligned" and self.config.unaligned_sources
        timers = self.config.mode == "aligned_timeout" and self.config.trigger_timers > 0
        for task in self.tasks.values():
            if task.finished:
                task.take(n, finished=True).complete = True
                self.stats["finished snapshots"] += 1
            elif task.is_source:
                task.heard.add(n)
                snap = task.take(n, finished=False)
                self._emit_barrier(task, snap, unaligned)
                snap.complete = True
            elif timers and self.rng.random() < self.config.trigger_timers:
                self.timers.append((task.name, n))
        self._check_global(n)

    def _emit_barrier(self, task: _Task, snap: TaskSnapshot, unaligned: bool) -> None:
        snap.forwarded = True
        barrier = Barrier(snap.checkpoint_id, unaligned)
        for cid in task.outputs:
            ch = self.channels[cid]
            task.loop_sent += ch.in_loop
            buf = ch.out_buf
            if unaligned:
                at = _after_last_control(buf)
                overtaken = [r for r in list(buf)[at:] if isinstance(r, Record)]
                snap.output_state[cid] = overtaken
                self.stats["output state records"] += len(overtaken)
                buf.insert(at, barrier)
            else:
                buf.append(barrier)

    def _timeout(self, task: _Task, n: int) -> None:
        handler = task.handler
        assert isinstance(handler, BarrierAligner)
        if len(task.ended) == len(task.inputs):
            return  # the subtask has stopped
        pending = handler.pending_checkpoint
        actions = self._call(task, f"alignment_timed_out({n})", handler.alignment_timed_out, n)
        if pending == n:
            self.stats["alignment timeouts"] += 1
        elif actions:
            self.stats["checkpoints initiated by a timeout"] += 1
        else:
            self.stats["stale timers"] += 1

    def _abort(self, n: int, why: str) -> None:
        if n in self.aborted or n in self.completed:
            return
        self.aborted.add(n)
        self.stats["aborted checkpoints"] += 1
        if self.config.trace:
            self.trace.append(f"  coordinator aborts {n}: {why}")
        for task in self.tasks.values():
            if not task.is_source:
                self.notices.append((task.name, n))

    def _check_global(self, n: int) -> None:
        if n in self.aborted or n in self.completed:
            return
        for task in self.tasks.values():
            snap = task.snapshots.get(n)
            if snap is None or not snap.complete:
                return
        self.completed.append(n)
        self.stats["completed checkpoints"] += 1

    # ------------------------------------------------------------------ the census

    def _census(self) -> None:
        """The coordinator asks every subtask of the loop for its counts."""
        assert self.census is not None
        wave = self.census.start_wave().wave
        self.census_open = True
        self.census_asked += [(name, wave) for name in self.loop_names]
        if self.frozen:
            self.frozen_waves += 1

    def _count(self, task: _Task, wave: int) -> None:
        """``task`` answers wave ``wave`` with what it counted until now."""
        assert self.census is not None
        try:
            actions = self.census.on_counts(task.name, wave, task.loop_sent, task.loop_processed)
        except ProtocolError as e:
            self._problem(f"census: {task.name}'s counts raised {type(e).__name__}: {e}", halt=True)
            raise  # pragma: no cover - _problem raised _Halt
        for action in actions:
            self.census_open = False
            self.stats["census waves"] += 1
            if self.config.trace:
                self.trace.append(f"  census -> {action}")
            match action:
                case Terminated():
                    self.loop_quiet = True
                case NextWave():
                    pass
                case _:
                    assert_never(action)

    # -------------------------------------------------------------------- actions

    def _call(
        self, task: _Task, event: str, method: Callable[..., Any], *args: Any, **kw: Any
    ) -> Sequence[Any]:
        """Feed one event to ``task``'s handler and carry out the actions it returns."""
        try:
            actions: Sequence[Any] = method(*args, **kw)
        except ProtocolError as e:
            self._problem(f"{task.name}: {event} raised {type(e).__name__}: {e}", halt=True)
            raise  # pragma: no cover - _problem raised _Halt
        if self.config.trace:
            self.trace.append(f"  {task.name}.{event} -> {list(actions)}")
        self._apply(task, actions)
        return actions

    def _apply(self, task: _Task, actions: Iterable[Any]) -> None:
        stats = self.stats
        for action in actions:
            if isinstance(action, SnapshotState):
                n = action.checkpoint_id
                task.heard.add(n)
                if n in task.snapshots:
                    self._problem(f"{task.name} snapshots checkpoint {n} a second time")
                    continue
                if task.finished:
                    self._problem(f"{task.name} snapshots checkpoint {n} after it ended")
                task.take(n, finished=False)
            elif isinstance(action, ForwardBarrier):
                snap = self._snapshot_of(task, action.checkpoint_id, action)
                if snap is None:
                    continue
                if snap.forwarded:
                    self._problem(f"{task.name} forwards barrier {snap.checkpoint_id} twice")
                if action.unaligned and not self.config.exactly_once:
                    self._problem(f"{task.name} forwards an unaligned barrier at least once")
                if task.finished:
                    self._problem(f"{task.name} forwards a barrier after its end of input")
                self._emit_barrier(task, snap, action.unaligned)
            elif isinstance(action, RecordMessage):
                snap = self._snapshot_of(task, action.snapshot_id, action)
                if snap is None:
                    continue
                if action.channel not in task.inputs:
                    self._problem(f"{task.name} records {action!r} on a channel not its input")
                    continue
                snap.input_state.setdefault(action.channel, []).append(action.message)
                stats["recorded records"] += 1
                if action.channel in self.topology.back_edges:
                    stats["recorded back-edge records"] += 1
            elif isinstance(action, SnapshotComplete):
                snap = self._snapshot_of(task, action.snapshot_id, action)
                if snap is None:
                    continue
                if not snap.forwarded and task.outputs:
                    self._problem(f"{task.name} completes {snap.checkpoint_id} unforwarded")
                snap.complete = True
                if snap.input_state:
                    stats["snapshots with recorded input"] += 1
                self._check_global(snap.checkpoint_id)
            elif isinstance(action, DeclineCheckpoint):
                n = action.checkpoint_id
                task.heard.add(n)
                stats["declines"] += 1
                snap = task.snapshots.get(n)
                if snap is not None:
                    if snap.complete:
                        self._problem(f"{task.name} declines {n} after completing it")
                    snap.declined = True
                    stats["declines after a snapshot"] += 1
                self._abort(n, f"{task.name} declined it: {action.reason}")
            elif isinstance(action, BlockChannel):
                if action.channel in task.blocked or action.channel not in task.inputs:
                    self._problem(f"{task.name}: bad {action!r}")
                task.blocked.append(action.channel)
                stats["blocked channels"] += 1
                if action.channel in self.topology.back_edges:
                    stats["blocked back edges"] += 1
                handler = task.handler
                if (
                    self.config.mode == "aligned_timeout"
                    and isinstance(handler, BarrierAligner)
                    and handler.pending_checkpoint is not None
                    and len(task.blocked) == 1
                ):
                    self.timers.append((task.name, handler.pending_checkpoint))
            elif isinstance(action, UnblockChannels):
                for cid in action.channels:
                    if cid in task.blocked:
                        task.blocked.remove(cid)
                    else:
                        self._problem(f"{task.name} unblocks {cid[0]}->{cid[1]}, not blocked")
            else:
                self._problem(f"{task.name}: unknown action {action!r}")
        handler = task.handler
        if handler is not None and set(task.blocked) != set(handler.blocked_channels):
            self._problem(
                f"{task.name}: the actions blocked {task.blocked} but the handler reports "
                f"{list(handler.blocked_channels)}"
            )

    def _snapshot_of(self, task: _Task, n: int, action: object) -> TaskSnapshot | None:
        snap = task.snapshots.get(n)
        if snap is None or snap.finished:
            self._problem(f"{task.name}: {action!r} without SnapshotState({n}) before")
            return None
        if snap.complete and not isinstance(action, ForwardBarrier):
            self._problem(f"{task.name}: {action!r} after SnapshotComplete({n})")
            return None
        if snap.declined:
            self._problem(f"{task.name}: {action!r} after declining {n}")
            return None
        return snap


def run_dataflow(
    topology: Topology,
    config: DataflowConfig,
    *,
    handler_factory: HandlerFactory = default_handler,
) -> DataflowRun:
    """Run ``topology`` once under ``config``."""
    return DataflowModel(topology, config, handler_factory=handler_factory).run()


# ------------------------------------------------------------------------------ checker


def _show(records: Sequence[Record]) -> str:
    return "[" + " ".join(map(str, records)) + "]"


def check_checkpoints(run: DataflowRun) -> list[str]:
    """The channel-state identity for every checkpoint at every channel whose two ends
    completed it (see the module docstring), plus: a checkpoint counted as completed is
    complete at every subtask. Returns the problems found, as sentences."""
    problems: list[str] = []
    exactly_once = run.config.exactly_once
    topo = run.topology
    for n in run.triggered:
        if n in run.completed:
            missing = [s for s in topo.subtasks if not _complete(run, s, n)]
            if missing:
                problems.append(f"checkpoint {n} counted complete but not at {missing}")
        for cid in topo.channels:
            sender, receiver = cid
            ss = run.snapshots[sender].get(n)
            rs = run.snapshots[receiver].get(n)
            if ss is None or rs is None or not _complete(run, sender, n):
                continue
            if not _complete(run, receiver, n):
                continue
            sent = run.emitted[sender][cid][: ss.emitted[cid]]
            consumed = run.consumed[receiver][cid][: rs.consumed[cid]]
            recorded_in = rs.input_state.get(cid, [])
            recorded_out = ss.output_state.get(cid, [])
            cut = consumed + recorded_in + recorded_out
            ok = cut == sent if exactly_once else cut[: len(sent)] == sent and not recorded_out
            if not ok:
                problems.append(
                    f"checkpoint {n}, channel {sender}->{receiver}: {sender} sent "
                    f"{_show(sent)} before its snapshot, but the cut holds {_show(cut)} "
                    f"(consumed by {receiver} before its snapshot {_show(consumed)}, recorded "
                    f"by {receiver} {_show(recorded_in)}, recorded by {sender} "
                    f"{_show(recorded_out)})"
                )
        for name in topo.subtasks:
            snap = run.snapshots[name].get(n)
            if snap is not None and snap.complete:
                extra = set(snap.input_state) - set(topo.inputs(name))
                if extra:
                    problems.append(f"checkpoint {n}: {name} recorded channels {extra}")
    return problems


def _complete(run: DataflowRun, name: str, n: int) -> bool:
    snap = run.snapshots[name].get(n)
    return snap is not None and snap.complete and not snap.declined


def restore_point(
    run: DataflowRun, checkpoint_id: int
) -> tuple[dict[str, TaskSnapshot], dict[ChannelId, list[Item]]]:
    """The snapshots of checkpoint ``checkpoint_id`` (completed at every subtask) and the
    content of each channel to restore: the receiver's recorded input state, then the
    sender's recorded output state, then the end of input if the sender had ended. A
    channel into a subtask that had ended is left empty."""
    snaps = {name: run.snapshots[name][checkpoint_id] for name in run.topology.subtasks}
    contents: dict[ChannelId, list[Item]] = {}
    for cid in run.topology.channels:
        sender, receiver = cid
        if snaps[receiver].finished:
            continue
        items: list[Item] = [*snaps[receiver].input_state.get(cid, [])]
        items += snaps[sender].output_state.get(cid, [])
        if snaps[sender].finished:
            items.append(END)
        contents[cid] = items
    return snaps, contents


def replay(run: DataflowRun, checkpoint_id: int, *, seed: int | None = None) -> DataflowRun:
    """Restore every subtask from ``checkpoint_id`` and run to the end without
    checkpoints (with another schedule: ``seed``, by default derived from the run's)."""
    if checkpoint_id not in run.completed:
        raise ValueError(f"checkpoint {checkpoint_id} did not complete")
    cfg = run.config
    config = replace(
        cfg,
        seed=cfg.seed * 1009 + checkpoint_id if seed is None else seed,
        max_checkpoints=0,
        abort_weight=0.0,
    )
    return DataflowModel(run.topology, config, restore=restore_point(run, checkpoint_id)).run()


def compare_states(
    got: Mapping[str, Counter[Record]],
    want: Mapping[str, Counter[Record]],
    *,
    exactly_once: bool,
    what: str,
) -> list[str]:
    """Problems where the final states ``got`` differ from the failure-free ``want``:
    any difference (exactly-once), or a record missing or foreign (at-least-once)."""
    problems: list[str] = []
    for name, ref in want.items():
        state = got.get(name, Counter())
        missing = sorted(r for r in ref if state[r] < ref[r])
        foreign = sorted(r for r in state if r not in ref)
        dup = sorted(r for r in ref if state[r] > ref[r]) if exactly_once else []
        for label, records in (("missing", missing), ("duplicated", dup), ("foreign", foreign)):
            if records:
                problems.append(f"{what}: {name} has {label} records {_show(records[:8])}")
    return problems


def check_replay(run: DataflowRun, checkpoint_id: int, *, seed: int | None = None) -> list[str]:
    """Replay from ``checkpoint_id`` and compare the final states with the failure-free
    ones."""
    again = replay(run, checkpoint_id, seed=seed)
    what = f"replay from checkpoint {checkpoint_id}"
    problems = [f"{what}: {p}" for p in again.problems]
    return problems + compare_states(
        again.final_states,
        reference_states(run.topology),
        exactly_once=run.config.exactly_once,
        what=what,
    )


def check_run(run: DataflowRun, *, replays: Literal["all", "last", "none"] = "all") -> list[str]:
    """Every check at once: the run's own problems, its final states against the
    failure-free ones (every mode processes each record exactly once without failures),
    :func:`check_checkpoints`, and :func:`check_replay` from every completed checkpoint
    (or the last one, or none)."""
    problems = list(run.problems)
    if problems:
        return problems
    problems += compare_states(
        run.final_states, reference_states(run.topology), exactly_once=True, what="the run"
    )
    problems += check_checkpoints(run)
    chosen = run.completed if replays == "all" else run.completed[-1:] if replays == "last" else []
    for n in chosen:
        problems += check_replay(run, n)
    return problems
