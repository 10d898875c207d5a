"""Run a cutline job as one Spark barrier stage.

Each attempt (generation) of the job is one Spark job: ``parallelism`` partitions,
``rdd.barrier().mapPartitions(...)``, so that Spark schedules every slot at once or
none. In each task, the slot body (:func:`cutline.runtime.task.slot.run_slot`) exchanges
its data addresses with the other slots through the cutline driver's control connection
(``BarrierTaskContext.allGather`` would do too, but it polls once a second: a second of
every start), then talks TCP: data to its peers, control to the driver. The Spark job runs
in a driver thread, in its own job group, so that the cutline driver can cancel it after a
failure and submit the next generation (Spark does not retry a failed barrier stage that
ends in ``collect()``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from cutline.runtime.graph import ExecutionPlan
from cutline.runtime.task.launch import SlotSetup
from cutline.runtime.task.slot import run_slot

SLOTS_CHECK_CONF = {
    # A barrier job asking for more slots than the cluster has fails at once, with a message,
    # instead of waiting for minutes.
    "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",
    "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "1",
}


class SparkSetupError(RuntimeError):
    """Spark cannot run the job: too few slots, no Java, a session that cannot start."""


_session_lock = threading.Lock()


def default_session(parallelism: int) -> Any:
    """The session a job runs on when ``execute()`` is given none: the active one; else, in a
    program started by ``spark-submit``, one on the master it was submitted to; else a local
    one (:func:`local_session`)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # started by spark-submit: its master and conf
        builder = SparkSession.builder.appName("cutline")
        for key, value in SLOTS_CHECK_CONF.items():
            builder = builder.config(key, value)
        return builder.getOrCreate()
    return local_session(parallelism)


def cluster_session(master: str, conf: dict[str, str] | None = None) -> Any:
    """A session on ``master`` (``spark://HOST:7077``, ``yarn``, ``k8s://...``) with
    cutline's settings and ``conf``; executors run the Python in ``PYSPARK_PYTHON`` (by
    default this one: right when every host has it at the same path)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName("cutline")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for key, value in {**SLOTS_CHECK_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:
        raise SparkSetupError(f"cannot start a Spark session on {master}: {exc}") from exc
    spark.sparkContext.setLogLevel("OFF")  # cutline reports failures itself
    return spark


def is_local(spark: Any) -> bool:
    """Whether ``spark`` runs in Spark's local mode (every task in the driver's JVM)."""
    master = str(spark.sparkContext.master)
    return master == "local" or master.startswith("local[")


def local_session(parallelism: int) -> Any:
    """A local Spark session with at least ``parallelism`` slots (created once, then reused)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    with _session_lock:
        active = SparkSession.getActiveSession()
        if active is not None:
            return active
        builder = (
            SparkSession.builder.master(f"local[{parallelism}]")
            .appName("cutline")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", str(parallelism))
            .config("spark.python.worker.faulthandler.enabled", "true")
        )
        for key, value in SLOTS_CHECK_CONF.items():
            builder = builder.config(key, value)
        try:
            spark = builder.getOrCreate()
        except Exception as exc:
            raise SparkSetupError(
                f"cannot start a local Spark session: {exc}. PySpark needs Java 17 or newer "
                "(java -version) and JAVA_HOME pointing to it."
            ) from exc
        spark.sparkContext.setLogLevel("OFF")  # cutline reports failures itself
        return spark


def _slot_body(setup: SlotSetup) -> Any:
    def body(_: Iterator[Any]) -> Iterator[str]:
        from pyspark import BarrierTaskContext

        context = BarrierTaskContext.get()
        slot = context.partitionId()
        address = context.getTaskInfos()[slot].address
        host = address.rsplit(":", 1)[0] if ":" in address else address
        summary = run_slot(setup, slot, host)
        yield json.dumps(summary)

    return body


class SparkJob:
    """One attempt of the job, running as a Spark job in a driver thread."""

    def __init__(self, spark: Any, setup: SlotSetup) -> None:
        self._spark = spark
        self._group = f"cutline-{uuid.uuid4().hex[:12]}-g{setup.generation}"
        self._error: str | None = None
        self._done = threading.Event()
        self.results: list[str] = []
        self._thread = threading.Thread(
            target=self._run, args=(setup,), name="cutline-spark-job", daemon=True
        )
        self._thread.start()

    def _run(self, setup: SlotSetup) -> None:
        sc = self._spark.sparkContext
        n = setup.plan.parallelism
        try:
            sc.setJobGroup(self._group, f"cutline generation {setup.generation}", True)
            rdd = sc.parallelize(range(n), n).barrier().mapPartitions(_slot_body(setup))
            self.results = rdd.collect()
        except BaseException as exc:
            self._error = _spark_error(exc, n)
        finally:
            self._done.set()

    def error(self) -> str | None:
        return self._error if self._done.is_set() else None

    def cancel(self) -> None:
        if not self._done.is_set():
            # the context may be stopping; the thread ends anyway
            with contextlib.suppress(Exception):
                self._spark.sparkContext.cancelJobGroup(self._group)

    def wait(self, timeout: float) -> None:
        self._thread.join(timeout)

    def detach(self) -> None:
        """Spark ends the tasks of a job whose slots all finished in its own time (a tenth of
        a second here); a next job's barrier stage waits for their slots."""


def _spark_error(exc: BaseException, slots: int) -> str:
    text = str(exc)
    if "BarrierJobSlotsNumberCheckFailed" in text or "maxConcurrentTasksCheck" in text:
        return (
            f"the job needs {slots} task slots at once (one per subtask index) and the Spark "
            "cluster has fewer: lower the parallelism or add executors/cores"
        )
    lines = [line for line in text.splitlines() if line.strip()]
    for line in lines:  # the slot's own report, when it could make one
        if line.startswith(("RuntimeError:", "Exception:")):
            return line.strip()
    for i, line in enumerate(lines):  # a Python error before the slot ran (e.g. unpickling)
        if "Traceback (most recent call last)" in line:
            error = _python_error(lines[i + 1 :])
            if error:
                return f"a Spark task failed before its slot ran: {error}"
    return lines[0].strip() if lines else type(exc).__name__


def _python_error(lines: list[str]) -> str | None:
    """The exception line that ends a Python traceback (before the JVM's stack, if any)."""
    last = None
    for line in lines:
        if line.startswith(("\tat ", "at ")) or line.startswith("\t"):
            break
        if not line.startswith((" ", "\t")):
            last = line.strip()
    return last


class UnpicklableError(TypeError):
    """A part of the job (a user function, most often) cannot be sent to the Spark workers."""


def check_picklable(plan: ExecutionPlan, **extra: Any) -> None:
    """Pickle every operator of ``plan`` (and the ``extra`` objects, by name) as Spark will
    when it ships the job to its workers, and name the first that cannot be: before any Spark
    job runs, rather than after a PySpark traceback and the restart attempts."""
    from pyspark import cloudpickle

    parts = [(op.name, op.logic) for chain in plan.chains for op in chain.operators]
    for chain in plan.chains:  # a key function travels with the edge that partitions by it
        parts += [
            (f"the key function of {plan.chain(out.downstream).operators[0].name}", out.key)
            for out in chain.outputs
            if callable(out.key)
        ]
    for what, part in [*parts, *extra.items()]:
        try:
            cloudpickle.dumps(part)  # type: ignore[no-untyped-call]
        except Exception as exc:
            raise UnpicklableError(
                f"{what}: cannot be sent to the Spark workers (pickled with cloudpickle): "
                f"{type(exc).__name__}: {exc}. Its function, or something it refers to (a "
                "lock, an open file or socket, a database connection, a generator), cannot be "
                "pickled: create such things in the function (or a KeyedProcessFunction's "
                "open()), not outside it"
            ) from None


class SparkLauncher:
    """Launches each generation as a barrier stage on ``spark``: in local mode, or on a cluster
    (standalone, YARN, Kubernetes), whose executors may come, go and come back."""

    poll_interval = 0.5

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self._driver_host: str | None = None

    @classmethod
    def for_session(cls, spark: Any, parallelism: int) -> SparkLauncher:
        """On ``spark`` (``None``: :func:`default_session`). In local mode the slots are
        checked at once (there are never more); on a cluster each generation waits for them
        (executors register after the session starts, and come back after a lost host)."""
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        session = spark if spark is not None else default_session(parallelism)
        if is_local(session):
            slots = session.sparkContext.defaultParallelism
            if parallelism > slots:
                raise SparkSetupError(
                    f"the job needs {parallelism} task slots at once (parallelism "
                    f"{parallelism}), and this Spark session ({session.sparkContext.master}) has "
                    f"{slots}: lower the parallelism, or give Spark more. In this process: stop "
                    "the running session first (SparkSession.getActiveSession().stop(); one "
                    "process has one), then execute() starts local[parallelism] itself, or "
                    f"make one with SparkSession.builder.master('local[{parallelism}]')"
                    ".getOrCreate() and pass it as execute(spark=...)"
                )
        return cls(session)

    # ------------------------------------------------------------- the cluster's slots

    def executors(self) -> list[tuple[str, int, int]] | None:
        """(host, cores, tasks running) of each executor a cluster has now (not the driver);
        ``None`` if this Spark does not say."""
        try:
            jsc = self.spark.sparkContext._jsc.sc()
            summaries = jsc.statusStore().executorList(True)  # active ones
            found = []
            for i in range(int(summaries.size())):
                summary = summaries.apply(i)
                if str(summary.id()) == "driver":
                    continue
                host = str(summary.hostPort()).rsplit(":", 1)[0]
                found.append((host, int(summary.totalCores()), int(summary.activeTasks())))
            return found
        except Exception:  # another Spark's internals
            return None

    def slots(self) -> tuple[int, int, frozenset[str] | None]:
        """(task slots free now, task slots in all, the hosts with an executor)."""
        sc = self.spark.sparkContext
        executors = self.executors()
        if executors is None:
            return int(sc.defaultParallelism), int(sc.defaultParallelism), None
        per_task = max(1, int(sc.getConf().get("spark.task.cpus", "1")))
        free = sum(
            max(0, cores - running * per_task) // per_task for _, cores, running in executors
        )
        total = sum(cores // per_task for _, cores, _ in executors)
        return free, total, frozenset(host for host, _, _ in executors)

    def wait_for_slots(
        self, needed: int, hosts: frozenset[str], timeout: float, say: Callable[[str], None]
    ) -> str | None:
        if is_local(self.spark):
            return None  # its slots never change (checked in for_session); Spark queues the
            # stage while a cancelled generation's tasks end
        deadline = time.monotonic() + timeout
        said = False
        missing: frozenset[str] = frozenset()
        while True:
            free, total, present = self.slots()
            missing = hosts - present if present is not None else frozenset()
            if free >= needed and not missing:
                if said:
                    say(f"{free} task slots free{' and every host back' if hosts else ''}")
                return None
            if time.monotonic() >= deadline:
                break
            if not said:
                said = True
                waiting = []
                if free < needed:
                    waiting.append(f"{needed} task slots (the cluster has {free} free)")
                if missing:
                    waiting.append(f"host(s) {', '.join(sorted(missing))} to come back")
                say(f"waiting up to {timeout:g} s for " + " and ".join(waiting))
            time.sleep(self.poll_interval)
        if free >= needed:  # the lost hosts did not come back: go on with the others
            say(
                f"host(s) {', '.join(sorted(missing))} did not come back within {timeout:g} s; "
                f"starting on the {free} free task slots of the others"
            )
            return None
        if total >= needed:  # busy (a cancelled generation's tasks still ending): Spark queues
            say(f"{free} of {total} task slots free after {timeout:g} s; starting anyway")
            return None
        return (
            f"the job needs {needed} task slots at once (one per subtask index) and the Spark "
            f"cluster had {free} free ({total} in all) after waiting {timeout:g} s "
            "(Timeouts.slots): add executors or cores, or lower the parallelism"
        )

    def launch(self, setup: SlotSetup) -> SparkJob:
        return SparkJob(self.spark, setup)

    def driver_host(self) -> str:
        if self._driver_host is None:  # (one lookup: sparkContext.getConf() copies every key)
            self._driver_host = str(self.spark.conf.get("spark.driver.host", "127.0.0.1"))
        return self._driver_host
