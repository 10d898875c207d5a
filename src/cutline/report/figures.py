"""The report's figures: the checkpoint history and one checkpoint's barriers, in matplotlib.

Both are built from what :mod:`cutline.report.data` read, with the lanes, arrows, cuts
and colours of :mod:`cutline.drawing` (so the barrier diagram looks like the simulator's
space-time diagrams), and become inline SVG for the page through :func:`inline_svg`.

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
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from matplotlib.axes import Axes
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from cutline import drawing
from cutline.report.data import Timeline, checkpoint_mode, human_seconds
from cutline.runtime.checkpoint.stats import (
    CheckpointStats,
    History,
    RunInfo,
    critical_path,
    human_bytes,
)

__all__ = ["checkpoint_figure", "history_figure", "inline_svg"]

_ABORTED_COLOUR = "#d62728"
_RESTART_COLOUR = "0.25"
_RUN_COLOUR = "0.7"
_RUN_SHADE = "0.965"
_CRITICAL_COLOUR = "0.1"
_MAX_HEIGHT = 24.0
_PANELS = ("duration", "size", "alignment")

_DIAMOND: dict[str, Any] = {"marker": "D", "markeredgecolor": "black", "linestyle": "none"}
"""How an acknowledgement is drawn, on the plot and in the key."""


def inline_svg(build: Callable[[], Figure], salt: str) -> str:
    """The figure ``build`` makes, as an ``<svg>`` element to put inside an HTML page.

    Built and saved in :func:`cutline.drawing.style` (deterministic hashing, real
    ``<text>``). The ids matplotlib makes up (``figure_1``, clip paths, markers) get
    ``salt`` in front, so that two figures on one page never share an id; the ``gid`` s
    stay as they are.
    """
    with drawing.style(f"cutline-report-{salt}"):
        fig = build()
        data = drawing.save(fig, "svg")
    gids = {str(a.get_gid()) for a in fig.findobj() if a.get_gid() is not None}
    text = data.decode("utf-8")
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


def _run_spans(history: History, timeline: Timeline) -> list[tuple[str, float, float]]:
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


def _across(axes: Sequence[Axes], x: float, gid: str, label: str | None, **line: Any) -> None:
    """A vertical line at time ``x`` on every panel of the history (``gid-<panel>``), with
    ``label`` in the key of the first panel."""
    for panel, ax in zip(_PANELS, axes, strict=True):
        ax.axvline(
            x,
            linewidth=1.0,
            label=label if panel == "duration" else None,
            gid=f"{gid}-{panel}",
            **line,
        )


def _above(ax: Axes, x: float, text: str, colour_: Any, gid: str, **extra: Any) -> None:
    """A small label just above the plot, starting at time ``x``."""
    ax.text(
        x,
        1.0,
        text,
        transform=ax.get_xaxis_transform(),
        ha="left",
        va="bottom",
        fontsize=7,
        color=colour_,
        gid=gid,
        **extra,
    )


def history_figure(history: History) -> Figure:
    """The checkpoints of ``history`` over time: duration, size and alignment, with the
    aborted checkpoints, savepoints, restarts and run starts marked (``gid`` s: see the
    module's docstring). Build it inside :func:`cutline.drawing.style` to get the
    diagrams' look."""
    timeline = Timeline.of(history)
    checkpoints = history.checkpoints
    completed = [c for c in checkpoints if c.completed]
    aborted = [c for c in checkpoints if not c.completed]
    dense = len(checkpoints) > 200
    size = 2.5 if dense else 5.0

    fig = drawing.figure(11.0, 7.5)
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
        crosses: bool = False,
    ) -> None:
        """One series on ``ax``: a line through the points of ``stats``, broken between
        runs, or (``crosses``: the aborted checkpoints) a cross at each point."""
        xs: list[float] = []
        ys: list[float] = []
        for i, c in enumerate(stats):
            if not crosses and i and c.run != stats[i - 1].run:
                xs.append(math.nan)  # a break: no line from one run's last point to the next's
                ys.append(math.nan)
            xs.append(timeline.triggered(c))
            ys.append(value(c) * scale)
        ax.add_line(
            Line2D(
                xs,
                ys,
                color=colour_,
                linestyle="none" if crosses else "-",
                linewidth=1.0,
                marker="x" if crosses else "o",
                markersize=size + (1.5 if crosses else 0.0),
                markeredgewidth=1.4 if crosses else 0.5,
                markeredgecolor=colour_ if crosses else "white",
                zorder=4 if crosses else 3,
                label=label,
                gid=gid,
            )
        )

    duration, sizes, alignment = axes
    seconds, seconds_unit = _time_scale(max((c.duration for c in checkpoints), default=0.0))
    aligned, aligned_unit = _time_scale(max((c.alignment for c in checkpoints), default=0.0))
    largest = max((max(c.size, c.full_size) for c in checkpoints), default=0)
    bytes_, bytes_unit = _size_scale(largest)
    # each panel: the completed checkpoints' series, then the last series' values of the
    # aborted ones, as crosses
    for ax, scale, lines in (
        (duration, seconds, [(lambda c: c.duration, "durations", "completed", "C0")]),
        (
            sizes,
            bytes_,
            [
                (lambda c: c.full_size, "full-sizes", "full size", "C1"),
                (lambda c: c.size, "sizes", "written", "C0"),
            ],
        ),
        (alignment, aligned, [(lambda c: c.alignment, "alignments", "completed", "C2")]),
    ):
        for value, gid, label, ink in lines:
            series(ax, completed, value, scale, gid, label, ink)
        value, gid, _, _ = lines[-1]
        series(
            ax, aborted, value, scale, f"aborted-{gid}", "aborted", _ABORTED_COLOUR, crosses=True
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

    # where runs started, and where generations failed
    for number, info in enumerate(history.runs):
        _across(
            axes,
            info.started - timeline.origin,
            f"run-{info.run}",
            "run started" if number == 0 else None,
            color=_RUN_COLOUR,
            linestyle=":",
            zorder=1,
        )
    # each run: its name above the plots where it starts, and every other one shaded
    along = duration.get_xaxis_transform()
    for number, (run, start, end) in enumerate(_run_spans(history, timeline)):
        recorded = run in timeline.runs
        _above(
            duration,
            start,
            f" run {run or '?'}" + ("" if recorded else " (no run record)"),
            "0.35",
            f"run-label-{run}",
            clip_on=False,
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
    for number, restart in enumerate(history.restarts):
        x = timeline.failed(restart)
        name = f"{restart.run}-{restart.generation}"
        _across(
            axes,
            x,
            f"restart-{name}",
            "restart" if number == 0 else None,
            color=_RESTART_COLOUR,
            linestyle="--",
            zorder=2,
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
            transform=along,
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
    inside :func:`cutline.drawing.style` to get their look."""
    names = _subtask_order(stats, run)
    n = max(1, len(names))
    ys = drawing.lane_heights(names)
    ink = drawing.colour(stats.checkpoint_id)
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
    fig = drawing.figure(11.0, height)
    ax = fig.add_subplot()
    kind = "savepoint" if stats.savepoint else "checkpoint"
    extras = [stats.status, checkpoint_mode(stats)]
    if stats.final:
        extras.append("final")
    ax.set_title(
        f"Barriers of {kind} {stats.checkpoint_id} ({', '.join(extras)}): "
        f"{human_seconds(stats.duration)}, run {stats.run or '?'} generation {stats.generation}",
        pad=14.0,
    )
    drawing.lane_axes(ax, n, left, right)
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
    _above(ax, 0.0, " trigger", "0.35", "trigger-label")
    _above(
        ax,
        stats.duration * scale,
        " complete" if stats.completed else " aborted",
        ink if stats.completed else _ABORTED_COLOUR,
        "end-label",
    )

    # subtask lanes, those that did not acknowledge in grey
    font = 9 if n <= 16 else 7
    for name in names:
        acked = name in subs
        drawing.lane(
            ax,
            ys[name],
            name if acked else f"{name} (no ack)",
            gid=f"subtask-{name}",
            label_gid=f"subtask-label-{name}",
            fontsize=font,
            muted=not acked,
        )

    # the critical path, a halo under everything on it
    segments = _critical_segments(stats, run, ys, scale)
    critical_channels = {c for _, c in critical_path(stats, run) if c is not None}
    path = LineCollection(
        segments,
        colors=[_CRITICAL_COLOUR],
        linewidths=7.0,
        alpha=0.18,
        capstyle="round",
        zorder=2,
        label="critical path",
    )
    path.set_gid("critical-path")
    ax.add_collection(path)

    # alignments and asynchronous parts
    for name in names:
        sub = subs.get(name)
        if sub is None:
            continue
        y = ys[name]
        if sub.alignment > 0 and sub.barriers:
            first = min(sub.barriers.values())
            ax.add_line(
                drawing.halo(
                    [first * scale, sub.snapshot_at * scale],
                    [y, y],
                    ink,
                    width=6.0,
                    gid=f"alignment-{name}",
                    capstyle="butt",
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
            drawing.arrow(
                (sender.forwarded_at * scale, ys[pair[0]]),
                (receiver.barriers[channel] * scale, ys[pair[1]]),
                ink,
                linewidth=1.6 if critical else 0.9,
                zorder=4,
                gid=f"barrier-{channel}",
                dashed=True,
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
        drawing.cut_line(
            [subs[name].snapshot_at * scale for name in order],
            [ys[name] for name in order],
            ink,
            f"cut of checkpoint {stats.checkpoint_id}",
            f"cut-{stats.checkpoint_id}",
        )
    )
    for name in sources:
        if name in subs:
            ax.add_line(
                drawing.star(subs[name].snapshot_at * scale, ys[name], ink, f"source-{name}")
            )
    slowest = stats.slowest
    for name in order:
        sub = subs[name]
        last = slowest is not None and slowest.subtask == name
        ax.add_line(
            Line2D(
                [sub.acknowledged * scale],
                [ys[name]],
                color=ink,
                markersize=6.5 if last else 5,
                markeredgewidth=1.2 if last else 0.5,
                zorder=6,
                gid=f"ack-{name}",
                **_DIAMOND,
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
        drawing.dashed_key(ink, "barrier"),
        Line2D([], [], color=ink, linewidth=6.0, alpha=0.35, label="alignment"),
        Line2D([], [], color=ink, linewidth=1.0, linestyle=":", label="snapshot to ack"),
        drawing.star_key(ink, "source"),
        Line2D(
            [], [], color=ink, markersize=5, markeredgewidth=0.5, label="acknowledged", **_DIAMOND
        ),
        Line2D([], [], color=_CRITICAL_COLOUR, linewidth=7.0, alpha=0.18, label="critical path"),
    ]
    drawing.legend(fig, ax, key)
    return fig
