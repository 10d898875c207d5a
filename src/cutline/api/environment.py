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

The environment is made of three parts: its settings, checked once when it is made
(:mod:`cutline.api.setting_groups`, the groups the user writes, and
:mod:`cutline.api.settings`, the runtime's objects made of them); the graph its sources and
streams build (:mod:`cutline.api.sources`, :mod:`cutline.api.streams`: :class:`DataStream`,
:class:`KeyedStream`, and how operators get their ids); and the run
(:mod:`cutline.api.execution`).
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Unpack

from cutline.api.connector_sources import ConnectorSources
from cutline.api.execution import SeamKeywords, Seams, run_job
from cutline.api.keyed import KeyedStream
from cutline.api.setting_groups import Checkpoints, HostLossPolicy, Place, State, Timeouts
from cutline.api.settings import DEFAULT_INTERVAL, DeprecatedSettings, Settings
from cutline.api.streams import DataStream
from cutline.runtime.driver.events import Listener
from cutline.runtime.driver.restart import RestartStrategy
from cutline.runtime.driver.result import JobResult
from cutline.runtime.durations import Duration
from cutline.runtime.graph import ExecutionPlan, plan
from cutline.runtime.state.keygroups import DEFAULT_MAX_PARALLELISM

__all__ = ["DataStream", "KeyedStream", "StreamEnvironment"]


class StreamEnvironment(ConnectorSources):
    """A streaming job being built, and how it runs.

    The settings come in groups, each a value whose docstring is its reference:
    :class:`~cutline.Checkpoints` (interval, directory, timeout, retention, the checkpointing
    mode, savepoints), :class:`~cutline.State` (the state backend, incremental checkpoints),
    :class:`~cutline.Timeouts` (how long each phase of an attempt may take), and the restart
    strategy. The common ones are also flat::

        StreamEnvironment(2, checkpoint_interval="1s", checkpoint_dir="ck/")
        StreamEnvironment(2, checkpoints=Checkpoints(interval="1s", dir="ck/", retained=3))

    A flat keyword fills in its group's field (``checkpoint_dir="ck/"`` with
    ``checkpoints=Checkpoints(retained=3)`` is ``Checkpoints(dir="ck/", retained=3)``); the
    two saying different things is a ``ValueError`` (a flat keyword left at its default says
    nothing). Durations are seconds, text with a unit (``"500ms"``, ``"2min"``) or a
    ``timedelta``. Every setting is checked here, when the environment is made: one that
    cannot work is a ``ValueError`` naming it and its value.

    :param parallelism: subtasks per operator, one Spark task slot each. Default 2.
    :param checkpoints: when checkpoints are taken, where they go, how barriers are handled
        (:class:`~cutline.Checkpoints`; default ``Checkpoints()``).
    :param state: where keyed state lives (:class:`~cutline.State`; default ``State()``:
        in memory).
    :param timeouts: how long each phase of an attempt may take (:class:`~cutline.Timeouts`).
    :param restart_strategy: whether and when the job restarts after a failure, from its
        latest checkpoint: ``ExponentialDelay()`` (the default: 1 s, then 1.5 times longer each
        time up to 1 min, with 10 % jitter, reset after an hour without failures; it gives up
        after 20 restarts in a row), ``FixedDelay(attempts, delay)``,
        ``FailureRate(failures, interval, delay)`` or ``NoRestart()``. Whatever it is, a job
        that fails at the same record in the same operator with the same error in two
        attempts in a row fails at once (a restart cannot help).
    :param checkpoint_interval: ``Checkpoints.interval``: time between checkpoints; ``None``:
        only the final checkpoint at the end of bounded input. Default ``"1s"``.
    :param checkpoint_dir: ``Checkpoints.dir``: where checkpoints go (a local path or any
        fsspec URL); default: a temporary directory removed after the job.
    :param max_parallelism: key groups: the most subtasks keyed state can ever be spread
        over, fixed for the life of a job (its checkpoints). Default 128.
    :param dead_letter_dir: where records that an operator opened with
        ``on_error="dead_letter"`` could not process go, with their error (JSON lines).
    :param storage_options: fsspec options (credentials, endpoints) for every URL of the job:
        checkpoints, inputs, outputs.
    :param batch_size: the most records a source reads at once (fewer while reading and
        processing them takes over 0.1 s). Default 65536.
    :param buffer_capacity: batches buffered per channel on each side (the receiver's credit,
        the sender's queue) before backpressure. Default 4.
    :param on_host_loss: after a failure, ``"restart"`` (the default) at once on the task
        slots there are (on a cluster: the hosts that remain, when they have enough), or
        ``"wait"`` up to ``Timeouts.slots`` for every host the failed attempt ran on to have
        an executor again, then start on what there is.
    :param deprecated: the flat keywords of before the groups (``state_backend="disk"``:
        ``state=State(backend="disk")``; ``retained_checkpoints=3``:
        ``checkpoints=Checkpoints(retained=3)``; ``restart_attempts``, ``restart_delay``:
        ``restart_strategy=FixedDelay(attempts, delay)``; the full list:
        ``cutline.api.settings.DEPRECATED``) still work, with a ``DeprecationWarning``
        saying what to write instead.
    """

    def __init__(
        self,
        parallelism: int = 2,
        *,
        checkpoints: Checkpoints | None = None,
        state: State | None = None,
        timeouts: Timeouts | None = None,
        restart_strategy: RestartStrategy | None = None,
        checkpoint_interval: Duration | None = DEFAULT_INTERVAL,
        checkpoint_dir: Place | None = None,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
        dead_letter_dir: Place | None = None,
        storage_options: dict[str, Any] | None = None,
        batch_size: int = 65536,
        buffer_capacity: int = 4,
        on_host_loss: HostLossPolicy = "restart",
        **deprecated: Unpack[DeprecatedSettings],
    ) -> None:
        arguments = dict(locals())  # every keyword, as given: checked in one place
        del arguments["self"], arguments["__class__"], arguments["deprecated"]
        super().__init__(Settings.check(arguments, deprecated))

    def plan(self) -> ExecutionPlan:
        return plan(self.graph, self.settings.parallelism, self.settings.max_parallelism)

    def execute(
        self,
        spark: Any = None,
        *,
        listener: Listener | None = None,
        stop_after: Duration | None = None,
        restore_from: str | os.PathLike[str] | None = None,
        allow_non_restored_state: bool = False,
        fresh: bool = False,
        progress: bool | None = None,
        **seams: Unpack[SeamKeywords],
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
        :param seams: ``hold_sources=``, ``phase_hook=``, ``launcher=``, ``on_ready=``: the
            test seams, deprecated here: :func:`cutline.testing.execute` takes them.
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
        if seams:
            _refuse_unknown_seams(seams)
            given = ", ".join(f"{name}=..." for name in seams)
            warnings.warn(
                f"execute({given}) is deprecated: these are test seams, taken by "
                f"cutline.testing.execute(env, {given}, ...) (same keywords as execute())",
                DeprecationWarning,
                stacklevel=2,
            )
        return run_job(
            self,
            spark,
            listener=listener,
            stop_after=stop_after,
            restore_from=restore_from,
            allow_non_restored_state=allow_non_restored_state,
            fresh=fresh,
            progress=progress,
            seams=Seams(**seams),
        )


def _refuse_unknown_seams(seams: SeamKeywords) -> None:
    for name in seams:
        if name not in SeamKeywords.__annotations__:
            raise TypeError(f"execute() got an unexpected keyword argument {name!r}")
