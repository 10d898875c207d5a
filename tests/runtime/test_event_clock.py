"""The watermark in one place per subtask (:class:`EventClock`): a place per operator of the
chain and one for the outputs, each only moving forward; the operators read theirs."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from test_window_operators import Job

from cutline.protocol.watermarks import MIN_WATERMARK, EventClock
from cutline.runtime.eventtime.aggregations import Aggregation
from cutline.runtime.eventtime.assigners import Session, Sliding, Tumbling
from cutline.runtime.eventtime.layouts import WINDOWS
from cutline.runtime.eventtime.logic import WindowLogic
from cutline.runtime.eventtime.timestamps import TimeColumn
from cutline.runtime.keyed_operators import KeyedProcessFunction, ProcessContext, ProcessLogic
from cutline.runtime.operators import OperatorContext


def test_each_place_moves_forward_only_and_apart_from_the_others() -> None:
    clock = EventClock(2)
    assert [clock.reached(0), clock.reached(1), clock.output] == [MIN_WATERMARK] * 3
    assert clock.advance(0, 100) == 100
    assert clock.advance(0, 50) == 100  # (never back)
    assert [clock.reached(0), clock.reached(1), clock.output] == [100, MIN_WATERMARK, MIN_WATERMARK]
    clock.advance(1, 70)
    clock.sent(70)
    clock.sent(60)
    assert [clock.reached(0), clock.reached(1), clock.output] == [100, 70, 70]


class Watches(KeyedProcessFunction):
    """Emits the watermark its timer service says, per record."""

    def process(self, record: Any, ctx: ProcessContext) -> list[Any]:
        return [ctx.timer_service.current_watermark()]


def context(clock: EventClock, position: int) -> OperatorContext:
    return OperatorContext("op", 0, 1, 128, 1, clock=clock, position=position)


def test_a_process_function_reads_its_own_place_on_the_clock() -> None:
    clock = EventClock(2)
    first = ProcessLogic(Watches(), "k").open(context(clock, 0), None)
    second = ProcessLogic(Watches(), "k").open(context(clock, 1), None)
    clock.advance(0, 1_000)  # (the subtask tells the first, which fires, then the second)
    assert first.process([{"k": 1}]) == [1_000]
    assert second.process([{"k": 1}]) == [MIN_WATERMARK]
    clock.advance(1, 1_000)
    assert second.process([{"k": 1}]) == [1_000]
    first.close()
    second.close()


@pytest.mark.parametrize("backend", ["memory", "disk"])
def test_a_restored_window_operator_starts_its_place_where_its_checkpoint_was(
    backend: str,
) -> None:
    """The watermarks from upstream start again from the least after a restore; the window
    operator's place starts at its checkpoint's watermark (a window that fired then never
    opens again), the outputs' place where nothing was sent yet."""
    logic = WindowLogic(
        Tumbling("10ms"), Aggregation("sum", "n"), "user", TimeColumn("ts", 0, pa.int64())
    )
    job = Job(logic, backend, 1)
    job.process([{"user": "a", "ts": 5, "n": 1}], arrow=True)
    job.watermark(25)
    assert job.output == [{"user": "a", "window_start": 0, "window_end": 10, "n": 1}]
    state = job.checkpoint(1)
    job.close()
    restored = Job(logic, backend, 1, state)
    op = restored.ops[0]
    assert op.ctx.watermark == 25
    assert op.ctx.clock.output == MIN_WATERMARK
    restored.process([{"user": "a", "ts": 7, "n": 1}], arrow=True)  # (late then: late now)
    restored.watermark(5)  # (upstream starting again from the least)
    assert op.ctx.watermark == 25
    assert restored.output == [] and restored.late == [{"user": "a", "ts": 7, "n": 1}]
    restored.close()


@pytest.mark.parametrize("windows", ["tumbling", "sliding", "session"])
@pytest.mark.parametrize("backend", ["memory", "disk"])
def test_fired_windows_go_when_the_lateness_is_past_though_nothing_else_is_open(
    windows: str, backend: str
) -> None:
    """The subtask moves an operator's place on the clock before it calls ``on_watermark``:
    the windows fired and kept for the allowed lateness still go once it is past, with no
    other window left to fire."""
    assigner = {
        "tumbling": Tumbling("10ms"),
        "sliding": Sliding("20ms", "10ms"),
        "session": Session("10ms"),
    }
    logic = WindowLogic(
        assigner[windows],
        Aggregation("count"),
        "user",
        TimeColumn("ts", 0, pa.int64()),
        allowed_lateness=50,
    )
    job = Job(logic, backend, 1)
    op = job.ops[0]
    job.process([{"user": "a", "ts": 5}, {"user": "b", "ts": 6}], arrow=True)
    for watermark in (30, 1_000):  # (fired, then past the lateness)
        op.ctx.advance(watermark)  # (as the subtask does)
        job.watermark(watermark)
    assert {r["user"] for r in job.output} == {"a", "b"}
    assert len(op.timers) == 0 and not op.timers.pending
    assert op.store.open_windows == 0 and not op.store.holds_windows()
    assert not list(op.backend.keys(WINDOWS))
    held = {
        "ColumnarWindows": lambda s: s.windows,
        "SlicedWindows": lambda s: {**s.windows, **s.slices},
        "ColumnarSessions": lambda s: s.rows,
        "RunWindows": lambda s: s.windows,
        "SlicedRuns": lambda s: {**s.windows, **s.slices},
        "KeyedWindows": lambda s: None,
    }[type(op.store).__name__](op.store)
    assert not held
    job.close()
