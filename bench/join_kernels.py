"""The window join's and the as-of join's kernels alone (no runtime, one subtask): rows per
second through ``add`` and ``advance``.

    .venv/bin/python bench/join_kernels.py [--rows 1000000] [--keys 10000] [--batch 10000]

Input: ``--rows`` rows a side (int64 key of ``--keys``, an int64 id, a float), 10 000 rows a
second of event time a side, times up to 200 ms out of order; batches of ``--batch`` rows of
each side in turn, the watermark 250 ms behind the latest time after each pair. Joins:
tumbling 1 s, sliding 2 s every 1 s, sessions with a gap of 100 ms (all ``how="full"``),
and the as-of join (``how="left"``). Each result's count is checked against a plain NumPy
computation of the same join. The as-of join's search is also timed against
``pyarrow.Table.join_asof`` on the same rows (one call, all rows at once).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from cutline.protocol.watermarks import MAX_WATERMARK
from cutline.runtime.eventtime.assigners import Session, Sliding, Tumbling
from cutline.runtime.joins.asof import AsofJoin
from cutline.runtime.joins.output import JoinLayout, Side
from cutline.runtime.joins.window import WindowJoin

RATE = 10  # rows per ms of event time, a side
DELAY = 200
LAG = 250


def sides(
    rows: int, keys: int, seed: int = 1
) -> list[tuple[np.ndarray, np.ndarray, pa.RecordBatch]]:
    """Per side: times, keys and the rows as one batch."""
    rng = np.random.default_rng(seed)
    out = []
    for side in Side:
        times = np.arange(rows, dtype=np.int64) // RATE + rng.integers(-DELAY, DELAY, rows) // 2
        key = rng.integers(0, keys, rows).astype(np.int64)
        ids = np.arange(rows, dtype=np.int64) + side * rows
        names = ("k", "lid", "x") if side is Side.LEFT else ("rk", "rid", "y")
        batch = pa.record_batch([key, ids, rng.random(rows)], names=list(names))
        out.append((times, key, batch))
    return out


def drive(kernel: Any, data: list[Any], batch: int) -> tuple[float, int]:
    """Seconds to feed both sides in batches and advance the watermark after each pair (and
    to the end); the result rows."""
    rows = len(data[0][0])
    results = 0
    start = time.perf_counter()
    for at in range(0, rows, batch):
        latest = 0
        for side in Side:
            times, key, rows_ = data[side]
            part = slice(at, at + batch)
            kernel.add(side, rows_.slice(at, batch), times[part], key[part] % 128)
            latest = max(latest, int(times[part].max()))
        out = kernel.advance(latest - LAG)
        results += 0 if out is None else out.num_rows
    out = kernel.advance(MAX_WATERMARK)
    results += 0 if out is None else out.num_rows
    return time.perf_counter() - start, results


def expected_windows(data: list[Any], starts_of: Callable[[np.ndarray], list[np.ndarray]]) -> int:
    """Pairs and lonely rows of a full window join of tumbling or sliding windows (each row's
    window starts: ``starts_of`` its times), counted."""
    groups = []
    for times, key, _ in data:
        groups.append(np.concatenate([starts * 1_000_003 + key for starts in starts_of(times)]))
    values, left_counts = np.unique(groups[0], return_counts=True)
    right_values, right_counts = np.unique(groups[1], return_counts=True)
    _, li, ri = np.intersect1d(values, right_values, return_indices=True)
    pairs = int((left_counts[li] * right_counts[ri]).sum())
    lonely = int(left_counts.sum() - left_counts[li].sum())
    lonely += int(right_counts.sum() - right_counts[ri].sum())
    return pairs + lonely


def expected_sessions(data: list[Any], gap: int) -> int:
    """Pairs and lonely rows of a full join of the sessions of both sides' rows per key,
    counted (here no session fires before its last row came: the watermark lags more than
    the rows are out of order, and a gap's more)."""
    times = np.concatenate([data[0][0], data[1][0]])
    keys = np.concatenate([data[0][1], data[1][1]])
    left = np.r_[np.ones(len(data[0][0]), bool), np.zeros(len(data[1][0]), bool)]
    order = np.lexsort((times, keys))
    times, keys, left = times[order], keys[order], left[order]
    new = np.r_[True, (keys[1:] != keys[:-1]) | (times[1:] - times[:-1] > gap)]
    session = np.cumsum(new) - 1
    lefts = np.bincount(session, weights=left).astype(np.int64)
    rights = np.bincount(session, weights=~left).astype(np.int64)
    both = (lefts > 0) & (rights > 0)
    return int((lefts * rights)[both].sum() + lefts[~both].sum() + rights[~both].sum())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--search-rows", type=int, default=100_000)
    args = parser.parse_args()
    data = sides(args.rows, args.keys)
    windowed = JoinLayout(("k",), ("rk",), windows=True)
    plain = JoinLayout(("k",), ("rk",))
    runs: dict[str, tuple[Callable[[], Any], int | None]] = {
        "window tumbling 1s": (
            lambda: WindowJoin(windowed, Tumbling("1s"), "full"),
            expected_windows(data, lambda t: [t - t % 1000]),
        ),
        "window sliding 2s/1s": (
            lambda: WindowJoin(windowed, Sliding("2s", every="1s"), "full"),
            expected_windows(data, lambda t: [t - t % 1000, t - t % 1000 - 1000]),
        ),
        "window session 100ms": (
            lambda: WindowJoin(windowed, Session(gap="100ms"), "full"),
            expected_sessions(data, 100),
        ),
        "as-of left": (lambda: AsofJoin(plain, "left"), args.rows),
    }
    for name, (make, expected) in runs.items():
        seconds, results = math.inf, 0
        for _ in range(args.repeats):
            took, results = drive(make(), data, args.batch)
            seconds = min(seconds, took)
            if expected is not None:
                assert results == expected, (name, results, expected)
        print(
            f"{name:24} {2 * args.rows / seconds / 1e6:6.2f} M rows/s "
            f"({2 * args.rows:,} rows in {seconds:.2f} s; {results:,} results"
            f"{', checked' if expected is not None else ''})"
        )
    search(sides(args.search_rows, args.keys))


def search(data: list[Any]) -> None:
    """The as-of search alone, all rows at once: the kernel's (codes, sort, searchsorted)
    against ``pyarrow.Table.join_asof`` (which wants both sides sorted by time)."""
    (lt, lk, lb), (rt, rk, rb) = data
    lt, rt = lt + 1_000, rt + 1_000  # (join_asof refuses times before 1970: "out of order")
    left = pa.table({"t": lt, "k": lk, "lid": lb.column(1)}).sort_by("t").combine_chunks()
    right = pa.table({"t": rt, "k": rk, "rid": rb.column(1)}).sort_by("t").combine_chunks()
    start = time.perf_counter()
    arrow = left.join_asof(right, on="t", by="k", tolerance=-(2**40))
    arrow_s = time.perf_counter() - start
    join = AsofJoin(JoinLayout(("k",), ("rk",)), "left")
    join.add(Side.RIGHT, pa.record_batch([rk, rb.column(1)], names=["rk", "rid"]), rt, rk)
    join.add(Side.LEFT, pa.record_batch([lk, lb.column(1)], names=["k", "lid"]), lt, lk)
    start = time.perf_counter()
    ours = join.advance(MAX_WATERMARK)
    ours_s = time.perf_counter() - start
    assert ours is not None
    found = dict(zip(ours.column("lid").to_pylist(), ours.column("rid").to_pylist(), strict=True))
    theirs = dict(
        zip(arrow.column("lid").to_pylist(), arrow.column("rid").to_pylist(), strict=True)
    )
    differ = sum(found[i] != theirs[i] for i in found)
    print(
        f"as-of search, {len(lt):,} left rows against {len(rt):,} versions at once: kernel "
        f"{ours_s:.2f} s, pyarrow join_asof {arrow_s:.2f} s; answers differ for {differ:,} rows"
    )


if __name__ == "__main__":
    main()
