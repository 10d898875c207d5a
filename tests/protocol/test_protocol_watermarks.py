"""Tests of the watermark rules (:mod:`cutline.protocol.watermarks`).

* Unit tests pin exact actions: bounded out-of-orderness, the minimum over splits and
  channels, a pending split held at its lowest timestamp, idleness and rejoining, the end.
* Property tests over random interleavings:
  - a source subtask's splits with random timestamps within the bound, read in random order,
    going idle at random: the watermark only increases, and a record of a split that never
    went idle is never late;
  - a subtask's input channels (each a well-formed upstream: its records are above every
    watermark it sent before them) read in random order, with barriers aligned by a
    :class:`~cutline.protocol.BarrierAligner` (a blocked channel is not read) or recorded
    unaligned: the watermark only increases, never passes an active channel's, no record is
    late, the end emits :data:`MAX_WATERMARK`; and replaying an unaligned checkpoint's recorded
    channel state (records and watermarks, in order) into a fresh valve, then the rest of each
    channel, keeps all of that.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline.protocol import BarrierAligner, ForwardBarrier, RecordMessage, SnapshotState
from cutline.protocol.errors import UnknownChannelError
from cutline.protocol.watermarks import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    EmitStatus,
    EmitWatermark,
    SplitWatermarks,
    WatermarkAction,
    WatermarkError,
    WatermarkValve,
    lowest_after,
)

# ------------------------------------------------------------------------- unit tests


def test_a_split_promises_its_highest_timestamp_less_the_bound_less_one() -> None:
    splits: SplitWatermarks[str] = SplitWatermarks(bound=2000)
    splits.split_added("a.parquet")
    assert splits.records("a.parquet", 10_000, now_s=0.0) == [EmitWatermark(7_999)]
    assert splits.records("a.parquet", 9_000, now_s=0.1) == []  # out of order: nothing new
    assert splits.records("a.parquet", 12_000, now_s=0.2) == [EmitWatermark(9_999)]


def test_the_subtask_watermark_is_the_minimum_over_its_splits_and_a_finished_one_holds_nothing() -> (
    None
):
    splits: SplitWatermarks[str] = SplitWatermarks(bound=0)
    splits.split_added("a")
    splits.split_added("b")
    assert splits.records("a", 100, now_s=0) == []  # b holds it at MIN
    assert splits.records("b", 50, now_s=0) == [EmitWatermark(49)]
    assert splits.records("b", 500, now_s=0) == [EmitWatermark(99)]
    assert splits.split_finished("a") == [EmitWatermark(499)]
    assert splits.split_finished("b") == [EmitWatermark(MAX_WATERMARK)]


def test_a_split_not_started_holds_the_watermark_at_its_lowest_timestamp() -> None:
    splits: SplitWatermarks[str] = SplitWatermarks(bound=1000)
    splits.split_added("0.parquet")
    splits.split_added("1.parquet", lowest=60_000)
    assert splits.records("0.parquet", 80_000, now_s=0) == [EmitWatermark(59_999)]
    assert splits.split_finished("0.parquet") == []
    assert splits.records("1.parquet", 61_000, now_s=0) == []  # 59,999 still: it only increases
    assert splits.records("1.parquet", 70_000, now_s=0) == [EmitWatermark(68_999)]


@settings(max_examples=500, deadline=None)
@given(
    bound=st.integers(0, 5_000),
    steps=st.lists(st.integers(-5_000, 8_000), min_size=1, max_size=60),
    start=st.integers(-(10**12), 10**12),
    head=st.integers(1, 60),
)
def test_a_split_s_first_records_bound_all_of_its_records(
    bound: int, steps: list[int], start: int, head: int
) -> None:
    """A split whose records come at most ``bound`` out of order (each at or above the highest
    before it minus the bound) holds no record below ``lowest_after`` of its first ones: a
    CSV file not started yet may hold the watermark there, and none of its records is late
    for it."""
    times, highest = [], None
    for step in steps:
        floor = start if highest is None else highest - bound
        value = max(floor, (highest if highest is not None else start) + step)
        times.append(value)
        highest = value if highest is None else max(highest, value)
    first = times[: min(head, len(times))]
    lowest = lowest_after(min(first), max(first), bound)
    assert all(t >= lowest for t in times)
    assert lowest == min(first) or lowest == max(first) - bound


def test_an_idle_split_stops_holding_the_watermark_back_and_all_idle_says_so() -> None:
    splits: SplitWatermarks[int] = SplitWatermarks(bound=0, idle_timeout=5.0)
    splits.split_added(0)
    splits.split_added(1)
    assert splits.records(1, 10, now_s=0.0) == []  # split 0 holds it at MIN
    assert splits.records(0, 1000, now_s=3.0) == [EmitWatermark(9)]
    assert splits.tick(4.9) == []
    assert splits.tick(5.0) == [EmitWatermark(999)]  # split 1 went idle: 0 alone holds it
    assert splits.tick(8.0) == [EmitStatus(idle=True)]
    assert splits.idle
    # records again: active first, then the watermark if it moved
    assert splits.records(1, 2000, now_s=9.0) == [EmitStatus(idle=False), EmitWatermark(1999)]


def test_a_partition_that_never_shows_a_record_goes_idle_once_read_to_its_end() -> None:
    """A split that never showed a record holds the watermark (a file waiting its turn) until
    its reader says it read all there is (an empty Kafka partition): its idle time counts from
    then, so it does not hold the watermark back for ever."""
    splits: SplitWatermarks[str] = SplitWatermarks(bound=0, idle_timeout=5.0, bounded=False)
    splits.split_added("t/0")
    splits.split_added("t/1")  # empty, and stays so
    splits.split_added("file", lowest=100)  # (never said caught up: it holds until it starts)
    assert splits.records("t/0", 500, now_s=1.0) == []
    assert splits.tick(50.0) == []  # t/0 idle since 6.0, but t/1 holds it at MIN
    assert splits.caught_up("t/1", now_s=50.0) == []
    assert splits.caught_up("t/1", now_s=53.0) == []  # (from the first time it was said)
    assert splits.tick(54.9) == []
    assert splits.tick(55.0) == [EmitWatermark(99)]  # t/1 idle: the file holds it
    assert splits.records("file", 800, now_s=56.0) == [EmitWatermark(799)]
    assert splits.caught_up("t/0", now_s=57.0) == []  # (it showed records: counts from those)
    assert splits.tick(60.0) == []
    assert splits.tick(61.0) == [EmitStatus(idle=True)]  # the file, too


def test_an_unbounded_subtask_without_splits_is_idle_not_at_its_end() -> None:
    """Splits found while the job runs (a watched directory): with none to read the subtask
    holds nothing back (idle), never MAX_WATERMARK; a split found later brings it back."""
    splits: SplitWatermarks[str] = SplitWatermarks(bound=100, bounded=False)
    assert splits.quiet() == [EmitStatus(idle=True)]  # an empty directory
    assert splits.quiet() == []
    splits.split_added("a", lowest=5000)
    assert splits.records("a", 6000, now_s=0.0) == [EmitStatus(idle=False), EmitWatermark(5899)]
    assert splits.split_finished("a") == [EmitStatus(idle=True)]
    assert splits.watermark == 5899 and splits.idle
    splits.split_added("b")  # a new file: idle until it shows records
    assert splits.records("b", 7000, now_s=1.0) == [EmitStatus(idle=False), EmitWatermark(6899)]
    with pytest.raises(WatermarkError, match="not quiet"):
        splits.quiet()
    # and a bounded one ends
    bounded: SplitWatermarks[str] = SplitWatermarks(bound=0)
    bounded.split_added("a")
    assert bounded.split_finished("a") == [EmitWatermark(MAX_WATERMARK)]


def test_a_source_with_no_idle_timeout_never_goes_idle() -> None:
    splits: SplitWatermarks[int] = SplitWatermarks(bound=0)
    splits.split_added(0)
    splits.records(0, 10, now_s=0)
    assert splits.tick(1e9) == []


def test_split_misuse_is_refused() -> None:
    splits: SplitWatermarks[str] = SplitWatermarks(bound=0)
    with pytest.raises(WatermarkError, match="never added"):
        splits.records("x", 1, now_s=0)
    splits.split_added("x")
    with pytest.raises(WatermarkError, match="twice"):
        splits.split_added("x")
    splits.split_finished("x")
    with pytest.raises(WatermarkError, match="after it finished"):
        splits.records("x", 1, now_s=0)
    with pytest.raises(ValueError, match="negative"):
        SplitWatermarks(bound=-1)


def test_the_valve_emits_the_minimum_over_its_channels() -> None:
    valve: WatermarkValve[str] = WatermarkValve(["a", "b"])
    assert valve.watermark_received("a", 10) == []
    assert valve.watermark_received("b", 5) == [EmitWatermark(5)]
    assert valve.watermark_received("b", 20) == [EmitWatermark(10)]
    assert valve.watermark_received("a", 8) == []  # lower than a's own: ignored
    assert valve.end_of_input("a") == [EmitWatermark(20)]
    assert valve.end_of_input("b") == [EmitWatermark(MAX_WATERMARK)]


def test_an_idle_channel_does_not_hold_the_valve_and_rejoins_once_caught_up() -> None:
    valve: WatermarkValve[str] = WatermarkValve(["a", "b"])
    valve.watermark_received("a", 100)
    assert valve.status_received("b", idle=True) == [EmitWatermark(100)]
    assert valve.status_received("b", idle=False) == []  # behind (MIN): does not hold back
    assert valve.watermark_received("a", 200) == [EmitWatermark(200)]
    assert valve.watermark_received("b", 150) == []  # still behind 200
    assert valve.watermark_received("b", 250) == []  # caught up: holds from now on
    assert valve.watermark_received("a", 400) == [EmitWatermark(250)]


def test_every_channel_idle_moves_on_to_the_highest_and_says_idle() -> None:
    valve: WatermarkValve[str] = WatermarkValve(["a", "b"])
    valve.watermark_received("a", 10)
    valve.watermark_received("b", 30)
    assert valve.status_received("a", idle=True) == [EmitWatermark(30)]
    assert valve.status_received("b", idle=True) == [EmitStatus(idle=True)]
    assert valve.status_received("a", idle=False) == [EmitStatus(idle=False)]
    assert valve.end_of_input("a") == [EmitStatus(idle=True)]  # b, the only one left, is idle
    assert valve.idle


def test_the_valve_refuses_unknown_and_ended_channels() -> None:
    valve: WatermarkValve[str] = WatermarkValve(["a"])
    with pytest.raises(UnknownChannelError):
        valve.watermark_received("z", 1)
    valve.end_of_input("a")
    with pytest.raises(WatermarkError, match="after its end"):
        valve.watermark_received("a", 1)


# ------------------------------------------------------------- property: the splits


def _emitted(actions: list[WatermarkAction]) -> list[int]:
    return [a.watermark for a in actions if isinstance(a, EmitWatermark)]


@settings(max_examples=400, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), bound=st.integers(0, 50), idle=st.booleans())
def test_split_watermarks_only_increase_and_never_make_a_steady_splits_record_late(
    seed: int, bound: int, idle: bool
) -> None:
    rng = random.Random(seed)
    count = rng.randint(1, 4)
    timeout = 3.0 if idle else None
    splits: SplitWatermarks[int] = SplitWatermarks(bound, timeout)
    # each split: timestamps that come at most `bound` out of order
    streams = {}
    for s in range(count):
        base, stream = rng.randint(0, 500), []
        for _ in range(rng.randint(0, 30)):
            base += rng.randint(0, 20)
            stream.append(max(0, base - rng.randint(0, bound)))
        streams[s] = stream
    lowest = {s: (min(v) if v and rng.random() < 0.5 else None) for s, v in streams.items()}
    for s in range(count):
        splits.split_added(s, lowest[s])
    emitted: list[int] = []
    went_idle: set[int] = set()
    now = 0.0
    position = dict.fromkeys(streams, 0)
    while any(position[s] < len(streams[s]) for s in streams) or splits.splits:
        now += rng.choice([0.0, 0.5, 1.0, 4.0]) if idle else 0.1
        before = {s for s in splits.splits}
        actions = splits.tick(now)
        if idle:
            went_idle |= {s for s in before if splits._splits[s].idle}
        emitted += _emitted(actions)
        live = [s for s in splits.splits if position[s] < len(streams[s])]
        done = [s for s in splits.splits if position[s] >= len(streams[s])]
        if done and rng.random() < 0.3:  # its reader read all there is (for now)
            assert splits.caught_up(rng.choice(done), now) == []
        if done and (not live or rng.random() < 0.3):
            emitted += _emitted(splits.split_finished(rng.choice(done)))
            continue
        if not live:
            continue
        s = rng.choice(live)
        take = streams[s][position[s] : position[s] + rng.randint(1, 5)]
        position[s] += len(take)
        # a record is late if it is at or below the watermark emitted before it was read
        current = emitted[-1] if emitted else MIN_WATERMARK
        if s not in went_idle:
            assert all(t > current for t in take), (s, take, current)
        emitted += _emitted(splits.records(s, max(take), now))
    assert emitted == sorted(set(emitted)), "watermarks only increase"
    assert emitted and emitted[-1] == MAX_WATERMARK


# ------------------------------------------------- property: the valve, with barriers


@dataclass(frozen=True)
class Rec:
    ts: int


@dataclass(frozen=True)
class Wm:
    watermark: int


@dataclass(frozen=True)
class Bar:
    checkpoint: int


@dataclass(frozen=True)
class Idle:
    idle: bool


def _channel_stream(rng: random.Random, checkpoints: int, idleness: bool) -> list[object]:
    """A well-formed upstream: records above every watermark sent before them; barriers
    1..checkpoints in order; idle spells (no record inside one)."""
    out: list[object] = []
    watermark, high, idle = MIN_WATERMARK, rng.randint(0, 100), False
    barrier = 1
    for _ in range(rng.randint(0, 40)):
        roll = rng.random()
        if roll < 0.5 and not idle:
            high += rng.randint(0, 10)
            out.append(Rec(max(high - rng.randint(0, 5), watermark + 1)))
        elif roll < 0.75 and not idle:
            new = high - rng.randint(0, 8)
            if new > watermark:
                watermark = new
                out.append(Wm(new))
        elif roll < 0.85 and barrier <= checkpoints:
            out.append(Bar(barrier))
            barrier += 1
        elif idleness:
            idle = not idle
            out.append(Idle(idle))
    if idle:
        out.append(Idle(False))
    out += [Bar(b) for b in range(barrier, checkpoints + 1)]
    return out


class _Subtask:
    """A model of a subtask's loop: a barrier aligner and a valve, reading the channels the
    aligner does not block, in a random order; keeps what it checks."""

    def __init__(self, channels: list[str], unaligned: bool) -> None:
        self.aligner: BarrierAligner[str] = BarrierAligner(channels, unaligned=unaligned)
        self.valve: WatermarkValve[str] = WatermarkValve(channels)
        self.emitted: list[int] = []
        self.late: list[tuple[str, int, int]] = []
        self.idle_seen: set[str] = set()
        self.recorded: dict[int, dict[str, list[object]]] = {}
        self.snapshots: list[int] = []

    def deliver(self, channel: str, item: object) -> None:
        match item:
            case Rec(ts=ts):
                self._record(channel, item)
                if ts <= self.valve.watermark and channel not in self.idle_seen:
                    self.late.append((channel, ts, self.valve.watermark))
            case Wm(watermark=w):
                self._record(channel, item)
                self._check(self.valve.watermark_received(channel, w))
            case Idle(idle=idle):
                self._record(channel, item)
                if idle:
                    self.idle_seen.add(channel)
                self._check(self.valve.status_received(channel, idle))
            case Bar(checkpoint=n):
                for action in self.aligner.barrier_received(n, channel):
                    if isinstance(action, SnapshotState):
                        self.snapshots.append(action.checkpoint_id)
                    assert not isinstance(action, ForwardBarrier) or action.checkpoint_id == n

    def end(self, channel: str) -> None:
        self.aligner.end_of_input(channel)
        self._check(self.valve.end_of_input(channel))

    def _record(self, channel: str, item: object) -> None:
        for action in self.aligner.message_received(channel, item):
            assert isinstance(action, RecordMessage)
            self.recorded.setdefault(action.snapshot_id, {}).setdefault(action.channel, []).append(
                action.message
            )

    def _check(self, actions: list[WatermarkAction]) -> None:
        for action in actions:
            if isinstance(action, EmitWatermark):
                assert not self.emitted or action.watermark > self.emitted[-1]
                self.emitted.append(action.watermark)
        # never past a channel that is active, caught up and not ended
        for state in self.valve._channels.values():
            if not state.ended and not state.idle and state.caught_up:
                assert self.valve.watermark <= state.watermark


def _run(subtask: _Subtask, queues: dict[str, list[object]], rng: random.Random) -> None:
    position = dict.fromkeys(queues, 0)
    ended: set[str] = set()
    while len(ended) < len(queues):
        blocked = set(subtask.aligner.blocked_channels)
        ready = [c for c in queues if c not in ended and c not in blocked]
        assert ready, "aligned barriers never block every channel for good"
        channel = rng.choice(ready)
        if position[channel] == len(queues[channel]):
            subtask.end(channel)
            ended.add(channel)
            continue
        subtask.deliver(channel, queues[channel][position[channel]])
        position[channel] += 1


@settings(max_examples=400, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    channels=st.integers(1, 4),
    unaligned=st.booleans(),
    idleness=st.booleans(),
)
def test_the_valve_with_barrier_alignment_over_random_interleavings(
    seed: int, channels: int, unaligned: bool, idleness: bool
) -> None:
    rng = random.Random(seed)
    names = [f"c{i}" for i in range(channels)]
    checkpoints = rng.randint(0, 3)
    queues = {c: _channel_stream(rng, checkpoints, idleness) for c in names}
    subtask = _Subtask(names, unaligned)
    _run(subtask, queues, rng)
    assert subtask.late == [], "a record of a channel that never went idle is never late"
    assert subtask.emitted[-1] == MAX_WATERMARK
    assert subtask.snapshots == list(range(1, checkpoints + 1))

    if not unaligned or not checkpoints:
        return
    # a restore from the last unaligned checkpoint: each channel's recorded records and
    # watermarks first, in order, then what came after its barrier
    n = checkpoints
    restored = _Subtask(names, unaligned=False)
    for channel in names:
        for item in subtask.recorded.get(n, {}).get(channel, []):
            restored.deliver(channel, item)
    rest = {}
    for channel in names:
        stream = queues[channel]
        after = stream.index(Bar(n)) + 1
        rest[channel] = [i for i in stream[after:] if not isinstance(i, Bar)]
    _run(restored, rest, rng)
    assert restored.late == []
    assert restored.emitted[-1] == MAX_WATERMARK


def test_a_channel_blocked_for_alignment_holds_its_watermark_back() -> None:
    aligner: BarrierAligner[str] = BarrierAligner(["a", "b"])
    valve: WatermarkValve[str] = WatermarkValve(["a", "b"])
    valve.watermark_received("a", 10)
    valve.watermark_received("b", 10)
    aligner.barrier_received(1, "a")
    assert aligner.blocked_channels == ("a",)
    # a's next watermark (100) waits behind the barrier; b's cannot lift the valve past a's 10
    assert valve.watermark_received("b", 50) == []
    assert valve.watermark == 10
    aligner.barrier_received(1, "b")
    assert not aligner.blocked_channels
    assert valve.watermark_received("a", 100) == [EmitWatermark(50)]
