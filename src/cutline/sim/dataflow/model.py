"""A deterministic, seeded, I/O-free model of a small dataflow that drives the real barrier
handlers (:class:`~cutline.protocol.BarrierAligner`, :class:`~cutline.protocol.BarrierTracker`)
and the termination detector of loops (:class:`~cutline.protocol.TerminationDetector`) through
random schedules. Its graphs are in :mod:`cutline.sim.dataflow.graph`; what it proves about a
run is in :mod:`cutline.sim.dataflow.check`.

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
  offset and emits ``BarrierItem(n)`` (a source that already ended just keeps its final
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
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeAlias, assert_never

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
from cutline.sim.dataflow.graph import (
    END,
    BarrierItem,
    ChannelId,
    DataflowGraph,
    EndItem,
    Item,
    Record,
)

Mode: TypeAlias = Literal["aligned", "unaligned", "aligned_timeout", "at_least_once"]
MODES: tuple[Mode, ...] = ("aligned", "unaligned", "aligned_timeout", "at_least_once")
"""The checkpointing modes: the three exactly-once ones, then at-least-once."""

Handler: TypeAlias = BarrierAligner[ChannelId] | BarrierTracker[ChannelId]
HandlerFactory: TypeAlias = Callable[
    [str, Sequence[ChannelId], frozenset[ChannelId], Mode], Handler
]
"""``(subtask name, inputs, back edges, mode) -> handler``."""


def default_handler(
    name: str, inputs: Sequence[ChannelId], back_edges: frozenset[ChannelId], mode: Mode
) -> Handler:
    """The real handler for ``mode``."""
    if mode == "at_least_once":
        return BarrierTracker(inputs, back_edges=back_edges, name=name)
    return BarrierAligner(inputs, unaligned=mode == "unaligned", back_edges=back_edges, name=name)


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
    """Everything a run did, for the checker (:mod:`cutline.sim.dataflow.check`)."""

    topology: DataflowGraph
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
    """One run of a :class:`DataflowGraph` under a :class:`DataflowConfig`.

    :param handler_factory: makes each operator's handler (the real ones by default).
    :param restore: start from these snapshots (one per subtask, all of the same checkpoint,
        from :func:`~cutline.sim.dataflow.check.restore_point`) and this content of each
        channel, instead of from scratch.
    """

    def __init__(
        self,
        topology: DataflowGraph,
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
                self.tasks[ch.sender].loop_sent += sum(not isinstance(i, EndItem) for i in items)
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
        elif isinstance(item, BarrierItem) and item.unaligned:
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
        elif isinstance(item, BarrierItem):
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
        barrier = BarrierItem(snap.checkpoint_id, unaligned)
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
    topology: DataflowGraph,
    config: DataflowConfig,
    *,
    handler_factory: HandlerFactory = default_handler,
) -> DataflowRun:
    """Run ``topology`` once under ``config``."""
    return DataflowModel(topology, config, handler_factory=handler_factory).run()
