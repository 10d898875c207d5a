"""The window operators against each other and against plain Python, over random input.

The same random records, cut into random batches (Arrow or Python records) with watermarks
between them, go through the keyed layout (:class:`KeyedWindows`), the columnar ones
(:class:`ColumnarWindows`, :class:`ColumnarSessions`, the memory backend's) and the runs
(:class:`RunWindows`, :class:`SlicedRuns`, the disk backend's), each checkpointed and
restored at random points (at another parallelism too): all publish the same windows with
the same results, send the same records to ``late``, and equal a plain Python computation of
the windows the watermark passed.
"""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter, defaultdict
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline.protocol.watermarks import MAX_WATERMARK
from cutline.runtime.eventtime.aggregations import Aggregation, Kind
from cutline.runtime.eventtime.assigners import Session, Sliding, Tumbling
from cutline.runtime.eventtime.columnar_sessions import ColumnarSessions
from cutline.runtime.eventtime.columnar_windows import ColumnarWindows
from cutline.runtime.eventtime.keyed import KeyedWindows
from cutline.runtime.eventtime.logic import WindowLogic
from cutline.runtime.eventtime.operator import WindowOperator
from cutline.runtime.eventtime.run_windows import RunWindows
from cutline.runtime.eventtime.sliced_runs import SlicedRuns
from cutline.runtime.eventtime.timestamps import EventTimeError, TimeColumn
from cutline.runtime.operators import OperatorContext
from cutline.runtime.state.config import StateConfig
from cutline.runtime.state.keygroups import key_group_range
from cutline.runtime.state.segments import SegmentRef
from zone_windows import changes, windows_over

MAX_PARALLELISM = 16


class Store:
    """An in-memory segment store and source (what a checkpoint's folder is to the backend)."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.written = 0

    def write_segment(self, name: str, data: bytes, *, shared: bool = False) -> SegmentRef:
        self.files[name] = data
        return SegmentRef(name, len(data), "", True)

    def read_segment(self, ref: SegmentRef) -> bytes:
        return self.files[ref.path]


def context(
    subtask: int,
    parallelism: int,
    backend: str,
    store: Store | None,
    *,
    full_every: int = 10,
    restored: int | None = None,
    **config: Any,
) -> OperatorContext:
    """``config``: more of the :class:`StateConfig`."""
    return OperatorContext(
        name="window",
        subtask=subtask,
        parallelism=parallelism,
        max_parallelism=MAX_PARALLELISM,
        generation=1,
        state=StateConfig(backend=backend, full_every=full_every, **config),
        restore_store=store,  # type: ignore[arg-type]
        restore_checkpoint=restored,
        side_outputs=frozenset({"late"}),  # (the job reads .late())
    )


class Job:
    """One window operator per subtask, keys routed by key group, as the runtime does."""

    def __init__(
        self,
        logic: WindowLogic,
        backend: str,
        parallelism: int,
        state: Any = None,
        *,
        full_every: int = 10,
        restored: int | None = None,
        layout: Any = None,
        **config: Any,
    ):
        """``restored``: the id of the checkpoint ``state`` is (later checkpoints may build on
        its chains); ``layout``: the window store (default: the one the logic picks for the
        backend); ``config``: more of the :class:`StateConfig`."""
        self.logic, self.backend, self.parallelism = logic, backend, parallelism
        self.layout = layout
        self.store = Store() if state is None else state[0]
        restored_id = restored
        handles = [] if state is None else state[1]
        self.ops: list[WindowOperator] = []
        for i in range(parallelism):
            mine = key_group_range(i, parallelism, MAX_PARALLELISM)
            mine_handles = [
                h
                for h in handles
                if h["key_groups"][0] < mine.stop and mine.start < h["key_groups"][1]
            ]
            ctx = context(
                i,
                parallelism,
                backend,
                self.store,
                full_every=full_every,
                restored=restored_id,
                **config,
            )
            handed = mine_handles or None
            op = (
                logic.open(ctx, handed)
                if layout is None
                else WindowOperator(logic, ctx, handed, layout)
            )
            self.ops.append(op)
        self.output: list[dict[str, Any]] = []
        self.late: list[dict[str, Any]] = []

    def subtask_of(self, key: str) -> int:
        from cutline.runtime.state.keygroups import key_group, subtask_for_key_group

        return subtask_for_key_group(
            key_group(key, MAX_PARALLELISM), self.parallelism, MAX_PARALLELISM
        )

    def process(self, records: list[dict[str, Any]], arrow: bool) -> None:
        parts: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for r in records:
            parts[self.subtask_of(r["user"])].append(r)
        for i, part in parts.items():
            batch: Any = pa.RecordBatch.from_pylist(part) if arrow else part
            self._take(self.ops[i], self.ops[i].process(batch))

    def watermark(self, w: int) -> None:
        for op in self.ops:
            self._take(op, op.on_watermark(w))

    def _take(self, op: WindowOperator, out: Any) -> None:
        if out is not None:
            self.output += out.to_pylist() if isinstance(out, pa.RecordBatch) else out
        late = op.side_output("late")
        if late is not None:
            self.late += late.to_pylist() if isinstance(late, pa.RecordBatch) else late

    def checkpoint(self, n: int, base: int | None = None) -> tuple[Store, list[dict[str, Any]]]:
        handles = [
            op.snapshot(n, base=base).write(self.store, f"c{n}-s{i}")
            for i, op in enumerate(self.ops)
        ]
        return self.store, handles

    def close(self) -> None:
        for op in self.ops:
            op.close()


def expected(
    arrivals: list[tuple[dict[str, Any], int]],
    assigner: Tumbling | Sliding,
    kind: str,
    lateness: int,
) -> tuple[dict[tuple[str, int], Any], list[dict[str, Any]]]:
    """Each window's result over the records that came to it on time, and the records late
    for every window they belong to; ``arrivals``: each record with the watermark it met."""
    windows: dict[tuple[str, int], list[int]] = defaultdict(list)
    size = assigner.size
    every = assigner.every if isinstance(assigner, Sliding) else size
    late = []
    for r, watermark in arrivals:
        start = r["ts"] - r["ts"] % every
        on_time = False
        while start + size > r["ts"]:
            if start + size - 1 + lateness > watermark:
                windows[(r["user"], start)].append(r["n"])
                on_time = True
            start -= every
        if not on_time:
            late.append(r)
    reduce = {"count": len, "sum": sum, "min": min, "max": max, "mean": lambda v: sum(v) / len(v)}
    return {w: reduce[kind](v) for w, v in windows.items()}, late


@settings(max_examples=40, deadline=None)  # (make soak: 2,000, below)
@given(
    seed=st.integers(0, 2**32 - 1),
    kind=st.sampled_from(["count", "sum", "min", "max", "mean"]),
    windows=st.sampled_from(["tumbling", "sliding", "session"]),
    lateness=st.sampled_from([0, 0, 300]),
    switch=st.booleans(),
)
def test_the_columnar_and_the_keyed_window_operators_agree_through_restores(
    seed: int, kind: str, windows: str, lateness: int, switch: bool
) -> None:
    """With ``switch``, each restore takes a backend at random: the keyed layout restores
    what the columnar one wrote, and the other way round (a savepoint restored under the
    other ``state_backend``)."""
    rng = random.Random(seed)
    assigner: Tumbling | Sliding | Session = {
        "tumbling": Tumbling("300ms"),
        "sliding": Sliding("400ms", every="100ms"),
        "session": Session(gap="60ms"),
    }[windows]
    aggregation = Aggregation(kind) if kind == "count" else Aggregation(kind, "n")
    logic = WindowLogic(assigner, aggregation, "user", TimeColumn("ts", 0, pa.int64()), lateness)
    records = []
    t = 0
    for _ in range(rng.randint(1, 300)):
        t += rng.randint(0, 20)
        records.append(
            {
                "user": f"u{rng.randrange(9)}",
                "ts": t - rng.randint(0, 150),
                "n": rng.randint(-5, 50),
            }
        )
    jobs = {backend: Job(logic, backend, rng.randint(1, 3)) for backend in ("memory", "disk")}
    jobs["keyed"] = Job(logic, "memory", rng.randint(1, 3), layout=KeyedWindows)
    columnar = ColumnarSessions if windows == "session" else ColumnarWindows
    assert all(isinstance(op.store, columnar) for op in jobs["memory"].ops)
    on_disk = {"tumbling": RunWindows, "sliding": SlicedRuns, "session": KeyedWindows}[windows]
    assert all(type(op.store) is on_disk for op in jobs["disk"].ops)
    position, watermark, checkpoint = 0, -(2**63), 0
    arrivals: list[tuple[dict[str, Any], int]] = []
    while position < len(records):
        take = rng.randint(1, 40)
        batch = records[position : position + take]
        position += take
        arrivals += [(r, watermark) for r in batch]
        arrow = rng.random() < 0.7
        for job in jobs.values():
            job.process(batch, arrow)
        if rng.random() < 0.6:  # a watermark that may make later records late
            watermark = max(watermark, max(r["ts"] for r in batch) - rng.randint(0, 200))
            for job in jobs.values():
                job.watermark(watermark)
        if rng.random() < 0.2:  # a checkpoint, and a restore from it at another parallelism
            checkpoint += 1
            parallelism = rng.randint(1, 3)
            for name, job in list(jobs.items()):
                state = job.checkpoint(checkpoint)
                # restored under either backend: the other layout reads what this one wrote
                backend = rng.choice(["memory", "disk"]) if switch else job.backend
                restored = Job(logic, backend, parallelism, state, layout=job.layout)
                restored.output, restored.late = job.output, job.late
                job.close()
                jobs[name] = restored
    for job in jobs.values():
        job.watermark(MAX_WATERMARK)
    memory = jobs["memory"]

    def results(job: Job) -> Counter[tuple[Any, ...]]:
        return Counter(
            (r["user"], r["window_start"], r["window_end"], round(r[aggregation.output], 9))
            for r in job.output
        )

    def last(job: Job) -> dict[tuple[str, int, int], Any]:
        found = {}
        for r in job.output:
            found[(r["user"], r["window_start"], r["window_end"])] = r[aggregation.output]
        return found

    def sessions(job: Job) -> dict[tuple[str, int, int], Any]:
        """The sessions as they were last published: one that a later result of its key
        covers (it grew, a record within the lateness bridging it) is left out."""
        found: dict[tuple[str, int, int], Any] = {}
        for r in job.output:
            user, start, end = r["user"], r["window_start"], r["window_end"]
            for older in [w for w in found if w[0] == user and start <= w[1] and w[2] <= end]:
                del found[older]
            found[(user, start, end)] = r[aggregation.output]
        return found

    for other in (jobs["disk"], jobs["keyed"]):
        if lateness == 0:  # (with lateness, how often a window fires again may differ)
            assert results(memory) == results(other)
        if windows == "session":
            assert sessions(memory) == pytest.approx(sessions(other))
        else:
            assert last(memory) == pytest.approx(last(other))
        assert Counter(map(str, memory.late)) == Counter(map(str, other.late))
    if windows == "session":
        for job in jobs.values():
            job.close()
        return
    # the last result of each window is its result over the records that came on time to it
    wanted, late = expected(arrivals, assigner, kind, lateness)
    assert Counter(map(str, memory.late)) == Counter(map(str, late))
    final: dict[tuple[str, int], Any] = {}
    for r in memory.output:
        final[(r["user"], r["window_start"])] = r[aggregation.output]
    assert final.keys() == wanted.keys()
    assert all(final[w] == pytest.approx(wanted[w]) for w in wanted)
    if lateness == 0:
        assert len(memory.output) == len(wanted), "each window fired once"
    for job in jobs.values():
        job.close()


@pytest.mark.parametrize(
    ("backend", "windows", "arrow"),
    [
        ("memory", "tumbling", True),
        ("memory", "session", True),
        ("disk", "sliding", True),
        ("memory", "tumbling", False),
    ],
)
def test_late_records_nobody_reads_are_counted_and_let_go(
    tmp_path: Any, backend: str, windows: str, arrow: bool
) -> None:
    """Without a ``.late()`` reader (no side output in the context), a window operator keeps
    nothing of the records too late for their windows: 200,000 of them leave its memory (Python
    objects and Arrow buffers) where it was, and each is counted."""
    import tracemalloc

    logic = counting(windows)
    ctx = OperatorContext(
        name="window",
        subtask=0,
        parallelism=1,
        max_parallelism=MAX_PARALLELISM,
        generation=1,
        state=StateConfig(backend=backend, local_dir=str(tmp_path)),
    )
    op = logic.open(ctx, None)
    op.process(pa.RecordBatch.from_pylist([{"user": "u0", "ts": 10_000, "n": 1}]))
    op.on_watermark(1_000_000)  # every record below is late

    def late_batch(i: int) -> Any:
        rows = [{"user": f"u{j % 50}", "ts": j, "n": i} for j in range(1000)]
        return pa.RecordBatch.from_pylist(rows) if arrow else rows

    for i in range(5):  # (warm up: whatever the first batches allocate once)
        op.process(late_batch(i))
    tracemalloc.start()
    try:
        python_before = tracemalloc.get_traced_memory()[0]
        arrow_before = pa.total_allocated_bytes()
        for i in range(200):
            op.process(late_batch(i))
        python_grown = tracemalloc.get_traced_memory()[0] - python_before
        arrow_grown = pa.total_allocated_bytes() - arrow_before
    finally:
        tracemalloc.stop()
    # 200,000 records kept would be several MB as Arrow and tens of MB as Python dicts
    assert python_grown < 256 * 1024, python_grown
    assert arrow_grown < 256 * 1024, arrow_grown
    assert op.late_records == 205_000
    assert op.side_output("late") is None
    op.close()


@pytest.mark.slow
@pytest.mark.timeout(3600)  # (2,000 examples: about 15 minutes on 2 busy cores)
def test_the_window_layouts_agree_through_restores_under_either_backend_soak() -> None:
    """``make soak``: the property above over 2,000 examples, every restore under a backend
    drawn at random, allowed lateness in most (fired windows restored across the layouts)."""
    inner = test_the_columnar_and_the_keyed_window_operators_agree_through_restores
    run = settings(max_examples=2_000, deadline=None, database=None)(
        given(
            seed=st.integers(0, 2**32 - 1),
            kind=st.sampled_from(["count", "sum", "min", "max", "mean"]),
            windows=st.sampled_from(["tumbling", "sliding", "session"]),
            lateness=st.sampled_from([0, 300, 300]),
            switch=st.just(True),
        )(inner.hypothesis.inner_test)  # type: ignore[attr-defined]
    )
    run()


@pytest.mark.parametrize(
    ("backend", "windows", "before", "after"),
    [("memory", "tumbling", 2, 3), ("disk", "sliding", 3, 1), ("memory", "session", 1, 2)],
)
def test_late_counts_are_carried_by_a_restore_once_whatever_the_parallelism(
    backend: str, windows: str, before: int, after: int
) -> None:
    """Each subtask's count of late records goes into its checkpoint; a restore at another
    parallelism gives each old subtask's count to the one new subtask that owns its first key
    group, so the operator's total goes on from where it was, each record counted once."""
    logic = counting(windows)
    job = Job(logic, backend, before)
    job.process([{"user": f"u{i}", "ts": 10_000, "n": 1} for i in range(20)], arrow=True)
    job.watermark(1_000_000)
    job.process([{"user": f"u{i % 20}", "ts": i, "n": 1} for i in range(37)], arrow=True)
    assert sum(op.late_records for op in job.ops) == 37
    state = job.checkpoint(1)
    job.close()
    restored = Job(logic, backend, after, state)
    assert sum(op.late_records for op in restored.ops) == 37
    restored.process([{"user": f"u{i % 20}", "ts": i, "n": 1} for i in range(5)], arrow=True)
    assert sum(op.late_records for op in restored.ops) == 42
    again = Job(logic, backend, before, restored.checkpoint(2))
    assert sum(op.late_records for op in again.ops) == 42
    restored.close()
    again.close()


@pytest.mark.parametrize("backend", ["memory", "disk"])
@pytest.mark.parametrize("seed", range(4))
def test_windows_with_an_offset_start_at_it_in_either_layout(backend: str, seed: int) -> None:
    """``offset=`` shifts tumbling and sliding windows from the epoch: each record counts in
    the windows ``[offset + k * step, ... + size)`` that hold it, and nowhere else."""
    rng = random.Random(seed)
    size = rng.choice([1000, 3000, 86_400_000])
    every = rng.choice([size, size // 2 if size % 2 == 0 else size, size // 3])
    offset = rng.randrange(every)
    length, step, shift = (dt.timedelta(milliseconds=n) for n in (size, every, offset))
    assigner: Tumbling | Sliding = (
        Tumbling(length, offset=shift) if every == size else Sliding(length, step, offset=shift)
    )
    records = [
        {"user": f"u{rng.randrange(3)}", "ts": rng.randrange(-5 * size, 5 * size), "n": 1}
        for _ in range(300)
    ]
    wanted: Counter[tuple[str, int]] = Counter()
    for r in records:
        start = r["ts"] - (r["ts"] - offset) % every
        while start + size > r["ts"]:
            wanted[(r["user"], start)] += 1
            start -= every
    output = counted(assigner, backend, records)
    found = {(o["user"], o["window_start"]): o["count"] for o in output}
    assert found == dict(wanted)
    assert all(o["window_end"] - o["window_start"] == size for o in output)
    assert all((o["window_start"] - offset) % every == 0 for o in output)


def test_an_offset_not_less_than_the_period_is_refused_naming_the_one_that_works() -> None:
    with pytest.raises(
        EventTimeError, match=r"Tumbling\(24h\): offset=29h must be less than 24h .*windows of 5h"
    ):
        Tumbling("1 d", offset="29h")
    with pytest.raises(
        EventTimeError, match=r"Sliding\(10min, every=1min\): offset=1min must be less"
    ):
        Sliding("10 min", every="1 min", offset="1 min")
    assert str(Tumbling("1 d", offset="5h")) == "Tumbling(24h, offset=5h)"
    assert str(Tumbling("1 d")) == "Tumbling(24h)"  # (an operator's id is made from it)


def counting(windows: str) -> WindowLogic:
    """A count per user of ``windows`` (``tumbling``: 1 s, ``sliding``: 2 s every 1 s,
    ``session``: gap 100 ms) on the integer times of ``ts``."""
    assigner: Tumbling | Sliding | Session = {
        "tumbling": Tumbling("1s"),
        "sliding": Sliding("2s", every="1s"),
        "session": Session(gap="100ms"),
    }[windows]
    return WindowLogic(assigner, Aggregation("count"), "user", TimeColumn("ts", 0, pa.int64()))


@pytest.mark.parametrize("backend", ["memory", "disk"])
@pytest.mark.parametrize(
    ("zone", "size"),
    [
        ("America/New_York", "1 d"),
        ("America/New_York", "2 d"),
        ("America/New_York", "1 h"),
        ("Europe/Berlin", "6 h"),
        ("Australia/Lord_Howe", "30 min"),
        ("America/Havana", "1 d"),
    ],
)
def test_windows_in_a_time_zone_follow_its_local_clock_across_dst(
    backend: str, zone: str, size: str
) -> None:
    """``Tumbling(size, time_zone=zone)``: windows of the zone's local clock from its
    midnight, in either layout, over the days around both changes of 2024: each record
    counted in the window the definition gives it, each window ending where it says (days of
    23 and 25 hours in New York, 6 h windows of 5 and 7 in Berlin, half hours that end at
    Lord Howe's half-hour jump, Havana's days that start at 01:00 or at the first of two
    midnights)."""
    assigner = Tumbling(size, time_zone=zone)
    rng = random.Random(size)
    starts: list[int] = []
    records = []
    for change in changes(zone, 2024):
        first, last = change - 5 * 86_400_000, change + 5 * 86_400_000
        starts += windows_over(zone, assigner.size, first, last)
        records += [
            {"user": f"u{i % 2}", "ts": rng.randrange(first, last), "n": 1} for i in range(150)
        ]
    starts = sorted(set(starts))
    wanted: Counter[tuple[str, int, int]] = Counter()
    for r in records:
        i = max(i for i, s in enumerate(starts) if s <= r["ts"])
        wanted[(r["user"], starts[i], starts[i + 1])] += 1
    output = counted(assigner, backend, records)
    found = {(o["user"], o["window_start"], o["window_end"]): o["count"] for o in output}
    assert found == dict(wanted)


def test_a_time_zone_takes_sizes_that_divide_a_day_or_whole_days_and_must_be_one() -> None:
    with pytest.raises(
        EventTimeError,
        match=r"Tumbling\(7h\): time_zone='America/New_York' takes a size that divides a day "
        r".* 7h is neither",
    ):
        Tumbling("7 h", time_zone="America/New_York")
    with pytest.raises(EventTimeError, match=r"Tumbling\(25h\): .* 25h is neither"):
        Tumbling("25 h", time_zone="Europe/Berlin")
    with pytest.raises(
        EventTimeError,
        match=r"Tumbling\(1h\): offset=30min with time_zone='Asia/Kolkata': .* leave offset= out",
    ):
        Tumbling("1 h", offset="30 min", time_zone="Asia/Kolkata")
    with pytest.raises(EventTimeError, match=r"time_zone='Mars/Olympus' is no time zone"):
        Tumbling("1 d", time_zone="Mars/Olympus")
    with pytest.raises(EventTimeError, match=r"time_zone='America' is no time zone"):
        Tumbling("1 h", time_zone="America")
    assert str(Tumbling("1 d", time_zone="UTC")) == "Tumbling(24h, time_zone=UTC)"
    assert str(Tumbling("15 min", time_zone="Australia/Lord_Howe")) == (
        "Tumbling(15min, time_zone=Australia/Lord_Howe)"
    )
    assert Tumbling("2 d", time_zone="+05:30").size == 2 * 86_400_000


@pytest.mark.parametrize(
    ("backend", "windows"),
    [("memory", "tumbling"), ("disk", "tumbling"), ("memory", "session"), ("disk", "session")],
)
def test_early_results_come_every_period_of_processing_time_then_the_final_one(
    backend: str, windows: str
) -> None:
    """``early=``: each open window's result so far (``final`` false) whenever the period of
    processing time has passed, nothing before it, and the final result (``final`` true) when
    the watermark passes its end; windows that fired are not repeated early."""
    base = counting(windows)
    logic = WindowLogic(base.assigner, base.aggregation, "user", base.event_time, early=10_000)
    job = Job(logic, backend, 1)
    job.process([{"user": "a", "ts": 100, "n": 1}, {"user": "b", "ts": 150, "n": 1}], arrow=True)

    def clock(now: int) -> list[dict[str, Any]]:
        job.output = []
        for op in job.ops:
            job._take(op, op.on_processing_time(now))
        return sorted(job.output, key=lambda r: r["user"])

    first = clock(50_000)
    assert [(r["user"], r["count"], r["final"]) for r in first] == [
        ("a", 1, False),
        ("b", 1, False),
    ]
    assert clock(55_000) == []  # (within the period)
    job.process([{"user": "a", "ts": 120, "n": 1}], arrow=True)
    again = clock(60_000)
    assert [(r["user"], r["count"]) for r in again] == [("a", 2), ("b", 1)]
    job.output = []
    job.watermark(10**9)
    final = sorted(job.output, key=lambda r: r["user"])
    assert [(r["user"], r["count"], r["final"]) for r in final] == [("a", 2, True), ("b", 1, True)]
    assert clock(70_000) == []  # (nothing open)
    job.close()


def counted(
    assigner: Tumbling | Sliding, backend: str, records: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """A count per user of ``assigner``'s windows over ``records``, two subtasks of
    ``backend``, every window fired: what they output."""
    logic = WindowLogic(assigner, Aggregation("count"), "user", TimeColumn("ts", 0, pa.int64()))
    job = Job(logic, backend, 2)
    job.process(records, arrow=True)
    job.watermark(10**15)
    job.close()
    return job.output


@pytest.mark.parametrize("backend", ["disk", "memory"])
@pytest.mark.parametrize("arrow", [True, False])
def test_a_session_past_its_lateness_when_it_fires_is_dropped_as_it_fires(
    backend: str, arrow: bool
) -> None:
    """A session whose cleanup time (its end - 1 + the allowed lateness) the watermark has
    passed when it fires is published and dropped at once, whether the watermark got there in
    one step or in two: what a job holds and publishes after a watermark does not depend on
    the steps it came in (how the sources' reads happened to be cut). A record on time for the
    session it alone opens, touching the dropped session, starts a session of its own: it does
    not merge into the dropped one and publish it again."""
    logic = WindowLogic(
        Session(gap="500ms"),
        Aggregation(Kind.MAX, "n"),
        "user",
        TimeColumn("ts", 0, pa.int64()),
        1000,
    )
    # the session [100, 800) fires at 799 and is past at 799 + 1000 = 1799
    for steps in ((2000,), (900, 2000)):
        job = Job(logic, backend, 1)
        job.process([{"user": "a", "ts": 100, "n": 1}, {"user": "a", "ts": 300, "n": 5}], arrow)
        for watermark in steps:
            job.watermark(watermark)
        (op,) = job.ops
        assert op.figures() == {"late": 0, "windows": 0, "timers": 0}, steps  # nothing kept
        # [700, 1200) alone is past only at 1199 + 1000 = 2199: on time
        job.process([{"user": "a", "ts": 700, "n": 2}], arrow)
        job.watermark(2100)
        assert job.output == [
            {"user": "a", "window_start": 100, "window_end": 800, "n": 5},
            {"user": "a", "window_start": 700, "window_end": 1200, "n": 2},
        ], steps
        assert job.late == []
        job.close()
