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

import threading
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cutline.runtime.state.chains import ChainBooks
from cutline.runtime.state.config import Backend, StateConfig
from cutline.runtime.state.keygroups import DEFAULT_MAX_PARALLELISM, StateError, key_group
from cutline.runtime.state.primitives import ListState, MapState, ValueState
from cutline.runtime.state.segments import (
    DELETED,
    Group,
    Groups,
    SegmentRef,
    SegmentSource,
    SegmentStore,
    decode_segment,
    encode_segment,
    group_entries,
)
from cutline.runtime.state.timers import MemoryTimerIndex, TimerIndex

_CHECKED_KEYS = 1_000_000

GROUP_CACHE = 4_000_000
"""Keys whose key group the snapshot thread remembers (computing one costs about 1.5 µs)."""

KEYED_FORMAT = 1

ABSENT: Any = object()


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
        self.extra: dict[str, Any] = {}
        """What the operator keeps beside its keyed state in the handle (a window operator's
        watermark): picklable, read back from the handles at a restore."""
        self.attached: list[Callable[[SegmentStore, str], Mapping[str, Any]]] = []
        """What writes the operator's state kept beside its keyed state in segments of its
        own (:class:`~cutline.runtime.state.columns.ColumnChain`), after the keyed segment, on
        the same thread; what each returns goes into the handle."""

    def write(self, store: SegmentStore, name: str) -> dict[str, Any]:
        """Write the segment (files named ``name``...) and return the keyed state handle."""
        handle = {**self.backend._write(self, store, name), **self.extra}
        for attach in self.attached:
            handle.update(attach(store, name))
        return handle


@dataclass
class Frozen:
    """A delta layer frozen by a snapshot: merged into the base when the snapshot is written,
    and kept until no later incremental segment can need its keys."""

    number: int
    checkpoint_id: int | None
    tables: dict[str, tuple[str, dict[Hashable, Any]]]
    merged: bool = False
    spilled: dict[str, set[Hashable]] = field(default_factory=dict)
    """Disk backend: keys changed before this snapshot but written to the database early;
    their values are read back from it when the segment is written."""


class KeyedStateBackend:
    """The keyed state of one operator subtask (the part both backends share).

    :param max_parallelism: the number of key groups (fixed for the life of the job).
    :param key_groups: the key groups this subtask owns.
    :param config: backend settings (incremental checkpoints, chain length, ...).
    """

    kind: Backend = Backend.MEMORY

    path: str | None = None
    """The subtask's own folder on the worker's disk (the disk backend's: its database, and
    what an operator spills beside it), removed when the backend is closed; ``None``: none."""

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
        self.config = config or StateConfig(backend=self.kind)
        self._tables: dict[str, Any] = {}
        self._key: Hashable = None
        self._has_key = False
        self._checked: dict[Hashable, None] = {}
        """Keys already found to be in this subtask's key groups (hashing each is costly)."""
        self._lock = threading.Lock()
        """Guards the frozen layers, which both threads change."""
        self._base_lock = threading.Lock()
        """Memory backend: held while the snapshot thread changes a base dict."""
        self._frozen: list[Frozen] = []
        self._snapshots = 0
        self._written = 0
        self._books = ChainBooks(self.config)
        """Per checkpoint, the chain written for it (the bases of increments) and the number
        of its snapshot (its place among the frozen layers)."""
        self._group_cache: dict[Hashable, int] = {}
        self._group_cache_size = GROUP_CACHE
        self._timer_indexes: list[TimerIndex] = []
        self._spilled: dict[str, set[Hashable]] = {}
        """Disk backend: keys written to the database early since the last snapshot (per state
        name); the next snapshot's frozen layer takes them."""
        self._open()

    def _open(self) -> None:
        """Take what the backend holds beyond its Python objects (the disk backend's database),
        the last step of the constructor; :meth:`close` gives it back. The memory backend holds
        nothing more."""

    # ------------------------------------------------------------- current key

    def set_current_key(self, key: Hashable) -> None:
        """The key the next state accesses are for (the key of the record being processed)."""
        try:
            checked = key in self._checked
        except TypeError:  # unhashable: encode_key says why
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

    def timer_index(self, name: str) -> TimerIndex:
        """A new index of timers by due time for this subtask (:mod:`timers`): in memory for
        the memory backend, in a database beside the state for the disk backend. Closed with
        the backend."""
        index = self._new_timer_index(name)
        self._timer_indexes.append(index)
        return index

    def _new_timer_index(self, name: str) -> TimerIndex:
        return MemoryTimerIndex()

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
        self._books.taken(checkpoint_id, self._snapshots)
        tables = {}
        for name, table in list(self._tables.items()):
            tables[name] = (table.kind, table.freeze())
        with self._lock:
            # constant time: the spilled keys are looked at when the segment is written
            spilled, self._spilled = self._spilled, {}
            self._frozen.append(Frozen(self._snapshots, checkpoint_id, tables, spilled=spilled))
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
        chain = self._books.builds_on(snapshot.base, snapshot.savepoint)
        base_number = self._books.number_of(snapshot.base)
        incremental = chain is not None
        if chain is not None:
            assert base_number is not None
            layers = [f for f in self._frozen if base_number < f.number <= snapshot.number]
            union: dict[str, tuple[str, dict[Hashable, Any]]] = {}
            for frozen in layers:
                for table_name, keys in frozen.spilled.items():  # (older than its delta)
                    spilled = union.setdefault(table_name, (self._tables[table_name].kind, {}))
                    spilled[1].update(dict.fromkeys(keys, ABSENT))
                for table_name, (kind, entries) in frozen.tables.items():
                    union.setdefault(table_name, (kind, {}))[1].update(entries)
            groups = group_entries(
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
        self._books.written(snapshot.checkpoint_id, snapshot.savepoint, new_chain)
        # 3. forget what no later increment can build on: chains and layers up to the base
        if base_number is not None:
            assert snapshot.base is not None
            self._books.forget_before(snapshot.base)
            with self._lock:
                self._frozen = [f for f in self._frozen if not f.merged or f.number > base_number]
        elif not config.incremental:
            with self._lock:
                self._frozen = [f for f in self._frozen if not f.merged]
        return {
            "keyed": KEYED_FORMAT,
            "backend": str(self.kind),  # (a plain name in the handle)
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

    def _merge(self, frozen: Frozen) -> None:
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
                chain = [SegmentRef.from_dict(r) for r in handles[0]["chain"]]
                self._books.adopt(checkpoint_id, chain)  # (every later layer is newer)

    def _apply(self, groups: Groups, *, full: bool) -> None:
        """Apply one segment's entries (of my key groups) to the base."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the backend holds (files of the disk backend)."""
        self._close_timers()

    def _close_timers(self) -> None:
        for index in self._timer_indexes:
            index.close()
        self._timer_indexes = []


class Layers:
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
        value = self.delta.get(key, ABSENT)
        if value is ABSENT:  # (the common cases first: this is on every record's path)
            value = self._below(key) if self.frozen else self._from_base(key)
            if value is ABSENT:
                return default
        return default if value is DELETED else value

    def _below(self, key: Hashable) -> Any:
        for layer in reversed(self.frozen):
            value = layer.get(key, ABSENT)
            if value is not ABSENT:
                return value
        return self._from_base(key)

    def writable(self, key: Hashable, empty: Callable[[], Any]) -> Any:
        """The container of ``key``, owned by the delta (copied there on its first write)."""
        self._written()  # before: the caller changes the container it gets
        container = self.delta.get(key, ABSENT)
        if container is ABSENT or container is DELETED:
            below = self._below(key) if container is ABSENT else ABSENT
            container = empty() if below is ABSENT or below is DELETED else below.copy()
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
