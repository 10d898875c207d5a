"""Reading what a checkpoint holds: its operators' state, keyed state entry by entry, and
the records in flight it recorded (channel state).

:class:`CheckpointReader` opens one checkpoint or savepoint folder (or a checkpoint
directory's ``chk-N``) and reads only what is asked, one subtask's files at a time, each
checked against the metadata's size and digest. The CLI (``cutline checkpoints show``,
``diff``), the Spark data source (``spark/datasource/``) and the verifier use it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from cutline.runtime.checkpoint.layout import (
    CheckpointMetadata,
    CorruptCheckpointError,
    StateHandle,
    StorageError,
)
from cutline.runtime.checkpoint.location import CheckpointLocation
from cutline.runtime.checkpoint.state_file import DEAD_LETTERS, SubtaskState
from cutline.runtime.checkpoint.storage import CheckpointStorage
from cutline.runtime.eventtime.layouts import (
    WINDOWS,
    columnar_size,
    columns_as_keyed,
    read_session_rows,
    read_windows,
    session_rows_as_windows,
)
from cutline.runtime.network.wire import Watermark, WatermarkStatus, recorded_records
from cutline.runtime.state.backend import KEYED_FORMAT
from cutline.runtime.state.columns import handle_segments
from cutline.runtime.state.keygroups import StateError, key_group
from cutline.runtime.state.memory import MemoryStateBackend


class InspectError(Exception):
    """What was asked of a checkpoint cannot be answered (the message says why)."""


@dataclass(frozen=True)
class OperatorState:
    """One operator's state in a checkpoint."""

    uid: str
    name: str
    kind: str
    """``keyed`` (keyed state), ``source`` (offsets), ``sink`` (pending output),
    ``dead letters``, or ``operator`` (any other state)."""
    subtasks: tuple[str, ...]
    """The subtasks holding part of it."""
    size: int
    """Bytes of its keyed state segments (named by the checkpoint, incl. shared ones), and of
    the windows a window operator keeps as columns (in the state files); for other state, 0
    (it is inside the subtasks' state files)."""


@dataclass(frozen=True)
class KeyedEntry:
    """One key's value of one keyed state."""

    subtask: str
    key_group: int
    state: str
    """The state's name (``ValueState`` / ``ListState`` / ``MapState``)."""
    kind: str
    """``value``, ``list`` or ``map``."""
    key: Hashable
    value: Any


@dataclass(frozen=True)
class ChannelRecord:
    """One record of the channel state: in flight on ``channel`` when the checkpoint was taken."""

    subtask: str
    side: str
    """``input`` (recorded by the receiver) or ``output`` (overtaken at the sender)."""
    channel: str
    position: int
    """Its place among the records recorded on that side of the channel (0 first)."""
    record: Any


def open_checkpoint(
    url: str, checkpoint_id: int | None = None, *, storage_options: Mapping[str, Any] | None = None
) -> CheckpointReader:
    """A reader of checkpoint ``checkpoint_id`` of the checkpoint directory ``url``; without an
    id, ``url`` is a checkpoint or savepoint folder (with ``_metadata``), or a checkpoint
    directory (its newest complete checkpoint)."""
    if checkpoint_id is not None:
        storage = _directory(url, storage_options)
        if checkpoint_id not in storage.checkpoint_ids():
            known = storage.completed_ids()
            raise InspectError(
                f"{url} has no checkpoint {checkpoint_id} (complete ones there: "
                f"{', '.join(map(str, known)) or 'none'}; older ones were discarded, their "
                "statistics remain: `cutline checkpoints list`)"
            )
        return CheckpointReader(storage.location(checkpoint_id), checkpoint_id)
    location = CheckpointLocation.open(url, storage_options=storage_options)
    if location.fs.exists(f"{location.folder}/_metadata"):
        return CheckpointReader(location)
    storage = _directory(url, storage_options)
    completed = storage.completed_ids()
    if not completed:
        raise InspectError(
            f"{url} is neither a checkpoint or savepoint folder (no _metadata) nor a "
            "checkpoint directory with complete checkpoints (chk-N/_metadata)"
        )
    return CheckpointReader(storage.location(completed[-1]), completed[-1])


def _directory(url: str, storage_options: Mapping[str, Any] | None) -> CheckpointStorage:
    storage = CheckpointStorage(url, storage_options=storage_options)
    if not storage.fs.exists(storage.root):
        raise InspectError(f"{url} does not exist")
    if not storage.fs.isdir(storage.root):
        raise InspectError(f"{url} is not a directory")
    return storage


class CheckpointReader:
    """One complete checkpoint or savepoint, to read."""

    def __init__(self, location: CheckpointLocation, checkpoint_id: int | None = None) -> None:
        self.location = location
        try:
            self.metadata: CheckpointMetadata = location.read_metadata(checkpoint_id)
        except CorruptCheckpointError as exc:
            raise InspectError(str(exc)) from None
        self._state_files: dict[str, SubtaskState] = {}

    @property
    def checkpoint_id(self) -> int:
        return self.metadata.checkpoint_id

    @property
    def handles(self) -> dict[str, StateHandle]:
        return self.metadata.handles

    def operator_names(self) -> dict[str, str]:
        """Operator uid -> name (the uid, for checkpoints that did not record names)."""
        names = self.metadata.extra.get("operator_names") or {}
        uids = self.metadata.extra.get("operators") or []
        result = {str(uid): str(names.get(uid, uid)) for uid in uids}
        for handle in self.handles.values():
            for uid in handle.operators:
                result.setdefault(uid, str(names.get(uid, uid)))
        return result

    def state_file(self, subtask: str) -> SubtaskState:
        """The decoded state file of ``subtask`` (the last one read is kept)."""
        if subtask not in self._state_files:
            data = self.location.read_state(self._handle(subtask))
            self._state_files = {subtask: SubtaskState.decode(data, subtask)}
        return self._state_files[subtask]

    def operators(self) -> list[OperatorState]:
        """Every operator with state in the checkpoint (reads each subtask's state file)."""
        names = self.operator_names()
        holders: dict[str, list[str]] = {}
        for subtask, handle in sorted(self.handles.items()):
            for uid in handle.operators:
                holders.setdefault(uid, []).append(subtask)
        result = []
        kinds = self.metadata.extra.get("operator_kinds") or {}
        segments = {ref.path: ref.size for h in self.handles.values() for ref in h.segments}
        for uid, subtasks in holders.items():
            size = 0
            if uid == DEAD_LETTERS:
                kind = "dead letters"
            else:
                kind = kinds.get(uid) or self._guess_kind(subtasks[0], uid)
            if kind == "keyed":
                parts = [self.state_file(s).operators[uid] for s in subtasks]
                size = sum(
                    sum(segments.get(ref.path, 0) for ref in handle_segments(part))
                    + columnar_size(part)
                    for part in parts
                )
            result.append(OperatorState(uid, names.get(uid, uid), kind, tuple(subtasks), size))
        return sorted(result, key=lambda o: list(names).index(o.uid) if o.uid in names else 1 << 30)

    def _guess_kind(self, subtask: str, uid: str) -> str:
        """The kind of an operator's state, from the state (checkpoints without kinds)."""
        part = self.state_file(subtask).operators.get(uid)
        if isinstance(part, dict) and part.get("keyed") is not None:
            return "keyed"
        if isinstance(part, dict) and ("splits" in part or "rows" in part):
            return "source"
        return "operator"

    def resolve_operator(self, operator: str | None) -> str:
        """The uid of the keyed operator ``operator`` names (its uid or its name); without one,
        the checkpoint's only keyed operator."""
        keyed = [o for o in self.operators() if o.kind == "keyed"]
        if operator is None:
            if len(keyed) == 1:
                return keyed[0].uid
            if not keyed:
                raise InspectError(f"checkpoint {self.checkpoint_id} holds no keyed state")
            raise InspectError(
                f"checkpoint {self.checkpoint_id} holds keyed state of several operators: "
                f"name one of {', '.join(repr(o.name) for o in keyed)}"
            )
        for found in keyed:
            if operator == found.uid:
                return found.uid
        named = [found for found in keyed if found.name == operator]
        if len(named) == 1:
            return named[0].uid
        if named:
            raise InspectError(
                f"checkpoint {self.checkpoint_id} has several keyed operators named "
                f"{operator!r}: name one by its uid ({', '.join(repr(o.uid) for o in named)})"
            )
        raise InspectError(
            f"checkpoint {self.checkpoint_id} holds no keyed state of operator {operator!r} "
            f"(keyed operators: {', '.join(repr(o.name) for o in keyed) or 'none'})"
        )

    def keyed_entries(self, operator: str | None = None) -> Iterator[KeyedEntry]:
        """Every entry of the keyed state of ``operator`` (uid or name), subtask by subtask
        (one subtask's state is in memory at a time)."""
        uid = self.resolve_operator(operator)
        for subtask, handle in sorted(self.handles.items()):
            if uid in handle.operators:
                yield from self.keyed_entries_of(subtask, uid)

    def keyed_entries_of(self, subtask: str, uid: str) -> Iterator[KeyedEntry]:
        """The keyed state of operator ``uid`` in ``subtask``'s part of the checkpoint."""
        part = self.state_file(subtask).operators.get(uid)
        if not isinstance(part, dict) or part.get("keyed") != KEYED_FORMAT:
            raise InspectError(f"{subtask} holds no keyed state of {uid!r}")
        start, stop = part["key_groups"]
        backend = MemoryStateBackend(part["max_parallelism"], range(start, stop))
        try:
            backend.restore([part], self.location)
        except StateError as exc:
            raise CorruptCheckpointError(f"keyed state of {subtask}: {exc}") from None
        max_parallelism = part["max_parallelism"]
        for state, kind, key, value in backend.entries():
            yield KeyedEntry(subtask, key_group(key, max_parallelism), state, kind, key, value)
        # the windows a window operator keeps as columns (the memory backend's), shown as the
        # keyed layout keeps them (runtime/eventtime/layouts.py)
        columnar: dict[Hashable, Any] = columns_as_keyed(read_windows(part, self.location))
        sessions = read_session_rows(part, self.location)
        if sessions is not None:
            columnar = session_rows_as_windows(sessions)
        for key, value in columnar.items():
            group = key_group(key, max_parallelism)
            yield KeyedEntry(subtask, group, WINDOWS, "value", key, value)

    def _handle(self, subtask: str) -> StateHandle:
        handle = self.handles.get(subtask)
        if handle is None:
            raise InspectError(
                f"checkpoint {self.checkpoint_id} has no subtask {subtask!r} (it has "
                f"{', '.join(sorted(self.handles))})"
            )
        return handle

    def channel_state(self, subtask: str | None = None) -> Iterator[ChannelRecord]:
        """Every record of the recorded channel state (of one subtask, or of all)."""
        if subtask is not None:
            self._handle(subtask)
        names = [subtask] if subtask is not None else sorted(self.handles)
        for name in names:
            if not self.handles[name].channel_state:
                continue
            state = self.state_file(name)
            for side, recorded in (("input", state.inputs), ("output", state.outputs)):
                for channel, batches in sorted(recorded.items()):
                    position = 0
                    for batch in batches:
                        for record in _records(batch):
                            yield ChannelRecord(name, side, channel, position, record)
                            position += 1

    def recorded_counts(self, subtask: str) -> tuple[dict[str, int], dict[str, int]]:
        """Records per channel in ``subtask``'s channel state: (inputs, outputs), read from its
        state file."""
        if not self._handle(subtask).channel_state:
            return {}, {}
        state = self.state_file(subtask)
        inputs, outputs = (
            {str(c): recorded_records(batches) for c, batches in side.items() if batches}
            for side in (state.inputs, state.outputs)
        )
        return inputs, outputs


def _records(batch: Any) -> Iterator[Any]:
    """The records of a recorded batch: dicts for a columnar (Arrow) batch."""
    if isinstance(batch, Watermark | WatermarkStatus):
        return  # (event time's progress, recorded in order with the records: not a record)
    if hasattr(batch, "to_pylist"):
        yield from batch.to_pylist()
    else:
        yield from batch


__all__ = [
    "ChannelRecord",
    "CheckpointReader",
    "InspectError",
    "KeyedEntry",
    "OperatorState",
    "StorageError",
    "open_checkpoint",
]
