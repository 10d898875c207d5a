"""Tests of checkpoint storage on a real directory and on fsspec's ``memory://``.

Everything is written for real: local checkpoints go to pytest's ``tmp_path`` and
are corrupted on disk, URL checkpoints go to fsspec's in-memory filesystem (a
fresh path per test, since it is process-global). A full disk is ``/dev/full``
(writes to it fail with ENOSPC), not a mock; only a disk that fills up in the middle of
a write, or fails to sync or rename, is the real file system with a failing ``open``,
``fsync`` or ``mv`` put in (``fail_writes``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
import stat
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline.runtime.checkpoint.layout import (
    METADATA,
    CheckpointMetadata,
    CorruptCheckpointError,
    StateHandle,
    StorageError,
)
from cutline.runtime.checkpoint.stats import CheckpointStats, RunInfo, encode, stats_file
from cutline.runtime.checkpoint.storage import CheckpointStorage, Skipped

# --------------------------------------------------------------------- helpers

STATES = {"source-0": b"offset=42", "sum-1": b"\x00\x01total=7\xff" * 3, "sink-2": b""}
"""Several subtasks, one with binary bytes and one with an empty state."""


def raises_naming(exc: type[Exception], *parts: object) -> Any:
    """``pytest.raises(exc)`` whose message contains every one of ``parts`` verbatim."""
    pattern = "".join(f"(?=.*{re.escape(str(p))})" for p in parts)
    return pytest.raises(exc, match=re.compile(pattern, re.DOTALL))


@contextlib.contextmanager
def memory_url() -> Iterator[str]:
    """A fresh ``memory://`` checkpoint directory, removed afterwards."""
    url = f"memory://ck-{uuid.uuid4().hex}"
    try:
        yield url
    finally:
        fs = fsspec.filesystem("memory")
        root = fs._strip_protocol(url)
        if fs.exists(root):
            fs.rm(root, recursive=True)


@pytest.fixture(params=["local", "memory"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A checkpoint directory: a local path that does not exist yet, or a memory:// URL."""
    if request.param == "local":
        yield str(tmp_path / "checkpoints")
    else:
        with memory_url() as u:
            yield u


def where(url: str, checkpoint_id: int, name: str) -> str:
    """How an error message should name file ``name`` of checkpoint ``checkpoint_id``."""
    return f"{url}/chk-{checkpoint_id}/{name}"


def file_path(storage: CheckpointStorage, checkpoint_id: int, name: str) -> str:
    """The path of a checkpoint file on ``storage.fs``, to corrupt it behind the storage."""
    return f"{storage.checkpoint_path(checkpoint_id)}/{name}"


def write_checkpoint(
    storage: CheckpointStorage,
    checkpoint_id: int,
    states: dict[str, bytes] | None = None,
    *,
    generation: int = 1,
    extra: dict[str, Any] | None = None,
    complete: bool = True,
) -> CheckpointMetadata:
    """Write every subtask's state, then (if ``complete``) the metadata."""
    states = dict(STATES if states is None else states)
    handles = {
        task: storage.write_state(checkpoint_id, task, generation, data)
        for task, data in states.items()
    }
    metadata = CheckpointMetadata(
        checkpoint_id=checkpoint_id,
        generation=generation,
        handles=handles,
        extra={"checkpoint": checkpoint_id} if extra is None else extra,
    )
    if complete:
        storage.write_metadata(metadata)
    return metadata


def state_name(task: str, generation: int = 1) -> str:
    return f"g{generation}-{task}.state"


# ---------------------------------------------------------------- corruptions
#
# Each corruption damages checkpoint ``checkpoint_id`` on ``storage.fs`` and
# returns the name of the damaged file plus a fragment the reason must contain.

Corruption = Callable[[CheckpointStorage, int], tuple[str, str]]


def _rewrite_metadata(
    storage: CheckpointStorage, checkpoint_id: int, changes: dict[str, Any]
) -> None:
    path = file_path(storage, checkpoint_id, METADATA)
    data = json.loads(storage.fs.cat_file(path))
    data.update(changes)
    storage.fs.pipe_file(path, json.dumps(data).encode())


def metadata_truncated(storage: CheckpointStorage, checkpoint_id: int) -> tuple[str, str]:
    path = file_path(storage, checkpoint_id, METADATA)
    raw = storage.fs.cat_file(path)
    storage.fs.pipe_file(path, raw[: len(raw) // 2])
    return METADATA, "is not valid checkpoint metadata"


def metadata_empty(storage: CheckpointStorage, checkpoint_id: int) -> tuple[str, str]:
    storage.fs.pipe_file(file_path(storage, checkpoint_id, METADATA), b"")
    return METADATA, "is not valid checkpoint metadata"


def metadata_not_json(storage: CheckpointStorage, checkpoint_id: int) -> tuple[str, str]:
    storage.fs.pipe_file(file_path(storage, checkpoint_id, METADATA), b"\xff\x00 not json {")
    return METADATA, "is not valid checkpoint metadata"


def metadata_json_not_an_object(storage: CheckpointStorage, checkpoint_id: int) -> tuple[str, str]:
    storage.fs.pipe_file(file_path(storage, checkpoint_id, METADATA), b"[1, 2, 3]")
    return METADATA, "is not valid checkpoint metadata"


def metadata_old_format(storage: CheckpointStorage, checkpoint_id: int) -> tuple[str, str]:
    _rewrite_metadata(storage, checkpoint_id, {"format": 1})
    return METADATA, "written by an older version of cutline"


def metadata_wrong_format(storage: CheckpointStorage, checkpoint_id: int) -> tuple[str, str]:
    _rewrite_metadata(storage, checkpoint_id, {"format": 3})
    return METADATA, "unknown format 3"


def metadata_other_checkpoint(storage: CheckpointStorage, checkpoint_id: int) -> tuple[str, str]:
    _rewrite_metadata(storage, checkpoint_id, {"checkpoint_id": checkpoint_id + 1000})
    return METADATA, f"describes checkpoint {checkpoint_id + 1000}"


def metadata_handle_without_digest(
    storage: CheckpointStorage, checkpoint_id: int
) -> tuple[str, str]:
    path = file_path(storage, checkpoint_id, METADATA)
    data = json.loads(storage.fs.cat_file(path))
    del data["handles"]["sum-1"]["sha256"]
    storage.fs.pipe_file(path, json.dumps(data).encode())
    return METADATA, "is not valid checkpoint metadata"


def state_deleted(storage: CheckpointStorage, checkpoint_id: int) -> tuple[str, str]:
    storage.fs.rm(file_path(storage, checkpoint_id, state_name("sum-1")))
    return state_name("sum-1"), "is missing"


def state_truncated(storage: CheckpointStorage, checkpoint_id: int) -> tuple[str, str]:
    path = file_path(storage, checkpoint_id, state_name("sum-1"))
    raw = storage.fs.cat_file(path)
    storage.fs.pipe_file(path, raw[:-1])
    return state_name("sum-1"), f"has {len(raw) - 1} bytes, the metadata says {len(raw)}"


def state_grown(storage: CheckpointStorage, checkpoint_id: int) -> tuple[str, str]:
    path = file_path(storage, checkpoint_id, state_name("source-0"))
    raw = storage.fs.cat_file(path)
    storage.fs.pipe_file(path, raw + b"!")
    return state_name("source-0"), f"has {len(raw) + 1} bytes"


def state_byte_flipped(storage: CheckpointStorage, checkpoint_id: int) -> tuple[str, str]:
    path = file_path(storage, checkpoint_id, state_name("sum-1"))
    raw = bytearray(storage.fs.cat_file(path))
    raw[len(raw) // 2] ^= 0x01
    storage.fs.pipe_file(path, bytes(raw))
    return state_name("sum-1"), "does not match the digest"


CORRUPTIONS: dict[str, Corruption] = {
    "metadata truncated": metadata_truncated,
    "metadata empty": metadata_empty,
    "metadata not JSON": metadata_not_json,
    "metadata JSON but not an object": metadata_json_not_an_object,
    "metadata wrong format version": metadata_wrong_format,
    "metadata of an older cutline": metadata_old_format,
    "metadata describes another checkpoint": metadata_other_checkpoint,
    "metadata handle without digest": metadata_handle_without_digest,
    "state file deleted": state_deleted,
    "state file truncated": state_truncated,
    "state file grown": state_grown,
    "state file with one byte flipped": state_byte_flipped,
}
METADATA_CORRUPTIONS = [name for name in CORRUPTIONS if name.startswith("metadata")]
STATE_CORRUPTIONS = [name for name in CORRUPTIONS if name.startswith("state")]


# ----------------------------------------------------------------- round trip


def test_round_trip_of_states_and_metadata(url: str) -> None:
    storage = CheckpointStorage(url)
    extra = {"time": 1234.5, "operators": ["source", "sum"], "nested": {"a": None}}
    written = write_checkpoint(storage, 7, generation=3, extra=extra)

    metadata = storage.read_metadata(7)
    assert metadata == written
    assert metadata.checkpoint_id == 7
    assert metadata.generation == 3
    assert metadata.extra == extra
    assert set(metadata.handles) == set(STATES)
    for task, data in STATES.items():
        handle = metadata.handles[task]
        assert handle.path == state_name(task, 3)
        assert handle.size == len(data)
        assert handle.generation == 3
        assert storage.read_state(7, handle) == data
    assert storage.checked_metadata(7) == written


def test_write_state_returns_a_handle_with_size_and_sha256(url: str) -> None:
    storage = CheckpointStorage(url)
    handle = storage.write_state(1, "sum-1", 2, b"abc")
    assert handle == StateHandle(
        "g2-sum-1.state",
        3,
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        2,
    )
    assert StateHandle.from_dict(handle.to_dict()) == handle


def test_on_disk_layout_and_no_temporary_file_left(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path))
    write_checkpoint(storage, 7, generation=2)
    write_checkpoint(storage, 8, generation=2, complete=False)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["chk-7", "chk-8"]
    assert sorted(p.name for p in (tmp_path / "chk-7").iterdir()) == sorted(
        [METADATA, *(state_name(task, 2) for task in STATES)]
    )
    assert sorted(p.name for p in (tmp_path / "chk-8").iterdir()) == sorted(
        state_name(task, 2) for task in STATES
    )
    for task, data in STATES.items():
        assert (tmp_path / "chk-7" / state_name(task, 2)).read_bytes() == data
    on_disk = json.loads((tmp_path / "chk-7" / METADATA).read_bytes())
    assert on_disk["format"] == 2
    assert on_disk["checkpoint_id"] == 7
    assert on_disk["generation"] == 2
    assert on_disk["handles"]["sum-1"]["path"] == state_name("sum-1", 2)


def test_no_temporary_file_left_on_a_url() -> None:
    with memory_url() as url:
        storage = CheckpointStorage(url)
        write_checkpoint(storage, 3)
        names = [p.rsplit("/", 1)[-1] for p in storage.fs.ls(storage.checkpoint_path(3), False)]
        assert sorted(names) == sorted([METADATA, *(state_name(task) for task in STATES)])


def test_rewriting_metadata_replaces_it(url: str) -> None:
    storage = CheckpointStorage(url)
    first = write_checkpoint(storage, 1, extra={"n": 1})
    second = CheckpointMetadata(1, first.generation, first.handles, {"n": 2})
    storage.write_metadata(second)
    assert storage.read_metadata(1) == second


def test_checkpoint_ids_ignore_other_entries(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path))
    write_checkpoint(storage, 10)
    write_checkpoint(storage, 2)
    write_checkpoint(storage, 9, complete=False)
    for name in ("chk-x", "chk-", "chk-3.old", "xchk-4", "other"):
        (tmp_path / name).mkdir()
    (tmp_path / "notes.txt").write_text("hello")
    assert storage.checkpoint_ids() == [2, 9, 10]  # numerically, not as text
    assert storage.completed_ids() == [2, 10]


# ----------------------------------------------------------- incomplete checkpoints


def test_folder_without_metadata_is_incomplete(url: str) -> None:
    storage = CheckpointStorage(url)
    write_checkpoint(storage, 1)
    write_checkpoint(storage, 2, complete=False)

    assert storage.checkpoint_ids() == [1, 2]
    assert storage.completed_ids() == [1]
    assert storage.is_complete(1)
    assert not storage.is_complete(2)
    assert not storage.is_complete(99)
    with raises_naming(CorruptCheckpointError, "incomplete", where(url, 2, METADATA)):
        storage.read_metadata(2)
    metadata, skipped = storage.latest()
    assert metadata is not None
    assert metadata.checkpoint_id == 1
    assert skipped == []  # an incomplete checkpoint is not "skipped": it never counted


def test_only_incomplete_checkpoints_give_nothing(url: str) -> None:
    storage = CheckpointStorage(url)
    write_checkpoint(storage, 1, complete=False)
    write_checkpoint(storage, 2, complete=False)
    assert storage.completed_ids() == []
    assert storage.latest() == (None, [])
    assert storage.latest(check_files=False) == (None, [])


def test_empty_directory_has_no_checkpoint(url: str) -> None:
    storage = CheckpointStorage(url)
    assert storage.checkpoint_ids() == []
    assert storage.completed_ids() == []
    assert storage.latest() == (None, [])


# -------------------------------------------------------------------- latest


def test_latest_returns_the_newest_intact_checkpoint(url: str) -> None:
    storage = CheckpointStorage(url)
    for checkpoint_id in (1, 2, 5):
        write_checkpoint(storage, checkpoint_id)
    write_checkpoint(storage, 6, complete=False)
    metadata, skipped = storage.latest()
    assert metadata == storage.read_metadata(5)
    assert skipped == []


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_latest_falls_back_past_a_corrupt_checkpoint(url: str, corruption: str) -> None:
    storage = CheckpointStorage(url)
    for checkpoint_id in (1, 2, 3):
        write_checkpoint(storage, checkpoint_id)
    write_checkpoint(storage, 4, complete=False)
    damaged, fragment = CORRUPTIONS[corruption](storage, 3)

    metadata, skipped = storage.latest()
    assert metadata is not None
    assert metadata.checkpoint_id == 2
    assert metadata == storage.checked_metadata(2)
    assert [s.checkpoint_id for s in skipped] == [3]
    assert where(url, 3, damaged) in skipped[0].reason
    assert fragment in skipped[0].reason
    with raises_naming(CorruptCheckpointError, where(url, 3, damaged), fragment):
        storage.checked_metadata(3)


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_latest_with_every_checkpoint_corrupt_returns_none(url: str, corruption: str) -> None:
    storage = CheckpointStorage(url)
    for checkpoint_id in (1, 2, 3):
        write_checkpoint(storage, checkpoint_id)
    damaged = {c: CORRUPTIONS[corruption](storage, c)[0] for c in (1, 2, 3)}

    metadata, skipped = storage.latest()
    assert metadata is None
    assert [s.checkpoint_id for s in skipped] == [3, 2, 1]
    for s in skipped:
        assert where(url, s.checkpoint_id, damaged[s.checkpoint_id]) in s.reason


def test_latest_skips_several_differently_corrupt_checkpoints(url: str) -> None:
    storage = CheckpointStorage(url)
    for checkpoint_id in range(1, 6):
        write_checkpoint(storage, checkpoint_id)
    damaged = {
        5: state_byte_flipped(storage, 5)[0],
        4: metadata_not_json(storage, 4)[0],
        3: state_deleted(storage, 3)[0],
    }
    metadata, skipped = storage.latest()
    assert metadata is not None
    assert metadata.checkpoint_id == 2
    assert [s.checkpoint_id for s in skipped] == [5, 4, 3]
    for s in skipped:
        assert where(url, s.checkpoint_id, damaged[s.checkpoint_id]) in s.reason


@pytest.mark.parametrize("corruption", STATE_CORRUPTIONS)
def test_latest_without_verify_does_not_read_state_files(url: str, corruption: str) -> None:
    storage = CheckpointStorage(url)
    write_checkpoint(storage, 1)
    write_checkpoint(storage, 2)
    CORRUPTIONS[corruption](storage, 2)
    metadata, skipped = storage.latest(check_files=False)
    assert metadata is not None
    assert (metadata.checkpoint_id, skipped) == (2, [])


@pytest.mark.parametrize("corruption", METADATA_CORRUPTIONS)
def test_latest_without_verify_still_checks_metadata(url: str, corruption: str) -> None:
    storage = CheckpointStorage(url)
    write_checkpoint(storage, 1)
    write_checkpoint(storage, 2)
    CORRUPTIONS[corruption](storage, 2)
    metadata, skipped = storage.latest(check_files=False)
    assert metadata is not None
    assert metadata.checkpoint_id == 1
    assert [s.checkpoint_id for s in skipped] == [2]
    assert where(url, 2, METADATA) in skipped[0].reason


def test_unreadable_state_file_is_corrupt(tmp_path: Path) -> None:
    # A directory where the state file should be: open() fails with an OSError
    # that is not FileNotFoundError.
    storage = CheckpointStorage(str(tmp_path))
    write_checkpoint(storage, 1)
    write_checkpoint(storage, 2)
    target = tmp_path / "chk-2" / state_name("sum-1")
    target.unlink()
    target.mkdir()
    metadata, skipped = storage.latest()
    assert metadata is not None
    assert metadata.checkpoint_id == 1
    assert skipped == [Skipped(2, skipped[0].reason)]
    assert f"cannot read {target}" in skipped[0].reason


def test_unreadable_metadata_is_corrupt(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path))
    write_checkpoint(storage, 1)
    write_checkpoint(storage, 2, complete=False)
    (tmp_path / "chk-2" / METADATA).mkdir()
    assert storage.is_complete(2)  # it exists, so it counts as written ...
    metadata, skipped = storage.latest()  # ... but it cannot be read
    assert metadata is not None
    assert metadata.checkpoint_id == 1
    assert [s.checkpoint_id for s in skipped] == [2]
    assert f"cannot read {tmp_path / 'chk-2' / METADATA}" in skipped[0].reason


# ------------------------------------------------------------ stale generations


def test_state_file_of_a_stale_generation_is_not_read(url: str) -> None:
    storage = CheckpointStorage(url)
    # Generation 1 wrote its state for checkpoint 4, then failed before the metadata;
    # generation 2 (the restart) wrote the same checkpoint again and completed it.
    stale = storage.write_state(4, "sum-1", 1, b"stale state of the failed attempt")
    metadata = write_checkpoint(storage, 4, generation=2)
    assert storage.fs.exists(file_path(storage, 4, stale.path))

    assert storage.read_metadata(4).handles["sum-1"].path == state_name("sum-1", 2)
    assert storage.read_state(4, metadata.handles["sum-1"]) == STATES["sum-1"]
    # Damaging the stale file changes nothing: only the file the metadata names counts.
    storage.fs.pipe_file(file_path(storage, 4, stale.path), b"garbage")
    latest, skipped = storage.latest()
    assert (latest, skipped) == (metadata, [])


def test_stale_generation_file_is_no_substitute_for_a_missing_one(url: str) -> None:
    storage = CheckpointStorage(url)
    write_checkpoint(storage, 1, generation=1)
    # The stale file has exactly the right bytes, but its name is not the one in the metadata.
    storage.write_state(2, "sum-1", 1, STATES["sum-1"])
    write_checkpoint(storage, 2, generation=2)
    storage.fs.rm(file_path(storage, 2, state_name("sum-1", 2)))

    metadata, skipped = storage.latest()
    assert metadata is not None
    assert metadata.checkpoint_id == 1
    assert [s.checkpoint_id for s in skipped] == [2]
    assert where(url, 2, state_name("sum-1", 2)) in skipped[0].reason
    assert "is missing" in skipped[0].reason


# ------------------------------------------------------------------- removing


def test_discard_removes_the_folder(url: str) -> None:
    storage = CheckpointStorage(url)
    write_checkpoint(storage, 1)
    write_checkpoint(storage, 2)
    write_checkpoint(storage, 3, complete=False)

    storage.discard(2)
    storage.discard(3)
    assert not storage.fs.exists(storage.checkpoint_path(2))
    assert not storage.fs.exists(storage.checkpoint_path(3))
    assert storage.checkpoint_ids() == [1]
    assert storage.completed_ids() == [1]
    assert storage.checked_metadata(1).checkpoint_id == 1
    storage.discard(2)  # again: already gone
    storage.discard(99)  # never existed
    assert storage.checkpoint_ids() == [1]


def test_discard_state_removes_one_file_and_is_quiet_when_gone(url: str) -> None:
    storage = CheckpointStorage(url)
    metadata = write_checkpoint(storage, 5, complete=False)
    handle = metadata.handles["sum-1"]
    storage.discard_state(5, handle)
    assert not storage.fs.exists(file_path(storage, 5, handle.path))
    for task in ("source-0", "sink-2"):
        assert storage.fs.exists(file_path(storage, 5, metadata.handles[task].path))
    storage.discard_state(5, handle)  # already gone
    storage.discard_state(77, handle)  # no such checkpoint


# ----------------------------------------------------------------- bad names


@pytest.mark.parametrize(
    "task",
    ["a/b", "/abs", "..", "../up", ".", "", " ", "a b", " lead", "trail ", "a\nb", "tab\t", "a\\b"],
)
def test_bad_subtask_names_are_refused(url: str, task: str) -> None:
    storage = CheckpointStorage(url)
    with raises_naming(ValueError, repr(task)):
        storage.write_state(1, task, 1, b"x")
    assert storage.checkpoint_ids() == []  # nothing was written, not even the folder


@pytest.mark.parametrize("task", ["a", "source-0", "Sum_1", "x.y", "a..b", "0"])
def test_good_subtask_names_are_accepted(url: str, task: str) -> None:
    storage = CheckpointStorage(url)
    handle = storage.write_state(1, task, 1, b"x")
    assert handle.path == f"g1-{task}.state"
    assert storage.read_state(1, handle) == b"x"


# --------------------------------------------------------------- write failures


@pytest.mark.parametrize("size", [10, 1 << 20], ids=["buffered", "large"])
def test_full_disk_when_writing_state_is_a_storage_error(tmp_path: Path, size: int) -> None:
    storage = CheckpointStorage(str(tmp_path))
    target = tmp_path / "chk-1" / state_name("sum-1")
    target.parent.mkdir()
    target.symlink_to("/dev/full")  # every write to /dev/full fails with ENOSPC
    with raises_naming(StorageError, str(target), "No space left on device") as info:
        storage.write_state(1, "sum-1", 1, b"x" * size)
    assert not isinstance(info.value, CorruptCheckpointError)
    assert isinstance(info.value.__cause__, OSError)
    assert info.value.__cause__.errno == errno.ENOSPC


def test_read_only_folder_when_writing_metadata_is_a_storage_error(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path))
    metadata = write_checkpoint(storage, 1, complete=False)
    folder = tmp_path / "chk-1"
    folder.chmod(0o555)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip(
                "running as root: chmod 0o555 does not stop writes, and the metadata's "
                "temporary name is random, so /dev/full cannot be put in its place "
                "(see the obstructed-folder test for a failure that works as root)"
            )
        with raises_naming(StorageError, str(folder / METADATA), "Permission denied"):
            storage.write_metadata(metadata)
    finally:
        folder.chmod(stat.S_IRWXU)
    assert sorted(p.name for p in folder.iterdir()) == sorted(state_name(t) for t in STATES)
    assert not storage.is_complete(1)


def test_obstructed_folder_when_writing_metadata_is_a_storage_error(tmp_path: Path) -> None:
    # Works as root too: the checkpoint "folder" is a regular file, so neither the
    # folder nor the temporary metadata file can be created.
    storage = CheckpointStorage(str(tmp_path))
    (tmp_path / "chk-1").write_bytes(b"in the way")
    metadata = CheckpointMetadata(1, 1, {}, {})
    with raises_naming(StorageError, str(tmp_path / "chk-1" / METADATA)) as info:
        storage.write_metadata(metadata)
    assert not isinstance(info.value, CorruptCheckpointError)
    assert (tmp_path / "chk-1").read_bytes() == b"in the way"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chk-1"]


# ------------------------------------------------------------ directory URLs


def test_unknown_protocol_is_a_storage_error_naming_the_url() -> None:
    with raises_naming(StorageError, "nosuchproto://x"):
        CheckpointStorage("nosuchproto://x")


def test_checkpoint_dir_that_does_not_exist_lists_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "not" / "yet"
    storage = CheckpointStorage(str(missing))
    assert storage.checkpoint_ids() == []
    assert storage.completed_ids() == []
    assert storage.latest() == (None, [])
    assert not missing.exists()  # reading does not create it
    write_checkpoint(storage, 1)  # writing does
    assert storage.completed_ids() == [1]


def test_file_url_and_trailing_slash_name_the_same_directory(tmp_path: Path) -> None:
    write_checkpoint(CheckpointStorage(str(tmp_path)), 3)
    for url in (f"file://{tmp_path}", f"{tmp_path}/", f"{tmp_path}//"):
        storage = CheckpointStorage(url)
        assert storage.completed_ids() == [3]
        state_deleted(storage, 3)
        _, skipped = storage.latest()
        # The error names the plain local path, without the protocol.
        assert str(tmp_path / "chk-3" / state_name("sum-1")) in skipped[0].reason
        storage.write_state(3, "sum-1", 1, STATES["sum-1"])


def test_memory_errors_name_the_url() -> None:
    with memory_url() as url:
        storage = CheckpointStorage(url)
        write_checkpoint(storage, 1)
        state_truncated(storage, 1)
        with raises_naming(CorruptCheckpointError, f"{url}/chk-1/{state_name('sum-1')}"):
            storage.checked_metadata(1)


# ------------------------------------------------------------------ property

KINDS = ["incomplete", "intact", *CORRUPTIONS]


@settings(max_examples=60)
@given(st.dictionaries(st.integers(1, 20), st.sampled_from(KINDS), max_size=20))
def test_latest_is_the_newest_complete_intact_checkpoint(kinds: dict[int, str]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        storage = CheckpointStorage(directory)
        damaged: dict[int, str] = {}
        for checkpoint_id, kind in kinds.items():
            write_checkpoint(storage, checkpoint_id, complete=kind != "incomplete")
            if kind in CORRUPTIONS:
                damaged[checkpoint_id] = CORRUPTIONS[kind](storage, checkpoint_id)[0]

        expected_skipped: list[int] = []
        expected: int | None = None
        for checkpoint_id in sorted(kinds, reverse=True):
            if kinds[checkpoint_id] == "intact":
                expected = checkpoint_id
                break
            if kinds[checkpoint_id] != "incomplete":
                expected_skipped.append(checkpoint_id)

        assert storage.checkpoint_ids() == sorted(kinds)
        assert storage.completed_ids() == sorted(c for c, k in kinds.items() if k != "incomplete")
        metadata, skipped = storage.latest()
        assert (metadata.checkpoint_id if metadata else None) == expected
        assert [s.checkpoint_id for s in skipped] == expected_skipped
        for s in skipped:
            assert where(directory, s.checkpoint_id, damaged[s.checkpoint_id]) in s.reason
        if metadata is not None:
            for task, data in STATES.items():
                assert storage.read_state(metadata.checkpoint_id, metadata.handles[task]) == data


def test_folders_with_leading_zeros_are_not_checkpoints(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path))
    (tmp_path / "chk-007").mkdir()
    (tmp_path / "chk-0").mkdir()
    assert storage.checkpoint_ids() == [0]


@pytest.mark.parametrize("field", ["format", "checkpoint_id"])
def test_metadata_with_a_boolean_for_a_number_is_corrupt(tmp_path: Path, field: str) -> None:
    storage = CheckpointStorage(str(tmp_path))
    storage.write_metadata(CheckpointMetadata(1, 0, {}, {}))
    path = tmp_path / "chk-1" / "_metadata"
    data = json.loads(path.read_text())
    data[field] = True
    path.write_text(json.dumps(data))
    with pytest.raises(CorruptCheckpointError, match="not valid checkpoint metadata"):
        storage.read_metadata(1)


def test_a_passing_read_error_is_raised_not_skipped(tmp_path: Path) -> None:
    """Restoring an older checkpoint because the newest could not be read *right now* would
    replay output the sinks may already have published: an I/O error must stop the restore."""
    storage = CheckpointStorage(str(tmp_path))
    for checkpoint_id in (1, 2):
        handle = storage.write_state(checkpoint_id, "t", 0, b"state")
        storage.write_metadata(CheckpointMetadata(checkpoint_id, 0, {"t": handle}, {}))
    state = tmp_path / "chk-2" / "g0-t.state"
    state.unlink()
    state.symlink_to("/proc/self/mem")  # reading it fails with a real kernel error (EIO/EINVAL)
    with pytest.raises(StorageError, match="cannot read") as info:
        storage.latest()
    assert not isinstance(info.value, CorruptCheckpointError)
    assert "chk-2/g0-t.state" in str(info.value)


def test_a_handle_may_not_point_outside_its_checkpoint(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path))
    handle = storage.write_state(1, "t", 0, b"x")
    storage.write_metadata(CheckpointMetadata(1, 0, {"t": handle}, {}))
    path = tmp_path / "chk-1" / "_metadata"
    data = json.loads(path.read_text())
    data["handles"]["t"]["path"] = "../chk-7/g0-t.state"
    path.write_text(json.dumps(data))
    with pytest.raises(CorruptCheckpointError, match="not a state file of this checkpoint"):
        storage.read_metadata(1)


# ------------------------------------------- a completed checkpoint that lost its metadata


def checkpoint_stats(checkpoint_id: int, **changes: Any) -> CheckpointStats:
    """Statistics of ``checkpoint_id`` as the driver writes them (completed unless changed)."""
    return CheckpointStats(checkpoint_id=checkpoint_id, generation=1, duration=0.1, **changes)


def lose_metadata(storage: CheckpointStorage, checkpoint_id: int) -> None:
    storage.fs.rm(file_path(storage, checkpoint_id, METADATA))


def test_a_completed_checkpoint_whose_metadata_was_deleted_is_skipped_and_named(url: str) -> None:
    storage = CheckpointStorage(url)
    for checkpoint_id in (1, 2, 3):
        write_checkpoint(storage, checkpoint_id)
        storage.write_stats(checkpoint_stats(checkpoint_id))
    lose_metadata(storage, 3)

    assert storage.completed_ids() == [1, 2]
    assert storage.completed_without_metadata() == [3]
    reason = (
        "checkpoint 3 is incomplete: its _metadata is missing, though its statistics say it "
        f"completed ({where(url, 3, METADATA)} does not exist)"
    )
    assert storage.missing_metadata_reason(3) == reason
    for verify in (True, False):
        metadata, skipped = storage.latest(check_files=verify)
        assert metadata is not None and metadata.checkpoint_id == 2
        assert skipped == [Skipped(3, reason)]


def test_a_lost_metadata_is_named_with_the_damaged_checkpoints_in_order(url: str) -> None:
    storage = CheckpointStorage(url)
    for checkpoint_id in (1, 2, 3, 4):
        write_checkpoint(storage, checkpoint_id)
        storage.write_stats(checkpoint_stats(checkpoint_id))
    lose_metadata(storage, 4)
    state_deleted(storage, 3)
    lose_metadata(storage, 2)
    metadata, skipped = storage.latest()
    assert metadata is not None and metadata.checkpoint_id == 1
    assert [s.checkpoint_id for s in skipped] == [4, 3, 2]
    assert "its _metadata is missing" in skipped[0].reason
    assert "is missing" in skipped[1].reason and state_name("sum-1") in skipped[1].reason
    assert "its _metadata is missing" in skipped[2].reason
    assert storage.completed_without_metadata() == [2, 4]
    # none of this run's (since=): nothing to skip; the newest one of this run only
    assert storage.latest(since=5) == (None, [])
    metadata, skipped = storage.latest(since=4)
    assert metadata is None and [s.checkpoint_id for s in skipped] == [4]


def test_a_lost_metadata_older_than_the_restored_checkpoint_is_not_skipped(url: str) -> None:
    """Nothing was passed over for it: restoring the newest checkpoint is right."""
    storage = CheckpointStorage(url)
    for checkpoint_id in (1, 2):
        write_checkpoint(storage, checkpoint_id)
        storage.write_stats(checkpoint_stats(checkpoint_id))
    lose_metadata(storage, 1)
    metadata, skipped = storage.latest()
    assert metadata is not None and metadata.checkpoint_id == 2
    assert skipped == []
    assert storage.completed_without_metadata() == [1]


@pytest.mark.parametrize(
    "statistics",
    ["none", "aborted", "savepoint", "damaged", "of another checkpoint", "a folder"],
)
def test_a_folder_without_metadata_and_without_completed_statistics_is_as_before(
    url: str, statistics: str
) -> None:
    """In progress, aborted, or nothing known: not reported (the driver removes it)."""
    storage = CheckpointStorage(url)
    write_checkpoint(storage, 1)
    storage.write_stats(checkpoint_stats(1))
    write_checkpoint(storage, 2, complete=False)
    stats_path = f"{storage.root}/_stats/{stats_file(2)}"
    if statistics == "aborted":
        storage.write_stats(checkpoint_stats(2, status="aborted", reason="expired"))
    elif statistics == "savepoint":
        storage.write_stats(checkpoint_stats(2, savepoint=f"{url}/savepoints/sp-2"))
    elif statistics == "damaged":
        storage.fs.pipe_file(stats_path, b'{"kind": "checkpoint", <not json')
    elif statistics == "of another checkpoint":
        storage.fs.pipe_file(stats_path, encode(checkpoint_stats(7)))
    elif statistics == "a folder":
        storage.fs.makedirs(stats_path, exist_ok=True)
    assert storage.completed_without_metadata() == []
    metadata, skipped = storage.latest()
    assert metadata is not None and metadata.checkpoint_id == 1
    assert skipped == []


def test_statistics_without_a_folder_are_a_discarded_checkpoint_not_a_lost_one(url: str) -> None:
    storage = CheckpointStorage(url)
    write_checkpoint(storage, 2)
    for checkpoint_id in (1, 2):
        storage.write_stats(checkpoint_stats(checkpoint_id))
    assert storage.completed_without_metadata() == []
    assert storage.latest()[1] == []


def test_a_passing_read_error_on_the_statistics_is_raised(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path))
    write_checkpoint(storage, 1, complete=False)
    (tmp_path / "_stats").mkdir()
    (tmp_path / "_stats" / stats_file(1)).symlink_to("/proc/self/mem")
    with raises_naming(StorageError, "cannot read", str(tmp_path / "_stats" / stats_file(1))):
        storage.completed_without_metadata()


# ------------------------------------------------- statistics are written atomically


class TornWriter:
    """A file being written that takes half of the first write, then fails with ENOSPC (a
    disk that fills up mid-write)."""

    def __init__(self, file: Any) -> None:
        self.file = file

    def write(self, data: bytes) -> int:
        self.file.write(data[: len(data) // 2])
        self.file.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.file, name)

    def __enter__(self) -> TornWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()


def fail_writes(monkeypatch: pytest.MonkeyPatch, storage: CheckpointStorage, how: str) -> list[str]:
    """Make every file written through ``storage.fs`` fail ``how``; return the paths opened
    for writing."""
    opened: list[str] = []
    real_open = storage.fs.open

    def open_(path: str, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
        file = real_open(path, mode, *args, **kwargs)
        if "w" not in mode:
            return file
        opened.append(path)
        return TornWriter(file) if how == "write" else file

    def fsync(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    def mv(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(storage.fs, "open", open_)
    if how == "fsync":
        monkeypatch.setattr(os, "fsync", fsync)
    if how == "rename":
        monkeypatch.setattr(storage.fs, "mv", mv)
    return opened


def stats_names(storage: CheckpointStorage) -> list[str]:
    folder = f"{storage.root}/_stats"
    return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in storage.fs.ls(folder, detail=False))


@pytest.mark.parametrize("how", ["write", "fsync", "rename"])
def test_a_failed_statistics_write_leaves_no_file_and_the_old_one_intact(
    url: str, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if how == "fsync" and url.startswith("memory://"):
        pytest.skip("an in-memory file has nothing to sync")
    storage = CheckpointStorage(url)
    run = RunInfo("0a1b", 1.0, 2, "aligned", {}, [], {})
    storage.write_stats(run)
    storage.write_stats(checkpoint_stats(1))
    before = {
        name: storage.fs.cat_file(f"{storage.root}/_stats/{name}") for name in stats_names(storage)
    }
    opened = fail_writes(monkeypatch, storage, how)

    ended = dataclasses.replace(run, ended=9.0, outcome="finished")
    for record in (checkpoint_stats(2), ended):  # a new file, and one written again
        with pytest.raises(StorageError, match="cannot write statistics to") as info:
            storage.write_stats(record)
        assert isinstance(info.value.__cause__, OSError)
    assert f"{url}/_stats/run-0a1b.json" in str(info.value)
    assert len(opened) == 2 and all(p.endswith(".tmp") for p in opened)
    monkeypatch.undo()

    assert stats_names(storage) == sorted(before)  # no partial, empty or temporary file
    for name, data in before.items():
        assert storage.fs.cat_file(f"{storage.root}/_stats/{name}") == data
    history = storage.read_history()
    assert history.unreadable == []
    assert [c.checkpoint_id for c in history.checkpoints] == [1]
    assert history.runs == [run]


def test_a_failed_metadata_write_leaves_the_old_metadata(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = CheckpointStorage(url)
    first = write_checkpoint(storage, 1, extra={"n": 1})
    fail_writes(monkeypatch, storage, "write")
    with raises_naming(StorageError, where(url, 1, METADATA), "No space left on device"):
        storage.write_metadata(CheckpointMetadata(1, 1, first.handles, {"n": 2}))
    monkeypatch.undo()
    assert storage.read_metadata(1) == first
    names = [p.rsplit("/", 1)[-1] for p in storage.fs.ls(storage.checkpoint_path(1), False)]
    assert sorted(names) == sorted([METADATA, *(state_name(task) for task in STATES)])


def test_statistics_are_written_whole_under_their_name(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path))
    storage.write_stats(checkpoint_stats(4))
    assert sorted(p.name for p in (tmp_path / "_stats").iterdir()) == [stats_file(4)]
    assert (tmp_path / "_stats" / stats_file(4)).read_bytes() == encode(checkpoint_stats(4))
