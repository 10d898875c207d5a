"""Does a value read from JSON fit a dataclass field's type? One answer for every record the
runtime reads back: the control channel's messages (``network/messages.py``) and the
checkpoint statistics files (``checkpoint/stats.py``) both refuse what does not fit, naming
the field, instead of failing later deep inside.
"""

from __future__ import annotations

import types
import typing
from typing import Any

_HINTS: dict[type[Any], dict[str, Any]] = {}


def field_types(cls: type[Any]) -> dict[str, Any]:
    """The type of each field of dataclass ``cls`` (resolved once per class)."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def conforms(value: Any, hint: Any) -> bool:
    """Whether JSON ``value`` is of the type ``hint``: ``int``, ``str`` and ``bool`` exactly (a
    ``True`` is no count), ``float`` also from an int, unions, ``None``, and ``dict`` and
    ``list`` with their items; any other type (``Any``) takes anything."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        return any(conforms(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if hint is float:
        return type(value) in (int, float)
    if hint in (int, str, bool):
        return type(value) is hint
    if origin is dict:
        return isinstance(value, dict) and all(
            conforms(k, args[0]) and conforms(v, args[1]) for k, v in value.items()
        )
    if origin is list:
        return isinstance(value, list) and all(conforms(v, args[0]) for v in value)
    return True
