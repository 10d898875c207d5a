"""The progress of ``execute()`` on standard error.

In a terminal, a live display (rich): one table of the job's operators (records in and out,
throughput, backpressure) under a line with the elapsed time and generation, and the last
checkpoints and restarts below it, redrawn four times a second. When standard error is not a
terminal (a log file, a pipe, a notebook's captured output), one line per event instead
(:class:`ProgressLines`: every checkpoint, abort, restart, warning). ``execute(progress=True)``
forces the live display, ``progress=False`` keeps it all quiet. The same figures are in
``JobResult.metrics`` after the run.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from cutline.protocol.watermarks import MAX_WATERMARK
from cutline.runtime.checkpoint.stats import human_bytes
from cutline.runtime.driver.metrics import JobMetrics

_LEVEL_STYLE = {"high": "bold red", "low": "yellow", "ok": "green"}


def _count(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f}{unit}"
    return f"{n:.0f}"


def watermark_time(watermark: int | None) -> str:
    """A watermark for people: its UTC time of day (``-``: none; ``end``: the input ended)."""
    if watermark is None:
        return "-"
    if watermark >= MAX_WATERMARK:
        return "end"
    seconds, ms = divmod(watermark, 1000)
    return time.strftime("%H:%M:%S", time.gmtime(seconds)) + f".{ms:03d}"


def watermark_lag(lag: float | None) -> str:
    """How far a watermark is behind the wall clock, for people (``-``: none)."""
    if lag is None:
        return "-"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if lag >= size:
            return f"{lag / size:.1f} {unit}"
    return f"{lag:.1f} s"


def render(metrics: JobMetrics, title: str = "cutline") -> Group:
    """The display of ``metrics`` (a rich renderable)."""
    header = Text.assemble(
        (f"{title} ", "bold"),
        f"running {metrics.elapsed:.1f} s · generation {metrics.generation}",
        (f" · backpressured: {', '.join(metrics.backpressured)}" if metrics.backpressured else ""),
        (
            " · late records: " + ", ".join(f"{n} {c:,}" for n, c in metrics.late.items())
            if metrics.late
            else ""
        ),
        (
            (
                " · skipped: " + ", ".join(f"{n} {c:,}" for n, c in metrics.skipped.items()),
                "yellow",
            )
            if metrics.skipped
            else ""
        ),
    )
    timed = metrics.event_time
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column, justify in (
        ("operator", "left"),
        ("records in", "right"),
        ("records out", "right"),
        ("in/s", "right"),
        ("out/s", "right"),
        ("backpressured", "right"),
        *(
            (("watermark", "right"), ("lag", "right"), ("late", "right"), ("windows", "right"))
            if timed
            else ()
        ),
    ):
        table.add_column(column, justify=justify)
    for op in metrics.operators:
        level = op.backpressure
        cells: list[str | Text] = [
            op.name,
            _count(op.records_in),
            _count(op.records_out),
            _count(op.rate_in),
            _count(op.rate_out),
            Text(f"{op.backpressured:.0%} {level}", style=_LEVEL_STYLE[level]),
        ]
        if timed:
            cells += [
                watermark_time(op.watermark),
                watermark_lag(op.watermark_lag(metrics.at)),
                _count(op.late) if op.late else "",
                _count(op.windows) if op.windows else "",
            ]
        table.add_row(*cells)
    lines: list[Text | Table] = [header, table]
    for stats in metrics.checkpoints[-3:]:
        what = "savepoint" if stats.savepoint else "checkpoint"
        if stats.completed:
            behind = stats.waited_behind
            lines.append(
                Text(
                    f"{what} {stats.checkpoint_id}: {stats.duration:.2f} s, "
                    f"{human_bytes(stats.size)}"
                    + (f", barrier behind {behind[2]:,} records" if behind else "")
                    + (
                        f", {stats.channel_state_records} records in flight"
                        if stats.unaligned
                        else ""
                    )
                    + (f", alignment {stats.alignment:.2f} s" if stats.alignment >= 0.005 else ""),
                    style="dim",
                )
            )
        else:
            lines.append(
                Text(f"{what} {stats.checkpoint_id} aborted: {stats.reason}", style="yellow")
            )
    if metrics.waiting is not None:
        lines.append(Text(metrics.waiting, style="yellow"))
    for restart in metrics.restarts[-2:]:
        cause = restart.cause.splitlines()[0] if restart.cause else ""
        lines.append(
            Text(
                f"restart after generation {restart.generation} ({restart.failed_at:.1f} s): "
                f"{cause[:120]}",
                style="red",
            )
        )
    return Group(*lines)


class LiveProgress:
    """A context manager showing the figures handed to :meth:`update` (rich ``Live``)."""

    def __init__(self, console: Console | None = None, title: str = "cutline") -> None:
        self.console = console or Console(stderr=True)
        self.title = title
        self._live: Live | None = None
        self.last: JobMetrics | None = None

    def __enter__(self) -> LiveProgress:
        self._live = Live(
            Text(f"{self.title}: starting"),
            console=self.console,
            refresh_per_second=4,
            transient=False,
        )
        self._live.__enter__()
        return self

    def update(self, metrics: JobMetrics) -> None:
        self.last = metrics
        if self._live is not None:
            self._live.update(render(metrics, self.title))

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._live is not None:
            self._live.__exit__(kind, error, trace)
            self._live = None
            self.console.line()


def wanted(progress: bool | None, console: Console | None = None) -> bool:
    """Whether to show the display: asked for, or (``None``) standard error is a terminal."""
    if progress is not None:
        return bool(progress)
    return (console or Console(stderr=True)).is_terminal


class ProgressLines:
    """The progress without a terminal: one line per event, as the job's listener hears of it,
    e.g. ``cutline [   3.5 s] checkpoint 1 complete in 0.08 s``."""

    KINDS = frozenset(
        {
            "running",
            "checkpoint",
            "savepoint",
            "abort",
            "waiting",
            "restart",
            "slots",
            "warning",
            "skipped",
            "failure",
        }
    )

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream
        self.started = time.monotonic()

    def __call__(self, kind: str, message: str) -> None:
        if kind not in self.KINDS:
            return
        elapsed = time.monotonic() - self.started
        first, *more = message.splitlines() or [""]
        if kind in ("restart", "failure") and more:
            first += f" ... ({len(more)} more lines: JobResult.restarts has them whole)"
        print(
            f"cutline [{elapsed:7.1f} s] {kind} {first}", file=self.stream or sys.stderr, flush=True
        )
