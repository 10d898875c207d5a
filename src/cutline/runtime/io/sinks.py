"""An exactly-once file sink: two-phase commit of Parquet or JSON-lines part files.

Records go to a part file under ``OUTPUT/_pending/``, where readers of the
output directory (Spark, ``pyarrow.dataset``, pandas) do not look: they skip
names that start with ``_`` or ``.``. Then, per checkpoint (SEMANTICS §4):

Both are sinks of the public connector API (:mod:`cutline.connectors.sink`):

1. **pre-commit** (:meth:`FileSinkWriter.prepare_commit`, when the subtask
   snapshots for checkpoint ``n``): the records since the last checkpoint become
   a part, recorded in the sink's state for ``n`` as pending; the part file is
   written by :meth:`PreCommit.complete` on the subtask's snapshot thread (the
   asynchronous part of the checkpoint), so the subtask goes on meanwhile;
2. **commit** (:meth:`FileSinkWriter.commit`, once checkpoint ``n`` is
   complete): every part pending up to ``n`` is renamed into ``OUTPUT/`` —
   published.

After a failure, :meth:`FileSink.writer` with the state of the restored
checkpoint publishes the parts that checkpoint pre-committed (idempotently:
one already published stays as it is) and deletes this subtask's other
pending parts, written after the checkpoint by the attempt that failed. Every
record is therefore published exactly once.

One more case keeps that true when the job restores an older checkpoint than
the newest one that published (the newest is damaged; or a job whose driver
died resumes from its directory's newest checkpoint while a savepoint taken
since had published more): parts published for a checkpoint newer than the
restored one, by an earlier attempt of the same run or by an earlier run, are
**withdrawn** (deleted), since the replay writes their records again. Part
names carry the checkpoint id, the generation and the run (one ``execute()``),
so recovery knows them; checkpoint ids are never reused in a checkpoint
directory, and a fresh start never touches another run's output.
"""

from __future__ import annotations

import contextlib
import io
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import fsspec
import pyarrow as pa

from cutline.connectors.sink import PendingCommit, Sink, SinkContext, SinkWriter
from cutline.connectors.sink import SinkError as SinkError  # (its home: connectors)
from cutline.runtime.io.file_formats import PARQUET, PICKLE, OutputFormat

PENDING = "_pending"
_PART = re.compile(r"part-(\d{5})-(\d{10})-g(\d+)-([a-z0-9]+)-\d+\.[a-z]+")


COLLECT_FOLDER = "_collect"
"""The collect sinks write their parts under ``CHECKPOINT_DIR/_collect/NAME``."""


def collect_directory(checkpoint_dir: str, name: str) -> str:
    """Where the collect sink ``name`` of a job with this checkpoint directory writes."""
    return f"{checkpoint_dir.rstrip('/')}/{COLLECT_FOLDER}/{name}"


@dataclass(frozen=True)
class CollectSink(Sink):
    """The sink of ``stream.collect(name)``: pickled records in the job's checkpoint directory
    (:func:`collect_directory`), read back by the driver when the job ends. Where that is is
    known only when the job runs: its writer is the file sink's there."""

    name: str

    def writer(self, context: SinkContext, restored: Mapping[int, Any]) -> FileSinkWriter:
        directory = collect_directory(context.checkpoint_dir, self.name)
        return FileSink(directory, PICKLE, context.storage_options).writer(context, restored)


@dataclass(frozen=True)
class FileSink(Sink):
    """Part files in ``directory`` (a local path or any fsspec URL), in ``format``
    (:data:`~cutline.runtime.io.file_formats.PARQUET`,
    :data:`~cutline.runtime.io.file_formats.JSONL`, ...)."""

    directory: str
    format: OutputFormat = PARQUET
    storage_options: Mapping[str, Any] | None = None

    @property
    def columnar(self) -> bool:  # type: ignore[override]
        return self.format.columnar

    def __post_init__(self) -> None:
        if not isinstance(self.format, OutputFormat):
            raise TypeError(
                f"format must be an OutputFormat (cutline.runtime.io.file_formats), not "
                f"{self.format!r}"
            )

    def writer(self, context: SinkContext, restored: Mapping[int, Any]) -> FileSinkWriter:
        """A writer for subtask ``context.subtask`` in attempt ``context.generation`` of the
        job's run ``context.run`` (an id of one ``execute()``: part names carry it, so two runs
        never share a name, and recovery only ever withdraws its own run's parts).

        ``restored``: the states the sink stored in the checkpoint the job restores from, of
        this subtask, or, at another parallelism, of the previous run's subtasks this one
        takes over (old subtask index -> state): their pre-committed parts are published and
        their other pending parts removed."""
        run, subtask = context.run, context.subtask
        if not re.fullmatch(r"[a-z0-9]{1,16}", run):
            raise ValueError(f"run id {run!r}: use 1 to 16 lowercase letters and digits")
        fs, root = fsspec.core.url_to_fs(self.directory, **dict(self.storage_options or {}))
        writer = FileSinkWriter(fs, root.rstrip("/"), self.format, subtask, context.generation, run)
        states = {index: state or {} for index, state in restored.items()}
        states.setdefault(subtask, {})
        for index, old in sorted(states.items()):
            writer._recover(old, index)
        return writer


class FileSinkWriter(SinkWriter):
    def __init__(
        self,
        fs: Any,
        root: str,
        fmt: OutputFormat,
        subtask: int,
        generation: int,
        run: str = "r0",
    ) -> None:
        self._run = run
        self._fs = fs
        self._root = root
        self._format = fmt
        self._subtask = subtask
        self._generation = generation
        self._batches: list[Any] = []
        self._part = 0
        self._pending: list[dict[str, Any]] = []
        """Parts pre-committed and not yet published: {"checkpoint": n, "name": file name}."""
        self._unwritten: dict[str, tuple[int, list[Any]]] = {}
        """Parts pre-committed whose files are not written yet (name -> (checkpoint, records)),
        in order."""
        self._unwritten_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        """Held while writing part files (by the snapshot thread, or at a commit)."""
        self._failed: SinkError | None = None
        """A part file could not be written: every later call raises it (the subtask fails)."""
        try:
            self._fs.makedirs(f"{root}/{PENDING}", exist_ok=True)
        except OSError as exc:
            raise SinkError(f"cannot create {root}/{PENDING}: {exc.strerror or exc}") from exc

    # ------------------------------------------------------------------ writing

    def write(self, batch: pa.RecordBatch | list[Any]) -> None:
        """Buffer records for the part file of the current checkpoint (Arrow record batches;
        for a format not columnar, records as they are)."""
        if self._failed is not None:
            raise self._failed
        if len(batch):
            if not self._format.columnar and not isinstance(batch, list):
                batch = batch.to_pylist()
            self._batches.append(batch)

    def prepare_commit(self, checkpoint_id: int) -> PreCommit:
        """The synchronous part of the pre-commit: the records since the last checkpoint
        become a pending part (its file is written by :meth:`PreCommit.complete`, on the
        snapshot thread); the returned object holds the sink's state for ``checkpoint_id``."""
        if self._failed is not None:
            raise self._failed
        if self._batches:
            name = (
                f"part-{self._subtask:05d}-{checkpoint_id:010d}-g{self._generation}-"
                f"{self._run}-{self._part}{self._format.suffix}"
            )
            self._part += 1
            with self._unwritten_lock:
                self._unwritten[name] = (checkpoint_id, self._batches)
            self._batches = []
            self._pending.append({"checkpoint": checkpoint_id, "name": name})
        return PreCommit(
            self,
            {"checkpoint": checkpoint_id, "pending": list(self._pending), "directory": self._root},
        )

    def pre_commit(self, checkpoint_id: int) -> dict[str, Any]:
        """Close the records since the last checkpoint into a pending part, written now; return
        the sink's state for ``checkpoint_id`` (store it in the checkpoint)."""
        return self.prepare_commit(checkpoint_id).complete()

    def flush(self, up_to: int | None = None) -> None:
        """Write the pre-committed parts whose files are not written yet (of checkpoints up to
        ``up_to``; ``None``: all), in order. A part that cannot be written, for whatever
        reason, fails this writer for good (:class:`SinkError`, naming the file)."""
        if up_to is not None and not self._waiting(up_to):
            return  # (without waiting for the snapshot thread writing a later part)
        with self._flush_lock:
            if self._failed is not None:
                raise self._failed
            while True:
                with self._unwritten_lock:
                    if not self._unwritten:
                        return
                    name, (checkpoint_id, batches) = next(iter(self._unwritten.items()))
                if up_to is not None and checkpoint_id > up_to:
                    return
                path = f"{self._root}/{PENDING}/{name}"
                try:
                    self._write_file(path, batches)
                except SinkError as exc:
                    self._failed = exc
                    raise
                except Exception as exc:  # a record that cannot be encoded, ...
                    self._failed = SinkError(f"cannot write {path}: {type(exc).__name__}: {exc}")
                    raise self._failed from exc
                with self._unwritten_lock:
                    del self._unwritten[name]

    def _waiting(self, up_to: int) -> bool:
        """Whether a part of a checkpoint up to ``up_to`` is still to be written."""
        with self._unwritten_lock:
            return any(checkpoint <= up_to for checkpoint, _ in self._unwritten.values())

    def commit(self, checkpoint_id: int) -> list[str]:  # type: ignore[override]
        """Checkpoint ``checkpoint_id`` is complete: publish every part pending up to it.
        Returns the names published."""
        # written already, unless the subtask dropped a checkpoint before writing it
        self.flush(up_to=checkpoint_id)
        ready = [p for p in self._pending if p["checkpoint"] <= checkpoint_id]
        for part in ready:
            self._publish(part["name"])
        self._pending = [p for p in self._pending if p["checkpoint"] > checkpoint_id]
        return [p["name"] for p in ready]

    # ------------------------------------------------------------------ recovery

    def _recover(self, state: Mapping[str, Any], subtask: int) -> None:
        """Recover the parts of ``subtask`` (this one, or one of the previous run it adopts)."""
        # the parts belong to the directory of the sink that wrote them (a job restored from
        # another job's savepoint may write elsewhere): they are published there
        root = str(state.get("directory", self._root))
        self._withdraw_newer(state.get("checkpoint"), subtask)
        committed = [dict(p) for p in state.get("pending", [])]
        for part in committed:  # pre-committed in a complete checkpoint: publish (once)
            name = str(part["name"])
            match = _PART.fullmatch(name)
            # A part of another run (a savepoint, or a checkpoint of an earlier execute()) that
            # is no longer there was published by that run when the checkpoint completed (and
            # its output cleaned or moved since): nothing to do. Our own run's parts must be.
            theirs = root != self._root or (match is not None and match.group(4) != self._run)
            self._publish(name, root, missing_ok=theirs)
        if root != self._root:
            return  # another job's directory: what else is pending there is not ours to touch
        keep = {str(p["name"]) for p in committed}
        prefix = f"part-{subtask:05d}-"
        try:
            leftovers = self._fs.ls(f"{root}/{PENDING}", detail=False)
        except FileNotFoundError:
            leftovers = []
        for path in leftovers:
            name = str(path).rsplit("/", 1)[-1]
            if name.startswith(prefix) and name not in keep:
                # written after the restored checkpoint (or by a stale attempt): never published
                with contextlib.suppress(FileNotFoundError):
                    self._fs.rm(str(path))

    def _withdraw_newer(self, restored: int | None, subtask: int) -> None:
        """Delete ``subtask``'s parts published for checkpoints after ``restored`` by earlier
        attempts of this run (``restored`` ``None``: any) or by earlier runs: the job restores
        an older checkpoint than the newest that published, so their records come again."""
        prefix = f"part-{subtask:05d}-"
        try:
            published = self._fs.ls(self._root, detail=False)
        except FileNotFoundError:
            return
        for path in published:
            match = _PART.fullmatch(str(path).rstrip("/").rsplit("/", 1)[-1])
            if match is None or not match.group(0).startswith(prefix):
                continue
            checkpoint, generation = int(match.group(2)), int(match.group(3))
            if match.group(4) != self._run:
                # another run's part: published for a checkpoint after the one restored (by a
                # driver that died after it, or with a savepoint taken since), its records come
                # again. Checkpoint ids are never reused in a checkpoint directory.
                newer = restored is not None and checkpoint > restored
            else:
                newer = generation < self._generation and (
                    restored is None or checkpoint > restored
                )
            if newer:
                try:
                    self._fs.rm(str(path))
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    raise SinkError(f"cannot withdraw {path}: {exc.strerror or exc}") from exc

    def _publish(self, name: str, root: str | None = None, *, missing_ok: bool = False) -> None:
        root = root or self._root
        source = f"{root}/{PENDING}/{name}"
        target = f"{root}/{name}"
        try:
            if self._fs.exists(source):
                self._fs.mv(source, target)
            elif not missing_ok and not self._fs.exists(target):
                raise SinkError(
                    f"part {name} was pre-committed but is neither pending in {root}/"
                    f"{PENDING} nor published in {root}: the output lost it"
                )
        except OSError as exc:
            raise SinkError(f"cannot publish {source}: {exc.strerror or exc}") from exc

    def _write_file(self, path: str, batches: list[Any]) -> None:
        buffer = io.BytesIO()
        self._format.write(buffer, batches)
        try:
            with self._fs.open(path, "wb") as out:
                out.write(buffer.getvalue())
        except OSError as exc:
            raise SinkError(f"cannot write {path}: {exc.strerror or exc}") from exc


class PreCommit(PendingCommit):
    """A sink's pre-commit for one checkpoint whose part file is still to be written: the
    subtask's snapshot thread calls :meth:`complete` (the asynchronous part)."""

    def __init__(self, writer: FileSinkWriter, state: dict[str, Any]) -> None:
        self.writer, self.state = writer, state

    def complete(self) -> dict[str, Any]:
        """Write the part files pre-committed so far; the sink's state for the checkpoint."""
        self.writer.flush()
        return self.state
