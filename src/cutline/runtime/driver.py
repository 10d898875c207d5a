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
import pickle
import secrets
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import fsspec

from cutline.protocol.coordinator import (
    AbortCheckpoint,
    CheckpointCoordinator,
    CheckpointSettings,
    DiscardCheckpoint,
    DiscardState,
    FailJob,
    NotifyCheckpointComplete,
    TriggerCheckpoint,
    WriteMetadata,
)
from cutline.runtime.control import ControlError, ControlServer, Event
from cutline.runtime.graph import ExecutionPlan
from cutline.runtime.storage import (
    CheckpointMetadata,
    CheckpointStorage,
    StateHandle,
    StorageError,
)
from cutline.runtime.task import SlotSetup


class JobFailedError(Exception):
    """The job failed and the restart strategy gave up. The message names the operator, the
    subtask and the user's traceback when a user function failed."""

    def __init__(self, message: str, failure: Failure | None = None) -> None:
        super().__init__(message)
        self.failure = failure

    @property
    def operator(self) -> str | None:
        return self.failure.operator if self.failure else None

    @property
    def subtask(self) -> str | None:
        return self.failure.subtask if self.failure else None

    @property
    def user_traceback(self) -> str | None:
        return self.failure.traceback if self.failure else None


class CheckpointWarning(UserWarning):
    """A complete checkpoint was skipped on restore because it is damaged."""


@dataclass(frozen=True)
class Failure:
    """Why an attempt of the job failed."""

    cause: str
    """``task`` (an exception), ``lost`` (a worker died or stopped answering), ``checkpoint``
    (too many failed checkpoints), ``launcher`` (Spark itself)."""
    message: str
    subtask: str | None = None
    operator: str | None = None
    record: str | None = None
    traceback: str | None = None

    def describe(self) -> str:
        where = f"{self.operator} (subtask {self.subtask})" if self.operator else self.subtask
        text = f"{where}: {self.message}" if where else self.message
        if self.record is not None:
            text += f"\n  record: {self.record}"
        if self.traceback:
            text += "\n" + self.traceback.rstrip()
        return text


@dataclass(frozen=True)
class CheckpointInfo:
    checkpoint_id: int
    generation: int
    duration: float
    """Seconds from trigger to complete."""
    final: bool
    alignment: float = 0.0
    """The longest barrier alignment of any subtask (seconds)."""
    size: int = 0
    """Bytes of state files."""
    unaligned: bool = False
    """Whether any subtask took it unaligned (the mode, or an alignment that timed out)."""
    channel_state_records: int = 0
    """Records in flight it recorded (input and output channel state of every subtask)."""
    triggered_at: float = 0.0
    """Seconds from the start of the job to its trigger (it completed ``duration`` later)."""


@dataclass(frozen=True)
class RestartInfo:
    generation: int
    """The generation that failed."""
    cause: str
    restored_from: int | None
    """The checkpoint the next generation restored (``None``: from the start)."""
    failed_at: float
    """Seconds since the job started."""


@dataclass
class JobResult:
    """What :meth:`JobDriver.run` returns."""

    checkpoints: list[CheckpointInfo] = field(default_factory=list)
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

    @property
    def output(self) -> list[Any]:
        """The records of the job's collect sink (there must be exactly one)."""
        if len(self.collected) != 1:
            raise ValueError(
                f"the job has {len(self.collected)} collect sinks; use result.collected[name]"
            )
        return next(iter(self.collected.values()))


class LaunchedJob(Protocol):
    def error(self) -> str | None:
        """``None`` while running or after success; the failure's text otherwise."""
        ...

    def cancel(self) -> None: ...

    def wait(self, timeout: float) -> None: ...


class Launcher(Protocol):
    def launch(self, setup: SlotSetup) -> LaunchedJob:
        """Start one slot per subtask index, each calling ``run_slot(setup, slot, ...)``."""
        ...

    def driver_host(self) -> str:
        """The address the slots reach the driver at."""
        ...


@dataclass(frozen=True)
class JobConfig:
    parallelism: int
    checkpoint_dir: str
    checkpoints: CheckpointSettings = field(default_factory=CheckpointSettings)
    storage_options: dict[str, Any] | None = None
    restart_attempts: int = 3
    restart_delay: float = 1.0
    batch_size: int = 65536
    buffer_capacity: int = 4
    dead_letter_dir: str | None = None
    on_error: dict[str, str] = field(default_factory=dict)
    heartbeat_timeout: float = 30.0
    collect: dict[str, str] = field(default_factory=dict)
    """Collect sink name -> its directory (read back when the job ends)."""
    start_timeout: float = 300.0
    """Seconds for every slot to be scheduled and ready."""
    stop_after: float | None = None
    """Seconds after the job started at which it stops with a final checkpoint: the sources
    stop reading, everything they read is processed and published (for unbounded sources)."""
    checkpointing: str = "aligned"
    """``aligned``, ``unaligned`` or ``at_least_once`` (see :class:`SlotSetup`)."""
    alignment_timeout: float | None = None
    """See :class:`SlotSetup`."""


Listener = Callable[[str, str], None]
"""Called with (kind, message) for what a user may want to see: ``checkpoint``, ``abort``,
``restart``, ``warning``, ``failure``."""


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
        self._first_id = (existing[-1] + 1) if existing else 1
        """The first checkpoint id of this run; checkpoints below it belong to earlier runs."""
        self._next_id = self._first_id
        self.result = JobResult()
        self._start = time.monotonic()
        self.run_id = secrets.token_hex(4)
        """This run's id, in the names of its output files."""
        self.on_ready: Callable[[int, dict[str, int]], None] | None = None
        """Called with (generation, {slot: process id}) once every slot is ready (tests use it
        to kill a worker)."""

    # ---------------------------------------------------------------- attempts

    def run(self) -> JobResult:
        generation = 0
        restore = self._choose_checkpoint()
        while True:
            generation += 1
            failure = self._attempt(generation, restore)
            self.result.generations = generation
            if failure is None:
                self.result.duration = time.monotonic() - self._start
                self.result.collected = self._read_collected()
                return self.result
            restarts = len(self.result.restarts)
            if restarts >= self.config.restart_attempts:
                self.result.restarts.append(
                    RestartInfo(generation, failure.describe(), None, self._elapsed())
                )
                self.listener("failure", failure.describe())
                raise JobFailedError(
                    f"the job failed after {restarts + 1} attempt(s) "
                    f"(restart_attempts={self.config.restart_attempts}): {failure.describe()}",
                    failure,
                )
            restore = self._choose_checkpoint()  # warns about the damaged ones it skips
            restored = restore.checkpoint_id if restore is not None else None
            self.result.restarts.append(
                RestartInfo(generation, failure.describe(), restored, self._elapsed())
            )
            self.listener(
                "restart",
                f"generation {generation} failed: {failure.describe()}\n"
                f"restarting in {self.config.restart_delay:g} s from "
                + (f"checkpoint {restored}" if restored is not None else "the start"),
            )
            time.sleep(self.config.restart_delay)

    def _elapsed(self) -> float:
        return time.monotonic() - self._start

    def _choose_checkpoint(self) -> CheckpointMetadata | None:
        metadata, skipped = self.storage.latest(since=self._first_id)
        for skip in skipped:
            message = f"checkpoint {skip.checkpoint_id} is damaged and was skipped: {skip.reason}"
            warnings.warn(message, CheckpointWarning, stacklevel=2)
            self.listener("warning", message)
        return metadata

    def _attempt(self, generation: int, restore: CheckpointMetadata | None) -> Failure | None:
        config, plan = self.config, self.plan
        token = secrets.token_hex(16).encode()
        slots = [f"slot-{i}" for i in range(plan.parallelism)]
        server = ControlServer(slots, token=token, generation=generation)
        completed = [
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
            restore_id=restore.checkpoint_id if restore else None,
            restore_handles=(
                {s: h.to_dict() for s, h in restore.handles.items()} if restore else {}
            ),
            batch_size=config.batch_size,
            buffer_capacity=config.buffer_capacity,
            dead_letter_dir=config.dead_letter_dir,
            on_error=config.on_error,
            run=self.run_id,
            checkpointing=config.checkpointing,
            alignment_timeout=config.alignment_timeout,
        )
        attempt = _Attempt(self, generation, coordinator, server)
        job = self.launcher.launch(setup)
        try:
            return attempt.drive(job)
        finally:
            self._next_id = max(self._next_id, attempt.next_id)
            server.close()
            job.cancel()
            job.wait(60.0)

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


class _Attempt:
    """One generation of the job: its control events and its coordinator."""

    def __init__(
        self,
        driver: JobDriver,
        generation: int,
        coordinator: CheckpointCoordinator[str, dict[str, Any]],
        server: ControlServer,
    ) -> None:
        self.driver = driver
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
        self.alignment: dict[int, float] = {}
        self.channel_records: dict[int, int] = {}
        self.unaligned: set[int] = set()
        self.sizes: dict[int, int] = {}
        self.ready_at: float | None = None
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

    def now(self) -> float:
        return time.monotonic()

    def drive(self, job: LaunchedJob) -> Failure | None:
        config = self.driver.config
        started = self.now()
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
            if len(self.ready) < len(self.slots):
                if now - started > config.start_timeout:
                    return Failure(
                        "launcher",
                        f"only {len(self.ready)} of {len(self.slots)} slots started within "
                        f"{config.start_timeout:g} s",
                    )
            else:
                assert self.ready_at is not None
                for slot in self.slots - self.finished:
                    if now - self.last_beat.get(slot, now) > config.heartbeat_timeout:
                        return Failure(
                            "lost",
                            f"{slot} stopped answering (no heartbeat for "
                            f"{config.heartbeat_timeout:g} s)",
                            subtask=slot,
                        )
                stop = config.stop_after
                if stop is not None and self.final is None and now - driver_start >= stop:
                    if not self.driver.plan.has_loops:
                        self._do(self.coordinator.trigger(now, final=True))
                    elif not self.draining:  # the sources stop; the final checkpoint waits
                        self.draining = True  # for the loops to be quiet
                        self._broadcast("drain")
                if self.census_due is not None and now >= self.census_due:
                    self._census(now)
                # as in Flink, the first periodic checkpoint comes one interval after the start
                interval = config.checkpoints.interval
                if interval is None or now >= self.ready_at + interval:
                    self._do(self.coordinator.poll(now))
            event = self.server.next_event(timeout=0.02)
            while event is not None and self.failure is None:
                self._on_event(event)
                event = self.server.next_event(timeout=0)
        return self.failure

    def _explain(self, error: str) -> Failure:
        """The launcher failed: prefer the reason a task reported (it names the operator)."""
        deadline = self.now() + 2.0
        while self.failure is None and self.now() < deadline:
            event = self.server.next_event(timeout=0.1)
            if event is not None and event.kind in ("failed", "lost"):
                self._on_event(event)
        if self.failure is not None:
            return self.failure
        return self.consequence or Failure("launcher", error)

    # ----------------------------------------------------------------- events

    def _on_event(self, event: Event) -> None:
        body, kind, now = event.body, event.kind, self.now()
        self.last_beat[event.task] = now
        if kind == "ready":
            self.ready[event.task] = int(body.get("pid", 0))
            if len(self.ready) == len(self.slots):
                self.ready_at = now
                if self.driver.on_ready is not None:
                    self.driver.on_ready(self.generation, dict(self.ready))
        elif kind == "exhausted":
            self.exhausted.add(str(body["subtask"]))
            if self.exhausted >= self.sources and self.final is None:
                if self.driver.plan.has_loops:
                    self.census_due = now  # the final checkpoint waits for the loops to be quiet
                else:
                    self._do(self.coordinator.trigger(now, final=True))
        elif kind == "census":
            self._on_census(event.task, body, now)
        elif kind == "ack":
            checkpoint = int(body["checkpoint"])
            self.alignment[checkpoint] = max(
                self.alignment.get(checkpoint, 0.0), float(body.get("alignment", 0.0))
            )
            self.channel_records[checkpoint] = self.channel_records.get(checkpoint, 0) + int(
                body.get("channel_records", 0)
            )
            if body.get("unaligned"):
                self.unaligned.add(checkpoint)
            self._do(
                self.coordinator.acknowledge(
                    int(body["checkpoint"]), str(body["subtask"]), dict(body["handle"]), now
                )
            )
        elif kind == "decline":
            self._do(
                self.coordinator.decline(
                    int(body["checkpoint"]), str(body["subtask"]), str(body["reason"]), now
                )
            )
        elif kind == "failed":
            if body.get("cause") == "channel":
                # a consequence: an upstream subtask died; its own report (or its lost
                # connection) is the cause, and comes a moment later
                if self.consequence is None:
                    self.consequence = Failure(
                        "lost", str(body.get("error")), subtask=str(body.get("subtask"))
                    )
                    self.consequence_at = now
            elif self.failure is None or self.failure.cause != "task":
                self.failure = Failure(
                    "task",
                    str(body.get("error")),
                    subtask=str(body.get("subtask")),
                    operator=body.get("operator"),
                    record=body.get("record"),
                    traceback=body.get("traceback"),
                )
        elif kind == "lost":
            if event.task not in self.finished and self.failure is None:
                self.failure = Failure(
                    "lost",
                    f"{event.task} was lost: {body.get('reason')} (the worker process died or "
                    "its connection broke)",
                    subtask=event.task,
                )
        elif kind in ("finished", "heartbeat"):
            self.records_in.update(body.get("records_in", {}))
            self.driver.result.source_records[self.generation] = sum(
                n for s, n in self.records_in.items() if s in self.sources
            )
            if kind == "finished":
                self.finished.add(event.task)
                if len(self.finished) == len(self.slots) and self.ready_at is not None:
                    self.driver.result.running_seconds = now - self.ready_at

    def _census(self, now: float) -> None:
        """Ask every slot how many records its subtasks sent on channels and processed."""
        self.census_wave += 1
        self.census = {}
        self.census_due = None
        self.census_started = now
        self._broadcast("census", wave=self.census_wave)

    def _on_census(self, slot: str, body: dict[str, Any], now: float) -> None:
        """Termination detection for loops (Mattern's counting in two waves): if the records
        processed in one wave equal the records sent in the next, asked only after the first
        was answered, nothing was in flight or being processed between the two, and with every
        source exhausted nothing can move again: the final checkpoint can be taken."""
        if body.get("wave") != self.census_wave or self.final is not None:
            return
        self.census[slot] = (int(body["sent"]), int(body["done"]))
        if len(self.census) < len(self.slots):
            return
        sent = sum(s for s, _ in self.census.values())
        done = sum(d for _, d in self.census.values())
        if self.census_done == sent:
            self._do(self.coordinator.trigger(now, final=True))
            return
        self.census_done = done
        self.census_due = self.census_started + 0.05

    # ---------------------------------------------------------------- actions

    def _do(self, actions: Any) -> None:
        driver, storage = self.driver, self.driver.storage
        for action in actions:
            now = self.now()
            if isinstance(action, TriggerCheckpoint):
                self.next_id = max(self.next_id, action.checkpoint_id + 1)
                self.triggered_at[action.checkpoint_id] = (now, action.final)
                if action.final:
                    self.final = action.checkpoint_id
                self._broadcast(
                    "trigger", checkpoint=action.checkpoint_id, final=bool(action.final)
                )
            elif isinstance(action, WriteMetadata):
                self._write_metadata(action)
            elif isinstance(action, NotifyCheckpointComplete):
                self._broadcast("complete", checkpoint=action.checkpoint_id)
                started, final = self.triggered_at.pop(action.checkpoint_id, (now, False))
                info = CheckpointInfo(
                    action.checkpoint_id,
                    self.generation,
                    now - started,
                    final,
                    self.alignment.pop(action.checkpoint_id, 0.0),
                    self.sizes.pop(action.checkpoint_id, 0),
                    action.checkpoint_id in self.unaligned,
                    self.channel_records.pop(action.checkpoint_id, 0),
                    started - driver._start,
                )
                self.unaligned.discard(action.checkpoint_id)
                driver.result.checkpoints.append(info)
                driver.listener(
                    "checkpoint",
                    f"checkpoint {action.checkpoint_id} complete in {info.duration:.2f} s"
                    + (" (final)" if final else ""),
                )
            elif isinstance(action, AbortCheckpoint):
                self._broadcast("abort", checkpoint=action.checkpoint_id)
                self.alignment.pop(action.checkpoint_id, None)
                self.channel_records.pop(action.checkpoint_id, None)
                self.triggered_at.pop(action.checkpoint_id, None)
                self.unaligned.discard(action.checkpoint_id)
                with contextlib.suppress(StorageError):
                    storage.discard(action.checkpoint_id)
                if not action.subsumed:
                    driver.result.aborted.append((action.checkpoint_id, action.reason))
                    driver.listener(
                        "abort", f"checkpoint {action.checkpoint_id} aborted: {action.reason}"
                    )
                if action.checkpoint_id == self.final and self.failure is None:
                    self.final = None  # trigger another final checkpoint
                    self._do(self.coordinator.trigger(now, final=True))
            elif isinstance(action, DiscardState):
                with contextlib.suppress(StorageError, ValueError, KeyError):
                    storage.discard_state(
                        action.checkpoint_id, StateHandle.from_dict(action.handle)
                    )
            elif isinstance(action, DiscardCheckpoint):
                with contextlib.suppress(StorageError):
                    storage.discard(action.checkpoint_id)
            elif isinstance(action, FailJob):
                self.failure = Failure("checkpoint", action.reason)

    def _write_metadata(self, action: WriteMetadata[str, dict[str, Any]]) -> None:
        storage, now = self.driver.storage, self.now()
        try:
            metadata = CheckpointMetadata(
                checkpoint_id=action.checkpoint_id,
                generation=self.generation,
                handles={s: StateHandle.from_dict(h) for s, h in action.handles},
                extra={
                    "parallelism": self.driver.plan.parallelism,
                    "max_parallelism": self.driver.plan.max_parallelism,
                    "operators": [
                        op.uid for chain in self.driver.plan.chains for op in chain.operators
                    ],
                    "time": time.time(),
                },
            )
            storage.write_metadata(metadata)
            self.sizes[action.checkpoint_id] = sum(h.size for h in metadata.handles.values())
        except (StorageError, ValueError, KeyError) as exc:
            with contextlib.suppress(StorageError):
                storage.discard(action.checkpoint_id)
            self._do(self.coordinator.metadata_failed(action.checkpoint_id, str(exc), now))
            return
        self._do(self.coordinator.metadata_written(action.checkpoint_id, now))

    def _broadcast(self, kind: str, **body: Any) -> None:
        for slot in sorted(self.slots):
            with contextlib.suppress(ControlError):
                self.server.send(slot, kind, **body)
