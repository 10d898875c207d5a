"""Stop a job with a savepoint and resume it at another parallelism, exactly once.

Run it with ``python -m cutline.examples.rescale [WORKDIR]`` (local Spark). It

1. starts a keyed running count over 200,000 events at parallelism 2 and, once the first
   checkpoint is complete, asks for a savepoint and stops (as ``cutline savepoint DIR
   --cancel`` would from another terminal);
2. resumes from the savepoint at parallelism 4: keyed state is redistributed by key group,
   the source's offsets by split, and the sink publishes what the first run pre-committed;
3. checks that the two runs' output together has every event's running count exactly once.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

from cutline.api import JobClient, JobClientError, StreamEnvironment
from cutline.spark.launcher import local_session

EVENTS = 200_000
KEYS = 1_000


def with_key(record: dict[str, int]) -> dict[str, int]:
    return {"key": record["value"] % KEYS, "one": 1}


def slowly(batch: Any) -> Any:
    time.sleep(0.01)  # so that the first run is still going when the savepoint is asked for
    return batch


def job(parallelism: int, workdir: Path, out: str, *, pace: bool) -> StreamEnvironment:
    env = StreamEnvironment(
        parallelism,
        checkpoint_interval="500ms",
        checkpoint_dir=workdir / f"checkpoints-{parallelism}",
        batch_size=1_000,
    )
    stream = env.from_sequence(0, EVENTS, name="events")
    if pace:
        stream = stream.map_batches(slowly, name="pace")
    (
        stream.map(with_key, name="with_key")
        .key_by("key")
        .sum("one", name="counts")  # named: the savepoint's state is found by these names
        .write_parquet(workdir / out, name="out")
    )
    return env


def stop_with_savepoint(checkpoint_dir: Path, ready: threading.Event, answer: list[str]) -> None:
    ready.wait()
    while True:
        try:
            answer.append(JobClient(str(checkpoint_dir)).savepoint(stop=True))
            return
        except JobClientError as exc:
            if "no job is running" not in str(exc):
                raise
            time.sleep(0.1)


def main(workdir: Path) -> bool:
    spark = local_session(4)  # room for the second run's 4 subtasks
    ready, answer = threading.Event(), list[str]()
    asker = threading.Thread(
        target=stop_with_savepoint, args=(workdir / "checkpoints-2", ready, answer), daemon=True
    )
    asker.start()
    first = job(2, workdir, "out-1", pace=True).execute(
        spark, listener=lambda kind, message: ready.set() if kind == "checkpoint" else None
    )
    asker.join()
    print(f"run 1 (parallelism 2) stopped with savepoint {answer[0]}")
    print(f"  checkpoints: {len(first.checkpoints)}, savepoints: {first.savepoints}")
    second = job(4, workdir, "out-2", pace=False).execute(spark, restore_from=answer[0])
    print(f"run 2 (parallelism 4) restored {second.restored_from} and ran to the end")
    rows = []
    for out in ("out-1", "out-2"):
        rows += ds.dataset(str(workdir / out), format="parquet").to_table().to_pylist()
    expected = Counter((k, i) for k in range(KEYS) for i in range(1, EVENTS // KEYS + 1))
    exact = Counter((r["key"], r["one"]) for r in rows) == expected
    print(f"{len(rows):,} running counts published; exactly once: {exact}")
    return exact


if __name__ == "__main__":
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="rescale-"))
    sys.exit(0 if main(folder) else 1)
