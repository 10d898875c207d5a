"""Event-time windows across savepoints, restores and failures (threads): every window's result
is published exactly once, and equals the one computed here in plain Python from the same
input.

The input is several Parquet files of clicks over a few dozen users; the files overlap in event
time (each starts ``STAGGER`` ms after the one before and lasts longer than that), and within
each file the records come at most ``BOUND`` ms out of order, which is the job's
``max_out_of_orderness``: no record is ever late, so every window's result is determined by the
input alone, however the job is stopped, failed, restored or rescaled.

Faults land by construction. The sources hold part-way (``SourceHold``), and a listener
(:class:`OnCheckpoint`) acts on a complete checkpoint that it has read and found as the test
needs it (windows fired and kept, watermarks in the channel state, every source at the hold),
and that shows a source subtask still held: it reads on only once the listener has returned,
so the job has input left and cannot end (nor take its final checkpoint) before what the
listener set up happens, however fast the machine. What it sets up: a savepoint that stops
the job; a failure in the snapshot of the next checkpoint (:class:`FailAtNextCheckpoint`: the
job then restores exactly the checkpoint the listener read); or, in the test of a failure at
a random record, nothing: that record is read after the hold, so after a complete checkpoint.

The helpers here are shared with ``tests/spark/test_event_time_faults.py``.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from cutline import (
    AggregateFunction,
    Checkpoints,
    DataStream,
    EventTime,
    FixedDelay,
    JobClient,
    JobFailedError,
    Logic,
    OperatorContext,
    RestoreError,
    RunningOperator,
    Session,
    Sliding,
    SourceHold,
    State,
    StreamEnvironment,
    Tumbling,
    Window,
    testing,
)
from cutline.runtime.checkpoint.reader import CheckpointReader, open_checkpoint
from cutline.runtime.driver.client import JobEndpoint
from cutline.runtime.network.wire import Watermark, WatermarkStatus
from cutline.runtime.task.local import ThreadLauncher

Row = dict[str, Any]
WindowKey = tuple[str, int, int]

BOUND = 400
"""How far out of order (ms) the records of one file come: the jobs' max_out_of_orderness."""
BASE = 1_700_000_000_000
"""Where event time starts (epoch ms)."""
USERS = 36
STAGGER = 1500
"""Each file starts this long (ms) after the one before it."""
SOURCE = "clicks"
"""The name (and uid) of every job's source."""

# ------------------------------------------------------------------------------ input


@dataclass(frozen=True)
class Clicks:
    """The input of a test: the records of each file (``files[f]`` in file ``f``'s order)."""

    directory: Path
    files: list[list[Row]]

    @property
    def records(self) -> list[Row]:
        return [r for rows in self.files for r in rows]

    def files_of(self, subtask: int, parallelism: int) -> list[int]:
        """The files a source subtask reads, in its order (files are sorted by name and dealt
        round-robin)."""
        return [f for f in range(len(self.files)) if f % parallelism == subtask]

    def read_by(self, subtask: int, parallelism: int) -> list[Row]:
        """The records a source subtask reads, in its order."""
        return [r for f in self.files_of(subtask, parallelism) for r in self.files[f]]

    def hold_in_last_file(self, parallelism: int, fraction: float = 0.5) -> int:
        """A hold (records per source subtask) ``fraction`` of the way into the last file of
        the subtasks that read the fewest files (every file holds as many records)."""
        per_file = len(self.files[0])
        shortest = min(len(self.files_of(s, parallelism)) for s in range(parallelism))
        return (shortest - 1) * per_file + int(per_file * fraction)

    def watermark_at(self, parallelism: int, hold: int) -> int:
        """The watermark that reaches the windows once every source subtask read ``hold``
        records (and sent the watermark it made from them): per subtask, the minimum over its
        files of what each promises (a finished file: nothing; the file being read: its
        highest timestamp so far - BOUND - 1; a file not started: its lowest timestamp - 1);
        the minimum over the subtasks."""
        marks = []
        for subtask in range(parallelism):
            left = hold
            mine = []
            for f in self.files_of(subtask, parallelism):
                rows = self.files[f]
                if left <= 0:
                    mine.append(min(r["ts"] for r in rows) - 1)
                elif left <= len(rows):
                    mine.append(max(r["ts"] for r in rows[:left]) - BOUND - 1)
                left -= len(rows)
            marks.append(min(mine))
        return min(marks)


def write_clicks(
    directory: Path,
    seed: int,
    *,
    files: int = 6,
    per_file: int = 300,
    users: int = USERS,
    disorder: int = BOUND,
    stagger: int = STAGGER,
    row_group: int = 50,
) -> Clicks:
    """``files`` Parquet files of clicks (id, user, ts in epoch ms, amount): file ``f`` starts
    at ``BASE + f * stagger``, its clock advances 0-40 ms a record, and each record's time is
    its clock minus 0-``disorder`` ms (so at most ``disorder`` ms out of order)."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for f in range(files):
        clock = BASE + f * stagger
        rows = []
        for i in range(per_file):
            clock += rng.randint(0, 40)
            rows.append(
                {
                    "id": f * per_file + i,
                    "user": f"u{rng.randrange(users):02d}",
                    "ts": clock - rng.randint(0, disorder),
                    "amount": rng.randint(1, 100),
                }
            )
        pq.write_table(
            pa.Table.from_pylist(rows),
            directory / f"clicks-{f:02d}.parquet",
            row_group_size=row_group,
        )
        written.append(rows)
    return Clicks(directory, written)


# --------------------------------------------------------------- the answers, in Python


def tumbling(records: Iterable[Row], size: int) -> dict[WindowKey, list[Row]]:
    windows: dict[WindowKey, list[Row]] = defaultdict(list)
    for r in records:
        start = r["ts"] - r["ts"] % size
        windows[(r["user"], start, start + size)].append(r)
    return dict(windows)


def sliding(records: Iterable[Row], size: int, every: int) -> dict[WindowKey, list[Row]]:
    windows: dict[WindowKey, list[Row]] = defaultdict(list)
    for r in records:
        start = r["ts"] - r["ts"] % every
        while start + size > r["ts"]:
            windows[(r["user"], start, start + size)].append(r)
            start -= every
    return dict(windows)


def sessions(records: Iterable[Row], gap: int) -> dict[WindowKey, list[Row]]:
    """Per user, records less than ``gap`` apart (in time order) are one session, which ends
    ``gap`` after its last record."""
    by_user: dict[str, list[Row]] = defaultdict(list)
    for r in records:
        by_user[r["user"]].append(r)
    windows: dict[WindowKey, list[Row]] = {}
    for user, mine in by_user.items():
        mine.sort(key=lambda r: r["ts"])
        current = [mine[0]]
        for r in mine[1:]:
            if r["ts"] - current[-1]["ts"] > gap:
                windows[(user, current[0]["ts"], current[-1]["ts"] + gap)] = current
                current = []
            current.append(r)
        windows[(user, current[0]["ts"], current[-1]["ts"] + gap)] = current
    return windows


class Spending(AggregateFunction):
    """Clicks and amount spent (the per-record path, with a dict accumulator)."""

    def create_accumulator(self) -> Row:
        return {"clicks": 0, "spent": 0}

    def add(self, record: Row, accumulator: Row) -> Row:
        accumulator["clicks"] += 1
        accumulator["spent"] += record["amount"]
        return accumulator

    def merge(self, a: Row, b: Row) -> Row:
        return {"clicks": a["clicks"] + b["clicks"], "spent": a["spent"] + b["spent"]}

    def get_result(self, accumulator: Row) -> Row:
        return accumulator


def sorted_ids(key: str, window: Window, records: list[Row]) -> list[Row]:
    """A window's record ids, sorted (the per-record path keeping every record in state)."""
    return [
        {
            "user": key,
            "window_start": window.start,
            "window_end": window.end,
            "ids": sorted(r["id"] for r in records),
        }
    ]


@dataclass(frozen=True)
class Kind:
    """One window operator of a test job: how it is built, and its answer in Python."""

    assigner: Callable[[], Tumbling | Sliding | Session]
    apply: Callable[[Any], Any]
    """What the window computes: ``apply(keyed.window(...))``, given its ``name=``."""
    windows: Callable[[Iterable[Row]], dict[WindowKey, list[Row]]]
    value: Callable[[list[Row]], Any]
    """The result of a window from its records."""
    field: Callable[[Row], Any]
    """The result of a window from its output row."""


KINDS: dict[str, Kind] = {
    "tumbling": Kind(
        lambda: Tumbling("1s"),
        lambda w, name: w.count(name=name),
        lambda rs: tumbling(rs, 1000),
        len,
        lambda row: row["count"],
    ),
    "sliding": Kind(
        lambda: Sliding("2s", every="500ms"),
        lambda w, name: w.sum("amount", name=name),
        lambda rs: sliding(rs, 2000, 500),
        lambda rs: sum(r["amount"] for r in rs),
        lambda row: row["amount"],
    ),
    "session": Kind(
        lambda: Session(gap="500ms"),
        lambda w, name: w.count(name=name),
        lambda rs: sessions(rs, 500),
        len,
        lambda row: row["count"],
    ),
    # the per-record path (records that are Python dicts, or a user's function)
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
}
VECTORIZED = ("tumbling", "sliding", "session")


def expected(kind: str, records: Iterable[Row]) -> dict[WindowKey, Any]:
    """Every window of ``kind`` over ``records``, with its result."""
    k = KINDS[kind]
    return {w: k.value(rs) for w, rs in k.windows(records).items()}


def window_job(
    env: StreamEnvironment,
    clicks: Clicks,
    out: Path,
    kinds: Iterable[str],
    *,
    through: Callable[[DataStream], DataStream] | None = None,
    lateness: Any = 0,
    late: bool = False,
) -> None:
    """The clicks, ``through`` (operators between the source and ``key_by``), keyed by user,
    into one window operator per kind, each written to ``out/<kind>`` (its late records, with
    ``late``, to ``out/<kind>-late``). Every operator is named: the job restores into another
    of itself."""
    stream = env.read_parquet(
        clicks.directory, event_time=EventTime("ts", max_out_of_orderness=f"{BOUND}ms"), name=SOURCE
    )
    if through is not None:
        stream = through(stream)
    keyed = stream.key_by("user")
    for kind in kinds:
        result = KINDS[kind].apply(
            keyed.window(KINDS[kind].assigner(), allowed_lateness=lateness), kind
        )
        result.write_parquet(out / kind, name=f"{kind}-out")
        if late:
            result.late().write_parquet(out / f"{kind}-late", name=f"{kind}-late")


def published(directory: Path) -> list[Row]:
    """The rows a file sink published (its pending files are not read)."""
    if not directory.exists():
        return []
    return list(ds.dataset(str(directory), format="parquet").to_table().to_pylist())


def results(kind: str, rows: Iterable[Row]) -> dict[WindowKey, Any]:
    """The published windows of ``kind``, each of which must be there once."""
    found: dict[WindowKey, Any] = {}
    twice = []
    for row in rows:
        window = (row["user"], row["window_start"], row["window_end"])
        if window in found:
            twice.append(window)
        found[window] = KINDS[kind].field(row)
    assert not twice, f"{kind}: {len(twice)} windows published more than once: {twice[:5]}"
    return found


def assert_exact(kind: str, rows: Iterable[Row], wanted: dict[WindowKey, Any]) -> None:
    """``rows`` hold every window of ``wanted`` exactly once, with its result, and no other."""
    got = results(kind, rows)
    missing = sorted(wanted.keys() - got.keys())
    extra = sorted(got.keys() - wanted.keys())
    wrong = sorted(w for w in wanted.keys() & got.keys() if got[w] != wanted[w])
    assert not missing, f"{kind}: {len(missing)} windows never published: {missing[:5]}"
    assert not extra, f"{kind}: {len(extra)} windows published that should not be: {extra[:5]}"
    assert not wrong, f"{kind}: {len(wrong)} wrong results, e.g. " + ", ".join(
        f"{w}: {got[w]!r} instead of {wanted[w]!r}" for w in wrong[:3]
    )


# ------------------------------------------------------------------- looking at checkpoints


def source_positions(reader: CheckpointReader, source: str = SOURCE) -> dict[str, int]:
    """The records each subtask of ``source`` had read when the checkpoint was taken."""
    positions = {}
    for subtask, handle in sorted(reader.handles.items()):
        if source in handle.operators:
            part = reader.state_file(subtask).operators[source]
            # per file: the rows read (its position), or all of them (finished)
            positions[subtask] = sum(
                pq.ParquetFile(split).metadata.num_rows if state.finished else state.position
                for split, state in part["splits"].items()
            )
    return positions


def fired_windows_kept(reader: CheckpointReader, operator: str) -> int:
    """Windows of the window operator ``operator`` that fired and are kept for the allowed
    lateness, in the checkpoint's keyed state."""
    kept = 0
    for entry in reader.keyed_entries(operator):
        if isinstance(entry.value, dict):  # tumbling, sliding: {start: (accumulator, fired)}
            kept += sum(1 for _, fired in entry.value.values() if fired)
        else:  # sessions: ((start, end, accumulator, fired), ...)
            kept += sum(1 for *_, fired in entry.value if fired)
    return kept


def recorded_watermarks(reader: CheckpointReader) -> tuple[int, int]:
    """(records, watermarks) of the channel state an unaligned checkpoint recorded."""
    records = watermarks = 0
    for subtask, handle in sorted(reader.handles.items()):
        if not handle.channel_state:
            continue
        state = reader.state_file(subtask)
        for side in (state.inputs, state.outputs):
            for batches in side.values():
                for batch in batches:
                    if isinstance(batch, Watermark):
                        watermarks += 1
                    elif not isinstance(batch, WatermarkStatus):
                        records += len(batch)
    return records, watermarks


class OnCheckpoint:
    """A job's listener that calls ``act(checkpoint_id)`` once, on the first complete
    checkpoint (not the final one) for which ``ready(reader)`` holds, reading it.

    With ``hold`` (the job runs with ``SourceHold(records=hold, checkpoints=releases)``),
    only on a checkpoint in which some source subtask is at the hold and still held: it reads
    on only after this listener returned, so whatever ``act`` set up sees input after it.
    A source subtask reads exactly up to the hold, and the first ``releases`` checkpoints that
    complete after it began holding all show it there (it is released once the listener has
    been told of that many): so it is still held while fewer than ``releases`` checkpoints
    completed since the first that showed it at the hold, before this one."""

    def __init__(
        self,
        directory: Path,
        act: Callable[[int], None],
        ready: Callable[[CheckpointReader], bool] = lambda _: True,
        *,
        hold: int | None = None,
        releases: int = 1,
    ) -> None:
        self.directory = str(directory)
        self.act = act
        self.ready = ready
        self.hold = hold
        self.releases = releases
        self.first_at_hold: dict[str, int] = {}
        """Source subtask -> the first complete checkpoint that showed it at the hold."""
        self.completed: list[int] = []
        self.acted_on: int | None = None

    def __call__(self, kind: str, message: str) -> None:
        if kind == "savepoint":  # (it releases held sources too)
            self.completed.append(int(message.split()[0]))
        if kind != "checkpoint" or "(final)" in message or self.acted_on is not None:
            return
        checkpoint = int(message.split()[0])
        reader = open_checkpoint(self.directory, checkpoint)
        if (self.hold is None or self._held(reader, checkpoint)) and self.ready(reader):
            self.acted_on = checkpoint
            self.act(checkpoint)
        self.completed.append(checkpoint)

    def _held(self, reader: CheckpointReader, checkpoint: int) -> bool:
        """Whether a source subtask is at the hold in ``checkpoint`` and stays held until this
        listener returns."""
        held = False
        for subtask, records in source_positions(reader).items():
            if records != self.hold:
                continue
            first = self.first_at_hold.setdefault(subtask, checkpoint)
            if sum(1 for c in self.completed if c >= first) < self.releases:
                held = True
        return held


def endpoints_of(monkeypatch: pytest.MonkeyPatch) -> list[JobEndpoint]:
    """The endpoints (where savepoint requests queue up) of the jobs the test runs, newest
    last."""
    made: list[JobEndpoint] = []
    original = JobEndpoint.__init__

    def opened(self: JobEndpoint, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(JobEndpoint, "__init__", opened)
    return made


class StopWithSavepoint:
    """``act`` of an :class:`OnCheckpoint`: asks the job for a savepoint and to stop (on a thread,
    by ``JobClient``), and keeps the driver until the request is queued at the job's
    endpoint: the driver takes it before it triggers anything else, so the savepoint is the
    next checkpoint."""

    def __init__(self, directory: Path, endpoints: list[JobEndpoint]) -> None:
        self.directory = str(directory)
        self.endpoints = endpoints
        self.answers: list[Any] = []
        self.thread: threading.Thread | None = None

    def __call__(self, checkpoint_id: int) -> None:
        endpoint = self.endpoints[-1]
        self.thread = threading.Thread(target=self._ask, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60  # (only so that a broken job cannot hang the test)
        while endpoint.requests.empty() and self.thread.is_alive():
            if time.monotonic() > deadline:
                return
            time.sleep(0.002)

    def _ask(self) -> None:
        try:
            self.answers.append(JobClient(self.directory).savepoint(stop=True))
        except Exception as exc:
            self.answers.append(exc)

    def answer(self) -> Any:
        assert self.thread is not None, "the savepoint was never asked for"
        self.thread.join(60)
        assert self.answers, "the savepoint request was not answered"
        return self.answers[0]


# --------------------------------------------------------------------- user functions


@dataclass(frozen=True)
class FailAtRecord:
    """Raises once (a flag file remembers it), on the record with id ``bad``: for ``map``
    (records) and ``map_batches`` (Arrow batches) alike."""

    bad: int
    flag: str

    @property
    def __name__(self) -> str:
        return "fail_at_record"

    def __call__(self, data: Any) -> Any:
        if isinstance(data, pa.RecordBatch):
            hit = bool(pc.any(pc.equal(data.column("id"), self.bad)).as_py())
        else:
            hit = data["id"] == self.bad
        if hit and _first_time(self.flag):
            raise RuntimeError(f"injected failure at record {self.bad}")
        return data


class FailAtNextCheckpoint(Logic):
    """An operator that passes its records on and fails once, in its snapshot of the first
    checkpoint after ``marker`` exists: that checkpoint never completes, so the job restores
    the one after which the marker was made (whatever the records do meanwhile)."""

    def __init__(self, marker: str, flag: str) -> None:
        self.marker, self.flag = marker, flag

    def open(self, ctx: OperatorContext, state: Any) -> RunningOperator:
        return _FailAtNextCheckpoint(self.marker, self.flag)


class _FailAtNextCheckpoint(RunningOperator):
    def __init__(self, marker: str, flag: str) -> None:
        self.marker, self.flag = marker, flag

    def process(self, batch: Any) -> Any:
        return batch

    def snapshot(self, checkpoint_id: int, **_: Any) -> Any:
        if os.path.exists(self.marker) and _first_time(self.flag):
            raise RuntimeError(f"injected failure in the snapshot of checkpoint {checkpoint_id}")
        return None


@dataclass(frozen=True)
class Slow:
    """Sleeps ``pause`` seconds per batch (the load of a backpressure test)."""

    pause: float

    @property
    def __name__(self) -> str:
        return "slow"

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        time.sleep(self.pause)
        return batch


def _first_time(flag: str) -> bool:
    try:
        os.close(os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def as_dicts(record: Row) -> Row:
    """Records as Python dicts: the windows after it take the per-record path."""
    return dict(record)


# ------------------------------------------------------------------------------ jobs


RELEASES = 3
"""How many checkpoints release a source hold in the tests that fail in a checkpoint: the
listener may act on any of them (a held source keeps the job from ending meanwhile)."""


def environment(
    tmp_path: Path, parallelism: int, ck: str = "checkpoints", **options: Any
) -> StreamEnvironment:
    settings: dict[str, Any] = {
        "checkpoint_interval": 0.05,
        "checkpoint_dir": tmp_path / ck,
        "restart_strategy": FixedDelay(delay=0),
        "batch_size": 50,
        "max_parallelism": 16,
    }
    settings.update(options)
    return StreamEnvironment(parallelism, **settings)


@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 1)])
def test_stop_with_a_savepoint_and_restore_at_another_parallelism_publishes_each_window_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, before: int, after: int
) -> None:
    """Stopped with a savepoint while every source subtask holds half-way into its last file:
    the first run published exactly the windows the watermark at the hold passed (their final
    results), the run restored at another parallelism publishes exactly the others (windows
    half-filled before the stop finish with the right result; none fires twice)."""
    clicks = write_clicks(tmp_path / "in", seed=before * 10 + after)
    kinds = VECTORIZED
    hold = clicks.hold_in_last_file(before)
    env = environment(tmp_path, before)
    window_job(env, clicks, tmp_path / "out1", kinds)
    stop = StopWithSavepoint(tmp_path / "checkpoints", endpoints_of(monkeypatch))
    # the sources hold until the job stops (many checkpoints would release them): the
    # savepoint is asked for on the first checkpoint that shows them all at the hold
    listener = OnCheckpoint(
        tmp_path / "checkpoints",
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

    env = environment(tmp_path, after, ck="checkpoints2")
    window_job(env, clicks, tmp_path / "out2", kinds)
    second = testing.execute(env, launcher=ThreadLauncher(), restore_from=path)
    assert second.restarts == [] and second.restored_from == path

    watermark = clicks.watermark_at(before, hold)
    for kind in kinds:
        wanted = expected(kind, clicks.records)
        fired = {w: v for w, v in wanted.items() if w[2] - 1 <= watermark}
        assert 0 < len(fired) < len(wanted), "the stop came with windows fired and windows left"
        one, two = published(tmp_path / "out1" / kind), published(tmp_path / "out2" / kind)
        assert_exact(kind, one, fired)
        assert_exact(kind, one + two, wanted)


@pytest.mark.parametrize(
    ("path", "backend", "seed"),
    [("vectorized", "memory", 1), ("vectorized", "disk", 2), ("per-record", "memory", 3)],
)
def test_a_failure_at_a_random_record_restores_windows_from_a_checkpoint_exactly(
    tmp_path: Path, path: str, backend: str, seed: int
) -> None:
    """A user function raises on a random record read after the sources held (so after a
    complete checkpoint); the job restores its windows from that checkpoint (memory or disk
    state backend) and replays: each window once, exact. ``per-record``: the records are
    dicts (a ``map``) and the windows include a user's ``aggregate`` and ``process``."""
    rng = random.Random(seed)
    clicks = write_clicks(tmp_path / "in", seed)
    parallelism = 2
    hold = clicks.hold_in_last_file(parallelism, fraction=rng.uniform(0.1, 0.6))
    subtask = rng.randrange(parallelism)
    mine = clicks.read_by(subtask, parallelism)
    bad = mine[rng.randrange(hold, len(mine))]["id"]
    fail = FailAtRecord(bad, str(tmp_path / "failed"))
    if path == "vectorized":
        kinds: tuple[str, ...] = VECTORIZED

        def through(stream: DataStream) -> DataStream:
            return stream.map_batches(fail, name="fail")
    else:
        kinds = ("tumbling", "session-aggregate", "sliding-process")

        def through(stream: DataStream) -> DataStream:
            return stream.map(fail, name="fail").map(as_dicts, name="dicts")

    env = environment(
        tmp_path,
        parallelism,
        state=State(backend=backend, dir=tmp_path / "state"),
        checkpoints=Checkpoints(retained=2),
    )
    window_job(env, clicks, tmp_path / "out", kinds, through=through)
    result = testing.execute(env, launcher=ThreadLauncher(), hold_sources=SourceHold(records=hold))
    assert len(result.restarts) == 1
    assert f"injected failure at record {bad}" in result.restarts[0].cause
    assert result.restarts[0].restored_from is not None, "restored from a checkpoint"
    for kind in kinds:
        assert_exact(kind, published(tmp_path / "out" / kind), expected(kind, clicks.records))


def test_an_unaligned_checkpoint_with_watermarks_in_its_channel_state_restores_exactly(
    tmp_path: Path,
) -> None:
    """A slow operator between ``key_by`` and the windows, with buffers of one frame: the
    buffers are full, and unaligned checkpoints record the records *and the watermarks* in
    flight. The job fails in the next checkpoint after one that recorded both, restores that
    one, and replays its channel state, watermarks in their place: each window once,
    exact."""
    clicks = write_clicks(tmp_path / "in", 7, files=4)
    marker, flag = tmp_path / "checkpointed", tmp_path / "failed"
    hold = clicks.hold_in_last_file(2)
    kinds = ("tumbling", "session")
    env = environment(
        tmp_path,
        2,
        checkpoints=Checkpoints(mode="unaligned", retained=100),
        checkpoint_interval=0.1,
        buffer_capacity=1,
        batch_size=20,
    )

    def through(stream: DataStream) -> DataStream:
        return (
            stream.key_by("user")
            .map_batches(Slow(0.02), name="slow")
            .transform("fail", FailAtNextCheckpoint(str(marker), str(flag)), name="fail")
        )

    window_job(env, clicks, tmp_path / "out", kinds, through=through)
    listener = OnCheckpoint(
        tmp_path / "checkpoints",
        lambda _: marker.touch(),
        lambda reader: all(n > 0 for n in recorded_watermarks(reader)),
        hold=hold,
        releases=RELEASES,
    )
    result = testing.execute(
        env,
        launcher=ThreadLauncher(),
        listener=listener,
        hold_sources=SourceHold(records=hold, checkpoints=RELEASES),
    )
    assert listener.acted_on is not None, "no checkpoint recorded records and watermarks"
    assert len(result.restarts) == 1
    assert "injected failure in the snapshot" in result.restarts[0].cause
    assert result.restarts[0].restored_from == listener.acted_on
    (used,) = [c for c in result.checkpoints if c.checkpoint_id == listener.acted_on]
    records, _ = recorded_watermarks(
        open_checkpoint(str(tmp_path / "checkpoints"), used.checkpoint_id)
    )
    assert used.unaligned and used.channel_state_records == records
    for kind in kinds:
        assert_exact(kind, published(tmp_path / "out" / kind), expected(kind, clicks.records))


def test_a_job_that_failed_for_good_resumes_from_its_retained_unaligned_checkpoint(
    tmp_path: Path,
) -> None:
    """The job of the test above fails for good (no restart attempts) in the checkpoint after
    one that recorded records and watermarks in flight; a new run restores that retained
    checkpoint (``restore_from=.../chk-N``) at the same parallelism: together the two runs
    publish each window once, exact. At another parallelism the checkpoint is refused, naming
    why (its channel state restores only at its own)."""
    clicks = write_clicks(tmp_path / "in", 8, files=4)
    marker, flag = tmp_path / "checkpointed", tmp_path / "failed"
    hold = clicks.hold_in_last_file(2)
    kinds = ("tumbling", "sliding")

    def job(parallelism: int, out: str, ck: str) -> StreamEnvironment:
        env = environment(
            tmp_path,
            parallelism,
            ck,
            checkpoints=Checkpoints(mode="unaligned", retained=100),
            checkpoint_interval=0.1,
            buffer_capacity=1,
            batch_size=20,
            restart_strategy=FixedDelay(0, delay=0),
        )

        def through(stream: DataStream) -> DataStream:
            return (
                stream.key_by("user")
                .map_batches(Slow(0.02), name="slow")
                .transform("fail", FailAtNextCheckpoint(str(marker), str(flag)), name="fail")
            )

        window_job(env, clicks, tmp_path / out, kinds, through=through)
        return env

    listener = OnCheckpoint(
        tmp_path / "ck1",
        lambda _: marker.touch(),
        lambda reader: all(n > 0 for n in recorded_watermarks(reader)),
        hold=hold,
        releases=RELEASES,
    )
    with pytest.raises(JobFailedError, match="injected failure in the snapshot"):
        testing.execute(
            job(2, "out1", "ck1"),
            launcher=ThreadLauncher(),
            listener=listener,
            hold_sources=SourceHold(records=hold, checkpoints=RELEASES),
        )
    assert listener.acted_on is not None, "no checkpoint recorded records and watermarks"
    retained = tmp_path / "ck1" / f"chk-{listener.acted_on}"
    with pytest.raises(RestoreError, match="restore only at its parallelism 2, not 3"):
        testing.execute(job(3, "out-3", "ck3"), launcher=ThreadLauncher(), restore_from=retained)
    result = testing.execute(
        job(2, "out2", "ck2"), launcher=ThreadLauncher(), restore_from=retained
    )
    assert result.restarts == [] and result.restored_from == str(retained)
    for kind in kinds:
        both = published(tmp_path / "out1" / kind) + published(tmp_path / "out2" / kind)
        assert_exact(kind, both, expected(kind, clicks.records))


def test_windows_kept_for_allowed_lateness_are_not_published_again_after_a_restore(
    tmp_path: Path,
) -> None:
    """With allowed lateness, a window that fired stays in state (marked fired) for the
    lateness. The job fails in the next checkpoint after one that holds such windows of
    every kind, restores that one and replays: no window fires a second time (no record is
    late, so none may), every one fires once with its result, and the late output is
    empty."""
    clicks = write_clicks(tmp_path / "in", 11)
    marker, flag = tmp_path / "checkpointed", tmp_path / "failed"
    hold = clicks.hold_in_last_file(2)
    kinds = VECTORIZED
    env = environment(tmp_path, 2, checkpoints=Checkpoints(retained=100))

    def through(stream: DataStream) -> DataStream:
        return stream.transform("fail", FailAtNextCheckpoint(str(marker), str(flag)), name="fail")

    window_job(env, clicks, tmp_path / "out", kinds, through=through, lateness="4s", late=True)
    listener = OnCheckpoint(
        tmp_path / "checkpoints",
        lambda _: marker.touch(),
        lambda reader: all(fired_windows_kept(reader, kind) > 0 for kind in kinds),
        hold=hold,
        releases=RELEASES,
    )
    result = testing.execute(
        env,
        launcher=ThreadLauncher(),
        listener=listener,
        hold_sources=SourceHold(records=hold, checkpoints=RELEASES),
    )
    assert listener.acted_on is not None, "no checkpoint held fired windows of every kind"
    assert len(result.restarts) == 1
    assert result.restarts[0].restored_from == listener.acted_on
    for kind in kinds:
        assert_exact(kind, published(tmp_path / "out" / kind), expected(kind, clicks.records))
        assert published(tmp_path / "out" / f"{kind}-late") == []


@pytest.mark.parametrize("records", ["arrow", "dicts"])
def test_without_a_fault_every_kind_of_window_is_exact(tmp_path: Path, records: str) -> None:
    """The baseline of the tests above: no fault, each kind of window once, exact, on Arrow
    batches and on dicts (and the input is at most BOUND out of order within each file: no
    record is ever late)."""
    clicks = write_clicks(tmp_path / "in", 13, files=4)
    for rows in clicks.files:
        highest = rows[0]["ts"]
        for r in rows:
            assert r["ts"] >= highest - BOUND
            highest = max(highest, r["ts"])
    assert len({r["user"] for r in clicks.records}) == USERS
    env = environment(tmp_path, 2)
    through = (lambda s: s.map(as_dicts)) if records == "dicts" else None
    window_job(env, clicks, tmp_path / "out", KINDS, through=through)
    result = testing.execute(env, launcher=ThreadLauncher())
    assert result.restarts == []
    for kind in KINDS:
        assert_exact(kind, published(tmp_path / "out" / kind), expected(kind, clicks.records))
