"""The state an operator's function reads and writes for the current key: :class:`ValueState`,
:class:`ListState` and :class:`MapState`.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any, Protocol


class KeyedContext(Protocol):
    """What a state primitive needs of its backend: the key of the record being processed."""

    @property
    def current_key(self) -> Hashable: ...


class _State:
    """What every kind of keyed state shares: its table, and clearing the current key."""

    __slots__ = ("_backend", "_table")

    def __init__(self, backend: KeyedContext, table: Any) -> None:
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
