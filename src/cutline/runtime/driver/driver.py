"""The job driver: hosts the checkpoint coordinator, and restarts the job after a failure.

One :class:`JobDriver` runs one job. For each **attempt** (generation ``1, 2, ...``) it

1. picks the checkpoint to restore (the newest intact complete checkpoint of this run,
   skipping damaged ones with a warning that names them),
2. opens a control server fenced by a fresh token and the generation, and asks its
   :class:`Launcher` to start one slot per subtask index (on Spark: a barrier stage),
3. drives a :class:`~cutline.protocol.CheckpointCoordinator`: triggers checkpoints,
   collects acknowledgements, writes each checkpoint's metadata atomically, tells the
   tasks ``complete``, aborts, discards beyond retention; triggers the final checkpoint
   once every source subtask has read all its input;
4. watches for failures: a user function's exception (reported with the operator, the
   subtask and the traceback), a lost control connection (a killed worker), a slot whose
   heartbeats stop, the launcher's own failure, too many failed checkpoints.

After a failure it cancels the attempt and, while the restart strategy allows
(``restart_attempts`` with ``restart_delay`` between them), starts the next generation
from the latest complete checkpoint; otherwise :meth:`JobDriver.run` raises
:class:`JobFailedError`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pickle
import queue
import secrets
import time
import warnings
from collections.abc import Callable
from typing import Any, assert_never

import fsspec

from cutline.protocol.coordinator import (
    AbortCheckpoint,
    CheckpointCoordinator,
    DiscardCheckpoint,
    DiscardState,
    FailJob,
    NotifyCheckpointComplete,
    TriggerCheckpoint,
    WriteMetadata,
)
from cutline.protocol.cut import channel_cuts, check_cut
from cutline.protocol.registry import SharedStateRegistry
from cutline.runtime.checkpoint.lock import CheckpointDirectoryLock, Owner
from cutline.runtime.checkpoint.restore import RestoreError, RestoreSpec, plan_restore
from cutline.runtime.checkpoint.stats import (
    CheckpointStats,
    RestartInfo,
    RunInfo,
    SubtaskStats,
)
from cutline.runtime.checkpoint.storage import (
    METADATA,
    CheckpointLocation,
    CheckpointMetadata,
    CheckpointStorage,
    CorruptCheckpointError,
    StateHandle,
    StorageError,
)
from cutline.runtime.driver.client import JobEndpoint, SavepointRequest
from cutline.runtime.driver.config import LATEST, JobConfig, check_host_loss
from cutline.runtime.driver.metrics import JobMetrics, MetricsCollector
from cutline.runtime.driver.result import (
    CheckpointWarning,
    Failure,
    JobFailedError,
    JobInterrupted,
    JobResult,
)
from cutline.runtime.graph import ExecutionPlan, Operator, subtask_name
from cutline.runtime.network.control import ControlServer, Event
from cutline.runtime.network.messages import (
    Abort,
    Ack,
    Census,
    CensusCount,
    Complete,
    ControlError,
    Decline,
    Drain,
    DriverMessage,
    Exhausted,
    Failed,
    Finished,
    Heartbeat,
    Lost,
    Phase,
    Ready,
    Release,
    Trigger,
)
from cutline.runtime.operators import SinkLogic
from cutline.runtime.task.launch import LaunchedJob, Launcher, SlotSetup

LOST_GRACE = 0.25
"""Seconds a lost slot waits for another slot's report of the failure that caused it."""

SUBTASK_DETAILS = 100
"""Completed checkpoints whose per-subtask statistics ``JobResult.checkpoints`` keeps."""


Listener = Callable[[str, str], None]
"""Called with (kind, message) for what a user may want to see: ``checkpoint`` (``"3 complete
in 0.08 s"``), ``savepoint`` (``"4 complete in 0.10 s: FOLDER"``), ``abort`` (``"checkpoint 5:
REASON"``), ``restart``, ``slots`` (waiting for task slots or lost hosts), ``running`` (every
slot of a generation ready, and where), ``waiting`` (a checkpoint in flight longer than its
interval: what for, and behind how many records), ``warning``, ``failure``.
``print(kind, message)`` reads as a sentence."""


class JobDriver:
    def __init__(
        self,
        plan: ExecutionPlan,
        config: JobConfig,
        launcher: Launcher,
        listener: Listener | None = None,
    ) -> None:
        self.plan = plan
        self.config = config
        self.launcher = launcher
        self.listener = listener or (lambda kind, message: None)
        self.storage = CheckpointStorage(
            config.checkpoint_dir, storage_options=config.storage_options
        )
        existing = self.storage.checkpoint_ids()
        known = existing + self.storage.stats_checkpoint_ids()  # ids are never used twice
        self._first_id = max(known) + 1 if known else 1
        self.registry = SharedStateRegistry(self._shared_references(existing))
        self._savepoints: dict[int, str] = {}
        """This run's savepoints: id -> folder (restored from after a failure when newest)."""
        check_host_loss(config.on_host_loss)
        restore_from = config.restore_from
        if restore_from == LATEST:
            restore_from = config.checkpoint_dir
        self._initial = self._resolve(restore_from) if restore_from else None
        if self._initial is not None:  # ids above the restored one: nothing is named twice
            self._first_id = max(self._first_id, self._initial.checkpoint_id + 1)
            self._next_id = self._first_id
        """The first checkpoint id of this run; checkpoints below it belong to earlier runs."""
        self._earlier: list[int] = []
        """Complete checkpoints of earlier runs in the directory, oldest first: discarded as
        this run's own complete, so that the directory keeps ``retained`` in all."""
        self.endpoint: JobEndpoint | None = None
        self._stopped_with: int | None = None
        """The savepoint the job was stopped with: restored after a failure, it only ends."""
        self._next_id = self._first_id
        self.result = JobResult()
        self._start = time.monotonic()
        self.run_id = secrets.token_hex(4)
        """This run's id, in the names of its output files."""
        self.metrics = MetricsCollector(plan)
        self.on_progress: Callable[[JobMetrics], None] | None = None
        """Called with the job's figures about four times a second while it runs (the live
        progress display)."""
        self.on_ready: Callable[[int, dict[str, int]], None] | None = None
        """Called with (generation, {slot: process id}) once every slot is ready (tests use it
        to kill a worker)."""

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
        self.lock = CheckpointDirectoryLock(
            self.config.checkpoint_dir,
            Owner.this_process(self.run_id),
            storage_options=self.config.storage_options,
        )
        self.lock.acquire()
        try:
            if self.lock.took_over is not None:
                self.listener(
                    "warning",
                    f"took the checkpoint directory over from {self.lock.took_over.describe()}, "
                    "which ended without releasing it",
                )
            return self._run_locked()
        finally:
            self.lock.release()

    def _run_locked(self) -> JobResult:
        self._discard_incomplete()
        self._earlier = [c for c in self.storage.completed_ids() if c < self._first_id]
        self._delete_shared(self.registry.orphaned(self.storage.shared_files()))
        try:
            self.endpoint = JobEndpoint(
                self.config.checkpoint_dir,
                self.launcher.driver_host(),
                self.run_id,
                self.config.storage_options,
            )
        except (OSError, ValueError) as exc:  # the job runs; savepoints on request do not
            self.listener("warning", f"cannot open the job's endpoint for savepoints: {exc}")
        self.run_info = self._run_info()
        self._keep(self.run_info)
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
            self._keep(
                dataclasses.replace(
                    self.run_info, ended=time.time(), outcome=outcome[:2000], hosts=dict(last)
                )
            )
            if self.endpoint is not None:
                self.endpoint.close()
            with contextlib.suppress(StorageError):
                self._discard_incomplete()
                self._delete_shared(self.registry.orphaned(self.storage.shared_files()))

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
            run=self.run_id,
            started=time.time(),
            parallelism=plan.parallelism,
            checkpointing=self.config.checkpointing,
            operators={op.uid: op.name for chain in plan.chains for op in chain.operators},
            subtasks=plan.subtasks(),
            channels=channels,
            restored_from=self._initial.url if self._initial is not None else None,
        )

    def _keep(self, record: CheckpointStats | RestartInfo | RunInfo) -> None:
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
            self.listener("warning", f"cannot keep checkpoint statistics: {exc}")

    def _restarted(self, info: RestartInfo) -> None:
        hosts = dict(self.result.hosts.get(info.generation, {}))
        info = dataclasses.replace(info, run=self.run_id, time=time.time(), hosts=hosts)
        self.result.restarts.append(info)
        self._keep(info)

    def _run(self) -> JobResult:
        generation = 0
        restore = self._choose_checkpoint()
        if self._initial is not None:
            self.result.restored_from = self._initial.url
        while True:
            generation += 1
            failure = self._attempt(generation, restore)
            self.result.generations = generation
            self.result.metrics = self.metrics.snapshot(self._elapsed())
            if failure is None:
                self.result.duration = time.monotonic() - self._start
                self.result.collected = self._read_collected()
                return self.result
            restarts = len(self.result.restarts)
            if restarts >= self.config.restart_attempts or failure.cause == "lock":
                self._restarted(
                    RestartInfo(
                        generation, failure.describe(), None, self._elapsed(), restarted=False
                    )
                )
                self.listener("failure", failure.describe())
                raise JobFailedError(
                    f"the job failed after {restarts + 1} attempt(s) "
                    f"(restart_attempts={self.config.restart_attempts}): {failure.describe()}",
                    failure,
                )
            restore = self._choose_checkpoint()  # warns about the damaged ones it skips
            restored = restore.checkpoint_id if restore is not None else None
            self._restarted(RestartInfo(generation, failure.describe(), restored, self._elapsed()))
            self.listener(
                "restart",
                f"generation {generation} failed: {failure.describe()}\n"
                f"restarting in {self.config.restart_delay:g} s from "
                + (f"checkpoint {restored}" if restored is not None else "the start"),
            )
            time.sleep(self.config.restart_delay)

    def _elapsed(self) -> float:
        return time.monotonic() - self._start

    def _choose_checkpoint(self) -> RestoreSpec | None:
        """The newest intact complete checkpoint or savepoint of this run; else the one the
        job was asked to start from; else ``None``."""
        metadata, skipped = self.storage.latest(since=self._first_id, run=self.run_id)
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
        for savepoint_id in sorted(self._savepoints, reverse=True):
            if metadata is not None and savepoint_id < metadata.checkpoint_id:
                break
            location = CheckpointLocation.open(
                self._savepoints[savepoint_id], storage_options=self.config.storage_options
            )
            try:
                metadata, url, own = location.verify(savepoint_id), location.url, False
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
        self.listener("warning", message)

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
                metadata = location.verify()
            except CorruptCheckpointError as exc:
                raise RestoreError(f"cannot restore {url}: {exc}") from None
        else:
            storage = CheckpointStorage(url, storage_options=options)
            latest, skipped = storage.latest()
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

    def _shared_references(self, ids: list[int]) -> dict[int, list[str]]:
        """The shared files each complete checkpoint in the directory names."""
        references: dict[int, list[str]] = {}
        for checkpoint_id in ids:
            if not self.storage.is_complete(checkpoint_id):
                continue
            try:
                metadata = self.storage.read_metadata(checkpoint_id)
            except CorruptCheckpointError:
                continue
            references[checkpoint_id] = [
                ref.path for h in metadata.handles.values() for ref in h.shared
            ]
        return references

    def _delete_shared(self, paths: list[str]) -> None:
        for path in paths:
            with contextlib.suppress(StorageError, ValueError):
                self.storage.remove_shared(path)

    def _slots(self, generation: int) -> Failure | None:
        """Wait for the generation's task slots (and, after a lost host with
        ``on_host_loss="wait"``, for the hosts the failed generation ran on)."""
        hosts: frozenset[str] = frozenset()
        if self.config.on_host_loss == "wait":
            hosts = frozenset(h for h in self.result.hosts.get(generation - 1, {}).values() if h)
        error = self.launcher.wait_for_slots(
            self.plan.parallelism,
            hosts,
            self.config.slot_timeout,
            lambda message: self.listener("slots", message),
        )
        return None if error is None else Failure("launcher", error)

    def _attempt(self, generation: int, restore: RestoreSpec | None) -> Failure | None:
        config, plan = self.config, self.plan
        waited = self._slots(generation)
        if waited is not None:
            return waited
        token = secrets.token_hex(16).encode()
        slots = [f"slot-{i}" for i in range(plan.parallelism)]
        server = ControlServer(slots, token=token, generation=generation)
        completed = [  # retained further (and discarded in time) whatever was restored
            c
            for c in self.storage.completed_ids()
            if restore is not None and self._first_id <= c <= restore.checkpoint_id
        ]
        coordinator: CheckpointCoordinator[str, dict[str, Any]] = CheckpointCoordinator(
            plan.subtasks(), config.checkpoints, next_id=self._next_id, completed=completed
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
            drain=restore is not None and restore.checkpoint_id == self._stopped_with,
            batch_size=config.batch_size,
            buffer_capacity=config.buffer_capacity,
            dead_letter_dir=config.dead_letter_dir,
            on_error=config.on_error,
            run=self.run_id,
            checkpointing=config.checkpointing,
            alignment_timeout=config.alignment_timeout,
            rate_limits=config.rate_limits,
            hold=config.hold if generation == 1 else None,
            phase_hook=config.phase_hook,
        )
        attempt = _Attempt(self, generation, coordinator, server, holding=setup.hold is not None)
        self.metrics.new_generation(generation)
        job = self.launcher.launch(setup)
        try:
            return attempt.drive(job)
        finally:
            self._next_id = max(self._next_id, attempt.next_id)
            server.close()
            job.cancel()
            job.wait(60.0)
            attempt.answer_requests()
            attempt.end()
            self._delete_shared(self.registry.restarted())

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


def _slots_text(slots: list[str]) -> str:
    """``slot-1``, ``slot-0 and slot-1``, ``slot-0, slot-1 and slot-2``."""
    return slots[0] if len(slots) == 1 else f"{', '.join(slots[:-1])} and {slots[-1]}"


def running_message(generation: int, hosts: dict[str, str]) -> str:
    """The ``running`` listener message: ``generation 2: slot-0 on 10.0.0.11, ...``."""
    where = ", ".join(f"{slot} on {hosts[slot] or '?'}" for slot in sorted(hosts))
    return f"generation {generation}: {where}"


def parse_running(message: str) -> tuple[int, dict[str, str]]:
    """The generation and the slots' hosts in a ``running`` message."""
    head, _, rest = message.partition(": ")
    hosts = {}
    for part in rest.split(", "):
        slot, _, host = part.partition(" on ")
        hosts[slot] = host
    return int(head.rsplit(" ", 1)[-1]), hosts


class _Attempt:
    """One generation of the job: its control events and its coordinator."""

    def __init__(
        self,
        driver: JobDriver,
        generation: int,
        coordinator: CheckpointCoordinator[str, dict[str, Any]],
        server: ControlServer,
        *,
        holding: bool = False,
    ) -> None:
        self.driver = driver
        self.holding = holding
        """The sources hold part-way (:class:`SourceHold`): each checkpoint's completion is
        followed by ``release`` once the listener was told of it."""
        self.phases: dict[str, tuple[str, float]] = {}
        """Slot -> the phase it is in (``rendezvous``, ``restore``, ``running``) and since when:
        every phase has a deadline."""
        self.committing: tuple[int, float] | None = None
        """The final checkpoint, and when it completed: the slots publish and end."""
        self.generation = generation
        self.coordinator = coordinator
        self.server = server
        self.next_id = driver._next_id
        self.slots = server.tasks
        self.ready: dict[str, int] = {}
        self.finished: set[str] = set()
        self.exhausted: set[str] = set()
        self.sources = set(driver.plan.source_subtasks())
        self.last_beat: dict[str, float] = {}
        self.triggered_at: dict[int, tuple[float, bool]] = {}
        self.final: int | None = None
        self.failure: Failure | None = None
        self.records_in: dict[str, int] = {}
        self.sizes: dict[int, int] = {}
        self.full_sizes: dict[int, int] = {}
        self.trigger_wall: dict[int, float] = {}
        """Checkpoint -> its trigger time (seconds since the epoch)."""
        self.subtask_stats: dict[int, dict[str, SubtaskStats]] = {}
        """Checkpoint in flight -> the statistics of the subtasks that acknowledged it."""
        self.ready_at: float | None = None
        self.progress_due = 0.0
        self.said_waiting: set[int] = set()
        """Checkpoints the listener was told are slow (``waiting``)."""
        self.consequence: Failure | None = None
        """A failure caused by another (a channel whose upstream died), used if no cause comes."""
        self.consequence_at = 0.0
        self.census_wave = 0
        self.census: dict[str, tuple[int, int]] = {}
        self.census_due: float | None = None
        """When to ask the slots for their counts next (loops only, once the sources are done)."""
        self.census_started = 0.0
        self.census_done: int | None = None
        """Records processed, summed over the previous wave."""
        self.draining = False
        self.requests: dict[int, SavepointRequest] = {}
        """Savepoints in flight that someone asked for."""
        self.stop_request: SavepointRequest | None = None
        self.asking: SavepointRequest | None = None
        """The request whose savepoint the next trigger starts."""
        self.targets: dict[int, str] = {}
        """Savepoint in flight -> the folder it goes to (a checkpoint in it is a savepoint)."""

    def now(self) -> float:
        return time.monotonic()

    def drive(self, job: LaunchedJob) -> Failure | None:
        config = self.driver.config
        self.launched = self.now()
        driver_start = self.driver._start
        while self.failure is None:
            now = self.now()
            if len(self.finished) == len(self.slots):
                self.driver.result.records_in.update(self.records_in)
                return None
            error = job.error()
            if error is not None:
                return self._explain(error)
            if self.consequence is not None and now - self.consequence_at > 2.0:
                return self.consequence
            late = self._late(now)
            if late is not None:
                return late
            if self.driver.lock.lost is not None:  # another job writes here now: stop for good
                return Failure("lock", self.driver.lock.lost)
            if len(self.ready) == len(self.slots):
                assert self.ready_at is not None
                self._take_requests(now)
                stop = config.stop_after
                stopping = stop is not None and now - driver_start >= stop
                if (stopping or self.stop_request is not None) and self.final is None:
                    if not self.driver.plan.has_loops:
                        self._trigger_final(now)
                    elif not self.draining:  # the sources stop; the final checkpoint waits
                        self.draining = True  # for the loops to be quiet
                        self._broadcast(Drain())
                if self.census_due is not None and now >= self.census_due:
                    self._census(now)
                # as in Flink, the first periodic checkpoint comes one interval after the start
                interval = config.checkpoints.interval
                if interval is None or now >= self.ready_at + interval:
                    self._do(self.coordinator.poll(now))
            self._progress(now)
            event = self.server.next_event(timeout=0.02)
            while event is not None and self.failure is None:
                self._on_event(event)
                event = self.server.next_event(timeout=0)
        if self.failure.cause == "lost":
            self._hear_the_cause(LOST_GRACE)
        return self.failure

    def _hear_the_cause(self, grace: float) -> None:
        """A slot was lost: if its loss was caused by another slot's failure (a user function
        failed there, and Spark ended this one's task), that failure's report may arrive a
        moment later on another connection. Wait up to ``grace`` seconds for it: the cause
        wins over the failures it causes."""
        deadline = self.now() + grace
        while self.failure is not None and self.failure.cause == "lost":
            event = self.server.next_event(timeout=max(0.0, deadline - self.now()))
            if event is None:
                return
            if isinstance(event.message, Failed) and event.message.cause != "channel":
                self._on_event(event)

    def _late(self, now: float) -> Failure | None:
        """A slot that stopped answering (heartbeats go from the moment it reached the driver,
        in every phase), or a phase past its deadline: why the generation fails."""
        config = self.driver.config
        for slot in sorted(set(self.phases) - self.finished):
            if now - self.last_beat.get(slot, now) > config.heartbeat_timeout:
                return Failure(
                    "lost",
                    f"stopped answering (no heartbeat for {config.heartbeat_timeout:g} s, "
                    f"{self._phase_text(slot)}){self._on_host(slot)}",
                    subtask=slot,
                )
        absent = sorted(self.slots - set(self.phases))
        if absent and now - self.launched > config.start_timeout:
            return Failure(
                "deadline",
                f"{_slots_text(absent)} did not start within {config.start_timeout:g} s "
                "(start_timeout): Spark did not run the task, or its Python worker stopped "
                "before it reached the driver",
            )
        if absent:
            return None
        last_arrival = max(since for _, since in self.phases.values())
        meeting = sorted(s for s, (phase, _) in self.phases.items() if phase == "rendezvous")
        if meeting and now - last_arrival > config.start_timeout:
            return Failure(
                "deadline",
                f"{_slots_text(meeting)} did not finish the rendezvous (exchanging addresses with "
                f"the other slots) within {config.start_timeout:g} s (start_timeout)",
            )
        for slot, (phase, since) in sorted(self.phases.items()):
            if phase == "restore" and now - since > config.restore_timeout:
                return Failure(
                    "deadline",
                    f"did not report running within {config.restore_timeout:g} s of starting "
                    "its restore (restore_timeout): restoring its state, opening its operators "
                    f"or connecting its outputs took longer{self._on_host(slot)}",
                    subtask=slot,
                )
        if self.committing is not None:
            final, since = self.committing
            ending = sorted(self.slots - self.finished)
            if ending and now - since > config.commit_timeout:
                return Failure(
                    "deadline",
                    f"{_slots_text(ending)} did not publish and end within "
                    f"{config.commit_timeout:g} s of the final checkpoint {final}'s completion "
                    "(commit_timeout)",
                )
        return None

    def _phase_text(self, slot: str) -> str:
        phase, _ = self.phases.get(slot, ("start", 0.0))
        if phase == "running" and self.committing is not None:
            return "while publishing after the final checkpoint"
        if phase == "running" and self.final is not None:
            return "during the final checkpoint"
        return {
            "rendezvous": "during the rendezvous",
            "restore": "while restoring its state",
            "running": "while running",
        }.get(phase, f"in phase {phase}")

    def _on_host(self, slot: str) -> str:
        host = self.driver.result.hosts.get(self.generation, {}).get(slot)
        return f" (on {host})" if host else ""

    def _waiting(self, now: float) -> tuple[int, str] | None:
        """The oldest checkpoint in flight for longer than its interval (and a second): the
        subtasks it still waits for, and the most records its barrier waits behind on their
        inputs (backpressure), as its senders said when they acknowledged."""
        if not self.triggered_at:
            return None
        checkpoint = min(self.triggered_at)
        age = now - self.triggered_at[checkpoint][0]
        if age < max(1.0, self.driver.config.checkpoints.interval or 0.0):
            return None
        acknowledged = self.subtask_stats.get(checkpoint, {})
        waiting = [s for s in self.driver.plan.subtasks() if s not in acknowledged]
        if not waiting:
            return None  # every subtask acknowledged: its metadata is being written
        names = ", ".join(waiting[:3]) + (
            f" and {len(waiting) - 3} more" if len(waiting) > 3 else ""
        )
        text = f"checkpoint {checkpoint} in flight for {age:.1f} s, waiting for {names}"
        channels = self.driver.run_info.channels
        behind = [
            (records, channel)
            for stats in acknowledged.values()
            for channel, records in stats.queued_ahead.items()
            if channels.get(channel, ["", ""])[1] in waiting and records
        ]
        if behind:
            records, channel = max(behind)
            text += f": its barrier is behind {records:,} records on {channel} (backpressure)"
        return checkpoint, text

    def _progress(self, now: float) -> None:
        """Hand the job's figures to the progress display, four times a second; say once of a
        checkpoint that it is slow, and why (listener ``waiting``)."""
        if now < self.progress_due:
            return
        self.progress_due = now + 0.25
        waiting = self._waiting(now)
        self.driver.metrics.waiting = waiting[1] if waiting is not None else None
        if waiting is not None and waiting[0] not in self.said_waiting:
            self.said_waiting.add(waiting[0])
            self.driver.listener("waiting", waiting[1])
        callback = self.driver.on_progress
        if callback is None:
            return
        try:
            callback(self.driver.metrics.snapshot(now - self.driver._start))
        except Exception as exc:  # a display that fails must not fail the job
            self.driver.on_progress = None
            self.driver.listener("warning", f"the progress display failed and stopped: {exc}")

    def _explain(self, error: str) -> Failure:
        """The launcher failed: prefer the reason a task reported (it names the operator)."""
        deadline = self.now() + 2.0
        while self.failure is None and self.now() < deadline:
            event = self.server.next_event(timeout=0.1)
            if event is not None and isinstance(event.message, Failed | Lost):
                self._on_event(event)
        if self.failure is not None:
            return self.failure
        return self.consequence or Failure("launcher", error)

    # ----------------------------------------------------------------- events

    def _on_event(self, event: Event) -> None:
        message, slot, now = event.message, event.task, self.now()
        self.last_beat[slot] = now
        hosts = self.driver.result.hosts
        match message:
            case Phase():
                self.phases[slot] = (message.phase, now)
                if message.host is not None:
                    hosts.setdefault(self.generation, {})[slot] = message.host
            case Ready():
                self.phases[slot] = ("running", now)
                self.ready[slot] = message.pid
                hosts.setdefault(self.generation, {})[slot] = message.host
                if len(self.ready) == len(self.slots):
                    self.ready_at = now
                    on_hosts = hosts.get(self.generation, {})
                    self.driver.listener("running", running_message(self.generation, on_hosts))
                    if self.driver.on_ready is not None:
                        self.driver.on_ready(self.generation, dict(self.ready))
            case Exhausted():
                self.exhausted.add(message.subtask)
                if self.exhausted >= self.sources and self.final is None:
                    if self.driver.plan.has_loops:
                        self.census_due = now  # the final checkpoint waits for quiet loops
                    else:
                        self._trigger_final(now)
            case CensusCount():
                self._on_census(slot, message, now)
            case Ack():
                self._subtask_acknowledged(message, now)
                self._do(
                    self.coordinator.acknowledge(
                        message.checkpoint, message.subtask, message.handle, now
                    )
                )
            case Decline():
                self._do(
                    self.coordinator.decline(
                        message.checkpoint, message.subtask, message.reason, now
                    )
                )
            case Failed():
                if message.cause == "channel":
                    # a consequence: an upstream subtask died; its own report (or its lost
                    # connection) is the cause, and comes a moment later
                    if self.consequence is None:
                        self.consequence = Failure("lost", message.error, subtask=message.subtask)
                        self.consequence_at = now
                elif self.failure is None or self.failure.cause != "task":
                    self.failure = Failure(
                        "task",
                        message.error,
                        subtask=message.subtask,
                        operator=message.operator,
                        record=message.record,
                        traceback=message.traceback,
                    )
            case Lost():
                if slot not in self.finished and self.failure is None:
                    self.failure = Failure(
                        "lost",
                        f"lost{self._on_host(slot)}: {message.reason} (the worker "
                        "process or its host died, or its connection broke)",
                        subtask=slot,
                    )
            case Heartbeat() | Finished():
                self.records_in.update(message.records_in)
                with contextlib.suppress(TypeError, ValueError, KeyError, IndexError):
                    self.driver.metrics.heartbeat(message.metrics, now)
                self.driver.result.source_records[self.generation] = sum(
                    n for s, n in self.records_in.items() if s in self.sources
                )
                if isinstance(message, Finished):
                    self.finished.add(slot)
                    if len(self.finished) == len(self.slots) and self.ready_at is not None:
                        self.driver.result.running_seconds = now - self.ready_at
            case _:
                assert_never(message)

    def _subtask_acknowledged(self, ack: Ack, now: float) -> None:
        """Keep the statistics of one subtask's acknowledgement of a checkpoint in flight."""
        checkpoint = ack.checkpoint
        triggered = self.triggered_at.get(checkpoint)
        wall = self.trigger_wall.get(checkpoint)
        if triggered is None or wall is None:
            return  # a late acknowledgement
        with contextlib.suppress(KeyError, TypeError, ValueError):
            stats = ack.stats
            handle = StateHandle.from_dict(ack.handle)

            def after(at: Any) -> float:
                return float(at) - wall

            forwarded = stats.get("forwarded_at")
            self.subtask_stats.setdefault(checkpoint, {})[ack.subtask] = SubtaskStats(
                subtask=ack.subtask,
                acknowledged=now - triggered[0],
                start_delay=max(0.0, after(stats.get("first_barrier_at", wall))),
                alignment=ack.alignment,
                synchronous=float(stats.get("synchronous", 0.0)),
                asynchronous=ack.asynchronous,
                state_size=handle.size,
                segments_size=int(stats.get("segments_size", 0)),
                full_size=handle.size + sum(ref.size for ref in handle.segments),
                channel_state_records=int(stats.get("channel_state_records", 0)),
                channel_state_bytes=int(stats.get("channel_state_bytes", 0)),
                unaligned=ack.unaligned,
                barriers={str(c): after(t) for c, t in dict(stats.get("barriers", {})).items()},
                snapshot_at=after(stats.get("snapshot_at", wall)),
                forwarded_at=after(forwarded) if forwarded is not None else None,
                queued_ahead={
                    str(c): int(n) for c, n in dict(stats.get("queued_ahead", {})).items()
                },
            )

    def _checkpoint_stats(
        self, checkpoint: int, now: float, status: str, reason: str | None = None
    ) -> CheckpointStats:
        """The statistics of a checkpoint that ended (forgetting what was kept of it)."""
        started, final = self.triggered_at.pop(checkpoint, (now, False))
        subtasks = self.subtask_stats.pop(checkpoint, {})
        return CheckpointStats(
            checkpoint_id=checkpoint,
            generation=self.generation,
            duration=now - started,
            final=final,
            alignment=max((s.alignment for s in subtasks.values()), default=0.0),
            size=self.sizes.pop(checkpoint, sum(s.size for s in subtasks.values())),
            unaligned=any(s.unaligned for s in subtasks.values()),
            channel_state_records=sum(s.channel_state_records for s in subtasks.values()),
            triggered_at=started - self.driver._start,
            status=status,
            reason=reason,
            run=self.driver.run_id,
            trigger_time=self.trigger_wall.pop(checkpoint, 0.0),
            full_size=self.full_sizes.pop(checkpoint, sum(s.full_size for s in subtasks.values())),
            channel_state_bytes=sum(s.channel_state_bytes for s in subtasks.values()),
            checkpointing=self.driver.config.checkpointing,
            subtasks=dict(sorted(subtasks.items())),
        )

    def end(self) -> None:
        """The attempt ended: the checkpoints still in flight were aborted by it (and none
        waits any more: the figures kept at the end must not say one does)."""
        self.driver.metrics.waiting = None
        reason = (
            f"generation {self.generation} ended: {self.failure.describe()}"
            if self.failure is not None
            else f"generation {self.generation} ended"
        )
        now = self.now()
        for checkpoint in sorted(self.triggered_at):
            stats = self._checkpoint_stats(checkpoint, now, "aborted", reason[:2000])
            self.driver._keep(stats)
            with contextlib.suppress(StorageError):  # what its subtasks wrote of it
                if not self.driver.storage.is_complete(checkpoint):
                    self.driver.storage.discard(checkpoint)

    def _census(self, now: float) -> None:
        """Ask every slot how many records its subtasks sent on channels and processed."""
        self.census_wave += 1
        self.census = {}
        self.census_due = None
        self.census_started = now
        self._broadcast(Census(self.census_wave))

    def _on_census(self, slot: str, count: CensusCount, now: float) -> None:
        """Termination detection for loops (Mattern's counting in two waves): if the records
        processed in one wave equal the records sent in the next, asked only after the first
        was answered, nothing was in flight or being processed between the two, and with every
        source exhausted nothing can move again: the final checkpoint can be taken."""
        if count.wave != self.census_wave or self.final is not None:
            return
        self.census[slot] = (count.sent, count.done)
        if len(self.census) < len(self.slots):
            return
        sent = sum(s for s, _ in self.census.values())
        done = sum(d for _, d in self.census.values())
        if self.census_done == sent:
            self._trigger_final(now)
            return
        self.census_done = done
        self.census_due = self.census_started + 0.05

    # -------------------------------------------------------------- savepoints

    def _take_requests(self, now: float) -> None:
        """Start the savepoints asked for through the job's endpoint."""
        endpoint = self.driver.endpoint
        while endpoint is not None:
            try:
                request = endpoint.requests.get_nowait()
            except queue.Empty:
                return
            try:
                self._savepoint_target(request.target, 0)
            except ValueError as exc:
                request.fail(str(exc))
                continue
            if request.stop:
                if self.final is not None or self.stop_request is not None:
                    request.fail("the job is already stopping")
                else:
                    self.stop_request = request
                continue
            self.asking = request
            self._do(self.coordinator.trigger(now, savepoint=True))
            if self.asking is not None:  # the job failed meanwhile: nothing was triggered
                self.asking.fail("the job is failing")
                self.asking = None

    def _trigger_final(self, now: float) -> None:
        """Trigger the final checkpoint: a savepoint when someone asked to stop with one."""
        self.asking = self.stop_request
        self._do(self.coordinator.trigger(now, final=True, savepoint=self.stop_request is not None))
        self.asking = None

    def _savepoint_target(self, directory: str | None, checkpoint_id: int) -> str:
        """The folder savepoint ``checkpoint_id`` goes to (on the checkpoints' file system)."""
        driver = self.driver
        storage = driver.storage
        base = directory or driver.config.savepoint_dir
        if base is None:
            root = f"{storage.root}/savepoints"
        else:
            fs, root = fsspec.core.url_to_fs(base, **dict(driver.config.storage_options or {}))
            if type(fs) is not type(storage.fs):
                raise ValueError(
                    f"the savepoint directory {base} must be on the file system of the checkpoint "
                    f"directory {driver.config.checkpoint_dir}"
                )
        return f"{root.rstrip('/')}/savepoint-{checkpoint_id}-{driver.run_id}"

    def answer_requests(self) -> None:
        """The attempt ended: whoever still waits for a savepoint gets an answer."""
        reason = self.failure.describe() if self.failure is not None else "the job ended"
        for request in [*self.requests.values(), self.stop_request, self.asking]:
            if request is not None:
                request.fail(f"the job stopped before the savepoint completed: {reason}")
        self.requests.clear()

    # ---------------------------------------------------------------- actions

    def _do(self, actions: Any) -> None:
        driver, storage = self.driver, self.driver.storage
        for action in actions:
            now = self.now()
            if isinstance(action, TriggerCheckpoint):
                n = action.checkpoint_id
                self.next_id = max(self.next_id, n + 1)
                self.triggered_at[n] = (now, action.final)
                self.trigger_wall[n] = time.time()
                if action.final:
                    self.final = n
                base = None if action.savepoint else self.coordinator.latest_completed
                driver.registry.triggered(n, base)
                if action.savepoint:
                    request = self.asking
                    self.asking = None
                    if request is not None:
                        self.requests[n] = request
                    self.targets[n] = self._savepoint_target(
                        request.target if request is not None else None, n
                    )
                self._broadcast(Trigger(n, action.final, action.savepoint, base))
            elif isinstance(action, WriteMetadata):
                self._write_metadata(action)
            elif isinstance(action, NotifyCheckpointComplete):
                self._broadcast(Complete(action.checkpoint_id))
                info = self._checkpoint_stats(action.checkpoint_id, now, "completed")
                final = info.final
                target = self.targets.pop(action.checkpoint_id, None)
                if target is not None:
                    url = storage.url_of(target)
                    info = dataclasses.replace(info, savepoint=url)
                    driver._savepoints[action.checkpoint_id] = url
                    driver.result.savepoints.append(url)
                    request = self.requests.pop(action.checkpoint_id, None)
                    if request is not None:
                        request.succeed(url, action.checkpoint_id)
                        if request is self.stop_request:
                            self.stop_request = None
                            driver._stopped_with = action.checkpoint_id
                driver.result.checkpoints.append(info)
                driver._keep(info)
                kept = driver.result.checkpoints
                if len(kept) > SUBTASK_DETAILS:  # the older ones' details are in the files
                    older = len(kept) - SUBTASK_DETAILS - 1
                    kept[older] = dataclasses.replace(kept[older], subtasks={})
                driver.listener(  # "checkpoint 3 complete in 0.08 s", said as kind + message
                    "savepoint" if target is not None else "checkpoint",
                    f"{action.checkpoint_id} complete in {info.duration:.2f} s"
                    + (" (final)" if final else "")
                    + (f": {info.savepoint}" if info.savepoint else ""),
                )
                if final:
                    self.committing = (action.checkpoint_id, self.now())
                if self.holding:  # after the listener: what it did happened before the release
                    self._broadcast(Release(action.checkpoint_id))
            elif isinstance(action, AbortCheckpoint):
                self._broadcast(Abort(action.checkpoint_id))
                if action.checkpoint_id in self.triggered_at:
                    driver._keep(
                        self._checkpoint_stats(
                            action.checkpoint_id, now, "aborted", action.reason[:2000]
                        )
                    )
                self.targets.pop(action.checkpoint_id, None)
                with contextlib.suppress(StorageError):
                    storage.discard(action.checkpoint_id)
                driver._delete_shared(
                    driver.registry.aborted(action.checkpoint_id, _shared(action.handles))
                )
                request = self.requests.pop(action.checkpoint_id, None)
                stop_failed = request is not None and request is self.stop_request
                if request is not None:
                    request.fail(
                        f"savepoint {action.checkpoint_id} aborted: {action.reason}"
                        + ("; the job goes on" if stop_failed else "")
                    )
                    if stop_failed:
                        self.stop_request = None
                if not action.subsumed:
                    driver.result.aborted.append((action.checkpoint_id, action.reason))
                    driver.listener("abort", f"checkpoint {action.checkpoint_id}: {action.reason}")
                if action.checkpoint_id == self.final and self.failure is None:
                    self.final = None
                    stop = driver.config.stop_after
                    ending = (
                        self.exhausted >= self.sources
                        or self.draining
                        or (stop is not None and now - driver._start >= stop)
                    )
                    if ending or not stop_failed:
                        self._trigger_final(now)  # another final checkpoint
                    # else: a stop with a savepoint that failed: the sources read on
            elif isinstance(action, DiscardState):
                # a late acknowledgement of an aborted checkpoint: its folder (which the late
                # write made again) goes, segments and all; never a complete one
                with contextlib.suppress(StorageError, ValueError, KeyError):
                    if not storage.is_complete(action.checkpoint_id):
                        storage.discard(action.checkpoint_id)
                    else:
                        storage.discard_state(
                            action.checkpoint_id, StateHandle.from_dict(action.handle)
                        )
                driver._delete_shared(driver.registry.orphaned(_shared(((None, action.handle),))))
            elif isinstance(action, DiscardCheckpoint):
                with contextlib.suppress(StorageError):
                    storage.discard(action.checkpoint_id)
                if action.checkpoint_id in driver.registry.retained:
                    driver._delete_shared(driver.registry.discarded(action.checkpoint_id))
            elif isinstance(action, FailJob):
                self.failure = Failure("checkpoint", action.reason)

    def _write_metadata(self, action: WriteMetadata[str, dict[str, Any]]) -> None:
        storage, now = self.driver.storage, self.now()
        n = action.checkpoint_id
        target = self.targets.get(n)
        plan, mode = self.driver.plan, self.driver.config.checkpointing
        operators = [op for chain in plan.chains for op in chain.operators]
        try:
            metadata = CheckpointMetadata(
                checkpoint_id=n,
                generation=self.generation,
                handles={s: StateHandle.from_dict(h) for s, h in action.handles},
                extra={
                    "savepoint": target is not None,
                    "run": self.driver.run_id,
                    "parallelism": plan.parallelism,
                    "max_parallelism": plan.max_parallelism,
                    "operators": [op.uid for op in operators],
                    "operator_names": {op.uid: op.name for op in operators},
                    "operator_kinds": {op.uid: _kind(op) for op in operators},
                    "checkpointing": mode,
                    "time": time.time(),
                },
            )
            # never complete a checkpoint that is not a consistent cut (protocol/cut.py)
            violations = check_cut(
                channel_cuts(
                    {s: h.channels for s, h in metadata.handles.items() if h.channels is not None}
                ),
                at_least_once=mode == "at_least_once",
            )
            if violations:
                raise ValueError(
                    f"it is not a consistent cut: {violations[0]}"
                    + (f" (and {len(violations) - 1} more channels)" if len(violations) > 1 else "")
                )
            if target is not None:
                if any(h.shared for h in metadata.handles.values()):
                    raise ValueError("a savepoint names shared files")
                storage.move_checkpoint(n, target)
                storage.write_metadata(metadata, folder=target)
            else:
                storage.write_metadata(metadata)
            # the bytes this checkpoint wrote: its own files, and the shared ones new with it
            before = self.driver.registry.needed
            self.sizes[n] = sum(
                h.size + sum(r.size for r in h.segments if r.path not in before)
                for h in metadata.handles.values()
            )
            self.full_sizes[n] = sum(
                h.size + sum(r.size for r in h.segments) for h in metadata.handles.values()
            )
        except (StorageError, ValueError, KeyError) as exc:
            with contextlib.suppress(StorageError):
                storage.discard(n)
                if target is not None:
                    storage.remove_folder(target)
            self._do(self.coordinator.metadata_failed(n, str(exc), now))
            return
        hook = self.driver.config.checkpoint_written
        if hook is not None:
            storage = self.driver.storage
            hook(
                n,
                CheckpointLocation(storage.fs, target, storage.url_of)
                if target is not None
                else storage.location(n),
            )
        registry = self.driver.registry
        if target is not None:
            self.driver._delete_shared(registry.settled(n))
        else:
            shared = [ref.path for h in metadata.handles.values() for ref in h.shared]
            self.driver._delete_shared(registry.completed(n, shared))
        self._do(self.coordinator.metadata_written(n, now))
        if target is None:
            self._retain_across_runs()

    def _retain_across_runs(self) -> None:
        """``retained_checkpoints`` counts the directory's complete checkpoints, not only this
        run's: those of earlier runs go, oldest first, as this run's own complete. (The one
        this run restored stays while this run has fewer than that of its own: a restart may
        still need it; their shared files go only when no retained checkpoint names them.)"""
        driver = self.driver
        earlier = driver._earlier
        keep = max(0, driver.config.checkpoints.retained - len(self.coordinator.completed))
        while len(earlier) > keep:
            old = earlier.pop(0)
            with contextlib.suppress(StorageError):
                driver.storage.discard(old)
            if old in driver.registry.retained:
                driver._delete_shared(driver.registry.discarded(old))

    def _broadcast(self, message: DriverMessage) -> None:
        for slot in sorted(self.slots):
            with contextlib.suppress(ControlError):
                self.server.send(slot, message)


def _kind(op: Operator) -> str:
    """What kind of state operator ``op`` has (``CheckpointReader.operators`` says it)."""
    if op.is_source:
        return "source"
    if isinstance(op.logic, SinkLogic):
        return "sink"
    return "keyed" if getattr(op.logic, "keyed", False) else "operator"


def _shared(handles: Any) -> list[str]:
    """The shared files the acknowledgements ``handles`` ((task, handle dict), ...) name."""
    paths = []
    for _, handle in handles:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            paths += [ref.path for ref in StateHandle.from_dict(handle).shared]
    return paths
