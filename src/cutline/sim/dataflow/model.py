"""A deterministic, seeded, I/O-free model of a small dataflow that drives the real barrier
handlers (:class:`~cutline.protocol.BarrierAligner`, :class:`~cutline.protocol.BarrierTracker`)
and the termination detector of loops (:class:`~cutline.protocol.TerminationDetector`) through
random schedules. Its graphs are in :mod:`cutline.sim.dataflow.graph`, what a run is given
(the mode, the schedule's weights) in :mod:`cutline.sim.dataflow.config`, what it is made of
in :mod:`cutline.sim.dataflow.state` and its checkpoints in
:mod:`cutline.sim.dataflow.checkpoints`; what it proves about a run is in
:mod:`cutline.sim.dataflow.check`.

**Channels.** A record on a channel is in one of three places, in FIFO order: the
sender's *output buffer*, the *wire*, or the receiver's *input buffer* (bounded as
:class:`~cutline.sim.dataflow.state.Channel` says).

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

**Actions.** The subtask carries out what its handler returns, each checked
(:class:`~cutline.sim.dataflow.checkpoints.Checkpoints` feeds the handlers and carries out
their actions). Anything out of order (a second snapshot, a recording for a snapshot not
taken, a handler error, a deadlock) is a *problem* of the run.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeAlias, assert_never

from cutline.protocol import (
    BarrierAligner,
    BarrierTracker,
    NextWave,
    ProtocolError,
    SnapshotComplete,
    Terminated,
    TerminationDetector,
)
from cutline.sim.dataflow.checkpoints import Checkpoints
from cutline.sim.dataflow.config import DataflowConfig, HandlerFactory, default_handler
from cutline.sim.dataflow.graph import (
    END,
    BarrierItem,
    ChannelId,
    DataflowGraph,
    EndItem,
    Item,
    Record,
)
from cutline.sim.dataflow.state import (
    Channel,
    DataflowRun,
    Step,
    Task,
    TaskSnapshot,
    after_last_control,
)


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
            c: Channel(
                c,
                c in topology.back_edges,
                c[0] in loop and c[1] in loop,
                config.buffer_capacity,
                config.input_capacity,
            )
            for c in topology.channels
        }
        self.channel_list = list(self.channels.values())
        self.tasks: dict[str, Task] = {}
        for i, name in enumerate(topology.sources):
            self.tasks[name] = Task(name, i, (), topology.outputs(name), None)
        back = topology.back_edges
        for name in topology.operators:
            inputs = topology.inputs(name)
            handler = handler_factory(name, inputs, back & set(inputs), config.mode)
            self.tasks[name] = Task(name, -1, inputs, topology.outputs(name), handler)
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
        self.problems: list[str] = []
        self.stats: Counter[str] = Counter()
        self.trace: list[str] = []
        self.steps = 0
        self.checkpoints = Checkpoints(
            config,
            self.tasks,
            self.channels,
            topology.back_edges,
            self.rng,
            self.stats,
            self.trace,
            self._problem,
        )
        """The checkpoints: the coordinator's, and the handlers' actions carried out."""
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
            triggered=self.checkpoints.triggered,
            completed=self.checkpoints.completed,
            aborted=self.checkpoints.aborted,
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
                    unit.append((Step.EMIT, task.name))
            else:
                unit.append((Step.END, task.name))
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
            unit.append((Step.LOOP_END,))
        rare: list[_Step] = []
        weights: list[float] = []
        checkpoints = self.checkpoints
        if checkpoints.next_id <= cfg.max_checkpoints and self._may_trigger():
            rare.append((Step.TRIGGER,))
            weights.append(cfg.trigger_weight)
        for name, n in checkpoints.timers:
            rare.append((Step.TIMEOUT, name, n))
            weights.append(cfg.timeout_weight)
        for name, n in checkpoints.notices:
            rare.append((Step.NOTICE, name, n))
            weights.append(cfg.notice_weight)
        if cfg.abort_weight > 0 and checkpoints.in_flight():
            rare.append((Step.ABORT,))
            weights.append(cfg.abort_weight)
        self.frozen = not (unit or rare)
        for name, wave in self.census_asked:
            rare.append((Step.COUNT, name, wave))
            weights.append(cfg.count_weight)
        if self._census_may_start() and (not self.frozen or self.frozen_waves < 2):
            rare.append((Step.CENSUS,))
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
        kind: Step = step[0]
        if kind is not Step.CENSUS and kind is not Step.COUNT:
            self.frozen_waves = 0
        match kind:
            case Step.EMIT:
                task = self.tasks[step[1]]
                record = self.topology.first_record(task.index, task.offset)
                task.offset += 1
                self._forward(task, record)
            case Step.END:
                self._finish(self.tasks[step[1]])
            case Step.SEND:
                self._send(self.channels[step[1]])
            case Step.ARRIVE:
                self._arrive(self.channels[step[1]])
            case Step.CONSUME:
                self._consume(self.channels[step[1]])
            case Step.TRIGGER:
                self.checkpoints.trigger()
            case Step.TIMEOUT:
                self.checkpoints.timers.remove((step[1], step[2]))
                self.checkpoints.timeout(self.tasks[step[1]], step[2])
            case Step.NOTICE:
                self.checkpoints.notices.remove((step[1], step[2]))
                task = self.tasks[step[1]]
                assert task.handler is not None
                task.heard.add(step[2])
                self.checkpoints.call(task, f"abort({step[2]})", task.handler.abort, step[2])
            case Step.ABORT:
                self.checkpoints.abort(
                    self.checkpoints.in_flight()[0], "the coordinator aborted it"
                )
            case Step.CENSUS:
                self._census()
            case Step.COUNT:
                self.census_asked.remove((step[1], step[2]))
                self._count(self.tasks[step[1]], step[2])
            case Step.LOOP_END:
                self.loop_ended = True
                for head in self.heads:
                    self._finish(head)
            case unknown:
                assert_never(unknown)

    # ---------------------------------------------------------------- record flow

    def _forward(self, task: Task, record: Record) -> None:
        hop = self._route(task.name, record)
        if hop is None:
            return
        cid, out = hop
        ch = self.channels[cid]
        ch.out_buf.append(out)
        ch.out_records += 1
        task.emitted[cid].append(out)
        task.loop_sent += ch.in_loop

    def _send(self, ch: Channel) -> None:
        item = ch.out_buf.popleft()
        if isinstance(item, Record):
            ch.out_records -= 1
        ch.wire.append(item)

    def _arrive(self, ch: Channel) -> None:
        item = ch.wire.popleft()
        if isinstance(item, Record):
            ch.in_records += 1
            ch.in_buf.append(item)
        elif isinstance(item, BarrierItem) and item.unaligned:
            at = after_last_control(ch.in_buf)
            ch.in_buf.insert(at, replace(item, overtakes=len(ch.in_buf) - at))
        else:
            ch.in_buf.append(item)

    def _consume(self, ch: Channel) -> None:
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
            self.checkpoints.call(
                task, f"message_received({item})", handler.message_received, cid, item
            )
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
            self.checkpoints.call(
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
            actions = self.checkpoints.call(
                task, f"end_of_input({cid[0]}->{cid[1]})", handler.end_of_input, cid
            )
            if any(isinstance(a, SnapshotComplete) for a in actions):
                self.stats["snapshots completed by an end of input"] += 1
            if len(task.ended) == len(task.inputs) and not task.finished and task not in self.heads:
                self._finish(task)

    def _finish(self, task: Task) -> None:
        """``task`` sends its end of input on; checkpoints it never heard of count as taken
        with its final state."""
        task.finished = True
        for cid in task.outputs:
            self.channels[cid].out_buf.append(END)
        self.checkpoints.finished(task)

    # ------------------------------------------------------------------ the census

    def _census(self) -> None:
        """The coordinator asks every subtask of the loop for its counts."""
        assert self.census is not None
        wave = self.census.start_wave().wave
        self.census_open = True
        self.census_asked += [(name, wave) for name in self.loop_names]
        if self.frozen:
            self.frozen_waves += 1

    def _count(self, task: Task, wave: int) -> None:
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


def run_dataflow(
    topology: DataflowGraph,
    config: DataflowConfig,
    *,
    handler_factory: HandlerFactory = default_handler,
) -> DataflowRun:
    """Run ``topology`` once under ``config``."""
    return DataflowModel(topology, config, handler_factory=handler_factory).run()
