"""Key groups: keys spread over ``max_parallelism`` groups by a stable hash (the same in every
process and run, unlike Python's ``hash``); a subtask owns a contiguous range of them, so state
is redistributed by key group when a job restarts at another parallelism.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Hashable

DEFAULT_MAX_PARALLELISM = 128


class StateError(Exception):
    """State used wrongly: no current key, a name reused for another kind of state, a key that
    cannot be hashed stably, a state file that cannot be read or does not fit."""


def encode_key(key: Hashable) -> bytes:
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
        parts = [encode_key(k) for k in key]
        return b"t" + b"".join(struct.pack(">I", len(p)) + p for p in parts)
    raise StateError(
        f"a key of type {type(key).__name__} has no stable hash: use str, int, float, bool, "
        "bytes, None or tuples of them"
    )


def key_group(key: Hashable, max_parallelism: int) -> int:
    """The key group of ``key``: stable across processes, runs and machines.

    CRC-32 of the key's canonical bytes, mixed by MurmurHash3's finalizer (as Flink mixes
    ``hashCode``) so that keys differing in a few bits still spread over every key group."""
    h = zlib.crc32(encode_key(key))
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
