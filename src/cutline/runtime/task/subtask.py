"""What every subtask does, whatever its loop: :class:`SubtaskRunner`.

A subtask runs one chain's operators in a thread of its slot. Its loop is its kind's
(:class:`~cutline.runtime.task.source_subtask.SourceSubtask` reads its splits;
:class:`~cutline.runtime.task.input_subtask.InputSubtask` reads its input channels); what
they share is here: opening the operators (restoring their state), connecting the outputs,
running a batch through the chain and sending what comes out, the driver's messages, and
checkpoints. A checkpoint's synchronous part (offsets, copy-on-write state copies, the
sinks' pending parts) runs in the loop; then, for an unaligned checkpoint or a loop's head,
the channel state is recorded as records arrive; serializing, writing (keyed state
segments, the sinks' part files) and acknowledging run on the subtask's snapshot thread
while records keep flowing (what each checkpoint in flight has reached is kept in
:mod:`cutline.runtime.task.checkpoints`).

A checkpoint's state file (:mod:`cutline.runtime.checkpoint.state_file`) holds the
operators' state and its **channel state**: per input channel the records recorded on it
(consumed again first after a restore), per output channel the records an unaligned barrier
overtook (sent again first).
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import secrets
import threading
import time
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from typing import Any, assert_never

from cutline.connectors.sink import PendingCommit, SinkContext
from cutline.protocol.watermarks import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    EmitStatus,
    EmitWatermark,
    WatermarkAction,
)
from cutline.runtime.checkpoint.location import CheckpointLocation
from cutline.runtime.checkpoint.restore import gather
from cutline.runtime.checkpoint.state_file import DEAD_LETTERS, SubtaskState
from cutline.runtime.checkpoint.storage import CheckpointStorage
from cutline.runtime.graph import Chain, subtask_name
from cutline.runtime.io.sinks import FileSink
from cutline.runtime.network.channel import InputGate, OutputChannel
from cutline.runtime.network.control import ControlClient
from cutline.runtime.network.messages import (
    Abort,
    Ack,
    Census,
    Complete,
    ControlError,
    Decline,
    Drain,
    DriverMessage,
    Peers,
    Release,
    Stop,
    Trigger,
    Warn,
)
from cutline.runtime.network.wire import (
    Barrier,
    EndOfInput,
    Records,
    Watermark,
    WatermarkStatus,
    recorded_records,
    replayed,
)
from cutline.runtime.operators import (
    Batch,
    DeadLetterOutput,
    OperatorContext,
    Partitioner,
    RecordError,
    RescaledStates,
    RunningOperator,
    function_name,
)
from cutline.runtime.source_operator import SourceOperator
from cutline.runtime.state.backend import KeyedSnapshot
from cutline.runtime.state.columns import handle_segments
from cutline.runtime.state.segments import SegmentRef
from cutline.runtime.task.checkpoints import PendingSnapshot, SubtaskCheckpoints
from cutline.runtime.task.failures import failed_message, shorten
from cutline.runtime.task.launch import SlotSetup

JOIN_SECONDS = 10.0


class Stopped(Exception):
    """The driver stopped the job (or went away): the subtask ends quietly."""


class SubtaskRunner:
    """The loop of one subtask of a chain."""

    def __init__(
        self,
        setup: SlotSetup,
        chain: Chain,
        index: int,
        control: ControlClient,
        storage: CheckpointStorage,
        gate: InputGate | None,
    ) -> None:
        self.setup = setup
        self.chain = chain
        self.index = index
        self.name = subtask_name(chain.uid, index)
        self.control = control
        self.storage = storage
        self.gate = gate
        self.inbox: queue.SimpleQueue[DriverMessage] = queue.SimpleQueue()
        self.outputs: list[tuple[str, list[OutputChannel], Partitioner | None, str | None]] = []
        """Per output edge: the downstream chain, its channels, how records are split between
        them, and the side output it carries (``"late"``; ``None``: the main output)."""
        self._sides: tuple[str, ...] = ()
        """The side outputs of the chain's tail that an edge carries."""
        self.watermark = MIN_WATERMARK
        """The watermark this subtask's chain has reached (epoch ms)."""
        self.idle = False
        """Whether this subtask said downstream that it is idle."""
        self.timed = False
        """Whether event time reached it (a watermark before the end's, which every job
        sends)."""
        self._assigners = any(
            op.logic.makes_watermarks for op in chain.operators if not op.is_source
        )
        """Whether an operator of the chain makes watermarks from its records."""
        self.stopped = threading.Event()
        self.failure: BaseException | None = None
        self.records_in = 0
        self.records_sent = 0
        """Records sent on channels (counted before they are sent)."""
        self.records_done = 0
        """Records received on channels and processed (counted after their outputs were sent):
        the driver's census compares the two to know that a loop is quiet."""
        self.operator_records: dict[str, list[int]] = {op.uid: [0, 0] for op in chain.operators}
        """Operator uid -> [records in, records out] (live progress)."""
        self.backpressured = 0.0
        """Seconds spent unable to send (an output channel without room)."""
        self._sent: dict[str, int] = {}
        """Records sent per output channel in this generation (the channel state it sends
        again after a restore included)."""
        self._received: dict[str, int] = {c: 0 for c in (gate.channels if gate is not None else ())}
        """Records received per input channel from the wire in this generation."""
        self.checkpoints = SubtaskCheckpoints()
        """What this subtask knows of each checkpoint in flight."""
        self._snapshotter = ThreadPoolExecutor(1, thread_name_prefix=f"cutline-snap-{self.name}")
        self._writes: list[futures.Future[None]] = []
        self._last_snapshot: int | None = None
        self._last_complete = -1
        self._operators: list[tuple[str, RunningOperator]] = []
        self._reader: SourceOperator | None = None
        """A source chain's connector (its reader, splits and watermarks)."""
        self._dead_letters: DeadLetterOutput | None = None
        self._current = chain.operators[0].name
        self._timeout = setup.barriers.alignment_timeout
        self._restore_location: CheckpointLocation | None = None
        self._restored_inputs: dict[str, list[Any]] = {}
        self._restored_outputs: dict[str, list[Any]] = {}
        self._key_contexts: dict[str, OperatorContext] = {}
        self._clocked: list[int] = []
        """The operators (their index in the chain) that look at processing time."""
        self.thread: threading.Thread | None = None

    # ----------------------------------------------------------------- set-up

    def open(self) -> None:
        """Restore state (when the driver chose a checkpoint) and open every operator."""
        setup = self.setup
        restored: dict[str, Any] = {}
        spec = setup.restore
        if spec is not None:
            self._restore_location = CheckpointLocation.open(
                spec.url, storage_options=setup.storage_options
            )
            gathered = gather(spec, self._restore_location, setup.plan, self.chain, self.index)
            restored = gathered.parts
            self._restored_inputs = gathered.inputs
            self._restored_outputs = gathered.outputs
            self._check_channel_state(spec.checkpoint_id)
            # the records in flight at the checkpoint count as sent in this generation (and as
            # done once replayed): the census of a loop must see them
            self.records_sent += sum(
                recorded_records(batches) for batches in self._restored_inputs.values()
            )
        if setup.dead_letter_dir is not None:
            sink = FileSink(
                f"{setup.dead_letter_dir.rstrip('/')}/{self.chain.uid}",
                "jsonl",
                setup.storage_options,
            )
            adopted = RescaledStates.of(restored.get(DEAD_LETTERS), self.index)
            context = SinkContext(
                "dead letters",
                self.index,
                setup.plan.parallelism,
                setup.generation,
                setup.run,
                job=setup.job,
            )
            self._dead_letters = DeadLetterOutput(sink.writer(context, adopted))
        for op in self.chain.operators:
            ctx = self._context(op.name, op.uid)
            self._current = op.name
            if op.is_source:
                self._reader = op.logic.open(ctx, restored.get(op.uid))
            else:
                self._operators.append((op.uid, op.logic.open(ctx, restored.get(op.uid))))
        self._clocked = [
            index
            for index, (_, running) in enumerate(self._operators)
            if type(running).on_processing_time is not RunningOperator.on_processing_time
        ]

    def _check_channel_state(self, checkpoint_id: int) -> None:
        """The recorded channels of the restored checkpoint must be channels of this job."""
        plan = self.setup.plan
        inputs = (
            set(plan.input_channels(self.chain, self.index)) if not self.chain.is_source else set()
        )
        outputs = {
            channel
            for out in self.chain.outputs
            for channel, _ in plan.output_channels(out, self.index)
        }
        for kind, recorded, known in (
            ("input", self._restored_inputs, inputs),
            ("output", self._restored_outputs, outputs),
        ):
            unknown = sorted(c for c, batches in recorded.items() if batches and c not in known)
            if unknown:
                raise RecordError(
                    f"checkpoint {checkpoint_id} holds records in flight on {kind} channel "
                    f"{unknown[0]!r} of {self.name}, which this job does not have: a checkpoint "
                    "with channel state (unaligned, or of a loop) restores only into the same "
                    "job graph at the same parallelism"
                )

    def _context(self, name: str, uid: str) -> OperatorContext:
        """What the operator ``uid`` (or work done on its behalf, named ``name``) knows."""
        plan, setup = self.setup.plan, self.setup
        return OperatorContext(
            name=name,
            subtask=self.index,
            parallelism=plan.parallelism,
            max_parallelism=plan.max_parallelism,
            generation=setup.generation,
            on_error=setup.on_error.get(uid, "fail"),
            dead_letters=self._dead_letters,
            run=setup.run,
            job=setup.job,
            uid=uid,
            state=setup.state,
            restore_store=self._restore_location,
            restore_checkpoint=(
                setup.restore.checkpoint_id
                if setup.restore is not None and setup.restore.own
                else None
            ),
            checkpoint_dir=setup.checkpoint_dir,
            storage_options=setup.storage_options,
            side_outputs=frozenset(
                out.side
                for out in self.chain.outputs
                if out.side is not None and uid == self.chain.operators[-1].uid
            ),
            warn=self._warn,
        )

    def _warn(self, message: str) -> None:
        """Something for the job's listener that is not a failure."""
        self.control.send(Warn(self.name, message[:2000]))

    def connect(self, addresses: dict[tuple[int, str], tuple[str, int]]) -> None:
        """Open the output channels to every downstream subtask."""
        plan, setup = self.setup.plan, self.setup
        for out in self.chain.outputs:
            channels = [
                OutputChannel(
                    addresses[(target, out.downstream)],
                    channel,
                    token=setup.token,
                    generation=setup.generation,
                    capacity=setup.buffer_capacity,
                )
                for channel, target in plan.output_channels(out, self.index)
            ]
            for channel in channels:  # the restored channel state goes first
                items = self._restored_outputs.get(channel.channel, [])
                self.records_sent += recorded_records(items)
                self._sent[channel.channel] = recorded_records(items)
                channel.preload([replayed(item) for item in items])
            partitioner = None
            if out.partitioning == "hash":
                assert out.key is not None
                partitioner = Partitioner(out.key, plan.parallelism, plan.max_parallelism)
                head = plan.chain(out.downstream).operators[0]
                key = out.key if isinstance(out.key, str) else function_name(out.key)
                # the key function belongs to the keyed operator: its on_error applies
                self._key_contexts[out.downstream] = self._context(
                    f"key_by({key}) of {head.name}", head.uid
                )
            assert out.partitioning == "hash" or len(channels) == 1
            self.outputs.append((out.downstream, channels, partitioner, out.side))
        self._sides = tuple(sorted({side for *_, side in self.outputs if side is not None}))

    # ------------------------------------------------------------------- loop

    def run(self) -> None:
        try:
            self._loop()
            self._snapshotter.shutdown(wait=True)
        except Stopped:
            self.stopped.set()
        except BaseException as exc:
            if self.stopped.is_set():
                return  # closing the channels of a stopped job makes sends fail: not a failure
            self._report(exc)  # first: the slot closes the control connection once it sees
            self.failure = exc  # a failure, and the driver must get the cause before that
        finally:
            if self.failure is not None or self.stopped.is_set():
                for _, running in self._operators:  # (the sinks drop what they staged)
                    with contextlib.suppress(Exception):
                        running.abort()
            self._snapshotter.shutdown(wait=False, cancel_futures=True)
            self.close_operators()

    def _loop(self) -> None:
        """The subtask's loop, until its input ended and its last checkpoint completed."""
        raise NotImplementedError

    def close_operators(self) -> None:
        """Close every operator opened (keyed state backends remove their working files)."""
        if self._reader is not None:
            with contextlib.suppress(Exception):
                self._reader.close()
        for _, running in self._operators:
            with contextlib.suppress(Exception):
                running.close()

    def stop(self) -> None:
        self.stopped.set()
        self.inbox.put(Stop())

    def _handle_messages(self, wait: float) -> None:
        """Carry out the driver's messages (waiting up to ``wait`` seconds for the first)."""
        try:
            message = self.inbox.get(timeout=wait) if wait > 0 else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if self.stopped.is_set():
                raise Stopped
            match message:
                case Stop():
                    raise Stopped
                case Trigger():
                    self._on_trigger(message)
                case Release(checkpoint=checkpoint):
                    self._on_release(checkpoint)
                case Drain():
                    self._on_drain()
                case Complete(checkpoint=checkpoint):
                    self._last_complete = max(self._last_complete, checkpoint)
                    for timed in self.checkpoints.timed():
                        if timed.checkpoint_id <= checkpoint:
                            timed.triggered = None
                    if self._reader is not None:
                        self._reader.checkpoint_complete(checkpoint)
                    for _, running in self._operators:
                        running.notify_complete(checkpoint)
                    if self._dead_letters is not None:
                        self._dead_letters.writer.commit(checkpoint)
                case Abort(checkpoint=checkpoint):
                    aborted = self.checkpoints[checkpoint]
                    aborted.triggered = None
                    aborted.unflushed = None  # not written: the driver dropped it
                    self._on_abort(checkpoint)
                case Census() | Peers():
                    pass  # the slot's own: it answers a census for all its subtasks
                case _:
                    assert_never(message)
            try:
                message = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _on_trigger(self, trigger: Trigger) -> None:
        checkpoint, savepoint = trigger.checkpoint, trigger.savepoint
        triggered = self.checkpoints[checkpoint]
        # what the barrier will say too: a barrier the alignment timeout takes out of an input
        # queue is never seen as a frame here
        triggered.said(trigger.base, savepoint)
        if self._timeout is not None and not trigger.final and not savepoint:
            triggered.triggered = time.monotonic()

    def _on_release(self, checkpoint: int) -> None:
        """A checkpoint completed and the listener was told (sources held part-way)."""

    def _on_drain(self) -> None:
        """Sources stop reading (a stop with a final checkpoint, in a job with loops)."""

    def _on_abort(self, checkpoint: int) -> None:
        """The driver dropped checkpoint ``checkpoint``."""

    # ---------------------------------------------------------------- records

    def _push(self, batch: Batch, start: int = 0) -> None:
        """Run ``batch`` through the chain's operators (from the ``start``-th) and send what
        comes out."""
        current: Batch = batch
        counts = self.operator_records
        operators = self._operators[start:] if start else self._operators
        for uid, running in operators:
            self._current = uid
            counted = counts[uid]
            counted[0] += len(current)
            out = running.process(current)
            if out is None or not len(out):
                if self._sides:
                    self._emit_sides()
                if self._assigners:
                    self._assigned_watermarks(start)
                return
            current = out
            counted[1] += len(current)
        self._emit(current)
        if self._sides:
            self._emit_sides()
        if self._assigners:
            self._assigned_watermarks(start)

    def _assigned_watermarks(self, start: int) -> None:
        """The watermarks the chain's ``assign_timestamps`` operators made from the records
        just pushed go on from them."""
        for index in range(start, len(self._operators)):
            running = self._operators[index][1]
            if running.makes_watermarks:
                self._assigned_status(running)  # (active again: before its watermark)
                watermark = running.take_watermark()
                if watermark is not None:
                    self._advance_watermark(watermark, index + 1)

    def _emit_sides(self) -> None:
        """Send what the chain's tail put in its side outputs (a window's late records)."""
        _, tail = self._operators[-1]
        for side in self._sides:
            batch = tail.side_output(side)
            if batch is not None and len(batch):
                self._emit(batch, side)

    # ------------------------------------------------------------ event time

    @property
    def shown_watermark(self) -> int | None:
        """The watermark for the progress and the statistics: ``None`` without event time."""
        return self.watermark if self.timed else None

    def dead_letter_count(self) -> int:
        """Records sent to the dead letters in this generation (so far)."""
        return self._dead_letters.count if self._dead_letters is not None else 0

    def event_figures(self) -> dict[str, dict[str, int]]:
        """Operator uid -> its event-time figures now (those that have any)."""
        figures = {}
        for uid, running in self._operators:
            found = running.figures()
            if found is not None:
                figures[uid] = found
        return figures

    def _processing_time(self) -> None:
        """Tell the operators that keep processing-time timers (or windows) the time."""
        clocked = self._clocked
        if not clocked:
            return
        now = int(time.time() * 1000)
        for index in clocked:
            uid, running = self._operators[index]
            self._current = uid
            self._fired(index, running.on_processing_time(now))
            if running.makes_watermarks:  # (assign_timestamps with an idle timeout)
                self._assigned_status(running)

    def _fired(self, index: int, out: Batch | None) -> None:
        """What the ``index``-th operator emitted when time moved (a window, a timer): through
        the rest of the chain; the chain's tail's side outputs (late records) go out too."""
        if out is not None and len(out):
            self.operator_records[self._operators[index][0]][1] += len(out)
            self._push(out, index + 1)
        elif self._sides and index == len(self._operators) - 1:
            self._emit_sides()

    def _assigned_status(self, running: RunningOperator) -> None:
        """An ``assign_timestamps`` operator went idle or active again: say so downstream."""
        idle = running.take_status()
        if idle is not None and idle != self.idle:
            self.idle = idle
            for channel in self.output_channels():
                channel.send(WatermarkStatus(idle))

    def _carry_out_watermarks(self, actions: list[WatermarkAction]) -> None:
        """Carry out what the source's clock or the input valve decided, in order."""
        for action in actions:
            match action:
                case EmitWatermark(watermark=watermark):
                    self._advance_watermark(watermark)
                case EmitStatus(idle=idle):
                    self.idle = idle
                    for channel in self.output_channels():
                        channel.send(WatermarkStatus(idle))
                case _:
                    assert_never(action)

    def _advance_watermark(self, watermark: int, start: int = 0) -> None:
        """Event time reached ``watermark`` at the ``start``-th operator of the chain: each
        operator from there fires what it completes (its output goes through the rest of the
        chain first), then the watermark goes on every output, after those records. An
        operator that makes its own watermarks (``assign_timestamps``) takes only the end
        (:data:`MAX_WATERMARK`) from upstream."""
        for index in range(start, len(self._operators)):
            uid, running = self._operators[index]
            self._current = uid
            if running.makes_watermarks:  # (it sends its own, made from its records)
                out = running.on_watermark(watermark)
                if out is not None and len(out):
                    self._push(out, index + 1)
                own = running.take_watermark()
                if own is not None:
                    self._advance_watermark(own, index + 1)
                return
            self._fired(index, running.on_watermark(watermark))
        self.watermark = watermark
        if watermark != MAX_WATERMARK:
            self.timed = True
        frame = Watermark(watermark)
        for channel in self.output_channels():
            channel.send(frame)

    def _emit(self, batch: Batch, side: str | None = None) -> None:
        for downstream, channels, partitioner, carries in self.outputs:
            if carries != side:
                continue
            if partitioner is None:
                records = Records(batch)
                self.records_sent += len(records)
                self._sent[channels[0].channel] = self._sent.get(channels[0].channel, 0) + len(
                    records
                )
                channels[0].send(records)
                continue
            context = self._key_contexts[downstream]
            self._current = context.name
            try:
                parts = partitioner.split(batch, context.fail)
            except RecordError as exc:
                context.fail(exc.record, exc)
                continue  # the whole batch went to the dead letters
            for channel, part in zip(channels, parts, strict=True):
                if len(part):
                    self.records_sent += len(part)
                    self._sent[channel.channel] = self._sent.get(channel.channel, 0) + len(part)
                    channel.send(Records(part))

    def _forward(self, checkpoint_id: int, unaligned: bool, forced_aligned: bool = False) -> None:
        """Emit ``Barrier(checkpoint_id)`` on every output: in line, or (unaligned) ahead of
        the queued records, which become the output side of the checkpoint's channel state."""
        checkpoint = self.checkpoints[checkpoint_id]
        base, savepoint = checkpoint.base, checkpoint.savepoint
        forwarding = checkpoint.pending
        if forwarding is not None and self.outputs:
            forwarding.forwarded_at = time.time()
        if not unaligned:
            frame = Barrier(
                checkpoint_id, forced_aligned=forced_aligned, savepoint=savepoint, base=base
            )
            for channel in self.output_channels():
                if forwarding is not None:  # what the barrier waits behind (statistics)
                    forwarding.queued_ahead[channel.channel] = channel.records_ahead()
                channel.send(frame)
            return
        assert forwarding is not None  # an unaligned barrier is forwarded after the snapshot
        forwarding.unaligned = True
        frame = Barrier(checkpoint_id, unaligned=True, savepoint=savepoint, base=base)
        for channel in self.output_channels():
            forwarding.keep_output(channel.channel, channel.send_priority(frame))

    def _emit_end(self) -> None:
        frame = EndOfInput()
        for channel in self.output_channels():
            channel.send(frame)

    # ------------------------------------------------------------ checkpoints

    def _snapshot(self, checkpoint_id: int) -> None:
        """The synchronous part: offsets, state copies, the sinks' pending parts."""
        parts: dict[str, Any] = {}
        started, wall = time.monotonic(), time.time()
        checkpoint = self.checkpoints[checkpoint_id]
        base, savepoint = checkpoint.base, checkpoint.savepoint
        for older in self.checkpoints.older(checkpoint_id):
            older.kind = older.first_barrier = older.trigger_seen = None
        if self._reader is not None:
            self._current = self.chain.operators[0].name
            parts[self.chain.operators[0].uid] = self._reader.snapshot(checkpoint_id)
        for uid, running in self._operators:
            self._current = uid
            parts[uid] = running.snapshot(checkpoint_id, base=base, savepoint=savepoint)
        if self._dead_letters is not None:
            parts[DEAD_LETTERS] = self._dead_letters.writer.prepare_commit(checkpoint_id)
        self._last_snapshot = checkpoint_id
        now = time.monotonic()
        first, checkpoint.first_barrier = checkpoint.first_barrier, None
        alignment = max(0.0, started - first) if first is not None else 0.0
        seen, checkpoint.trigger_seen = checkpoint.trigger_seen, None
        first_at = min(checkpoint.arrivals.values(), default=seen if seen is not None else wall)
        checkpoint.pending = PendingSnapshot(
            parts,
            alignment,
            now,
            savepoint,
            synchronous=now - started,
            snapshot_at=wall,
            first_barrier_at=first_at,
            sent=dict(self._sent),
            received=dict(self._received),
            watermark=self.shown_watermark,
            event_time=self.event_figures(),
            records={uid: list(counted) for uid, counted in self.operator_records.items()},
            dead_letters=self.dead_letter_count(),
        )
        self.checkpoints.forget_empty()

    def _complete(self, checkpoint_id: int) -> None:
        """The checkpoint is whole here (its channel state recorded): write it and ack; with
        an alignment timeout, once its barrier has left every output queue (until then, the
        timeout can still turn it unaligned, and what it overtakes belongs to this state)."""
        checkpoint = self.checkpoints.get(checkpoint_id)
        if checkpoint is None or checkpoint.pending is None:
            return
        taking, checkpoint.pending = checkpoint.pending, None
        taking.arrivals, checkpoint.arrivals = checkpoint.arrivals, {}
        for older in self.checkpoints.older(checkpoint_id):
            if older.pending is None:
                older.arrivals = {}
        if self._timeout is not None and (
            self.checkpoints.unflushed() or self._barrier_queued(checkpoint_id)
        ):
            checkpoint.unflushed = taking  # (behind an earlier one: written in order)
            return
        self.checkpoints.forget_empty()
        self._submit(checkpoint_id, taking)

    def _submit(self, checkpoint_id: int, taking: PendingSnapshot) -> None:
        """Write checkpoint ``checkpoint_id`` on the snapshot thread (in order)."""
        self._writes = [w for w in self._writes if not w.done()]
        self._writes.append(self._snapshotter.submit(self._write, checkpoint_id, taking))

    def wait_for_snapshots(self, timeout: float) -> None:
        """Wait (up to ``timeout`` s) for the snapshot thread's write in progress: once a slot
        ends, nothing of its generation may still write (a sink's part file landing after the
        next generation cleaned up would stay forever). Writes the thread's shutdown cancelled
        never run: not waited for (``futures.wait`` never counts them done)."""
        running = [w for w in self._writes if not w.cancelled()]
        futures.wait(running, timeout=max(0.0, timeout))

    def output_channels(self) -> list[OutputChannel]:
        """Every output channel of this subtask, of every output edge."""
        return [channel for _, channels, _, _ in self.outputs for channel in channels]

    def _has_room(self) -> bool:
        """Whether every output channel can take a batch without blocking."""
        return all(channel.has_room for channel in self.output_channels())

    def _wait_for_room(self, timeout: float) -> None:
        for channel in self.output_channels():
            if not channel.has_room:
                channel.wait_for_room(timeout)
                return

    def _barrier_queued(self, checkpoint_id: int) -> bool:
        return any(channel.holds_barrier(checkpoint_id) for channel in self.output_channels())

    def _check_timeouts(self) -> None:
        """The alignment timeout: a checkpoint not aligned here, or whose barrier still waits
        in an output queue, that long after its trigger goes unaligned."""
        if self._timeout is None:
            return
        now = time.monotonic()
        for checkpoint in self.checkpoints.unflushed():  # in order: a backend writes its
            n, taking = checkpoint.checkpoint_id, checkpoint.unflushed  # snapshots so
            assert taking is not None
            if self._barrier_queued(n):
                triggered = checkpoint.triggered
                if triggered is None or now < triggered + self._timeout:
                    break  # not yet (the later ones wait); or forced aligned: never
                for channel in self.output_channels():
                    overtaken = channel.promote(n)
                    if overtaken is not None:
                        taking.unaligned = True
                        taking.keep_output(channel.channel, overtaken)
            checkpoint.unflushed = None
            self._submit(n, taking)
        self._time_out(now)
        self.checkpoints.forget_empty()

    def _time_out(self, now: float) -> None:
        """Checkpoints not aligned here that long after their trigger (a source aligns
        nothing: the timeout only stops watching them)."""
        assert self._timeout is not None
        for checkpoint in self.checkpoints.timed():
            assert checkpoint.triggered is not None
            if now >= checkpoint.triggered + self._timeout:
                checkpoint.triggered = None

    def _write(self, checkpoint_id: int, taking: PendingSnapshot) -> None:
        """The asynchronous part: serialize, store, acknowledge (or decline)."""
        segments: list[SegmentRef] = []
        try:
            state = {}
            store = self.storage.segment_store(checkpoint_id)
            for number, (uid, part) in enumerate(taking.parts.items()):
                if isinstance(part, KeyedSnapshot):
                    name = (
                        f"g{self.setup.generation}-{self.name}-{number}-c{checkpoint_id}-"
                        f"{secrets.token_hex(4)}"
                    )
                    part = part.write(store, name)
                    segments += handle_segments(part)
                elif isinstance(part, PendingCommit):  # a sink's committable, made now
                    try:
                        part = part.complete()
                    except Exception as exc:  # the sink is broken: the subtask fails
                        self._fail_from_snapshot_thread(uid, exc)
                        return
                state[uid] = part
            written = SubtaskState(state, taking.inputs, taking.outputs)
            channel_bytes = written.channel_state_bytes()
            data = written.encode()
            counts = taking.channel_counts()
            handle = self.storage.write_state(checkpoint_id, self.name, self.setup.generation, data)
            handle = dataclasses.replace(
                handle,
                segments=tuple(segments),
                operators=tuple(uid for uid, part in state.items() if part is not None),
                channel_state=bool(taking.inputs or taking.outputs),
                channels=counts,
            )
        except Exception as exc:  # (segments written meanwhile are removed with the run's
            # unneeded files when the job ends)
            with contextlib.suppress(ControlError):
                reason = shorten(f"{type(exc).__name__}: {exc}")
                self.control.send(Decline(self.name, checkpoint_id, reason))
            return
        with contextlib.suppress(ControlError):
            self.control.send(
                Ack(
                    self.name,
                    checkpoint_id,
                    handle.to_dict(),
                    alignment=taking.alignment,
                    asynchronous=time.monotonic() - taking.sync_end,
                    unaligned=taking.unaligned,
                    stats=taking.statistics(store.written, channel_bytes),
                )
            )

    # ---------------------------------------------------------------- failure

    def _fail_from_snapshot_thread(self, uid: str, exc: BaseException) -> None:
        """A sink could not write its part: report the failure naming the sink (not a declined
        checkpoint: the sink cannot go on), and let the slot end the subtask."""
        name = "dead letters" if uid == DEAD_LETTERS else uid
        for op in self.chain.operators:
            if op.uid == uid:
                name = op.name
        with contextlib.suppress(ControlError):
            self.control.send(failed_message(self.name, exc, name))
        self.failure = exc

    def _report(self, exc: BaseException) -> None:
        operator = self._current
        for op in self.chain.operators:
            if op.uid == self._current:
                operator = op.name
        with contextlib.suppress(ControlError):
            self.control.send(failed_message(self.name, exc, operator))
