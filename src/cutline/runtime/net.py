"""Socket helpers shared by the channels and the control connection."""

from __future__ import annotations

import contextlib
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


class Listener:
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
        self._server = socket.create_server((host, 0), backlog=backlog)
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
