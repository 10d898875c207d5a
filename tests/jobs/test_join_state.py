"""An interval join and an as-of join over input spanning days of event time at a steady rate
keep a flat state: the rows each join keeps (the figure ``kept`` in its checkpoints'
statistics) and the bytes its checkpoints write are as many at the end of the input as at
its start, and never more than the join's rule allows; and a hot key (keys drawn from a zipf
distribution: a quarter of the records have one key) does not stall the job, whose results
are exactly the plain-Python answer.

The input is one generated source (:class:`Steady`, one split: read by one source subtask)
of both sides' records, interleaved in time order: record ``i`` is the left's when ``i`` is
even, the right's when odd, at ``BASE + (i // 2) * STEP`` less up to ``DISORDER``. Two
``map_batches`` split it into the join's inputs. The reader stops at every ``GATE`` records
until a checkpoint that holds it there is complete: many checkpoints, spread evenly over the
days of event time, by construction. The checkpoints are aligned, so each join subtask
takes its snapshot having processed exactly the records the source had read before it, and
the watermark the source sent with them (after each batch): what it keeps then is what its
rule keeps at that watermark, however the channels of the two inputs interleaved.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from test_event_time_restore import published

from cutline import EventTime, StreamEnvironment, testing
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
from cutline.runtime.checkpoint.stats import CheckpointStats
from cutline.runtime.task.local import ThreadLauncher

BASE = 1_700_000_000_000
DAY = 86_400_000
DAYS = 2
STEP = 8_000
"""Event time (ms) between two records of a side: 10,800 a side a day."""
DISORDER = 1_000
PER_SIDE = DAYS * DAY // STEP
KEYS = 100
ZIPF = 1.1
"""Key ``k`` (0-based) is drawn with a chance in proportion to ``1 / (k + 1) ** ZIPF``: key 0
has about a quarter of the records."""
GATE = 2 * PER_SIDE // 24
"""Records (of both sides) between two gates: 24 gates, one per two hours of event time."""
WITHIN = 60_000
"""The interval join pairs a left record with the right ones up to a minute before it."""


def steady(seed: int) -> pa.Table:
    """Every record of the input: ``id``, ``side`` (0 left, 1 right), ``key``, ``ts``."""
    rng = np.random.default_rng(seed)
    n = 2 * PER_SIDE
    weights = 1 / np.arange(1, KEYS + 1) ** ZIPF
    keys = rng.choice(KEYS, size=n, p=weights / weights.sum())
    index = np.arange(n)
    times = BASE + (index // 2) * STEP - rng.integers(0, DISORDER, size=n)
    return pa.table(
        {"id": index, "side": index % 2, "key": keys.astype(np.int64), "ts": times.astype(np.int64)}
    )


@dataclass(frozen=True)
class Steady(Source):
    """The records of :func:`steady` as one split, the reader stopping every ``GATE`` records
    until a checkpoint holding its position there is complete."""

    seed: int

    def splits(self) -> Iterable[Split]:
        return [Split("steady", 0)]

    def record_schema(self) -> pa.Schema:
        return steady(self.seed).schema

    def reader(self, context: SourceContext) -> SplitReader:
        return SteadyReader(steady(self.seed))


class SteadyReader(SplitReader):
    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self.at: int | None = None
        self.taken: dict[int, int] = {}
        """Checkpoint -> the position it holds."""
        self.passed = 0
        """The gate last passed (a checkpoint holding the reader there completed)."""

    def add_split(self, split: Split, position: Any) -> None:
        self.at = 0 if position is None else int(position)
        self.passed = self.at - self.at % GATE

    def read(self, max_records: int) -> ReadResult:
        if self.at is None:
            return Nothing()
        if self.at >= self.table.num_rows:
            self.at = None
            return Finished("steady")
        gate = self.passed + GATE
        if self.at == gate:
            return Nothing(0.005)  # (until checkpoint_complete lets it through)
        count = min(max_records, gate - self.at, self.table.num_rows - self.at)
        rows = self.table.slice(self.at, count).to_batches()[0]
        self.at += count
        return Records(rows, "steady")

    def position(self, split: str) -> int:
        assert self.at is not None
        return self.at

    def positions_taken(self, checkpoint_id: int, positions: Any) -> None:
        if "steady" in positions:
            self.taken[checkpoint_id] = int(positions["steady"])

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        at = self.taken.pop(checkpoint_id, None)
        if at is not None and at % GATE == 0:
            self.passed = max(self.passed, at)


@dataclass(frozen=True)
class OneSide:
    """The records of one side (``map_batches``)."""

    side: int

    @property
    def __name__(self) -> str:
        return f"side_{self.side}"

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch.filter(pc.equal(batch.column("side"), self.side))


def interval_answer(left: list[dict[str, Any]], right: list[dict[str, Any]]) -> Counter[Any]:
    """Each (left id, right id) with ``-WITHIN <= right.ts - left.ts <= 0``, equal keys."""
    by_key: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for r in right:
        by_key[r["key"]].append((r["ts"], r["id"]))
    for rows in by_key.values():
        rows.sort()
    found: Counter[Any] = Counter()
    for c in left:
        mine = by_key.get(c["key"], [])
        start = bisect.bisect_left(mine, (c["ts"] - WITHIN, -1))
        stop = bisect.bisect_right(mine, (c["ts"], 1 << 62))
        found.update((c["id"], rid) for _, rid in mine[start:stop])
    return found


def asof_answer(left: list[dict[str, Any]], right: list[dict[str, Any]]) -> Counter[Any]:
    """Each left id with the id of the latest right record of its key at or before it."""
    by_key: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for r in right:
        by_key[r["key"]].append((r["ts"], r["id"]))
    for rows in by_key.values():
        rows.sort()
    found: Counter[Any] = Counter()
    for c in left:
        mine = by_key.get(c["key"], [])
        at = bisect.bisect_right(mine, (c["ts"], 1 << 62))
        found[(c["id"], mine[at - 1][1] if at else None)] += 1
    return found


def rows_in(span: int) -> int:
    """The most records of one side whose times fit in ``span + 1`` ms (record ``j``'s time is
    ``j * STEP`` less under ``DISORDER < STEP``)."""
    return span // STEP + 2


@dataclass(frozen=True)
class Kept:
    """What a join kept at one checkpoint."""

    watermark: int
    rows: int
    """The figure ``kept``, summed over its subtasks."""
    bytes: int
    """What its subtasks wrote for it (the kernels' tables, beside the empty keyed state)."""


def kept(checkpoints: list[CheckpointStats], join: str) -> list[Kept]:
    """What ``join`` kept at each checkpoint (not the final one) once its watermark is in the
    input's event time."""
    found = []
    for c in checkpoints:
        watermark = c.watermarks().get(join)
        if c.final or watermark is None or watermark < BASE:
            continue
        written = sum(s.segments_size for name, s in c.subtasks.items() if name.startswith(join))
        found.append(Kept(watermark, c.event_time()[join]["kept"], written))
    return found


def test_an_interval_and_an_asof_join_keep_a_flat_state_over_days_with_a_hot_key(
    tmp_path: Path,
) -> None:
    seed = 11
    env = StreamEnvironment(
        2,
        checkpoint_interval=0.02,
        checkpoint_dir=tmp_path / "ck",
        batch_size=100,
    )
    time = EventTime("ts", max_out_of_orderness=f"{DISORDER}ms")
    both = env.from_source(Steady(seed), name="steady", event_time=time)
    left = both.map_batches(OneSide(0), name="left")
    right = both.map_batches(OneSide(1), name="right")
    left.interval_join(
        right, on="key", between=(f"-{WITHIN}ms", "0s"), name="interval"
    ).write_parquet(tmp_path / "interval", name="interval-out")
    left.asof_join(right, on="key", how="left", name="asof").write_parquet(
        tmp_path / "asof", name="asof-out"
    )
    result = testing.execute(env, launcher=ThreadLauncher())

    rows = steady(seed).to_pylist()
    lefts, rights = rows[0::2], rows[1::2]
    hot = Counter(r["key"] for r in rows).most_common(1)[0][1]
    assert hot > len(rows) // 6, "a hot key"
    for join, wanted in (
        ("interval", interval_answer(lefts, rights)),
        ("asof", asof_answer(lefts, rights)),
    ):
        got = Counter((r["id"], r["id_right"]) for r in published(tmp_path / join))
        assert got == wanted, join

    # the rows a join keeps at a watermark w, which is the newest time read less DISORDER + 1:
    # the interval join, the right's after w - WITHIN and the left's after w; the as-of join,
    # the newest version of each key at or before w, the right's after w and the left's after
    # w (pending): each side's records after w fit in DISORDER + 1 ms
    ahead = rows_in(DISORDER + 1)
    bounds = {"interval": rows_in(WITHIN + DISORDER + 1) + ahead, "asof": KEYS + 2 * ahead}
    span = DAYS * DAY
    for join, bound in bounds.items():
        marks = kept(result.checkpoints, join)
        early = [k for k in marks if k.watermark < BASE + span // 3]
        late = [k for k in marks if k.watermark >= BASE + 2 * span // 3]
        assert len(early) >= 5 and len(late) >= 5, (join, len(marks))
        assert max(k.rows for k in marks) <= bound, (join, marks)
        # flat: no more rows at the end than at the start, nor bytes beyond what the rows that
        # may differ take (4 int64 columns: 32 bytes a row, and as many for Arrow's buffers)
        assert max(k.rows for k in late) <= max(k.rows for k in early), (join, marks)
        most = max(k.bytes for k in early) + bound * 64
        assert max(k.bytes for k in late) <= most, (join, marks)
