"""A checkpoint directory belongs to one running job: the lock that says which.

Two jobs writing checkpoints into one directory overwrite each other's ``chk-N`` folders and
statistics, and a restore may then read the other job's state. So the driver takes the
directory's lock before it touches anything there, and a second job refuses to start, naming the
owner: its run id, process, host, user and since when (:class:`DirectoryLockedError`).

The lock is the file ``_lock`` in the directory, holding the owner's identity, and works two ways:

* **On a local (or NFS) file system**, the owner holds an exclusive ``flock`` on it for as long
  as it runs. The kernel releases it when the process ends, however it ends, so the successor of
  a crashed owner takes it over at once (and says so: the file still names the crashed owner).
* **On any other file system** (an object store, ``memory://``), the file is a **lease**: the
  owner rewrites it every :attr:`CheckpointDirectoryLock.lease` / 3 seconds (at least every 2 s)
  from a thread of its own; a lease not renewed for :attr:`~CheckpointDirectoryLock.lease` seconds has expired, and a
  successor may take it over. An owner that finds its lease taken over (it was stopped so long
  that it expired) has lost the directory: :attr:`CheckpointDirectoryLock.lost` says why, and the
  driver stops the job. Stores without conditional writes leave a narrow race when two jobs start
  within moments of each other; the lease re-reads what it wrote to narrow it further.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import fsspec

LOCK_FILE = "_lock"


class DirectoryLockedError(Exception):
    """Another running job owns the checkpoint directory."""


@dataclass(frozen=True)
class Owner:
    """Who holds a checkpoint directory."""

    run: str
    host: str
    pid: int
    user: str
    since: float
    """Seconds since the epoch."""

    @classmethod
    def this_process(cls, run: str) -> Owner:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = str(os.getuid()) if hasattr(os, "getuid") else "?"
        return cls(run, socket.gethostname(), os.getpid(), user, time.time())

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return (
            f"run {self.run} (process {self.pid} on host {self.host}, user {self.user}, "
            f"since {since})"
        )

    @classmethod
    def parse(cls, text: str) -> tuple[Owner | None, float]:
        """The owner a lock file names and when its lease was last renewed (``None`` for an
        empty or unreadable file: no owner)."""
        try:
            data = json.loads(text)
            owner = cls(
                str(data["run"]),
                str(data["host"]),
                int(data["pid"]),
                str(data["user"]),
                float(data["since"]),
            )
            return owner, float(data.get("renewed", owner.since))
        except (ValueError, KeyError, TypeError):
            return None, 0.0


class CheckpointDirectoryLock:
    """The lock of one checkpoint directory (a local path or an fsspec URL), for ``owner``.

    :param lease: on file systems without ``flock``: seconds a lease lasts without renewal.
    """

    def __init__(
        self,
        url: str,
        owner: Owner,
        *,
        storage_options: dict[str, Any] | None = None,
        lease: float = 60.0,
    ) -> None:
        self.url = url
        self.owner = owner
        self.lease = lease
        self.fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        self.root = root.rstrip("/") or "/"
        self.path = f"{self.root}/{LOCK_FILE}"
        self.local = _is_local(self.fs)
        self.took_over: Owner | None = None
        """The owner that ended without releasing the directory (crashed, killed), if any."""
        self.lost: str | None = None
        """Why the lease was lost (taken over by another job), once it was."""
        self._file: Any = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    # ----------------------------------------------------------------- public

    def acquire(self) -> None:
        """Take the lock, or raise :class:`DirectoryLockedError` naming its owner."""
        self.fs.makedirs(self.root, exist_ok=True)
        if self.local:
            self._acquire_local()
        else:
            self._acquire_lease()

    def release(self) -> None:
        """Give the lock up (the file stays, empty: a successor takes it at once)."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(5.0)
        if self.local and self._file is not None:
            import fcntl

            with contextlib.suppress(OSError):
                self._file.seek(0)
                self._file.truncate()
                self._file.flush()
            with contextlib.suppress(OSError):
                fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None
        elif not self.local and self.lost is None:
            with contextlib.suppress(OSError):
                owner, _ = self._read_lease()
                if owner == self.owner:
                    with self.fs.open(self.path, "w") as out:
                        out.write("")

    def __enter__(self) -> CheckpointDirectoryLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # ------------------------------------------------------------------ local

    def _acquire_local(self) -> None:
        import fcntl

        handle = open(self.path, "a+")  # noqa: SIM115 (held open for as long as the job runs)
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            owner, _ = Owner.parse(handle.read())
            handle.close()
            raise DirectoryLockedError(self._refusal(owner)) from None
        handle.seek(0)
        self.took_over, _ = Owner.parse(handle.read())
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(asdict(self.owner)))
        handle.flush()
        self._file = handle

    # ------------------------------------------------------------------ lease

    def _read_lease(self) -> tuple[Owner | None, float]:
        try:
            with self.fs.open(self.path, "r") as source:
                return Owner.parse(source.read())
        except FileNotFoundError:
            return None, 0.0

    def _write_lease(self) -> None:
        with self.fs.open(self.path, "w") as out:
            out.write(json.dumps({**asdict(self.owner), "renewed": time.time()}))

    def _acquire_lease(self) -> None:
        owner, renewed = self._read_lease()
        if owner is not None and owner != self.owner:
            if time.time() - renewed < self.lease:
                raise DirectoryLockedError(self._refusal(owner))
            self.took_over = owner  # its lease expired: it ended without releasing it
        self._write_lease()
        mine, _ = self._read_lease()
        if mine != self.owner:  # another job wrote its lease in between
            raise DirectoryLockedError(self._refusal(mine))
        self._renewer = threading.Thread(
            target=self._renew, name="cutline-directory-lease", daemon=True
        )
        self._renewer.start()

    def _renew(self) -> None:
        while not self._stop.wait(min(self.lease / 3, 2.0)) and self.renew():
            pass

    def renew(self) -> bool:
        """Renew the lease (what the lease's thread does every third of it, at least every
        2 s); ``False`` once it was lost (:attr:`lost` says why)."""
        try:
            owner, _ = self._read_lease()
            if owner != self.owner:
                self.lost = (
                    f"the checkpoint directory {self.url} was taken over by "
                    + (owner.describe() if owner is not None else "someone else")
                    + f" (this job's lease of {self.lease:g} s had expired)"
                )
                return False
            self._write_lease()
        except OSError:
            pass  # a passing error: the next renewal tries again, within the lease
        return True

    def _refusal(self, owner: Owner | None) -> str:
        who = owner.describe() if owner is not None else "another job"
        return (
            f"the checkpoint directory {self.url} is in use by {who}: a checkpoint directory "
            "belongs to one running job (two would overwrite each other's checkpoints). Give "
            "this job its own checkpoint_dir, or stop the other one first. (A job that died "
            + (
                "released it when its process ended"
                if self.local
                else f"releases it when its lease expires, {self.lease:g} s after its last renewal"
            )
            + "; to resume it, run it again with restore_from='latest'.)"
        )


def _is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")
