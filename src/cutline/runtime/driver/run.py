"""What lasts for a whole run of a job (one ``execute()``), across its attempts.

The :class:`~cutline.runtime.driver.driver.JobDriver` makes one :class:`JobRun` and hands it
to each :class:`~cutline.runtime.driver.attempt.JobAttempt`: the job's plan and
configuration, its checkpoint storage and the registry of its shared files, the result and
the figures it builds up, the listener that tells the user (typed events,
:mod:`cutline.runtime.driver.events`), and the few facts one attempt
leaves to the next (the savepoints taken, the next checkpoint id, the checkpoints of earlier
runs still to retire).
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable

from cutline.protocol.registry import SharedStateRegistry
from cutline.runtime.checkpoint.layout import StorageError
from cutline.runtime.checkpoint.lock import CheckpointDirectoryLock
from cutline.runtime.checkpoint.stats import CheckpointStats, RestartInfo, RunInfo
from cutline.runtime.checkpoint.storage import CheckpointStorage
from cutline.runtime.driver.client import JobEndpoint
from cutline.runtime.driver.config import JobConfig
from cutline.runtime.driver.events import EventListener, JobWarning, RecordsSkipped
from cutline.runtime.driver.global_commits import GlobalCommits
from cutline.runtime.driver.metrics import JobMetrics, MetricsCollector
from cutline.runtime.driver.result import JobResult
from cutline.runtime.graph import ExecutionPlan


class JobRun:
    """One run of a job: see the module's docstring."""

    def __init__(
        self,
        plan: ExecutionPlan,
        config: JobConfig,
        storage: CheckpointStorage,
        registry: SharedStateRegistry,
        listener: EventListener,
        first_id: int,
    ) -> None:
        self.plan, self.config, self.storage = plan, config, storage
        self.registry = registry
        self.listener = listener
        self.run_id = secrets.token_hex(4)
        """This run's id, in the names of its output files."""
        self.job_id = self.run_id
        """The id of the job's lineage: the run that began the checkpoint directory's current
        lineage (this one, unless it resumes an earlier run's). The same across the runs that
        resume one another, so a transactional sink knows its own transactions after a
        restart of the whole job (``SinkContext.job``)."""
        self.started = time.monotonic()
        self.result = JobResult()
        self.metrics = MetricsCollector(plan)
        self.run_info: RunInfo | None = None
        self.lock: CheckpointDirectoryLock | None = None
        self.endpoint: JobEndpoint | None = None
        self.first_id = first_id
        """The first checkpoint id of this run; checkpoints below it belong to earlier runs."""
        self.next_id = first_id
        self.global_commits = GlobalCommits(plan)
        """The global committers of its sinks (on the driver, for the whole run)."""
        self.savepoints: dict[int, str] = {}
        """This run's savepoints: id -> folder (restored from after a failure when newest)."""
        self.stopped_with: int | None = None
        """The savepoint the job was stopped with: restored after a failure, it only ends."""
        self.earlier: list[int] = []
        """Complete checkpoints of earlier runs in the directory, oldest first: discarded as
        this run's own complete, so that the directory keeps ``retained`` in all."""
        self.on_progress: Callable[[JobMetrics], None] | None = None
        """Called with the job's figures about four times a second while it runs (the live
        progress display)."""
        self.on_ready: Callable[[int, dict[str, int]], None] | None = None
        """Called with (generation, {slot: process id}) once every slot is ready (tests use it
        to kill a worker)."""

    def elapsed(self) -> float:
        """Seconds since the run started."""
        return time.monotonic() - self.started

    def record(self, record: CheckpointStats | RestartInfo | RunInfo) -> None:
        """Write a statistics record; a failure to is a warning, never the job's failure."""
        if isinstance(record, CheckpointStats):
            self.metrics.checkpoints.append(record)
        elif isinstance(record, RestartInfo):
            self.metrics.restarts.append(record)
        try:
            self.storage.write_stats(record)
            if isinstance(record, CheckpointStats):
                self.storage.prune_stats(self.config.stats_history)
        except StorageError as exc:
            self.listener(JobWarning(f"cannot keep checkpoint statistics: {exc}"))

    def skipped(self, source: str, split: str, records: int, why: str) -> None:
        """A source skipped ``records`` of ``split`` (``SourceContext.skipped``): counted and
        told once, however often a restore repeats the same skip."""
        if self.metrics.skip(source, split, records, why):
            self.listener(RecordsSkipped(source, split, records, why))

    def delete_shared(self, paths: list[str]) -> None:
        """Remove shared files no retained checkpoint names any more."""
        for path in paths:
            with contextlib.suppress(StorageError, ValueError):
                self.storage.remove_shared(path)

    def retire_earlier(self, completed: int) -> None:
        """``Checkpoints.retained`` counts the directory's complete checkpoints, not only this
        run's: those of earlier runs go, oldest first, as this run's own complete
        (``completed`` of them). (The one this run restored stays while this run has fewer
        than that of its own: a restart may still need it; their shared files go only when no
        retained checkpoint names them.)"""
        keep = max(0, self.config.checkpoints.retained - completed)
        while len(self.earlier) > keep:
            old = self.earlier.pop(0)
            with contextlib.suppress(StorageError):
                self.storage.discard(old)
            if old in self.registry.retained:
                self.delete_shared(self.registry.discarded(old))
