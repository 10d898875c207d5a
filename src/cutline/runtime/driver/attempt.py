"""One attempt (generation) of a job, on the driver: its control events and its coordinator.

A :class:`JobAttempt` runs from the launch of the generation's slots to their end. Its loop
reads the slots' messages and feeds the :class:`~cutline.protocol.CheckpointCoordinator`,
carries out the coordinator's actions (trigger, write metadata, complete, abort, discard),
and asks its roles what to do:

===============================  ==================================================================
role                             what it decides
===============================  ==================================================================
:class:`FailureDetector`         whether the attempt failed: a report, a lost slot, a heartbeat
                                 that stopped, a phase past its deadline
:class:`CheckpointStatsTracker`  each checkpoint's statistics, and which one is slow and why
:class:`SavepointRequests`       which savepoint to trigger for whom, and what to answer them
:class:`TerminationDetector`     (jobs with loops) when the loops are quiet, so that the final
                                 checkpoint may be taken
===============================  ==================================================================

The attempt ends when every slot finished (``None``) or with the :class:`Failure` that ended
it; the driver then restarts the job or fails it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Sequence
from typing import Any, assert_never

from cutline.protocol.coordinator import (
    AbortCheckpoint,
    CheckpointCoordinator,
    CoordinatorAction,
    DiscardCheckpoint,
    DiscardState,
    FailJob,
    NotifyCheckpointComplete,
    TriggerCheckpoint,
    WriteMetadata,
)
from cutline.protocol.errors import ProtocolError
from cutline.protocol.termination import NextWave, Terminated, TerminationDetector
from cutline.runtime.checkpoint.layout import StateHandle, StorageError
from cutline.runtime.checkpoint.location import CheckpointLocation
from cutline.runtime.checkpoint.stats import RecordCounts
from cutline.runtime.driver.events import (
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointSlow,
    GenerationRunning,
    JobWarning,
    SavepointCompleted,
)
from cutline.runtime.driver.failure_detector import FailureDetector
from cutline.runtime.driver.global_commits import GlobalCommitError
from cutline.runtime.driver.metadata import checkpoint_metadata
from cutline.runtime.driver.result import Failure
from cutline.runtime.driver.run import JobRun
from cutline.runtime.driver.savepoints import SavepointRequests
from cutline.runtime.driver.stats_tracker import CheckpointStatsTracker
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
    Gates,
    Heartbeat,
    Lost,
    Peers,
    Phase,
    Ready,
    Release,
    Skipped,
    Trigger,
    Warn,
)
from cutline.runtime.task.launch import LaunchedJob

LOST_GRACE = 0.25
"""Seconds a lost slot waits for another slot's report of the failure that caused it."""

SUBTASK_DETAILS = 100
"""Completed checkpoints whose per-subtask statistics ``JobResult.checkpoints`` keeps."""

Coordinator = CheckpointCoordinator[str, dict[str, Any]]


class JobAttempt:
    """One generation of the job (see the module's docstring).

    :param holding: the sources hold part-way (:class:`~cutline.runtime.task.launch.SourceHold`):
        each checkpoint's completion is followed by ``Release`` once the listener was told.
    :param restored: what the job had counted at the checkpoint the attempt restores (see
        :class:`~cutline.runtime.checkpoint.stats.RecordCounts`; ``None``: not known).
    """

    def __init__(
        self,
        run: JobRun,
        generation: int,
        coordinator: Coordinator,
        server: ControlServer,
        *,
        holding: bool = False,
        restored: RecordCounts | None,
    ) -> None:
        self.run, self.generation = run, generation
        self.coordinator, self.server = coordinator, server
        self.holding = holding
        self.slots = server.tasks
        self.next_id = run.next_id
        self.hosts: dict[str, str] = {}
        """Slot -> the host it runs on (as it said)."""
        self.gates: dict[str, Gates] = {}
        """Slot -> where its input gates are (the rendezvous), once it said."""
        self.ready: dict[str, int] = {}
        """Slot -> its process id, once it is ready."""
        self.ready_at: float | None = None
        self.finished: set[str] = set()
        self.exhausted: set[str] = set()
        self.sources = set(run.plan.source_subtasks())
        self.records_in: dict[str, int] = {}
        self.final: int | None = None
        """The final checkpoint in flight."""
        self.draining = False
        """The sources were told to stop reading (a stop, in a job with loops)."""
        self.failures = FailureDetector(self.slots, run.config, self.hosts.get)
        self.stats = CheckpointStatsTracker(
            generation, run.run_id, run.started, run.config.barriers.mode, restored
        )
        self.savepoints = SavepointRequests(run.config, run.storage, run.run_id)
        self.progress_due = 0.0
        self.termination = TerminationDetector(self.slots)
        """Loops only, once the sources are done: whether the loops are quiet."""
        self.census_due: float | None = None
        """When to ask the slots for their counts next."""
        self.census_started = 0.0

    @property
    def failure(self) -> Failure | None:
        return self.failures.failure

    def now(self) -> float:
        return time.monotonic()

    def drive(self, job: LaunchedJob) -> Failure | None:
        """Run the attempt until every slot finished (``None``) or it failed (why)."""
        config, run = self.run.config, self.run
        self.failures.launched = self.now()
        while True:
            now = self.now()
            if len(self.finished) == len(self.slots) and self.failure is None:
                run.result.records_in.update(self.records_in)
                return None
            error = job.error()
            if error is not None and self.failure is None:
                return self._launcher_failed(error)
            failure = self.failures.check(now, self.finished, self.final)
            if failure is None and run.lock is not None and run.lock.lost is not None:
                failure = Failure("lock", run.lock.lost)  # another job writes here: stop for good
            if failure is not None:
                if failure.cause == "lost":
                    self._hear_the_cause(LOST_GRACE)
                return self.failure or failure
            if len(self.ready) == len(self.slots):
                assert self.ready_at is not None
                self._take_requests(now)
                stop = config.stop_after
                stopping = stop is not None and run.elapsed() >= stop
                if (stopping or self.savepoints.stop_request is not None) and self.final is None:
                    if not run.plan.has_loops:
                        self._trigger_final(now)
                    elif not self.draining:  # the sources stop; the final checkpoint waits
                        self.draining = True  # for the loops to be quiet
                        self._broadcast(Drain())
                if self.census_due is not None and now >= self.census_due:
                    self._census(now)
                # as in Flink, the first periodic checkpoint comes one interval after the start
                interval = config.checkpoints.interval
                if interval is None or now >= self.ready_at + interval:
                    self._carry_out(self.coordinator.poll(now))
            self._progress(now)
            event = self.server.next_event(timeout=0.02)
            while event is not None and self.failure is None:
                self._on_event(event)
                event = self.server.next_event(timeout=0)

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

    def _launcher_failed(self, error: str) -> Failure:
        """The launcher failed: prefer the reason a slot reported (it names the operator)."""
        deadline = self.now() + 2.0
        while self.failure is None and self.now() < deadline:
            event = self.server.next_event(timeout=0.1)
            if event is not None and isinstance(event.message, Failed | Lost):
                self._on_event(event)
        return self.failures.launcher_failed(error)

    def _progress(self, now: float) -> None:
        """Hand the job's figures to the progress display, four times a second; say once of a
        checkpoint that it is slow, and why (listener ``waiting``)."""
        if now < self.progress_due:
            return
        self.progress_due = now + 0.25
        run = self.run
        assert run.run_info is not None
        slow = self.stats.slow(
            now, run.config.checkpoints.interval, run.plan.subtasks(), run.run_info.channels
        )
        run.metrics.waiting = slow[1] if slow is not None else None
        if slow is not None and self.stats.first_said_slow(slow[0]):
            run.listener(CheckpointSlow(slow[0], slow[1]))
        if run.on_progress is None:
            return
        try:
            run.on_progress(run.metrics.snapshot(run.elapsed()))
        except Exception as exc:  # a display that fails must not fail the job
            run.on_progress = None
            run.listener(JobWarning(f"the progress display failed and stopped: {exc}"))

    # ----------------------------------------------------------------- events

    def _on_event(self, event: Event) -> None:
        message, slot, now = event.message, event.task, self.now()
        self.failures.heard(slot, now)
        run = self.run
        match message:
            case Phase():
                self.failures.entered(slot, message.phase, now)
                if message.host is not None:
                    self._on_host(slot, message.host)
            case Gates():
                self._on_gates(slot, message)
            case Ready():
                self.failures.entered(slot, "running", now)
                self.ready[slot] = message.pid
                self._on_host(slot, message.host)
                if len(self.ready) == len(self.slots):
                    self.ready_at = now
                    run.listener(GenerationRunning(self.generation, dict(self.hosts)))
                    if run.on_ready is not None:
                        run.on_ready(self.generation, dict(self.ready))
            case Exhausted():
                self.exhausted.add(message.subtask)
                if self.exhausted >= self.sources and self.final is None:
                    if run.plan.has_loops:
                        self.census_due = now  # the final checkpoint waits for quiet loops
                    else:
                        self._trigger_final(now)
            case CensusCount():
                self._on_census(slot, message, now)
            case Warn():
                run.listener(JobWarning(f"{message.subtask}: {message.message}"))
            case Skipped():
                run.skipped(message.source, message.split, message.records, message.why)
            case Ack():
                self.stats.acknowledged(message, now)
                self._carry_out(
                    self.coordinator.acknowledge(
                        message.checkpoint, message.subtask, message.handle, now
                    )
                )
            case Decline():
                self._carry_out(
                    self.coordinator.decline(
                        message.checkpoint, message.subtask, message.reason, now
                    )
                )
            case Failed():
                self.failures.task_failed(message, now)
            case Lost():
                self.failures.lost(slot, message.reason, slot in self.finished)
            case Heartbeat() | Finished():
                self.records_in.update(message.records_in)
                with contextlib.suppress(TypeError, ValueError, KeyError, IndexError):
                    run.metrics.heartbeat(message.metrics, now)
                run.result.source_records[self.generation] = sum(
                    n for s, n in self.records_in.items() if s in self.sources
                )
                if isinstance(message, Finished):
                    self.finished.add(slot)
                    if len(self.finished) == len(self.slots) and self.ready_at is not None:
                        run.result.running_seconds = now - self.ready_at
            case _:
                assert_never(message)

    def _on_gates(self, slot: str, gates: Gates) -> None:
        """The rendezvous: once every slot said where its gates are, tell them all (in slot
        order, as ``slot-0``, ``slot-1``, ... are the subtasks' indices)."""
        self.gates[slot] = gates
        self._on_host(slot, gates.host)
        if len(self.gates) < len(self.slots):
            return
        order = [self.gates[f"slot-{i}"] for i in range(len(self.slots))]
        self._broadcast(Peers([g.host for g in order], [dict(g.ports) for g in order]))

    def _on_host(self, slot: str, host: str) -> None:
        self.hosts[slot] = host
        self.run.result.hosts.setdefault(self.generation, {})[slot] = host

    def end(self) -> None:
        """The attempt ended: the checkpoints still in flight were aborted by it (and none
        waits any more: the figures kept at the end must not say one does); whoever waits for
        a savepoint is answered."""
        run = self.run
        run.metrics.waiting = None
        failure = self.failure
        self.savepoints.answer_all(failure.describe() if failure is not None else "the job ended")
        reason = f"generation {self.generation} ended" + (
            f": {failure.describe()}" if failure is not None else ""
        )
        now = self.now()
        for checkpoint in self.stats.in_flight:
            run.record(self.stats.ended(checkpoint, now, "aborted", reason[:2000]))
            with contextlib.suppress(StorageError):  # what its subtasks wrote of it
                if not run.storage.is_complete(checkpoint):
                    run.storage.discard(checkpoint)

    # ------------------------------------------------------------------ loops

    def _census(self, now: float) -> None:
        """Ask every slot how many records its subtasks sent on channels and processed (a wave
        of the :class:`~cutline.protocol.termination.TerminationDetector`)."""
        self.census_due = None
        if self.termination.terminated:
            return
        self.census_started = now
        self._broadcast(Census(self.termination.start_wave().wave))

    def _on_census(self, slot: str, count: CensusCount, now: float) -> None:
        """A slot's counts: once a wave shows the loops quiet (Mattern's counting in two waves:
        nothing in flight, and with every source exhausted nothing can move again), the final
        checkpoint can be taken; else the next wave goes 50 ms after this one started."""
        if self.final is not None:
            return
        try:
            actions = self.termination.on_counts(slot, count.wave, count.sent, count.done)
        except ProtocolError as exc:  # (a slot's counts went down: it is not what it says)
            self.failures.lost(slot, f"its census answer is impossible: {exc}", False)
            return
        for action in actions:
            match action:
                case Terminated():
                    self._trigger_final(now)
                case NextWave():
                    self.census_due = self.census_started + 0.05
                case _:
                    assert_never(action)

    # -------------------------------------------------------------- savepoints

    def _take_requests(self, now: float) -> None:
        """Start the savepoints asked for through the job's endpoint."""
        for _ in self.savepoints.take(self.run.endpoint, stopping=self.final is not None):
            self._carry_out(self.coordinator.trigger(now, savepoint=True))

    def _trigger_final(self, now: float) -> None:
        """Trigger the final checkpoint: a savepoint when someone asked to stop with one."""
        savepoints = self.savepoints
        savepoints.asking = savepoints.stop_request
        self._carry_out(
            self.coordinator.trigger(now, final=True, savepoint=savepoints.stop_request is not None)
        )
        savepoints.asking = None

    # ---------------------------------------------------------------- actions

    def _carry_out(self, actions: Sequence[CoordinatorAction[str, dict[str, Any]]]) -> None:
        """Carry out the coordinator's actions, in order."""
        for action in actions:
            match action:
                case TriggerCheckpoint():
                    self._trigger(action)
                case WriteMetadata():
                    self._write_metadata(action)
                case NotifyCheckpointComplete():
                    self._completed(action.checkpoint_id)
                case AbortCheckpoint():
                    self._aborted(action)
                case DiscardState():
                    # a late acknowledgement of an aborted checkpoint: its folder (which the
                    # late write made again) goes, segments and all; never a complete one
                    storage = self.run.storage
                    with contextlib.suppress(StorageError, ValueError, KeyError):
                        if not storage.is_complete(action.checkpoint_id):
                            storage.discard(action.checkpoint_id)
                        else:
                            storage.discard_state(
                                action.checkpoint_id, StateHandle.from_dict(action.handle)
                            )
                    orphaned = self.run.registry.orphaned(_shared(((None, action.handle),)))
                    self.run.delete_shared(orphaned)
                case DiscardCheckpoint():
                    with contextlib.suppress(StorageError):
                        self.run.storage.discard(action.checkpoint_id)
                    if action.checkpoint_id in self.run.registry.retained:
                        self.run.delete_shared(self.run.registry.discarded(action.checkpoint_id))
                case FailJob():
                    self.failures.fail(Failure("checkpoint", action.reason))
                case _:
                    assert_never(action)

    def _trigger(self, action: TriggerCheckpoint) -> None:
        n = action.checkpoint_id
        self.next_id = max(self.next_id, n + 1)
        self.stats.triggered(n, self.now(), action.final)
        if action.final:
            self.final = n
        base = None if action.savepoint else self.coordinator.latest_completed
        self.run.registry.triggered(n, base)
        if action.savepoint:
            self.savepoints.triggered(n)
        self._broadcast(Trigger(n, action.final, action.savepoint, base))

    def _completed(self, checkpoint: int) -> None:
        run = self.run
        self._broadcast(Complete(checkpoint))
        info = self.stats.ended(checkpoint, self.now(), "completed")
        target = self.savepoints.folder(checkpoint)
        if target is not None:
            url = run.storage.url_of(target)
            info = dataclasses.replace(info, savepoint=url)
            run.savepoints[checkpoint] = url
            run.result.savepoints.append(url)
            if self.savepoints.completed(checkpoint, url):
                run.stopped_with = checkpoint
        run.result.checkpoints.append(info)
        run.record(info)
        kept = run.result.checkpoints
        if len(kept) > SUBTASK_DETAILS:  # the older ones' details are in the files
            older = len(kept) - SUBTASK_DETAILS - 1
            kept[older] = dataclasses.replace(kept[older], subtasks={})
        names = {op.uid: op.name for chain in run.plan.chains for op in chain.operators}
        late = tuple(
            (names.get(uid, uid), figures["late"])
            for uid, figures in info.event_time().items()
            if figures.get("late")
        )
        run.listener(
            SavepointCompleted(checkpoint, info.duration, info.final, late, info.savepoint)
            if info.savepoint is not None
            else CheckpointCompleted(checkpoint, info.duration, info.final, late)
        )
        if info.final:
            self.failures.committing = (checkpoint, self.now())
        if self.holding:  # after the listener: what it did happened before the release
            self._broadcast(Release(checkpoint))

    def _aborted(self, action: AbortCheckpoint[str, dict[str, Any]]) -> None:
        run, n, now = self.run, action.checkpoint_id, self.now()
        self._broadcast(Abort(n))
        if n in self.stats.in_flight:
            run.record(self.stats.ended(n, now, "aborted", action.reason[:2000]))
        with contextlib.suppress(StorageError):
            run.storage.discard(n)
        run.delete_shared(run.registry.aborted(n, _shared(action.handles)))
        stop_failed = self.savepoints.aborted(n, action.reason)
        if not action.subsumed:
            run.result.aborted.append((n, action.reason))
            run.listener(CheckpointAborted(n, action.reason))
        if n == self.final and self.failure is None:
            self.final = None
            stop = run.config.stop_after
            ending = (
                self.exhausted >= self.sources
                or self.draining
                or (stop is not None and run.elapsed() >= stop)
            )
            if ending or not stop_failed:
                self._trigger_final(now)  # another final checkpoint
            # else: a stop with a savepoint that failed: the sources read on

    def _write_metadata(self, action: WriteMetadata[str, dict[str, Any]]) -> None:
        run, now = self.run, self.now()
        storage = run.storage
        n = action.checkpoint_id
        target = self.savepoints.folder(n)
        try:
            metadata = checkpoint_metadata(
                run, self.generation, self.stats, action, savepoint=target is not None
            )
            if target is not None:
                if any(h.shared for h in metadata.handles.values()):
                    raise ValueError("a savepoint names shared files")
                storage.move_checkpoint(n, target)
                storage.write_metadata(metadata, folder=target)
            else:
                storage.write_metadata(metadata)
            # the bytes this checkpoint wrote: its own files, and the shared ones new with it
            before = run.registry.needed
            self.stats.written(
                n,
                sum(
                    h.size + sum(r.size for r in h.segments if r.path not in before)
                    for h in metadata.handles.values()
                ),
                sum(h.size + sum(r.size for r in h.segments) for h in metadata.handles.values()),
            )
        except (StorageError, ValueError, KeyError) as exc:
            with contextlib.suppress(StorageError):
                storage.discard(n)
                if target is not None:
                    storage.remove_folder(target)
            self._carry_out(self.coordinator.metadata_failed(n, str(exc), now))
            return
        location = (
            CheckpointLocation(storage.fs, target, storage.url_of)
            if target is not None
            else storage.location(n)
        )
        hook = run.config.checkpoint_written
        if hook is not None:
            hook(n, location)
        if target is not None:
            run.delete_shared(run.registry.settled(n))
        else:
            shared = [ref.path for h in metadata.handles.values() for ref in h.shared]
            run.delete_shared(run.registry.completed(n, shared))
        try:  # (before the subtasks hear of it; a restore of it commits it again)
            run.global_commits.commit(n, location)
        except GlobalCommitError as exc:
            self.failures.fail(Failure("commit", str(exc)))
            return
        self._carry_out(self.coordinator.metadata_written(n, now))
        if target is None:
            run.retire_earlier(len(self.coordinator.completed))

    def _broadcast(self, message: DriverMessage) -> None:
        for slot in sorted(self.slots):
            with contextlib.suppress(ControlError):
                self.server.send(slot, message)


def _shared(handles: Any) -> list[str]:
    """The shared files the acknowledgements ``handles`` ((task, handle dict), ...) name."""
    paths = []
    for _, handle in handles:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            paths += [ref.path for ref in StateHandle.from_dict(handle).shared]
    return paths
