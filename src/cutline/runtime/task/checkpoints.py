"""What one subtask knows of each checkpoint in flight: one object per checkpoint id (the role
of Flink's ``SubtaskCheckpointCoordinator``).

A checkpoint passes through a subtask in steps, and each step leaves something to remember
until a later one:

==========================  ==========================================================
step                        what :class:`SubtaskCheckpoint` keeps, until when
==========================  ==========================================================
trigger (from the driver)   ``base`` and ``savepoint`` (what the barrier says too), until
                            a later checkpoint's snapshot; the trigger time, for the
                            alignment timeout, until it completes, aborts or times out
first barrier on an input   when it came (alignment is timed from it), until the snapshot
each barrier                when it came on its channel (wall clock), until the checkpoint
                            is whole here; whether it came forced aligned, until forwarded
snapshot (synchronous)      the :class:`PendingSnapshot`: the operators' parts, then the
                            channel state recorded, until the checkpoint is whole here
whole here                  with an alignment timeout, the snapshot still waits (``unflushed``)
                            while its barrier sits in an output queue; then it is written
==========================  ==========================================================

:class:`SubtaskCheckpoints` holds them by id, makes one on first use and forgets it once it
keeps nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from cutline.runtime.network.wire import InBand, recorded, recorded_records


@dataclass
class PendingSnapshot:
    """A checkpoint taken at this subtask and not yet whole: its synchronous part, and the
    channel state recorded since."""

    parts: dict[str, Any]
    alignment: float
    sync_end: float
    savepoint: bool = False
    unaligned: bool = False
    inputs: dict[str, list[Any]] = field(default_factory=dict)
    outputs: dict[str, list[Any]] = field(default_factory=dict)
    synchronous: float = 0.0
    snapshot_at: float = 0.0
    """Wall clock of the snapshot (statistics compare it across processes)."""
    first_barrier_at: float = 0.0
    """Wall clock of the first barrier (a source: of the trigger)."""
    forwarded_at: float | None = None
    sent: dict[str, int] = field(default_factory=dict)
    """Records sent per output channel before the barrier."""
    received: dict[str, int] = field(default_factory=dict)
    """Records received per input channel before the snapshot."""
    arrivals: dict[str, float] = field(default_factory=dict)
    """Input channel -> wall clock of its barrier."""
    queued_ahead: dict[str, int] = field(default_factory=dict)
    """Output channel -> records its (in-line) barrier was sent behind."""
    watermark: int | None = None
    """The subtask's watermark at the snapshot (``None``: it has none yet)."""
    event_time: dict[str, dict[str, int]] = field(default_factory=dict)
    """Operator uid -> its event-time figures at the snapshot (late records, open windows,
    timers)."""
    records: dict[str, list[int]] = field(default_factory=dict)
    """Operator uid -> [records in, records out] in this generation, at the snapshot: the
    driver adds them to what the restored checkpoint had counted, for the job's counts."""
    dead_letters: int = 0
    """Records sent to the dead letters in this generation, before the snapshot."""

    def statistics(self, segments_size: int, channel_bytes: int) -> dict[str, Any]:
        """The figures its acknowledgement carries, once written (the driver's
        ``CheckpointStatsTracker`` makes its ``SubtaskStats`` of them)."""
        counts = self.channel_counts()
        return {
            "synchronous": self.synchronous,
            "first_barrier_at": self.first_barrier_at,
            "snapshot_at": self.snapshot_at,
            "forwarded_at": self.forwarded_at,
            "barriers": self.arrivals,
            "segments_size": segments_size,
            "channel_state_bytes": channel_bytes,
            "channel_state_records": sum(counts["recorded_inputs"].values())
            + sum(counts["recorded_outputs"].values()),
            "queued_ahead": self.queued_ahead,
            "watermark": self.watermark,
            "event_time": self.event_time,
            "records": self.records,
            "dead_letters": self.dead_letters,
        }

    def keep_output(self, channel: str, overtaken: list[InBand]) -> None:
        """Keep the records (and watermarks) an unaligned barrier overtook on output
        ``channel``."""
        if overtaken:
            self.outputs[channel] = [recorded(frame) for frame in overtaken]

    def channel_counts(self) -> dict[str, dict[str, int]]:
        """What the consistent-cut verifier checks (``runtime/checkpoint/verify.py``)."""
        return {
            "sent": self.sent,
            "received": self.received,
            "recorded_inputs": _recorded(self.inputs),
            "recorded_outputs": _recorded(self.outputs),
        }


def _recorded(channels: dict[str, list[Any]]) -> dict[str, int]:
    """Records per channel of recorded channel state."""
    return {c: recorded_records(batches) for c, batches in channels.items() if batches}


@dataclass
class SubtaskCheckpoint:
    """One checkpoint at one subtask (see the module's table)."""

    checkpoint_id: int
    kind: tuple[int | None, bool] | None = None
    """(its base, whether it is a savepoint), from its trigger or its first barrier."""
    triggered: float | None = None
    """With an alignment timeout: when it was triggered (monotonic)."""
    trigger_seen: float | None = None
    """A source: when its trigger came (wall clock)."""
    first_barrier: float | None = None
    """When its first barrier came (monotonic)."""
    arrivals: dict[str, float] = field(default_factory=dict)
    """Input channel -> when its barrier came (wall clock)."""
    forced: bool = False
    """Its barriers came forced aligned (and are forwarded so)."""
    pending: PendingSnapshot | None = None
    """Its snapshot, until the checkpoint is whole here."""
    unflushed: PendingSnapshot | None = None
    """Whole here, but its barrier still waits in an output queue (alignment timeout)."""

    @property
    def base(self) -> int | None:
        return self.kind[0] if self.kind is not None else None

    @property
    def savepoint(self) -> bool:
        return self.kind[1] if self.kind is not None else False

    def barrier_came(self, channel: str, now: float, wall: float) -> None:
        if self.first_barrier is None:
            self.first_barrier = now
        self.arrivals.setdefault(channel, wall)

    def said(self, base: int | None, savepoint: bool) -> None:
        """What its trigger or a barrier says of it (the first one told is kept)."""
        if self.kind is None:
            self.kind = (base, savepoint)

    def keeps_nothing(self) -> bool:
        return (
            self.kind is None
            and self.triggered is None
            and self.trigger_seen is None
            and self.first_barrier is None
            and not self.arrivals
            and not self.forced
            and self.pending is None
            and self.unflushed is None
        )


class SubtaskCheckpoints:
    """The checkpoints in flight at one subtask, by id."""

    def __init__(self) -> None:
        self._by_id: dict[int, SubtaskCheckpoint] = {}

    def __getitem__(self, checkpoint_id: int) -> SubtaskCheckpoint:
        """The checkpoint (made on first use)."""
        checkpoint = self._by_id.get(checkpoint_id)
        if checkpoint is None:
            checkpoint = self._by_id[checkpoint_id] = SubtaskCheckpoint(checkpoint_id)
        return checkpoint

    def get(self, checkpoint_id: int) -> SubtaskCheckpoint | None:
        return self._by_id.get(checkpoint_id)

    def older(self, checkpoint_id: int) -> list[SubtaskCheckpoint]:
        return [c for n, c in sorted(self._by_id.items()) if n < checkpoint_id]

    def __iter__(self) -> Iterator[SubtaskCheckpoint]:
        """Oldest first."""
        return iter([c for _, c in sorted(self._by_id.items())])

    def watched(self) -> bool:
        """Whether the alignment timeout watches any checkpoint (the loop then looks more
        often)."""
        return any(c.triggered is not None or c.unflushed is not None for c in self._by_id.values())

    def timed(self) -> list[SubtaskCheckpoint]:
        """Those the alignment timeout watches: triggered and not yet complete here."""
        return [c for c in self if c.triggered is not None]

    def unflushed(self) -> list[SubtaskCheckpoint]:
        """Those whole here whose barrier still waits in an output queue, oldest first."""
        return [c for c in self if c.unflushed is not None]

    def forget_empty(self) -> None:
        """Forget the checkpoints that keep nothing any more."""
        for n in [n for n, c in self._by_id.items() if c.keeps_nothing()]:
            del self._by_id[n]
