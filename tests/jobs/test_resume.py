"""``restore_from="latest"``: a job whose driver died is started again and resumes.

The driver runs in a process of its own (slots as its threads), is killed with SIGKILL once a
checkpoint is complete, and the same job started again with ``restore_from="latest"`` must
publish every record exactly once into the same output directory. The driver is killed while
its job is frozen part-way (its sources hold half-way and its listener keeps it), however
fast the machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cutline import Checkpoints, CheckpointWarning, FixedDelay, StreamEnvironment, testing
from cutline.runtime.checkpoint.restore import RestoreError
from cutline.runtime.checkpoint.storage import CheckpointStorage
from cutline.runtime.task.local import ThreadLauncher
from paths import import_path

RECORDS = 3000


def build(workdir: Path, retained: int = 1, rate_limit: float | None = None) -> StreamEnvironment:
    """The job: a sequence (at most ``rate_limit`` records a second), a map, JSON lines out."""

    def slow(record: dict[str, int]) -> dict[str, int]:  # (its name: the operator's)
        return {"n": record["value"]}

    env = StreamEnvironment(
        parallelism=2,
        checkpoints=Checkpoints(interval=0.2, dir=workdir / "ck", retained=retained),
        batch_size=50,
        restart_strategy=FixedDelay(delay=0.1),
    )
    env.from_sequence(0, RECORDS, rate_limit=rate_limit).map(slow, name="slow").write_jsonl(
        workdir / "out"
    )
    return env


def freeze_after(workdir: Path, checkpoints: int) -> Callable[[str, str], None]:
    """A listener that, once ``checkpoints`` complete checkpoints pre-committed output (a part
    file of theirs is pending or published), touches ``workdir/frozen`` and keeps the driver
    for ever: no checkpoint completes any more, so sources that hold part-way stay there,
    and the job is frozen with input left until its driver is killed."""
    with_output: list[int] = []

    def listener(kind: str, message: str) -> None:
        if kind != "checkpoint":
            return
        checkpoint = int(message.split()[0])
        out = workdir / "out"
        name = f"part-*-{checkpoint:010d}-*"
        if any(out.glob(name)) or any((out / "_pending").glob(name)):
            with_output.append(checkpoint)
        if len(with_output) >= checkpoints:
            (workdir / "frozen").touch()
            threading.Event().wait()

    return listener


DRIVER = """
import sys
from pathlib import Path
sys.path[:0] = {tests!r}
from test_resume import RECORDS, build, freeze_after
from cutline import SourceHold
from cutline.runtime.task.local import ThreadLauncher
workdir = Path({workdir!r})
build(workdir, {retained}, rate_limit=RECORDS).execute(
    launcher=ThreadLauncher(),
    hold_sources=SourceHold(records=RECORDS // 4),
    listener=freeze_after(workdir, {checkpoints}),
)
"""


def published(out: Path) -> list[int]:
    return sorted(
        json.loads(line)["n"]
        for part in out.glob("part-*")
        for line in part.read_text().splitlines()
    )


def checkpoints_published(out: Path) -> set[int]:
    """The checkpoints whose part files are published in ``out``."""
    return {int(p.name.split("-")[2]) for p in out.glob("part-*")}


def kill_driver_after(workdir: Path, checkpoints: int, retained: int = 1) -> list[int]:
    """Run the job's driver in a process of its own and SIGKILL it once ``checkpoints``
    checkpoints with output completed (:func:`freeze_after`: the job is frozen then, its
    sources holding half-way or before) and the newest published its parts; the complete
    ones then on disk. The source is rate-limited (a second at least for the whole input),
    so that checkpoints with output complete before the sources hold: the freeze comes while
    they hold at the latest."""
    script = DRIVER.format(
        tests=import_path(),
        workdir=str(workdir),
        retained=retained,
        checkpoints=checkpoints,
    )
    driver = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    storage = CheckpointStorage(str(workdir / "ck"))
    try:
        while (
            not (workdir / "frozen").exists()
            or not (workdir / "ck").exists()
            or len(storage.completed_ids()) < checkpoints
            or max(storage.completed_ids()) not in checkpoints_published(workdir / "out")
        ):
            assert driver.poll() is None, driver.stderr.read() if driver.stderr else ""
            assert time.monotonic() < deadline, "the checkpoints did not complete within 60 s"
            time.sleep(0.01)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(30)
    assert 0 < len(published(workdir / "out")) < RECORDS  # it died part-way
    return storage.completed_ids()


def test_a_job_whose_driver_was_killed_resumes_exactly(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path / "ck"))
    latest = max(kill_driver_after(tmp_path, 1))
    messages: list[tuple[str, str]] = []
    result = testing.execute(
        build(tmp_path),
        launcher=ThreadLauncher(),
        restore_from="latest",
        listener=lambda kind, message: messages.append((kind, message)),
    )
    assert published(tmp_path / "out") == list(range(RECORDS))
    assert result.restored_from == storage.location(latest).url
    # what the dead run counted until its checkpoint, and this run after it: the whole job's
    assert list(result.summary().read.values()) == [RECORDS]
    assert list(result.summary().written.values()) == [RECORDS]
    assert result.metrics is not None and result.metrics.operators[0].records_out < RECORDS
    # the only warning: the dead driver's lock on the directory was taken over
    [warning] = [m for kind, m in messages if kind == "warning"]
    assert warning.startswith("took the checkpoint directory over from run ")
    assert "which ended without releasing it" in warning


def test_resuming_from_an_older_checkpoint_withdraws_what_the_dead_run_published_after_it(
    tmp_path: Path,
) -> None:
    """The newest checkpoint the dead driver completed (and published) is damaged: the job
    resumes from the one before, and the dead run's parts of the newer one must go."""
    *older, newest = kill_driver_after(tmp_path, 2, retained=2)
    for state in (tmp_path / "ck" / f"chk-{newest}").glob("*.state"):
        state.write_bytes(b"damaged")
    storage = CheckpointStorage(str(tmp_path / "ck"))
    with pytest.warns(CheckpointWarning, match=f"checkpoint {newest} is damaged: "):
        result = testing.execute(
            build(tmp_path, retained=2), launcher=ThreadLauncher(), restore_from="latest"
        )
    assert result.restored_from == storage.location(older[-1]).url
    assert published(tmp_path / "out") == list(range(RECORDS))


def test_resuming_a_finished_job_publishes_nothing_twice(tmp_path: Path) -> None:
    testing.execute(build(tmp_path), launcher=ThreadLauncher())
    assert published(tmp_path / "out") == list(range(RECORDS))
    result = testing.execute(build(tmp_path), launcher=ThreadLauncher(), restore_from="latest")
    assert published(tmp_path / "out") == list(range(RECORDS))
    assert result.restored_from is not None
    # it read nothing more: the figures are those of the run that finished
    assert list(result.summary().read.values()) == [RECORDS]
    assert result.metrics is not None and result.metrics.operators[0].records_out == 0


def test_latest_without_a_complete_checkpoint_starts_from_the_beginning(tmp_path: Path) -> None:
    messages: list[tuple[str, str]] = []
    testing.execute(
        build(tmp_path),
        launcher=ThreadLauncher(),
        restore_from="latest",
        listener=lambda kind, message: messages.append((kind, message)),
    )
    assert published(tmp_path / "out") == list(range(RECORDS))
    assert (
        "warning",
        f"no complete checkpoint in {tmp_path / 'ck'} yet: starting from the beginning",
    ) in messages


def test_latest_with_no_checkpoint_refuses_an_output_directory_that_holds_files(
    tmp_path: Path,
) -> None:
    """No checkpoint there, yet published output: not this job's directory (a typo?)."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "part-other.jsonl").write_text("{}\n")
    with pytest.raises(
        ValueError,
        match=r"already holds 1 file\(s\), and .* has no complete checkpoint to resume from: the files are not this job's",
    ):
        testing.execute(build(tmp_path), launcher=ThreadLauncher(), restore_from="latest")


def test_latest_needs_a_checkpoint_dir(tmp_path: Path) -> None:
    env = StreamEnvironment(parallelism=1)
    env.from_sequence(0, 10).collect()
    with pytest.raises(ValueError, match='restore_from="latest" needs the job\'s checkpoint_dir'):
        testing.execute(env, launcher=ThreadLauncher(), restore_from="latest")


def test_a_damaged_only_checkpoint_is_named(tmp_path: Path) -> None:
    testing.execute(build(tmp_path), launcher=ThreadLauncher())
    storage = CheckpointStorage(str(tmp_path / "ck"))
    [last] = storage.completed_ids()
    for state in (tmp_path / "ck" / f"chk-{last}").glob("*.state"):
        state.write_bytes(b"damaged")
    with (
        pytest.raises(RestoreError, match=r"every complete checkpoint in .* is damaged") as info,
        pytest.warns(CheckpointWarning, match=f"checkpoint {last} is damaged: .*skipped"),
    ):
        testing.execute(build(tmp_path), launcher=ThreadLauncher(), restore_from="latest")
    message = str(info.value)
    assert f"checkpoint {last} is damaged: state file" in message  # which, and what is wrong
    assert "cutline checkpoints verify" in message and "restore a savepoint" in message
    assert os.path.exists(tmp_path / "out")
