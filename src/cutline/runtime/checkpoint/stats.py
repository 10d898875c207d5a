"""Checkpoint statistics: what each checkpoint cost, kept in the checkpoint directory.

The driver writes one small JSON file per event to ``CHECKPOINT_DIR/_stats/``, as it
happens, so the history outlives the checkpoints themselves (only the newest
``Checkpoints.retained`` stay) and the job that wrote it::

    CHECKPOINT_DIR/_stats/
      run-3f2a9c1e.json          # a run (one execute()): when, parallelism, operators, channels
      checkpoint-12.json         # checkpoint 12: status, timings, sizes, per subtask
      restart-3f2a9c1e-1.json    # generation 1 of run 3f2a9c1e failed: why, restored from what

Times measured inside one process are monotonic differences (never negative). Times
that compare two processes (a barrier's *start delay*, its arrival on each channel) are
wall-clock seconds after the driver's trigger: on one machine exact, on a cluster as
good as the hosts' clock synchronisation (a start delay is never shown below 0).

The newest ``STATS_HISTORY`` checkpoint files are kept; older ones are removed as new
ones come (like Flink's checkpoint history).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from cutline.runtime.fields import conforms, field_types

STATS_FOLDER = "_stats"
STATS_FORMAT = 1
STATS_HISTORY = 1000
"""Checkpoint statistics files kept per checkpoint directory (the newest)."""

_CHECKPOINT_FILE = re.compile(r"checkpoint-(0|[1-9][0-9]*)\.json")
_RUN_FILE = re.compile(r"run-([0-9a-f]+)\.json")
_RESTART_FILE = re.compile(r"restart-([0-9a-f]+)-([0-9]+)\.json")


class _Record:
    """A statistics record: a dataclass kept as JSON with its ``kind`` and the format."""

    KIND: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = dataclasses.asdict(self)  # type: ignore[call-overload]
        data["format"] = STATS_FORMAT
        data["kind"] = self.KIND
        return data

    @classmethod
    def _values(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        """The fields of ``cls`` in ``data`` (others, e.g. of a newer version, are ignored),
        each checked to be of its type (``ValueError`` naming the field if not)."""
        hints = field_types(cls)
        values = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name not in data:
                continue
            value = data[f.name]
            if f.name != "subtasks" and not conforms(value, hints[f.name]):
                raise ValueError(f"{f.name} is {value!r}, not of type {hints[f.name]}")
            values[f.name] = value
        return values

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        return cls(**cls._values(data))


@dataclass(frozen=True)
class SubtaskStats(_Record):
    """One subtask's part of one checkpoint (Flink: ``SubtaskStateStats``)."""

    subtask: str
    acknowledged: float
    """Seconds from the trigger to its acknowledgement reaching the driver (driver's clock)."""
    start_delay: float
    """Seconds from the trigger to the first barrier reaching it (a source: the trigger)."""
    alignment: float
    """Seconds from its first barrier to its snapshot (aligned: waiting for the others)."""
    synchronous: float
    """Seconds of the synchronous part (offsets, state copies, the sinks' pending parts)."""
    asynchronous: float
    """Seconds from the end of the synchronous part to the acknowledgement (channel state
    still recorded, serialising and writing)."""
    state_size: int
    """Bytes of its state file."""
    segments_size: int = 0
    """Bytes of keyed state segments written with this checkpoint (new ones only)."""
    full_size: int = 0
    """Bytes of everything its state is made of (its state file and every segment it names,
    also those written by earlier checkpoints)."""
    channel_state_records: int = 0
    channel_state_bytes: int = 0
    unaligned: bool = False
    barriers: dict[str, float] = field(default_factory=dict)
    """Input channel -> seconds after the trigger its barrier arrived (wall clock)."""
    snapshot_at: float = 0.0
    """Seconds after the trigger it took its snapshot (wall clock)."""
    forwarded_at: float | None = None
    """Seconds after the trigger it sent the barrier on (``None``: it has no outputs)."""
    queued_ahead: dict[str, int] = field(default_factory=dict)
    """Output channel -> records its barrier was sent behind (queued for credit, and in the
    receiver's buffer): what the barrier had to wait behind on that channel (aligned)."""
    watermark: int | None = None
    """Its watermark (epoch ms) at its snapshot; ``None``: it had none (no event time)."""
    event_time: dict[str, dict[str, int]] = field(default_factory=dict)
    """Operator uid -> its event-time figures at the snapshot: ``late`` (records too late
    for their windows so far, this generation), ``windows`` (open), ``timers``, ``kept`` (a
    join's rows kept, both sides)."""
    records: dict[str, list[int]] = field(default_factory=dict)
    """Operator uid -> [records in, records out] of its chain's operators in this generation,
    at the snapshot."""
    dead_letters: int = 0
    """Records it sent to the dead letters in this generation, before the snapshot."""

    KIND: ClassVar[str] = "subtask"

    @property
    def size(self) -> int:
        """Bytes it wrote for this checkpoint."""
        return self.state_size + self.segments_size

    @property
    def last_barrier(self) -> tuple[str, float] | None:
        """The input channel whose barrier came last, and when (what its acknowledgement
        waited for: an unaligned subtask records its channel state until then)."""
        return _latest(self.barriers)

    @property
    def snapshot_barrier(self) -> tuple[str, float] | None:
        """The input channel whose barrier came last before the snapshot (what the snapshot,
        and so the barriers it sent on, waited for: aligned, the last input to align;
        unaligned, the first barrier; a loop's head, never its back edge)."""
        return _latest({c: t for c, t in self.barriers.items() if t <= self.snapshot_at})


def _latest(barriers: Mapping[str, float]) -> tuple[str, float] | None:
    if not barriers:
        return None
    channel = max(barriers, key=lambda c: (barriers[c], c))
    return channel, barriers[channel]


def summed_figures(
    per_subtask: Iterable[Mapping[str, Mapping[str, Any]]],
) -> dict[str, dict[str, int]]:
    """Operator uid -> its event-time figures (late records, open windows, timers), summed
    over the subtasks' ``{uid: {figure: value}}`` (of a checkpoint, or of the heartbeats)."""
    totals: dict[str, dict[str, int]] = {}
    for figures in per_subtask:
        for uid, found in figures.items():
            if not isinstance(found, Mapping):
                continue
            summed = totals.setdefault(str(uid), {})
            for name, value in found.items():
                summed[str(name)] = summed.get(str(name), 0) + int(value)
    return totals


@dataclass(frozen=True)
class RecordCounts:
    """Records each operator took in and gave out, and records sent to the dead letters.

    A subtask counts its own in each generation; the driver keeps the whole job's, since it
    started, at every checkpoint: what the checkpoint the generation restored from had
    counted, plus what the generation's subtasks had counted at their snapshots. A record
    read again after a restore was not counted at the restored checkpoint (it came after the
    snapshots), so it counts once; summed per operator, a restore at another parallelism
    needs nothing special. The checkpoint's metadata keeps them (:meth:`to_extra`), so a run
    that restores it, resumed or from a savepoint anywhere, goes on counting from them."""

    operators: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    """Operator uid -> (records in, records out)."""
    dead_letters: int = 0

    def __add__(self, other: RecordCounts) -> RecordCounts:
        operators = dict(self.operators)
        for uid, (taken, given) in other.operators.items():
            before = operators.get(uid, (0, 0))
            operators[uid] = (before[0] + taken, before[1] + given)
        return RecordCounts(operators, self.dead_letters + other.dead_letters)

    @classmethod
    def of(cls, records: Mapping[str, Any], dead_letters: Any = 0) -> RecordCounts:
        """From JSON (uid -> [in, out]); ``ValueError`` or ``TypeError`` if it is not that."""
        operators = {}
        for uid, counted in records.items():
            taken, given = counted
            operators[str(uid)] = (int(taken), int(given))
        return cls(operators, int(dead_letters))

    def to_json(self) -> dict[str, list[int]]:
        return {uid: [taken, given] for uid, (taken, given) in sorted(self.operators.items())}

    def to_extra(self) -> dict[str, Any]:
        """What a checkpoint's metadata keeps of them (in its ``extra``)."""
        return {"records": self.to_json(), "dead_letters": self.dead_letters}

    @classmethod
    def in_extra(cls, extra: Mapping[str, Any]) -> RecordCounts | None:
        """What a checkpoint's metadata says the job had counted at it (``None``: nothing, a
        checkpoint of an older version, or not readable)."""
        records = extra.get("records")
        if not isinstance(records, Mapping):
            return None
        try:
            return cls.of(records, extra.get("dead_letters", 0))
        except (TypeError, ValueError):
            return None


@dataclass(frozen=True)
class CheckpointStats(_Record):
    """One checkpoint's statistics (Flink: ``CompletedCheckpointStats`` and
    ``FailedCheckpointStats`` in one)."""

    checkpoint_id: int
    generation: int
    duration: float
    """Seconds from trigger to complete (or to abort)."""
    final: bool = False
    alignment: float = 0.0
    """The longest barrier alignment of any subtask (seconds)."""
    size: int = 0
    """Bytes it wrote: its state files and keyed state segments (for an incremental
    checkpoint, only the segments new with it, not those it shares with earlier ones)."""
    unaligned: bool = False
    """Whether any subtask took it unaligned (the mode, or an alignment that timed out)."""
    channel_state_records: int = 0
    """Records in flight it recorded (input and output channel state of every subtask)."""
    triggered_at: float = 0.0
    """Seconds from the start of the job to its trigger (it completed ``duration`` later)."""
    savepoint: str | None = None
    """For a savepoint: its folder."""
    status: str = "completed"
    """``completed`` or ``aborted``."""
    reason: str | None = None
    """Why it was aborted."""
    run: str = ""
    trigger_time: float = 0.0
    """When it was triggered (seconds since the epoch, driver's clock)."""
    full_size: int = 0
    """Bytes of everything it is made of (incremental: also the segments it shares)."""
    channel_state_bytes: int = 0
    checkpointing: str = "aligned"
    records: dict[str, list[int]] = field(default_factory=dict)
    """Operator uid -> [records in, records out] since the job started, at this checkpoint
    (see :class:`RecordCounts`); empty: not known (aborted, written by an older version, or
    its generation restored a checkpoint that did not know them)."""
    dead_letters: int = 0
    """Records sent to the dead letters since the job started, at this checkpoint."""
    subtasks: dict[str, SubtaskStats] = field(default_factory=dict)
    """Every subtask that acknowledged it."""

    @property
    def completed(self) -> bool:
        return self.status == "completed"

    @property
    def slowest(self) -> SubtaskStats | None:
        """The subtask whose acknowledgement came last."""
        if not self.subtasks:
            return None
        return max(self.subtasks.values(), key=lambda s: (s.acknowledged, s.subtask))

    @property
    def waited_behind(self) -> tuple[str, str, int] | None:
        """Where its barrier waited behind the most records: ``(sender, output channel,
        records)``, or ``None`` when no barrier waited behind any (unaligned ones overtake)."""
        most = max(
            ((s.subtask, c, n) for s in self.subtasks.values() for c, n in s.queued_ahead.items()),
            key=lambda found: found[2],
            default=None,
        )
        return most if most is not None and most[2] > 0 else None

    def watermarks(self) -> dict[str, int]:
        """Chain uid -> its watermark at this checkpoint (the least of its subtasks'; only
        chains with event time)."""
        found: dict[str, int] = {}
        for stats in self.subtasks.values():
            if stats.watermark is None:
                continue
            chain = stats.subtask.rsplit("-", 1)[0]
            found[chain] = min(found.get(chain, stats.watermark), stats.watermark)
        return found

    def event_time(self) -> dict[str, dict[str, int]]:
        """Operator uid -> its event-time figures summed over its subtasks."""
        return summed_figures(stats.event_time for stats in self.subtasks.values())

    def counts(self) -> RecordCounts | None:
        """What the job had counted at this checkpoint since it started (``None``: not
        known)."""
        return RecordCounts.of(self.records, self.dead_letters) if self.records else None

    KIND: ClassVar[str] = "checkpoint"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        values = cls._values(data)
        subtasks = data.get("subtasks", {})
        if not isinstance(subtasks, dict) or not all(
            isinstance(v, dict) for v in subtasks.values()
        ):
            raise ValueError(f"subtasks is {subtasks!r}, not a map of subtask statistics")
        values["subtasks"] = {
            str(name): SubtaskStats.from_dict(sub) for name, sub in subtasks.items()
        }
        return cls(**values)


@dataclass(frozen=True)
class RestartInfo(_Record):
    """A generation of the job failed, and whether and from where the next one started."""

    generation: int
    """The generation that failed."""
    cause: str
    restored_from: int | None
    """The checkpoint the next generation restored (``None``: from the start, or none: the
    job failed for good)."""
    failed_at: float
    """Seconds since the job started."""
    run: str = ""
    time: float = 0.0
    """When it failed (seconds since the epoch)."""
    restarted: bool = True
    """Whether a next generation was started (``False``: the restart strategy gave up)."""
    hosts: dict[str, str] = field(default_factory=dict)
    """Slot -> the host (address) it ran on in the failed generation (empty: it never got all
    its slots running)."""
    delay: float = 0.0
    """Seconds the next generation waited before it started (the restart strategy's delay)."""

    KIND: ClassVar[str] = "restart"


@dataclass(frozen=True)
class RunInfo(_Record):
    """One run of a job (one ``execute()``) on a checkpoint directory."""

    run: str
    started: float
    """Seconds since the epoch."""
    parallelism: int
    checkpointing: str
    operators: dict[str, str]
    """Operator uid -> its name."""
    subtasks: list[str]
    """Every subtask, sources first in the order of the plan."""
    channels: dict[str, list[str]]
    """Channel id -> [sending subtask, receiving subtask]."""
    restored_from: str | None = None
    ended: float | None = None
    outcome: str | None = None
    """``finished``, or ``failed: ...`` (``None`` while it runs, or if the driver died)."""
    hosts: dict[str, str] = field(default_factory=dict)
    """At the end: slot -> the host (address) it ran on in the last generation."""

    KIND: ClassVar[str] = "run"


@dataclass
class History:
    """Everything in a checkpoint directory's ``_stats`` folder."""

    checkpoints: list[CheckpointStats] = field(default_factory=list)
    """By id."""
    restarts: list[RestartInfo] = field(default_factory=list)
    """By time."""
    runs: list[RunInfo] = field(default_factory=list)
    """By start."""
    unreadable: list[str] = field(default_factory=list)
    """Files that could not be read (named, with the reason)."""

    def checkpoint(self, checkpoint_id: int) -> CheckpointStats | None:
        for stats in self.checkpoints:
            if stats.checkpoint_id == checkpoint_id:
                return stats
        return None

    def run(self, run: str) -> RunInfo | None:
        for info in self.runs:
            if info.run == run:
                return info
        return None


def critical_path(stats: CheckpointStats, run: RunInfo | None) -> list[tuple[str, str | None]]:
    """The chain of waits that made ``stats`` as long as it was: from the subtask whose
    acknowledgement came last and the input whose barrier it waited for last, back through
    the sender of that barrier, which sent it once it snapshotted, so through the input whose
    barrier its snapshot waited for last, and so on, to a source. Each step is
    ``(subtask, input channel)``; the last step (a source, a subtask that snapshotted before
    any barrier came, or one whose inputs are unknown) has ``None``. A loop's head may come
    twice: first for its acknowledgement (which waited for the barrier round the loop), then
    for its snapshot."""
    path: list[tuple[str, str | None]] = []
    current = stats.slowest
    seen: set[tuple[str, bool]] = set()  # (subtask, by its snapshot): a loop's head comes twice
    while current is not None and (current.subtask, bool(path)) not in seen:
        seen.add((current.subtask, bool(path)))
        last = current.last_barrier if not path else current.snapshot_barrier
        if last is None:
            path.append((current.subtask, None))
            break
        channel = last[0]
        path.append((current.subtask, channel))
        sender = run.channels.get(channel, [None])[0] if run is not None else None
        current = stats.subtasks.get(sender) if sender is not None else None
    return path


# ------------------------------------------------------------------------------ for people


def human_bytes(count: float) -> str:
    """A size for people, in powers of 1024: ``512 B``, ``1.5 KiB``, ``2.0 MiB``."""
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def id_ranges(ids: Iterable[int]) -> str:
    """``1-8, 10, 12-20``: sorted ids with consecutive runs folded (``none`` for none)."""
    parts: list[str] = []
    values = sorted(set(ids))
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ", ".join(parts) or "none"


# ------------------------------------------------------------------------------- the folder


def stats_file(checkpoint_id: int) -> str:
    return f"checkpoint-{checkpoint_id}.json"


def checkpoint_ids_in(names: list[str]) -> list[int]:
    """The ids of the checkpoint statistics files among ``names`` (base names)."""
    ids = []
    for name in names:
        match = _CHECKPOINT_FILE.fullmatch(name)
        if match:
            ids.append(int(match.group(1)))
    return sorted(ids)


def encode(record: CheckpointStats | RestartInfo | RunInfo) -> bytes:
    return json.dumps(record.to_dict(), sort_keys=True, indent=1).encode()


def decode(name: str, data: bytes) -> CheckpointStats | RestartInfo | RunInfo | None:
    """The record in the statistics file ``name`` (``None``: not a statistics file);
    ``ValueError`` when it is one but cannot be read."""
    kind = (
        "checkpoint"
        if _CHECKPOINT_FILE.fullmatch(name)
        else "run"
        if _RUN_FILE.fullmatch(name)
        else "restart"
        if _RESTART_FILE.fullmatch(name)
        else None
    )
    if kind is None:
        return None
    try:
        values = json.loads(data)
        if not isinstance(values, dict) or values.get("kind") != kind:
            raise ValueError(f"not a {kind} record")
        if values.get("format") != STATS_FORMAT:
            raise ValueError(f"unknown format {values.get('format')!r}")
        if kind == "checkpoint":
            return CheckpointStats.from_dict(values)
        if kind == "run":
            return RunInfo.from_dict(values)
        return RestartInfo.from_dict(values)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"{name} is not a valid statistics file: {exc}") from None


def history_of(files: Mapping[str, bytes]) -> History:
    """The history in a statistics folder's ``files`` (base name -> contents)."""
    history = History()
    for name in sorted(files):
        try:
            record = decode(name, files[name])
        except ValueError as exc:
            history.unreadable.append(str(exc))
            continue
        if isinstance(record, CheckpointStats):
            history.checkpoints.append(record)
        elif isinstance(record, RestartInfo):
            history.restarts.append(record)
        elif isinstance(record, RunInfo):
            history.runs.append(record)
    history.checkpoints.sort(key=lambda s: s.checkpoint_id)
    history.restarts.sort(key=lambda r: (r.time, r.run, r.generation))
    history.runs.sort(key=lambda r: r.started)
    return history
