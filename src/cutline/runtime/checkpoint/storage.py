"""Checkpoint storage: one folder per checkpoint in a local directory or any fsspec URL.

Layout::

    CHECKPOINT_DIR/
      chk-7/
        g2-source-0.state      # a subtask's state file: generation 2, subtask "source-0"
        g2-sum-1.state
        g2-sum-1-0-c7-….seg    # keyed state in full, owned by this checkpoint
        _metadata              # written last, atomically: the checkpoint is complete
      chk-8/                   # no _metadata: incomplete, never restored from
        g2-source-0.state
      _stats/                  # statistics of every checkpoint, restart and run (stats.py)
        checkpoint-7.json
      shared/                  # keyed state of incremental checkpoints, shared by them
        g2-sum-1-0-c5-….seg    #   (reference counted: see protocol/registry.py)
        g2-sum-1-0-c7-….seg

A keyed operator's state is a chain of **segments** (``runtime/state.py``): with
incremental checkpoints they go to ``shared/`` and a checkpoint names the ones it
needs as ``../shared/NAME``; otherwise, and always for a savepoint, they are the
checkpoint's own files. A folder that names no shared file is self-contained: it
can be moved or copied anywhere and restored from there (a savepoint is such a folder).

Every state file is named after the *generation* (the restart attempt) that
wrote it, and the metadata lists, for every subtask, its file with size and
SHA-256. A restore reads only files the metadata names, and checks their size
and digest, so a file left by a stale attempt, a torn write or a flipped bit
is refused with an error that names the file. :meth:`CheckpointStorage.latest`
falls back to the previous complete checkpoint, and says why.

The metadata and the statistics files are written to a temporary name and then
renamed: on a local disk the rename is atomic; on object stores a single object
write is. A torn write leaves no such file behind, and never spoils an older one.

A ``chk-N`` folder without ``_metadata`` is a checkpoint in progress or one that was
aborted, unless its statistics say it **completed**: then its metadata was lost (deleted
by hand, a damaged file system) and :meth:`CheckpointStorage.latest` names it among the
checkpoints it skipped (:meth:`CheckpointStorage.completed_without_metadata` lists such ids).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import posixpath
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import fsspec

from cutline.runtime.checkpoint.stats import (
    STATS_FOLDER,
    STATS_HISTORY,
    CheckpointStats,
    History,
    RestartInfo,
    RunInfo,
    checkpoint_ids_in,
    decode,
    encode,
    history_of,
    stats_file,
)
from cutline.runtime.state.keygroups import StateError
from cutline.runtime.state.segments import SHARED_PREFIX, SegmentRef

METADATA = "_metadata"
DISCARDING = "_discarding"
"""The mark :meth:`CheckpointStorage.discard` leaves in a folder before removing it."""
FORMAT_VERSION = 2
"""2: handles name their segments and the operators with state (cutline 0.1 with issue 5)."""
_CHECKPOINT_DIR = re.compile(r"chk-(0|[1-9][0-9]*)")
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
SHARED = "shared"


_UNSYNCABLE = (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EROFS)
"""``fsync`` errors of files that cannot be synced (a device, a pipe): not a failed write."""


def _sync(stream: Any) -> None:
    """Flush ``stream``, and sync it to the disk when it is a local file (object stores have
    no such step). A failed flush or sync (a full disk, EIO) raises its ``OSError``."""
    stream.flush()
    try:
        fileno = stream.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation, ValueError):
        return  # not a local file
    try:
        os.fsync(fileno)
    except OSError as exc:
        if exc.errno not in _UNSYNCABLE:
            raise


def _sync_directory(fs: Any, folder: str) -> None:
    """fsync a local directory, so that a rename in it is durable (a no-op elsewhere)."""
    if "file" not in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_DAMAGED = (IsADirectoryError, NotADirectoryError)
"""Errors that mean the checkpoint's files are not what they should be (not passing faults)."""


class StorageError(Exception):
    """Checkpoint storage could not be read or written; the message names the path."""


class CorruptCheckpointError(StorageError):
    """A checkpoint's metadata or state file is missing, truncated, altered or unreadable."""


@dataclass(frozen=True)
class StateHandle:
    """Where one subtask's part of a checkpoint lives, and how to know it is intact."""

    path: str
    """Relative to the checkpoint directory."""
    size: int
    sha256: str
    generation: int
    segments: tuple[SegmentRef, ...] = ()
    """The keyed state segments the state file names (its own, and shared ones)."""
    operators: tuple[str, ...] = ()
    """The operators (uids) that have state in the file."""
    channel_state: bool = False
    """Whether it holds records in flight (an unaligned checkpoint, a loop)."""
    channels: dict[str, dict[str, int]] | None = None
    """The subtask's records per channel when it snapshotted (``runtime/verify.py``):
    ``sent`` (per output channel, before the barrier), ``received`` (per input channel, before
    the snapshot), ``recorded_inputs`` and ``recorded_outputs`` (records in its channel state).
    ``None`` in checkpoints of older versions."""

    @property
    def shared(self) -> list[SegmentRef]:
        return [ref for ref in self.segments if ref.shared]

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size": self.size,
            "sha256": self.sha256,
            "generation": self.generation,
            "segments": [ref.to_dict() for ref in self.segments],
            "operators": list(self.operators),
            "channel_state": self.channel_state,
            **({"channels": self.channels} if self.channels is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StateHandle:
        handle = cls(
            path=str(data["path"]),
            size=int(data["size"]),
            sha256=str(data["sha256"]),
            generation=int(data["generation"]),
            segments=tuple(SegmentRef.from_dict(r) for r in data.get("segments", ())),
            operators=tuple(str(u) for u in data.get("operators", ())),
            channel_state=bool(data.get("channel_state", False)),
            channels=_channel_counts(data.get("channels")),
        )
        prefix = f"g{handle.generation}-"
        if not (
            handle.path.startswith(prefix)
            and handle.path.endswith(".state")
            and _SAFE_NAME.fullmatch(handle.path)
        ):
            raise ValueError(f"state path {handle.path!r} is not a state file of this checkpoint")
        for ref in handle.segments:
            check_segment_path(ref.path)
        return handle


COUNTS = ("sent", "received", "recorded_inputs", "recorded_outputs")


def _channel_counts(data: Any) -> dict[str, dict[str, int]] | None:
    """The ``channels`` of a handle, checked: four maps of channel id -> record count."""
    if data is None:
        return None
    if not isinstance(data, Mapping) or set(data) != set(COUNTS):
        raise ValueError(f"channel counts {data!r} are not {', '.join(COUNTS)}")
    counts: dict[str, dict[str, int]] = {}
    for kind in COUNTS:
        values = data[kind]
        if not isinstance(values, Mapping) or not all(
            type(n) is int and n >= 0 for n in values.values()
        ):
            raise ValueError(f"channel counts {kind!r} are not counts of records per channel")
        counts[kind] = {str(c): int(n) for c, n in values.items()}
    return counts


def check_segment_path(path: str) -> str:
    """``path`` if it names a segment of a checkpoint (its own, or in the shared folder)."""
    name = path[len(SHARED_PREFIX) :] if path.startswith(SHARED_PREFIX) else path
    if not (name.endswith(".seg") and _SAFE_NAME.fullmatch(name)):
        raise ValueError(f"segment path {path!r} is not a segment of a checkpoint")
    return path


@dataclass(frozen=True)
class CheckpointMetadata:
    """What makes a checkpoint complete: every subtask's handle, plus the job's own facts."""

    checkpoint_id: int
    generation: int
    handles: dict[str, StateHandle]
    """Subtask name -> its state handle."""
    extra: dict[str, Any]
    """Anything the job records with the checkpoint (timestamps, operator ids, ...)."""

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "format": FORMAT_VERSION,
                "checkpoint_id": self.checkpoint_id,
                "generation": self.generation,
                "handles": {task: h.to_dict() for task, h in sorted(self.handles.items())},
                "extra": self.extra,
            },
            sort_keys=True,
            indent=1,
        ).encode()


@dataclass(frozen=True)
class Skipped:
    """A complete-looking checkpoint that :meth:`CheckpointStorage.latest` passed over."""

    checkpoint_id: int
    reason: str
    """Why, as a sentence naming the checkpoint ("checkpoint 3 is damaged: ...")."""


class CheckpointStorage:
    """The checkpoints of one job under ``url`` (a local path or an fsspec URL)."""

    def __init__(self, url: str, *, storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = url
        try:
            self.fs, self.root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        except (ValueError, ImportError) as exc:
            raise StorageError(f"checkpoint directory {url!r}: {exc}") from None
        self.root = self.root.rstrip("/") or "/"

    # -------------------------------------------------------------------- paths

    def checkpoint_path(self, checkpoint_id: int) -> str:
        return f"{self.root}/chk-{checkpoint_id}"

    def _names_in(self, folder: str, what: str) -> list[str]:
        """The names (without the path) of what ``folder`` holds, sorted; none when it does not
        exist yet. A folder that cannot be listed raises :class:`StorageError` naming it as
        ``what`` ("the shared folder") and where it is."""
        try:
            paths = self.fs.ls(folder, detail=False) if self.fs.exists(folder) else []
        except OSError as exc:
            raise StorageError(
                f"cannot list {what} {self._where(folder)}: {exc.strerror or exc}"
            ) from exc
        return sorted(str(path).rstrip("/").rsplit("/", 1)[-1] for path in paths)

    def _where(self, path: str) -> str:
        """``path`` as the user would write it (with the URL's protocol)."""
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        return path if protocol in ("file", "local") else f"{protocol}://{path.lstrip('/')}"

    # ------------------------------------------------------------------- writing

    def write_state(
        self, checkpoint_id: int, subtask: str, generation: int, data: bytes
    ) -> StateHandle:
        """Store one subtask's state for ``checkpoint_id`` and return its handle."""
        if _SAFE_NAME.fullmatch(subtask) is None:
            raise ValueError(f"subtask name {subtask!r} is not usable as a file name")
        name = f"g{generation}-{subtask}.state"
        folder = self.checkpoint_path(checkpoint_id)
        self._write_file(folder, name, data, f"state of {subtask} for checkpoint {checkpoint_id}")
        return StateHandle(name, len(data), hashlib.sha256(data).hexdigest(), generation)

    def _write_file(self, folder: str, name: str, data: bytes, what: str) -> None:
        """Write ``data`` to ``folder/name``, synced to the disk; a clear error naming it."""
        path = f"{folder}/{name}"
        try:
            self.fs.makedirs(folder, exist_ok=True)
            with self.fs.open(path, "wb") as out:
                out.write(data)
                _sync(out)
        except OSError as exc:
            raise StorageError(
                f"cannot write {what} to {self._where(path)}: {exc.strerror or exc}"
            ) from exc

    def url_of(self, path: str) -> str:
        """``path`` (on this storage's file system) as a URL or local path."""
        return self._where(path)

    def move_checkpoint(self, checkpoint_id: int, target: str) -> None:
        """Move the folder of ``checkpoint_id`` to ``target`` (a path on the same file system,
        which must not exist): a savepoint leaves the checkpoint directory."""
        source = self.checkpoint_path(checkpoint_id)
        try:
            if self.fs.exists(target):
                raise StorageError(f"{self._where(target)} already exists")
            parent = target.rstrip("/").rsplit("/", 1)[0]
            self.fs.makedirs(parent, exist_ok=True)
            self.fs.mv(source, target, recursive=True)
        except OSError as exc:
            raise StorageError(
                f"cannot move checkpoint {checkpoint_id} to {self._where(target)}: "
                f"{exc.strerror or exc}"
            ) from exc

    def remove_folder(self, path: str) -> None:
        """Remove ``path`` and everything in it (quiet when it is not there)."""
        try:
            if self.fs.exists(path):
                self.fs.rm(path, recursive=True)
        except OSError as exc:
            raise StorageError(f"cannot remove {self._where(path)}: {exc.strerror or exc}") from exc

    def replace_file(self, folder: str, name: str, data: bytes, what: str) -> None:
        """Write ``data`` to ``folder/name`` atomically: under a temporary name in the same
        folder (synced to the disk), then renamed to ``name``. If anything fails, the
        temporary file is removed and a file ``name`` that was there stays as it was; the
        :class:`StorageError` names ``folder/name`` and ``what`` it is."""
        final = f"{folder}/{name}"
        temporary = f"{folder}/.{name}.{uuid.uuid4().hex}.tmp"
        try:
            self.fs.makedirs(folder, exist_ok=True)
            with self.fs.open(temporary, "wb") as out:
                out.write(data)
                _sync(out)  # on a local disk: the bytes are there before the name is
            self.fs.mv(temporary, final)
            _sync_directory(self.fs, folder)  # on a local disk: the new name survives a crash
        except OSError as exc:
            self._remove_quietly(temporary)
            raise StorageError(
                f"cannot write {what} to {self._where(final)}: {exc.strerror or exc}"
            ) from exc
        except BaseException:
            self._remove_quietly(temporary)
            raise

    def write_metadata(self, metadata: CheckpointMetadata, *, folder: str | None = None) -> None:
        """Complete a checkpoint: write its metadata under a temporary name, then rename it
        (in ``folder``: a savepoint's, instead of the checkpoint's own)."""
        folder = folder or self.checkpoint_path(metadata.checkpoint_id)
        what = f"the metadata of checkpoint {metadata.checkpoint_id}"
        self.replace_file(folder, METADATA, metadata.to_json(), what)

    def write_segment(
        self, checkpoint_id: int, name: str, data: bytes, *, shared: bool
    ) -> SegmentRef:
        """Store a keyed state segment of ``checkpoint_id``: in the checkpoint's folder, or
        (``shared``) in the shared folder, named from it as ``../shared/NAME``."""
        if _SAFE_NAME.fullmatch(name) is None or not name.endswith(".seg"):
            raise ValueError(f"segment name {name!r} is not usable as a file name")
        folder = f"{self.root}/{SHARED}" if shared else self.checkpoint_path(checkpoint_id)
        self._write_file(folder, name, data, f"state of checkpoint {checkpoint_id}")
        relative = SHARED_PREFIX + name if shared else name
        return SegmentRef(relative, len(data), hashlib.sha256(data).hexdigest(), False)

    def segment_store(self, checkpoint_id: int) -> _SegmentWriter:
        """What a subtask's keyed snapshots of ``checkpoint_id`` write their segments to."""
        return _SegmentWriter(self, checkpoint_id)

    def shared_files(self) -> list[str]:
        """Every file in the shared folder, as ``../shared/NAME``."""
        names = self._names_in(f"{self.root}/{SHARED}", "the shared folder")
        return [SHARED_PREFIX + name for name in names]

    def remove_shared(self, path: str) -> None:
        """Delete a shared file (``../shared/NAME``); quiet when it is already gone."""
        check_segment_path(path)
        if not path.startswith(SHARED_PREFIX):
            raise ValueError(f"{path!r} is not a shared file")
        full = f"{self.root}/{SHARED}/{path[len(SHARED_PREFIX) :]}"
        try:
            self.fs.rm(full)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StorageError(f"cannot remove {self._where(full)}: {exc.strerror or exc}") from exc

    # ---------------------------------------------------------------- statistics

    def write_stats(self, record: CheckpointStats | RestartInfo | RunInfo) -> None:
        """Keep ``record`` in the statistics folder (``_stats``; see ``runtime/stats.py``)."""
        if isinstance(record, CheckpointStats):
            name = stats_file(record.checkpoint_id)
        elif isinstance(record, RestartInfo):
            name = f"restart-{record.run}-{record.generation}.json"
        else:
            name = f"run-{record.run}.json"
        # atomically: a full disk must not leave an empty or partial file (nor spoil an older
        # one: a run's record is written again when it ends)
        self.replace_file(f"{self.root}/{STATS_FOLDER}", name, encode(record), "statistics")

    def _stats_names(self) -> list[str]:
        return self._names_in(f"{self.root}/{STATS_FOLDER}", "the statistics folder")

    def stats_checkpoint_ids(self) -> list[int]:
        """Ids of the checkpoints with statistics (also those whose folders are gone)."""
        return checkpoint_ids_in(self._stats_names())

    def prune_stats(self, keep: int = STATS_HISTORY) -> None:
        """Remove all but the newest ``keep`` checkpoint statistics files."""
        ids = self.stats_checkpoint_ids()
        for checkpoint_id in ids[: max(0, len(ids) - keep)]:
            self._remove_quietly(f"{self.root}/{STATS_FOLDER}/{stats_file(checkpoint_id)}")

    def read_history(self) -> History:
        """Every record of the statistics folder (unreadable files are named in
        ``History.unreadable``, not raised)."""
        folder = f"{self.root}/{STATS_FOLDER}"
        files: dict[str, bytes] = {}
        for name in self._stats_names():
            if name.endswith(".json"):
                try:
                    with self.fs.open(f"{folder}/{name}", "rb") as source:
                        files[name] = source.read()
                except OSError as exc:
                    raise StorageError(
                        f"cannot read {self._where(f'{folder}/{name}')}: {exc.strerror or exc}"
                    ) from exc
        return history_of(files)

    # ------------------------------------------------------------------- reading

    def checkpoint_ids(self) -> list[int]:
        """Ids of every checkpoint folder, complete or not, in increasing order."""
        ids = []
        for name in self._names_in(self.root, "the checkpoint directory"):
            match = _CHECKPOINT_DIR.fullmatch(name)
            if match:
                ids.append(int(match.group(1)))
        return sorted(ids)

    def is_complete(self, checkpoint_id: int) -> bool:
        """Whether the checkpoint's metadata was written (it may still be corrupt)."""
        return bool(self.fs.exists(f"{self.checkpoint_path(checkpoint_id)}/{METADATA}"))

    def completed_ids(self) -> list[int]:
        """Ids of the checkpoints with metadata, in increasing order."""
        return [c for c in self.checkpoint_ids() if self.is_complete(c)]

    def completed_without_metadata(self) -> list[int]:
        """Ids of the ``chk-N`` folders without metadata whose statistics say the checkpoint
        completed, in increasing order: their ``_metadata`` was lost after the fact (deleted,
        a damaged file system). They are never restored from, but they are not a checkpoint in
        progress or an aborted one either: keep them, and say so
        (:meth:`missing_metadata_reason`). A folder whose statistics are missing, unreadable,
        or say it was aborted or is a savepoint, is not one of them."""
        return self._lost([c for c in self.checkpoint_ids() if not self.is_complete(c)])

    def _lost(self, incomplete: list[int]) -> list[int]:
        """Those of the ``incomplete`` ids (folders without metadata) whose statistics say
        they completed, and which were not being discarded (:meth:`discard` marks a folder
        before it removes anything: a removal cut short leaves such a folder)."""
        return [
            c
            for c in incomplete
            if self._stats_say_completed(c)
            and not self.fs.exists(f"{self.checkpoint_path(c)}/{DISCARDING}")
        ]

    def _stats_say_completed(self, checkpoint_id: int) -> bool:
        """Whether the statistics file of ``checkpoint_id`` says it completed (a savepoint's
        does not count: its metadata is in its own folder)."""
        record = self.checkpoint_stats(checkpoint_id)
        return record is not None and record.completed and not record.savepoint

    def checkpoint_stats(self, checkpoint_id: int) -> CheckpointStats | None:
        """The statistics of ``checkpoint_id`` (a checkpoint's or a savepoint's), ``None`` if
        there are none or they are damaged (`cutline checkpoints list` names those)."""
        name = stats_file(checkpoint_id)
        path = f"{self.root}/{STATS_FOLDER}/{name}"
        try:
            with self.fs.open(path, "rb") as source:
                data = source.read()
        except (FileNotFoundError, *_DAMAGED):
            return None
        except OSError as exc:
            raise StorageError(f"cannot read {self._where(path)}: {exc.strerror or exc}") from exc
        try:
            record = decode(name, data)
        except ValueError:
            return None
        if isinstance(record, CheckpointStats) and record.checkpoint_id == checkpoint_id:
            return record
        return None

    def missing_metadata_reason(self, checkpoint_id: int) -> str:
        """What is wrong with a checkpoint of :meth:`completed_without_metadata`."""
        where = self._where(f"{self.checkpoint_path(checkpoint_id)}/{METADATA}")
        return (
            f"checkpoint {checkpoint_id} is incomplete: its {METADATA} is missing, though its "
            f"statistics say it completed ({where} does not exist)"
        )

    def location(self, checkpoint_id: int) -> CheckpointLocation:
        """The folder of checkpoint ``checkpoint_id``, to read it."""
        return CheckpointLocation(self.fs, self.checkpoint_path(checkpoint_id), self._where)

    def read_metadata(self, checkpoint_id: int) -> CheckpointMetadata:
        """The metadata of a complete checkpoint; :class:`CorruptCheckpointError` if it is
        missing or unreadable."""
        return self.location(checkpoint_id).read_metadata(checkpoint_id)

    def read_state(self, checkpoint_id: int, handle: StateHandle) -> bytes:
        """One subtask's state, checked against its handle's size and digest."""
        return self.location(checkpoint_id).read_state(handle)

    def checked_metadata(self, checkpoint_id: int) -> CheckpointMetadata:
        """Read the metadata and check every file it names; raise if anything is off."""
        return self.location(checkpoint_id).checked_metadata(checkpoint_id)

    def latest(
        self, *, check_files: bool = True, since: int = 0, run: str | None = None
    ) -> tuple[CheckpointMetadata | None, list[Skipped]]:
        """The newest complete checkpoint that is intact, and the newer ones passed over (with
        the reason each was skipped, to warn about).

        Only a checkpoint that is damaged (missing or altered files, invalid metadata) is
        skipped; so is, newer than the one returned, a folder that lost its metadata though
        its statistics say it completed (:meth:`completed_without_metadata`). An I/O error
        that may pass raises :class:`StorageError` instead: restoring an older checkpoint
        than the newest complete one would replay output the sinks may already have
        published.

        ``since``: only checkpoints with an id of at least this (those of one run of a job).
        ``run``: a checkpoint written by another run is skipped too (another job wrote into
        this directory: its state is not this job's).
        """
        skipped: list[Skipped] = []
        ids = [c for c in self.checkpoint_ids() if c >= since]
        complete = {c for c in ids if self.is_complete(c)}
        lost = set(self._lost([c for c in ids if c not in complete]))
        for checkpoint_id in sorted(complete | lost, reverse=True):
            if checkpoint_id in lost:
                skipped.append(Skipped(checkpoint_id, self.missing_metadata_reason(checkpoint_id)))
                continue
            try:
                metadata = (
                    self.checked_metadata(checkpoint_id)
                    if check_files
                    else self.read_metadata(checkpoint_id)
                )
            except CorruptCheckpointError as exc:
                skipped.append(
                    Skipped(checkpoint_id, f"checkpoint {checkpoint_id} is damaged: {exc}")
                )
                continue
            writer = metadata.extra.get("run")
            if run is not None and writer != run:
                skipped.append(
                    Skipped(
                        checkpoint_id,
                        f"checkpoint {checkpoint_id} was written by run {writer}, not by this "
                        f"run ({run}): another job wrote into this checkpoint directory",
                    )
                )
                continue
            return metadata, skipped
        return None, skipped

    # ----------------------------------------------------------------- removing

    def discard(self, checkpoint_id: int) -> None:
        """Remove a checkpoint's folder and everything in it, marked first as being discarded
        (a removal cut short must not look like a checkpoint that lost its metadata)."""
        path = self.checkpoint_path(checkpoint_id)
        try:
            if self.fs.exists(path):
                with contextlib.suppress(OSError):
                    self.fs.touch(f"{path}/{DISCARDING}")
                self.fs.rm(path, recursive=True)
        except OSError as exc:
            raise StorageError(
                f"cannot remove checkpoint {checkpoint_id} at {self._where(path)}: "
                f"{exc.strerror or exc}"
            ) from exc

    def discard_state(self, checkpoint_id: int, handle: StateHandle) -> None:
        """Remove one state file (a late acknowledgement of an aborted checkpoint); quiet when
        it is already gone."""
        path = f"{self.checkpoint_path(checkpoint_id)}/{handle.path}"
        try:
            self.fs.rm(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StorageError(
                f"cannot remove state file {self._where(path)}: {exc.strerror or exc}"
            ) from exc

    def _remove_quietly(self, path: str) -> None:
        try:
            if self.fs.exists(path):
                self.fs.rm(path)
        except OSError:
            pass


class _SegmentWriter:
    """A :class:`~cutline.runtime.state.segments.SegmentStore` that writes one checkpoint's segments."""

    def __init__(self, storage: CheckpointStorage, checkpoint_id: int) -> None:
        self.storage, self.checkpoint_id = storage, checkpoint_id
        self.written = 0
        """Bytes of the segments written through it."""

    def write_segment(self, name: str, data: bytes, *, shared: bool) -> SegmentRef:
        ref = self.storage.write_segment(self.checkpoint_id, name, data, shared=shared)
        self.written += len(data)
        return ref

    def read_segment(self, ref: SegmentRef) -> bytes:
        return self.storage.location(self.checkpoint_id).read_segment(ref)


class CheckpointLocation:
    """The folder of one checkpoint or savepoint (anywhere), to read it: its metadata, its
    subtasks' state files and its segments, each checked against what the metadata says.

    It is also the :class:`~cutline.runtime.state.segments.SegmentStore` a restore reads from."""

    def __init__(self, fs: Any, folder: str, where: Any = None) -> None:
        self.fs = fs
        self.folder = folder.rstrip("/")
        self._where = where or (lambda path: path)

    @classmethod
    def open(
        cls, url: str, *, storage_options: Mapping[str, Any] | None = None
    ) -> CheckpointLocation:
        try:
            fs, folder = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        except (ValueError, ImportError) as exc:
            raise StorageError(f"checkpoint {url!r}: {exc}") from None
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]

        def where(path: str) -> str:
            return path if protocol in ("file", "local") else f"{protocol}://{path.lstrip('/')}"

        return cls(fs, folder, where)

    @property
    def url(self) -> str:
        return str(self._where(self.folder))

    def _read(self, path: str, what: str) -> bytes:
        where = self._where(path)
        try:
            with self.fs.open(path, "rb") as source:
                data: bytes = source.read()
        except FileNotFoundError:
            raise CorruptCheckpointError(f"{what} {where} is missing") from None
        except _DAMAGED as exc:
            raise CorruptCheckpointError(f"cannot read {where}: {exc.strerror or exc}") from exc
        except OSError as exc:  # maybe passing (EIO, a throttled store): never skip on it
            raise StorageError(f"cannot read {where}: {exc.strerror or exc}") from exc
        return data

    def read_metadata(self, checkpoint_id: int | None = None) -> CheckpointMetadata:
        """The metadata; :class:`CorruptCheckpointError` if it is missing or unreadable (or,
        given ``checkpoint_id``, describes another checkpoint)."""
        path = f"{self.folder}/{METADATA}"
        where = self._where(path)
        if not self._exists(path):
            if checkpoint_id is None:
                raise CorruptCheckpointError(
                    f"{self._where(self.folder)} is not a complete checkpoint or savepoint: "
                    f"{where} does not exist"
                ) from None
            raise CorruptCheckpointError(
                f"checkpoint {checkpoint_id} is incomplete: {where} does not exist"
            )
        raw = self._read(path, "checkpoint metadata")
        try:
            data = json.loads(raw)
            if data.get("format") == 1:
                raise ValueError(
                    "it was written by an older version of cutline (format 1), whose "
                    "checkpoints this version cannot restore"
                )
            if type(data.get("format")) is not int or data["format"] != FORMAT_VERSION:
                raise ValueError(f"unknown format {data.get('format')!r}")
            if type(data["checkpoint_id"]) is not int or (
                checkpoint_id is not None and data["checkpoint_id"] != checkpoint_id
            ):
                raise ValueError(f"it describes checkpoint {data['checkpoint_id']}")
            return CheckpointMetadata(
                checkpoint_id=data["checkpoint_id"],
                generation=int(data["generation"]),
                handles={
                    str(task): StateHandle.from_dict(h) for task, h in data["handles"].items()
                },
                extra=dict(data.get("extra", {})),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptCheckpointError(
                f"{where} is not valid checkpoint metadata: {exc}"
            ) from None

    def _exists(self, path: str) -> bool:
        try:
            return bool(self.fs.exists(path))
        except OSError as exc:
            raise StorageError(f"cannot read {self._where(path)}: {exc.strerror or exc}") from exc

    def read_state(self, handle: StateHandle) -> bytes:
        """One subtask's state file, checked against its handle's size and digest."""
        path = f"{self.folder}/{handle.path}"
        data = self._read(path, "state file")
        self._check(path, data, handle.size, handle.sha256)
        return data

    def read_segment(self, ref: SegmentRef) -> bytes:
        """A keyed state segment, checked against its size and digest."""
        path = self._segment_path(ref)
        data = self._read(path, "state segment")
        self._check(path, data, ref.size, ref.sha256, "state segment")
        return data

    def _segment_path(self, ref: SegmentRef) -> str:
        try:
            check_segment_path(ref.path)
        except ValueError as exc:
            raise StateError(str(exc)) from None
        return posixpath.normpath(f"{self.folder}/{ref.path}")

    def _check(
        self, path: str, data: bytes, size: int, sha256: str, what: str = "state file"
    ) -> None:
        where = self._where(path)
        if len(data) != size:
            raise CorruptCheckpointError(
                f"{what} {where} has {len(data)} bytes, the metadata says {size}"
            )
        if hashlib.sha256(data).hexdigest() != sha256:
            raise CorruptCheckpointError(
                f"{what} {where} does not match the digest in the metadata"
            )

    def checked_metadata(self, checkpoint_id: int | None = None) -> CheckpointMetadata:
        """The metadata, once every state file it names is intact (size and digest) and every
        segment is there with its size (segments are read whole, and their digests checked,
        when restored)."""
        metadata = self.read_metadata(checkpoint_id)
        for handle in metadata.handles.values():
            self.read_state(handle)
            for ref in handle.segments:
                path = self._segment_path(ref)
                where = self._where(path)
                try:
                    size = self.fs.size(path)
                except FileNotFoundError:
                    raise CorruptCheckpointError(f"state segment {where} is missing") from None
                except OSError as exc:
                    raise StorageError(f"cannot read {where}: {exc.strerror or exc}") from exc
                if size != ref.size:
                    raise CorruptCheckpointError(
                        f"state segment {where} has {size} bytes, the metadata says {ref.size}"
                    )
        return metadata
