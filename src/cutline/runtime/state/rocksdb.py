"""The disk backend: keyed state in an embedded RocksDB (``rocksdict``) in a local directory of the
worker, for state larger than memory. Only what changed since the last checkpoint is held in
memory.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import struct
import tempfile
import threading
from collections.abc import Hashable, Iterator, Mapping
from typing import Any

from cutline.runtime.state.backend import (
    ABSENT,
    GROUP_CACHE,
    Frozen,
    KeyedSnapshot,
    KeyedStateBackend,
    Layers,
)
from cutline.runtime.state.config import Backend
from cutline.runtime.state.keygroups import StateError, encode_key
from cutline.runtime.state.segments import DELETED, Group, Groups, SegmentStore
from cutline.runtime.state.timers import DiskTimerIndex, TimerIndex

_DB_KEY = struct.Struct(">HH")  # key group, state id

_SPILL_ENTRY_BYTES = 512
"""A rough upper bound of the memory one changed entry holds, for the spill threshold."""


class _DiskTable(Layers):
    """A named state of the disk backend: the base is RocksDB."""

    __slots__ = ("backend", "number")

    def __init__(self, backend: DiskStateBackend, kind: str, number: int) -> None:
        super().__init__(kind)
        self.backend = backend
        self.number = number

    def db_key(self, key: Hashable) -> bytes:
        return _DB_KEY.pack(self.backend._group_of(key), self.number) + encode_key(key)

    def _from_base(self, key: Hashable) -> Any:
        raw = self.backend._db.get(self.db_key(key))
        return ABSENT if raw is None else pickle.loads(raw)[1]

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

    kind = Backend.DISK

    def _new_timer_index(self, name: str) -> TimerIndex:
        """A database of its own beside the state's (in the system's temporary folder when
        the state's is gone)."""
        folder = self.path if self.path is not None and os.path.isdir(self.path) else None
        return DiskTimerIndex(folder, name)

    def _open(self) -> None:
        """Create and open this subtask's database in a fresh folder of ``config.local_dir``
        (the system's temporary folder by default), first removing those of dead processes."""
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
        self._group_cache_size = min(GROUP_CACHE, memory // 128)  # (about 100 bytes a key)
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
            db_key = table.db_key(key) if prefix is None else prefix + encode_key(key)
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

    def _merge(self, frozen: Frozen) -> None:
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
            if value is ABSENT:
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
        self._close_timers()
        with self._db_lock:
            with contextlib.suppress(Exception):
                self._db.close()
            if self.path is not None:
                shutil.rmtree(self.path, ignore_errors=True)
