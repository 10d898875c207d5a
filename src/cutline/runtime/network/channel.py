"""Channels between subtasks over TCP, with credit-based flow control and barriers that can
overtake the records queued before them.

A subtask's :class:`InputGate` listens on one port for all its input channels.
Every accepted connection gets a reader thread that decodes frames
(:mod:`cutline.runtime.network.wire`) into that channel's queue. The queue has room for
``capacity`` records frames, and the sender may send only as many as it holds
**credits** for: the gate grants ``capacity`` when the channel connects and one
more each time the subtask consumes a frame. A sender without credit keeps its
frames in its own output queue (:class:`OutputChannel`), and when that is full
too, ``send`` blocks: that is the backpressure. A slow subtask slows its inputs,
memory stays bounded by ``capacity`` frames per channel on each side, and the
sockets never hold records the receiver has no room for, so a barrier can
always reach the receiver at once.

That is what **unaligned** barriers need (SEMANTICS §3): ``send_priority`` writes
a barrier ahead of the sender's queued frames (they stay queued; they are returned,
to be kept as the output side of the checkpoint's channel state), and the gate hands
such a barrier to the subtask ahead of the frames queued before it on its channel,
together with those frames (:class:`PriorityBarrier`), which are still consumed later.

The subtask's loop calls :meth:`InputGate.poll` with the channels it must not
consume now (those blocked by barrier alignment); their frames stay queued.
**Back edges** (the feedback channel of a loop) get unbounded credit, so that a
loop can never deadlock on its own backpressure. Channels are read round robin
(back edges too: reading them first would starve the loop's input, and its barriers).

A connection whose hello carries another job's token or a stale generation is
refused and closed, and the gate goes on waiting for the right one. A channel
whose connection ends before its end of input is an error: the upstream
subtask failed, and :meth:`InputGate.poll` raises :class:`ChannelError`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import threading
import time
from collections import deque
from collections.abc import Collection, Iterable
from dataclasses import dataclass

import pyarrow as pa

from cutline.runtime.network.frames import FrameSizer
from cutline.runtime.network.net import Acceptor, close_socket, connect
from cutline.runtime.network.wire import (
    Barrier,
    CreditDecoder,
    EndOfInput,
    Frame,
    FrameDecoder,
    Hello,
    InBand,
    Records,
    Watermark,
    WatermarkStatus,
    WireError,
    encode,
    encode_credit,
)

_READ_SIZE = 256 * 1024

UNBOUNDED_CREDIT = 0x7FFFFFFF
"""The credit a back edge gets: a loop must not wait for itself."""


_IN_BAND = (Records, Watermark, WatermarkStatus)


@dataclass(frozen=True, slots=True)
class PriorityBarrier:
    """An unaligned barrier, handed to the subtask ahead of ``overtaken``: the records frames
    (and watermarks, in order) of its channel that were queued before it (still queued,
    consumed later)."""

    barrier: Barrier
    overtaken: tuple[InBand, ...]


class ChannelError(Exception):
    """A channel broke: its upstream disconnected early, or sent bytes that are not frames."""


class InputGate:
    """Every input channel of one subtask.

    :param channels: the ids of the input channels.
    :param token: the job's secret: connections must present it.
    :param generation: the job attempt: connections from another one are refused.
    :param capacity: records frames buffered per channel (the credit each sender gets).
    :param host: the address to listen on (``0.0.0.0``: every interface).
    :param hello_timeout: seconds a new connection has to say hello before it is dropped.
    :param back_edges: channels that come round a loop: unbounded credit.
    """

    def __init__(
        self,
        channels: Iterable[str],
        *,
        token: bytes,
        generation: int,
        capacity: int = 16,
        host: str = "0.0.0.0",
        hello_timeout: float = 30.0,
        back_edges: Collection[str] = (),
    ) -> None:
        self.channels = tuple(channels)
        self.back_edges = frozenset(back_edges)
        self.hello_timeout = hello_timeout
        if len(set(self.channels)) != len(self.channels):
            raise ValueError(f"an input channel is listed twice: {self.channels!r}")
        if capacity < 1:
            raise ValueError(f"capacity must be 1 or more, not {capacity}")
        self.capacity = capacity
        self._token = token
        self._generation = generation
        self._queues: dict[str, deque[Frame]] = {c: deque() for c in self.channels}
        self._records: dict[str, int] = dict.fromkeys(self.channels, 0)
        """Records frames queued per channel (what the credit bounds)."""
        self._priority: deque[tuple[str, PriorityBarrier]] = deque()
        self._connections: dict[str, socket.socket] = {}
        self._connected: set[str] = set()
        self._ended: set[str] = set()
        self._errors: list[ChannelError] = []
        self.refused: list[str] = []
        """Why each refused connection was refused (for logs and tests)."""
        self._lock = threading.Condition()
        self._closed = False
        self._next = 0  # round-robin start, for fairness between channels
        self._acceptor = Acceptor(
            self._read, host=host, backlog=max(8, len(self.channels)), name="cutline-channel"
        )

    @property
    def port(self) -> int:
        return self._acceptor.port

    def buffered(self, channel: str) -> int:
        """Frames of ``channel`` received and not yet polled."""
        with self._lock:
            return len(self._queues[channel])

    def promote(self, checkpoint_id: int) -> list[tuple[str, tuple[InBand, ...]]]:
        """Take ``Barrier(checkpoint_id)`` out of every channel queue it waits in (behind
        records) as if it had come unaligned: per channel, the records frames (and watermarks)
        it overtakes."""
        promoted = []
        with self._lock:
            for channel, queue in self._queues.items():
                ahead: list[InBand] = []
                older: list[Frame] = []
                for frame in queue:
                    if isinstance(frame, Barrier) and frame.checkpoint_id == checkpoint_id:
                        queue.remove(frame)
                        for old in older:  # void once this one went ahead of them
                            queue.remove(old)
                        promoted.append((channel, tuple(ahead)))
                        break
                    if isinstance(frame, _IN_BAND):
                        ahead.append(frame)
                    elif isinstance(frame, Barrier) and frame.checkpoint_id < checkpoint_id:
                        older.append(frame)
        return promoted

    def queued_records(self) -> int:
        """Records frames received on every channel and not yet polled."""
        with self._lock:
            return sum(self._records.values())

    @property
    def finished(self) -> bool:
        """Every channel delivered its end of input, and it was polled."""
        with self._lock:
            return (
                len(self._ended) == len(self.channels)
                and not any(self._queues.values())
                and not self._priority
            )

    def poll(
        self,
        blocked: Collection[str] = (),
        timeout: float | None = None,
        *,
        priority_only: bool = False,
    ) -> tuple[str, Frame | PriorityBarrier] | None:
        """The next frame of a channel not in ``blocked`` (an unaligned barrier of any
        channel first, as a :class:`PriorityBarrier`), waiting up to ``timeout`` seconds
        (``None``: until one comes). Returns ``None`` on timeout or when nothing can come.
        ``priority_only``: only an unaligned barrier (the subtask has no room to send)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                if self._errors:
                    raise self._errors[0]
                if self._priority:
                    return self._priority.popleft()
                if priority_only:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if self._closed or (remaining is not None and remaining <= 0):
                        return None
                    self._lock.wait(remaining)
                    continue
                n = len(self.channels)
                for i in range(n):
                    channel = self.channels[(self._next + i) % n]
                    queue = self._queues[channel]
                    if queue and channel not in blocked:
                        self._next = (self._next + i + 1) % n
                        frame = queue.popleft()
                        if isinstance(frame, Records):
                            self._records[channel] -= 1
                            if channel not in self.back_edges:
                                self._grant(channel, 1)
                        return channel, frame
                if self._closed or all(
                    c in self._ended and not self._queues[c] for c in self.channels
                ):
                    return None
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._lock.wait(remaining)

    def close(self) -> None:
        """Stop listening and reading; close every connection."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._acceptor.close()

    def __enter__(self) -> InputGate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- threads

    def _read(self, conn: socket.socket) -> None:
        decoder = FrameDecoder(
            token=self._token, generation=self._generation, channels=self._queues.keys()
        )
        conn.settimeout(self.hello_timeout)  # a silent peer must not hold a reader forever
        channel: str | None = None
        try:
            while not self._closed:
                try:
                    data = conn.recv(_READ_SIZE)
                except TimeoutError:
                    with self._lock:
                        self.refused.append("a connection sent no hello in time")
                    return
                except OSError:
                    data = b""
                if not data:
                    if channel is not None and channel not in self._ended and not self._closed:
                        self._fail(
                            f"channel {channel!r}: the upstream subtask disconnected before "
                            "its end of input"
                        )
                    return
                for frame in decoder.feed(data):
                    if isinstance(frame, Hello):
                        conn.settimeout(None)
                        channel = self._greet(frame, conn)
                        if channel is None:
                            return
                        continue
                    assert channel is not None
                    if not self._put(channel, frame) or isinstance(frame, EndOfInput):
                        return  # closing now tells the sender everything arrived
        except WireError as exc:
            if decoder.hello is None:  # not one of ours (a scanner, a stale or foreign peer)
                with self._lock:
                    self.refused.append(str(exc))
            else:
                self._fail(f"channel {decoder.hello.channel!r}: {exc}")
        except Exception as exc:  # a reader must never die silently: poll() would wait forever
            self._fail(f"channel {channel!r}: {type(exc).__name__}: {exc}")
        # the acceptor closes the connection when this returns

    def _greet(self, hello: Hello, conn: socket.socket) -> str | None:
        with self._lock:
            if hello.channel not in self._queues:
                self.refused.append(f"channel {hello.channel!r} is not an input of this subtask")
                return None
            if hello.channel in self._connected:
                self.refused.append(f"channel {hello.channel!r} is already connected")
                return None
            self._connected.add(hello.channel)
            self._connections[hello.channel] = conn
            credit = UNBOUNDED_CREDIT if hello.channel in self.back_edges else self.capacity
            self._grant(hello.channel, credit)
            return hello.channel

    def _grant(self, channel: str, count: int) -> None:
        """Tell ``channel``'s sender it may send ``count`` more records frames."""
        conn = self._connections.get(channel)
        if conn is not None:
            with contextlib.suppress(OSError):  # a gone sender shows up on the reading side
                conn.sendall(encode_credit(count))

    def _put(self, channel: str, frame: Frame) -> bool:
        with self._lock:
            if self._closed:
                return False
            queue = self._queues[channel]
            if isinstance(frame, Barrier) and frame.unaligned:
                # ahead of the frames queued before it; in-line barriers it overtook are void
                overtaken = tuple(f for f in queue if isinstance(f, _IN_BAND))
                for old in [f for f in queue if isinstance(f, Barrier)]:
                    if old.checkpoint_id < frame.checkpoint_id:
                        queue.remove(old)
                self._priority.append((channel, PriorityBarrier(frame, overtaken)))
            else:
                if isinstance(frame, Records):
                    self._records[channel] += 1
                    if self._records[channel] > self.capacity and channel not in self.back_edges:
                        raise WireError(f"the sender sent more than its {self.capacity} credits")
                queue.append(frame)
                if isinstance(frame, EndOfInput):
                    self._ended.add(channel)
                    self._connections.pop(channel, None)  # no credit after the end
            self._lock.notify_all()
            return True

    def _fail(self, message: str) -> None:
        with self._lock:
            self._errors.append(ChannelError(message))
            self._lock.notify_all()


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
            overtaken: list[InBand] = [f for f in self._queue if isinstance(f, _IN_BAND)]
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
                if isinstance(frame, _IN_BAND):
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
