"""``retained_checkpoints`` counts a checkpoint directory's complete checkpoints across the runs
that resume one another: the checkpoints of earlier runs go as the new run's own complete,
never one a restore still needs, and never a shared file a retained checkpoint names. A run that
starts fresh (``fresh=True``) deletes none of an earlier run's."""

from __future__ import annotations

from pathlib import Path

import pytest

from cutline import Checkpoints, FixedDelay, StreamEnvironment, testing
from cutline.runtime.checkpoint.storage import CheckpointStorage
from cutline.runtime.task.local import ThreadLauncher


def _job(tmp_path: Path, out: str, retained: int, n: int = 5_000) -> StreamEnvironment:
    env = StreamEnvironment(
        2,
        checkpoints=Checkpoints(
            interval=None,  # the final checkpoint only: one per run, whatever the speed
            dir=str(tmp_path / "ck"),
            retained=retained,
        ),
        restart_strategy=FixedDelay(delay=0),
    )
    env.from_sequence(0, n).key_by(lambda r: r["value"] % 5).sum("value", name="sums").collect()
    return env


def _referenced(storage: CheckpointStorage) -> set[str]:
    return {
        ref.path
        for c in storage.completed_ids()
        for handle in storage.read_metadata(c).handles.values()
        for ref in handle.shared
    }


@pytest.mark.parametrize("retained", [1, 2])
def test_runs_that_resume_keep_only_the_retained_checkpoints_in_all(tmp_path, retained):
    storage = CheckpointStorage(str(tmp_path / "ck"))
    ids: list[int] = []
    for run in range(4):
        result = testing.execute(
            _job(tmp_path, f"out{run}", retained), launcher=ThreadLauncher(), restore_from="latest"
        )
        ids.append(result.checkpoints[-1].checkpoint_id)
        assert storage.completed_ids() == ids[-retained:]
        assert set(storage.shared_files()) == _referenced(storage)  # none kept, none missing
    # their statistics stay (the history of every run)
    history = storage.read_history()
    assert {s.checkpoint_id for s in history.checkpoints if s.completed} >= set(ids)


def test_runs_that_start_fresh_delete_no_earlier_run_s_checkpoint(tmp_path):
    storage = CheckpointStorage(str(tmp_path / "ck"))
    ids: list[int] = []
    for run in range(3):
        result = testing.execute(
            _job(tmp_path, f"out{run}", 1), launcher=ThreadLauncher(), fresh=True
        )
        ids.append(result.checkpoints[-1].checkpoint_id)
        assert storage.completed_ids() == ids
        assert set(storage.shared_files()) == _referenced(storage)


def test_the_checkpoint_a_run_restored_stays_until_the_run_has_its_own(tmp_path):
    storage = CheckpointStorage(str(tmp_path / "ck"))
    first = testing.execute(_job(tmp_path, "out", 1), launcher=ThreadLauncher())
    [restored] = storage.completed_ids()
    assert restored == first.checkpoints[-1].checkpoint_id
    seen: list[list[int]] = []

    def listener(kind: str, message: str) -> None:
        if kind == "running":  # the run restored it and has no checkpoint of its own yet
            seen.append(storage.completed_ids())

    again = testing.execute(
        _job(tmp_path, "out", 1),
        launcher=ThreadLauncher(),
        restore_from="latest",
        listener=listener,
    )
    assert seen == [[restored]]
    assert storage.completed_ids() == [again.checkpoints[-1].checkpoint_id]
    assert set(storage.shared_files()) == _referenced(storage)
