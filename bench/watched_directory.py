"""How soon a watched directory's new file is read: cutline and Spark Structured Streaming side
by side (issue 25: "a watched directory picks a new file up within its interval plus the time
to read it").

    .venv/bin/python bench/watched_directory.py [--files 30] [--every 0.3] [--interval 0.1]
        [--out bench/results/watched_directory.json]

A feeder puts ``--files`` JSON-lines files of 1,000 records into a directory, one every
``--every`` seconds (written under a hidden name, then renamed into place: the moment of the
rename is the file's *arrival*). Each system watches the directory at ``--interval``:

* **cutline**: ``read_jsonl(dir, monitor=interval)``, parallelism 2, checkpoints every
  second; a ``map_batches`` stamps each batch with the wall clock as it is processed;
* **spark structured streaming**: ``readStream.json(dir)``, every new file per micro-batch
  (no ``maxFilesPerTrigger``), ``foreachBatch`` stamping each batch as it runs (after
  collecting it); twice: ``trigger(processingTime=interval)``, and the default trigger (the
  next micro-batch as soon as the last one ended, listing the directory each time): the
  best of the two is Spark's figure.

A file's **pickup** is from its arrival to the first stamp of a record of it. Figures: p50,
p99 and max over the files, per system. A run counts only if every record of every file came
out (cutline: exactly once).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

ROWS = 1_000


def put(folder: Path, number: int) -> float:
    """File ``number``, written whole under a hidden name, then renamed: the rename's time."""
    hidden = folder / f".part-{number:04d}.jsonl.tmp"
    hidden.write_text("".join(json.dumps({"file": number, "row": i}) + "\n" for i in range(ROWS)))
    os.rename(hidden, folder / f"part-{number:04d}.jsonl")
    return time.time()


def feed(folder: Path, files: int, every: float, arrivals: dict[int, float]) -> None:
    for number in range(files):
        arrivals[number] = put(folder, number)
        time.sleep(every)


def figures(arrivals: dict[int, float], stamps: dict[int, float]) -> dict[str, Any]:
    pickups = sorted(stamps[f] - arrivals[f] for f in arrivals if f in stamps)
    if not pickups:
        return {}
    return {
        "p50_s": statistics.median(pickups),
        "p99_s": pickups[min(len(pickups) - 1, int(0.99 * len(pickups)))],
        "max_s": pickups[-1],
        "files": len(pickups),
    }


class Stamp:
    """``map_batches``: the batch's files, stamped with the wall clock, appended to a file."""

    __name__ = "stamp"

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        now = time.time()
        seen = batch.column("file").to_pylist()
        with open(self.path, "a") as out:
            out.write(json.dumps({"at": now, "files": sorted(set(seen)), "rows": len(seen)}) + "\n")
        return batch


def run_cutline(work: Path, files: int, every: float, interval: float) -> dict[str, Any]:
    from cutline import JobClient, StreamEnvironment

    folder, stamps_file = work / "in", work / "stamps.jsonl"
    folder.mkdir(parents=True)
    env = StreamEnvironment(2, checkpoint_interval="1s", checkpoint_dir=str(work / "ck"))
    env.read_jsonl(
        folder, monitor=interval, schema={"file": "int64", "row": "int64"}, name="landing"
    ).map_batches(Stamp(str(stamps_file)), name="stamp").sink_to(lambda batch: None, name="end")
    arrivals: dict[int, float] = {}
    feeder = threading.Thread(target=feed, args=(folder, files, every, arrivals), daemon=True)

    def stop_when_read() -> None:
        feeder.join()
        while True:  # until every record came out (then a stop with a savepoint ends the job)
            time.sleep(0.05)
            rows = _rows(stamps_file)
            if rows >= files * ROWS:
                break
        JobClient(str(work / "ck")).savepoint(stop=True)

    started: list[int] = []

    def listener(kind: str, message: str) -> None:
        if kind == "running" and not started:
            started.append(1)
            feeder.start()
            threading.Thread(target=stop_when_read, daemon=True).start()

    env.execute(listener=listener, progress=False)
    stamps, rows = _first_stamps(stamps_file)
    return {"figures": figures(arrivals, stamps), "verified": rows == files * ROWS}


def run_spark(
    spark: Any, work: Path, files: int, every: float, interval: float | None
) -> dict[str, Any]:
    folder = work / "in"
    folder.mkdir(parents=True)
    arrivals: dict[int, float] = {}
    stamps: dict[int, float] = {}
    rows = [0]

    def each(df: Any, _: int) -> None:
        seen = [r["file"] for r in df.select("file").collect()]
        now = time.time()
        rows[0] += len(seen)
        for f in set(seen):
            stamps.setdefault(f, now)

    writer = (
        spark.readStream.schema("file LONG, row LONG")
        .json(str(folder))
        .writeStream.foreachBatch(each)
        .option("checkpointLocation", str(work / "ck"))
    )
    if interval is not None:
        writer = writer.trigger(processingTime=f"{int(interval * 1000)} milliseconds")
    query = writer.start()
    try:
        feed(folder, files, every, arrivals)
        deadline = time.monotonic() + 120
        while rows[0] < files * ROWS and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        query.stop()
    return {"figures": figures(arrivals, stamps), "verified": rows[0] == files * ROWS}


def _rows(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(json.loads(line)["rows"] for line in path.read_text().splitlines() if line)


def _first_stamps(path: Path) -> tuple[dict[int, float], int]:
    stamps: dict[int, float] = {}
    rows = 0
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        rows += entry["rows"]
        for f in entry["files"]:
            stamps[f] = min(stamps.get(f, entry["at"]), entry["at"])
    return stamps, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=30)
    parser.add_argument("--every", type=float, default=0.3)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--out", type=Path, default=Path("bench/results/watched_directory.json"))
    args = parser.parse_args()
    from cutline.spark.launcher import local_session

    spark = local_session(2)
    results = []
    systems = {
        "cutline": f"read_jsonl(monitor={args.interval}s)",
        "spark structured streaming": f"trigger(processingTime={args.interval}s)",
        "spark structured streaming, default trigger": "the next micro-batch at once",
    }
    for system, setting in systems.items():
        work = Path(tempfile.mkdtemp(prefix="cutline-watched-"))
        try:
            if system == "cutline":
                result = run_cutline(work, args.files, args.every, args.interval)
            else:
                interval = None if "default" in system else args.interval
                result = run_spark(spark, work, args.files, args.every, interval)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        result.update(system=system, setting=setting)
        results.append(result)
        print(system, json.dumps(result))
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "watched directory: from a file's rename to its first record out",
                "parameters": {
                    "files": args.files,
                    "rows_per_file": ROWS,
                    "every_s": args.every,
                    "interval_s": args.interval,
                    "parallelism": 2,
                },
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                "results": results,
            },
            indent=1,
        )
    )
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
