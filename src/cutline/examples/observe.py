"""Look inside a job's checkpoints: statistics, verification, state as a DataFrame, a report.

Runs a keyed job on local Spark with unaligned checkpoints every 0.3 s and a slow operator
behind a shuffle (so barriers overtake queued records and checkpoints hold records in
flight), fails it once part-way (it restarts from the latest checkpoint), and then answers
"what is in checkpoint N, why was it slow, and is it consistent?" with the tools::

    python -m cutline.examples.observe [WORKDIR] [--images DIR]

It prints the commands to run next (``cutline checkpoints list/show/verify/diff``,
``cutline report``), reads the keyed state of the newest checkpoint as a Spark DataFrame and
checks it against the output the exactly-once sink published up to that checkpoint, and
writes ``WORKDIR/report.html``. ``--images DIR`` also saves the report's two figures as PNG
(the pictures of the documentation's observability page).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from cutline import Checkpoints, FixedDelay, StreamEnvironment
from cutline.report import checkpoint_figure, history_figure, write_report
from cutline.runtime.checkpoint.storage import CheckpointStorage
from cutline.runtime.checkpoint.verify import verify_checkpoint
from cutline.spark.datasource import read_state
from cutline.spark.launcher import local_session

KEYS = 1_000
RECORDS = 600_000


class SlowOnce:
    """Key a record by ``value % KEYS``; a little slow (so the shuffle backs up), and failing
    once at record ``fail_at`` (a marker file remembers it already did)."""

    __name__ = "to_key"

    def __init__(self, marker: str, fail_at: int) -> None:
        self.marker, self.fail_at = marker, fail_at

    def __call__(self, record: dict[str, int]) -> dict[str, int]:
        value = record["value"]
        if value == self.fail_at and not Path(self.marker).exists():
            Path(self.marker).write_text("failed once")
            raise RuntimeError(f"injected failure at record {value}")
        return {"key": value % KEYS, "value": 1}


def slow_count(batch: Any) -> Any:
    """Pass the batch on after a pause: the downstream end of the backpressure."""
    time.sleep(0.004)
    return batch


def run(workdir: Path, spark: Any = None, records: int = RECORDS) -> Any:
    """Run the job in ``workdir`` (emptied first, then ``ck/`` and ``output/`` in it); return
    its ``JobResult``."""
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    checkpoints = workdir / "ck"
    env = StreamEnvironment(
        parallelism=2,
        checkpoints=Checkpoints(
            interval="0.3s", dir=str(checkpoints), mode="unaligned", retained=5
        ),
        batch_size=2_000,
        buffer_capacity=2,
        restart_strategy=FixedDelay(delay=0.2),
    )
    (
        env.from_sequence(0, records, name="events")
        .map(SlowOnce(str(workdir / "failed-once"), records // 3), name="to_key")
        .key_by("key")
        .map_batches(slow_count, name="slow")
        .key_by("key")
        .sum("value", name="counts")
        .write_jsonl(str(workdir / "output"), name="sink")
    )
    return env.execute(spark)


def published_counts(output: Path) -> dict[int, int]:
    """The last count per key the sink published (its output is the running counts)."""
    counts: Counter[int] = Counter()
    for part in sorted(output.glob("*.jsonl")):
        for line in part.read_text().splitlines():
            record = json.loads(line)
            counts[record["key"]] = max(counts[record["key"]], record["value"])
    return dict(counts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workdir", nargs="?", default="demo-output/observe")
    parser.add_argument("--images", help="also save the report's figures as PNG here")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir)
    spark = local_session(2)
    result = run(workdir, spark)
    checkpoints = workdir / "ck"
    storage = CheckpointStorage(str(checkpoints))
    latest = storage.completed_ids()[-1]
    print(
        f"{len(result.checkpoints)} checkpoints complete, {len(result.aborted)} aborted, "
        f"{len(result.restarts)} restart(s); in flight at the slowest: "
        f"{max(result.checkpoints, key=lambda c: c.duration).channel_state_records} records"
    )

    # is the newest checkpoint consistent? (the driver checked it too, before completing it)
    verification = verify_checkpoint(storage.location(latest), latest)
    print(verification.summary())
    # what is in it: the counts per key, as a Spark DataFrame, equal to the sink's output
    state = {row.key: row.value for row in read_state(spark, str(checkpoints), "counts").collect()}
    exact = state == published_counts(workdir / "output")
    print(
        f"read_state: {len(state)} keys in checkpoint {latest}, "
        + ("equal to" if exact else "NOT equal to")
        + " the last count per key the sink published"
    )
    report = write_report(str(checkpoints), workdir / "report.html")
    print(f"report: {report}")
    if args.images:
        images = Path(args.images)
        images.mkdir(parents=True, exist_ok=True)
        history = storage.read_history()
        history_figure(history).savefig(images / "report-history.png", dpi=72)
        slowest = max((c for c in history.checkpoints if c.completed), key=lambda c: c.duration)
        checkpoint_figure(slowest, history.run(slowest.run)).savefig(
            images / "report-barriers.png", dpi=72
        )
        print(f"figures: {images}/report-history.png, {images}/report-barriers.png")
    print(
        "next:\n"
        f"  cutline checkpoints list {checkpoints}\n"
        f"  cutline checkpoints show {checkpoints} latest\n"
        f"  cutline checkpoints verify {checkpoints}\n"
        f"  cutline checkpoints diff {checkpoints} {storage.completed_ids()[0]} {latest}\n"
        f"  cutline report {checkpoints} -o report.html"
    )
    return 0 if exact and verification.ok else 1


if __name__ == "__main__":
    sys.exit(main())
