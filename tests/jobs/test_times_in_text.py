"""Times written as text (issue 27): CSV and JSON-lines columns of ISO-8601 date-times, with
``Z``, an offset or no zone, with or without fractions of a second, mixed in one column, are
read as the instants they name, exactly; a ``schema=`` dict sets the types of the columns it
names and keeps the others; every Arrow timestamp type is accepted as a string; and the hints
cutline gives about them work when followed to the letter. Jobs run through the real runtime
with slots as threads (no Spark), as a new user would run them."""

from __future__ import annotations

import ast
import datetime as dt
import json
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_runtime_jobs import dead_letters

from cutline import (
    EventTime,
    EventTimeError,
    FixedDelay,
    JobFailedError,
    JobResult,
    StreamEnvironment,
    Tumbling,
    testing,
)
from cutline.runtime.io.formats import InputWarning, as_schema
from cutline.runtime.io.times import to_timestamps
from cutline.runtime.task.local import ThreadLauncher

UTC = dt.UTC
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)


def environment(tmp_path: Path, parallelism: int = 1) -> StreamEnvironment:
    return StreamEnvironment(
        parallelism,
        checkpoint_interval=0.05,
        checkpoint_dir=tmp_path / "checkpoints",
        dead_letter_dir=tmp_path / "dead",
        restart_strategy=FixedDelay(0, delay=0),
        batch_size=16,
    )


def run(env: StreamEnvironment) -> JobResult:
    result = testing.execute(env, launcher=ThreadLauncher(), progress=False)
    assert result.restarts == []
    return result


def schema_of(stream: Any) -> pa.Schema:
    """The schema fixed in a file source's operator when the job was built."""
    return stream.operator.logic.source.schema


def text(instant: dt.datetime, style: str, offset: int = 0, digits: int = 0) -> str:
    """``instant`` (aware) as ISO-8601 text: ``style`` is ``Z``, ``offset`` (``+hh:mm``,
    ``offset`` minutes east), ``compact`` (``+hhmm``), ``hours`` (``+hh``, the offset's whole
    hours), ``none`` (UTC wall time, no zone) or ``lower`` (``t`` and ``z``); ``digits`` of a
    second (more than 6: zeros after the microseconds; fewer: the instant must have no more);
    a space instead of ``T`` for ``none``."""
    if style in ("Z", "none", "lower"):
        offset = 0
    elif style == "hours":
        offset = int(offset / 60) * 60
    wall = instant.astimezone(dt.timezone(dt.timedelta(minutes=offset)))
    second = f"{wall.year:04d}-{wall:%m-%dT%H:%M:%S}"  # (%Y: no zeros before year 999)
    if style == "none":
        second = second.replace("T", " ")
    if digits:
        second += "." + f"{wall.microsecond:06d}{'0' * 3}"[:digits]
    sign = "-" if offset < 0 else "+"
    hours, minutes = divmod(abs(offset), 60)
    zone = {
        "Z": "Z",
        "lower": "z",
        "offset": f"{sign}{hours:02d}:{minutes:02d}",
        "compact": f"{sign}{hours:02d}{minutes:02d}",
        "hours": f"{sign}{hours:02d}",
        "none": "",
    }[style]
    if style == "lower":
        second = second.replace("T", "t")
    return second + zone


def naive(instant: dt.datetime) -> dt.datetime:
    """As a column without a time zone holds it: the UTC wall time."""
    return instant.astimezone(UTC).replace(tzinfo=None)


# the rows of the issue, and what each names
BASE = dt.datetime(2024, 5, 1, 12, 0, 30, tzinfo=UTC)
TIMES = [
    ("2024-05-01T12:00:30Z", BASE),
    ("2024-05-01 12:00:31", BASE + dt.timedelta(seconds=1)),
    ("2024-05-01T14:00:32+02:00", BASE + dt.timedelta(seconds=2)),
    ("2024-05-01T12:00:33.250Z", BASE + dt.timedelta(seconds=3, milliseconds=250)),
    ("2024-05-01T07:00:34.123-0500", BASE + dt.timedelta(seconds=4, milliseconds=123)),
    ("2024-05-01 12:00:35.5", BASE + dt.timedelta(seconds=5, milliseconds=500)),
    ("2024-05-01t12:00:36z", BASE + dt.timedelta(seconds=6)),
    ("2024-05-01T13:00:37+01", BASE + dt.timedelta(seconds=7)),
]


def write_times(folder: Path, fmt: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"clicks.{fmt}"
    rows = [{"user": f"u{i % 2}", "ts": t, "amount": i} for i, (t, _) in enumerate(TIMES)]
    if fmt == "csv":
        path.write_text(
            "user,ts,amount\n" + "".join(f"{r['user']},{r['ts']},{i}\n" for i, r in enumerate(rows))
        )
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ------------------------------------------------------------------ reading and inferring


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_mixed_iso_times_are_inferred_as_timestamps_and_read_exactly(
    tmp_path: Path, fmt: str
) -> None:
    path = write_times(tmp_path / "in", fmt)
    env = environment(tmp_path)
    stream = getattr(env, f"read_{fmt}")(path, event_time="ts")
    assert schema_of(stream) == pa.schema(
        [("user", pa.string()), ("ts", pa.timestamp("us")), ("amount", pa.int64())]
    )
    stream.collect()
    assert run(env).output == [
        {"user": f"u{i % 2}", "ts": naive(instant), "amount": i}
        for i, (_, instant) in enumerate(TIMES)
    ]
    assert dead_letters(tmp_path / "dead") == []


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
@pytest.mark.parametrize(
    "kind",
    ["timestamp[ms]", "timestamp[ms, tz=UTC]", "timestamp[us, tz=Europe/Paris]", "timestamp[ns]"],
)
def test_the_issue_hint_and_every_timestamp_type_keep_the_columns_and_every_row(
    tmp_path: Path, fmt: str, kind: str
) -> None:
    """The issue's ``schema={'ts': 'timestamp[ms]'}``: the other columns stay, and no row with
    ``Z`` or an offset goes to the dead letters; the same with a time zone (the instants are
    the same, shown in it)."""
    path = write_times(tmp_path / "in", fmt)
    env = environment(tmp_path)
    reader = getattr(env, f"read_{fmt}")
    reader(path, schema={"ts": kind}, event_time="ts", on_error="dead_letter").collect()
    output = run(env).output
    assert dead_letters(tmp_path / "dead") == []
    assert [(r["user"], r["amount"]) for r in output] == [(f"u{i % 2}", i) for i in range(8)]
    schema = as_schema({"ts": kind})
    assert schema is not None
    zone = schema.field("ts").type.tz
    for row, (_, instant) in zip(output, TIMES, strict=True):
        got = row["ts"]
        if zone is None:
            assert got == naive(instant)
        else:
            assert got == instant and str(got.tzinfo) == zone


def test_a_value_finer_than_the_unit_is_refused_naming_the_unit_that_holds_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "a.csv"
    path.write_text(
        "n,ts\n1,2024-05-01T12:00:30.120Z\n2,2024-05-01T07:00:34.123456-0500\n"
        "3,2024-05-01 12:00:35.000000000\n"
    )
    env = environment(tmp_path)
    env.read_csv(path, schema={"ts": "timestamp[ms]"}, on_error="dead_letter").collect()
    assert [r["n"] for r in run(env).output] == [1, 3]  # (zeros after the unit are exact)
    (dead,) = dead_letters(tmp_path / "dead")
    assert dead["error"] == (
        f"{path}:3: column 'ts': '2024-05-01T07:00:34.123456-0500' is finer than a "
        "timestamp[ms] holds (give schema={'ts': 'timestamp[us]'})"
    )
    found = re.search(r"schema=(\{.*?\})", dead["error"])
    assert found is not None
    env = environment(tmp_path / "again")
    env.read_csv(path, schema=ast.literal_eval(found.group(1)), on_error="dead_letter").collect()
    assert [r["ts"] for r in run(env).output] == [  # the hint, followed
        dt.datetime(2024, 5, 1, 12, 0, 30, 120000),
        dt.datetime(2024, 5, 1, 12, 0, 34, 123456),
        dt.datetime(2024, 5, 1, 12, 0, 35),
    ]


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_text_that_is_no_time_is_still_rejected_naming_its_file_and_line(
    tmp_path: Path, fmt: str
) -> None:
    path = tmp_path / f"a.{fmt}"
    values = ["2024-05-01T12:00:30Z", "yesterday", "2024-02-30T00:00:00Z", "2024-05-01 12:00:31"]
    if fmt == "csv":
        path.write_text("ts,n\n" + "".join(f"{v},{i}\n" for i, v in enumerate(values)))
    else:
        path.write_text("".join(json.dumps({"ts": v, "n": i}) + "\n" for i, v in enumerate(values)))
    line = 1 if fmt == "csv" else 0
    env = environment(tmp_path)
    reader = getattr(env, f"read_{fmt}")
    reader(path, schema={"ts": "timestamp[us]"}, on_error="dead_letter").collect()
    assert [r["n"] for r in run(env).output] == [0, 3]
    assert [d["error"] for d in dead_letters(tmp_path / "dead")] == [
        f"{path}:{line + 2}: column 'ts': 'yesterday' is not a timestamp[us]",
        f"{path}:{line + 3}: column 'ts': '2024-02-30T00:00:00Z' is not a timestamp[us]",
    ]
    env = environment(tmp_path / "failing")
    getattr(env, f"read_{fmt}")(path, schema={"ts": "timestamp[us]"}).collect()
    with pytest.raises(JobFailedError, match=rf"{path}:{line + 2}: column 'ts': 'yesterday'"):
        run(env)


def test_json_lines_times_in_whole_seconds_or_finer_are_one_type(tmp_path: Path) -> None:
    """pyarrow.json reads whole seconds as timestamps and finer text as text: one column of
    both is times, and a column of nanoseconds is timestamp[ns]."""
    (tmp_path / "in").mkdir()
    whole = [{"ts": "2024-05-01T12:00:30Z", "ns": "2024-05-01T12:00:30.123456789Z"}]
    finer = [{"ts": "2024-05-01T12:00:30.5+00:30", "ns": "2024-05-01 12:00:31"}]
    (tmp_path / "in" / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in whole))
    (tmp_path / "in" / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in finer))
    env = environment(tmp_path)
    stream = env.read_jsonl(tmp_path / "in")
    assert schema_of(stream) == pa.schema([("ts", pa.timestamp("us")), ("ns", pa.timestamp("ns"))])
    stream.map_batches(nanoseconds).collect()  # (Python's datetime holds no nanoseconds)
    assert run(env).output == [
        {"ts": dt.datetime(2024, 5, 1, 12, 0, 30), "ns": 1714564830123456789},
        {"ts": dt.datetime(2024, 5, 1, 11, 30, 30, 500000), "ns": 1714564831000000000},
    ]


def nanoseconds(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch with its ``ns`` column as integers."""
    ns = batch.column("ns").cast(pa.int64())
    return pa.record_batch([batch.column("ts"), ns], names=["ts", "ns"])


# ------------------------------------------------------------------------ windows over it


def test_a_window_over_csv_times_in_every_form_counts_exactly(tmp_path: Path) -> None:
    rng = random.Random(27)
    styles = ["Z", "offset", "compact", "none", "lower"]
    start = dt.datetime(2024, 5, 1, 11, 58, tzinfo=UTC)
    every: list[tuple[str, dt.datetime]] = []
    (tmp_path / "in").mkdir()
    for f in range(3):
        lines = ["user,ts,amount"]
        t = start
        for _ in range(300):
            t += dt.timedelta(milliseconds=rng.randint(0, 2000))
            instant = t - dt.timedelta(milliseconds=rng.randint(0, 500))  # out of order
            user = f"u{rng.randrange(4)}"
            offset = rng.choice([0, 60, -300, 330, 120])
            stamp = text(instant, rng.choice(styles), offset, rng.choice([0, 3, 6]))
            lines.append(f"{user},{stamp},{rng.randint(1, 9)}")
            every.append((user, instant))
        (tmp_path / "in" / f"part-{f}.csv").write_text("\n".join(lines) + "\n")
    env = environment(tmp_path, parallelism=2)
    clicks = env.read_csv(tmp_path / "in", event_time=EventTime("ts", max_out_of_orderness="600ms"))
    clicks.key_by("user").window(Tumbling("1 min")).count().collect()
    result = run(env)
    minute = dt.timedelta(minutes=1)
    expected = Counter()
    for user, instant in every:
        low = naive(instant).replace(second=0, microsecond=0)
        expected[(user, low, low + minute)] += 1
    got = {(r["user"], r["window_start"], r["window_end"]): r["count"] for r in result.output}
    assert len(got) == len(result.output), "each window once"
    assert got == dict(expected)
    assert sum(got.values()) == 900


# -------------------------------------------------------------------- schema= as a dict


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_schema_dict_sets_its_columns_types_and_keeps_the_others(
    tmp_path: Path, fmt: str
) -> None:
    path = tmp_path / f"a.{fmt}"
    rows = [{"user": "u1", "n": 1, "ts": "2024-05-01T12:00:30Z", "note": "hi"}]
    if fmt == "csv":
        path.write_text("user,n,ts,note\nu1,1,2024-05-01T12:00:30Z,hi\n")
    else:
        path.write_text(json.dumps(rows[0]) + "\n")
    env = environment(tmp_path)
    stream = getattr(env, f"read_{fmt}")(path, schema={"n": "double", "ts": "timestamp[s]"})
    assert schema_of(stream) == pa.schema(
        [
            ("user", pa.string()),
            ("n", pa.float64()),
            ("ts", pa.timestamp("s")),
            ("note", pa.string()),
        ]
    )
    whole = pa.schema([("n", pa.float64()), ("user", pa.string())])
    other = environment(tmp_path / "whole")
    assert schema_of(getattr(other, f"read_{fmt}")(path, schema=whole)) == whole  # as said
    stream.collect()
    assert run(env).output == [
        {"user": "u1", "n": 1.0, "ts": dt.datetime(2024, 5, 1, 12, 0, 30), "note": "hi"}
    ]


def test_a_schema_dict_column_that_no_file_has_is_added_and_said(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text("user,ts\nu1,2024-05-01T12:00:30Z\n")
    env = environment(tmp_path)
    with pytest.warns(InputWarning, match=r"schema= gives the type of 'tss', which the heads"):
        stream = env.read_csv(path, schema={"tss": "timestamp[ms]"})
    assert schema_of(stream).names == ["user", "ts", "tss"]


def test_parquet_takes_a_schema_dict_as_the_types_of_its_columns(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    pq.write_table(
        pa.table({"n": pa.array([1], pa.int32()), "ts": ["2024-05-01T14:00:30+02:00"], "x": [1]}),
        tmp_path / "in" / "1.parquet",
    )
    pq.write_table(
        pa.table({"n": ["2"], "ts": ["2024-05-01 12:00:31"], "y": [True]}),
        tmp_path / "in" / "2.parquet",
    )
    env = environment(tmp_path)
    stream = env.read_parquet(
        tmp_path / "in", schema={"n": "int64", "ts": "timestamp[ms, tz=UTC]"}, event_time="ts"
    )  # (n is int32 in one file, string in the other: no conflict once its type is given)
    assert schema_of(stream) == pa.schema(
        [
            ("n", pa.int64()),
            ("ts", pa.timestamp("ms", tz="UTC")),
            ("x", pa.int64()),
            ("y", pa.bool_()),
        ]
    )
    stream.collect()
    assert run(env).output == [
        {"n": 1, "ts": BASE, "x": 1, "y": None},
        {"n": 2, "ts": BASE + dt.timedelta(seconds=1), "x": None, "y": True},
    ]


# -------------------------------------------------------------------------- type strings

UNITS = ["s", "ms", "us", "ns"]
ZONES = [None, "UTC", "Europe/Paris", "+02:00", "-05:30", "America/New_York"]


@pytest.mark.parametrize("unit", UNITS)
@pytest.mark.parametrize("zone", ZONES)
def test_every_arrow_timestamp_type_is_accepted_as_pyarrow_spells_it(
    unit: str, zone: str | None
) -> None:
    kind = pa.timestamp(unit, zone)
    assert as_schema({"ts": str(kind)}) == pa.schema([("ts", kind)])
    spaced = str(kind).replace("[", "[ ").replace(", ", " ,  ").replace("]", " ]")
    assert as_schema({"ts": spaced.replace("timestamp", "Timestamp")}) == pa.schema([("ts", kind)])


def test_type_strings_that_worked_still_work() -> None:
    assert as_schema(
        {"a": "str", "b": "int", "c": "double", "d": "bool", "e": "date32", "f": "timestamp"}
    ) == pa.schema(
        [
            ("a", pa.string()),
            ("b", pa.int64()),
            ("c", pa.float64()),
            ("d", pa.bool_()),
            ("e", pa.date32()),
            ("f", pa.timestamp("us")),
        ]
    )
    assert as_schema({"t": "timestamp[us, tz=utc]"}) == pa.schema(
        [("t", pa.timestamp("us", "UTC"))]
    )


def test_an_unknown_type_string_names_the_column_the_string_and_types_that_work(
    tmp_path: Path,
) -> None:
    path = tmp_path / "a.csv"
    path.write_text("ts\n2024-05-01T12:00:30Z\n")
    env = environment(tmp_path)
    with pytest.raises(ValueError) as unknown:
        env.read_csv(path, schema={"ts": "timestamp[ps]"})
    message = str(unknown.value)
    assert "column 'ts' has the unknown type 'timestamp[ps]'" in message
    examples = re.findall(r"'(timestamp\[[^']*\])'", message.split(" like ", 1)[1])
    assert len(examples) == 3
    for example in examples:
        as_schema({"ts": example})  # the examples it gives work
    with pytest.raises(
        ValueError, match=r"column 'ts' has the type 'timestamp\[ms, tz=Mars/Base\]'"
    ):
        env.read_jsonl(path, schema={"ts": "timestamp[ms, tz=Mars/Base]"})


# ---------------------------------------------------------------------- hints, followed


def test_the_hint_of_a_text_event_time_column_followed_literally_works(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text(
        "user,ts,amount\nu1,2024-05-01T12:00:30Z,1\nu2,n/a,2\nu1,2024-05-01 14:00:31+02:00,3\n"
    )
    env = environment(tmp_path)
    with pytest.raises(EventTimeError) as refused:
        env.read_csv(path, event_time="ts")  # one value is no time: the column is text
    found = re.search(r"schema=(\{.*?\})", str(refused.value))
    assert found is not None, str(refused.value)
    suggested = ast.literal_eval(found.group(1))
    assert "on_error='dead_letter'" in str(refused.value)
    env = environment(tmp_path)
    stream = env.read_csv(path, schema=suggested, event_time="ts", on_error="dead_letter")
    stream.key_by("user").window(Tumbling("1 min")).count().collect()
    minute = dt.datetime(2024, 5, 1, 12, 0)
    assert sorted((r["user"], r["window_start"], r["count"]) for r in run(env).output) == [
        ("u1", minute, 2)
    ]
    (dead,) = dead_letters(tmp_path / "dead")
    assert dead["error"] == f"{path}:3: column 'ts': 'n/a' is not a timestamp[us]"


def test_the_hint_for_numbers_and_text_in_a_wide_file_followed_literally_works(
    tmp_path: Path,
) -> None:
    """With more than 8 columns the hint names only the column to change: a dict of it alone
    keeps the others."""
    names = [f"c{i}" for i in range(9)]
    path = tmp_path / "wide.csv"
    path.write_text(",".join(names) + "\n" + ",".join(["1"] * 8 + ["x"]) + "\n" + "2," * 8 + "3\n")
    env = environment(tmp_path)
    with pytest.warns(InputWarning) as caught:
        env.read_csv(path)
    found = re.search(r"schema=(\{.*?\})", str(caught[0].message))
    assert found is not None
    suggested = ast.literal_eval(found.group(1))
    assert suggested == {"c8": "int64"}
    env = environment(tmp_path)
    env.read_csv(path, schema=suggested, on_error="dead_letter").collect()
    assert run(env).output == [dict.fromkeys(names, 2) | {"c8": 3}]


# ------------------------------------------------------------------- exact, whatever form

INSTANTS = st.datetimes(
    min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30), timezones=st.just(UTC)
)
FORMS = st.tuples(
    st.sampled_from(["Z", "offset", "compact", "hours", "none", "lower"]),
    st.integers(-23 * 60 - 59, 23 * 60 + 59),
    st.sampled_from([0, 3, 6, 9]),
)


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.tuples(INSTANTS, FORMS), min_size=1, max_size=20),
    zone=st.sampled_from([None, "UTC", "Asia/Kolkata", "-03:00"]),
)
def test_any_instant_in_any_form_parses_to_itself(
    values: list[tuple[dt.datetime, tuple[str, int, int]]], zone: str | None
) -> None:
    """A column of random instants (years 1 to 9999, to the microsecond), each written in a
    random form (offsets of up to 23:59 either way, 0 to 9 digits of a second), parses to
    exactly those instants, in microseconds with and without a time zone, and to the
    millisecond when they are whole milliseconds."""
    texts, expected = [], []
    for instant, (style, offset, digits) in values:
        if digits < 6:
            step = 10 ** (6 - digits)
            instant = instant.replace(microsecond=instant.microsecond // step * step)
        texts.append(text(instant, style, offset, digits))
        expected.append((instant - EPOCH) // dt.timedelta(microseconds=1))
    column = pa.array(texts, pa.string())
    stamps, failed = to_timestamps(column, pa.timestamp("us", zone))
    assert failed == {}
    assert stamps.type == pa.timestamp("us", zone)
    assert stamps.cast(pa.int64()).to_pylist() == expected
    if all(e % 1000 == 0 for e in expected):
        millis, failed = to_timestamps(column, pa.timestamp("ms"))
        assert failed == {}
        assert millis.cast(pa.int64()).to_pylist() == [e // 1000 for e in expected]
