"""The source API: what a connector implements to be read by a cutline job.

A **source** (:class:`Source`, picklable: it travels in the job's plan to every worker) says
what its input is made of: **splits** (:class:`~cutline.protocol.splits.Split`: a file, a
partition, a slice of a range), each with an id that never changes. Every subtask of the
source opens a **reader** (:class:`SplitReader`); cutline decides which splits each reader gets
(:func:`~cutline.protocol.splits.owner`: the same answer on every worker, without talking)
and hands them over with the position to start from: the beginning, or where a restored
checkpoint left it.

A reader's :meth:`SplitReader.read` has three outcomes: :class:`Records` (of one split),
:class:`Nothing` now (cutline waits a little, still answering the driver, and asks again), or
a split :class:`Finished`. At every checkpoint cutline asks the reader where each of its
unfinished splits stands (:meth:`SplitReader.position`: small and picklable), and stores that;
a restore, at any parallelism, hands each split to its new reader from there. So whatever the
reader read after the checkpoint is read again, and nothing before it: exactly once, when the
reader reads the same records again from a position.

**Threads.** Every call cutline makes to one reader, from :meth:`Source.reader` that makes it
to its :meth:`SplitReader.close`, is made on one thread, its subtask's, one call at a time: a
client bound to the thread that made it can be kept in the reader. Event time
(``event_time=`` on ``env.from_source``) is cutline's: watermarks per split from the records
each read returns (:class:`Records` names its split), idleness, and the lowest timestamp a
split not started yet may hold (:meth:`SplitReader.lowest_timestamp`, :meth:`SplitReader.head`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

import pyarrow as pa

from cutline.protocol.splits import Split

Batch: TypeAlias = pa.RecordBatch | list[Any]
"""What a reader returns: an Arrow record batch (the fast path), or a list of records."""


class SourceError(Exception):
    """A source cannot be read (its input is missing, damaged, or does not fit): the message
    names the source, the split or file, and what to do. ``record``: the record that cannot
    be read, when one is to blame (a line, a Kafka message: where it is and what it holds); a
    job that fails at the same record twice in a row does not restart again (a restart
    cannot help)."""

    def __init__(self, message: str, record: Any = None) -> None:
        super().__init__(message)
        self.record = record


def with_types(inferred: pa.Schema, types: pa.Schema) -> pa.Schema:
    """A schema a source inferred from its input, with the types ``types`` gives the fields
    it names (a ``schema=`` dict: the user's types of some fields); those the input did not
    show come last."""
    fields = [types.field(f.name) if f.name in types.names else f for f in inferred]
    fields += [f for f in types if f.name not in inferred.names]
    return pa.schema(fields)


@dataclass(frozen=True)
class Records:
    """Records read from split ``split``. ``split=None``: from several splits at once (a reader
    that reads its splits together, :attr:`Source.watermarks_per_split` ``False``)."""

    batch: Batch
    split: str | None


@dataclass(frozen=True)
class Nothing:
    """No record now: ask again in about ``wait`` seconds (cutline waits at most that long,
    answering the driver meanwhile, and sends nothing downstream)."""

    wait: float = 0.05


@dataclass(frozen=True)
class Finished:
    """Every record of split ``split`` was read: it is never read again, not even after a
    restore."""

    split: str


ReadResult = Records | Nothing | Finished


@dataclass(frozen=True)
class SourceContext:
    """What a reader knows of where it runs."""

    name: str
    """The source operator's name (for messages)."""
    subtask: int
    parallelism: int
    rejected: Callable[[Any, str], None] | None = None
    """With ``on_error="dead_letter"``: hand a record that cannot be read here
    (``rejected(record, why)``), and go on; ``None``: raise :class:`SourceError` instead."""
    warn: Callable[[str], None] | None = None
    """Tell the user something that is not a failure (the job's listener hears it, with the
    subtask's name); ``None``: nowhere to."""
    skipped: Callable[[str, int, str], None] | None = None
    """Report records that will never be read, because a split's position could not be
    honoured and the user chose to read on elsewhere rather than fail (``skipped(split,
    records, why)``: how many, and why, naming the split and both positions). cutline counts
    them per source, once however often a restore repeats the same skip, and tells the user:
    the job's listener, the live display and the result. ``None``: nowhere to (say it with
    ``warn``)."""


class SplitReader(ABC):
    """Reads the splits cutline hands to one subtask of a source (see the module's docstring).
    Every method runs on the subtask's thread, the one that called :meth:`Source.reader`;
    none may block for long (``read`` answers :class:`Nothing` rather than wait for input)."""

    @abstractmethod
    def add_split(self, split: Split, position: Any) -> None:
        """Read ``split`` from now on, from ``position`` (``None``: its beginning; else a
        position this source's :meth:`position` gave for it)."""

    @abstractmethod
    def read(self, max_records: int) -> ReadResult:
        """At most ``max_records`` records of one of its splits, or :class:`Nothing` now, or
        that a split finished. With no split left (all finished, none added yet), return
        :class:`Nothing`: a bounded source ends once its listed splits all finished."""

    @abstractmethod
    def position(self, split: str) -> Any:
        """Where the reader stands in ``split`` (one it has and did not finish): every record
        it returned of it is before this position. Small and picklable: it goes into every
        checkpoint."""

    def lowest_timestamp(self, split: str, column: str) -> int | None:
        """The lowest value of event-time ``column`` in ``split``, in epoch milliseconds, if
        the reader knows it without reading it (a Parquet footer): a split not started yet
        holds the watermark there. ``None``: unknown."""
        return None

    def head(self, split: str) -> pa.RecordBatch | None:
        """The first records of ``split``, read apart from the reading, if cheap (the first
        block of a file): a split not started yet holds the watermark where they allow.
        ``None``: none (the split holds the watermark back until it starts)."""
        return None

    def caught_up(self) -> Iterable[str]:
        """The splits it has read all there is of, for now (a partition at its end): with
        event time, one that never showed a record stops holding the watermark back
        ``idle_timeout`` after it is first said here (so an empty partition does not hold it
        for ever). Asked every few tens of milliseconds when there is an ``idle_timeout``;
        by default none (a split holds the watermark until its records start)."""
        return ()

    def positions_taken(self, checkpoint_id: int, positions: Mapping[str, Any]) -> None:
        """Checkpoint ``checkpoint_id`` holds ``positions`` (what :meth:`position` just gave,
        per unfinished split). A reader that publishes its positions once a checkpoint
        completes keeps them until :meth:`checkpoint_complete` (several checkpoints may be in
        flight; one may never complete)."""
        return None

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is complete: the positions it holds are durable (a
        Kafka reader may publish those :meth:`positions_taken` gave for it, for monitoring)."""
        return None

    def close(self) -> None:
        """The subtask ends, fails or is cancelled: release what the reader holds."""
        return None


class Source(ABC):
    """What a job reads (see the module's docstring). Picklable: it is built on the driver and
    sent to every worker."""

    bounded: bool = True
    """Whether its splits end (a bounded source ends the job once every split finished);
    ``False``: the job runs until stopped (``stop_after``, a savepoint with ``stop=True``)."""
    discovery_interval: float | None = None
    """Seconds between two listings of its splits on each subtask (new files, new partitions);
    ``None``: its splits are listed once, when the subtask opens."""
    watermarks_per_split: bool = True
    """Whether each :class:`Records` names its split (watermarks per split); ``False``: the
    reader reads its splits together, and its subtask's event time is one."""

    def record_schema(self) -> pa.Schema | None:
        """The columns of its records when it knows them before reading (``event_time=`` is
        then checked when the job is built); ``None``: unknown."""
        return None

    def prepare(self) -> tuple[Source, list[str]]:
        """Called once on the driver when the job is built: this source ready to send to the
        workers (a schema inferred, the splits there are now numbered, a missing input said
        as :class:`SourceError`), and warnings to show the user."""
        return self, []

    @abstractmethod
    def splits(self) -> Iterable[Split]:
        """Every split there is now (on each subtask: when it opens, then every
        :attr:`discovery_interval`). A split's id and ordinal never change."""

    @abstractmethod
    def reader(self, context: SourceContext) -> SplitReader:
        """A reader for one subtask, made on that subtask's thread (once per attempt), which
        makes every call to it."""
