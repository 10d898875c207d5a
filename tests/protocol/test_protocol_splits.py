"""Tests of split assignment and bookkeeping (:mod:`cutline.protocol.splits`).

* Unit tests pin the owner of a split (round-robin by ordinal, else a stable hash), what a
  book hands to its reader on a discovery and a restore, and the errors.
* A property test runs a source over random schedules: splits appear while the job runs, each
  subtask lists them at its own moments (so the subtasks know different sets), reads a few
  records of one of its splits at a time, and global checkpoints and failures come at random,
  each failure restoring the last checkpoint at a random parallelism. Within an attempt no
  split is ever given to two subtasks; and the records published (those before each
  restored checkpoint, then the rest) are every record of every split exactly once.
"""

from __future__ import annotations

import random
import zlib
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline.protocol.splits import (
    AddSplit,
    Split,
    SplitBook,
    SplitChanged,
    SplitError,
    SplitState,
    merge_split_states,
    owner,
)


def test_a_split_with_an_ordinal_goes_round_robin_else_by_a_stable_hash() -> None:
    assert [owner(Split(f"p{i}", i), 3) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    named = Split("landing/2026-11-27/part-0007.parquet")
    assert owner(named, 5) == zlib.crc32(named.id.encode()) % 5
    assert {owner(Split(f"f{i}"), 4) for i in range(100)} == {0, 1, 2, 3}


def test_a_discovery_gives_the_reader_only_new_splits_of_its_own() -> None:
    book = SplitBook(1, 2)
    first = book.discovered([Split("a", 0), Split("b", 1), Split("c", 2), Split("d", 3)])
    assert first == [AddSplit(Split("b", 1)), AddSplit(Split("d", 3))]
    assert book.discovered([Split("b", 1), Split("d", 3), Split("f", 5)]) == [
        AddSplit(Split("f", 5))
    ]
    book.finished("b")
    assert book.unfinished == ["d", "f"] and not book.done
    assert book.snapshot({"d": 10, "f": 0}) == {
        "b": SplitState(1, finished=True),
        "d": SplitState(1 + 2, 10),
        "f": SplitState(5, 0),
    }


def test_a_restore_deals_the_splits_again_and_skips_finished_ones() -> None:
    states = merge_split_states(
        [
            {"s0": SplitState(0, 7), "s2": SplitState(2, finished=True)},
            {"s1": SplitState(1, 3), "s3": SplitState(3, 0)},
        ]
    )
    books = [SplitBook(i, 3) for i in range(3)]
    handed = [book.restored(states) for book in books]
    assert handed == [
        [AddSplit(Split("s0", 0), 7), AddSplit(Split("s3", 3), 0)],
        [AddSplit(Split("s1", 1), 3)],
        [],
    ]
    assert books[2].done and books[2].snapshot({}) == {"s2": SplitState(2, finished=True)}
    # a finished split is never added again by a discovery
    assert books[2].discovered([Split("s2", 2), Split("s5", 5)]) == [AddSplit(Split("s5", 5))]


def test_a_split_listed_with_another_version_is_said_to_have_changed_once() -> None:
    book = SplitBook(0, 1)
    assert book.discovered([Split("f", None, "10 bytes")]) == [
        AddSplit(Split("f", None, "10 bytes"))
    ]
    assert book.discovered([Split("f", None, "10 bytes")]) == []
    book.finished("f")
    grown = Split("f", None, "25 bytes")
    assert book.discovered([grown]) == [SplitChanged(grown, "10 bytes", True)]
    assert book.discovered([grown]) == [], "said once per version"
    # the version goes into the checkpoint: a restored book knows it
    state = book.snapshot({})
    assert state == {"f": SplitState(None, None, True, "25 bytes")}
    again = SplitBook(0, 1)
    assert again.restored(state) == []
    assert again.discovered([Split("f", None, "30 bytes")]) == [
        SplitChanged(Split("f", None, "30 bytes"), "25 bytes", True)
    ]


def test_broken_events_are_named() -> None:
    book = SplitBook(0, 1)
    book.discovered([Split("a", 1)])
    with pytest.raises(SplitError, match="listed with ordinal 2, and before with 1"):
        book.discovered([Split("a", 2)])
    with pytest.raises(SplitError, match="does not read it"):
        book.finished("zzz")
    with pytest.raises(SplitError, match="no position for split"):
        book.snapshot({})
    with pytest.raises(SplitError, match="restored once"):
        book.restored({})
    with pytest.raises(SplitError, match="non-empty string"):
        Split("")
    with pytest.raises(SplitError, match="integer of 0 or more"):
        Split("x", -1)
    with pytest.raises(SplitError, match=r"not one of 0 \.\. 1"):
        SplitBook(2, 2)


# ------------------------------------------------------------------------------ properties


class Subtask:
    """One source subtask: its book, and a reader whose position per split is the number of
    records of it read."""

    def __init__(
        self,
        index: int,
        parallelism: int,
        states: dict[str, SplitState] | None,
        listing: list[Split],
    ) -> None:
        self.book = SplitBook(index, parallelism)
        self.positions: dict[str, int] = {}
        if states is not None:
            self.add(self.book.restored(states, listing))

    def add(self, actions: list[AddSplit]) -> None:
        for action in actions:
            assert action.split.id not in self.positions, "a split given twice"
            self.positions[action.split.id] = action.position or 0


@settings(max_examples=400, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), numbering=st.sampled_from(["fixed", "listed", "none"]))
def test_every_record_of_every_split_is_read_once_whatever_the_schedule(
    seed: int, numbering: str
) -> None:
    """``numbering``: ``fixed``, every split has its ordinal (partitions); ``listed``, those
    there when an attempt starts are numbered in name order for that attempt, later ones
    hashed (files); ``none``, every split hashed."""
    rng = random.Random(seed)
    lengths = {f"split-{i:03d}": rng.randint(0, 12) for i in range(rng.randint(1, 30))}
    order = list(lengths)
    rng.shuffle(order)  # the order the splits appear in
    appeared = rng.randint(0, len(order))  # some are there from the start
    ordinals: dict[str, int | None] = {}

    def attempt_starts() -> list[Split]:
        """The listing every subtask of a new attempt shares; the ordinals of this attempt."""
        ordinals.clear()
        if numbering == "fixed":
            ordinals.update({s: i for i, s in enumerate(lengths)})
        elif numbering == "listed":
            ordinals.update({s: i for i, s in enumerate(sorted(order[:appeared]))})
        return [Split(s, o) for s, o in ordinals.items() if s in order[:appeared]]

    def listed(split: str) -> Split:
        return Split(split, ordinals.get(split))

    parallelism = rng.randint(1, 5)
    listing = attempt_starts()
    subtasks = [Subtask(i, parallelism, None, listing) for i in range(parallelism)]
    published: list[tuple[str, int]] = []  # output of restored checkpoints and of the end
    pending: list[tuple[str, int]] = []  # output since the last checkpoint
    checkpoint: dict[str, SplitState] | None = None
    for _ in range(rng.randint(0, 400)):
        roll = rng.random()
        if roll < 0.1 and appeared < len(order):
            appeared += 1  # a new split appears (a file is renamed into the directory)
        elif roll < 0.35:  # a subtask lists the splits there are now
            sub = rng.choice(subtasks)
            sub.add(sub.book.discovered([listed(s) for s in order[:appeared]]))
        elif roll < 0.85:  # a subtask reads a few records of one of its splits
            sub = rng.choice(subtasks)
            unfinished = sub.book.unfinished
            if unfinished:
                split = rng.choice(unfinished)
                start = sub.positions[split]
                end = min(lengths[split], start + rng.randint(1, 4))
                pending += [(split, i) for i in range(start, end)]
                sub.positions[split] = end
                if end == lengths[split]:
                    sub.book.finished(split)
        elif roll < 0.95:  # a checkpoint: every subtask's snapshot at once, then it completes
            snapshots = [
                sub.book.snapshot({s: sub.positions[s] for s in sub.book.unfinished})
                for sub in subtasks
            ]
            checkpoint = merge_split_states(snapshots)
            published += pending
            pending = []
        else:  # a failure: the last checkpoint restored at another parallelism
            pending = []
            parallelism = rng.randint(1, 5)
            listing = attempt_starts()
            subtasks = [Subtask(i, parallelism, checkpoint, listing) for i in range(parallelism)]
        # within an attempt, no split is read by two subtasks
        holders = Counter(s for sub in subtasks for s in sub.positions)
        assert not holders or max(holders.values()) == 1
    # the end: every split is there; each subtask lists and reads until it is done
    appeared = len(order)
    for sub in subtasks:
        sub.add(sub.book.discovered([listed(s) for s in order]))
        for split in sub.book.unfinished:
            pending += [(split, i) for i in range(sub.positions[split], lengths[split])]
            sub.book.finished(split)
        assert sub.book.done
    published += pending
    wanted = [(s, i) for s, n in lengths.items() for i in range(n)]
    assert Counter(published) == Counter(wanted)
