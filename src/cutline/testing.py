"""Running a job for a test or a demo, with the seams a test needs and a job never does (as
``bytewax.testing`` and ``trio.testing``)::

    from cutline import StreamEnvironment, testing
    from cutline.testing import SourceHold, ThreadLauncher

    env = StreamEnvironment(2, checkpoint_interval="100ms", checkpoint_dir="ck/")
    env.from_sequence(0, 1000).key_by("value").count().collect()
    result = testing.execute(env, launcher=ThreadLauncher(), hold_sources=SourceHold(250))

:func:`execute` takes every keyword of :meth:`StreamEnvironment.execute
<cutline.StreamEnvironment.execute>` and the four seams:

* ``hold_sources=``\\ :class:`~cutline.SourceHold`: the sources stop part-way in the first
  attempt until a checkpoint taken since is complete and the listener was told of it, so
  that a listener that kills a worker on that checkpoint always kills a running job with
  input left, on a machine of any speed;
* ``launcher=``: where the slots run instead of Spark: ``ThreadLauncher()`` runs each as a
  thread of this process (fast, no Spark session; a launcher is a ``Launcher``);
* ``phase_hook=``: ``hook(phase, slot, generation)`` called in each slot's process as it
  enters each of ``SLOT_PHASES``, to freeze or stall a worker in a phase;
* ``on_ready=``: ``on_ready(generation, {slot: process id})`` called once every slot of an
  attempt is ready, to know which processes to kill.
"""

from __future__ import annotations

import os
from typing import Any

from cutline.api.environment import StreamEnvironment
from cutline.api.execution import ReadyCallback, Seams, run_job
from cutline.runtime.driver.events import Listener
from cutline.runtime.driver.result import JobResult
from cutline.runtime.durations import Duration
from cutline.runtime.task.launch import SLOT_PHASES, Launcher, PhaseHook, SourceHold
from cutline.runtime.task.local import ThreadLauncher

__all__ = [
    "SLOT_PHASES",
    "Launcher",
    "PhaseHook",
    "SourceHold",
    "ThreadLauncher",
    "execute",
]


def execute(
    env: StreamEnvironment,
    spark: Any = None,
    *,
    hold_sources: SourceHold | None = None,
    launcher: Launcher | None = None,
    phase_hook: PhaseHook | None = None,
    on_ready: ReadyCallback | None = None,
    listener: Listener | None = None,
    stop_after: Duration | None = None,
    restore_from: str | os.PathLike[str] | None = None,
    allow_non_restored_state: bool = False,
    fresh: bool = False,
    progress: bool | None = None,
) -> JobResult:
    """Run ``env``'s job as ``env.execute(...)`` does, with the test seams; return its
    :class:`~cutline.JobResult`.

    :param env: the job.
    :param hold_sources: hold every source subtask part-way in the first attempt until a
        checkpoint taken since is complete and the listener was told of it
        (:class:`~cutline.SourceHold`): a listener that fails the job on that checkpoint (kills a
        worker) then always fails a running job with input left, however fast the machine.
        Needs a periodic checkpoint (``checkpoint_interval``).
    :param launcher: starts the job's slots instead of Spark: ``ThreadLauncher()`` runs
        each as a thread of this process. Default: Spark (``spark``, or a local session).
    :param phase_hook: ``hook(phase, slot, generation)``, called in each slot's process as
        it enters each phase of an attempt (``SLOT_PHASES``: ``start``, ``rendezvous``,
        ``restore``, ``running``, ``final_checkpoint``, ``commit``): for tests that freeze or
        stall a worker in a given phase. On Spark it must be picklable.
    :param on_ready: ``on_ready(generation, {slot: process id})``, called in this process
        once every slot of an attempt is ready.
    :param spark: as in :meth:`~cutline.StreamEnvironment.execute`, as are ``listener``,
        ``stop_after``, ``restore_from``, ``allow_non_restored_state``, ``fresh`` and
        ``progress``.
    """
    return run_job(
        env,
        spark,
        listener=listener,
        stop_after=stop_after,
        restore_from=restore_from,
        allow_non_restored_state=allow_non_restored_state,
        fresh=fresh,
        progress=progress,
        seams=Seams(
            hold_sources=hold_sources, phase_hook=phase_hook, launcher=launcher, on_ready=on_ready
        ),
    )
