"""Tests of a subtask with two logical inputs (:mod:`cutline.protocol.inputs`), each of several
channels: its watermark, and its barriers.

* Unit tests pin exact actions: the least over the inputs, each the least over its channels;
  an idle input; every input idle; the ends; which input holds the subtask back; errors.
* Over one input, :class:`MultiInputValve` is :class:`WatermarkValve`: the same random event
  sequences to both give the same actions, event for event.
* Over two inputs, random event sequences (watermarks up and down, statuses, ends) keep the
  invariants of the module's text, each input's watermark being its own valve's.
* A model of a two-input subtask reads random interleavings of records, barriers, watermarks
  and idleness on the channels of both inputs (the well-formed upstreams of
  ``test_protocol_watermarks``), its barriers handled by one :class:`BarrierAligner` (aligned,
  unaligned with barriers that overtake queued items, aligned with alignment timeouts) or
  :class:`BarrierTracker` (at least once) over the channels of both: every checkpoint
  completes, only once both inputs' barriers came; its state holds exactly the items that came
  before the barrier on each channel of each input less those its recorded channel state holds
  (at least once: at least those), in order; no record of a channel that never went idle is
  late, and the end emits ``MAX_WATERMARK``; a restore from the recorded channel state keeps
  that.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_protocol_watermarks import Bar, Idle, Rec, Wm, _channel_stream

from cutline.protocol import (
    BarrierAligner,
    BarrierTracker,
    BlockChannel,
    DeclineCheckpoint,
    ForwardBarrier,
    MultiInputValve,
    RecordMessage,
    SnapshotComplete,
    SnapshotState,
    UnblockChannels,
    UnknownChannelError,
    UnknownInputError,
)
from cutline.protocol.watermarks import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    EmitStatus,
    EmitWatermark,
    WatermarkAction,
    WatermarkError,
    WatermarkValve,
)

LEFT, RIGHT = "left", "right"
Event = tuple[str, int, int]
"""(kind, channel index, watermark): kind is "wm", "idle", "active" or "end"."""

# ------------------------------------------------------------------------- unit tests


def two_by_two() -> MultiInputValve[str, str]:
    return MultiInputValve({"l0": LEFT, "l1": LEFT, "r0": RIGHT, "r1": RIGHT})


def test_the_watermark_is_the_least_over_the_inputs_each_the_least_over_its_channels() -> None:
    valve = two_by_two()
    assert valve.inputs == (LEFT, RIGHT) and valve.channels(RIGHT) == ("r0", "r1")
    assert valve.watermark_received("l0", 10) == []
    assert valve.watermark_received("l1", 30) == []
    assert valve.input_watermark(LEFT) == 10
    assert valve.watermark_received("r0", 40) == []
    assert valve.watermark_received("r1", 20) == [EmitWatermark(10)]  # right 20, left 10
    assert valve.holding_back() == (LEFT,)
    assert valve.watermark_received("l0", 50) == [EmitWatermark(20)]  # left 30, right 20
    assert valve.holding_back() == (RIGHT,)
    assert valve.input_watermark(LEFT) == 30 and valve.input_watermark(RIGHT) == 20
    assert valve.channel_watermark("l0") == 50


def test_an_idle_input_holds_nothing_back_and_one_back_holds_it_at_once() -> None:
    valve = two_by_two()
    for channel, w in (("l0", 10), ("l1", 10), ("r0", 5), ("r1", 5)):
        valve.watermark_received(channel, w)
    assert valve.status_received("r0", idle=True) == []  # r1 still holds the right at 5
    assert not valve.input_idle(RIGHT)
    assert valve.status_received("r1", idle=True) == [EmitWatermark(10)]  # the right is idle
    assert valve.input_idle(RIGHT) and not valve.idle
    assert valve.watermark_received("l0", 100) == []
    assert valve.watermark_received("l1", 100) == [EmitWatermark(100)]
    # the right comes back at 5: it holds the subtask (which never goes back) from now on
    assert valve.status_received("r0", idle=False) == []
    assert valve.holding_back() == (RIGHT,)
    assert valve.watermark_received("l0", 200) == []
    assert valve.watermark_received("l1", 200) == []
    assert valve.watermark_received("r0", 150) == [EmitWatermark(150)]


def test_every_input_idle_says_so_and_moves_to_the_least_of_theirs() -> None:
    valve = two_by_two()
    for channel, w in (("l0", 10), ("l1", 20), ("r0", 30), ("r1", 40)):
        valve.watermark_received(channel, w)
    assert valve.watermark == 10
    assert valve.status_received("r0", idle=True) == [] and valve.input_watermark(RIGHT) == 40
    # the right goes idle; the left alone holds the subtask, then moves on to its highest
    assert valve.status_received("r1", idle=True) == []
    assert valve.status_received("l0", idle=True) == [EmitWatermark(20)]
    assert valve.status_received("l1", idle=True) == [EmitStatus(idle=True)]
    assert valve.idle and valve.holding_back() == ()
    # an idle input's channel ends: its valve moves on, so does the idle subtask (to the least)
    assert valve.watermark_received("l0", 60) == []  # (an idle channel's, kept for later)
    assert valve.end_of_input("l1") == [EmitWatermark(40)]  # left 60, right 40
    # the left back (the right idle): it alone holds the subtask
    assert valve.status_received("l0", idle=False) == [EmitStatus(idle=False), EmitWatermark(60)]


def test_an_ended_input_holds_nothing_and_every_input_ended_is_the_end() -> None:
    valve = two_by_two()
    valve.watermark_received("r0", 7)
    valve.watermark_received("r1", 9)
    assert valve.end_of_input("l0") == []
    assert not valve.input_ended(LEFT)
    assert valve.end_of_input("l1") == [EmitWatermark(7)]
    assert valve.input_ended(LEFT) and valve.input_watermark(LEFT) == MAX_WATERMARK
    assert valve.status_received("r0", idle=True) == [EmitWatermark(9)]
    assert valve.status_received("r1", idle=True) == [EmitStatus(idle=True)]
    assert valve.end_of_input("r0") == []
    assert valve.end_of_input("r1") == [EmitStatus(idle=False), EmitWatermark(MAX_WATERMARK)]
    assert valve.watermark == MAX_WATERMARK and not valve.idle


def test_an_idle_valve_moving_on_as_a_channel_ends_moves_the_idle_subtask_too() -> None:
    """Why an idle subtask moves on to the least of its inputs (where Flink's stays): over one
    input it must be that input's valve, which moves on, idle, when a channel ends."""
    valve: WatermarkValve[str] = WatermarkValve(["a", "b"])
    multi: MultiInputValve[str, str] = MultiInputValve({"a": LEFT, "b": LEFT})
    for v in (valve, multi):
        assert v.status_received("a", idle=True) == []
        assert v.status_received("b", idle=True) == [EmitStatus(idle=True)]
        assert v.watermark_received("a", 100) == []  # (an idle channel's: kept for later)
        assert v.end_of_input("b") == [EmitWatermark(100)]
        assert v.idle


def test_misuse_is_refused_naming_the_channel_or_input() -> None:
    with pytest.raises(ValueError, match="at least one input channel"):
        MultiInputValve({})
    valve = two_by_two()
    with pytest.raises(UnknownChannelError, match="'z0'"):
        valve.watermark_received("z0", 1)
    with pytest.raises(UnknownInputError, match="'middle'"):
        valve.input_watermark("middle")
    valve.end_of_input("l0")
    with pytest.raises(WatermarkError, match="'l0'"):
        valve.status_received("l0", idle=True)
    assert valve.input_of("r1") == RIGHT


# ----------------------------------------------------- random event sequences


def events(channels: int, size: int = 60) -> st.SearchStrategy[list[Event]]:
    kinds = st.sampled_from(["wm", "wm", "wm", "idle", "active", "end"])
    return st.lists(
        st.tuples(kinds, st.integers(0, channels - 1), st.integers(-20, 300)),
        min_size=size // 3,
        max_size=size,
    )


def feed(valve: Any, kind: str, channel: str, value: int) -> list[WatermarkAction]:
    """One event to a ``WatermarkValve`` or a ``MultiInputValve`` (they take the same)."""
    match kind:
        case "wm":
            return valve.watermark_received(channel, value)
        case "idle" | "active":
            return valve.status_received(channel, kind == "idle")
        case _:
            return valve.end_of_input(channel)


@settings(max_examples=300, deadline=None)  # (make soak: 3,000, below)
@given(channels=st.integers(1, 4), data=st.data())
def test_over_one_input_it_is_the_watermark_valve(channels: int, data: st.DataObject) -> None:
    names = [f"c{i}" for i in range(channels)]
    valve: WatermarkValve[str] = WatermarkValve(names)
    multi: MultiInputValve[str, int] = MultiInputValve(dict.fromkeys(names, 0))
    for kind, index, value in data.draw(events(channels)):
        channel = names[index]
        try:
            expected = feed(valve, kind, channel, value)
        except WatermarkError:
            with pytest.raises(WatermarkError):
                feed(multi, kind, channel, value)
            continue
        assert feed(multi, kind, channel, value) == expected
        assert (multi.watermark, multi.idle) == (valve.watermark, valve.idle)
        assert multi.input_watermark(0) == valve.watermark and multi.input_idle(0) == valve.idle


class Checked:
    """A :class:`MultiInputValve` beside one :class:`WatermarkValve` per input fed the same
    events (each input's own rule), checking the invariants after every event."""

    def __init__(self, input_of: Mapping[str, str]) -> None:
        self.valve: MultiInputValve[str, str] = MultiInputValve(input_of)
        self.own = {
            side: WatermarkValve([c for c, s in input_of.items() if s == side])
            for side in self.valve.inputs
        }
        self.input_of = input_of
        self.ended: set[str] = set()
        self.emitted: list[int] = []
        self.statuses: list[bool] = []
        self.seen: Counter[str] = Counter()
        """What happened, to show that the random runs are not vacuous."""

    def feed(self, kind: str, channel: str, value: int = 0) -> None:
        own = self.own[self.input_of[channel]]
        if channel in self.ended:
            with pytest.raises(WatermarkError):
                feed(self.valve, kind, channel, value)
            return
        was_idle = own.idle
        feed(own, kind, channel, value)
        actions = feed(self.valve, kind, channel, value)
        if was_idle and not own.idle and own.watermark < self.valve.watermark:
            self.seen["an input back from idleness behind"] += 1
        if kind == "end":
            self.ended.add(channel)
        self.check(actions)

    def check(self, actions: list[WatermarkAction]) -> None:
        valve = self.valve
        for action in actions:
            match action:
                case EmitWatermark(watermark=w):
                    assert not self.emitted or w > self.emitted[-1], "only increases"
                    self.emitted.append(w)
                    if any(self.valve.input_idle(s) for s in self.valve.inputs):
                        self.seen["a watermark past an idle input"] += 1
                case EmitStatus(idle=idle):
                    assert idle != (self.statuses[-1] if self.statuses else False), "alternate"
                    self.statuses.append(idle)
                    self.seen["every input idle"] += idle
        assert valve.watermark == (self.emitted or [MIN_WATERMARK])[-1]
        assert valve.idle == (self.statuses[-1] if self.statuses else False)
        live = [s for s in valve.inputs if not valve.input_ended(s)]
        active = [s for s in live if not valve.input_idle(s)]
        for side in valve.inputs:  # each input's watermark is its own valve's
            own = self.own[side]
            assert (valve.input_watermark(side), valve.input_idle(side)) == (
                own.watermark,
                own.idle,
            )
            assert valve.input_ended(side) == all(c in self.ended for c in valve.channels(side))
        assert valve.idle == bool(live and not active)
        if not live:
            assert self.emitted[-1] == MAX_WATERMARK
        elif active:  # an idle input holds nothing back
            assert valve.watermark >= min(valve.input_watermark(s) for s in active)
        if any(isinstance(a, EmitWatermark) for a in actions):  # never above an active one
            for side in active:
                assert valve.watermark <= valve.input_watermark(side)
                for state in self.own[side]._channels.values():
                    if not state.ended and not state.idle and state.caught_up:
                        assert valve.watermark <= state.watermark


@settings(max_examples=300, deadline=None)  # (make soak: 3,000, below)
@given(left=st.integers(1, 3), right=st.integers(1, 3), data=st.data())
def test_two_inputs_keep_the_invariants_over_random_events(
    left: int, right: int, data: st.DataObject
) -> None:
    names = [f"l{i}" for i in range(left)] + [f"r{i}" for i in range(right)]
    checked = Checked({c: LEFT if c[0] == "l" else RIGHT for c in names})
    for kind, index, value in data.draw(events(len(names), size=80)):
        checked.feed(kind, names[index], value)
    for channel in names:
        if channel not in checked.ended:
            checked.feed("end", channel)
    assert checked.emitted[-1] == MAX_WATERMARK


# ------------------------------------- a two-input subtask: records, barriers, watermarks

MODES = ("aligned", "unaligned", "aligned_timeout", "at_least_once")


class TwoInputSubtask:
    """A model of a two-input subtask's loop: one barrier handler over the channels of both
    inputs and a :class:`Checked` valve, reading in a random order the channels the handler
    does not block. Its state is the items it consumed, per channel, by their place in the
    channel (``items[c][i]``); it keeps what it snapshots and records per checkpoint."""

    def __init__(self, items: dict[str, list[object]], input_of: dict[str, str], mode: str) -> None:
        self.items, self.mode = items, mode
        self.queues = {c: list(enumerate(stream)) for c, stream in items.items()}
        channels = list(items)
        self.handler: BarrierAligner[str] | BarrierTracker[str] = (
            BarrierTracker(channels, name="join")
            if mode == "at_least_once"
            else BarrierAligner(channels, unaligned=mode == "unaligned", name="join")
        )
        self.checked = Checked(input_of)
        self.consumed: dict[str, list[int]] = {c: [] for c in channels}
        self.at_snapshot: dict[int, dict[str, list[int]]] = {}
        self.recorded: dict[int, dict[str, list[int]]] = {}
        self.barriers: dict[str, set[int]] = {c: set() for c in channels}
        self.ended: set[str] = set()
        self.completed: list[int] = []
        self.declined: list[int] = []
        self.never_idle = {c for c, s in items.items() if not any(isinstance(i, Idle) for i in s)}
        self.late: list[tuple[str, int, int]] = []

    def run(self, rng: random.Random, checkpoints: int) -> None:
        while len(self.ended) < len(self.queues):
            if self.mode == "aligned_timeout" and rng.random() < 0.08:
                assert isinstance(self.handler, BarrierAligner)
                pending = self.handler.pending_checkpoint
                n = self.handler.last_settled + 1 if pending is None else pending
                if 1 <= n <= checkpoints:  # (the pending one, or the next before its barriers)
                    actions = self.handler.alignment_timed_out(n)
                    self.checked.seen["alignment timeouts that snapshot"] += bool(actions)
                    self.checked.seen["checkpoints a timeout began"] += pending is None
                    self.apply(actions)
                continue
            ready = [c for c in self.queues if c not in self.ended]
            ready = [c for c in ready if not self.handler.is_blocked(c)]
            assert ready, "barriers never block every channel for good"
            self.step(rng.choice(ready), rng)

    def step(self, channel: str, rng: random.Random) -> None:
        queue = self.queues[channel]
        if not queue:
            self.ended.add(channel)
            self.apply(self.handler.end_of_input(channel))
            self.checked.feed("end", channel)
            return
        first = next((i for i, (_, item) in enumerate(queue) if isinstance(item, Bar)), None)
        if self.mode in ("unaligned", "aligned_timeout") and first and rng.random() < 0.3:
            # an unaligned barrier jumps over the items queued before it in the input buffer
            _, barrier = queue.pop(first)
            assert isinstance(barrier, Bar)
            overtaken = [place for place, _ in queue[:first]]
            self.checked.seen["barriers that overtook items"] += 1
            self.barrier(channel, barrier.checkpoint, overtaken)
            return
        place, item = queue.pop(0)
        match item:
            case Bar(checkpoint=n):
                self.barrier(channel, n, [])
                return
            case Rec(ts=ts):
                if ts <= self.checked.valve.watermark and channel in self.never_idle:
                    self.late.append((channel, ts, self.checked.valve.watermark))
            case Wm(watermark=w):
                self.checked.feed("wm", channel, w)
            case Idle(idle=idle):
                self.checked.feed("idle" if idle else "active", channel)
        self.consumed[channel].append(place)
        self.apply(self.handler.message_received(channel, place))

    def barrier(self, channel: str, n: int, overtaken: list[int]) -> None:
        self.barriers[channel].add(n)
        unaligned = bool(overtaken) or self.mode == "unaligned"
        if self.mode == "at_least_once":
            unaligned = False
        self.apply(
            self.handler.barrier_received(n, channel, unaligned=unaligned, overtaken=overtaken)
        )

    def apply(self, actions: Any) -> None:
        for action in actions:
            match action:
                case SnapshotState(checkpoint_id=n):
                    self.at_snapshot[n] = {c: list(done) for c, done in self.consumed.items()}
                case RecordMessage(snapshot_id=n, channel=c, message=place):
                    self.recorded.setdefault(n, {}).setdefault(c, []).append(place)
                    self.checked.seen["recorded items"] += 1
                case SnapshotComplete(snapshot_id=n):
                    missing = [c for c in self.queues if c not in self.ended | self.at(n)]
                    assert not missing, f"{n} complete before the barriers of {missing}"
                    self.completed.append(n)
                    if any(c in self.ended and c not in self.at(n) for c in self.queues):
                        self.checked.seen["checkpoints completed over an ended channel"] += 1
                case DeclineCheckpoint(checkpoint_id=n):
                    self.declined.append(n)
                case BlockChannel() | UnblockChannels() | ForwardBarrier():
                    pass

    def at(self, n: int) -> set[str]:
        return {c for c, came in self.barriers.items() if n in came}

    def before(self, channel: str, n: int) -> list[int]:
        """The places of the items before ``Barrier(n)`` on ``channel`` (all, if it ended
        before carrying it)."""
        stream = self.items[channel]
        end = stream.index(Bar(n)) if Bar(n) in stream else len(stream)
        return [i for i in range(end) if not isinstance(stream[i], Bar)]


def two_input_streams(
    rng: random.Random, checkpoints: int
) -> tuple[dict[str, list[object]], dict[str, str]]:
    """Two inputs of one to three channels each; a channel may end early, after a barrier."""
    items: dict[str, list[object]] = {}
    input_of: dict[str, str] = {}
    for side in (LEFT, RIGHT):
        for i in range(rng.randint(1, 3)):
            stream = _channel_stream(rng, checkpoints, idleness=rng.random() < 0.5)
            if checkpoints and rng.random() < 0.2:
                stream = stream[: stream.index(Bar(rng.randint(1, checkpoints))) + 1]
            items[f"{side[0]}{i}"] = stream
            input_of[f"{side[0]}{i}"] = side
    return items, input_of


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=600, deadline=None)  # (2,400 schedules over the modes)
@given(seed=st.integers(0, 2**32 - 1), checkpoints=st.integers(0, 4))
def test_a_two_input_subtask_over_random_interleavings(
    mode: str, seed: int, checkpoints: int
) -> None:
    check_two_input_subtask(mode, seed, checkpoints)


def test_the_random_runs_exercise_every_behaviour() -> None:
    """The property test is not vacuous: over fixed seeds, what it is meant to check
    happens."""
    seen: dict[str, Counter[str]] = {mode: Counter() for mode in MODES}
    for mode in MODES:
        for seed in range(60):
            seen[mode].update(check_two_input_subtask(mode, seed, checkpoints=3))
    common = [
        "every input idle",
        "a watermark past an idle input",
        "an input back from idleness behind",
        "checkpoints completed over an ended channel",
    ]
    unaligned = ["barriers that overtook items", "recorded items"]
    timeouts = ["alignment timeouts that snapshot", "checkpoints a timeout began"]
    expected = {
        "aligned": common,
        "unaligned": common + unaligned,
        "aligned_timeout": common + unaligned + timeouts,
        "at_least_once": common,
    }
    missing = {mode: [k for k in expected[mode] if not seen[mode][k]] for mode in MODES}
    assert missing == {mode: [] for mode in MODES}


def check_two_input_subtask(mode: str, seed: int, checkpoints: int) -> Counter[str]:
    """One random run of a two-input subtask, checked; what happened in it."""
    rng = random.Random(seed)
    items, input_of = two_input_streams(rng, checkpoints)
    subtask = TwoInputSubtask(items, input_of, mode)
    subtask.run(rng, checkpoints)

    # each checkpoint whose barrier came completes, once (after a timeout, one that no barrier
    # came for: every channel ended before it)
    carried = [n for n in range(1, checkpoints + 1) if any(Bar(n) in s for s in items.values())]
    if mode == "aligned_timeout":
        assert set(carried) <= set(subtask.completed) <= set(range(1, checkpoints + 1))
        assert subtask.completed == sorted(set(subtask.completed))
    else:
        assert subtask.completed == carried
    assert subtask.declined == []
    for n in subtask.completed:
        for side in (LEFT, RIGHT):
            channels = subtask.checked.valve.channels(side)
            state = {c: subtask.at_snapshot[n][c] for c in channels}
            recorded = {c: subtask.recorded.get(n, {}).get(c, []) for c in channels}
            before = {c: subtask.before(c, n) for c in channels}
            if mode == "at_least_once":  # nothing lost; what came after may be in the state
                assert {c: state[c][: len(before[c])] for c in channels} == before
                assert not any(recorded.values())
                continue
            # the state holds what came before the barrier, less the channel state recorded
            assert {c: state[c] + recorded[c] for c in channels} == before, (n, side)
            if mode == "aligned":
                assert not any(recorded.values()), "aligned: no channel state"
    assert subtask.late == [], "a record of a channel that never went idle is never late"
    assert subtask.checked.emitted[-1] == MAX_WATERMARK

    if mode == "at_least_once" or not subtask.completed:
        return subtask.checked.seen
    # a restore from the last checkpoint: each channel's recorded items, then those after its
    # barrier, into a fresh subtask (no more checkpoints)
    n = subtask.completed[-1]
    rest: dict[str, list[object]] = {}
    for channel, stream in items.items():
        after = stream.index(Bar(n)) + 1 if Bar(n) in stream else len(stream)
        replayed = [stream[i] for i in subtask.recorded.get(n, {}).get(channel, [])]
        rest[channel] = replayed + [i for i in stream[after:] if not isinstance(i, Bar)]
    restored = TwoInputSubtask(rest, input_of, "aligned")
    restored.run(rng, 0)
    assert restored.late == []
    assert restored.checked.emitted[-1] == MAX_WATERMARK
    return subtask.checked.seen


@pytest.mark.slow
def test_over_one_input_it_is_the_watermark_valve_soak() -> None:
    """``make soak``: the identity with ``WatermarkValve`` over 3,000 examples."""
    inner = test_over_one_input_it_is_the_watermark_valve.hypothesis.inner_test  # type: ignore[attr-defined]
    settings(max_examples=3000, deadline=None, database=None)(
        given(channels=st.integers(1, 4), data=st.data())(inner)
    )()


@pytest.mark.slow
def test_two_inputs_keep_the_invariants_over_random_events_soak() -> None:
    """``make soak``: the invariants over 3,000 examples."""
    inner = test_two_inputs_keep_the_invariants_over_random_events.hypothesis.inner_test  # type: ignore[attr-defined]
    settings(max_examples=3000, deadline=None, database=None)(
        given(left=st.integers(1, 3), right=st.integers(1, 3), data=st.data())(inner)
    )()
