"""The report's barrier diagram: one checkpoint's barriers through the subtasks.

The diagram has one horizontal line per subtask (sources first, as the run
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

from typing import Any

from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from cutline import drawing
from cutline.report.data import checkpoint_mode, human_seconds
from cutline.report.figures import ABORTED_COLOUR, above, time_scale
from cutline.runtime.checkpoint.stats import CheckpointStats, RunInfo, critical_path, human_bytes

_CRITICAL_COLOUR = "0.1"
_MAX_HEIGHT = 24.0

_DIAMOND: dict[str, Any] = {"marker": "D", "markeredgecolor": "black", "linestyle": "none"}
"""How an acknowledgement is drawn, on the plot and in the key."""


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
    scale, unit = time_scale(high - low)
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
        color=ink if stats.completed else ABORTED_COLOUR,
        linestyle="-",
        linewidth=1.2,
        alpha=0.8,
        zorder=1,
    )
    end.set_gid("end")
    above(ax, 0.0, " trigger", "0.35", "trigger-label")
    above(
        ax,
        stats.duration * scale,
        " complete" if stats.completed else " aborted",
        ink if stats.completed else ABORTED_COLOUR,
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
