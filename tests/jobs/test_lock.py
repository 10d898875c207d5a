"""A checkpoint directory belongs to one running job: a second job refuses to start, naming the
owner; the successor of an owner that died takes the directory over; on file systems without
``flock`` a lease does the same, and an owner whose lease was taken over stops."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import fsspec
import pytest

from cutline import FixedDelay, SourceHold, StreamEnvironment, testing
from cutline.runtime.checkpoint.lock import (
    LOCK_FILE,
    CheckpointDirectoryLock,
    DirectoryLockedError,
    Owner,
)
from cutline.runtime.checkpoint.storage import CheckpointStorage
from cutline.runtime.driver.result import JobFailedError
from cutline.runtime.task.local import ThreadLauncher


def _job(tmp_path: Path, out: str, checkpoint_dir: Path | str | None = None) -> StreamEnvironment:
    env = StreamEnvironment(
        2,
        checkpoint_interval=0.05,
        checkpoint_dir=str(checkpoint_dir or tmp_path / "ck"),
        restart_strategy=FixedDelay(delay=0),
    )
    env.from_sequence(0, 20_000).key_by(lambda r: r["value"] % 5).sum("value").write_jsonl(
        tmp_path / out
    )
    return env


def test_a_second_job_with_the_same_checkpoint_directory_refuses_to_start(tmp_path):
    """The second job is started while the first one runs by construction: from the first's
    listener, while its sources hold."""
    refusals: list[BaseException] = []

    def listener(kind: str, message: str) -> None:
        if kind == "checkpoint" and not refusals:
            try:
                testing.execute(_job(tmp_path, "out-b"), launcher=ThreadLauncher(), progress=False)
            except DirectoryLockedError as exc:
                refusals.append(exc)
            else:
                refusals.append(AssertionError("the second job ran"))

    first = _job(tmp_path, "out-a")
    result = testing.execute(
        first, launcher=ThreadLauncher(), listener=listener, hold_sources=SourceHold(records=2_000)
    )
    assert len(refusals) == 1 and isinstance(refusals[0], DirectoryLockedError)
    message = str(refusals[0])
    assert f"is in use by run {result.checkpoints[-1].run} (process {os.getpid()} on host" in (
        message
    )
    assert "belongs to one running job" in message
    assert not (tmp_path / "out-b").exists() or not list((tmp_path / "out-b").glob("part-*"))
    # the first job was not disturbed, and the directory is free again
    assert result.restarts == []
    again = testing.execute(
        _job(tmp_path, "out-c"), launcher=ThreadLauncher(), progress=False, fresh=True
    )
    assert again.restarts == []


def test_the_successor_of_a_killed_owner_takes_the_directory_over(tmp_path):
    ready = tmp_path / "locked"
    script = (
        "import sys, time\n"
        "from cutline.runtime.checkpoint.lock import CheckpointDirectoryLock, Owner\n"
        f"lock = CheckpointDirectoryLock({str(tmp_path / 'ck')!r}, Owner.this_process('dead0001'))\n"
        "lock.acquire()\n"
        f"open({str(ready)!r}, 'w').close()\n"
        "time.sleep(600)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script])
    try:
        while not ready.exists():
            assert owner.poll() is None, "the owner did not start"
            time.sleep(0.01)
        with pytest.raises(DirectoryLockedError, match=rf"run dead0001 \(process {owner.pid} on"):
            CheckpointDirectoryLock(str(tmp_path / "ck"), Owner.this_process("next0001")).acquire()
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(30)
    successor = CheckpointDirectoryLock(str(tmp_path / "ck"), Owner.this_process("next0001"))
    successor.acquire()
    assert successor.took_over is not None and successor.took_over.run == "dead0001"
    assert successor.took_over.pid == owner.pid
    successor.release()
    assert (tmp_path / "ck" / LOCK_FILE).read_text() == ""  # released: nobody to take over from
    third = CheckpointDirectoryLock(str(tmp_path / "ck"), Owner.this_process("third001"))
    third.acquire()
    assert third.took_over is None
    third.release()


def test_a_lease_refuses_a_second_owner_and_expires_when_not_renewed():
    url = f"memory://cutline-lock-{uuid.uuid4().hex}/ck"
    first = CheckpointDirectoryLock(url, Owner.this_process("first001"), lease=0.3)
    assert not first.local
    first.acquire()
    second = CheckpointDirectoryLock(url, Owner.this_process("second01"), lease=0.3)
    with pytest.raises(DirectoryLockedError, match=r"run first001 .* its lease expires"):
        second.acquire()
    # the first owner freezes: its renewals stop, and its lease expires
    first._stop.set()
    assert first._renewer is not None
    first._renewer.join(5)
    written = time.time()
    while time.time() - written <= 0.3:
        time.sleep(0.05)
    second.acquire()
    assert second.took_over is not None and second.took_over.run == "first001"
    # the first owner, back, finds its lease taken over: it has lost the directory
    assert not first.renew()
    assert first.lost is not None and "was taken over by run second01" in first.lost
    second.release()


def test_a_restart_never_restores_a_checkpoint_another_run_wrote(tmp_path):
    """Defence in depth behind the lock: among a run's checkpoints, one whose metadata names
    another run (another job wrote into the directory) is skipped, with the reason."""
    env = _job(tmp_path, "out")
    result = testing.execute(env, launcher=ThreadLauncher(), progress=False)
    storage = CheckpointStorage(str(tmp_path / "ck"))
    [last] = storage.completed_ids()
    run = result.checkpoints[-1].run
    metadata, skipped = storage.latest(run="someone")
    assert metadata is None
    assert skipped[0].reason == (
        f"checkpoint {last} was written by run {run}, not by this run (someone): another job "
        "wrote into this checkpoint directory"
    )
    assert storage.latest(run=run)[0] is not None


def test_a_job_whose_lease_is_taken_over_stops_without_restarting():
    """On a lease file system, a job that lost its directory (another took it over) fails at
    once: restarting would write into the other job's directory."""
    url = f"memory://cutline-lock-{uuid.uuid4().hex}/ck"

    def listener(kind: str, message: str) -> None:
        if kind == "checkpoint":  # another job takes the directory over (as if it had expired)
            fs, root = fsspec.core.url_to_fs(url)
            with fs.open(f"{root}/{LOCK_FILE}", "w") as out:
                out.write(
                    '{"run": "other001", "host": "h", "pid": 1, "user": "u", "since": 0, '
                    f'"renewed": {time.time() + 3600}}}'
                )

    env = StreamEnvironment(
        2, checkpoint_interval=0.05, checkpoint_dir=url, restart_strategy=FixedDelay(delay=0)
    )
    env.from_sequence(0, None).collect()
    with pytest.raises(JobFailedError, match="taken over by run other001") as info:
        testing.execute(
            env,  # unbounded and held: only the lost lease ends it
            launcher=ThreadLauncher(),
            listener=listener,
            progress=False,
            hold_sources=SourceHold(records=1_000),
        )
    assert "after 1 attempt(s)" in str(info.value)
