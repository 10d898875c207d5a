"""Key groups: keys spread over ``max_parallelism`` groups by a stable hash (the same in every
process and run, unlike Python's ``hash``); a subtask owns a contiguous range of them, so state
is redistributed by key group when a job restarts at another parallelism.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Hashable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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


def key_groups(keys: pa.Array | pa.ChunkedArray, max_parallelism: int) -> np.ndarray:
    """:func:`key_group` of every value of an Arrow column at once (``int64`` results; a null
    is the group of ``None``). Integer, string and binary columns are hashed vectorized (the
    same bytes and CRC-32 as :func:`key_group`, so every path agrees); other types per value.
    """
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    kind = keys.type
    if pa.types.is_integer(kind):
        prefix, data = b"i", pc.cast(keys, pa.string())
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        prefix, data = b"s", keys
    elif pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        prefix, data = b"b", keys
    else:
        return np.array([key_group(k, max_parallelism) for k in keys.to_pylist()], np.int64)
    groups = _mix(_crc32(prefix, data)) % np.uint32(max_parallelism)
    if keys.null_count:
        nulls = keys.is_null().to_numpy(zero_copy_only=False)
        groups[nulls] = key_group(None, max_parallelism)
    return groups.astype(np.int64)


def _crc_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0xEDB88320), table >> 1)
    return table.astype(np.uint32)


_CRC_TABLE = _crc_table()
_ROWS_AT_ONCE = 1 << 16


def _crc32(prefix: bytes, values: pa.Array) -> np.ndarray:
    """``zlib.crc32(prefix + value)`` of each value of a string or binary array, as
    ``uint32``: the table-driven CRC run over all values at once, a byte position at a
    time (values shorter than the longest stop early)."""
    n = len(values)
    start = np.uint32(zlib.crc32(prefix) ^ 0xFFFFFFFF)  # the register after the prefix
    if not n:
        return np.zeros(0, np.uint32)
    values = values.cast(pa.large_binary())
    offsets_buffer, data_buffer = values.buffers()[1:3]
    offsets = np.frombuffer(offsets_buffer, np.int64)[values.offset : values.offset + n + 1]
    data = (
        np.frombuffer(data_buffer, np.uint8)
        if data_buffer is not None and data_buffer.size
        else np.zeros(1, np.uint8)
    )
    out = np.empty(n, np.uint32)
    for first in range(0, n, _ROWS_AT_ONCE):
        last = min(first + _ROWS_AT_ONCE, n)
        begin = offsets[first:last]
        lengths = offsets[first + 1 : last + 1] - begin
        crc = np.full(len(begin), start, np.uint32)
        for position in range(int(lengths.max(initial=0))):
            going = lengths > position
            at = np.minimum(begin + position, len(data) - 1)
            stepped = _CRC_TABLE[(crc ^ data[at]) & 0xFF] ^ (crc >> 8)
            crc = np.where(going, stepped, crc)
        out[first:last] = crc ^ np.uint32(0xFFFFFFFF)
    return out


def _mix(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's finalizer over ``uint32`` values (as :func:`key_group` mixes one)."""
    h = h ^ (h >> 16)
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * np.uint32(0xC2B2AE35)
    mixed: np.ndarray = h ^ (h >> 16)
    return mixed


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
