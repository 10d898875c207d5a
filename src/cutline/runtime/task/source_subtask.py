"""A source subtask: reads its splits batch by batch and takes a checkpoint when the driver
triggers one (records its offsets, emits the barrier).

It reads as much at once as its chain handles in about a tenth of a second
(:class:`ReadSize`), so that it sees the driver's messages that often; at most
``rate_limit`` records a second (:class:`Pace`); and, for tests and the demo, it can hold
part-way (:class:`~cutline.runtime.task.launch.SourceHold`) until checkpoints completed.
"""

from __future__ import annotations

import time
from typing import Any

from cutline.protocol.watermarks import MAX_WATERMARK
from cutline.runtime.network.messages import Exhausted, Trigger
from cutline.runtime.task.subtask import SubtaskRunner


class ReadSize:
    """How many records a source subtask reads at once (at most ``batch_size``): halved while a
    read and its chain's work take longer than :attr:`SLOW` seconds, doubled while they take
    less than :attr:`FAST`. So the subtask sees the driver's messages (a checkpoint's trigger)
    about that often however costly its operators are per record, and reads whole batches
    when they are cheap (or cost the same whatever their size)."""

    SLOW = 0.1
    FAST = 0.025
    SMALLEST = 16

    def __init__(self, most: int) -> None:
        self.most = most
        self.size = min(most, 1024)

    def took(self, records: int, seconds: float) -> None:
        """``records`` were read and pushed through the chain in ``seconds``."""
        if seconds > self.SLOW:
            self.size = max(self.SMALLEST, min(self.size, records) // 2)
        elif seconds < self.FAST and records >= self.size:
            self.size = min(self.most, self.size * 2)


class Pace:
    """A token bucket: at most ``rate`` records per second, in bursts of at most 0.1 s'
    worth (or one record), read in steps of at least 0.01 s' worth (or one record): a fast
    limit is not read a record at a time (each read costs the whole chain a pass)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.burst = max(1.0, rate * 0.1)
        self.step = max(1.0, rate * 0.01)
        self.tokens = 0.0
        self.at: float | None = None

    def allowed(self, now: float) -> int:
        """Records that may be read now (none until a step's worth is there)."""
        if self.at is None:
            self.at, self.tokens = now, self.step
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        return int(self.tokens) if self.tokens >= self.step else 0

    def took(self, records: int) -> None:
        self.tokens -= records

    def wait(self) -> float:
        """Seconds until the next read may start (a step's worth of records)."""
        return 0.0 if self.tokens >= self.step else (self.step - self.tokens) / self.rate


def _pause(pace: Pace | None) -> float:
    """How long a source subtask waits for the driver's messages before its next read."""
    return 0.0 if pace is None else min(0.1, pace.wait())


class SourceSubtask(SubtaskRunner):
    """The loop of one subtask of a source chain."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        setup = self.setup
        self._final: int | None = None
        """The final checkpoint, once triggered: the subtask ends once it completed."""
        self._draining = setup.drain
        """Stop reading: the job stops with a final checkpoint."""
        self._hold = setup.hold
        self._hold_from: int | None = None
        """The first checkpoint triggered while the source held (only later ones release it)."""
        self._hold_released = 0
        """Checkpoints since it held whose completion the driver has announced (``release``)."""

    def _loop(self) -> None:
        exhausted = False
        source = self.chain.operators[0]
        rate = self.setup.rate_limits.get(source.uid)
        pace = Pace(rate / self.setup.plan.parallelism) if rate else None
        reads = ReadSize(self.setup.batch_size)
        running = self._reader
        assert running is not None
        nothing = 0.0
        """How long the reader asked to wait before it is asked again (it had nothing)."""
        while True:
            idle = exhausted or self._final is not None or self._holding()
            self._handle_messages(0.1 if idle else max(nothing, _pause(pace)))
            nothing = 0.0
            self._check_timeouts()
            self._processing_time()
            if not exhausted:
                self._current = source.name
                self._carry_out_watermarks(running.tick(time.monotonic()))
            if self._final is not None and self._last_complete >= self._final:
                self.outputs.end()
                return
            if exhausted or self._final is not None or self._holding():
                continue  # (asked again: a message may have changed it)
            if not self.outputs.has_room():
                waited = time.monotonic()
                self.outputs.wait_for_room(0.01)  # and see the driver's messages meanwhile
                self.backpressured += time.monotonic() - waited
                continue
            size = reads.size
            if pace is not None:
                size = min(size, pace.allowed(time.monotonic()))
                if size < 1:
                    continue
            if self._hold is not None:
                size = min(size, self._hold.records - self.records_in)
            self._current = source.name
            started = time.perf_counter()
            batch = None if self._draining else running.read(size)
            if batch is None:
                self._carry_out_watermarks(running.take_watermarks())  # (a split finished)
                if not self._draining and not running.exhausted:
                    nothing = running.wait  # nothing now: asked again after that (or a message)
                    continue
                exhausted = True
                if not self._draining:
                    # the end of the input: every window and timer fires (processing-time ones
                    # too, without event time), before the final checkpoint
                    if running.strategy is not None:
                        self._carry_out_watermarks(running.end())
                    elif self.watermark < MAX_WATERMARK:
                        self._advance_watermark(MAX_WATERMARK)
                self.control.send(Exhausted(self.name))
                continue
            self.records_in += len(batch)
            self.operator_records[source.uid][1] += len(batch)
            self._push(batch)
            self._current = source.name
            self._carry_out_watermarks(running.take_watermarks())
            reads.took(len(batch), time.perf_counter() - started)
            if pace is not None:
                pace.took(len(batch))

    def _holding(self) -> bool:
        """Whether this source subtask holds (:class:`SourceHold`): it read its records and the
        checkpoints that release it have not all completed yet."""
        hold = self._hold
        if hold is None or self._draining:
            return False
        if self._hold_released >= hold.checkpoints:
            self._hold = None  # released for good
            return False
        return self.records_in >= hold.records

    def _on_trigger(self, trigger: Trigger) -> None:
        super()._on_trigger(trigger)
        checkpoint = trigger.checkpoint
        self.checkpoints[checkpoint].trigger_seen = time.time()
        if self._hold_from is None and self._holding():
            self._hold_from = checkpoint
        self._snapshot(checkpoint)
        # the final checkpoint and savepoints align: nothing may stay in flight
        aligned = trigger.final or trigger.savepoint
        self.outputs.forward(
            self.checkpoints[checkpoint], self.setup.barriers.unaligned and not aligned, aligned
        )
        self.snapshot_writer.complete(checkpoint)
        if trigger.final:
            self._final = checkpoint

    def _on_release(self, checkpoint: int) -> None:
        if self._hold_from is not None and checkpoint >= self._hold_from:
            self._hold_released += 1  # completed, and the listener was told

    def _on_drain(self) -> None:
        self._draining = True  # stop reading: the job stops once the loops are quiet

    def _on_abort(self, checkpoint: int) -> None:
        if self._final == checkpoint:
            self._final = None  # the driver triggers another final checkpoint
