"""The checkpoints of one run of the dataflow model (:mod:`cutline.sim.dataflow.model`): the
coordinator's part of them and what each subtask's barrier handler does about them
(:class:`Checkpoints`).

The coordinator triggers checkpoints ``1, 2, ...`` (each source records its offset and emits
``BarrierItem(n)``; a subtask that ended counts as having taken it with its final state),
counts a checkpoint completed once every subtask completed it, and aborts one that a subtask
declined, or at random, sending each operator subtask the notice of the abort. A subtask's
alignment timer calls ``alignment_timed_out(n)``.

**Actions.** Every event fed to a subtask's handler (:meth:`Checkpoints.call`) returns
actions, which the subtask carries out: ``SnapshotState`` copies its state and notes how many
records it has consumed from each input and emitted on each output; ``ForwardBarrier`` emits
the barrier on every output (unaligned: ahead of the records in each output buffer, which
become the output side of the channel state); ``RecordMessage`` appends to the *input side*
of the channel state; ``SnapshotComplete`` marks its snapshot whole; ``DeclineCheckpoint``
drops it and makes the coordinator abort the checkpoint; ``BlockChannel``/``UnblockChannels``
are checked against what the handler reports. A subtask that ends without ever hearing of a
checkpoint counts as having completed it with its final state (the cut passes after its end).
Anything out of order (a second snapshot, a recording for a snapshot not taken, a handler
error) is a *problem* of the run.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from cutline.protocol import (
    BarrierAligner,
    BlockChannel,
    DeclineCheckpoint,
    ForwardBarrier,
    ProtocolError,
    RecordMessage,
    SnapshotComplete,
    SnapshotState,
    UnblockChannels,
)
from cutline.sim.dataflow.config import DataflowConfig
from cutline.sim.dataflow.graph import BarrierItem, ChannelId, Record
from cutline.sim.dataflow.state import Channel, Task, TaskSnapshot, after_last_control


class Problem(Protocol):
    """Notes a problem of the run (``halt``: and stops it, raising)."""

    def __call__(self, text: str, halt: bool = False) -> None: ...


class Checkpoints:
    """The checkpoints of one run: those triggered, completed and aborted, the abort notices
    and alignment timers pending, and each subtask's handler fed and its actions carried out.

    It shares the run's ``tasks``, ``channels``, ``rng``, ``stats`` and ``trace``;
    ``problem`` notes a problem of the run.
    """

    def __init__(
        self,
        config: DataflowConfig,
        tasks: Mapping[str, Task],
        channels: Mapping[ChannelId, Channel],
        back_edges: frozenset[ChannelId],
        rng: random.Random,
        stats: Counter[str],
        trace: list[str],
        problem: Problem,
    ) -> None:
        self.config = config
        self.tasks, self.channels, self.back_edges = tasks, channels, back_edges
        self.rng, self.stats, self.trace = rng, stats, trace
        self._problem = problem
        self.next_id = 1
        self.triggered: list[int] = []
        self.completed: list[int] = []
        self.aborted: set[int] = set()
        self.timers: list[tuple[str, int]] = []
        self.notices: list[tuple[str, int]] = []

    def in_flight(self) -> list[int]:
        done = set(self.completed)
        return [n for n in self.triggered if n not in done and n not in self.aborted]

    def finished(self, task: Task) -> None:
        """``task`` ended: the checkpoints it never heard of count as taken with its final
        state."""
        for n in self.triggered:
            if n not in task.heard and n not in task.snapshots:
                task.take(n, finished=True).complete = True
                self.stats["finished snapshots"] += 1
                self._check_global(n)

    def trigger(self) -> None:
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

    def _emit_barrier(self, task: Task, snap: TaskSnapshot, unaligned: bool) -> None:
        snap.forwarded = True
        barrier = BarrierItem(snap.checkpoint_id, unaligned)
        for cid in task.outputs:
            ch = self.channels[cid]
            task.loop_sent += ch.in_loop
            buf = ch.out_buf
            if unaligned:
                at = after_last_control(buf)
                overtaken = [r for r in list(buf)[at:] if isinstance(r, Record)]
                snap.output_state[cid] = overtaken
                self.stats["output state records"] += len(overtaken)
                buf.insert(at, barrier)
            else:
                buf.append(barrier)

    def timeout(self, task: Task, n: int) -> None:
        handler = task.handler
        assert isinstance(handler, BarrierAligner)
        if len(task.ended) == len(task.inputs):
            return  # the subtask has stopped
        pending = handler.pending_checkpoint
        actions = self.call(task, f"alignment_timed_out({n})", handler.alignment_timed_out, n)
        if pending == n:
            self.stats["alignment timeouts"] += 1
        elif actions:
            self.stats["checkpoints initiated by a timeout"] += 1
        else:
            self.stats["stale timers"] += 1

    def abort(self, n: int, why: str) -> None:
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

    def call(
        self, task: Task, event: str, method: Callable[..., Any], *args: Any, **kw: Any
    ) -> Sequence[Any]:
        """Feed one event to ``task``'s handler and carry out the actions it returns."""
        try:
            actions: Sequence[Any] = method(*args, **kw)
        except ProtocolError as e:
            self._problem(f"{task.name}: {event} raised {type(e).__name__}: {e}", halt=True)
            raise  # pragma: no cover - the problem halted the run
        if self.config.trace:
            self.trace.append(f"  {task.name}.{event} -> {list(actions)}")
        self._apply(task, actions)
        return actions

    def _apply(self, task: Task, actions: Iterable[Any]) -> None:
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
                if action.channel in self.back_edges:
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
                self.abort(n, f"{task.name} declined it: {action.reason}")
            elif isinstance(action, BlockChannel):
                if action.channel in task.blocked or action.channel not in task.inputs:
                    self._problem(f"{task.name}: bad {action!r}")
                task.blocked.append(action.channel)
                stats["blocked channels"] += 1
                if action.channel in self.back_edges:
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

    def _snapshot_of(self, task: Task, n: int, action: object) -> TaskSnapshot | None:
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
