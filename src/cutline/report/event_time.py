"""The report's event time: each operator's watermark over the run, and how fast event time went.

A watermark's lag behind the wall clock says how late a live stream is; for input replayed
from files (yesterday's clicks read in a minute) it says only how old the data is. What
means something then is the **rate**: milliseconds of event time the watermark moved per
second of wall clock between two checkpoints (``41.3 min/s``: a minute of wall clock reads
41 hours of the input; ``1.00 s/s``: the job keeps pace with a live stream).

The figure (:func:`watermark_figure`) draws each chain's watermark (the least of its
subtasks') at every checkpoint against the seconds since the first run started, in UTC
dates on the y axis. Its drawn elements carry these ``gid`` s: ``watermark-<chain>`` (a
chain's line), ``end-<chain>`` (the mark where its input ended: every later watermark is
the end, not a time), ``no-watermarks`` (the note on a history without any).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from datetime import UTC, datetime

from matplotlib.figure import Figure

from cutline import drawing
from cutline.protocol.watermarks import MAX_WATERMARK
from cutline.report.data import Timeline
from cutline.runtime.checkpoint.stats import CheckpointStats, History

__all__ = ["event_rates", "human_rate", "shown_checkpoint", "timed", "watermark_figure"]


def timed(history: History) -> list[CheckpointStats]:
    """The completed checkpoints that have event time (a watermark or event-time figures)."""
    return [c for c in history.checkpoints if c.completed and (c.watermarks() or c.event_time())]


def shown_checkpoint(checkpoints: Sequence[CheckpointStats]) -> CheckpointStats:
    """The checkpoint whose watermarks to show: the newest taken before the input ended (one
    of its watermarks is a time, not the end), else the newest."""
    for stats in reversed(checkpoints):
        if any(w < MAX_WATERMARK for w in stats.watermarks().values()):
            return stats
    return checkpoints[-1]


def event_rates(checkpoints: Sequence[CheckpointStats]) -> dict[int, dict[str, float]]:
    """Per checkpoint id, per chain: milliseconds of event time its watermark moved per
    second of wall clock since the checkpoint before (of the same run, both watermarks times,
    not the end)."""
    rates: dict[int, dict[str, float]] = {}
    for before, after in itertools.pairwise(checkpoints):
        seconds = after.trigger_time - before.trigger_time
        if after.run != before.run or seconds <= 0:
            continue
        old, new = before.watermarks(), after.watermarks()
        found = {
            chain: (new[chain] - old[chain]) / seconds
            for chain in new.keys() & old.keys()
            if MAX_WATERMARK not in (new[chain], old[chain]) and min(new[chain], old[chain]) > 0
        }
        if found:
            rates[after.checkpoint_id] = found
    return rates


def human_rate(ms_per_s: float) -> str:
    """Event time per second of wall clock: ``0.98 s/s``, ``41.3 min/s``, ``23.2 h/s``."""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000)):
        if abs(ms_per_s) >= 2 * size:
            return f"{ms_per_s / size:.1f} {unit}/s"
    return f"{ms_per_s / 1000:.2f} s/s"


def _utc(seconds: float, _position: object = None) -> str:
    """A y tick: epoch seconds as a UTC date and time."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")


def watermark_figure(history: History) -> Figure:
    """Each chain's watermark at every checkpoint, over the run (``gid`` s: see the
    module's docstring). Build it inside :func:`cutline.drawing.style`."""
    timeline = Timeline.of(history)
    checkpoints = timed(history)
    fig = drawing.figure(11.0, 3.8)
    ax = fig.subplots()
    ax.set_xlabel("seconds since the first run started (checkpoint triggered)")
    ax.set_ylabel("watermark (UTC)")
    chains = sorted({chain for c in checkpoints for chain in c.watermarks()})
    if not chains:
        ax.text(0.5, 0.5, "no watermarks recorded", ha="center", gid="no-watermarks")
        return fig
    for index, chain in enumerate(chains):
        xs: list[float] = []
        ys: list[float] = []
        ended: float | None = None
        for i, stats in enumerate(checkpoints):
            watermark = stats.watermarks().get(chain)
            if watermark is None:
                continue
            if watermark >= MAX_WATERMARK:
                ended = timeline.triggered(stats) if ended is None else ended
                continue
            if i and stats.run != checkpoints[i - 1].run:
                xs.append(math.nan)  # (a break between runs)
                ys.append(math.nan)
            xs.append(timeline.triggered(stats))
            ys.append(watermark / 1000)
        colour = drawing.colour(index)
        ax.plot(
            xs, ys, marker="o", markersize=3, color=colour, label=chain, gid=f"watermark-{chain}"
        )
        if ended is not None:
            ax.axvline(ended, color=colour, linestyle=":", gid=f"end-{chain}")
    ax.yaxis.set_major_formatter(_utc)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    fig.suptitle("Watermarks over the run (a dotted line: the input ended)")
    return fig
