"""A job run again on a checkpoint directory it already used: it resumes, or starts fresh when
told, and never deletes another run's checkpoints (``runtime/checkpoint/lineage.py``).

Without ``restore_from`` over a checkpoint to resume, ``execute()`` is refused before anything
starts, saying both ways on; ``fresh=True`` starts from the beginning and keeps the earlier
run's checkpoints, which ``restore_from="latest"`` then no longer means; a run restored from
a savepoint elsewhere begins a lineage whose "latest", before its first checkpoint, is that
savepoint.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from cutline import Checkpoints, FixedDelay, ResumableCheckpointError, StreamEnvironment, testing
from cutline.cli import main
from cutline.runtime.checkpoint.lineage import begin_lineage, read_lineage, resumable
from cutline.runtime.checkpoint.storage import CheckpointStorage
from cutline.runtime.checkpoint.verify import verify_checkpoint
from cutline.runtime.task.local import ThreadLauncher

N = 2_000


def job(
    tmp_path: Path, retained: int = 1, n: int | None = N, ck: str = "ck", **options: object
) -> StreamEnvironment:
    env = StreamEnvironment(
        2,
        checkpoints=Checkpoints(
            interval=None if n is not None else 0.05, dir=tmp_path / ck, retained=retained
        ),
        restart_strategy=FixedDelay(delay=0),
        **options,  # type: ignore[arg-type]
    )
    env.from_sequence(0, n, name="numbers", rate_limit=None if n else 20_000).key_by(
        lambda r: r["value"] % 5
    ).sum("value", name="sums").collect()
    return env


def counts(result: object) -> int:
    return len(result.output)  # type: ignore[attr-defined]


def test_a_second_run_without_restore_from_is_refused_and_deletes_nothing(
    tmp_path: Path,
) -> None:
    """The issue's case: a job stopped with ``stop_after`` (an unbounded source) leaves a
    resumable checkpoint; the same job run again without ``restore_from`` is refused, naming
    the checkpoint and both ways on, and the checkpoint is still there, intact."""
    first = testing.execute(job(tmp_path, n=None), launcher=ThreadLauncher(), stop_after=0.3)
    last = first.checkpoints[-1].checkpoint_id
    storage = CheckpointStorage(str(tmp_path / "ck"))
    assert storage.completed_ids() == [last]
    with pytest.raises(ResumableCheckpointError) as refused:
        testing.execute(job(tmp_path, n=None), launcher=ThreadLauncher(), stop_after=0.3)
    message = str(refused.value)
    assert f"holds complete checkpoint {last} of an earlier run" in message
    assert "restore_from='latest'" in message and "fresh=True" in message
    assert re.search(r"taken \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", message)
    assert storage.completed_ids() == [last]
    assert verify_checkpoint(storage.location(last)).ok
    began = read_lineage(storage)  # (by the first run: the refused one began nothing)
    assert began is not None and (began.since, began.restored_from) == (1, None)
    # and it resumes, going on from that checkpoint
    again = testing.execute(
        job(tmp_path, n=None), launcher=ThreadLauncher(), stop_after=0.3, restore_from="latest"
    )
    assert again.restored_from is not None and again.restored_from.endswith(f"chk-{last}")


def test_fresh_starts_from_the_beginning_and_keeps_the_earlier_run_s_checkpoints(
    tmp_path: Path,
) -> None:
    first = testing.execute(job(tmp_path), launcher=ThreadLauncher())
    old = first.checkpoints[-1].checkpoint_id
    second = testing.execute(job(tmp_path), launcher=ThreadLauncher(), fresh=True)
    new = second.checkpoints[-1].checkpoint_id
    assert second.restored_from is None and counts(second) == N  # every record again
    storage = CheckpointStorage(str(tmp_path / "ck"))
    assert storage.completed_ids() == [old, new], "retained_checkpoints=1 deleted nothing of it"
    assert verify_checkpoint(storage.location(old)).ok
    lineage = read_lineage(storage)
    assert lineage is not None and old < lineage.since <= new
    assert lineage.restored_from is None
    # "latest" is now the fresh run's newest, not the earlier run's; the list says so
    listed = CliRunner().invoke(main, ["checkpoints", "list", str(tmp_path / "ck")])
    assert listed.exit_code == 0, listed.output
    assert f"restore_from='latest' resumes checkpoint {new}" in listed.output
    assert f"checkpoints below {lineage.since} are of runs before a fresh start" in listed.output
    found = resumable(storage)
    assert found is not None and found.checkpoint_id == new
    third = testing.execute(job(tmp_path), launcher=ThreadLauncher(), restore_from="latest")
    assert third.restored_from is not None and third.restored_from.endswith(f"chk-{new}")
    assert counts(third) == 0, "a finished job resumed publishes nothing again"
    # resuming continues the lineage: its older checkpoint retires, the earlier run's stays
    assert storage.completed_ids() == [old, third.checkpoints[-1].checkpoint_id]


def test_a_fresh_run_that_completed_no_checkpoint_is_started_fresh_again_not_resumed(
    tmp_path: Path,
) -> None:
    """After ``fresh=True`` the earlier run's checkpoints are no longer what the directory
    resumes: a fresh run whose driver died before its first checkpoint leaves nothing to
    resume (the lineage it began has no checkpoint), so the next run may start without
    ``restore_from``, and ``"latest"`` starts from the beginning, not from the old one."""
    testing.execute(job(tmp_path), launcher=ThreadLauncher())
    storage = CheckpointStorage(str(tmp_path / "ck"))
    [old] = storage.completed_ids()
    begin_lineage(storage, old + 1, None, "died")  # (what a fresh run writes before it starts)
    assert resumable(storage) is None
    result = testing.execute(job(tmp_path), launcher=ThreadLauncher(), restore_from="latest")
    assert result.restored_from is None and counts(result) == N
    assert old in storage.completed_ids()


def test_latest_resumes_the_savepoint_a_new_lineage_started_from(tmp_path: Path) -> None:
    """A run restored from a checkpoint elsewhere (here another directory's) into a directory
    with an earlier run's checkpoints keeps them, and begins a lineage whose start is that
    checkpoint: resumed before the lineage has a checkpoint of its own, the job restores it
    again, not the earlier run's checkpoint."""
    source = testing.execute(job(tmp_path, ck="elsewhere"), launcher=ThreadLauncher())
    elsewhere = CheckpointStorage(str(tmp_path / "elsewhere"))
    start = elsewhere.url_of(elsewhere.checkpoint_path(source.checkpoints[-1].checkpoint_id))
    testing.execute(job(tmp_path), launcher=ThreadLauncher())
    storage = CheckpointStorage(str(tmp_path / "ck"))
    [old] = storage.completed_ids()
    restored = testing.execute(job(tmp_path), launcher=ThreadLauncher(), restore_from=start)
    assert restored.restored_from == start
    lineage = read_lineage(storage)
    assert lineage is not None and lineage.restored_from == start and lineage.since > old
    assert old in storage.completed_ids(), "the earlier run's checkpoint is kept"
    # the lineage as its run would leave it had its driver died before its first checkpoint
    begin_lineage(storage, max(storage.completed_ids()) + 1, start, "died")
    found = resumable(storage)
    assert found is not None and found.url == start and found.checkpoint_id is None
    with pytest.raises(ResumableCheckpointError, match="earlier run restored"):
        testing.execute(job(tmp_path), launcher=ThreadLauncher())
    again = testing.execute(job(tmp_path), launcher=ThreadLauncher(), restore_from="latest")
    assert again.restored_from == start


def test_fresh_does_not_go_with_restore_from(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fresh=True starts from the beginning"):
        testing.execute(job(tmp_path), launcher=ThreadLauncher(), fresh=True, restore_from="latest")


def test_a_directory_without_a_complete_checkpoint_needs_neither(tmp_path: Path) -> None:
    (tmp_path / "ck").mkdir()
    result = testing.execute(job(tmp_path), launcher=ThreadLauncher())
    assert counts(result) == N
    began = read_lineage(CheckpointStorage(str(tmp_path / "ck")))
    assert began is not None and (began.since, began.restored_from) == (1, None)
