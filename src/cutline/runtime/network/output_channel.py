"""The sending end of a channel: :class:`OutputChannel` (the channels' flow control and
barriers: :mod:`cutline.runtime.network.channel`)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from collections.abc import Iterable

import pyarrow as pa

from cutline.runtime.network.channel import IN_BAND, UNBOUNDED_CREDIT, ChannelError
from cutline.runtime.network.frames import FrameSizer
from cutline.runtime.network.net import close_socket, connect
from cutline.runtime.network.wire import (
    Barrier,
    CreditDecoder,
    EndOfInput,
    Frame,
    Hello,
    InBand,
    Records,
    Watermark,
    WireError,
    encode,
)


class OutputChannel:
    """The sending end of one channel: connect, say hello, then send frames as the receiver
    grants credit, keeping up to ``capacity`` records frames queued meanwhile (``send``
    blocks beyond that: backpressure).

    A thread reads the receiver's credits and sends the queued frames as they allow.
    Barriers and ends of input need no credit, but keep their place in the queue;
    :meth:`send_priority` sends a barrier ahead of everything queued.
    """

    def __init__(
        self,
        address: tuple[str, int],
        channel: str,
        *,
        token: bytes,
        generation: int,
        connect_timeout: float = 30.0,
        capacity: int = 4,
    ) -> None:
        self.channel = channel
        if capacity < 1:
            raise ValueError(f"capacity must be 1 or more, not {capacity}")
        self.capacity = capacity
        self._sock = connect(
            address,
            encode(Hello(channel, generation, token)),
            timeout=connect_timeout,
            error=ChannelError,
            who=f"channel {channel!r}",
            unreachable="cannot connect to",
            peer="the downstream subtask",
        )
        self._lock = threading.Condition()
        self._queue: deque[Frame] = deque()
        self._queued_records = 0
        self._credits = 0
        self._unconsumed: deque[int] = deque()
        """Records of each records frame written and not yet consumed by the receiver (its
        credit not back yet), oldest first."""
        self._sizer = FrameSizer()
        """How large a frame that waits for credit may be (from the receiver's pace)."""
        self._unbounded = False
        """A loop's back edge: unbounded credit, never given back per frame (nothing to
        count: its frames never wait)."""
        self._error: ChannelError | None = None
        self._closed = False
        self._ended = False
        self._reader = threading.Thread(
            target=self._read_credits, name=f"cutline-credit-{channel}", daemon=True
        )
        self._reader.start()

    @property
    def queued(self) -> int:
        """Records frames waiting for credit."""
        with self._lock:
            return self._queued_records

    def send(self, frame: Frame) -> None:
        """Send one frame in order; blocks while ``capacity`` records frames already wait for
        credit (backpressure), and an :class:`EndOfInput` until everything is written. Safe
        to call from several threads.

        While records wait for credit (the receiver is slower), a records frame is cut into
        frames of a fraction of a second of the receiver's work (:mod:`cutline.runtime.network.frames`):
        the records in flight, which a barrier waits behind, stay few however large the
        batches (a simple form of Flink's buffer debloating)."""
        with self._lock:
            if self._error is not None:
                raise self._error
            while (
                isinstance(frame, Records)
                and self._queued_records >= self.capacity
                and self._error is None
            ):
                self._lock.wait()  # (a subtask that checked has_room never waits here)
            if self._error is not None:
                raise self._error
            if (
                isinstance(frame, Watermark)
                and self._queue
                and isinstance(self._queue[-1], Watermark)
            ):
                self._queue[-1] = frame  # waiting for credit: only the newest watermark matters
                return
            frames = self._cut(frame) if isinstance(frame, Records) else [frame]
            self._queue.extend(frames)
            self._queued_records += sum(isinstance(f, Records) for f in frames)
            self._drain()
            while isinstance(frame, EndOfInput) and self._queue and self._error is None:
                self._lock.wait()  # the last frame: returns once everything is written
            if self._error is not None:
                raise self._error

    def _cut(self, frame: Records) -> list[Frame]:
        """``frame``, in frames of about :attr:`FrameSizer.seconds` of the receiver's work when
        it would wait for credit (with the lock held)."""
        if self._credits > 0 and not self._queue:
            return [frame]  # it goes at once: nothing waits behind it
        count = len(frame)
        size = self._sizer.cut(count, time.monotonic())
        if size is None:
            return [frame]
        batch = frame.batch
        if isinstance(batch, pa.RecordBatch):
            return [Records(batch.slice(i, size)) for i in range(0, count, size)]
        return [Records(batch[i : i + size]) for i in range(0, count, size)]

    def preload(self, frames: Iterable[Frame]) -> None:
        """Queue ``frames`` to go first, without waiting for room (the output side of a
        restored checkpoint's channel state)."""
        with self._lock:
            for frame in frames:
                self._queue.append(frame)
                if isinstance(frame, Records):
                    self._queued_records += 1
            self._drain()

    def send_priority(self, barrier: Barrier) -> list[InBand]:
        """Send ``barrier`` ahead of the queued frames; return the records frames (and
        watermarks) it overtook (they stay queued and are sent later). Queued barriers older
        than it are dropped: the receiver would ignore them."""
        with self._lock:
            if self._error is not None:
                raise self._error
            overtaken: list[InBand] = [f for f in self._queue if isinstance(f, IN_BAND)]
            for old in [f for f in self._queue if isinstance(f, Barrier)]:
                if old.checkpoint_id < barrier.checkpoint_id:
                    self._queue.remove(old)
            self._write(barrier)
            return overtaken

    def records_ahead(self) -> int:
        """Records a frame sent now would wait behind: queued here for credit, and sent but not
        yet consumed by the receiver."""
        with self._lock:
            queued = sum(len(f) for f in self._queue if isinstance(f, Records))
            return queued + sum(self._unconsumed)

    def holds_barrier(self, checkpoint_id: int) -> bool:
        """Whether ``Barrier(checkpoint_id)`` still waits in the queue (for credit ahead of it)."""
        with self._lock:
            return any(
                isinstance(f, Barrier) and f.checkpoint_id == checkpoint_id for f in self._queue
            )

    def promote(self, checkpoint_id: int) -> list[InBand] | None:
        """Turn ``Barrier(checkpoint_id)``, if it still waits in the queue, into an unaligned
        one sent now; return the records frames (and watermarks) queued ahead of it (``None``:
        not queued)."""
        with self._lock:
            ahead: list[InBand] = []
            older: list[Frame] = []
            for frame in self._queue:
                if isinstance(frame, Barrier) and frame.checkpoint_id == checkpoint_id:
                    self._queue.remove(frame)
                    for old in older:  # void: the receiver would refuse them after this one
                        self._queue.remove(old)
                    # the same barrier, unaligned: its base and savepoint flag go with it
                    self._write(dataclasses.replace(frame, unaligned=True, forced_aligned=False))
                    return ahead
                if isinstance(frame, IN_BAND):
                    ahead.append(frame)
                elif isinstance(frame, Barrier) and frame.checkpoint_id < checkpoint_id:
                    older.append(frame)
            return None

    def wait_for_room(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for :attr:`has_room`."""
        with self._lock:
            if self._queued_records >= self.capacity and self._error is None:
                self._lock.wait(timeout)

    @property
    def has_room(self) -> bool:
        """Whether a records frame sent now would not block (fewer than ``capacity`` wait)."""
        with self._lock:
            return self._queued_records < self.capacity or self._error is not None

    def close(self) -> None:
        """Close the channel; a ``send`` blocked by backpressure in another thread fails.

        After an end of input, first wait (a little) for the receiver to close its side: a
        socket closed with unread credits in it would reset the connection, and the receiver
        could lose what it had not read yet."""
        if self._ended:
            self._reader.join(5.0)
        # first, without the lock: a sendall blocked under it (a receiver that stopped reading)
        # wakes up only when the socket is shut down
        close_socket(self._sock)
        with self._lock:
            self._closed = True
            if self._error is None:
                self._error = ChannelError(f"channel {self.channel!r} was closed")
            self._lock.notify_all()

    def __enter__(self) -> OutputChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- internals

    def _drain(self) -> None:
        """Write the queued frames the credits allow (called with the lock held)."""
        queue = self._queue
        while queue and self._error is None:
            head = queue[0]
            if isinstance(head, Records):
                if self._credits <= 0:
                    break
                self._credits -= 1
                self._queued_records -= 1
                if not self._unbounded:
                    self._unconsumed.append(len(head))
            queue.popleft()
            try:
                self._write(head)
            except ChannelError as exc:
                self._error = exc
            if isinstance(head, EndOfInput):
                self._ended = True
        self._lock.notify_all()

    def _note_consumed(self, frames: int) -> None:
        """The receiver consumed ``frames`` records frames (their credit came back): tell the
        frame sizer (with the lock held). A grant beyond the frames written is the receiver's
        room (its first grant, a back edge's), not a consumption."""
        if frames >= UNBOUNDED_CREDIT:
            self._unbounded = True
            return
        now = time.monotonic()
        for _ in range(min(frames, len(self._unconsumed))):
            self._sizer.consumed(now, self._unconsumed.popleft())

    def _write(self, frame: Frame) -> None:
        try:
            self._sock.sendall(encode(frame))
        except OSError as exc:
            raise ChannelError(
                f"channel {self.channel!r}: the downstream subtask is gone: {exc.strerror or exc}"
            ) from exc

    def _read_credits(self) -> None:
        decoder = CreditDecoder()
        reason = "the downstream subtask closed the channel"
        try:
            while True:
                try:
                    data = self._sock.recv(4096)
                except OSError as exc:
                    reason = f"the downstream subtask is gone: {exc.strerror or exc}"
                    data = b""
                if not data:
                    break
                credits = decoder.feed(data)
                if credits:
                    with self._lock:
                        granted = sum(credits)
                        self._credits += granted
                        self._note_consumed(granted)
                        self._drain()
        except WireError as exc:
            reason = str(exc)
        with self._lock:
            if self._error is None and not self._ended:  # after the end, closing is the reply
                self._error = ChannelError(f"channel {self.channel!r}: {reason}")
            self._lock.notify_all()
