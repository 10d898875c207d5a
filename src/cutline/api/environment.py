"""The user's API: :class:`StreamEnvironment`, :class:`DataStream`, :class:`KeyedStream`.

::

    env = StreamEnvironment(parallelism=2, checkpoint_interval="1s", checkpoint_dir="ck/")
    (env.read_parquet("events/")
        .key_by("key")
        .sum("value")
        .write_parquet("out/"))
    result = env.execute()            # on local Spark, local[parallelism]

Building a pipeline only describes it (a job graph); :meth:`StreamEnvironment.execute`
runs it on Spark and returns when bounded input is all processed and its output published.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable, Hashable, Iterable
from typing import Any

import fsspec
import pyarrow as pa

from cutline.api.progress import LiveProgress, ProgressLines, wanted
from cutline.protocol.coordinator import CheckpointSettings
from cutline.runtime.checkpoint.storage import CheckpointStorage
from cutline.runtime.driver.config import LATEST, JobConfig, check_host_loss
from cutline.runtime.driver.driver import JobDriver
from cutline.runtime.driver.result import JobInterrupted, JobResult
from cutline.runtime.driver.run import Listener
from cutline.runtime.graph import Edge, ExecutionPlan, GraphError, JobGraph, Operator, plan
from cutline.runtime.io.sinks import FileSink
from cutline.runtime.io.sources import CsvOptions, FileSource, InputWarning, SequenceSource
from cutline.runtime.network.net import port_range
from cutline.runtime.operators import (
    KeyedProcessFunction,
    MapBatchesLogic,
    MapLogic,
    PassLogic,
    ProcessLogic,
    RollingLogic,
    SinkLogic,
    SourceLogic,
    function_name,
)
from cutline.runtime.state.config import BACKENDS, StateConfig
from cutline.runtime.state.keygroups import DEFAULT_MAX_PARALLELISM
from cutline.runtime.task.launch import CHECKPOINTING_MODES, Launcher, PhaseHook, SourceHold

_DURATION = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|min|m|h)?\s*")
_UNITS = {"ms": 0.001, "s": 1.0, None: 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}


def seconds(value: float | int | str | None, what: str) -> float | None:
    """``1.5``, ``"1s"``, ``"500ms"``, ``"2min"`` -> seconds (``None`` stays ``None``)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{what}: expected seconds or a duration like '1s', got {value!r}")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        match = _DURATION.fullmatch(value)
        if match:
            return float(match.group(1)) * _UNITS[match.group(2)]
    raise ValueError(
        f"{what}: {value!r} is not a duration (use seconds, or text like '500ms', '1s', '2min')"
    )


def _positive(value: float | int | str, what: str) -> float:
    """A deadline: a finite duration greater than zero."""
    duration = seconds(value, what)
    if duration is None or not 0 < duration < math.inf:
        raise ValueError(f"{what} must be a finite duration greater than zero, not {value!r}")
    return duration


def location(path: str | os.PathLike[str]) -> str:
    """A URL as it is; a local path made absolute, so that it names the same place in every
    process (a Spark executor's working directory is not the driver's)."""
    text = os.fspath(path)
    if "://" in text:
        return text
    return os.path.abspath(os.path.expanduser(text))


def _both(first: Listener, second: Listener | None) -> Listener:
    """A listener that tells ``first``, then ``second`` (if any)."""

    def both(kind: str, message: str) -> None:
        first(kind, message)
        if second is not None:
            second(kind, message)

    return both


def _interactive() -> bool:
    """Whether Python runs interactively (a REPL, IPython, a notebook)."""
    return hasattr(sys, "ps1") or bool(sys.flags.interactive) or "IPython" in sys.modules


def _restore_url(restore_from: str | os.PathLike[str] | None) -> str | None:
    if restore_from is None:
        return None
    if isinstance(restore_from, str) and restore_from == LATEST:
        return LATEST  # (a folder named so: Path("latest") or "./latest")
    return location(restore_from)


class StreamEnvironment:
    """A streaming job being built, and how it runs.

    :param parallelism: subtasks per operator, one Spark task slot each.
    :param checkpoint_interval: time between checkpoints (``"1s"``, ``0.5``); ``None``: only the
        final checkpoint at the end of bounded input.
    :param checkpoint_dir: where checkpoints go (a local path or any fsspec URL); by default a
        temporary directory removed after the job.
    :param checkpoint_timeout: a checkpoint not complete after this long is aborted.
    :param min_pause: the least time between the end of one checkpoint and the next trigger.
    :param tolerable_failed_checkpoints: failed checkpoints in a row before the job restarts.
    :param retained_checkpoints: complete checkpoints kept.
    :param restart_attempts: restarts after failures before ``execute`` raises.
    :param restart_delay: pause before each restart.
    :param dead_letter_dir: where records that an operator opened with
        ``on_error="dead_letter"`` could not process go, with their error (JSON lines).
    :param batch_size: records per batch read from a source.
    :param buffer_capacity: batches buffered per input channel before backpressure.
    :param heartbeat_timeout: a slot silent this long is declared lost (a host cut off from
        the network; a killed one is noticed at once).
    :param start_timeout: each slot of a (re)start must be running and have reached the
        driver this long after the launch, and the slots' rendezvous must end this long after
        the last one arrived; otherwise the attempt fails naming the slot, and the job restarts.
    :param restore_timeout: each slot must have restored its state, opened its operators and
        connected its outputs this long after it began (a large state takes longer).
    :param commit_timeout: after the final checkpoint completed, every slot must have published
        its output and ended this long after.
    :param slot_timeout: how long each (re)start waits for its task slots (one per subtask
        index, all at once: executors register after the session starts, and come back
        after a lost host) before it fails.
    :param on_host_loss: after a failure, ``"restart"`` at once on the task slots there are
        (on a cluster: the hosts that remain, when they have enough), or ``"wait"`` up to
        ``slot_timeout`` for every host the failed attempt ran on to have an executor again,
        then start on what there is.
    :param checkpointing: how barriers are handled (README, "Checkpointing modes"):
        ``"aligned"`` (exactly-once; a subtask waits for a checkpoint's barrier on every
        input before it snapshots), ``"unaligned"`` (exactly-once; it snapshots on the first
        barrier, which overtakes the queued records; those are stored with the checkpoint)
        or ``"at_least_once"`` (inputs never wait; replay after a failure may repeat records).
    :param alignment_timeout: with ``"aligned"``: a subtask whose alignment of a checkpoint
        lasts longer switches that checkpoint to unaligned (``None``: never).
    :param max_concurrent_checkpoints: checkpoints in flight at once (``"unaligned"``, or with an
        ``alignment_timeout``: 1).
    :param state_backend: where keyed state lives: ``"memory"`` (Python dicts, fastest) or
        ``"disk"`` (an embedded RocksDB on each worker's disk, for state larger than memory).
    :param incremental_checkpoints: a checkpoint writes only the keyed state that changed since
        the last complete one (plus a full one every ``full_checkpoint_every``).
    :param full_checkpoint_every: with incremental checkpoints: at most this many checkpoints
        in a chain (one full, the rest incremental) before the next full one.
    :param state_dir: ``"disk"``: where each worker keeps its working databases (default: the
        system's temporary directory).
    :param state_memory: ``"disk"``: bytes of memory per keyed operator subtask for RocksDB's
        buffers and cache, and for changes not yet written to it.
    :param savepoint_dir: where savepoints go when the request names no directory (default:
        ``CHECKPOINT_DIR/savepoints``).
    """

    def __init__(
        self,
        parallelism: int = 2,
        *,
        checkpoint_interval: float | str | None = "1s",
        checkpoint_dir: str | os.PathLike[str] | None = None,
        checkpoint_timeout: float | str = "10min",
        min_pause: float | str = 0,
        tolerable_failed_checkpoints: int = 0,
        retained_checkpoints: int = 1,
        restart_attempts: int = 3,
        restart_delay: float | str = "1s",
        dead_letter_dir: str | os.PathLike[str] | None = None,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
        batch_size: int = 65536,
        buffer_capacity: int = 4,
        heartbeat_timeout: float | str = "30s",
        start_timeout: float | str = "1min",
        restore_timeout: float | str = "10min",
        commit_timeout: float | str = "2min",
        slot_timeout: float | str = "2min",
        on_host_loss: str = "restart",
        storage_options: dict[str, Any] | None = None,
        checkpointing: str = "aligned",
        alignment_timeout: float | str | None = None,
        max_concurrent_checkpoints: int = 1,
        state_backend: str = "memory",
        incremental_checkpoints: bool = True,
        full_checkpoint_every: int = 10,
        state_dir: str | os.PathLike[str] | None = None,
        state_memory: int = 64 * 1024 * 1024,
        savepoint_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if state_backend not in BACKENDS:
            raise ValueError(
                f"state_backend must be one of {', '.join(map(repr, BACKENDS))}, "
                f"not {state_backend!r}"
            )
        self.state = StateConfig(
            backend=state_backend,
            incremental=incremental_checkpoints,
            full_every=full_checkpoint_every,
            local_dir=os.fspath(state_dir) if state_dir is not None else None,
            memory=state_memory,
        )
        self.savepoint_dir = location(savepoint_dir) if savepoint_dir is not None else None
        if type(parallelism) is not int or parallelism < 1:
            raise ValueError(f"parallelism must be a positive integer, not {parallelism!r}")
        if type(max_parallelism) is not int or max_parallelism < parallelism:
            raise ValueError(
                f"max_parallelism must be an integer of at least parallelism ({parallelism}), "
                f"not {max_parallelism!r}"
            )
        for name, value in (
            ("batch_size", batch_size),
            ("buffer_capacity", buffer_capacity),
        ):
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        if type(restart_attempts) is not int or restart_attempts < 0:
            raise ValueError(f"restart_attempts must be 0 or more, not {restart_attempts!r}")
        if checkpointing not in CHECKPOINTING_MODES:
            raise ValueError(
                f"checkpointing must be one of {', '.join(map(repr, CHECKPOINTING_MODES))}, "
                f"not {checkpointing!r}"
            )
        if type(max_concurrent_checkpoints) is not int or max_concurrent_checkpoints < 1:
            raise ValueError(
                "max_concurrent_checkpoints must be a positive integer, not "
                f"{max_concurrent_checkpoints!r}"
            )
        self.alignment_timeout = seconds(alignment_timeout, "alignment_timeout")
        if self.alignment_timeout is not None and not math.isfinite(self.alignment_timeout):
            raise ValueError(
                f"alignment_timeout must be a finite duration, not {alignment_timeout!r}"
            )
        if self.alignment_timeout is not None:
            if checkpointing != "aligned":
                raise ValueError(
                    f"alignment_timeout applies to aligned checkpoints only, not {checkpointing!r}"
                )
            if self.alignment_timeout < 0:
                raise ValueError(f"alignment_timeout must be 0 or more, not {alignment_timeout!r}")
        if checkpointing == "unaligned" and max_concurrent_checkpoints != 1:
            raise ValueError(
                "unaligned checkpoints are taken one at a time: max_concurrent_checkpoints must "
                f"be 1, not {max_concurrent_checkpoints!r}"
            )
        if self.alignment_timeout is not None and max_concurrent_checkpoints != 1:
            # (as in Flink: a barrier that goes unaligned overtakes the barriers of the
            # checkpoints queued before it, which could then never complete)
            raise ValueError(
                "with an alignment_timeout checkpoints may go unaligned, and those are taken one "
                f"at a time: max_concurrent_checkpoints must be 1, not "
                f"{max_concurrent_checkpoints!r}"
            )
        self.checkpointing = checkpointing
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.checkpoint_settings = CheckpointSettings(
            interval=seconds(checkpoint_interval, "checkpoint_interval"),
            timeout=seconds(checkpoint_timeout, "checkpoint_timeout") or 0.0,
            min_pause=seconds(min_pause, "min_pause") or 0.0,
            tolerable_failures=tolerable_failed_checkpoints,
            retained=retained_checkpoints,
            max_concurrent=max_concurrent_checkpoints,
        )
        self.checkpoint_dir = location(checkpoint_dir) if checkpoint_dir is not None else None
        self.restart_attempts = restart_attempts
        self.restart_delay = seconds(restart_delay, "restart_delay") or 0.0
        self.heartbeat_timeout = _positive(heartbeat_timeout, "heartbeat_timeout")
        self.start_timeout = _positive(start_timeout, "start_timeout")
        self.restore_timeout = _positive(restore_timeout, "restore_timeout")
        self.commit_timeout = _positive(commit_timeout, "commit_timeout")
        slots_for = seconds(slot_timeout, "slot_timeout")
        if slots_for is None or not 0 <= slots_for < math.inf:
            raise ValueError(f"slot_timeout must be a finite duration, not {slot_timeout!r}")
        self.slot_timeout = slots_for
        self.on_host_loss = check_host_loss(on_host_loss)
        self.dead_letter_dir = location(dead_letter_dir) if dead_letter_dir is not None else None
        self.batch_size = batch_size
        self.buffer_capacity = buffer_capacity
        self.storage_options = storage_options
        self.graph = JobGraph()
        self._on_error: dict[str, str] = {}
        self._rate_limits: dict[str, float] = {}
        self._outputs: dict[str, str] = {}
        self._collect: dict[str, str] = {}
        self._counter = 0

    # ----------------------------------------------------------------- sources

    def from_sequence(
        self,
        start: int = 0,
        end: int | None = None,
        *,
        column: str = "value",
        name: str | None = None,
        rate_limit: float | None = None,
    ) -> DataStream:
        """The integers ``start, start+1, ...`` up to ``end`` (excluded; ``None``: unbounded), as
        records with one column.

        :param rate_limit: at most this many records per second (for the whole source: each of
            its subtasks reads its share), e.g. for a demo or a load test; ``None``: as fast as
            the job takes them."""
        if type(start) is not int or (end is not None and type(end) is not int):
            raise ValueError(f"from_sequence needs integers, got start={start!r}, end={end!r}")
        return self._source(
            SequenceSource(start, end, column), name or "sequence", name, rate_limit
        )

    def read_parquet(
        self,
        path: str | os.PathLike[str],
        *,
        schema: pa.Schema | dict[str, Any] | None = None,
        on_error: str = "fail",
        name: str | None = None,
        rate_limit: float | None = None,
    ) -> DataStream:
        """The records of Parquet files, as Arrow batches with one schema.

        :param path: a directory (its ``.parquet`` and ``.pq`` files), one file, or a glob
            pattern (``"events/2024-*.parquet"``: every file it matches; a directory it
            matches gives its Parquet files); a local path or any fsspec URL. Names starting
            with ``.`` or ``_`` are left out of directories and patterns. The files are sorted
            by name and dealt round-robin to the subtasks, one split each. A path that does
            not exist raises ``SourceError`` here; no input file at all is an empty stream and
            an ``InputWarning`` naming the path and the suffixes looked for.
        :param schema: the columns and their types: a ``pyarrow.Schema``, or a dict of column
            -> type (``{"user": "string", "n": "int64"}``; a pyarrow type or its name). By
            default, the union of the files' own schemas (their footers, read here), each
            column's types unified (int32 and int64: int64; int64 and double: double; null:
            the other); a column of two irreconcilable types (int64 in one file, string in
            another) raises ``SourceError`` naming both files: give ``schema=``. Every file,
            subtask and restart reads this schema: a column a file lacks is null, a column
            not in the schema is left out, and a file whose column cannot be cast to the
            schema's type at all (a struct for an int64) fails naming the file.
        :param on_error: a row with a value that does not cast to its column's type (an
            overflow, when ``schema=`` narrows a type) fails the job naming ``file, row N``
            (1-based) with ``"fail"``, or goes to the dead letters with ``"dead_letter"``
            (the row as the record; ``StreamEnvironment(dead_letter_dir=...)``).
        :param name: the operator's name (and uid, which checkpoints know it by).
        :param rate_limit: at most this many records per second, for the whole source (each
            subtask reads its share); ``None``: as fast as the job takes them.

        Replayable: the offset in each checkpoint is, per file, the rows consumed (handed out
        or rejected); a restore passes over exactly those.
        """
        return self._files(path, "parquet", name, schema, on_error, rate_limit)

    def read_csv(
        self,
        path: str | os.PathLike[str],
        *,
        schema: pa.Schema | dict[str, Any] | None = None,
        delimiter: str = ",",
        header: bool = True,
        quote: str | None = '"',
        null_values: Iterable[str] = ("",),
        column_names: Iterable[str] | None = None,
        on_error: str = "fail",
        name: str | None = None,
        rate_limit: float | None = None,
    ) -> DataStream:
        """The records of CSV files, as Arrow batches with one schema.

        :param path: a directory (its ``.csv`` files), one file, or a glob pattern
            (``"logs/2024-*.csv"``: every file it matches, whatever its suffix; a directory it
            matches gives its ``.csv`` files); a local path or any fsspec URL. Names starting
            with ``.`` or ``_`` are left out of directories and patterns. The files are sorted
            by name and dealt round-robin to the subtasks, one split each. A path that does
            not exist raises ``SourceError`` here; no input file at all is an empty stream and
            an ``InputWarning`` naming the path and the suffixes looked for.
        :param schema: the columns and their types: a ``pyarrow.Schema``, or a dict of column
            -> type (``{"user": "string", "n": "int64"}``; a pyarrow type or its name:
            ``"string"``, ``"int64"``, ``"double"``, ``"bool"``, ``"date32"``,
            ``"timestamp[us]"``, ...). By default it is inferred here, on the driver, from the
            head of every file (its first 1 MiB and at most 10,000 rows; with more than 256
            files, 256 MiB in all shared between them, at least 64 KiB each): a column is the
            first of int64, double, bool, date32, timestamp[us] and timestamp[us, tz=UTC] that
            all its sampled values cast to (spaces around a value do not count), else string;
            a column without a value in the samples is string. Columns come in the order the
            files name them, the files' columns united. A column whose values mix numbers and
            text is string, with an ``InputWarning`` naming it, an example and its
            ``file:line``: give ``schema=`` to read it as numbers, the other rows rejected.
            Every file, subtask and restart reads this schema: a column a file lacks is null,
            a column not in the schema is left out.
        :param delimiter: the field separator (one character).
        :param header: whether each file's first line names its columns (it is never data).
            Without one, the columns are ``column_names``, else the names of ``schema=`` in
            its order, else ``f0, f1, ...`` (as many as the first record of each file has).
        :param quote: the quote character (``None``: no quoting). As in RFC 4180, a quoted
            value may hold the delimiter, line breaks and the quote (doubled).
        :param null_values: the fields that are null (quoted or not). By default only the
            empty field: ``n/a``, ``NA`` or ``NaN`` are values (``NaN`` a double's).
        :param column_names: the columns' names, in field order (instead of the header's).
        :param on_error: what a rejected row does: a malformed record (more or fewer fields
            than the columns, invalid UTF-8, an unterminated quote) or one with a value that
            does not cast to its column's type (``'abc'`` for an int64). ``"fail"``: the job
            fails (after its restarts) with ``SourceError: FILE:LINE: why``, e.g.
            ``events.csv:3: column 'value': 'abc' is not an int64``. ``"dead_letter"``: the
            row goes to the dead letters (``StreamEnvironment(dead_letter_dir=...)``) with
            the line's text as the record and ``FILE:LINE: why`` as the error, and the job
            goes on. Lines are the file's own, 1-based (the header is line 1); blank lines
            are no rows.
        :param name: the operator's name (and uid, which checkpoints know it by).
        :param rate_limit: at most this many records per second, for the whole source (each
            subtask reads its share); ``None``: as fast as the job takes them.

        Replayable: the offset in each checkpoint is, per file, the rows consumed (handed out
        or rejected); a restore parses the file again and passes over exactly those (a
        rejected row is never rejected twice, nor a row lost).
        """
        options = CsvOptions(
            delimiter=delimiter,
            header=header,
            quote=quote,
            null_values=tuple(null_values),
            column_names=tuple(column_names) if column_names is not None else None,
        )
        return self._files(path, "csv", name, schema, on_error, rate_limit, options)

    def read_jsonl(
        self,
        path: str | os.PathLike[str],
        *,
        schema: pa.Schema | dict[str, Any] | None = None,
        on_error: str = "fail",
        name: str | None = None,
        rate_limit: float | None = None,
    ) -> DataStream:
        """The records of JSON-lines files (one JSON object per line), as Arrow batches with
        one schema.

        :param path: a directory (its ``.jsonl`` and ``.json`` files), one file, or a glob
            pattern (every file it matches, whatever its suffix; a directory it matches gives
            its JSON-lines files); a local path or any fsspec URL. Names starting with ``.``
            or ``_`` are left out of directories and patterns. The files are sorted by name
            and dealt round-robin to the subtasks, one split each. A path that does not exist
            raises ``SourceError`` here; no input file at all is an empty stream and an
            ``InputWarning`` naming the path and the suffixes looked for.
        :param schema: the columns and their types: a ``pyarrow.Schema``, or a dict of column
            -> type (``{"user": "string", "n": "int64"}``). By default it is inferred here, on
            the driver, from the head of every file (as ``read_csv``: 1 MiB and at most 10,000
            lines each) with pyarrow.json's types (int64, double, bool, string, timestamps
            for ISO-8601 text, read as timestamp[us], structs, lists), unified across lines
            and files (int64 and double: double; null: the other; structs field by field). A
            column whose values fit no one type (numbers and text, objects and numbers) is
            string, its values that are not text read as their JSON text; when they mix
            numbers and text an ``InputWarning`` names the column, an example and its
            ``file:line``. A column with nothing but nulls in the samples is string. Every
            file, subtask and restart reads this schema: a field a line lacks is null, a
            field not in the schema is left out.
        :param on_error: what a rejected line does: malformed JSON, a line that is no JSON
            object, or a value that does not fit its column's type (``"abc"`` or ``3.5`` for
            an int64; a string column takes any value, as its JSON text). ``"fail"``: the job
            fails (after its restarts) with ``SourceError: FILE:LINE: why``.
            ``"dead_letter"``: the line goes to the dead letters
            (``StreamEnvironment(dead_letter_dir=...)``) with its text as the record and
            ``FILE:LINE: why`` as the error, and the job goes on. Lines are 1-based; blank
            lines are no rows.
        :param name: the operator's name (and uid, which checkpoints know it by).
        :param rate_limit: at most this many records per second, for the whole source (each
            subtask reads its share); ``None``: as fast as the job takes them.

        Replayable: the offset in each checkpoint is, per file, the lines consumed (handed
        out or rejected); a restore passes over exactly those.
        """
        return self._files(path, "jsonl", name, schema, on_error, rate_limit)

    def _files(
        self,
        path: str | os.PathLike[str],
        fmt: str,
        name: str | None,
        schema: pa.Schema | dict[str, Any] | None,
        on_error: str,
        rate_limit: float | None,
        csv: CsvOptions | None = None,
    ) -> DataStream:
        what = name or f"read_{fmt}"
        self._check_on_error(what, on_error)  # before the files are sampled
        source = FileSource(
            location(path), fmt, self.storage_options, schema=schema, csv=csv or CsvOptions()
        )
        # on the driver, now: a missing path is an error here, not inside a Spark task, and
        # the schema every subtask and restart reads is fixed
        source, notes = source.prepare()
        for note in notes:
            warnings.warn(f"{what}({path}): {note}", InputWarning, stacklevel=3)
        return self._source(source, what, name, rate_limit, on_error)

    def _source(
        self,
        source: SequenceSource | FileSource,
        name: str,
        uid: str | None = None,
        rate_limit: float | None = None,
        on_error: str = "fail",
    ) -> DataStream:
        if rate_limit is not None and (
            isinstance(rate_limit, bool)
            or not isinstance(rate_limit, int | float)
            or not 0 < rate_limit < math.inf
        ):
            raise ValueError(
                f"{name}: rate_limit must be a number of records per second greater than zero, "
                f"not {rate_limit!r}"
            )
        operator = self._add(name, SourceLogic(source), [], uid, on_error)
        if rate_limit is not None:
            self._rate_limits[operator.uid] = float(rate_limit)
        return DataStream(self, operator)

    def _check_on_error(self, name: str, on_error: str) -> None:
        if on_error not in ("fail", "dead_letter"):
            raise ValueError(f"on_error must be 'fail' or 'dead_letter', not {on_error!r}")
        if on_error == "dead_letter" and self.dead_letter_dir is None:
            raise ValueError(
                f"{name}: on_error='dead_letter' needs a dead-letter directory: "
                "StreamEnvironment(dead_letter_dir=...)"
            )

    def _add(
        self,
        name: str,
        logic: Any,
        inputs: list[Edge],
        uid: str | None = None,
        on_error: str = "fail",
    ) -> Operator:
        if uid is not None:
            name = uid  # the user's name for it, in messages, dead letters and the progress
        self._check_on_error(name, on_error)
        self._counter += 1
        if uid is None:
            uid = f"{self._counter}-{re.sub(r'[^A-Za-z0-9_.]', '_', name)}"[:60]
        operator = self.graph.add(Operator(uid, name, logic, inputs))
        self._on_error[uid] = on_error
        return operator

    # ----------------------------------------------------------------- running

    def plan(self) -> ExecutionPlan:
        return plan(self.graph, self.parallelism, self.max_parallelism)

    def execute(
        self,
        spark: Any = None,
        *,
        listener: Listener | None = None,
        launcher: Launcher | None = None,
        on_ready: Callable[[int, dict[str, int]], None] | None = None,
        stop_after: float | str | None = None,
        restore_from: str | os.PathLike[str] | None = None,
        allow_non_restored_state: bool = False,
        progress: bool | None = None,
        hold_sources: SourceHold | None = None,
        phase_hook: PhaseHook | None = None,
    ) -> JobResult:
        """Run the job on Spark and wait for it to end.

        :param spark: a ``SparkSession`` to run on; by default a local one with
            ``local[parallelism]`` (created once, reused).
        :param listener: called with ``(kind, message)`` for checkpoints, aborts, restarts and
            warnings, e.g. ``lambda kind, msg: print(kind, msg)``.
        :param stop_after: stop the job this long after it started (``"30s"``), gracefully: the
            sources stop reading, a final checkpoint completes, and everything read until then
            is processed and published exactly once. For unbounded sources; without it such
            a job runs until interrupted.
        :param restore_from: start from this checkpoint or savepoint (its folder; or a
            checkpoint directory: its newest complete checkpoint; or ``"latest"``: this job's
            own ``checkpoint_dir``'s, how a job whose driver died resumes, and from the
            beginning while there is none), at this job's parallelism
            (state is redistributed when it differs). State is matched to operators by their
            names (``name=``): name the stateful operators, and keep the names.
        :param allow_non_restored_state: start even when the checkpoint holds state of an
            operator this job does not have (that state is dropped); otherwise that is an
            error naming the operator.
        :param progress: show the progress on standard error: ``None`` (default) a live display
            when standard error is a terminal (records in and out per operator, throughput,
            backpressure, the last checkpoints and restarts), and otherwise a line per
            checkpoint, abort, restart and warning; ``True`` the live display always; ``False``
            nothing. The same figures are in ``result.metrics`` afterwards.
        :param hold_sources: hold every source subtask part-way in the first attempt until a
            checkpoint taken since is complete and the listener was told of it
            (:class:`~cutline.SourceHold`): a listener that fails the job on that checkpoint
            (kills a worker, for a test or a demo) then always fails a running job with input
            left, however fast the machine. Needs a ``checkpoint_interval``.
        :param phase_hook: ``hook(phase, slot, generation)``, called in each slot's process as
            it enters each phase of an attempt (``start``, ``rendezvous``, ``restore``,
            ``running``, ``final_checkpoint``, ``commit``): for tests that freeze or stall a
            worker in a given phase. Must be picklable.
        :raises RestoreError: the checkpoint does not fit the job (the message says why).
        :returns: a :class:`~cutline.runtime.driver.result.JobResult`; ``result.output`` is the
            records of the collect sink.
        :raises JobFailedError: the job failed and the restart strategy gave up.

        On Ctrl-C the job's attempt is cancelled and the program ends with exit status 130,
        saying ``interrupted; last complete checkpoint N; resume with restore_from='latest'``
        (no traceback); in an interactive session it raises
        :class:`~cutline.runtime.driver.result.JobInterrupted` (a ``KeyboardInterrupt``) instead.
        """
        execution_plan = self.plan()
        port_range()  # a malformed CUTLINE_PORTS: said now, not when the first socket opens
        if hold_sources is not None:
            if not isinstance(hold_sources, SourceHold):
                raise TypeError(f"hold_sources takes a SourceHold, not {hold_sources!r}")
            if self.checkpoint_settings.interval is None:
                raise ValueError(
                    "hold_sources waits for a periodic checkpoint: give the job a "
                    "checkpoint_interval"
                )
        restore = _restore_url(restore_from)
        if restore == LATEST and not self._has_checkpoint():
            # nothing completed, so nothing was published: a fresh start is the resumption
            # (and an output directory that holds files then says this is not the same job)
            if listener is not None:
                listener(
                    "warning",
                    f"no complete checkpoint in {self.checkpoint_dir} yet: "
                    "starting from the beginning",
                )
            restore = None
            fresh = "no complete checkpoint to resume from"
        else:
            fresh = None
        self._check_outputs(restoring=restore is not None, why=fresh)
        if not self._outputs and not self._collect:
            warnings.warn("the job has no sink: its results go nowhere", stacklevel=2)
        from cutline.spark.launcher import SparkLauncher, check_picklable, is_local

        if launcher is None:
            launcher = SparkLauncher.for_session(spark, self.parallelism)
            if self.checkpoint_dir is None and not is_local(launcher.spark):
                raise ValueError(
                    "on a Spark cluster the job needs a checkpoint_dir that every host can "
                    "read and write (a shared path, or a URL: hdfs://..., s3://...); the "
                    "default temporary directory is on the driver's machine only"
                )
        if isinstance(launcher, SparkLauncher):  # what Spark cannot ship, said now
            check_picklable(execution_plan, phase_hook=phase_hook)
        temporary = None
        checkpoint_dir = self.checkpoint_dir
        if checkpoint_dir is None:
            temporary = tempfile.mkdtemp(prefix="cutline-checkpoints-")
            checkpoint_dir = temporary
        try:
            collect_dirs = {}
            for name in self._collect:
                directory = f"{checkpoint_dir.rstrip('/')}/_collect/{name}"
                fs, root = fsspec.core.url_to_fs(directory, **dict(self.storage_options or {}))
                if fs.exists(root):
                    fs.rm(root, recursive=True)
                collect_dirs[name] = directory
                operator = self.graph.operators[self._collect[name]]
                operator.logic = SinkLogic(FileSink(directory, "pickle", self.storage_options))
            config = JobConfig(
                parallelism=self.parallelism,
                checkpoint_dir=checkpoint_dir,
                checkpoints=self.checkpoint_settings,
                storage_options=self.storage_options,
                restart_attempts=self.restart_attempts,
                restart_delay=self.restart_delay,
                batch_size=self.batch_size,
                buffer_capacity=self.buffer_capacity,
                dead_letter_dir=self.dead_letter_dir,
                on_error=dict(self._on_error),
                heartbeat_timeout=self.heartbeat_timeout,
                start_timeout=self.start_timeout,
                restore_timeout=self.restore_timeout,
                commit_timeout=self.commit_timeout,
                rate_limits=dict(self._rate_limits),
                hold=hold_sources,
                phase_hook=phase_hook,
                slot_timeout=self.slot_timeout,
                on_host_loss=self.on_host_loss,
                collect=collect_dirs,
                stop_after=seconds(stop_after, "stop_after"),
                checkpointing=self.checkpointing,
                alignment_timeout=self.alignment_timeout,
                state=self.state,
                restore_from=restore,
                allow_non_restored_state=allow_non_restored_state,
                savepoint_dir=self.savepoint_dir,
            )
            if progress is None and not wanted(None):  # no terminal: a line per event
                listener = _both(ProgressLines(), listener)
            driver = JobDriver(execution_plan, config, launcher, listener)
            driver.on_ready = on_ready
            try:
                if not wanted(progress):
                    return driver.run()
                with LiveProgress() as live:
                    driver.on_progress = live.update
                    result = driver.run()
                    if result.metrics is not None:
                        live.update(result.metrics)  # the final figures stay on the screen
                    return result
            except JobInterrupted as exc:
                interrupted = exc
                if temporary is not None:  # removed below: nothing to resume from
                    interrupted = JobInterrupted(
                        "interrupted; nothing to resume (the job had no checkpoint_dir: give it "
                        "one to resume an interrupted job)",
                        exc.checkpoint,
                    )
                if _interactive():
                    raise interrupted from None  # a notebook or a REPL goes on
                print(f"cutline: {interrupted}", file=sys.stderr)
                raise SystemExit(130) from None  # as a shell does on SIGINT: no traceback
        finally:
            if temporary is not None:
                shutil.rmtree(temporary, ignore_errors=True)

    def _has_checkpoint(self) -> bool:
        """Whether ``checkpoint_dir`` holds a complete checkpoint (intact or not: a damaged
        one is the driver's to report)."""
        if self.checkpoint_dir is None:
            raise ValueError('restore_from="latest" needs the job\'s checkpoint_dir')
        storage = CheckpointStorage(self.checkpoint_dir, storage_options=self.storage_options)
        return bool(storage.completed_ids())

    def _location(self, directory: str) -> tuple[str, str]:
        """(protocol, path) of ``directory``: equal for two spellings of one place."""
        fs, root = fsspec.core.url_to_fs(directory, **dict(self.storage_options or {}))
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        return protocol, root.rstrip("/") or "/"

    def _check_outputs(self, restoring: bool, why: str | None = None) -> None:
        """At ``execute()``: every output directory apart from the others, and empty unless the
        job restores (a job resumed after its driver died goes on writing where it was)."""
        places = [(self._location(d), f"output directory {d}") for d in self._outputs.values()]
        if self.dead_letter_dir is not None:
            places.append((self._location(self.dead_letter_dir), "dead_letter_dir"))
        for i, (a, what_a) in enumerate(places):
            for b, what_b in places[i + 1 :]:
                if a[0] == b[0] and (
                    a[1] == b[1] or b[1].startswith(a[1] + "/") or a[1].startswith(b[1] + "/")
                ):
                    raise ValueError(
                        f"{what_a} and {what_b} overlap: give each sink its own directory"
                    )
        if restoring:
            return
        for uid, directory in self._outputs.items():
            self._check_empty(directory, self.graph.operators[uid].name, why)

    def _check_output(self, directory: str, what: str) -> None:
        location = self._location(directory)
        if any(self._location(d) == location for d in self._outputs.values()):
            raise ValueError(f"{what}: two sinks write to {directory}; give each its own directory")

    def _check_empty(self, directory: str, what: str, why: str | None = None) -> None:
        fs, root = fsspec.core.url_to_fs(directory, **dict(self.storage_options or {}))
        if fs.exists(root):
            published = [
                p
                for p in fs.ls(root, detail=False)
                if not str(p).rstrip("/").rsplit("/", 1)[-1].startswith(("_", "."))
            ]
            if published:
                advice = (
                    f", and {self.checkpoint_dir} has {why}: the files are not this job's "
                    "(another checkpoint_dir?); write to a new directory, or remove them"
                    if why is not None  # restore_from="latest" found nothing to resume
                    else "; write to a new directory, or remove them first (the exactly-once "
                    "sink never overwrites output), or resume the job that wrote them "
                    "(restore_from=...)"
                )
                raise ValueError(
                    f"{what}: output directory {directory} already holds {len(published)} "
                    f"file(s){advice}"
                )


class DataStream:
    """A stream of records: the output of one operator."""

    def __init__(self, env: StreamEnvironment, operator: Operator) -> None:
        self.env = env
        self.operator = operator

    def _then(
        self,
        name: str,
        logic: Any,
        *,
        uid: str | None = None,
        on_error: str = "fail",
        edge: Edge | None = None,
    ) -> DataStream:
        inputs = [edge or Edge(self.operator.uid)]
        return DataStream(self.env, self.env._add(name, logic, inputs, uid, on_error))

    def map(
        self, fn: Callable[[Any], Any], *, name: str | None = None, on_error: str = "fail"
    ) -> DataStream:
        """One record out for every record in: ``fn(record)``."""
        return self._then(*_per_record("map", fn), uid=name, on_error=on_error)

    def flat_map(
        self, fn: Callable[[Any], Iterable[Any]], *, name: str | None = None, on_error: str = "fail"
    ) -> DataStream:
        """Any number of records out for every record in: ``fn(record)`` returns an iterable."""
        return self._then(*_per_record("flat_map", fn), uid=name, on_error=on_error)

    def filter(
        self, fn: Callable[[Any], bool], *, name: str | None = None, on_error: str = "fail"
    ) -> DataStream:
        """The records for which ``fn(record)`` is true."""
        return self._then(*_per_record("filter", fn), uid=name, on_error=on_error)

    def map_batches(
        self,
        fn: Callable[[pa.RecordBatch], pa.RecordBatch | pa.Table],
        *,
        name: str | None = None,
        on_error: str = "fail",
    ) -> DataStream:
        """The vectorized path: ``fn`` gets a ``pyarrow.RecordBatch`` and returns a batch or
        table. (Records that are dicts are turned into a batch first.)"""
        return self._then(*_per_record("map_batches", fn), uid=name, on_error=on_error)

    def key_by(self, key: str | Callable[[Any], Hashable]) -> KeyedStream:
        """Partition by key: a column name (records are dicts or columns) or a function."""
        if not (isinstance(key, str) or callable(key)):
            raise TypeError(f"key_by takes a column name or a function, not {key!r}")
        return KeyedStream(self, key)

    def union(self, *others: DataStream) -> DataStream:
        """The records of this stream and of ``others``, interleaved."""
        streams = [self, *others]
        if not others:
            raise ValueError("union needs at least one other stream")
        if any(s.env is not self.env for s in streams):
            raise ValueError("union of streams from different StreamEnvironments")
        if len({s.operator.uid for s in streams}) != len(streams):
            raise ValueError("union of a stream with itself: every record would come twice")
        inputs = [Edge(s.operator.uid) for s in streams]
        return DataStream(self.env, self.env._add("union", PassLogic(), inputs))

    def iterate(
        self,
        body: Callable[[DataStream], tuple[DataStream, DataStream]],
        *,
        name: str | None = None,
    ) -> DataStream:
        """A loop, for iterative algorithms (label propagation, graph search, PageRank).

        ``body(loop)`` receives the stream of records entering the loop: this stream's records
        and every record fed back. It returns ``(feedback, output)``: ``feedback`` goes round
        to the loop's head again, ``output`` leaves the loop (the value returned here). A
        record circulates until the body stops feeding it back. Checkpoints of every mode stay
        consistent: records that travel the back edge while a checkpoint goes round are
        stored with it and replayed after a restore; the final checkpoint of bounded input
        waits until nothing circulates any more.
        """
        if not callable(body):
            raise TypeError(f"iterate needs a function of the loop's stream, not {body!r}")
        head = self.env._add("iterate", PassLogic(), [Edge(self.operator.uid)], name)
        returned = body(DataStream(self.env, head))
        if (
            not isinstance(returned, tuple)
            or len(returned) != 2
            or not all(isinstance(s, DataStream) for s in returned)
        ):
            raise TypeError(
                f"the body of iterate must return (feedback, output), two streams, not {returned!r}"
            )
        feedback, output = returned
        if feedback.env is not self.env or output.env is not self.env:
            raise ValueError("iterate: the body returned a stream of another StreamEnvironment")
        try:
            self.env.graph.close_loop(head.uid, feedback.operator.uid)
        except GraphError as exc:
            raise ValueError(f"iterate: {exc}") from None
        return output

    def write_parquet(self, path: str | os.PathLike[str], *, name: str | None = None) -> None:
        """Exactly-once Parquet output: part files appear in ``path`` when the checkpoint that
        covers them completes (pending ones wait in ``path/_pending``, which readers skip)."""
        self._file_sink(location(path), "parquet", name)

    def write_jsonl(self, path: str | os.PathLike[str], *, name: str | None = None) -> None:
        """Exactly-once JSON-lines output (as :meth:`write_parquet`)."""
        self._file_sink(location(path), "jsonl", name)

    def _file_sink(self, path: str, fmt: str, name: str | None) -> None:
        what = f"write_{fmt}({path})"
        self.env._check_output(path, what)
        operator = self._then(
            what, SinkLogic(FileSink(path, fmt, self.env.storage_options)), uid=name
        ).operator
        self.env._outputs[operator.uid] = path

    def collect(self, name: str = "collect") -> None:
        """Keep the records: ``execute()`` returns them (``result.output``), exactly once."""
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ValueError(f"collect name {name!r}: use letters, digits, '_', '-' and '.'")
        if name in self.env._collect:
            raise ValueError(f"two collect sinks are named {name!r}")
        # the directory is fixed at execute(); the sink's logic finds it through the env
        logic = SinkLogic(FileSink(f"{{collect:{name}}}", "pickle"))
        operator = self._then(f"collect({name})", logic).operator
        self.env._collect[name] = operator.uid


class KeyedStream:
    """A stream partitioned by key: keyed state and rolling aggregations per key."""

    def __init__(self, stream: DataStream, key: str | Callable[[Any], Hashable]) -> None:
        self.stream = stream
        self.key = key

    def _keyed(self, name: str, logic: Any, uid: str | None, on_error: str = "fail") -> DataStream:
        edge = Edge(self.stream.operator.uid, "hash", self.key)
        return self.stream._then(name, logic, uid=uid, on_error=on_error, edge=edge)

    def map(
        self, fn: Callable[[Any], Any], *, name: str | None = None, on_error: str = "fail"
    ) -> DataStream:
        """As :meth:`DataStream.map`, on records partitioned by key."""
        return self._keyed(*_per_record("map", fn), name, on_error)

    def flat_map(
        self, fn: Callable[[Any], Iterable[Any]], *, name: str | None = None, on_error: str = "fail"
    ) -> DataStream:
        return self._keyed(*_per_record("flat_map", fn), name, on_error)

    def filter(
        self, fn: Callable[[Any], bool], *, name: str | None = None, on_error: str = "fail"
    ) -> DataStream:
        return self._keyed(*_per_record("filter", fn), name, on_error)

    def map_batches(
        self,
        fn: Callable[[pa.RecordBatch], pa.RecordBatch | pa.Table],
        *,
        name: str | None = None,
        on_error: str = "fail",
    ) -> DataStream:
        """As :meth:`DataStream.map_batches`: every batch holds only keys of one subtask."""
        return self._keyed(*_per_record("map_batches", fn), name, on_error)

    def process(
        self, function: KeyedProcessFunction, *, name: str | None = None, on_error: str = "fail"
    ) -> DataStream:
        """Run ``function.process(record, ctx)`` for every record, with keyed state in ``ctx``."""
        if not isinstance(function, KeyedProcessFunction):
            raise TypeError(
                "process takes an instance of a KeyedProcessFunction subclass, not "
                f"{type(function).__name__}"
            )
        return self._keyed(
            f"process({type(function).__name__})",
            ProcessLogic(function, self.key),
            name,
            on_error,
        )

    def reduce(
        self, fn: Callable[[Any, Any], Any], *, name: str | None = None, on_error: str = "fail"
    ) -> DataStream:
        """For every record, emit ``fn(previous result of its key, record)`` (the first record of
        a key is emitted as it is)."""
        _callable(fn, "reduce")
        return self._keyed(
            f"reduce({function_name(fn)})", RollingLogic("reduce", self.key, fn=fn), name, on_error
        )

    def sum(self, field: str | int, *, name: str | None = None) -> DataStream:
        """For every record, the record with ``field`` replaced by its key's running sum."""
        return self._keyed(f"sum({field})", RollingLogic("sum", self.key, field), name)

    def min(self, field: str | int, *, name: str | None = None) -> DataStream:
        return self._keyed(f"min({field})", RollingLogic("min", self.key, field), name)

    def max(self, field: str | int, *, name: str | None = None) -> DataStream:
        return self._keyed(f"max({field})", RollingLogic("max", self.key, field), name)

    def count(self, *, name: str | None = None) -> DataStream:
        """For every record, the record with a ``count`` field: its key's running count."""
        return self._keyed("count", RollingLogic("count", self.key), name)


def _per_record(kind: str, fn: Any) -> tuple[str, Any]:
    """The name and logic of a ``map``, ``flat_map``, ``filter`` or ``map_batches``."""
    _callable(fn, kind)
    logic = MapBatchesLogic(fn) if kind == "map_batches" else MapLogic(fn, kind)
    return f"{kind}({function_name(fn)})", logic


def _callable(fn: Any, what: str) -> None:
    if not callable(fn):
        raise TypeError(f"{what} takes a function, not {type(fn).__name__}")
