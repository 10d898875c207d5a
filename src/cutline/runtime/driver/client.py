"""Talking to a running job from anywhere: take a savepoint, or stop with one.

While a job runs, its driver listens on a small TCP endpoint (:class:`JobEndpoint`) and
writes where, with a secret token, to ``CHECKPOINT_DIR/_job.json`` (readable by its owner
only on a local disk); the file goes when the job ends. A :class:`JobClient` made from the
same checkpoint directory (``cutline savepoint DIR``, or Python in another process or
thread) reads it and sends one request per connection: a JSON line, answered by one JSON
line when the savepoint is complete or has failed.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import math
import os
import queue
import secrets
import socket
from dataclasses import dataclass, field
from typing import Any

import fsspec

from cutline.runtime.durations import Duration, seconds
from cutline.runtime.network.net import Acceptor

JOB_FILE = "_job.json"
_MAX_LINE = 64 * 1024


class JobClientError(Exception):
    """No running job answers for that checkpoint directory, or the request failed."""


@dataclass
class SavepointRequest:
    """A request for a savepoint, waiting for the driver's answer."""

    target: str | None
    """The directory to put the savepoint in (``None``: the job's default)."""
    stop: bool
    """Stop the job once the savepoint is complete (cancel with savepoint)."""
    answers: queue.Queue[dict[str, Any]] = field(default_factory=lambda: queue.Queue(1))

    def succeed(self, path: str, checkpoint_id: int) -> None:
        with contextlib.suppress(queue.Full):
            self.answers.put_nowait({"ok": True, "path": path, "checkpoint": checkpoint_id})

    def fail(self, reason: str) -> None:
        with contextlib.suppress(queue.Full):
            self.answers.put_nowait({"ok": False, "error": reason})


class JobEndpoint:
    """The driver's side: accepts requests and queues them for the driver's loop."""

    def __init__(self, checkpoint_dir: str, host: str, run: str, storage_options: Any = None):
        self.requests: queue.Queue[SavepointRequest] = queue.Queue()
        self._token = secrets.token_hex(16)
        self._closed = False
        self._fs, root = fsspec.core.url_to_fs(checkpoint_dir, **dict(storage_options or {}))
        self._path = f"{root.rstrip('/')}/{JOB_FILE}"
        self._acceptor = Acceptor(self._serve, host=host, backlog=8, name="cutline-endpoint")
        info = {
            "host": host,
            "port": self._acceptor.port,
            "token": self._token,
            "run": run,
            "pid": os.getpid(),
        }
        try:
            self._fs.makedirs(root, exist_ok=True)
            text = json.dumps(info)
            if os.path.isdir(root):  # a local disk: readable by the job's owner only, at once
                fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as out:
                    out.write(text)
            else:
                with self._fs.open(self._path, "w") as out:
                    out.write(text)
        except BaseException:
            self._acceptor.close()
            raise

    def close(self) -> None:
        self._closed = True
        self._acceptor.close()
        with contextlib.suppress(OSError):
            self._fs.rm(self._path)
        while True:  # nobody will answer these any more
            try:
                self.requests.get_nowait().fail("the job ended")
            except queue.Empty:
                return

    def _serve(self, conn: socket.socket) -> None:
        request = _read_line(conn)
        if request is None:
            return
        if not hmac.compare_digest(str(request.get("token", "")), self._token):
            _write_line(conn, {"ok": False, "error": "wrong token"})
            return
        if request.get("kind") != "savepoint":
            _write_line(conn, {"ok": False, "error": f"unknown request {request.get('kind')!r}"})
            return
        target = request.get("target")
        pending = SavepointRequest(str(target) if target else None, bool(request.get("stop")))
        self.requests.put(pending)
        while True:
            try:
                answer = pending.answers.get(timeout=1.0)
                break
            except queue.Empty:
                if self._closed:  # came as the job ended: nobody will take it
                    answer = {"ok": False, "error": "the job ended"}
                    break
        _write_line(conn, answer)


def _read_line(conn: socket.socket) -> dict[str, Any] | None:
    buffer = b""
    while b"\n" not in buffer:
        data = conn.recv(4096)
        if not data or len(buffer) > _MAX_LINE:
            return None
        buffer += data
    try:
        message = json.loads(buffer.split(b"\n", 1)[0])
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def _write_line(conn: socket.socket, message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps(message).encode() + b"\n")


class JobClient:
    """A handle on the job running with checkpoint directory ``checkpoint_dir``.

    >>> JobClient("/data/checkpoints").savepoint()            # doctest: +SKIP
    '/data/checkpoints/savepoints/savepoint-12-3fa2b1c0'
    """

    def __init__(self, checkpoint_dir: str, *, storage_options: Any = None) -> None:
        self.checkpoint_dir = os.fspath(checkpoint_dir)
        fs, root = fsspec.core.url_to_fs(self.checkpoint_dir, **dict(storage_options or {}))
        path = f"{root.rstrip('/')}/{JOB_FILE}"
        try:
            with fs.open(path, "r") as source:
                self._info = json.loads(source.read())
        except FileNotFoundError:
            raise JobClientError(
                f"no job is running with checkpoint directory {self.checkpoint_dir} "
                f"({JOB_FILE} is not there)"
            ) from None
        except (OSError, ValueError) as exc:
            raise JobClientError(f"cannot read {path}: {exc}") from None

    @property
    def run(self) -> str:
        return str(self._info.get("run"))

    def savepoint(
        self,
        target: str | os.PathLike[str] | None = None,
        *,
        stop: bool = False,
        timeout: Duration = "10min",
    ) -> str:
        """Take a savepoint and return its folder (a URL or path).

        :param target: the directory to put it in (default: ``CHECKPOINT_DIR/savepoints``).
        :param stop: stop the job once the savepoint is complete: the sources stop reading,
            everything read before it is processed and published, and ``execute()`` returns.
        :param timeout: how long to wait for it (a duration: ``"30s"``, a ``timedelta``, or a
            number of seconds).
        :raises JobClientError: no job answers, or the savepoint failed (the message says why).
        """
        wait = seconds(timeout, "savepoint: timeout")
        if wait is None or not 0 < wait < math.inf:
            raise ValueError(f"savepoint: timeout must be a positive duration, not {timeout!r}")
        request = {
            "kind": "savepoint",
            "token": self._info.get("token"),
            "target": os.fspath(target) if target is not None else None,
            "stop": stop,
        }
        address = (str(self._info.get("host")), int(self._info.get("port", 0)))
        try:
            with socket.create_connection(address, timeout=10.0) as conn:
                conn.settimeout(wait)
                conn.sendall(json.dumps(request).encode() + b"\n")
                answer = _read_line(conn)
        except OSError as exc:
            raise JobClientError(
                f"the job of {self.checkpoint_dir} (run {self.run}) does not answer at "
                f"{address[0]}:{address[1]}: {exc} (it may have ended without removing "
                f"{JOB_FILE})"
            ) from None
        if answer is None:
            raise JobClientError(f"the job of {self.checkpoint_dir} closed the connection")
        if not answer.get("ok"):
            raise JobClientError(f"the savepoint failed: {answer.get('error')}")
        return str(answer["path"])
