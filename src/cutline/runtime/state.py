"""Keyed state of one operator subtask: value, list and map state, in key groups, behind one
interface with two backends, and checkpointed in full or incrementally.

**Key groups.** Keys are spread over ``max_parallelism`` key groups by a stable hash (the same
in every process and every run, unlike Python's ``hash``). A subtask owns a contiguous range
of key groups, so state is redistributed by key group when a job restarts at another
parallelism.

**Backends** (:class:`StateConfig`, ``backend=``):

* ``"memory"`` — :class:`MemoryStateBackend`: Python dicts. Fastest; the state must fit in the
  worker's memory.
* ``"disk"`` — :class:`DiskStateBackend`: an embedded RocksDB (``rocksdict``) in a local
  directory of the worker, for state larger than memory. Only what changed since the last
  checkpoint is held in memory.

Both keep what changed since the last checkpoint in a *delta* layer in front of the rest of
the state (the *base*: a dict, or the database). Taking a checkpoint has two parts, as in
SEMANTICS §3:

* :meth:`KeyedStateBackend.snapshot` is the **synchronous** part: the delta is frozen and a
  new, empty one takes the writes, whatever the size of the state (a pointer swap).
* :meth:`KeyedSnapshot.write` is the **asynchronous** part, on the subtask's snapshot thread:
  it merges the frozen delta into the base (the processing thread reads through the layers
  meanwhile) and writes a **segment**: the entries of every key group, in full, or only the
  changes since the checkpoint given as ``base`` (an **incremental** checkpoint: upserts and
  deletions). A keyed state handle names a chain of segments: the last full one and the
  incremental ones after it, at most ``full_every`` long. Restoring a chain applies its
  segments in order: the same state as a full segment of the same checkpoint.

Incremental segments only ever build on a checkpoint the coordinator declared complete (its
id travels with the barrier as ``base``), so no segment needs the files of a checkpoint
that may still be aborted.

State values must be picklable. Values are shared with snapshots, not copied: a value stored
in state (given to :meth:`ValueState.update`, :meth:`ListState.add` or :meth:`MapState.put`,
or read back from them) must not be changed in place — store a new value instead. List and
map containers are copied on their first write after a snapshot (copy-on-write).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import pickle
import shutil
import struct
import tempfile
import threading
import zlib
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

DEFAULT_MAX_PARALLELISM = 128
_CHECKED_KEYS = 1_000_000
_GROUP_CACHE = 4_000_000
"""Keys whose key group the snapshot thread remembers (computing one costs about 1.5 µs)."""
SEGMENT_FORMAT = 1
KEYED_FORMAT = 1
BACKENDS = ("memory", "disk")


class StateError(Exception):
    """State used wrongly: no current key, a name reused for another kind of state, a key that
    cannot be hashed stably, a state file that cannot be read or does not fit."""


@dataclass(frozen=True)
class StateConfig:
    """How a job keeps and checkpoints its keyed state.

    :param backend: ``"memory"`` or ``"disk"`` (see the module's docstring).
    :param incremental: checkpoints write only what changed since the last complete one.
    :param full_every: with ``incremental``: a chain of segments is at most this long (one full
        and ``full_every - 1`` incremental ones), so a restore never reads an endless chain
        and old files can be deleted.
    :param local_dir: ``"disk"``: where the working databases live on each worker (default:
        the system's temporary directory). They are scratch space: checkpoints are what
        survives.
    :param memory: ``"disk"``: bytes of memory for RocksDB's write buffers and block cache,
        per keyed operator subtask.
    """

    backend: str = "memory"
    incremental: bool = True
    full_every: int = 10
    local_dir: str | None = None
    memory: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(
                f"state backend must be one of {', '.join(map(repr, BACKENDS))}, "
                f"not {self.backend!r}"
            )
        if type(self.incremental) is not bool:
            raise ValueError(
                f"incremental_checkpoints must be True or False, not {self.incremental!r}"
            )
        if type(self.full_every) is not int or self.full_every < 1:
            raise ValueError(
                f"full_checkpoint_every must be a positive integer, not {self.full_every!r}"
            )
        if type(self.memory) is not int or self.memory < 1024 * 1024:
            raise ValueError(
                f"state_memory must be at least 1 MiB (1048576 bytes), not {self.memory!r}"
            )


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


# ------------------------------------------------------------------------------- segments


@dataclass(frozen=True)
class SegmentRef:
    """One segment file of a keyed state handle."""

    path: str
    """Relative to the checkpoint's folder: ``NAME.seg`` (the checkpoint's own file) or
    ``../shared/NAME.seg`` (shared by the incremental checkpoints that build on it)."""
    size: int
    sha256: str
    full: bool

    @property
    def shared(self) -> bool:
        return self.path.startswith(SHARED_PREFIX)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256, "full": self.full}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SegmentRef:
        return cls(str(data["path"]), int(data["size"]), str(data["sha256"]), bool(data["full"]))


SHARED_PREFIX = "../shared/"


class SegmentSource(Protocol):
    """Where a restore reads segments (the restored checkpoint's folder)."""

    def read_segment(self, ref: SegmentRef) -> bytes: ...


class SegmentStore(SegmentSource, Protocol):
    """Where a keyed snapshot writes its segments (the runtime's checkpoint storage;
    :class:`MemorySegmentStore` in tests)."""

    def write_segment(self, name: str, data: bytes, *, shared: bool) -> SegmentRef: ...


class MemorySegmentStore:
    """Segments kept in a dict (for tests and benchmarks of the backends alone)."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    def write_segment(self, name: str, data: bytes, *, shared: bool) -> SegmentRef:
        path = (SHARED_PREFIX if shared else "") + name
        self.files[path] = data
        return SegmentRef(path, len(data), hashlib.sha256(data).hexdigest(), False)

    def read_segment(self, ref: SegmentRef) -> bytes:
        """The segment, checked against its size and digest (as the checkpoint storage does)."""
        try:
            data = self.files[ref.path]
        except KeyError:
            raise StateError(f"segment {ref.path} is missing") from None
        if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.sha256:
            raise StateError(f"segment {ref.path} does not match its size and digest")
        return data


Groups = dict[int, dict[str, tuple[str, dict[Hashable, Any], list[Hashable]]]]
"""key group -> state name -> (kind, upserts, deleted keys)."""


Group = tuple[int, dict[str, tuple[str, dict[Hashable, Any], list[Hashable]]]]


_CHUNK_ENTRIES = 4096
"""Entries per pickle of a segment (whole key groups: a chunk ends after the group that
reaches it)."""


def encode_segment(groups: Iterable[Group], *, full: bool, max_parallelism: int) -> bytes:
    """A segment: a header, then pickles of a few thousand entries each (lists of whole key
    groups), so that neither writing nor reading holds much more than that as Python objects,
    and a small segment is not mostly framing."""
    out = io.BytesIO()
    header = {"format": SEGMENT_FORMAT, "full": full, "max_parallelism": max_parallelism}
    pickle.dump(header, out, protocol=pickle.HIGHEST_PROTOCOL)
    chunk: list[Group] = []
    entries = 0
    for group in groups:  # each chunk its own pickle: nothing remembered from one to the next
        chunk.append(group)
        entries += sum(len(upserts) + len(deletes) for _, upserts, deletes in group[1].values())
        if entries >= _CHUNK_ENTRIES:
            pickle.dump(chunk, out, protocol=pickle.HIGHEST_PROTOCOL)
            chunk, entries = [], 0
    if chunk:
        pickle.dump(chunk, out, protocol=pickle.HIGHEST_PROTOCOL)
    pickle.dump(None, out)  # the end: a truncated segment is never taken for a whole one
    return out.getvalue()


def decode_segment(data: bytes, where: str) -> tuple[dict[str, Any], Iterator[Group]]:
    """The header of a segment, and its key groups, read one at a time."""
    source = io.BytesIO(data)
    try:
        header = pickle.load(source)
    except Exception as exc:
        raise StateError(f"segment {where} is not readable: {exc}") from exc
    if not isinstance(header, dict) or header.get("format") != SEGMENT_FORMAT:
        raise StateError(f"segment {where} was not written by this version of cutline")

    def groups() -> Iterator[Group]:
        while True:
            try:
                chunk = pickle.load(source)
            except Exception as exc:
                raise StateError(f"segment {where} is not readable: {exc}") from exc
            if chunk is None:
                return
            if not isinstance(chunk, list):
                raise StateError(f"segment {where} is not readable: a chunk is not a list")
            yield from chunk

    return header, groups()


def _group_entries(
    layers: Iterable[tuple[str, str, Mapping[Hashable, Any]]],
    max_parallelism: int,
    groups_of: Callable[[Hashable], int],
) -> Groups:
    """Entries of ``(name, kind, {key: value or DELETED})`` layers, grouped by key group."""
    grouped: Groups = {}
    for name, kind, entries in layers:
        for key, value in entries.items():
            group = grouped.setdefault(groups_of(key), {})
            table = group.get(name)
            if table is None:
                table = group[name] = (kind, {}, [])
            if value is DELETED:
                table[2].append(key)
            else:
                table[1][key] = value
    return grouped


class _Deleted:
    """The mark of a key deleted in a delta layer (never stored in a segment)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "DELETED"


DELETED: Any = _Deleted()
_ABSENT: Any = object()


# ----------------------------------------------------------------------------- snapshots


class KeyedSnapshot:
    """The synchronous part of a checkpoint of one keyed operator subtask; :meth:`write` is the
    asynchronous part. Snapshots of one backend are written in the order they were taken."""

    def __init__(
        self,
        backend: KeyedStateBackend,
        number: int,
        checkpoint_id: int | None,
        base: int | None,
        savepoint: bool,
    ) -> None:
        self.backend = backend
        self.number = number
        self.checkpoint_id = checkpoint_id
        self.base = base
        self.savepoint = savepoint
        self.full: bool | None = None
        """Whether it wrote a full segment (known once written)."""

    def write(self, store: SegmentStore, name: str) -> dict[str, Any]:
        """Write the segment (files named ``name``...) and return the keyed state handle."""
        return self.backend._write(self, store, name)


@dataclass
class _Frozen:
    """A delta layer frozen by a snapshot: merged into the base when the snapshot is written,
    and kept until no later incremental segment can need its keys."""

    number: int
    checkpoint_id: int | None
    tables: dict[str, tuple[str, dict[Hashable, Any]]]
    merged: bool = False
    spilled: dict[str, set[Hashable]] = field(default_factory=dict)
    """Disk backend: keys changed before this snapshot but written to the database early;
    their values are read back from it when the segment is written."""


# ------------------------------------------------------------------------------ backends


class KeyedStateBackend:
    """The keyed state of one operator subtask (the part both backends share).

    :param max_parallelism: the number of key groups (fixed for the life of the job).
    :param key_groups: the key groups this subtask owns.
    :param config: backend settings (incremental checkpoints, chain length, ...).
    """

    kind = "memory"

    def __init__(
        self,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
        key_groups: range | None = None,
        config: StateConfig | None = None,
    ) -> None:
        if max_parallelism < 1:
            raise ValueError(f"max_parallelism must be 1 or more, not {max_parallelism}")
        self.max_parallelism = max_parallelism
        self.key_groups = key_groups if key_groups is not None else range(max_parallelism)
        self.config = config or StateConfig()
        self._tables: dict[str, Any] = {}
        self._key: Hashable = None
        self._has_key = False
        self._checked: dict[Hashable, None] = {}
        """Keys already found to be in this subtask's key groups (hashing each is costly)."""
        self._lock = threading.Lock()
        """Guards the frozen layers, which both threads change."""
        self._base_lock = threading.Lock()
        """Memory backend: held while the snapshot thread changes a base dict."""
        self._frozen: list[_Frozen] = []
        self._snapshots = 0
        self._written = 0
        self._chains: dict[int, list[SegmentRef]] = {}
        """Checkpoint id -> the chain of segments written for it (the bases of increments)."""
        self._numbers: dict[int, int] = {}
        """Checkpoint id -> the number of its snapshot (its place among the frozen layers)."""
        self._group_cache: dict[Hashable, int] = {}
        self._group_cache_size = _GROUP_CACHE

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

    def value_table(self, name: str) -> Any:
        """Value state ``name`` as a table with ``get(key, default)`` and ``table[key] = value``,
        for operators that read and write many keys at once. Only use keys of this subtask's
        key groups (the caller routes records by key, so they are), and never change a value
        in place."""
        return self._table(name, "value")

    def _table(self, name: str, kind: str) -> Any:
        table = self._tables.get(name)
        if table is None:
            if not isinstance(name, str) or not name:
                raise StateError(f"a state name must be a non-empty string, not {name!r}")
            table = self._tables[name] = self._new_table(name, kind)
        elif table.kind != kind:
            raise StateError(f"state {name!r} is {table.kind} state, not {kind} state")
        return table

    def _new_table(self, name: str, kind: str) -> Any:
        raise NotImplementedError

    # ------------------------------------------------------------------ queries

    def keys(self, name: str) -> Iterator[Hashable]:
        """The keys that have a value in state ``name``."""
        table = self._tables.get(name)
        return iter(table.keys()) if table is not None else iter(())

    def state_names(self) -> list[str]:
        return sorted(self._tables)

    def entries(self) -> Iterator[tuple[str, str, Hashable, Any]]:
        """Every ``(state name, kind, key, value)``, state by state (to read a checkpoint)."""
        for name in self.state_names():
            table = self._tables[name]
            for key in list(table.keys()):
                yield name, table.kind, key, table.get(key)

    def __len__(self) -> int:
        """The number of (state, key) entries."""
        return sum(len(t.keys()) for t in self._tables.values())

    # ---------------------------------------------------------------- snapshot

    def snapshot(
        self,
        checkpoint_id: int | None = None,
        *,
        base: int | None = None,
        savepoint: bool = False,
    ) -> KeyedSnapshot:
        """The synchronous part of a checkpoint: freeze the delta layer (constant time).

        :param base: the newest checkpoint the coordinator declared complete when it triggered
            this one: an incremental segment may build on the chain written for it.
        :param savepoint: write a full segment the checkpoint owns (nothing shared)."""
        self._snapshots += 1
        if checkpoint_id is not None:
            self._numbers[checkpoint_id] = self._snapshots
        tables = {}
        for name, table in list(self._tables.items()):
            tables[name] = (table.kind, table.freeze())
        with self._lock:
            self._frozen.append(_Frozen(self._snapshots, checkpoint_id, tables))
            self._publish_frozen()
        return KeyedSnapshot(self, self._snapshots, checkpoint_id, base, savepoint)

    def _publish_frozen(self) -> None:
        """Give every table the frozen layers not yet merged (newest last); under the lock."""
        unmerged = [f for f in self._frozen if not f.merged]
        for name, table in list(self._tables.items()):
            table.frozen = tuple(f.tables[name][1] for f in unmerged if name in f.tables)

    def _write(self, snapshot: KeyedSnapshot, store: SegmentStore, name: str) -> dict[str, Any]:
        if snapshot.number <= self._written:
            raise StateError(
                f"snapshot {snapshot.number} is written after snapshot {self._written}: "
                "snapshots are written in the order they were taken"
            )
        self._written = snapshot.number
        # 1. merge every frozen layer up to this snapshot into the base, oldest first
        for frozen in self._frozen:
            if frozen.number > snapshot.number:
                break
            if not frozen.merged:
                self._merge(frozen)
                with self._lock:
                    frozen.merged = True
                    self._publish_frozen()
        # 2. full, or the changes since the base checkpoint's chain
        config = self.config
        chain = self._chains.get(snapshot.base) if snapshot.base is not None else None
        base_number = self._numbers.get(snapshot.base) if snapshot.base is not None else None
        incremental = (
            config.incremental
            and not snapshot.savepoint
            and chain is not None
            and base_number is not None
            and len(chain) < config.full_every
        )
        if incremental:
            assert chain is not None and base_number is not None
            layers = [f for f in self._frozen if base_number < f.number <= snapshot.number]
            union: dict[str, tuple[str, dict[Hashable, Any]]] = {}
            for frozen in layers:
                for table_name, keys in frozen.spilled.items():  # (older than its delta)
                    spilled = union.setdefault(table_name, (self._tables[table_name].kind, {}))
                    spilled[1].update(dict.fromkeys(keys, _ABSENT))
                for table_name, (kind, entries) in frozen.tables.items():
                    union.setdefault(table_name, (kind, {}))[1].update(entries)
            groups = _group_entries(
                ((n, k, self._resolve(n, e)) for n, (k, e) in union.items()),
                self.max_parallelism,
                self._group_of,
            )
            data = encode_segment(groups.items(), full=False, max_parallelism=self.max_parallelism)
            ref = store.write_segment(f"{name}.seg", data, shared=True)
            new_chain = [*chain, SegmentRef(ref.path, ref.size, ref.sha256, False)]
        else:
            data = encode_segment(
                self._full_groups(), full=True, max_parallelism=self.max_parallelism
            )
            ref = store.write_segment(
                f"{name}.seg", data, shared=config.incremental and not snapshot.savepoint
            )
            new_chain = [SegmentRef(ref.path, ref.size, ref.sha256, True)]
        snapshot.full = not incremental
        if not snapshot.savepoint and snapshot.checkpoint_id is not None and config.incremental:
            self._chains[snapshot.checkpoint_id] = new_chain
        # 3. forget what no later increment can build on: chains and layers up to the base
        if base_number is not None:
            assert snapshot.base is not None
            for old in [c for c in list(self._chains) if c < snapshot.base]:
                del self._chains[old]
            for old in [c for c in list(self._numbers) if c < snapshot.base]:
                del self._numbers[old]
            with self._lock:
                self._frozen = [f for f in self._frozen if not f.merged or f.number > base_number]
        elif not config.incremental:
            with self._lock:
                self._frozen = [f for f in self._frozen if not f.merged]
        return {
            "keyed": KEYED_FORMAT,
            "backend": self.kind,
            "max_parallelism": self.max_parallelism,
            "key_groups": [self.key_groups.start, self.key_groups.stop],
            "chain": [r.to_dict() for r in new_chain],
        }

    def _group_of(self, key: Hashable) -> int:
        cache = self._group_cache
        group = cache.get(key)
        if group is None:
            group = key_group(key, self.max_parallelism)
            if len(cache) < self._group_cache_size:  # (full: the rest computed every time)
                cache[key] = group
        return group

    def _merge(self, frozen: _Frozen) -> None:
        raise NotImplementedError

    def _resolve(self, name: str, entries: Mapping[Hashable, Any]) -> Mapping[Hashable, Any]:
        """The entries of a union of delta layers as they go into a segment."""
        return entries

    def _full_groups(self) -> Iterable[Group]:
        """Every entry of the base, by key group."""
        raise NotImplementedError

    # ----------------------------------------------------------------- restore

    def restore(
        self,
        handles: Sequence[Mapping[str, Any]],
        store: SegmentSource,
        *,
        checkpoint_id: int | None = None,
    ) -> None:
        """Load the keyed state handles of a checkpoint (of one or several subtasks of the
        previous run), keeping only the key groups this subtask owns.

        ``checkpoint_id``: the restored checkpoint lives in this job's checkpoint directory;
        when exactly one handle covers exactly this subtask's key groups, later incremental
        checkpoints may build on its chain."""
        if self._snapshots or len(self):
            raise StateError("state is restored into an empty backend only")
        mine = self.key_groups
        for handle in handles:
            if not isinstance(handle, Mapping) or handle.get("keyed") != KEYED_FORMAT:
                raise StateError("the keyed state was not written by this version of cutline")
            if handle["max_parallelism"] != self.max_parallelism:
                raise StateError(
                    f"the state was written with max_parallelism {handle['max_parallelism']}, "
                    f"this job has {self.max_parallelism}: it cannot be redistributed"
                )
            start, stop = handle["key_groups"]
            if stop <= mine.start or start >= mine.stop:
                continue  # none of my key groups
            for ref_data in handle["chain"]:
                ref = SegmentRef.from_dict(ref_data)
                header, groups = decode_segment(store.read_segment(ref), ref.path)
                for group, tables in groups:
                    if group in mine:
                        self._apply({group: tables}, full=header["full"])
        if checkpoint_id is not None and len(handles) == 1:
            start, stop = handles[0]["key_groups"]
            if range(start, stop) == mine:
                self._chains[checkpoint_id] = [SegmentRef.from_dict(r) for r in handles[0]["chain"]]
                self._numbers[checkpoint_id] = 0  # every later layer is newer

    def _apply(self, groups: Groups, *, full: bool) -> None:
        """Apply one segment's entries (of my key groups) to the base."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the backend holds (files of the disk backend)."""


# -------------------------------------------------------------------------- memory backend


class _Layers:
    """One named state: the base (a dict, or the database) under frozen delta layers under the
    delta that takes the writes. Subclasses say how the base is read and listed."""

    __slots__ = ("delta", "frozen", "kind")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.frozen: tuple[dict[Hashable, Any], ...] = ()
        self.delta: dict[Hashable, Any] = {}

    def _from_base(self, key: Hashable) -> Any:
        raise NotImplementedError

    def _base_keys(self) -> dict[Hashable, None]:
        raise NotImplementedError

    def _written(self) -> None:
        """After a write to the delta (the disk backend may spill)."""

    def get(self, key: Hashable, default: Any = None) -> Any:
        value = self.delta.get(key, _ABSENT)
        if value is _ABSENT:  # (the common cases first: this is on every record's path)
            value = self._below(key) if self.frozen else self._from_base(key)
            if value is _ABSENT:
                return default
        return default if value is DELETED else value

    def _below(self, key: Hashable) -> Any:
        for layer in reversed(self.frozen):
            value = layer.get(key, _ABSENT)
            if value is not _ABSENT:
                return value
        return self._from_base(key)

    def writable(self, key: Hashable, empty: Callable[[], Any]) -> Any:
        """The container of ``key``, owned by the delta (copied there on its first write)."""
        self._written()  # before: the caller changes the container it gets
        container = self.delta.get(key, _ABSENT)
        if container is _ABSENT or container is DELETED:
            below = self._below(key) if container is _ABSENT else _ABSENT
            container = empty() if below is _ABSENT or below is DELETED else below.copy()
            self.delta[key] = container
        return container

    def freeze(self) -> dict[Hashable, Any]:
        frozen, self.delta = self.delta, {}
        return frozen

    def keys(self) -> list[Hashable]:
        present = self._base_keys()
        for layer in (*self.frozen, self.delta):
            for key, value in layer.items():
                if value is DELETED:
                    present.pop(key, None)
                else:
                    present[key] = None
        return list(present)

    def __len__(self) -> int:
        return len(self.keys())


class _MemoryTable(_Layers):
    """A named state of the memory backend: the base is a dict."""

    __slots__ = ("base", "lock")

    def __init__(self, kind: str, lock: threading.Lock) -> None:
        super().__init__(kind)
        self.base: dict[Hashable, Any] = {}
        self.lock = lock
        """Held while the base is changed, so that listing keys sees a whole base."""

    def _from_base(self, key: Hashable) -> Any:
        return self.base.get(key, _ABSENT)

    def _base_keys(self) -> dict[Hashable, None]:
        with self.lock:
            return dict.fromkeys(self.base)

    def __setitem__(self, key: Hashable, value: Any) -> None:
        self.delta[key] = value

    def delete(self, key: Hashable) -> None:
        below = self._below(key)
        if below is _ABSENT or below is DELETED:  # (identity: values may not compare)
            self.delta.pop(key, None)
        else:
            self.delta[key] = DELETED


class MemoryStateBackend(KeyedStateBackend):
    """Keyed state in Python dicts (``StateConfig(backend="memory")``)."""

    kind = "memory"

    def _new_table(self, name: str, kind: str) -> _MemoryTable:
        return _MemoryTable(kind, self._base_lock)

    def _merge(self, frozen: _Frozen) -> None:
        for name, (_, entries) in frozen.tables.items():
            base = self._tables[name].base
            with self._base_lock:
                for key, value in entries.items():
                    if value is DELETED:
                        base.pop(key, None)
                    else:
                        base[key] = value

    def _full_groups(self) -> Iterable[Group]:
        return _group_entries(
            ((name, t.kind, t.base) for name, t in list(self._tables.items())),
            self.max_parallelism,
            self._group_of,
        ).items()

    def _apply(self, groups: Groups, *, full: bool) -> None:
        for tables in groups.values():
            for name, (kind, upserts, deletes) in tables.items():
                base = self._table(name, kind).base
                base.update(upserts)
                for key in deletes:
                    base.pop(key, None)


# ---------------------------------------------------------------------------- disk backend

_DB_KEY = struct.Struct(">HH")  # key group, state id
_SPILL_ENTRY_BYTES = 512
"""A rough upper bound of the memory one changed entry holds, for the spill threshold."""


class _DiskTable(_Layers):
    """A named state of the disk backend: the base is RocksDB."""

    __slots__ = ("backend", "number")

    def __init__(self, backend: DiskStateBackend, kind: str, number: int) -> None:
        super().__init__(kind)
        self.backend = backend
        self.number = number

    def db_key(self, key: Hashable) -> bytes:
        return _DB_KEY.pack(self.backend._group_of(key), self.number) + _encode_key(key)

    def _from_base(self, key: Hashable) -> Any:
        raw = self.backend._db.get(self.db_key(key))
        return _ABSENT if raw is None else pickle.loads(raw)[1]

    def _base_keys(self) -> dict[Hashable, None]:
        present: dict[Hashable, None] = {}
        db = self.backend._db
        for group in self.backend.key_groups:
            prefix = _DB_KEY.pack(group, self.number)
            for db_key, raw in db.items(from_key=prefix):
                if not db_key.startswith(prefix):
                    break
                present[pickle.loads(raw)[0]] = None
        return present

    def _written(self) -> None:
        if len(self.delta) >= self.backend._spill_at:
            self.backend._spill()

    def __setitem__(self, key: Hashable, value: Any) -> None:
        self.delta[key] = value
        self._written()

    def delete(self, key: Hashable) -> None:
        self.delta[key] = DELETED
        self._written()


def _remove_stale_databases(folder: str) -> None:
    """Delete working databases left by processes that died (a SIGKILLed worker)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if not name.startswith("cutline-state-"):
            continue
        try:
            pid = int(name.split("-")[2])
        except (IndexError, ValueError):
            continue
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
        except OSError:
            pass


class DiskStateBackend(KeyedStateBackend):
    """Keyed state in an embedded RocksDB on the worker's disk (``StateConfig(backend="disk")``).

    What changed since the last checkpoint stays in memory (the delta layers) until the
    snapshot thread writes it into the database; beyond about ``config.memory`` bytes of
    changes, the delta is written early (spilled) when no snapshot is being written, and
    only its keys are kept, to be read back for the next incremental segment."""

    kind = "disk"

    def __init__(
        self,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
        key_groups: range | None = None,
        config: StateConfig | None = None,
    ) -> None:
        super().__init__(max_parallelism, key_groups, config or StateConfig(backend="disk"))
        import rocksdict

        self._rocksdict = rocksdict
        folder = self.config.local_dir or tempfile.gettempdir()
        try:
            os.makedirs(folder, exist_ok=True)
            _remove_stale_databases(folder)
            self.path = tempfile.mkdtemp(prefix=f"cutline-state-{os.getpid()}-", dir=folder)
        except OSError as exc:
            raise StateError(
                f"cannot create the state database in {folder}: {exc.strerror or exc}"
            ) from exc
        memory = self.config.memory
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_write_buffer_size(max(memory // 4, 1 << 20))
        table = rocksdict.BlockBasedOptions()
        table.set_block_cache(rocksdict.Cache(max(memory // 2, 1 << 20)))
        options.set_block_based_table_factory(table)
        try:
            self._db: Any = rocksdict.Rdict(f"{self.path}/db", options)
        except Exception as exc:
            shutil.rmtree(self.path, ignore_errors=True)
            raise StateError(f"cannot open the state database in {self.path}: {exc}") from exc
        writes = rocksdict.WriteOptions()
        writes.disable_wal = True  # type: ignore[method-assign,assignment]  # (a property)
        self._db.set_write_options(writes)
        self._names: dict[int, str] = {}
        self._spill_at = max(memory // _SPILL_ENTRY_BYTES, 16)
        self._group_cache_size = min(_GROUP_CACHE, memory // 128)  # (about 100 bytes a key)
        self._spilled: dict[str, set[Hashable]] = {}
        """Keys written to the database early since the last snapshot (per state name)."""
        self._db_lock = threading.RLock()
        self.spills = 0

    def _new_table(self, name: str, kind: str) -> _DiskTable:
        number = len(self._names)
        if number > 0xFFFF:
            raise StateError("a keyed operator has at most 65536 named states")
        self._names[number] = name
        return _DiskTable(self, kind, number)

    # ------------------------------------------------------------------ writes

    def _batch(self) -> Any:
        return self._rocksdict.WriteBatch(raw_mode=True)

    def _put_entries(
        self, table: _DiskTable, entries: Mapping[Hashable, Any], group: int | None = None
    ) -> None:
        """Write ``entries`` (values or DELETED; all of key group ``group`` when given) into
        the database, in batches that hold the GIL only briefly."""
        batch, count = self._batch(), 0
        prefix = _DB_KEY.pack(group, table.number) if group is not None else None
        for key, value in entries.items():
            db_key = table.db_key(key) if prefix is None else prefix + _encode_key(key)
            if value is DELETED:
                batch.delete(db_key)
            else:
                batch.put(db_key, pickle.dumps((key, value), protocol=pickle.HIGHEST_PROTOCOL))
            count += 1
            if count == 1000:
                self._db.write(batch)
                batch, count = self._batch(), 0
        if count:
            self._db.write(batch)

    def _spill(self) -> None:
        """Too many changes in memory: write the delta into the database now, if no snapshot
        is waiting to be written (its segment must see the database as it was)."""
        if self._written < self._snapshots or not self._db_lock.acquire(blocking=False):
            return
        try:
            for name, table in list(self._tables.items()):
                if table.delta:
                    self._put_entries(table, table.delta)
                    self._spilled.setdefault(name, set()).update(table.delta)
                    table.delta = {}
            self.spills += 1
        finally:
            self._db_lock.release()

    def snapshot(
        self,
        checkpoint_id: int | None = None,
        *,
        base: int | None = None,
        savepoint: bool = False,
    ) -> KeyedSnapshot:
        snapshot = super().snapshot(checkpoint_id, base=base, savepoint=savepoint)
        if self._spilled:  # constant time: the keys are looked at when the segment is written
            self._frozen[-1].spilled, self._spilled = self._spilled, {}
        return snapshot

    def _merge(self, frozen: _Frozen) -> None:
        with self._db_lock:
            for name, (_, entries) in frozen.tables.items():
                self._put_entries(self._tables[name], entries)

    def _write(self, snapshot: KeyedSnapshot, store: SegmentStore, name: str) -> dict[str, Any]:
        with self._db_lock:
            return super()._write(snapshot, store, name)

    def _resolve(self, name: str, entries: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        """``entries`` with the spilled keys' values read back from the database."""
        table = self._tables[name]
        out = {}
        for key, value in entries.items():
            if value is _ABSENT:
                raw = self._db.get(table.db_key(key))
                value = DELETED if raw is None else pickle.loads(raw)[1]
            out[key] = value
        return out

    def _full_groups(self) -> Iterator[Group]:
        """Every entry, one key group at a time (the database is in key group order)."""
        current: int | None = None
        tables: dict[str, tuple[str, dict[Hashable, Any], list[Hashable]]] = {}
        for db_key, raw in self._db.items():
            group, number = _DB_KEY.unpack_from(db_key)
            if group != current:
                if current is not None:
                    yield current, tables
                current, tables = group, {}
            name = self._names[number]
            key, value = pickle.loads(raw)
            table = tables.get(name)
            if table is None:
                table = tables[name] = (self._tables[name].kind, {}, [])
            table[1][key] = value
        if current is not None:
            yield current, tables

    def _apply(self, groups: Groups, *, full: bool) -> None:
        for group, tables in groups.items():
            for name, (kind, upserts, deletes) in tables.items():
                table = self._table(name, kind)
                entries: dict[Hashable, Any] = dict(upserts)
                entries.update(dict.fromkeys(deletes, DELETED))
                self._put_entries(table, entries, group)

    def close(self) -> None:
        with self._db_lock:
            with contextlib.suppress(Exception):
                self._db.close()
            shutil.rmtree(self.path, ignore_errors=True)


def new_backend(
    config: StateConfig | None,
    max_parallelism: int = DEFAULT_MAX_PARALLELISM,
    key_groups: range | None = None,
) -> KeyedStateBackend:
    """The backend ``config`` asks for."""
    config = config or StateConfig()
    cls = DiskStateBackend if config.backend == "disk" else MemoryStateBackend
    return cls(max_parallelism, key_groups, config)


# -------------------------------------------------------------------------------- states


class _State:
    """What every kind of keyed state shares: its table, and clearing the current key."""

    __slots__ = ("_backend", "_table")

    def __init__(self, backend: KeyedStateBackend, table: Any) -> None:
        self._backend, self._table = backend, table

    def clear(self) -> None:
        """Remove the current key's state."""
        self._table.delete(self._backend.current_key)


class ValueState(_State):
    """One value per key."""

    __slots__ = ()

    def get(self, default: Any = None) -> Any:
        return self._table.get(self._backend.current_key, default)

    def update(self, value: Any) -> None:
        self._table[self._backend.current_key] = value


class ListState(_State):
    """A list of values per key."""

    __slots__ = ()

    def get(self) -> list[Any]:
        """A copy of the key's list (empty when there is none)."""
        return list(self._table.get(self._backend.current_key, ()))

    def add(self, value: Any) -> None:
        self._table.writable(self._backend.current_key, list).append(value)

    def update(self, values: Iterable[Any]) -> None:
        self._table[self._backend.current_key] = list(values)


class MapState(_State):
    """A map of user keys to values per key."""

    __slots__ = ()

    def _map(self) -> dict[Any, Any]:
        found: dict[Any, Any] = self._table.get(self._backend.current_key, None) or {}
        return found

    def get(self, user_key: Any, default: Any = None) -> Any:
        return self._map().get(user_key, default)

    def put(self, user_key: Any, value: Any) -> None:
        self._table.writable(self._backend.current_key, dict)[user_key] = value

    def remove(self, user_key: Any) -> None:
        key = self._backend.current_key
        if user_key in self._map():
            container = self._table.writable(key, dict)
            del container[user_key]
            if not container:
                self._table.delete(key)

    def contains(self, user_key: Any) -> bool:
        return user_key in self._map()

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._map().items())
