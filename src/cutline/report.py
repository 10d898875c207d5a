"""The checkpoint report: one self-contained HTML page about a checkpoint directory.

``cutline report DIR -o report.html`` reads the statistics the driver keeps in
``DIR/_stats`` (``runtime/stats.py``) and writes a page that opens in any browser,
offline: no server, no scripts, no external stylesheets or fonts; the figures are
inline SVG. It shows

- the directory, its runs (start, parallelism, checkpointing mode, outcome) and totals
  (completed and aborted checkpoints, savepoints, restarts, folders on disk);
- the history over time: every checkpoint's end-to-end duration, its size (bytes it
  wrote, and the full size of its state), its longest alignment; aborted checkpoints
  as red crosses, restarts as vertical lines; each run named and every other one shaded,
  and the line of a series broken between runs (it never joins the last checkpoint of
  one run to the first of the next);
- a table of the checkpoints (the newest :data:`TABLE_ROWS`): status and why an aborted
  one was, duration, size, channel state, alignment, the slowest subtask and the
  critical path that made it the slowest (:func:`~cutline.runtime.checkpoint.stats.critical_path`),
  the savepoint folder;
- the restarts: which generation failed, when, why (the cause, traceback included), and
  what the next generation restored;
- the space-time diagram of one checkpoint's barriers (by default the slowest completed
  one), drawn from the recorded times in the style of the simulator's diagrams
  (``sim/diagram.py``);
- the statistics files that could not be read.

The same directory always gives the same page, byte for byte: it shows the times the runs
recorded, never the time it was made. Every text that comes from the files is escaped.

**The history figure** (x: seconds since the first run started) has three panels,
``duration``, ``size`` and ``alignment``. Its drawn elements carry these ``gid`` s (the
``id`` of their group in the SVG):

- ``durations``, ``sizes``, ``full-sizes``, ``alignments``: the completed checkpoints;
- ``aborted-durations``, ``aborted-sizes``, ``aborted-alignments``: the aborted ones;
- ``savepoints``: the savepoints (on the duration panel);
- ``restart-<run>-<generation>-<panel>`` for a restart's line on each panel, and
  ``restart-label-<run>-<generation>`` for its label;
- ``run-<run>-<panel>`` for the line where a run started, on each panel, and
  ``run-label-<run>`` for its name above the plots; ``run-span-<run>-<panel>`` for the
  shading of every other run (the second, the fourth, ...) on each panel;
- ``no-checkpoints`` for the note on a history without checkpoints.

**The barrier diagram** has one horizontal line per subtask (sources first, as the run
lists them), time along x in seconds (or milliseconds) after the trigger. Its drawn
elements carry these ``gid`` s:

- ``subtask-<name>`` (line) and ``subtask-label-<name>`` (label) for each subtask;
- ``barrier-<channel>`` for the barrier on a channel: a dashed arrow in the checkpoint's
  colour from the sender's ``forwarded_at`` to its arrival at the receiver (a short tick
  at the arrival when the sender's time is unknown);
- ``cut-<id>`` for the cut: the line through the points where the subtasks snapshotted;
- ``source-<name>`` for the star at a source's snapshot;
- ``alignment-<name>`` for an alignment (first barrier to snapshot), where there was one;
- ``async-<name>`` for the asynchronous part (snapshot to acknowledgement) and
  ``ack-<name>`` for the acknowledgement's mark;
- ``channel-state-<name>`` for the records in flight a subtask recorded (where non-zero);
- ``critical-path`` for the halo on the critical path;
- ``trigger`` and ``end`` for the trigger and the end (complete or aborted) of the
  checkpoint, ``trigger-label`` and ``end-label`` for their labels;
- ``no-acknowledgements`` for the note on a checkpoint nobody acknowledged.

Barrier arrivals and snapshots are each subtask's wall clock, acknowledgements the
driver's: on one machine they agree; on a cluster they are as good as the hosts' clock
synchronisation (an arrow may point backwards, and a time may be negative).
"""

from __future__ import annotations

import html
import io
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib as mpl
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch

from cutline import __version__
from cutline.runtime.checkpoint.stats import (
    STATS_FOLDER,
    STATS_HISTORY,
    CheckpointStats,
    History,
    RestartInfo,
    RunInfo,
    critical_path,
    human_bytes,
    id_ranges,
)
from cutline.runtime.checkpoint.storage import CheckpointStorage, StorageError
from cutline.sim.diagram import colour, cut_line, star, style

__all__ = [
    "TABLE_ROWS",
    "ReportError",
    "build_report",
    "checkpoint_figure",
    "history_figure",
    "write_report",
]

TABLE_ROWS = 200
"""Checkpoints listed in the table (the newest); the plots show every one."""

_SVG_METADATA: dict[str, str | None] = {"Date": None, "Creator": "cutline"}
"""No date and no version in the SVG: the same input gives the same page."""

_ABORTED_COLOUR = "#d62728"
_LINE_COLOUR = "0.55"
_RESTART_COLOUR = "0.25"
_RUN_COLOUR = "0.7"
_RUN_SHADE = "0.965"
_CRITICAL_COLOUR = "0.1"
_MAX_HEIGHT = 24.0
_PANELS = ("duration", "size", "alignment")


class ReportError(Exception):
    """The report cannot be made (the message names the directory and the problem)."""


# --------------------------------------------------------------------------- formatting


def _seconds(value: float) -> str:
    """A duration for people: ``12.3 ms``, ``4.56 s``, ``7.5 min``."""
    size = abs(value)
    if size < 1.0:
        return f"{value * 1000:.1f} ms"
    if size < 120.0:
        return f"{value:.2f} s"
    return f"{value / 60:.1f} min"


def _utc(epoch: float) -> str:
    """A recorded wall-clock time (seconds since the epoch), in UTC to the millisecond."""
    if epoch <= 0:
        return "unknown"
    moment = datetime.fromtimestamp(epoch, UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d} UTC"


def _e(text: object) -> str:
    """``text`` escaped for HTML (every text from the files goes through here)."""
    return html.escape(str(text), quote=True)


# ------------------------------------------------------------------------------ reading


@dataclass(frozen=True)
class _Directory:
    """What the report is made of: the history, and the checkpoint folders on disk."""

    name: str
    history: History
    folders: list[int]
    """Ids of the ``chk-N`` folders on disk (complete or not)."""
    completed: list[int]
    """Ids of those with metadata (restorable, unless damaged)."""
    lost: list[int] = field(default_factory=list)
    """Ids of those without metadata whose statistics say they completed (it was lost)."""


def _read(checkpoint_dir: str, storage_options: dict[str, Any] | None) -> _Directory:
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
    return _Directory(name, history, folders, completed, lost)


# --------------------------------------------------------------------------------- time


@dataclass(frozen=True)
class _Timeline:
    """Places the recorded events on one axis: seconds after the first run started (or,
    without run records, after the first recorded trigger or failure)."""

    origin: float
    """Seconds since the epoch at x = 0."""
    runs: dict[str, RunInfo]
    from_runs: bool

    @classmethod
    def of(cls, history: History) -> _Timeline:
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
        return f"seconds since {start} ({_utc(self.origin)})"


# -------------------------------------------------------------------------------- figures


def _svg(build: Callable[[], Figure], salt: str) -> str:
    """The figure ``build`` makes, as an ``<svg>`` element to put inside an HTML page.

    Built and saved in the diagrams' style (deterministic hashing, real ``<text>``). The
    ids matplotlib makes up (``figure_1``, clip paths, markers) get ``salt`` in front, so
    that two figures on one page never share an id; the ``gid`` s stay as they are.
    """
    buffer = io.BytesIO()
    with style(), mpl.rc_context({"svg.hashsalt": f"cutline-report-{salt}"}):
        fig = build()
        fig.savefig(buffer, format="svg", metadata=_SVG_METADATA)
    gids = {str(a.get_gid()) for a in fig.findobj() if a.get_gid() is not None}
    text = buffer.getvalue().decode("utf-8")
    text = text[text.index("<svg") :]
    renamed = {
        found: f"{salt}-{found}"
        for found in re.findall(r'\bid="([^"]+)"', text)
        if html.unescape(found) not in gids
    }

    def rename(match: re.Match[str]) -> str:
        new = renamed.get(match.group(2))
        return match.group(0) if new is None else match.group(1) + new

    return re.sub(r'(\bid="|#)([^"()\s#]+)(?=[")])', rename, text)


def _time_scale(span: float) -> tuple[float, str]:
    """Milliseconds for short times, seconds for long ones: the factor and the unit."""
    return (1000.0, "ms") if span < 2.0 else (1.0, "s")


def _size_scale(largest: float) -> tuple[float, str]:
    """The power of 1024 that suits sizes up to ``largest``: the factor and the unit."""
    for power, unit in ((3, "GiB"), (2, "MiB"), (1, "KiB")):
        if largest >= 1024**power:
            return 1.0 / 1024**power, unit
    return 1.0, "B"


def _run_spans(history: History, timeline: _Timeline) -> list[tuple[str, float, float]]:
    """Each run with a record or a checkpoint, in the order they started: ``(run, start,
    end)`` on the time axis, from its start (without a run record: its first checkpoint) to
    the next one's start (the last run: to its last checkpoint, restart or end)."""
    starts: dict[str, float] = {}
    last: dict[str, float] = {}
    for info in history.runs:
        starts[info.run] = info.started - timeline.origin
        if info.ended is not None:
            last[info.run] = info.ended - timeline.origin
    events = [(c.run, timeline.triggered(c)) for c in history.checkpoints]
    events += [(r.run, timeline.failed(r)) for r in history.restarts]
    for run, x in events:
        starts[run] = min(x, starts.get(run, x))
        last[run] = max(x, last.get(run, x))
    ordered = sorted(starts, key=lambda run: (starts[run], run))
    spans = []
    for i, run in enumerate(ordered):
        end = starts[ordered[i + 1]] if i + 1 < len(ordered) else last.get(run, starts[run])
        spans.append((run, starts[run], max(end, starts[run])))
    return spans


def history_figure(history: History) -> Figure:
    """The checkpoints of ``history`` over time: duration, size and alignment, with the
    aborted checkpoints, savepoints, restarts and run starts marked (``gid`` s: see the
    module's docstring). Build it inside :func:`cutline.sim.diagram.style` to get the
    diagrams' look."""
    timeline = _Timeline.of(history)
    checkpoints = history.checkpoints
    completed = [c for c in checkpoints if c.completed]
    aborted = [c for c in checkpoints if not c.completed]
    dense = len(checkpoints) > 200
    size = 2.5 if dense else 5.0

    fig = Figure(figsize=(11.0, 7.5), dpi=100, layout="constrained")
    axes = fig.subplots(3, 1, sharex=True)
    done = f"{len(completed)} completed, {len(aborted)} aborted"
    restarts = len(history.restarts)
    fig.suptitle(
        f"Checkpoint history: {len(checkpoints)} checkpoint{'s' if len(checkpoints) != 1 else ''} "
        f"({done}), {restarts} restart{'s' if restarts != 1 else ''}"
    )

    def series(
        ax: Axes,
        stats: Sequence[CheckpointStats],
        value: Callable[[CheckpointStats], float],
        scale: float,
        gid: str,
        label: str,
        colour_: Any,
        *,
        aborted_: bool = False,
        marker: str = "o",
    ) -> None:
        xs: list[float] = []
        ys: list[float] = []
        for i, c in enumerate(stats):
            if not aborted_ and i and c.run != stats[i - 1].run:
                xs.append(math.nan)  # a break: no line from one run's last point to the next's
                ys.append(math.nan)
            xs.append(timeline.triggered(c))
            ys.append(value(c) * scale)
        ax.add_line(
            Line2D(
                xs,
                ys,
                color=colour_,
                linestyle="none" if aborted_ else "-",
                linewidth=1.0,
                marker=marker,
                markersize=size + (1.5 if aborted_ else 0.0),
                markeredgewidth=1.4 if aborted_ else 0.5,
                markeredgecolor=colour_ if aborted_ else "white",
                zorder=4 if aborted_ else 3,
                label=label,
                gid=gid,
            )
        )

    duration, sizes, alignment = axes
    seconds, seconds_unit = _time_scale(max((c.duration for c in checkpoints), default=0.0))
    aligned, aligned_unit = _time_scale(max((c.alignment for c in checkpoints), default=0.0))
    largest = max((max(c.size, c.full_size) for c in checkpoints), default=0)
    bytes_, bytes_unit = _size_scale(largest)
    crosses: dict[str, Any] = {"aborted_": True, "marker": "x"}
    series(duration, completed, lambda c: c.duration, seconds, "durations", "completed", "C0")
    series(
        duration,
        aborted,
        lambda c: c.duration,
        seconds,
        "aborted-durations",
        "aborted",
        _ABORTED_COLOUR,
        **crosses,
    )
    savepoints = [c for c in completed if c.savepoint]
    duration.add_line(
        Line2D(
            [timeline.triggered(c) for c in savepoints],
            [c.duration * seconds for c in savepoints],
            color="black",
            linestyle="none",
            marker="D",
            markersize=size + 3.0,
            markerfacecolor="none",
            markeredgewidth=1.0,
            zorder=5,
            label="savepoint",
            gid="savepoints",
        )
    )
    series(sizes, completed, lambda c: c.full_size, bytes_, "full-sizes", "full size", "C1")
    series(sizes, completed, lambda c: c.size, bytes_, "sizes", "written", "C0")
    series(
        sizes,
        aborted,
        lambda c: c.size,
        bytes_,
        "aborted-sizes",
        "aborted",
        _ABORTED_COLOUR,
        **crosses,
    )
    series(alignment, completed, lambda c: c.alignment, aligned, "alignments", "completed", "C2")
    series(
        alignment,
        aborted,
        lambda c: c.alignment,
        aligned,
        "aborted-alignments",
        "aborted",
        _ABORTED_COLOUR,
        **crosses,
    )

    # where runs started, and where generations failed
    for number, info in enumerate(history.runs):
        x = info.started - timeline.origin
        for panel, ax in zip(_PANELS, axes, strict=True):
            ax.axvline(
                x,
                color=_RUN_COLOUR,
                linestyle=":",
                linewidth=1.0,
                zorder=1,
                label="run started" if panel == "duration" and number == 0 else None,
                gid=f"run-{info.run}-{panel}",
            )
    # each run: its name above the plots where it starts, and every other one shaded
    along = duration.get_xaxis_transform()
    for number, (run, start, end) in enumerate(_run_spans(history, timeline)):
        recorded = run in timeline.runs
        duration.text(
            start,
            1.0,
            f" run {run or '?'}" + ("" if recorded else " (no run record)"),
            transform=along,
            ha="left",
            va="bottom",
            fontsize=7,
            color="0.35",
            clip_on=False,
            gid=f"run-label-{run}",
        )
        if number % 2 == 1:
            for panel, ax in zip(_PANELS, axes, strict=True):
                ax.axvspan(
                    start,
                    end,
                    color=_RUN_SHADE,
                    linewidth=0,
                    zorder=0,
                    gid=f"run-span-{run}-{panel}",
                )
    restart_label = along
    for number, restart in enumerate(history.restarts):
        first = number == 0
        x = timeline.failed(restart)
        name = f"{restart.run}-{restart.generation}"
        for panel, ax in zip(_PANELS, axes, strict=True):
            ax.axvline(
                x,
                color=_RESTART_COLOUR,
                linestyle="--",
                linewidth=1.0,
                zorder=2,
                label="restart" if panel == "duration" and first else None,
                gid=f"restart-{name}-{panel}",
            )
        then = (
            f"→ chk {restart.restored_from}"
            if restart.restored_from is not None
            else ("→ the start" if restart.restarted else "(gave up)")
        )
        duration.text(
            x,
            0.98,
            f" g{restart.generation} failed {then}",
            transform=restart_label,
            rotation=90,
            ha="left",
            va="top",
            fontsize=7,
            color=_RESTART_COLOUR,
            gid=f"restart-label-{name}",
        )

    duration.set_ylabel(f"duration ({seconds_unit})")
    sizes.set_ylabel(f"size ({bytes_unit})")
    alignment.set_ylabel(f"longest alignment ({aligned_unit})")
    alignment.set_xlabel(timeline.label)
    for ax in axes:
        ax.relim()
        ax.autoscale_view()
        ax.set_ylim(bottom=0.0)
        ax.grid(True, color="0.92", linewidth=0.6)
        ax.set_axisbelow(True)
        for side in ("right", "top"):
            ax.spines[side].set_visible(False)
        shown = [
            line
            for line in ax.get_lines()
            if len(line.get_xdata()) and not str(line.get_label()).startswith("_")
        ]
        if shown:  # outside, on the right: a thousand checkpoints leave no room inside
            ax.legend(
                handles=shown,
                loc="upper left",
                bbox_to_anchor=(1.01, 1.0),
                frameon=False,
                fontsize=7.5,
            )
    if not checkpoints:
        duration.text(
            0.5,
            0.5,
            "no checkpoint was recorded",
            transform=duration.transAxes,
            ha="center",
            va="center",
            color="0.4",
            gid="no-checkpoints",
        )
    return fig


def _mode(stats: CheckpointStats) -> str:
    """The checkpointing mode, and how the checkpoint was taken where that differs: an
    aligned one whose alignment timed out went unaligned; the final checkpoint and
    savepoints are always aligned."""
    if stats.unaligned and stats.checkpointing != "unaligned":
        return f"{stats.checkpointing}, taken unaligned"
    if stats.checkpointing == "unaligned" and stats.subtasks and not stats.unaligned:
        return "unaligned, taken aligned"
    return stats.checkpointing


def _subtask_order(stats: CheckpointStats, run: RunInfo | None) -> list[str]:
    """The run's subtasks (sources first), then any others that acknowledged ``stats``
    (a missing run record: those without barriers, the sources, first)."""
    names = list(run.subtasks) if run is not None else []
    known = set(names)
    extra = [n for n in stats.subtasks if n not in known]
    extra.sort(key=lambda n: (bool(stats.subtasks[n].barriers), n))
    return names + extra


def _critical_segments(
    stats: CheckpointStats, run: RunInfo | None, ys: dict[str, float], scale: float
) -> list[list[tuple[float, float]]]:
    """The critical path as line segments: along each subtask from when its last barrier
    came (a source: the trigger) to when it sent the barrier on (the last one: to its
    acknowledgement), and along each channel from the sender to the receiver."""
    steps = list(reversed(critical_path(stats, run)))
    segments: list[list[tuple[float, float]]] = []
    for i, (name, channel) in enumerate(steps):
        sub = stats.subtasks.get(name)
        if sub is None or name not in ys:
            continue
        y = ys[name]
        start = sub.barriers.get(channel, 0.0) if channel is not None else 0.0
        if i + 1 < len(steps):
            end = sub.forwarded_at if sub.forwarded_at is not None else sub.snapshot_at
            next_name, next_channel = steps[i + 1]
            following = stats.subtasks.get(next_name)
            if following is not None and next_channel in following.barriers:
                arrival = following.barriers[next_channel]
                segments.append([(end * scale, y), (arrival * scale, ys[next_name])])
        else:
            end = sub.acknowledged
        low, high = min(start, end), max(start, end)
        segments.append([(low * scale, y), (high * scale, y)])
    return segments


def checkpoint_figure(stats: CheckpointStats, run: RunInfo | None) -> Figure:
    """The space-time diagram of the barriers of checkpoint ``stats`` (``run``: the run
    that took it, for its subtasks and channels; ``None`` if its record is missing), in the
    style of the simulator's diagrams (``gid`` s: see the module's docstring). Build it
    inside :func:`cutline.sim.diagram.style` to get their look."""
    names = _subtask_order(stats, run)
    n = max(1, len(names))
    ys = {name: float(len(names) - 1 - i) for i, name in enumerate(names)}
    ink = colour(stats.checkpoint_id)
    subs = stats.subtasks
    channels = dict(run.channels) if run is not None else {}
    receivers = {pair[1] for pair in channels.values() if len(pair) == 2}
    sources = [
        name
        for name in names
        if (run is not None and name not in receivers) or (name in subs and not subs[name].barriers)
    ]

    times = [0.0, stats.duration]
    for part in subs.values():
        times += [part.snapshot_at, part.acknowledged, *part.barriers.values()]
        if part.forwarded_at is not None:
            times.append(part.forwarded_at)
    low, high = min(times), max(times)
    scale, unit = _time_scale(high - low)
    pad = max(high - low, 1e-3) * 0.04
    left, right = (low - pad) * scale, (high + pad) * scale

    height = min(_MAX_HEIGHT, max(3.2, 1.7 + 0.6 * n))
    fig = Figure(figsize=(11.0, height), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    kind = "savepoint" if stats.savepoint else "checkpoint"
    extras = [stats.status, _mode(stats)]
    if stats.final:
        extras.append("final")
    ax.set_title(
        f"Barriers of {kind} {stats.checkpoint_id} ({', '.join(extras)}): "
        f"{_seconds(stats.duration)}, run {stats.run or '?'} generation {stats.generation}",
        pad=14.0,
    )
    ax.set_xlim(left, right)
    ax.set_ylim(-0.6, n - 0.4)
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    ax.set_xlabel(
        f"{unit} after the trigger (barriers, snapshots: each subtask's wall clock; "
        "acknowledgements: the driver's)"
    )
    ax.grid(True, axis="x", color="0.92", linewidth=0.6)
    ax.set_axisbelow(True)

    trigger = ax.axvline(0.0, color="0.35", linestyle="--", linewidth=1.0, zorder=1)
    trigger.set_gid("trigger")
    end = ax.axvline(
        stats.duration * scale,
        color=ink if stats.completed else _ABORTED_COLOUR,
        linestyle="-",
        linewidth=1.2,
        alpha=0.8,
        zorder=1,
    )
    end.set_gid("end")
    edge = ax.get_xaxis_transform()
    ax.text(
        0.0,
        1.0,
        " trigger",
        transform=edge,
        ha="left",
        va="bottom",
        fontsize=7,
        color="0.35",
        gid="trigger-label",
    )
    ax.text(
        stats.duration * scale,
        1.0,
        " complete" if stats.completed else " aborted",
        transform=edge,
        ha="left",
        va="bottom",
        fontsize=7,
        color=ink if stats.completed else _ABORTED_COLOUR,
        gid="end-label",
    )

    # subtask lines and labels
    label_transform = ax.get_yaxis_transform()
    font = 9 if n <= 16 else 7
    for name in names:
        y = ys[name]
        ax.add_line(
            Line2D(
                [left, right],
                [y, y],
                color=_LINE_COLOUR,
                linewidth=1.0,
                zorder=1,
                gid=f"subtask-{name}",
            )
        )
        acked = name in subs
        ax.text(
            -0.008,
            y,
            name if acked else f"{name} (no ack)",
            transform=label_transform,
            ha="right",
            va="center",
            fontsize=font,
            fontweight="bold" if acked else "normal",
            color="black" if acked else "0.5",
            gid=f"subtask-label-{name}",
        )

    # the critical path, a halo under everything on it
    segments = _critical_segments(stats, run, ys, scale)
    critical_channels = {c for _, c in critical_path(stats, run) if c is not None}
    halo = LineCollection(
        segments,
        colors=[_CRITICAL_COLOUR],
        linewidths=7.0,
        alpha=0.18,
        capstyle="round",
        zorder=2,
        label="critical path",
    )
    halo.set_gid("critical-path")
    ax.add_collection(halo)

    # alignments and asynchronous parts
    for name in names:
        sub = subs.get(name)
        if sub is None:
            continue
        y = ys[name]
        if sub.alignment > 0 and sub.barriers:
            first = min(sub.barriers.values())
            ax.add_line(
                Line2D(
                    [first * scale, sub.snapshot_at * scale],
                    [y, y],
                    color=ink,
                    alpha=0.35,
                    linewidth=6.0,
                    solid_capstyle="butt",
                    zorder=2,
                    gid=f"alignment-{name}",
                )
            )
        ax.add_line(
            Line2D(
                [sub.snapshot_at * scale, sub.acknowledged * scale],
                [y, y],
                color=ink,
                linewidth=1.0,
                linestyle=":",
                zorder=3,
                gid=f"async-{name}",
            )
        )

    # barriers: one arrow per channel, from the sender's forwarding to the arrival
    drawn: set[str] = set()
    for channel in sorted(channels):
        pair = channels[channel]
        if len(pair) != 2:
            continue
        sender, receiver = (subs.get(pair[0]), subs.get(pair[1]))
        if receiver is None or channel not in receiver.barriers:
            continue
        if sender is None or sender.forwarded_at is None or pair[0] not in ys:
            continue
        critical = channel in critical_channels
        ax.add_patch(
            FancyArrowPatch(
                (sender.forwarded_at * scale, ys[pair[0]]),
                (receiver.barriers[channel] * scale, ys[pair[1]]),
                arrowstyle="-|>",
                mutation_scale=8,
                color=ink,
                linewidth=1.6 if critical else 0.9,
                linestyle=(0, (4.0, 2.5)),
                shrinkA=1.5,
                shrinkB=1.5,
                zorder=4,
                gid=f"barrier-{channel}",
            )
        )
        drawn.add(channel)
    for name in names:  # arrivals whose sender's time is unknown: a tick at the arrival
        sub = subs.get(name)
        if sub is None:
            continue
        for channel in sorted(sub.barriers):
            if channel not in drawn:
                ax.add_line(
                    Line2D(
                        [sub.barriers[channel] * scale],
                        [ys[name]],
                        color=ink,
                        marker="|",
                        markersize=12,
                        markeredgewidth=1.4,
                        linestyle="none",
                        zorder=4,
                        gid=f"barrier-{channel}",
                    )
                )
                drawn.add(channel)

    # the cut through the snapshots, stars at the sources, the acknowledgements
    order = [name for name in names if name in subs]
    ax.add_line(
        cut_line(
            [subs[name].snapshot_at * scale for name in order],
            [ys[name] for name in order],
            ink,
            f"cut of checkpoint {stats.checkpoint_id}",
            f"cut-{stats.checkpoint_id}",
        )
    )
    for name in sources:
        if name in subs:
            ax.add_line(star(subs[name].snapshot_at * scale, ys[name], ink, f"source-{name}"))
    slowest = stats.slowest
    for name in order:
        sub = subs[name]
        last = slowest is not None and slowest.subtask == name
        ax.add_line(
            Line2D(
                [sub.acknowledged * scale],
                [ys[name]],
                color=ink,
                marker="D",
                markersize=6.5 if last else 5,
                markeredgecolor="black",
                markeredgewidth=1.2 if last else 0.5,
                linestyle="none",
                zorder=6,
                gid=f"ack-{name}",
            )
        )

    # records in flight each subtask recorded, next to its snapshot
    annotated = 0
    for name in order:
        sub = subs[name]
        if not sub.channel_state_records and not sub.channel_state_bytes:
            continue
        dy = 7.0 if annotated % 2 == 0 else -7.0
        annotated += 1
        ax.annotate(
            f"{sub.channel_state_records} in flight ({human_bytes(sub.channel_state_bytes)})",
            (sub.snapshot_at * scale, ys[name]),
            xytext=(5.0, dy),
            textcoords="offset points",
            ha="left",
            va="bottom" if dy > 0 else "top",
            fontsize=7,
            fontweight="bold",
            color=ink,
            zorder=7,
            gid=f"channel-state-{name}",
        )
    if not subs:
        ax.text(
            0.5,
            0.5,
            f"no subtask acknowledged checkpoint {stats.checkpoint_id}",
            transform=ax.transAxes,
            ha="center",
            va="center",
            color="0.4",
            gid="no-acknowledgements",
        )

    key = [
        Line2D([], [], color=ink, linewidth=0.9, linestyle=(0, (4.0, 2.5)), label="barrier"),
        Line2D([], [], color=ink, linewidth=6.0, alpha=0.35, label="alignment"),
        Line2D([], [], color=ink, linewidth=1.0, linestyle=":", label="snapshot to ack"),
        Line2D(
            [],
            [],
            color=ink,
            marker="*",
            markersize=11,
            markeredgecolor="black",
            markeredgewidth=0.6,
            linestyle="none",
            label="source",
        ),
        Line2D(
            [],
            [],
            color=ink,
            marker="D",
            markersize=5,
            markeredgecolor="black",
            markeredgewidth=0.5,
            linestyle="none",
            label="acknowledged",
        ),
        Line2D([], [], color=_CRITICAL_COLOUR, linewidth=7.0, alpha=0.18, label="critical path"),
        *[line for line in ax.get_lines() if str(line.get_gid()).startswith("cut-")],
    ]
    fig.legend(handles=key, loc="outside right upper", frameon=False)
    return fig


# ----------------------------------------------------------------------------------- page

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif;
       margin: 1.5em 2em; color: #222; line-height: 1.4; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
code, pre, .mono { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 0.9em; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ddd; padding: 0.2em 0.5em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
td.n { text-align: right; white-space: nowrap; }
tr.aborted td { background: #fdf0f0; }
tr.drawn td { background: #eef5fc; }
pre { white-space: pre-wrap; margin: 0; max-width: 80em; }
.note { color: #555; font-size: 0.9em; }
.warning { background: #fff6e0; border: 1px solid #e8c66a; padding: 0.5em 1em; }
figure { margin: 1em 0; }
svg { max-width: 100%; height: auto; }
dl.totals { display: grid; grid-template-columns: max-content auto; gap: 0.1em 1em; }
dl.totals dt { font-weight: bold; } dl.totals dd { margin: 0; }
"""


def _table(headers: Sequence[str], rows: Iterable[tuple[str, Sequence[str]]], ident: str) -> str:
    """An HTML table; ``rows`` are ``(row class, cells)`` with the cells already HTML."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    for cls, cells in rows:
        attr = f' class="{cls}"' if cls else ""
        body.append(f"<tr{attr}>" + "".join(cells) + "</tr>")
    return (
        f'<table id="{ident}"><thead><tr>{head}</tr></thead><tbody>\n'
        + "\n".join(body)
        + "\n</tbody></table>"
    )


def _td(text: object, *, number: bool = False) -> str:
    return f'<td class="n">{_e(text)}</td>' if number else f"<td>{_e(text)}</td>"


def _long(text: str, *, limit: int = 160) -> str:
    """A text from the files as a cell's HTML: short ones as they are, long or many-line
    ones (a traceback) folded under their first line."""
    first = text.splitlines()[0] if text else ""
    if len(text) <= limit and "\n" not in text:
        return f"<pre>{_e(text)}</pre>"
    summary = first if len(first) <= limit else first[:limit] + "…"
    return f"<details><summary><code>{_e(summary)}</code></summary><pre>{_e(text)}</pre></details>"


def _path_text(stats: CheckpointStats, run: RunInfo | None) -> str:
    """The critical path read from the source: ``a →[channel @ t] b``."""
    steps = list(reversed(critical_path(stats, run)))
    if not steps:
        return ""
    parts = [steps[0][0]]
    if steps[0][1] is not None:  # the sender is unknown: start from the channel
        first = stats.subtasks[steps[0][0]].barriers.get(steps[0][1], 0.0)
        parts = [f"[{steps[0][1]} @ {_seconds(first)}] → {steps[0][0]}"]
    for name, channel in steps[1:]:
        arrival = stats.subtasks[name].barriers.get(channel or "", 0.0)
        parts.append(f" →[{channel} @ {_seconds(arrival)}] {name}")
    return "".join(parts)


def _choose(history: History, checkpoint: int | None, name: str) -> CheckpointStats | None:
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


def _header(directory: _Directory, timeline: _Timeline) -> str:
    history = directory.history
    completed = [c for c in history.checkpoints if c.completed]
    aborted = [c for c in history.checkpoints if not c.completed]
    savepoints = [c for c in completed if c.savepoint]
    restarted = [r for r in history.restarts if r.restarted]
    gave_up = [r for r in history.restarts if not r.restarted]
    incomplete = sorted(set(directory.folders) - set(directory.completed) - set(directory.lost))
    totals = [
        ("checkpoints", f"{len(history.checkpoints)} with statistics"),
        ("completed", str(len(completed))),
        ("aborted", str(len(aborted))),
        ("savepoints", str(len(savepoints))),
        ("restarts", str(len(restarted))),
    ]
    if gave_up:
        totals.append(("failures not restarted", f"{len(gave_up)} (the job failed)"))
    totals.append(("complete checkpoint folders on disk", id_ranges(directory.completed)))
    if directory.lost:
        totals.append(
            (
                "completed, but their _metadata is missing (never restored from)",
                id_ranges(directory.lost),
            )
        )
    if incomplete:
        totals.append(("incomplete folders", id_ranges(incomplete)))
    totals_html = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in totals)

    rows = []
    for info in history.runs:
        length = _seconds(info.ended - info.started) if info.ended is not None else ""
        outcome = info.outcome if info.outcome is not None else "unknown (running, or died)"
        failed = not outcome.startswith("finished")
        rows.append(
            (
                "aborted" if failed else "",
                [
                    f"<td><code>{_e(info.run)}</code></td>",
                    _td(_utc(info.started)),
                    _td(length, number=True),
                    _td(info.parallelism, number=True),
                    _td(info.checkpointing),
                    _td(len(info.subtasks), number=True),
                    _td(info.restored_from or ""),
                    f"<td>{_long(outcome)}</td>",
                ],
            )
        )
    referenced = {c.run for c in history.checkpoints} | {r.run for r in history.restarts}
    for missing in sorted(referenced - set(timeline.runs)):
        rows.append(
            (
                "aborted",
                [
                    f"<td><code>{_e(missing or '?')}</code></td>",
                    '<td colspan="7">no run record (its file is missing or unreadable): '
                    "its subtasks and channels are unknown</td>",
                ],
            )
        )
    runs = _table(
        [
            "run",
            "started",
            "ran",
            "parallelism",
            "checkpointing",
            "subtasks",
            "restored from",
            "outcome",
        ],
        rows,
        "runs",
    )
    return (
        f'<section id="summary"><h2>Summary</h2><dl class="totals">{totals_html}</dl>'
        f"<h3>Runs</h3>{runs}</section>"
    )


def _checkpoint_table(history: History, timeline: _Timeline, drawn: int | None) -> str:
    checkpoints = history.checkpoints
    shown = sorted(checkpoints, key=lambda c: -c.checkpoint_id)[:TABLE_ROWS]
    rows = []
    for stats in shown:
        run = timeline.runs.get(stats.run)
        slowest = stats.slowest
        status = stats.status + (" (final)" if stats.final else "")
        mode = _mode(stats)
        channel_state = (
            f"{stats.channel_state_records} records, {human_bytes(stats.channel_state_bytes)}"
            if stats.channel_state_records or stats.channel_state_bytes
            else ""
        )
        classes = [] if stats.completed else ["aborted"]
        if stats.checkpoint_id == drawn:
            classes.insert(0, "drawn")
        cls = " ".join(classes)
        rows.append(
            (
                cls,
                [
                    _td(stats.checkpoint_id, number=True),
                    "<td>"
                    + _e(status)
                    + (f"<br>{_long(stats.reason, limit=80)}" if stats.reason else "")
                    + "</td>",
                    f"<td><code>{_e(stats.run or '?')}</code> g{_e(stats.generation)}</td>",
                    _td(f"{timeline.triggered(stats):.2f} s", number=True),
                    _td(_seconds(stats.duration), number=True),
                    _td(human_bytes(stats.size), number=True),
                    _td(human_bytes(stats.full_size), number=True),
                    _td(mode),
                    _td(channel_state, number=True),
                    _td(_seconds(stats.alignment), number=True),
                    _td(
                        f"{slowest.subtask} (ack {_seconds(slowest.acknowledged)})"
                        if slowest is not None
                        else "no acknowledgement"
                    ),
                    f'<td class="mono">{_e(_path_text(stats, run))}</td>',
                    _td(stats.savepoint or ""),
                ],
            )
        )
    note = ""
    if len(checkpoints) > TABLE_ROWS:
        note = (
            f'<p class="note">The newest {TABLE_ROWS} of {len(checkpoints)} checkpoints '
            f"(ids {_e(id_ranges(c.checkpoint_id for c in shown))}); the plots above show "
            "all of them.</p>"
        )
    table = _table(
        [
            "id",
            "status",
            "run",
            "triggered",
            "duration",
            "written",
            "full size",
            "mode",
            "channel state",
            "alignment",
            "slowest subtask",
            "critical path (source → slowest)",
            "savepoint",
        ],
        rows,
        "checkpoints",
    )
    return (
        '<section id="checkpoint-table"><h2>Checkpoints</h2>'
        '<p class="note">Newest first. <em>triggered</em>: seconds on the plots\' axis; '
        "<em>written</em>: state files and new keyed state segments; <em>full size</em>: "
        "everything the checkpoint is made of; <em>alignment</em>: the longest of any subtask; "
        "<em>critical path</em>: from a source, through the input whose barrier came last at "
        f"each subtask, to the subtask acknowledged last.</p>{note}{table}</section>"
    )


def _restart_table(history: History, timeline: _Timeline) -> str:
    if not history.restarts:
        return '<section id="restarts"><h2>Restarts</h2><p>No restarts.</p></section>'
    rows = []
    for restart in history.restarts:
        if restart.restored_from is not None:
            then = f"restarted from checkpoint {restart.restored_from}"
        elif restart.restarted:
            then = "restarted from the start"
        else:
            then = "not restarted: the restart strategy gave up, the job failed"
        rows.append(
            (
                "" if restart.restarted else "aborted",
                [
                    f"<td><code>{_e(restart.run or '?')}</code></td>",
                    _td(restart.generation, number=True),
                    _td(f"{timeline.failed(restart):.2f} s", number=True),
                    _td(_utc(restart.time)),
                    f"<td>{_long(restart.cause)}</td>",
                    _td(then),
                ],
            )
        )
    table = _table(
        ["run", "failed generation", "at", "time", "cause", "then"], rows, "restart-table"
    )
    return f'<section id="restarts"><h2>Restarts</h2>{table}</section>'


def _diagram_section(timeline: _Timeline, chosen: CheckpointStats | None, why: str) -> str:
    if chosen is None:
        return '<section id="diagram"><h2>Barriers</h2><p>No checkpoint to draw.</p></section>'
    run = timeline.runs.get(chosen.run)
    svg = _svg(lambda: checkpoint_figure(chosen, run), "diagram")
    missing = (
        '<p class="warning">The record of the run that took it is missing: its channels '
        "are unknown, so barriers show as ticks where they arrived.</p>"
        if run is None
        else ""
    )
    return (
        f'<section id="diagram"><h2>Barriers of checkpoint {_e(chosen.checkpoint_id)}</h2>'
        f'<p class="note">{_e(why)}. One line per subtask, sources first. A dashed arrow is a '
        "barrier, from when the sender sent it on to when it reached the receiver; the thick "
        "line through the dots is the cut (where each subtask took its snapshot), a star marks "
        "a source, a diamond the acknowledgement reaching the driver (the larger one: the last). "
        "The grey halo is the critical path. Barrier and snapshot times are each subtask's "
        "wall clock: across hosts, clock skew can make them negative or arrows run "
        f"backwards.</p>{missing}<figure>{svg}</figure></section>"
    )


def build_report(
    checkpoint_dir: str,
    *,
    checkpoint: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> str:
    """The HTML report of the checkpoint directory ``checkpoint_dir`` (a local path or an
    fsspec URL, opened with ``storage_options``), one self-contained page.

    ``checkpoint`` is the checkpoint whose barriers the diagram shows (default: the slowest
    completed one). :class:`ReportError` when the directory does not exist, is not a
    checkpoint directory, holds no statistics (written by an older cutline), or
    ``checkpoint`` has none (the message lists those that do).
    """
    directory = _read(checkpoint_dir, storage_options)
    history = directory.history
    chosen = _choose(history, checkpoint, directory.name)
    timeline = _Timeline.of(history)
    title = f"cutline checkpoint report: {directory.name}"
    plots = _svg(lambda: history_figure(history), "history")
    if checkpoint is not None:
        why = "As asked"
    elif chosen is not None and chosen.completed:
        why = "The slowest completed checkpoint"
    else:
        why = "No checkpoint completed: the slowest one"
    diagram = _diagram_section(timeline, chosen, why)
    unreadable = ""
    if history.unreadable:
        items = "".join(f"<li><code>{_e(u)}</code></li>" for u in history.unreadable)
        unreadable = (
            '<section id="unreadable"><h2>Unreadable statistics files</h2>'
            f'<div class="warning"><p>{len(history.unreadable)} file(s) in '
            f"<code>{_e(STATS_FOLDER)}</code> could not be read and are left out of this "
            f"report:</p><ul>{items}</ul></div></section>"
        )
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f'<meta name="generator" content="cutline {_e(__version__)}">',
        f"<title>{_e(title)}</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body>",
        "<h1>Checkpoint report</h1>",
        f'<p class="mono" id="directory">{_e(directory.name)}</p>',
        unreadable,
        _header(directory, timeline),
        '<section id="history"><h2>History</h2>'
        f'<p class="note">x: {_e(timeline.label)}, at each checkpoint\'s trigger. Red crosses: '
        "aborted checkpoints; dashed lines: restarts (the generation that failed, and what the "
        f"next one restored); dotted lines: runs starting (each run is named above the "
        "plots, every other one shaded, and the lines break between runs).</p>"
        f"<figure>{plots}</figure>"
        "</section>",
        _checkpoint_table(history, timeline, chosen.checkpoint_id if chosen else None),
        _restart_table(history, timeline),
        diagram,
        f'<p class="note">Made by cutline {_e(__version__)} from the statistics in '
        f"<code>{_e(STATS_FOLDER)}</code>.</p>",
        "</body>",
        "</html>",
    ]
    return "\n".join(p for p in parts if p) + "\n"


def write_report(
    checkpoint_dir: str,
    output: str | Path,
    *,
    checkpoint: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Path:
    """Write the report of ``checkpoint_dir`` (see :func:`build_report`) to ``output``
    and return its path. Nothing is written when the report cannot be made."""
    page = build_report(checkpoint_dir, checkpoint=checkpoint, storage_options=storage_options)
    path = Path(output)
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise ReportError(
            f"cannot write the report to {str(path)!r}: {exc.strerror or exc}"
        ) from None
    return path
