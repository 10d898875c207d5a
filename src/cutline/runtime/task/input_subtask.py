"""A subtask with inputs: reads the channels its barrier handler has not blocked, runs its
chain on each batch, and carries out the handler's actions.

The handler is :class:`~cutline.protocol.BarrierAligner` for exactly-once (aligned,
unaligned, with an alignment timeout) and :class:`~cutline.protocol.BarrierTracker` for
at-least-once. A loop's head has the back edge as an input: once every other input ended
and the driver found the loop quiet, it sends the end round the loop.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, assert_never

from cutline.protocol.alignment import (
    BarrierAction,
    BarrierAligner,
    BarrierTracker,
    BlockChannel,
    DeclineCheckpoint,
    ForwardBarrier,
    SnapshotState,
    UnblockChannels,
)
from cutline.protocol.chandy_lamport import RecordMessage, SnapshotComplete
from cutline.protocol.inputs import MultiInputValve
from cutline.protocol.watermarks import WatermarkValve
from cutline.runtime.network.channel import PriorityBarrier
from cutline.runtime.network.messages import Decline
from cutline.runtime.network.wire import (
    Barrier,
    EndOfInput,
    Hello,
    Records,
    Watermark,
    WatermarkStatus,
    recorded,
    replayed,
)
from cutline.runtime.operators import Batch
from cutline.runtime.task.failures import shorten
from cutline.runtime.task.launch import Checkpointing
from cutline.runtime.task.subtask import SubtaskRunner


class InputSubtask(SubtaskRunner):
    """The loop of one subtask of a chain with inputs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._handler: BarrierAligner[str] | BarrierTracker[str] | None = None
        self._valve: WatermarkValve[str] | MultiInputValve[str, int] | None = None
        self._ports: dict[str, int] | None = None
        """Input channel -> the port of the head it feeds, when the head takes two inputs."""

    def _take(self, channel: str, batch: Batch) -> None:
        """A batch from ``channel`` through the chain: a two-input head is told its port."""
        ports = self._ports
        if ports is None:
            self._push(batch)
            return
        uid, head = self._operators[0]
        self._current = uid
        counted = self.operator_records[uid]
        counted[0] += len(batch)
        self._fired(0, head.process_from(ports[channel], batch))

    def _loop(self) -> None:
        assert self.gate is not None
        setup, gate = self.setup, self.gate
        handler: BarrierAligner[str] | BarrierTracker[str]
        match setup.barriers.mode:
            case Checkpointing.AT_LEAST_ONCE:
                handler = BarrierTracker(gate.channels, back_edges=gate.back_edges, name=self.name)
            case Checkpointing.ALIGNED | Checkpointing.UNALIGNED:
                handler = BarrierAligner(
                    gate.channels,
                    unaligned=setup.barriers.unaligned,
                    back_edges=gate.back_edges,
                    name=self.name,
                )
            case unknown:
                assert_never(unknown)
        self._handler = handler
        if self.chain.operators[0].logic.two_inputs:
            self._ports = self.setup.plan.input_ports(self.chain, self.index)
        # event time: the minimum over the inputs (a loop's back edge holds nothing back)
        timed = [c for c in gate.channels if c not in gate.back_edges]
        valve: WatermarkValve[str] | MultiInputValve[str, int] | None = None
        if timed and self._ports is not None:  # the least of the two inputs' watermarks
            valve = MultiInputValve({c: self._ports[c] for c in timed})
        elif timed:
            valve = WatermarkValve(timed)
        self._valve = valve
        # the records (and watermarks) in flight at the restored checkpoint come first
        for channel in gate.channels:
            for item in self._restored_inputs.get(channel, ()):
                match replayed(item):
                    case Records() as restored:
                        self.records_in += len(restored)
                        self._take(channel, restored.batch)
                        self.records_done += len(restored)
                    case Watermark() | WatermarkStatus() as mark:
                        self._in_band(channel, mark)
        self._restored_inputs = {}
        ended = sent_end = False
        while True:
            if ended:  # (asked before waiting: the completion may have come already)
                if self._last_snapshot is None or self._last_complete >= self._last_snapshot:
                    return
                self._handle_messages(0.1)
                continue
            self._handle_messages(0)
            self._check_timeouts()
            self._processing_time()
            wait = 0.05
            if self.checkpoints.watched():
                wait = 0.01
            if (
                gate.back_edges
                and not sent_end
                and all(c in gate.back_edges for c in handler.live_inputs)
            ):
                # Every input but the loop's back edges ended: the driver triggered the final
                # checkpoint only once the loop was quiet, so nothing more comes round; the
                # end goes round the loop and ends the back edges too.
                self.outputs.end()
                sent_end = True
            # Take in a batch only when every output has room for what it makes: a subtask
            # never blocks in a send, so it always sees barriers, timeouts and messages.
            room = self.outputs.has_room()
            waited = time.monotonic()
            item = gate.poll(
                handler.blocked_channels, timeout=wait if room else 0.005, priority_only=not room
            )
            if not room:
                self.backpressured += time.monotonic() - waited
            if item is None:
                if room and not handler.live_inputs:
                    if not sent_end:
                        self.outputs.end()
                    ended = True
                continue
            channel, frame = item
            match frame:
                case Records():
                    self.records_in += len(frame)
                    self._received[channel] += len(frame)
                    self._carry_out(handler.message_received(channel, frame))
                    self._take(channel, frame.batch)
                    self.records_done += len(frame)
                case PriorityBarrier(barrier=barrier, overtaken=overtaken):
                    n = barrier.checkpoint_id
                    checkpoint = self.checkpoints[n]
                    checkpoint.barrier_came(channel, time.monotonic(), time.time())
                    checkpoint.said(barrier.base, barrier.savepoint)
                    self._carry_out(
                        handler.barrier_received(n, channel, unaligned=True, overtaken=overtaken)
                    )
                case Barrier():
                    n = frame.checkpoint_id
                    checkpoint = self.checkpoints[n]
                    checkpoint.barrier_came(channel, time.monotonic(), time.time())
                    checkpoint.said(frame.base, frame.savepoint)
                    if frame.forced_aligned:
                        checkpoint.forced = True
                    self._carry_out(
                        handler.barrier_received(
                            n,
                            channel,
                            unaligned=frame.unaligned,
                            forced_aligned=frame.forced_aligned,
                        )
                    )
                case Watermark() | WatermarkStatus():
                    self._carry_out(handler.message_received(channel, frame))  # (recorded too)
                    self._in_band(channel, frame)
                case EndOfInput():
                    if valve is not None and channel not in gate.back_edges:
                        self._carry_out_watermarks(valve.end_of_input(channel))
                    self._carry_out(handler.end_of_input(channel))
                case Hello():
                    raise AssertionError("a gate keeps the hellos of its channels")
                case _:
                    assert_never(frame)

    def _carry_out(self, actions: Sequence[BarrierAction[str]]) -> None:
        """Carry out the barrier handler's actions, in order."""
        for action in actions:
            match action:
                case RecordMessage():
                    recording = self.checkpoints.get(action.snapshot_id)
                    if recording is not None and recording.pending is not None:
                        recording.pending.inputs.setdefault(action.channel, []).append(
                            recorded(action.message)
                        )
                case SnapshotState():
                    self._snapshot(action.checkpoint_id)
                case ForwardBarrier():
                    forwarded = self.checkpoints[action.checkpoint_id]
                    forced, forwarded.forced = forwarded.forced, False
                    self.outputs.forward(forwarded, action.unaligned, forced)
                case SnapshotComplete():
                    self.snapshot_writer.complete(action.snapshot_id)
                case DeclineCheckpoint():
                    declined = self.checkpoints[action.checkpoint_id]
                    declined.pending = declined.unflushed = declined.first_barrier = None
                    reason = shorten(action.reason)
                    self.control.send(Decline(self.name, action.checkpoint_id, reason))
                case BlockChannel() | UnblockChannels():
                    pass  # the handler's blocked_channels says it all
                case _:
                    assert_never(action)

    def _in_band(self, channel: str, frame: Watermark | WatermarkStatus) -> None:
        """A watermark (or an idleness status) from ``channel`` goes to the valve."""
        valve = self._valve
        if valve is None or (self.gate is not None and channel in self.gate.back_edges):
            return  # (event time does not go round a loop)
        if isinstance(frame, Watermark):
            self._carry_out_watermarks(valve.watermark_received(channel, frame.timestamp))
        else:
            self._carry_out_watermarks(valve.status_received(channel, frame.idle))

    def _on_abort(self, checkpoint: int) -> None:
        if self._handler is not None:
            self._carry_out(self._handler.abort(checkpoint))

    def _time_out(self, now: float) -> None:
        """Checkpoints not aligned here that long after their trigger go unaligned."""
        assert self._timeout is not None
        handler = self._handler
        for checkpoint in self.checkpoints.timed():
            n, triggered = checkpoint.checkpoint_id, checkpoint.triggered
            assert triggered is not None
            if now < triggered + self._timeout:
                continue
            if isinstance(handler, BarrierAligner) and handler.pending_checkpoint not in (None, n):
                continue  # another checkpoint aligns here first; try again after it
            checkpoint.triggered = None
            if not isinstance(handler, BarrierAligner):
                continue
            assert self.gate is not None
            self._carry_out(handler.alignment_timed_out(n))
            if n in handler.recording:
                for input_channel, ahead in self.gate.promote(n):
                    checkpoint.arrivals.setdefault(input_channel, time.time())
                    self._carry_out(
                        handler.barrier_received(n, input_channel, unaligned=True, overtaken=ahead)
                    )
