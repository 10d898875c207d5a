"""How ``cutline checkpoints`` shows what it found (its commands are
:mod:`cutline.cli_checkpoints`): rich tables and lines, wide enough not to wrap when they go
to a file or a pipe.

* :func:`checkpoints_table` — ``list``: a row per checkpoint (status, duration, size, channel
  state, alignment, on disk or not); :func:`print_restarts` — each restart and its cause;
* :func:`print_stats` — ``show``: one checkpoint's statistics, per subtask (slowest first),
  its critical path (which input's barrier came last, hop by hop back to a source), what its
  barrier waited behind, and each operator's event time;
* :func:`print_contents` — ``show``: the operators with state in its files, and each
  subtask's state file, segments and channel state;
* durations, sizes and times as a person reads them (:func:`seconds`, :func:`size`,
  :func:`when`, :func:`utc`), and text printed whole (:func:`print_indented`), on a console
  of its own (:func:`make_console`).
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import Iterable

from rich.console import Console
from rich.table import Table
from rich.text import Text

from cutline.protocol.watermarks import MAX_WATERMARK
from cutline.runtime.checkpoint.layout import METADATA, CorruptCheckpointError
from cutline.runtime.checkpoint.location import CheckpointLocation
from cutline.runtime.checkpoint.reader import CheckpointReader, InspectError
from cutline.runtime.checkpoint.stats import (
    CheckpointStats,
    History,
    RestartInfo,
    critical_path,
    human_bytes,
)


def make_console() -> Console:
    """A console for the commands' output (to a file or a pipe: wide enough that tables do
    not wrap)."""
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = max(console.width, 160)  # a file or a pipe: no wrapping of tables
    return console


def size(n: int | None) -> str:
    """``n`` bytes as a person reads them (``-``: not known)."""
    return "-" if n is None else human_bytes(n)


def seconds(value: float | None) -> str:
    """``value`` seconds as a person reads them, in ms below one (``-``: not known)."""
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if abs(value) < 1 else f"{value:.2f} s"


def first_line(text: str | None, most: int) -> str:
    """The first line of ``text``, cut to ``most`` characters at the end of a word (with an
    ellipsis; mid-word only when its first word is longer than that)."""
    line = text.splitlines()[0] if text else ""
    if len(line) <= most:
        return line
    cut = line[: most - 1]
    space = cut.rstrip().rfind(" ")
    return (cut[:space].rstrip() if space > 0 else cut) + "…"


def print_indented(console: Console, text: str, indent: int = 4) -> None:
    """Print ``text`` whole, as it is (no markup), every line indented and wrapped at word
    boundaries to the console's width (a wrapped line keeps its line's own indent)."""
    width = max(20, console.width - indent)
    for line in text.rstrip("\n").splitlines() or [""]:
        line = line.expandtabs(4).rstrip()
        own = " " * (len(line) - len(line.lstrip(" ")))
        wrapped = textwrap.wrap(line, width, subsequent_indent=own, break_on_hyphens=False) or [""]
        for part in wrapped:
            console.print(Text(" " * indent + part), soft_wrap=True)


def when(epoch: float) -> str:
    """A wall-clock time, local, to the second (``-``: none)."""
    return time.strftime("%m-%d %H:%M:%S", time.localtime(epoch)) if epoch else "-"


def utc(ms: int) -> str:
    """Epoch milliseconds as a UTC time (event time need not be near now)."""
    whole, rest = divmod(ms, 1000)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(whole)) + f".{rest:03d} UTC"


def checkpoints_table(
    title: str, rows: Iterable[tuple[int, CheckpointStats | None, bool]], lost: set[int]
) -> Table:
    """A row per checkpoint of ``rows`` (its id, its statistics if any, whether it is on
    disk); those of ``lost`` lost their metadata though their statistics say they completed."""
    table = Table(title=title, header_style="bold")
    for column in (
        "id",
        "status",
        "triggered",
        "duration",
        "size",
        "full size",
        "in flight",
        "alignment",
        "on disk",
        "gen",
    ):
        table.add_column(column, justify="left" if column in ("status", "triggered") else "right")
    for checkpoint_id, stats, on_disk in rows:
        if stats is None:
            table.add_row(str(checkpoint_id), "complete (no statistics)", *["-"] * 6, "yes", "-")
            continue
        status = stats.status
        if checkpoint_id in lost:
            status = f"incomplete ({METADATA} missing)"
        if stats.savepoint:
            status = f"{status} (savepoint)"
        elif stats.final:
            status = f"{status} (final)"
        if not stats.completed and stats.reason:
            status += f": {first_line(stats.reason, 60)}"
        table.add_row(
            str(checkpoint_id),
            Text(status),
            when(stats.trigger_time),
            seconds(stats.duration),
            size(stats.size),
            size(stats.full_size),
            str(stats.channel_state_records) if stats.unaligned else "-",
            seconds(stats.alignment),
            f"no {METADATA}" if checkpoint_id in lost else "yes" if on_disk else "no",
            str(stats.generation),
        )
    return table


def print_restarts(console: Console, restarts: Iterable[RestartInfo]) -> None:
    """Each restart: which generation of which run failed when, what followed, its cause."""
    for restart in restarts:
        then = (
            f"restarted from checkpoint {restart.restored_from}"
            if restart.restored_from is not None
            else ("restarted from the start" if restart.restarted else "gave up")
        )
        console.print(
            Text(
                f"restart: generation {restart.generation} of run {restart.run} failed at "
                f"{when(restart.time)}; {then}; the cause:"
            )
        )
        print_indented(console, restart.cause or "(none recorded)")


def print_stats(console: Console, stats: CheckpointStats, history: History) -> None:
    """Checkpoint ``stats``: why it took as long as it did (per subtask, the critical path
    through the runs of ``history``, what its barrier waited behind), and its event time."""
    kind = "savepoint" if stats.savepoint else "checkpoint"
    console.print(
        f"[bold]{kind} {stats.checkpoint_id}[/bold]: {stats.status}"
        + (f" ({stats.reason})" if stats.reason else "")
        + f" — triggered {when(stats.trigger_time)}, run {stats.run}, generation "
        f"{stats.generation}, {stats.checkpointing}" + (" (final)" if stats.final else "")
    )
    console.print(
        f"  end to end {seconds(stats.duration)}; written {size(stats.size)} (full "
        f"{size(stats.full_size)}); channel state {stats.channel_state_records} records "
        f"({size(stats.channel_state_bytes)}); longest alignment {seconds(stats.alignment)}"
        + (f"\n  savepoint: {stats.savepoint}" if stats.savepoint else "")
    )
    if not stats.subtasks:
        return
    _print_event_time(console, stats)
    table = Table(header_style="bold", title="subtasks (slowest first)")
    for column in (
        "subtask",
        "acknowledged",
        "start delay",
        "alignment",
        "sync",
        "async",
        "written",
        "in flight",
        "last barrier from",
    ):
        table.add_column(
            column, justify="left" if column in ("subtask", "last barrier from") else "right"
        )
    ordered = sorted(stats.subtasks.values(), key=lambda s: (-s.acknowledged, s.subtask))
    for sub in ordered:
        last = sub.last_barrier
        table.add_row(
            sub.subtask,
            seconds(sub.acknowledged),
            seconds(sub.start_delay),
            seconds(sub.alignment),
            seconds(sub.synchronous),
            seconds(sub.asynchronous),
            size(sub.size),
            str(sub.channel_state_records) if sub.channel_state_records else "-",
            f"{last[0]} at {seconds(last[1])}" if last else "-",
        )
    console.print(table)
    run = history.run(stats.run)
    path = critical_path(stats, run)
    if path:
        hops = []
        for subtask, channel in path:
            sub = stats.subtasks[subtask]
            behind = ""
            if channel is not None:
                sender = stats.subtasks.get(run.channels.get(channel, [""])[0] if run else "")
                waited = sender.queued_ahead.get(channel, 0) if sender is not None else 0
                behind = f", behind {waited:,} records" if waited else ""
            if channel is None:
                hops.append(f"{subtask} (snapshot at {seconds(sub.snapshot_at)})")
            elif not hops:
                hops.append(
                    f"{subtask} (acknowledged {seconds(sub.acknowledged)}, its last barrier on "
                    f"{channel} at {seconds(sub.barriers[channel])}{behind})"
                )
            else:
                hops.append(
                    f"{subtask} (snapshot at {seconds(sub.snapshot_at)}, after the barrier on "
                    f"{channel} at {seconds(sub.barriers[channel])}{behind})"
                )
        console.print("critical path: " + "\n  <- ".join(hops))
    most = stats.waited_behind
    if most is not None:
        sending, channel, records = most
        console.print(
            f"its barrier waited behind the most records on {channel} (sent by {sending}): "
            f"{records:,} (backpressure: records queued for a slower subtask; unaligned "
            "checkpoints overtake them)"
        )


def _print_event_time(console: Console, stats: CheckpointStats) -> None:
    """Per chain, its watermark at the checkpoint and how far behind the trigger it was; per
    operator with event time, its open windows, timers and late records."""
    watermarks, figures = stats.watermarks(), stats.event_time()
    if not watermarks and not figures:
        return
    table = Table(header_style="bold", title="event time")
    for column in ("operator", "watermark", "behind", "windows", "timers", "late records"):
        table.add_column(column, justify="left" if column in ("operator", "watermark") else "right")
    for uid in sorted(set(watermarks) | set(figures)):
        watermark = watermarks.get(uid)
        if watermark is None:
            shown, behind = "-", "-"
        elif watermark >= MAX_WATERMARK:
            shown, behind = "end of input", "-"
        else:
            shown = utc(watermark)
            behind = seconds(max(0.0, stats.trigger_time - watermark / 1000))
        found = figures.get(uid, {})
        table.add_row(
            uid,
            shown,
            behind,
            *(
                f"{found[name]:,}" if name in found else "-"
                for name in ("windows", "timers", "late")
            ),
        )
    console.print(table)


def print_contents(
    console: Console, reader: CheckpointReader, location: CheckpointLocation
) -> None:
    console.print(f"[bold]contents[/bold] ({location.url})")
    try:
        operators = reader.operators()
    except (CorruptCheckpointError, InspectError) as exc:
        console.print(f"  cannot read its state: {exc}", style="red")
        return
    table = Table(header_style="bold", title="operators with state")
    for column in ("operator", "uid", "kind", "subtasks", "keyed state"):
        table.add_column(column)
    for op in operators:
        table.add_row(
            op.name,
            op.uid,
            op.kind,
            str(len(op.subtasks)),
            size(op.size) if op.kind == "keyed" else "-",
        )
    console.print(table)
    table = Table(header_style="bold", title="subtasks")
    for column in ("subtask", "state file", "segments", "shared", "channel state"):
        table.add_column(column, justify="left" if column == "subtask" else "right")
    for name, handle in sorted(reader.handles.items()):
        recorded = "-"
        if handle.channel_state:
            inputs, outputs = reader.recorded_counts(name)
            recorded = ", ".join(
                [f"in {c}: {k}" for c, k in sorted(inputs.items())]
                + [f"out {c}: {k}" for c, k in sorted(outputs.items())]
            )
        table.add_row(
            name,
            size(handle.size),
            size(sum(r.size for r in handle.segments)),
            str(len(handle.shared)),
            recorded,
        )
    console.print(table)
