"""Small socket helpers shared by the channels and the control connection."""

from __future__ import annotations

import contextlib
import socket


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
