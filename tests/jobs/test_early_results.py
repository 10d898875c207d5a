"""``window(..., early=)`` in a whole job: however many early results a run gives (that
depends on how fast the machine is: none is promised), each window's last result is final and
exact, and every early one came before it and counted no more."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from cutline import StreamEnvironment, Tumbling
from cutline.runtime.task.local import ThreadLauncher

START = dt.datetime(2024, 5, 1, 12, tzinfo=dt.UTC)


def test_each_window_ends_with_its_final_exact_result(tmp_path: Path) -> None:
    rows = [
        {"user": f"u{i % 4}", "ts": START + dt.timedelta(seconds=(i * 11) % 600)}
        for i in range(2000)
    ]
    (tmp_path / "in").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in" / "clicks.parquet")
    env = StreamEnvironment(
        2, checkpoint_dir=str(tmp_path / "ck"), checkpoint_interval=0.05, batch_size=20
    )
    clicks = env.read_parquet(
        tmp_path / "in", event_time="ts", max_out_of_orderness="10 min", rate_limit=20_000
    )
    clicks.key_by("user").window(Tumbling("1 min"), early="20ms").count().collect()
    result = env.execute(launcher=ThreadLauncher())
    wanted = Counter((r["user"], r["ts"].replace(second=0)) for r in rows)
    last: dict[tuple[str, dt.datetime], dict] = {}
    for record in result.output:
        window = (record["user"], record["window_start"])
        assert window not in last or not last[window]["final"], "nothing after the final one"
        assert record["count"] <= wanted[window]
        last[window] = record
    assert {w: r["count"] for w, r in last.items()} == wanted
    assert all(r["final"] for r in last.values())
