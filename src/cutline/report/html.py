"""The report's page: the HTML around the figures, and the functions that make it.

``cutline report DIR -o report.html`` (:func:`write_report`) writes one page that opens in
any browser, offline: no server, no scripts, no external stylesheets or fonts; the
figures (:mod:`cutline.report.figures`) are inline SVG. The page is made of the sections
below, each a function of what :mod:`cutline.report.data` read; :func:`build_report` puts
them together. Every text that comes from the files goes through :func:`_e` (escaped).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from cutline import __version__
from cutline.protocol.watermarks import MAX_WATERMARK
from cutline.report.barrier_figure import checkpoint_figure
from cutline.report.data import (
    Directory,
    ReportError,
    Timeline,
    checkpoint_mode,
    choose_checkpoint,
    critical_path_text,
    human_seconds,
    human_utc,
    read_directory,
)
from cutline.report.event_time import (
    event_rates,
    human_rate,
    shown_checkpoint,
    timed,
    watermark_figure,
)
from cutline.report.figures import inline_svg
from cutline.report.history_figure import history_figure
from cutline.runtime.checkpoint.stats import (
    STATS_FOLDER,
    CheckpointStats,
    History,
    human_bytes,
    id_ranges,
)

__all__ = ["TABLE_ROWS", "build_report", "write_report"]

TABLE_ROWS = 200
"""Checkpoints listed in the table (the newest); the plots show every one."""


def _e(text: object) -> str:
    """``text`` escaped for HTML (every text from the files goes through here)."""
    return html.escape(str(text), quote=True)


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


def _header(directory: Directory, timeline: Timeline) -> str:
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
        length = human_seconds(info.ended - info.started) if info.ended is not None else ""
        outcome = info.outcome if info.outcome is not None else "unknown (running, or died)"
        failed = not outcome.startswith("finished")
        rows.append(
            (
                "aborted" if failed else "",
                [
                    f"<td><code>{_e(info.run)}</code></td>",
                    _td(human_utc(info.started)),
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


def _checkpoint_table(history: History, timeline: Timeline, drawn: int | None) -> str:
    checkpoints = history.checkpoints
    shown = sorted(checkpoints, key=lambda c: -c.checkpoint_id)[:TABLE_ROWS]
    rows = []
    for stats in shown:
        run = timeline.runs.get(stats.run)
        slowest = stats.slowest
        status = stats.status + (" (final)" if stats.final else "")
        mode = checkpoint_mode(stats)
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
                    _td(human_seconds(stats.duration), number=True),
                    _td(human_bytes(stats.size), number=True),
                    _td(human_bytes(stats.full_size), number=True),
                    _td(mode),
                    _td(channel_state, number=True),
                    _td(human_seconds(stats.alignment), number=True),
                    _td(
                        f"{slowest.subtask} (ack {human_seconds(slowest.acknowledged)})"
                        if slowest is not None
                        else "no acknowledgement"
                    ),
                    f'<td class="mono">{_e(critical_path_text(stats, run))}</td>',
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


def _restart_table(history: History, timeline: Timeline) -> str:
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
                    _td(human_utc(restart.time)),
                    f"<td>{_long(restart.cause)}</td>",
                    _td(then),
                ],
            )
        )
    table = _table(
        ["run", "failed generation", "at", "time", "cause", "then"], rows, "restart-table"
    )
    return f'<section id="restarts"><h2>Restarts</h2>{table}</section>'


def _event_time_section(history: History) -> str:
    """Each operator's watermark at the newest checkpoint taken before the input ended, how
    far it was behind that checkpoint's trigger and how fast event time went, its open
    windows, timers and late records; the watermarks over the run (a figure); and at every
    checkpoint the lag, the slowest rate and the late records per operator."""
    checkpoints = timed(history)
    if not checkpoints:
        return ""
    shown = shown_checkpoint(checkpoints)
    rates = event_rates(checkpoints)
    watermarks, figures = shown.watermarks(), shown.event_time()
    rows = []
    for uid in sorted(set(watermarks) | set(figures)):
        watermark = watermarks.get(uid)
        rate = rates.get(shown.checkpoint_id, {}).get(uid)
        if watermark is None:
            when, behind = "-", "-"
        elif watermark >= MAX_WATERMARK:
            when, behind = "end of input", "-"
        else:
            when = human_utc(watermark / 1000)
            behind = human_seconds(max(0.0, shown.trigger_time - watermark / 1000))
        found = figures.get(uid, {})
        rows.append(
            (
                "",
                [
                    f"<td><code>{_e(uid)}</code></td>",
                    _td(when),
                    _td(behind, number=True),
                    _td(human_rate(rate) if rate is not None else "-", number=True),
                    *(
                        _td(f"{found[k]:,}" if k in found else "-", number=True)
                        for k in ("windows", "timers", "late")
                    ),
                ],
            )
        )
    headers = ["operator", "watermark", "behind its trigger", "event time per second"]
    table = _table([*headers, "open windows", "timers", "late records"], rows, "event-time-table")
    lags = []
    for stats in checkpoints:
        lag = [
            stats.trigger_time - w / 1000 for w in stats.watermarks().values() if w < MAX_WATERMARK
        ]
        slowest = min(rates.get(stats.checkpoint_id, {}).values(), default=None)
        late = ", ".join(
            f"{uid} {f['late']:,}" for uid, f in sorted(stats.event_time().items()) if f.get("late")
        )
        lags.append(
            (
                "",
                [
                    _td(stats.checkpoint_id, number=True),
                    _td(human_seconds(max(0.0, *lag)) if lag else "end of input", number=True),
                    _td(human_rate(slowest) if slowest is not None else "-", number=True),
                    _td(late or "-"),
                ],
            )
        )
    history_table = _table(
        [
            "checkpoint",
            "watermark furthest behind",
            "slowest event time per second",
            "late records so far",
        ],
        lags,
        "lag-table",
    )
    figure = inline_svg(lambda: watermark_figure(history), "watermarks")
    ended = " (the input ended after it)" if shown is not checkpoints[-1] else ""
    return (
        '<section id="event-time"><h2>Event time</h2>'
        f'<p class="note">At checkpoint {_e(shown.checkpoint_id)}{_e(ended)}: each '
        "operator's watermark (the least of its subtasks'), how far it was behind the wall "
        "clock when the checkpoint was triggered (how late a live stream is; for replayed "
        "input, how old the data is), how much event time it went through per second of wall "
        "clock since the checkpoint before (replayed input: how fast the job reads it; a live "
        "stream: about 1 s/s), and its windows, timers and late records (records too late for "
        "their windows, sent to the side output; per window operator, counted since the job "
        f"started).</p>{table}<figure>{figure}</figure>{history_table}</section>"
    )


def _diagram_section(timeline: Timeline, chosen: CheckpointStats | None, why: str) -> str:
    if chosen is None:
        return '<section id="diagram"><h2>Barriers</h2><p>No checkpoint to draw.</p></section>'
    run = timeline.runs.get(chosen.run)
    svg = inline_svg(lambda: checkpoint_figure(chosen, run), "diagram")
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
    directory = read_directory(checkpoint_dir, storage_options)
    history = directory.history
    chosen = choose_checkpoint(history, checkpoint, directory.name)
    timeline = Timeline.of(history)
    title = f"cutline checkpoint report: {directory.name}"
    plots = inline_svg(lambda: history_figure(history), "history")
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
        _event_time_section(history),
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
