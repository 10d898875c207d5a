"""The two inputs of the join tests that fail, stop and restore jobs
(``tests/jobs/test_join_restore.py``, ``tests/spark/test_join_faults.py``), the jobs that join
them, and every join's answer over them in plain Python.

Each input (clicks on the left, views on the right) is several Parquet files overlapping in
event time, as ``write_clicks`` of ``test_event_time_restore.py`` makes them: file ``f``
starts ``STAGGER`` ms after the one before, its clock advances 0-40 ms a record, and each
record's time is its clock minus 0-``BOUND`` ms. The jobs' ``max_out_of_orderness`` is
``BOUND``: no record of a file is ever at or before its watermark, and the join's watermark
(the least of every source subtask's of both inputs) is at or below each of those, so no
record is late and every join's results are fixed by the input alone, however the job is
killed, stopped, restored or rescaled. The right's times are distinct per user, so that an
as-of join never meets two versions of a key at one time (whose answer would be the one that
arrived last: an order across files that the input does not fix).

A test may add records that are late *by construction* (:func:`write_side`'s ``late_at``):
a minute before every other record, placed after the point where the test stops its job
with a savepoint; the restored join starts at the watermark the stopped one had reached, so
each of them is late (to ``.late()``, pairing with nothing) whatever the order of arrival.
"""

from __future__ import annotations

import bisect
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from cutline import DataStream, EventTime, KeyedCoProcessFunction, StreamEnvironment, Tumbling

Row = dict[str, Any]
Result = tuple[Any, ...]

BASE = 1_700_000_000_000
"""Where event time starts (epoch ms)."""
BOUND = 400
"""How far out of order (ms) a file's records come: the jobs' ``max_out_of_orderness``."""
STAGGER = 1500
USERS = 24
ITEMS = 500
"""The regular join's key (``item``) takes this many values: few pairs per record."""
RIGHT_IDS = 1_000_000
"""The right's ids start here (the left's at 0): an id names its record and its side."""
LATE_BY = 60_000
"""Records late by construction are this long (ms) before :data:`BASE`."""

NULLS = 40
"""With ``nulls``, one record in this many has a null key."""

LOWER, UPPER = -300, 100
"""The interval join's ``between`` (ms): a view from 300 ms before a click to 100 ms after."""
WINDOW = 500
"""The window join's tumbling window (ms)."""
JOINS = ("interval", "window", "asof", "regular")


@dataclass(frozen=True)
class Input:
    """One input of a test: the records of each file, in file order (``late``: those late by
    construction, among them)."""

    directory: Path
    files: list[list[Row]]
    late: list[Row]

    @property
    def records(self) -> list[Row]:
        """Every record not late by construction."""
        late = {r["id"] for r in self.late}
        return [r for rows in self.files for r in rows if r["id"] not in late]

    def read_by(self, subtask: int, parallelism: int) -> list[Row]:
        """The records a source subtask reads, in its order (files are sorted by name and
        dealt round-robin)."""
        return [r for f, rows in enumerate(self.files) if f % parallelism == subtask for r in rows]


def write_side(
    directory: Path,
    seed: int,
    *,
    first_id: int,
    files: int,
    per_file: int,
    distinct_times: bool = False,
    late_at: Mapping[int, int] | None = None,
    late_count: int = 5,
    nulls: bool = False,
) -> Input:
    """``files`` Parquet files of ``per_file`` records each (``id``, ``user``, ``item``,
    ``ts``; ids from ``first_id`` on); ``distinct_times``: no two records of a user at one
    time. ``late_at``: file -> index there at which ``late_count`` records late by
    construction are put (the ids after the others'). ``nulls``: one record in
    :data:`NULLS` has no ``user`` and no ``item`` (a null key: it pairs with nothing, and an
    outer join emits it alone)."""
    rng = random.Random(seed)
    directory.mkdir(parents=True)
    taken: set[tuple[str, int]] = set()
    written: list[list[Row]] = []
    late: list[Row] = []
    next_late = first_id + files * per_file
    for f in range(files):
        clock = BASE + f * STAGGER
        rows = []
        for i in range(per_file):
            clock += rng.randint(0, 40)
            user = f"u{rng.randrange(USERS):02d}"
            ts = clock - rng.randint(0, BOUND)
            while distinct_times and (user, ts) in taken:
                ts = clock - rng.randint(0, BOUND)
            taken.add((user, ts))
            item: int | None = rng.randrange(ITEMS)
            if nulls and rng.randrange(NULLS) == 0:
                user, item = None, None  # type: ignore[assignment]
            rows.append({"id": first_id + f * per_file + i, "user": user, "item": item, "ts": ts})
        if late_at is not None and f in late_at:
            mine = []
            for k in range(late_count):
                user, item = f"u{rng.randrange(USERS):02d}", rng.randrange(ITEMS)
                ts = BASE - LATE_BY - k * 7
                mine.append({"id": next_late, "user": user, "item": item, "ts": ts})
                next_late += 1
            rows[late_at[f] : late_at[f]] = mine
            late += mine
        pq.write_table(
            pa.Table.from_pylist(rows), directory / f"part-{f:02d}.parquet", row_group_size=50
        )
        written.append(rows)
    return Input(directory, written, late)


# ------------------------------------------------------------------------------ jobs


def _interval(clicks: DataStream, views: DataStream, name: str, **_: Any) -> DataStream:
    return clicks.interval_join(
        views, on="user", between=(f"{LOWER}ms", f"{UPPER}ms"), how="full", name=name
    )


def _window(clicks: DataStream, views: DataStream, name: str, **_: Any) -> DataStream:
    return clicks.window_join(
        views, on="user", window=Tumbling(f"{WINDOW}ms"), how="left", name=name
    )


def _asof(clicks: DataStream, views: DataStream, name: str, **_: Any) -> DataStream:
    return clicks.asof_join(views, on="user", how="left", name=name)


def _regular(clicks: DataStream, views: DataStream, name: str, ttl: Any = None) -> DataStream:
    return clicks.join(views, on="item", ttl=ttl, name=name)


BUILD: dict[str, Callable[..., DataStream]] = {
    "interval": _interval,
    "window": _window,
    "asof": _asof,
    "regular": _regular,
}


def join_job(
    env: StreamEnvironment,
    left: Input,
    right: Input,
    out: Path,
    kinds: Iterable[str],
    *,
    late: bool = False,
    ttl: Any = None,
    after: Callable[[DataStream], DataStream] | None = None,
) -> None:
    """Clicks (``left``) and views (``right``) into one join of each kind, named by its kind,
    written to ``out/<kind>``; with ``late``, each input's late records to
    ``out/<kind>-late-<side>``; ``ttl``: the regular join's; ``after``: operators after
    every join (chained to it)."""
    time = EventTime("ts", max_out_of_orderness=f"{BOUND}ms")
    clicks = env.read_parquet(left.directory, event_time=time, name="clicks")
    views = env.read_parquet(right.directory, event_time=time, name="views")
    for kind in kinds:
        joined = BUILD[kind](clicks, views, kind, ttl=ttl)
        result = after(joined) if after is not None else joined
        result.write_parquet(out / kind, name=f"{kind}-out")
        if late:
            for side in ("left", "right"):
                joined.late(side, name=f"{kind}-late-{side}").write_parquet(  # type: ignore[attr-defined]
                    out / f"{kind}-late-{side}", name=f"{kind}-late-{side}-out"
                )


SECOND = 1000


class Tally(KeyedCoProcessFunction):
    """Per user, the records of both inputs so far (one count, shared): each record is
    emitted with the count it made (``timer`` 0); and an event-time timer at the last
    millisecond of each second a record of the user is in, shared too, which emits the user
    and the timer's time when it fires (``id`` -1, ``seen`` 0)."""

    def open(self, ctx: Any) -> None:
        self.seen = ctx.value_state("seen")

    def _count(self, record: Any, ctx: Any) -> Any:
        seen = self.seen.get(0) + 1
        self.seen.update(seen)
        ctx.timer_service.register_event_time_timer(_second_end(record["ts"]))
        yield {"user": record["user"], "id": record["id"], "seen": seen, "timer": 0}

    def process_left(self, record: Any, ctx: Any) -> Any:
        return self._count(record, ctx)

    def process_right(self, record: Any, ctx: Any) -> Any:
        return self._count(record, ctx)

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        yield {"user": ctx.key, "id": -1, "seen": 0, "timer": timestamp}


def _second_end(ts: int) -> int:
    return ts - ts % SECOND + SECOND - 1


def tally_job(env: StreamEnvironment, left: Input, right: Input, out: Path) -> None:
    """Clicks and views connected by user into :class:`Tally`, written to ``out/tally``."""
    time = EventTime("ts", max_out_of_orderness=f"{BOUND}ms")
    clicks = env.read_parquet(left.directory, event_time=time, name="clicks")
    views = env.read_parquet(right.directory, event_time=time, name="views")
    clicks.key_by("user").connect(views.key_by("user")).process(
        Tally(), name="tally"
    ).write_parquet(out / "tally", name="tally-out")


# ---------------------------------------------------------------- the answers, in Python


def answer(kind: str, left: list[Row], right: list[Row]) -> Counter[Result]:
    """Every result of the join ``kind`` of ``left`` with ``right``, as :func:`result` has
    them."""
    found: Counter[Result] = Counter()
    match kind:
        case "interval":  # how="full"
            matched: set[int] = set()
            rights = _by(right, "user")
            for c in left:
                mine = [v for v in rights[c["user"]] if LOWER <= v["ts"] - c["ts"] <= UPPER]
                found.update((c["id"], v["id"]) for v in mine)
                matched.update(v["id"] for v in mine)
                if not mine:
                    found[(c["id"], None)] += 1
            found.update((None, v["id"]) for v in right if v["id"] not in matched)
        case "window":  # tumbling, how="left"
            windows: dict[tuple[str, int], list[Row]] = defaultdict(list)
            for v in right:
                if v["user"] is not None:
                    windows[(v["user"], v["ts"] - v["ts"] % WINDOW)].append(v)
            for c in left:
                start = c["ts"] - c["ts"] % WINDOW
                mine = windows.get((c["user"], start), [])
                found.update((start, c["id"], v["id"]) for v in mine)
                if not mine:
                    found[(start, c["id"], None)] += 1
        case "asof":  # how="left"
            versions = {
                user: sorted((v["ts"], v["id"]) for v in rows)
                for user, rows in _by(right, "user").items()
            }
            for c in left:
                times = versions.get(c["user"], [])
                at = bisect.bisect_right(times, (c["ts"], RIGHT_IDS * 2))
                found[(c["id"], times[at - 1][1] if at else None)] += 1
        case "regular":
            items = _by(right, "item")
            found.update((c["id"], v["id"]) for c in left for v in items[c["item"]])
        case _:
            raise AssertionError(kind)
    return found


def result(kind: str, row: Row) -> Result:
    """A published row of the join ``kind``, as :func:`answer` has it: the ids of its left and
    right records (``None``: missing), after its window's start for a window join."""
    if kind == "window":
        assert row["window_end"] == row["window_start"] + WINDOW, row
        return (row["window_start"], row["id"], row["id_right"])
    return (row["id"], row["id_right"])


def _by(rows: Iterable[Row], column: str) -> defaultdict[Any, list[Row]]:
    """The rows of each value of ``column``; a row whose value is null is in none (a null
    key equals nothing)."""
    grouped: defaultdict[Any, list[Row]] = defaultdict(list)
    for r in rows:
        if r[column] is not None:
            grouped[r[column]].append(r)
    return grouped


def assert_once(kind: str, rows: Iterable[Row], wanted: Counter[Result]) -> None:
    """``rows`` are exactly the results ``wanted``, each as many times (once: the ids are
    distinct), none more, none missing."""
    got = Counter(result(kind, r) for r in rows)
    twice = sorted((r for r, n in got.items() if n > wanted.get(r, 0) and r in wanted), key=str)
    missing = sorted((wanted - got).keys(), key=str)
    extra = sorted((got - wanted).keys(), key=str)
    assert not twice, f"{kind}: {len(twice)} results published more than once: {twice[:5]}"
    assert not missing, f"{kind}: {len(missing)} results never published: {missing[:5]}"
    assert not extra, f"{kind}: {len(extra)} results published that should not be: {extra[:5]}"


def assert_tally(published: list[Row], left: Input, right: Input) -> None:
    """Every record counted once, and each user's counts 1..n (one count shared by both
    inputs, never reset, never repeated); every timer fired once: one per user and second
    with a record of either input."""
    rows = [r for r in published if r["timer"] == 0]
    timers = Counter((r["user"], r["timer"]) for r in published if r["timer"] != 0)
    records = (*left.records, *right.records)
    assert timers == Counter({(r["user"], _second_end(r["ts"])) for r in records})
    ids = sorted(r["id"] for r in rows)
    wanted = sorted(r["id"] for r in records)
    assert len(ids) == len(set(ids)), "a record counted twice"
    assert ids == wanted, "every record once"
    counts = _by(rows, "user")
    for user, mine in counts.items():
        assert sorted(r["seen"] for r in mine) == list(range(1, len(mine) + 1)), user
