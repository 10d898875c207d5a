"""Event time as one value (:class:`cutline.EventTime`): checked when made, taken alike by
every source and by ``assign_timestamps``, ``event_time="ts"`` its shorthand; the keywords
the sources took one by one before still work, as deprecated aliases that say the
``EventTime(...)`` to write, and give the same job."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cutline import (
    BoundedOutOfOrderness,
    EventTime,
    EventTimeError,
    Monotonous,
    StreamEnvironment,
    Tumbling,
    testing,
)
from cutline.api.event_time import strategy
from cutline.runtime.source_operator import SourceLogic
from cutline.runtime.task.local import ThreadLauncher

SCHEMA = pa.schema([("user", pa.string()), ("ts", pa.int64())])


def write(tmp_path: Path) -> list[dict[str, Any]]:
    """Clicks 0.1 s apart, at most 300 ms out of order."""
    rows = [{"user": f"u{i % 3}", "ts": i * 100 + (300 if i % 7 == 0 else 0)} for i in range(300)]
    (tmp_path / "in").mkdir(exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, SCHEMA), tmp_path / "in" / "clicks.parquet")
    return rows


def env_of(tmp_path: Path, folder: str) -> StreamEnvironment:
    return StreamEnvironment(
        1,
        checkpoint_dir=str(tmp_path / folder),
        dead_letter_dir=str(tmp_path / f"{folder}-dead"),
        batch_size=20,
    )


def per_second(output: list[dict[str, Any]]) -> Counter[tuple[str, int]]:
    return Counter({(r["user"], r["window_start"]): r["count"] for r in output})


def expected(rows: list[dict[str, Any]]) -> Counter[tuple[str, int]]:
    return Counter((r["user"], r["ts"] - r["ts"] % 1000) for r in rows)


def test_an_event_time_is_checked_when_it_is_made_naming_the_field_and_the_value() -> None:
    made = EventTime("ts", max_out_of_orderness="3s", idle_timeout="10s", max_jump="1 d")
    assert (made.bound_ms, made.idle_timeout_s, made.max_jump_ms) == (3000, 10.0, 86_400_000)
    assert repr(made) == (
        "EventTime('ts', max_out_of_orderness='3s', idle_timeout='10s', max_jump='1 d')"
    )
    assert EventTime("ts", max_out_of_orderness=dt.timedelta(seconds=3)).bound_ms == 3000
    assert EventTime("ts", max_out_of_orderness=0.25).bound_ms == 250  # (seconds)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.unit = "s"  # type: ignore[misc]
    refused: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"max_out_of_orderness": "soon"}, EventTimeError, "max_out_of_orderness='soon' is not"),
        ({"max_out_of_orderness": "1us"}, EventTimeError, "max_out_of_orderness='1us': unknown"),
        ({"idle_timeout": 0}, EventTimeError, "idle_timeout=0 must be a positive duration"),
        ({"max_jump": "0s"}, EventTimeError, "max_jump='0s' must be positive"),
        ({"unit": "min"}, EventTimeError, "unit='min': use 's', 'ms', 'us' or 'ns'"),
        ({"watermarks": 5}, TypeError, "watermarks= takes a WatermarkGenerator"),
        (
            {"watermarks": Monotonous(), "max_out_of_orderness": "1s"},
            EventTimeError,
            "give max_out_of_orderness= or watermarks=, not both",
        ),
    ]
    for fields, error, said in refused:
        with pytest.raises(error, match=rf"^EventTime: {said}"):
            EventTime("ts", **fields)
    with pytest.raises(TypeError, match=r"EventTime takes a column name .* not int 3"):
        EventTime(3)  # type: ignore[arg-type]
    with pytest.raises(EventTimeError, match="must be a non-empty name"):
        EventTime("")


def test_the_shorthand_and_the_value_give_one_strategy_and_the_source_says_its_idleness() -> None:
    """``event_time="ts"`` is ``EventTime("ts")``; an ``idle_timeout`` left out is the
    source's (10 s for Kafka and Delta, never for files), ``None`` is never everywhere."""
    made = strategy("read_kafka", EventTime("ts"), SCHEMA, idle_default="10s")
    assert made is not None and made.idle_timeout_s == 10.0 and made.bound_ms == 0
    never = strategy("read_kafka", EventTime("ts", idle_timeout=None), SCHEMA, idle_default="10s")
    assert never is not None and never.idle_timeout_s is None
    files = strategy("read_parquet", EventTime("ts"), SCHEMA)
    assert files is not None and files.idle_timeout_s is None
    assert files.column.type == pa.int64()
    with pytest.raises(EventTimeError, match=r"read_csv: event_time='when': no such column"):
        strategy("read_csv", EventTime("when"), SCHEMA)
    with pytest.raises(TypeError, match=r"a source's event time is a column.*is for assign_"):
        strategy("read_csv", EventTime(lambda r: r["ts"]), SCHEMA)


def test_every_source_takes_the_value_and_its_shorthand(tmp_path: Path) -> None:
    write(tmp_path)
    env = env_of(tmp_path, "ck")
    time = EventTime("ts", max_out_of_orderness="300ms", idle_timeout="5s")
    streams = [
        env.read_parquet(tmp_path / "in", event_time=time),
        env.from_sequence(0, 10, column="ts", event_time=time),
        env.read_parquet(tmp_path / "in", event_time="ts", name="shorthand"),
    ]
    for stream in streams[:2]:
        logic = stream.operator.logic
        assert isinstance(logic, SourceLogic) and logic.watermarks is not None
        assert (logic.watermarks.bound_ms, logic.watermarks.idle_timeout_s) == (300, 5.0)
    shorthand = streams[2].operator.logic
    assert isinstance(shorthand, SourceLogic) and shorthand.watermarks is not None
    assert shorthand.watermarks.bound_ms == 0 and shorthand.watermarks.idle_timeout_s is None
    with pytest.raises(TypeError, match=r"event_time= takes EventTime\(...\) or a column's"):
        env.read_parquet(tmp_path / "in", event_time=5)  # type: ignore[arg-type]


def test_the_old_keywords_still_work_say_what_to_write_and_give_the_same_windows(
    tmp_path: Path,
) -> None:
    rows = write(tmp_path)
    outputs = []
    for folder, old in (("old", True), ("new", False)):
        env = env_of(tmp_path, folder)
        if old:
            with pytest.warns(DeprecationWarning) as caught:
                stream = env.read_parquet(
                    tmp_path / "in",
                    event_time="ts",
                    max_out_of_orderness=0.3,
                    idle_timeout="5s",
                    max_watermark_jump="1 d",
                )
            (warning,) = caught
            assert str(warning.message) == (
                "read_parquet: max_out_of_orderness=, idle_timeout=, max_watermark_jump= are "
                "deprecated: write event_time=EventTime('ts', max_out_of_orderness='0.3s', "
                "idle_timeout='5s', max_jump='1 d')"
            )
            assert warning.filename == __file__
        else:
            time = EventTime("ts", max_out_of_orderness="300ms", idle_timeout="5s", max_jump="1d")
            stream = env.read_parquet(tmp_path / "in", event_time=time)
        stream.key_by("user").window(Tumbling("1s")).count().collect()
        outputs.append(testing.execute(env, launcher=ThreadLauncher(), progress=False).output)
    assert per_second(outputs[0]) == per_second(outputs[1]) == expected(rows)
    env = env_of(tmp_path, "both")
    with pytest.raises(ValueError, match=r"max_out_of_orderness= and EventTime\(...\) both say"):
        env.read_parquet(tmp_path / "in", event_time=EventTime("ts"), max_out_of_orderness="1s")
    with pytest.raises(ValueError, match=r"watermarks= need event_time=: write event_time="):
        env.read_csv(tmp_path / "in", watermarks=BoundedOutOfOrderness("1s"))
    with pytest.raises(TypeError, match=r"got an unexpected keyword argument 'max_lateness'"):
        env.read_parquet(tmp_path / "in", event_time="ts", max_lateness=1)  # type: ignore[call-arg]


def test_assign_timestamps_takes_the_value_its_shorthands_and_its_old_keywords(
    tmp_path: Path,
) -> None:
    """A column or a function, given alone or in an ``EventTime``; the old
    ``assign_timestamps(column, max_out_of_orderness=...)`` warns and gives the same."""
    rows = write(tmp_path)
    outputs = []
    for way in ("value", "function", "old"):
        env = env_of(tmp_path, way)
        stream = env.read_parquet(tmp_path / "in").map(dict)
        if way == "value":
            timed = stream.assign_timestamps(EventTime("ts", max_out_of_orderness="300ms"))
        elif way == "function":
            timed = stream.assign_timestamps(
                EventTime(lambda r: r["ts"], max_out_of_orderness="300ms")
            )
        else:
            with pytest.warns(DeprecationWarning, match=r"write assign_timestamps\(EventTime\("):
                timed = stream.assign_timestamps("ts", max_out_of_orderness="300ms")
        timed.key_by("user").window(Tumbling("1s")).count().collect()
        outputs.append(testing.execute(env, launcher=ThreadLauncher(), progress=False).output)
    assert all(per_second(output) == expected(rows) for output in outputs)
    stream = env_of(tmp_path, "named").read_parquet(tmp_path / "in")
    with pytest.warns(DeprecationWarning, match=r"column_or_fn=.* is deprecated"):
        stream.assign_timestamps(column_or_fn="ts", name="old")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"assign_timestamps needs the event time"):
        stream.assign_timestamps()
    with pytest.raises(ValueError, match=r"the records have no column 'when'"):
        stream.assign_timestamps(EventTime("when"))


def test_assign_timestamps_sends_a_record_that_jumps_past_max_jump_to_the_dead_letters(
    tmp_path: Path,
) -> None:
    rows = write(tmp_path)
    far = {"user": "u1", "ts": 10**13}  # (the year 2286)
    pq.write_table(pa.Table.from_pylist([far], SCHEMA), tmp_path / "in" / "z-far.parquet")
    env = env_of(tmp_path, "ck")
    (
        env.read_parquet(tmp_path / "in")
        .assign_timestamps(
            EventTime("ts", max_out_of_orderness="300ms", max_jump="1h"), on_error="dead_letter"
        )
        .key_by("user")
        .window(Tumbling("1s"))
        .count()
        .collect()
    )
    result = testing.execute(env, launcher=ThreadLauncher(), progress=False)
    assert per_second(result.output) == expected(rows)
    dead = [
        json.loads(line)
        for path in (tmp_path / "ck-dead").rglob("*.jsonl")
        for line in path.read_text().splitlines()
    ]
    assert len(dead) == 1 and "jumps more than max_jump=1h ahead of" in json.dumps(dead[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (nothing here is deprecated)
        env_of(tmp_path, "again").read_parquet(tmp_path / "in").assign_timestamps("ts")
