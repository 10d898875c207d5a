"""Both keyed state backends against a model: incremental checkpoint chains restore exactly the
state of their checkpoint (and the same as a full checkpoint), across rescaling, with the disk
backend holding more changed state than its memory; and the errors a restore must give."""

from __future__ import annotations

import contextlib
import copy
import os
import random
from collections import deque
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cutline.runtime.state.backend import KeyedSnapshot, KeyedStateBackend
from cutline.runtime.state.config import BACKENDS, StateConfig
from cutline.runtime.state.factory import new_backend
from cutline.runtime.state.keygroups import (
    StateError,
    key_group,
    key_group_range,
    subtask_for_key_group,
)
from cutline.runtime.state.memory import MemoryStateBackend
from cutline.runtime.state.rocksdb import DiskStateBackend
from cutline.runtime.state.segments import SHARED_PREFIX, MemorySegmentStore

MAX_P = 16
KINDS = {"v": "value", "w": "value", "l": "list", "m": "map"}
"""The states the tests use: name -> kind."""

State = dict[str, dict[Hashable, Any]]
"""name -> key -> value (a list for list state, a dict for map state); no empty tables."""


def read_state(backend: KeyedStateBackend, kinds: Mapping[str, str] = KINDS) -> State:
    """Everything in ``backend``, read through its public interface."""
    out: State = {}
    for name in backend.state_names():
        table: dict[Hashable, Any] = {}
        for key in backend.keys(name):
            backend.set_current_key(key)
            kind = kinds[name]
            if kind == "value":
                table[key] = backend.value_state(name).get()
            elif kind == "list":
                table[key] = backend.list_state(name).get()
            else:
                table[key] = dict(backend.map_state(name).items())
        if table:
            out[name] = table
    return out


def without_empty_tables(model: State) -> State:
    return {name: copy.deepcopy(table) for name, table in model.items() if table}


@contextlib.contextmanager
def opened(
    kind: str,
    tmp_path: Path,
    max_parallelism: int = MAX_P,
    key_groups: range | None = None,
    **config: Any,
) -> Iterator[KeyedStateBackend]:
    backend = new_backend(
        StateConfig(backend=kind, local_dir=str(tmp_path), **config), max_parallelism, key_groups
    )
    try:
        yield backend
    finally:
        backend.close()


def restored_state(
    kind: str,
    tmp_path: Path,
    handles: Sequence[Mapping[str, Any]],
    store: MemorySegmentStore,
    max_parallelism: int = MAX_P,
    kinds: Mapping[str, str] = KINDS,
) -> State:
    """The state a fresh backend of ``kind`` has after restoring ``handles``."""
    with opened(kind, tmp_path, max_parallelism) as fresh:
        fresh.restore(handles, store)
        return read_state(fresh, kinds)


def disk(backend: KeyedStateBackend) -> DiskStateBackend:
    assert isinstance(backend, DiskStateBackend)
    return backend


# --------------------------------------------------------------- the model property test

ALL_KEYS: list[Hashable] = [*range(30), "a", "b", "ü", ("t", 1), ("t", 2)]
keys = st.sampled_from(ALL_KEYS)
small = st.integers(0, 4)
change_op = st.one_of(
    st.tuples(st.just("value"), st.sampled_from(["v", "w"]), keys, small),
    st.tuples(st.just("add"), keys, small),
    st.tuples(st.just("set_list"), keys, st.lists(small, max_size=3)),
    st.tuples(st.just("put"), keys, small, small),
    st.tuples(st.just("remove"), keys, small),
    st.tuples(st.just("clear"), st.sampled_from(sorted(KINDS)), keys),
)


@dataclass(frozen=True)
class Round:
    """Changes, then a checkpoint."""

    changes: list[tuple[Any, ...]]
    flush_first: bool
    """Write (or drop) the checkpoints still pending before this one is taken."""
    id_step: int
    when: str
    """``now``: written at once; ``later``: stays pending during the next round's changes;
    ``never``: the asynchronous part fails (it is never written)."""
    savepoint: bool


rounds = st.lists(
    st.builds(
        Round,
        changes=st.lists(change_op, max_size=8),
        flush_first=st.booleans(),
        id_step=st.integers(1, 2),
        when=st.sampled_from(["now", "now", "later", "never"]),
        savepoint=st.integers(0, 7).map(lambda n: n == 7),
    ),
    min_size=1,
    max_size=6,
)


def apply(backend: KeyedStateBackend, op: tuple[Any, ...]) -> None:
    kind = op[0]
    if kind == "value":
        _, name, key, x = op
        backend.set_current_key(key)
        backend.value_state(name).update(x)
    elif kind == "add":
        _, key, x = op
        backend.set_current_key(key)
        backend.list_state("l").add(x)
    elif kind == "set_list":
        _, key, xs = op
        backend.set_current_key(key)
        backend.list_state("l").update(xs)
    elif kind == "put":
        _, key, user_key, x = op
        backend.set_current_key(key)
        backend.map_state("m").put(user_key, x)
    elif kind == "remove":
        _, key, user_key = op
        backend.set_current_key(key)
        backend.map_state("m").remove(user_key)
    else:
        _, name, key = op
        backend.set_current_key(key)
        {"value": backend.value_state, "list": backend.list_state, "map": backend.map_state}[
            KINDS[name]
        ](name).clear()


def apply_to_model(model: State, op: tuple[Any, ...]) -> None:
    kind = op[0]
    if kind == "value":
        _, name, key, x = op
        model.setdefault(name, {})[key] = x
    elif kind == "add":
        _, key, x = op
        model.setdefault("l", {}).setdefault(key, []).append(x)
    elif kind == "set_list":
        _, key, xs = op
        model.setdefault("l", {})[key] = list(xs)
    elif kind == "put":
        _, key, user_key, x = op
        model.setdefault("m", {}).setdefault(key, {})[user_key] = x
    elif kind == "remove":
        _, key, user_key = op
        mapping = model.get("m", {}).get(key)
        if mapping is not None and user_key in mapping:
            del mapping[user_key]
            if not mapping:
                del model["m"][key]
    else:
        _, name, key = op
        model.get(name, {}).pop(key, None)


@dataclass
class Pending:
    """A checkpoint taken (synchronous part) by both backends, not yet written."""

    checkpoint_id: int
    base: int | None
    savepoint: bool
    never_written: bool
    incremental: KeyedSnapshot
    full: KeyedSnapshot
    expected: State


@pytest.mark.parametrize("kind", BACKENDS)
@settings(
    max_examples=200,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    script=rounds,
    full_every=st.integers(1, 5),
    spill_at=st.sampled_from([None, 3, 1]),
    data=st.data(),
)
def test_every_checkpoint_restores_exactly_its_state(
    kind: str,
    tmp_path: Path,
    script: list[Round],
    full_every: int,
    spill_at: int | None,
    data: st.DataObject,
) -> None:
    """Two backends driven identically, one checkpointing incrementally (chains of at most
    ``full_every`` segments), one in full. Every written checkpoint restores to exactly the
    model's state at the moment it was taken, from either.

    Restores go into a fresh memory backend (opening a database costs ~10 ms); the last
    written checkpoint's chain, when it has increments, into a fresh disk backend too."""
    with (
        opened(kind, tmp_path, incremental=True, full_every=full_every) as backend,
        opened(kind, tmp_path, incremental=False) as reference,
    ):
        if kind == "disk" and spill_at is not None:
            # a tiny spill threshold, so that small examples spill between checkpoints too
            disk(backend)._spill_at = disk(reference)._spill_at = spill_at
        store, reference_store = MemorySegmentStore(), MemorySegmentStore()
        model: State = {}
        pending: deque[Pending] = deque()
        checkpoint_id = 0
        written: list[int] = []  # the checkpoints written so far, in order
        chains: dict[int, list[dict[str, Any]]] = {}  # of written checkpoints (not savepoints)
        newest_base = 0  # the chains older than the newest base written on are forgotten
        last: tuple[dict[str, Any], State] | None = None  # the last handle written

        def write(p: Pending) -> None:
            nonlocal newest_base, last
            handle = p.incremental.write(store, f"cp{p.checkpoint_id}")
            chain = handle["chain"]
            assert 1 <= len(chain) <= full_every
            assert chain[0]["full"] and not any(ref["full"] for ref in chain[1:])
            assert p.incremental.full == (len(chain) == 1)
            can_build = (
                not p.savepoint
                and p.base is not None
                and p.base in chains
                and p.base >= newest_base
                and len(chains[p.base]) < full_every
            )
            if not p.incremental.full:  # incremental: only on the chain of a written checkpoint
                assert p.base is not None and p.base in written and p.base in chains
                assert chain[:-1] == chains[p.base]
            assert p.incremental.full == (not can_build)
            if p.savepoint:
                assert not chain[0]["path"].startswith(SHARED_PREFIX)
            else:
                chains[p.checkpoint_id] = chain
            if p.base is not None:
                newest_base = max(newest_base, p.base)
            written.append(p.checkpoint_id)
            event(f"a chain of {len(chain)}")

            reference_handle = p.full.write(reference_store, f"cp{p.checkpoint_id}")
            assert p.full.full and len(reference_handle["chain"]) == 1

            from_chain = restored_state("memory", tmp_path, [handle], store)
            from_full = restored_state("memory", tmp_path, [reference_handle], reference_store)
            assert from_chain == p.expected
            assert from_full == p.expected
            last = handle, p.expected

        def flush() -> None:
            while pending:
                p = pending.popleft()
                if p.never_written:
                    event("a checkpoint never written")
                else:
                    write(p)

        for round_ in script:
            if pending:
                event("changes while a checkpoint is not written")
            for op in round_.changes:
                apply(backend, op)
                apply(reference, op)
                apply_to_model(model, op)
            for b in (backend, reference):
                assert read_state(b) == without_empty_tables(model)
            if round_.flush_first:
                flush()
            checkpoint_id += round_.id_step
            base_choice = data.draw(st.sampled_from(["newest", "none", "any"]), label="base")
            base = None
            if written and base_choice == "newest":
                base = written[-1]
            elif written and base_choice == "any":
                base = data.draw(st.sampled_from(written), label="any base")
            pending.append(
                Pending(
                    checkpoint_id,
                    base,
                    round_.savepoint,
                    round_.when == "never",
                    backend.snapshot(checkpoint_id, base=base, savepoint=round_.savepoint),
                    reference.snapshot(checkpoint_id, base=base, savepoint=round_.savepoint),
                    without_empty_tables(model),
                )
            )
            if round_.when == "now":
                flush()
        flush()
        if last is not None and kind != "memory" and len(last[0]["chain"]) > 1:
            assert restored_state(kind, tmp_path, [last[0]], store) == last[1]
        if isinstance(backend, DiskStateBackend):
            event(f"spilled: {backend.spills > 0}")


def test_incremental_checkpoints_write_only_the_changes(tmp_path: Path) -> None:
    """The property test's expectations are not empty: increments happen and are small."""
    for kind in BACKENDS:
        with opened(kind, tmp_path, full_every=3) as backend:
            store = MemorySegmentStore()
            for key in range(500):
                backend.set_current_key(key)
                backend.value_state("v").update(key)
            sizes = []
            for checkpoint_id in range(1, 5):
                backend.set_current_key(checkpoint_id)
                backend.value_state("v").update(-1)
                snapshot = backend.snapshot(checkpoint_id, base=checkpoint_id - 1 or None)
                handle = snapshot.write(store, f"cp{checkpoint_id}")
                sizes.append(handle["chain"][-1]["size"])
                assert len(handle["chain"]) == [1, 2, 3, 1][checkpoint_id - 1]
            full, increment = sizes[0], sizes[1]
            assert increment * 10 < full
            assert sizes[3] > full // 2  # the chain was full: a full segment again


# ------------------------------------------------------------------------------ rescaling


def change(backend: KeyedStateBackend, model: State, key: int, round_: int) -> None:
    """One of several kinds of change to ``key``, in ``backend`` and ``model``."""
    backend.set_current_key(key)
    how = (key + round_) % 5
    if how == 0:
        backend.value_state("v").update((key, round_))
        model.setdefault("v", {})[key] = (key, round_)
    elif how == 1:
        backend.list_state("l").add(round_)
        model.setdefault("l", {}).setdefault(key, []).append(round_)
    elif how == 2:
        backend.map_state("m").put(round_, key)
        model.setdefault("m", {}).setdefault(key, {})[round_] = key
    elif how == 3:
        for name in ("v", "l", "m"):
            apply(backend, ("clear", name, key))
            model.get(name, {}).pop(key, None)
    # how == 4: left alone


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize(("p_old", "p_new"), [(1, 2), (2, 1), (2, 4), (4, 2), (3, 2)])
def test_incremental_chains_are_redistributed_by_key_group(
    tmp_path: Path, kind: str, p_old: int, p_new: int
) -> None:
    max_p = 32
    model: State = {}
    store = MemorySegmentStore()
    with contextlib.ExitStack() as stack:
        old = [
            stack.enter_context(
                opened(kind, tmp_path, max_p, key_group_range(i, p_old, max_p), full_every=5)
            )
            for i in range(p_old)
        ]
        handles: list[dict[str, Any]] = []
        for checkpoint_id in (1, 2, 3):
            for key in range(300 + 20 * checkpoint_id):  # new keys each time
                owner = old[subtask_for_key_group(key_group(key, max_p), p_old, max_p)]
                change(owner, model, key, checkpoint_id)
            base = checkpoint_id - 1 or None
            handles = [
                b.snapshot(checkpoint_id, base=base).write(store, f"cp{checkpoint_id}-{i}")
                for i, b in enumerate(old)
            ]
        assert all(len(h["chain"]) == 3 for h in handles)

        new = [
            stack.enter_context(opened(kind, tmp_path, max_p, key_group_range(i, p_new, max_p)))
            for i in range(p_new)
        ]
        merged: State = {}
        for backend in new:
            backend.restore(handles, store, checkpoint_id=3)
            for name, table in read_state(backend).items():
                for restored, value in table.items():
                    assert isinstance(restored, int)
                    assert key_group(restored, max_p) in backend.key_groups
                    assert restored not in merged.get(name, {}), f"{name}/{restored} twice"
                    merged.setdefault(name, {})[restored] = value
        assert merged == without_empty_tables(model)


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_restored_chain_is_continued_incrementally(tmp_path: Path, kind: str) -> None:
    model: State = {}
    store = MemorySegmentStore()
    with opened(kind, tmp_path, full_every=4) as first:
        for checkpoint_id in (1, 2):
            for key in range(100):
                change(first, model, key, checkpoint_id)
            handle = first.snapshot(checkpoint_id, base=checkpoint_id - 1 or None).write(
                store, f"cp{checkpoint_id}"
            )
    with opened(kind, tmp_path, full_every=4) as second:
        second.restore([handle], store, checkpoint_id=2)
        for checkpoint_id in (3, 4, 5):
            for key in range(50, 150):
                change(second, model, key, checkpoint_id)
            snapshot = second.snapshot(checkpoint_id, base=checkpoint_id - 1)
            handle = snapshot.write(store, f"cp{checkpoint_id}")
            assert len(handle["chain"]) == [3, 4, 1][checkpoint_id - 3]
            assert restored_state(kind, tmp_path, [handle], store) == without_empty_tables(model)


# ------------------------------------------------------------ disk: more state than memory


def database_size(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(folder, name))
        for folder, _, names in os.walk(path)
        for name in names
    )


def test_disk_state_larger_than_memory_spills_and_restores_exactly(tmp_path: Path) -> None:
    memory = 1 << 20
    rng = random.Random(5)
    model: dict[Hashable, Any] = {}
    kinds = {"v": "value"}

    def change_many(backends: Sequence[KeyedStateBackend], keys: Iterator[int]) -> None:
        for key in keys:
            delete = key % 7 == 0 and key in model
            value = rng.randbytes(100)
            for b in backends:
                b.set_current_key(key)
                if delete:
                    b.value_state("v").clear()
                else:
                    b.value_state("v").update(value)
            if delete:
                del model[key]
            else:
                model[key] = value

    store, reference_store = MemorySegmentStore(), MemorySegmentStore()
    with (
        opened("disk", tmp_path, memory=memory, full_every=10) as raw,
        opened("disk", tmp_path, memory=memory, incremental=False) as raw_reference,
    ):
        backend, reference = disk(raw), disk(raw_reference)
        both = (backend, reference)

        change_many(both, iter(range(20_000)))
        assert backend.spills > 0
        handle = backend.snapshot(1).write(store, "cp1")
        assert restored_state("disk", tmp_path, [handle], store, kinds=kinds) == {"v": model}

        # 2: half the keys change, some are deleted, new ones come
        spills = backend.spills
        change_many(both, iter(range(10_000, 30_000)))
        assert backend.spills > spills
        snapshots = [b.snapshot(2, base=1) for b in both]
        at_2 = dict(model)
        # changes while checkpoint 2 is not written yet: not in it
        change_many(both, iter(range(25_000, 31_000)))
        handle, reference_handle = (
            snapshots[0].write(store, "cp2"),
            snapshots[1].write(reference_store, "cp2"),
        )
        assert snapshots[0].full is False and snapshots[1].full is True
        assert handle["chain"][-1]["size"] < handle["chain"][0]["size"]
        for restored in (
            restored_state("disk", tmp_path, [handle], store, kinds=kinds),
            restored_state("disk", tmp_path, [reference_handle], reference_store, kinds=kinds),
        ):
            assert restored == {"v": at_2}

        # 3: on the chain of 2, with the changes made while 2 was written, and more
        change_many(both, iter(range(0, 40_000, 3)))
        handle = backend.snapshot(3, base=2).write(store, "cp3")
        reference_handle = reference.snapshot(3, base=2).write(reference_store, "cp3")
        assert len(handle["chain"]) == 3
        for restored in (
            restored_state("disk", tmp_path, [handle], store, kinds=kinds),
            restored_state("disk", tmp_path, [reference_handle], reference_store, kinds=kinds),
        ):
            assert restored == {"v": model}
        assert read_state(backend, kinds) == {"v": model}
        assert database_size(backend.path) > memory


def test_keys_while_a_checkpoint_is_pending_after_a_spill(tmp_path: Path) -> None:
    """Keys deleted and spilled before a snapshot stay deleted while it is being written."""
    with opened("disk", tmp_path, memory=1 << 20) as backend:  # spills beyond ~2048 changes
        state = backend.value_state("v")
        for key in range(3000):
            backend.set_current_key(key)
            state.update(key)
        for key in range(3000):
            backend.set_current_key(key)
            state.clear()
        assert disk(backend).spills > 0
        assert list(backend.keys("v")) == []
        snapshot = backend.snapshot(1)  # written later, by the snapshot thread
        assert list(backend.keys("v")) == [] and len(backend) == 0
        backend.set_current_key(0)
        assert state.get() is None
        snapshot.write(MemorySegmentStore(), "cp1")
        assert list(backend.keys("v")) == [] and len(backend) == 0


# ---------------------------------------------------------------------------- errors


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_handle_of_another_max_parallelism_is_refused(tmp_path: Path, kind: str) -> None:
    store = MemorySegmentStore()
    with opened(kind, tmp_path, 16) as backend:
        backend.set_current_key("k")
        backend.value_state("v").update(1)
        handle = backend.snapshot(1).write(store, "cp1")
    with (
        opened(kind, tmp_path, 64) as other,
        pytest.raises(StateError, match=r"max_parallelism 16\b.*\b64\b"),
    ):
        other.restore([handle], store)


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("damage", ["garbage", "truncated", "emptied"])
def test_a_corrupt_segment_is_named(tmp_path: Path, kind: str, damage: str) -> None:
    store = MemorySegmentStore()
    with opened(kind, tmp_path) as backend:
        for key in range(50):
            backend.set_current_key(key)
            backend.value_state("v").update(key)
        backend.snapshot(1).write(store, "cp1")
        for key in range(5):
            backend.set_current_key(key)
            backend.value_state("v").update(-key)
        handle = backend.snapshot(2, base=1).write(store, "cp2")
    path = handle["chain"][-1]["path"]  # the increment
    data = store.files[path]
    store.files[path] = {
        "garbage": b"\x00not a segment" + data[14:],
        "truncated": data[: len(data) // 2],
        "emptied": b"",
    }[damage]
    with opened(kind, tmp_path) as fresh, pytest.raises(StateError, match=path):
        fresh.restore([handle], store)


@pytest.mark.parametrize("kind", BACKENDS)
def test_snapshots_are_written_in_the_order_they_were_taken(tmp_path: Path, kind: str) -> None:
    store = MemorySegmentStore()
    with opened(kind, tmp_path) as backend:
        backend.set_current_key("k")
        first = backend.snapshot(1)
        second = backend.snapshot(2)
        second.write(store, "cp2")
        with pytest.raises(StateError, match="written in the order"):
            first.write(store, "cp1")
        with pytest.raises(StateError, match="written in the order"):
            second.write(store, "cp2-again")


# ------------------------------------- regressions (bugs this file found in state.py)


@pytest.mark.parametrize("kind", BACKENDS)
def test_an_increment_after_a_snapshot_without_checkpoint_id(tmp_path: Path, kind: str) -> None:
    store = MemorySegmentStore()
    with opened(kind, tmp_path) as backend:
        backend.set_current_key("k")
        backend.value_state("v").update(1)
        backend.snapshot().write(store, "no-id")  # checkpoint_id=None, the default
        backend.snapshot(2).write(store, "cp2")
        backend.value_state("v").update(2)
        backend.snapshot(3, base=2).write(store, "cp3")
        handle = backend.snapshot(4, base=3).write(store, "cp4")
    assert restored_state(kind, tmp_path, [handle], store) == {"v": {"k": 2}}


@pytest.mark.parametrize(
    "kind",
    [
        "memory",
        "disk",
    ],
)
def test_a_numpy_array_value_can_be_cleared(tmp_path: Path, kind: str) -> None:
    np = pytest.importorskip("numpy")
    with opened(kind, tmp_path) as backend:
        backend.set_current_key("k")
        state = backend.value_state("v")
        state.update(np.array([1, 2]))
        backend.snapshot(1)
        state.clear()
        assert state.get() is None


def test_a_segment_with_an_altered_value_is_refused() -> None:
    store = MemorySegmentStore()
    backend = MemoryStateBackend(8)
    backend.set_current_key("k")
    backend.value_state("v").update("hello world")
    handle = backend.snapshot(1).write(store, "cp1")
    (path,) = store.files
    store.files[path] = store.files[path].replace(b"hello", b"jello")
    with pytest.raises(StateError, match=path):
        MemoryStateBackend(8).restore([handle], store)


def test_every_one_byte_change_of_a_segment_is_refused() -> None:
    store = MemorySegmentStore()
    backend = MemoryStateBackend(8)
    for key in range(5):
        backend.set_current_key(key)
        backend.value_state("v").update(f"value-{key}")
        backend.map_state("m").put("x", key)
    handle = backend.snapshot(1).write(store, "cp1")
    (path,) = store.files
    data = store.files[path]
    outcomes = []
    for i in range(len(data)):
        store.files[path] = data[:i] + bytes([data[i] ^ 1]) + data[i + 1 :]
        try:
            MemoryStateBackend(8).restore([handle], store)
            outcomes.append("restored")
        except StateError as exc:
            outcomes.append("named" if path in str(exc) else "StateError without the path")
        except Exception as exc:
            outcomes.append(type(exc).__name__)
    assert set(outcomes) == {"named"}
