"""How a checkpoint directory is laid out, and the metadata that makes a checkpoint complete.

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

A keyed operator's state is a chain of **segments** (``runtime/state/segments.py``): with
incremental checkpoints they go to ``shared/`` and a checkpoint names the ones it
needs as ``../shared/NAME``; otherwise, and always for a savepoint, they are the
checkpoint's own files. A folder that names no shared file is self-contained: it
can be moved or copied anywhere and restored from there (a savepoint is such a folder).

Every state file is named after the *generation* (the restart attempt) that
wrote it, and the metadata (:class:`CheckpointMetadata`) lists, for every subtask, its
:class:`StateHandle`: the file with its size and SHA-256, and the segments it names. A
restore reads only files the metadata names, and checks their size and digest, so a file
left by a stale attempt, a torn write or a flipped bit is refused with an error that names
the file (:class:`CorruptCheckpointError`). Writing the directory is ``storage.py``'s;
reading one checkpoint's folder is ``location.py``'s.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cutline.runtime.state.segments import SHARED_PREFIX, SegmentRef

METADATA = "_metadata"
DISCARDING = "_discarding"
"""The mark ``CheckpointStorage.discard`` (``storage.py``) leaves in a folder before removing it."""
FORMAT_VERSION = 2
"""2: handles name their segments and the operators with state (cutline 0.1 with issue 5)."""
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
"""What a state file's or a segment's name may be (no path, nothing hidden)."""
SHARED = "shared"


DAMAGED = (IsADirectoryError, NotADirectoryError)
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
            and SAFE_NAME.fullmatch(handle.path)
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
    if not (name.endswith(".seg") and SAFE_NAME.fullmatch(name)):
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
