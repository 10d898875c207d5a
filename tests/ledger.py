"""Connectors written as a third party would, against ``cutline.connectors`` only: a ledger of
accounts (a source), each account a split of numbered entries, and a journal (a
two-phase-commit sink of JSON-lines files).

Entry ``i`` of account ``a`` has an amount and an event time (``ts``, epoch ms) that depend on
``a`` and ``i`` alone, at most :data:`DISORDER` ms out of order within the account, so every
result over it is known in plain Python (:func:`entries`). The reader polls its accounts in
turn, a few entries at a time (Arrow batches for even accounts, lists of dicts for odd ones),
now and then has nothing (``Nothing``), and says when an account is finished. Its position in
an account is the number of entries it returned.

Also here: readers that break the contract (for the tests of what cutline says about them).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from cutline.connectors import (
    Batch,
    Finished,
    GlobalCommitter,
    Nothing,
    PendingCommit,
    ReadResult,
    Records,
    Sink,
    SinkContext,
    SinkWriter,
    Source,
    SourceContext,
    Split,
    SplitReader,
)

BASE = 1_700_000_000_000
DISORDER = 80
"""How far (ms) an entry's time may be before an earlier entry's of its account."""


def entry(account: int, i: int) -> dict[str, Any]:
    mix = (account * 7919 + i * 104729) % 1000
    return {
        "account": f"acct-{account:02d}",
        "entry": i,
        "amount": mix % 97 - 20,
        "ts": BASE + i * 25 + account * 3 - mix % DISORDER,
    }


def entries(accounts: int, per_account: int) -> list[dict[str, Any]]:
    """Every entry of the ledger."""
    return [entry(a, i) for a in range(accounts) for i in range(per_account)]


@dataclass(frozen=True)
class Ledger(Source):
    """``accounts`` accounts of ``per_account`` entries; ``numbered``: the accounts are dealt
    round-robin (by their number), else by a hash of their name."""

    accounts: int = 6
    per_account: int = 400
    numbered: bool = True
    records_at_a_time: int = 13

    def splits(self) -> Iterable[Split]:
        return [Split(f"acct-{a:02d}", a if self.numbered else None) for a in range(self.accounts)]

    def record_schema(self) -> pa.Schema:
        return pa.schema(
            [
                ("account", pa.string()),
                ("entry", pa.int64()),
                ("amount", pa.int64()),
                ("ts", pa.int64()),
            ]
        )

    def reader(self, context: SourceContext) -> SplitReader:
        return LedgerReader(self)


class LedgerReader(SplitReader):
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.positions: dict[str, int] = {}
        self.turn = 0

    def add_split(self, split: Split, position: Any) -> None:
        self.positions[split.id] = 0 if position is None else int(position)

    def read(self, max_records: int) -> ReadResult:
        if not self.positions:
            return Nothing()
        self.turn += 1
        if self.turn % 11 == 5:
            return Nothing(0.001)  # (a poll that found nothing)
        accounts = sorted(self.positions)
        split = accounts[self.turn % len(accounts)]
        at = self.positions[split]
        if at >= self.ledger.per_account:
            del self.positions[split]
            return Finished(split)
        account = int(split.split("-")[1])
        count = min(max_records, self.ledger.records_at_a_time, self.ledger.per_account - at)
        rows = [entry(account, i) for i in range(at, at + count)]
        self.positions[split] = at + count
        if account % 2 == 0:
            return Records(pa.RecordBatch.from_pylist(rows, self.ledger.record_schema()), split)
        return Records(rows, split)

    def position(self, split: str) -> int:
        return self.positions[split]


# ------------------------------------------------------------------- contracts broken


@dataclass(frozen=True)
class Broken(Source):
    """A one-account ledger whose reader breaks the contract as ``how`` says: ``raises`` (in
    read), ``wrong`` (read returns a list), ``unpicklable`` (a position of a lock),
    ``stranger`` (records of a split it was not given), ``nameless`` (records of no split)."""

    how: str

    def splits(self) -> Iterable[Split]:
        return [Split("only", 0)]

    def reader(self, context: SourceContext) -> SplitReader:
        return BrokenReader(self.how)


class BrokenReader(SplitReader):
    def __init__(self, how: str) -> None:
        self.how = how
        self.reads = 0

    def add_split(self, split: Split, position: Any) -> None:
        pass

    def read(self, max_records: int) -> Any:
        self.reads += 1
        if self.how == "raises":
            raise ConnectionError("the ledger's server went away")
        if self.how == "wrong":
            return [{"x": 1}]
        if self.how == "stranger":
            return Records([{"x": 1}], "elsewhere")
        if self.how == "nameless":
            return Records([{"x": 1}], None)
        return Records([{"x": self.reads}], "only") if self.reads < 1_000_000 else Finished("only")

    def position(self, split: str) -> Any:
        if self.how == "unpicklable":
            import threading

            return threading.Lock()
        return self.reads


# ------------------------------------------------------------------------ a sink of the API


@dataclass(frozen=True)
class Journal(Sink):
    """A two-phase-commit sink written against ``cutline.connectors`` only: each checkpoint's
    records of a subtask are staged as one JSON-lines file under ``directory/.staging``
    (written on the snapshot thread), committed by renaming it into ``directory``; a restore
    commits the restored staged files (once) and removes the rest its subtasks staged."""

    directory: str
    fail_commit: str | None = None
    """A flag file: the first commit of any writer raises, once (a commit that fails)."""

    def writer(self, context: SinkContext, restored: Mapping[int, Any]) -> SinkWriter:
        return JournalWriter(self.directory, context, restored, self.fail_commit)


class JournalWriter(SinkWriter):
    def __init__(
        self,
        directory: str,
        context: SinkContext,
        restored: Mapping[int, Any],
        fail_commit: str | None = None,
    ) -> None:
        self.fail_commit = fail_commit
        self.directory = Path(directory)
        self.staging = self.directory / ".staging"
        self.staging.mkdir(parents=True, exist_ok=True)
        self.context = context
        self.rows: list[dict[str, Any]] = []
        self.prepared: list[tuple[int, str]] = []  # (checkpoint, file name), not committed
        keep = {name for committables in restored.values() for _, name in committables or ()}
        for name in keep:
            self._publish(name)  # may not have been: once, idempotently
        drop_staged(self.staging, keep, (*restored, context.subtask))

    def write(self, batch: Batch) -> None:
        self.rows += batch.to_pylist() if isinstance(batch, pa.RecordBatch) else list(batch)

    def prepare_commit(self, checkpoint_id: int) -> PendingCommit:
        rows, self.rows = self.rows, []
        if rows:
            name = staged_name(self.context, checkpoint_id)
            self.prepared.append((checkpoint_id, name))
            return Staged(self.staging / name, rows, list(self.prepared))
        return Staged(None, [], list(self.prepared))

    def commit(self, checkpoint_id: int) -> None:
        due = [p for p in self.prepared if p[0] <= checkpoint_id]
        if self.fail_commit is not None and due and first_time(self.fail_commit):
            raise ConnectionError(f"the journal's disk went away committing {due[0][1]}")
        for _, name in due:
            self._publish(name)
        self.prepared = [p for p in self.prepared if p[0] > checkpoint_id]

    def _publish(self, name: str) -> None:
        staged = self.staging / name
        if staged.exists():
            os.replace(staged, self.directory / name)


class Staged(PendingCommit):
    def __init__(self, path: Path | None, rows: list[dict[str, Any]], prepared: list[Any]):
        self.path, self.rows, self.prepared = path, rows, prepared

    def complete(self) -> list[tuple[int, str]]:
        if self.path is not None:
            self.path.write_text("".join(json.dumps(r) + "\n" for r in self.rows))
        return self.prepared  # the committables: every file prepared and not yet committed


def journal(directory: str | Path) -> list[dict[str, Any]]:
    """The records the journal published."""
    return [
        json.loads(line)
        for path in sorted(Path(directory).glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]


@dataclass(frozen=True)
class Ledgerbook(Sink):
    """A sink with a global committer (as a table format has), written against the API only:
    each subtask stages one JSON-lines file per checkpoint (its committable: the file's name);
    the driver's committer publishes every subtask's files of a checkpoint at once and notes
    the checkpoint in ``directory/_committed`` (so that committing it again does nothing).
    ``fail_commit``: a flag file; the first global commit raises, once."""

    directory: str
    fail_commit: str | None = None

    def global_committer(self) -> GlobalCommitter:
        return LedgerbookCommitter(self.directory, self.fail_commit)

    def writer(self, context: SinkContext, restored: Mapping[int, Any]) -> SinkWriter:
        return LedgerbookWriter(Path(self.directory), context, restored)


class LedgerbookWriter(SinkWriter):
    def __init__(self, directory: Path, context: SinkContext, restored: Mapping[int, Any]):
        self.staging = directory / ".staging"
        self.staging.mkdir(parents=True, exist_ok=True)
        self.context = context
        self.rows: list[dict[str, Any]] = []
        keep = {name for names in restored.values() for name in names or ()}
        drop_staged(self.staging, keep, (*restored, context.subtask))

    def write(self, batch: Batch) -> None:
        self.rows += batch.to_pylist() if isinstance(batch, pa.RecordBatch) else list(batch)

    def prepare_commit(self, checkpoint_id: int) -> PendingCommit:
        rows, self.rows = self.rows, []
        name = staged_name(self.context, checkpoint_id)
        return Staged(self.staging / name if rows else None, rows, [name] if rows else [])

    def commit(self, checkpoint_id: int) -> None:
        return None  # (the driver's committer publishes)


class LedgerbookCommitter(GlobalCommitter):
    def __init__(self, directory: str, fail_commit: str | None) -> None:
        self.directory = Path(directory)
        self.fail_commit = fail_commit

    def commit(self, checkpoint_id: int, committables: list[Any]) -> None:
        log = self.directory / "_committed"
        done = log.read_text().split() if log.exists() else []
        if str(checkpoint_id) in done:
            return  # committed before a failure: nothing twice
        if self.fail_commit is not None and any(committables) and first_time(self.fail_commit):
            raise ConnectionError(f"the ledgerbook's table is locked (checkpoint {checkpoint_id})")
        for names in committables:
            for name in names or ():
                os.replace(self.directory / ".staging" / name, self.directory / name)
        with open(log, "a") as out:
            out.write(f"{checkpoint_id}\n")


@dataclass(frozen=True)
class Closing(Ledger):
    """A ledger whose readers note, in ``folder``, each checkpoint they were told of and that
    they were closed."""

    folder: str = ""

    def reader(self, context: SourceContext) -> SplitReader:
        return ClosingReader(self, Path(self.folder) / f"reader-{context.subtask}")


class ClosingReader(LedgerReader):
    def __init__(self, ledger: Ledger, note: Path) -> None:
        super().__init__(ledger)
        self.note = note

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        with open(self.note, "a") as out:
            out.write(f"complete {checkpoint_id}\n")

    def close(self) -> None:
        with open(self.note, "a") as out:
            out.write("closed\n")


def staged_name(context: SinkContext, checkpoint_id: int) -> str:
    """The file a writer stages for a checkpoint (its subtask first, its attempt last)."""
    c = context
    return f"{c.subtask:03d}-{checkpoint_id:08d}-{c.run}-{c.generation}.jsonl"


def drop_staged(staging: Path, keep: set[str], subtasks: Iterable[int]) -> None:
    """Remove what ``subtasks`` staged but ``keep``: staged after the restored checkpoint."""
    mine = {f"{index:03d}" for index in subtasks}
    for staged in staging.iterdir():
        if staged.name.split("-")[0] in mine and staged.name not in keep:
            staged.unlink()


def first_time(flag: str) -> bool:
    """Whether ``flag`` did not exist yet (it does now): for faults that strike once."""
    try:
        os.close(os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True
