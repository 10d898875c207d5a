"""The receiving end of a subtask's input channels: its :class:`InputGate` (the channels'
flow control and barriers: :mod:`cutline.runtime.network.channel`)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import deque
from collections.abc import Collection, Iterable

from cutline.runtime.network.channel import (
    IN_BAND,
    READ_SIZE,
    UNBOUNDED_CREDIT,
    ChannelError,
    PriorityBarrier,
)
from cutline.runtime.network.net import Acceptor
from cutline.runtime.network.wire import (
    Barrier,
    EndOfInput,
    Frame,
    FrameDecoder,
    Hello,
    InBand,
    Records,
    WireError,
    encode_credit,
)


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
                    if isinstance(frame, IN_BAND):
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
                    data = conn.recv(READ_SIZE)
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
                overtaken = tuple(f for f in queue if isinstance(f, IN_BAND))
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
