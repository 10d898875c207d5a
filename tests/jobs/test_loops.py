"""Loops (``DataStream.iterate``) through the real runtime with threads for slots: the
connected-components example in every checkpointing mode, with and without a failure inside
the loop, and the errors of badly built loops. The same example on local Spark with a killed
worker is in ``test_spark_jobs.py``.

Exactly-once output of the example: every ``(vertex, label)`` pair is published once (a label
only ever drops, so a repeat would be a duplicate), and every vertex's smallest published
label is the smallest vertex of its component.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_runtime_jobs import FirstBatch, once_something_was_read

from cutline import Checkpoints, FixedDelay, JobResult, SourceHold, StreamEnvironment, testing
from cutline.examples.connected_components import (
    Propagate,
    as_output,
    both_directions,
    components,
    edge_stream,
    expected_labels,
    is_label,
    is_output,
    vertex_of,
)
from cutline.runtime.graph import GraphError
from cutline.runtime.task.local import ThreadLauncher

EDGES, VERTICES = 3_000, 2_000
MODES = ["aligned", "unaligned", "at_least_once"]


def environment(tmp_path: Path, mode: str, **options: Any) -> StreamEnvironment:
    settings: dict[str, Any] = {
        "checkpoint_interval": 0.05,
        "checkpoint_dir": tmp_path / "checkpoints",
        "restart_strategy": FixedDelay(delay=0),
        "batch_size": 50,
        "checkpoints": Checkpoints(mode=mode),
    }
    settings.update(options)
    return StreamEnvironment(2, **settings)


def final_labels(result: JobResult) -> dict[int, int]:
    labels: dict[int, int] = {}
    for r in result.output:
        labels[r["vertex"]] = min(r["label"], labels.get(r["vertex"], r["label"]))
    return labels


def duplicates(result: JobResult) -> int:
    pairs = Counter((r["vertex"], r["label"]) for r in result.output)
    return sum(n - 1 for n in pairs.values())


@pytest.mark.parametrize("mode", MODES)
def test_connected_components_in_every_mode(tmp_path: Path, mode: str) -> None:
    env = environment(tmp_path, mode)
    components(edge_stream(env, edges=EDGES, vertices=VERTICES)).collect()
    result = testing.execute(env, launcher=ThreadLauncher())
    assert result.restarts == []
    assert final_labels(result) == expected_labels(EDGES, VERTICES)
    assert duplicates(result) == 0
    assert result.checkpoints[-1].final


@dataclass(frozen=True)
class FailOnceAfter:
    """Passes records through; raises once on the first record after ``marker`` exists."""

    marker: str
    flag: str

    @property
    def __name__(self) -> str:
        return "fail_once_after"

    def __call__(self, record: Any) -> Any:
        if os.path.exists(self.marker):
            try:
                os.close(os.open(self.flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return record
            raise RuntimeError("injected failure inside the loop")
        return record


def touch_on_checkpoint(path: Path) -> Callable[[str, str], None]:
    def listener(kind: str, message: str) -> None:
        if kind == "checkpoint":
            path.touch()

    return listener


@pytest.mark.parametrize("mode", MODES)
def test_a_failure_inside_the_loop_restores_the_records_on_the_back_edge(
    tmp_path: Path, mode: str
) -> None:
    """The failure comes on the first record fed back after a checkpoint completed. The edges
    hold half-way until one has, and every edge read after that sends a label round the loop:
    there is always a record to fail on, however fast the loop."""
    marker = tmp_path / "checkpointed"
    env = environment(tmp_path, mode)

    def body(loop: Any) -> tuple[Any, Any]:
        messages = loop.key_by(vertex_of).process(Propagate())
        feedback = messages.filter(is_label).map(FailOnceAfter(str(marker), str(tmp_path / "f")))
        return feedback, messages.filter(is_output).map(as_output)

    (
        edge_stream(env, edges=EDGES, vertices=VERTICES)
        .flat_map(both_directions)
        .iterate(body)
        .collect()
    )
    result = testing.execute(
        env,
        launcher=ThreadLauncher(),
        listener=touch_on_checkpoint(marker),
        hold_sources=SourceHold(records=EDGES // 4),  # half of each subtask's edges
    )
    assert len(result.restarts) == 1
    assert result.restarts[0].restored_from is not None
    assert final_labels(result) == expected_labels(EDGES, VERTICES)
    if mode != "at_least_once":
        assert duplicates(result) == 0


def test_checkpoints_of_a_busy_loop_record_the_back_edge(tmp_path: Path) -> None:
    # (the edges hold half-way until a checkpoint completed: there is one before the final
    # one, whatever the speed; that the loop is busy when one is taken is not by construction)
    env = environment(tmp_path, "aligned", checkpoint_interval=0.02, batch_size=20)
    components(edge_stream(env, edges=EDGES, vertices=VERTICES)).collect()
    result = testing.execute(
        env, launcher=ThreadLauncher(), hold_sources=SourceHold(records=EDGES // 4)
    )
    assert final_labels(result) == expected_labels(EDGES, VERTICES)
    assert any(c.channel_state_records > 0 for c in result.checkpoints)
    assert all(not c.unaligned for c in result.checkpoints)  # aligned: only the back edge


def test_an_unbounded_source_with_a_loop_stops_when_the_loop_is_quiet(tmp_path: Path) -> None:
    env = environment(tmp_path, "aligned")

    def body(loop: Any) -> tuple[Any, Any]:
        # each record goes round until its counter reaches zero
        stepped = loop.map(lambda r: {**r, "left": r["left"] - 1})
        return stepped.filter(lambda r: r["left"] > 0), stepped.filter(lambda r: r["left"] == 0)

    read = tmp_path / "read"
    (
        env.from_sequence(0, None)
        .map_batches(FirstBatch(read))
        .map(lambda r: {"value": r["value"], "left": 1 + r["value"] % 5})
        .iterate(body)
        .map(lambda r: r["value"])
        .collect()
    )
    # the stop comes once a batch was read (the listener keeps the driver until then)
    result = testing.execute(
        env, launcher=ThreadLauncher(), stop_after=0.5, listener=once_something_was_read(read)
    )
    published = Counter(result.output)
    assert published, "the job read something before it stopped"
    assert all(n == 1 for n in published.values())
    # every record the sources read came out of the loop, once
    assert sum(published.values()) == result.source_records[result.generations]


def test_a_body_that_does_not_return_two_streams_is_refused(tmp_path: Path) -> None:
    env = environment(tmp_path, "aligned")
    stream = env.from_sequence(0, 10)
    with pytest.raises(TypeError, match=r"must return \(feedback, output\)"):
        stream.iterate(lambda loop: loop.map(lambda r: r))  # type: ignore[arg-type,return-value]


def test_feeding_back_the_loop_s_own_input_is_refused(tmp_path: Path) -> None:
    env = environment(tmp_path, "aligned")
    with pytest.raises(ValueError, match="must come from inside its loop body"):
        env.from_sequence(0, 10).iterate(lambda loop: (loop, loop.map(lambda r: r)))


def test_feeding_back_a_stream_from_outside_the_loop_is_refused(tmp_path: Path) -> None:
    env = environment(tmp_path, "aligned")
    outside = env.from_sequence(0, 5).map(lambda r: r)
    with pytest.raises(ValueError, match="must come from inside its loop body"):
        env.from_sequence(0, 10).iterate(lambda loop: (outside, loop.map(lambda r: r)))


def test_a_loop_head_takes_one_back_edge_only() -> None:
    from cutline.runtime.graph import Edge, JobGraph, Operator

    graph = JobGraph()
    graph.add(Operator("src", "source", None))
    graph.add(Operator("head", "iterate", None, [Edge("src")]))
    graph.add(Operator("body", "map", None, [Edge("head")]))
    graph.close_loop("head", "body")
    with pytest.raises(GraphError, match="already has a back edge"):
        graph.close_loop("head", "body")
    assert graph.has_loops


@dataclass(frozen=True)
class SlowAfterRestart:
    """Counts a record's rounds down once ``going`` exists (until then every record goes round
    and round, unchanged: the loop is busy, by construction, until the failure that creates
    ``going``); slow for a moment after a restart (``until`` holds the time), so that a
    restored loop head is still busy replaying its back edge while the driver's census runs."""

    until: str
    going: str

    @property
    def __name__(self) -> str:
        return "step"

    def __call__(self, record: dict[str, Any]) -> dict[str, Any]:
        if not os.path.exists(self.going):
            return record
        if os.path.exists(self.until) and time.time() < float(Path(self.until).read_text() or 0):
            time.sleep(0.03)
        return {**record, "left": record["left"] - 1}


class Enter:
    """A record enters the loop with ``rounds`` to go; ``all_in`` is touched once this copy
    of the function has passed ``n`` records."""

    __name__ = "enter"

    def __init__(self, rounds: int, n: int, all_in: Path) -> None:
        self.rounds, self.n, self.all_in = rounds, n, all_in
        self.passed = 0

    def __call__(self, record: dict[str, int]) -> dict[str, int]:
        self.passed += 1
        if self.passed == self.n:
            self.all_in.touch()
        return {"value": record["value"], "left": self.rounds}


def test_a_restored_loop_is_not_declared_quiet_while_it_replays_its_back_edge(
    tmp_path: Path,
) -> None:
    # Restored from a checkpoint taken after the sources were exhausted, with records on the
    # back edge: the head replays them first. The census must count that work, or the final
    # checkpoint comes too early and what the replay produces is never published.
    # By construction: the records go round without counting down until the failure, which
    # comes on the second checkpoint completed after every record entered the loop (so it
    # was triggered after the source read its last record). (The rounds no longer keep the
    # first generation busy: 100 are enough for the restored one to be busy after its replay.)
    n, rounds = 200, 100
    marker, slow = tmp_path / "checkpointed", tmp_path / "slow"
    failed, all_in = tmp_path / "failed", tmp_path / "all-in"
    env = StreamEnvironment(
        1,
        checkpoint_interval=0.05,
        checkpoint_dir=tmp_path / "checkpoints",
        batch_size=20,
        restart_strategy=FixedDelay(2, delay=0),
    )

    def body(loop: Any) -> tuple[Any, Any]:
        stepped = loop.map(SlowAfterRestart(str(slow), str(failed)))  # chained with the head
        feedback = stepped.filter(lambda r: r["left"] > 0).map(
            FailOnceAfter(str(marker), str(failed))
        )
        return feedback, stepped.filter(lambda r: r["left"] == 0)

    (
        env.from_sequence(0, n)
        .map(Enter(rounds, n, all_in))
        .iterate(body)
        .map(lambda r: r["value"])
        .collect()
    )
    completed: list[str] = []

    def listener(kind: str, message: str) -> None:
        if kind == "checkpoint" and all_in.exists():
            completed.append(message)
            if len(completed) == 2:
                marker.touch()
        if kind == "restart":
            slow.write_text(str(time.time() + 1.5))

    result = testing.execute(env, launcher=ThreadLauncher(), listener=listener)
    assert len(result.restarts) == 1
    assert result.restarts[0].restored_from is not None
    published = Counter(result.output)
    assert sorted(published) == list(range(n))
    assert all(count == 1 for count in published.values())
