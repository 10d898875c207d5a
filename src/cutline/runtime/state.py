"""Keyed state of one operator subtask: value, list and map state, in key groups.

Keys are spread over ``max_parallelism`` **key groups** by a stable hash (the
same in every process and every run, unlike Python's ``hash``). A subtask owns
a contiguous range of key groups, so state can later be redistributed when a
job restarts at another parallelism.

Taking a checkpoint has two parts, as in SEMANTICS §3:

* :meth:`KeyedStateBackend.snapshot` is the **synchronous** part: a shallow
  copy of each state's table (a C-level dict copy) and a new *epoch*. List and
  map values are copied on their first write after the snapshot
  (copy-on-write), so the snapshot never changes under the writer.
* :meth:`StateSnapshot.serialize` is the **asynchronous** part: it can run on
  another thread while records keep flowing.

State values must be picklable; the serialized form is a pickle of plain
dicts and lists, grouped by key group. Values are shared with snapshots, not
copied: a value stored in state (given to :meth:`ValueState.update`,
:meth:`ListState.add` or :meth:`MapState.put`, or read back from them) must
not be changed in place — store a new value instead. (Flink's heap backend
copies values through their serializer; cutline leaves Python objects alone
for speed, and this is the rule that keeps snapshots exact.)
"""

from __future__ import annotations

import pickle
import struct
import zlib
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_PARALLELISM = 128
_CHECKED_KEYS = 1_000_000
_FORMAT = 1


class StateError(Exception):
    """State used wrongly: no current key, a name reused for another kind of state, a key that
    cannot be hashed stably."""


def _encode_key(key: Hashable) -> bytes:
    """A canonical byte string for ``key``: equal keys give equal bytes in every process."""
    if isinstance(key, int):  # bools too: True == 1, so they must share a key group
        return b"i" + str(int(key)).encode()
    if isinstance(key, str):
        return b"s" + key.encode("utf-8", "surrogatepass")
    if isinstance(key, bytes):
        return b"b" + key
    if isinstance(key, float):
        if key.is_integer():  # 1.0 == 1, so both must land in the same key group
            return b"i" + str(int(key)).encode()
        return b"f" + struct.pack(">d", key)
    if key is None:
        return b"n"
    if isinstance(key, tuple):
        parts = [_encode_key(k) for k in key]
        return b"t" + b"".join(struct.pack(">I", len(p)) + p for p in parts)
    raise StateError(
        f"a key of type {type(key).__name__} has no stable hash: use str, int, float, bool, "
        "bytes, None or tuples of them"
    )


def key_group(key: Hashable, max_parallelism: int) -> int:
    """The key group of ``key``: stable across processes, runs and machines.

    CRC-32 of the key's canonical bytes, mixed by MurmurHash3's finalizer (as Flink mixes
    ``hashCode``) so that keys differing in a few bits still spread over every key group."""
    h = zlib.crc32(_encode_key(key))
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h % max_parallelism


def key_group_range(subtask: int, parallelism: int, max_parallelism: int) -> range:
    """The contiguous key groups that subtask ``subtask`` of ``parallelism`` owns."""
    if not 1 <= parallelism <= max_parallelism:
        raise ValueError(
            f"parallelism {parallelism} must be between 1 and the maximum parallelism "
            f"{max_parallelism}"
        )
    if not 0 <= subtask < parallelism:
        raise ValueError(f"subtask {subtask} is not one of 0..{parallelism - 1}")
    start = (subtask * max_parallelism + parallelism - 1) // parallelism
    end = ((subtask + 1) * max_parallelism + parallelism - 1) // parallelism
    return range(start, end)


def subtask_for_key_group(group: int, parallelism: int, max_parallelism: int) -> int:
    """The subtask that owns key group ``group`` (the inverse of :func:`key_group_range`)."""
    return group * parallelism // max_parallelism


class _Table:
    """One named state: key -> value, with copy-on-write of mutable values after a snapshot."""

    __slots__ = ("data", "epochs", "kind")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.data: dict[Hashable, Any] = {}
        self.epochs: dict[Hashable, int] = {}
        """For list and map state: the epoch in which each key's container was last copied."""


class KeyedStateBackend:
    """The keyed state of one operator subtask.

    :param max_parallelism: the number of key groups (fixed for the life of the job).
    :param key_groups: the key groups this subtask owns.
    """

    def __init__(
        self, max_parallelism: int = DEFAULT_MAX_PARALLELISM, key_groups: range | None = None
    ) -> None:
        if max_parallelism < 1:
            raise ValueError(f"max_parallelism must be 1 or more, not {max_parallelism}")
        self.max_parallelism = max_parallelism
        self.key_groups = key_groups if key_groups is not None else range(max_parallelism)
        self._tables: dict[str, _Table] = {}
        self._key: Hashable = None
        self._has_key = False
        self._checked: dict[Hashable, None] = {}
        """Keys already found to be in this subtask's key groups (hashing each is costly)."""
        self._epoch = 0

    # ------------------------------------------------------------- current key

    def set_current_key(self, key: Hashable) -> None:
        """The key the next state accesses are for (the key of the record being processed)."""
        try:
            checked = key in self._checked
        except TypeError:  # unhashable: _encode_key says why
            checked = False
        if not checked:
            group = key_group(key, self.max_parallelism)
            if group not in self.key_groups:
                raise StateError(
                    f"key {key!r} is in key group {group}, which this subtask does not own "
                    f"({self.key_groups.start}..{self.key_groups.stop - 1})"
                )
            if len(self._checked) >= _CHECKED_KEYS:
                self._checked.clear()
            self._checked[key] = None
        self._key = key
        self._has_key = True

    @property
    def current_key(self) -> Hashable:
        if not self._has_key:
            raise StateError("keyed state is used outside of a keyed record: no current key")
        return self._key

    # ------------------------------------------------------------------ states

    def value_state(self, name: str) -> ValueState:
        return ValueState(self, self._table(name, "value"))

    def list_state(self, name: str) -> ListState:
        return ListState(self, self._table(name, "list"))

    def map_state(self, name: str) -> MapState:
        return MapState(self, self._table(name, "map"))

    def _table(self, name: str, kind: str) -> _Table:
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = _Table(kind)
        elif table.kind != kind:
            raise StateError(f"state {name!r} is {table.kind} state, not {kind} state")
        return table

    def _writable(self, table: _Table, key: Hashable, empty: Any) -> Any:
        """The container of ``key`` in a list or map table, copied first if a snapshot shares it."""
        container = table.data.get(key)
        if container is None:
            container = table.data[key] = empty
            table.epochs[key] = self._epoch
        elif table.epochs.get(key) != self._epoch:
            container = table.data[key] = container.copy()
            table.epochs[key] = self._epoch
        return container

    def _clear(self, table: _Table, key: Hashable) -> None:
        table.data.pop(key, None)
        table.epochs.pop(key, None)

    def value_table(self, name: str) -> dict[Hashable, Any]:
        """Value state ``name`` as a dict (key -> value), for vectorized operators that read and
        write many keys at once. Assign values; never change one in place, and only use keys of
        this subtask's key groups (the caller routes records by key, so they are)."""
        return self._table(name, "value").data

    # ------------------------------------------------------------------ queries

    def keys(self, name: str) -> Iterator[Hashable]:
        """The keys that have a value in state ``name``."""
        table = self._tables.get(name)
        return iter(list(table.data)) if table else iter(())

    def state_names(self) -> list[str]:
        return sorted(self._tables)

    def __len__(self) -> int:
        """The number of (state, key) entries."""
        return sum(len(t.data) for t in self._tables.values())

    # ---------------------------------------------------------------- snapshot

    def snapshot(self) -> StateSnapshot:
        """The synchronous part of a checkpoint: cheap, and the result never changes after."""
        tables = {name: (t.kind, t.data.copy()) for name, t in self._tables.items()}
        self._epoch += 1  # list and map containers are copied on their next write
        return StateSnapshot(self.max_parallelism, self.key_groups, tables)

    def restore(self, blobs: Iterable[bytes]) -> None:
        """Load serialized snapshots (from one or several subtasks of the previous run), keeping
        only the key groups this subtask owns."""
        self._tables.clear()
        for blob in blobs:
            data = StateSnapshot.deserialize(blob)
            if data["max_parallelism"] != self.max_parallelism:
                raise StateError(
                    f"the state was written with max_parallelism {data['max_parallelism']}, "
                    f"this job has {self.max_parallelism}: it cannot be redistributed"
                )
            for name, (kind, groups) in data["tables"].items():
                table = self._table(name, kind)
                for group, entries in groups.items():
                    if group in self.key_groups:
                        table.data.update(entries)
        self._epoch += 1


@dataclass(frozen=True)
class StateSnapshot:
    """A consistent copy of a subtask's keyed state, to serialize off the processing thread."""

    max_parallelism: int
    key_groups: range
    tables: dict[str, tuple[str, dict[Hashable, Any]]]

    def serialize(self) -> bytes:
        """The asynchronous part: the state, grouped by key group, as bytes."""
        grouped: dict[str, tuple[str, dict[int, dict[Hashable, Any]]]] = {}
        for name, (kind, data) in self.tables.items():
            groups: dict[int, dict[Hashable, Any]] = {}
            for key, value in data.items():
                groups.setdefault(key_group(key, self.max_parallelism), {})[key] = value
            grouped[name] = (kind, groups)
        payload = {
            "format": _FORMAT,
            "max_parallelism": self.max_parallelism,
            "key_groups": [self.key_groups.start, self.key_groups.stop],
            "tables": grouped,
        }
        return pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)

    @staticmethod
    def deserialize(blob: bytes) -> dict[str, Any]:
        try:
            data = pickle.loads(blob)
        except Exception as exc:
            raise StateError(f"the state is not readable: {exc}") from exc
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise StateError("the state was not written by this version of cutline")
        return data


class _State:
    """What every kind of keyed state shares: its table, and clearing the current key."""

    __slots__ = ("_backend", "_table")

    def __init__(self, backend: KeyedStateBackend, table: _Table) -> None:
        self._backend, self._table = backend, table

    def clear(self) -> None:
        """Remove the current key's state."""
        self._backend._clear(self._table, self._backend.current_key)


class ValueState(_State):
    """One value per key."""

    __slots__ = ()

    def get(self, default: Any = None) -> Any:
        return self._table.data.get(self._backend.current_key, default)

    def update(self, value: Any) -> None:
        self._table.data[self._backend.current_key] = value


class ListState(_State):
    """A list of values per key."""

    __slots__ = ()

    def get(self) -> list[Any]:
        """A copy of the key's list (empty when there is none)."""
        return list(self._table.data.get(self._backend.current_key, ()))

    def add(self, value: Any) -> None:
        self._backend._writable(self._table, self._backend.current_key, []).append(value)

    def update(self, values: Iterable[Any]) -> None:
        key = self._backend.current_key
        self._table.data[key] = list(values)
        self._table.epochs[key] = self._backend._epoch


class MapState(_State):
    """A map of user keys to values per key."""

    __slots__ = ()

    def _map(self) -> dict[Any, Any]:
        found: dict[Any, Any] = self._table.data.get(self._backend.current_key, {})
        return found

    def get(self, user_key: Any, default: Any = None) -> Any:
        return self._map().get(user_key, default)

    def put(self, user_key: Any, value: Any) -> None:
        self._backend._writable(self._table, self._backend.current_key, {})[user_key] = value

    def remove(self, user_key: Any) -> None:
        key = self._backend.current_key
        if user_key in self._table.data.get(key, {}):
            container = self._backend._writable(self._table, key, {})
            del container[user_key]
            if not container:
                self._backend._clear(self._table, key)

    def contains(self, user_key: Any) -> bool:
        return user_key in self._map()

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._map().items())
