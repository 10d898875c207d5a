"""A connector written as a third party would, against ``cutline.connectors`` only: a ledger of
accounts, each account a split of numbered entries.

Entry ``i`` of account ``a`` has an amount and an event time (``ts``, epoch ms) that depend on
``a`` and ``i`` alone, at most :data:`DISORDER` ms out of order within the account, so every
result over it is known in plain Python (:func:`entries`). The reader polls its accounts in
turn, a few entries at a time (Arrow batches for even accounts, lists of dicts for odd ones),
now and then has nothing (``Nothing``), and says when an account is finished. Its position in
an account is the number of entries it returned.

Also here: readers that break the contract (for the tests of what cutline says about them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from cutline.connectors import (
    Finished,
    Nothing,
    ReadResult,
    Records,
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
    ``stranger`` (records of a split it was not given)."""

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
        return Records([{"x": self.reads}], "only") if self.reads < 1_000_000 else Finished("only")

    def position(self, split: str) -> Any:
        if self.how == "unpicklable":
            import threading

            return threading.Lock()
        return self.reads
