"""Checkpoint state as Spark DataFrames (``cutline.spark.datasource``): the keyed state read
through Spark must be exactly the state the job had at each checkpoint, as its published
output implies; the channel state exactly what the checkpoint recorded; the column types
inferred as documented; and every error a clean :class:`InspectError` naming the problem.

The jobs run with their slots as threads (:class:`~cutline.runtime.task.local.ThreadLauncher`):
only the reading is Spark's, on the session's real local Spark.
"""

from __future__ import annotations

import ast
import json
import pickle
import re
import shutil
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from cutline import (
    Checkpoints,
    FixedDelay,
    KeyedProcessFunction,
    SourceHold,
    StreamEnvironment,
    testing,
)
from cutline.runtime.checkpoint.reader import InspectError, open_checkpoint
from cutline.runtime.checkpoint.storage import CheckpointStorage
from cutline.runtime.state.keygroups import DEFAULT_MAX_PARALLELISM, key_group
from cutline.runtime.task.local import ThreadLauncher
from cutline.spark.datasource import (
    BINARY,
    BOOLEAN,
    DOUBLE,
    LONG,
    REPR,
    STRING,
    UNKNOWN,
    CutlineDataSource,
    KeyedShapes,
    KeyedStateReader,
    ReadOptions,
    Shape,
    StateTypeError,
    finish,
    read_channel_state,
    read_state,
    record_text,
    register,
    shape_of,
    unify,
)

from docs_examples import docs_example, run_example

N = 2_000
KEYS = 13
_PART = re.compile(r"part-(\d{5})-(\d{10})-g(\d+)-[a-z0-9]+-\d+\.pickle")


# ----------------------------------------------------------------------------------- jobs


def key_value(record: dict[str, int]) -> dict[str, int]:
    """key = value mod 13."""
    return {"key": record["value"] % KEYS, "value": 1}


@pytest.fixture(scope="module")
def counts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A keyed running count (one keyed operator, ``counts``) at parallelism 2, with every
    checkpoint retained; returns its checkpoint directory. Its sources hold half-way until
    two checkpoints completed: three complete checkpoints at least, the first two before the
    end of the input."""
    directory = tmp_path_factory.mktemp("counts") / "ck"
    env = StreamEnvironment(
        2,
        checkpoints=Checkpoints(interval=0.05, dir=directory, retained=100),
        restart_strategy=FixedDelay(delay=0),
        batch_size=20,
    )
    env.from_sequence(0, N).map(key_value).key_by("key").count(name="counts").collect()
    result = testing.execute(
        env, launcher=ThreadLauncher(), hold_sources=SourceHold(records=N // 4, checkpoints=2)
    )
    assert result.restarts == []
    assert sorted(Counter(r["key"] for r in result.output).values()) == sorted(
        Counter(v % KEYS for v in range(N)).values()
    )
    return directory


def published_by_checkpoint(directory: Path) -> dict[int, list[dict[str, Any]]]:
    """The collect sink's published parts: checkpoint id -> the records it pre-committed."""
    parts: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for path in (directory / "_collect" / "collect").iterdir():
        match = _PART.fullmatch(path.name)
        if match is None:
            continue
        assert match.group(3) == "1", "the job restarted: parts of one attempt expected"
        parts[int(match.group(2))] += pickle.loads(path.read_bytes())
    return parts


def counts_at(parts: dict[int, list[dict[str, Any]]], checkpoint_id: int) -> dict[int, int]:
    """Each key's count in the state of checkpoint ``checkpoint_id``: the number of its
    records published by checkpoints up to it (the output up to that cut)."""
    seen = Counter(r["key"] for c, records in parts.items() if c <= checkpoint_id for r in records)
    return dict(seen)


class Kinds(KeyedProcessFunction):
    """Keyed state of many types, all deterministic whatever the order of the records."""

    def open(self, ctx):
        self.states = {
            name: ctx.value_state(name)
            for name in ("count", "total", "mean", "name", "big", "flag", "blob", "mixed", "pair")
        }
        self.values = ctx.list_state("values")
        self.seen = ctx.map_state("seen")

    def process(self, record, ctx):
        value, index = record["value"], record["value"] % 10
        s = self.states
        count, total = s["count"].get(0) + 1, s["total"].get(0) + value
        s["count"].update(count)
        s["total"].update(total)
        s["mean"].update(total / count)
        s["name"].update(f"item-{index}")
        s["big"].update(np.int64(total))
        s["flag"].update(count % 2 == 0)
        s["blob"].update(bytes([index]) * 3)
        s["mixed"].update(index if index % 2 == 0 else f"odd-{index}")
        s["pair"].update((index, "x"))
        self.values.update(sorted([*self.values.get(), value]))
        self.seen.put(value, value % 3 == 0)
        yield {"key": ctx.key, "count": count}


def quarter(record: dict[str, int]) -> dict[str, Any]:
    return {"key": record["value"] % 5, "x": record["value"] / 4}


@pytest.fixture(scope="module")
def kinds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two keyed operators at parallelism 1: ``kinds`` (string keys k0..k9, 20 records each;
    value, list and map state of many types) and ``float_sum`` (int keys, float sums)."""
    directory = tmp_path_factory.mktemp("kinds") / "ck"
    env = StreamEnvironment(1, checkpoint_interval=None, checkpoint_dir=directory, batch_size=16)
    (
        env.from_sequence(0, 200)
        .map(lambda r: {"key": f"k{r['value'] % 10}", "value": r["value"]})
        .key_by("key")
        .process(Kinds(), name="kinds")
        .collect("kinds")
    )
    env.from_sequence(0, 50).map(quarter).key_by("key").sum("x", name="float_sum").collect("sums")
    assert testing.execute(env, launcher=ThreadLauncher()).restarts == []
    return directory


def expected_kinds(index: int) -> dict[str, Any]:
    """The final state of key ``k{index}`` of the ``kinds`` operator, per state."""
    values = list(range(index, 200, 10))
    total = sum(values)
    return {
        "count": 20,
        "total": total,
        "mean": total / 20,
        "name": f"item-{index}",
        "big": total,
        "flag": True,
        "blob": bytes([index]) * 3,
        "mixed": index if index % 2 == 0 else f"odd-{index}",
        "pair": (index, "x"),
        "values": values,
        "seen": {v: v % 3 == 0 for v in values},
    }


def grow_batch_key(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.append_column("key", pc.bit_wise_and(batch["value"], 7))


def slow_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    time.sleep(0.02)
    return batch


@pytest.fixture(scope="module")
def unaligned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Unaligned checkpoints of a job under backpressure (a slow keyed operator behind full
    buffers), all retained: they record the records in flight."""
    directory = tmp_path_factory.mktemp("unaligned") / "ck"
    env = StreamEnvironment(
        2,
        checkpoints=Checkpoints(interval=0.1, dir=directory, retained=100, mode="unaligned"),
        restart_strategy=FixedDelay(delay=0),
        batch_size=20,
        buffer_capacity=2,
    )
    (
        env.from_sequence(0, 1_500)
        .map_batches(grow_batch_key)
        .key_by("key")
        .map_batches(slow_batch)
        .key_by("key")
        .count(name="counts")
        .collect()
    )
    result = testing.execute(env, launcher=ThreadLauncher())
    assert result.restarts == []
    assert any(c.channel_state_records > 0 for c in result.checkpoints)
    return directory


# ------------------------------------------------------------------------ exact keyed state


def test_read_state_is_exactly_the_state_at_each_retained_checkpoint(spark, counts: Path) -> None:
    storage = CheckpointStorage(str(counts))
    complete = storage.completed_ids()
    assert len(complete) >= 3, f"only checkpoints {complete}: the job was too fast"
    parts = published_by_checkpoint(counts)
    assert sum(map(len, parts.values())) == N
    chosen = [complete[0], complete[len(complete) // 2], complete[-1]]
    for checkpoint_id in chosen:
        if checkpoint_id == complete[-1]:  # the directory alone: its newest checkpoint
            df = read_state(spark, str(counts))
        else:
            df = read_state(spark, str(counts), "counts", checkpoint_id=checkpoint_id)
        assert df.schema.simpleString() == (
            "struct<subtask:string,key_group:int,key:bigint,state:string,value:bigint>"
        )
        rows = df.collect()
        state = {row.key: row.value for row in rows}
        assert len(state) == len(rows), "a key twice"
        assert state == counts_at(parts, checkpoint_id), f"checkpoint {checkpoint_id}"
        for row in rows:
            assert row.state == "count"
            assert row.key_group == key_group(row.key, DEFAULT_MAX_PARALLELISM)
            assert row.subtask in ("counts-0", "counts-1")
    # the last checkpoint is the final one: every record counted
    assert counts_at(parts, complete[-1]) == dict(Counter(v % KEYS for v in range(N)))
    assert counts_at(parts, complete[0]) != counts_at(parts, complete[-1])


def test_the_data_source_and_spark_sql_give_the_same_state(spark, counts: Path) -> None:
    parts = published_by_checkpoint(counts)
    # (of those with state: one taken before any record was counted has none)
    complete = [c for c in CheckpointStorage(str(counts)).completed_ids() if counts_at(parts, c)]
    checkpoint_id = complete[len(complete) // 3]
    expected = counts_at(parts, checkpoint_id)
    register(spark)
    register(spark)  # idempotent
    df = (
        spark.read.format("cutline")
        .option("operator", "counts")  # the operator's name= (its name and its uid)
        .load(str(counts / f"chk-{checkpoint_id}"))
    )
    df.createOrReplaceTempView("cutline_counts_state")
    threshold = sorted(expected.values())[len(expected) // 2]
    rows = spark.sql(
        f"select key, value from cutline_counts_state where value >= {threshold}"
    ).collect()
    assert sorted((r.key, r.value) for r in rows) == sorted(
        (k, v) for k, v in expected.items() if v >= threshold
    )
    # the same checkpoint as the option `checkpoint` of the directory, and without the option
    # operator (the only keyed one); one partition per subtask holding state
    by_id = spark.read.format("cutline").option("checkpoint", str(checkpoint_id)).load(str(counts))
    assert by_id.rdd.getNumPartitions() == 2
    assert {r.key: r.value for r in by_id.collect()} == expected


# --------------------------------------------------------------------------- channel state


def test_channel_state_of_an_unaligned_checkpoint_is_what_the_checkpoint_recorded(
    spark, unaligned: Path
) -> None:
    storage = CheckpointStorage(str(unaligned))
    with_channels = [
        c
        for c in storage.completed_ids()
        if any(h.channel_state for h in storage.read_metadata(c).handles.values())
    ]
    assert with_channels, "no retained checkpoint recorded records in flight"
    checkpoint_id = with_channels[0]
    reader = open_checkpoint(str(unaligned), checkpoint_id)
    expected = sorted(
        (r.subtask, r.side, r.channel, r.position, record_text(r.record))
        for r in reader.channel_state()
    )
    df = read_channel_state(
        spark, str(unaligned), checkpoint_id=checkpoint_id, storage_options={"auto_mkdir": False}
    )
    assert df.schema.simpleString() == (
        "struct<subtask:string,side:string,channel:string,position:bigint,record:string>"
    )
    rows = sorted(tuple(r) for r in df.collect())
    assert rows == expected
    assert rows, "the handles say there is channel state"
    per_subtask = Counter(r[0] for r in rows)
    for subtask, handle in reader.handles.items():
        assert handle.channels is not None
        recorded = sum(handle.channels["recorded_inputs"].values()) + sum(
            handle.channels["recorded_outputs"].values()
        )
        assert per_subtask.get(subtask, 0) == recorded, subtask
    assert {r[1] for r in rows} <= {"input", "output"}
    # the records were rows of Arrow batches: JSON objects with the batches' columns
    for row in rows:
        record = json.loads(row[4])
        assert set(record) == {"value", "key"} and record["key"] == record["value"] & 7


def test_a_checkpoint_without_channel_state_gives_no_rows(spark, counts: Path) -> None:
    assert read_channel_state(spark, str(counts)).collect() == []


# ----------------------------------------------------------------------------------- types


def test_the_types_of_each_state_are_inferred(spark, kinds: Path) -> None:
    expected = {
        "count": "bigint",
        "total": "bigint",
        "mean": "double",
        "name": "string",
        "big": "bigint",
        "flag": "boolean",
        "blob": "binary",
        "mixed": "string",
        "pair": "string",
        "values": "array<bigint>",
        "seen": "map<bigint,boolean>",
    }
    for state, value_type in expected.items():
        df = read_state(spark, str(kinds), "kinds", state=state)
        assert df.schema.simpleString() == (
            f"struct<subtask:string,key_group:int,key:string,state:string,value:{value_type}>"
        ), state
    floats = read_state(spark, str(kinds), "float_sum")
    assert floats.schema["key"].dataType.simpleString() == "bigint"
    assert floats.schema["value"].dataType.simpleString() == "double"
    assert {r.key: r.value for r in floats.collect()} == {
        j: sum(v / 4 for v in range(50) if v % 5 == j) for j in range(5)
    }


@pytest.mark.parametrize("state", ["values", "seen", "big", "blob", "mixed"])
def test_the_values_of_a_state_are_read_exactly(spark, kinds: Path, state: str) -> None:
    rows = read_state(spark, str(kinds), "kinds", state=state).collect()
    assert len(rows) == 10
    for row in rows:
        wanted = expected_kinds(int(row.key[1:]))[state]
        if state == "mixed":  # ints and strings: the column holds every value's repr
            assert row.value == repr(wanted)
        elif state == "blob":
            assert bytes(row.value) == wanted
        else:
            assert row.value == wanted


def test_an_operator_with_several_kinds_of_state_has_a_string_value_column(
    spark, kinds: Path
) -> None:
    df = read_state(spark, str(kinds), "kinds")
    assert df.schema["key"].dataType.simpleString() == "string"
    assert df.schema["value"].dataType.simpleString() == "string"
    rows = df.collect()
    assert len(rows) == 10 * 11
    for row in rows:
        assert ast.literal_eval(row.value) == expected_kinds(int(row.key[1:]))[row.state]


def test_types_string_gives_the_repr_of_every_key_and_value(spark, kinds: Path) -> None:
    df = read_state(spark, str(kinds), "float_sum", types="string")
    assert df.schema["key"].dataType.simpleString() == "string"
    rows = df.collect()
    expected = {j: sum(v / 4 for v in range(50) if v % 5 == j) for j in range(5)}
    assert {r.key: r.value for r in rows} == {repr(k): repr(v) for k, v in expected.items()}
    through_source = (
        spark.read.format("cutline")
        .option("operator", "kinds")
        .option("state", "count")
        .option("types", "string")
        .load(str(kinds))
    )
    assert sorted((r.key, r.value) for r in through_source.collect()) == [
        (repr(f"k{i}"), "20") for i in range(10)
    ]


def test_a_value_beyond_the_sample_that_does_not_fit_fails_clearly(spark, kinds: Path) -> None:
    # one entry sampled (parallelism 1): an int or a string; the other kind does not fit
    df = read_state(spark, str(kinds), "kinds", state="mixed", sample_size=1)
    with pytest.raises(Exception) as failure:
        df.collect()
    message = str(failure.value)
    assert "StateTypeError" in message
    assert re.search(
        r"the value of key 'k\d' in state 'mixed' \(kinds-0\) is ('odd-\d'|\d) \((str|int)\), "
        r"which does not fit the column type (bigint|string)",
        message,
    ), message
    assert 'types="string"' in message


def test_a_schema_given_by_the_user_converts_to_its_types(spark, kinds: Path) -> None:
    df = (
        spark.read.format("cutline")
        .schema("subtask string, key_group int, key string, state string, value string")
        .option("operator", "kinds")
        .option("state", "name")
        .load(str(kinds))
    )
    assert sorted(r.value for r in df.collect()) == [f"item-{i}" for i in range(10)]


# ----------------------------------------------------------------------------------- errors


def test_a_missing_path_is_a_clean_error(spark, tmp_path: Path) -> None:
    with pytest.raises(InspectError, match=r"nowhere does not exist"):
        read_state(spark, str(tmp_path / "nowhere"))
    with pytest.raises(InspectError, match=r"nowhere does not exist"):
        read_channel_state(spark, str(tmp_path / "nowhere"))


def test_a_folder_that_is_no_checkpoint_is_a_clean_error(spark, tmp_path: Path) -> None:
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"meow")
    with pytest.raises(InspectError, match=r"is neither a checkpoint or savepoint folder"):
        read_state(spark, str(tmp_path / "photos"))


def test_an_unknown_checkpoint_id_is_a_clean_error(spark, counts: Path) -> None:
    with pytest.raises(InspectError, match=r"has no checkpoint 999999 \(complete ones there: "):
        read_state(spark, str(counts), checkpoint_id=999_999)


def test_an_unknown_operator_or_state_is_a_clean_error(spark, kinds: Path) -> None:
    with pytest.raises(
        InspectError,
        match=r"holds no keyed state of operator 'nope' \(keyed operators: 'kinds', 'float_sum'\)",
    ):
        read_state(spark, str(kinds), "nope")
    with pytest.raises(InspectError, match=r"holds keyed state of several operators: name one of"):
        read_state(spark, str(kinds))
    with pytest.raises(
        InspectError, match=r"operator 'kinds' has no state 'colour' .*'blob', 'count'"
    ):
        read_state(spark, str(kinds), "kinds", state="colour")


def test_a_checkpoint_without_keyed_state_is_a_clean_error(spark, tmp_path: Path) -> None:
    env = StreamEnvironment(1, checkpoint_interval=None, checkpoint_dir=tmp_path / "ck")
    env.from_sequence(0, 10).map(lambda r: r["value"]).collect()
    testing.execute(env, launcher=ThreadLauncher())
    with pytest.raises(InspectError, match=r"checkpoint \d+ holds no keyed state$"):
        read_state(spark, str(tmp_path / "ck"))


def test_a_damaged_state_file_is_a_clean_error(spark, counts: Path, tmp_path: Path) -> None:
    copy = tmp_path / "ck"
    shutil.copytree(counts, copy)
    newest = CheckpointStorage(str(copy)).completed_ids()[-1]
    state_file = next((copy / f"chk-{newest}").glob("*counts-0.state"))
    data = bytearray(state_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state_file.write_bytes(bytes(data))
    with pytest.raises(InspectError, match=r"counts-0\.state does not match the digest"):
        read_state(spark, str(copy))


def test_through_spark_read_the_error_is_wrapped_with_its_message(spark, tmp_path: Path) -> None:
    register(spark)
    with pytest.raises(Exception) as failure:
        spark.read.format("cutline").load(str(tmp_path / "nowhere"))
    assert "InspectError: " in str(failure.value)
    assert "nowhere does not exist" in str(failure.value)


def test_wrong_options_are_clean_errors() -> None:
    with pytest.raises(InspectError, match="name the checkpoint to read"):
        ReadOptions.parse({})
    with pytest.raises(InspectError, match=r"option checkpoint: 'seven' is not a checkpoint id"):
        ReadOptions.parse({"path": "ck", "checkpoint": "seven"})
    with pytest.raises(InspectError, match=r"option types: 'ints' is not one of"):
        ReadOptions.parse({"path": "ck", "TYPES": "ints"})
    with pytest.raises(InspectError, match=r"option storageOptions is not JSON"):
        ReadOptions.parse({"path": "ck", "storageOptions": "{"})
    with pytest.raises(InspectError, match=r"drop the option operator"):
        ReadOptions.parse({"path": "ck", "channelState": "true", "operator": "sum"})
    with pytest.raises(InspectError, match=r"storageOptions: the options reach Spark's executors"):
        read_state(None, "ck", storage_options={"client": object()})
    parsed = ReadOptions.parse(
        {"path": "ck", "Checkpoint": "7", "channelstate": "TRUE", "storageOptions": '{"a": 1}'}
    )
    assert (parsed.checkpoint_id, parsed.channel_state, parsed.storage_options) == (
        7,
        True,
        {"a": 1},
    )


# ------------------------------------------------------------------------ inference itself


@pytest.mark.parametrize(
    ("values", "shape"),
    [
        ([1, 2, -(2**63)], LONG),
        ([1, 2.5], DOUBLE),
        ([True, False], BOOLEAN),
        ([1, True], REPR),
        (["a", "b"], STRING),
        ([b"a", bytearray(b"b")], BINARY),
        ([np.int64(3), np.int32(4)], LONG),
        ([np.float32(0.5), 2], DOUBLE),
        ([np.bool_(True)], BOOLEAN),
        ([np.str_("x"), "y"], STRING),
        ([2**63], REPR),
        ([1, "a"], REPR),
        ([(1, 2)], REPR),
        ([object()], REPR),
        ([None, 3], LONG),
        ([None], REPR),
        ([[1, 2], [], [3.5]], Shape("array", element=DOUBLE)),
        ([[], []], Shape("array", element=REPR)),
        ([[1, "a"]], REPR),
        ([[1], {"a": 1}], REPR),
        ([[[1], [2, 3]]], Shape("array", element=Shape("array", element=LONG))),
        ([{"a": 1}, {"b": 2.0}], Shape("map", key=STRING, value=DOUBLE)),
        ([{"a": [1]}, {}], Shape("map", key=STRING, value=Shape("array", element=LONG))),
        ([{None: 1}], REPR),
        ([{1: "a", "b": "c"}], REPR),
    ],
)
def test_the_inference_rules(values: list[Any], shape: Shape) -> None:
    inferred = UNKNOWN
    for value in values:
        inferred = unify(inferred, shape_of(value))
    assert finish(inferred) == shape
    assert Shape.from_json(json.loads(json.dumps(shape.to_json()))) == shape


def test_channel_records_are_json_for_dicts_and_repr_otherwise() -> None:
    assert record_text({"value": 3, "key": "a"}) == '{"value": 3, "key": "a"}'
    assert json.loads(record_text({"at": b"x"}) or "") == {"at": "b'x'"}
    assert record_text({(1, 2): 3}) == "{(1, 2): 3}"
    assert record_text((1, "a")) == "(1, 'a')"
    assert record_text(np.int64(5)) == "5"
    assert record_text(None) is None


def test_the_reader_is_picklable_and_checks_every_value(kinds: Path) -> None:
    source = CutlineDataSource({"path": str(kinds), "operator": "kinds", "state": "values"})
    schema = source.schema()
    reader = pickle.loads(pickle.dumps(source.reader(schema)))
    assert isinstance(reader, KeyedStateReader)
    partitions = reader.partitions()
    assert [p.value for p in partitions] == ["kinds-0"]
    rows = list(reader.read(partitions[0]))
    assert sorted(r[2] for r in rows) == [f"k{i}" for i in range(10)]
    assert all(r[4] == expected_kinds(int(r[2][1:]))["values"] for r in rows)
    # a column type the values do not fit (as when the sample missed them)
    names = CutlineDataSource({"path": str(kinds), "operator": "kinds", "state": "name"})
    names.schema()
    strict = KeyedStateReader(names.reader(schema).plan, schema, KeyedShapes(STRING, LONG))
    with pytest.raises(
        StateTypeError,
        match=r"the value of key 'k\d' in state 'name' \(kinds-0\) is 'item-\d' \(str\), which "
        r"does not fit the column type bigint",
    ):
        list(strict.read(partitions[0]))


# ------------------------------------------------------------------ across state backends


@pytest.mark.slow  # (make test: the reader across backends in tests/jobs, the data source here)
def test_read_state_gives_the_same_windows_whichever_backend_wrote_them(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same job stopped at the same place under each state backend: the memory backend
    keeps built-in windows as columns, the disk backend as keyed state; ``read_state`` gives
    the same rows from both (``tests/jobs/test_state_across_backends.py`` runs the jobs)."""
    from test_event_time_restore import write_clicks
    from test_state_across_backends import run_to_savepoint

    clicks = write_clicks(tmp_path / "in", seed=9)
    paths = {
        backend: run_to_savepoint(tmp_path, clicks, backend, 2, monkeypatch, name=backend)[0]
        for backend in ("memory", "disk")
    }
    for operator in ("tumbling-count", "sliding-sum", "session-mean", "rolling"):
        rows = {  # (a window's value is the repr of a dict: compared as the dict)
            backend: sorted(
                (*row[:-1], _parsed(row[-1])) for row in read_state(spark, path, operator).collect()
            )
            for backend, path in paths.items()
        }
        assert rows["memory"], f"{operator}: the savepoint holds its state"
        assert rows["memory"] == rows["disk"], operator


def _parsed(value: Any) -> Any:
    """A window's value (the repr of a dict of windows, or of a tuple of sessions) as a value
    whose order does not depend on the order it was built in."""
    if not isinstance(value, str):
        return value
    parsed = ast.literal_eval(value)
    return sorted(parsed.items()) if isinstance(parsed, dict) else parsed


def test_the_observability_page_reads_state_as_it_says(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/operations/observability.md's DataFrames, as written there, on the final checkpoint
    of a keyed sum named ``sum``: the state read is every key's total."""
    env = StreamEnvironment(2, checkpoint_interval=None, checkpoint_dir=tmp_path / "ck")
    stream = env.from_sequence(0, N).map(key_value)
    stream.key_by("key").sum("value", name="sum").collect()
    testing.execute(env, launcher=ThreadLauncher(), progress=False)
    (checkpoint,) = sorted((tmp_path / "ck").glob("chk-*"))
    namespace = run_example(
        docs_example("state-dataframes"),
        tmp_path,
        monkeypatch,
        before=lambda names: names.update(spark=spark),
        checkpoint=str(checkpoint),
    )
    rows = namespace["df"].collect()
    totals = Counter(key_value({"value": i})["key"] for i in range(N))
    assert {row["key"]: row["value"] for row in rows} == dict(totals)
