"""The report's data: a checkpoint directory's statistics read into what the page shows.

:func:`read_directory` opens the directory (a local path or an fsspec URL) and reads the
history the driver keeps in its ``_stats`` folder (:mod:`cutline.runtime.checkpoint.stats`)
and which ``chk-N`` folders are on disk; every way that can fail becomes one
:class:`ReportError` that names the directory and the problem. :class:`Timeline` puts
the recorded wall-clock times on the one axis that the page's plots and tables share.
The rest turns statistics into the words the page (and the figures' titles) use:
durations and times for people, the checkpointing mode, the critical path, and which
checkpoint the barrier diagram shows.

Nothing here draws or writes HTML: :mod:`cutline.report.figures` and
:mod:`cutline.report.html` do, from what this module reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cutline.runtime.checkpoint.layout import StorageError
from cutline.runtime.checkpoint.stats import (
    STATS_FOLDER,
    STATS_HISTORY,
    CheckpointStats,
    History,
    RestartInfo,
    RunInfo,
    critical_path,
    id_ranges,
)
from cutline.runtime.checkpoint.storage import CheckpointStorage

__all__ = [
    "Directory",
    "ReportError",
    "Timeline",
    "checkpoint_mode",
    "choose_checkpoint",
    "critical_path_text",
    "human_seconds",
    "human_utc",
    "read_directory",
]


class ReportError(Exception):
    """The report cannot be made (the message names the directory and the problem)."""


# --------------------------------------------------------------------------- formatting


def human_seconds(value: float) -> str:
    """A duration for people: ``12.3 ms``, ``4.56 s``, ``7.5 min``."""
    size = abs(value)
    if size < 1.0:
        return f"{value * 1000:.1f} ms"
    if size < 120.0:
        return f"{value:.2f} s"
    return f"{value / 60:.1f} min"


def human_utc(epoch: float) -> str:
    """A recorded wall-clock time (seconds since the epoch), in UTC to the millisecond."""
    if epoch <= 0:
        return "unknown"
    moment = datetime.fromtimestamp(epoch, UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d} UTC"


# ------------------------------------------------------------------------------ reading


@dataclass(frozen=True)
class Directory:
    """What the report is made of: the history, and the checkpoint folders on disk."""

    name: str
    history: History
    folders: list[int]
    """Ids of the ``chk-N`` folders on disk (complete or not)."""
    completed: list[int]
    """Ids of those with metadata (restorable, unless damaged)."""
    lost: list[int] = field(default_factory=list)
    """Ids of those without metadata whose statistics say they completed (it was lost)."""


def read_directory(checkpoint_dir: str, storage_options: dict[str, Any] | None) -> Directory:
    """Read ``checkpoint_dir``'s statistics; :class:`ReportError` when there are none."""
    name = str(checkpoint_dir)
    try:
        storage = CheckpointStorage(name, storage_options=storage_options)
    except StorageError as exc:
        raise ReportError(str(exc)) from None
    fs, root = storage.fs, storage.root
    try:
        if not fs.exists(root):
            raise ReportError(f"checkpoint directory {name!r} does not exist")
        if not fs.isdir(root):
            raise ReportError(
                f"{name!r} is a file, not a checkpoint directory (the folder a job's "
                "checkpoint_dir names)"
            )
        has_stats = bool(fs.isdir(f"{root}/{STATS_FOLDER}"))
        folders = storage.checkpoint_ids()
        if not has_stats and not folders:
            raise ReportError(
                f"{name!r} is not a cutline checkpoint directory: it has neither a "
                f"{STATS_FOLDER} folder nor chk-N checkpoint folders"
            )
        if not has_stats:
            raise ReportError(
                f"{name!r} has checkpoint folders (chk-N for N = {id_ranges(folders)}) but no "
                f"statistics: it was written by an older cutline, from before checkpoint "
                f"statistics were kept in {STATS_FOLDER}/ (run the job again with this version "
                "to get them)"
            )
        history = storage.read_history()
        completed = storage.completed_ids()
        lost = storage.completed_without_metadata()
    except StorageError as exc:
        raise ReportError(f"cannot read checkpoint directory {name!r}: {exc}") from None
    except OSError as exc:
        raise ReportError(
            f"cannot read checkpoint directory {name!r}: {exc.strerror or exc}"
        ) from None
    if not (history.checkpoints or history.runs or history.restarts):
        if history.unreadable:
            raise ReportError(
                f"none of the statistics in {name!r}/{STATS_FOLDER} can be read: "
                + "; ".join(history.unreadable)
            )
        raise ReportError(
            f"{name!r} has no statistics: its {STATS_FOLDER} folder holds no run, "
            "checkpoint or restart record"
        )
    return Directory(name, history, folders, completed, lost)


# --------------------------------------------------------------------------------- time


@dataclass(frozen=True)
class Timeline:
    """Places the recorded events on one axis: seconds after the first run started (or,
    without run records, after the first recorded trigger or failure)."""

    origin: float
    """Seconds since the epoch at x = 0."""
    runs: dict[str, RunInfo]
    from_runs: bool

    @classmethod
    def of(cls, history: History) -> Timeline:
        runs = {info.run: info for info in history.runs}
        if history.runs:
            return cls(min(info.started for info in history.runs), runs, True)
        times = [c.trigger_time for c in history.checkpoints if c.trigger_time > 0]
        times += [r.time for r in history.restarts if r.time > 0]
        return cls(min(times, default=0.0), runs, False)

    def _epoch(self, recorded: float, run: str, since_start: float) -> float:
        if recorded > 0:
            return recorded
        info = self.runs.get(run)
        return (info.started if info is not None else self.origin) + since_start

    def triggered(self, stats: CheckpointStats) -> float:
        """When ``stats`` was triggered, on the axis."""
        return self._epoch(stats.trigger_time, stats.run, stats.triggered_at) - self.origin

    def failed(self, restart: RestartInfo) -> float:
        """When the generation of ``restart`` failed, on the axis."""
        return self._epoch(restart.time, restart.run, restart.failed_at) - self.origin

    @property
    def label(self) -> str:
        start = "the first run started" if self.from_runs else "the first recorded event"
        return f"seconds since {start} ({human_utc(self.origin)})"


# ------------------------------------------------------------------- what the page says


def checkpoint_mode(stats: CheckpointStats) -> str:
    """The checkpointing mode, and how the checkpoint was taken where that differs: an
    aligned one whose alignment timed out went unaligned; the final checkpoint and
    savepoints are always aligned."""
    if stats.unaligned and stats.checkpointing != "unaligned":
        return f"{stats.checkpointing}, taken unaligned"
    if stats.checkpointing == "unaligned" and stats.subtasks and not stats.unaligned:
        return "unaligned, taken aligned"
    return stats.checkpointing


def critical_path_text(stats: CheckpointStats, run: RunInfo | None) -> str:
    """The critical path read from the source: ``a →[channel @ t] b``."""
    steps = list(reversed(critical_path(stats, run)))
    if not steps:
        return ""
    parts = [steps[0][0]]
    if steps[0][1] is not None:  # the sender is unknown: start from the channel
        first = stats.subtasks[steps[0][0]].barriers.get(steps[0][1], 0.0)
        parts = [f"[{steps[0][1]} @ {human_seconds(first)}] → {steps[0][0]}"]
    for name, channel in steps[1:]:
        arrival = stats.subtasks[name].barriers.get(channel or "", 0.0)
        parts.append(f" →[{channel} @ {human_seconds(arrival)}] {name}")
    return "".join(parts)


def choose_checkpoint(
    history: History, checkpoint: int | None, name: str
) -> CheckpointStats | None:
    """The checkpoint to draw: ``checkpoint``, or the slowest completed one (else the
    slowest one that a subtask acknowledged, else the slowest of all)."""
    if checkpoint is not None:
        chosen = history.checkpoint(checkpoint)
        if chosen is None:
            ids = [c.checkpoint_id for c in history.checkpoints]
            raise ReportError(
                f"checkpoint {checkpoint} has no statistics in {name!r}; the checkpoints "
                f"with statistics are {id_ranges(ids)}"
                + (
                    f" (only the newest {STATS_HISTORY} are kept)"
                    if ids and checkpoint < min(ids)
                    else ""
                )
            )
        return chosen
    for candidates in (
        [c for c in history.checkpoints if c.completed],
        [c for c in history.checkpoints if c.subtasks],
        history.checkpoints,
    ):
        if candidates:
            return max(candidates, key=lambda c: (c.duration, -c.checkpoint_id))
    return None
