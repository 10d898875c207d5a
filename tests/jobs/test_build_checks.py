"""A key, a field or an event-time column that the records are known not to have (or not of a
type that works) is refused when the job is built, naming the columns there are
(``cutline.api.columns``); after an operator that may change the records, nothing is
assumed, and the same job builds."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cutline import StreamEnvironment, Tumbling, testing
from cutline.runtime.task.local import ThreadLauncher


def clicks(tmp_path: Path) -> StreamEnvironment:
    (tmp_path / "in").mkdir()
    table = pa.table(
        {
            "user": ["a", "b"],
            "ts": pa.array([1_000, 2_000], pa.timestamp("ms")),
            "amount": [1.5, 2.0],
            "n": pa.array([1, 2], pa.int32()),
        }
    )
    pq.write_table(table, tmp_path / "in" / "x.parquet")
    return StreamEnvironment(1, checkpoint_dir=str(tmp_path / "ck"))


COLUMNS = r"\(columns: user, ts, amount, n\)"


def test_a_key_or_a_field_the_records_lack_is_refused_naming_the_columns(tmp_path: Path) -> None:
    env = clicks(tmp_path)
    stream = env.read_parquet(tmp_path / "in", event_time="ts")
    with pytest.raises(
        ValueError, match=rf"key_by\('nope'\): the records have no column 'nope' {COLUMNS}"
    ):
        stream.key_by("nope")
    keyed = stream.key_by("user")
    with pytest.raises(
        ValueError, match=rf"sum\('nope'\): the records have no column 'nope' {COLUMNS}"
    ):
        keyed.sum("nope")
    with pytest.raises(
        ValueError,
        match=r"column 'user' is string, but max needs numbers \(numeric columns: amount, n\)",
    ):
        keyed.max("user")
    windowed = keyed.window(Tumbling("1s"))
    with pytest.raises(
        ValueError, match=rf"window\(Tumbling\(1s\)\)\.sum\('nope'\): .*no column 'nope' {COLUMNS}"
    ):
        windowed.sum("nope")
    with pytest.raises(
        ValueError, match=r"\.mean\('user'\): column 'user' is string, but mean needs numbers"
    ):
        windowed.mean("user")
    with pytest.raises(
        ValueError, match=rf"assign_timestamps: the records have no column 'when' {COLUMNS}"
    ):
        stream.assign_timestamps("when")
    # filter keeps the columns: still checked; a window's results have theirs
    with pytest.raises(ValueError, match=r"key_by\('nope'\)"):
        stream.filter(lambda r: True).key_by("nope")
    sums = windowed.sum("amount")
    assert sums.schema is not None
    assert sums.schema.names == ["user", "window_start", "window_end", "amount"]
    assert sums.schema.field("window_start").type == pa.timestamp("ms")
    with pytest.raises(
        ValueError, match=r"no column 'n' \(columns: user, window_start, window_end, amount\)"
    ):
        sums.key_by("user").sum("n")
    counts = keyed.window(Tumbling("1s")).count()
    assert counts.schema is not None and counts.schema.field("count").type == pa.int64()
    late = sums.late()
    with pytest.raises(ValueError, match=rf"no column 'nope' {COLUMNS}"):
        late.key_by("nope")


def test_after_an_operator_that_may_change_the_records_nothing_is_assumed(tmp_path: Path) -> None:
    env = clicks(tmp_path)
    stream = env.read_parquet(tmp_path / "in", event_time="ts")
    mapped = stream.map(lambda r: {**r, "city": "x"})
    assert mapped.schema is None
    mapped.key_by("city").window(Tumbling("1s")).sum("amount").collect()
    unioned = stream.union(env.read_parquet(tmp_path / "in", event_time="ts", name="again"))
    assert unioned.schema is not None and unioned.schema.equals(stream.schema)
    assert stream.union(mapped).schema is None
    testing.execute(env, launcher=ThreadLauncher())
