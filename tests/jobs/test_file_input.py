"""File input a user can trust (issue 16, points 7-9): one schema for the whole input, rows
that do not fit it or are malformed rejected with their file and line (an error, or a dead
letter), CSV options, a file, a glob or a directory, and a warning for an empty input. Jobs run
through the real runtime with slots as threads (no Spark)."""

from __future__ import annotations

import ast
import json
import math
import pickle
import re
import warnings
from datetime import date, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_runtime_jobs import FailAfterCheckpoint, dead_letters

from cutline import FixedDelay, JobFailedError, JobResult, SourceHold, StreamEnvironment, testing
from cutline.runtime.io.formats import CsvOptions, InputWarning, SourceError, as_schema
from cutline.runtime.task.local import ThreadLauncher

SCHEMA = {"user": "string", "value": "int64"}


def environment(tmp_path: Path, parallelism: int = 1, **options: Any) -> StreamEnvironment:
    settings: dict[str, Any] = {
        "checkpoint_interval": 0.05,
        "checkpoint_dir": tmp_path / "checkpoints",
        "dead_letter_dir": tmp_path / "dead",
        "restart_strategy": FixedDelay(0, delay=0),
        "batch_size": 16,
    }
    settings.update(options)
    return StreamEnvironment(parallelism, **settings)


def run(env: StreamEnvironment, **options: Any) -> JobResult:
    return testing.execute(env, launcher=ThreadLauncher(), progress=False, **options)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def schema_of(stream: Any) -> pa.Schema:
    """The schema fixed in a file source's operator when the job was built."""
    return stream.operator.logic.source.schema


# ----------------------------------------------------------------- the issue's case


def test_the_issue_case_with_a_schema_sends_the_text_row_to_the_dead_letters(
    tmp_path: Path,
) -> None:
    events = write(tmp_path / "in" / "events.csv", "user,value\nu3,3\nu3,4\nu9,abc\n")
    env = environment(tmp_path)
    (
        env.read_csv(tmp_path / "in", schema=SCHEMA, on_error="dead_letter")
        .key_by("user")
        .sum("value")
        .collect()
    )
    result = run(env)
    assert result.output == [{"user": "u3", "value": 3}, {"user": "u3", "value": 7}]
    (dead,) = dead_letters(tmp_path / "dead")
    assert json.loads(dead["record"]) == "u9,abc"
    assert dead["error"] == f"{events}:4: column 'value': 'abc' is not an int64"
    assert dead["operator"] == "read_csv"
    assert dead["traceback"] == ""


def test_without_a_header_the_line_is_the_row(tmp_path: Path) -> None:
    events = write(tmp_path / "events.csv", "u3,3\nu3,4\nu9,abc\n")
    env = environment(tmp_path)
    stream = env.read_csv(events, header=False, schema=SCHEMA, on_error="dead_letter")
    stream.key_by("user").sum("value").collect()
    result = run(env)
    assert [r["value"] for r in result.output] == [3, 7]
    (dead,) = dead_letters(tmp_path / "dead")
    assert dead["error"] == f"{events}:3: column 'value': 'abc' is not an int64"


def test_the_issue_case_without_a_schema_is_text_and_says_so(tmp_path: Path) -> None:
    events = write(tmp_path / "in" / "events.csv", "user,value\nu3,3\nu3,4\nu9,abc\n")
    env = environment(tmp_path)
    with pytest.warns(InputWarning) as caught:
        stream = env.read_csv(tmp_path / "in")
    (warning,) = caught
    assert warning.filename == __file__  # it points at the user's read_csv
    message = str(warning.message)
    assert f"column 'value' mixes numbers and text ('abc' at {events}:4)" in message
    assert "schema={'user': 'string', 'value': 'int64'}" in message
    assert "dead letters" in message
    assert schema_of(stream) == pa.schema([("user", pa.string()), ("value", pa.string())])
    stream.collect()
    assert [r["value"] for r in run(env).output] == ["3", "4", "abc"]
    # the schema= it suggests can be pasted
    found = re.search(r"schema=(\{.*?\})", message)
    assert found is not None
    env = environment(tmp_path / "again")
    suggested = ast.literal_eval(found.group(1))
    env.read_csv(tmp_path / "in", schema=suggested, on_error="dead_letter").collect()
    assert [r["value"] for r in run(env).output] == [3, 4]


def test_a_byte_order_mark_is_not_part_of_the_first_column(tmp_path: Path) -> None:
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbfuser,value\r\nu1,1\r\n")
    env = environment(tmp_path)
    env.read_csv(path).collect()
    assert run(env).output == [{"user": "u1", "value": 1}]


def test_n_a_and_the_like_are_values_unless_null_values_says_otherwise(tmp_path: Path) -> None:
    write(tmp_path / "a.csv", "name,score\nn/a,1.5\nNA,NaN\nNaN,\n,2\nzed,3\n")
    env = environment(tmp_path)
    env.read_csv(tmp_path / "a.csv").collect("default")
    env.read_csv(tmp_path / "a.csv", null_values=["n/a", "NA", ""]).collect("chosen")
    result = run(env)
    default = result.collected["default"]
    assert [r["name"] for r in default] == ["n/a", "NA", "NaN", None, "zed"]  # only ""
    scores = [r["score"] for r in default]
    assert scores[0] == 1.5 and math.isnan(scores[1]) and scores[2:] == [None, 2.0, 3.0]
    assert [r["name"] for r in result.collected["chosen"]] == [None, None, "NaN", None, "zed"]


# ------------------------------------------------------------------------ one schema


def test_a_csv_schema_is_inferred_across_files(tmp_path: Path) -> None:
    write(tmp_path / "in" / "a.csv", "k,n,when\nx,1,2024-01-02\n")
    write(tmp_path / "in" / "b.csv", "k,n,flag,at\ny, 2.5 ,true,2024-01-02 03:04:05\n")
    write(tmp_path / "in" / "c.csv", "k,empty\nz,\n")
    env = environment(tmp_path)
    stream = env.read_csv(tmp_path / "in")
    assert schema_of(stream) == pa.schema(
        [
            ("k", pa.string()),
            ("n", pa.float64()),  # int64 in a.csv, double in b.csv
            ("when", pa.date32()),
            ("flag", pa.bool_()),
            ("at", pa.timestamp("us")),
            ("empty", pa.string()),  # no value seen: text
        ]
    )
    stream.collect()
    assert run(env).output == [
        {"k": "x", "n": 1.0, "when": date(2024, 1, 2), "flag": None, "at": None, "empty": None},
        {"k": "y", "n": 2.5, "when": None, "flag": True, "at": datetime(2024, 1, 2, 3, 4, 5)}
        | {"empty": None},
        {"k": "z", "n": None, "when": None, "flag": None, "at": None, "empty": None},
    ]


def test_the_schema_is_fixed_when_the_job_is_built(tmp_path: Path) -> None:
    """Every subtask and restart reads the same types: a file changed after the job was built
    is read with them, and what no longer fits is rejected."""
    path = write(tmp_path / "in" / "a.csv", "user,value\nu1,1\n")
    env = environment(tmp_path)
    stream = env.read_csv(path, on_error="dead_letter")
    source = stream.operator.logic.source
    assert pickle.loads(pickle.dumps(source)).schema == source.schema  # (to the executors)
    write(path, "user,value\nu1,1\nu2,two\n")
    stream.collect()
    assert run(env).output == [{"user": "u1", "value": 1}]
    assert [d["error"] for d in dead_letters(tmp_path / "dead")] == [
        f"{path}:3: column 'value': 'two' is not an int64"
    ]


def test_a_given_schema_selects_and_orders_the_columns(tmp_path: Path) -> None:
    write(tmp_path / "in" / "a.csv", "extra,value,user\n9,1,u1\n")
    write(tmp_path / "in" / "b.csv", "user\nu2\n")
    env = environment(tmp_path)
    schema = pa.schema([("user", pa.string()), ("value", pa.int32())])
    stream = env.read_csv(tmp_path / "in", schema=schema)
    assert schema_of(stream) == schema
    stream.collect()
    assert run(env).output == [{"user": "u1", "value": 1}, {"user": "u2", "value": None}]


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_columns_reads_only_those_columns_in_their_order(tmp_path: Path, fmt: str) -> None:
    rows = [{"a": 1, "b": "x", "c": 3.5}, {"a": 2, "b": "y", "c": 4.5}]
    path = tmp_path / f"in.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif fmt == "csv":
        write(path, "a,b,c\n1,x,3.5\n2,y,4.5\n")
    else:
        write(path, "".join(json.dumps(r) + "\n" for r in rows))
    env = environment(tmp_path)
    stream = getattr(env, f"read_{fmt}")(path, columns=["c", "a"])
    assert schema_of(stream) == pa.schema([("c", pa.float64()), ("a", pa.int64())])
    stream.collect()
    assert run(env).output == [{"c": 3.5, "a": 1}, {"c": 4.5, "a": 2}]


def test_columns_are_checked_when_the_job_is_built(tmp_path: Path) -> None:
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"a": [1], "ts": [5]}), path)
    env = environment(tmp_path)
    with pytest.raises(ValueError, match=r"no column 'zz' to read \(columns=\); the input's "):
        env.read_parquet(path, columns=["a", "zz"])
    with pytest.raises(TypeError, match="columns takes a list of column names, not 'a'"):
        env.read_parquet(path, columns="a")
    with pytest.raises(ValueError, match="columns=\\[\\] reads no column"):
        env.read_parquet(path, columns=[])
    with pytest.raises(ValueError, match="columns names 'a' more than once"):
        env.read_parquet(path, columns=["a", "a"])
    with pytest.raises(ValueError, match="event_time='ts' is not among the columns read"):
        env.read_parquet(path, columns=["a"], event_time="ts")
    # a different projection is a different source (its id), the same one the same
    one = env.read_parquet(path, columns=["a"]).operator.uid
    assert one != env.read_parquet(path, columns=["ts"]).operator.uid


def test_schema_names_and_types_are_checked() -> None:
    assert as_schema({"a": "str", "b": "int", "c": pa.float32(), "d": "timestamp[ms]"}) == (
        pa.schema(
            [("a", pa.string()), ("b", pa.int64()), ("c", pa.float32()), ("d", pa.timestamp("ms"))]
        )
    )
    with pytest.raises(ValueError, match="column 'n' has the unknown type 'number'"):
        as_schema({"n": "number"})
    with pytest.raises(TypeError, match=r"schema must be a pyarrow\.Schema or a dict"):
        as_schema(["n"])
    with pytest.raises(ValueError, match="give at least one column"):
        as_schema({})
    with pytest.raises(ValueError, match="delimiter must be one ASCII character"):
        CsvOptions(delimiter=";;")
    with pytest.raises(ValueError, match="the quote and the delimiter are both"):
        CsvOptions(quote=",")
    with pytest.raises(ValueError, match="column_names names 'a' twice"):
        CsvOptions(column_names=("a", "a"))


def test_a_header_that_names_a_column_twice_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "a.csv", "a,b,a\n1,2,3\n")
    with pytest.raises(SourceError, match=rf"{path}:1: the header names 'a' twice"):
        environment(tmp_path).read_csv(path)


# ---------------------------------------------------------------------- JSON lines


def test_a_json_schema_is_inferred_across_files(tmp_path: Path) -> None:
    rows_a = [
        {"id": 1, "at": "2024-01-02T03:04:05", "tags": ["a"], "who": {"name": "x"}, "z": None}
    ]
    rows_b = [{"id": 2.5, "at": "2024-01-02T03:04:05", "who": {"age": 3}, "z": None}]
    write(tmp_path / "in" / "a.jsonl", "".join(json.dumps(r) + "\n" for r in rows_a))
    write(tmp_path / "in" / "b.jsonl", "".join(json.dumps(r) + "\n" for r in rows_b))
    env = environment(tmp_path)
    stream = env.read_jsonl(tmp_path / "in")
    assert schema_of(stream) == pa.schema(
        [
            ("id", pa.float64()),
            ("at", pa.timestamp("us")),
            ("tags", pa.list_(pa.string())),
            ("who", pa.struct([("name", pa.string()), ("age", pa.int64())])),
            ("z", pa.string()),  # only nulls seen: text
        ]
    )
    stream.collect()
    output = run(env).output
    assert [r["id"] for r in output] == [1.0, 2.5]
    assert output[1]["who"] == {"name": None, "age": 3}
    assert output[1]["tags"] is None


def test_a_json_column_of_numbers_and_text_is_text_and_says_so(tmp_path: Path) -> None:
    lines = [{"user": "u3", "value": 3}, {"user": "u3", "value": 4}, {"user": "u9", "value": "x"}]
    path = write(tmp_path / "b.jsonl", "".join(json.dumps(r) + "\n" for r in lines))
    env = environment(tmp_path)
    with pytest.warns(
        InputWarning, match=rf"column 'value' mixes numbers and text \('x' at {path}:3\)"
    ):
        stream = env.read_jsonl(path)
    stream.collect()
    assert [r["value"] for r in run(env).output] == ["3", "4", "x"]  # numbers as JSON text


def test_json_values_that_do_not_fit_are_rejected_with_the_reason(tmp_path: Path) -> None:
    path = write(
        tmp_path / "in" / "a.jsonl",
        '{"user": "u1", "value": 1, "more": true}\n'
        '{"user": "u2", "value": "abc"}\n'
        '{"user": "u3", "value": 2.5}\n'
        '{"user": ["u4"], "value": 4}\n'
        "\n"
        '{"user": "u5"}\n',
    )
    env = environment(tmp_path)
    env.read_jsonl(path, schema=SCHEMA, on_error="dead_letter").collect()
    assert run(env).output == [  # (a dict sets the types of its columns: "more" is kept)
        {"user": "u1", "value": 1, "more": True},
        {"user": '["u4"]', "value": 4, "more": None},  # text takes any value, as JSON text
        {"user": "u5", "value": None, "more": None},
    ]
    assert [(d["error"], json.loads(d["record"])) for d in dead_letters(tmp_path / "dead")] == [
        (f"{path}:2: column 'value': 'abc' is not an int64", '{"user": "u2", "value": "abc"}'),
        (f"{path}:3: column 'value': 2.5 is not an int64", '{"user": "u3", "value": 2.5}'),
    ]


def test_json_text_that_is_not_utf8_is_rejected(tmp_path: Path) -> None:
    """(pyarrow.json takes the bytes as they are: the reader checks them.)"""
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"user": "u1", "value": 1}\n{"user": "caf\xe9", "value": 2}\n')
    env = environment(tmp_path)
    env.read_jsonl(path, on_error="dead_letter").collect()
    assert run(env).output == [{"user": "u1", "value": 1}]
    (dead,) = dead_letters(tmp_path / "dead")
    assert dead["error"] == f"{path}:2: column 'user': not UTF-8 text"
    assert json.loads(dead["record"]) == '{"user": "caf\ufffd", "value": 2}'


# --------------------------------------------------------------------- malformed rows


@pytest.mark.parametrize(
    ("fmt", "bad", "reason"),
    [
        ("csv", "u2,2,3", "3 field(s) where the columns are 2"),
        ("jsonl", '{"user": "u2", "value": 2', "malformed JSON: Expecting ',' delimiter"),
        ("jsonl", "[2]", "not a JSON object but an array"),
    ],
)
def test_a_malformed_row_fails_the_job_naming_its_file_and_line(
    tmp_path: Path, fmt: str, bad: str, reason: str
) -> None:
    first = '{"user": "u1", "value": 1}' if fmt == "jsonl" else "u1,1"
    header = "user,value\n" if fmt == "csv" else ""
    path = write(tmp_path / f"events.{fmt}", f"{header}{first}\n{bad}\n{first}\n")
    line = 3 if fmt == "csv" else 2
    env = environment(tmp_path)
    reader = env.read_csv if fmt == "csv" else env.read_jsonl
    reader(path, schema=SCHEMA).collect()
    with pytest.raises(JobFailedError) as failed:
        run(env)
    assert f"SourceError: {path}:{line}: {reason}" in str(failed.value)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
@pytest.mark.parametrize("parallelism", [1, 2])
def test_with_dead_letters_a_malformed_row_is_skipped_and_the_rest_is_exact(
    tmp_path: Path, fmt: str, parallelism: int
) -> None:
    expected, bad = [], []
    for f in range(3):
        lines = ["user,value"] if fmt == "csv" else []
        for i in range(f * 40, (f + 1) * 40):
            if i % 13 == 5:
                lines.append(f"u{i % 4},{i},x" if fmt == "csv" else f'{{"user": "u{i % 4}",')
                bad.append((f"part-{f}.{fmt}", len(lines), lines[-1]))
            elif fmt == "csv":
                lines.append(f"u{i % 4},{i}")
                expected.append(i)
            else:
                lines.append(json.dumps({"user": f"u{i % 4}", "value": i}))
                expected.append(i)
        write(tmp_path / "in" / f"part-{f}.{fmt}", "\n".join(lines) + "\n")
    env = environment(tmp_path, parallelism)
    reader = env.read_csv if fmt == "csv" else env.read_jsonl
    reader(tmp_path / "in", schema=SCHEMA, on_error="dead_letter").collect()
    assert sorted(r["value"] for r in run(env).output) == expected
    dead = dead_letters(tmp_path / "dead")
    got = sorted(
        (
            Path(d["error"].split(":")[0]).name,
            int(d["error"].split(":")[1]),
            json.loads(d["record"]),
        )
        for d in dead
    )
    assert got == sorted(bad)


# ------------------------------------------------------------- restarts and dead letters


def test_rejected_rows_are_dead_lettered_once_across_a_restore(tmp_path: Path) -> None:
    """A restore from a checkpoint taken after rejected rows passes over them: none is dead
    lettered twice, none is lost, and the good rows come out exactly once."""
    marker, flag = tmp_path / "checkpointed", tmp_path / "failed-once"
    good, bad = [], []
    for f in range(2):
        lines = ["user,value"]
        for i in range(f * 300, (f + 1) * 300):
            if i % 10 == 3:
                lines.append(f"u{i % 5},bad{i}")
                bad.append(f"u{i % 5},bad{i}")
            else:
                lines.append(f"u{i % 5},{i}")
                good.append(i)
        write(tmp_path / "in" / f"part-{f}.csv", "\n".join(lines) + "\n")
    env = environment(tmp_path, 2, batch_size=4, restart_strategy=FixedDelay(1, delay=0))
    (
        env.read_csv(tmp_path / "in", schema=SCHEMA, on_error="dead_letter")
        .map(FailAfterCheckpoint(str(marker), str(flag)))
        .collect()
    )

    def listener(kind: str, message: str) -> None:
        if kind == "checkpoint":
            marker.touch()

    # the sources hold after 100 rows each (rejected ones read past) until a checkpoint
    # completed: the failure after it always finds rows left to fail on, on any machine
    result = run(env, listener=listener, hold_sources=SourceHold(records=100))
    assert len(result.restarts) == 1
    assert result.restarts[0].restored_from is not None
    assert sorted(r["value"] for r in result.output) == good
    records = [json.loads(d["record"]) for d in dead_letters(tmp_path / "dead")]
    assert sorted(records) == sorted(bad)


# ----------------------------------------------------------------- files, globs, dirs


def test_a_file_a_glob_or_a_directory(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    for name in ("a.jsonl", "b.jsonl", "c.json", "d.txt", "_e.jsonl", ".f.jsonl"):
        write(folder / name, json.dumps({"file": name}) + "\n")
    write(folder / "sub" / "g.jsonl", json.dumps({"file": "g.jsonl"}) + "\n")
    env = environment(tmp_path)
    env.read_jsonl(folder / "b.jsonl").collect("file")
    env.read_jsonl(folder / "*.jsonl").collect("glob")
    env.read_jsonl(str(folder / "[bd].*")).collect("any_suffix")
    env.read_jsonl(folder / "su*").collect("glob_of_a_directory")
    env.read_jsonl(folder).collect("directory")
    collected = run(env).collected
    assert {name: [r["file"] for r in rows] for name, rows in collected.items()} == {
        "file": ["b.jsonl"],
        "glob": ["a.jsonl", "b.jsonl"],
        "any_suffix": ["b.jsonl", "d.txt"],
        "glob_of_a_directory": ["g.jsonl"],
        "directory": ["a.jsonl", "b.jsonl", "c.json"],
    }


def test_an_empty_input_warns_and_a_missing_path_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    write(tmp_path / "empty" / "_SUCCESS", "")
    env = environment(tmp_path)
    with pytest.warns(InputWarning) as caught:
        env.read_csv(tmp_path / "empty").collect("empty")
        env.read_jsonl(tmp_path / "nothing-*.jsonl").collect("no_match")
    assert [str(w.message) for w in caught] == [
        f"read_csv({tmp_path / 'empty'}): no csv input: the directory {tmp_path / 'empty'} has "
        "no file whose name ends in '.csv' (names starting with '.' or '_' are left out); the "
        "stream will be empty",
        f"read_jsonl({tmp_path / 'nothing-*.jsonl'}): no jsonl input: the pattern "
        f"{tmp_path / 'nothing-*.jsonl'} matches no file (nor a directory with a file whose "
        "name ends in '.jsonl' or '.json') (names starting with '.' or '_' are left out); the "
        "stream will be empty",
    ]
    assert all(w.filename == __file__ for w in caught)
    assert run(env).collected == {"empty": [], "no_match": []}
    with pytest.raises(SourceError, match=rf"input path {tmp_path / 'missing.csv'} does not exist"):
        env.read_csv(tmp_path / "missing.csv")


# ------------------------------------------------------------------------ CSV options


def test_csv_delimiter_quote_and_header_options(tmp_path: Path) -> None:
    write(tmp_path / "semi.csv", "user;note\nu1;'a; b'\nu2;'it''s\ntwo lines'\nu3;plain\n")
    write(tmp_path / "bare.csv", "u1,1\nu2,2\n")
    write(tmp_path / "one.csv", "u1\nu2\n")
    env = environment(tmp_path)
    env.read_csv(tmp_path / "semi.csv", delimiter=";", quote="'").collect("semi")
    env.read_csv(tmp_path / "bare.csv", header=False).collect("numbered")
    env.read_csv(tmp_path / "bare.csv", header=False, column_names=["who", "n"]).collect("named")
    env.read_csv(tmp_path / "bare.csv", column_names=["who", "n"]).collect("renamed")
    env.read_csv(tmp_path / "one.csv", header=False, schema={"who": "string"}).collect("typed")
    collected = run(env).collected
    assert collected["semi"] == [
        {"user": "u1", "note": "a; b"},
        {"user": "u2", "note": "it's\ntwo lines"},
        {"user": "u3", "note": "plain"},
    ]
    assert collected["numbered"] == [{"f0": "u1", "f1": 1}, {"f0": "u2", "f1": 2}]
    assert collected["named"] == [{"who": "u1", "n": 1}, {"who": "u2", "n": 2}]
    assert collected["renamed"] == [{"who": "u2", "n": 2}]  # the header line is not data
    assert collected["typed"] == [{"who": "u1"}, {"who": "u2"}]  # the schema's names


def test_lines_are_counted_across_multi_line_records(tmp_path: Path) -> None:
    path = write(tmp_path / "a.csv", 'user,value\n"two\nlines",1\n\nu2,x\n')
    env = environment(tmp_path)
    env.read_csv(path, schema=SCHEMA, on_error="dead_letter").collect()
    assert run(env).output == [{"user": "two\nlines", "value": 1}]
    (dead,) = dead_letters(tmp_path / "dead")
    assert dead["error"] == f"{path}:5: column 'value': 'x' is not an int64"


# --------------------------------------------------------------------------- Parquet


def test_parquet_files_are_read_with_one_schema(tmp_path: Path) -> None:
    pq.write_table(pa.table({"n": pa.array([1], pa.int32()), "a": ["x"]}), tmp_path / "1.parquet")
    pq.write_table(pa.table({"n": pa.array([2], pa.int64()), "b": [True]}), tmp_path / "2.parquet")
    env = environment(tmp_path)
    stream = env.read_parquet(tmp_path)
    assert schema_of(stream) == pa.schema(
        [("n", pa.int64()), ("a", pa.string()), ("b", pa.bool_())]
    )
    stream.collect()
    assert run(env).output == [{"n": 1, "a": "x", "b": None}, {"n": 2, "a": None, "b": True}]


def test_parquet_schemas_that_conflict_name_both_files(tmp_path: Path) -> None:
    pq.write_table(pa.table({"n": [1]}), tmp_path / "1.parquet")
    pq.write_table(pa.table({"n": ["x"]}), tmp_path / "2.parquet")
    env = environment(tmp_path)
    with pytest.raises(
        SourceError,
        match=r"column 'n' is int64 in .*1\.parquet but string in .*2\.parquet: give schema=",
    ):
        env.read_parquet(tmp_path)
    pq.write_table(pa.table({"n": [{"x": 1}]}), tmp_path / "2.parquet")
    with pytest.raises(
        SourceError,
        match=r"2\.parquet: column 'n' is struct<x: int64> in this file, which cannot be read as int64",
    ):
        env.read_parquet(tmp_path, schema={"n": "int64"})


def test_parquet_values_that_do_not_cast_are_rejected_by_row(tmp_path: Path) -> None:
    path = tmp_path / "in" / "1.parquet"
    path.parent.mkdir()
    pq.write_table(pa.table({"n": ["1", "two", "3"]}), path)
    env = environment(tmp_path)
    env.read_parquet(path.parent, schema={"n": "int64"}, on_error="dead_letter").collect()
    assert run(env).output == [{"n": 1}, {"n": 3}]
    (dead,) = dead_letters(tmp_path / "dead")
    assert dead["error"] == f"{path}, row 2: column 'n': 'two' is not an int64"
    assert json.loads(dead["record"]) == {"n": "two"}


def test_on_error_is_checked_before_the_files_are_read(tmp_path: Path) -> None:
    env = StreamEnvironment(1)
    with pytest.raises(ValueError, match="read_csv: on_error='dead_letter' needs a dead-letter"):
        env.read_csv(tmp_path / "missing", on_error="dead_letter")
    with pytest.raises(ValueError, match="on_error must be 'fail' or 'dead_letter'"):
        env.read_jsonl(tmp_path / "missing", on_error="skip")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning here would fail the test
        write(tmp_path / "ok.csv", "a\n1\n")
        env.read_csv(tmp_path / "ok.csv")
