"""The two timer indexes (a heap; a RocksDB database) against a plain model, over random
adds, discards and pops, with timers added while a pop runs (a timer's callback registering
another): every timer due fires once, none that is not due, whatever the index."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline.runtime.state.timers import DiskTimerIndex, MemoryTimerIndex, TimerIndex


def run(index: TimerIndex, seed: int) -> list[frozenset[tuple[int, str, int]]]:
    rng = random.Random(seed)
    model: set[tuple[int, str, int]] = set()
    popped: list[frozenset[tuple[int, str, int]]] = []
    for _ in range(rng.randint(1, 60)):
        roll = rng.random()
        if roll < 0.5:
            timer = (rng.randint(-50, 300), f"k{rng.randrange(8)}", rng.randrange(3))
            index.add(*timer)
            model.add(timer)
        elif roll < 0.7 and model:
            timer = rng.choice(sorted(model))
            index.discard(*timer)
            model.discard(timer)
        else:
            upto = rng.randint(-50, 300)
            fired = []
            for timer in index.pop_due(upto):
                fired.append(timer)
                model.discard(timer)
                # a callback registers another timer, due or not (drawn from the timer that
                # fires, so that both indexes add the same ones whatever their order)
                own = random.Random(f"{seed}/{timer}/{upto}")
                if own.random() < 0.3:
                    added = (own.randint(timer[0] - 20, upto + 20), "cb", own.randrange(1000))
                    index.add(*added)
                    model.add(added)
            assert len(fired) == len(set(fired)), "each timer fires once"
            assert all(due <= upto for due, _, _ in fired)
            assert not any(due <= upto for due, _, _ in model), "every timer due fired"
            popped.append(frozenset(fired))
        assert len(index) == len(model)
    return popped


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_the_memory_and_disk_timer_indexes_fire_every_due_timer_once(
    seed: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    memory = run(MemoryTimerIndex(), seed)
    disk_index = DiskTimerIndex(str(tmp_path_factory.mktemp("timers")), "t")
    try:
        assert run(disk_index, seed) == memory
    finally:
        disk_index.close()


def test_a_disk_index_pops_many_timers_going_on_from_where_it_was(tmp_path: Path) -> None:
    """30,000 timers popped in rounds of 1,000: each round reads on from the last key taken
    (reading from the first would pass over the tombstones of every timer taken before it)."""
    index = DiskTimerIndex(str(tmp_path), "t")
    try:
        for i in range(30_000):
            index.add(i % 997, f"k{i}", None)
        seen = []
        starts: list[bytes | None] = []

        class Watched:
            """The database, with where each pass over its keys starts written down."""

            def __init__(self, db: object) -> None:
                self.db = db

            def keys(self, from_key: bytes | None = None) -> object:
                starts.append(from_key)
                return self.db.keys(from_key=from_key)  # type: ignore[attr-defined]

            def __getattr__(self, name: str) -> object:
                return getattr(self.db, name)

        index._db = Watched(index._db)
        for due, key, _ in index.pop_due(10_000):
            seen.append((due, key))
        assert len(seen) == 30_000 and len(index) == 0
        assert [due for due, _ in seen] == sorted(due for due, _ in seen)
        assert starts[0] is None and all(start is not None for start in starts[1:])
    finally:
        index.close()
