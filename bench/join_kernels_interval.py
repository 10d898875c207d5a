"""The interval and regular join kernels alone (``cutline.runtime.joins``; the window and
as-of kernels: ``bench/join_kernels.py``), on one core: rows a second through ``add`` and
``advance``, no operator, channels or checkpoints around them.

Input: ``--rows`` rows a side (default 10^6) over ``--keys`` keys (default 10^4, uniform),
one row a millisecond a side, each time disordered by up to 1 s, in batches of ``--batch``
rows a side; after each pair of batches the watermark advances to 1 s behind the batches'
start. The joins:

* ``interval``: ``between=(-10 s, 0)``, ``how=inner`` and ``how=full``, on an integer key
  and on the same keys as strings;
* ``regular_ttl``: the regular join with ``ttl`` 10 s;
* ``regular``: the regular join kept for ever, the right side one row per key (a dimension
  table, as Nexmark q3's persons), so its state grows with the input.

Every answer is checked against a plain computation (NumPy, sorted by key and time): the
number of pairs, and of unmatched rows of an outer join.

Each is run ``--repeats`` times (default 3) and the fastest run counts (the machine is shared).

Run: ``python bench/join_kernels_interval.py [--rows N] [--keys K] [--batch B] [--repeats R] [--out F]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from cutline.protocol.watermarks import MAX_WATERMARK
from cutline.runtime.joins.interval import IntervalJoin
from cutline.runtime.joins.output import JoinLayout, Side
from cutline.runtime.joins.regular import RegularJoin

LAYOUT = JoinLayout(("k",), ("k",))
LOWER, UPPER = -10_000, 0


def side_input(
    rows: int, keys: int, batch: int, seed: int, strings: bool
) -> list[tuple[pa.RecordBatch, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for first in range(0, rows, batch):
        n = min(batch, rows - first)
        times = np.arange(first, first + n, dtype=np.int64) + rng.integers(0, 1000, n)
        k = rng.integers(0, keys, n)
        key = pa.array(k.astype(str)) if strings else pa.array(k)
        out.append((pa.record_batch({"k": key, "t": times, "v": rng.random(n)}), times))
    return out


def drive(
    join: Any, left: list[tuple[pa.RecordBatch, np.ndarray]], right: list[Any], batch: int
) -> tuple[float, int, int]:
    """Seconds, result rows, and of them unmatched ones (a null ``v`` or ``v_right``)."""
    results = unmatched = 0

    def count(out: pa.RecordBatch | None) -> None:
        nonlocal results, unmatched
        if out is not None:
            results += out.num_rows
            unmatched += out.column("v").null_count + out.column("v_right").null_count

    started = time.perf_counter()
    for i in range(max(len(left), len(right))):
        for side, batches in ((Side.LEFT, left), (Side.RIGHT, right)):
            if i < len(batches):
                rows, times = batches[i]
                groups = np.zeros(rows.num_rows, np.int64)
                count(join.add(side, rows, times, groups))
        count(join.advance(i * batch - 1000))
    count(join.advance(MAX_WATERMARK))
    elapsed = time.perf_counter() - started
    assert join.kept() == {"left": 0, "right": 0}
    return elapsed, results, unmatched


def interval_answer(left: list[Any], right: list[Any]) -> tuple[int, int]:
    """Pairs, and rows of either side without a partner, by sorting: a plain computation."""

    def columns(batches: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        keys = np.concatenate([np.asarray(b.column("k").to_numpy(), str) for b, _ in batches])
        return np.unique(keys, return_inverse=True)[1], np.concatenate([t for _, t in batches])

    (lk, lt), (rk, rt) = columns(left), columns(right)
    span = int(max(lt.max(), rt.max())) + 2 * (UPPER - LOWER) + 2
    right_sorted = np.sort(rk * span + rt)
    start = np.searchsorted(right_sorted, lk * span + lt + LOWER, "left")
    partners = np.searchsorted(right_sorted, lk * span + lt + UPPER, "right") - start
    left_sorted = np.sort(lk * span + lt)
    lstart = np.searchsorted(left_sorted, rk * span + rt - UPPER, "left")
    right_partners = np.searchsorted(left_sorted, rk * span + rt - LOWER, "right") - lstart
    return int(partners.sum()), int((partners == 0).sum() + (right_partners == 0).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each; the best counts")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows, keys, batch = args.rows, args.keys, args.batch
    figures: dict[str, Any] = {
        "rows_a_side": rows,
        "keys": keys,
        "batch": batch,
        "machine": platform.platform(),
    }
    cases: list[tuple[str, bool, Callable[[], Any], str]] = [
        (
            "interval inner, int key",
            False,
            lambda: IntervalJoin(LAYOUT, "inner", LOWER, UPPER),
            "i",
        ),
        ("interval full, int key", False, lambda: IntervalJoin(LAYOUT, "full", LOWER, UPPER), "f"),
        ("interval inner, str key", True, lambda: IntervalJoin(LAYOUT, "inner", LOWER, UPPER), "i"),
        ("regular, ttl 10 s", False, lambda: RegularJoin(LAYOUT, 10_000), "r"),
    ]
    inputs = {
        strings: (
            side_input(rows, keys, batch, 1, strings),
            side_input(rows, keys, batch, 2, strings),
        )
        for strings in (False, True)
    }
    answer = interval_answer(*inputs[False])
    for name, strings, make, kind in cases:
        left, right = inputs[strings]
        runs = [drive(make(), left, right, batch) for _ in range(args.repeats)]
        elapsed, results, unmatched = min(runs)
        if kind == "i":
            assert (results, unmatched) == (answer[0], 0), (results, answer)
        elif kind == "f":
            assert (results - unmatched, unmatched) == answer, (results, unmatched, answer)
        figures[name] = {"rows_per_s": round(2 * rows / elapsed), "results": results}
        print(
            f"{name}: {2 * rows / elapsed / 1e6:.2f} M rows/s ({elapsed:.2f} s), {results} results"
        )
    # a regular join kept for ever: each left row with its key's one right row
    dimension = []
    for first in range(0, keys * 10, batch):
        k = np.arange(first, min(first + batch, keys * 10))
        zeros = np.zeros(len(k), np.int64)
        dimension.append((pa.record_batch({"k": k, "t": zeros, "v": zeros * 1.0}), zeros))
    facts = side_input(rows, keys * 10, batch, 3, False)
    elapsed, results, _ = min(
        drive(RegularJoin(LAYOUT), facts, dimension, batch) for _ in range(args.repeats)
    )
    assert results == rows, results
    name = f"regular for ever, {keys * 10} right rows kept"
    figures[name] = {"rows_per_s": round((rows + keys * 10) / elapsed), "results": results}
    print(f"{name}: {(rows + keys * 10) / elapsed / 1e6:.2f} M rows/s ({elapsed:.2f} s)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
