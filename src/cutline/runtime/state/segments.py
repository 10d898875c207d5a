"""Segments: the files keyed state is checkpointed to, each the entries of every key group, in full
or only the changes since a base checkpoint (upserts and deletions).
"""

from __future__ import annotations

import hashlib
import io
import pickle
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from cutline.runtime.state.keygroups import StateError

SEGMENT_FORMAT = 1


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


def group_entries(
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


Groups = dict[int, dict[str, tuple[str, dict[Hashable, Any], list[Hashable]]]]
"""key group -> state name -> (kind, upserts, deleted keys)."""

DELETED: Any = _Deleted()
