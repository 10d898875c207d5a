"""Unit tests of the sans-IO Chandy-Lamport recorder (SEMANTICS.md §1-§2).

Every transition is checked against the exact list of actions it returns (order
matters) and against the queries afterwards: ``status``, ``in_progress``,
``is_recording`` and ``recording_channels``.

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
    ChandyLamportRecorder,
    ChannelRecorded,
    DuplicateMarkerError,
    InvalidSnapshotIdError,
    ProtocolError,
    RecordMessage,
    RecordState,
    SendMarker,
    SnapshotComplete,
    SnapshotStatus,
    UnknownChannelError,
)

NOT_STARTED = SnapshotStatus.NOT_STARTED
RECORDING = SnapshotStatus.RECORDING
COMPLETE = SnapshotStatus.COMPLETE

Recorder = ChandyLamportRecorder[Any, Any]


# --------------------------------------------------------------------- helpers


def make(
    inputs: Iterable[Hashable] = ("a", "b", "c"),
    outputs: Iterable[Hashable] = ("x", "y"),
    name: str = "p1",
) -> Recorder:
    return ChandyLamportRecorder(inputs, outputs, name=name)


def acts(actions: Sequence[Any]) -> list[Any]:
    """The returned actions as a list (the recorder returns a list or an empty tuple)."""
    return list(actions)


def started(snapshot_id: int, outputs: Iterable[Hashable] = ("x", "y")) -> list[Any]:
    """What recording the state for ``snapshot_id`` returns first: RecordState, then markers."""
    return [RecordState(snapshot_id), *(SendMarker(snapshot_id, out) for out in outputs)]


def observe(r: Recorder, ids: Iterable[int], channels: Iterable[Hashable]) -> tuple[Any, ...]:
    """Everything the queries say about ``ids`` and ``channels``, to compare before/after."""
    ids = tuple(ids)
    channels = tuple(channels)
    return (
        {s: r.status(s) for s in ids},
        r.in_progress(),
        {s: r.recording_channels(s) for s in ids},
        {(s, c): r.is_recording(s, c) for s in ids for c in channels},
    )


def assert_not_started(r: Recorder, snapshot_id: int) -> None:
    assert r.status(snapshot_id) is NOT_STARTED
    assert snapshot_id not in r.in_progress()
    assert r.recording_channels(snapshot_id) == frozenset()
    for c in r.inputs:
        assert not r.is_recording(snapshot_id, c)


def assert_complete(r: Recorder, snapshot_id: int) -> None:
    assert r.status(snapshot_id) is COMPLETE
    assert snapshot_id not in r.in_progress()
    assert r.recording_channels(snapshot_id) == frozenset()
    for c in r.inputs:
        assert not r.is_recording(snapshot_id, c)


def assert_recording(r: Recorder, snapshot_id: int, channels: Iterable[Hashable]) -> None:
    channels = frozenset(channels)
    assert channels, "use assert_complete for a snapshot with no open channel"
    assert r.status(snapshot_id) is RECORDING
    assert snapshot_id in r.in_progress()
    assert r.recording_channels(snapshot_id) == channels
    for c in r.inputs:
        assert r.is_recording(snapshot_id, c) is (c in channels)


def raises_naming(exc: type[Exception], *parts: object) -> Any:
    """``pytest.raises(exc)`` whose message contains every one of ``parts`` verbatim."""
    pattern = "".join(f"(?=.*{re.escape(str(p))})" for p in parts)
    return pytest.raises(exc, match=re.compile(pattern, re.DOTALL))


# ----------------------------------------------------------------- constructor


def test_constructor_keeps_channels_in_order_and_name() -> None:
    r = make(inputs=["c", "a", "b"], outputs=["z", "x"], name="bank-3")
    assert r.inputs == ("c", "a", "b")
    assert r.outputs == ("z", "x")
    assert r.name == "bank-3"


def test_constructor_accepts_one_shot_iterables() -> None:
    r = ChandyLamportRecorder((c for c in "ab"), iter(["x"]))
    assert r.inputs == ("a", "b")
    assert r.outputs == ("x",)
    assert r.name == "process"


def test_fresh_recorder_has_nothing_started() -> None:
    r = make()
    assert r.in_progress() == ()
    for s in (0, 1, 7, 10**18):
        assert_not_started(r, s)


def test_duplicate_input_channel_is_a_value_error_naming_the_process() -> None:
    with raises_naming(ValueError, "p9", "input", "'a'"):
        ChandyLamportRecorder(["a", "b", "a"], ["x"], name="p9")


def test_duplicate_output_channel_is_a_value_error_naming_the_process() -> None:
    with raises_naming(ValueError, "p9", "output", "'x'"):
        ChandyLamportRecorder(["a"], ["x", "y", "x"], name="p9")


def test_duplicate_tuple_channel_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="p9"):
        ChandyLamportRecorder([("p", "q"), ("r", "q"), ("p", "q")], [], name="p9")
    with pytest.raises(ValueError, match="p9"):
        ChandyLamportRecorder([], [("q", "p"), ("q", "p")], name="p9")


def test_same_channel_id_as_input_and_output_is_allowed() -> None:
    # A self-loop (or a shared id namespace): the input and output lists are separate.
    r = make(inputs=["loop"], outputs=["loop"])
    assert acts(r.initiate(0)) == [RecordState(0), SendMarker(0, "loop")]
    assert_recording(r, 0, {"loop"})
    assert acts(r.marker_received(0, "loop")) == [
        ChannelRecorded(0, "loop"),
        SnapshotComplete(0),
    ]
    assert_complete(r, 0)


# -------------------------------------------------------------------- initiate


def test_initiate_with_inputs_and_outputs() -> None:
    r = make()
    assert acts(r.initiate(0)) == [
        RecordState(0),
        SendMarker(0, "x"),
        SendMarker(0, "y"),
    ]
    assert r.in_progress() == (0,)
    assert_recording(r, 0, {"a", "b", "c"})
    assert_not_started(r, 1)


def test_initiate_sends_markers_in_the_order_outputs_were_given() -> None:
    outputs = ["m", "z", "a", "q", "b"]
    r = make(outputs=outputs)
    assert acts(r.initiate(3)) == [RecordState(3), *(SendMarker(3, o) for o in outputs)]


def test_initiate_with_no_inputs_completes_at_once() -> None:
    r = make(inputs=[])
    assert acts(r.initiate(0)) == [*started(0), SnapshotComplete(0)]
    assert_complete(r, 0)
    assert r.in_progress() == ()


def test_initiate_with_no_outputs_sends_no_marker() -> None:
    r = make(outputs=[])
    assert acts(r.initiate(0)) == [RecordState(0)]
    assert_recording(r, 0, {"a", "b", "c"})


def test_initiate_with_neither_inputs_nor_outputs() -> None:
    r = make(inputs=[], outputs=[])
    assert acts(r.initiate(4)) == [RecordState(4), SnapshotComplete(4)]
    assert_complete(r, 4)
    assert r.in_progress() == ()


def test_initiate_twice_is_a_no_op_while_in_progress() -> None:
    r = make()
    r.initiate(0)
    before = observe(r, [0, 1], r.inputs)
    assert acts(r.initiate(0)) == []
    assert observe(r, [0, 1], r.inputs) == before
    assert_recording(r, 0, {"a", "b", "c"})


def test_initiate_after_recording_due_to_a_marker_is_a_no_op() -> None:
    r = make()
    r.marker_received(0, "b")
    before = observe(r, [0], r.inputs)
    assert acts(r.initiate(0)) == []
    assert observe(r, [0], r.inputs) == before
    assert_recording(r, 0, {"a", "c"})
    # and the snapshot goes on as if the initiate never came
    assert acts(r.marker_received(0, "a")) == [ChannelRecorded(0, "a")]
    assert acts(r.marker_received(0, "c")) == [ChannelRecorded(0, "c"), SnapshotComplete(0)]
    assert_complete(r, 0)


def test_initiate_after_local_completion_by_markers_is_a_no_op() -> None:
    r = make()
    r.initiate(0)
    for c in ("a", "b", "c"):
        r.marker_received(0, c)
    assert_complete(r, 0)
    assert acts(r.initiate(0)) == []
    assert_complete(r, 0)
    assert r.in_progress() == ()


def test_initiate_after_completion_started_by_a_marker_is_a_no_op() -> None:
    r = make(inputs=["a"])
    assert acts(r.marker_received(2, "a")) == [
        *started(2),
        ChannelRecorded(2, "a"),
        SnapshotComplete(2),
    ]
    assert acts(r.initiate(2)) == []
    assert_complete(r, 2)


def test_initiate_after_immediate_completion_is_a_no_op() -> None:
    r = make(inputs=[])
    r.initiate(0)
    assert acts(r.initiate(0)) == []
    assert_complete(r, 0)


def test_initiate_of_another_id_is_not_affected_by_a_recorded_one() -> None:
    r = make()
    r.initiate(0)
    assert acts(r.initiate(1)) == started(1)
    assert r.in_progress() == (0, 1)
    assert_recording(r, 0, {"a", "b", "c"})
    assert_recording(r, 1, {"a", "b", "c"})


# ------------------------------------------------------------- marker_received


def test_first_marker_records_closes_its_channel_and_records_the_others() -> None:
    r = make()
    assert acts(r.marker_received(0, "b")) == [
        RecordState(0),
        SendMarker(0, "x"),
        SendMarker(0, "y"),
        ChannelRecorded(0, "b"),
    ]
    assert r.in_progress() == (0,)
    assert_recording(r, 0, {"a", "c"})


def test_first_marker_with_no_outputs() -> None:
    r = make(outputs=[])
    assert acts(r.marker_received(1, "c")) == [RecordState(1), ChannelRecorded(1, "c")]
    assert_recording(r, 1, {"a", "b"})


def test_first_marker_on_the_only_input_completes_at_once() -> None:
    r = make(inputs=["a"])
    assert acts(r.marker_received(0, "a")) == [
        RecordState(0),
        SendMarker(0, "x"),
        SendMarker(0, "y"),
        ChannelRecorded(0, "a"),
        SnapshotComplete(0),
    ]
    assert_complete(r, 0)
    assert r.in_progress() == ()


def test_first_marker_on_the_only_input_with_no_outputs() -> None:
    r = make(inputs=["a"], outputs=[])
    assert acts(r.marker_received(0, "a")) == [
        RecordState(0),
        ChannelRecorded(0, "a"),
        SnapshotComplete(0),
    ]
    assert_complete(r, 0)


def test_later_markers_close_channels_one_by_one_after_initiate() -> None:
    r = make()
    r.initiate(0)
    assert acts(r.marker_received(0, "b")) == [ChannelRecorded(0, "b")]
    assert_recording(r, 0, {"a", "c"})
    assert acts(r.marker_received(0, "a")) == [ChannelRecorded(0, "a")]
    assert_recording(r, 0, {"c"})
    assert acts(r.marker_received(0, "c")) == [ChannelRecorded(0, "c"), SnapshotComplete(0)]
    assert_complete(r, 0)
    assert r.in_progress() == ()


def test_later_markers_close_channels_one_by_one_after_a_first_marker() -> None:
    r = make()
    r.marker_received(0, "c")
    assert acts(r.marker_received(0, "a")) == [ChannelRecorded(0, "a")]
    assert_recording(r, 0, {"b"})
    assert acts(r.marker_received(0, "b")) == [ChannelRecorded(0, "b"), SnapshotComplete(0)]
    assert_complete(r, 0)


@pytest.mark.parametrize("order", list(itertools.permutations("abc")))
@pytest.mark.parametrize("initiated", [True, False], ids=["initiate-first", "marker-first"])
def test_every_marker_order_completes_on_the_last_marker(
    order: tuple[str, ...], initiated: bool
) -> None:
    r = make()
    if initiated:
        assert acts(r.initiate(0)) == started(0)
    open_channels = {"a", "b", "c"}
    for i, c in enumerate(order):
        expected: list[Any] = []
        if i == 0 and not initiated:
            expected += started(0)
        expected.append(ChannelRecorded(0, c))
        open_channels.discard(c)
        if not open_channels:
            expected.append(SnapshotComplete(0))
        assert acts(r.marker_received(0, c)) == expected
        if open_channels:
            assert_recording(r, 0, open_channels)
    assert_complete(r, 0)


# ------------------------------------------------------------ message_received


def test_message_before_any_snapshot_returns_no_action() -> None:
    r = make()
    assert acts(r.message_received("a", "m")) == []
    assert r.in_progress() == ()


def test_message_on_an_open_channel_is_recorded() -> None:
    r = make()
    r.initiate(0)
    assert acts(r.message_received("a", "m1")) == [RecordMessage(0, "a", "m1")]
    assert acts(r.message_received("a", "m2")) == [RecordMessage(0, "a", "m2")]
    assert acts(r.message_received("c", "m3")) == [RecordMessage(0, "c", "m3")]
    # recording messages does not change what is open
    assert_recording(r, 0, {"a", "b", "c"})


def test_messages_are_recorded_only_between_recording_and_the_channel_marker() -> None:
    r = make(inputs=["a", "b"])
    assert acts(r.message_received("a", "before")) == []
    r.initiate(0)
    assert acts(r.message_received("a", "during")) == [RecordMessage(0, "a", "during")]
    r.marker_received(0, "a")
    assert acts(r.message_received("a", "after-marker")) == []
    # b is still open
    assert acts(r.message_received("b", "b-during")) == [RecordMessage(0, "b", "b-during")]
    r.marker_received(0, "b")
    assert acts(r.message_received("b", "after-complete")) == []
    assert acts(r.message_received("a", "after-complete")) == []
    assert_complete(r, 0)


def test_message_on_the_channel_whose_marker_started_recording_is_not_recorded() -> None:
    r = make()
    r.marker_received(0, "a")
    assert acts(r.message_received("a", "m")) == []
    assert acts(r.message_received("b", "m")) == [RecordMessage(0, "b", "m")]


def test_message_on_an_input_no_snapshot_is_recording_returns_no_action() -> None:
    r = make()
    r.initiate(0)
    r.marker_received(0, "a")
    r.initiate(1)
    r.marker_received(1, "a")
    assert acts(r.message_received("a", "m")) == []
    assert acts(r.message_received("b", "m")) == [
        RecordMessage(0, "b", "m"),
        RecordMessage(1, "b", "m"),
    ]


def test_message_payload_is_passed_through_untouched() -> None:
    r = make()
    r.initiate(0)
    r.initiate(1)
    payload = {"unhashable": [1, 2, 3]}
    actions = acts(r.message_received("b", payload))
    assert [a.snapshot_id for a in actions] == [0, 1]
    assert all(a.message is payload for a in actions)
    assert all(a.channel == "b" for a in actions)
    assert acts(r.message_received("b", None)) == [
        RecordMessage(0, "b", None),
        RecordMessage(1, "b", None),
    ]


# ------------------------------------------------------- concurrent snapshots


def test_message_is_recorded_for_each_snapshot_in_the_order_they_started() -> None:
    r = make()
    r.initiate(0)
    r.initiate(1)
    r.initiate(2)
    assert r.in_progress() == (0, 1, 2)
    assert acts(r.message_received("a", "m")) == [
        RecordMessage(0, "a", "m"),
        RecordMessage(1, "a", "m"),
        RecordMessage(2, "a", "m"),
    ]


def test_ids_out_of_order_record_in_start_order_not_id_order() -> None:
    r = make()
    assert acts(r.initiate(5)) == started(5)
    assert acts(r.marker_received(2, "c")) == [*started(2), ChannelRecorded(2, "c")]
    assert r.in_progress() == (5, 2)
    assert acts(r.message_received("a", "m")) == [
        RecordMessage(5, "a", "m"),
        RecordMessage(2, "a", "m"),
    ]
    # c is closed for 2 only
    assert acts(r.message_received("c", "n")) == [RecordMessage(5, "c", "n")]
    assert_recording(r, 5, {"a", "b", "c"})
    assert_recording(r, 2, {"a", "b"})
    for s in (0, 1, 3, 4, 6):
        assert_not_started(r, s)


def test_start_order_is_kept_when_a_middle_snapshot_stops_recording_a_channel() -> None:
    r = make()
    for s in (7, 3, 9):
        r.initiate(s)
    assert acts(r.marker_received(3, "a")) == [ChannelRecorded(3, "a")]
    assert acts(r.message_received("a", "m")) == [
        RecordMessage(7, "a", "m"),
        RecordMessage(9, "a", "m"),
    ]
    assert acts(r.message_received("b", "m")) == [
        RecordMessage(7, "b", "m"),
        RecordMessage(3, "b", "m"),
        RecordMessage(9, "b", "m"),
    ]


def test_concurrent_snapshots_complete_independently() -> None:
    r = make(inputs=["a", "b"])
    r.initiate(0)
    r.marker_received(1, "a")
    assert_recording(r, 0, {"a", "b"})
    assert_recording(r, 1, {"b"})
    # a marker for 1 does not touch 0's recording of the same channel
    assert acts(r.marker_received(1, "b")) == [ChannelRecorded(1, "b"), SnapshotComplete(1)]
    assert_complete(r, 1)
    assert_recording(r, 0, {"a", "b"})
    assert r.in_progress() == (0,)
    assert acts(r.message_received("b", "m")) == [RecordMessage(0, "b", "m")]
    assert acts(r.marker_received(0, "a")) == [ChannelRecorded(0, "a")]
    assert acts(r.marker_received(0, "b")) == [ChannelRecorded(0, "b"), SnapshotComplete(0)]
    assert_complete(r, 0)
    assert_complete(r, 1)
    assert r.in_progress() == ()


def test_in_progress_drops_completed_ids_and_keeps_start_order() -> None:
    r = make(inputs=["a"])
    r.initiate(4)
    r.initiate(1)
    r.initiate(8)
    assert r.in_progress() == (4, 1, 8)
    r.marker_received(1, "a")
    assert r.in_progress() == (4, 8)
    r.initiate(0)
    assert r.in_progress() == (4, 8, 0)


def test_ids_completed_out_of_order() -> None:
    r = make(inputs=["a"])
    for s in (5, 2):
        r.marker_received(s, "a")
    for s in (2, 5):
        assert_complete(r, s)
    for s in (0, 1, 3, 4, 6):
        assert_not_started(r, s)
    for s in (0, 3, 1, 4):
        assert acts(r.initiate(s)) == started(s)
        assert_recording(r, s, {"a"})
        r.marker_received(s, "a")
    for s in range(6):
        assert_complete(r, s)
        with pytest.raises(DuplicateMarkerError):
            r.marker_received(s, "a")
        assert acts(r.initiate(s)) == []
    assert_not_started(r, 6)
    assert acts(r.initiate(6)) == started(6)


@pytest.mark.parametrize("big", [2**31, 2**32 + 1, 10**18, 2**63 - 1, 2**64, 10**30])
def test_large_ids(big: int) -> None:
    r = make(inputs=["a", "b"])
    assert acts(r.initiate(big)) == started(big)
    assert_recording(r, big, {"a", "b"})
    for s in (0, big - 1, big + 1):
        assert_not_started(r, s)
    assert acts(r.message_received("a", "m")) == [RecordMessage(big, "a", "m")]
    assert acts(r.marker_received(big, "a")) == [ChannelRecorded(big, "a")]
    assert acts(r.marker_received(big, "b")) == [ChannelRecorded(big, "b"), SnapshotComplete(big)]
    assert_complete(r, big)
    for s in (0, 1, big - 1, big + 1):
        assert_not_started(r, s)
    with raises_naming(DuplicateMarkerError, "p1", "'a'"):
        r.marker_received(big, "a")
    assert acts(r.initiate(big)) == []
    # a small id still works next to it
    assert acts(r.initiate(0)) == started(0)


def test_many_sequential_ids_complete_and_reject_late_markers() -> None:
    r = make(inputs=["a", "b"], outputs=["x"])
    n = 3000
    for s in range(n):
        if s % 2:
            assert acts(r.initiate(s)) == [RecordState(s), SendMarker(s, "x")]
            r.marker_received(s, "b")
        else:
            r.marker_received(s, "b")
        assert acts(r.marker_received(s, "a")) == [ChannelRecorded(s, "a"), SnapshotComplete(s)]
    assert r.in_progress() == ()
    for s in range(n):
        assert r.status(s) is COMPLETE
    for s in (0, 1, n // 2, n - 2, n - 1):
        for c in ("a", "b"):
            with raises_naming(DuplicateMarkerError, "p1", repr(c), "completed"):
                r.marker_received(s, c)
        assert acts(r.initiate(s)) == []
        assert acts(r.message_received("a", "late")) == []
    assert_not_started(r, n)
    assert_not_started(r, n + 1)


def test_many_overlapping_sequential_ids_keep_the_completed_set_compact() -> None:
    """Ids started in order, up to three at once, completing in order."""
    r = make(inputs=["a", "b"], outputs=[])
    n, window = 2000, 3
    for s in range(n + window):
        if s < n:
            assert acts(r.initiate(s)) == [RecordState(s)]
        old = s - window
        if old >= 0:
            assert acts(r.marker_received(old, "a")) == [ChannelRecorded(old, "a")]
            assert acts(r.marker_received(old, "b")) == [
                ChannelRecorded(old, "b"),
                SnapshotComplete(old),
            ]
        assert len(r.in_progress()) <= window
    assert r.in_progress() == ()
    assert all(r.status(s) is COMPLETE for s in range(n))
    assert r.status(n) is NOT_STARTED
    with pytest.raises(DuplicateMarkerError):
        r.marker_received(n - 1, "a")
    with pytest.raises(DuplicateMarkerError):
        r.marker_received(0, "b")
    # White-box: with ids completing in order nothing is kept above the floor.
    # (This reads a private attribute; update it if _CompletedIds is reworked.)
    assert len(r._completed._above) == 0
    assert len(r._completed) == n


def test_completed_set_collapses_after_a_gap_is_filled() -> None:
    r = make(inputs=[], outputs=[])
    for s in range(100, 0, -1):  # 100 .. 1, all above the floor 0
        r.initiate(s)
    assert all(r.status(s) is COMPLETE for s in range(1, 101))
    assert r.status(0) is NOT_STARTED
    r.initiate(0)
    assert all(r.status(s) is COMPLETE for s in range(101))
    assert r.status(101) is NOT_STARTED
    # White-box, as above: filling the gap collapses the set to its floor.
    assert len(r._completed._above) == 0


# ---------------------------------------------------------------------- errors


def test_error_classes_are_protocol_errors() -> None:
    for cls in (UnknownChannelError, DuplicateMarkerError, InvalidSnapshotIdError):
        assert issubclass(cls, ProtocolError)
        assert issubclass(cls, Exception)


@pytest.mark.parametrize("channel", ["zz", "x", ("a",), 0])
def test_marker_on_unknown_channel(channel: Hashable) -> None:
    # "x" is an output of the process, not an input: still unknown for a marker.
    r = make()
    with raises_naming(UnknownChannelError, "p1", repr(channel), "marker"):
        r.marker_received(0, channel)
    assert_not_started(r, 0)
    assert r.in_progress() == ()


def test_marker_on_unknown_channel_during_a_snapshot_leaves_state_unchanged() -> None:
    r = make()
    r.initiate(0)
    r.marker_received(0, "a")
    before = observe(r, [0, 1], [*r.inputs, "zz"])
    with raises_naming(UnknownChannelError, "p1", "'zz'"):
        r.marker_received(0, "zz")
    with raises_naming(UnknownChannelError, "p1", "'zz'"):
        r.marker_received(1, "zz")
    assert observe(r, [0, 1], [*r.inputs, "zz"]) == before
    assert acts(r.message_received("b", "m")) == [RecordMessage(0, "b", "m")]


def test_marker_on_a_process_with_no_inputs_is_unknown() -> None:
    r = make(inputs=[])
    with raises_naming(UnknownChannelError, "p1", "'a'"):
        r.marker_received(0, "a")
    assert_not_started(r, 0)


@pytest.mark.parametrize("recording", [False, True], ids=["idle", "recording"])
def test_message_on_unknown_channel(recording: bool) -> None:
    r = make()
    if recording:
        r.initiate(0)
    before = observe(r, [0], [*r.inputs, "zz"])
    with raises_naming(UnknownChannelError, "p1", "'zz'", "message"):
        r.message_received("zz", "m")
    with raises_naming(UnknownChannelError, "p1", "'y'"):
        r.message_received("y", "m")  # an output, not an input
    assert observe(r, [0], [*r.inputs, "zz"]) == before


def test_duplicate_marker_while_in_progress_is_rejected_and_changes_nothing() -> None:
    r = make()
    r.initiate(0)
    r.marker_received(0, "a")
    before = observe(r, [0], r.inputs)
    with raises_naming(DuplicateMarkerError, "p1", "'a'", "0"):
        r.marker_received(0, "a")
    assert observe(r, [0], r.inputs) == before
    assert_recording(r, 0, {"b", "c"})
    # the rest of the snapshot proceeds normally
    assert acts(r.message_received("a", "m")) == []
    assert acts(r.message_received("b", "m")) == [RecordMessage(0, "b", "m")]
    assert acts(r.marker_received(0, "b")) == [ChannelRecorded(0, "b")]
    assert acts(r.marker_received(0, "c")) == [ChannelRecorded(0, "c"), SnapshotComplete(0)]


def test_duplicate_marker_on_the_channel_that_started_recording() -> None:
    r = make()
    r.marker_received(3, "b")
    before = observe(r, [3], r.inputs)
    with raises_naming(DuplicateMarkerError, "p1", "'b'", "3"):
        r.marker_received(3, "b")
    assert observe(r, [3], r.inputs) == before
    assert_recording(r, 3, {"a", "c"})


def test_duplicate_marker_does_not_disturb_other_snapshots() -> None:
    r = make()
    r.initiate(0)
    r.initiate(1)
    r.marker_received(0, "a")
    before = observe(r, [0, 1], r.inputs)
    with pytest.raises(DuplicateMarkerError):
        r.marker_received(0, "a")
    assert observe(r, [0, 1], r.inputs) == before
    assert acts(r.message_received("a", "m")) == [RecordMessage(1, "a", "m")]


@pytest.mark.parametrize("channel", ["a", "b", "c"])
def test_duplicate_marker_after_completion(channel: str) -> None:
    r = make()
    r.initiate(0)
    for c in ("a", "b", "c"):
        r.marker_received(0, c)
    with raises_naming(DuplicateMarkerError, "p1", repr(channel), "completed"):
        r.marker_received(0, channel)
    assert_complete(r, 0)
    assert r.in_progress() == ()
    # did not restart the snapshot
    assert acts(r.message_received(channel, "m")) == []


def test_duplicate_marker_after_immediate_completion() -> None:
    r = make(inputs=["a"])
    r.marker_received(0, "a")
    with raises_naming(DuplicateMarkerError, "p1", "'a'"):
        r.marker_received(0, "a")
    assert_complete(r, 0)


INVALID_IDS = [-1, -(10**20), True, False, 1.0, 0.0, 2.5, "0", "1", None, b"1", (1,)]


@pytest.mark.parametrize("bad", INVALID_IDS, ids=repr)
def test_initiate_rejects_invalid_ids(bad: Any) -> None:
    r = make()
    r.initiate(1)
    before = observe(r, [0, 1, 2], r.inputs)
    with raises_naming(InvalidSnapshotIdError, "p1", repr(bad)):
        r.initiate(bad)
    assert observe(r, [0, 1, 2], r.inputs) == before
    assert r.in_progress() == (1,)


@pytest.mark.parametrize("bad", INVALID_IDS, ids=repr)
def test_marker_received_rejects_invalid_ids(bad: Any) -> None:
    r = make()
    r.initiate(1)
    before = observe(r, [0, 1, 2], r.inputs)
    with raises_naming(InvalidSnapshotIdError, "p1", repr(bad)):
        r.marker_received(bad, "a")
    assert observe(r, [0, 1, 2], r.inputs) == before
    # True == 1 must not have closed channel a of snapshot 1
    assert_recording(r, 1, {"a", "b", "c"})


def test_invalid_id_check_uses_the_default_name() -> None:
    r = ChandyLamportRecorder(["a"], [])
    with raises_naming(InvalidSnapshotIdError, "process", "-3"):
        r.initiate(-3)


def test_zero_is_a_valid_id() -> None:
    r = make(inputs=[], outputs=[])
    assert acts(r.initiate(0)) == [RecordState(0), SnapshotComplete(0)]


# --------------------------------------------------------------- channel types


CHANNEL_SETS = {
    "str": (["in-1", "in-2", "in-3"], ["out-1", "out-2"]),
    "tuple": ([("p", "q"), ("r", "q"), ("s", "q")], [("q", "p"), ("q", "t")]),
    "int": ([0, 1, 2], [10, 11]),
    "falsy": ([0, "", ()], [b"", frozenset()]),
    "mixed": ([("p", 1), "b", frozenset({"x"})], [3, ("q", "p")]),
}


@pytest.mark.parametrize("kind", list(CHANNEL_SETS))
def test_full_snapshot_with_channel_ids_of_various_types(kind: str) -> None:
    inputs, outputs = CHANNEL_SETS[kind]
    first, second, third = inputs
    r = ChandyLamportRecorder(inputs, outputs, name="q")
    assert acts(r.marker_received(0, second)) == [
        *started(0, outputs),
        ChannelRecorded(0, second),
    ]
    assert_recording(r, 0, {first, third})
    assert acts(r.message_received(second, "m0")) == []
    assert acts(r.message_received(first, "m1")) == [RecordMessage(0, first, "m1")]
    assert acts(r.initiate(1)) == started(1, outputs)
    assert acts(r.message_received(third, "m2")) == [
        RecordMessage(0, third, "m2"),
        RecordMessage(1, third, "m2"),
    ]
    assert acts(r.marker_received(0, first)) == [ChannelRecorded(0, first)]
    assert acts(r.marker_received(0, third)) == [ChannelRecorded(0, third), SnapshotComplete(0)]
    assert_complete(r, 0)
    assert_recording(r, 1, set(inputs))
    with raises_naming(DuplicateMarkerError, "q", repr(first)):
        r.marker_received(0, first)
    with raises_naming(UnknownChannelError, "q", repr(outputs[0])):
        r.marker_received(1, outputs[0])


def test_tuple_channel_is_not_confused_with_its_parts() -> None:
    r = ChandyLamportRecorder([("a", "b")], [], name="q")
    with raises_naming(UnknownChannelError, "q", "'a'"):
        r.marker_received(0, "a")
    with raises_naming(UnknownChannelError, "q", "('a', 'b', 'c')"):
        r.message_received(("a", "b", "c"), "m")
    assert acts(r.marker_received(0, ("a", "b"))) == [
        RecordState(0),
        ChannelRecorded(0, ("a", "b")),
        SnapshotComplete(0),
    ]


def test_none_as_a_channel_id_is_closed_by_its_first_marker() -> None:
    r = ChandyLamportRecorder([None, "b"], ["x"], name="q")
    assert acts(r.marker_received(0, None)) == [
        RecordState(0),
        SendMarker(0, "x"),
        ChannelRecorded(0, None),
    ]
    assert r.recording_channels(0) == frozenset({"b"})
    assert acts(r.message_received(None, "m")) == []


def test_none_as_the_only_input_completes_on_its_first_marker() -> None:
    r = ChandyLamportRecorder([None], [], name="q")
    assert acts(r.marker_received(0, None)) == [
        RecordState(0),
        ChannelRecorded(0, None),
        SnapshotComplete(0),
    ]
    with pytest.raises(DuplicateMarkerError):
        r.marker_received(0, None)


# --------------------------------------------------------------------- queries


def test_recording_channels_returns_a_snapshot_not_a_live_view() -> None:
    r = make()
    r.initiate(0)
    channels = r.recording_channels(0)
    assert isinstance(channels, frozenset)
    r.marker_received(0, "a")
    assert channels == frozenset({"a", "b", "c"})
    assert r.recording_channels(0) == frozenset({"b", "c"})


def test_is_recording_on_unknown_channel_or_id_is_false() -> None:
    r = make()
    r.initiate(0)
    assert not r.is_recording(0, "zz")
    assert not r.is_recording(1, "a")
    assert r.recording_channels(1) == frozenset()


def test_queries_reject_an_invalid_snapshot_id() -> None:
    r = make()
    for bad in (-1, True, 0.5, "x"):
        with pytest.raises(InvalidSnapshotIdError):
            r.status(bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidSnapshotIdError):
            r.is_recording(bad, "a")  # type: ignore[arg-type]
        with pytest.raises(InvalidSnapshotIdError):
            r.recording_channels(bad)  # type: ignore[arg-type]


# ------------------------------------------------------------ property tests


@st.composite
def one_snapshot_runs(draw: st.DrawFn) -> tuple[list[str], list[str], list[tuple[str, Any]]]:
    """k inputs, messages on each, one marker per input, FIFO per channel, any interleaving.

    Events: ("msg", (channel, n)), ("marker", channel), ("initiate", None).
    """
    k = draw(st.integers(1, 4), label="k")
    inputs = [f"in{i}" for i in range(k)]
    outputs = [f"out{i}" for i in range(draw(st.integers(0, 2), label="outputs"))]
    queues: list[list[tuple[str, Any]]] = []
    for c in inputs:
        before = draw(st.integers(0, 3))
        after = draw(st.integers(0, 3))
        q: list[tuple[str, Any]] = [("msg", (c, n)) for n in range(before)]
        q.append(("marker", c))
        q += [("msg", (c, n)) for n in range(before, before + after)]
        queues.append(q)
    events: list[tuple[str, Any]] = []
    while any(queues):
        nonempty = [q for q in queues if q]
        events.append(nonempty[draw(st.integers(0, len(nonempty) - 1))].pop(0))
    where = draw(st.none() | st.integers(0, len(events)), label="initiate at")
    if where is not None:
        events.insert(where, ("initiate", None))
    return inputs, outputs, events


@settings(max_examples=300, deadline=None)
@given(one_snapshot_runs())
def test_property_one_snapshot_any_interleaving(
    run: tuple[list[str], list[str], list[tuple[str, Any]]],
) -> None:
    inputs, outputs, events = run
    r = ChandyLamportRecorder(inputs, outputs, name="prop")
    all_actions: list[Any] = []
    recorded = False
    closed: set[str] = set()
    for kind, arg in events:
        if kind == "initiate":
            actions = acts(r.initiate(0))
            if recorded:
                assert actions == []
            else:
                assert actions == started(0, outputs)
            recorded = True
        elif kind == "marker":
            actions = acts(r.marker_received(0, arg))
            head = [] if recorded else started(0, outputs)
            recorded = True
            closed.add(arg)
            tail = [SnapshotComplete(0)] if len(closed) == len(inputs) else []
            assert actions == [*head, ChannelRecorded(0, arg), *tail]
        else:
            channel = arg[0]
            actions = acts(r.message_received(channel, arg))
            # recorded iff it arrived after the process recorded and before c's marker
            if recorded and channel not in closed:
                assert actions == [RecordMessage(0, channel, arg)]
            else:
                assert actions == []
        all_actions += actions
        if recorded and len(closed) < len(inputs):
            assert_recording(r, 0, set(inputs) - closed)
        elif recorded:
            assert_complete(r, 0)
        else:
            assert_not_started(r, 0)

    assert all_actions.count(RecordState(0)) == 1
    assert all_actions[0] == RecordState(0)
    channel_recorded = [a.channel for a in all_actions if isinstance(a, ChannelRecorded)]
    assert sorted(channel_recorded) == sorted(inputs)
    completes = [a for a in all_actions if isinstance(a, SnapshotComplete)]
    assert completes == [SnapshotComplete(0)]
    assert all_actions[-1] == SnapshotComplete(0)
    assert [a for a in all_actions if isinstance(a, SendMarker)] == [
        SendMarker(0, o) for o in outputs
    ]
    # every message recorded at most once; only messages sent between the cut points
    recorded_msgs = [a.message for a in all_actions if isinstance(a, RecordMessage)]
    assert len(recorded_msgs) == len(set(recorded_msgs))
    assert_complete(r, 0)
    assert r.in_progress() == ()


@st.composite
def concurrent_runs(
    draw: st.DrawFn,
) -> tuple[list[str], list[int], list[tuple[str, Any]]]:
    """Several snapshot ids at once: per input channel one marker per id, messages between.

    Events: ("msg", (channel, n)), ("marker", (id, channel)), ("initiate", id).
    """
    k = draw(st.integers(1, 3), label="k")
    inputs = [f"in{i}" for i in range(k)]
    ids = draw(st.lists(st.integers(0, 50), min_size=1, max_size=3, unique=True), label="ids")
    queues: list[list[tuple[str, Any]]] = []
    for c in inputs:
        markers = draw(st.permutations(ids))
        q: list[tuple[str, Any]] = []
        n = 0
        for s in markers:
            for _ in range(draw(st.integers(0, 2))):
                q.append(("msg", (c, n)))
                n += 1
            q.append(("marker", (s, c)))
        for _ in range(draw(st.integers(0, 2))):
            q.append(("msg", (c, n)))
            n += 1
        queues.append(q)
    initiates = draw(st.lists(st.sampled_from(ids), max_size=4))
    queues += [[("initiate", s)] for s in initiates]
    events: list[tuple[str, Any]] = []
    while any(queues):
        nonempty = [q for q in queues if q]
        events.append(nonempty[draw(st.integers(0, len(nonempty) - 1))].pop(0))
    return inputs, ids, events


@settings(max_examples=200, deadline=None)
@given(concurrent_runs())
def test_property_concurrent_snapshots_match_a_reference_model(
    run: tuple[list[str], list[int], list[tuple[str, Any]]],
) -> None:
    inputs, ids, events = run
    outputs = ["o"]
    r = ChandyLamportRecorder(inputs, outputs, name="prop")
    order: list[int] = []  # ids in the order they started here
    open_: dict[int, set[str]] = {}
    done: set[int] = set()

    def start(s: int) -> list[Any]:
        order.append(s)
        open_[s] = set(inputs)
        return started(s, outputs)

    for kind, arg in events:
        if kind == "initiate":
            expected = [] if arg in open_ or arg in done else start(arg)
            assert acts(r.initiate(arg)) == expected
        elif kind == "marker":
            s, c = arg
            expected = [] if s in open_ else start(s)
            open_[s].discard(c)
            expected.append(ChannelRecorded(s, c))
            if not open_[s]:
                del open_[s]
                done.add(s)
                expected.append(SnapshotComplete(s))
            assert acts(r.marker_received(s, c)) == expected
        else:
            c = arg[0]
            expected = [RecordMessage(s, c, arg) for s in order if c in open_.get(s, ())]
            assert acts(r.message_received(c, arg)) == expected
        assert r.in_progress() == tuple(s for s in order if s in open_)
        for s in ids:
            if s in open_:
                assert_recording(r, s, open_[s])
            elif s in done:
                assert_complete(r, s)
            else:
                assert_not_started(r, s)
    assert done == set(ids)
    assert r.in_progress() == ()


def test_discard_below_keeps_memory_constant_with_gaps_in_the_ids() -> None:
    r = ChandyLamportRecorder(["a"], ["x"], name="q")
    for s in range(1, 2001, 2):  # odd ids only: a gap below every one
        r.initiate(s)
        r.marker_received(s, "a")
    assert len(r._completed._above) == 1000  # one entry per id above the first gap
    r.discard_below(2001)
    assert len(r._completed._above) == 0
    assert r.status(1999) is SnapshotStatus.COMPLETE
    assert r.status(0) is SnapshotStatus.COMPLETE  # discarded ids count as complete
    with pytest.raises(DuplicateMarkerError):
        r.marker_received(7, "a")
    assert r.status(2001) is SnapshotStatus.NOT_STARTED


def test_discard_below_refuses_while_a_lower_snapshot_is_in_progress() -> None:
    r = ChandyLamportRecorder(["a", "b"], [], name="q")
    r.initiate(3)
    with pytest.raises(ProtocolError, match=r"snapshot\(s\) \[3\] still in progress"):
        r.discard_below(5)
    assert r.status(3) is SnapshotStatus.RECORDING
    r.discard_below(3)  # ids below the one in progress are fine
    assert r.status(2) is SnapshotStatus.COMPLETE


def test_an_unknown_channel_error_for_a_marker_names_the_snapshot() -> None:
    r = ChandyLamportRecorder(["a"], [], name="q")
    with pytest.raises(
        UnknownChannelError, match="q: a marker for snapshot 4 arrived on channel 'z'"
    ):
        r.marker_received(4, "z")
