"""How a slot is described and started: :class:`SlotSetup` (everything a slot needs, pickled to the
executors), the phases a slot goes through, and source holds for tests and demos.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from cutline.runtime.checkpoint.restore import RestoreSpec
from cutline.runtime.graph import ExecutionPlan
from cutline.runtime.state.config import StateConfig


class Checkpointing(StrEnum):
    """How the subtasks handle a checkpoint's barriers (``checkpointing=`` names one)."""

    ALIGNED = "aligned"
    """Exactly once: a subtask with several inputs waits for the barrier on all of them
    (``BarrierAligner``)."""
    UNALIGNED = "unaligned"
    """Exactly once: a barrier overtakes the records queued before it, which go into the
    checkpoint as channel state (``BarrierAligner(unaligned=True)``)."""
    AT_LEAST_ONCE = "at_least_once"
    """No waiting: a subtask snapshots when the last input's barrier comes; records after the
    first may be replayed (``BarrierTracker``)."""


CHECKPOINTING_MODES = tuple(str(m) for m in Checkpointing)


@dataclass(frozen=True)
class BarrierHandling:
    """How the subtasks handle a checkpoint's barriers, checked when it is made.

    :param mode: :class:`Checkpointing` (or its name: ``aligned`` or ``unaligned``,
        exactly-once both, or ``at_least_once``).
    :param alignment_timeout: with ``aligned``: seconds from a checkpoint's trigger after which
        it goes unaligned at a subtask where it has not aligned yet (or whose barrier still
        waits in an output queue); ``None``: never.
    """

    mode: Checkpointing = Checkpointing.ALIGNED
    alignment_timeout: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in CHECKPOINTING_MODES:
            raise ValueError(
                f"checkpointing must be one of {', '.join(map(repr, CHECKPOINTING_MODES))}, "
                f"not {self.mode!r}"
            )
        object.__setattr__(self, "mode", Checkpointing(self.mode))
        timeout = self.alignment_timeout
        if timeout is None:
            return
        if type(timeout) not in (int, float) or not 0 <= timeout < float("inf"):
            raise ValueError(
                f"alignment_timeout must be a finite duration of 0 or more, not {timeout!r}"
            )
        if self.mode is not Checkpointing.ALIGNED:
            raise ValueError(
                f"alignment_timeout applies to aligned checkpoints only, not {str(self.mode)!r}"
            )

    @property
    def unaligned(self) -> bool:
        return self.mode is Checkpointing.UNALIGNED

    def check_concurrency(self, max_concurrent: int) -> None:
        """Checkpoints are taken one at a time when unaligned, and with an alignment timeout (as
        in Flink: a barrier that goes unaligned overtakes the barriers of the checkpoints
        queued before it, which could then never complete): ``ValueError`` otherwise."""
        if max_concurrent == 1 or (not self.unaligned and self.alignment_timeout is None):
            return
        why = (
            "unaligned checkpoints are taken one at a time"
            if self.unaligned
            else "with an alignment_timeout checkpoints may go unaligned, and those are taken "
            "one at a time"
        )
        raise ValueError(f"{why}: max_concurrent_checkpoints must be 1, not {max_concurrent!r}")


@dataclass(frozen=True)
class SlotSetup:
    """Everything a slot needs, sent (pickled) from the driver with the Spark job."""

    plan: ExecutionPlan
    generation: int
    token: bytes
    driver: tuple[str, int]
    checkpoint_dir: str
    storage_options: dict[str, Any] | None = None
    restore: RestoreSpec | None = None
    """The checkpoint or savepoint to restore (``None``: start from scratch)."""
    state: StateConfig = field(default_factory=StateConfig)
    batch_size: int = 65536
    buffer_capacity: int = 4
    dead_letter_dir: str | None = None
    on_error: dict[str, str] = field(default_factory=dict)
    """Operator uid -> ``fail`` or ``dead_letter``."""
    heartbeat_interval: float = 0.25
    run: str = "r0"
    """The id of this run of the job (one ``execute()``), in every output file's name."""
    job: str = "r0"
    """The id of the job's lineage (``SinkContext.job``): the same across resumed runs."""
    barriers: BarrierHandling = field(default_factory=BarrierHandling)
    drain: bool = False
    """The sources read nothing: the job publishes what it restored and ends (it restores the
    savepoint it was stopped with)."""
    rate_limits: dict[str, float] = field(default_factory=dict)
    """Source operator uid -> records per second for the whole source (each of its subtasks
    reads at most its share: the limit divided by the parallelism)."""
    hold: SourceHold | None = None
    """Hold every source subtask part-way (see :class:`SourceHold`)."""
    phase_hook: PhaseHook | None = None
    """Called in the slot's process as it enters each phase (fault-injection tests)."""

    def enter(self, phase: str, slot: int) -> None:
        """The slot (or its supervisor) enters ``phase``: call the phase hook, if any."""
        if self.phase_hook is not None:
            self.phase_hook(phase, slot, self.generation)


SLOT_PHASES = ("start", "rendezvous", "restore", "running", "final_checkpoint", "commit")
"""The phases a slot goes through, in order, each with a deadline at the driver: ``start``
(the task runs; ends when it reached the driver), ``rendezvous`` (the slots exchange their
addresses), ``restore`` (state restored, operators opened, output channels connected; ends
with ``ready``), ``running``, ``final_checkpoint`` (the final checkpoint was triggered) and
``commit`` (it completed: the sinks publish, the subtasks end)."""

PhaseHook = Callable[[str, int, int], None]
"""``hook(phase, slot, generation)``: called in each slot's process as it enters each of
:data:`SLOT_PHASES` (``final_checkpoint`` and ``commit`` in the slot's supervisor, when the
driver's trigger or completion arrives); for tests that freeze or stall a worker in a phase."""


@dataclass(frozen=True)
class SourceHold:
    """Hold the sources part-way, so that a test or a demo can fail a job at a complete
    checkpoint with input left, on a machine of any speed.

    In the job's first attempt each source subtask stops reading once it has read ``records``
    records, until ``checkpoints`` checkpoints triggered after it stopped have completed and
    the job's listener has been told of them (a listener that kills a worker on a checkpoint
    therefore always kills a running job); then it reads on. Later attempts do not hold.
    """

    records: int
    checkpoints: int = 1

    def __post_init__(self) -> None:
        for name, value, least in (
            ("records", self.records, 0),
            ("checkpoints", self.checkpoints, 1),
        ):
            if type(value) is not int or value < least:
                raise ValueError(
                    f"SourceHold: {name} must be a whole number of at least {least}, not {value!r}"
                )


class LaunchedJob(Protocol):
    def error(self) -> str | None:
        """``None`` while running or after success; the failure's text otherwise."""
        ...

    def cancel(self) -> None: ...

    def wait(self, timeout: float) -> None: ...

    def detach(self) -> None:
        """The attempt ended well: every slot said ``Finished`` (its output published). What
        is left of its tasks (closing sockets, ending threads) may end without the driver
        waiting for it."""
        ...


class Launcher(Protocol):
    def launch(self, setup: SlotSetup) -> LaunchedJob:
        """Start one slot per subtask index, each calling ``run_slot(setup, slot, ...)``."""
        ...

    def driver_host(self) -> str:
        """The address the slots reach the driver at."""
        ...

    def wait_for_slots(
        self, needed: int, hosts: frozenset[str], timeout: float, say: Callable[[str], None]
    ) -> str | None:
        """Wait, up to ``timeout`` seconds, until ``needed`` task slots are free at once and
        every one of ``hosts`` runs an executor again (hosts a failed generation ran on: the
        ``on_host_loss="wait"`` policy). ``None`` when the job can start (a host that did not
        come back is then only said, through ``say``); otherwise why it cannot."""
        ...
