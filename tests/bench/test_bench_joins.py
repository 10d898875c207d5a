"""The joins benchmark (bench/joins.py) at a tiny size: its input is what its docstring says,
its reference equals the per-record computation, its check refuses wrong answers, and (slow:
a Spark session and three streaming queries) it runs and verifies the reference and Spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import cutline

BENCH = Path(__file__).resolve().parents[2] / "bench"
EVENTS, FILES = 20_000, 4


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import joins_input
    import joins_reference

    return joins_input, joins_reference


@pytest.fixture
def tiny(bench, tmp_path: Path):
    joins_input, _ = bench
    spec = joins_input.JoinsSpec(events=EVENTS, files=FILES)
    return joins_input.prepare_joins_input(spec, tmp_path, lambda _: None)


def test_the_input_is_sliced_alike_and_no_record_is_late_for_a_2_s_watermark(bench, tiny):
    joins_input, _ = bench
    assert tiny.rows == {
        "persons": EVENTS // 50,
        "auctions": EVENTS // 50 * 3,
        "bids": EVENTS // 50 * 46,
        "orders": EVENTS // 10 * 9,
        "rates": EVENTS // 10,
    }
    for stream in joins_input.STREAMS:
        files = sorted(tiny.parquet(stream).glob("*.parquet"))
        assert len(files) == FILES
        assert [os.stat(f).st_mtime for f in files] == sorted(os.stat(f).st_mtime for f in files)
        times = tiny.read(stream, ["date_time"])["date_time"].to_numpy()
        assert (np.maximum.accumulate(times) - times).max() < 2_000
        assert tiny.csv(stream).stat().st_size > 0
    auctions = tiny.read("auctions")
    lasted = pc.subtract(auctions["expires"], auctions["date_time"]).to_numpy()
    assert lasted.min() >= 1 and lasted.max() <= joins_input.MAX_AUCTION_MS
    assert set(pc.unique(tiny.read("persons")["state"]).to_pylist()) <= set(joins_input.US_STATES)
    rates = tiny.read("rates")
    pairs = set(zip(rates["currency"].to_pylist(), rates["date_time"].to_pylist(), strict=True))
    assert len(pairs) == rates.num_rows  # no two rates of a currency at one time


def test_the_reference_equals_the_per_record_computation(bench, tiny):
    _, ref = bench
    answers = ref.reference_answers(tiny, ref.QUERIES)
    rows = ref.python_answers(tiny, ref.QUERIES)
    for query in ref.QUERIES:
        assert answers[query].num_rows > 0, query
        check = ref.compare(
            ref.rows_table(query, rows[query], answers[query]), answers[query], query
        )
        assert check["verified"], (query, check)
    assert answers["asof"].num_rows == tiny.rows["orders"]  # a left join: every order once
    assert 0 < answers["asof"]["rate"].null_count < 1000  # only the first orders have none


def test_the_check_refuses_what_is_not_exactly_the_answer(bench):
    _, ref = bench
    expected = pa.table(
        {
            "order_id": [1, 2, 3],
            "currency": ["USD", "EUR", "USD"],
            "amount": [10, 20, 30],
            "order_time": [5, 6, 7],
            "rate": pa.array([None, 7, 8], pa.int64()),
            "rate_time": pa.array([None, 1, 2], pa.int64()),
        }
    )

    def changed(column: str, values: list) -> pa.Table:
        at = expected.column_names.index(column)
        return expected.set_column(at, column, pa.array(values, expected.column(column).type))

    assert ref.compare(expected.take([2, 0, 1]), expected, "asof")["verified"]  # any order
    missing = ref.compare(expected.slice(1), expected, "asof")
    assert (missing["verified"], missing["missing_rows"], missing["unexpected_rows"]) == (
        False,
        1,
        0,
    )
    twice = ref.compare(pa.concat_tables([expected, expected.slice(2)]), expected, "asof")
    assert (twice["verified"], twice["unexpected_rows"]) == (False, 1)
    assert not ref.compare(changed("currency", ["USD", "GBP", "USD"]), expected, "asof")["verified"]
    assert not ref.compare(changed("rate", [0, 7, 8]), expected, "asof")["verified"]  # null
    assert not ref.compare(changed("rate", [None, None, 8]), expected, "asof")["verified"]
    assert not ref.compare(expected.drop_columns(["rate"]), expected, "asof")["verified"]


@pytest.mark.slow
def test_the_benchmark_verifies_the_reference_and_spark_at_a_tiny_size(tmp_path: Path):
    src = str(Path(cutline.__file__).resolve().parents[1])  # (the cutline these tests import)
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    out = tmp_path / "joins.json"
    command = [sys.executable, str(BENCH / "joins.py"), "--events", str(EVENTS), "--files"]
    command += [str(FILES), "--repeats", "1", "--no-flink", "--spark-files", "0,2"]
    command += ["--spark-partitions", "2", "--spark-states", "hdfs", "--work", str(tmp_path)]
    done = subprocess.run(
        [*command, "--out", str(out)],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    document = json.loads(out.read_text())
    found = {(m["system"], m["name"].split()[-1]): m for m in document["results"]}
    for query in ("q3", "q8", "q9", "asof"):
        assert found["reference", query]["verified"] is True
        assert document["inputs"][f"{EVENTS} events"]["reference_equals_python"][query] is True
    for query in ("q3", "q8", "q9"):
        spark = found["spark structured streaming", query]
        assert spark["verified"] is True, spark["runs"]
        assert spark["parameters"]["setting"]["spark.sql.shuffle.partitions"] == 2
        assert spark["figures"]["events_per_s_per_core"]["median"] > 0
        sweep = document["spark_sweep"]["queries"][query]
        assert len(sweep["runs"]) == 2 and sweep["best"] is not None
    spark_asof = found["spark structured streaming", "asof"]
    assert "spark.driver.memory 4g" in document["systems"]["spark structured streaming"]
    assert spark_asof["verified"] is None and spark_asof["runs"] == []
    assert spark_asof["status"].startswith("not supported")
    assert spark_asof["figures"]["events_per_s_incl_start"]["median"] is None
    assert found["pyflink sql", "q3"]["verified"] is None
    cutline_q9 = found["cutline", "q9"]
    assert cutline_q9["verified"] is True or "interval_join" in cutline_q9["status"]
    assert document["flink_published"]["events_per_s_per_core"]["q3"] == 152_120
