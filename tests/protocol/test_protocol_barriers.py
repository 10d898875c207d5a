"""Tests of barrier checkpoints in every mode (SEMANTICS.md §3, §4): exactly-once aligned,
unaligned, aligned with an alignment timeout, at-least-once, with and without loops.

* Property tests drive the real handlers from :mod:`cutline.sim.dataflow`, a seeded
  model of a small dataflow with bounded buffers, random schedules, random checkpoint
  triggers, timeouts and aborts; its checker verifies the channel-state identity of every
  checkpoint at every channel, and that a restore from every completed checkpoint, after
  replaying the recorded channel state, ends in the failure-free states (exactly-once) or
  covers them (at-least-once).
* Unit tests pin the new behaviours of :class:`BarrierAligner`, :class:`BarrierTracker` and
  :class:`ChandyLamportRecorder` to exact action lists (order matters).
* Deliberately broken handlers show that the checker is not vacuous.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline.protocol import (
    BarrierAligner,
    BarrierTracker,
    BlockChannel,
    ChandyLamportRecorder,
    ChannelRecorded,
    DeclineCheckpoint,
    DuplicateMarkerError,
    ForwardBarrier,
    ProtocolError,
    RecordMessage,
    RecordState,
    SendMarker,
    SnapshotComplete,
    SnapshotState,
    SnapshotStatus,
    UnblockChannels,
)
from cutline.sim.dataflow import (
    MODES,
    ChannelId,
    DataflowConfig,
    DataflowGraph,
    Handler,
    HandlerFactory,
    Mode,
    Record,
    check_checkpoints,
    check_dataflow_run,
    dag_topology,
    loop_topology,
    reference_states,
    replay,
    run_dataflow,
)

# ------------------------------------------------------------------------------ helpers


def acts(actions: Sequence[Any]) -> list[Any]:
    return list(actions)


def snapshot(n: int, *, unaligned: bool = False) -> list[Any]:
    """What a handler returns when it snapshots ``n``: copy the state, forward the barrier."""
    return [SnapshotState(n), ForwardBarrier(n, unaligned)]


def recorded(n: int, channel: str, *messages: str) -> list[Any]:
    return [RecordMessage(n, channel, m) for m in messages]


# ===================================================================== unaligned mode


def test_unaligned_snapshot_on_the_first_barrier_records_the_records_it_overtook() -> None:
    h: BarrierAligner[str] = BarrierAligner(["a", "b", "c"], unaligned=True, name="t")
    assert acts(h.barrier_received(1, "a", unaligned=True, overtaken=["x", "y"])) == [
        *snapshot(1, unaligned=True),
        *recorded(1, "a", "x", "y"),
    ]
    assert h.recording == (1,)
    assert h.recorded_channels(1) == {"b", "c"}
    assert h.blocked_channels == ()
    assert h.last_settled == 1
    # the overtaken records are consumed afterwards: they are not recorded a second time
    assert acts(h.message_received("a", "x")) == []
    assert acts(h.message_received("a", "y")) == []


def test_unaligned_first_barrier_without_overtaken_records_closes_its_channel_empty() -> None:
    h: BarrierAligner[str] = BarrierAligner(["a", "b"], unaligned=True, name="t")
    assert acts(h.barrier_received(1, "a")) == snapshot(1, unaligned=True)
    assert h.recorded_channels(1) == {"b"}


def test_unaligned_records_the_other_inputs_until_their_barriers() -> None:
    h: BarrierAligner[str] = BarrierAligner(["a", "b", "c"], unaligned=True, name="t")
    h.barrier_received(1, "a")
    assert acts(h.message_received("b", "m1")) == recorded(1, "b", "m1")
    assert acts(h.message_received("a", "q")) == []  # a delivered its barrier
    assert acts(h.message_received("c", "m2")) == recorded(1, "c", "m2")
    assert acts(h.message_received("b", "m3")) == recorded(1, "b", "m3")
    assert acts(h.barrier_received(1, "b")) == []
    assert h.recorded_channels(1) == {"c"}
    assert acts(h.message_received("b", "m4")) == []
    assert acts(h.message_received("c", "m5")) == recorded(1, "c", "m5")
    # the last barrier overtook two records: they close the channel state of c
    assert acts(h.barrier_received(1, "c", unaligned=True, overtaken=["m6", "m7"])) == [
        *recorded(1, "c", "m6", "m7"),
        SnapshotComplete(1),
    ]
    assert h.recording == ()
    assert acts(h.message_received("c", "m6")) == []


def test_unaligned_with_a_single_input_completes_at_once() -> None:
    h: BarrierAligner[str] = BarrierAligner(["a"], unaligned=True, name="t")
    assert acts(h.barrier_received(3, "a", unaligned=True, overtaken=["x"])) == [
        *snapshot(3, unaligned=True),
        *recorded(3, "a", "x"),
        SnapshotComplete(3),
    ]


def test_overtaken_records_also_belong_to_a_later_checkpoint_still_recording_the_channel() -> None:
    h: BarrierAligner[str] = BarrierAligner(["a", "b"], unaligned=True, name="t")
    assert acts(h.barrier_received(1, "a")) == snapshot(1, unaligned=True)
    assert acts(h.barrier_received(2, "a")) == snapshot(2, unaligned=True)
    assert acts(h.message_received("b", "m")) == [*recorded(1, "b", "m"), *recorded(2, "b", "m")]
    # BarrierItem(1) jumps over x on b: x is in checkpoint 1's state of b, and, once received,
    # in checkpoint 2's too (it was sent before BarrierItem(2) as well)
    assert acts(h.barrier_received(1, "b", unaligned=True, overtaken=["x"])) == [
        *recorded(1, "b", "x"),
        SnapshotComplete(1),
    ]
    assert acts(h.message_received("b", "x")) == recorded(2, "b", "x")
    assert acts(h.barrier_received(2, "b")) == [SnapshotComplete(2)]


def test_overtaken_records_alone_make_a_barrier_unaligned() -> None:
    h: BarrierAligner[str] = BarrierAligner(["a", "b"], name="t")
    assert acts(h.barrier_received(1, "a", overtaken=["x"])) == [
        *snapshot(1, unaligned=True),
        *recorded(1, "a", "x"),
    ]


def test_unaligned_barrier_of_an_aborted_checkpoint_is_ignored_with_its_overtaken_records() -> None:
    h: BarrierAligner[str] = BarrierAligner(["a", "b"], unaligned=True, name="t")
    assert acts(h.abort(1)) == []
    assert acts(h.barrier_received(1, "a", unaligned=True, overtaken=["x"])) == []
    assert acts(h.barrier_received(2, "b")) == snapshot(2, unaligned=True)
    # x was sent before BarrierItem(2) on a: received now, it is in checkpoint 2's state
    assert acts(h.message_received("a", "x")) == recorded(2, "a", "x")


# ================================================================= alignment timeout


def test_alignment_timeout_switches_a_blocked_alignment_to_unaligned() -> None:
    h: BarrierAligner[str] = BarrierAligner(["a", "b", "c"], name="t")
    assert acts(h.barrier_received(1, "a")) == [BlockChannel("a")]
    assert acts(h.barrier_received(1, "b")) == [BlockChannel("b")]
    assert h.pending_checkpoint == 1
    # the blocked channels delivered the barrier and nothing since: recorded empty
    assert acts(h.alignment_timed_out(1)) == [
        *snapshot(1, unaligned=True),
        UnblockChannels(("a", "b")),
    ]
    assert h.pending_checkpoint is None
    assert h.blocked_channels == ()
    assert not h.is_blocked("a") and not h.is_blocked("b")
    assert h.recorded_channels(1) == {"c"}
    assert acts(h.message_received("a", "q")) == []
    assert acts(h.message_received("c", "m")) == recorded(1, "c", "m")
    assert acts(h.barrier_received(1, "c")) == [SnapshotComplete(1)]


def test_alignment_timeout_after_the_alignment_ended_does_nothing() -> None:
    h: BarrierAligner[str] = BarrierAligner(["a", "b"], name="t")
    h.barrier_received(1, "a")
    h.barrier_received(1, "b")
    assert acts(h.alignment_timed_out(1)) == []  # aligned meanwhile
    h.barrier_received(2, "a")
    h.abort(2)
    assert acts(h.alignment_timed_out(2)) == []  # aborted meanwhile
    assert h.pending_checkpoint is None


def test_alignment_timeout_of_an_older_checkpoint_leaves_the_pending_one_alone() -> None:
    h: BarrierAligner[str] = BarrierAligner(["a", "b"], name="t")
    h.barrier_received(1, "a")
    h.barrier_received(2, "b")  # overtakes 1: declines it
    assert acts(h.alignment_timed_out(1)) == []
    assert h.pending_checkpoint == 2
    assert h.blocked_channels == ("b",)


def test_alignment_timeout_then_the_last_input_ends() -> None:
    h: BarrierAligner[str] = BarrierAligner(["a", "b"], name="t")
    h.barrier_received(1, "a")
    assert acts(h.alignment_timed_out(1)) == [
        *snapshot(1, unaligned=True),
        UnblockChannels(("a",)),
    ]
    assert acts(h.message_received("b", "m")) == recorded(1, "b", "m")
    assert acts(h.end_of_input("b")) == [SnapshotComplete(1)]


def test_an_unaligned_barrier_during_an_aligned_alignment_switches_it() -> None:
    h: BarrierAligner[str] = BarrierAligner(["a", "b", "c"], name="t")
    assert acts(h.barrier_received(1, "a")) == [BlockChannel("a")]
    assert acts(h.barrier_received(1, "b", unaligned=True, overtaken=["x"])) == [
        *snapshot(1, unaligned=True),
        *recorded(1, "b", "x"),
        UnblockChannels(("a",)),
    ]
    assert h.recorded_channels(1) == {"c"}
    assert acts(h.barrier_received(1, "c")) == [SnapshotComplete(1)]


def test_an_unaligned_barrier_that_completes_the_alignment_resumes_before_completing() -> None:
    h: BarrierAligner[str] = BarrierAligner(["a", "b"], name="t")
    h.barrier_received(1, "a")
    assert acts(h.barrier_received(1, "b", unaligned=True, overtaken=["x"])) == [
        *snapshot(1, unaligned=True),
        *recorded(1, "b", "x"),
        UnblockChannels(("a",)),
        SnapshotComplete(1),
    ]


def test_a_newer_unaligned_barrier_declines_the_pending_alignment_then_snapshots() -> None:
    h: BarrierAligner[str] = BarrierAligner(["a", "b", "c"], name="t")
    h.barrier_received(1, "a")
    assert acts(h.barrier_received(2, "b", unaligned=True)) == [
        DeclineCheckpoint(1, "checkpoint 2 overtook it on channel 'b' before it aligned"),
        UnblockChannels(("a",)),
        *snapshot(2, unaligned=True),
    ]
    # a delivered BarrierItem(1) only: it is recorded for 2 like c
    assert h.recorded_channels(2) == {"a", "c"}


# ==================================================================== loops (back edges)


def test_aligned_back_edges_are_not_waited_for_and_are_recorded_until_the_barrier() -> None:
    h: BarrierAligner[str] = BarrierAligner(["a", "b", "back"], back_edges=["back"], name="h")
    assert acts(h.barrier_received(1, "a")) == [BlockChannel("a")]
    assert acts(h.barrier_received(1, "b")) == [*snapshot(1), UnblockChannels(("a",))]
    assert h.recording == (1,)
    assert h.recorded_channels(1) == {"back"}
    assert acts(h.message_received("a", "m")) == []
    assert acts(h.message_received("back", "r1")) == recorded(1, "back", "r1")
    assert acts(h.message_received("back", "r2")) == recorded(1, "back", "r2")
    assert acts(h.barrier_received(1, "back")) == [SnapshotComplete(1)]
    assert acts(h.message_received("back", "r3")) == []


def test_aligned_back_edge_recorded_for_two_checkpoints_at_once() -> None:
    h: BarrierAligner[str] = BarrierAligner(["in", "back"], back_edges=["back"], name="h")
    assert acts(h.barrier_received(1, "in")) == snapshot(1)
    assert acts(h.message_received("back", "r1")) == recorded(1, "back", "r1")
    assert acts(h.barrier_received(2, "in")) == snapshot(2)
    assert acts(h.message_received("back", "r2")) == [
        *recorded(1, "back", "r2"),
        *recorded(2, "back", "r2"),
    ]
    assert acts(h.barrier_received(1, "back")) == [SnapshotComplete(1)]
    assert acts(h.message_received("back", "r3")) == recorded(2, "back", "r3")
    assert acts(h.barrier_received(2, "back")) == [SnapshotComplete(2)]


def test_a_barrier_on_a_back_edge_before_the_heads_snapshot_is_blocked() -> None:
    h: BarrierAligner[str] = BarrierAligner(["in", "back"], back_edges=["back"], name="h")
    assert acts(h.barrier_received(1, "back")) == [BlockChannel("back")]
    assert h.pending_checkpoint == 1
    assert h.is_blocked("back")
    # the back edge delivered the barrier and nothing since: it is recorded empty
    assert acts(h.barrier_received(1, "in")) == [
        *snapshot(1),
        UnblockChannels(("back",)),
        SnapshotComplete(1),
    ]


def test_a_barrier_on_a_back_edge_after_the_regular_inputs_ended_snapshots() -> None:
    h: BarrierAligner[str] = BarrierAligner(["in", "back"], back_edges=["back"], name="h")
    assert acts(h.end_of_input("in")) == []
    assert acts(h.barrier_received(1, "back")) == [*snapshot(1), SnapshotComplete(1)]


def test_unaligned_head_records_its_back_edge_like_any_other_input() -> None:
    h: BarrierAligner[str] = BarrierAligner(
        ["in", "back"], unaligned=True, back_edges=["back"], name="h"
    )
    assert acts(h.barrier_received(1, "back", unaligned=True, overtaken=["r"])) == [
        *snapshot(1, unaligned=True),
        *recorded(1, "back", "r"),
    ]
    assert acts(h.message_received("in", "m")) == recorded(1, "in", "m")
    assert acts(h.barrier_received(1, "in")) == [SnapshotComplete(1)]


def test_end_of_a_back_edge_completes_the_heads_recording() -> None:
    h: BarrierAligner[str] = BarrierAligner(["in", "back"], back_edges=["back"], name="h")
    assert acts(h.barrier_received(1, "in")) == snapshot(1)
    assert acts(h.message_received("back", "r")) == recorded(1, "back", "r")
    assert acts(h.end_of_input("back")) == [SnapshotComplete(1)]


def test_at_least_once_back_edges_are_not_waited_for_and_are_recorded() -> None:
    h: BarrierTracker[str] = BarrierTracker(["a", "b", "back"], back_edges=["back"], name="h")
    assert acts(h.barrier_received(1, "a")) == []
    assert h.pending_checkpoints == (1,)
    assert acts(h.message_received("a", "m")) == []  # not blocked, not recorded
    assert acts(h.barrier_received(1, "b")) == snapshot(1)
    assert h.pending_checkpoints == ()
    assert h.recorded_channels(1) == {"back"}
    assert acts(h.message_received("back", "r")) == recorded(1, "back", "r")
    assert acts(h.barrier_received(1, "back")) == [SnapshotComplete(1)]


def test_at_least_once_back_edge_barrier_before_the_snapshot_is_not_blocked() -> None:
    h: BarrierTracker[str] = BarrierTracker(["in", "back"], back_edges=["back"], name="h")
    assert acts(h.barrier_received(1, "back")) == []
    assert not h.is_blocked("back")
    assert acts(h.message_received("back", "r")) == []
    assert acts(h.barrier_received(1, "in")) == [*snapshot(1), SnapshotComplete(1)]


# ========================================================================= abort, end


def test_abort_during_recording_declines_it() -> None:
    h: BarrierAligner[str] = BarrierAligner(["a", "b"], unaligned=True, name="t")
    h.barrier_received(1, "a")
    assert acts(h.message_received("b", "m")) == recorded(1, "b", "m")
    assert acts(h.abort(1)) == [DeclineCheckpoint(1, "it was aborted")]
    assert h.recording == ()
    assert acts(h.message_received("b", "m2")) == []
    assert acts(h.barrier_received(1, "b")) == []  # its late barrier is ignored


def test_abort_of_a_newer_checkpoint_declines_an_older_recording_too() -> None:
    h: BarrierAligner[str] = BarrierAligner(["in", "back"], back_edges=["back"], name="h")
    h.barrier_received(1, "in")
    assert acts(h.abort(2)) == [DeclineCheckpoint(1, "it was aborted")]
    assert acts(h.barrier_received(1, "back")) == []
    assert acts(h.barrier_received(2, "in")) == []
    assert acts(h.barrier_received(3, "in")) == snapshot(3)


def test_abort_at_least_once_declines_pending_and_recording_checkpoints() -> None:
    h: BarrierTracker[str] = BarrierTracker(["a", "b", "back"], back_edges=["back"], name="h")
    h.barrier_received(1, "a")
    h.barrier_received(1, "b")  # snapshot 1, recording back
    h.barrier_received(2, "a")  # 2 pending
    h.barrier_received(3, "a")  # 3 pending
    assert acts(h.abort(2)) == [
        DeclineCheckpoint(1, "it was aborted"),
        DeclineCheckpoint(2, "it was aborted"),
    ]
    assert h.pending_checkpoints == (3,)
    assert acts(h.barrier_received(3, "b")) == snapshot(3)


def test_a_newer_barrier_on_a_recorded_channel_declines_the_older_recording() -> None:
    h: BarrierAligner[str] = BarrierAligner(["a", "b"], unaligned=True, name="t")
    h.barrier_received(1, "a")
    # b skipped BarrierItem(1) (checkpoint 1 was declined upstream): 1 can never complete here
    assert acts(h.barrier_received(2, "b")) == [
        DeclineCheckpoint(1, "checkpoint 2 overtook it on channel 'b' before its barrier came"),
        *snapshot(2, unaligned=True),
    ]


def test_end_of_input_completes_a_recording() -> None:
    h: BarrierAligner[str] = BarrierAligner(["a", "b", "c"], unaligned=True, name="t")
    h.barrier_received(1, "a")
    assert acts(h.message_received("b", "m")) == recorded(1, "b", "m")
    assert acts(h.end_of_input("b")) == []  # c is still recorded
    assert acts(h.end_of_input("c")) == [SnapshotComplete(1)]
    # later checkpoints do not wait for the ended inputs
    assert acts(h.barrier_received(2, "a")) == [*snapshot(2, unaligned=True), SnapshotComplete(2)]


def test_end_of_input_completes_two_recordings_at_once() -> None:
    h: BarrierAligner[str] = BarrierAligner(["a", "b"], unaligned=True, name="t")
    h.barrier_received(1, "a")
    h.barrier_received(2, "a")
    assert acts(h.end_of_input("b")) == [SnapshotComplete(1), SnapshotComplete(2)]


# ================================================================ at-least-once tracker


def test_tracker_snapshots_at_the_last_barrier_with_several_checkpoints_pending() -> None:
    h: BarrierTracker[str] = BarrierTracker(["a", "b", "c"], name="t")
    assert acts(h.barrier_received(1, "a")) == []
    assert acts(h.barrier_received(2, "a")) == []
    assert acts(h.barrier_received(1, "b")) == []
    assert acts(h.barrier_received(3, "a")) == []
    assert acts(h.barrier_received(2, "b")) == []
    assert h.pending_checkpoints == (1, 2, 3)
    assert h.blocked_channels == ()
    assert not any(h.is_blocked(c) for c in "abc")
    assert acts(h.barrier_received(1, "c")) == [*snapshot(1), SnapshotComplete(1)]
    assert h.pending_checkpoints == (2, 3)
    assert acts(h.barrier_received(2, "c")) == [*snapshot(2), SnapshotComplete(2)]
    assert acts(h.barrier_received(3, "b")) == []
    assert acts(h.barrier_received(3, "c")) == [*snapshot(3), SnapshotComplete(3)]
    assert h.pending_checkpoints == ()
    assert h.last_settled == 3


def test_tracker_subsumes_a_checkpoint_whose_barrier_was_skipped() -> None:
    h: BarrierTracker[str] = BarrierTracker(["a", "b"], name="t")
    h.barrier_received(1, "a")
    h.barrier_received(2, "a")
    # b skipped BarrierItem(1): 2 completes its barriers first and subsumes 1
    assert acts(h.barrier_received(2, "b")) == [
        DeclineCheckpoint(1, "checkpoint 2 completed its barriers first"),
        *snapshot(2),
        SnapshotComplete(2),
    ]
    assert acts(h.barrier_received(3, "b")) == []


def test_tracker_end_of_input_releases_pending_checkpoints() -> None:
    h: BarrierTracker[str] = BarrierTracker(["a", "b"], name="t")
    h.barrier_received(1, "a")
    assert acts(h.end_of_input("b")) == [*snapshot(1), SnapshotComplete(1)]


def test_tracker_rejects_unaligned_barriers() -> None:
    h: BarrierTracker[str] = BarrierTracker(["a", "b"], name="t")
    with pytest.raises(ProtocolError, match="unaligned"):
        h.barrier_received(1, "a", unaligned=True)
    with pytest.raises(ProtocolError, match="unaligned"):
        h.barrier_received(1, "a", overtaken=["x"])
    assert h.pending_checkpoints == ()


# ============================================================ Chandy-Lamport recorder


def recorder() -> ChandyLamportRecorder[str, str]:
    return ChandyLamportRecorder(["a", "b", "c"], ["o"], name="p")


def test_recorder_initiate_with_closed_channels_records_them_empty() -> None:
    r = recorder()
    assert acts(r.initiate(1, closed=["a"])) == [
        RecordState(1),
        SendMarker(1, "o"),
        ChannelRecorded(1, "a"),
    ]
    assert r.recording_channels(1) == {"b", "c"}
    assert acts(r.message_received("a", "m")) == []
    assert acts(r.message_received("b", "m")) == [RecordMessage(1, "b", "m")]


def test_recorder_initiate_with_every_channel_closed_completes_at_once() -> None:
    r = recorder()
    assert acts(r.initiate(1, closed=["c", "a", "b"])) == [
        RecordState(1),
        SendMarker(1, "o"),
        ChannelRecorded(1, "c"),
        ChannelRecorded(1, "a"),
        ChannelRecorded(1, "b"),
        SnapshotComplete(1),
    ]
    assert r.status(1) is SnapshotStatus.COMPLETE


def test_recorder_initiate_twice_does_nothing_the_second_time() -> None:
    r = recorder()
    r.initiate(1)
    assert acts(r.initiate(1, closed=["a"])) == []
    assert r.recording_channels(1) == {"a", "b", "c"}


def test_recorder_first_marker_with_overtaken_messages() -> None:
    r = recorder()
    assert acts(r.marker_received(1, "a", overtaken=["x", "y"])) == [
        RecordState(1),
        SendMarker(1, "o"),
        RecordMessage(1, "a", "x"),
        RecordMessage(1, "a", "y"),
        ChannelRecorded(1, "a"),
    ]
    assert r.recording_channels(1) == {"b", "c"}
    assert acts(r.message_received("a", "x")) == []  # received later: not recorded again


def test_recorder_overtaken_messages_belong_to_that_snapshot_only() -> None:
    r = recorder()
    r.initiate(1)
    r.initiate(2)
    assert acts(r.marker_received(1, "b", overtaken=["z"])) == [
        RecordMessage(1, "b", "z"),
        ChannelRecorded(1, "b"),
    ]
    assert acts(r.message_received("b", "z")) == [RecordMessage(2, "b", "z")]
    assert acts(r.marker_received(2, "b")) == [ChannelRecorded(2, "b")]


def test_recorder_end_of_input() -> None:
    r = recorder()
    r.initiate(1)
    r.marker_received(1, "a")
    assert acts(r.end_of_input("b")) == [ChannelRecorded(1, "b")]
    assert acts(r.end_of_input("c")) == [ChannelRecorded(1, "c"), SnapshotComplete(1)]
    # later snapshots do not record the ended channels
    assert acts(r.initiate(2)) == [RecordState(2), SendMarker(2, "o")]
    assert r.recording_channels(2) == {"a"}
    assert acts(r.marker_received(2, "a")) == [ChannelRecorded(2, "a"), SnapshotComplete(2)]
    with pytest.raises(ProtocolError, match="after its end"):
        r.message_received("b", "m")
    with pytest.raises(ProtocolError, match="after its end"):
        r.end_of_input("b")
    with pytest.raises(ProtocolError, match="after its end"):
        r.initiate(3, closed=["c"])


def test_recorder_end_of_input_with_nothing_recording() -> None:
    r = recorder()
    assert acts(r.end_of_input("a")) == []
    assert acts(r.marker_received(1, "b", overtaken=["x"])) == [
        RecordState(1),
        SendMarker(1, "o"),
        RecordMessage(1, "b", "x"),
        ChannelRecorded(1, "b"),
    ]
    assert r.recording_channels(1) == {"c"}


def test_recorder_abandon() -> None:
    r = recorder()
    r.initiate(1)
    r.initiate(2)
    assert r.abandon(1) is None
    assert r.in_progress() == (2,)
    assert r.status(1) is SnapshotStatus.COMPLETE  # done: it takes no more events
    assert acts(r.message_received("a", "m")) == [RecordMessage(2, "a", "m")]
    assert acts(r.initiate(1)) == []
    with pytest.raises(DuplicateMarkerError):
        r.marker_received(1, "a")
    r.abandon(5)  # one that never started: a later initiate does nothing
    assert acts(r.initiate(5)) == []


# ======================================================================== the model


def test_reference_states_of_a_small_loop() -> None:
    topo = DataflowGraph(
        sources=("s",),
        operators=("h", "t", "out"),
        channels=(("s", "h"), ("h", "t"), ("t", "out"), ("t", "h")),
        back_edges=frozenset({("t", "h")}),
        records=3,
        max_rounds=2,
    )
    # record seq goes round seq % 3 times
    r0, r1, r2 = (Record(0, seq, seq % 3) for seq in range(3))
    loops = [Record(0, 1, 0), Record(0, 2, 1), Record(0, 2, 0)]
    expect = Counter([r0, r1, r2, *loops])
    assert reference_states(topo) == {
        "h": expect,
        "t": expect,
        "out": Counter([r0, Record(0, 1, 0), Record(0, 2, 0)]),
    }


def test_topology_rejects_a_backwards_channel_that_is_no_back_edge() -> None:
    with pytest.raises(ValueError, match="no back edge"):
        DataflowGraph(("s",), ("a", "b"), (("s", "a"), ("a", "b"), ("b", "a")))


def test_a_run_is_determined_by_its_seed() -> None:
    topo = loop_topology(random.Random(4), sources=2, heads=2, body=1, tails=2)
    config = DataflowConfig(mode="aligned_timeout", seed=11, trace=True, trigger_weight=0.3)
    first, second = run_dataflow(topo, config), run_dataflow(topo, config)
    assert first.trace == second.trace
    assert first.completed == second.completed


@pytest.mark.parametrize("mode", MODES)
def test_a_diamond_with_every_checkpoint_replayed(mode: Mode) -> None:
    topo = DataflowGraph(
        sources=("s0", "s1"),
        operators=("a", "b", "j"),
        channels=(("s0", "a"), ("s0", "b"), ("s1", "b"), ("a", "j"), ("b", "j"), ("s1", "j")),
        records=12,
    )
    for seed in range(20):
        config = DataflowConfig(mode=mode, seed=seed, max_checkpoints=4, trigger_weight=0.3)
        run = run_dataflow(topo, config)
        assert run.completed, f"seed {seed}: no checkpoint completed"
        assert check_dataflow_run(run) == [], f"seed {seed}"


# ------------------------------------------------------------------- random dataflows


def build(
    seed: int, mode: Mode, loop: bool, shape: Sequence[int], knobs: Sequence[Any]
) -> tuple[DataflowGraph, DataflowConfig]:
    """A topology and a config from a seed and a few drawn sizes and weights."""
    rng = random.Random(seed)
    sources, a, b, c, records, rounds = shape
    if loop:
        topo = loop_topology(
            rng,
            sources=sources,
            heads=1 + a % 2,
            body=b % 3,
            tails=1 + c % 2,
            records=records,
            max_rounds=rounds,
        )
    else:
        topo = dag_topology(rng, sources=sources, layers=1 + a % 3, width=3, records=records)
    capacity, in_capacity, checkpoints, trigger, timeout, abort, unaligned_sources, timers = knobs
    config = DataflowConfig(
        mode=mode,
        seed=seed,
        buffer_capacity=capacity,
        input_capacity=in_capacity,
        max_checkpoints=checkpoints,
        trigger_weight=trigger,
        timeout_weight=timeout,
        abort_weight=abort,
        unaligned_sources=unaligned_sources,
        trigger_timers=timers,
    )
    return topo, config


shapes = st.tuples(
    st.integers(1, 3),  # sources
    st.integers(0, 5),
    st.integers(0, 5),
    st.integers(0, 5),
    st.integers(1, 9),  # records per source
    st.integers(0, 3),  # rounds round the loop
)
knobs = st.tuples(
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(1, 6),
    st.sampled_from([0.02, 0.1, 0.5, 2.0]),
    st.sampled_from([0.05, 0.3, 1.0]),
    st.sampled_from([0.0, 0.0, 0.01, 0.05]),
    st.booleans(),
    st.sampled_from([0.0, 0.3, 1.0]),  # timers armed at the trigger (aligned_timeout)
)
seeds = st.integers(0, 2**32 - 1)


def assert_no_problem(topo: DataflowGraph, config: DataflowConfig) -> None:
    run = run_dataflow(topo, config)
    problems = check_dataflow_run(run)
    assert not problems, (
        f"{config}\n{topo.describe()}\ncompleted {run.completed}, aborted {sorted(run.aborted)}\n"
        + "\n".join(problems[:10])
        + "\n(run again with trace=True to see every step)"
    )


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=750, deadline=None)
@given(seed=seeds, shape=shapes, knobs=knobs)
def test_random_acyclic_dataflows(
    mode: Mode, seed: int, shape: tuple[int, ...], knobs: tuple[Any, ...]
) -> None:
    assert_no_problem(*build(seed, mode, False, shape, knobs))


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=500, deadline=None)
@given(seed=seeds, shape=shapes, knobs=knobs)
def test_random_dataflows_with_a_loop(
    mode: Mode, seed: int, shape: tuple[int, ...], knobs: tuple[Any, ...]
) -> None:
    assert_no_problem(*build(seed, mode, True, shape, knobs))


def test_random_runs_exercise_every_behaviour() -> None:
    """The property tests are not vacuous: over fixed seeds, every behaviour they are meant
    to check happens (and the checker has completed checkpoints to check)."""
    stats: dict[Mode, Counter[str]] = {mode: Counter() for mode in MODES}
    knob = (1, 2, 5, 0.5, 0.3, 0.02, True, 0.3)
    for mode in MODES:
        for seed in range(40):
            for loop in (False, True):
                topo, config = build(seed, mode, loop, (2, seed, seed // 2, seed // 3, 6, 2), knob)
                stats[mode].update(run_dataflow(topo, config).stats)
    expected: dict[Mode, list[str]] = {
        "aligned": ["blocked channels", "recorded back-edge records"],
        "unaligned": ["overtaken records", "output state records", "recorded records"],
        "aligned_timeout": [
            "alignment timeouts",
            "checkpoints initiated by a timeout",
            "stale timers",
            "alignments switched by an unaligned barrier",
            "overtaken records",
            "output state records",
        ],
        "at_least_once": [
            "barriers with several checkpoints pending",
            "recorded back-edge records",
        ],
    }
    common = [
        "completed checkpoints",
        "declines after a snapshot",
        "aborted checkpoints",
        "finished snapshots",
        "snapshots completed by an end of input",
    ]
    missing = {
        mode: [key for key in [*common, *expected[mode]] if not stats[mode][key]] for mode in MODES
    }
    assert missing == {mode: [] for mode in MODES}


@pytest.mark.parametrize("mode", MODES)
def test_a_back_edge_from_a_tail_the_head_does_not_feed(mode: Mode) -> None:
    """``t`` gets its barriers through ``h0`` and sends them round to ``h1``, which may not
    have snapshotted yet: aligned, ``h1`` then blocks its back edge."""
    topo = DataflowGraph(
        sources=("s0", "s1"),
        operators=("h0", "t", "h1", "out"),
        channels=(
            ("s0", "h0"),
            ("h0", "t"),
            ("t", "out"),
            ("s1", "h1"),
            ("h1", "out"),
            ("t", "h1"),
        ),
        back_edges=frozenset({("t", "h1")}),
        records=8,
        max_rounds=1,
    )
    blocked = 0
    for seed in range(40):
        config = DataflowConfig(mode=mode, seed=seed, trigger_weight=0.5, max_checkpoints=4)
        run = run_dataflow(topo, config)
        assert check_dataflow_run(run) == [], f"seed {seed}"
        blocked += run.stats["blocked back edges"]
    assert (blocked > 0) is (mode in ("aligned", "aligned_timeout"))


def test_at_least_once_replay_can_duplicate_records() -> None:
    """The at-least-once checks allow duplicates, and they do happen: the checks are not
    just the exactly-once ones."""
    topo = DataflowGraph(
        sources=("s0", "s1"),
        operators=("j",),
        channels=(("s0", "j"), ("s1", "j")),
        records=10,
    )
    for seed in range(100):
        config = DataflowConfig(mode="at_least_once", seed=seed, trigger_weight=0.5)
        run = run_dataflow(topo, config)
        assert check_dataflow_run(run) == []
        for n in run.completed:
            final = replay(run, n).final_states["j"]
            if final != reference_states(topo)["j"]:
                assert final - reference_states(topo)["j"]  # only extra records
                return
    pytest.fail("no replay duplicated a record")


# ------------------------------------------------------------------ broken handlers


class ForgetsOvertaken(BarrierAligner[ChannelId]):
    """Takes an unaligned barrier as such, but drops the records it overtook."""

    def barrier_received(
        self,
        checkpoint_id: int,
        channel: ChannelId,
        *,
        unaligned: bool = False,
        overtaken: Sequence[Any] = (),
    ) -> Sequence[Any]:
        return super().barrier_received(
            checkpoint_id, channel, unaligned=unaligned or bool(overtaken)
        )


class DropsBackEdgeRecords(BarrierAligner[ChannelId]):
    """Never records what comes round a back edge."""

    def message_received(self, channel: ChannelId, message: Any) -> Sequence[Any]:
        actions = super().message_received(channel, message)
        return [a for a in actions if a.channel not in self.back_edges]


def forgets_overtaken(
    name: str, inputs: Sequence[ChannelId], back: frozenset[ChannelId], mode: Mode
) -> Handler:
    return ForgetsOvertaken(inputs, unaligned=mode == "unaligned", back_edges=back, name=name)


def never_blocks(
    name: str, inputs: Sequence[ChannelId], back: frozenset[ChannelId], mode: Mode
) -> Handler:
    return BarrierTracker(inputs, back_edges=back, name=name)


def drops_back_edge_records(
    name: str, inputs: Sequence[ChannelId], back: frozenset[ChannelId], mode: Mode
) -> Handler:
    return DropsBackEdgeRecords(inputs, unaligned=mode == "unaligned", back_edges=back, name=name)


@pytest.mark.parametrize(
    ("factory", "mode", "loop", "symptom"),
    [
        (forgets_overtaken, "unaligned", False, "but the cut holds"),
        (forgets_overtaken, "aligned_timeout", False, "but the cut holds"),
        (never_blocks, "aligned", False, "but the cut holds"),
        (drops_back_edge_records, "aligned", True, "but the cut holds"),
        (drops_back_edge_records, "unaligned", True, "but the cut holds"),
    ],
    ids=[
        "forgets-overtaken",
        "forgets-overtaken-timeout",
        "never-blocks",
        "drops-back-edge",
        "drops-back-edge-unaligned",
    ],
)
def test_the_checker_catches_a_broken_handler(
    factory: HandlerFactory, mode: Mode, loop: bool, symptom: str
) -> None:
    knob = (1, 2, 4, 0.5, 0.3, 0.0, True, 0.0)
    for seed in range(200):
        topo, config = build(seed, mode, loop, (2, seed, seed // 2, seed // 3, 6, 2), knob)
        run = run_dataflow(topo, config, handler_factory=factory)
        problems = check_checkpoints(run)
        if problems:
            assert symptom in problems[0]
            return
    pytest.fail("the checker never noticed")
