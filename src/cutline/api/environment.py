"""The user's API: :class:`StreamEnvironment` builds a job and runs it.

::

    env = StreamEnvironment(parallelism=2, checkpoint_interval="1s", checkpoint_dir="ck/")
    (env.read_parquet("events/")
        .key_by("key")
        .sum("value")
        .write_parquet("out/"))
    result = env.execute()            # on local Spark, local[parallelism]

Building a pipeline only describes it (a job graph); :meth:`StreamEnvironment.execute`
runs it on Spark and returns when bounded input is all processed and its output published.

The environment is made of three parts, one module each: its settings, checked once when it
is made (:mod:`cutline.api.settings`); the graph its sources and streams build
(:mod:`cutline.api.sources`, :mod:`cutline.api.streams`: :class:`DataStream`,
:class:`KeyedStream`, and how operators get their ids); and, here, the run: ``execute()``
checks the outputs, picks the launcher and the checkpoint to restore, and hands the plan to
the driver with the listener and the progress display.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable
from typing import Any

import fsspec

from cutline.api.connector_sources import ConnectorSources
from cutline.api.keyed import KeyedStream
from cutline.api.progress import LiveProgress, ProgressLines, wanted
from cutline.api.settings import Settings, location
from cutline.api.streams import DataStream
from cutline.runtime.checkpoint.lineage import (
    ResumableCheckpointError,
    refuse_fresh_start,
    resumable,
)
from cutline.runtime.checkpoint.lock import CheckpointDirectoryLock, Owner
from cutline.runtime.checkpoint.storage import CheckpointStorage
from cutline.runtime.driver.config import LATEST, JobConfig
from cutline.runtime.driver.driver import JobDriver
from cutline.runtime.driver.events import (
    EventListener,
    JobEvent,
    JobWarning,
    Listener,
    event_listener,
)
from cutline.runtime.driver.restart import RestartStrategy
from cutline.runtime.driver.result import JobInterrupted, JobResult
from cutline.runtime.durations import seconds
from cutline.runtime.graph import ExecutionPlan, plan
from cutline.runtime.io.sinks import collect_directory
from cutline.runtime.network.net import port_range
from cutline.runtime.operators import SinkLogic
from cutline.runtime.state.keygroups import DEFAULT_MAX_PARALLELISM
from cutline.runtime.task.launch import Launcher, PhaseHook, SourceHold

__all__ = ["DataStream", "KeyedStream", "StreamEnvironment"]


def _both(first: EventListener, second: EventListener) -> EventListener:
    """A listener that tells ``first``, then ``second``."""

    def both(event: JobEvent) -> None:
        first(event)
        second(event)

    return both


def _interactive() -> bool:
    """Whether Python runs interactively (a REPL, IPython, a notebook)."""
    return hasattr(sys, "ps1") or bool(sys.flags.interactive) or "IPython" in sys.modules


def _restore_url(restore_from: str | os.PathLike[str] | None) -> str | None:
    if restore_from is None:
        return None
    if isinstance(restore_from, str) and restore_from == LATEST:
        return LATEST  # (a folder named so: Path("latest") or "./latest")
    return location(restore_from)


class StreamEnvironment(ConnectorSources):
    """A streaming job being built, and how it runs.

    :param parallelism: subtasks per operator, one Spark task slot each.
    :param checkpoint_interval: time between checkpoints (``"1s"``, ``0.5``); ``None``: only the
        final checkpoint at the end of bounded input.
    :param checkpoint_dir: where checkpoints go (a local path or any fsspec URL); by default a
        temporary directory removed after the job.
    :param checkpoint_timeout: a checkpoint not complete after this long is aborted.
    :param min_pause: the least time between the end of one checkpoint and the next trigger.
    :param tolerable_failed_checkpoints: failed checkpoints in a row before the job restarts.
    :param retained_checkpoints: complete checkpoints kept.
    :param restart_strategy: whether and when the job restarts after a failure, from its
        latest checkpoint: ``ExponentialDelay()`` (the default: 1 s, then 1.5 times longer each
        time up to 1 min, with 10 % jitter, reset after an hour without failures; it gives up
        after 20 restarts in a row), ``FixedDelay(attempts, delay)``,
        ``FailureRate(failures, interval, delay)`` or ``NoRestart()``. Whatever it is, a job
        that fails at the same record in the same operator with the same error in two
        attempts in a row fails at once (a restart cannot help).
    :param restart_attempts: deprecated: ``restart_strategy=FixedDelay(attempts, delay)``.
    :param restart_delay: deprecated: ``restart_strategy=FixedDelay(attempts, delay)``.
    :param dead_letter_dir: where records that an operator opened with
        ``on_error="dead_letter"`` could not process go, with their error (JSON lines).
    :param batch_size: records per batch read from a source.
    :param buffer_capacity: batches buffered per input channel before backpressure.
    :param heartbeat_timeout: a slot silent this long is declared lost (a host cut off from
        the network; a killed one is noticed at once).
    :param start_timeout: each slot of a (re)start must be running and have reached the
        driver this long after the launch, and the slots' rendezvous must end this long after
        the last one arrived; otherwise the attempt fails naming the slot, and the job restarts.
    :param restore_timeout: each slot must have restored its state, opened its operators and
        connected its outputs this long after it began (a large state takes longer).
    :param commit_timeout: after the final checkpoint completed, every slot must have published
        its output and ended this long after.
    :param slot_timeout: how long each (re)start waits for its task slots (one per subtask
        index, all at once: executors register after the session starts, and come back
        after a lost host) before it fails.
    :param on_host_loss: after a failure, ``"restart"`` at once on the task slots there are
        (on a cluster: the hosts that remain, when they have enough), or ``"wait"`` up to
        ``slot_timeout`` for every host the failed attempt ran on to have an executor again,
        then start on what there is.
    :param checkpointing: how barriers are handled (README, "Checkpointing modes"):
        ``"aligned"`` (exactly-once; a subtask waits for a checkpoint's barrier on every
        input before it snapshots), ``"unaligned"`` (exactly-once; it snapshots on the first
        barrier, which overtakes the queued records; those are stored with the checkpoint)
        or ``"at_least_once"`` (inputs never wait; replay after a failure may repeat records).
    :param alignment_timeout: with ``"aligned"``: a subtask whose alignment of a checkpoint
        lasts longer switches that checkpoint to unaligned (``None``: never).
    :param max_concurrent_checkpoints: checkpoints in flight at once (``"unaligned"``, or with an
        ``alignment_timeout``: 1).
    :param state_backend: where keyed state lives: ``"memory"`` (Python dicts, fastest) or
        ``"disk"`` (an embedded RocksDB on each worker's disk, for state larger than memory).
    :param incremental_checkpoints: a checkpoint writes only the keyed state that changed since
        the last complete one (plus a full one every ``full_checkpoint_every``).
    :param full_checkpoint_every: with incremental checkpoints: at most this many checkpoints
        in a chain (one full, the rest incremental) before the next full one.
    :param state_dir: ``"disk"``: where each worker keeps its working databases (default: the
        system's temporary directory).
    :param state_memory: ``"disk"``: bytes of memory per keyed operator subtask for RocksDB's
        buffers and cache, and for changes not yet written to it.
    :param savepoint_dir: where savepoints go when the request names no directory (default:
        ``CHECKPOINT_DIR/savepoints``).
    """

    def __init__(
        self,
        parallelism: int = 2,
        *,
        checkpoint_interval: float | str | None = "1s",
        checkpoint_dir: str | os.PathLike[str] | None = None,
        checkpoint_timeout: float | str = "10min",
        min_pause: float | str = 0,
        tolerable_failed_checkpoints: int = 0,
        retained_checkpoints: int = 1,
        restart_strategy: RestartStrategy | None = None,
        restart_attempts: int | None = None,
        restart_delay: float | str | None = None,
        dead_letter_dir: str | os.PathLike[str] | None = None,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
        batch_size: int = 65536,
        buffer_capacity: int = 4,
        heartbeat_timeout: float | str = "30s",
        start_timeout: float | str = "1min",
        restore_timeout: float | str = "10min",
        commit_timeout: float | str = "2min",
        slot_timeout: float | str = "2min",
        on_host_loss: str = "restart",
        storage_options: dict[str, Any] | None = None,
        checkpointing: str = "aligned",
        alignment_timeout: float | str | None = None,
        max_concurrent_checkpoints: int = 1,
        state_backend: str = "memory",
        incremental_checkpoints: bool = True,
        full_checkpoint_every: int = 10,
        state_dir: str | os.PathLike[str] | None = None,
        state_memory: int = 64 * 1024 * 1024,
        savepoint_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        arguments = dict(locals())  # every argument, as given: checked in one place
        del arguments["self"], arguments["__class__"]
        super().__init__(Settings.check(arguments))

    # ----------------------------------------------------------------- running

    def plan(self) -> ExecutionPlan:
        return plan(self.graph, self.settings.parallelism, self.settings.max_parallelism)

    def execute(
        self,
        spark: Any = None,
        *,
        listener: Listener | None = None,
        launcher: Launcher | None = None,
        on_ready: Callable[[int, dict[str, int]], None] | None = None,
        stop_after: float | str | None = None,
        restore_from: str | os.PathLike[str] | None = None,
        allow_non_restored_state: bool = False,
        fresh: bool = False,
        progress: bool | None = None,
        hold_sources: SourceHold | None = None,
        phase_hook: PhaseHook | None = None,
    ) -> JobResult:
        """Run the job on Spark and wait for it to end.

        :param spark: a ``SparkSession`` to run on; by default a local one with
            ``local[parallelism]`` (created once, reused).
        :param listener: told of checkpoints, aborts, restarts and warnings: a callable taking
            ``(kind, message)``, e.g. ``lambda kind, msg: print(kind, msg)``, or a
            :class:`~cutline.JobListener`, whose ``on_event`` gets each event typed (see
            :mod:`cutline.runtime.driver.events`).
        :param stop_after: stop the job this long after it started (``"30s"``), gracefully: the
            sources stop reading, a final checkpoint completes, and everything read until then
            is processed and published exactly once. For unbounded sources; without it such
            a job runs until interrupted.
        :param restore_from: start from this checkpoint or savepoint (its folder; or a
            checkpoint directory: its newest complete checkpoint; or ``"latest"``: this job's
            own ``checkpoint_dir``'s, how a job whose driver died resumes, and from the
            beginning while there is none), at this job's parallelism
            (state is redistributed when it differs). State is matched to operators by their
            ids: the ``name=`` of a named operator, else one derived from its kind, function
            and inputs (:mod:`cutline.api.streams`): name the stateful operators, and keep
            the names.
        :param allow_non_restored_state: start even when the checkpoint holds state of an
            operator this job does not have (that state is dropped); otherwise that is an
            error naming the operator.
        :param fresh: start from the beginning although ``checkpoint_dir`` holds a checkpoint
            of an earlier run to resume. Without ``restore_from`` and without ``fresh``, such
            a start is refused (:class:`~cutline.ResumableCheckpointError`, saying both ways
            on). The earlier run's checkpoints are kept, never deleted; from then on
            ``restore_from="latest"`` means this run's newest
            (:mod:`cutline.runtime.checkpoint.lineage`).
        :param progress: show the progress on standard error: ``None`` (default) a live display
            when standard error is a terminal (records in and out per operator, throughput,
            backpressure, the last checkpoints and restarts), and otherwise a line per
            checkpoint, abort, restart and warning; ``True`` the live display always; ``False``
            nothing. The same figures are in ``result.metrics`` afterwards.
        :param hold_sources: hold every source subtask part-way in the first attempt until a
            checkpoint taken since is complete and the listener was told of it
            (:class:`~cutline.SourceHold`): a listener that fails the job on that checkpoint
            (kills a worker, for a test or a demo) then always fails a running job with input
            left, however fast the machine. Needs a ``checkpoint_interval``.
        :param phase_hook: ``hook(phase, slot, generation)``, called in each slot's process as
            it enters each phase of an attempt (``start``, ``rendezvous``, ``restore``,
            ``running``, ``final_checkpoint``, ``commit``): for tests that freeze or stall a
            worker in a given phase. Must be picklable.
        :raises RestoreError: the checkpoint does not fit the job (the message says why).
        :raises ResumableCheckpointError: no ``restore_from`` nor ``fresh``, and
            ``checkpoint_dir`` holds a checkpoint to resume.
        :returns: a :class:`~cutline.runtime.driver.result.JobResult`; ``result.output`` is the
            records of the collect sink.
        :raises JobFailedError: the job failed and the restart strategy gave up.

        On Ctrl-C the job's attempt is cancelled and the program ends with exit status 130,
        saying ``interrupted; last complete checkpoint N; resume with restore_from='latest'``
        (no traceback); in an interactive session it raises
        :class:`~cutline.runtime.driver.result.JobInterrupted` (a ``KeyboardInterrupt``) instead.
        """
        settings = self.settings
        execution_plan = self.plan()
        port_range()  # a malformed CUTLINE_PORTS: said now, not when the first socket opens
        if hold_sources is not None:
            if not isinstance(hold_sources, SourceHold):
                raise TypeError(f"hold_sources takes a SourceHold, not {hold_sources!r}")
            if settings.checkpoints.interval is None:
                raise ValueError(
                    "hold_sources waits for a periodic checkpoint: give the job a "
                    "checkpoint_interval"
                )
        told = event_listener(listener)
        restore = _restore_url(restore_from)
        if fresh and restore is not None:
            raise ValueError(
                "fresh=True starts from the beginning: it does not go with restore_from "
                f"(given {restore_from!r})"
            )
        if restore is None and not fresh and settings.checkpoint_dir is not None:
            self._refuse_fresh_start()  # (the driver checks again, under the lock)
        if restore == LATEST and not self._has_checkpoint():
            # nothing completed, so nothing was published: a fresh start is the resumption
            # (and an output directory that holds files then says this is not the same job)
            told(
                JobWarning(
                    f"no complete checkpoint in {settings.checkpoint_dir} yet: "
                    "starting from the beginning"
                )
            )
            restore = None
            why = "no complete checkpoint to resume from"
        else:
            why = None
        self._check_outputs(restoring=restore is not None, why=why)
        if not any(isinstance(op.logic, SinkLogic) for op in self.graph.operators.values()):
            warnings.warn("the job has no sink: its results go nowhere", stacklevel=2)
        from cutline.spark.launcher import SparkLauncher, check_picklable, is_local

        if launcher is None:
            launcher = SparkLauncher.for_session(spark, settings.parallelism)
            if settings.checkpoint_dir is None and not is_local(launcher.spark):
                raise ValueError(
                    "on a Spark cluster the job needs a checkpoint_dir that every host can "
                    "read and write (a shared path, or a URL: hdfs://..., s3://...); the "
                    "default temporary directory is on the driver's machine only"
                )
        if isinstance(launcher, SparkLauncher):  # what Spark cannot ship, said now
            check_picklable(execution_plan, phase_hook=phase_hook)
        temporary = None
        checkpoint_dir = settings.checkpoint_dir
        if checkpoint_dir is None:
            temporary = tempfile.mkdtemp(prefix="cutline-checkpoints-")
            checkpoint_dir = temporary
        try:
            collect_dirs = {}
            for name in self._collect:
                directory = collect_directory(checkpoint_dir, name)
                fs, root = fsspec.core.url_to_fs(directory, **dict(settings.storage_options or {}))
                if fs.exists(root):
                    fs.rm(root, recursive=True)
                collect_dirs[name] = directory
            config = JobConfig(
                parallelism=settings.parallelism,
                checkpoint_dir=checkpoint_dir,
                checkpoints=settings.checkpoints,
                barriers=settings.barriers,
                state=settings.state,
                restart=settings.restart,
                on_host_loss=settings.on_host_loss,
                deadlines=settings.deadlines,
                storage_options=settings.storage_options,
                batch_size=settings.batch_size,
                buffer_capacity=settings.buffer_capacity,
                dead_letter_dir=settings.dead_letter_dir,
                on_error=dict(self._on_error),
                rate_limits=dict(self._rate_limits),
                hold=hold_sources,
                phase_hook=phase_hook,
                collect=collect_dirs,
                stop_after=seconds(stop_after, "stop_after"),
                restore_from=restore,
                allow_non_restored_state=allow_non_restored_state,
                fresh=fresh,
                savepoint_dir=settings.savepoint_dir,
            )
            if progress is None and not wanted(None):  # no terminal: a line per event
                told = _both(event_listener(ProgressLines()), told)
            driver = JobDriver(execution_plan, config, launcher, told)
            driver.on_ready = on_ready
            try:
                if not wanted(progress):
                    return driver.run()
                with LiveProgress() as live:
                    driver.on_progress = live.update
                    result = driver.run()
                    if result.metrics is not None:
                        live.update(result.metrics)  # the final figures stay on the screen
                    return result
            except JobInterrupted as exc:
                interrupted = exc
                if temporary is not None:  # removed below: nothing to resume from
                    interrupted = JobInterrupted(
                        "interrupted; nothing to resume (the job had no checkpoint_dir: give it "
                        "one to resume an interrupted job)",
                        exc.checkpoint,
                    )
                if _interactive():
                    raise interrupted from None  # a notebook or a REPL goes on
                print(f"cutline: {interrupted}", file=sys.stderr)
                raise SystemExit(130) from None  # as a shell does on SIGINT: no traceback
        finally:
            if temporary is not None:
                shutil.rmtree(temporary, ignore_errors=True)

    def _has_checkpoint(self) -> bool:
        """Whether ``checkpoint_dir`` holds something to resume: a complete checkpoint of its
        current lineage (intact or not: a damaged one is the driver's to report), or what that
        lineage's first run restored."""
        if self.settings.checkpoint_dir is None:
            raise ValueError('restore_from="latest" needs the job\'s checkpoint_dir')
        return resumable(self._storage()) is not None

    def _refuse_fresh_start(self) -> None:
        """A start from the beginning over a checkpoint to resume is refused, before the outputs
        are looked at (the error says both ways on); but a directory in use by a running job
        is that job's, and that is the error to say."""
        try:
            refuse_fresh_start(self._storage())
        except ResumableCheckpointError:
            settings = self.settings
            assert settings.checkpoint_dir is not None
            probe = CheckpointDirectoryLock(
                settings.checkpoint_dir,
                Owner.this_process("probe"),
                storage_options=dict(settings.storage_options or {}),
            )
            with probe:  # (DirectoryLockedError while another job runs there)
                pass
            raise

    def _storage(self) -> CheckpointStorage:
        assert self.settings.checkpoint_dir is not None
        return CheckpointStorage(
            self.settings.checkpoint_dir, storage_options=self.settings.storage_options
        )

    def _check_outputs(self, restoring: bool, why: str | None = None) -> None:
        """At ``execute()``: every output directory apart from the others, and empty unless the
        job restores (a job resumed after its driver died goes on writing where it was)."""
        places = [(self._location(d), f"output directory {d}") for d in self._outputs.values()]
        if self.settings.dead_letter_dir is not None:
            places.append((self._location(self.settings.dead_letter_dir), "dead_letter_dir"))
        for i, (a, what_a) in enumerate(places):
            for b, what_b in places[i + 1 :]:
                if a[0] == b[0] and (
                    a[1] == b[1] or b[1].startswith(a[1] + "/") or a[1].startswith(b[1] + "/")
                ):
                    raise ValueError(
                        f"{what_a} and {what_b} overlap: give each sink its own directory"
                    )
        if restoring:
            return
        for uid, directory in self._outputs.items():
            self._check_empty(directory, self.graph.operators[uid].name, why)

    def _check_output(self, directory: str, what: str) -> None:
        location = self._location(directory)
        if any(self._location(d) == location for d in self._outputs.values()):
            raise ValueError(f"{what}: two sinks write to {directory}; give each its own directory")

    def _check_empty(self, directory: str, what: str, why: str | None = None) -> None:
        fs, root = fsspec.core.url_to_fs(directory, **dict(self.settings.storage_options or {}))
        if fs.exists(root):
            published = [
                p
                for p in fs.ls(root, detail=False)
                if not str(p).rstrip("/").rsplit("/", 1)[-1].startswith(("_", "."))
            ]
            if published:
                advice = (
                    f", and {self.settings.checkpoint_dir} has {why}: the files are not this job's "
                    "(another checkpoint_dir?); write to a new directory, or remove them"
                    if why is not None  # restore_from="latest" found nothing to resume
                    else "; write to a new directory, or remove them first (the exactly-once "
                    "sink never overwrites output), or resume the job that wrote them "
                    "(restore_from=...)"
                )
                raise ValueError(
                    f"{what}: output directory {directory} already holds {len(published)} "
                    f"file(s){advice}"
                )
