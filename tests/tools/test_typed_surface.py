"""The API is typed for its users: the package ships ``py.typed``, a closed set of strings is a
``Literal`` a type checker holds a job to, and importing the API imports no connector's client
library."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import get_args

from mypy import api as mypy

import cutline

ROOT = Path(__file__).parents[2]


def test_the_package_ships_py_typed() -> None:
    assert (Path(cutline.__file__).parent / "py.typed").is_file()
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in settings["tool"]["setuptools"]["package-data"]["cutline"]


def test_a_type_checker_sees_every_name_of_the_api_as_its_own_type() -> None:
    """``cutline``'s names are imported on first use (``__getattr__``, typed ``Any``); a block
    for type checkers imports each of them from ``cutline.api``, so none is ``Any`` to them."""
    tree = ast.parse((Path(cutline.__file__)).read_text())
    (block,) = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    ]
    seen = {
        alias.asname
        for node in block.body
        if isinstance(node, ast.ImportFrom) and node.module == "cutline.api"
        for alias in node.names
    }
    assert seen == set(cutline._API)


JOB = """
from cutline import StreamEnvironment, Tumbling

env = StreamEnvironment(2)
numbers = env.from_sequence(0, 10)
keyed = numbers.key_by("value")
keyed.running_sum("value", on_error="dead_letter")
numbers.write_parquet("out", compression="zstd", partition_by=["value"])
numbers.write_kafka("t", bootstrap_servers="b:9092", value_format="avro")
"""

MISTAKES = {
    'keyed.running_sum("value", on_error="skip")': '"on_error" to "running_sum"',
    "keyed.running_mean(1)": 'Argument 1 to "running_mean" of "KeyedStream" has incompatible',
    'keyed.window(Tumbling("1s"), time="wall")': '"time" to "window"',
    'numbers.write_parquet("out", compression="lzo")': '"compression" to "write_parquet"',
    'numbers.map(str, on_error="dead-letter")': '"on_error" to "map"',
    'numbers.write_delta("t", compression="zip")': '"compression" to "write_delta"',
    'numbers.write_kafka("t", bootstrap_servers="b", value_format="xml")': '"value_format"',
}


def test_mypy_finds_each_string_out_of_its_closed_set_and_passes_the_right_ones(
    tmp_path: Path,
) -> None:
    job = tmp_path / "job.py"
    job.write_text(JOB + "\n".join(MISTAKES) + "\n")
    flags = ["--strict", "--follow-imports=silent", "--cache-dir", str(tmp_path / "cache")]
    out, err, status = mypy.run([*flags, str(job)])
    errors = {}
    for line in out.splitlines():
        if ": error:" in line:
            number = int(line.split(":")[1])
            assert number not in errors, out  # one error a line
            errors[number] = line
    first = len(JOB.splitlines()) + 1
    assert sorted(errors) == list(range(first, first + len(MISTAKES))), out + err
    for number, pattern in enumerate(MISTAKES.values(), first):
        assert re.search(pattern, errors[number]), errors[number]
    assert status == 1


def test_each_literal_of_names_holds_the_names_its_enum_takes() -> None:
    """The API takes names (a ``Literal``); inside, they are made enums: the same names."""
    from cutline.connectors.kafka.names import KeyFormat, OffsetPolicy, ValueFormatName
    from cutline.connectors.kafka.ranges import OFFSET_POLICIES
    from cutline.connectors.kafka.values import Keys, Values

    assert set(get_args(ValueFormatName)) == {str(v) for v in Values}
    assert set(get_args(KeyFormat)) == {str(k) for k in Keys}
    assert get_args(OffsetPolicy) == OFFSET_POLICIES


def test_importing_the_api_imports_no_connector_client() -> None:
    clients = ("confluent_kafka", "fastavro", "deltalake", "pyiceberg", "psycopg")
    imports = "import sys, cutline.api, cutline.connectors.kafka.names"
    code = f"{imports}\nprint([m for m in {clients!r} if m in sys.modules])\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
