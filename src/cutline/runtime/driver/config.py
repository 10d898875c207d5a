"""A job's configuration as the driver runs it (:class:`JobConfig`), made of settings objects
that each check themselves when they are made: the coordinator's
:class:`~cutline.protocol.CheckpointSettings`, the subtasks'
:class:`~cutline.runtime.task.launch.BarrierHandling`, the
:class:`~cutline.runtime.state.config.StateConfig`, the
:mod:`~cutline.runtime.driver.restart` strategy and the :class:`Deadlines`. The API
turns its keyword arguments into these objects once; the driver hands the slots' part of them
on as they are.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cutline.protocol.coordinator import CheckpointSettings
from cutline.runtime.checkpoint.location import CheckpointLocation
from cutline.runtime.checkpoint.stats import STATS_HISTORY
from cutline.runtime.driver.restart import HOST_LOSS_POLICIES, ExponentialDelay, RestartStrategy
from cutline.runtime.operators import OnError
from cutline.runtime.state.config import StateConfig
from cutline.runtime.task.launch import BarrierHandling, PhaseHook, SourceHold

LATEST = "latest"
"""``restore_from=LATEST``: the newest intact complete checkpoint in the job's own checkpoint
directory: how a job whose driver died resumes."""


@dataclass(frozen=True)
class Deadlines:
    """How long each phase of a slot may take, and a slot may stay silent, before the attempt
    fails (seconds; see :mod:`cutline.runtime.driver.failure_detector`)."""

    heartbeat: float = 30.0
    """A slot that sends no heartbeat for this long is lost (in any phase)."""
    start: float = 60.0
    """For every slot of a generation to start and reach the driver after the launch, and for
    their rendezvous to end after the last one did."""
    restore: float = 600.0
    """For a slot to restore its state, open its operators and connect its outputs."""
    commit: float = 120.0
    """For every slot to publish and end after the final checkpoint completed."""
    slots: float = 120.0
    """For the task slots of a generation (one per subtask index, all at once) to be free;
    then it fails as a launcher failure (counted as a restart)."""

    def __post_init__(self) -> None:
        for name, value in (
            ("heartbeat_timeout", self.heartbeat),
            ("start_timeout", self.start),
            ("restore_timeout", self.restore),
            ("commit_timeout", self.commit),
        ):
            if type(value) not in (int, float) or not 0 < value < math.inf:
                raise ValueError(
                    f"{name} must be a finite duration greater than zero, not {value!r}"
                )
        if type(self.slots) not in (int, float) or not 0 <= self.slots < math.inf:
            raise ValueError(f"slot_timeout must be a finite duration, not {self.slots!r}")


@dataclass(frozen=True)
class JobConfig:
    parallelism: int
    checkpoint_dir: str
    checkpoints: CheckpointSettings = field(default_factory=CheckpointSettings)
    barriers: BarrierHandling = field(default_factory=BarrierHandling)
    state: StateConfig = field(default_factory=StateConfig)
    restart: RestartStrategy = field(default_factory=ExponentialDelay)
    on_host_loss: str = "restart"
    """One of :data:`~cutline.runtime.driver.restart.HOST_LOSS_POLICIES`."""
    deadlines: Deadlines = field(default_factory=Deadlines)
    storage_options: dict[str, Any] | None = None
    batch_size: int = 65536
    buffer_capacity: int = 4
    dead_letter_dir: str | None = None
    on_error: dict[str, OnError] = field(default_factory=dict)
    collect: dict[str, str] = field(default_factory=dict)
    """Collect sink name -> its directory (read back when the job ends)."""
    rate_limits: dict[str, float] = field(default_factory=dict)
    """Source operator uid -> records per second (see :class:`SlotSetup`)."""
    hold: SourceHold | None = None
    """Hold the sources part-way in the first generation (see :class:`SourceHold`)."""
    phase_hook: PhaseHook | None = None
    """Called in each slot's process as it enters each phase (fault-injection tests)."""
    stop_after: float | None = None
    """Seconds after the job started at which it stops with a final checkpoint: the sources
    stop reading, everything they read is processed and published (for unbounded sources)."""
    restore_from: str | None = None
    """A checkpoint or savepoint folder (or a checkpoint directory: its newest complete
    checkpoint) to start from."""
    allow_non_restored_state: bool = False
    """Start even if the checkpoint holds state of operators the job does not have."""
    fresh: bool = False
    """Start from the beginning although the checkpoint directory holds a checkpoint to resume
    (kept: :mod:`~cutline.runtime.checkpoint.lineage`); without it, such a start is refused."""
    savepoint_dir: str | None = None
    """Where savepoints go by default (``CHECKPOINT_DIR/savepoints``)."""
    stats_history: int = STATS_HISTORY
    """Checkpoint statistics files kept in ``CHECKPOINT_DIR/_stats`` (the newest)."""
    checkpoint_written: Callable[[int, CheckpointLocation], None] | None = None
    """Called on the driver with each checkpoint's (or savepoint's) id and location once its
    metadata is written, before it is declared complete: a hook for checks of one's own (the
    test suite verifies every checkpoint in full with it, ``runtime/checkpoint/verify.py``).
    What it raises fails the job."""

    def __post_init__(self) -> None:
        self.barriers.check_concurrency(self.checkpoints.max_concurrent)
        if self.on_host_loss not in HOST_LOSS_POLICIES:
            raise ValueError(
                f"on_host_loss must be one of {', '.join(map(repr, HOST_LOSS_POLICIES))}, "
                f"not {self.on_host_loss!r}"
            )
