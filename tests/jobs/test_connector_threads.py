"""Where cutline calls a connector (``docs/connectors/writing.md``, the thread contract), in real jobs
(slots as threads), and what it names when a connector fails.

Every method of a sink's writer, from ``Sink.writer()`` that makes it to its ``close()``, runs
on one thread, its subtask's; a ``PendingCommit`` completes on the subtask's snapshot thread.
The same for a source: ``reader()`` and every method of the reader on the subtask's thread.
The connectors here note the thread of every call (in a file per subtask and attempt), and
the jobs go through a failure, so that a restored attempt's writers and readers are seen too.
A failure of a connector chained after a source names the connector, not the source.
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
import threading
import types
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_connector_api import assert_exact

from cutline import EventTime, FixedDelay, JobFailedError, SourceHold, StreamEnvironment, testing
from cutline.connectors import (
    Batch,
    PendingCommit,
    ReadResult,
    Sink,
    SinkContext,
    SinkWriter,
    SourceContext,
    Split,
    SplitReader,
)
from cutline.runtime.task.local import ThreadLauncher

from docs_examples import docs_example
from ledger import DISORDER, Journal, JournalWriter, Ledger, LedgerReader, first_time, journal

pytestmark = pytest.mark.jobs


def note(folder: str, who: str, method: str) -> None:
    """``who`` (a writer or reader: its kind, subtask and attempt) had ``method`` called on
    the current thread."""
    thread = threading.current_thread()
    with open(Path(folder) / "calls", "a") as out:
        out.write(f"{who} {method} {thread.ident} {thread.name}\n")


def calls(folder: Path) -> dict[str, list[tuple[str, str, str]]]:
    """Who -> its (method, thread id, thread name), in order."""
    seen: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
    for line in (folder / "calls").read_text().splitlines():
        who, method, ident, name = line.split(" ", 3)
        seen[who].append((method, ident, name))
    return dict(seen)


# -- a journal and a ledger that note their threads ----------------------------------------------


@dataclass(frozen=True)
class WatchedJournal(Journal):
    notes: str = ""

    def writer(self, context: SinkContext, restored: Mapping[int, Any]) -> SinkWriter:
        who = f"writer-{context.name}-{context.subtask}-{context.generation}"
        note(self.notes, who, "writer")
        return WatchedWriter(self.directory, context, restored, notes=self.notes, who=who)


class WatchedWriter(JournalWriter):
    def __init__(self, *args: Any, notes: str, who: str) -> None:
        super().__init__(*args)
        self.notes, self.who = notes, who

    def write(self, batch: Batch) -> None:
        note(self.notes, self.who, "write")
        super().write(batch)

    def prepare_commit(self, checkpoint_id: int) -> PendingCommit:
        note(self.notes, self.who, "prepare_commit")
        return WatchedStaging(super().prepare_commit(checkpoint_id), self.notes, self.who)

    def commit(self, checkpoint_id: int) -> None:
        note(self.notes, self.who, "commit")
        super().commit(checkpoint_id)

    def abort(self) -> None:
        note(self.notes, self.who, "abort")

    def close(self) -> None:
        note(self.notes, self.who, "close")


class WatchedStaging(PendingCommit):
    def __init__(self, staged: PendingCommit, notes: str, who: str) -> None:
        self.staged, self.notes, self.who = staged, notes, who

    def complete(self) -> Any:
        note(self.notes, self.who, "complete")
        return self.staged.complete()


@dataclass(frozen=True)
class WatchedLedger(Ledger):
    notes: str = ""

    def reader(self, context: SourceContext) -> SplitReader:
        attempt = len(list(Path(self.notes).glob("attempt-*")))
        who = f"reader-{context.name}-{context.subtask}-{attempt}"
        note(self.notes, who, "reader")
        return WatchedReader(self, self.notes, who)


class WatchedReader(LedgerReader):
    def __init__(self, ledger: Ledger, notes: str, who: str) -> None:
        super().__init__(ledger)
        self.notes, self.who = notes, who

    def add_split(self, split: Split, position: Any) -> None:
        note(self.notes, self.who, "add_split")
        super().add_split(split, position)

    def read(self, max_records: int) -> ReadResult:
        note(self.notes, self.who, "read")
        return super().read(max_records)

    def position(self, split: str) -> int:
        note(self.notes, self.who, "position")
        return super().position(split)

    def lowest_timestamp(self, split: str, column: str) -> int | None:
        note(self.notes, self.who, "lowest_timestamp")
        return None

    def caught_up(self) -> list[str]:
        note(self.notes, self.who, "caught_up")
        return []

    def positions_taken(self, checkpoint_id: int, positions: Mapping[str, Any]) -> None:
        note(self.notes, self.who, "positions_taken")

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        note(self.notes, self.who, "checkpoint_complete")

    def close(self) -> None:
        note(self.notes, self.who, "close")


@dataclass(frozen=True)
class FailOnce:
    """Raises once, at entry ``entry`` of account ``account`` (and notes the attempt after)."""

    entry: int
    folder: str

    @property
    def __name__(self) -> str:
        return "fail_once"

    def __call__(self, record: dict[str, Any]) -> dict[str, Any]:
        if record["entry"] == self.entry and first_time(str(Path(self.folder) / "attempt-2")):
            raise RuntimeError(f"injected failure at entry {self.entry}")
        return record


def test_every_method_of_a_writer_and_of_a_reader_runs_on_its_subtasks_thread(
    tmp_path: Path,
) -> None:
    """A journal chained after its source (one thread runs both) and one after a running sum
    (another chain): through a failure, each writer's and reader's every call, from the one
    that made it to its close, is on one thread, its subtask's; complete() on the snapshot
    thread."""
    notes = str(tmp_path)
    env = StreamEnvironment(
        2,
        checkpoint_interval=0.05,
        checkpoint_dir=tmp_path / "ck",
        restart_strategy=FixedDelay(delay=0),
    )
    env.from_source(
        WatchedLedger(accounts=4, per_account=300, notes=notes),
        name="ledger",
        event_time=EventTime("ts", max_out_of_orderness=f"{DISORDER}ms", idle_timeout="1s"),
    ).map(FailOnce(250, notes), name="fail").sink_to(
        WatchedJournal(str(tmp_path / "chained"), notes=notes), name="chained"
    )
    accounts = env.from_source(WatchedLedger(accounts=3, per_account=200, notes=notes), name="more")
    balances = accounts.key_by("account").sum("amount", name="balance")
    balances.sink_to(WatchedJournal(str(tmp_path / "after"), notes=notes), name="after")
    result = testing.execute(
        env, launcher=ThreadLauncher(), hold_sources=SourceHold(records=100, checkpoints=2)
    )
    assert len(result.restarts) == 1
    assert len(journal(tmp_path / "chained")) == 4 * 300

    seen = calls(tmp_path)
    writers = sorted(who for who in seen if who.startswith("writer-"))
    readers = sorted(who for who in seen if who.startswith("reader-"))
    assert writers == [
        f"writer-{n}-{s}-{a}" for n in ("after", "chained") for s in (0, 1) for a in (1, 2)
    ]
    assert readers == [
        f"reader-{n}-{s}-{a}" for n in ("ledger", "more") for s in (0, 1) for a in (0, 1)
    ]
    assert any(m == "position" for made in seen.values() for m, _, _ in made)
    for who, made in seen.items():
        on_its_thread = [(m, ident, name) for m, ident, name in made if m != "complete"]
        assert len({(ident, name) for _, ident, name in on_its_thread}) == 1, (who, made)
        _, _, thread = on_its_thread[0]
        subtask = who.split("-")[2]
        chain = {"chained": "ledger", "after": "balance"}.get(who.split("-")[1], who.split("-")[1])
        assert thread == f"cutline-{chain}-{subtask}", (who, made)  # (chained: the source's)
        methods = {m for m, _, _ in made}
        assert "close" in methods, (who, made)
        snapshot_threads = {name for m, _, name in made if m == "complete"}
        assert all(name.startswith(f"cutline-snap-{chain}-") for name in snapshot_threads)
        if who.startswith("writer-"):  # (restored, one may be given no record: no write)
            assert methods >= {"writer", "prepare_commit", "complete", "commit"}, (who, made)
            assert ("write" in methods) or who.endswith("-2"), (who, made)
            assert ("abort" in methods) == who.endswith("-1"), (who, made)  # (the failed one)
        elif who.endswith("-0"):  # (the first attempt reads, held until two checkpoints)
            assert methods >= {
                "reader",
                "add_split",
                "read",
                "positions_taken",
                "checkpoint_complete",
            }
            if who.startswith("reader-ledger-"):  # (with event time and an idle timeout)
                assert methods >= {"caught_up", "lowest_timestamp"}
        else:  # (restored: a subtask whose splits the checkpoint holds finished reads nothing)
            assert "reader" in methods


# -- a failing connector is named ------------------------------------------------------------


@dataclass(frozen=True)
class FailingSink(Sink):
    """A sink whose writer fails ``where``: when made, or in one of its methods."""

    where: str

    def writer(self, context: SinkContext, restored: Mapping[int, Any]) -> SinkWriter:
        if self.where == "made":
            raise ConnectionError("the sink's server is not there")
        return FailingWriter(self.where)


class FailingWriter(SinkWriter):
    def __init__(self, where: str) -> None:
        self.where = where

    def _fails(self, where: str) -> None:
        if self.where == where:
            raise ConnectionError(f"the sink's server went away ({where})")

    def write(self, batch: Batch) -> None:
        self._fails("write")

    def prepare_commit(self, checkpoint_id: int) -> PendingCommit | None:
        self._fails("prepare_commit")
        return FailingCompletion(self.where) if self.where == "complete" else None

    def commit(self, checkpoint_id: int) -> None:
        self._fails("commit")


class FailingCompletion(PendingCommit):
    def __init__(self, where: str) -> None:
        self.where = where

    def complete(self) -> None:
        raise ConnectionError("the sink's server went away (complete)")


@dataclass(frozen=True)
class UnopenedLedger(Ledger):
    def reader(self, context: SourceContext) -> SplitReader:
        raise ConnectionError("the ledger's server is not there")


@pytest.mark.parametrize(
    ("where", "operator"),
    [
        ("made", "journal"),
        ("write", "journal"),
        ("prepare_commit", "journal"),
        ("complete", "journal"),
        ("commit", "journal"),
        ("reader", "ledger"),
    ],
)
def test_a_connector_chained_after_a_source_that_fails_is_named(
    tmp_path: Path, where: str, operator: str
) -> None:
    """The sink runs in the source's subtask (``ledger-0``): its failures, when its writer is
    made and in every method, name it; a source whose reader cannot be made names itself."""
    env = StreamEnvironment(
        1, checkpoint_interval=0.05, checkpoint_dir=tmp_path / "ck", restart_strategy=FixedDelay(0)
    )
    ledger = UnopenedLedger() if where == "reader" else Ledger(accounts=2, per_account=3000)
    source = env.from_source(ledger, name="ledger")
    source.sink_to(FailingSink(where), name="journal")
    with pytest.raises(JobFailedError) as failed:
        testing.execute(
            env, launcher=ThreadLauncher(), hold_sources=SourceHold(records=100, checkpoints=2)
        )
    assert failed.value.operator == operator
    assert failed.value.subtask == "ledger-0"
    assert f"{operator} (subtask ledger-0): " in str(failed.value)
    what = "is not there" if where in ("made", "reader") else f"went away ({where})"
    assert what in str(failed.value)


# -- the page's SQLite sink ----------------------------------------------------------------------


def test_the_sqlite_sink_of_the_write_your_own_page_is_exact_through_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/connectors/writing.md's SQLite sink, as it is written there: its connection may only be
    used by the thread that made it (``sqlite3``'s own check). Two subtasks write one database
    file; a failure strikes after two checkpoints completed, and the restored writers move what
    the restored checkpoint staged and drop the rest: every balance is in the table once, and
    nothing is left staged."""
    code = docs_example("writing-sqlite").code
    assert "sqlite3.connect" in code and len(code.splitlines()) < 80
    database = tmp_path / "out.db"
    with contextlib.closing(sqlite3.connect(database)) as db:
        db.execute(
            "CREATE TABLE balances (account TEXT, entry INTEGER, amount INTEGER, ts INTEGER)"
        )
    ledger = Ledger(accounts=4, per_account=250)
    env = StreamEnvironment(
        2,
        checkpoint_interval=0.05,
        checkpoint_dir=tmp_path / "ck",
        restart_strategy=FixedDelay(delay=0),
    )
    stream = env.from_source(ledger, name="ledger").map(FailOnce(200, str(tmp_path)), name="fail")
    page_module = types.ModuleType("sqlite_page")
    page_module.stream = stream.key_by("account").sum("amount", name="balance")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sqlite_page", page_module)
    monkeypatch.chdir(tmp_path)  # ("out.db")
    exec(
        compile(code, "docs/connectors/writing.md", "exec", dont_inherit=True), page_module.__dict__
    )
    result = testing.execute(
        env, launcher=ThreadLauncher(), hold_sources=SourceHold(records=100, checkpoints=2)
    )
    assert len(result.restarts) == 1 and result.restarts[0].restored_from is not None
    with contextlib.closing(sqlite3.connect(database)) as db:
        db.row_factory = sqlite3.Row
        rows = [dict(row) for row in db.execute("SELECT * FROM balances")]
        assert db.execute("SELECT count(*) FROM cutline_staged").fetchone()[0] == 0
    assert_exact(ledger, rows, [], with_windows=False)
