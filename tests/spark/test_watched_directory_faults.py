"""A watched directory on a real local Spark session: files put into it while the job runs
(one more at every complete checkpoint), a Python worker SIGKILLed once two files were read,
more files after the restart; every row of every file published exactly once. The kill and
the stop land by construction: both come from the job's listener, on a checkpoint that shows
the files read (``Feeder`` of ``tests/jobs/test_watched_directory.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_savepoints import endpoints_of
from test_watched_directory import (
    Feeder,
    assert_every_row_once,
    finished_files,
    published,
    put_file,
    watching_job,
)

from cutline import testing
from cutline.demo import WorkerKiller


@pytest.mark.parametrize("slot", ["slot-0", "slot-1"])
def test_a_watched_directory_survives_a_sigkill_exactly_once(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slot: str
) -> None:
    (tmp_path / "landing").mkdir()
    for number in range(2):
        put_file(tmp_path / "landing", number)
    feeder = Feeder(
        tmp_path / "landing", tmp_path / "ck", list(range(2, 9)), 9, endpoints_of(monkeypatch)
    )
    killer = WorkerKiller(slot=slot)

    def listener(kind: str, message: Any) -> None:
        if (
            kind == "checkpoint"
            and killer.killed_at is None
            and finished_files(tmp_path / "ck", int(message.split()[0])) >= 2
        ):
            killer.kill()
        feeder(kind, message)

    env = watching_job(tmp_path, 2, "out")
    try:
        result = testing.execute(env, spark, listener=listener, on_ready=killer.on_ready)
    finally:
        killer.disarm()
    assert killer.killed_at is not None and len(result.restarts) == 1
    assert result.savepoints == [feeder.savepoint()]
    assert_every_row_once(published(tmp_path / "out"), 9)
