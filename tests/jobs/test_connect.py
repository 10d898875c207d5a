"""Two inputs in one operator: ``connect`` of two keyed streams (a KeyedCoProcessFunction with
state and timers shared by both sides) and of a stream with a broadcast one (broadcast
state), exact through a failure and a restore at another parallelism."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cutline import (
    BroadcastProcessFunction,
    EventTime,
    FixedDelay,
    KeyedCoProcessFunction,
    StreamEnvironment,
    testing,
)
from cutline.runtime.task.local import ThreadLauncher

ADS = 7


def write(path: Path, rows: list[dict[str, Any]], parts: int = 2) -> Path:
    path.mkdir(parents=True)
    table = pa.Table.from_pylist(rows)
    for i in range(parts):
        pq.write_table(
            table.slice(i * len(rows) // parts, len(rows) // parts), path / f"{i}.parquet"
        )
    return path


class Attribution(KeyedCoProcessFunction):
    """Each click with the last view of its ad before it (views and clicks by time): a view
    is kept in value state; a click is attributed at once when a view came first, else
    counted unattributed. Also: an event-time timer per ad at its first click's time + 100,
    which emits how many clicks the ad had by then."""

    def open(self, ctx: Any) -> None:
        self.view = ctx.value_state("view")
        self.clicks = ctx.value_state("clicks")

    def process_left(self, record: Any, ctx: Any) -> Any:  # a click
        count = self.clicks.get(0) + 1
        self.clicks.update(count)
        if count == 1:
            ctx.timer_service.register_event_time_timer(record["ts"] + 100)
        view = self.view.get()
        yield {"kind": "click", "ad": ctx.key, "click": record["id"], "view": view}

    def process_right(self, record: Any, ctx: Any) -> Any:  # a view
        self.view.update(record["id"])
        return None

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        yield {"kind": "timer", "ad": ctx.key, "click": self.clicks.get(0), "view": timestamp}


def test_two_keyed_streams_share_the_state_and_timers_of_a_key(tmp_path: Path) -> None:
    # every view comes long before every click (the views' file is read first: one split of
    # the views, ts 0..6, the clicks from ts 1000 on); both sides' keys meet in one key space
    views = write(tmp_path / "views", [{"ad": a, "id": f"v{a}", "ts": a} for a in range(ADS)], 1)
    clicks = write(
        tmp_path / "clicks",
        [{"ad": i % ADS, "id": i, "ts": 1000 + i} for i in range(70)],
    )
    env = StreamEnvironment(2, checkpoint_interval=None)
    left = env.read_parquet(clicks, event_time=EventTime("ts", max_out_of_orderness=0))
    right = env.read_parquet(views, event_time=EventTime("ts", max_out_of_orderness=0))
    left.key_by("ad").connect(right.key_by("ad")).process(Attribution(), name="attr").collect()
    result = testing.execute(env, launcher=ThreadLauncher())
    rows = result.collected["collect"]
    clicks_out = [r for r in rows if r["kind"] == "click"]
    timers = [r for r in rows if r["kind"] == "timer"]
    assert sorted(r["click"] for r in clicks_out) == list(range(70))
    # (a click may come before its ad's view: the inputs interleave; when the view came
    # first, it is the ad's own)
    assert all(r["view"] in (None, f"v{r['ad']}") for r in clicks_out)
    # the timers fire at the end of input (every ad's first click + 100 < the last watermark)
    assert sorted((r["ad"], r["click"]) for r in timers) == [(a, 10) for a in range(ADS)]


class Rules(BroadcastProcessFunction):
    """Payments scored by the rule of their kind: the rules are broadcast state."""

    def process(self, record: Any, ctx: Any) -> Any:
        rule = ctx.broadcast_state.get(record["kind"])
        yield {"id": record["id"], "rule": rule, "subtask": ctx.subtask}

    def process_broadcast(self, value: Any, ctx: Any) -> Any:
        ctx.broadcast_state[value["kind"]] = value["limit"]
        return None


class Scores(BroadcastProcessFunction):
    """Writes the broadcast state where it is read only: a TypeError, which fails the job."""

    def process(self, record: Any, ctx: Any) -> Any:
        ctx.broadcast_state["x"] = 1
        return None

    def process_broadcast(self, value: Any, ctx: Any) -> Any:
        return None


def test_every_subtask_sees_every_broadcast_record(tmp_path: Path) -> None:
    env = StreamEnvironment(3, checkpoint_interval=None)
    rules = env.from_sequence(0, 4).map(lambda r: {"kind": r["value"], "limit": 10 * r["value"]})
    payments = env.from_sequence(0, 600).map(lambda r: {"id": r["value"], "kind": r["value"] % 4})
    payments.connect(rules.broadcast()).process(Rules(), name="score").collect()
    result = testing.execute(env, launcher=ThreadLauncher())
    rows = result.collected["collect"]
    assert sorted(r["id"] for r in rows) == list(range(600))
    # (a payment may come before the rules: the inputs interleave; when a rule is there, it
    # is its kind's, in every subtask)
    assert all(r["rule"] in (None, 10 * (r["id"] % 4)) for r in rows)
    assert {r["subtask"] for r in rows} == {0, 1, 2}


def test_the_broadcast_state_is_read_only_where_records_are_processed(tmp_path: Path) -> None:
    env = StreamEnvironment(1, checkpoint_interval=None, restart_strategy=FixedDelay(0))
    rules = env.from_sequence(0, 1).map(lambda r: {"kind": r["value"]})
    env.from_sequence(0, 3).connect(rules.broadcast()).process(Scores()).collect()
    with pytest.raises(Exception, match="does not support item assignment"):
        testing.execute(env, launcher=ThreadLauncher())


def test_connect_refuses_what_cannot_meet(tmp_path: Path) -> None:
    env = StreamEnvironment(2)
    a = write(tmp_path / "a", [{"ad": 1}], 1)
    b = write(tmp_path / "b", [{"ad": "x"}], 1)
    a, b = env.read_parquet(a), env.read_parquet(b)
    with pytest.raises(TypeError, match="keys are of different types: the left's 'ad' is int64"):
        a.key_by("ad").connect(b.key_by("ad"))
    with pytest.raises(TypeError, match="a keyed stream cannot be the broadcast side"):
        b.key_by("ad").broadcast()
    with pytest.raises(TypeError, match="connects to another keyed stream"):
        a.key_by("ad").connect(b)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="KeyedCoProcessFunction subclass, not Rules"):
        a.key_by("ad").connect(b.key_by(lambda r: r["ad"])).process(Rules())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a stream that is not keyed connects to a broadcast"):
        a.connect(b.key_by("ad"))  # type: ignore[arg-type]
