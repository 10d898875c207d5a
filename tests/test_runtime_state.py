"""Keyed state: key groups, value / list / map state, snapshots that never change, restore."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline.runtime.state import (
    KeyedStateBackend,
    StateError,
    key_group,
    key_group_range,
    subtask_for_key_group,
)


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
    script = (
        f"from cutline.runtime.state import key_group\nprint([key_group(k, 128) for k in {keys!r}])"
    )
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


def test_equal_keys_share_a_key_group() -> None:
    # keys that are equal in Python (and so one dict key) must land in one key group
    assert key_group(1, 128) == key_group(1.0, 128) == key_group(True, 128)
    assert key_group(0, 128) == key_group(False, 128) == key_group(-0.0, 128)
    assert key_group(("a", 1), 128) == key_group(("a", 1.0), 128)


def test_unhashable_or_unstable_keys_are_refused() -> None:
    backend = KeyedStateBackend(8)
    for key in ([1], {"a": 1}, object()):
        with pytest.raises(StateError, match="no stable hash"):
            backend.set_current_key(key)  # type: ignore[arg-type]


def test_state_needs_a_current_key_in_an_owned_key_group() -> None:
    backend = KeyedStateBackend(8, key_group_range(0, 2, 8))
    with pytest.raises(StateError, match="no current key"):
        backend.value_state("v").get()
    foreign = next(k for k in range(100) if key_group(k, 8) not in backend.key_groups)
    with pytest.raises(StateError, match=f"key group {key_group(foreign, 8)}, which this subtask"):
        backend.set_current_key(foreign)


def test_a_name_keeps_its_kind() -> None:
    backend = KeyedStateBackend()
    backend.value_state("s")
    with pytest.raises(StateError, match="'s' is value state, not list state"):
        backend.list_state("s")


def test_value_list_and_map_state() -> None:
    backend = KeyedStateBackend()
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
    assert sorted(backend.keys("count")) == ["b"]


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


def snapshot_content(blob: bytes) -> dict[str, dict[Any, Any]]:
    restored = KeyedStateBackend(16)
    restored.restore([blob])
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
    backend = KeyedStateBackend(16)
    value, lst, mp = backend.value_state("v"), backend.list_state("l"), backend.map_state("m")
    model: dict[str, dict[Any, Any]] = {"v": {}, "l": {}, "m": {}}
    taken = []
    for op, key, x in operations:
        if op == "snapshot":
            taken.append((backend.snapshot(), model_state(model)))
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
    for snapshot, expected in taken:  # serialized only now, after every later write
        assert snapshot_content(snapshot.serialize()) == expected
    assert snapshot_content(backend.snapshot().serialize()) == model_state(model)


@pytest.mark.parametrize(("before", "after"), [(2, 1), (2, 3), (3, 2), (1, 4)])
def test_restore_at_another_parallelism_redistributes_by_key_group(before: int, after: int) -> None:
    max_p = 32
    old = [KeyedStateBackend(max_p, key_group_range(i, before, max_p)) for i in range(before)]
    for key in range(200):
        owner = old[subtask_for_key_group(key_group(key, max_p), before, max_p)]
        owner.set_current_key(key)
        owner.value_state("v").update(key * 10)
    blobs = [b.snapshot().serialize() for b in old]
    new = [KeyedStateBackend(max_p, key_group_range(i, after, max_p)) for i in range(after)]
    seen: dict[int, int] = {}
    for backend in new:
        backend.restore(blobs)
        for key in backend.keys("v"):
            assert key_group(key, max_p) in backend.key_groups
            backend.set_current_key(key)
            assert key not in seen
            seen[key] = backend.value_state("v").get()  # type: ignore[index]
    assert seen == {k: k * 10 for k in range(200)}


def test_restore_refuses_another_max_parallelism_and_garbage() -> None:
    blob = KeyedStateBackend(16).snapshot().serialize()
    with pytest.raises(StateError, match="max_parallelism 16, this job has 32"):
        KeyedStateBackend(32).restore([blob])
    with pytest.raises(StateError, match="not readable"):
        KeyedStateBackend(16).restore([b"not a pickle"])
