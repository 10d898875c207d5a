"""Reading one checkpoint or savepoint folder, wherever it is: :class:`CheckpointLocation`.

A restore, the reader, the verifier and the CLI read a checkpoint through it: its metadata
(refused when it is of another format or describes another checkpoint), its subtasks' state
files and its keyed state segments, each checked against the size and SHA-256 the metadata
gives (the layout and the metadata are ``layout.py``'s). What is missing or altered is a
:class:`~cutline.runtime.checkpoint.layout.CorruptCheckpointError` naming the file; an I/O
error that may pass (EIO, a throttled store) is a
:class:`~cutline.runtime.checkpoint.layout.StorageError` instead, so that no caller mistakes
it for a damaged checkpoint and skips to an older one.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Mapping
from typing import Any

import fsspec

from cutline.runtime.checkpoint.layout import (
    DAMAGED,
    FORMAT_VERSION,
    METADATA,
    CheckpointMetadata,
    CorruptCheckpointError,
    StateHandle,
    StorageError,
    check_segment_path,
)
from cutline.runtime.state.keygroups import StateError
from cutline.runtime.state.segments import SegmentRef


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
        except DAMAGED as exc:
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
