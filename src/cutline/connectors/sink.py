"""The sink API: what a connector implements to be written to by a cutline job.

A **sink** (:class:`Sink`, picklable) makes a **writer** (:class:`SinkWriter`) on every
subtask of the sink operator. Exactly once is a two-phase commit around the checkpoints
(Flink's Sink V2, SEMANTICS §4):

1. the writer takes the records (:meth:`SinkWriter.write`), staged where nobody reads them
   yet (a pending file, an open transaction);
2. at a checkpoint's barrier, :meth:`SinkWriter.prepare_commit` closes what came since the
   last one and returns a small, picklable **committable** saying what to commit (the file
   names, the transaction id), stored in the checkpoint; the slow part (writing a file) may
   be left to a :class:`PendingCommit`, which cutline completes on the subtask's snapshot
   thread while records keep flowing;
3. when the checkpoint is complete, :meth:`SinkWriter.commit` makes everything prepared up
   to it visible, **idempotently** (after a failure it may be asked again);
4. after a restore, :meth:`Sink.writer` gets the committables of the restored checkpoint that
   it owns (its own subtask's, or at another parallelism those of the old subtasks it takes
   over: old subtask ``j`` goes to ``j % parallelism``): it commits them (they may not have
   been) and aborts whatever else it staged after them.

A sink without transactions gives at-least-once output: ``stream.sink_to(fn)`` calls
``fn(batch)`` for every batch, and a restore calls it again for the batches after the
restored checkpoint (:class:`FunctionSink`).

**Threads.** Every call cutline makes to one writer, from :meth:`Sink.writer` that makes it to
its :meth:`SinkWriter.close`, is made on one thread, its subtask's, one call at a time: a client
bound to the thread that made it (a ``sqlite3`` connection) can be kept in the writer. The one
exception is :meth:`PendingCommit.complete`: it runs on the subtask's snapshot thread, one at a
time and in checkpoint order, while the subtask's thread goes on calling the writer
(:meth:`SinkWriter.write`, and :meth:`SinkWriter.commit` of an earlier checkpoint; the commit of
its own checkpoint comes only after it returned), so what it touches must be safe to use from
that thread. When the subtask fails or is stopped, :meth:`SinkWriter.abort` and
:meth:`SinkWriter.close` do not wait for a ``complete()`` still running; when it ends, ``close()``
comes after every one.

A record the destination refuses (a value its column cannot take) is a :class:`RecordError`
raised by :meth:`SinkWriter.write` or :meth:`SinkWriter.prepare_commit`: the job fails naming
it, or with ``on_error="dead_letter"`` it goes to the dead letters and the job goes on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cutline.connectors.source import Batch


class SinkError(Exception):
    """A sink cannot write, stage or commit its output: the message names the sink and the
    file, table or transaction."""


class RecordError(Exception):
    """A record that cannot be handled, though the job can go on without it: one a writer's
    destination refused (a value its column cannot take), or one cutline cannot handle itself
    (not a dict where columns are needed, a missing key column). Reported like a user
    function's error, with the record: the job fails naming it, or with
    ``on_error="dead_letter"`` it goes to the dead letters with ``message`` and the job goes
    on. ``message`` should say what is wrong and where (the table, the column, the value),
    the same way every time the record comes (no times, counters or transaction ids in it): a
    record that fails alike in two attempts in a row fails the job."""

    def __init__(self, message: str, record: Any = None) -> None:
        super().__init__(message)
        self.record = record


@dataclass(frozen=True)
class SinkContext:
    """What a writer knows of where it runs."""

    name: str
    """The sink operator's name (for messages)."""
    subtask: int
    parallelism: int
    generation: int
    """The job's attempt (1, 2, ... within one run): names staged by an attempt carry it."""
    run: str
    """The id of this run of the job (one ``execute()``): lowercase letters and digits."""
    checkpoint_dir: str = ""
    storage_options: Mapping[str, Any] | None = None
    job: str = ""
    """The id of the job: the same for every run that resumes the checkpoint directory's
    lineage (``restore_from="latest"``), new for a fresh start or a restore from elsewhere.
    Lowercase letters and digits. A transactional sink names its transactions with it (and
    ``uid``, ``subtask`` and the checkpoint id), so that after any restart it finds the
    ones it staged and the restored checkpoint does not hold, and aborts them."""
    uid: str = ""
    """The sink operator's id: unique in the job, the same in every run (its ``name=``, or
    one derived from what it is and reads). Two sinks of one job never share it."""


class PendingCommit(ABC):
    """A committable whose slow part is still to do: cutline calls :meth:`complete` on the
    subtask's snapshot thread (the asynchronous part of the checkpoint), not the thread that
    calls the writer (see the module's docstring)."""

    @abstractmethod
    def complete(self) -> Any:
        """Finish staging (write the file); return the committable for the checkpoint."""


class SinkWriter(ABC):
    """Writes one subtask's records (see the module's docstring). Every method is called on
    the subtask's thread, the one that called :meth:`Sink.writer`."""

    @abstractmethod
    def write(self, batch: Batch) -> None:
        """Take ``batch`` (an Arrow record batch, or a list of records), staged until a
        checkpoint commits it. A :class:`RecordError` for one record the destination refused
        (of this batch, or of one held since) once every other record given is taken."""

    @abstractmethod
    def prepare_commit(self, checkpoint_id: int) -> Any:
        """The barrier of ``checkpoint_id``: close what was written since the last one and
        return its committable (small, picklable; ``None``: nothing), or a
        :class:`PendingCommit` that makes it on the snapshot thread. A :class:`RecordError`
        for a record refused while sending what it held: cutline puts it aside (or fails)
        and asks again, until it returns."""

    @abstractmethod
    def commit(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is complete: make every committable prepared up to it
        visible. Idempotent."""

    def abort(self) -> None:
        """The subtask fails or is cancelled: drop what was staged and not prepared (what was
        prepared is the restored writer's to commit or abort). Before :meth:`close`; a
        ``complete()`` may still run on the snapshot thread."""
        return None

    def close(self) -> None:
        """The subtask ends: release what the writer holds."""
        return None


class GlobalCommitter(ABC):
    """One commit per checkpoint covering every subtask's committables, on the driver (a
    table format, Delta Lake or Iceberg, where one transaction must add every subtask's
    files)."""

    @abstractmethod
    def commit(self, checkpoint_id: int, committables: list[Any]) -> None:
        """Checkpoint ``checkpoint_id`` is complete: commit the committables its subtasks
        prepared, at once. Called after the checkpoint is durable and before its subtasks
        hear of it; after a failure (of this call, or of the driver), again for the
        checkpoint the job restores: it must be **idempotent** (find out whether that
        checkpoint was committed: a table's version, an application transaction id). What it
        raises fails the job over."""


class Sink(ABC):
    """Where a job writes (see the module's docstring). Picklable."""

    columnar: bool = False
    """Its writers are given Arrow record batches: cutline turns records (dicts) into one, and
    a record that does not fit fails naming it (``on_error``). ``False``: batches as they
    come, Arrow or lists of records."""

    def global_committer(self) -> GlobalCommitter | None:
        """Its committer on the driver, if its commit must cover every subtask at once (its
        writers' :meth:`SinkWriter.commit` then usually does nothing); ``None``: each writer
        commits its own."""
        return None

    @abstractmethod
    def writer(self, context: SinkContext, restored: Mapping[int, Any]) -> SinkWriter:
        """A writer for one subtask, made on the subtask's thread (once per attempt), which
        makes every call to it: ``restored`` maps old subtask indexes to their committables in
        the restored checkpoint (empty on a fresh start): commit those, abort the rest those
        subtasks staged."""


@dataclass(frozen=True)
class FunctionSink(Sink):
    """``stream.sink_to(fn)``: ``fn(batch)`` for every batch, **at least once**: after a
    failure, the batches since the restored checkpoint are given again. For destinations
    without transactions (an HTTP endpoint, a log); make ``fn`` idempotent where it can be."""

    fn: Callable[[Batch], Any]

    def writer(self, context: SinkContext, restored: Mapping[int, Any]) -> SinkWriter:
        return _FunctionWriter(self.fn)


class _FunctionWriter(SinkWriter):
    def __init__(self, fn: Callable[[Batch], Any]) -> None:
        self.fn = fn

    def write(self, batch: Batch) -> None:
        self.fn(batch)

    def prepare_commit(self, checkpoint_id: int) -> None:
        return None

    def commit(self, checkpoint_id: int) -> None:
        return None
