"""The job driver: hosts the checkpoint coordinator, and restarts the job after a failure.

One :class:`JobDriver` runs one job (a :class:`~cutline.runtime.driver.run.JobRun`: what
lasts across its attempts). It takes the checkpoint directory's lock for the whole run and,
for each **attempt** (generation ``1, 2, ...``),

1. picks the checkpoint to restore (the newest intact complete checkpoint of this run,
   skipping damaged ones with a warning that names them),
2. waits for the task slots, opens a control server fenced by a fresh token and the
   generation, and asks its :class:`~cutline.runtime.task.launch.Launcher` to start one slot
   per subtask index (on Spark: a barrier stage),
3. hands the generation to a :class:`~cutline.runtime.driver.attempt.JobAttempt`, which
   drives the :class:`~cutline.protocol.CheckpointCoordinator` and watches for failures.

After a failure it cancels the attempt and, while its
:class:`~cutline.runtime.driver.restart.RestartStrategy` allows, starts the next generation
from the latest complete checkpoint; otherwise :meth:`JobDriver.run` raises
:class:`~cutline.runtime.driver.result.JobFailedError`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pickle
import secrets
import time
import warnings
from collections.abc import Callable
from typing import Any, assert_never

import fsspec

from cutline.protocol.coordinator import (
    CheckpointCoordinator,
)
from cutline.protocol.registry import SharedStateRegistry
from cutline.runtime.checkpoint.layout import METADATA, CorruptCheckpointError, StorageError
from cutline.runtime.checkpoint.lineage import (
    begin_lineage,
    refuse_fresh_start,
    standing,
)
from cutline.runtime.checkpoint.location import CheckpointLocation
from cutline.runtime.checkpoint.lock import CheckpointDirectoryLock, Owner
from cutline.runtime.checkpoint.restore import RestoreError, RestoreSpec, plan_restore
from cutline.runtime.checkpoint.stats import (
    RecordCounts,
    RestartInfo,
    RunInfo,
)
from cutline.runtime.checkpoint.storage import CheckpointStorage
from cutline.runtime.driver.attempt import JobAttempt
from cutline.runtime.driver.client import JobEndpoint
from cutline.runtime.driver.config import LATEST, JobConfig
from cutline.runtime.driver.events import (
    EventListener,
    JobFailure,
    JobWarning,
    Restarting,
    WaitingForSlots,
)
from cutline.runtime.driver.global_commits import GlobalCommitError
from cutline.runtime.driver.metrics import JobMetrics
from cutline.runtime.driver.restart import GiveUp, Restart, Restarts
from cutline.runtime.driver.result import (
    CheckpointWarning,
    Failure,
    JobFailedError,
    JobInterrupted,
    JobResult,
)
from cutline.runtime.driver.run import JobRun
from cutline.runtime.driver.summary import JobCounts
from cutline.runtime.graph import ExecutionPlan, subtask_name
from cutline.runtime.network.control import ControlServer
from cutline.runtime.task.launch import Launcher, SlotSetup


class JobDriver:
    def __init__(
        self,
        plan: ExecutionPlan,
        config: JobConfig,
        launcher: Launcher,
        listener: EventListener | None = None,
    ) -> None:
        self.plan, self.config, self.launcher = plan, config, launcher
        self.restarts = Restarts(config.restart)
        """This run's restart decisions."""
        storage = CheckpointStorage(config.checkpoint_dir, storage_options=config.storage_options)
        existing = storage.checkpoint_ids()
        known = existing + storage.stats_checkpoint_ids()  # ids are never used twice
        first_id = max(known) + 1 if known else 1
        registry = SharedStateRegistry(_shared_references(storage, existing))
        listener = listener or (lambda event: None)
        self.job = JobRun(plan, config, storage, registry, listener, first_id)
        restore_from = config.restore_from
        if restore_from == LATEST:
            restore_from = config.checkpoint_dir
        self._initial = self._resolve(restore_from) if restore_from else None
        if self._initial is not None:  # ids above the restored one: nothing is named twice
            self.job.first_id = self.job.next_id = max(first_id, self._initial.checkpoint_id + 1)

    @property
    def storage(self) -> CheckpointStorage:
        return self.job.storage

    @property
    def result(self) -> JobResult:
        return self.job.result

    @property
    def listener(self) -> EventListener:
        return self.job.listener

    @property
    def on_progress(self) -> Callable[[JobMetrics], None] | None:
        """Called with the job's figures about four times a second while it runs."""
        return self.job.on_progress

    @on_progress.setter
    def on_progress(self, callback: Callable[[JobMetrics], None] | None) -> None:
        self.job.on_progress = callback

    @property
    def on_ready(self) -> Callable[[int, dict[str, int]], None] | None:
        """Called with (generation, {slot: process id}) once every slot is ready."""
        return self.job.on_ready

    @on_ready.setter
    def on_ready(self, callback: Callable[[int, dict[str, int]], None] | None) -> None:
        self.job.on_ready = callback

    # ---------------------------------------------------------------- attempts

    def _discard_incomplete(self) -> None:
        """Remove the folders of checkpoints that never completed (a crashed run's, or written
        late by a failed generation)."""
        lost = set(self.storage.completed_without_metadata())  # evidence: kept, and reported
        for checkpoint_id in self.storage.checkpoint_ids():
            if not self.storage.is_complete(checkpoint_id) and checkpoint_id not in lost:
                with contextlib.suppress(StorageError):
                    self.storage.discard(checkpoint_id)

    def run(self) -> JobResult:
        """Run the job to its end; :class:`JobFailedError` when it failed for good,
        :class:`~cutline.runtime.checkpoint.lock.DirectoryLockedError` when another job owns the
        checkpoint directory."""
        lock = self.job.lock = CheckpointDirectoryLock(
            self.config.checkpoint_dir,
            Owner.this_process(self.job.run_id),
            storage_options=self.config.storage_options,
        )
        lock.acquire()
        try:
            if lock.took_over is not None:
                self.listener(
                    JobWarning(
                        "took the checkpoint directory over from "
                        f"{lock.took_over.describe()}, which ended without releasing it"
                    )
                )
            return self._run_locked()
        finally:
            lock.release()

    def _run_locked(self) -> JobResult:
        self._discard_incomplete()
        job = self.job
        job.earlier = self._lineage()
        job.delete_shared(job.registry.orphaned(self.storage.shared_files()))
        try:
            job.endpoint = JobEndpoint(
                self.config.checkpoint_dir,
                self.launcher.driver_host(),
                job.run_id,
                self.config.storage_options,
            )
        except (OSError, ValueError) as exc:  # the job runs; savepoints on request do not
            self.listener(JobWarning(f"cannot open the job's endpoint for savepoints: {exc}"))
        run_info = job.run_info = self._run_info()
        job.record(run_info)
        outcome = "failed"
        try:
            result = self._run()
            outcome = "finished"
            return result
        except JobFailedError as exc:
            outcome = f"failed: {exc}"
            raise
        except KeyboardInterrupt:  # Ctrl-C (PySpark's handler has cancelled the Spark jobs)
            outcome = "interrupted"
            raise JobInterrupted(self._interrupted(), self._last_complete()) from None
        finally:
            last = self.result.hosts.get(max(self.result.hosts), {}) if self.result.hosts else {}
            job.record(
                dataclasses.replace(
                    run_info, ended=time.time(), outcome=outcome[:2000], hosts=dict(last)
                )
            )
            if job.endpoint is not None:
                job.endpoint.close()
            with contextlib.suppress(StorageError):
                self._discard_incomplete()
                job.delete_shared(job.registry.orphaned(self.storage.shared_files()))

    def _lineage(self) -> list[int]:
        """The complete checkpoints of earlier runs that this run may retire: those of the
        directory's lineage when it resumes them; none when it begins a new lineage (a fresh
        start, or a restore from elsewhere: the checkpoints before it are another run's, never
        deleted). A start from the beginning over a checkpoint to resume is refused unless
        the job was told ``fresh``."""
        storage, job, initial = self.storage, self.job, self._initial
        now = standing(storage)
        if initial is None and not self.config.fresh:
            refuse_fresh_start(storage, now)
        found = now.resumable
        continues = (
            initial is not None
            and found is not None
            and (
                initial.own and initial.checkpoint_id == found.checkpoint_id
                if found.checkpoint_id is not None
                else initial.url == found.url
            )
        )
        if continues:
            if now.lineage is not None and now.lineage.run:
                job.job_id = now.lineage.run
            return [c for c in now.completed if now.since <= c < job.first_id]
        begin_lineage(
            storage, job.first_id, initial.url if initial is not None else None, job.run_id
        )
        return []

    def _last_complete(self) -> int | None:
        """The newest checkpoint this run completed (``None``: none yet)."""
        done = [c.checkpoint_id for c in self.result.checkpoints if not c.savepoint]
        return max(done) if done else None

    def _interrupted(self) -> str:
        """What an interrupted job says: where it got to, and how to go on."""
        last = self._last_complete()
        if last is None and self._initial is not None:
            where = f"no checkpoint completed since it restored {self._initial.url}"
        elif last is None:
            where = "no checkpoint completed yet"
        else:
            where = f"last complete checkpoint {last}"
        return (
            f"interrupted; {where}; resume with restore_from='latest' "
            f"(checkpoint_dir={self.config.checkpoint_dir})"
        )

    def _run_info(self) -> RunInfo:
        plan = self.plan
        channels: dict[str, list[str]] = {}
        for chain in plan.chains:
            for out in chain.outputs:
                for index in range(plan.parallelism):
                    for channel, target in plan.output_channels(out, index):
                        channels[channel] = [
                            subtask_name(chain.uid, index),
                            subtask_name(out.downstream, target),
                        ]
        return RunInfo(
            run=self.job.run_id,
            started=time.time(),
            parallelism=plan.parallelism,
            checkpointing=self.config.barriers.mode,
            operators={op.uid: op.name for chain in plan.chains for op in chain.operators},
            subtasks=plan.subtasks(),
            channels=channels,
            restored_from=self._initial.url if self._initial is not None else None,
        )

    def _restarted(self, info: RestartInfo) -> None:
        hosts = dict(self.result.hosts.get(info.generation, {}))
        info = dataclasses.replace(info, run=self.job.run_id, time=time.time(), hosts=hosts)
        self.result.restarts.append(info)
        self.job.record(info)

    def _run(self) -> JobResult:
        generation = 0
        restore = self._choose_checkpoint()
        if self._initial is not None:
            self.result.restored_from = self._initial.url
        while True:
            generation += 1
            failure = self._attempt(generation, restore)
            self.result.generations = generation
            self.result.metrics = self.job.metrics.snapshot(self.job.elapsed())
            if failure is None:
                self.result.duration = self.job.elapsed()
                self.result.collected = self._read_collected()
                self.result.counts = self._counts(restore)
                return self.result
            decision = self.restarts.after(failure, self.job.elapsed())
            match decision:
                case GiveUp(why=why):
                    self._restarted(
                        RestartInfo(
                            generation,
                            failure.describe(),
                            None,
                            self.job.elapsed(),
                            restarted=False,
                        )
                    )
                    self.listener(JobFailure(f"{failure.describe()}\nnot restarted: {why}"))
                    raise JobFailedError(
                        f"the job failed after {generation} attempt(s), not restarted: {why}: "
                        f"{failure.describe()}",
                        failure,
                        deterministic=decision.deterministic,
                    )
                case Restart(delay=delay):
                    restore = self._choose_checkpoint()  # warns about damaged ones it skips
                    restored = restore.checkpoint_id if restore is not None else None
                    self._restarted(
                        RestartInfo(
                            generation,
                            failure.describe(),
                            restored,
                            self.job.elapsed(),
                            delay=delay,
                        )
                    )
                    self.listener(Restarting(generation, failure.describe(), delay, restored))
                    time.sleep(delay)
                case _:
                    assert_never(decision)

    def _choose_checkpoint(self) -> RestoreSpec | None:
        """The newest intact complete checkpoint or savepoint of this run; else the one the
        job was asked to start from; else ``None``."""
        metadata, skipped = self.storage.latest(since=self.job.first_id, run=self.job.run_id)
        for skip in skipped:
            self._warn(f"{skip.reason} (skipped)")
        if metadata is None and skipped:
            start = (
                f"the checkpoint it started from ({self._initial.url})"
                if self._initial is not None
                else "the beginning"
            )
            self._warn(
                f"every complete checkpoint of this run is damaged: it restarts from {start} "
                "(the output it published since is withdrawn and written again)"
            )
        url = self.storage.location(metadata.checkpoint_id).url if metadata else None
        own = True
        for savepoint_id in sorted(self.job.savepoints, reverse=True):
            if metadata is not None and savepoint_id < metadata.checkpoint_id:
                break
            location = CheckpointLocation.open(
                self.job.savepoints[savepoint_id], storage_options=self.config.storage_options
            )
            try:
                metadata, url, own = location.checked_metadata(savepoint_id), location.url, False
                break
            except CorruptCheckpointError as exc:
                self._warn(f"savepoint {savepoint_id} is damaged: {exc} (skipped)")
        if metadata is None or url is None:
            return self._initial
        return plan_restore(
            metadata,
            url,
            self.plan,
            own=own,
            allow_non_restored_state=self.config.allow_non_restored_state,
        )

    def _warn(self, message: str) -> None:
        warnings.warn(message, CheckpointWarning, stacklevel=3)
        self.listener(JobWarning(message))

    def _resolve(self, url: str) -> RestoreSpec:
        """The checkpoint or savepoint ``url`` names (a folder with metadata, or a checkpoint
        directory: its newest intact complete checkpoint), checked against the job."""
        options = self.config.storage_options
        location = CheckpointLocation.open(url, storage_options=options)
        try:
            has_metadata = location.fs.exists(f"{location.folder}/{METADATA}")
        except OSError as exc:
            raise RestoreError(f"cannot read {url}: {exc}") from None
        if has_metadata:
            try:
                metadata = location.checked_metadata()
            except CorruptCheckpointError as exc:
                raise RestoreError(f"cannot restore {url}: {exc}") from None
        else:
            storage = CheckpointStorage(url, storage_options=options)
            now = standing(storage)
            latest, skipped = storage.latest(since=now.since)
            for skip in skipped:
                self._warn(f"{url}: {skip.reason} (skipped)")
            if latest is None and skipped:
                raise RestoreError(
                    f"every complete checkpoint in {url} is damaged, so none can be restored:\n"
                    + "".join(f"  {skip.reason}\n" for skip in skipped)
                    + f"(`cutline checkpoints verify {url}` checks them again.) To go on: restore "
                    "a savepoint of the job (restore_from=FOLDER), or start from the beginning "
                    "(without restore_from) writing to new output directories: the output "
                    "published so far holds what these checkpoints covered"
                )
            found = now.resumable
            if found is not None and found.checkpoint_id is None:  # a savepoint, or the start
                return self._resolve(found.url)
            if latest is None:
                raise RestoreError(
                    f"there is no complete checkpoint or savepoint at {url} (a folder with "
                    f"{METADATA}, or a checkpoint directory with chk-N folders)"
                )
            metadata = latest
            location = storage.location(latest.checkpoint_id)
        own = (
            not metadata.extra.get("savepoint")
            and type(location.fs) is type(self.storage.fs)
            and location.folder.rsplit("/", 1)[0].rstrip("/") == self.storage.root
        )
        return plan_restore(
            metadata,
            location.url,
            self.plan,
            own=own,
            allow_non_restored_state=self.config.allow_non_restored_state,
        )

    def _slots(self, generation: int) -> Failure | None:
        """Wait for the generation's task slots (and, after a lost host with
        ``on_host_loss="wait"``, for the hosts the failed generation ran on)."""
        hosts: frozenset[str] = frozenset()
        if self.config.on_host_loss == "wait":
            hosts = frozenset(h for h in self.result.hosts.get(generation - 1, {}).values() if h)
        error = self.launcher.wait_for_slots(
            self.plan.parallelism,
            hosts,
            self.config.deadlines.slots,
            lambda message: self.listener(WaitingForSlots(message)),
        )
        return None if error is None else Failure("launcher", error)

    def _attempt(self, generation: int, restore: RestoreSpec | None) -> Failure | None:
        config, plan = self.config, self.plan
        if restore is not None and self.job.global_commits.committers:
            # the restored checkpoint's global commits may not have happened: once more
            try:
                location = CheckpointLocation.open(
                    restore.url, storage_options=config.storage_options
                )
                self.job.global_commits.commit(restore.checkpoint_id, location)
            except (GlobalCommitError, StorageError) as exc:
                return Failure("commit", str(exc))
        waited = self._slots(generation)
        if waited is not None:
            return waited
        token = secrets.token_hex(16).encode()
        slots = [f"slot-{i}" for i in range(plan.parallelism)]
        server = ControlServer(slots, token=token, generation=generation)
        completed = [  # retained further (and discarded in time) whatever was restored
            c
            for c in self.storage.completed_ids()
            if restore is not None and self.job.first_id <= c <= restore.checkpoint_id
        ]
        coordinator: CheckpointCoordinator[str, dict[str, Any]] = CheckpointCoordinator(
            plan.subtasks(), config.checkpoints, next_id=self.job.next_id, completed=completed
        )
        setup = SlotSetup(
            plan=plan,
            generation=generation,
            token=token,
            driver=(self.launcher.driver_host(), server.port),
            checkpoint_dir=config.checkpoint_dir,
            storage_options=config.storage_options,
            restore=restore,
            state=config.state,
            drain=restore is not None and restore.checkpoint_id == self.job.stopped_with,
            batch_size=config.batch_size,
            buffer_capacity=config.buffer_capacity,
            dead_letter_dir=config.dead_letter_dir,
            on_error=config.on_error,
            run=self.job.run_id,
            job=self.job.job_id,
            barriers=config.barriers,
            rate_limits=config.rate_limits,
            hold=config.hold if generation == 1 else None,
            phase_hook=config.phase_hook,
        )
        attempt = JobAttempt(
            self.job,
            generation,
            coordinator,
            server,
            holding=setup.hold is not None,
            restored=restore.counts if restore is not None else RecordCounts(),
        )
        self.job.metrics.new_generation(generation)
        job = self.launcher.launch(setup)
        ended_well = False
        try:
            failure = attempt.drive(job)
            ended_well = failure is None
            return failure
        finally:
            self.job.next_id = max(self.job.next_id, attempt.next_id)
            server.close()
            if ended_well:
                job.detach()
            else:
                job.cancel()
                job.wait(60.0)
            attempt.end()
            self.job.delete_shared(self.job.registry.restarted())

    def _counts(self, restore: RestoreSpec | None) -> JobCounts:
        """What the job counted from its start to its end: what the checkpoint its last
        generation restored had counted (none at a fresh start), plus what that generation
        counted (all of it: every slot finished)."""
        restored = restore.counts if restore is not None else RecordCounts()
        since = None
        if restore is not None and restored is None:  # (a checkpoint of an older version)
            since = self._initial.url if self._initial is not None else restore.url
        counted = (restored or RecordCounts()) + self.job.metrics.counted()
        return JobCounts.of(self.plan, counted, since)

    def _read_collected(self) -> dict[str, list[Any]]:
        collected: dict[str, list[Any]] = {}
        for name, directory in self.config.collect.items():
            fs, root = fsspec.core.url_to_fs(directory, **dict(self.config.storage_options or {}))
            records: list[Any] = []
            if fs.exists(root):
                for path in sorted(str(p) for p in fs.ls(root, detail=False)):
                    if path.endswith(".pickle") and not path.rsplit("/", 1)[-1].startswith("_"):
                        with fs.open(path, "rb") as source:
                            records.extend(pickle.load(source))
            collected[name] = records
        return collected


def _shared_references(storage: CheckpointStorage, ids: list[int]) -> dict[int, list[str]]:
    """The shared files each complete checkpoint in the directory names."""
    references: dict[int, list[str]] = {}
    for checkpoint_id in ids:
        if not storage.is_complete(checkpoint_id):
            continue
        try:
            metadata = storage.read_metadata(checkpoint_id)
        except CorruptCheckpointError:
            continue
        references[checkpoint_id] = [
            ref.path for h in metadata.handles.values() for ref in h.shared
        ]
    return references
