"""The run of a job: what :meth:`StreamEnvironment.execute <cutline.StreamEnvironment.execute>`
(and :func:`cutline.testing.execute`, with its test seams) does. It checks the outputs and the
checkpoint directory (:mod:`cutline.api.preflight`), picks the launcher and the checkpoint to
restore, and hands the plan to the driver with the listener and the progress display."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

import fsspec

from cutline.api.preflight import check_outputs, has_checkpoint, refuse_start_over
from cutline.api.progress import LiveProgress, ProgressLines, wanted
from cutline.api.setting_groups import location
from cutline.runtime.driver.config import LATEST, JobConfig
from cutline.runtime.driver.driver import JobDriver
from cutline.runtime.driver.events import (
    EventListener,
    JobEvent,
    JobWarning,
    Listener,
    event_listener,
)
from cutline.runtime.driver.result import JobInterrupted, JobResult
from cutline.runtime.durations import Duration, seconds
from cutline.runtime.io.sinks import collect_directory
from cutline.runtime.network.net import port_range
from cutline.runtime.sink_operator import SinkLogic
from cutline.runtime.task.launch import Launcher, PhaseHook, SourceHold

if TYPE_CHECKING:
    from cutline.api.environment import StreamEnvironment

ReadyCallback = Callable[[int, dict[str, int]], None]
"""``on_ready(generation, {slot name: process id})``."""


@dataclass(frozen=True)
class Seams:
    """The test seams of a run (see :func:`cutline.testing.execute`): none by default."""

    hold_sources: SourceHold | None = None
    phase_hook: PhaseHook | None = None
    launcher: Launcher | None = None
    on_ready: ReadyCallback | None = None

    def __post_init__(self) -> None:
        if self.hold_sources is not None and not isinstance(self.hold_sources, SourceHold):
            raise TypeError(f"hold_sources takes a SourceHold, not {self.hold_sources!r}")


class SeamKeywords(TypedDict, total=False):
    """The test seams ``execute()`` took before :func:`cutline.testing.execute`: each still
    works there, with a ``DeprecationWarning``."""

    hold_sources: SourceHold | None
    phase_hook: PhaseHook | None
    launcher: Launcher | None
    on_ready: ReadyCallback | None


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


def run_job(
    env: StreamEnvironment,
    spark: Any,
    *,
    listener: Listener | None,
    stop_after: Duration | None,
    restore_from: str | os.PathLike[str] | None,
    allow_non_restored_state: bool,
    fresh: bool,
    progress: bool | None,
    seams: Seams,
) -> JobResult:
    """Run ``env``'s job (the keywords are ``execute()``'s) and wait for it to end. Called
    straight from ``execute()`` and ``cutline.testing.execute()``: its warnings name their
    caller's caller."""
    settings = env.settings
    execution_plan = env.plan()
    port_range()  # a malformed CUTLINE_PORTS: said now, not when the first socket opens
    if seams.hold_sources is not None and settings.checkpoints.interval is None:
        raise ValueError(
            "hold_sources waits for a periodic checkpoint: give the job a checkpoint_interval"
        )
    told = event_listener(listener)
    restore = _restore_url(restore_from)
    if fresh and restore is not None:
        raise ValueError(
            "fresh=True starts from the beginning: it does not go with restore_from "
            f"(given {restore_from!r})"
        )
    if restore is None and not fresh and settings.checkpoint_dir is not None:
        refuse_start_over(env)  # (the driver checks again, under the lock)
    if restore == LATEST and not has_checkpoint(env):
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
    check_outputs(env, restoring=restore is not None, why=why)
    if not any(isinstance(op.logic, SinkLogic) for op in env.graph.operators.values()):
        warnings.warn("the job has no sink: its results go nowhere", stacklevel=3)
    from cutline.spark.launcher import SparkLauncher, check_picklable, is_local

    launcher = seams.launcher
    if launcher is None:
        launcher = SparkLauncher.for_session(spark, settings.parallelism)
        if settings.checkpoint_dir is None and not is_local(launcher.spark):
            raise ValueError(
                "on a Spark cluster the job needs a checkpoint_dir that every host can "
                "read and write (a shared path, or a URL: hdfs://..., s3://...); the "
                "default temporary directory is on the driver's machine only"
            )
    if isinstance(launcher, SparkLauncher):  # what Spark cannot ship, said now
        check_picklable(execution_plan, phase_hook=seams.phase_hook)
    temporary = None
    checkpoint_dir = settings.checkpoint_dir
    if checkpoint_dir is None:
        temporary = tempfile.mkdtemp(prefix="cutline-checkpoints-")
        checkpoint_dir = temporary
    try:
        collect_dirs = {}
        for name in env._collect:
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
            on_error=dict(env._on_error),
            rate_limits=dict(env._rate_limits),
            hold=seams.hold_sources,
            phase_hook=seams.phase_hook,
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
        driver.on_ready = seams.on_ready
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
