"""Unit tests of the sans-IO checkpoint coordinator (SEMANTICS.md §3-§5).

Every event is checked against the exact list of actions it returns (order
matters) and against the queries afterwards: ``pending``, ``completed``,
``status``, ``consecutive_failures`` and ``next_trigger_time``. A property test
drives random settings through random event sequences (time never goes back)
and checks the coordinator's invariants after every step.

Tests marked ``xfail(strict=True, reason="BUG: ...")`` show behaviour believed
to be wrong; they pass (by failing) until the coordinator is fixed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

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
    DuplicateAcknowledgementError,
    FailJob,
    NotifyCheckpointComplete,
    ProtocolError,
    TriggerCheckpoint,
    UnknownCheckpointError,
    UnknownTaskError,
    WriteMetadata,
)

PENDING = CheckpointStatus.PENDING
ACKNOWLEDGED = CheckpointStatus.ACKNOWLEDGED
COMPLETE = CheckpointStatus.COMPLETE
ABORTED = CheckpointStatus.ABORTED

TASKS = ("a", "b", "c")

Coordinator = CheckpointCoordinator[Any, Any]


# --------------------------------------------------------------------- helpers


def make(
    tasks: Iterable[Hashable] = TASKS,
    *,
    next_id: int = 1,
    completed: Iterable[int] = (),
    **kwargs: Any,
) -> Coordinator:
    """A coordinator over ``tasks`` with ``CheckpointSettings(**kwargs)``."""
    return CheckpointCoordinator(
        tasks, CheckpointSettings(**kwargs), next_id=next_id, completed=completed
    )


def acts(actions: Sequence[Any]) -> list[Any]:
    """The returned actions as a list (the coordinator returns a list or a tuple)."""
    return list(actions)


def handle(task: Hashable, checkpoint_id: int) -> str:
    return f"{task}@{checkpoint_id}"


def ack_all(
    c: Coordinator, checkpoint_id: int, now: float, tasks: Iterable[Hashable] = TASKS
) -> list[Any]:
    """Every task in ``tasks`` acknowledges ``checkpoint_id``; the actions of the last one."""
    actions: list[Any] = []
    for task in tasks:
        actions = acts(c.acknowledge(checkpoint_id, task, handle(task, checkpoint_id), now))
    return actions


def complete(
    c: Coordinator, checkpoint_id: int, now: float, tasks: Iterable[Hashable] = TASKS
) -> list[Any]:
    """Acknowledge ``checkpoint_id`` by every task, then write its metadata, at ``now``."""
    tasks = tuple(tasks)
    assert ack_all(c, checkpoint_id, now, tasks) == [
        WriteMetadata(checkpoint_id, tuple((t, handle(t, checkpoint_id)) for t in tasks))
    ]
    return acts(c.metadata_written(checkpoint_id, now))


def trig(checkpoint_id: int, now: float, final: bool = False) -> TriggerCheckpoint:
    return TriggerCheckpoint(checkpoint_id, now, final)


def observe(c: Coordinator, ids: Iterable[int] = range(0, 12)) -> tuple[Any, ...]:
    """Everything the queries say, to compare before and after an event that raised."""
    statuses: dict[int, Any] = {}
    for n in ids:
        try:
            statuses[n] = c.status(n)
        except UnknownCheckpointError:
            statuses[n] = None
    return (
        c.pending,
        c.completed,
        c.latest_completed,
        c.consecutive_failures,
        c.next_trigger_time(),
        statuses,
    )


def raises_naming(exc: type[Exception], *parts: object) -> Any:
    """``pytest.raises(exc)`` whose message contains every one of ``parts`` verbatim."""
    pattern = "".join(f"(?=.*{re.escape(str(p))})" for p in parts)
    return pytest.raises(exc, match=re.compile(pattern, re.DOTALL))


def assert_timeout_abort(action: Any, checkpoint_id: int, handles: tuple[Any, ...]) -> None:
    assert isinstance(action, AbortCheckpoint)
    assert action.checkpoint_id == checkpoint_id
    assert action.handles == handles
    assert action.subsumed is False
    assert "timed out" in action.reason


# ------------------------------------------------------------------ triggering


def test_fresh_coordinator_state() -> None:
    c = make()
    assert c.tasks == frozenset(TASKS)
    assert c.pending == ()
    assert c.completed == ()
    assert c.latest_completed is None
    assert c.consecutive_failures == 0
    assert c.next_trigger_time() == 0.0


def test_first_poll_at_zero_triggers_checkpoint_one() -> None:
    c = make()
    assert acts(c.poll(0)) == [trig(1, 0)]
    assert c.pending == (1,)
    assert c.status(1) is PENDING


def test_poll_before_time_zero_triggers_nothing() -> None:
    c = make()
    assert acts(c.poll(-1.0)) == []
    assert acts(c.poll(0.0)) == [trig(1, 0.0)]


def test_interval_is_respected_from_the_last_trigger() -> None:
    c = make(interval=10, max_concurrent=3)
    assert acts(c.poll(0)) == [trig(1, 0)]
    assert c.next_trigger_time() == 10
    assert acts(c.poll(5)) == []
    assert acts(c.poll(9.999)) == []
    assert acts(c.poll(10)) == [trig(2, 10)]
    assert acts(c.poll(10)) == []
    # a late poll: the next interval counts from when it actually triggered
    assert acts(c.poll(23)) == [trig(3, 23)]
    assert c.next_trigger_time() == 33
    assert acts(c.poll(32.5)) == []
    assert c.pending == (1, 2, 3)


def test_interval_is_respected_even_when_the_previous_checkpoint_completed_early() -> None:
    c = make(interval=10)
    assert acts(c.poll(0)) == [trig(1, 0)]
    assert complete(c, 1, 3) == [NotifyCheckpointComplete(1)]
    assert acts(c.poll(3)) == []
    assert acts(c.poll(9.5)) == []
    assert acts(c.poll(10)) == [trig(2, 10)]


def test_min_pause_counts_from_the_completion_of_the_previous_checkpoint() -> None:
    c = make(interval=1, min_pause=5)
    assert acts(c.poll(0)) == [trig(1, 0)]
    for t in TASKS:  # acknowledgements at 1; the checkpoint ends only when metadata is written
        c.acknowledge(1, t, handle(t, 1), 1)
    assert acts(c.poll(2)) == []
    assert acts(c.metadata_written(1, 3)) == [NotifyCheckpointComplete(1)]
    assert c.next_trigger_time() == 8
    assert acts(c.poll(6)) == []  # 1 + 5 would be due if it counted from the acks
    assert acts(c.poll(7.99)) == []
    assert acts(c.poll(8)) == [trig(2, 8)]
    assert c.next_trigger_time() == 9  # nothing ended since: the interval rules again


def test_min_pause_counts_from_a_decline() -> None:
    c = make(interval=1, min_pause=5, tolerable_failures=5)
    c.poll(0)
    assert acts(c.decline(1, "b", "no", 4)) == [AbortCheckpoint(1, "declined by task 'b': no")]
    assert c.next_trigger_time() == 9
    assert acts(c.poll(8.5)) == []
    assert acts(c.poll(9)) == [trig(2, 9)]


def test_min_pause_larger_than_the_interval_with_several_concurrent_checkpoints() -> None:
    c = make(interval=1, min_pause=4, max_concurrent=3, tolerable_failures=5)
    assert acts(c.poll(0)) == [trig(1, 0)]
    assert acts(c.poll(1)) == [trig(2, 1)]  # nothing ended yet: only the interval counts
    assert acts(c.decline(1, "a", "x", 1.5)) == [AbortCheckpoint(1, "declined by task 'a': x")]
    assert acts(c.poll(2)) == []
    assert acts(c.poll(5)) == []
    assert acts(c.poll(5.5)) == [trig(3, 5.5)]


def test_max_concurrent_one_waits_for_the_checkpoint_in_flight() -> None:
    c = make(interval=1)
    assert acts(c.poll(0)) == [trig(1, 0)]
    assert acts(c.poll(1)) == []
    assert acts(c.poll(5)) == []
    assert ack_all(c, 1, 5)[0].checkpoint_id == 1
    # acknowledged but its metadata not yet written: still in flight
    assert c.status(1) is ACKNOWLEDGED
    assert acts(c.poll(6)) == []
    assert acts(c.metadata_written(1, 7)) == [NotifyCheckpointComplete(1)]
    assert acts(c.poll(7)) == [trig(2, 7)]


def test_max_concurrent_three() -> None:
    c = make(interval=1, max_concurrent=3, tolerable_failures=5)
    assert acts(c.poll(0)) == [trig(1, 0)]
    assert acts(c.poll(1)) == [trig(2, 1)]
    assert acts(c.poll(2)) == [trig(3, 2)]
    assert acts(c.poll(3)) == []
    assert acts(c.poll(10)) == []
    assert c.pending == (1, 2, 3)
    assert acts(c.decline(2, "c", "x", 10)) == [AbortCheckpoint(2, "declined by task 'c': x")]
    assert acts(c.poll(10)) == [trig(4, 10)]
    assert c.pending == (1, 3, 4)
    assert acts(c.poll(20)) == []


def test_interval_none_triggers_only_on_demand() -> None:
    c = make(interval=None, timeout=50, tolerable_failures=1)
    assert c.next_trigger_time() is None
    assert acts(c.poll(0)) == []
    assert acts(c.poll(1000)) == []
    assert acts(c.trigger(1000)) == [trig(1, 1000)]
    assert complete(c, 1, 1001) == [NotifyCheckpointComplete(1)]
    assert acts(c.poll(10_000)) == []
    assert c.next_trigger_time() is None
    # poll still times out what was triggered on demand
    assert acts(c.trigger(10_000)) == [trig(2, 10_000)]
    actions = acts(c.poll(10_050))
    assert len(actions) == 1
    assert_timeout_abort(actions[0], 2, ())
    assert c.pending == ()


def test_trigger_on_demand_ignores_interval_and_max_concurrent() -> None:
    c = make(interval=10)
    assert acts(c.poll(0)) == [trig(1, 0)]
    assert acts(c.trigger(1)) == [trig(2, 1)]
    assert acts(c.trigger(1)) == [trig(3, 1)]
    assert c.pending == (1, 2, 3)
    # an on-demand trigger counts as the last trigger for the interval
    assert c.next_trigger_time() == 11
    assert acts(c.poll(50)) == []  # three in flight, max_concurrent=1


def test_trigger_final_marks_the_action_final() -> None:
    c = make(interval=None)
    assert acts(c.trigger(3, final=True)) == [TriggerCheckpoint(1, 3, final=True)]
    assert acts(c.trigger(4)) == [TriggerCheckpoint(2, 4, final=False)]
    c2 = make()
    assert acts(c2.poll(0)) == [TriggerCheckpoint(1, 0, final=False)]
    assert acts(c2.trigger(0, final=True)) == [TriggerCheckpoint(2, 0, final=True)]


# ---------------------------------------------------------- acknowledgements


def test_acknowledgements_from_every_task_write_metadata_with_every_handle() -> None:
    c = make()
    c.poll(0)
    assert acts(c.acknowledge(1, "b", "hb", 1)) == []
    assert c.status(1) is PENDING
    assert acts(c.acknowledge(1, "c", "hc", 2)) == []
    assert c.status(1) is PENDING
    assert acts(c.acknowledge(1, "a", "ha", 3)) == [
        WriteMetadata(1, (("b", "hb"), ("c", "hc"), ("a", "ha")))
    ]
    assert c.status(1) is ACKNOWLEDGED
    assert c.pending == (1,)
    assert c.completed == ()


def test_a_single_task_job_writes_metadata_on_its_only_acknowledgement() -> None:
    c = make(["only"])
    c.poll(0)
    assert acts(c.acknowledge(1, "only", {"offset": 7}, 0)) == [
        WriteMetadata(1, (("only", {"offset": 7}),))
    ]


def test_acknowledgements_of_concurrent_checkpoints_are_independent() -> None:
    c = make(interval=1, max_concurrent=2)
    c.poll(0)
    c.poll(1)
    assert acts(c.acknowledge(2, "a", "2a", 2)) == []
    assert acts(c.acknowledge(1, "a", "1a", 2)) == []
    assert acts(c.acknowledge(2, "b", "2b", 2)) == []
    assert acts(c.acknowledge(2, "c", "2c", 2)) == [
        WriteMetadata(2, (("a", "2a"), ("b", "2b"), ("c", "2c")))
    ]
    assert c.status(1) is PENDING
    assert c.status(2) is ACKNOWLEDGED


# --------------------------------------------------------- metadata_written


def test_metadata_written_completes_the_checkpoint() -> None:
    c = make()
    c.poll(0)
    ack_all(c, 1, 1)
    assert acts(c.metadata_written(1, 2)) == [NotifyCheckpointComplete(1)]
    assert c.status(1) is COMPLETE
    assert c.pending == ()
    assert c.completed == (1,)
    assert c.latest_completed == 1


def test_completion_subsumes_older_pending_checkpoints_with_their_handles() -> None:
    c = make(interval=1, max_concurrent=4)
    for t in range(4):
        c.poll(t)
    assert c.pending == (1, 2, 3, 4)
    c.acknowledge(1, "a", "1a", 4)
    c.acknowledge(1, "c", "1c", 4)
    ack_all(c, 3, 4)
    c.acknowledge(4, "b", "4b", 4)
    assert acts(c.metadata_written(3, 5)) == [
        NotifyCheckpointComplete(3),
        AbortCheckpoint(1, "subsumed by checkpoint 3", (("a", "1a"), ("c", "1c")), subsumed=True),
        AbortCheckpoint(2, "subsumed by checkpoint 3", (), subsumed=True),
    ]
    assert c.status(1) is ABORTED
    assert c.status(2) is ABORTED
    assert c.status(3) is COMPLETE
    assert c.status(4) is PENDING  # newer ones are untouched
    assert c.pending == (4,)
    assert c.consecutive_failures == 0  # subsumption is not a failure


def test_subsumption_is_not_a_failure_even_with_no_tolerance() -> None:
    c = make(interval=1, max_concurrent=3, tolerable_failures=0)
    for t in range(3):
        c.poll(t)
    ack_all(c, 3, 3)
    actions = acts(c.metadata_written(3, 3))
    assert not any(isinstance(a, FailJob) for a in actions)
    assert [a.checkpoint_id for a in actions if isinstance(a, AbortCheckpoint)] == [1, 2]
    assert acts(c.poll(4)) == [trig(4, 4)]


def test_completion_subsumes_an_older_checkpoint_whose_metadata_is_being_written() -> None:
    c = make(interval=1, max_concurrent=2)
    c.poll(0)
    c.poll(1)
    ack_all(c, 1, 2)
    ack_all(c, 2, 2)
    assert acts(c.metadata_written(2, 3)) == [
        NotifyCheckpointComplete(2),
        AbortCheckpoint(
            1,
            "subsumed by checkpoint 2",
            tuple((t, handle(t, 1)) for t in TASKS),
            subsumed=True,
        ),
    ]
    assert c.status(1) is ABORTED
    assert c.completed == (2,)
    # the metadata write of 1 that was under way can no longer complete it: its folder goes
    assert acts(c.metadata_written(1, 4)) == [DiscardCheckpoint(1)]
    assert c.completed == (2,)
    with raises_naming(ProtocolError, "checkpoint 1", "not waiting for it"):
        c.metadata_written(1, 4)


def test_retention_one_discards_the_previous_checkpoint() -> None:
    c = make(interval=1, retained=1)
    c.poll(0)
    assert complete(c, 1, 0.5) == [NotifyCheckpointComplete(1)]
    assert c.completed == (1,)
    c.poll(1)
    assert complete(c, 2, 1.5) == [NotifyCheckpointComplete(2), DiscardCheckpoint(1)]
    assert c.completed == (2,)
    c.poll(2)
    assert complete(c, 3, 2.5) == [NotifyCheckpointComplete(3), DiscardCheckpoint(2)]
    assert c.completed == (3,)
    assert c.latest_completed == 3


def test_retention_three_discards_the_oldest_in_order() -> None:
    c = make(interval=1, retained=3)
    for n in (1, 2, 3):
        c.poll(n - 1)
        assert complete(c, n, n - 0.5) == [NotifyCheckpointComplete(n)]
    assert c.completed == (1, 2, 3)
    c.poll(3)
    assert complete(c, 4, 3.5) == [NotifyCheckpointComplete(4), DiscardCheckpoint(1)]
    c.poll(4)
    assert complete(c, 5, 4.5) == [NotifyCheckpointComplete(5), DiscardCheckpoint(2)]
    assert c.completed == (3, 4, 5)


def test_completion_actions_come_in_order_notify_subsumed_then_discarded() -> None:
    c = make(interval=1, max_concurrent=2, retained=1)
    c.poll(0)
    complete(c, 1, 0.5)
    c.poll(1)
    c.poll(2)
    ack_all(c, 3, 3)
    assert acts(c.metadata_written(3, 3)) == [
        NotifyCheckpointComplete(3),
        AbortCheckpoint(2, "subsumed by checkpoint 3", (), subsumed=True),
        DiscardCheckpoint(1),
    ]
    assert c.completed == (3,)


def test_completion_resets_the_failure_count() -> None:
    c = make(interval=1, tolerable_failures=5)
    c.poll(0)
    c.decline(1, "a", "x", 0)
    c.poll(1)
    c.decline(2, "a", "x", 1)
    assert c.consecutive_failures == 2
    c.poll(2)
    complete(c, 3, 2)
    assert c.consecutive_failures == 0


# ------------------------------------------------------------------- timeout


def test_timeout_aborts_with_the_handles_that_came_in_then_min_pause_applies() -> None:
    c = make(interval=1, timeout=10, min_pause=5, tolerable_failures=1)
    assert acts(c.poll(0)) == [trig(1, 0)]
    assert acts(c.acknowledge(1, "a", "ha", 2)) == []
    assert acts(c.acknowledge(1, "c", "hc", 3)) == []
    assert acts(c.poll(9.99)) == []
    actions = acts(c.poll(10))
    assert len(actions) == 1  # not due before 10 + min_pause
    assert_timeout_abort(actions[0], 1, (("a", "ha"), ("c", "hc")))
    assert "10 s" in actions[0].reason
    assert c.status(1) is ABORTED
    assert c.pending == ()
    assert c.consecutive_failures == 1
    assert c.next_trigger_time() == 15
    assert acts(c.poll(14.9)) == []
    assert acts(c.poll(15)) == [trig(2, 15)]


def test_timeout_message_counts_and_names_the_missing_tasks() -> None:
    c = make(timeout=2.5, min_pause=100, tolerable_failures=1)
    c.poll(0)
    c.acknowledge(1, "b", "hb", 1)
    (abort,) = acts(c.poll(2.5))
    assert abort.reason == "timed out after 2.5 s waiting for 2 of 3 tasks: a, c"


def test_timeout_message_names_at_most_five_missing_tasks() -> None:
    c = CheckpointCoordinator([f"t{i}" for i in range(8)], CheckpointSettings(timeout=1))
    c.poll(0)
    (abort, _fail) = acts(c.poll(1))
    assert abort.reason.endswith("waiting for 8 of 8 tasks: t0, t1, t2, t3, t4 and 3 more")


def test_timeout_and_the_next_trigger_in_the_same_poll_come_in_that_order() -> None:
    c = make(interval=1, timeout=10, tolerable_failures=1)
    c.poll(0)
    actions = acts(c.poll(10))
    assert len(actions) == 2
    assert_timeout_abort(actions[0], 1, ())
    assert actions[1] == trig(2, 10)


def test_timeouts_are_per_checkpoint() -> None:
    c = make(interval=2, timeout=5, max_concurrent=2, min_pause=100, tolerable_failures=5)
    c.poll(0)
    c.poll(2)
    (abort1,) = acts(c.poll(5))
    assert_timeout_abort(abort1, 1, ())
    assert c.pending == (2,)
    assert acts(c.poll(6.9)) == []
    (abort2,) = acts(c.poll(7))
    assert_timeout_abort(abort2, 2, ())


def test_an_acknowledged_checkpoint_is_not_aborted_by_a_timeout_once_complete() -> None:
    c = make(interval=100, timeout=10)
    c.poll(0)
    complete(c, 1, 9)
    assert acts(c.poll(50)) == []
    assert c.status(1) is COMPLETE


def test_a_checkpoint_whose_metadata_is_being_written_is_not_timed_out() -> None:
    """The write may still land: rolling the tasks back could lose a complete checkpoint. The
    driver bounds the write and reports its failure instead."""
    c = make(interval=1, timeout=10, tolerable_failures=1)
    c.poll(0)
    ack_all(c, 1, 1)
    assert c.status(1) is ACKNOWLEDGED
    assert acts(c.poll(1000)) == []
    assert acts(c.metadata_failed(1, "disk full", 1001)) == [
        AbortCheckpoint(
            1,
            "its metadata could not be written: disk full",
            tuple((t, handle(t, 1)) for t in TASKS),
        )
    ]
    assert c.status(1) is ABORTED
    assert c.consecutive_failures == 1
    with raises_naming(ProtocolError, "checkpoint 1", "not being written"):
        c.metadata_failed(1, "again", 1002)


# ------------------------------------------------------------------- decline


def test_decline_aborts_with_the_handles_that_came_in() -> None:
    c = make(min_pause=1, tolerable_failures=1)
    c.poll(0)
    c.acknowledge(1, "a", "ha", 1)
    assert acts(c.decline(1, "b", "alignment aborted", 2)) == [
        AbortCheckpoint(1, "declined by task 'b': alignment aborted", (("a", "ha"),))
    ]
    assert c.status(1) is ABORTED
    assert c.pending == ()
    assert c.consecutive_failures == 1
    assert c.next_trigger_time() == 3


# ------------------------------------------------------------------ failures


def test_tolerable_failures_zero_fails_the_job_on_the_first_failure() -> None:
    c = make(interval=1, tolerable_failures=0)
    c.poll(0)
    actions = acts(c.decline(1, "a", "disk full", 1))
    assert actions[0] == AbortCheckpoint(1, "declined by task 'a': disk full")
    assert len(actions) == 2
    assert isinstance(actions[1], FailJob)
    assert "disk full" in actions[1].reason
    assert "checkpoint 1" in actions[1].reason
    assert c.next_trigger_time() is None
    for t in (1, 2, 100, 10_000):
        assert acts(c.poll(t)) == []
    assert acts(c.trigger(10_000)) == []
    assert acts(c.trigger(10_000, final=True)) == []
    assert c.pending == ()


def test_tolerable_failures_two_fails_the_job_on_the_third_in_a_row() -> None:
    c = make(interval=1, timeout=5, tolerable_failures=2)
    c.poll(0)
    assert acts(c.decline(1, "a", "x", 1)) == [AbortCheckpoint(1, "declined by task 'a': x")]
    assert c.consecutive_failures == 1
    assert acts(c.poll(1)) == [trig(2, 1)]
    (abort,) = acts(c.poll(6))[:1]
    assert_timeout_abort(abort, 2, ())
    assert c.consecutive_failures == 2
    assert c.pending == (3,)  # the same poll triggered 3
    actions = acts(c.decline(3, "c", "y", 7))
    assert actions[0] == AbortCheckpoint(3, "declined by task 'c': y")
    assert len(actions) == 2
    assert isinstance(actions[1], FailJob)
    assert re.search(r"\b3\b.*\b2\b", actions[1].reason), actions[1].reason
    assert c.consecutive_failures == 3
    assert acts(c.poll(100)) == []


def test_a_completion_resets_the_count_before_it_exceeds_the_tolerance() -> None:
    c = make(interval=1, tolerable_failures=2)
    n = 0
    for outcome in ("fail", "fail", "ok", "fail", "fail", "ok", "fail", "fail"):
        n += 1
        assert acts(c.poll(n)) == [trig(n, n)]
        if outcome == "ok":
            assert complete(c, n, n)[0] == NotifyCheckpointComplete(n)
        else:
            assert acts(c.decline(n, "a", "x", n)) == [
                AbortCheckpoint(n, "declined by task 'a': x")
            ]
    assert c.consecutive_failures == 2
    n += 1
    c.poll(n)
    actions = acts(c.decline(n, "a", "x", n))
    assert [type(a) for a in actions] == [AbortCheckpoint, FailJob]


def test_fail_job_is_returned_exactly_once() -> None:
    c = make(interval=1, timeout=10, max_concurrent=3, tolerable_failures=0)
    c.poll(0)
    c.poll(1)
    c.poll(2)
    actions = acts(c.decline(1, "a", "x", 3))
    # the job restarts: the checkpoints still in flight are aborted with it, not as failures
    assert actions[:2] == [AbortCheckpoint(1, "declined by task 'a': x"), actions[1]]
    assert isinstance(actions[1], FailJob)
    assert actions[2:] == [
        AbortCheckpoint(2, "the job failed"),
        AbortCheckpoint(3, "the job failed"),
    ]
    assert c.pending == ()
    assert acts(c.decline(2, "b", "y", 4)) == []
    assert acts(c.poll(12)) == []
    assert c.consecutive_failures == 1
    assert acts(c.poll(100)) == []


def test_two_timeouts_in_one_poll_fail_the_job_once_after_both_aborts() -> None:
    c = make(interval=0.5, timeout=10, max_concurrent=2, tolerable_failures=1)
    c.poll(0)
    c.poll(0.5)
    assert c.pending == (1, 2)
    actions = acts(c.poll(20))
    assert [type(a) for a in actions] == [AbortCheckpoint, AbortCheckpoint, FailJob]
    assert [a.checkpoint_id for a in actions[:2]] == [1, 2]
    assert acts(c.poll(30)) == []


def test_no_checkpoint_completes_or_triggers_after_fail_job() -> None:
    c = make(interval=1, max_concurrent=2, tolerable_failures=0)
    c.poll(0)
    c.poll(1)
    actions = acts(c.decline(1, "a", "x", 2))
    assert isinstance(actions[1], FailJob)
    assert actions[2:] == [AbortCheckpoint(2, "the job failed")]
    # 2 was still in flight: it is aborted with the job, its late acknowledgements discarded
    assert acts(c.acknowledge(2, "a", "2a", 3)) == [DiscardState(2, "a", "2a")]
    assert c.next_trigger_time() is None
    assert acts(c.poll(50)) == []
    assert acts(c.trigger(50)) == []


# ------------------------------------------------------------ late messages


def test_late_acknowledgement_of_a_declined_checkpoint_discards_its_state() -> None:
    c = make(interval=100, tolerable_failures=1)
    c.poll(0)
    c.decline(1, "a", "x", 1)
    before = observe(c)
    assert acts(c.acknowledge(1, "b", "hb", 2)) == [DiscardState(1, "b", "hb")]
    assert observe(c) == before
    assert c.consecutive_failures == 1


def test_late_acknowledgement_of_a_timed_out_checkpoint_discards_its_state() -> None:
    c = make(interval=100, timeout=5, tolerable_failures=1)
    c.poll(0)
    c.poll(5)
    assert c.status(1) is ABORTED
    assert acts(c.acknowledge(1, "c", "late", 6)) == [DiscardState(1, "c", "late")]


def test_late_acknowledgement_of_a_subsumed_checkpoint_discards_its_state() -> None:
    c = make(interval=1, max_concurrent=2)
    c.poll(0)
    c.poll(1)
    complete(c, 2, 2)
    assert c.status(1) is ABORTED
    assert acts(c.acknowledge(1, "a", "1a", 3)) == [DiscardState(1, "a", "1a")]


def test_late_acknowledgement_of_a_checkpoint_from_before_a_restore_discards_its_state() -> None:
    c = make(next_id=10, completed=[7])
    assert acts(c.acknowledge(8, "a", "h8", 0)) == [DiscardState(8, "a", "h8")]
    assert acts(c.acknowledge(0, "a", "h0", 0)) == [DiscardState(0, "a", "h0")]
    # the restored checkpoint's state is live: an acknowledgement of it is an error, not a discard
    with pytest.raises(DuplicateAcknowledgementError):
        c.acknowledge(7, "a", "h7", 0)


def test_late_decline_returns_nothing() -> None:
    c = make(interval=1, timeout=5, max_concurrent=3, tolerable_failures=5)
    c.poll(0)  # 1: declined
    c.poll(1)  # 2: subsumed
    c.poll(2)  # 3: complete
    c.decline(1, "a", "x", 3)
    complete(c, 3, 3)
    c.poll(3)  # 4: times out
    c.poll(9)
    assert [c.status(n) for n in (1, 2, 3, 4)] == [ABORTED, ABORTED, COMPLETE, ABORTED]
    before = observe(c)
    for n in (1, 2, 4):
        for task in TASKS:
            assert acts(c.decline(n, task, "late", 10)) == []
    assert observe(c) == before
    with pytest.raises(DuplicateAcknowledgementError):  # every task acknowledged 3
        c.decline(3, "a", "late", 10)


def test_a_duplicate_acknowledgement_of_a_complete_checkpoint_is_an_error() -> None:
    c = make()
    c.poll(0)
    complete(c, 1, 1)
    assert c.completed == (1,)
    with pytest.raises(DuplicateAcknowledgementError):
        c.acknowledge(1, "a", handle("a", 1), 2)


# -------------------------------------------------------------------- status


def test_status_of_every_kind_of_checkpoint() -> None:
    c = make(interval=1, max_concurrent=5, tolerable_failures=5, timeout=100, retained=5)
    for t in range(5):
        c.poll(t)
    c.decline(1, "a", "x", 5)
    ack_all(c, 3, 5)
    c.metadata_written(3, 5)  # subsumes 2
    ack_all(c, 4, 5)
    c.acknowledge(5, "a", "5a", 5)
    assert [c.status(n) for n in range(1, 6)] == [ABORTED, ABORTED, COMPLETE, ACKNOWLEDGED, PENDING]


@pytest.mark.parametrize("bad", [0, 6, 99, -1])
def test_status_of_a_never_triggered_id_is_an_error(bad: int) -> None:
    c = make(interval=1, max_concurrent=5)
    for t in range(5):
        c.poll(t)
    with raises_naming(UnknownCheckpointError, f"checkpoint {bad}", "never triggered"):
        c.status(bad)


def test_status_of_a_checkpoint_discarded_beyond_retention() -> None:
    c = make(interval=1, retained=1)
    c.poll(0)
    complete(c, 1, 0)
    c.poll(1)
    assert complete(c, 2, 1) == [NotifyCheckpointComplete(2), DiscardCheckpoint(1)]
    assert c.status(1) is COMPLETE


# ------------------------------------------------------------------- restore


def test_restore_continues_ids_and_keeps_the_completed_ones() -> None:
    c = make(interval=1, retained=2, next_id=8, completed=[5, 7])
    assert c.completed == (5, 7)
    assert c.latest_completed == 7
    assert c.status(5) is COMPLETE
    assert c.status(7) is COMPLETE
    with raises_naming(UnknownCheckpointError, "checkpoint 8"):
        c.status(8)
    assert acts(c.poll(0)) == [trig(8, 0)]
    assert complete(c, 8, 0.5) == [NotifyCheckpointComplete(8), DiscardCheckpoint(5)]
    assert acts(c.poll(1)) == [trig(9, 1)]
    assert c.completed == (7, 8)


def test_restore_with_more_completed_than_retained_discards_them_after_the_next_completion() -> (
    None
):
    c = make(interval=1, retained=1, next_id=4, completed=[1, 2, 3])
    assert c.completed == (1, 2, 3)  # kept until a newer one is complete (SEMANTICS §5)
    c.poll(0)
    assert complete(c, 4, 1) == [
        NotifyCheckpointComplete(4),
        DiscardCheckpoint(1),
        DiscardCheckpoint(2),
        DiscardCheckpoint(3),
    ]
    assert c.completed == (4,)


def test_restore_with_next_id_zero() -> None:
    c = make(next_id=0)
    assert acts(c.poll(0)) == [trig(0, 0)]
    assert complete(c, 0, 0) == [NotifyCheckpointComplete(0)]
    assert c.completed == (0,)


def test_ids_keep_increasing_across_a_restore() -> None:
    c = make(interval=1)
    for n in (1, 2, 3):
        c.poll(n)
        complete(c, n, n)
    restored = make(interval=1, next_id=c.latest_completed + 1, completed=c.completed)
    assert acts(restored.poll(0)) == [trig(4, 0)]


@pytest.mark.parametrize("completed", [[3], [1, 3], [5], [2, 7]])
def test_restore_completed_must_be_below_next_id(completed: list[int]) -> None:
    with raises_naming(ValueError, "completed", "below 3"):
        make(next_id=3, completed=completed)


@pytest.mark.parametrize("next_id", [-1, 1.0, "1", True, None])
def test_restore_next_id_must_be_a_non_negative_integer(next_id: Any) -> None:
    with raises_naming(ValueError, "next_id", repr(next_id)):
        make(next_id=next_id)


@pytest.mark.parametrize("completed", [[5, 3], [3, 3]])
def test_restore_completed_must_be_increasing(completed: list[int]) -> None:
    with raises_naming(ValueError, "completed"):
        make(next_id=10, completed=completed)


# -------------------------------------------------------------------- errors


def test_protocol_errors_are_protocol_errors() -> None:
    for exc in (UnknownCheckpointError, UnknownTaskError, DuplicateAcknowledgementError):
        assert issubclass(exc, ProtocolError)


def test_unknown_task_is_an_error_and_changes_nothing() -> None:
    c = make()
    c.poll(0)
    c.acknowledge(1, "a", "ha", 0)
    before = observe(c)
    with raises_naming(UnknownTaskError, "'z'", "not part of this job"):
        c.acknowledge(1, "z", "hz", 1)
    with raises_naming(UnknownTaskError, "'z'"):
        c.decline(1, "z", "no", 1)
    assert observe(c) == before
    assert ack_all(c, 1, 2, ("b", "c")) == [
        WriteMetadata(1, (("a", "ha"), ("b", handle("b", 1)), ("c", handle("c", 1))))
    ]


@pytest.mark.parametrize("bad", [2, 3, 100, -1])
def test_acknowledging_or_declining_a_never_triggered_id_is_an_error(bad: int) -> None:
    c = make()
    c.poll(0)
    before = observe(c)
    with raises_naming(UnknownCheckpointError, f"checkpoint {bad}", "never triggered"):
        c.acknowledge(bad, "a", "h", 1)
    with raises_naming(UnknownCheckpointError, f"checkpoint {bad}", "never triggered"):
        c.decline(bad, "a", "no", 1)
    assert observe(c) == before


def test_acknowledging_before_any_trigger_is_an_error() -> None:
    c = make()
    with raises_naming(UnknownCheckpointError, "checkpoint 1", "never triggered"):
        c.acknowledge(1, "a", "h", 0)


@pytest.mark.parametrize("bad", [1.0, "1", True])
def test_a_checkpoint_id_that_is_not_an_int_is_unknown(bad: Any) -> None:
    c = make()
    c.poll(0)
    with pytest.raises(UnknownCheckpointError, match="never triggered"):
        c.acknowledge(bad, "a", "h", 1)


def test_a_task_acknowledging_twice_is_an_error_and_keeps_the_first_handle() -> None:
    c = make()
    c.poll(0)
    c.acknowledge(1, "a", "first", 0)
    before = observe(c)
    with raises_naming(DuplicateAcknowledgementError, "'a'", "checkpoint 1", "twice"):
        c.acknowledge(1, "a", "second", 1)
    assert observe(c) == before
    assert ack_all(c, 1, 2, ("b", "c")) == [
        WriteMetadata(1, (("a", "first"), ("b", handle("b", 1)), ("c", handle("c", 1))))
    ]


def test_declining_after_acknowledging_is_an_error() -> None:
    c = make()
    c.poll(0)
    c.acknowledge(1, "b", "hb", 0)
    before = observe(c)
    with raises_naming(DuplicateAcknowledgementError, "'b'", "checkpoint 1", "after acknowledging"):
        c.decline(1, "b", "changed my mind", 1)
    assert observe(c) == before
    assert c.consecutive_failures == 0


def test_answering_after_every_task_acknowledged_is_an_error() -> None:
    c = make()
    c.poll(0)
    ack_all(c, 1, 0)
    before = observe(c)
    for task in TASKS:
        with raises_naming(
            DuplicateAcknowledgementError, repr(task), "checkpoint 1", "after every task"
        ):
            c.acknowledge(1, task, "again", 1)
        with raises_naming(
            DuplicateAcknowledgementError, repr(task), "checkpoint 1", "after every task"
        ):
            c.decline(1, task, "no", 1)
    assert observe(c) == before
    assert acts(c.metadata_written(1, 2)) == [NotifyCheckpointComplete(1)]


def test_metadata_written_for_a_checkpoint_not_waiting_for_it_is_an_error() -> None:
    c = make(interval=1, max_concurrent=5, tolerable_failures=5)
    for t in range(4):
        c.poll(t)
    c.acknowledge(1, "a", "ha", 4)  # 1: pending, partly acknowledged
    c.decline(2, "a", "x", 4)  # 2: aborted
    complete(c, 3, 4)  # 3: complete (1 is subsumed)
    # 4: pending, no acknowledgement; 5, 99: never triggered
    before = observe(c)
    for n in (1, 2, 3, 4, 5, 99, -1):
        with raises_naming(ProtocolError, f"checkpoint {n}", "not waiting for it"):
            c.metadata_written(n, 5)
    assert observe(c) == before


def test_metadata_written_twice_is_an_error() -> None:
    c = make()
    c.poll(0)
    complete(c, 1, 0)
    with raises_naming(ProtocolError, "checkpoint 1", "not waiting for it"):
        c.metadata_written(1, 1)
    assert c.completed == (1,)


@pytest.mark.parametrize(
    ("field_name", "value"),
    [
        ("interval", 0),
        ("interval", -1.0),
        ("interval", math.inf),
        ("interval", math.nan),
        ("timeout", 0),
        ("timeout", -5),
        ("timeout", math.inf),
        ("timeout", math.nan),
        ("min_pause", -0.5),
        ("min_pause", math.inf),
        ("min_pause", math.nan),
        ("max_concurrent", 0),
        ("max_concurrent", -1),
        ("max_concurrent", 1.0),
        ("max_concurrent", True),
        ("tolerable_failures", -1),
        ("tolerable_failures", 1.5),
        ("retained", 0),
        ("retained", 2.0),
    ],
)
def test_invalid_settings_name_the_bad_field(field_name: str, value: Any) -> None:
    with raises_naming(ValueError, "invalid checkpoint settings", field_name, repr(value)):
        CheckpointSettings(**{field_name: value})


def test_invalid_settings_name_every_bad_field() -> None:
    with raises_naming(
        ValueError,
        "interval",
        "timeout",
        "min_pause",
        "max_concurrent",
        "tolerable_failures",
        "retained",
    ):
        CheckpointSettings(
            interval=-1,
            timeout=0,
            min_pause=-1,
            max_concurrent=0,
            tolerable_failures=-1,
            retained=0,
        )


def test_boundary_settings_are_valid() -> None:
    s = CheckpointSettings(
        interval=None, timeout=1e-9, min_pause=0, max_concurrent=1, tolerable_failures=0
    )
    assert s.interval is None
    assert CheckpointSettings().interval == 1.0


@pytest.mark.parametrize(
    ("field_name", "value"), [("timeout", None), ("min_pause", None), ("interval", "1")]
)
def test_non_numeric_settings_name_the_bad_field(field_name: str, value: Any) -> None:
    with raises_naming(ValueError, field_name):
        CheckpointSettings(**{field_name: value})


@pytest.mark.parametrize("tasks", [[], (), set(), iter([])])
def test_empty_task_set_is_an_error(tasks: Iterable[str]) -> None:
    with raises_naming(ValueError, "at least one task"):
        CheckpointCoordinator(tasks)


def test_tasks_accept_a_one_shot_iterable_and_collapse_duplicates() -> None:
    c = CheckpointCoordinator(t for t in ["a", "b", "a"])
    assert c.tasks == frozenset({"a", "b"})
    c.poll(0)
    c.acknowledge(1, "a", 1, 0)
    assert acts(c.acknowledge(1, "b", 2, 0)) == [WriteMetadata(1, (("a", 1), ("b", 2)))]


# ----------------------------------------------------------- property test


@dataclass
class Model:
    """What the property test learnt from the actions so far (not a reimplementation)."""

    tasks: tuple[str, ...]
    s: CheckpointSettings
    next_id: int
    completed: list[int]
    pending: dict[int, dict[str, str]] = field(default_factory=dict)  # id -> handles
    trigger_time: dict[int, float] = field(default_factory=dict)
    acknowledged: set[int] = field(default_factory=set)  # every task acknowledged
    ended: dict[int, str] = field(default_factory=dict)  # id -> "complete" | "aborted"
    answered: dict[int, set[str]] = field(default_factory=dict)  # tasks that answered an id
    ever_completed: set[int] = field(default_factory=set)
    last_trigger: float | None = None
    last_end: float | None = None
    failures: int = 0
    failed: bool = False
    final_triggered: bool = False
    """After a final checkpoint is triggered, poll triggers no more (until it aborts)."""
    finals: set[int] = field(default_factory=set)
    """The final checkpoints triggered."""

    def due(self, now: float) -> bool:
        if self.s.interval is None or self.failed or self.final_triggered:
            return False
        if self.last_trigger is not None and now < self.last_trigger + self.s.interval:
            return False
        if self.last_end is not None and now < self.last_end + self.s.min_pause:
            return False
        return now >= 0


def check_actions(m: Model, event: str, now: float, actions: list[Any]) -> None:
    """Check one event's actions against the invariants, and fold them into ``m``."""
    expect_fail_job = False
    for i, a in enumerate(actions):
        assert not expect_fail_job or isinstance(a, FailJob), (
            f"no FailJob right after the failure that exceeded the tolerance: {actions}"
        )
        if isinstance(a, TriggerCheckpoint):
            assert not m.failed, "trigger after FailJob"
            assert event in ("poll", "trigger")
            assert a.checkpoint_id == m.next_id, "ids are consecutive and strictly increasing"
            assert a.checkpoint_id not in m.ended
            assert a.timestamp == now
            if event == "poll":
                assert not a.final
                assert m.s.interval is not None, "automatic trigger with interval=None"
                assert len(m.pending) < m.s.max_concurrent, "max_concurrent exceeded"
                assert m.due(now), (
                    f"automatic trigger at {now} before last trigger {m.last_trigger} + "
                    f"interval or last end {m.last_end} + min_pause"
                )
            m.next_id += 1
            m.pending[a.checkpoint_id] = {}
            if a.final:
                m.finals.add(a.checkpoint_id)
            m.trigger_time[a.checkpoint_id] = now
            m.answered[a.checkpoint_id] = set()
            m.last_trigger = now
        elif isinstance(a, WriteMetadata):
            assert event == "ack" and i == 0 and len(actions) == 1
            n = a.checkpoint_id
            assert n in m.pending and n not in m.acknowledged
            assert len(a.handles) == len(m.tasks), "one handle per task"
            assert dict(a.handles) == m.pending[n]
            assert sorted(t for t, _ in a.handles) == sorted(m.tasks)
            m.acknowledged.add(n)
        elif isinstance(a, NotifyCheckpointComplete):
            n = a.checkpoint_id
            assert event == "metadata" and i == 0
            assert n in m.acknowledged
            assert n not in m.ended, f"checkpoint {n} ended twice"
            assert not m.completed or m.completed[-1] < n, "completed is increasing"
            del m.pending[n]
            m.acknowledged.discard(n)
            m.ended[n] = "complete"
            m.completed.append(n)
            m.ever_completed.add(n)
            m.last_end = now
            m.failures = 0
            # exactly the older pending ones are subsumed, oldest first
            older = sorted(k for k in m.pending if k < n)
            subsumed = [x for x in actions[1:] if isinstance(x, AbortCheckpoint)]
            assert [x.checkpoint_id for x in subsumed] == older
            assert all(x.subsumed for x in subsumed)
        elif isinstance(a, AbortCheckpoint):
            n = a.checkpoint_id
            assert n not in m.ended, f"checkpoint {n} ended twice (was {m.ended.get(n)})"
            assert n in m.pending
            assert dict(a.handles) == m.pending[n], "the abort names every handle that came in"
            assert len(a.handles) == len(m.pending[n])
            if a.subsumed:
                assert event == "metadata"
            elif a.reason == "the job failed":
                assert m.failed, "aborted with the job before the job failed"
            else:
                assert n not in m.acknowledged, "a checkpoint being written was timed out"
                if event == "poll":
                    assert now - m.trigger_time[n] >= m.s.timeout
                    assert "timed out" in a.reason
                else:
                    assert event == "decline"
                    assert "declined" in a.reason
                m.last_end = now
                m.failures += 1
                if not m.failed and m.failures > m.s.tolerable_failures:
                    expect_fail_job = True
            del m.pending[n]
            m.acknowledged.discard(n)
            m.ended[n] = "aborted"
            if not a.subsumed and n in m.finals and not m.finals & set(m.pending):
                m.final_triggered = False  # the job did not end with it: periodic ones go on
        elif isinstance(a, FailJob):
            assert expect_fail_job, f"FailJob at {m.failures} failures: {actions}"
            assert not m.failed, "FailJob twice"
            assert m.failures > m.s.tolerable_failures
            m.failed = True
            expect_fail_job = False
        elif isinstance(a, DiscardCheckpoint):
            assert event == "metadata"
            assert a.checkpoint_id in m.ever_completed, "discarding a checkpoint never completed"
            assert m.completed and m.completed[0] == a.checkpoint_id, "oldest discarded first"
            m.completed.pop(0)
        elif isinstance(a, DiscardState):
            assert event == "late_ack" and len(actions) == 1
        else:  # pragma: no cover
            raise AssertionError(f"unexpected action {a!r}")
    assert not expect_fail_job, f"no FailJob after exceeding the tolerance: {actions}"
    assert len(m.completed) <= m.s.retained, "more complete checkpoints than retained"


def check_state(c: Coordinator, m: Model) -> None:
    assert c.pending == tuple(sorted(m.pending))
    assert c.completed == tuple(m.completed)
    assert list(c.completed) == sorted(set(c.completed))
    assert c.latest_completed == (m.completed[-1] if m.completed else None)
    assert c.consecutive_failures == m.failures
    if m.failed or m.s.interval is None:
        assert c.next_trigger_time() is None
    for n in m.pending:
        assert c.status(n) is (ACKNOWLEDGED if n in m.acknowledged else PENDING)
    for n, how in m.ended.items():
        if how == "aborted":
            assert c.status(n) is ABORTED
        else:  # complete, retained or discarded since
            assert c.status(n) is COMPLETE
    with pytest.raises(UnknownCheckpointError):
        c.status(m.next_id)


@st.composite
def coordinator_settings(draw: st.DrawFn) -> CheckpointSettings:
    return CheckpointSettings(
        interval=draw(st.sampled_from([None, 0.5, 1, 2, 3, 5])),
        timeout=draw(st.sampled_from([0.5, 1, 2, 4, 8, 600])),
        min_pause=draw(st.sampled_from([0, 0, 0.5, 1, 2.5])),
        max_concurrent=draw(st.integers(1, 3)),
        tolerable_failures=draw(st.integers(0, 3)),
        retained=draw(st.integers(1, 3)),
    )


@settings(max_examples=250, deadline=None)
@given(s=coordinator_settings(), n_tasks=st.integers(1, 3), data=st.data())
def test_property_random_event_sequences_keep_the_invariants(
    s: CheckpointSettings, n_tasks: int, data: st.DataObject
) -> None:
    tasks = tuple(f"t{i}" for i in range(n_tasks))
    next_id = data.draw(st.integers(0, 5), label="next_id")
    restored = data.draw(
        st.lists(st.integers(0, max(next_id - 1, 0)), unique=True, max_size=s.retained).map(sorted)
        if next_id > 0
        else st.just([]),
        label="completed",
    )
    c: Coordinator = CheckpointCoordinator(tasks, s, next_id=next_id, completed=restored)
    m = Model(tasks, s, next_id, list(restored), ever_completed=set(restored))
    now = data.draw(st.sampled_from([0.0, 0.0, 1.0, 3.5]), label="start")

    for _ in range(data.draw(st.integers(1, 40), label="steps")):
        now += data.draw(st.sampled_from([0, 0, 0.5, 1, 1, 2, 5]), label="dt")
        pending_ids = [n for n in m.pending if n not in m.acknowledged]
        kinds = ["poll", "poll", "poll", "trigger"]
        if pending_ids:
            kinds += ["ack"] * 4 + ["decline", "dup"]
        if m.acknowledged:
            kinds += ["metadata"] * 3
        late_ack = [  # tasks that never answered a checkpoint that was aborted
            (n, t)
            for n, how in m.ended.items()
            if how == "aborted"
            for t in tasks
            if t not in m.answered[n]
        ]
        if late_ack:
            kinds.append("late_ack")
        if m.ended:
            kinds.append("late_decline")
        kind = data.draw(st.sampled_from(kinds), label="kind")
        event(kind)

        if kind == "poll":
            actions = acts(c.poll(now))
            check_actions(m, "poll", now, actions)
            # nothing left that should have timed out, and a trigger when one was due
            assert all(
                now - m.trigger_time[n] < s.timeout for n in m.pending if n not in m.acknowledged
            )
            if not any(isinstance(a, TriggerCheckpoint) for a in actions):
                assert not (m.due(now) and len(m.pending) < s.max_concurrent), (
                    f"poll({now}) did not trigger a due checkpoint"
                )
        elif kind == "trigger":
            final = data.draw(st.booleans(), label="final")
            actions = acts(c.trigger(now, final=final))
            if m.failed:
                assert actions == []
            else:
                assert actions == [TriggerCheckpoint(m.next_id, now, final)]
                m.final_triggered = m.final_triggered or final
            check_actions(m, "trigger", now, actions)
        elif kind == "ack":
            n = data.draw(st.sampled_from(pending_ids), label="ack id")
            waiting = [t for t in tasks if t not in m.pending[n]]
            t = data.draw(st.sampled_from(waiting), label="ack task")
            actions = acts(c.acknowledge(n, t, handle(t, n), now))
            m.pending[n][t] = handle(t, n)
            m.answered[n].add(t)
            if len(m.pending[n]) < len(tasks):
                assert actions == []
            else:
                assert len(actions) == 1 and isinstance(actions[0], WriteMetadata)
            check_actions(m, "ack", now, actions)
        elif kind == "decline":
            n = data.draw(st.sampled_from(pending_ids), label="decline id")
            waiting = [t for t in tasks if t not in m.pending[n]]
            t = data.draw(st.sampled_from(waiting), label="decline task")
            m.answered[n].add(t)
            actions = acts(c.decline(n, t, "random", now))
            assert actions and actions[0] == AbortCheckpoint(
                n, f"declined by task {t!r}: random", tuple(m.pending[n].items())
            )
            check_actions(m, "decline", now, actions)
        elif kind == "metadata":
            n = data.draw(st.sampled_from(sorted(m.acknowledged)), label="metadata id")
            actions = acts(c.metadata_written(n, now))
            assert actions[0] == NotifyCheckpointComplete(n)
            check_actions(m, "metadata", now, actions)
        elif kind == "late_ack":
            n, t = data.draw(st.sampled_from(late_ack), label="late ack")
            m.answered[n].add(t)
            actions = acts(c.acknowledge(n, t, "late", now))
            assert actions == [DiscardState(n, t, "late")]
            check_actions(m, "late_ack", now, actions)
        elif kind == "late_decline":
            n = data.draw(st.sampled_from(sorted(m.ended)), label="late decline id")
            t = data.draw(st.sampled_from(tasks), label="late decline task")
            if m.ended[n] == "aborted":
                assert acts(c.decline(n, t, "late", now)) == []
            else:  # every task acknowledged a complete checkpoint: nobody can decline it
                with pytest.raises(DuplicateAcknowledgementError):
                    c.decline(n, t, "late", now)
        else:  # "dup": an impossible event raises and changes nothing
            before = observe(c, range(next_id, m.next_id + 1))
            n = data.draw(st.sampled_from(pending_ids), label="dup id")
            answered = list(m.pending[n])
            if answered:
                with pytest.raises(DuplicateAcknowledgementError):
                    c.acknowledge(n, answered[0], "again", now)
                with pytest.raises(DuplicateAcknowledgementError):
                    c.decline(n, answered[0], "again", now)
            with pytest.raises(ProtocolError, match="not waiting for it"):
                c.metadata_written(n, now)
            with pytest.raises(UnknownCheckpointError):
                c.acknowledge(m.next_id, tasks[0], "h", now)
            assert observe(c, range(next_id, m.next_id + 1)) == before
        check_state(c, m)
    event(f"failed={m.failed}, completed={bool(m.ever_completed - set(restored))}")
    event(f"aborted={sum(how == 'aborted' for how in m.ended.values()) > 0}")


def test_periodic_checkpoints_go_on_after_a_final_checkpoint_aborted() -> None:
    """A stop with a savepoint that fails: the job goes on, and so do its checkpoints."""
    coordinator: CheckpointCoordinator[str, str] = CheckpointCoordinator(
        ["a"], CheckpointSettings(interval=1.0)
    )
    [trigger] = coordinator.trigger(0.0, final=True, savepoint=True)
    assert isinstance(trigger, TriggerCheckpoint)
    assert coordinator.poll(5.0) == []  # a final checkpoint in flight: no periodic one
    aborted = coordinator.decline(trigger.checkpoint_id, "a", "the folder exists", 5.0)
    assert [type(a) for a in aborted] == [AbortCheckpoint]
    [periodic] = coordinator.poll(10.0)
    assert isinstance(periodic, TriggerCheckpoint) and not periodic.final
