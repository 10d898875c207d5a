"""B3 — state size (see /work/shared/spec/BENCHMARKS.md, bench/README.md).

Keyed value state of 10^4 to 10^7 keys (int keys, int values) in one operator subtask that
owns all 128 key groups, on each backend (``memory``: Python dicts; ``disk``: RocksDB),
checkpointed to real files in a temporary checkpoint directory on the local disk
(:class:`cutline.runtime.checkpoint.storage.CheckpointStorage`).

One run of a configuration (backend, keys) drives two backends identically: one configured
``incremental=True, full_every=10``, the other ``incremental=False``:

1. load the keys (value = key), take checkpoint 1 (full on both);
2. change 1% of the keys (a seeded random choice), take checkpoint 2 with base 1
   (incremental on the first backend, full on the second);
3. restore each backend's checkpoint 2 (a chain: full + incremental; or one full segment)
   into a fresh backend and compare the restored state with the expected one.

Figures: the synchronous part of each checkpoint (``backend.snapshot()`` alone), the
asynchronous part (``snapshot.write()``: merging, encoding and writing the segment), the size
of the segments new with each checkpoint, restore time, and the ratio of the full size to the
incremental size at 1% churn. A figure counts only when its run was verified.

Run: ``python bench/b3_state.py [--quick] [--sizes 10000,100000] [--repeats N] [--out F]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import posixpath
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import cutline
from cutline.runtime.checkpoint.storage import CheckpointStorage
from cutline.runtime.state.backend import KeyedStateBackend
from cutline.runtime.state.config import StateConfig
from cutline.runtime.state.factory import new_backend

BENCH_DIR = Path(__file__).resolve().parent
PROJECT_DIR = BENCH_DIR.parent
BACKENDS = ("memory", "disk")
FULL_SIZES = (10**4, 10**5, 10**6, 10**7)
QUICK_SIZES = (10**4, 10**5)
DEFAULT_REPEATS = 3
LARGE = 10**7
"""Sizes from this on run once by default (a disk run of 10^7 keys takes minutes)."""
MAX_PARALLELISM = 128
FULL_EVERY = 10
CHURN = 0.01
"""Share of the keys changed between checkpoint 1 and checkpoint 2."""
STATE = "count"
CHECK_EVERY_KEY_UP_TO = 10**6
SAMPLE = 100_000
"""Keys checked (besides the count of keys and every changed key) above CHECK_EVERY_KEY_UP_TO."""
AIM_RATIO = 20.0
AIM_SYNC_S = 0.010
AIM_SYNC_KEYS = 10**6
_MISSING: Any = object()

DEFINITIONS = {
    "sync_ms": (
        "wall time of backend.snapshot(checkpoint_id, base=...) alone: the synchronous part, "
        "which blocks the subtask's processing thread. 'full' is checkpoint 1 (after loading "
        "the keys), 'incremental' checkpoint 2 (after changing 1% of the keys) of the "
        "incremental backend."
    ),
    "async_s": (
        "wall time of snapshot.write(store, name) alone: the asynchronous part (the snapshot "
        "thread's): merging the frozen changes into the base, encoding the segment and writing "
        "it to a file (fsync included) in the checkpoint directory on the local disk."
    ),
    "size_bytes": (
        "sum of the sizes of the segments new with the checkpoint (the chain's segments that "
        "the previous checkpoint's chain did not name); each is checked against the file's size."
    ),
    "full_over_incremental": (
        "size of checkpoint 2 of the backend configured incremental=False (a full segment) / "
        "size of checkpoint 2 of the backend configured incremental=True (the changes since "
        "checkpoint 1), for each run (the two backends are driven identically); aim >= 20."
    ),
    "restore_s": (
        "wall time of backend.restore([handle], storage.location(2), checkpoint_id=2) into a "
        "fresh backend: reading the files (just written, so likely in the page cache), checking "
        "their digests, decoding and loading them. 'chain' restores the incremental backend's "
        "checkpoint 2 (full segment of checkpoint 1 + incremental segment of checkpoint 2), "
        "'full' the non-incremental backend's checkpoint 2 (one full segment)."
    ),
    "load_s": "wall time of writing the N keys into the state (value_table()[key] = key).",
    "update_s": "wall time of writing the 1% changed keys.",
    "peak_rss_bytes": (
        "the process's peak resident set size during the configuration's run (both backends, "
        "the restores and the checks, and the benchmark's own expected values): VmHWM of "
        "/proc/self/status, reset at the start of the run (clear_refs 5). Where that reset is "
        "not available, the process's peak so far (resource.getrusage ru_maxrss), which never "
        "goes down; 'peak_rss_reset' says which."
    ),
    "verified": (
        "true only if every run's two restored states equal the expected state (every key and "
        "value, and no other key, up to 10^6 keys; above that the count of keys, a seeded "
        "sample of 10^5 keys and every changed key), checkpoint 1 was full on both backends, "
        "checkpoint 2 was incremental (a chain of 2) on the incremental backend and full on "
        "the other, and every segment file has the size its reference says."
    ),
}


# ----------------------------------------------------------------- memory


_CLEAR_REFS = "/proc/self/clear_refs"


def reset_peak_rss() -> bool:
    """Reset the kernel's peak RSS of this process (Linux 4.0+); False when not possible."""
    try:
        with open(_CLEAR_REFS, "w") as out:
            out.write("5")
        return True
    except OSError:
        return False


def rss_bytes(field_name: str) -> int | None:
    """``VmRSS`` or ``VmHWM`` of this process, in bytes (None when /proc is not there)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def ru_maxrss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


# ----------------------------------------------------------------- one run


def spread(values: Sequence[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "runs": list(values),
    }


@dataclass
class Checkpoint:
    checkpoint_id: int
    sync_s: float
    async_s: float
    size_bytes: int
    full: bool | None
    chain: list[dict[str, Any]]


@dataclass
class Variant:
    """One backend driven through checkpoints 1 and 2 and restored from checkpoint 2."""

    incremental: bool
    load_s: float = 0.0
    update_s: float = 0.0
    checkpoints: list[Checkpoint] = field(default_factory=list)
    restore_s: float = 0.0
    checked: str = ""
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "incremental": self.incremental,
            "load_s": self.load_s,
            "update_s": self.update_s,
            "checkpoints": [vars(c) for c in self.checkpoints],
            "restore_s": self.restore_s,
            "restore_checked": self.checked,
            "problems": self.problems,
        }


@dataclass
class Run:
    backend: str
    keys: int
    repeat: int
    incremental: Variant
    full: Variant
    peak_rss_bytes: int | None
    peak_rss_reset: bool
    rss_at_start_bytes: int | None
    wall_s: float

    @property
    def problems(self) -> list[str]:
        return [f"incremental backend: {p}" for p in self.incremental.problems] + [
            f"non-incremental backend: {p}" for p in self.full.problems
        ]

    @property
    def ratio(self) -> float:
        return self.full.checkpoints[1].size_bytes / self.incremental.checkpoints[1].size_bytes


def state_config(kind: str, incremental: bool, local_dir: Path) -> StateConfig:
    return StateConfig(
        backend=kind, incremental=incremental, full_every=FULL_EVERY, local_dir=str(local_dir)
    )


def fresh_backend(kind: str, incremental: bool, local_dir: Path) -> KeyedStateBackend:
    return new_backend(
        state_config(kind, incremental, local_dir), MAX_PARALLELISM, range(MAX_PARALLELISM)
    )


def checkpoint(
    backend: KeyedStateBackend,
    storage: CheckpointStorage,
    checkpoint_id: int,
    base: int | None,
    previous: list[dict[str, Any]],
    label: str,
) -> tuple[Checkpoint, dict[str, Any], list[str]]:
    """Take and write one checkpoint, timing its two parts; check its files' sizes."""
    gc.collect()
    start = time.perf_counter()
    snap = backend.snapshot(checkpoint_id, base=base)
    taken = time.perf_counter()
    handle = snap.write(storage.segment_store(checkpoint_id), f"b3-{label}-c{checkpoint_id}")
    written = time.perf_counter()
    chain = list(handle["chain"])
    old = {r["path"] for r in previous}
    new = [r for r in chain if r["path"] not in old]
    problems = []
    folder = storage.checkpoint_path(checkpoint_id)
    for ref in chain:
        path = posixpath.normpath(f"{folder}/{ref['path']}")
        try:
            on_disk = os.path.getsize(path)
        except OSError as exc:
            problems.append(f"checkpoint {checkpoint_id}: segment {ref['path']}: {exc}")
            continue
        if on_disk != ref["size"]:
            problems.append(
                f"checkpoint {checkpoint_id}: segment {ref['path']} has {on_disk} bytes, "
                f"its reference says {ref['size']}"
            )
    figures = Checkpoint(
        checkpoint_id,
        taken - start,
        written - taken,
        sum(r["size"] for r in new),
        snap.full,
        chain,
    )
    return figures, handle, problems


def check_state(
    backend: KeyedStateBackend, keys: int, updates: dict[int, int], rng: random.Random
) -> tuple[str, list[str]]:
    """Compare the restored state with the expected one: key k has value updates.get(k, k)."""
    table = backend.value_table(STATE)
    problems: list[str] = []
    count = wrong = 0
    if keys <= CHECK_EVERY_KEY_UP_TO:
        for key in backend.keys(STATE):
            count += 1
            if type(key) is not int or not 0 <= key < keys:
                if len(problems) < 5:
                    problems.append(f"unexpected key {key!r}")
                wrong += 1
                continue
            value = table.get(key, _MISSING)
            if value != updates.get(key, key):
                if len(problems) < 5:
                    problems.append(f"key {key}: {value!r}, expected {updates.get(key, key)!r}")
                wrong += 1
        checked = f"every key ({count:,}): keys are 0..{keys - 1} and every value is right"
    else:
        count = sum(1 for _ in backend.keys(STATE))
        sample = rng.sample(range(keys), SAMPLE)
        for key in (*sample, *updates):
            value = table.get(key, _MISSING)
            if value != updates.get(key, key):
                if len(problems) < 5:
                    problems.append(f"key {key}: {value!r}, expected {updates.get(key, key)!r}")
                wrong += 1
        checked = (
            f"the count of keys ({count:,}), a seeded sample of {SAMPLE:,} keys and the "
            f"{len(updates):,} changed keys"
        )
    if count != keys:
        problems.append(f"{count:,} keys restored, expected {keys:,}")
    if wrong:
        problems.append(f"{wrong:,} keys wrong or unexpected")
    return checked, problems


def drive(
    kind: str,
    incremental: bool,
    keys: int,
    updates: dict[int, int],
    root: Path,
    check_seed: str,
    progress: Callable[[str], None],
) -> Variant:
    """One backend: load, checkpoint 1, change 1%, checkpoint 2; then restore checkpoint 2."""
    label = "incr" if incremental else "full"
    variant = Variant(incremental)
    storage = CheckpointStorage(str(root / f"checkpoints-{label}"))
    local_dir = root / "local"
    backend = fresh_backend(kind, incremental, local_dir)
    try:
        table = backend.value_table(STATE)
        start = time.perf_counter()
        for key in range(keys):
            table[key] = key
        variant.load_s = time.perf_counter() - start
        first, _, problems = checkpoint(backend, storage, 1, None, [], label)
        variant.problems += problems
        start = time.perf_counter()
        for key, value in updates.items():
            table[key] = value
        variant.update_s = time.perf_counter() - start
        second, handle, problems = checkpoint(backend, storage, 2, 1, first.chain, label)
        variant.problems += problems
        variant.checkpoints = [first, second]
        del table
    finally:
        backend.close()
        del backend
        gc.collect()
    if first.full is not True or len(first.chain) != 1:
        variant.problems.append(f"checkpoint 1 was not one full segment: {first.chain}")
    expected = 2 if incremental else 1
    if second.full is not (not incremental) or len(second.chain) != expected:
        variant.problems.append(
            f"checkpoint 2 was not {'incremental' if incremental else 'full'} "
            f"(a chain of {expected}): full={second.full}, chain {second.chain}"
        )
    progress(
        f"    {label}: load {variant.load_s:.2f}s; ckpt 1 sync {first.sync_s * 1e3:.2f} ms, "
        f"async {first.async_s:.2f}s, {first.size_bytes:,} B; ckpt 2 sync "
        f"{second.sync_s * 1e3:.2f} ms, async {second.async_s:.3f}s, {second.size_bytes:,} B"
    )

    restored = fresh_backend(kind, incremental, local_dir)
    try:
        gc.collect()
        start = time.perf_counter()
        restored.restore([handle], storage.location(2), checkpoint_id=2)
        variant.restore_s = time.perf_counter() - start
        start = time.perf_counter()
        variant.checked, problems = check_state(restored, keys, updates, random.Random(check_seed))
        variant.problems += [f"restored checkpoint 2: {p}" for p in problems]
        check_s = time.perf_counter() - start
    except Exception as exc:  # a failed restore is an unverified run, not a crash
        variant.problems.append(f"restore of checkpoint 2 failed: {type(exc).__name__}: {exc}")
        check_s = 0.0
    finally:
        restored.close()
        del restored
        gc.collect()
    progress(
        f"    {label}: restore {variant.restore_s:.2f}s, check {check_s:.2f}s: "
        + ("ok" if not variant.problems else "; ".join(variant.problems[:3]))
    )
    return variant


def run_once(
    kind: str,
    keys: int,
    repeat: int,
    seed: int,
    tmp_dir: Path,
    progress: Callable[[str], None],
) -> Run:
    """One configuration once: both backends (incremental and not) in a fresh directory."""
    gc.collect()
    rss_start = rss_bytes("VmRSS")
    reset = reset_peak_rss()
    started = time.perf_counter()
    # The same changed keys for both backends and both kinds in one repeat.
    rng = random.Random(f"b3:{keys}:{seed}:{repeat}")
    changed = rng.sample(range(keys), max(1, round(keys * CHURN)))
    updates = {key: -key - 1 for key in changed}
    del changed
    root = Path(tempfile.mkdtemp(prefix="cutline-b3-", dir=tmp_dir))
    variants: dict[bool, Variant] = {}
    try:
        for incremental in (True, False) if repeat % 2 == 0 else (False, True):
            variants[incremental] = drive(
                kind, incremental, keys, updates, root, f"b3-check:{keys}:{seed}:{repeat}", progress
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    del updates
    peak = rss_bytes("VmHWM") if reset else None
    if peak is None:
        reset, peak = False, ru_maxrss_bytes()
    return Run(
        kind,
        keys,
        repeat,
        variants[True],
        variants[False],
        peak,
        reset,
        rss_start,
        time.perf_counter() - started,
    )


# ----------------------------------------------------------------- output


def filesystem_of(path: Path) -> str | None:
    """The file system type of ``path`` (from /proc/mounts), to show it is a local disk."""
    try:
        with open("/proc/mounts") as mounts:
            entries = [line.split() for line in mounts]
    except OSError:
        return None
    target = str(path.resolve())
    best: tuple[int, str] | None = None
    for entry in entries:
        if len(entry) < 3:
            continue
        mount = entry[1]
        if (target == mount or target.startswith(mount.rstrip("/") + "/")) and (
            best is None or len(mount) > best[0]
        ):
            best = (len(mount), f"{entry[2]} ({entry[0]} on {mount})")
    return best[1] if best else None


def system_info(tmp_dir: Path) -> dict[str, Any]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=PROJECT_DIR,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--", "src"],
                cwd=PROJECT_DIR,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = None, None
    try:
        rocksdict_version: str | None = metadata.version("rocksdict")
    except metadata.PackageNotFoundError:
        rocksdict_version = None
    return {
        "name": "cutline keyed state backends (cutline.runtime.state, CheckpointStorage)",
        "cutline_version": cutline.__version__,
        "git_commit": commit,
        "src_has_uncommitted_changes": dirty,
        "rocksdict_version": rocksdict_version,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "load_average_at_start": list(os.getloadavg()),
        "checkpoint_dir_parent": str(tmp_dir),
        "checkpoint_dir_filesystem": filesystem_of(tmp_dir),
    }


def config_dict(kind: str, incremental: bool) -> dict[str, Any]:
    config = vars(state_config(kind, incremental, Path("local")))
    return {**config, "local_dir": "the run's temporary directory (--tmp-dir)/local"}


def verified(runs: Sequence[Run]) -> bool:
    return all(not r.problems for r in runs)


def record(
    kind: str, keys: int, runs: Sequence[Run], seed: int, system: dict[str, Any]
) -> dict[str, Any]:
    """The JSON object of one configuration (backend, keys)."""
    inc, full = [r.incremental for r in runs], [r.full for r in runs]
    ok = verified(runs)
    ratios = [r.ratio for r in runs]
    sync_incremental = [v.checkpoints[1].sync_s for v in inc]
    figures: dict[str, Any] = {
        "sync_ms_full": spread([v.checkpoints[0].sync_s * 1e3 for v in inc]),
        "sync_ms_incremental": spread([s * 1e3 for s in sync_incremental]),
        "async_s_full": spread([v.checkpoints[0].async_s for v in inc]),
        "async_s_incremental": spread([v.checkpoints[1].async_s for v in inc]),
        "size_bytes_full": spread([v.checkpoints[0].size_bytes for v in inc]),
        "size_bytes_incremental": spread([v.checkpoints[1].size_bytes for v in inc]),
        "size_bytes_full_at_checkpoint_2": spread([v.checkpoints[1].size_bytes for v in full]),
        "full_over_incremental": spread(ratios),
        "restore_s_chain": spread([v.restore_s for v in inc]),
        "restore_s_full": spread([v.restore_s for v in full]),
        "load_s": spread([v.load_s for v in inc]),
        "update_s": spread([v.update_s for v in inc]),
        "non_incremental_backend": {
            "sync_ms_checkpoint_1": spread([v.checkpoints[0].sync_s * 1e3 for v in full]),
            "sync_ms_checkpoint_2": spread([v.checkpoints[1].sync_s * 1e3 for v in full]),
            "async_s_checkpoint_1": spread([v.checkpoints[0].async_s for v in full]),
            "async_s_checkpoint_2": spread([v.checkpoints[1].async_s for v in full]),
            "size_bytes_checkpoint_1": spread([v.checkpoints[0].size_bytes for v in full]),
            "size_bytes_checkpoint_2": spread([v.checkpoints[1].size_bytes for v in full]),
            "load_s": spread([v.load_s for v in full]),
        },
        "peak_rss_bytes": spread([r.peak_rss_bytes for r in runs if r.peak_rss_bytes is not None])
        if any(r.peak_rss_bytes is not None for r in runs)
        else None,
        "peak_rss_reset": all(r.peak_rss_reset for r in runs),
        "aims": {
            "full_over_incremental_at_least": AIM_RATIO,
            "full_over_incremental_met": statistics.median(ratios) >= AIM_RATIO,
            "sync_ms_incremental_under": AIM_SYNC_S * 1e3 if keys == AIM_SYNC_KEYS else None,
            "sync_ms_incremental_met": statistics.median(sync_incremental) < AIM_SYNC_S
            if keys == AIM_SYNC_KEYS
            else None,
        },
    }
    return {
        "name": "b3.state_size",
        "system": system,
        "parameters": {
            "backend": kind,
            "keys": keys,
            "state": f"value state {STATE!r}: int keys 0..N-1, value = key",
            "changed_keys": max(1, round(keys * CHURN)),
            "churn": CHURN,
            "change": "value = -key - 1 for a seeded random sample of the keys",
            "max_parallelism": MAX_PARALLELISM,
            "key_groups": [0, MAX_PARALLELISM],
            "incremental_backend": config_dict(kind, True),
            "non_incremental_backend": config_dict(kind, False),
            "checkpoints": "1: base None (full); 2: base 1 (incremental when configured so)",
            "repeats": len(runs),
            "seed": seed,
        },
        "figures": figures,
        "verified": ok,
        "verification": {
            "verified": ok,
            "restore_checked": sorted({v.checked for v in (*inc, *full) if v.checked}),
            "problems": [f"repeat {r.repeat}: {p}" for r in runs for p in r.problems][:20],
        },
        "runs": [
            {
                "repeat": r.repeat,
                "wall_s": r.wall_s,
                "peak_rss_bytes": r.peak_rss_bytes,
                "rss_at_start_bytes": r.rss_at_start_bytes,
                "full_over_incremental": r.ratio,
                "incremental_backend": r.incremental.to_dict(),
                "non_incremental_backend": r.full.to_dict(),
            }
            for r in runs
        ],
    }


def ms(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:,.0f}"


def secs(value: float) -> str:
    return f"{value:.3f}" if value < 10 else f"{value:.2f}" if value < 100 else f"{value:.1f}"


def cell(values: Sequence[float], fmt: Callable[[float], str] = secs) -> str:
    """The median, and under it the min-max when there are several runs."""
    median = fmt(statistics.median(values))
    if len(values) == 1:
        return median
    return f"{median}\n{fmt(min(values))}-{fmt(max(values))}"


def fmt_bytes(value: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def new_table(title: str, columns: Sequence[str]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, justify="left" if column == "backend" else "right")
    return table


def tables(results: Iterable[tuple[str, int, list[Run]]]) -> tuple[Table, Table]:
    main = new_table(
        "B3 state size. c1: checkpoint 1, full, after loading the keys; c2: checkpoint 2, after "
        "changing 1% of the keys (incr: incremental backend; full: the backend configured "
        "incremental=False). Times: median, and min-max over the runs; sizes, ratio, "
        "peak RSS: median.",
        (
            "backend",
            "keys\n(runs)",
            "sync ms\nc1 full",
            "sync ms\nc2 incr",
            "async s\nc1 full",
            "async s\nc2 incr",
            "size\nc2 full",
            "size\nc2 incr",
            "ratio\nfull/incr",
            "restore s\nchain c2",
            "restore s\nfull c2",
            "peak RSS\n(at start)",
            "verified",
        ),
    )
    side = new_table(
        "B3 the backend configured incremental=False (every checkpoint full), driven the same "
        "way: median, and min-max over the runs.",
        (
            "backend",
            "keys\n(runs)",
            "sync ms\nc1",
            "sync ms\nc2",
            "async s\nc1",
            "async s\nc2",
            "size\nc1",
            "size\nc2",
            "restore s\nc2",
        ),
    )
    for kind, keys, runs in results:
        inc, full = [r.incremental for r in runs], [r.full for r in runs]
        peaks = [r.peak_rss_bytes for r in runs if r.peak_rss_bytes is not None]
        starts = [r.rss_at_start_bytes for r in runs if r.rss_at_start_bytes is not None]
        peak = fmt_bytes(statistics.median(peaks)) if peaks else "-"
        if starts:
            peak += f"\n({fmt_bytes(statistics.median(starts))})"
        label = f"{keys:,}\n({len(runs)})"
        main.add_row(
            kind,
            label,
            cell([v.checkpoints[0].sync_s * 1e3 for v in inc], ms),
            cell([v.checkpoints[1].sync_s * 1e3 for v in inc], ms),
            cell([v.checkpoints[0].async_s for v in inc]),
            cell([v.checkpoints[1].async_s for v in inc]),
            fmt_bytes(statistics.median(v.checkpoints[1].size_bytes for v in full)),
            fmt_bytes(statistics.median(v.checkpoints[1].size_bytes for v in inc)),
            f"{statistics.median(r.ratio for r in runs):.1f}x",
            cell([v.restore_s for v in inc]),
            cell([v.restore_s for v in full]),
            peak,
            "[green]yes[/]" if verified(runs) else "[red]NO[/]",
        )
        side.add_row(
            kind,
            label,
            cell([v.checkpoints[0].sync_s * 1e3 for v in full], ms),
            cell([v.checkpoints[1].sync_s * 1e3 for v in full], ms),
            cell([v.checkpoints[0].async_s for v in full]),
            cell([v.checkpoints[1].async_s for v in full]),
            fmt_bytes(statistics.median(v.checkpoints[0].size_bytes for v in full)),
            fmt_bytes(statistics.median(v.checkpoints[1].size_bytes for v in full)),
            cell([v.restore_s for v in full]),
        )
    return main, side


def parse_sizes(text: str) -> tuple[int, ...]:
    sizes = []
    for part in text.split(","):
        part = part.strip().replace("_", "")
        try:
            value = int(part) if part.isdigit() else int(float(part))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not a number of keys") from None
        if value < 100:
            raise argparse.ArgumentTypeError(f"{value} keys: use at least 100 (1% must be >= 1)")
        sizes.append(value)
    return tuple(sizes)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="10^4 and 10^5 keys, 1 run each: a smoke run"
    )
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=None,
        help="numbers of keys, comma-separated (default 10000,100000,1000000,10000000; "
        "1e6 is accepted)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help=f"runs per configuration (default {DEFAULT_REPEATS}, and 1 for {LARGE:,} keys "
        "or more; 1 with --quick)",
    )
    parser.add_argument(
        "--backends",
        default=",".join(BACKENDS),
        help="comma-separated: memory, disk (default both)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--tmp-dir",
        type=Path,
        default=Path(tempfile.gettempdir()),
        help="where the checkpoint directories and the disk backend's databases go "
        "(a local disk; default the system's temporary directory)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON output (default bench/results/b3.json, or b3-quick.json with --quick)",
    )
    args = parser.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be at least 1")
    kinds = tuple(k.strip() for k in args.backends.split(",") if k.strip())
    if not kinds or any(k not in BACKENDS for k in kinds):
        parser.error(f"--backends: choose among {', '.join(BACKENDS)}")
    sizes = args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
    out = args.out or BENCH_DIR / "results" / ("b3-quick.json" if args.quick else "b3.json")

    def repeats_for(keys: int) -> int:
        if args.repeats is not None:
            return int(args.repeats)
        if args.quick:
            return 1
        return 1 if keys >= LARGE else DEFAULT_REPEATS

    console = Console(width=None if sys.stdout.isatty() else 170)
    err = Console(stderr=True)

    def progress(text: str) -> None:
        err.print(text, style="dim", highlight=False, soft_wrap=True)

    args.tmp_dir.mkdir(parents=True, exist_ok=True)
    system = system_info(args.tmp_dir)
    started = time.perf_counter()
    runs: dict[tuple[str, int], list[Run]] = {(k, n): [] for n in sizes for k in kinds}
    for keys in sizes:
        for repeat in range(repeats_for(keys)):
            # Interleave the backends, alternating which goes first.
            for kind in kinds if repeat % 2 == 0 else tuple(reversed(kinds)):
                progress(f"{kind}, {keys:,} keys, run {repeat + 1}/{repeats_for(keys)}")
                run = run_once(kind, keys, repeat, args.seed, args.tmp_dir, progress)
                runs[kind, keys].append(run)
                peak = "-" if run.peak_rss_bytes is None else fmt_bytes(run.peak_rss_bytes)
                progress(
                    f"  ratio {run.ratio:.1f}x, peak RSS {peak}, {run.wall_s:.1f}s"
                    + ("" if not run.problems else f", [red]NOT verified[/]: {run.problems[0]}")
                )
    elapsed = time.perf_counter() - started

    results = [(k, n, runs[k, n]) for n in sizes for k in kinds]
    show(console, tables(results), results)
    for kind, keys, rs in results:
        ratio = statistics.median(r.ratio for r in rs)
        line = (
            f"{kind}, {keys:,} keys: full/incremental size at 1% churn {ratio:.1f}x "
            f"(aim >= {AIM_RATIO:.0f}x: {'met' if ratio >= AIM_RATIO else 'NOT met'})"
        )
        if keys == AIM_SYNC_KEYS:
            sync = statistics.median(r.incremental.checkpoints[1].sync_s for r in rs)
            line += (
                f"; synchronous part of checkpoint 2 {sync * 1e3:.2f} ms "
                f"(aim < {AIM_SYNC_S * 1e3:.0f} ms: {'met' if sync < AIM_SYNC_S else 'NOT met'})"
            )
        console.print(line)

    measurements = [record(k, n, rs, args.seed, system) for k, n, rs in results]
    write_results(out, "B3", "state size", argv, args.quick, elapsed, DEFINITIONS, measurements)
    return 0 if all(verified(rs) for _, _, rs in results) else 1


def show(console: Console, shown: Iterable[Table], results: Sequence[tuple[str, int, Any]]) -> None:
    """The tables of a run of B3 or B3w, then what any run found wrong."""
    for t in shown:
        console.print(t)
    for kind, keys, rs in results:
        if not verified(rs):
            console.print(f"[red]{kind}, {keys:,} keys NOT verified:[/]")
            for r in rs:
                for problem in r.problems[:5]:
                    console.print(f"  run {r.repeat + 1}: {problem}")


def write_results(
    out: Path,
    benchmark: str,
    title: str,
    argv: Sequence[str] | None,
    quick: bool,
    elapsed: float,
    definitions: dict[str, Any],
    measurements: list[dict[str, Any]],
) -> None:
    """The JSON of a run of B3 or B3w (``bench/results/``), and a line saying where."""
    script = {"B3": "b3_state.py", "B3w": "b3_windows.py"}[benchmark]
    document = {
        "benchmark": benchmark,
        "title": title,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", f"bench/{script}", *(argv or sys.argv[1:])]),
        "quick": quick,
        "wall_seconds": elapsed,
        "definitions": definitions,
        "measurements": measurements,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    Console().print(f"wrote {out} ({elapsed:.0f} s)")


if __name__ == "__main__":
    raise SystemExit(main())
