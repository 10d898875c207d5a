"""The statistics of the checkpoints in flight, for one attempt (Flink's
``CheckpointStatsTracker``).

The attempt tells it when a checkpoint is triggered, each subtask's acknowledgement and the
bytes its metadata names; when the checkpoint ends (completed or aborted) it hands back the
checkpoint's :class:`~cutline.runtime.checkpoint.stats.CheckpointStats` and forgets it. It
also says which checkpoint is slow and what it waits for (the listener's ``waiting``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cutline.runtime.checkpoint.layout import StateHandle
from cutline.runtime.checkpoint.stats import CheckpointStats, RecordCounts, SubtaskStats
from cutline.runtime.network.messages import Ack


@dataclass
class _InFlight:
    """What is known of one checkpoint in flight."""

    started: float
    """When it was triggered (the driver's monotonic clock)."""
    wall: float
    """When it was triggered (seconds since the epoch: the subtasks' times compare to it)."""
    final: bool
    subtasks: dict[str, SubtaskStats]
    size: int | None = None
    full_size: int | None = None
    counts: RecordCounts | None = None
    """The job's counts at it, once its metadata is made (:meth:`counted`)."""


class CheckpointStatsTracker:
    """The checkpoints in flight of one attempt, and their statistics.

    :param generation: the attempt's generation.
    :param run: the run's id.
    :param job_start: when the job started (monotonic): triggers are timed from it.
    :param checkpointing: the job's checkpointing mode, kept in every record.
    :param restored: what the job had counted at the checkpoint the attempt restored (none
        counted at a fresh start; ``None``: not known, so neither are its checkpoints').
    """

    def __init__(
        self,
        generation: int,
        run: str,
        job_start: float,
        checkpointing: str,
        restored: RecordCounts | None = None,
    ) -> None:
        self.generation, self.run = generation, run
        self.job_start, self.checkpointing = job_start, checkpointing
        self.restored = restored
        self._in_flight: dict[int, _InFlight] = {}
        self._said_slow: set[int] = set()

    @property
    def in_flight(self) -> list[int]:
        """The checkpoints triggered and not yet ended, oldest first."""
        return sorted(self._in_flight)

    def triggered(self, checkpoint: int, now: float, final: bool) -> None:
        self._in_flight[checkpoint] = _InFlight(now, time.time(), final, {})

    def acknowledged(self, ack: Ack, now: float) -> None:
        """Keep the statistics of one subtask's acknowledgement (a late one is ignored)."""
        checkpoint = self._in_flight.get(ack.checkpoint)
        if checkpoint is None:
            return
        with contextlib.suppress(KeyError, TypeError, ValueError):
            checkpoint.subtasks[ack.subtask] = _subtask_stats(ack, now, checkpoint)

    def written(self, checkpoint: int, size: int, full_size: int) -> None:
        """Its metadata was written: ``size`` bytes new with it, ``full_size`` in all."""
        flight = self._in_flight.get(checkpoint)
        if flight is not None:
            flight.size, flight.full_size = size, full_size

    def counted(self, checkpoint: int, subtasks: Iterable[str]) -> RecordCounts | None:
        """The job's counts at ``checkpoint`` since it started: the restored checkpoint's plus
        what ``subtasks`` (all of the job's) had counted at their snapshots (``None``: not
        known, or a subtask's acknowledgement said nothing of them). Kept for its
        statistics."""
        flight = self._in_flight.get(checkpoint)
        if flight is None or self.restored is None:
            return None
        counts = self.restored
        for subtask in subtasks:
            stats = flight.subtasks.get(subtask)
            if stats is None or not stats.records:
                return None
            counts = counts + RecordCounts.of(stats.records, stats.dead_letters)
        flight.counts = counts
        return counts

    def ended(
        self, checkpoint: int, now: float, status: str, reason: str | None = None
    ) -> CheckpointStats:
        """The statistics of a checkpoint that ended (and it is forgotten)."""
        flight = self._in_flight.pop(checkpoint, None) or _InFlight(now, 0.0, False, {})
        subtasks = flight.subtasks.values()
        counts = flight.counts if status == "completed" else None
        return CheckpointStats(
            checkpoint_id=checkpoint,
            generation=self.generation,
            duration=now - flight.started,
            final=flight.final,
            alignment=max((s.alignment for s in subtasks), default=0.0),
            size=flight.size if flight.size is not None else sum(s.size for s in subtasks),
            unaligned=any(s.unaligned for s in subtasks),
            channel_state_records=sum(s.channel_state_records for s in subtasks),
            triggered_at=flight.started - self.job_start,
            status=status,
            reason=reason,
            run=self.run,
            trigger_time=flight.wall,
            full_size=(
                flight.full_size
                if flight.full_size is not None
                else sum(s.full_size for s in subtasks)
            ),
            channel_state_bytes=sum(s.channel_state_bytes for s in subtasks),
            checkpointing=self.checkpointing,
            records=counts.to_json() if counts is not None else {},
            dead_letters=counts.dead_letters if counts is not None else 0,
            subtasks=dict(sorted(flight.subtasks.items())),
        )

    def slow(
        self,
        now: float,
        interval: float | None,
        subtasks: list[str],
        channels: dict[str, list[str]],
    ) -> tuple[int, str] | None:
        """The oldest checkpoint in flight for longer than its interval (and a second): the
        subtasks it still waits for, and the most records its barrier waits behind on their
        inputs (backpressure), as its senders said when they acknowledged. ``channels`` maps
        a channel to its (sender, receiver)."""
        if not self._in_flight:
            return None
        checkpoint = min(self._in_flight)
        flight = self._in_flight[checkpoint]
        age = now - flight.started
        if age < max(1.0, interval or 0.0):
            return None
        waiting = [s for s in subtasks if s not in flight.subtasks]
        if not waiting:
            return None  # every subtask acknowledged: its metadata is being written
        names = ", ".join(waiting[:3]) + (
            f" and {len(waiting) - 3} more" if len(waiting) > 3 else ""
        )
        text = f"checkpoint {checkpoint} in flight for {age:.1f} s, waiting for {names}"
        behind = [
            (records, channel)
            for stats in flight.subtasks.values()
            for channel, records in stats.queued_ahead.items()
            if channels.get(channel, ["", ""])[1] in waiting and records
        ]
        if behind:
            records, channel = max(behind)
            text += f": its barrier is behind {records:,} records on {channel} (backpressure)"
        return checkpoint, text

    def first_said_slow(self, checkpoint: int) -> bool:
        """Whether this is the first time ``checkpoint`` is said to be slow."""
        if checkpoint in self._said_slow:
            return False
        self._said_slow.add(checkpoint)
        return True


def _subtask_stats(ack: Ack, now: float, flight: _InFlight) -> SubtaskStats:
    stats, wall = ack.stats, flight.wall
    handle = StateHandle.from_dict(ack.handle)

    def after(at: Any) -> float:
        return float(at) - wall

    forwarded = stats.get("forwarded_at")
    return SubtaskStats(
        subtask=ack.subtask,
        acknowledged=now - flight.started,
        start_delay=max(0.0, after(stats.get("first_barrier_at", wall))),
        alignment=ack.alignment,
        synchronous=float(stats.get("synchronous", 0.0)),
        asynchronous=ack.asynchronous,
        state_size=handle.size,
        segments_size=int(stats.get("segments_size", 0)),
        full_size=handle.size + sum(ref.size for ref in handle.segments),
        channel_state_records=int(stats.get("channel_state_records", 0)),
        channel_state_bytes=int(stats.get("channel_state_bytes", 0)),
        unaligned=ack.unaligned,
        barriers={str(c): after(t) for c, t in dict(stats.get("barriers", {})).items()},
        snapshot_at=after(stats.get("snapshot_at", wall)),
        forwarded_at=after(forwarded) if forwarded is not None else None,
        queued_ahead={str(c): int(n) for c, n in dict(stats.get("queued_ahead", {})).items()},
        watermark=int(stats["watermark"]) if stats.get("watermark") is not None else None,
        event_time={
            str(uid): {str(k): int(v) for k, v in dict(figures).items()}
            for uid, figures in dict(stats.get("event_time", {})).items()
        },
        records=RecordCounts.of(dict(stats.get("records", {}))).to_json(),
        dead_letters=int(stats.get("dead_letters", 0)),
    )
