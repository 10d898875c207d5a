"""Channels between subtasks over TCP, with bounded buffers and backpressure.

A subtask's :class:`InputGate` listens on one port for all its input
channels. Every accepted connection gets a reader thread that decodes frames
(:mod:`cutline.runtime.wire`) into that channel's bounded queue. When the
queue is full the reader stops reading the socket: the kernel's receive
buffer fills, TCP's window closes, and the upstream subtask's ``send`` blocks.
That is the backpressure: a slow subtask slows its inputs, and memory stays
bounded by ``capacity`` frames per channel plus the sockets' buffers.

The subtask's loop calls :meth:`InputGate.poll` with the channels it must not
consume now (those blocked by barrier alignment); their frames stay queued.

A connection whose hello carries another job's token or a stale generation is
refused and closed, and the gate goes on waiting for the right one. A channel
whose connection ends before its end of input is an error: the upstream
subtask failed, and :meth:`InputGate.poll` raises :class:`ChannelError`.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import deque
from collections.abc import Collection, Iterable

from cutline.runtime.net import Listener, close_socket
from cutline.runtime.wire import (
    EndOfInput,
    Frame,
    FrameDecoder,
    Hello,
    WireError,
    encode,
)

_READ_SIZE = 256 * 1024
SOCKET_BUFFER = 64 * 1024
"""Kernel buffer asked for per channel socket and direction (Linux doubles it: 128 KiB): with
the bounded queues, what bounds the records in flight between two subtasks, and so how long a
barrier waits behind them (the kernel's default can grow to several MB)."""


class ChannelError(Exception):
    """A channel broke: its upstream disconnected early, or sent bytes that are not frames."""


class InputGate:
    """Every input channel of one subtask.

    :param channels: the ids of the input channels.
    :param token: the job's secret: connections must present it.
    :param generation: the job attempt: connections from another one are refused.
    :param capacity: frames buffered per channel before its reader stops reading.
    :param host: the address to listen on (``0.0.0.0``: every interface).
    :param hello_timeout: seconds a new connection has to say hello before it is dropped.
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
    ) -> None:
        self.channels = tuple(channels)
        self.hello_timeout = hello_timeout
        if len(set(self.channels)) != len(self.channels):
            raise ValueError(f"an input channel is listed twice: {self.channels!r}")
        if capacity < 1:
            raise ValueError(f"capacity must be 1 or more, not {capacity}")
        self.capacity = capacity
        self._token = token
        self._generation = generation
        self._queues: dict[str, deque[Frame]] = {c: deque() for c in self.channels}
        self._connected: set[str] = set()
        self._ended: set[str] = set()
        self._errors: list[ChannelError] = []
        self.refused: list[str] = []
        """Why each refused connection was refused (for logs and tests)."""
        self._lock = threading.Condition()
        self._closed = False
        self._next = 0  # round-robin start, for fairness between channels
        self._listener = Listener(
            self._read, host=host, backlog=max(8, len(self.channels)), name="cutline-channel"
        )

    @property
    def port(self) -> int:
        return self._listener.port

    def buffered(self, channel: str) -> int:
        """Frames of ``channel`` received and not yet polled."""
        with self._lock:
            return len(self._queues[channel])

    @property
    def finished(self) -> bool:
        """Every channel delivered its end of input, and it was polled."""
        with self._lock:
            return len(self._ended) == len(self.channels) and not any(self._queues.values())

    def poll(
        self, blocked: Collection[str] = (), timeout: float | None = None
    ) -> tuple[str, Frame] | None:
        """The next frame of a channel not in ``blocked``, waiting up to ``timeout`` seconds
        (``None``: until one comes). Returns ``None`` on timeout or when nothing can come."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                if self._errors:
                    raise self._errors[0]
                n = len(self.channels)
                for i in range(n):
                    channel = self.channels[(self._next + i) % n]
                    queue = self._queues[channel]
                    if queue and channel not in blocked:
                        self._next = (self._next + i + 1) % n
                        frame = queue.popleft()
                        self._lock.notify_all()  # its reader may go on reading
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
        self._listener.close()

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
        with contextlib.suppress(OSError):
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
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
                        channel = self._greet(frame)
                        if channel is None:
                            return
                        conn.settimeout(None)
                        continue
                    assert channel is not None
                    if not self._put(channel, frame):
                        return
        except WireError as exc:
            if decoder.hello is None:  # not one of ours (a scanner, a stale or foreign peer)
                with self._lock:
                    self.refused.append(str(exc))
            else:
                self._fail(f"channel {decoder.hello.channel!r}: {exc}")
        except Exception as exc:  # a reader must never die silently: poll() would wait forever
            self._fail(f"channel {channel!r}: {type(exc).__name__}: {exc}")
        # the listener closes the connection when this returns

    def _greet(self, hello: Hello) -> str | None:
        with self._lock:
            if hello.channel not in self._queues:
                self.refused.append(f"channel {hello.channel!r} is not an input of this subtask")
                return None
            if hello.channel in self._connected:
                self.refused.append(f"channel {hello.channel!r} is already connected")
                return None
            self._connected.add(hello.channel)
            return hello.channel

    def _put(self, channel: str, frame: Frame) -> bool:
        with self._lock:
            queue = self._queues[channel]
            while len(queue) >= self.capacity and not self._closed:
                self._lock.wait()  # backpressure: stop reading this socket
            if self._closed:
                return False
            queue.append(frame)
            if isinstance(frame, EndOfInput):
                self._ended.add(channel)
            self._lock.notify_all()
            return True

    def _fail(self, message: str) -> None:
        with self._lock:
            self._errors.append(ChannelError(message))
            self._lock.notify_all()


class OutputChannel:
    """The sending end of one channel: connect, say hello, send frames (blocking when the
    receiver's buffers are full)."""

    def __init__(
        self,
        address: tuple[str, int],
        channel: str,
        *,
        token: bytes,
        generation: int,
        connect_timeout: float = 30.0,
    ) -> None:
        self.channel = channel
        try:
            self._sock = socket.create_connection(address, timeout=connect_timeout)
        except OSError as exc:
            raise ChannelError(
                f"channel {channel!r}: cannot connect to {address[0]}:{address[1]}: "
                f"{exc.strerror or exc}"
            ) from exc
        self._sock.settimeout(None)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with contextlib.suppress(OSError):
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
        self._send_lock = threading.Lock()
        try:
            self.send(Hello(channel, generation, token))
        except ChannelError:
            close_socket(self._sock)
            raise

    def send(self, frame: Frame) -> None:
        """Send one frame; blocks while the receiver's buffers are full (backpressure). Safe to
        call from several threads."""
        data = encode(frame)
        try:
            with self._send_lock:
                self._sock.sendall(data)
        except OSError as exc:
            raise ChannelError(
                f"channel {self.channel!r}: the downstream subtask is gone: {exc.strerror or exc}"
            ) from exc

    def close(self) -> None:
        """Close the channel; a ``send`` blocked by backpressure in another thread fails."""
        close_socket(self._sock)

    def __enter__(self) -> OutputChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
