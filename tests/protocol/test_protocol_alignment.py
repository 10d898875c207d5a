"""Unit and property tests of the sans-IO aligned barrier handler (SEMANTICS.md §3, "Aligned").

Every transition is checked against the exact list of actions it returns (order
matters) and against the queries afterwards: ``pending_checkpoint``,
``is_blocked``, ``blocked_channels``, ``live_inputs`` and ``last_settled``.

The property tests drive one handler from k FIFO input queues of records and
barriers with a random consumer that only reads unblocked channels, and check the
exactly-once invariant: at ``SnapshotState(n)`` exactly the records before
``Barrier(n)`` on every input have been consumed.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline.protocol import (
    BarrierAligner,
    BarrierOrderError,
    BlockChannel,
    DeclineCheckpoint,
    ForwardBarrier,
    InvalidCheckpointIdError,
    ProtocolError,
    SnapshotComplete,
    SnapshotState,
    UnblockChannels,
    UnknownChannelError,
)

Handler = BarrierAligner[Any]

INVALID_IDS: list[Any] = [-1, -(10**18), True, False, 1.0, 0.0, float("nan"), "1", None]


# --------------------------------------------------------------------- helpers


def make(inputs: Iterable[Hashable] = ("a", "b", "c"), name: str = "t1") -> Handler:
    return BarrierAligner(inputs, name=name)


def acts(actions: Sequence[Any]) -> list[Any]:
    """The returned actions as a list (the handler returns a list or an empty tuple)."""
    return list(actions)


def aligned(n: int, *held: Hashable) -> list[Any]:
    """What the alignment of ``n`` returns: snapshot, forward, then resume the ``held`` ones."""
    tail = [UnblockChannels(tuple(held))] if held else []
    return [SnapshotState(n), ForwardBarrier(n), *tail, SnapshotComplete(n)]


def overtaken(old: int, new: int, channel: Hashable, *held: Hashable) -> list[Any]:
    """What a newer barrier returns first when it overtakes the pending ``old`` alignment."""
    reason = f"checkpoint {new} overtook it on channel {channel!r} before it aligned"
    tail = [UnblockChannels(tuple(held))] if held else []
    return [DeclineCheckpoint(old, reason), *tail]


def cancelled(old: int, cancelled_id: int, *held: Hashable) -> list[Any]:
    """What ``cancel(cancelled_id)`` returns when it ends the pending ``old`` alignment."""
    tail = [UnblockChannels(tuple(held))] if held else []
    reason = (
        "it was aborted"
        if old == cancelled_id
        else f"the newer checkpoint {cancelled_id} was aborted"
    )
    return [DeclineCheckpoint(old, reason), *tail]


def observe(h: Handler, extra: Iterable[Hashable] = ()) -> tuple[Any, ...]:
    """Everything the queries say, to compare before/after an event."""
    return (
        h.pending_checkpoint,
        h.blocked_channels,
        h.live_inputs,
        h.last_settled,
        {c: h.is_blocked(c) for c in (*h.inputs, *extra)},
    )


def assert_state(
    h: Handler,
    *,
    pending: int | None,
    blocked: Sequence[Hashable] = (),
    settled: int,
    live: Sequence[Hashable] | None = None,
) -> None:
    assert h.pending_checkpoint == pending
    assert h.blocked_channels == tuple(blocked)
    assert h.last_settled == settled
    assert h.live_inputs == (h.inputs if live is None else tuple(live))
    for c in h.inputs:
        assert h.is_blocked(c) is (c in blocked)


def raises_naming(exc: type[Exception], *parts: object) -> Any:
    """``pytest.raises(exc)`` whose message contains every one of ``parts`` verbatim."""
    pattern = "".join(f"(?=.*{re.escape(str(p))})" for p in parts)
    return pytest.raises(exc, match=re.compile(pattern, re.DOTALL))


# ----------------------------------------------------------------- constructor


def test_constructor_keeps_inputs_in_order_and_name() -> None:
    h = make(inputs=["c", "a", "b"], name="map-2")
    assert h.inputs == ("c", "a", "b")
    assert h.name == "map-2"


def test_constructor_accepts_a_one_shot_iterable_and_has_a_default_name() -> None:
    h = BarrierAligner(c for c in "ab")
    assert h.inputs == ("a", "b")
    assert h.name == "subtask"


def test_fresh_handler_has_nothing_pending() -> None:
    h = make()
    assert_state(h, pending=None, settled=-1)
    assert h.live_inputs == ("a", "b", "c")
    assert not h.is_blocked("zz")  # an unknown channel is not blocked either


def test_duplicate_input_channel_is_a_value_error_naming_the_subtask() -> None:
    with raises_naming(ValueError, "t9", "'a'"):
        BarrierAligner(["a", "b", "a"], name="t9")


def test_source_with_no_inputs() -> None:
    h = make(inputs=[])
    assert_state(h, pending=None, settled=-1, live=())
    with raises_naming(UnknownChannelError, "t1", "'a'"):
        h.barrier_received(1, "a")
    with raises_naming(UnknownChannelError, "t1", "'a'"):
        h.end_of_input("a")
    assert acts(h.abort(2)) == []
    assert_state(h, pending=None, settled=2, live=())


def test_error_classes_are_protocol_errors() -> None:
    for cls in (UnknownChannelError, BarrierOrderError, InvalidCheckpointIdError):
        assert issubclass(cls, ProtocolError)


# ------------------------------------------------------------------ one input


def test_one_input_snapshots_and_forwards_at_once() -> None:
    h = make(inputs=["a"])
    assert acts(h.barrier_received(1, "a")) == aligned(1)
    assert_state(h, pending=None, settled=1)


def test_one_input_consecutive_checkpoints() -> None:
    h = make(inputs=["a"])
    for n in (0, 1, 2, 3, 7, 10**18):
        assert acts(h.barrier_received(n, "a")) == aligned(n)
        assert_state(h, pending=None, settled=n)


def test_one_input_ending_then_nothing_is_left() -> None:
    h = make(inputs=["a"])
    h.barrier_received(1, "a")
    assert acts(h.end_of_input("a")) == []
    assert_state(h, pending=None, settled=1, live=())


# ------------------------------------------------------------ several inputs


@pytest.mark.parametrize("order", list(itertools.permutations("abc")), ids="".join)
def test_barriers_block_one_by_one_until_the_last_aligns(order: tuple[str, ...]) -> None:
    h = make()
    first, second, last = order
    assert acts(h.barrier_received(1, first)) == [BlockChannel(first)]
    assert_state(h, pending=1, blocked=[first], settled=-1)
    assert acts(h.barrier_received(1, second)) == [BlockChannel(second)]
    assert_state(h, pending=1, blocked=[first, second], settled=-1)
    # the last channel is never blocked; the others resume in the order they were blocked
    assert acts(h.barrier_received(1, last)) == aligned(1, first, second)
    assert_state(h, pending=None, settled=1)


def test_two_inputs() -> None:
    h = make(inputs=["b", "a"])
    assert acts(h.barrier_received(0, "a")) == [BlockChannel("a")]
    assert_state(h, pending=0, blocked=["a"], settled=-1)
    assert acts(h.barrier_received(0, "b")) == aligned(0, "a")
    assert_state(h, pending=None, settled=0)


def test_many_inputs_unblock_in_arrival_order_not_input_order() -> None:
    inputs = [f"in{i}" for i in range(8)]
    arrival = ["in5", "in0", "in7", "in2", "in3", "in6", "in1"]
    h = make(inputs=inputs)
    for i, c in enumerate(arrival):
        assert acts(h.barrier_received(4, c)) == [BlockChannel(c)]
        assert_state(h, pending=4, blocked=arrival[: i + 1], settled=-1)
    assert acts(h.barrier_received(4, "in4")) == aligned(4, *arrival)
    assert_state(h, pending=None, settled=4)


def test_consecutive_checkpoints_1_2_3() -> None:
    h = make()
    orders = {1: ("a", "b", "c"), 2: ("c", "b", "a"), 3: ("b", "c", "a")}
    for n, (x, y, z) in orders.items():
        assert acts(h.barrier_received(n, x)) == [BlockChannel(x)]
        assert_state(h, pending=n, blocked=[x], settled=n - 1 if n > 1 else -1)
        assert acts(h.barrier_received(n, y)) == [BlockChannel(y)]
        assert_state(h, pending=n, blocked=[x, y], settled=n - 1 if n > 1 else -1)
        assert acts(h.barrier_received(n, z)) == aligned(n, x, y)
        assert_state(h, pending=None, settled=n)


def test_checkpoint_ids_may_have_gaps() -> None:
    h = make(inputs=["a", "b"])
    for n in (2, 5, 6, 100):
        assert acts(h.barrier_received(n, "b")) == [BlockChannel("b")]
        assert acts(h.barrier_received(n, "a")) == aligned(n, "b")
        assert_state(h, pending=None, settled=n)


def test_channel_ids_of_various_types() -> None:
    inputs: list[Hashable] = [None, 0, ("p", 1), frozenset({"q"})]
    h = make(inputs=inputs)
    for c in inputs[:-1]:
        assert acts(h.barrier_received(3, c)) == [BlockChannel(c)]
    assert_state(h, pending=3, blocked=inputs[:-1], settled=-1)
    assert not h.is_blocked(("p",))  # a tuple is not confused with its parts
    assert acts(h.barrier_received(3, inputs[-1])) == aligned(3, *inputs[:-1])


def test_blocked_channels_is_a_copy_not_a_live_view() -> None:
    h = make()
    h.barrier_received(1, "a")
    blocked = h.blocked_channels
    h.barrier_received(1, "b")
    assert blocked == ("a",)
    assert h.blocked_channels == ("a", "b")


# ------------------------------------------------------------------ overtaking


def test_newer_barrier_overtakes_a_pending_alignment() -> None:
    h = make()
    assert acts(h.barrier_received(1, "a")) == [BlockChannel("a")]
    assert acts(h.barrier_received(2, "b")) == [
        *overtaken(1, 2, "b", "a"),
        BlockChannel("b"),
    ]
    assert_state(h, pending=2, blocked=["b"], settled=1)
    # the late barrier of the aborted checkpoint is ignored and blocks nothing
    assert acts(h.barrier_received(1, "c")) == []
    assert_state(h, pending=2, blocked=["b"], settled=1)
    assert acts(h.barrier_received(2, "a")) == [BlockChannel("a")]
    assert acts(h.barrier_received(2, "c")) == aligned(2, "b", "a")
    assert_state(h, pending=None, settled=2)


def test_newer_barrier_overtakes_and_unblocks_several_channels_in_block_order() -> None:
    h = make(inputs=["a", "b", "c", "d"])
    h.barrier_received(1, "b")
    h.barrier_received(1, "a")
    assert acts(h.barrier_received(5, "d")) == [
        *overtaken(1, 5, "d", "b", "a"),
        BlockChannel("d"),
    ]
    assert_state(h, pending=5, blocked=["d"], settled=1)
    assert acts(h.barrier_received(5, "c")) == [BlockChannel("c")]
    assert acts(h.barrier_received(5, "a")) == [BlockChannel("a")]
    assert acts(h.barrier_received(5, "b")) == aligned(5, "d", "c", "a")
    assert_state(h, pending=None, settled=5)


def test_newer_barrier_overtaking_when_the_other_inputs_ended() -> None:
    # The old alignment's blocked channels are live and have not delivered the new
    # barrier, so the new one cannot align at once: it blocks its channel.
    h = make()
    h.end_of_input("c")
    assert acts(h.barrier_received(1, "a")) == [BlockChannel("a")]
    assert acts(h.barrier_received(2, "b")) == [*overtaken(1, 2, "b", "a"), BlockChannel("b")]
    assert_state(h, pending=2, blocked=["b"], settled=1, live=["a", "b"])
    assert acts(h.end_of_input("a")) == aligned(2, "b")
    assert_state(h, pending=None, settled=2, live=["b"])


def test_overtaking_twice() -> None:
    h = make()
    h.barrier_received(1, "a")
    assert acts(h.barrier_received(2, "b")) == [*overtaken(1, 2, "b", "a"), BlockChannel("b")]
    assert acts(h.barrier_received(3, "c")) == [*overtaken(2, 3, "c", "b"), BlockChannel("c")]
    assert_state(h, pending=3, blocked=["c"], settled=2)
    assert acts(h.barrier_received(2, "a")) == []  # aborted here: ignored
    assert acts(h.barrier_received(3, "a")) == [BlockChannel("a")]
    assert acts(h.barrier_received(3, "b")) == aligned(3, "c", "a")


def test_older_barrier_during_a_newer_alignment_is_ignored() -> None:
    # Channel "a" never carried barrier 3 (each barrier at most once per channel); its
    # barrier 5 starts the alignment of 5. Barrier 3 on "b" cannot be barrier 5.
    h = make(inputs=["a", "b"])
    assert acts(h.barrier_received(5, "a")) == [BlockChannel("a")]
    assert acts(h.barrier_received(3, "b")) == []  # actually: SnapshotState(5) ...
    assert_state(h, pending=5, blocked=["a"], settled=-1)
    assert acts(h.barrier_received(5, "b")) == aligned(5, "a")


def test_older_barrier_during_a_newer_alignment_does_not_block() -> None:
    h = make()
    assert acts(h.barrier_received(5, "a")) == [BlockChannel("a")]
    assert acts(h.barrier_received(3, "b")) == []  # actually: BlockChannel("b")
    assert acts(h.barrier_received(5, "b")) == [BlockChannel("b")]
    assert acts(h.barrier_received(5, "c")) == aligned(5, "a", "b")


# ------------------------------------------------------------- settled barriers


def test_barriers_of_an_aborted_checkpoint_are_ignored() -> None:
    h = make(inputs=["a", "b", "c", "d"])
    h.barrier_received(1, "a")
    h.barrier_received(2, "b")  # overtakes 1
    before = observe(h)
    assert acts(h.barrier_received(1, "c")) == []
    assert acts(h.barrier_received(0, "d")) == []  # never started here, older still
    assert observe(h) == before


def test_barriers_of_a_cancelled_checkpoint_are_ignored() -> None:
    h = make()
    h.barrier_received(1, "a")
    h.abort(1)
    before = observe(h)
    assert acts(h.barrier_received(1, "b")) == []
    assert acts(h.barrier_received(1, "c")) == []
    assert observe(h) == before
    assert_state(h, pending=None, settled=1)
    # the next checkpoint aligns over every input, "a" included
    assert acts(h.barrier_received(2, "c")) == [BlockChannel("c")]
    assert acts(h.barrier_received(2, "a")) == [BlockChannel("a")]
    assert acts(h.barrier_received(2, "b")) == aligned(2, "c", "a")


def test_ignored_barriers_still_count_for_the_channel_order() -> None:
    h = make()
    h.abort(3)
    assert acts(h.barrier_received(2, "a")) == []
    with raises_naming(BarrierOrderError, "t1", "'a'"):
        h.barrier_received(2, "a")
    with raises_naming(BarrierOrderError, "t1", "'a'"):
        h.barrier_received(1, "a")
    assert acts(h.barrier_received(3, "a")) == []
    assert_state(h, pending=None, settled=3)


# ---------------------------------------------------------------------- cancel


def test_cancel_of_the_pending_checkpoint() -> None:
    h = make()
    h.barrier_received(1, "b")
    h.barrier_received(1, "a")
    assert acts(h.abort(1)) == cancelled(1, 1, "b", "a")
    assert_state(h, pending=None, settled=1)


def test_cancel_of_a_newer_checkpoint_aborts_the_pending_one() -> None:
    h = make()
    h.barrier_received(1, "c")
    assert acts(h.abort(3)) == cancelled(1, 3, "c")
    assert_state(h, pending=None, settled=3)
    for n in (2, 3):  # every id up to the cancelled one is ignored
        for c in "abc":
            if n > 1 or c != "c":
                assert acts(h.barrier_received(n, c)) == []
    assert_state(h, pending=None, settled=3)
    assert acts(h.barrier_received(4, "a")) == [BlockChannel("a")]
    assert_state(h, pending=4, blocked=["a"], settled=3)


def test_cancel_of_an_older_checkpoint_leaves_the_pending_alignment_alone() -> None:
    h = make()
    h.barrier_received(1, "a")
    h.barrier_received(1, "b")
    h.barrier_received(1, "c")
    assert acts(h.barrier_received(4, "a")) == [BlockChannel("a")]
    before = observe(h)
    assert acts(h.abort(1)) == []  # already settled
    assert observe(h) == before
    assert acts(h.abort(0)) == []
    assert observe(h) == before
    assert acts(h.abort(3)) == []  # never started here, older than the pending one
    assert h.pending_checkpoint == 4
    assert h.blocked_channels == ("a",)
    assert h.last_settled == 3
    assert acts(h.barrier_received(4, "b")) == [BlockChannel("b")]
    assert acts(h.barrier_received(4, "c")) == aligned(4, "a", "b")


def test_cancel_of_a_future_checkpoint_with_nothing_pending() -> None:
    h = make()
    assert acts(h.abort(2)) == []
    assert_state(h, pending=None, settled=2)
    for n in (0, 1, 2):
        for c in ("b", "a", "c"):
            assert acts(h.barrier_received(n, c)) == []
            assert_state(h, pending=None, settled=2)
    assert acts(h.barrier_received(3, "b")) == [BlockChannel("b")]
    assert acts(h.barrier_received(3, "a")) == [BlockChannel("a")]
    assert acts(h.barrier_received(3, "c")) == aligned(3, "b", "a")


def test_cancel_twice_and_cancel_of_a_snapshotted_checkpoint_are_no_ops() -> None:
    h = make(inputs=["a"])
    h.barrier_received(1, "a")
    before = observe(h)
    assert acts(h.abort(1)) == []
    assert acts(h.abort(0)) == []
    assert observe(h) == before
    assert acts(h.abort(5)) == []
    after = observe(h)
    assert acts(h.abort(5)) == []
    assert acts(h.abort(4)) == []
    assert observe(h) == after


def test_cancel_works_after_every_input_ended() -> None:
    h = make(inputs=["a", "b"])
    h.end_of_input("a")
    h.end_of_input("b")
    assert acts(h.abort(7)) == []
    assert_state(h, pending=None, settled=7, live=())


# ---------------------------------------------------------------- end of input


def test_end_of_input_with_nothing_pending() -> None:
    h = make()
    assert acts(h.end_of_input("b")) == []
    assert_state(h, pending=None, settled=-1, live=["a", "c"])
    # later checkpoints align over the live inputs only
    assert acts(h.barrier_received(1, "c")) == [BlockChannel("c")]
    assert acts(h.barrier_received(1, "a")) == aligned(1, "c")
    assert_state(h, pending=None, settled=1, live=["a", "c"])


def test_end_of_input_of_the_last_missing_input_completes_the_alignment() -> None:
    h = make()
    h.barrier_received(1, "c")
    h.barrier_received(1, "a")
    assert acts(h.end_of_input("b")) == aligned(1, "c", "a")
    assert_state(h, pending=None, settled=1, live=["a", "c"])


def test_end_of_input_that_is_not_the_last_missing_one_keeps_aligning() -> None:
    h = make(inputs=["a", "b", "c", "d"])
    h.barrier_received(1, "a")
    assert acts(h.end_of_input("c")) == []
    assert_state(h, pending=1, blocked=["a"], settled=-1, live=["a", "b", "d"])
    assert acts(h.barrier_received(1, "d")) == [BlockChannel("d")]
    assert acts(h.end_of_input("b")) == aligned(1, "a", "d")
    assert_state(h, pending=None, settled=1, live=["a", "d"])


def test_end_of_input_one_by_one_until_all_ended() -> None:
    h = make()
    h.barrier_received(1, "a")
    assert acts(h.end_of_input("b")) == []
    assert acts(h.end_of_input("c")) == aligned(1, "a")
    assert acts(h.barrier_received(2, "a")) == aligned(2)  # the one live input
    assert acts(h.end_of_input("a")) == []
    assert_state(h, pending=None, settled=2, live=())


def test_all_inputs_ended_with_nothing_pending() -> None:
    h = make()
    for c in ("c", "a", "b"):
        assert acts(h.end_of_input(c)) == []
    assert_state(h, pending=None, settled=-1, live=())
    for c in ("a", "b", "c"):
        with raises_naming(BarrierOrderError, "t1", repr(c), "end of input"):
            h.barrier_received(1, c)
    assert_state(h, pending=None, settled=-1, live=())


# ---------------------------------------------------------------------- errors


@pytest.mark.parametrize("channel", ["zz", None, ("a",), 0])
@pytest.mark.parametrize("pending", [False, True], ids=["idle", "aligning"])
def test_barrier_on_unknown_channel(channel: Hashable, pending: bool) -> None:
    h = make()
    if pending:
        h.barrier_received(1, "a")
    before = observe(h, [channel])
    with raises_naming(UnknownChannelError, "t1", repr(channel), "barrier"):
        h.barrier_received(1, channel)
    with raises_naming(UnknownChannelError, "t1", repr(channel)):
        h.barrier_received(2, channel)
    assert observe(h, [channel]) == before


@pytest.mark.parametrize("pending", [False, True], ids=["idle", "aligning"])
def test_end_of_input_on_unknown_channel(pending: bool) -> None:
    h = make()
    if pending:
        h.barrier_received(1, "a")
    before = observe(h, ["zz"])
    with raises_naming(UnknownChannelError, "t1", "'zz'", "end of input"):
        h.end_of_input("zz")
    assert observe(h, ["zz"]) == before


def test_same_barrier_again_after_alignment() -> None:
    h = make(inputs=["a", "b"])
    h.barrier_received(1, "a")
    h.barrier_received(1, "b")
    before = observe(h)
    for n in (1, 0):
        with raises_naming(BarrierOrderError, "t1", "'a'", f"checkpoint {n} after"):
            h.barrier_received(n, "a")
        assert observe(h) == before
    assert acts(h.barrier_received(2, "a")) == [BlockChannel("a")]


def test_same_barrier_again_on_a_blocked_channel() -> None:
    h = make()
    h.barrier_received(3, "b")
    before = observe(h)
    for n in (3, 2):
        with raises_naming(BarrierOrderError, "t1", "'b'", f"checkpoint {n}"):
            h.barrier_received(n, "b")
        assert observe(h) == before
    assert acts(h.barrier_received(3, "a")) == [BlockChannel("a")]
    assert acts(h.barrier_received(3, "c")) == aligned(3, "b", "a")


def test_older_barrier_again_on_a_channel_that_delivered_a_newer_one() -> None:
    h = make(inputs=["a"])
    h.barrier_received(5, "a")
    before = observe(h)
    with raises_naming(BarrierOrderError, "t1", "'a'", "checkpoint 4", "checkpoint 5"):
        h.barrier_received(4, "a")
    assert observe(h) == before


def test_newer_barrier_on_a_blocked_channel() -> None:
    h = make()
    h.barrier_received(1, "a")
    h.barrier_received(1, "b")
    before = observe(h)
    with raises_naming(BarrierOrderError, "t1", "'a'", "blocked", "checkpoint 2"):
        h.barrier_received(2, "a")
    assert observe(h) == before
    assert acts(h.barrier_received(1, "c")) == aligned(1, "a", "b")
    assert acts(h.barrier_received(2, "a")) == [BlockChannel("a")]  # now it may


def test_end_of_input_on_a_blocked_channel() -> None:
    h = make()
    h.barrier_received(1, "b")
    before = observe(h)
    with raises_naming(BarrierOrderError, "t1", "'b'", "blocked", "end of input"):
        h.end_of_input("b")
    assert observe(h) == before


def test_anything_after_end_of_input_on_that_channel() -> None:
    h = make()
    h.end_of_input("a")
    h.barrier_received(1, "b")
    before = observe(h)
    with raises_naming(BarrierOrderError, "t1", "'a'", "end of input"):
        h.barrier_received(1, "a")
    with raises_naming(BarrierOrderError, "t1", "'a'", "end of input"):
        h.barrier_received(2, "a")
    with raises_naming(BarrierOrderError, "t1", "'a'", "end of input"):
        h.end_of_input("a")
    assert observe(h) == before
    assert acts(h.barrier_received(1, "c")) == aligned(1, "b")


@pytest.mark.parametrize("bad", INVALID_IDS, ids=repr)
def test_barrier_received_rejects_invalid_ids(bad: Any) -> None:
    h = make()
    h.barrier_received(1, "a")
    before = observe(h)
    with raises_naming(InvalidCheckpointIdError, "t1", repr(bad)):
        h.barrier_received(bad, "b")
    with raises_naming(InvalidCheckpointIdError, "t1"):
        h.barrier_received(bad, "zz")  # the id is checked before the channel
    assert observe(h) == before
    assert acts(h.barrier_received(1, "b")) == [BlockChannel("b")]


def test_invalid_id_error_of_a_barrier_names_the_channel() -> None:
    h = make()
    with raises_naming(InvalidCheckpointIdError, "t1", "'b'"):
        h.barrier_received(-1, "b")


@pytest.mark.parametrize("bad", INVALID_IDS, ids=repr)
def test_cancel_rejects_invalid_ids(bad: Any) -> None:
    h = make()
    h.barrier_received(1, "a")
    before = observe(h)
    with raises_naming(InvalidCheckpointIdError, "t1", repr(bad)):
        h.abort(bad)
    assert observe(h) == before


def test_error_messages_use_the_default_name() -> None:
    h = BarrierAligner(["a"])
    with raises_naming(UnknownChannelError, "subtask", "'zz'"):
        h.barrier_received(0, "zz")
    with raises_naming(InvalidCheckpointIdError, "subtask"):
        h.abort(-1)


def test_zero_is_a_valid_id() -> None:
    h = make(inputs=["a", "b"])
    assert acts(h.barrier_received(0, "a")) == [BlockChannel("a")]
    assert acts(h.abort(0)) == cancelled(0, 0, "a")
    assert_state(h, pending=None, settled=0)


# ------------------------------------------------------------ property tests

Item = tuple[str, int]  # ("rec", i), ("bar", n) or ("eoi", 0)


@st.composite
def channel_queues(
    draw: st.DrawFn, *, may_end: bool
) -> tuple[int, list[str], dict[str, list[Item]]]:
    """k inputs (1-5), m checkpoints (1-4); per input a FIFO queue of records and barriers.

    Without ``may_end`` every queue carries Barrier(1..m) once each, in order. With it, a
    queue may stop after Barrier(j) (0 <= j <= m) and then carry its end of input ("eoi").
    """
    k = draw(st.integers(1, 5), label="k")
    m = draw(st.integers(1, 4), label="m")
    inputs = [f"in{i}" for i in range(k)]
    queues: dict[str, list[Item]] = {}
    for c in inputs:
        last = m
        ends = may_end and draw(st.booleans())
        if ends:
            last = draw(st.integers(0, m))
        q: list[Item] = []
        i = 0
        for n in range(1, last + 2):
            for _ in range(draw(st.integers(0, 3))):
                q.append(("rec", i))
                i += 1
            if n <= last:
                q.append(("bar", n))
        if ends:
            q.append(("eoi", 0))
        queues[c] = q
    return m, inputs, queues


def records_before(queues: dict[str, list[Item]]) -> dict[tuple[str, int], int]:
    """Per (channel, checkpoint): how many records come before that barrier on the channel,
    or all the channel's records if it ends before carrying that barrier."""
    out: dict[tuple[str, int], int] = {}
    for c, q in queues.items():
        seen = 0
        for kind, arg in q:
            if kind == "rec":
                seen += 1
            elif kind == "bar":
                out[c, arg] = seen
        for n in range(1, 100):
            out.setdefault((c, n), seen)
    return out


class Run:
    """One handler driven by a consumer, with a model of the blocked channels."""

    def __init__(self, inputs: list[str], queues: dict[str, list[Item]]) -> None:
        self.h: Handler = BarrierAligner(inputs, name="prop")
        self.inputs = inputs
        self.queues = {c: list(q) for c, q in queues.items()}
        self.expected = records_before(queues)
        self.consumed = dict.fromkeys(inputs, 0)
        self.blocked: list[str] = []  # the model, from Block/Unblock actions
        self.actions: list[Any] = []

    def consumable(self) -> list[str]:
        return [c for c in self.inputs if self.queues[c] and not self.h.is_blocked(c)]

    def apply(self, actions: Sequence[Any]) -> None:
        actions = acts(actions)
        for i, a in enumerate(actions):
            if isinstance(a, BlockChannel):
                assert a.channel not in self.blocked
                self.blocked.append(a.channel)
            elif isinstance(a, UnblockChannels):
                assert list(a.channels) == self.blocked
                self.blocked = []
            elif isinstance(a, SnapshotState):
                assert actions[i + 1 : i + 2] == [ForwardBarrier(a.checkpoint_id)]
                for c in self.inputs:  # exactly the records before Barrier(n) consumed
                    assert self.consumed[c] == self.expected[c, a.checkpoint_id], c
            elif isinstance(a, ForwardBarrier):
                assert i > 0
                assert actions[i - 1] == SnapshotState(a.checkpoint_id)
            elif isinstance(a, SnapshotComplete):
                assert a.snapshot_id in self.snapshots() + [
                    b.checkpoint_id for b in actions[:i] if isinstance(b, SnapshotState)
                ]
            else:
                assert isinstance(a, DeclineCheckpoint)
        self.actions += actions
        assert self.h.blocked_channels == tuple(self.blocked)
        for c in self.inputs:
            assert self.h.is_blocked(c) is (c in self.blocked)

    def deliver(self, c: str) -> None:
        kind, arg = self.queues[c].pop(0)
        if kind == "rec":
            self.consumed[c] += 1
        elif kind == "bar":
            self.apply(self.h.barrier_received(arg, c))
        else:
            self.apply(self.h.end_of_input(c))

    def snapshots(self) -> list[int]:
        return [a.checkpoint_id for a in self.actions if isinstance(a, SnapshotState)]

    def aborts(self) -> list[int]:
        return [a.checkpoint_id for a in self.actions if isinstance(a, DeclineCheckpoint)]


@settings(max_examples=300, deadline=None)
@given(channel_queues(may_end=False), st.data())
def test_property_exactly_once_alignment(
    setup: tuple[int, list[str], dict[str, list[Item]]], data: st.DataObject
) -> None:
    m, inputs, queues = setup
    run = Run(inputs, queues)
    while any(run.queues.values()):
        consumable = run.consumable()
        assert consumable, "deadlock: every non-empty channel is blocked"
        run.deliver(data.draw(st.sampled_from(consumable)))
    assert run.snapshots() == list(range(1, m + 1))
    assert run.aborts() == []
    assert [a for a in run.actions if isinstance(a, ForwardBarrier)] == [
        ForwardBarrier(n) for n in range(1, m + 1)
    ]
    assert run.h.pending_checkpoint is None
    assert run.h.blocked_channels == ()
    assert run.h.last_settled == m
    assert run.h.live_inputs == tuple(inputs)


@settings(max_examples=300, deadline=None)
@given(channel_queues(may_end=True), st.data())
def test_property_exactly_once_with_ends_and_cancels(
    setup: tuple[int, list[str], dict[str, list[Item]]], data: st.DataObject
) -> None:
    m, inputs, queues = setup
    run = Run(inputs, queues)
    cancels_left = data.draw(st.integers(0, 3), label="cancels")
    first_barrier: dict[int, int] = {}  # checkpoint -> step its first barrier arrived
    cancelled_at: list[tuple[int, int]] = []  # (step, id)
    step = 0
    while any(run.queues.values()):
        step += 1
        consumable = run.consumable()
        assert consumable, "deadlock: every non-empty channel is blocked"
        if cancels_left and data.draw(st.integers(0, 3), label="cancel now?") == 0:
            cancels_left -= 1
            n = data.draw(st.integers(0, m + 1), label="cancel id")
            cancelled_at.append((step, n))
            run.apply(run.h.abort(n))
            continue
        c = data.draw(st.sampled_from(consumable))
        kind, arg = run.queues[c][0]
        if kind == "bar":
            first_barrier.setdefault(arg, step)
        run.deliver(c)

    snapshots, aborts = run.snapshots(), run.aborts()
    assert snapshots == sorted(snapshots)
    assert aborts == sorted(aborts)
    for n in range(1, m + 1):
        ends = snapshots.count(n) + aborts.count(n)
        started = n in first_barrier
        cancelled_before = started and any(s < first_barrier[n] and k >= n for s, k in cancelled_at)
        if not started or cancelled_before:
            assert ends == 0, n  # ignored: cancelled before it started, or no barrier came
        else:
            assert ends == 1, n  # snapshotted or aborted here, exactly once
            if n in aborts:  # only a cancel after it started can abort it
                assert any(s > first_barrier[n] and k >= n for s, k in cancelled_at)
    assert run.h.pending_checkpoint is None
    assert run.h.blocked_channels == ()
    ended = [c for c in inputs if queues[c] and queues[c][-1][0] == "eoi"]
    assert run.h.live_inputs == tuple(c for c in inputs if c not in ended)
