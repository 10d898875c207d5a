"""Every built-in join exactly once across a stop with a savepoint and a restore at another
parallelism under the other state backend (slots as threads): each result, outer rows
included (and the rows of null keys, which pair with nothing), published once by one of the
two runs, equal to the plain-Python answer; and the records late because of the restore (at
or before the watermark the stopped job had reached) in the late side output, paired with
nothing, and counted.

The inputs and the answers are ``tests/join_inputs.py``'s: no record is late but those put
there to be, after the point where the job stops. The stop lands by construction
(``test_event_time_restore.py``'s :class:`OnCheckpoint` and :class:`StopWithSavepoint`):
every source subtask of both inputs holds half-way into its last file until the job stops,
and the savepoint is asked for on the first checkpoint that shows them all there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_event_time_restore import (
    OnCheckpoint,
    StopWithSavepoint,
    endpoints_of,
    published,
    source_positions,
)

from cutline import SourceHold, State, StreamEnvironment, testing
from cutline.runtime.task.local import ThreadLauncher
from join_inputs import (
    JOINS,
    RIGHT_IDS,
    Input,
    answer,
    assert_once,
    join_job,
    result,
    write_side,
)

FILES, PER_FILE = 6, 300
"""Per input (6: as many files for each source subtask at parallelism 2 and 3)."""
HALF = PER_FILE // 2
"""Where in its last file each source subtask holds."""


def _inputs(tmp_path: Path, parallelism: int, seed: int) -> tuple[Input, Input]:
    """Both inputs, with records late by construction a little after the hold in the last
    file of each source subtask (read only by the restored job)."""
    late_at = {f: HALF + 7 for f in range(FILES - parallelism, FILES)}
    sides = {"files": FILES, "per_file": PER_FILE, "late_at": late_at, "nulls": True}
    left = write_side(tmp_path / "in" / "clicks", seed, first_id=0, **sides)  # type: ignore[arg-type]
    right = write_side(
        tmp_path / "in" / "views",
        seed + 1,
        first_id=RIGHT_IDS,
        distinct_times=True,
        **sides,  # type: ignore[arg-type]
    )
    return left, right


def _environment(tmp_path: Path, p: int, backend: str, run: str) -> StreamEnvironment:
    return StreamEnvironment(
        p,
        checkpoint_interval=0.05,
        checkpoint_dir=tmp_path / f"ck{run}",
        state=State(backend=backend, dir=tmp_path / f"state{run}"),  # type: ignore[arg-type]
        batch_size=50,
        max_parallelism=16,
    )


def _all_held(hold: int) -> Any:
    def ready(reader: Any) -> bool:
        positions = [*source_positions(reader, "clicks").values()]
        positions += source_positions(reader, "views").values()
        return set(positions) == {hold}

    return ready


@pytest.mark.parametrize(
    ("before", "after", "p1", "p2", "kinds"),
    [("memory", "disk", 2, 3, JOINS), ("disk", "memory", 3, 1, ("interval", "window"))],
)
def test_every_join_is_exact_through_a_savepoint_restored_at_another_parallelism(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    before: str,
    after: str,
    p1: int,
    p2: int,
    kinds: tuple[str, ...],
) -> None:
    left, right = _inputs(tmp_path, p1, seed=p1 * 10 + p2)
    hold = (FILES // p1 - 1) * PER_FILE + HALF
    endpoints = endpoints_of(monkeypatch)
    out1, out2 = tmp_path / "out1", tmp_path / "out2"

    env = _environment(tmp_path, p1, before, "1")
    join_job(env, left, right, out1, kinds, late=True, ttl="10 min")
    stop = StopWithSavepoint(tmp_path / "ck1", endpoints)
    listener = OnCheckpoint(tmp_path / "ck1", stop, _all_held(hold), hold=hold, releases=1000)
    first = testing.execute(
        env,
        launcher=ThreadLauncher(),
        listener=listener,
        hold_sources=SourceHold(records=hold, checkpoints=1000),
    )
    savepoint = stop.answer()
    assert isinstance(savepoint, str) and first.savepoints == [savepoint], savepoint

    env = _environment(tmp_path, p2, after, "2")
    join_job(env, left, right, out2, kinds, late=True, ttl="10 min")
    second = testing.execute(env, launcher=ThreadLauncher(), restore_from=savepoint)
    assert second.restarts == [] and second.restored_from == savepoint

    # what the stopped job read: the first `hold` records of each source subtask
    read = {
        r["id"] for side in (left, right) for s in range(p1) for r in side.read_by(s, p1)[:hold]
    }
    assert not read & {r["id"] for r in (*left.late, *right.late)}
    final = second.checkpoints[-1]
    assert final.final
    for kind in kinds:
        one, two = published(out1 / kind), published(out2 / kind)
        assert_once(kind, one + two, answer(kind, left.records, right.records))
        # the premise: the stop came part-way, with state that the restored job finished
        assert one and two, kind
        assert any(read & set(result(kind, row)) for row in two), f"{kind}: nothing carried over"
        for side, records in (("left", left.late), ("right", right.late)):
            late = published(out1 / f"{kind}-late-{side}") + published(out2 / f"{kind}-late-{side}")
            assert sorted(r["id"] for r in late) == sorted(r["id"] for r in records), (kind, side)
        assert final.event_time()[kind]["late"] == len(left.late) + len(right.late), kind
    if "interval" in kinds:  # outer rows of records read before the stop, emitted after it
        pairs = [result("interval", row) for row in published(out2 / "interval")]
        assert any(None in pair and read & set(pair) for pair in pairs)
