"""The subtask loop, and the slot that runs one subtask of every chain.

A **slot** is one Spark task of the job's barrier stage. It

1. opens an :class:`~cutline.runtime.channel.InputGate` for each of its subtasks that has
   inputs, and exchanges the gates' addresses with the other slots once (the
   *rendezvous*: ``BarrierTaskContext.allGather`` on Spark, any function in tests);
2. connects to the driver's control server, restores each subtask's state from the
   checkpoint the driver chose, connects the output channels, and says ``ready``;
3. runs each subtask in its own thread (:class:`SubtaskRunner`), and routes the driver's
   messages (``trigger``, ``complete``, ``abort``, ``stop``) to them;
4. says ``finished`` when every subtask ended, or reports the first failure and raises.

A :class:`SubtaskRunner` is the loop of one chain subtask. A source subtask reads
batches from its reader and takes a checkpoint when the driver triggers one
(records its offset, emits the barrier). Any other subtask reads the channels that
its :class:`~cutline.protocol.AlignedBarrierHandler` has not blocked, and carries out
the handler's actions. A checkpoint's synchronous part (offsets, copy-on-write state
copies, the sinks' pre-commit) runs in the loop; serializing, writing and
acknowledging run on the subtask's snapshot thread while records keep flowing.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import queue
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from cutline.protocol.alignment import (
    AbortAlignment,
    AlignedBarrierHandler,
    ForwardBarrier,
    SnapshotState,
)
from cutline.runtime.channel import ChannelError, InputGate, OutputChannel
from cutline.runtime.control import ControlClient, ControlError
from cutline.runtime.graph import Chain, ExecutionPlan, subtask_name
from cutline.runtime.operators import (
    Batch,
    DeadLetterOutput,
    OperatorContext,
    Partitioner,
    RecordError,
    Running,
    UserFunctionError,
    function_name,
)
from cutline.runtime.sinks import FileSink
from cutline.runtime.state import StateSnapshot
from cutline.runtime.storage import CheckpointStorage, StateHandle
from cutline.runtime.wire import Barrier, EndOfInput, Records

STATE_FORMAT = 1
_JOIN_SECONDS = 10.0
DEAD_LETTERS = "_dead_letters"


@dataclass(frozen=True)
class SlotSetup:
    """Everything a slot needs, sent (pickled) from the driver with the Spark job."""

    plan: ExecutionPlan
    generation: int
    token: bytes
    driver: tuple[str, int]
    checkpoint_dir: str
    storage_options: dict[str, Any] | None = None
    restore_id: int | None = None
    restore_handles: dict[str, dict[str, Any]] = field(default_factory=dict)
    batch_size: int = 65536
    buffer_capacity: int = 4
    dead_letter_dir: str | None = None
    on_error: dict[str, str] = field(default_factory=dict)
    """Operator uid -> ``fail`` or ``dead_letter``."""
    heartbeat_interval: float = 0.25
    run: str = "r0"
    """The id of this run of the job (one ``execute()``), in every output file's name."""


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
        self.inbox: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self.outputs: list[tuple[str, list[OutputChannel], Partitioner | None]] = []
        self.stopped = threading.Event()
        self.failure: BaseException | None = None
        self.records_in = 0
        self._snapshotter = ThreadPoolExecutor(1, thread_name_prefix=f"cutline-snap-{self.name}")
        self._last_snapshot: int | None = None
        self._last_complete = -1
        self._final: int | None = None
        self._operators: list[tuple[str, Running]] = []
        self._reader: Any = None
        self._dead_letters: DeadLetterOutput | None = None
        self._current = chain.operators[0].name
        self._first_barrier_at: float | None = None
        self._key_contexts: dict[str, OperatorContext] = {}
        self.thread: threading.Thread | None = None

    # ----------------------------------------------------------------- set-up

    def open(self) -> None:
        """Restore state (when the driver chose a checkpoint) and open every operator."""
        setup = self.setup
        restored: dict[str, Any] = {}
        handle = setup.restore_handles.get(self.name)
        if setup.restore_id is not None and handle is not None:
            data = self.storage.read_state(setup.restore_id, StateHandle.from_dict(handle))
            payload = pickle.loads(data)
            if payload.get("format") != STATE_FORMAT:
                raise RecordError(f"the state of {self.name} was written by another version")
            restored = payload["operators"]
        if setup.dead_letter_dir is not None:
            sink = FileSink(
                f"{setup.dead_letter_dir.rstrip('/')}/{self.chain.uid}",
                "jsonl",
                setup.storage_options,
            )
            writer = sink.open(self.index, setup.generation, restored.get(DEAD_LETTERS), setup.run)
            self._dead_letters = DeadLetterOutput(writer)
        for op in self.chain.operators:
            ctx = self._context(op.name, op.uid)
            self._current = op.name
            if op.is_source:
                self._reader = op.logic.open(ctx, restored.get(op.uid))
            else:
                self._operators.append((op.uid, op.logic.open(ctx, restored.get(op.uid))))

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
        )

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
                )
                for channel, target in plan.output_channels(out, self.index)
            ]
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
            self.outputs.append((out.downstream, channels, partitioner))

    # ------------------------------------------------------------------- loop

    def run(self) -> None:
        try:
            if self.chain.is_source:
                self._run_source()
            else:
                self._run_with_inputs()
            self._snapshotter.shutdown(wait=True)
        except Stopped:
            self.stopped.set()
        except BaseException as exc:
            if self.stopped.is_set():
                return  # closing the channels of a stopped job makes sends fail: not a failure
            self._report(exc)  # first: the slot closes the control connection once it sees
            self.failure = exc  # a failure, and the driver must get the cause before that
        finally:
            self._snapshotter.shutdown(wait=False, cancel_futures=True)
            for _, running in self._operators:
                with contextlib.suppress(Exception):
                    running.close()

    def stop(self) -> None:
        self.stopped.set()
        self.inbox.put({"kind": "stop"})

    def _run_source(self) -> None:
        exhausted = False
        batch_size = self.setup.batch_size
        while True:
            self._handle_messages(block=exhausted or self._final is not None)
            if self._final is not None and self._last_complete >= self._final:
                self._emit_end()
                return
            if exhausted or self._final is not None:
                continue
            self._current = self.chain.operators[0].name
            batch = self._reader.read(batch_size)
            if batch is None:
                exhausted = True
                self.control.send("exhausted", subtask=self.name)
                continue
            self.records_in += batch.num_rows
            self._push(batch)

    def _run_with_inputs(self) -> None:
        assert self.gate is not None
        aligner: AlignedBarrierHandler[str] = AlignedBarrierHandler(
            self.gate.channels, name=self.name
        )
        self._aligner = aligner
        gate = self.gate
        ended = False
        while True:
            self._handle_messages(block=ended)
            if ended:
                if self._last_snapshot is None or self._last_complete >= self._last_snapshot:
                    return
                continue
            item = gate.poll(aligner.blocked_channels, timeout=0.05)
            if item is None:
                if not aligner.live_inputs:
                    self._emit_end()
                    ended = True
                continue
            channel, frame = item
            if isinstance(frame, Records):
                self.records_in += len(frame)
                self._push(frame.batch)
            elif isinstance(frame, Barrier):
                if aligner.pending_checkpoint is None:
                    self._first_barrier_at = time.monotonic()
                self._align(aligner.barrier_received(frame.checkpoint_id, channel))
            elif isinstance(frame, EndOfInput):
                self._align(aligner.end_of_input(channel))

    def _align(self, actions: Sequence[object]) -> None:
        for action in actions:
            if isinstance(action, SnapshotState):
                self._snapshot(action.checkpoint_id)
            elif isinstance(action, ForwardBarrier):
                self._emit_barrier(action.checkpoint_id)
            elif isinstance(action, AbortAlignment):
                self.control.send(
                    "decline",
                    subtask=self.name,
                    checkpoint=action.checkpoint_id,
                    reason=_cut(action.reason),
                )
            # BlockChannel / UnblockChannels: the aligner's blocked_channels says it all

    def _handle_messages(self, block: bool) -> None:
        """Carry out the driver's messages (waiting a moment for one when ``block``)."""
        try:
            message = self.inbox.get(timeout=0.1) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind = message["kind"]
            if kind == "stop" or self.stopped.is_set():
                raise Stopped
            checkpoint = int(message.get("checkpoint", -1))
            if kind == "trigger" and self.chain.is_source:
                self._snapshot(checkpoint)
                self._emit_barrier(checkpoint)
                if message.get("final"):
                    self._final = checkpoint
            elif kind == "complete":
                self._last_complete = max(self._last_complete, checkpoint)
                for _, running in self._operators:
                    running.notify_complete(checkpoint)
                if self._dead_letters is not None:
                    self._dead_letters.writer.notify_complete(checkpoint)
            elif kind == "abort":
                if self._final == checkpoint:
                    self._final = None  # the driver triggers another final checkpoint
                if not self.chain.is_source:
                    self._align(self._aligner.abort(checkpoint))
            try:
                message = self.inbox.get_nowait()
            except queue.Empty:
                return

    # ---------------------------------------------------------------- records

    def _push(self, batch: Batch) -> None:
        """Run ``batch`` through the chain's operators and send what comes out."""
        current: Batch | None = batch
        for uid, running in self._operators:
            self._current = uid
            current = running.process(current)
            if current is None or not len(current):
                return
        assert current is not None
        self._emit(current)

    def _emit(self, batch: Batch) -> None:
        for downstream, channels, partitioner in self.outputs:
            if partitioner is None:
                channels[0].send(Records(batch))
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
                    channel.send(Records(part))

    def _emit_barrier(self, checkpoint_id: int) -> None:
        frame = Barrier(checkpoint_id)
        for _, channels, _ in self.outputs:
            for channel in channels:
                channel.send(frame)

    def _emit_end(self) -> None:
        frame = EndOfInput()
        for _, channels, _ in self.outputs:
            for channel in channels:
                channel.send(frame)

    # ------------------------------------------------------------ checkpoints

    def _snapshot(self, checkpoint_id: int) -> None:
        """The synchronous part: offsets, state copies, sinks' pre-commit."""
        parts: dict[str, Any] = {}
        if self._reader is not None:
            parts[self.chain.operators[0].uid] = self._reader.offset()
        for uid, running in self._operators:
            self._current = uid
            parts[uid] = running.snapshot(checkpoint_id)
        if self._dead_letters is not None:
            parts[DEAD_LETTERS] = self._dead_letters.writer.pre_commit(checkpoint_id)
        self._last_snapshot = checkpoint_id
        now = time.monotonic()
        alignment = now - self._first_barrier_at if self._first_barrier_at is not None else 0.0
        self._first_barrier_at = None
        self._snapshotter.submit(self._write, checkpoint_id, parts, alignment, now)

    def _write(
        self, checkpoint_id: int, parts: dict[str, Any], alignment: float, sync_end: float
    ) -> None:
        """The asynchronous part: serialize, store, acknowledge (or decline)."""
        try:
            state = {
                uid: part.serialize() if isinstance(part, StateSnapshot) else part
                for uid, part in parts.items()
            }
            data = pickle.dumps(
                {"format": STATE_FORMAT, "operators": state}, protocol=pickle.HIGHEST_PROTOCOL
            )
            handle = self.storage.write_state(checkpoint_id, self.name, self.setup.generation, data)
        except Exception as exc:
            with contextlib.suppress(ControlError):
                self.control.send(
                    "decline",
                    subtask=self.name,
                    checkpoint=checkpoint_id,
                    reason=_cut(f"{type(exc).__name__}: {exc}"),
                )
            return
        with contextlib.suppress(ControlError):
            self.control.send(
                "ack",
                subtask=self.name,
                checkpoint=checkpoint_id,
                handle=handle.to_dict(),
                alignment=alignment,
                asynchronous=time.monotonic() - sync_end,
            )

    # ---------------------------------------------------------------- failure

    def _report(self, exc: BaseException) -> None:
        operator = self._current
        for op in self.chain.operators:
            if op.uid == self._current:
                operator = op.name
        with contextlib.suppress(ControlError):
            self.control.send("failed", subtask=self.name, **failure_report(exc, operator))


def failure_report(exc: BaseException, operator: str) -> dict[str, Any]:
    """The body of a ``failed`` message: the operator, the record, the error, the traceback
    (the user's own frames for a user function's error), each cut to a size a control message
    can carry."""
    if isinstance(exc, UserFunctionError):
        return {
            "operator": _cut(exc.operator),
            "record": _cut(exc.record),
            "error": _cut(exc.error),
            "traceback": _cut(exc.user_traceback),
            "cause": "task",
        }
    return {
        "operator": _cut(operator),
        "record": None,
        "error": _cut(f"{type(exc).__name__}: {exc}"),
        "traceback": _cut("".join(traceback.format_exception(exc))),
        "cause": "channel" if isinstance(exc, ChannelError) else "task",
    }


_MOST = 16 * 1024


def _cut(text: str) -> str:
    """``text``, or its first and last 8 KiB with how much was left out between them."""
    if len(text) <= _MOST:
        return text
    half = _MOST // 2
    return f"{text[:half]}\n... ({len(text) - _MOST} characters left out) ...\n{text[-half:]}"


Exchange = Callable[[str], list[str]]
"""The rendezvous: send this slot's addresses, get every slot's (in slot order)."""


def run_slot(setup: SlotSetup, slot: int, host: str, exchange: Exchange) -> dict[str, Any]:
    """Run subtask ``slot`` of every chain of ``setup.plan``; return a summary when all ended."""
    plan = setup.plan
    gates: dict[str, InputGate] = {}
    control: ControlClient | None = None
    runners: list[SubtaskRunner] = []
    opening: str | None = None
    try:
        for chain in plan.chains:
            if not chain.is_source:
                gates[chain.uid] = InputGate(
                    plan.input_channels(chain, slot),
                    token=setup.token,
                    generation=setup.generation,
                    capacity=setup.buffer_capacity,
                )
        mine = {"slot": slot, "host": host, "ports": {u: g.port for u, g in gates.items()}}
        addresses: dict[tuple[int, str], tuple[str, int]] = {}
        for text in exchange(json.dumps(mine)):
            other = json.loads(text)
            for uid, port in other["ports"].items():
                addresses[(int(other["slot"]), uid)] = (other["host"], int(port))
        control = ControlClient(
            setup.driver, f"slot-{slot}", token=setup.token, generation=setup.generation
        )
        storage = CheckpointStorage(setup.checkpoint_dir, storage_options=setup.storage_options)
        for chain in plan.chains:
            runner = SubtaskRunner(setup, chain, slot, control, storage, gates.get(chain.uid))
            runners.append(runner)
            opening = runner.name
            runner.open()
        opening = None
        for runner in runners:
            runner.connect(addresses)
        control.send("ready", pid=os.getpid(), host=host)
        return _supervise(setup, control, runners)
    except BaseException as exc:
        if control is not None and not any(r.failure for r in runners):
            with contextlib.suppress(ControlError):
                report = failure_report(exc, "(opening the subtasks)")
                control.send("failed", subtask=opening or f"slot-{slot}", **report)
        raise
    finally:
        for runner in runners:
            runner.stop()
            for _, channels, _ in runner.outputs:
                for channel in channels:
                    channel.close()
        for gate in gates.values():
            gate.close()
        if control is not None:
            control.close()
        # Let the subtask threads end before the slot does, so that none of them still
        # pre-commits or publishes while the next generation recovers (in a reused worker, or
        # with the thread launcher). A thread stuck in user code is given up on after a while.
        deadline = time.monotonic() + _JOIN_SECONDS
        for runner in runners:
            if runner.thread is not None:
                runner.thread.join(max(0.0, deadline - time.monotonic()))


def _supervise(
    setup: SlotSetup, control: ControlClient, runners: list[SubtaskRunner]
) -> dict[str, Any]:
    threads = [
        threading.Thread(target=r.run, name=f"cutline-{r.name}", daemon=True) for r in runners
    ]
    for runner, thread in zip(runners, threads, strict=True):
        runner.thread = thread
        thread.start()
    next_beat = time.monotonic() + setup.heartbeat_interval
    while any(t.is_alive() for t in threads):
        failed = [r for r in runners if r.failure is not None]
        if failed:
            raise RuntimeError(f"subtask {failed[0].name} failed: {failed[0].failure}")
        try:
            message = control.receive(timeout=0.1)
        except ControlError:
            raise RuntimeError("the driver closed the control connection") from None
        if message is not None:
            for runner in runners:
                runner.inbox.put(message)
        now = time.monotonic()
        if now >= next_beat:
            control.send("heartbeat", records_in={r.name: r.records_in for r in runners})
            next_beat = now + setup.heartbeat_interval
    failed = [r for r in runners if r.failure is not None]
    if failed:
        raise RuntimeError(f"subtask {failed[0].name} failed: {failed[0].failure}")
    if any(r.stopped.is_set() for r in runners):
        return {"stopped": True}
    summary = {"records_in": {r.name: r.records_in for r in runners}}
    control.send("finished", **summary)
    return summary
