"""The savepoints someone asked a running job for, through its endpoint, in one attempt.

A request is taken when every slot runs: a plain one triggers a savepoint at once; a *stop*
one waits to be the job's final checkpoint (the sources stop first). The request is answered
when its savepoint completes (with its folder) or is aborted (with why), and every request
still waiting when the attempt ends is answered then: nobody waits for ever.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator

import fsspec

from cutline.runtime.checkpoint.storage import CheckpointStorage
from cutline.runtime.driver.client import JobEndpoint, SavepointRequest
from cutline.runtime.driver.config import JobConfig


class SavepointRequests:
    """The savepoint requests of one attempt, and the folders their savepoints go to."""

    def __init__(self, config: JobConfig, storage: CheckpointStorage, run: str) -> None:
        self._config, self._storage, self._run = config, storage, run
        self._in_flight: dict[int, SavepointRequest] = {}
        """Savepoints in flight that someone asked for."""
        self.stop_request: SavepointRequest | None = None
        """A request to stop with a savepoint: the final checkpoint will be it."""
        self.asking: SavepointRequest | None = None
        """The request whose savepoint the next trigger starts."""
        self._targets: dict[int, str] = {}
        """Savepoint in flight -> the folder it goes to (a checkpoint in it is a savepoint)."""

    def target(self, directory: str | None, checkpoint_id: int) -> str:
        """The folder savepoint ``checkpoint_id`` goes to (on the checkpoints' file system);
        ``ValueError`` if ``directory`` is on another."""
        storage, config = self._storage, self._config
        base = directory or config.savepoint_dir
        if base is None:
            root = f"{storage.root}/savepoints"
        else:
            fs, root = fsspec.core.url_to_fs(base, **dict(config.storage_options or {}))
            if type(fs) is not type(storage.fs):
                raise ValueError(
                    f"the savepoint directory {base} must be on the file system of the checkpoint "
                    f"directory {config.checkpoint_dir}"
                )
        return f"{root.rstrip('/')}/savepoint-{checkpoint_id}-{self._run}"

    def take(self, endpoint: JobEndpoint | None, stopping: bool) -> Iterator[SavepointRequest]:
        """The requests that arrived, to trigger a savepoint for each (one at a time: the
        caller triggers before it asks for the next). A request to stop is kept as
        :attr:`stop_request` instead; a second one, or one while ``stopping``, fails."""
        while endpoint is not None:
            try:
                request = endpoint.requests.get_nowait()
            except queue.Empty:
                return
            try:
                self.target(request.target, 0)
            except ValueError as exc:
                request.fail(str(exc))
                continue
            if request.stop:
                if stopping or self.stop_request is not None:
                    request.fail("the job is already stopping")
                else:
                    self.stop_request = request
                continue
            self.asking = request
            yield request
            if self.asking is not None:  # the job failed meanwhile: nothing was triggered
                self.asking.fail("the job is failing")
                self.asking = None

    def triggered(self, checkpoint: int) -> None:
        """A savepoint was triggered: it answers the request that asked for it (if any)."""
        request, self.asking = self.asking, None
        if request is not None:
            self._in_flight[checkpoint] = request
        self._targets[checkpoint] = self.target(
            request.target if request is not None else None, checkpoint
        )

    def folder(self, checkpoint: int) -> str | None:
        """The folder a savepoint in flight goes to; ``None`` for a checkpoint."""
        return self._targets.get(checkpoint)

    def completed(self, checkpoint: int, url: str) -> bool:
        """Savepoint ``checkpoint`` is complete at ``url``: answer who asked. ``True`` if it
        was the one the job stops with."""
        self._targets.pop(checkpoint, None)
        request = self._in_flight.pop(checkpoint, None)
        if request is None:
            return False
        request.succeed(url, checkpoint)
        if request is not self.stop_request:
            return False
        self.stop_request = None
        return True

    def aborted(self, checkpoint: int, reason: str) -> bool:
        """Checkpoint ``checkpoint`` was aborted: answer who asked for it. ``True`` if it was
        the savepoint to stop with (the job then goes on)."""
        self._targets.pop(checkpoint, None)
        request = self._in_flight.pop(checkpoint, None)
        if request is None:
            return False
        stop_failed = request is self.stop_request
        request.fail(
            f"savepoint {checkpoint} aborted: {reason}"
            + ("; the job goes on" if stop_failed else "")
        )
        if stop_failed:
            self.stop_request = None
        return stop_failed

    def answer_all(self, reason: str) -> None:
        """The attempt ended: whoever still waits for a savepoint gets an answer."""
        for request in [*self._in_flight.values(), self.stop_request, self.asking]:
            if request is not None:
                request.fail(f"the job stopped before the savepoint completed: {reason}")
        self._in_flight.clear()
        self.stop_request = self.asking = None
