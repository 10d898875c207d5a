"""The job's events, typed: a JobListener gets them as dataclasses whose fields say what
happened, and a ``(kind, message)`` listener gets the same events worded.

The job fails once, on the first batch after a checkpoint completed (the sources hold until
then, so there is input left to fail on, on a machine of any speed), and restarts from it.
"""

from __future__ import annotations

from pathlib import Path

from test_checkpointing_modes import HALF, FailOnceAfter, environment, keyed_job

from cutline import (
    CheckpointCompleted,
    GenerationRunning,
    JobEvent,
    JobListener,
    Restarting,
    SavepointCompleted,
    testing,
)
from cutline.runtime.task.local import ThreadLauncher


class Recorder(JobListener):
    def __init__(self, marker: Path) -> None:
        self.marker = marker
        self.events: list[JobEvent] = []

    def on_event(self, event: JobEvent) -> None:
        self.events.append(event)
        if isinstance(event, CheckpointCompleted):
            self.marker.touch()


def test_a_job_listener_gets_typed_events_and_a_plain_one_the_same_words(tmp_path: Path) -> None:
    marker = tmp_path / "checkpointed"
    env = environment(tmp_path, "aligned")
    keyed_job(env, tmp_path, 0.0, then=FailOnceAfter(str(marker), str(tmp_path / "failed")))
    recorder = Recorder(marker)
    result = testing.execute(env, launcher=ThreadLauncher(), listener=recorder, hold_sources=HALF)
    events = recorder.events

    running = [e for e in events if isinstance(e, GenerationRunning)]
    assert [e.generation for e in running] == [1, 2]
    assert all(set(e.hosts) == {"slot-0", "slot-1"} for e in running)
    assert running[0].message.startswith("generation 1: slot-0 on ")

    [restart] = [e for e in events if isinstance(e, Restarting)]
    assert restart.generation == 1 and "injected failure" in restart.cause
    assert restart.restored == result.restarts[0].restored_from
    assert restart.kind == "restart" and restart.message.endswith(
        f"restarting in 0 s from checkpoint {restart.restored}"
    )

    completed = [e for e in events if isinstance(e, CheckpointCompleted)]
    assert not any(isinstance(e, SavepointCompleted) for e in completed)
    assert [e.checkpoint for e in completed] == [c.checkpoint_id for c in result.checkpoints]
    assert [e.final for e in completed][-1] is True
    assert str(completed[-1]) == (
        f"checkpoint {completed[-1].checkpoint} complete in {completed[-1].duration:.2f} s (final)"
    )

    # the same job, told to a (kind, message) callable: the events' own words
    said: list[tuple[str, str]] = []
    again = environment(tmp_path / "again", "aligned")
    keyed_job(again, tmp_path, 0.0)
    testing.execute(again, launcher=ThreadLauncher(), listener=lambda k, m: said.append((k, m)))
    kinds = [k for k, _ in said]
    assert kinds[0] == "running" and "checkpoint" in kinds
    assert said[0][1].startswith("generation 1: slot-0 on ")
    assert said[-1][0] == "checkpoint" and said[-1][1].endswith("(final)")
