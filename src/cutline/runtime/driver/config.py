"""A job's configuration as the driver runs it (:class:`JobConfig`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cutline.protocol.coordinator import CheckpointSettings
from cutline.runtime.checkpoint.stats import STATS_HISTORY
from cutline.runtime.checkpoint.storage import CheckpointLocation
from cutline.runtime.state.config import StateConfig
from cutline.runtime.task.launch import PhaseHook, SourceHold

LATEST = "latest"
"""``restore_from=LATEST``: the newest intact complete checkpoint in the job's own checkpoint
directory: how a job whose driver died resumes."""

HOST_LOSS_POLICIES = ("restart", "wait")
"""After a generation failed: ``restart`` at once on the slots there are (the hosts that remain,
when they have enough), or ``wait`` (up to ``slot_timeout``) for every host it ran on to be
back."""


def check_host_loss(policy: str) -> str:
    if policy not in HOST_LOSS_POLICIES:
        raise ValueError(
            f"on_host_loss must be one of {', '.join(map(repr, HOST_LOSS_POLICIES))}, "
            f"not {policy!r}"
        )
    return policy


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
    start_timeout: float = 60.0
    """Seconds for every slot of a generation to start and reach the driver after the launch,
    and for their rendezvous to end after the last one did."""
    restore_timeout: float = 600.0
    """Seconds for a slot to restore its state, open its operators and connect its outputs."""
    commit_timeout: float = 120.0
    """Seconds for every slot to publish and end after the final checkpoint completed."""
    rate_limits: dict[str, float] = field(default_factory=dict)
    """Source operator uid -> records per second (see :class:`SlotSetup`)."""
    hold: SourceHold | None = None
    """Hold the sources part-way in the first generation (see :class:`SourceHold`)."""
    phase_hook: PhaseHook | None = None
    """Called in each slot's process as it enters each phase (fault-injection tests)."""
    stop_after: float | None = None
    """Seconds after the job started at which it stops with a final checkpoint: the sources
    stop reading, everything they read is processed and published (for unbounded sources)."""
    checkpointing: str = "aligned"
    """``aligned``, ``unaligned`` or ``at_least_once`` (see :class:`SlotSetup`)."""
    alignment_timeout: float | None = None
    """See :class:`SlotSetup`."""
    state: StateConfig = field(default_factory=StateConfig)
    restore_from: str | None = None
    """A checkpoint or savepoint folder (or a checkpoint directory: its newest complete
    checkpoint) to start from."""
    allow_non_restored_state: bool = False
    """Start even if the checkpoint holds state of operators the job does not have."""
    savepoint_dir: str | None = None
    """Where savepoints go by default (``CHECKPOINT_DIR/savepoints``)."""
    stats_history: int = STATS_HISTORY
    """Checkpoint statistics files kept in ``CHECKPOINT_DIR/_stats`` (the newest)."""
    slot_timeout: float = 120.0
    """Seconds each generation waits for its task slots (one per subtask index, all at once)
    before it fails as a launcher failure (counted as a restart)."""
    on_host_loss: str = "restart"
    """One of :data:`HOST_LOSS_POLICIES`."""
    checkpoint_written: Callable[[int, CheckpointLocation], None] | None = None
    """Called on the driver with each checkpoint's (or savepoint's) id and location once its
    metadata is written, before it is declared complete: a hook for checks of one's own (the
    test suite verifies every checkpoint in full with it, ``runtime/checkpoint/verify.py``).
    What it raises fails the job."""
