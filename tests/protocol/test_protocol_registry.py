"""Tests of the shared state registry (reference counting of the shared files of incremental
checkpoints, ``cutline.protocol.registry``).

The first part checks every event against the exact answer it returns (the files now
unneeded, sorted) and the queries afterwards: ``needed``, ``retained`` and ``pending``.

The second part simulates a job: a real :class:`CheckpointCoordinator` (random retention,
concurrency, timeout and tolerance) triggers checkpoints on top of the newest complete one;
subtasks write a full file or append a new file to their chain of the base; acknowledgements
arrive late or never, checkpoints are declined, time out, are subsumed, their metadata write
fails, savepoints are taken and the job restarts. A set of names plays the file system: a
write adds a file, the registry's answers remove them. After every step:

(a) no needed file is deleted: every file of a retained complete checkpoint, of the base of a
    checkpoint in flight, and every file written for a checkpoint in flight exists;
(b) a file is answered (deleted) at most once, and only a file that exists;
(c) no unneeded file is kept: with nothing in flight and every acknowledgement delivered, the
    files are exactly those of the retained complete checkpoints, apart from the files of
    acknowledgements that were lost and not yet reported with ``orphaned``;

and completing a checkpoint never names a deleted file.

The registry's queries are checked too: it agrees with the coordinator on what is retained
and in flight, and ``needed`` is exactly the files of the retained checkpoints and of the
bases of the checkpoints in flight.

A late acknowledgement may name base files that were deleted meanwhile:
``test_a_late_acknowledgement_does_not_answer_a_deleted_base_file_again`` pins that they are
not answered again (the registry remembers what it answered).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from cutline.protocol import (
    AbortCheckpoint,
    CheckpointCoordinator,
    CheckpointSettings,
    CheckpointStatus,
    DiscardCheckpoint,
    DiscardState,
    FailJob,
    NotifyCheckpointComplete,
    ProtocolError,
    SharedStateRegistry,
    TriggerCheckpoint,
    WriteMetadata,
)


def state(r: SharedStateRegistry) -> tuple[frozenset[str], frozenset[int], dict[int, int | None]]:
    return r.needed, r.retained, dict(r.pending)


def one_complete(files: Iterable[str] = ("a", "b"), checkpoint: int = 1) -> SharedStateRegistry:
    """A registry that heard checkpoint ``checkpoint`` trigger on nothing and complete."""
    r = SharedStateRegistry()
    r.triggered(checkpoint, None)
    assert r.completed(checkpoint, files) == []
    return r


# ============================================================================ unit tests


class TestQueriesAndConstruction:
    def test_an_empty_registry_needs_nothing(self) -> None:
        r = SharedStateRegistry()
        assert state(r) == (frozenset(), frozenset(), {})
        assert r.restarted() == []
        assert r.orphaned([]) == []

    def test_restored_checkpoints_are_retained_and_their_files_needed(self) -> None:
        r = SharedStateRegistry({3: ["a", "b"], 4: iter(["b", "c"])})
        assert state(r) == (frozenset("abc"), frozenset({3, 4}), {})
        assert r.discarded(3) == ["a"]
        assert r.discarded(4) == ["b", "c"]
        assert state(r) == (frozenset(), frozenset(), {})

    def test_restored_registry_answers_stray_files_listed_at_start(self) -> None:
        r = SharedStateRegistry({3: ["a", "b"]})
        assert r.orphaned(["b", "z", "a", "y"]) == ["y", "z"]
        assert state(r) == (frozenset("ab"), frozenset({3}), {})

    def test_restored_checkpoint_with_no_files(self) -> None:
        r = SharedStateRegistry({2: []})
        assert state(r) == (frozenset(), frozenset({2}), {})
        assert r.discarded(2) == []

    def test_queries_are_copies(self) -> None:
        r = one_complete()
        r.triggered(2, 1)
        pending = r.pending
        assert isinstance(pending, dict)
        pending[9] = None
        assert r.pending == {2: 1}


class TestTriggered:
    def test_a_checkpoint_in_flight_on_a_held_base(self) -> None:
        r = one_complete()
        r.triggered(2, 1)
        assert state(r) == (frozenset("ab"), frozenset({1}), {2: 1})

    def test_a_checkpoint_on_no_base(self) -> None:
        r = SharedStateRegistry()
        r.triggered(1, None)
        assert state(r) == (frozenset(), frozenset(), {1: None})

    def test_a_base_the_registry_never_held_gives_nothing_to_build_on(self) -> None:
        r = one_complete()
        r.triggered(2, 7)  # a savepoint, say
        assert r.pending == {2: None}
        # and so nothing is protected for checkpoint 2: discarding 1 frees its files
        assert r.discarded(1) == ["a", "b"]
        assert state(r) == (frozenset(), frozenset(), {2: None})

    def test_a_base_already_released_gives_nothing_to_build_on(self) -> None:
        r = one_complete()
        assert r.discarded(1) == ["a", "b"]
        r.triggered(2, 1)
        assert state(r) == (frozenset(), frozenset(), {2: None})
        assert r.completed(2, ["c"]) == []
        assert state(r) == (frozenset("c"), frozenset({2}), {})

    def test_a_discarded_base_still_held_for_another_checkpoint_can_be_built_on(self) -> None:
        r = one_complete()
        r.triggered(2, 1)
        assert r.discarded(1) == []
        r.triggered(3, 1)
        assert r.pending == {2: 1, 3: 1}
        assert r.aborted(2) == []  # 3 still builds on 1
        assert r.needed == frozenset("ab")
        assert r.aborted(3) == ["a", "b"]

    def test_a_restored_checkpoint_is_a_base(self) -> None:
        r = SharedStateRegistry({5: ["a"]})
        r.triggered(6, 5)
        assert r.pending == {6: 5}
        assert r.discarded(5) == []
        assert r.needed == frozenset("a")

    def test_triggering_a_checkpoint_in_flight_again_is_an_error(self) -> None:
        r = one_complete()
        r.triggered(2, 1)
        with pytest.raises(ProtocolError, match="checkpoint 2 was triggered twice"):
            r.triggered(2, None)
        assert state(r) == (frozenset("ab"), frozenset({1}), {2: 1})

    def test_triggering_a_complete_checkpoint_again_is_an_error(self) -> None:
        r = one_complete()
        with pytest.raises(ProtocolError, match="checkpoint 1 was triggered twice"):
            r.triggered(1, None)
        assert state(r) == (frozenset("ab"), frozenset({1}), {})


class TestCompleted:
    def test_the_first_checkpoint_completes(self) -> None:
        r = SharedStateRegistry()
        r.triggered(1, None)
        assert r.completed(1, ["b", "a", "a"]) == []
        assert state(r) == (frozenset("ab"), frozenset({1}), {})

    def test_an_incremental_checkpoint_shares_its_base_files(self) -> None:
        r = one_complete()
        r.triggered(2, 1)
        assert r.completed(2, ["a", "b", "c"]) == []
        assert state(r) == (frozenset("abc"), frozenset({1, 2}), {})
        assert r.discarded(1) == []  # 2 names all of 1's files
        assert r.discarded(2) == ["a", "b", "c"]

    def test_completion_releases_a_discarded_base_but_keeps_what_it_names(self) -> None:
        r = one_complete()
        r.triggered(2, 1)
        assert r.discarded(1) == []  # base of 2: protected
        assert state(r) == (frozenset("ab"), frozenset(), {2: 1})
        assert r.completed(2, ["a", "c"]) == ["b"]
        assert state(r) == (frozenset("ac"), frozenset({2}), {})

    def test_completion_of_a_full_checkpoint_releases_its_discarded_base(self) -> None:
        r = one_complete()
        r.triggered(2, 1)
        assert r.discarded(1) == []
        assert r.completed(2, ["x"]) == ["a", "b"]
        assert state(r) == (frozenset("x"), frozenset({2}), {})

    def test_a_checkpoint_that_was_never_triggered_may_complete(self) -> None:
        r = SharedStateRegistry()
        assert r.completed(4, ["a"]) == []
        assert state(r) == (frozenset("a"), frozenset({4}), {})

    def test_a_checkpoint_completes_with_no_files(self) -> None:
        r = one_complete()
        r.triggered(2, 1)
        assert r.completed(2, []) == []
        assert state(r) == (frozenset("ab"), frozenset({1, 2}), {})
        assert r.discarded(1) == ["a", "b"]

    def test_completing_one_of_two_on_the_same_base_keeps_the_base_for_the_other(self) -> None:
        r = one_complete()
        r.triggered(2, 1)
        r.triggered(3, 1)
        assert r.completed(2, ["a", "c"]) == []
        assert r.discarded(1) == []  # 3 still builds on it
        assert state(r) == (frozenset("abc"), frozenset({2}), {3: 1})
        assert r.completed(3, ["a", "d"]) == ["b"]
        assert state(r) == (frozenset("acd"), frozenset({2, 3}), {})

    def test_completing_twice_is_an_error(self) -> None:
        r = one_complete()
        with pytest.raises(ProtocolError, match="checkpoint 1 completed twice"):
            r.completed(1, ["c"])
        assert state(r) == (frozenset("ab"), frozenset({1}), {})

    def test_completing_a_discarded_base_still_held_again_is_an_error(self) -> None:
        r = one_complete()
        r.triggered(2, 1)
        assert r.discarded(1) == []
        with pytest.raises(ProtocolError, match="checkpoint 1 completed twice"):
            r.completed(1, ["c"])
        assert state(r) == (frozenset("ab"), frozenset(), {2: 1})

    def test_completing_a_restored_checkpoint_again_is_an_error(self) -> None:
        r = SharedStateRegistry({1: ["a"]})
        with pytest.raises(ProtocolError, match="completed twice"):
            r.completed(1, ["a"])


class TestDiscarded:
    def test_discarding_answers_the_files_no_other_checkpoint_names(self) -> None:
        r = one_complete(["a", "b"])
        r.triggered(2, 1)
        assert r.completed(2, ["b", "c"]) == []
        r.triggered(3, 2)
        assert r.completed(3, ["b", "c", "d"]) == []
        assert r.discarded(1) == ["a"]
        assert r.discarded(3) == ["d"]
        assert state(r) == (frozenset("bc"), frozenset({2}), {})
        assert r.discarded(2) == ["b", "c"]

    def test_a_base_is_protected_while_a_checkpoint_builds_on_it(self) -> None:
        r = one_complete()
        r.triggered(2, 1)
        assert r.discarded(1) == []
        assert state(r) == (frozenset("ab"), frozenset(), {2: 1})
        assert r.aborted(2, ["a", "c"]) == ["a", "b", "c"]
        assert state(r) == (frozenset(), frozenset(), {})

    def test_discarding_twice_is_an_error(self) -> None:
        r = one_complete()
        assert r.discarded(1) == ["a", "b"]
        with pytest.raises(ProtocolError, match="checkpoint 1 is not retained"):
            r.discarded(1)

    def test_discarding_a_protected_base_twice_is_an_error(self) -> None:
        r = one_complete()
        r.triggered(2, 1)
        assert r.discarded(1) == []
        with pytest.raises(ProtocolError, match="checkpoint 1 is not retained"):
            r.discarded(1)
        assert state(r) == (frozenset("ab"), frozenset(), {2: 1})

    @pytest.mark.parametrize("checkpoint", [0, 2, 99])
    def test_discarding_an_unknown_checkpoint_is_an_error(self, checkpoint: int) -> None:
        r = one_complete()
        with pytest.raises(ProtocolError, match=f"checkpoint {checkpoint} is not retained"):
            r.discarded(checkpoint)
        assert state(r) == (frozenset("ab"), frozenset({1}), {})

    def test_discarding_a_checkpoint_in_flight_is_an_error(self) -> None:
        r = one_complete()
        r.triggered(2, 1)
        with pytest.raises(ProtocolError, match="checkpoint 2 is not retained"):
            r.discarded(2)
        assert state(r) == (frozenset("ab"), frozenset({1}), {2: 1})

    def test_discarding_an_aborted_checkpoint_is_an_error(self) -> None:
        # the coordinator's DiscardCheckpoint for a metadata write it abandoned: the driver
        # must not pass it on (its files were given with the abort)
        r = one_complete()
        r.triggered(2, 1)
        assert r.aborted(2, ["a", "c"]) == ["c"]
        with pytest.raises(ProtocolError, match="checkpoint 2 is not retained"):
            r.discarded(2)


class TestAborted:
    def test_an_aborted_checkpoint_frees_its_new_files_not_its_base(self) -> None:
        r = one_complete()
        r.triggered(2, 1)
        assert r.aborted(2, ["a", "b", "c", "d"]) == ["c", "d"]
        assert state(r) == (frozenset("ab"), frozenset({1}), {})

    def test_an_abort_without_acknowledgements(self) -> None:
        r = one_complete()
        r.triggered(2, 1)
        assert r.aborted(2) == []
        assert state(r) == (frozenset("ab"), frozenset({1}), {})

    def test_an_abort_does_not_free_the_files_of_a_retained_checkpoint(self) -> None:
        r = one_complete()
        r.triggered(2, 1)
        r.triggered(3, 1)
        assert r.completed(3, ["a", "x"]) == []
        assert r.aborted(2, ["a", "b", "c"]) == ["c"]  # subsumed by 3
        assert r.discarded(1) == ["b"]
        assert state(r) == (frozenset("ax"), frozenset({3}), {})

    def test_an_abort_of_an_unknown_checkpoint_frees_its_files(self) -> None:
        r = one_complete()
        assert r.aborted(42, ["b", "q"]) == ["q"]
        assert state(r) == (frozenset("ab"), frozenset({1}), {})

    def test_a_file_withheld_at_an_abort_is_answered_once_later(self) -> None:
        r = one_complete()
        r.triggered(2, 1)
        r.triggered(3, 1)
        assert r.discarded(1) == []
        assert r.aborted(2, ["a", "c"]) == ["c"]  # a: 3 builds on 1
        assert r.aborted(3) == ["a", "b"]
        assert r.restarted() == []
        assert r.orphaned([]) == []


class TestSettled:
    def test_a_savepoint_settles_and_releases_its_base(self) -> None:
        r = one_complete()
        r.triggered(2, 1)
        assert r.discarded(1) == []
        assert r.settled(2) == ["a", "b"]
        assert state(r) == (frozenset(), frozenset(), {})

    def test_a_settled_savepoint_is_not_retained(self) -> None:
        r = one_complete()
        r.triggered(2, None)
        assert r.settled(2) == []
        assert state(r) == (frozenset("ab"), frozenset({1}), {})
        with pytest.raises(ProtocolError, match="checkpoint 2 is not retained"):
            r.discarded(2)
        r.triggered(3, 2)  # a savepoint gives nothing to build on
        assert r.pending == {3: None}

    def test_settling_what_is_not_in_flight_answers_nothing(self) -> None:
        r = one_complete()
        assert r.settled(9) == []
        assert state(r) == (frozenset("ab"), frozenset({1}), {})


class TestOrphaned:
    def test_files_no_checkpoint_needs_are_answered(self) -> None:
        r = one_complete()
        r.triggered(2, 1)
        assert r.orphaned(["a", "z", "c", "z"]) == ["c", "z"]
        assert state(r) == (frozenset("ab"), frozenset({1}), {2: 1})

    def test_files_of_a_protected_base_are_withheld_then_answered_once(self) -> None:
        r = one_complete()
        r.triggered(2, 1)
        assert r.discarded(1) == []
        assert r.orphaned(["a", "b", "x"]) == ["x"]
        assert r.settled(2) == ["a", "b"]

    def test_a_late_acknowledgement_of_an_aborted_checkpoint(self) -> None:
        r = one_complete()
        r.triggered(2, 1)
        assert r.aborted(2, ["a", "c"]) == ["c"]
        assert r.orphaned(["a", "b", "d"]) == ["d"]  # the other task's late ack
        assert state(r) == (frozenset("ab"), frozenset({1}), {})

    def test_a_late_acknowledgement_does_not_answer_a_deleted_base_file_again(self) -> None:
        r = one_complete(["a"])
        r.triggered(2, 1)  # a subtask writes ["a", "b"]: an increment on 1
        assert r.aborted(2) == []  # declined by another subtask before the ack came
        assert r.discarded(1) == ["a"]  # the driver deletes a
        assert r.orphaned(["a", "b"]) == ["b"]  # the late ack: a was answered already


class TestRestarted:
    def test_a_restart_ends_every_checkpoint_in_flight(self) -> None:
        r = one_complete()
        r.triggered(2, 1)
        r.triggered(3, None)
        assert r.discarded(1) == []
        assert r.restarted() == ["a", "b"]
        assert state(r) == (frozenset(), frozenset(), {})

    def test_a_restart_keeps_the_retained_checkpoints(self) -> None:
        r = one_complete()
        r.triggered(2, 1)
        assert r.restarted() == []
        assert state(r) == (frozenset("ab"), frozenset({1}), {})
        r.triggered(3, 1)  # the first checkpoint after the restore builds on it
        assert r.pending == {3: 1}
        assert r.completed(3, ["a", "b", "c"]) == []

    def test_late_acknowledgements_after_a_restart_are_orphaned(self) -> None:
        r = one_complete()
        r.triggered(2, 1)
        assert r.restarted() == []
        assert r.orphaned(["a", "b", "c"]) == ["c"]


# ===================================================================== the simulated job


Chain = tuple[str, ...]
"""What a subtask's acknowledgement names: its chain of shared files, oldest first."""
Handles = tuple[tuple[str, Chain], ...]

RESTARTS = ("abort", "orphan", "fresh")
"""How a restart reaches the registry. ``abort``: each checkpoint in flight is aborted with the
acknowledgements it had, then ``restarted()``. ``orphan``: ``restarted()``, then those
acknowledgements' files are ``orphaned``. ``fresh``: the driver crashed too; a new registry is
built from the retained checkpoints and told every file of the directory (``orphaned``)."""


@dataclass(frozen=True)
class Shape:
    tasks: int
    retained: int
    max_concurrent: int
    full_every: int
    timeout: int
    tolerable_failures: int


@dataclass
class Ack:
    run: int
    checkpoint: int
    task: str
    chain: Chain
    new: str | None
    """The file written for it (``None``: for a savepoint, which shares no file)."""


class Job:
    """A job: a real coordinator, the registry, subtasks with chains of files, and the file
    system as a set of names. Each step method returns whether it could do anything."""

    STEPS = (
        *["tick"] * 4,
        *["write"] * 6,
        *["deliver"] * 6,
        *["metadata"] * 4,
        "decline",
        "lose",
        "report",
        "report chain",
        "savepoint",
        "restart",
    )

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        """Skip, rather than fail on, files an ``orphaned`` answer names that were deleted
        already (the bug of ``test_a_late_acknowledgement_does_not_answer_a_deleted_base_
        file_again``); counted in ``stats["double answer"]``."""
        self.tasks = tuple(f"s{i}" for i in range(shape.tasks))
        self.settings = CheckpointSettings(
            interval=1.0,
            timeout=float(shape.timeout),
            max_concurrent=shape.max_concurrent,
            tolerable_failures=shape.tolerable_failures,
            retained=shape.retained,
        )
        self.coordinator: CheckpointCoordinator[str, Chain] = CheckpointCoordinator(
            self.tasks, self.settings
        )
        self.registry = SharedStateRegistry()
        self.now = 0.0
        self.next_id = 1
        self.run = 0
        self.serial = 0
        self.files: set[str] = set()
        """The file system."""
        self.deleted: set[str] = set()
        self.chains: dict[str, dict[int, Chain]] = {t: {} for t in self.tasks}
        """Subtask -> checkpoint -> the chain it wrote for it (this run)."""
        self.bases: dict[int, int | None] = {}
        """Checkpoint -> the newest complete checkpoint when it was triggered."""
        self.named_bases: dict[int, int | None] = {}
        """Checkpoint -> the base the registry was told (``None`` for some savepoints)."""
        self.savepoints: set[int] = set()
        self.to_write: dict[int, set[str]] = {}
        """Checkpoint -> the subtasks that have its barrier and did not write it yet (this
        run; also after it was aborted: they do not know yet)."""
        self.written: dict[int, set[str]] = {}
        self.delivered: dict[int, list[Chain]] = {}
        """Checkpoint in flight -> the acknowledgements the coordinator took."""
        self.acks: list[Ack] = []
        """Written, not delivered yet."""
        self.lost: list[Ack] = []
        """Never delivered, and their files not reported to the registry yet."""
        self.writing: dict[int, Handles] = {}
        """Metadata being written."""
        self.handles: dict[int, Handles] = {}
        self.complete: dict[int, dict[str, Chain]] = {}
        """Every checkpoint (not savepoint) that completed: each subtask's chain."""
        self.restart_due = False
        self.stats: Counter[str] = Counter()
        self._savepoint_next = False

    # ------------------------------------------------------------------ the model

    def files_of(self, checkpoint: int) -> set[str]:
        return {f for chain in self.complete[checkpoint].values() for f in chain}

    def retained(self) -> list[int]:
        """The retained complete checkpoints (the coordinator's retention, less savepoints)."""
        return [n for n in self.coordinator.completed if n in self.complete]

    def retained_files(self) -> set[str]:
        return {f for n in self.retained() for f in self.files_of(n)}

    # ---------------------------------------------------------------- the driver

    def answer(self, files: Sequence[str], how: str) -> None:
        """Delete the files the registry answered."""
        assert list(files) == sorted(set(files)), f"{how}: answer {files} not sorted, unique"
        again = [f for f in files if f in self.deleted]
        assert not again, f"{how} answered {again} again (deleted before)"
        unknown = [f for f in files if f not in self.files]
        assert not unknown, f"{how} answered {unknown}, never written"
        self.files.difference_update(files)
        self.deleted.update(files)

    def apply(self, actions: Iterable[object]) -> None:
        """Carry out the coordinator's actions, in order, telling the registry."""
        for action in actions:
            if isinstance(action, TriggerCheckpoint):
                n = action.checkpoint_id
                self.next_id = n + 1
                self.bases[n] = base = self.coordinator.latest_completed
                if self._savepoint_next:
                    self.savepoints.add(n)
                    # a driver may name a base for a savepoint or not (it builds on none)
                    self.named_bases[n] = base if n % 2 else None
                else:
                    self.named_bases[n] = base
                self.registry.triggered(n, self.named_bases[n])
                self.to_write[n] = set(self.tasks)
                self.written[n] = set()
                self.delivered[n] = []
            elif isinstance(action, WriteMetadata):
                self.writing[action.checkpoint_id] = action.handles
                self.handles[action.checkpoint_id] = action.handles
            elif isinstance(action, NotifyCheckpointComplete):
                n = action.checkpoint_id
                del self.delivered[n]
                if n in self.savepoints:
                    self.stats["savepoint"] += 1
                    self.answer(self.registry.settled(n), "settled")
                    continue
                chains = dict(self.handles[n])
                named = {f for chain in chains.values() for f in chain}
                broken = named - self.files
                assert not broken, f"checkpoint {n} completes naming deleted files {broken}"
                if any(p > n for p in self.coordinator.pending):
                    self.stats["completed with newer in flight"] += 1
                if any(len(c) > 1 for c in chains.values()):
                    self.stats["incremental completed"] += 1
                base = self.bases[n]
                if base in self.complete and base not in self.retained():
                    self.stats["completed on a discarded base"] += 1
                self.complete[n] = chains
                self.answer(self.registry.completed(n, sorted(named)), "completed")
            elif isinstance(action, AbortCheckpoint):
                self.delivered.pop(action.checkpoint_id, None)
                self.stats["subsumed" if action.subsumed else "aborted"] += 1
                files = {f for _, chain in action.handles for f in chain}
                self.answer(self.registry.aborted(action.checkpoint_id, sorted(files)), "aborted")
            elif isinstance(action, DiscardState):
                self.stats["late ack"] += 1
                self.answer(self.registry.orphaned(action.handle), "orphaned")
            elif isinstance(action, DiscardCheckpoint):
                n = action.checkpoint_id
                if n in self.complete:
                    if n in self.registry.pending.values():
                        self.stats["discarded a base in use"] += 1
                    self.answer(self.registry.discarded(n), "discarded")
                else:  # a savepoint, or a metadata write abandoned: no shared file of its own
                    assert n in self.savepoints or n not in self.coordinator.completed
                    self.stats["discarded abandoned or savepoint"] += 1
            elif isinstance(action, FailJob):
                self.stats["failed"] += 1
                self.restart_due = True
            else:  # pragma: no cover
                raise AssertionError(f"unexpected action {action!r}")

    # ------------------------------------------------------------------ the steps

    def tick(self, arg: int) -> bool:
        self.now += 1 + arg % 3
        self.apply(self.coordinator.poll(self.now))
        return True

    def savepoint(self) -> bool:
        self._savepoint_next = True
        try:
            self.apply(self.coordinator.trigger(self.now))
        finally:
            self._savepoint_next = False
        return True

    def write(self, arg: int) -> bool:
        """A subtask writes its part of a checkpoint: a new full chain, or (3 times in 4) its
        chain of the base plus a new file, if it has that chain and it is not full."""
        todo = [(n, t) for n in sorted(self.to_write) for t in sorted(self.to_write[n])]
        if not todo:
            return False
        n, task = todo[arg % len(todo)]
        arg //= len(todo)
        self.to_write[n].discard(task)
        if n in self.savepoints:
            self.acks.append(Ack(self.run, n, task, (), None))
            return True
        base = self.bases[n]
        previous = None if base is None else self.chains[task].get(base)
        self.serial += 1
        if previous is not None and len(previous) < self.shape.full_every and arg % 4:
            new = f"c{n}.{task}.i{self.serial}"
            chain: Chain = (*previous, new)
            if n in self.coordinator.pending:
                gone = set(previous) - self.files
                assert not gone, f"{task} builds checkpoint {n} on deleted files {gone}"
        else:
            new = f"c{n}.{task}.f{self.serial}"
            chain = (new,)
        self.files.add(new)
        self.written[n].add(new)
        self.chains[task][n] = chain
        self.acks.append(Ack(self.run, n, task, chain, new))
        return True

    def deliver(self, arg: int, *, lose: bool = False) -> bool:
        """An acknowledgement in transit arrives (or is lost for good)."""
        if not self.acks:
            return False
        ack = self.acks.pop(arg % len(self.acks))
        if lose:
            self.lost.append(ack)
            return True
        if ack.run < self.run:
            self.stats["ack from before a restart"] += 1
        actions = self.coordinator.acknowledge(ack.checkpoint, ack.task, ack.chain, self.now)
        if ack.checkpoint in self.coordinator.pending:
            self.delivered[ack.checkpoint].append(ack.chain)
        self.apply(actions)
        return True

    def decline(self, arg: int) -> bool:
        todo = [
            (n, t)
            for n in self.coordinator.pending
            if self.coordinator.status(n) is CheckpointStatus.PENDING
            for t in sorted(self.to_write[n])
        ]
        if not todo:
            return False
        n, task = todo[arg % len(todo)]
        self.to_write[n].discard(task)
        self.apply(self.coordinator.decline(n, task, "alignment aborted", self.now))
        return True

    def metadata(self, arg: int) -> bool:
        """A metadata write ends: written, or (1 time in 5) failed."""
        if not self.writing:
            return False
        ids = sorted(self.writing)
        n = ids[arg % len(ids)]
        del self.writing[n]
        if arg // len(ids) % 5 == 0:
            if n in self.coordinator.pending:  # else: abandoned anyway
                self.apply(self.coordinator.metadata_failed(n, "disk full", self.now))
            return True
        if n not in self.coordinator.pending:
            self.stats["abandoned metadata written"] += 1
        self.apply(self.coordinator.metadata_written(n, self.now))
        return True

    def report_lost(self, arg: int, *, whole_chain: bool) -> bool:
        """The driver finds the files of a lost acknowledgement of a checkpoint no longer in
        flight (its chain, or only the file it wrote) and reports them with ``orphaned``."""
        ended = [
            i
            for i, a in enumerate(self.lost)
            if a.run < self.run or a.checkpoint not in self.coordinator.pending
        ]
        if not ended:
            return False
        ack = self.lost.pop(ended[arg % len(ended)])
        files = ack.chain if whole_chain or ack.new is None else (ack.new,)
        self.answer(self.registry.orphaned(files), "orphaned")
        return True

    def restart(self, arg: int) -> bool:
        """The job restarts from its newest retained checkpoint, with a new coordinator;
        subtasks keep only their chain of the restored checkpoint."""
        mode = RESTARTS[arg % len(RESTARTS)]
        arg //= len(RESTARTS)
        self.stats[f"restart {mode}"] += 1
        in_flight = {n: self.delivered[n] for n in self.coordinator.pending}
        if mode == "fresh":  # nothing in transit survives the driver
            self.lost.clear()
            self.acks.clear()
            self.registry = SharedStateRegistry(
                {n: sorted(self.files_of(n)) for n in self.retained()}
            )
            self.answer(self.registry.orphaned(sorted(self.files)), "orphaned")
        else:
            for ack in list(self.acks):  # each in transit arrives late, or (1 in 3) never
                if arg % 3 == 0:
                    self.acks.remove(ack)
                    self.lost.append(ack)
                arg //= 3
            if mode == "abort":
                for n, chains in sorted(in_flight.items()):
                    files = {f for chain in chains for f in chain}
                    self.answer(self.registry.aborted(n, sorted(files)), "aborted")
                self.answer(self.registry.restarted(), "restarted")
            else:
                self.answer(self.registry.restarted(), "restarted")
                files = {f for chains in in_flight.values() for c in chains for f in c}
                self.answer(self.registry.orphaned(sorted(files)), "orphaned")
        self.coordinator = CheckpointCoordinator(
            self.tasks, self.settings, next_id=self.next_id, completed=self.coordinator.completed
        )
        restored = self.coordinator.latest_completed
        for t in self.tasks:
            self.chains[t] = {}
            if restored is not None and restored in self.complete:
                self.chains[t][restored] = self.complete[restored][t]
        self.to_write.clear()
        self.writing.clear()
        self.delivered.clear()
        self.run += 1
        self.restart_due = False
        return True

    # ------------------------------------------------------------------ invariants

    def check(self) -> None:
        retained = self.retained()
        retained_files = self.retained_files()
        # (a) nothing needed was deleted
        gone = retained_files - self.files
        assert not gone, f"files {gone} of retained checkpoints {retained} were deleted"
        needed = set(retained_files)
        for n in self.coordinator.pending:
            base = self.named_bases[n]
            if base is not None and base in self.complete:
                gone = self.files_of(base) - self.files
                assert not gone, f"files {gone} of base {base} of {n} in flight were deleted"
                needed |= self.files_of(base)
            gone = self.written[n] - self.files
            assert not gone, f"files {gone} written for {n} in flight were deleted"
        # the registry agrees with the coordinator and the model
        assert self.registry.retained == frozenset(retained), (self.registry.retained, retained)
        assert set(self.registry.pending) == set(self.coordinator.pending), (
            self.registry.pending,
            self.coordinator.pending,
        )
        assert self.registry.needed == needed, (sorted(self.registry.needed), sorted(needed))
        # (c) nothing unneeded is kept once nothing is in flight or in transit
        if not self.coordinator.pending and not self.acks:
            self.stats["quiescent"] += 1
            stray = {a.new for a in self.lost if a.new is not None and a.new in self.files}
            kept = self.files - stray - retained_files
            assert not kept, f"kept {sorted(kept)}, needed by no retained checkpoint"

    # ------------------------------------------------------------------ a schedule

    def step(self, what: str, arg: int) -> None:
        if what == "tick":
            self.tick(arg)
        elif what == "write":
            self.write(arg) or self.tick(arg)
        elif what == "deliver":
            self.deliver(arg) or self.write(arg) or self.tick(arg)
        elif what == "metadata":
            self.metadata(arg) or self.deliver(arg) or self.tick(arg)
        elif what == "decline":
            self.decline(arg)
        elif what == "lose":
            self.deliver(arg, lose=True)
        elif what in ("report", "report chain"):
            self.report_lost(arg, whole_chain=what == "report chain")
        elif what == "savepoint":
            arg % 4 == 0 and self.savepoint()
        elif what == "restart":
            arg % 3 == 0 and self.restart(arg // 3)
        if self.restart_due:
            self.restart(arg)
        self.check()

    def settle(self, arg: int) -> None:
        """Write, deliver and complete everything; restart (which ends what waits for a lost
        acknowledgement); deliver the late acknowledgements and report every lost one. Then
        the files are exactly those of the retained checkpoints."""
        while True:
            self.to_write = {n: t for n, t in self.to_write.items() if t}
            if not (self.write(0) or self.deliver(0)):
                if not self.writing:
                    break
                n = min(self.writing)
                del self.writing[n]
                self.apply(self.coordinator.metadata_written(n, self.now))
            if self.restart_due:
                self.restart(arg)
            self.check()
        self.restart(arg)
        self.check()
        while self.deliver(0) or self.report_lost(0, whole_chain=arg % 2 == 0):
            self.check()
        assert not self.lost and not self.acks and not self.coordinator.pending
        assert self.files == self.retained_files()
        assert self.registry.needed == self.files
        assert self.registry.restarted() == []


STEP_BYTES = 3


def decode(raw: bytes) -> list[tuple[str, int]]:
    """Three bytes a step: which step, and an argument that picks among its choices (one draw
    of bytes is far cheaper to generate than a list of tuples, and shrinks as well)."""
    return [
        (Job.STEPS[raw[i] % len(Job.STEPS)], int.from_bytes(raw[i + 1 : i + 3]))
        for i in range(0, len(raw) - STEP_BYTES + 1, STEP_BYTES)
    ]


Schedule = Sequence[tuple[str, int]]


def run_schedule(shape: Shape, schedule: Schedule) -> Job:
    job = Job(shape)
    job.check()
    for what, arg in schedule:
        job.step(what, arg)
    job.settle(schedule[-1][1] if schedule else 0)
    return job


shapes = st.builds(
    Shape,
    tasks=st.integers(1, 3),
    retained=st.integers(1, 3),
    max_concurrent=st.integers(1, 3),
    full_every=st.integers(1, 4),
    timeout=st.integers(2, 30),
    tolerable_failures=st.integers(0, 3),
)
schedules = st.binary(min_size=40 * STEP_BYTES, max_size=160 * STEP_BYTES).map(decode)


@settings(max_examples=2500, deadline=None)
@given(shape=shapes, schedule=schedules)
def test_property_random_jobs_keep_exactly_the_needed_files(
    shape: Shape, schedule: Schedule
) -> None:
    job = run_schedule(shape, schedule)
    for name, count in job.stats.items():
        if count:
            event(name)


def seeded_jobs(seed: int, count: int) -> list[tuple[Shape, Schedule]]:
    rng = random.Random(seed)
    jobs: list[tuple[Shape, Schedule]] = []
    for _ in range(count):
        shape = Shape(
            tasks=rng.randint(1, 3),
            retained=rng.randint(1, 3),
            max_concurrent=rng.randint(1, 3),
            full_every=rng.randint(1, 4),
            timeout=rng.randint(2, 30),
            tolerable_failures=rng.randint(0, 3),
        )
        schedule = [
            (rng.choice(Job.STEPS), rng.randrange(2**16)) for _ in range(rng.randint(1, 160))
        ]
        jobs.append((shape, schedule))
    return jobs


def test_the_simulated_jobs_reach_the_interesting_cases() -> None:
    """The property is not vacuous: schedules like its own reach every case it is about."""
    total: Counter[str] = Counter()
    for shape, schedule in seeded_jobs(20240611, 300):
        total += run_schedule(shape, schedule).stats
    for case in (
        "incremental completed",
        "completed with newer in flight",
        "completed on a discarded base",
        "discarded a base in use",
        "subsumed",
        "aborted",
        "late ack",
        "ack from before a restart",
        "abandoned metadata written",
        "discarded abandoned or savepoint",
        "savepoint",
        "failed",
        "restart abort",
        "restart orphan",
        "restart fresh",
        "quiescent",
    ):
        assert total[case] > 0, f"no schedule reached {case!r}: {dict(total)}"


def test_the_simulated_jobs_answer_each_file_once() -> None:
    for shape, schedule in seeded_jobs(20240611, 300):
        run_schedule(shape, schedule)
