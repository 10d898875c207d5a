"""What a running job tells its user, typed: the job events.

The driver says each event as a frozen dataclass (a :class:`JobEvent`); what it says is in
its fields, and :attr:`JobEvent.message` words it as a sentence. A listener is either

* a :class:`JobListener`, whose :meth:`~JobListener.on_event` gets the event itself (match on
  its class to read its fields), or
* any callable taking ``(kind, message)``: ``print`` reads as a sentence.

============================  ==========  ======================================================
event                         ``kind``    when
============================  ==========  ======================================================
:class:`CheckpointCompleted`  checkpoint  a checkpoint completed
:class:`SavepointCompleted`   savepoint   a savepoint completed (with its folder)
:class:`CheckpointAborted`    abort       a checkpoint was aborted (not one a newer one
                                          subsumed)
:class:`CheckpointSlow`       waiting     a checkpoint in flight for longer than its interval:
                                          what it waits for (said once)
:class:`WaitingForSlots`      slots       waiting for task slots, or for lost hosts
:class:`GenerationRunning`    running     every slot of a generation is ready, and where
:class:`Restarting`           restart     a generation failed and the job restarts
:class:`JobFailure`           failure     the job failed for good (``execute`` raises next)
:class:`RecordsSkipped`       skipped     a source skipped records it will never read, as the
                                          user's policy said (once per skip)
:class:`JobWarning`           warning     anything else a user should know
============================  ==========  ======================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, TypeAlias


class JobEvent:
    """Something a running job tells its user."""

    kind: ClassVar[str]

    @property
    def message(self) -> str:
        """The event as a sentence (after its ``kind``)."""
        raise NotImplementedError

    def __str__(self) -> str:
        return f"{self.kind} {self.message}"


@dataclass(frozen=True)
class CheckpointCompleted(JobEvent):
    kind: ClassVar[str] = "checkpoint"
    checkpoint: int
    duration: float
    """Seconds from its trigger to its completion."""
    final: bool = False
    """The last checkpoint of the job (taken once the input ended, or at a stop)."""
    late: tuple[tuple[str, int], ...] = ()
    """Per window operator (its name) with any, the records too late for its windows since
    the job started, at the checkpoint (a record late for two windows counts in each)."""

    @property
    def message(self) -> str:
        late = ", ".join(f"{name} {count:,}" for name, count in self.late)
        return (
            f"{self.checkpoint} complete in {self.duration:.2f} s"
            + (" (final)" if self.final else "")
            + (f"; late records so far: {late}" if late else "")
        )


@dataclass(frozen=True)
class SavepointCompleted(CheckpointCompleted):
    kind: ClassVar[str] = "savepoint"
    folder: str = ""
    """Where the savepoint is (restore it with ``restore_from=``)."""

    @property
    def message(self) -> str:
        return f"{super().message}: {self.folder}"


@dataclass(frozen=True)
class CheckpointAborted(JobEvent):
    kind: ClassVar[str] = "abort"
    checkpoint: int
    reason: str

    @property
    def message(self) -> str:
        return f"checkpoint {self.checkpoint}: {self.reason}"


@dataclass(frozen=True)
class CheckpointSlow(JobEvent):
    kind: ClassVar[str] = "waiting"
    checkpoint: int
    description: str
    """How long it has been in flight, the subtasks it waits for, and the backpressure its
    barrier waits behind."""

    @property
    def message(self) -> str:
        return self.description


@dataclass(frozen=True)
class WaitingForSlots(JobEvent):
    kind: ClassVar[str] = "slots"
    description: str

    @property
    def message(self) -> str:
        return self.description


@dataclass(frozen=True)
class GenerationRunning(JobEvent):
    kind: ClassVar[str] = "running"
    generation: int
    hosts: dict[str, str]
    """Slot -> the host it runs on."""

    @property
    def message(self) -> str:
        where = ", ".join(f"{slot} on {self.hosts[slot] or '?'}" for slot in sorted(self.hosts))
        return f"generation {self.generation}: {where}"


@dataclass(frozen=True)
class Restarting(JobEvent):
    kind: ClassVar[str] = "restart"
    generation: int
    """The generation that failed."""
    cause: str
    delay: float
    """Seconds until the next generation starts."""
    restored: int | None
    """The checkpoint it restarts from (``None``: the start)."""

    @property
    def message(self) -> str:
        start = f"checkpoint {self.restored}" if self.restored is not None else "the start"
        return (
            f"generation {self.generation} failed: {self.cause}\n"
            f"restarting in {self.delay:g} s from {start}"
        )


@dataclass(frozen=True)
class JobFailure(JobEvent):
    kind: ClassVar[str] = "failure"
    cause: str

    @property
    def message(self) -> str:
        return self.cause


@dataclass(frozen=True)
class RecordsSkipped(JobEvent):
    """A source read on past records it will never read: a split's position its input no
    longer held, and the user chose to read on elsewhere rather than fail (Kafka's
    ``on_offset_out_of_range``). Said once per skip, however often a restore repeats it."""

    kind: ClassVar[str] = "skipped"
    source: str
    split: str
    records: int
    why: str
    """Names the split and both positions."""

    @property
    def message(self) -> str:
        return f"{self.source}: {self.records:,} records of {self.split} skipped: {self.why}"


@dataclass(frozen=True)
class JobWarning(JobEvent):
    kind: ClassVar[str] = "warning"
    text: str

    @property
    def message(self) -> str:
        return self.text


class JobListener:
    """A listener that gets the job's events typed: override :meth:`on_event`."""

    def on_event(self, event: JobEvent) -> None:
        raise NotImplementedError


EventListener: TypeAlias = Callable[[JobEvent], None]
"""What the driver calls with each event."""

Listener: TypeAlias = JobListener | Callable[[str, str], None]
"""What a user gives: a :class:`JobListener`, or a callable taking ``(kind, message)``."""


def event_listener(listener: Listener | None) -> EventListener:
    """The driver's listener for what a user gave (``None``: nobody listens)."""
    if listener is None:
        return lambda event: None
    if isinstance(listener, JobListener):
        return listener.on_event
    told = listener
    return lambda event: told(event.kind, event.message)
