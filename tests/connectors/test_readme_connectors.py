"""The README's Kafka, PostgreSQL, Delta Lake and Apache Iceberg examples, as they are written there, against
real servers (their ``broker = ...`` and ``dsn = ...`` lines pointed at the test's), in a
folder of their own, with slots as threads: each does what the README says it does."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.dataset as ds
import pytest
from deltalake import DeltaTable
from pyiceberg.catalog import load_catalog
from test_kafka import read_topic

from cutline import StreamEnvironment
from cutline.examples.servers import KafkaBroker, PostgresServer, produce
from cutline.runtime.task.local import ThreadLauncher

pytestmark = pytest.mark.connectors

README = Path(__file__).parents[2] / "README.md"


def example(heading: str, number: int = 0) -> str:
    """Python block ``number`` (0: the first) under README heading ``#### heading``."""
    text = README.read_text()
    section = text[text.index(f"#### {heading}\n") :]
    section = section[: section.find("\n#### ", 1) % len(section)]
    return re.findall(r"```python\n(.*?)```", section, re.S)[number]


def run_example(code: str, folder: Path, monkeypatch: pytest.MonkeyPatch, **lines: str) -> None:
    """Run ``code`` in ``folder``, its ``name = ...`` lines replaced by ``lines``, its jobs
    on the thread launcher."""
    for name, value in lines.items():
        code, found = re.subn(rf"^{name} = .*$", f"{name} = {value!r}", code, flags=re.M)
        assert found == 1, f"the example has no line '{name} = ...'"
    original = StreamEnvironment.execute

    def on_threads(self: StreamEnvironment, *args: Any, **kwargs: Any) -> Any:
        return original(self, *args, launcher=ThreadLauncher(), progress=False, **kwargs)

    monkeypatch.setattr(StreamEnvironment, "execute", on_threads)
    monkeypatch.chdir(folder)
    exec(compile(code, str(README), "exec", dont_inherit=True), {"__name__": "readme"})


def clicks(broker: KafkaBroker, n: int = 300) -> list[dict[str, Any]]:
    broker.create_topic("clicks", 2)
    rows = [{"user": f"u{i % 4}", "amount": i} for i in range(n)]
    for p in range(2):  # (user u in partition u % 2, its clicks in order)
        produce(broker, "clicks", [json.dumps(r) for i, r in enumerate(rows) if i % 2 == p], p)
    return rows


def test_the_kafka_example(
    kafka_broker: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clicks(kafka_broker)
    kafka_broker.create_topic("clicks-per-minute", 1)
    run_example(example("Kafka"), tmp_path, monkeypatch, broker=kafka_broker.bootstrap_servers)
    written = [json.loads(m.value()) for m in read_topic(kafka_broker, "clicks-per-minute", 1)]
    # (the clicks were produced within a minute or two: per user, its clicks in its windows)
    per_user: Counter[str] = Counter()
    for r in written:
        per_user[r["user"]] += r["count"]
    assert per_user == {f"u{u}": 75 for u in range(4)}


def test_the_postgresql_example(
    kafka_broker: KafkaBroker,
    postgres: PostgresServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = clicks(kafka_broker)
    code = example("PostgreSQL")
    ddl = re.search(r"^# (CREATE TABLE .*)$", code, re.M).group(1)  # type: ignore[union-attr]
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        for statement in ddl.split(";"):
            conn.execute(statement)
    run_example(
        code, tmp_path, monkeypatch, broker=kafka_broker.bootstrap_servers, dsn=postgres.dsn
    )
    totals: dict[str, int] = {}
    sums: Counter[tuple[str, int]] = Counter()
    for r in rows:
        totals[r["user"]] = totals.get(r["user"], 0) + r["amount"]
        sums[(r["user"], totals[r["user"]])] += 1
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        assert Counter(conn.execute('SELECT "user", amount FROM sums').fetchall()) == sums
        assert dict(conn.execute('SELECT "user", amount FROM totals').fetchall()) == totals


def test_the_delta_lake_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_example(example("Delta Lake"), tmp_path, monkeypatch)
    table = DeltaTable(str(tmp_path / "tables" / "sums")).to_pyarrow_table().to_pylist()
    # (each user's numbers come from both source subtasks, in either order: its running sums
    # vary, its count of them and its total do not)
    assert Counter(r["user"] for r in table) == {f"u{u}": 10_000 for u in range(10)}
    highest: dict[str, int] = {}
    for r in table:
        highest[r["user"]] = max(highest.get(r["user"], 0), r["amount"])
    assert highest == {f"u{u}": sum(range(u, 100_000, 10)) for u in range(10)}


def test_the_apache_iceberg_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_example(example("Apache Iceberg"), tmp_path, monkeypatch)
    lake = tmp_path / "lake"
    catalog = {"type": "sql", "uri": f"sqlite:///{lake}/catalog.db", "warehouse": f"file://{lake}"}
    made = load_catalog("default", **catalog).load_table("shop.sums")
    table = made.scan().to_arrow().to_pylist()
    # (as the Delta Lake example's: each user's count of running sums and its total)
    assert Counter(r["user"] for r in table) == {f"u{u}": 10_000 for u in range(10)}
    highest: dict[str, int] = {}
    for r in table:
        highest[r["user"]] = max(highest.get(r["user"], 0), r["amount"])
    assert highest == {f"u{u}": sum(range(u, 100_000, 10)) for u in range(10)}
    assert all(s.summary["cutline.checkpoint"] for s in made.snapshots())


def test_the_delta_lake_reading_example_reads_back_what_the_first_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The running sums the first example wrote, read back (the table's snapshot, then the
    job ends): each user's highest is its total."""
    both = example("Delta Lake") + example("Delta Lake", 1)
    run_example(both, tmp_path, monkeypatch)
    totals = ds.dataset(str(tmp_path / "totals"), format="parquet").to_table().to_pylist()
    assert len(totals) == 100_000 and set(totals[0]) == {"user", "amount"}
    highest: dict[str, int] = {}
    for r in totals:
        highest[r["user"]] = max(highest.get(r["user"], 0), r["amount"])
    assert highest == {f"u{u}": sum(range(u, 100_000, 10)) for u in range(10)}
