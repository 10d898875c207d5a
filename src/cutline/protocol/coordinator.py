"""The checkpoint coordinator of one job, as a sans-IO state machine.

The coordinator owns checkpoint ids (strictly increasing), decides when to
trigger a checkpoint, collects every subtask's acknowledgement, and decides
when a checkpoint is complete, aborted, subsumed or discarded. It never reads
a clock, opens a file or sends a message: the driver that hosts it passes the
current time into every event and carries out the actions it returns, in order.

==============================================  ===========================================
event (method)                                  actions it may return
==============================================  ===========================================
``poll(now)``                                   ``TriggerCheckpoint``; ``AbortCheckpoint`` for
                                                a checkpoint that timed out; ``FailJob``
``trigger(now, final=..., savepoint=...)``      ``TriggerCheckpoint`` (on demand: the final
                                                checkpoint of bounded input, a savepoint)
``acknowledge(n, task, handle, now)``           ``WriteMetadata`` once every task acknowledged;
                                                ``DiscardState`` for a late acknowledgement
``decline(n, task, reason, now)``               ``AbortCheckpoint``; ``FailJob``
``metadata_written(n, now)``                    ``NotifyCheckpointComplete``, ``AbortCheckpoint``
                                                for older pending ones (subsumed),
                                                ``DiscardCheckpoint`` beyond retention
``metadata_failed(n, reason, now)``             ``AbortCheckpoint``; ``FailJob``
==============================================  ===========================================

A checkpoint is complete only once its metadata is written (the driver writes
it atomically, then calls :meth:`CheckpointCoordinator.metadata_written`).

A **savepoint** is a checkpoint taken on demand that the user owns: it completes
like any other (the tasks are told, sinks publish), but it is never retained
nor discarded here, and one that fails does not count towards the failures
that fail the job.

Once a **final** checkpoint is triggered, :meth:`CheckpointCoordinator.poll` triggers no
periodic one; if the final one aborts, the job did not end with it, and periodic checkpoints
go on until the next final trigger (a stop with a savepoint that failed: the job goes on).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, TypeAlias, TypeVar

from cutline.protocol.errors import ProtocolError

T = TypeVar("T", bound=Hashable)
"""The type of a subtask id (each subtask acknowledges each checkpoint)."""
H = TypeVar("H")
"""The type of a state handle: whatever a task reports about the state it wrote."""


class UnknownCheckpointError(ProtocolError):
    """An event names a checkpoint id the coordinator never triggered."""


class UnknownTaskError(ProtocolError):
    """An event names a task that is not part of the job."""


class DuplicateAcknowledgementError(ProtocolError):
    """A task acknowledged or declined the same checkpoint twice."""


@dataclass(frozen=True)
class CheckpointSettings:
    """How often checkpoints are taken and how failures are tolerated (times in seconds)."""

    interval: float | None = 1.0
    """Seconds between two triggers; ``None`` triggers only on demand."""
    timeout: float = 600.0
    """A checkpoint not acknowledged by every task this long after its trigger is aborted (the
    write of its metadata is bounded by the driver, see ``metadata_failed``)."""
    min_pause: float = 0.0
    """Seconds from the end of one checkpoint (complete or aborted) to the next trigger."""
    max_concurrent: int = 1
    """Checkpoints in flight at once."""
    tolerable_failures: int = 0
    """Consecutive failed checkpoints (timed out or declined) tolerated before the job fails."""
    retained: int = 1
    """Complete checkpoints kept; older ones are discarded once a newer one is complete."""

    def __post_init__(self) -> None:
        problems = []
        if self.interval is not None and not (_seconds(self.interval) and self.interval > 0):
            problems.append(f"interval must be a positive number of seconds, not {self.interval!r}")
        if not (_seconds(self.timeout) and self.timeout > 0):
            problems.append(f"timeout must be a positive number of seconds, not {self.timeout!r}")
        if not (_seconds(self.min_pause) and self.min_pause >= 0):
            problems.append(f"min_pause must be 0 or more seconds, not {self.min_pause!r}")
        if type(self.max_concurrent) is not int or self.max_concurrent < 1:
            problems.append(f"max_concurrent must be 1 or more, not {self.max_concurrent!r}")
        if type(self.tolerable_failures) is not int or self.tolerable_failures < 0:
            problems.append(
                f"tolerable_failures must be 0 or more, not {self.tolerable_failures!r}"
            )
        if type(self.retained) is not int or self.retained < 1:
            problems.append(f"retained must be 1 or more, not {self.retained!r}")
        if problems:
            raise ValueError("invalid checkpoint settings: " + "; ".join(problems))


def _some(tasks: Iterable[Hashable], most: int = 5) -> str:
    """``a, b, c`` (and how many more): names for a message."""
    names = sorted(str(t) for t in tasks)
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def _seconds(value: object) -> bool:
    """A finite number of seconds (not a bool, not a string)."""
    return type(value) in (int, float) and math.isfinite(value)  # type: ignore[arg-type]


class CheckpointStatus(Enum):
    PENDING = "pending"
    """Triggered, waiting for acknowledgements."""
    ACKNOWLEDGED = "acknowledged"
    """Every task acknowledged; its metadata is being written."""
    COMPLETE = "complete"
    """Its metadata is written (it may since have been discarded beyond retention)."""
    ABORTED = "aborted"


@dataclass(frozen=True, slots=True)
class TriggerCheckpoint:
    """Ask every source task to take checkpoint ``checkpoint_id`` (and emit its barrier)."""

    checkpoint_id: int
    timestamp: float
    final: bool = False
    """The last checkpoint of a job whose input is bounded and exhausted."""
    savepoint: bool = False
    """A savepoint: owned by the user, never retained nor discarded by the coordinator."""


@dataclass(frozen=True, slots=True)
class WriteMetadata(Generic[T, H]):
    """Write checkpoint ``checkpoint_id``'s metadata (every task's handle) atomically, then
    call ``metadata_written``."""

    checkpoint_id: int
    handles: tuple[tuple[T, H], ...]


@dataclass(frozen=True, slots=True)
class NotifyCheckpointComplete:
    """Tell every task that checkpoint ``checkpoint_id`` is complete (sinks publish)."""

    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class AbortCheckpoint(Generic[T, H]):
    """Checkpoint ``checkpoint_id`` will never complete: tell the tasks, remove its files
    (``handles`` are the acknowledgements that came in)."""

    checkpoint_id: int
    reason: str
    handles: tuple[tuple[T, H], ...] = ()
    subsumed: bool = False
    """Aborted because a newer checkpoint completed (not a failure)."""


@dataclass(frozen=True, slots=True)
class DiscardState(Generic[T, H]):
    """A late acknowledgement of a checkpoint that was already aborted: remove its files."""

    checkpoint_id: int
    task: T
    handle: H


@dataclass(frozen=True, slots=True)
class DiscardCheckpoint:
    """A complete checkpoint beyond the retained number: remove it."""

    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class FailJob:
    """Too many consecutive checkpoint failures: fail the job (it restarts or stops)."""

    reason: str


CoordinatorAction: TypeAlias = (
    TriggerCheckpoint
    | WriteMetadata[T, H]
    | NotifyCheckpointComplete
    | AbortCheckpoint[T, H]
    | DiscardState[T, H]
    | DiscardCheckpoint
    | FailJob
)


@dataclass
class PendingCheckpoint(Generic[T, H]):
    """A checkpoint in flight."""

    checkpoint_id: int
    triggered_at: float
    final: bool
    waiting_for: set[T]
    handles: dict[T, H] = field(default_factory=dict)
    status: CheckpointStatus = CheckpointStatus.PENDING
    savepoint: bool = False


class CheckpointCoordinator(Generic[T, H]):
    """Triggers checkpoints, collects acknowledgements, completes, aborts and retains them.

    :param tasks: every task (subtask) of the job; each must acknowledge each checkpoint.
    :param settings: interval, timeout, pause, concurrency, tolerance and retention.
    :param next_id: the id of the first checkpoint. A restarted job starts above every
        checkpoint folder in its storage, complete or not (not just above the one it restored
        from), so that no id, and no folder, is ever reused.
    :param completed: ids of complete checkpoints already retained (on restore), oldest first.
    """

    def __init__(
        self,
        tasks: Iterable[T],
        settings: CheckpointSettings | None = None,
        *,
        next_id: int = 1,
        completed: Iterable[int] = (),
    ) -> None:
        self.settings = settings or CheckpointSettings()
        self.tasks: frozenset[T] = frozenset(tasks)
        if not self.tasks:
            raise ValueError("a checkpoint coordinator needs at least one task")
        if type(next_id) is not int or next_id < 0:
            raise ValueError(f"next_id must be a non-negative integer, not {next_id!r}")
        self._next_id = next_id
        self._first_id = next_id
        self._pending: dict[int, PendingCheckpoint[T, H]] = {}
        self._completed: list[int] = list(completed)
        if any(type(c) is not int or not 0 <= c < next_id for c in self._completed) or any(
            a >= b for a, b in zip(self._completed, self._completed[1:], strict=False)
        ):
            raise ValueError(
                f"completed checkpoints {self._completed} must be increasing ids below {next_id}"
            )
        self._final_triggered = False
        self._aborted: set[int] = set()  # one int per aborted checkpoint: aborts are rare
        self._savepoints: set[int] = set()
        self._abandoned_writes: set[int] = set()
        """Checkpoints aborted while their metadata was being written."""
        self._last_trigger: float | None = None
        self._last_end: float | None = None
        self._consecutive_failures = 0
        self._failed = False

    # ------------------------------------------------------------------ queries

    @property
    def pending(self) -> tuple[int, ...]:
        """Ids of the checkpoints in flight (triggered, not yet complete or aborted)."""
        return tuple(self._pending)

    @property
    def completed(self) -> tuple[int, ...]:
        """Ids of the retained complete checkpoints, oldest first."""
        return tuple(self._completed)

    @property
    def latest_completed(self) -> int | None:
        return self._completed[-1] if self._completed else None

    @property
    def consecutive_failures(self) -> int:
        return self._consecutive_failures

    def status(self, checkpoint_id: int) -> CheckpointStatus:
        pending = self._pending.get(checkpoint_id)
        if pending is not None:
            return pending.status
        if checkpoint_id in self._completed or checkpoint_id in self._savepoints:
            return CheckpointStatus.COMPLETE
        if checkpoint_id in self._aborted:
            return CheckpointStatus.ABORTED
        if type(checkpoint_id) is int and self._first_id <= checkpoint_id < self._next_id:
            return CheckpointStatus.COMPLETE  # completed, then discarded beyond retention
        raise UnknownCheckpointError(f"checkpoint {checkpoint_id!r} was never triggered")

    def next_trigger_time(self) -> float | None:
        """The earliest time :meth:`poll` may trigger a checkpoint (``None``: never by itself)."""
        if self.settings.interval is None or self._failed or self._final_triggered:
            return None
        times = [0.0]
        if self._last_trigger is not None:
            times.append(self._last_trigger + self.settings.interval)
        if self._last_end is not None:
            times.append(self._last_end + self.settings.min_pause)
        return max(times)

    # ------------------------------------------------------------------- events

    def poll(self, now: float) -> Sequence[CoordinatorAction[T, H]]:
        """Time is ``now``: abort what timed out, trigger what is due."""
        actions: list[CoordinatorAction[T, H]] = []
        for checkpoint in list(self._pending.values()):
            if checkpoint.checkpoint_id not in self._pending:
                continue  # aborted with the job a moment ago
            # A checkpoint whose metadata is being written is not timed out here: the write may
            # still land, and the tasks must not roll back a checkpoint that may be complete.
            # The driver bounds the write itself and reports ``metadata_failed``.
            if (
                checkpoint.status is CheckpointStatus.PENDING
                and now - checkpoint.triggered_at >= self.settings.timeout
            ):
                actions += self._fail(
                    checkpoint,
                    f"timed out after {self.settings.timeout:g} s waiting for "
                    f"{len(checkpoint.waiting_for)} of {len(self.tasks)} tasks: "
                    + _some(checkpoint.waiting_for),
                    now,
                )
        due = self.next_trigger_time()
        if due is not None and now >= due and len(self._pending) < self.settings.max_concurrent:
            actions += self._trigger(now, final=False, savepoint=False)
        return actions

    def trigger(
        self, now: float, *, final: bool = False, savepoint: bool = False
    ) -> Sequence[CoordinatorAction[T, H]]:
        """Trigger a checkpoint now, whatever the interval, the pause and the number in flight
        (for the final checkpoint of bounded input, or a savepoint, or both: a job that stops
        with a savepoint). Returns no action after the job failed."""
        if self._failed:
            return ()
        if final:
            self._final_triggered = True
        return self._trigger(now, final=final, savepoint=savepoint)

    def acknowledge(
        self, checkpoint_id: int, task: T, handle: H, now: float
    ) -> Sequence[CoordinatorAction[T, H]]:
        """``task`` took its part of checkpoint ``checkpoint_id`` and stored it as ``handle``."""
        checkpoint = self._lookup(checkpoint_id, task)
        if checkpoint is None:
            return (DiscardState(checkpoint_id, task, handle),)
        if task not in checkpoint.waiting_for:
            raise DuplicateAcknowledgementError(
                f"task {task!r} acknowledged checkpoint {checkpoint_id} twice"
            )
        checkpoint.waiting_for.discard(task)
        checkpoint.handles[task] = handle
        if checkpoint.waiting_for:
            return ()
        checkpoint.status = CheckpointStatus.ACKNOWLEDGED
        return (WriteMetadata(checkpoint_id, tuple(checkpoint.handles.items())),)

    def decline(
        self, checkpoint_id: int, task: T, reason: str, now: float
    ) -> Sequence[CoordinatorAction[T, H]]:
        """``task`` cannot take checkpoint ``checkpoint_id`` (it aborted its alignment, say)."""
        checkpoint = self._lookup(checkpoint_id, task)
        if checkpoint is None:
            return ()
        if task not in checkpoint.waiting_for:
            raise DuplicateAcknowledgementError(
                f"task {task!r} declined checkpoint {checkpoint_id} after acknowledging it"
            )
        return self._fail(checkpoint, f"declined by task {task!r}: {reason}", now)

    def metadata_failed(
        self, checkpoint_id: int, reason: str, now: float
    ) -> Sequence[CoordinatorAction[T, H]]:
        """The metadata of ``checkpoint_id`` could not be written, and the driver made sure it
        is not there (it removed what may have landed): the checkpoint failed."""
        checkpoint = self._pending.get(checkpoint_id)
        if checkpoint is None or checkpoint.status is not CheckpointStatus.ACKNOWLEDGED:
            raise ProtocolError(
                f"metadata of checkpoint {checkpoint_id} failed, but it was not being written"
            )
        return self._fail(checkpoint, f"its metadata could not be written: {reason}", now)

    def metadata_written(self, checkpoint_id: int, now: float) -> Sequence[CoordinatorAction[T, H]]:
        """The metadata of ``checkpoint_id`` is stored: the checkpoint is complete."""
        checkpoint = self._pending.get(checkpoint_id)
        if checkpoint is None and checkpoint_id in self._abandoned_writes:
            # Aborted (timed out, subsumed, the job failed) while its metadata was being
            # written: the folder now looks complete, and must go.
            self._abandoned_writes.discard(checkpoint_id)
            return (DiscardCheckpoint(checkpoint_id),)
        if checkpoint is None or checkpoint.status is not CheckpointStatus.ACKNOWLEDGED:
            raise ProtocolError(
                f"metadata of checkpoint {checkpoint_id} written, but it was not waiting for it"
            )
        del self._pending[checkpoint_id]
        if not checkpoint.savepoint:
            self._completed.append(checkpoint_id)
        else:
            self._savepoints.add(checkpoint_id)
        self._last_end = now
        self._consecutive_failures = 0
        actions: list[CoordinatorAction[T, H]] = [NotifyCheckpointComplete(checkpoint_id)]
        for older in [c for c in self._pending.values() if c.checkpoint_id < checkpoint_id]:
            self._drop(older)
            actions.append(
                AbortCheckpoint(
                    older.checkpoint_id,
                    f"subsumed by checkpoint {checkpoint_id}",
                    tuple(older.handles.items()),
                    subsumed=True,
                )
            )
        while len(self._completed) > self.settings.retained:
            actions.append(DiscardCheckpoint(self._completed.pop(0)))
        return actions

    # ---------------------------------------------------------------- internals

    def _trigger(
        self, now: float, *, final: bool, savepoint: bool
    ) -> list[CoordinatorAction[T, H]]:
        checkpoint_id = self._next_id
        self._next_id += 1
        self._last_trigger = now
        self._pending[checkpoint_id] = PendingCheckpoint(
            checkpoint_id, now, final, waiting_for=set(self.tasks), savepoint=savepoint
        )
        return [TriggerCheckpoint(checkpoint_id, now, final, savepoint)]

    def _drop(self, checkpoint: PendingCheckpoint[T, H]) -> None:
        """Forget a pending checkpoint that is being aborted."""
        del self._pending[checkpoint.checkpoint_id]
        self._aborted.add(checkpoint.checkpoint_id)
        if checkpoint.status is CheckpointStatus.ACKNOWLEDGED:
            self._abandoned_writes.add(checkpoint.checkpoint_id)

    def _fail(
        self, checkpoint: PendingCheckpoint[T, H], reason: str, now: float
    ) -> list[CoordinatorAction[T, H]]:
        self._drop(checkpoint)
        self._last_end = now
        if checkpoint.final and not any(p.final for p in self._pending.values()):
            # the job did not end with it: periodic checkpoints go on until the next final one
            # (a stop with a savepoint that failed: the job goes on; an aborted final
            # checkpoint of bounded input: the driver triggers another final one at once)
            self._final_triggered = False
        actions: list[CoordinatorAction[T, H]] = [
            AbortCheckpoint(checkpoint.checkpoint_id, reason, tuple(checkpoint.handles.items()))
        ]
        if checkpoint.savepoint:
            return actions  # the user asked for it and is told; the job goes on
        self._consecutive_failures += 1
        if not self._failed and self._consecutive_failures > self.settings.tolerable_failures:
            self._failed = True
            actions.append(
                FailJob(
                    f"{self._consecutive_failures} checkpoint(s) failed in a row, more than the "
                    f"{self.settings.tolerable_failures} tolerated; last: checkpoint "
                    f"{checkpoint.checkpoint_id} {reason}"
                )
            )
            for other in list(self._pending.values()):  # the job restarts: nothing completes
                self._drop(other)
                actions.append(
                    AbortCheckpoint(
                        other.checkpoint_id, "the job failed", tuple(other.handles.items())
                    )
                )
        return actions

    def _lookup(self, checkpoint_id: int, task: T) -> PendingCheckpoint[T, H] | None:
        """The pending checkpoint an acknowledgement or decline is for; ``None`` when it was
        already aborted or completed (late messages are normal)."""
        if task not in self.tasks:
            raise UnknownTaskError(f"task {task!r} is not part of this job")
        if type(checkpoint_id) is not int or not 0 <= checkpoint_id < self._next_id:
            raise UnknownCheckpointError(f"checkpoint {checkpoint_id!r} was never triggered")
        checkpoint = self._pending.get(checkpoint_id)
        if checkpoint is not None and checkpoint.status is CheckpointStatus.PENDING:
            return checkpoint
        if checkpoint is None and (
            checkpoint_id in self._aborted
            or (checkpoint_id < self._first_id and checkpoint_id not in self._completed)
        ):
            return None  # a late answer to an aborted checkpoint, or one from before a restore
        raise DuplicateAcknowledgementError(
            f"task {task!r} answered checkpoint {checkpoint_id} after every task acknowledged it"
        )
