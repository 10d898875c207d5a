"""The memory backend: keyed state in Python dicts. Fastest; the state must fit in the worker's
memory.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterable
from typing import Any

from cutline.runtime.state.backend import (
    ABSENT,
    Frozen,
    KeyedStateBackend,
    Layers,
)
from cutline.runtime.state.config import Backend
from cutline.runtime.state.segments import DELETED, Group, Groups, group_entries


class _MemoryTable(Layers):
    """A named state of the memory backend: the base is a dict."""

    __slots__ = ("base", "lock")

    def __init__(self, kind: str, lock: threading.Lock) -> None:
        super().__init__(kind)
        self.base: dict[Hashable, Any] = {}
        self.lock = lock
        """Held while the base is changed, so that listing keys sees a whole base."""

    def _from_base(self, key: Hashable) -> Any:
        return self.base.get(key, ABSENT)

    def _base_keys(self) -> dict[Hashable, None]:
        with self.lock:
            return dict.fromkeys(self.base)

    def __setitem__(self, key: Hashable, value: Any) -> None:
        self.delta[key] = value

    def delete(self, key: Hashable) -> None:
        below = self._below(key)
        if below is ABSENT or below is DELETED:  # (identity: values may not compare)
            self.delta.pop(key, None)
        else:
            self.delta[key] = DELETED


class MemoryStateBackend(KeyedStateBackend):
    """Keyed state in Python dicts (``StateConfig(backend="memory")``)."""

    kind = Backend.MEMORY

    def _new_table(self, name: str, kind: str) -> _MemoryTable:
        return _MemoryTable(kind, self._base_lock)

    def _merge(self, frozen: Frozen) -> None:
        for name, (_, entries) in frozen.tables.items():
            base = self._tables[name].base
            with self._base_lock:
                for key, value in entries.items():
                    if value is DELETED:
                        base.pop(key, None)
                    else:
                        base[key] = value

    def _full_groups(self) -> Iterable[Group]:
        return group_entries(
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
