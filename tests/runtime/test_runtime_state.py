"""Keyed state: key groups, value / list / map state, snapshots that never change, restore
(for both backends)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cutline.runtime.state.backend import KeyedSnapshot, KeyedStateBackend
from cutline.runtime.state.config import BACKENDS, StateConfig
from cutline.runtime.state.factory import new_backend
from cutline.runtime.state.keygroups import (
    StateError,
    key_group,
    key_group_range,
    key_groups,
    subtask_for_key_group,
)
from cutline.runtime.state.memory import MemoryStateBackend
from cutline.runtime.state.segments import MemorySegmentStore

MakeBackend = Callable[..., KeyedStateBackend]


@pytest.fixture(params=BACKENDS)
def make_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MakeBackend]:
    """Makes backends of one kind (memory, then disk in tmp_path) and closes them at the end."""
    made: list[KeyedStateBackend] = []

    def make(
        max_parallelism: int = 128, key_groups: range | None = None, **config: Any
    ) -> KeyedStateBackend:
        full_config = StateConfig(backend=request.param, local_dir=str(tmp_path), **config)
        backend = new_backend(full_config, max_parallelism, key_groups)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


@pytest.mark.parametrize("max_parallelism", [1, 7, 128, 1000])
@pytest.mark.parametrize("parallelism", [1, 2, 3, 5])
def test_key_group_ranges_partition_the_key_groups(max_parallelism: int, parallelism: int) -> None:
    if parallelism > max_parallelism:
        with pytest.raises(ValueError, match="between 1 and the maximum parallelism"):
            key_group_range(0, parallelism, max_parallelism)
        return
    ranges = [key_group_range(i, parallelism, max_parallelism) for i in range(parallelism)]
    assert [g for r in ranges for g in r] == list(range(max_parallelism))
    assert all(len(r) >= max_parallelism // parallelism for r in ranges)
    for i, r in enumerate(ranges):
        assert all(subtask_for_key_group(g, parallelism, max_parallelism) == i for g in r)


def test_key_groups_are_the_same_in_every_process() -> None:
    keys = ["k1", "", "ünïcode", 0, -5, 2**70, 1.5, True, None, b"\x00raw", ("a", 1, (None, 2.5))]
    script = f"from cutline.runtime.state.keygroups import key_group\nprint([key_group(k, 128) for k in {keys!r}])"
    outputs = {
        subprocess.run(
            [sys.executable, "-c", script],
            env=dict(os.environ, PYTHONHASHSEED=seed),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("0", "1", "999")
    }
    assert len(outputs) == 1
    assert outputs == {str([key_group(k, 128) for k in keys]) + "\n"}


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.tuples(st.just(pa.int64()), st.lists(st.none() | st.integers(-(2**63), 2**63 - 1))),
        st.tuples(st.just(pa.uint64()), st.lists(st.none() | st.integers(0, 2**64 - 1))),
        st.tuples(st.just(pa.int8()), st.lists(st.none() | st.integers(-128, 127))),
        st.tuples(st.just(pa.string()), st.lists(st.none() | st.text())),
        st.tuples(st.just(pa.large_string()), st.lists(st.none() | st.text(max_size=80))),
        st.tuples(st.just(pa.binary()), st.lists(st.none() | st.binary())),
        st.tuples(st.just(pa.float64()), st.lists(st.none() | st.floats(allow_nan=False))),
        st.tuples(st.just(pa.bool_()), st.lists(st.none() | st.booleans())),
    ),
    st.integers(0, 3),
    st.sampled_from([1, 7, 128, 32768]),
)
def test_a_column_s_key_groups_are_each_value_s(
    column: tuple[pa.DataType, list[Any]], skip: int, max_parallelism: int
) -> None:
    """The vectorized hashing of a shuffle (``key_groups``) puts every key where
    ``key_group`` does (state and records must meet), sliced arrays included."""
    kind, values = column
    array = pa.array(values, kind).slice(min(skip, len(values)))
    expected = [key_group(v, max_parallelism) for v in array.to_pylist()]
    assert key_groups(array, max_parallelism).tolist() == expected
    chunked = pa.chunked_array([array, array], kind)
    assert np.array_equal(key_groups(chunked, max_parallelism), expected * 2)


def test_equal_keys_share_a_key_group() -> None:
    # keys that are equal in Python (and so one dict key) must land in one key group
    assert key_group(1, 128) == key_group(1.0, 128) == key_group(True, 128)
    assert key_group(0, 128) == key_group(False, 128) == key_group(-0.0, 128)
    assert key_group(("a", 1), 128) == key_group(("a", 1.0), 128)


def test_unhashable_or_unstable_keys_are_refused(make_backend: MakeBackend) -> None:
    backend = make_backend(8)
    for key in ([1], {"a": 1}, object()):
        with pytest.raises(StateError, match="no stable hash"):
            backend.set_current_key(key)


def test_state_needs_a_current_key_in_an_owned_key_group(make_backend: MakeBackend) -> None:
    backend = make_backend(8, key_group_range(0, 2, 8))
    with pytest.raises(StateError, match="no current key"):
        backend.value_state("v").get()
    foreign = next(k for k in range(100) if key_group(k, 8) not in backend.key_groups)
    with pytest.raises(StateError, match=f"key group {key_group(foreign, 8)}, which this subtask"):
        backend.set_current_key(foreign)


def test_a_name_keeps_its_kind(make_backend: MakeBackend) -> None:
    backend = make_backend()
    backend.value_state("s")
    with pytest.raises(StateError, match="'s' is value state, not list state"):
        backend.list_state("s")


def test_value_list_and_map_state(make_backend: MakeBackend) -> None:
    backend = make_backend()
    count, seen, last = (
        backend.value_state("count"),
        backend.list_state("seen"),
        backend.map_state("last"),
    )
    for key, item in [("a", 1), ("b", 2), ("a", 3)]:
        backend.set_current_key(key)
        count.update(count.get(0) + 1)
        seen.add(item)
        last.put("item", item)
    backend.set_current_key("a")
    assert (count.get(), seen.get(), last.items()) == (2, [1, 3], [("item", 3)])
    last.remove("item")
    assert not last.contains("item")
    assert list(backend.keys("last")) == ["b"]  # an emptied map leaves no entry
    seen.update([9])
    assert seen.get() == [9]
    count.clear()
    assert count.get("none") == "none"
    assert list(backend.keys("count")) == ["b"]


# ----------------------------------------------------------- snapshot isolation

ops = st.lists(
    st.tuples(
        st.sampled_from(["value", "add", "update", "put", "remove", "clear", "snapshot"]),
        st.integers(0, 5),  # key
        st.integers(0, 3),  # user key / value
    ),
    max_size=60,
)


def model_state(model: dict[str, dict[Any, Any]]) -> dict[str, dict[Any, Any]]:
    return {
        name: {
            k: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v)
            for k, v in table.items()
            if v not in ([], {})
        }
        for name, table in model.items()
    }


def snapshot_content(
    handle: Mapping[str, Any], store: MemorySegmentStore
) -> dict[str, dict[Any, Any]]:
    restored = MemoryStateBackend(16)
    restored.restore([handle], store)
    out: dict[str, dict[Any, Any]] = {"v": {}, "l": {}, "m": {}}
    for name in ("v", "l", "m"):
        if name in restored.state_names():
            for key in restored.keys(name):
                restored.set_current_key(key)
                if name == "v":
                    out[name][key] = restored.value_state("v").get()
                elif name == "l":
                    out[name][key] = restored.list_state("l").get()
                else:
                    out[name][key] = dict(restored.map_state("m").items())
    return {n: {k: v for k, v in t.items() if v not in ([], {})} for n, t in out.items()}


@settings(max_examples=300)
@given(operations=ops)
def test_a_snapshot_never_changes_after_it_was_taken(
    operations: list[tuple[str, int, int]],
) -> None:
    check_snapshots_never_change(MemoryStateBackend(16), operations)


@settings(  # opening a database takes ~10 ms
    max_examples=150,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(operations=ops)
def test_a_disk_snapshot_never_changes_after_it_was_taken(
    tmp_path: Path, operations: list[tuple[str, int, int]]
) -> None:
    config = StateConfig(backend="disk", local_dir=str(tmp_path))
    check_snapshots_never_change(new_backend(config, 16), operations)


def check_snapshots_never_change(
    backend: KeyedStateBackend, operations: list[tuple[str, int, int]]
) -> None:
    try:
        value, lst, mp = backend.value_state("v"), backend.list_state("l"), backend.map_state("m")
        model: dict[str, dict[Any, Any]] = {"v": {}, "l": {}, "m": {}}
        taken: list[tuple[KeyedSnapshot, dict[str, dict[Any, Any]]]] = []
        for op, key, x in operations:
            if op == "snapshot":
                taken.append((backend.snapshot(len(taken) + 1), model_state(model)))
                continue
            backend.set_current_key(key)
            if op == "value":
                value.update(x)
                model["v"][key] = x
            elif op == "add":
                lst.add(x)
                model["l"].setdefault(key, []).append(x)
            elif op == "update":
                lst.update([x, x])
                model["l"][key] = [x, x]
            elif op == "put":
                mp.put(x, key)
                model["m"].setdefault(key, {})[x] = key
            elif op == "remove":
                mp.remove(x)
                model["m"].get(key, {}).pop(x, None)
            else:
                value.clear()
                lst.clear()
                mp.clear()
                for table in model.values():
                    table.pop(key, None)
        store = MemorySegmentStore()
        taken.append((backend.snapshot(len(taken) + 1), model_state(model)))
        for snapshot, expected in taken:  # written only now, after every later write
            handle = snapshot.write(store, f"cp{snapshot.checkpoint_id}")
            assert snapshot_content(handle, store) == expected
    finally:
        backend.close()


@pytest.mark.parametrize(("before", "after"), [(2, 1), (2, 3), (3, 2), (1, 4)])
def test_restore_at_another_parallelism_redistributes_by_key_group(
    make_backend: MakeBackend, before: int, after: int
) -> None:
    max_p = 32
    old = [make_backend(max_p, key_group_range(i, before, max_p)) for i in range(before)]
    for key in range(200):
        owner = old[subtask_for_key_group(key_group(key, max_p), before, max_p)]
        owner.set_current_key(key)
        owner.value_state("v").update(key * 10)
    store = MemorySegmentStore()
    handles = [b.snapshot(1).write(store, f"cp1-{i}") for i, b in enumerate(old)]
    new = [make_backend(max_p, key_group_range(i, after, max_p)) for i in range(after)]
    seen: dict[int, int] = {}
    for backend in new:
        backend.restore(handles, store)
        for restored in backend.keys("v"):
            assert isinstance(restored, int)
            assert key_group(restored, max_p) in backend.key_groups
            backend.set_current_key(restored)
            assert restored not in seen
            seen[restored] = backend.value_state("v").get()
    assert seen == {k: k * 10 for k in range(200)}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_restore_refuses_another_max_parallelism_and_garbage(make_backend: MakeBackend) -> None:
    store = MemorySegmentStore()
    handle = make_backend(16).snapshot(1).write(store, "cp1")
    with pytest.raises(StateError, match="max_parallelism 16, this job has 32"):
        make_backend(32).restore([handle], store)
    with pytest.raises(StateError, match="not written by this version"):
        make_backend(16).restore([{"something": "else"}], store)
    (path,) = store.files
    store.files[path] = b"not a pickle"
    with pytest.raises(StateError, match=f"segment {path} does not match its size and digest"):
        make_backend(16).restore([handle], store)
    # a segment that matches its handle but is not one (a handle pointing at another file)
    store.files[path] = b"not a pickle"
    forged = {
        **handle,
        "chain": [{**handle["chain"][0], "size": 12, "sha256": sha(b"not a pickle")}],
    }
    with pytest.raises(StateError, match=f"segment {path} is not readable"):
        make_backend(16).restore([forged], store)
    del store.files[path]
    with pytest.raises(StateError, match=f"segment {path} is missing"):
        make_backend(16).restore([handle], store)
