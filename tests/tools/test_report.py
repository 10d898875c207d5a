"""The HTML report of a checkpoint directory (``report.py``), made from real directories:
the checkpoint directory of a small job run with the thread launcher (with a restart), and
directories of statistics files written through :class:`CheckpointStorage` (aborted
checkpoints, a missing run record, clock skew, a thousand checkpoints). The figures are
checked through the ``gid`` s in the page's inline SVG, never by their pixels."""

from __future__ import annotations

import html
import math
import os
import re
import shutil
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from matplotlib.lines import Line2D

import checkpoint_verification
from cutline import FixedDelay, SourceHold, StreamEnvironment, testing
from cutline.report import (
    TABLE_ROWS,
    ReportError,
    build_report,
    history_figure,
    write_report,
)
from cutline.runtime.checkpoint.stats import (
    CheckpointStats,
    History,
    RestartInfo,
    RunInfo,
    SubtaskStats,
    encode,
    stats_file,
)
from cutline.runtime.checkpoint.storage import CheckpointStorage
from cutline.runtime.task.local import ThreadLauncher

CAUSE_MARK = "injected <boom> & 'failure'"
"""In the restart's cause: text that must come out escaped."""

# ----------------------------------------------------------------------------- helpers


@dataclass(frozen=True)
class FailOnceAfterCheckpoint:
    """Raises once (a flag file remembers it), on the first record after ``marker`` exists."""

    marker: str
    flag: str

    def __call__(self, record: dict[str, int]) -> dict[str, int]:
        if os.path.exists(self.marker):
            try:
                os.close(os.open(self.flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return record
            raise RuntimeError(CAUSE_MARK)
        return record


def key_value(record: dict[str, int]) -> dict[str, int]:
    return {"key": record["value"] % 5, "value": 1}


def mark_checkpoints(marker: Path) -> Callable[[str, str], None]:
    def listener(kind: str, message: str) -> None:
        if kind == "checkpoint":
            marker.touch()

    return listener


def svgs(page: str) -> list[ET.Element]:
    """Every inline SVG of the page, parsed."""
    return [ET.fromstring(found) for found in re.findall(r"<svg\b.*?</svg>", page, re.S)]


def ids(element: ET.Element) -> list[str]:
    return [e.attrib["id"] for e in element.iter() if "id" in e.attrib]


def diagram_ids(page: str) -> set[str]:
    """The ids in the barrier diagram (the page's second figure)."""
    figures = svgs(page)
    assert len(figures) == 2, "the history plots and the barrier diagram"
    return set(ids(figures[1]))


def history_ids(page: str) -> set[str]:
    return set(ids(svgs(page)[0]))


def table_ids(page: str) -> list[int]:
    """The checkpoint ids in the checkpoints table, in its order."""
    table = re.search(r'<table id="checkpoints">.*?</table>', page, re.S)
    assert table is not None
    return [int(n) for n in re.findall(r'<tr[^>]*><td class="n">(\d+)</td>', table.group(0))]


def history(folder: Path) -> History:
    return CheckpointStorage(str(folder)).read_history()


# ------------------------------------------------------------ a real job with a restart


@pytest.fixture(scope="module")
def restarted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint directory of a keyed job (parallelism 2) that failed once after a
    checkpoint and restarted from one (the sources hold half-way until a checkpoint
    completed: the failure lands with input left)."""
    base = tmp_path_factory.mktemp("restarted")
    marker, flag = base / "checkpointed", base / "failed-once"
    env = StreamEnvironment(
        2,
        checkpoint_interval=0.05,
        checkpoint_dir=base / "checkpoints",
        restart_strategy=FixedDelay(delay=0),
        batch_size=4,
    )
    (
        env.from_sequence(0, 400)
        .map(FailOnceAfterCheckpoint(str(marker), str(flag)))
        .map(key_value)
        .key_by("key")
        .sum("value")
        .collect()
    )
    failures_before = len(checkpoint_verification.FAILURES)
    result = testing.execute(
        env,
        launcher=ThreadLauncher(),
        listener=mark_checkpoints(marker),
        hold_sources=SourceHold(records=100),  # half of each source subtask's
    )
    assert checkpoint_verification.FAILURES[failures_before:] == []
    assert len(result.restarts) == 1
    assert result.restarts[0].restored_from is not None
    assert result.checkpoints
    return base / "checkpoints"


@pytest.fixture(scope="module")
def page(restarted: Path) -> str:
    """The report of ``restarted`` (made once: the figures take a moment)."""
    return build_report(str(restarted))


def test_the_report_of_a_run_with_a_restart_shows_every_checkpoint_the_restart_and_figures(
    restarted: Path, page: str
) -> None:
    recorded = history(restarted)
    assert recorded.restarts and recorded.checkpoints and recorded.runs

    assert page.startswith("<!DOCTYPE html>")
    assert html.escape(str(restarted)) in page
    (run,) = recorded.runs
    assert run.run in page
    assert "<dt>restarts</dt><dd>1</dd>" in page
    assert table_ids(page) == sorted((c.checkpoint_id for c in recorded.checkpoints), reverse=True)

    # the restart: its cause escaped, never raw
    (restart,) = recorded.restarts
    assert CAUSE_MARK in restart.cause
    assert html.escape(restart.cause) in page
    assert CAUSE_MARK not in page and "<boom>" not in page
    assert f"restarted from checkpoint {restart.restored_from}" in page

    # the plots: every series, and the restart on each panel
    plotted = history_ids(page)
    assert {"durations", "sizes", "full-sizes", "alignments"} <= plotted
    name = f"{restart.run}-{restart.generation}"
    for panel in ("duration", "size", "alignment"):
        assert f"restart-{name}-{panel}" in plotted
        assert f"run-{run.run}-{panel}" in plotted
    assert f"restart-label-{name}" in plotted

    # the diagram of the slowest completed checkpoint: every subtask, channel and ack
    slowest = max(
        (c for c in recorded.checkpoints if c.completed),
        key=lambda c: (c.duration, -c.checkpoint_id),
    )
    drawn = diagram_ids(page)
    assert f"cut-{slowest.checkpoint_id}" in drawn
    assert f"Barriers of checkpoint {slowest.checkpoint_id}" in page
    assert {f"subtask-{s}" for s in run.subtasks} <= drawn
    assert {f"subtask-label-{s}" for s in run.subtasks} <= drawn
    assert {f"barrier-{c}" for c in run.channels} <= drawn
    assert {f"ack-{s}" for s in slowest.subtasks} <= drawn
    sources = [s for s in run.subtasks if not slowest.subtasks[s].barriers]
    assert sources and {f"source-{s}" for s in sources} <= drawn
    assert {"critical-path", "trigger", "end"} <= drawn


def test_the_page_is_self_contained(page: str) -> None:
    assert "<script" not in page.lower()
    assert "<link" not in page.lower()
    assert "<img" not in page.lower()  # the figures are inline SVG
    for attribute in re.findall(r'(?:src|href)\s*=\s*"([^"]*)"', page, re.I):
        assert attribute.startswith("#"), attribute
    assert not re.search(r"url\(\s*['\"]?(?:https?:|//)", page, re.I)
    assert "@import" not in page
    # no two elements share an id, not even two figures' clip paths and markers
    every = re.findall(r'\bid="([^"]*)"', page)
    assert len(every) == len(set(every))


def test_the_same_directory_gives_the_same_page(restarted: Path, page: str) -> None:
    assert build_report(str(restarted)) == page


def test_a_chosen_checkpoint_is_drawn(restarted: Path) -> None:
    recorded = history(restarted)
    chosen = recorded.checkpoints[0].checkpoint_id
    page = build_report(str(restarted), checkpoint=chosen)
    assert f"cut-{chosen}" in diagram_ids(page)
    assert f"Barriers of checkpoint {chosen}" in page
    assert re.search(rf'<tr class="drawn[^"]*"><td class="n">{chosen}</td>', page)


def test_write_report_writes_the_page_and_returns_its_path(
    restarted: Path, page: str, tmp_path: Path
) -> None:
    path = write_report(str(restarted), tmp_path / "report.html")
    assert path == tmp_path / "report.html"
    assert path.read_text(encoding="utf-8") == page


def test_an_unreadable_statistics_file_is_listed_and_the_rest_reported(
    restarted: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "checkpoints"
    shutil.copytree(restarted, folder)
    ids_ = [c.checkpoint_id for c in history(folder).checkpoints]
    broken = folder / "_stats" / stats_file(ids_[0])
    broken.write_text('{"kind": "checkpoint", <not json')
    page = build_report(str(folder))
    assert 'id="unreadable"' in page
    assert html.escape(stats_file(ids_[0])) in page
    assert table_ids(page) == sorted(ids_[1:], reverse=True)


# ------------------------------------------------------------------------------ errors


def test_a_directory_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(ReportError, match="does not exist") as info:
        build_report(str(missing))
    assert str(missing) in str(info.value)


def test_a_file_is_not_a_checkpoint_directory(tmp_path: Path) -> None:
    file = tmp_path / "notes.txt"
    file.write_text("hello")
    with pytest.raises(ReportError, match="is a file, not a checkpoint directory"):
        build_report(str(file))


def test_a_folder_of_other_files_is_not_a_checkpoint_directory(tmp_path: Path) -> None:
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(os.urandom(64))
    (foreign / "chk-notes").write_text("not a checkpoint")
    (foreign / "stats").mkdir()
    with pytest.raises(ReportError, match="is not a cutline checkpoint directory") as info:
        build_report(str(foreign))
    assert "_stats" in str(info.value) and "chk-N" in str(info.value)


def test_a_checkpoint_directory_without_statistics_was_written_by_an_older_cutline(
    restarted: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "checkpoints"
    shutil.copytree(restarted, folder)
    shutil.rmtree(folder / "_stats")
    with pytest.raises(ReportError, match="no statistics: it was written by an older cutline"):
        build_report(str(folder))


def test_an_empty_statistics_folder_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "checkpoints" / "_stats").mkdir(parents=True)
    with pytest.raises(ReportError, match="has no statistics"):
        build_report(str(tmp_path / "checkpoints"))


def test_a_statistics_folder_of_only_unreadable_files_is_an_error(tmp_path: Path) -> None:
    stats = tmp_path / "checkpoints" / "_stats"
    stats.mkdir(parents=True)
    (stats / "checkpoint-3.json").write_text("[]")
    with pytest.raises(ReportError, match=r"none of the statistics .* can be read") as info:
        build_report(str(tmp_path / "checkpoints"))
    assert "checkpoint-3.json" in str(info.value)


def test_a_checkpoint_without_statistics_is_an_error_listing_those_with(restarted: Path) -> None:
    ids_ = [c.checkpoint_id for c in history(restarted).checkpoints]
    unknown = max(ids_) + 100
    with pytest.raises(ReportError, match=f"checkpoint {unknown} has no statistics") as info:
        build_report(str(restarted), checkpoint=unknown)
    assert f"the checkpoints with statistics are {min(ids_)}-{max(ids_)}" in str(info.value)


def test_nothing_is_written_when_the_report_cannot_be_made(tmp_path: Path) -> None:
    output = tmp_path / "report.html"
    with pytest.raises(ReportError):
        write_report(str(tmp_path / "nowhere"), output)
    assert not output.exists()


# -------------------------------------------------- statistics written through the storage


RUN = "0a1b2c3d"
T0 = 1_700_000_000.0
"""When the synthetic run started (seconds since the epoch)."""


def two_by_two_run(**changes: Any) -> RunInfo:
    """A run of two sources feeding two sums over four channels."""
    values: dict[str, Any] = {
        "run": RUN,
        "started": T0,
        "parallelism": 2,
        "checkpointing": "aligned",
        "operators": {"src": "sequence", "sum": "sum(value)"},
        "subtasks": ["src-0", "src-1", "sum-0", "sum-1"],
        "channels": {
            f"src>sum:{a}>{b}": [f"src-{a}", f"sum-{b}"] for a in range(2) for b in range(2)
        },
        "ended": T0 + 30.0,
        "outcome": "finished",
    }
    values.update(changes)
    return RunInfo(**values)


def subtasks(skew: float = 0.0, records: int = 0) -> dict[str, SubtaskStats]:
    """Four subtasks' acknowledgements; ``skew`` shifts sum-1's clock."""
    sources = {
        f"src-{a}": SubtaskStats(
            subtask=f"src-{a}",
            acknowledged=0.02 + 0.01 * a,
            start_delay=0.001,
            alignment=0.0,
            synchronous=0.0001,
            asynchronous=0.01,
            state_size=200,
            full_size=200,
            snapshot_at=0.001 + 0.002 * a,
            forwarded_at=0.0012 + 0.002 * a,
        )
        for a in range(2)
    }
    sums = {
        f"sum-{b}": SubtaskStats(
            subtask=f"sum-{b}",
            acknowledged=0.05 + 0.02 * b,
            start_delay=0.004,
            alignment=0.01,
            synchronous=0.001,
            asynchronous=0.02,
            state_size=1000,
            segments_size=500,
            full_size=4000,
            channel_state_records=records * b,
            channel_state_bytes=40 * records * b,
            barriers={
                f"src>sum:{a}>{b}": 0.004 + 0.01 * a + (skew if b else 0.0) for a in range(2)
            },
            snapshot_at=0.015 + (skew if b else 0.0),
        )
        for b in range(2)
    }
    return {**sources, **sums}


def checkpoint(checkpoint_id: int, **changes: Any) -> CheckpointStats:
    values: dict[str, Any] = {
        "checkpoint_id": checkpoint_id,
        "generation": 1,
        "duration": 0.08 + 0.001 * (checkpoint_id % 7),
        "alignment": 0.01,
        "size": 3000 + checkpoint_id,
        "full_size": 9000 + checkpoint_id,
        "triggered_at": 0.5 * checkpoint_id,
        "trigger_time": T0 + 0.5 * checkpoint_id,
        "run": RUN,
        "subtasks": subtasks(),
    }
    values.update(changes)
    return CheckpointStats(**values)


@pytest.fixture(scope="module")
def assorted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of statistics: completed checkpoints, one aborted before anyone
    acknowledged it, a savepoint, one with a clock-skewed subtask, one of a run whose
    record is missing, and a restart whose cause is markup."""
    tmp_path = tmp_path_factory.mktemp("assorted")
    folder = tmp_path / "checkpoints"
    storage = CheckpointStorage(str(folder))
    storage.write_stats(two_by_two_run())
    storage.write_stats(checkpoint(1, subtasks=subtasks(records=12)))
    storage.write_stats(checkpoint(2, duration=0.9))  # the slowest completed one
    storage.write_stats(
        checkpoint(
            3,
            status="aborted",
            reason="generation 1 ended: </pre><script>alert(1)</script>",
            subtasks={},
        )
    )
    storage.write_stats(
        RestartInfo(
            generation=1,
            cause="a <b>bold</b> failure\n  Traceback: x < y",
            restored_from=2,
            failed_at=1.7,
            run=RUN,
            time=T0 + 1.7,
        )
    )
    storage.write_stats(checkpoint(4, generation=2, subtasks=subtasks(skew=-0.05)))
    storage.write_stats(checkpoint(5, generation=2, savepoint=str(tmp_path / "sp<1>")))
    storage.write_stats(checkpoint(6, run="ffffeeee", trigger_time=T0 + 40.0))
    return folder


@pytest.fixture(scope="module")
def assorted_report(assorted: Path) -> Callable[[int | None], str]:
    """The report of ``assorted`` drawing a checkpoint (each made once)."""
    pages: dict[int | None, str] = {}

    def report(checkpoint: int | None) -> str:
        if checkpoint not in pages:
            pages[checkpoint] = build_report(str(assorted), checkpoint=checkpoint)
        return pages[checkpoint]

    return report


def test_an_aborted_checkpoint_nobody_acknowledged_is_reported_and_drawn(
    assorted_report: Callable[[int | None], str],
) -> None:
    page = assorted_report(None)
    assert table_ids(page) == [6, 5, 4, 3, 2, 1]
    assert "aborted-durations" in history_ids(page)
    assert "&lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script" not in page
    assert "a &lt;b&gt;bold&lt;/b&gt; failure" in page and "<b>bold" not in page
    assert "sp&lt;1&gt;" in page
    assert "savepoints" in history_ids(page)
    assert "cut-2" in diagram_ids(page), "the slowest completed checkpoint by default"

    drawn = diagram_ids(assorted_report(3))
    assert {"no-acknowledgements", "cut-3", "trigger", "end"} <= drawn
    assert {f"subtask-{s}" for s in two_by_two_run().subtasks} <= drawn
    assert not [i for i in drawn if i.startswith(("barrier-", "ack-"))]


def test_negative_times_from_clock_skew_are_drawn(
    assorted_report: Callable[[int | None], str],
) -> None:
    page = assorted_report(4)
    drawn = diagram_ids(page)
    assert {f"barrier-src>sum:{a}>{b}" for a in range(2) for b in range(2)} <= drawn
    assert {"cut-4", "critical-path", "ack-sum-1"} <= drawn
    assert not [i for i in drawn if i.startswith("channel-state-")], "none recorded any"
    # sum-1's clock is 50 ms behind: the time axis reaches below 0
    texts = "".join(svgs(page)[1].itertext())
    assert "\N{MINUS SIGN}" in texts
    drawn = diagram_ids(assorted_report(1))
    assert "channel-state-sum-1" in drawn and "channel-state-sum-0" not in drawn
    assert "alignment-sum-0" in drawn


def test_a_checkpoint_of_a_run_without_its_record_is_drawn_from_its_subtasks(
    assorted_report: Callable[[int | None], str],
) -> None:
    page = assorted_report(6)
    assert "no run record" in page
    drawn = diagram_ids(page)
    assert {f"subtask-{s}" for s in two_by_two_run().subtasks} <= drawn
    # the channels' senders are unknown: a tick where each barrier arrived
    assert {f"barrier-src>sum:{a}>{b}" for a in range(2) for b in range(2)} <= drawn
    assert {"source-src-0", "source-src-1", "cut-6"} <= drawn


def test_a_directory_with_only_a_failed_run_and_no_checkpoints(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    storage.write_stats(two_by_two_run(outcome="failed: <nope>"))
    storage.write_stats(RestartInfo(1, "boom", None, 0.3, run=RUN, time=T0 + 0.3, restarted=False))
    page = build_report(str(tmp_path / "checkpoints"))
    assert "No checkpoint to draw." in page
    assert "no-checkpoints" in {i for svg in svgs(page) for i in ids(svg)}
    assert "failed: &lt;nope&gt;" in page
    assert "the restart strategy gave up" in page


def test_a_thousand_checkpoints_are_plotted_and_the_newest_listed(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    stats = folder / "_stats"
    stats.mkdir(parents=True)
    (stats / f"run-{RUN}.json").write_bytes(encode(two_by_two_run()))
    for n in range(1, 1001):
        record = (
            checkpoint(n, status="aborted", reason="expired", subtasks={})
            if n % 50 == 0
            else checkpoint(n)
        )
        (stats / stats_file(n)).write_bytes(encode(record))
    page = build_report(str(folder))
    shown = table_ids(page)
    assert shown == list(range(1000, 1000 - TABLE_ROWS, -1))
    assert f"The newest {TABLE_ROWS} of 1000 checkpoints" in page
    plots = svgs(page)[0]
    by_id = {e.attrib["id"]: e for e in plots.iter() if "id" in e.attrib}
    assert {"durations", "aborted-durations", "sizes", "alignments"} <= set(by_id)
    # every completed checkpoint is a point of the duration series
    assert len(list(by_id["durations"].iter("{http://www.w3.org/2000/svg}use"))) == 980


def test_an_fsspec_url_is_read_like_a_local_directory() -> None:
    url = "memory://cutline-report-test/checkpoints"
    storage = CheckpointStorage(url)
    storage.write_stats(two_by_two_run())
    storage.write_stats(checkpoint(1))
    try:
        page = build_report(url)
        assert "cut-1" in diagram_ids(page)
        assert html.escape(url) in page
    finally:
        storage.fs.rm("/cutline-report-test", recursive=True)


# ------------------------------------------------------------------- several runs


OTHER = "9f8e7d6c"
"""A second run, a minute after the first."""


def two_runs(folder: Path) -> History:
    """Statistics of two runs on one directory: checkpoints 1-3 (one aborted) in the first,
    4-6 in the second, a minute later."""
    storage = CheckpointStorage(str(folder))
    storage.write_stats(two_by_two_run())
    storage.write_stats(two_by_two_run(run=OTHER, started=T0 + 60.0, ended=T0 + 90.0))
    for n in (1, 2, 3):
        aborted: dict[str, Any] = {"status": "aborted", "reason": "expired"} if n == 2 else {}
        storage.write_stats(checkpoint(n, **aborted))
    for n in (4, 5, 6):
        storage.write_stats(checkpoint(n, run=OTHER, trigger_time=T0 + 60.0 + 0.5 * n))
    return storage.read_history()


def lines_of(figure: Any) -> dict[str, Line2D]:
    return {str(a.get_gid()): a for a in figure.findobj(Line2D) if a.get_gid() is not None}


def test_the_history_lines_break_between_runs(tmp_path: Path) -> None:
    recorded = two_runs(tmp_path / "checkpoints")
    drawn = lines_of(history_figure(recorded))
    for gid in ("durations", "sizes", "full-sizes", "alignments"):
        xs = [float(x) for x in drawn[gid].get_xdata()]
        ys = [float(y) for y in drawn[gid].get_ydata()]
        # 1 and 3 of the first run, a break, 4, 5 and 6 of the second
        assert [math.isnan(x) for x in xs] == [False, False, True, False, False, False], gid
        assert math.isnan(ys[2])
        assert xs[:2] == [0.5, 1.5] and xs[3:] == [62.0, 62.5, 63.0]
    # markers only (no line to break): every aborted checkpoint, none a NaN
    assert [float(x) for x in drawn["aborted-durations"].get_xdata()] == [1.0]


def test_one_run_is_one_unbroken_line(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    storage.write_stats(two_by_two_run())
    for n in (1, 2, 3):
        storage.write_stats(checkpoint(n, generation=1 if n < 3 else 2))  # across a restart
    drawn = lines_of(history_figure(storage.read_history()))
    assert not any(math.isnan(float(x)) for x in drawn["durations"].get_xdata())
    assert len(drawn["durations"].get_xdata()) == 3


def test_runs_are_named_and_every_other_one_shaded(tmp_path: Path) -> None:
    two_runs(tmp_path / "checkpoints")
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    storage.write_stats(checkpoint(7, run="77777777", trigger_time=T0 + 120.0))  # no record
    page = build_report(str(tmp_path / "checkpoints"))
    plotted = history_ids(page)
    assert {f"run-label-{RUN}", f"run-label-{OTHER}", "run-label-77777777"} <= plotted
    assert {f"run-span-{OTHER}-{panel}" for panel in ("duration", "size", "alignment")} <= plotted
    assert not [i for i in plotted if i.startswith((f"run-span-{RUN}", "run-span-7777"))]
    texts = "".join(svgs(page)[0].itertext())
    assert f"run {RUN}" in texts and f"run {OTHER}" in texts
    assert "run 77777777 (no run record)" in texts
    # the SVG line of the durations is two pieces: two moves, one per run
    by_id = {e.attrib["id"]: e for e in svgs(page)[0].iter() if "id" in e.attrib}
    paths = [p.attrib["d"] for p in by_id["durations"].iter("{http://www.w3.org/2000/svg}path")]
    assert sum(d.count("M") for d in paths if "L" in d) == 3  # runs of 2, 3 and 1 points


def test_a_completed_checkpoint_that_lost_its_metadata_is_counted_apart(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    two_runs(folder)
    for n in (5, 6):
        (folder / f"chk-{n}").mkdir()
        (folder / f"chk-{n}" / "g1-src-0.state").write_bytes(b"state")
    page = build_report(str(folder))
    assert (
        "<dt>completed, but their _metadata is missing (never restored from)</dt><dd>5-6</dd>"
        in page
    )
    assert "incomplete folders" not in page
