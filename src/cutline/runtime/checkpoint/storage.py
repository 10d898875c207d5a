"""Checkpoint storage: the checkpoints of one job in a directory, local or any fsspec URL.

:class:`CheckpointStorage` writes a checkpoint directory (laid out as ``layout.py`` says):
each subtask's state file and keyed state segments, then the metadata that completes the
checkpoint; the statistics of every checkpoint, restart and run; and it lists, finds,
moves and removes checkpoints. Reading one checkpoint's folder is
:class:`~cutline.runtime.checkpoint.location.CheckpointLocation`'s, which it hands out
(:meth:`CheckpointStorage.location`).

The metadata and the statistics files are written to a temporary name and then
renamed: on a local disk the rename is atomic; on object stores a single object
write is. A torn write leaves no such file behind, and never spoils an older one.

:meth:`CheckpointStorage.latest` finds the newest complete checkpoint that is intact, falls
back to the previous complete one when it is not, and says why. A ``chk-N`` folder without
``_metadata`` is a checkpoint in progress or one that was aborted, unless its statistics say
it **completed**: then its metadata was lost (deleted by hand, a damaged file system) and
:meth:`CheckpointStorage.latest` names it among the checkpoints it skipped
(:meth:`CheckpointStorage.completed_without_metadata` lists such ids).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import fsspec

from cutline.runtime.checkpoint.layout import (
    DAMAGED,
    DISCARDING,
    METADATA,
    SAFE_NAME,
    SHARED,
    CheckpointMetadata,
    CorruptCheckpointError,
    StateHandle,
    StorageError,
    check_segment_path,
)
from cutline.runtime.checkpoint.location import CheckpointLocation
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
from cutline.runtime.state.segments import SHARED_PREFIX, SegmentRef

_CHECKPOINT_DIR = re.compile(r"chk-(0|[1-9][0-9]*)")


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
        if SAFE_NAME.fullmatch(subtask) is None:
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
        if SAFE_NAME.fullmatch(name) is None or not name.endswith(".seg"):
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
        except (FileNotFoundError, *DAMAGED):
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
