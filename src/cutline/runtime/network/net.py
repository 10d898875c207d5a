"""Socket helpers shared by the channels and the control connection: closing a socket so
that its peer and its other threads notice, connecting to a peer and saying hello, and
listening on the ports ``CUTLINE_PORTS`` allows."""

from __future__ import annotations

import contextlib
import errno
import os
import random
import socket
import threading
from collections.abc import Callable


def close_socket(sock: socket.socket) -> None:
    """Shut ``sock`` down, then close it, ignoring errors.

    The shutdown matters: on Linux a plain ``close()`` from one thread neither
    wakes another thread blocked in ``accept``, ``recv`` or ``sendall`` on the
    same socket, nor (while that call holds it) sends the peer a FIN.
    """
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


def no_delay(sock: socket.socket) -> None:
    """Send small messages at once (``TCP_NODELAY``): a credit, a barrier or a control message
    written while an earlier one is not yet acknowledged would otherwise wait for that
    acknowledgement, which the peer delays by up to 40 ms (Nagle's algorithm meeting delayed
    acknowledgements)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def connect(
    address: tuple[str, int],
    hello: bytes,
    *,
    timeout: float,
    error: Callable[[str], Exception],
    who: str,
    unreachable: str,
    peer: str,
) -> socket.socket:
    """A connection to ``peer`` at ``address`` that has said ``hello`` (the opening bytes: the
    channel's or the control connection's hello, which carries the job's generation and
    token), in blocking mode; the two ends of the job that connect to another both start so.

    A failure raises ``error(message)``, naming the one who connects (``who``: ``"channel
    'a'"``, ``"task 't'"``), the peer and its address, and the system's reason:

    - no connection within ``timeout`` seconds: ``"{who}: {unreachable} HOST:PORT: why"``,
      where ``unreachable`` is the caller's own words (``"cannot connect to"``, ``"cannot
      reach the driver at"``);
    - the hello not sent: ``"{who}: cannot say hello to {peer} at HOST:PORT: why"``, after
      closing the socket (nothing half-open is left behind).

    Encode ``hello`` before calling: a token that cannot be sent is then refused before any
    connection is made."""
    host, port = address
    try:
        sock = socket.create_connection(address, timeout=timeout)
    except OSError as exc:
        raise error(f"{who}: {unreachable} {host}:{port}: {exc.strerror or exc}") from exc
    sock.settimeout(None)
    try:
        no_delay(sock)
        sock.sendall(hello)
    except OSError as exc:
        close_socket(sock)
        raise error(
            f"{who}: cannot say hello to {peer} at {host}:{port}: {exc.strerror or exc}"
        ) from exc
    return sock


PORTS_VARIABLE = "CUTLINE_PORTS"
"""``LOW-HIGH``: the TCP ports cutline listens on (data channels on the executors, the
control server and the savepoint endpoint on the driver); unset: any free port the system
gives. Set it in the driver's environment and in the executors' (``spark.executorEnv``) where a
firewall only lets a range through."""


class PortsError(ValueError):
    """``CUTLINE_PORTS`` is malformed, or every port in it is taken."""


def port_range(text: str | None = None) -> range | None:
    """The range ``CUTLINE_PORTS`` (or ``text``) names; ``None`` when it is unset."""
    text = os.environ.get(PORTS_VARIABLE) if text is None else text
    if text is None or not text.strip():
        return None
    low, sep, high = text.strip().partition("-")
    try:
        first, last = int(low), int(high if sep else low)
    except ValueError:
        first, last = -1, -1
    if not 1 <= first <= last <= 65535:
        raise PortsError(
            f"{PORTS_VARIABLE}={text!r} is not a port range: use LOW-HIGH, e.g. 40000-40999"
        )
    return range(first, last + 1)


def listen(host: str, backlog: int) -> socket.socket:
    """A listening TCP socket on ``host``: on a free port of ``CUTLINE_PORTS`` when it is set,
    else on any free port."""
    ports = port_range()
    if ports is None:
        return socket.create_server((host, 0), backlog=backlog)
    start = random.randrange(len(ports))  # many listeners start at once: spread them
    for i in range(len(ports)):
        port = ports[(start + i) % len(ports)]
        try:
            return socket.create_server((host, port), backlog=backlog)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    raise PortsError(
        f"every port of {PORTS_VARIABLE}={ports.start}-{ports.stop - 1} is in use on {host}: "
        "widen the range (each slot listens on one port per operator chain with inputs, the "
        "driver on two)"
    )


class Acceptor:
    """A listening TCP socket that hands each accepted connection to ``handle`` on a thread of
    its own, closes the connection when ``handle`` returns, and closes every connection still
    open (said hello or not) on :meth:`close`."""

    def __init__(
        self,
        handle: Callable[[socket.socket], None],
        *,
        host: str,
        backlog: int,
        name: str,
    ) -> None:
        self._handle = handle
        self._name = name
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = False
        self._server = listen(host, backlog)
        threading.Thread(target=self._accept, name=f"{name}-accept", daemon=True).start()

    @property
    def port(self) -> int:
        port: int = self._server.getsockname()[1]
        return port

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns = list(self._open)
        close_socket(self._server)  # shutdown first: it wakes the thread blocked in accept()
        for conn in conns:
            close_socket(conn)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with contextlib.suppress(OSError):  # (a peer gone already: its reader will see)
                no_delay(conn)
            with self._lock:
                if self._closed:
                    close_socket(conn)
                    return
                self._open.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name=self._name, daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._handle(conn)
        except OSError:
            if not self._closed:
                raise
            # closed under the handler's feet by close(): nothing to report
        finally:
            with self._lock:
                self._open.discard(conn)
            close_socket(conn)
