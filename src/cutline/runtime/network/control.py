"""The control connection between the driver (which hosts the checkpoint coordinator) and each
task, over TCP: one JSON object per line.

A slot connects and says hello with its name, the job's **generation** and the job's secret
**token**; the driver refuses another job's slots and a stale attempt's, so their late
acknowledgements never reach the coordinator. Then both sides speak the typed messages of
:mod:`cutline.runtime.network.messages` (which lists them), one JSON object per line.

The driver reads every task's messages into one queue
(:meth:`ControlServer.next_event`); a slot whose connection ends without
``Finished`` shows up as a :class:`~cutline.runtime.network.messages.Lost` event, so the driver can restart the job.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import queue
import socket
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cutline.runtime.network.messages import (
    DRIVER_MESSAGES,
    MAX_LINE,
    SLOT_MESSAGES,
    ControlError,
    DriverMessage,
    Lost,
    SlotMessage,
    decode,
    encode,
    encode_line,
)
from cutline.runtime.network.net import Acceptor, close_socket, connect


@dataclass(frozen=True)
class Event:
    """A message from a slot, or :class:`Lost` when its connection ended early."""

    task: str
    message: SlotMessage | Lost


def _ascii_token(token: bytes) -> bytes:
    if not isinstance(token, bytes) or not token.isascii():
        raise ValueError("the job token must be ASCII bytes, e.g. secrets.token_hex(16).encode()")
    return token


def _lines(sock: socket.socket) -> Iterable[dict[str, Any]]:
    """The JSON messages arriving on ``sock``, until it closes."""
    buffer = b""
    while True:
        try:
            data = sock.recv(65536)
        except OSError:
            return
        if not data:
            return
        buffer += data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            try:
                message = json.loads(line)
            except (ValueError, RecursionError):
                raise ControlError("a control message is not JSON") from None
            if not isinstance(message, dict) or not isinstance(message.get("kind"), str):
                raise ControlError("a control message has no kind")
            yield message
        if len(buffer) > MAX_LINE:
            raise ControlError(f"a control message is longer than {MAX_LINE} bytes")


class ControlServer:
    """The driver's end: accepts the tasks of one generation of the job.

    :param token: the job's secret, as ASCII text in bytes (``secrets.token_hex(16).encode()``).
    :param hello_timeout: seconds a new connection has to say hello before it is dropped.
    """

    def __init__(
        self,
        tasks: Iterable[str],
        *,
        token: bytes,
        generation: int,
        host: str = "0.0.0.0",
        hello_timeout: float = 30.0,
    ) -> None:
        self.hello_timeout = hello_timeout
        self.tasks = frozenset(tasks)
        self._token = _ascii_token(token)
        self._generation = generation
        self._send_lock = threading.Lock()
        self._events: queue.Queue[Event] = queue.Queue()
        self._conns: dict[str, socket.socket] = {}
        self._lock = threading.Lock()
        self.refused: list[str] = []
        self._closed = False
        self._acceptor = Acceptor(
            self._serve, host=host, backlog=max(8, len(self.tasks)), name="cutline-control"
        )

    @property
    def port(self) -> int:
        return self._acceptor.port

    @property
    def connected(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._conns)

    def next_event(self, timeout: float | None = None) -> Event | None:
        """The next message from any task (``None`` after ``timeout`` seconds)."""
        try:
            return self._events.get(timeout=timeout)
        except queue.Empty:
            return None

    def send(self, task: str, message: DriverMessage) -> None:
        """Send a message to one slot. Raises :class:`ControlError` if it is not connected."""
        with self._lock:
            conn = self._conns.get(task)
        if conn is None:
            raise ControlError(f"task {task!r} is not connected")
        data = encode(message)
        try:
            with self._send_lock:
                conn.sendall(data)
        except OSError as exc:
            raise ControlError(f"task {task!r} is gone: {exc.strerror or exc}") from exc

    def broadcast(self, message: DriverMessage) -> None:
        """Send a message to every connected slot (one that is gone is skipped)."""
        for task in sorted(self.connected):
            with contextlib.suppress(ControlError):
                self.send(task, message)

    def close(self) -> None:
        self._closed = True
        self._acceptor.close()  # closes every connection, greeted or not

    def __enter__(self) -> ControlServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _refuse(self, conn: socket.socket, reason: str) -> None:
        with self._lock:
            self.refused.append(reason)
        close_socket(conn)  # at once, so that the peer sees its refusal

    def _serve(self, conn: socket.socket) -> None:
        task: str | None = None
        finished = reported = False
        conn.settimeout(self.hello_timeout)  # a silent peer must not hold a thread forever
        try:
            for message in _lines(conn):
                if task is None:
                    task = self._hello(conn, message)
                    if task is None:
                        return
                    conn.settimeout(None)
                    continue
                decoded: SlotMessage = decode(message, SLOT_MESSAGES, f"task {task!r}")
                finished = finished or decoded.kind == "finished"
                self._events.put(Event(task, decoded))
        except ControlError as exc:
            if task is not None:
                self._events.put(Event(task, Lost(str(exc))))
                reported = True
        finally:
            close_socket(conn)  # before reporting it lost: the acceptor would close it too late
            if task is not None:
                with self._lock:
                    self._conns.pop(task, None)
                if not finished and not reported and not self._closed:
                    self._events.put(Event(task, Lost("its control connection closed")))

    def _hello(self, conn: socket.socket, message: dict[str, Any]) -> str | None:
        token = str(message.get("token", "")).encode()
        name = message.get("task")
        if message.get("kind") != "hello" or not hmac.compare_digest(token, self._token):
            self._refuse(conn, "a connection without this job's hello and token")
            return None
        generation = message.get("generation")
        if type(generation) is not int or generation != self._generation:
            self._refuse(
                conn,
                f"task {name!r} of generation {message.get('generation')}, this is generation "
                f"{self._generation}",
            )
            return None
        if name not in self.tasks:
            self._refuse(conn, f"{name!r} is not a task of this job")
            return None
        with self._lock:
            if name in self._conns:
                self.refused.append(f"task {name!r} is already connected")
                return None
            self._conns[name] = conn
        return str(name)


class _Wake:
    """Not a message: :meth:`ControlClient.wake`'s nudge."""


class ControlClient:
    """A task's end of the control connection."""

    def __init__(
        self,
        address: tuple[str, int],
        task: str,
        *,
        token: bytes,
        generation: int,
        connect_timeout: float = 30.0,
    ) -> None:
        self.task = task
        hello = {"task": task, "generation": generation, "token": _ascii_token(token).decode()}
        self._sock = connect(
            address,
            encode_line("hello", hello),
            timeout=connect_timeout,
            error=ControlError,
            who=f"task {task!r}",
            unreachable="cannot reach the driver at",
            peer="the driver",
        )
        self._send_lock = threading.Lock()
        self._inbox: queue.Queue[DriverMessage | _Wake | None] = queue.Queue()
        threading.Thread(target=self._read, name="cutline-control-client", daemon=True).start()

    def send(self, message: SlotMessage) -> None:
        data = encode(message)
        try:
            with self._send_lock:  # the snapshot thread acknowledges while the loop sends too
                self._sock.sendall(data)
        except OSError as exc:
            raise ControlError(
                f"task {self.task!r}: the driver is gone: {exc.strerror or exc}"
            ) from exc

    def receive(self, timeout: float | None = None) -> DriverMessage | None:
        """The next message from the driver; ``None`` on timeout. Raises :class:`ControlError`
        once the driver closed the connection."""
        try:
            message = self._inbox.get(timeout=timeout)
        except queue.Empty:
            return None
        if message is None:
            self._inbox.put(None)  # stays closed
            raise ControlError(f"task {self.task!r}: the driver closed the control connection")
        if isinstance(message, _Wake):
            return None
        return message

    def wake(self) -> None:
        """End a :meth:`receive` that is waiting now (or the next one) early, with ``None``:
        something else the receiver watches changed (a subtask of the slot ended)."""
        self._inbox.put(_Wake())

    def close(self) -> None:
        close_socket(self._sock)

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self) -> None:
        try:
            for message in _lines(self._sock):
                self._inbox.put(decode(message, DRIVER_MESSAGES, "the driver"))
        except ControlError:
            pass
        finally:
            self._inbox.put(None)
