"""B3w — window state (B3 of /work/shared/spec/BENCHMARKS.md for a window operator; issue 27).

Window state of 10^4, 10^5, 10^6 keys: every key has one open tumbling window
(``Tumbling("1 h")``, the built-in ``sum`` of an int column keyed by an int key column) in one
window operator subtask that owns all 128 key groups, opened as the runtime opens it
(``WindowLogic(...).open(ctx, state)``: the columnar layout on the ``memory`` backend, the keyed
layout on ``disk``), checkpointed to real files (a :class:`CheckpointStorage` in a temporary
directory: the backend's segments, and the subtask's state file holding the handle, as the
subtask's snapshot thread writes them).

One run of a configuration (backend, keys) drives two operators identically, one configured
``StateConfig(incremental=True, full_every=10)``, the other ``incremental=False``:

1. feed one record per key (Arrow batches of 65,536 rows, event times inside one window, the
   watermark an hour behind it: nothing fires), take checkpoint 1 (base None);
2. new records for 1% of the keys (a seeded random choice), in the same window: checkpoint 2
   (base 1);
3. records for 1% new keys, in the same window: checkpoint 3 (base 2);
4. restore each checkpoint into a fresh operator, fire its windows (a watermark far ahead) and
   compare what fires with the sums computed independently with NumPy, exactly.

Figures (see DEFINITIONS and bench/README.md): the synchronous and asynchronous parts of each
checkpoint, the bytes it adds, full / incremental at 1% churn, restore and fire times, records/s
while feeding. A figure counts only when its run was verified.

Run: ``python bench/b3_windows.py [--quick] [--sizes 10000,100000] [--repeats N] [--out F]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from rich.console import Console
from rich.table import Table

import b3_state as b3  # (bench/b3_state.py, beside this file: B3 of keyed state)
from cutline.runtime.checkpoint.layout import StateHandle
from cutline.runtime.checkpoint.state_file import SubtaskState
from cutline.runtime.checkpoint.storage import CheckpointStorage
from cutline.runtime.eventtime.aggregations import Aggregation
from cutline.runtime.eventtime.assigners import Tumbling
from cutline.runtime.eventtime.layouts import columnar_size
from cutline.runtime.eventtime.logic import WindowLogic
from cutline.runtime.eventtime.timestamps import TimeColumn
from cutline.runtime.operators import OperatorContext
from cutline.runtime.state.config import StateConfig

BACKENDS = ("memory", "disk", "disk-4MiB")
"""``disk-4MiB``: the disk backend with 4 MiB of state memory, so that the windows' runs are
written to files (spilled) beyond 2 MiB: window state larger than the memory it is given."""
SMALL_MEMORY = 4 * 1024 * 1024
FULL_SIZES = (10**4, 10**5, 10**6)
QUICK_SIZES = (10**4, 10**5)
DEFAULT_REPEATS = 3
BATCH_ROWS = 65_536
HOUR = 3_600_000
WINDOW_START = 1_700_000_000_000 // HOUR * HOUR
"""The one window every record is in: [WINDOW_START, WINDOW_START + 1 h)."""
BEHIND = WINDOW_START - HOUR
"""The watermark sent after every batch while feeding: nothing fires."""
FIRE_AT = WINDOW_START + 10 * HOUR
"""The watermark that fires the restored windows."""
NEW_KEYS = 0.01
"""Share of new keys (beside the N) added between checkpoint 2 and checkpoint 3."""
VALUES = (-1_000_000, 1_000_000)
"""Each record's value: a seeded random int in this range (end excluded)."""
UID, SUBTASK = "window", "window-0"
LOGIC = WindowLogic(
    Tumbling("1 h"), Aggregation("sum", "v"), "key", TimeColumn("ts", 0, pa.int64())
)

DEFINITIONS = {
    "sync_ms": "wall time of operator.snapshot(id, base=..., savepoint=False) alone: the "
    "synchronous part, which blocks the processing thread. c1: after feeding N keys (base None); "
    "c2: after 1% of them changed (base 1); c3: after 1% new keys (base 2). Headline figures "
    "'_full' and '_incremental' are c1 and c2 of the incremental=True operator.",
    "async_s": "wall time of snapshot.write(store, name) (merging, encoding, writing and fsyncing "
    "the segments) plus encoding and writing the subtask's state file, which holds the handle "
    "(CheckpointStorage.write_state): what the snapshot thread does ('write_s': the first alone).",
    "size_bytes": "bytes of every file the checkpoint added or changed under the checkpoint "
    "directory (chk-N and shared/, listed before and after): segments and the state file. "
    "'columnar_bytes': the part of the handle kept as columns (layouts.columnar_size: today the "
    "memory backend's windows, inside the state file).",
    "full_over_incremental": "size of checkpoint 2 (or 3) of the incremental=False operator / "
    "that of the incremental=True one, per run (the two are driven identically).",
    "restore_s": "wall time of reading the state file (size and digest checked), decoding it and "
    "opening a fresh operator on the handle (the backend restores its chain, the operator its "
    "windows and timers). 'chain': the incremental=True operator's c2; 'full': the other's.",
    "fire_s": "wall time of on_watermark(far ahead) on the restored operator: every window fires.",
    "records_per_s": "records / wall time of process(batch) and on_watermark(behind) over the "
    "batches (built beforehand): 'feed' the N keys (step 1), 'churn' the 1% (step 2).",
    "peak_rss_bytes": "VmHWM of /proc/self/status over the configuration's run (both operators, "
    "restores, checks), reset at its start; else ru_maxrss ('peak_rss_reset' false).",
    "verified": "true only if, in every run, each of the 3 checkpoints of both operators, "
    "restored into a fresh operator, fires exactly one window [start, start + 1 h) per key "
    "present with the sum NumPy computed; nothing fired while feeding; every segment file has "
    "the size its reference says; every checkpoint of the incremental=False operator, and c1 "
    "of the other, was full.",
}


# ----------------------------------------------------------------- workload


@dataclass
class Step:
    """Records fed between two checkpoints, as Arrow batches, and the sums expected after."""

    batches: list[pa.RecordBatch]
    records: int
    expected: np.ndarray
    """Per key 0..len-1, its window's sum after this step (every key present has records)."""


def workload(keys: int, seed: int, repeat: int) -> list[Step]:
    """The three steps of one repeat (the same for both backends and both operators)."""
    rng = np.random.default_rng([keys, seed, repeat])
    changed = max(1, round(keys * b3.CHURN))
    added = max(1, round(keys * NEW_KEYS))
    plan = [
        rng.permutation(keys),  # 1: every key once
        rng.choice(keys, changed, replace=False),  # 2: 1% of them again
        keys + rng.permutation(added),  # 3: 1% new keys
    ]
    steps, sums = [], np.zeros(0, dtype=np.int64)
    for who in plan:
        who = who.astype(np.int64)
        values = rng.integers(*VALUES, len(who), dtype=np.int64)
        times = WINDOW_START + rng.integers(0, HOUR, len(who), dtype=np.int64)
        sums = np.pad(sums, (0, max(0, int(who.max()) + 1 - len(sums))))  # (a new array)
        np.add.at(sums, who, values)
        table = pa.table({"key": who, "ts": times, "v": values})
        steps.append(Step(table.to_batches(max_chunksize=BATCH_ROWS), len(who), sums))
    return steps


def check_fired(fired: Any, expected: np.ndarray) -> list[str]:
    """What fired against the expected sums: one row per key 0..len-1, in the one window, with
    its sum exactly; the problems found (none: verified)."""
    if fired is None:
        return [f"nothing fired, expected {len(expected):,} windows"]
    table = fired if isinstance(fired, pa.RecordBatch) else pa.RecordBatch.from_pylist(fired)
    problems = []
    if table.num_rows != len(expected):
        problems.append(f"{table.num_rows:,} windows fired, expected {len(expected):,}")
    keys = np.asarray(table.column("key").to_numpy(zero_copy_only=False))
    sums = np.asarray(table.column("v").to_numpy(zero_copy_only=False))
    for name, value in (("window_start", WINDOW_START), ("window_end", WINDOW_START + HOUR)):
        column = np.asarray(table.column(name).to_numpy(zero_copy_only=False))
        if len(column) and not (column == value).all():
            problems.append(f"{int((column != value).sum()):,} windows with another {name}")
    order = np.argsort(keys, kind="stable")
    keys, sums = keys[order], sums[order]
    if len(keys) != len(expected) or not np.array_equal(keys, np.arange(len(expected))):
        problems.append(f"the keys fired are not 0..{len(expected) - 1}, once each")
        return problems
    wrong = np.flatnonzero(sums != expected)
    if len(wrong):
        first = int(wrong[0])
        problems.append(
            f"{len(wrong):,} sums wrong (key {first}: {sums[first]!r}, expected {expected[first]})"
        )
    return problems


# ----------------------------------------------------------------- one run


@dataclass
class Checkpoint:
    checkpoint_id: int
    sync_s: float
    write_s: float
    state_file_s: float
    size_bytes: int
    new_files: int
    segment_bytes: int
    state_file_bytes: int
    columnar_bytes: int
    full: bool | None
    chain_length: int
    restore_s: float = 0.0
    fire_s: float = 0.0

    @property
    def async_s(self) -> float:
        return self.write_s + self.state_file_s


@dataclass
class Variant:
    """One operator driven through checkpoints 1, 2 and 3, each restored and fired."""

    incremental: bool
    operator: str = ""
    process_s: list[float] = field(default_factory=list)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    spills: int = 0
    """Times the operator wrote its windows' runs to files while fed (the disk backend)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "incremental": self.incremental,
            "operator": self.operator,
            "spills": self.spills,
            "process_s": self.process_s,
            "checkpoints": [{**vars(c), "async_s": c.async_s} for c in self.checkpoints],
            "problems": self.problems,
        }


@dataclass
class Run:
    backend: str
    keys: int
    repeat: int
    records: list[int]
    incremental: Variant
    full: Variant
    peak_rss_bytes: int | None
    peak_rss_reset: bool
    rss_at_start_bytes: int | None
    wall_s: float

    @property
    def problems(self) -> list[str]:
        mine = [("incremental", self.incremental), ("non-incremental", self.full)]
        return [f"{name}: {p}" for name, v in mine for p in v.problems]

    def ratio(self, checkpoint: int) -> float:
        full = self.full.checkpoints[checkpoint - 1].size_bytes
        return full / max(1, self.incremental.checkpoints[checkpoint - 1].size_bytes)

    def rate(self, step: int) -> float:
        return self.records[step] / self.incremental.process_s[step]


def state_config(kind: str, incremental: bool, local_dir: Path) -> StateConfig:
    small = kind == "disk-4MiB"
    return StateConfig(
        backend="disk" if small else kind,
        incremental=incremental,
        full_every=b3.FULL_EVERY,
        local_dir=str(local_dir),
        **({"memory": SMALL_MEMORY} if small else {}),
    )


def context(config: StateConfig, storage: CheckpointStorage | None = None, n: int = 0) -> Any:
    """One subtask owning every key group; ``storage``: restoring checkpoint ``n`` from it."""
    where = (
        {} if storage is None else {"restore_store": storage.location(n), "restore_checkpoint": n}
    )
    # (name, subtask, parallelism, max_parallelism, generation)
    return OperatorContext(UID, 0, 1, b3.MAX_PARALLELISM, 1, uid=UID, state=config, **where)


def files_under(root: str) -> dict[str, tuple[int, int]]:
    """Every file under ``root``: relative path -> (size, modification time in ns)."""
    found = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            info = os.stat(path)
            found[os.path.relpath(path, root)] = (info.st_size, info.st_mtime_ns)
    return found


def feed(operator: Any, step: Step) -> tuple[float, list[str]]:
    """Process a step's batches (the watermark behind after each); its time; what fired."""
    problems = []
    gc.collect()
    start = time.perf_counter()
    for batch in step.batches:
        out = operator.process(batch)
        early = operator.on_watermark(BEHIND)
        if (out is not None and len(out)) or (early is not None and len(early)):
            problems.append("windows fired while feeding (the watermark is an hour behind)")
    return time.perf_counter() - start, problems[:1]


def checkpoint(
    operator: Any, storage: CheckpointStorage, checkpoint_id: int, base: int | None, label: str
) -> tuple[Checkpoint, StateHandle, list[str]]:
    """Take and write one checkpoint as the subtask does (segments, then its state file),
    timing its parts; the bytes of the files it added; its segments' sizes checked."""
    before = files_under(storage.root)
    gc.collect()
    start = time.perf_counter()
    snap = operator.snapshot(checkpoint_id, base=base, savepoint=False)
    taken = time.perf_counter()
    handle = snap.write(storage.segment_store(checkpoint_id), f"b3w-{label}-c{checkpoint_id}")
    written = time.perf_counter()
    state_handle = storage.write_state(
        checkpoint_id, SUBTASK, 1, SubtaskState({UID: handle}).encode()
    )
    done = time.perf_counter()
    after = files_under(storage.root)
    new = {path: at[0] for path, at in after.items() if before.get(path) != at}
    folder = Path(storage.checkpoint_path(checkpoint_id))
    chain, problems = list(handle.get("chain", ())), []
    for ref in chain:
        path = os.path.relpath(os.path.normpath(folder / ref["path"]), storage.root)
        on_disk = after.get(path, (None,))[0]
        if on_disk != ref["size"]:
            problems.append(
                f"checkpoint {checkpoint_id}: segment {ref['path']} has {on_disk} "
                f"bytes, its reference says {ref['size']}"
            )
    state_path = os.path.relpath(folder / state_handle.path, storage.root)
    figures = Checkpoint(
        checkpoint_id,
        sync_s=taken - start,
        write_s=written - taken,
        state_file_s=done - written,
        size_bytes=sum(new.values()),
        new_files=len(new),
        segment_bytes=sum(size for path, size in new.items() if path != state_path),
        state_file_bytes=after.get(state_path, (0,))[0],
        columnar_bytes=columnar_size(handle),
        full=snap.full,
        chain_length=len(chain),
    )
    return figures, state_handle, problems


def restore_and_fire(
    config: StateConfig,
    storage: CheckpointStorage,
    figures: Checkpoint,
    state_handle: StateHandle,
    expected: np.ndarray,
) -> list[str]:
    """Restore one checkpoint into a fresh operator, fire it, check what fired."""
    checkpoint_id = figures.checkpoint_id
    gc.collect()
    start = time.perf_counter()
    try:
        data = storage.read_state(checkpoint_id, state_handle)
        handle = SubtaskState.decode(data, SUBTASK).operators[UID]
        operator = LOGIC.open(context(config, storage, checkpoint_id), [handle])
    except Exception as exc:  # a failed restore is an unverified run, not a crash
        return [f"restore of checkpoint {checkpoint_id} failed: {type(exc).__name__}: {exc}"]
    figures.restore_s = time.perf_counter() - start
    try:
        gc.collect()
        opened = time.perf_counter()
        fired = operator.on_watermark(FIRE_AT)
        figures.fire_s = time.perf_counter() - opened
        problems = check_fired(fired, expected)
    except Exception as exc:
        problems = [f"firing failed: {type(exc).__name__}: {exc}"]
    finally:
        operator.close()
    return [f"checkpoint {checkpoint_id}: {p}" for p in problems]


def drive(
    kind: str, incremental: bool, steps: list[Step], root: Path, progress: Callable[[str], None]
) -> Variant:
    """One operator: feed, checkpoint 1; churn, checkpoint 2; new keys, checkpoint 3; then
    restore each checkpoint and fire it."""
    label = "incr" if incremental else "full"
    variant = Variant(incremental)
    storage = CheckpointStorage(str(root / f"checkpoints-{label}"))
    config = state_config(kind, incremental, root / "local")
    operator = LOGIC.open(context(config), None)
    variant.operator = f"WindowOperator({type(operator.store).__name__})"  # type: ignore[attr-defined]
    handles = []
    try:
        for number, step in enumerate(steps, start=1):
            elapsed, problems = feed(operator, step)
            variant.process_s.append(elapsed)
            variant.problems += problems
            figures, state_handle, problems = checkpoint(
                operator, storage, number, number - 1 or None, label
            )
            variant.checkpoints.append(figures)
            variant.problems += problems
            handles.append(state_handle)
        variant.spills = int(getattr(operator.store, "spills", 0))
    finally:
        operator.close()
        del operator
        gc.collect()
    for figures in variant.checkpoints:
        if figures.full is False and (not incremental or figures.checkpoint_id == 1):
            variant.problems.append(f"checkpoint {figures.checkpoint_id} was not full")
    for figures, state_handle, step in zip(variant.checkpoints, handles, steps, strict=True):
        variant.problems += restore_and_fire(config, storage, figures, state_handle, step.expected)
    c = variant.checkpoints
    progress(
        f"    {label} ({variant.operator}): feed {variant.process_s[0]:.2f}s; "
        + "; ".join(
            f"c{x.checkpoint_id} sync {x.sync_s * 1e3:.2f} ms, async {x.async_s:.3f}s, "
            f"{x.size_bytes:,} B, restore {x.restore_s:.2f}s, fire {x.fire_s:.2f}s"
            for x in c
        )
        + (": ok" if not variant.problems else ": " + "; ".join(variant.problems[:3]))
    )
    return variant


def run_once(
    kind: str, keys: int, repeat: int, seed: int, tmp_dir: Path, progress: Callable[[str], None]
) -> Run:
    """One configuration once: both operators (incremental and not) in a fresh directory."""
    gc.collect()
    rss_start = b3.rss_bytes("VmRSS")
    reset = b3.reset_peak_rss()
    started = time.perf_counter()
    steps = workload(keys, seed, repeat)
    root = Path(tempfile.mkdtemp(prefix="cutline-b3w-", dir=tmp_dir))
    variants: dict[bool, Variant] = {}
    try:
        for incremental in (True, False) if repeat % 2 == 0 else (False, True):
            variants[incremental] = drive(kind, incremental, steps, root, progress)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    records = [s.records for s in steps]
    del steps
    peak = b3.rss_bytes("VmHWM") if reset else None
    if peak is None:
        reset, peak = False, b3.ru_maxrss_bytes()
    wall = time.perf_counter() - started
    return Run(
        kind, keys, repeat, records, variants[True], variants[False], peak, reset, rss_start, wall
    )


# ----------------------------------------------------------------- output


def verified(runs: Sequence[Run]) -> bool:
    return all(not r.problems for r in runs)


def versions() -> dict[str, Any]:
    """What the window operators run on, and the last commit that changed src/."""
    command = ["git", "log", "-1", "--format=%H", "--", "src"]
    try:
        found = subprocess.run(
            command, cwd=b3.PROJECT_DIR, capture_output=True, text=True, check=True
        )
        src_commit: str | None = found.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        src_commit = None
    return {
        "name": "cutline window operators (WindowLogic.open on the keyed state backends, "
        "CheckpointStorage)",
        "src_last_commit": src_commit,
        "numpy_version": np.__version__,
        "pyarrow_version": pa.__version__,
        "rich_version": metadata.version("rich"),
    }


PARTS: dict[str, Callable[[Checkpoint], float]] = {
    "sync_ms": lambda c: c.sync_s * 1e3,
    "async_s": lambda c: c.async_s,
    "size_bytes": lambda c: c.size_bytes,
    "columnar_bytes": lambda c: c.columnar_bytes,
    "state_file_bytes": lambda c: c.state_file_bytes,
    "segment_bytes": lambda c: c.segment_bytes,
    "restore_s": lambda c: c.restore_s,
    "fire_s": lambda c: c.fire_s,
}


def of(variants: Sequence[Variant], number: int, part: str) -> dict[str, Any]:
    """``part`` of checkpoint ``number`` over the runs (median, min, max, each)."""
    return b3.spread([PARTS[part](v.checkpoints[number - 1]) for v in variants])


def record(
    kind: str, keys: int, runs: Sequence[Run], seed: int, system: dict[str, Any]
) -> dict[str, Any]:
    """The JSON object of one configuration (backend, keys)."""
    inc, full = [r.incremental for r in runs], [r.full for r in runs]
    figures: dict[str, Any] = {}
    for part in ("sync_ms", "async_s", "size_bytes"):
        figures[f"{part}_full"] = of(inc, 1, part)
        figures[f"{part}_incremental"] = of(inc, 2, part)
    figures |= {
        "size_bytes_full_at_checkpoint_2": of(full, 2, "size_bytes"),
        "full_over_incremental": b3.spread([r.ratio(2) for r in runs]),
        "full_over_incremental_at_checkpoint_3": b3.spread([r.ratio(3) for r in runs]),
        "restore_s_chain": of(inc, 2, "restore_s"),
        "restore_s_full": of(full, 2, "restore_s"),
        "records_per_s_feed": b3.spread([r.rate(0) for r in runs]),
        "records_per_s_churn": b3.spread([r.rate(1) for r in runs]),
        **{
            f"{name}_operator": {
                part: {f"c{n}": of(vs, n, part) for n in range(1, len(vs[0].checkpoints) + 1)}
                for part in PARTS
            }
            for name, vs in (("incremental", inc), ("non_incremental", full))
        },
        "peak_rss_bytes": b3.spread(
            [r.peak_rss_bytes for r in runs if r.peak_rss_bytes is not None]
        )
        if any(r.peak_rss_bytes is not None for r in runs)
        else None,
        "peak_rss_reset": all(r.peak_rss_reset for r in runs),
        "spills": b3.spread([r.incremental.spills for r in runs]),
    }
    ok = verified(runs)
    return {
        "name": "b3.window_state",
        "system": system,
        "parameters": {
            "backend": kind,
            "keys": keys,
            "operator": inc[0].operator,
            "window": "Tumbling('1 h'), sum of int64 'v' keyed by int64 'key', event time 'ts'",
            "window_start": WINDOW_START,
            "records": runs[0].records,
            "batch_rows": BATCH_ROWS,
            "churn": b3.CHURN,
            "new_keys": NEW_KEYS,
            "values": f"seeded random ints in [{VALUES[0]}, {VALUES[1]})",
            "max_parallelism": b3.MAX_PARALLELISM,
            "key_groups": [0, b3.MAX_PARALLELISM],
            "incremental_operator": {**vars(state_config(kind, True, Path("local")))},
            "non_incremental_operator": {**vars(state_config(kind, False, Path("local")))},
            "local_dir": "the run's temporary directory (--tmp-dir)/local",
            "checkpoints": "1: base None; 2: base 1 (1% of the keys changed); 3: base 2 (1% "
            "new keys)",
            "repeats": len(runs),
            "seed": seed,
        },
        "figures": figures,
        "verified": ok,
        "verification": {
            "verified": ok,
            "checked": "each checkpoint of both operators restored, fired, and every key's "
            "window and sum compared with NumPy's",
            "problems": [f"repeat {r.repeat}: {p}" for r in runs for p in r.problems][:20],
        },
        "runs": [
            {
                "repeat": r.repeat,
                "wall_s": r.wall_s,
                "peak_rss_bytes": r.peak_rss_bytes,
                "rss_at_start_bytes": r.rss_at_start_bytes,
                "full_over_incremental": r.ratio(2),
                "incremental_operator": r.incremental.to_dict(),
                "non_incremental_operator": r.full.to_dict(),
            }
            for r in runs
        ],
    }


def rate(value: float) -> str:
    return f"{value / 1e6:.2f} M" if value >= 1e6 else f"{value / 1e3:.0f} k"


MAIN_TITLE = (
    "B3w window state: one open Tumbling('1 h') sum window per key. c1: checkpoint 1 after "
    "feeding the keys; c2: checkpoint 2 after 1% of them changed (incr: the operator configured "
    "incremental=True; full: incremental=False). Size: bytes of the files new with the "
    "checkpoint (in handle: of which the windows kept as columns in the state file). Times: "
    "median, and min-max over the runs; sizes, ratio: median."
)
MAIN_COLUMNS = (
    "backend|keys\n(runs)|sync ms\nc1|sync ms\nc2 incr|async s\nc1|async s\nc2 incr|size\nc2 full"
    "|size\nc2 incr|in handle\nc2 incr|ratio\nfull/incr|restore s\nc2 incr|restore s\nc2 full"
    "|verified"
)
SIDE_COLUMNS = (
    "backend|keys\n(runs)|operator|feed\nrecords/s|churn\nrecords/s|size\nc1|size\nc3 incr"
    "|ratio c3\nfull/incr|fire s\nc2 incr|sync ms\nc2 full|async s\nc2 full|peak RSS"
)


def times(vs: list[Variant], n: int, part: str) -> str:
    return b3.cell(
        [PARTS[part](v.checkpoints[n - 1]) for v in vs], b3.ms if "ms" in part else b3.secs
    )


def size(vs: list[Variant], n: int, part: str = "size_bytes") -> str:
    return b3.fmt_bytes(statistics.median(PARTS[part](v.checkpoints[n - 1]) for v in vs))


def ratio(runs: list[Run], n: int) -> str:
    return f"{statistics.median(r.ratio(n) for r in runs):.1f}x"


def tables(results: Iterable[tuple[str, int, list[Run]]]) -> tuple[Table, Table]:
    main = b3.new_table(MAIN_TITLE, MAIN_COLUMNS.split("|"))
    side = b3.new_table(
        "B3w feeding, firing, and checkpoint 3 (after 1% new keys): median, and min-max.",
        SIDE_COLUMNS.split("|"),
    )
    for kind, keys, runs in results:
        inc, full = [r.incremental for r in runs], [r.full for r in runs]
        label = f"{keys:,}\n({len(runs)})"
        ok = "[green]yes[/]" if verified(runs) else "[red]NO[/]"
        main.add_row(
            *(kind, label, times(inc, 1, "sync_ms"), times(inc, 2, "sync_ms")),
            *(times(inc, 1, "async_s"), times(inc, 2, "async_s"), size(full, 2), size(inc, 2)),
            *(size(inc, 2, "columnar_bytes"), ratio(runs, 2), times(inc, 2, "restore_s")),
            *(times(full, 2, "restore_s"), ok),
        )
        peaks = [r.peak_rss_bytes for r in runs if r.peak_rss_bytes is not None]
        side.add_row(
            *(kind, label, inc[0].operator, b3.cell([r.rate(0) for r in runs], rate)),
            *(b3.cell([r.rate(1) for r in runs], rate), size(inc, 1), size(inc, 3), ratio(runs, 3)),
            *(times(inc, 2, "fire_s"), times(full, 2, "sync_ms"), times(full, 2, "async_s")),
            b3.fmt_bytes(statistics.median(peaks)) if peaks else "-",
        )
    return main, side


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--quick", action="store_true", help="10^4 and 10^5 keys, 1 run each")
    add("--sizes", type=b3.parse_sizes, help="numbers of keys, comma-separated (1e6 is accepted)")
    add("--repeats", type=int, help=f"runs per configuration ({DEFAULT_REPEATS}; --quick: 1)")
    add(
        "--backends",
        default=",".join(BACKENDS),
        help="comma-separated: memory, disk, disk-4MiB (all)",
    )
    add("--seed", type=int, default=1)
    add(
        "--tmp-dir",
        type=Path,
        default=Path(tempfile.gettempdir()),
        help="where the checkpoint directories and the disk backend's databases go (a local "
        "disk; default the system's temporary directory)",
    )
    add("--out", type=Path, help="JSON output (bench/results/b3_windows[-quick].json)")
    args = parser.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be at least 1")
    kinds = tuple(k.strip() for k in args.backends.split(",") if k.strip())
    if not kinds or any(k not in BACKENDS for k in kinds):
        parser.error(f"--backends: choose among {', '.join(BACKENDS)}")
    sizes = args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
    name = "b3_windows-quick.json" if args.quick else "b3_windows.json"
    out = args.out or b3.BENCH_DIR / "results" / name
    repeats = args.repeats or (1 if args.quick else DEFAULT_REPEATS)

    console = Console(width=None if sys.stdout.isatty() else 190)
    err = Console(stderr=True)

    def progress(text: str) -> None:
        err.print(text, style="dim", highlight=False, soft_wrap=True)

    args.tmp_dir.mkdir(parents=True, exist_ok=True)
    system = {**b3.system_info(args.tmp_dir), **versions()}
    started = time.perf_counter()
    runs: dict[tuple[str, int], list[Run]] = {(k, n): [] for n in sizes for k in kinds}
    for keys in sizes:
        for repeat in range(repeats):
            # Interleave the backends, alternating which goes first.
            for kind in kinds if repeat % 2 == 0 else tuple(reversed(kinds)):
                progress(f"{kind}, {keys:,} keys, run {repeat + 1}/{repeats}")
                run = run_once(kind, keys, repeat, args.seed, args.tmp_dir, progress)
                runs[kind, keys].append(run)
                progress(
                    f"  ratio c2 {run.ratio(2):.1f}x, c3 {run.ratio(3):.1f}x, {run.wall_s:.1f}s"
                    + ("" if not run.problems else f", [red]NOT verified[/]: {run.problems[0]}")
                )
    elapsed = time.perf_counter() - started

    results = [(k, n, runs[k, n]) for n in sizes for k in kinds]
    b3.show(console, tables(results), results)
    measurements = [record(k, n, rs, args.seed, system) for k, n, rs in results]
    b3.write_results(
        out, "B3w", "window state", argv, args.quick, elapsed, DEFINITIONS, measurements
    )
    return 0 if all(verified(rs) for _, _, rs in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
