"""A file a checkpoint is part-way through is read on from there only if it is the file the
position counted: one that changed since it was listed (its size or modification time), or
is gone, fails the restored job naming it, never read on from a row count that now points
into other rows.

The job stops with a savepoint while its source holds part-way through the second of three
files (``SourceHold``: by construction); the file is then rewritten, or removed, and the job
resumed from the savepoint.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from test_savepoints import SavepointOnHold, endpoints_of

from cutline import FixedDelay, JobClient, JobFailedError, SourceHold, StreamEnvironment, testing
from cutline.runtime.task.local import ThreadLauncher

pytestmark = pytest.mark.jobs

ROWS = 100


def write(path: Path, first: int, rows: int = ROWS) -> None:
    path.write_text("n\n" + "".join(f"{first + i}\n" for i in range(rows)))


def job(tmp_path: Path, ck: str) -> StreamEnvironment:
    env = StreamEnvironment(
        1,
        checkpoint_interval=0.05,
        checkpoint_dir=tmp_path / ck,
        batch_size=10,
        restart_strategy=FixedDelay(0),
    )
    env.read_csv(tmp_path / "in", name="numbers").collect()
    return env


def stopped_part_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Three files of 100 rows, the job stopped with a savepoint once 150 rows were read:
    half-way through the second file. Its folder."""
    (tmp_path / "in").mkdir()
    for i in range(3):
        write(tmp_path / "in" / f"{i}.csv", i * 1000)
    asking = SavepointOnHold(
        endpoints_of(monkeypatch),
        lambda _: JobClient(str(tmp_path / "ck1")).savepoint(stop=True),
    )
    testing.execute(
        job(tmp_path, "ck1"),
        launcher=ThreadLauncher(),
        listener=asking,
        hold_sources=SourceHold(records=150, checkpoints=2),
        progress=False,
    )
    path = asking.answer()
    assert isinstance(path, str), path
    return path


def resume(tmp_path: Path, savepoint: str) -> Any:
    return testing.execute(
        job(tmp_path, "ck2"), launcher=ThreadLauncher(), restore_from=savepoint, progress=False
    )


def test_a_file_rewritten_after_the_checkpoint_read_part_of_it_fails_the_restore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    savepoint = stopped_part_way(tmp_path, monkeypatch)
    second = tmp_path / "in" / "1.csv"
    write(second, 5000, ROWS + 20)  # (more rows: a count of rows read still fits in it)
    with pytest.raises(JobFailedError) as failed:
        resume(tmp_path, savepoint)
    message = str(failed.value)
    assert f"{second} changed since it was listed (it was " in message
    assert "and the checkpoint restored read 50 rows of it" in message


def test_a_file_gone_after_the_checkpoint_read_part_of_it_fails_the_restore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    savepoint = stopped_part_way(tmp_path, monkeypatch)
    second = tmp_path / "in" / "1.csv"
    os.remove(second)
    with pytest.raises(JobFailedError) as failed:
        resume(tmp_path, savepoint)
    assert f"{second} is gone, though the checkpoint restored read 50 rows of it" in str(
        failed.value
    )


def test_an_unchanged_file_is_read_on_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    savepoint = stopped_part_way(tmp_path, monkeypatch)
    rest = resume(tmp_path, savepoint).output
    assert sorted(r["n"] for r in rest) == [1000 + i for i in range(50, ROWS)] + [
        2000 + i for i in range(ROWS)
    ]
