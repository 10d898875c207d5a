"""The report's history figure: the checkpoints of a directory over time.

The figure (x: seconds since the first run started) has three panels,
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
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from cutline import drawing
from cutline.report.data import Timeline
from cutline.report.figures import ABORTED_COLOUR, above, time_scale
from cutline.runtime.checkpoint.stats import CheckpointStats, History

_RESTART_COLOUR = "0.25"
_RUN_COLOUR = "0.7"
_RUN_SHADE = "0.965"
_PANELS = ("duration", "size", "alignment")


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
    seconds, seconds_unit = time_scale(max((c.duration for c in checkpoints), default=0.0))
    aligned, aligned_unit = time_scale(max((c.alignment for c in checkpoints), default=0.0))
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
        series(ax, aborted, value, scale, f"aborted-{gid}", "aborted", ABORTED_COLOUR, crosses=True)
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
        above(
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
