"""``restore_from="latest"``: a job whose driver died is started again and resumes.

The driver runs in a process of its own (slots as its threads), is killed with SIGKILL once a
checkpoint is complete, and the same job started again with ``restore_from="latest"`` must
publish every record exactly once into the same output directory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cutline import CheckpointWarning, StreamEnvironment
from cutline.runtime.local import ThreadLauncher
from cutline.runtime.restore import RestoreError
from cutline.runtime.storage import CheckpointStorage

RECORDS = 3000


def build(workdir: Path) -> StreamEnvironment:
    """The job: a sequence, a slow map (so that it is still running when the driver dies),
    JSON lines out."""

    def slow(record: dict[str, int]) -> dict[str, int]:
        time.sleep(0.001)
        return {"n": record["value"]}

    env = StreamEnvironment(
        parallelism=2,
        checkpoint_dir=workdir / "ck",
        checkpoint_interval=0.2,
        batch_size=50,
        restart_delay=0.1,
    )
    env.from_sequence(0, RECORDS).map(slow, name="slow").write_jsonl(workdir / "out")
    return env


DRIVER = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_resume import build
from cutline.runtime.local import ThreadLauncher
build(Path({workdir!r})).execute(launcher=ThreadLauncher())
"""


def published(out: Path) -> list[int]:
    return sorted(
        json.loads(line)["n"]
        for part in out.glob("part-*")
        for line in part.read_text().splitlines()
    )


def test_a_job_whose_driver_was_killed_resumes_exactly(tmp_path: Path) -> None:
    script = DRIVER.format(tests=str(Path(__file__).parent), workdir=str(tmp_path))
    driver = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    storage = CheckpointStorage(str(tmp_path / "ck"))
    try:
        while not (tmp_path / "ck").exists() or not storage.completed_ids():
            assert driver.poll() is None, driver.stderr.read() if driver.stderr else ""
            assert time.monotonic() < deadline, "no checkpoint completed within 60 s"
            time.sleep(0.02)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(30)
    latest = max(storage.completed_ids())
    before = published(tmp_path / "out")
    assert len(before) < RECORDS  # it died part-way
    messages: list[tuple[str, str]] = []
    result = build(tmp_path).execute(
        launcher=ThreadLauncher(),
        restore_from="latest",
        listener=lambda kind, message: messages.append((kind, message)),
    )
    assert published(tmp_path / "out") == list(range(RECORDS))
    assert result.restored_from == storage.location(latest).url
    assert not [m for kind, m in messages if kind == "warning"]


def test_resuming_a_finished_job_publishes_nothing_twice(tmp_path: Path) -> None:
    build(tmp_path).execute(launcher=ThreadLauncher())
    assert published(tmp_path / "out") == list(range(RECORDS))
    result = build(tmp_path).execute(launcher=ThreadLauncher(), restore_from="latest")
    assert published(tmp_path / "out") == list(range(RECORDS))
    assert result.restored_from is not None


def test_latest_without_a_complete_checkpoint_starts_from_the_beginning(tmp_path: Path) -> None:
    messages: list[tuple[str, str]] = []
    build(tmp_path).execute(
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
    with pytest.raises(ValueError, match=r"already holds 1 file\(s\)"):
        build(tmp_path).execute(launcher=ThreadLauncher(), restore_from="latest")


def test_latest_needs_a_checkpoint_dir(tmp_path: Path) -> None:
    env = StreamEnvironment(parallelism=1)
    env.from_sequence(0, 10).collect()
    with pytest.raises(ValueError, match='restore_from="latest" needs the job\'s checkpoint_dir'):
        env.execute(launcher=ThreadLauncher(), restore_from="latest")


def test_a_damaged_only_checkpoint_is_named(tmp_path: Path) -> None:
    build(tmp_path).execute(launcher=ThreadLauncher())
    storage = CheckpointStorage(str(tmp_path / "ck"))
    [last] = storage.completed_ids()
    for state in (tmp_path / "ck" / f"chk-{last}").glob("*.state"):
        state.write_bytes(b"damaged")
    with (
        pytest.raises(RestoreError, match="no complete checkpoint or savepoint"),
        pytest.warns(CheckpointWarning, match=f"checkpoint {last} .* is damaged and was skipped"),
    ):
        build(tmp_path).execute(launcher=ThreadLauncher(), restore_from="latest")
    assert os.path.exists(tmp_path / "out")
