"""What a job returns or raises: :class:`JobResult`, :class:`JobFailedError`,
:class:`JobInterrupted`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cutline.runtime.checkpoint.stats import (
    CheckpointStats,
    RestartInfo,
)
from cutline.runtime.driver.metrics import JobMetrics
from cutline.runtime.driver.summary import JobCounts, JobSummary


class JobFailedError(Exception):
    """The job failed and the restart strategy gave up. The message names the operator, the
    subtask and the user's traceback when a user function failed."""

    def __init__(
        self, message: str, failure: Failure | None = None, *, deterministic: bool = False
    ) -> None:
        super().__init__(message)
        self.failure = failure
        self.deterministic = deterministic
        """It failed at the same record twice in a row: a restart could not help (the
        restart strategy's attempts were not used up)."""

    @property
    def operator(self) -> str | None:
        return self.failure.operator if self.failure else None

    @property
    def subtask(self) -> str | None:
        return self.failure.subtask if self.failure else None

    @property
    def user_traceback(self) -> str | None:
        return self.failure.traceback if self.failure else None


class JobInterrupted(KeyboardInterrupt):
    """The job was interrupted (Ctrl-C): its attempt was cancelled. ``checkpoint`` is the
    newest checkpoint it completed, from which ``restore_from="latest"`` resumes it."""

    def __init__(self, message: str, checkpoint: int | None) -> None:
        super().__init__(message)
        self.checkpoint = checkpoint


class CheckpointWarning(UserWarning):
    """A complete checkpoint was skipped on restore because it is damaged."""


@dataclass(frozen=True)
class Failure:
    """Why an attempt of the job failed."""

    cause: str
    """``task`` (an exception), ``lost`` (a worker died or stopped answering), ``deadline`` (a
    slot did not get through a phase of its start or end in time), ``checkpoint`` (too many
    failed checkpoints), ``launcher`` (Spark itself), ``lock`` (another job took the checkpoint
    directory over: never restarted), ``commit`` (a sink's global commit on the driver)."""
    message: str
    subtask: str | None = None
    operator: str | None = None
    record: str | None = None
    traceback: str | None = None
    passing: bool = False
    """The error is of a kind that passes (``OSError``: a connection refused or reset, a
    timeout, I/O): never taken for a deterministic one, even at the same record twice."""

    def describe(self) -> str:
        where = f"{self.operator} (subtask {self.subtask})" if self.operator else self.subtask
        text = f"{where}: {self.message}" if where else self.message
        if self.record is not None:
            text += f"\n  record: {self.record}"
        if self.traceback:
            text += "\n" + self.traceback.rstrip()
        return text


@dataclass
class JobResult:
    """What ``execute()`` returns (the driver's ``JobDriver.run`` makes it)."""

    checkpoints: list[CheckpointStats] = field(default_factory=list)
    """The completed checkpoints and savepoints, with their statistics (per subtask for the
    newest ``SUBTASK_DETAILS`` (100) only, so a long run's result stays small: every
    checkpoint's are in ``CHECKPOINT_DIR/_stats``)."""
    aborted: list[tuple[int, str]] = field(default_factory=list)
    restarts: list[RestartInfo] = field(default_factory=list)
    collected: dict[str, list[Any]] = field(default_factory=dict)
    duration: float = 0.0
    generations: int = 0
    records_in: dict[str, int] = field(default_factory=dict)
    """Records each subtask took in, in the last generation."""
    source_records: dict[int, int] = field(default_factory=dict)
    """Per generation, the records its source subtasks read (for a failed generation: as last
    reported, at most a heartbeat before it failed)."""
    running_seconds: float = 0.0
    """The last generation's time from every slot running to every slot finished."""
    savepoints: list[str] = field(default_factory=list)
    """The folders of the savepoints taken (the last one is where a stopped job resumes)."""
    restored_from: str | None = None
    """The checkpoint or savepoint the job started from (``restore_from``)."""
    hosts: dict[int, dict[str, str]] = field(default_factory=dict)
    """Per generation, the host (address) each slot ran on: ``{1: {"slot-0": "10.0.0.11",
    ...}}``."""
    metrics: JobMetrics | None = None
    """Records in and out per operator, throughput and backpressure at the end (of the last
    generation), the last checkpoints and the restarts: what the live progress showed."""
    counts: JobCounts | None = None
    """Records in and out per operator and dead letters since the job started (across
    restarts and resumed runs, each record once): see :meth:`summary`."""

    def summary(self) -> JobSummary:
        """The job's figures from its start to its end: records read per source and written
        per sink, window results, late records, dead letters, the watermark at the end, this
        run's checkpoints and restarts (:meth:`JobSummary.verdict` says them in a
        sentence)."""
        metrics = self.metrics
        operators = metrics.operators if metrics is not None else []
        return JobSummary.of(
            self.counts,
            metrics.late if metrics is not None else {},
            [o.watermark for o in operators if o.watermark is not None],
            len([c for c in self.checkpoints if not c.savepoint]),
            len(self.savepoints),
            self.restarts,
            metrics.skipped if metrics is not None else None,
        )

    def __repr__(self) -> str:
        """A summary (the fields hold kilobytes: statistics per subtask, every record), then
        the verdict: what the job read, wrote and did (:meth:`summary`)."""
        parts = [f"{self.duration:.1f} s", f"{self.generations} generation(s)"]
        completed = [c for c in self.checkpoints if not c.savepoint]
        if completed:
            parts.append(f"{len(completed)} checkpoint(s), the last {completed[-1].checkpoint_id}")
        if self.savepoints:
            parts.append(f"savepoints {self.savepoints}")
        if self.aborted:
            parts.append(f"{len(self.aborted)} aborted")
        for name, records in self.collected.items():
            parts.append(f"collected {name!r}: {len(records):,} records")
        if self.restored_from:
            parts.append(f"restored from {self.restored_from}")
        return f"JobResult({'; '.join(parts)}): {self.summary().verdict()}"

    @property
    def output(self) -> list[Any]:
        """The records of the job's collect sink (there must be exactly one)."""
        if len(self.collected) != 1:
            raise ValueError(
                f"the job has {len(self.collected)} collect sinks; use result.collected[name]"
            )
        return next(iter(self.collected.values()))
