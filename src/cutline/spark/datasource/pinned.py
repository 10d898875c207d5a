"""The checkpoint a read is about, as the driver finds it and as the executors find it again.

The driver resolves what the user named (a checkpoint directory's newest complete checkpoint,
say) to one folder and one checkpoint id: a :class:`Pinned`. That small, picklable value is
what travels to the executors, and each of them opens the folder again and checks that it
still holds the same checkpoint, so that every partition of one DataFrame reads one
consistent cut even if a newer checkpoint completes meanwhile.

:func:`readable` is the one place where a storage error (a damaged or unreadable file)
becomes the :class:`~cutline.runtime.checkpoint.reader.InspectError` the user sees.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from cutline.runtime.checkpoint.layout import StorageError
from cutline.runtime.checkpoint.reader import CheckpointReader, InspectError, open_checkpoint


@contextlib.contextmanager
def readable(what: str) -> Iterator[None]:
    """Turn storage errors (a damaged or unreadable file) into :class:`InspectError`; ``what``
    names the checkpoint (and the subtask) in the message."""
    try:
        yield
    except InspectError:
        raise
    except StorageError as exc:
        raise InspectError(f"cannot read the checkpoint {what}: {exc}") from None


@dataclass(frozen=True)
class Pinned:
    """One checkpoint, as the executors find it again: its folder and its id."""

    folder: str
    checkpoint_id: int
    storage_options: dict[str, Any] | None

    @classmethod
    def of(cls, reader: CheckpointReader, storage_options: dict[str, Any] | None) -> Pinned:
        """The checkpoint ``reader`` opened, read with the fsspec ``storage_options``."""
        return cls(reader.location.url, reader.checkpoint_id, storage_options)

    def open(self) -> CheckpointReader:
        """Open the folder again; :class:`InspectError` if it now holds another checkpoint."""
        with readable(self.folder):
            reader = open_checkpoint(self.folder, storage_options=self.storage_options)
        if reader.checkpoint_id != self.checkpoint_id:
            raise InspectError(
                f"{self.folder} now holds checkpoint {reader.checkpoint_id}, not checkpoint "
                f"{self.checkpoint_id} the DataFrame was made from"
            )
        return reader


def keyed_subtasks(reader: CheckpointReader, uid: str) -> list[str]:
    """The subtasks holding part of operator ``uid``'s state (from the metadata)."""
    return sorted(s for s, handle in reader.handles.items() if uid in handle.operators)


def channel_subtasks(reader: CheckpointReader) -> tuple[str, ...]:
    """The subtasks that recorded channel state (from the metadata)."""
    return tuple(sorted(s for s, handle in reader.handles.items() if handle.channel_state))
