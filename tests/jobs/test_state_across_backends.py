"""State written under one state backend, restored under the other: every stateful operator
kind round-tripped through a savepoint from ``state_backend="memory"`` to ``"disk"`` and back,
at the same and at another parallelism, output exact.

The memory backend keeps a built-in window aggregation of a key column as columns, the disk
backend its tumbling and sliding windows as runs (columns too, in parts) and its sessions (and
a user's window function on either) as keyed state; rolling aggregations,
process functions (value, list and map state, event-time timers) and loops keep keyed state
on both. Whatever wrote it, the restored job must go on from exactly where the savepoint was:
each window, each running count and each timer's output published once, with the result a
plain Python computation over the input gives (``tests/jobs/test_event_time_restore.py``
explains the input and how the stop lands by construction).

The checkpoint reader (``cutline checkpoints show`` and the Spark data source read through it)
shows the same windows whichever backend wrote them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from test_event_time_restore import (
    BOUND,
    SOURCE,
    Clicks,
    Kind,
    OnCheckpoint,
    Spending,
    StopWithSavepoint,
    endpoints_of,
    environment,
    published,
    sessions,
    sliding,
    sorted_ids,
    source_positions,
    tumbling,
    write_clicks,
)
from test_savepoints import SavepointOnHold

from cutline import (
    EventTime,
    FixedDelay,
    JobClient,
    KeyedProcessFunction,
    ProcessContext,
    Session,
    Sliding,
    SourceHold,
    State,
    StreamEnvironment,
    Tumbling,
    testing,
)
from cutline.examples.connected_components import components, edge_stream, expected_labels
from cutline.runtime.checkpoint.reader import open_checkpoint
from cutline.runtime.state.columns import COLUMNS
from cutline.runtime.task.local import ThreadLauncher

Row = dict[str, Any]
LATENESS = 1000
"""Every window is kept this long after it fired: the savepoint holds fired windows too."""


def add_amounts(a: Row, b: Row) -> Row:
    return {**a, "amount": a["amount"] + b["amount"]}


def mean(rows: list[Row]) -> float:
    return sum(r["amount"] for r in rows) / len(rows)


WINDOWS: dict[str, Kind] = {
    # built-ins of a key column: columns on the memory backend, keyed state on the disk one
    "tumbling-count": Kind(
        lambda: Tumbling("1s"),
        lambda w, name: w.count(name=name),
        lambda rs: tumbling(rs, 1000),
        len,
        lambda row: row["count"],
    ),
    "tumbling-mean": Kind(
        lambda: Tumbling("1s"),
        lambda w, name: w.mean("amount", name=name),
        lambda rs: tumbling(rs, 1000),
        mean,
        lambda row: row["amount"],
    ),
    "sliding-sum": Kind(
        lambda: Sliding("2s", every="500ms"),
        lambda w, name: w.sum("amount", name=name),
        lambda rs: sliding(rs, 2000, 500),
        lambda rs: sum(r["amount"] for r in rs),
        lambda row: row["amount"],
    ),
    "sliding-min": Kind(
        lambda: Sliding("1500ms", every="500ms"),
        lambda w, name: w.min("amount", name=name),
        lambda rs: sliding(rs, 1500, 500),
        lambda rs: min(r["amount"] for r in rs),
        lambda row: row["amount"],
    ),
    "session-max": Kind(
        lambda: Session(gap="500ms"),
        lambda w, name: w.max("amount", name=name),
        lambda rs: sessions(rs, 500),
        lambda rs: max(r["amount"] for r in rs),
        lambda row: row["amount"],
    ),
    "session-mean": Kind(
        lambda: Session(gap="400ms"),
        lambda w, name: w.mean("amount", name=name),
        lambda rs: sessions(rs, 400),
        mean,
        lambda row: row["amount"],
    ),
    # a user's functions: keyed state on both backends
    "session-aggregate": Kind(
        lambda: Session(gap="500ms"),
        lambda w, name: w.aggregate(Spending(), name=name),
        lambda rs: sessions(rs, 500),
        lambda rs: (len(rs), sum(r["amount"] for r in rs)),
        lambda row: (row["clicks"], row["spent"]),
    ),
    "sliding-process": Kind(
        lambda: Sliding("1500ms", every="500ms"),
        lambda w, name: w.process(sorted_ids, name=name),
        lambda rs: sliding(rs, 1500, 500),
        lambda rs: sorted(r["id"] for r in rs),
        lambda row: list(row["ids"]),
    ),
    "tumbling-reduce": Kind(
        lambda: Tumbling("1s"),
        lambda w, name: w.reduce(add_amounts, name=name),
        lambda rs: tumbling(rs, 1000),
        lambda rs: sum(r["amount"] for r in rs),
        lambda row: row["amount"],
    ),
}
COLUMNAR = ("tumbling-count", "tumbling-mean", "sliding-sum", "sliding-min")
"""The window kinds the memory backend keeps as columns per window (sessions: as rows)."""
SESSION_ROWS = ("session-max", "session-mean")


class Tally(KeyedProcessFunction):
    """Every kind of keyed state and event-time timers: per user, how many records came
    (value state), which records wait for their second to end (list state), how many came in
    each second (map state); a timer at the end of each second publishes that second's count
    and record ids."""

    def open(self, ctx: ProcessContext) -> None:
        self.seen = ctx.value_state("seen")
        self.waiting = ctx.list_state("waiting")
        self.per_second = ctx.map_state("per_second")

    def process(self, record: Row, ctx: ProcessContext) -> list[Row]:
        seen = self.seen.get(0) + 1
        self.seen.update(seen)
        self.waiting.add((record["ts"], record["id"]))
        second = record["ts"] - record["ts"] % 1000
        self.per_second.put(second, self.per_second.get(second, 0) + 1)
        assert ctx.timer_service is not None
        ctx.timer_service.register_event_time_timer(second + 999)
        return [{"user": ctx.key, "what": "seen", "second": 0, "n": seen, "ids": [record["id"]]}]

    def on_timer(self, timestamp: int, ctx: ProcessContext) -> list[Row]:
        second = timestamp - 999
        waiting = self.waiting.get()
        ids = sorted(i for t, i in waiting if t <= timestamp)
        self.waiting.update([(t, i) for t, i in waiting if t > timestamp])
        n = self.per_second.get(second)
        self.per_second.remove(second)
        return [{"user": ctx.key, "what": "second", "second": second, "n": n, "ids": ids}]


def every_kind_job(env: StreamEnvironment, clicks: Clicks, out: Path) -> None:
    """The clicks keyed by user into every window kind, a rolling count and :class:`Tally`,
    each written to ``out/<name>``; every operator named, so that the job restores into
    another of itself."""
    keyed = env.read_parquet(
        clicks.directory, event_time=EventTime("ts", max_out_of_orderness=f"{BOUND}ms"), name=SOURCE
    ).key_by("user")
    for kind, k in WINDOWS.items():
        window = keyed.window(k.assigner(), allowed_lateness=f"{LATENESS}ms")
        k.apply(window, kind).write_parquet(out / kind, name=f"{kind}-out")
    keyed.count(name="rolling").write_parquet(out / "rolling", name="rolling-out")
    keyed.process(Tally(), name="tally").write_parquet(out / "tally", name="tally-out")


# ------------------------------------------------------------------------------ answers


def windows_of(kind: str, rows: Iterable[Row]) -> dict[tuple[str, int, int], Any]:
    """The published windows of ``kind``, each of which must be there once."""
    found: dict[tuple[str, int, int], Any] = {}
    twice = []
    for row in rows:
        window = (row["user"], row["window_start"], row["window_end"])
        if window in found:
            twice.append(window)
        found[window] = WINDOWS[kind].field(row)
    assert not twice, f"{kind}: {len(twice)} windows published more than once: {twice[:5]}"
    return found


def assert_windows(kind: str, rows: Iterable[Row], wanted: dict[Any, Any]) -> None:
    got = windows_of(kind, rows)
    missing = sorted(wanted.keys() - got.keys())
    extra = sorted(got.keys() - wanted.keys())
    wrong = sorted(w for w in wanted.keys() & got.keys() if got[w] != wanted[w])
    assert not missing, f"{kind}: {len(missing)} windows never published: {missing[:5]}"
    assert not extra, f"{kind}: {len(extra)} windows that should not be: {extra[:5]}"
    assert not wrong, f"{kind}: {len(wrong)} wrong results, e.g. " + ", ".join(
        f"{w}: {got[w]!r} instead of {wanted[w]!r}" for w in wrong[:3]
    )


def assert_rolling(rows: list[Row], records: list[Row]) -> None:
    """Every record once, with its user's running count: per user, 1..(its records)."""
    users = Counter(r["user"] for r in records)
    assert sorted(r["id"] for r in rows) == sorted(r["id"] for r in records)
    assert Counter((r["user"], r["count"]) for r in rows) == Counter(
        (u, i) for u, n in users.items() for i in range(1, n + 1)
    )


def assert_tally(rows: list[Row], records: list[Row]) -> None:
    """Each record counted once (running counts 1..n per user, every record's id once), and every user's every second
    published once by its timer, with its count and its records."""
    users = Counter(r["user"] for r in records)
    seen = [r for r in rows if r["what"] == "seen"]
    assert sorted(i for r in seen for i in r["ids"]) == sorted(r["id"] for r in records)
    assert Counter((r["user"], r["n"]) for r in seen) == Counter(
        (u, i) for u, n in users.items() for i in range(1, n + 1)
    )
    seconds: dict[tuple[str, int], list[int]] = {}
    for r in records:
        seconds.setdefault((r["user"], r["ts"] - r["ts"] % 1000), []).append(r["id"])
    fired = [
        ((r["user"], r["second"]), (r["n"], list(r["ids"]))) for r in rows if r["what"] != "seen"
    ]
    assert Counter(w for w, _ in fired) == Counter(seconds.keys()), "every second fires once"
    assert dict(fired) == {w: (len(ids), sorted(ids)) for w, ids in seconds.items()}


def run_to_savepoint(
    tmp_path: Path,
    clicks: Clicks,
    backend: str,
    parallelism: int,
    monkeypatch: pytest.MonkeyPatch,
    name: str = "1",
) -> tuple[str, int]:
    """The job under ``backend``, stopped with a savepoint once every source subtask holds
    half-way into its last file; the savepoint's folder and the watermark at the stop."""
    hold = clicks.hold_in_last_file(parallelism)
    checkpoints = f"checkpoints{name}"
    env = environment(
        tmp_path,
        parallelism,
        checkpoints,
        state=State(backend=backend, dir=tmp_path / f"state{name}"),
    )
    every_kind_job(env, clicks, tmp_path / f"out{name}")
    stop = StopWithSavepoint(tmp_path / checkpoints, endpoints_of(monkeypatch))
    listener = OnCheckpoint(
        tmp_path / checkpoints,
        stop,
        lambda reader: set(source_positions(reader).values()) == {hold},
        hold=hold,
        releases=1000,
    )
    first = testing.execute(
        env,
        launcher=ThreadLauncher(),
        listener=listener,
        hold_sources=SourceHold(records=hold, checkpoints=1000),
    )
    path = stop.answer()
    assert isinstance(path, str), path
    assert first.savepoints == [path] and first.restarts == []
    return path, clicks.watermark_at(parallelism, hold)


@pytest.mark.parametrize(
    ("before", "after", "p_before", "p_after"),
    [
        # (make test: each direction once, each rescaled; make soak: also at the same parallelism)
        pytest.param("memory", "disk", 2, 2, marks=pytest.mark.slow),
        ("memory", "disk", 2, 3),
        pytest.param("disk", "memory", 2, 2, marks=pytest.mark.slow),
        ("disk", "memory", 3, 1),
    ],
)
def test_a_savepoint_restores_under_the_other_backend_exactly(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    before: str,
    after: str,
    p_before: int,
    p_after: int,
) -> None:
    """Every stateful operator kind, stopped with a savepoint under one backend and resumed
    under the other (at the same or another parallelism): the two runs together publish every
    window, running count and timer output exactly once, with its right result."""
    clicks = write_clicks(tmp_path / "in", seed=p_before * 10 + p_after)
    path, watermark = run_to_savepoint(tmp_path, clicks, before, p_before, monkeypatch)
    reader = open_checkpoint(path)
    columnar = {
        kind
        for kind in WINDOWS
        for subtask, handle in reader.handles.items()
        if kind in handle.operators and reader.state_file(subtask).operators[kind].get(COLUMNS)
    }
    # the memory backend kept the built-ins as columns; the disk backend its tumbling and
    # sliding windows as runs, its sessions keyed
    assert columnar == (set(COLUMNAR + SESSION_ROWS) if before == "memory" else set(COLUMNAR))

    env = environment(
        tmp_path, p_after, "checkpoints2", state=State(backend=after, dir=tmp_path / "state2")
    )
    every_kind_job(env, clicks, tmp_path / "out2")
    second = testing.execute(env, launcher=ThreadLauncher(), restore_from=path)
    assert second.restarts == [] and second.restored_from == path

    for kind, k in WINDOWS.items():
        wanted = {w: k.value(rs) for w, rs in k.windows(clicks.records).items()}
        fired = {w: v for w, v in wanted.items() if w[2] - 1 <= watermark}
        assert 0 < len(fired) < len(wanted), "the stop came with windows fired and windows left"
        one, two = published(tmp_path / "out1" / kind), published(tmp_path / "out2" / kind)
        assert_windows(kind, one, fired)
        assert_windows(kind, one + two, wanted)
    for name, check in (("rolling", assert_rolling), ("tally", assert_tally)):
        one, two = published(tmp_path / "out1" / name), published(tmp_path / "out2" / name)
        assert one and two, f"{name}: the stop came in the middle"
        check(one + two, clicks.records)


def shown(value: Any) -> str:
    """A state value as text, a dict's entries in order."""
    return repr(sorted(value.items()) if isinstance(value, dict) else value)


def test_the_reader_shows_the_same_windows_whichever_backend_wrote_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same job stopped at the same place under each backend: every operator's state, read
    entry by entry (what ``cutline checkpoints show`` and ``read_state`` show), is the same,
    though the memory backend keeps the built-in windows as columns (the disk backend's read
    into a memory backend, entry by entry)."""
    clicks = write_clicks(tmp_path / "in", seed=5)
    paths = {
        backend: run_to_savepoint(tmp_path, clicks, backend, 2, monkeypatch, name=backend)[0]
        for backend in ("memory", "disk")
    }
    readers = {backend: open_checkpoint(path) for backend, path in paths.items()}
    # what `cutline checkpoints show` lists: the windows kept as columns count in the size
    sizes = {
        backend: {o.name: (o.kind, o.size) for o in reader.operators()}
        for backend, reader in readers.items()
    }
    for operator in [*WINDOWS, "rolling", "tally"]:
        (kind, memory), (_, disk) = sizes["memory"][operator], sizes["disk"][operator]
        assert kind == "keyed" and disk / 4 < memory < disk * 4, (operator, memory, disk)
    # (the others hold records in the order they came, which differs from run to run)
    for operator in [*COLUMNAR, *SESSION_ROWS, "session-aggregate", "rolling"]:
        entries = {
            backend: sorted(
                (e.state, repr(e.key), shown(e.value), e.key_group)
                for e in reader.keyed_entries(operator)
            )
            for backend, reader in readers.items()
        }
        assert entries["memory"], f"{operator}: the savepoint holds its state"
        assert entries["memory"] == entries["disk"], operator


@pytest.mark.parametrize(
    ("before", "after", "p_before", "p_after"), [("memory", "disk", 2, 3), ("disk", "memory", 2, 1)]
)
def test_a_loop_s_state_restores_under_the_other_backend_exactly(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    before: str,
    after: str,
    p_before: int,
    p_after: int,
) -> None:
    """Connected components (keyed state inside a loop, records on its back edge), stopped
    with a savepoint under one backend half-way through its edges and resumed under the
    other: every label drop published once, every vertex ending with its component's label."""
    edges, vertices = 3_000, 8_000  # (sparse: the second half still joins components)

    def job(backend: str, parallelism: int, name: str) -> StreamEnvironment:
        env = StreamEnvironment(
            parallelism,
            checkpoint_interval=0.05,
            checkpoint_dir=tmp_path / f"checkpoints{name}",
            restart_strategy=FixedDelay(delay=0),
            batch_size=50,
            state=State(backend=backend, dir=tmp_path / f"state{name}"),
        )
        components(edge_stream(env, edges=edges, vertices=vertices)).write_parquet(
            tmp_path / f"out{name}", name="labels"
        )
        return env

    env = job(before, p_before, "1")
    asking = SavepointOnHold(
        endpoints_of(monkeypatch),
        lambda _: JobClient(str(tmp_path / "checkpoints1")).savepoint(stop=True),
    )
    first = testing.execute(
        env,
        launcher=ThreadLauncher(),
        listener=asking,
        # held half-way until the job stops (the stop of a loop waits for it to go quiet)
        hold_sources=SourceHold(records=edges // (2 * p_before), checkpoints=1000),
    )
    path = asking.answer()
    assert isinstance(path, str), path
    assert first.savepoints == [path]
    env = job(after, p_after, "2")
    second = testing.execute(env, launcher=ThreadLauncher(), restore_from=path)
    assert second.restarts == [] and second.restored_from == path
    one, two = published(tmp_path / "out1"), published(tmp_path / "out2")
    assert one and two, "the stop came in the middle"
    pairs = Counter((r["vertex"], r["label"]) for r in one + two)
    assert max(pairs.values()) == 1, "every label drop published once"
    labels: dict[int, int] = {}
    for vertex, label in pairs:
        labels[vertex] = min(label, labels.get(vertex, label))
    assert labels == expected_labels(edges, vertices)
