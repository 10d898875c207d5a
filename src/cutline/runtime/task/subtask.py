"""What every subtask does, whatever its loop: :class:`SubtaskRunner`.

A subtask runs one chain's operators in a thread of its slot. Its loop is its kind's
(:class:`~cutline.runtime.task.source_subtask.SourceSubtask` reads its splits;
:class:`~cutline.runtime.task.input_subtask.InputSubtask` reads its input channels); what
they share is here: opening the operators (restoring their state, with
:mod:`cutline.runtime.task.opening`), running a batch through the chain and sending what
comes out (on its :class:`~cutline.runtime.task.outputs.SubtaskOutputs`), event time, the
driver's messages, and checkpoints. A checkpoint's synchronous part (offsets, copy-on-write
state copies, the sinks' pending parts) runs in the loop; then, for an unaligned checkpoint
or a loop's head, the channel state is recorded as records arrive; serializing, writing
(keyed state segments, the sinks' part files) and acknowledging run on the subtask's
snapshot thread while records keep flowing (its
:class:`~cutline.runtime.task.snapshot_writer.SnapshotWriter`; what each checkpoint in flight
has reached is kept in :mod:`cutline.runtime.task.checkpoints`).

A checkpoint's state file (:mod:`cutline.runtime.checkpoint.state_file`) holds the
operators' state and its **channel state**: per input channel the records recorded on it
(consumed again first after a restore), per output channel the records an unaligned barrier
overtook (sent again first).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from typing import Any, assert_never

from cutline.protocol.watermarks import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    EmitStatus,
    EmitWatermark,
    EventClock,
    WatermarkAction,
)
from cutline.runtime.checkpoint.location import CheckpointLocation
from cutline.runtime.checkpoint.state_file import DEAD_LETTERS
from cutline.runtime.checkpoint.storage import CheckpointStorage
from cutline.runtime.graph import Chain, subtask_name
from cutline.runtime.network.control import ControlClient
from cutline.runtime.network.input_gate import InputGate
from cutline.runtime.network.messages import (
    Abort,
    Census,
    Complete,
    ControlError,
    Drain,
    DriverMessage,
    Peers,
    Release,
    Skipped,
    Stop,
    Trigger,
    Warn,
)
from cutline.runtime.network.wire import Watermark, WatermarkStatus, recorded_records
from cutline.runtime.operators import Batch, DeadLetterOutput, OperatorContext, RunningOperator
from cutline.runtime.source_operator import SourceOperator
from cutline.runtime.task.checkpoints import PendingSnapshot, SubtaskCheckpoints
from cutline.runtime.task.failures import failed_message
from cutline.runtime.task.launch import SlotSetup
from cutline.runtime.task.opening import dead_letter_output, operator_context, restored
from cutline.runtime.task.outputs import SubtaskOutputs
from cutline.runtime.task.snapshot_writer import SnapshotWriter

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
        self.gate = gate
        self.inbox: queue.SimpleQueue[DriverMessage] = queue.SimpleQueue()
        self.outputs = SubtaskOutputs(self._working_on)
        """Its output edges, and what was sent on them."""
        self.clock = EventClock(sum(not op.is_source for op in chain.operators))
        """Its event time: where each operator of the chain got to, and its outputs."""
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
        self._replayed = 0
        """Records in flight at the restored checkpoint on its inputs, replayed first."""
        self.records_done = 0
        """Records received on channels and processed (counted after their outputs were sent):
        the driver's census compares the two to know that a loop is quiet."""
        self.operator_records: dict[str, list[int]] = {op.uid: [0, 0] for op in chain.operators}
        """Operator uid -> [records in, records out] (live progress)."""
        self.backpressured = 0.0
        """Seconds spent unable to send (an output channel without room)."""
        self._received: dict[str, int] = {c: 0 for c in (gate.channels if gate is not None else ())}
        """Records received per input channel from the wire in this generation."""
        self.checkpoints = SubtaskCheckpoints()
        """What this subtask knows of each checkpoint in flight."""
        self._timeout = setup.barriers.alignment_timeout
        self.snapshot_writer = SnapshotWriter(
            self.name,
            chain,
            setup.generation,
            storage,
            control,
            self.checkpoints,
            self._timeout,
            self.outputs.channels,
            self._failed_writing,
        )
        """Writes the checkpoints once whole here, on the subtask's snapshot thread."""
        self._last_snapshot: int | None = None
        self._last_complete = -1
        self._operators: list[tuple[str, RunningOperator]] = []
        self._reader: SourceOperator | None = None
        """A source chain's connector (its reader, splits and watermarks)."""
        self._dead_letters: DeadLetterOutput | None = None
        self._current = chain.operators[0].name
        self._restore_location: CheckpointLocation | None = None
        self._restored_inputs: dict[str, list[Any]] = {}
        self._restored_outputs: dict[str, list[Any]] = {}
        self._clocked: list[int] = []
        """The operators (their index in the chain) that look at processing time."""
        self.thread: threading.Thread | None = None
        """The subtask's thread (:meth:`start`): every call into its operators, their
        connectors' readers and writers among them, is made on it, from :meth:`open` to
        their ``close``."""
        self.opened = threading.Event()
        """Set once the thread opened the operators (or failed to: :attr:`failure`)."""
        self._go = threading.Event()
        """Set when the slot says the loop may run (:meth:`go`), or stops the subtask."""
        self.looping = False
        """Whether its loop runs (its figures go into the slot's heartbeats)."""

    # ----------------------------------------------------------------- set-up

    def start(self) -> None:
        """Start the subtask's thread: it opens the operators (:meth:`open`), says so
        (:attr:`opened`), waits for :meth:`go`, then runs the loop until the subtask ends."""
        self.thread = threading.Thread(target=self.run, name=f"cutline-{self.name}", daemon=True)
        self.thread.start()

    def go(self) -> None:
        """The slot connected every output and told the driver it is ready: run the loop."""
        self._go.set()

    def open(self) -> None:
        """Restore state (when the driver chose a checkpoint) and open every operator (on the
        subtask's thread: a connector's reader or writer is made on the thread that uses it)."""
        self._current = "(restoring the subtask's checkpoint)"  # (no operator's yet)
        self._restore_location, gathered = restored(self.setup, self.chain, self.index, self.name)
        parts = gathered.parts
        self._restored_inputs = gathered.inputs
        self._restored_outputs = gathered.outputs
        self._replayed = sum(recorded_records(batches) for batches in gathered.inputs.values())
        self._current = "dead letters"
        self._dead_letters = dead_letter_output(self.setup, self.chain, self.index, parts)
        for op in self.chain.operators:
            ctx = self._context(op.name, op.uid, len(self._operators))
            self._current = op.name
            if op.is_source:
                self._reader = op.logic.open(ctx, parts.get(op.uid))
            else:
                self._operators.append((op.uid, op.logic.open(ctx, parts.get(op.uid))))
        self._clocked = [
            index
            for index, (_, running) in enumerate(self._operators)
            if type(running).on_processing_time is not RunningOperator.on_processing_time
        ]

    def _context(self, name: str, uid: str, position: int) -> OperatorContext:
        """What the operator ``uid`` (or work done on its behalf, named ``name``) knows; it is
        the ``position``-th after the source (its place on the clock)."""
        return operator_context(
            self.setup,
            self.chain,
            self.index,
            name,
            uid,
            dead_letters=self._dead_letters,
            restore_location=self._restore_location,
            warn=self._warn,
            skipped=lambda split, records, why: self.control.send(
                Skipped(self.name, name, split, records, why[:2000])
            ),
            clock=self.clock,
            position=position,
        )

    def _warn(self, message: str) -> None:
        """Something for the job's listener that is not a failure."""
        self.control.send(Warn(self.name, message[:2000]))

    def connect(self, addresses: dict[tuple[int, str], tuple[str, int]]) -> None:
        """Open the output channels to every downstream subtask."""
        outputs = self._restored_outputs
        outputs_place = len(self._operators)  # (a key function works for the outputs)

        def context(name: str, uid: str) -> OperatorContext:
            return self._context(name, uid, outputs_place)

        self.outputs.open(self.setup, self.chain, self.index, addresses, outputs, context)

    @property
    def records_sent(self) -> int:
        """Records sent on channels (counted before they are sent). The records in flight at
        the restored checkpoint count as sent in this generation (and as done once replayed):
        the census of a loop must see them."""
        return self._replayed + self.outputs.records_sent

    # ------------------------------------------------------------------- loop

    def run(self) -> None:
        """The subtask's thread, from opening its operators to closing them."""
        try:
            self.open()
            self.opened.set()
            self._go.wait()
            if self.stopped.is_set():
                raise Stopped
            self.looping = True
            self._loop()
            self.snapshot_writer.shutdown()
        except Stopped:
            self.stopped.set()
        except BaseException as exc:
            if not self.stopped.is_set():  # (closing the channels of a stopped job makes
                self._report(exc)  # sends fail: not a failure.) Reported first: the slot
                self.failure = exc  # ends once it sees a failure, and the driver must get
                # the cause before that
        finally:
            self.opened.set()  # (failed to open, or stopped meanwhile)
            if self.failure is not None or self.stopped.is_set():
                for uid, running in self._operators:  # (the sinks drop what they staged)
                    self._current = uid
                    with contextlib.suppress(Exception):
                        running.abort()
            self.snapshot_writer.shutdown(cancel=True)
            self.close_operators()
            self.control.wake()  # the slot sees at once that the subtask ended

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
        self._go.set()
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
                        self._current = self.chain.operators[0].name
                        self._reader.checkpoint_complete(checkpoint)
                    for uid, running in self._operators:
                        self._current = uid
                        running.notify_complete(checkpoint)
                    if self._dead_letters is not None:
                        was, self._current = self._current, DEAD_LETTERS
                        self._dead_letters.writer.commit(checkpoint)
                        self._current = was
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
                if self.outputs.sides:
                    self._emit_sides()
                if self._assigners:
                    self._assigned_watermarks(start)
                return
            current = out
            counted[1] += len(current)
        self.outputs.emit(current)
        if self.outputs.sides:
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
        for side in self.outputs.sides:
            batch = tail.side_output(side)
            if batch is not None and len(batch):
                self.outputs.emit(batch, side)

    # ------------------------------------------------------------ event time

    @property
    def watermark(self) -> int:
        """The watermark this subtask last sent on (epoch ms)."""
        return self.clock.output

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
        elif self.outputs.sides and index == len(self._operators) - 1:
            self._emit_sides()

    def _assigned_status(self, running: RunningOperator) -> None:
        """An ``assign_timestamps`` operator went idle or active again: say so downstream."""
        idle = running.take_status()
        if idle is not None and idle != self.idle:
            self.idle = idle
            self.outputs.broadcast(WatermarkStatus(idle))

    def _carry_out_watermarks(self, actions: list[WatermarkAction]) -> None:
        """Carry out what the source's clock or the input valve decided, in order."""
        for action in actions:
            match action:
                case EmitWatermark(watermark=watermark):
                    self._advance_watermark(watermark)
                case EmitStatus(idle=idle):
                    self.idle = idle
                    self.outputs.broadcast(WatermarkStatus(idle))
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
            self.clock.advance(index, watermark)
            self._fired(index, running.on_watermark(watermark))
            held = running.holds_back
            if held and watermark != MAX_WATERMARK:  # (it emits records that far behind)
                watermark = max(MIN_WATERMARK, watermark - held)
        self.clock.sent(watermark)
        if watermark != MAX_WATERMARK:
            self.timed = True
        self.outputs.broadcast(Watermark(watermark))

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
            was, self._current = self._current, DEAD_LETTERS
            parts[DEAD_LETTERS] = self._dead_letters.writer.prepare_commit(checkpoint_id)
            self._current = was
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
            sent=dict(self.outputs.sent),
            received=dict(self._received),
            watermark=self.shown_watermark,
            event_time=self.event_figures(),
            records={uid: list(counted) for uid, counted in self.operator_records.items()},
            dead_letters=self.dead_letter_count(),
        )
        self.checkpoints.forget_empty()

    def _check_timeouts(self) -> None:
        """The alignment timeout: a checkpoint not aligned here, or whose barrier still waits
        in an output queue, that long after its trigger goes unaligned."""
        if self._timeout is None:
            return
        now = time.monotonic()
        self.snapshot_writer.flush(now)
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

    # ---------------------------------------------------------------- failure

    def _working_on(self, name: str) -> None:
        """Work done on behalf of ``name`` (an operator, a key function) runs now: a failure
        names it."""
        self._current = name

    def _failed_writing(self, exc: BaseException) -> None:
        """A sink could not write its part on the snapshot thread (the writer reported it):
        the slot ends the subtask."""
        self.failure = exc

    def _report(self, exc: BaseException) -> None:
        """Tell the driver of ``exc``, naming the operator it came from: the one whose work
        ran when it was raised (:attr:`_current`, a uid or a name)."""
        with contextlib.suppress(ControlError):
            self.control.send(failed_message(self.name, exc, self._named(self._current)))

    def _named(self, current: str) -> str:
        if current == DEAD_LETTERS:
            return "dead letters"
        return next((op.name for op in self.chain.operators if op.uid == current), current)
