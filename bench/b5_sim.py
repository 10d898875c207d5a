"""B5 — protocol cost in the simulator (see /work/shared/spec/BENCHMARKS.md, bench/README.md).

Random strongly connected graphs of 10, 100 and 1,000 processes (about 3 output
channels per process) carry a steady payment load; a snapshot is started every
few steps by a random process. The identical script runs with snapshots
(``SimConfig(snapshots=True)``) and without (``snapshots=False``, same seed, so
the payments are identical), interleaved, several times each.

Figures per graph:

* payment events/s with and without snapshots (payment deliveries per CPU
  second of ``simulate()`` alone, keep_log=False) and total events/s (payment
  plus marker deliveries);
* overhead = 1 - payment events/s with / payment events/s without;
* markers per snapshot (must equal the number of channels);
* memory per snapshot (tracemalloc, see ``DEFINITIONS``).

A figure counts only when verified: every timed run passes cheap checks of its
own output, and one extra run with keep_log=True passes
``cutline.sim.checker.check_run`` against its baseline.

Run: ``python bench/b5_sim.py [--quick] [--repeats N] [--out bench/results/b5.json]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import cutline
from cutline.sim.checker import check_run
from cutline.sim.generate import strongly_connected_topology
from cutline.sim.log import EventKind, SimRun
from cutline.sim.scenario import Event, Initiate, Scenario, Send, Tick, Topology
from cutline.sim.simulator import SimConfig, simulate

BENCH_DIR = Path(__file__).resolve().parent
PROJECT_DIR = BENCH_DIR.parent
TOKENS = 1_000_000
"""Starting balance of every process: far more than any process can pay in a run."""
MAX_AMOUNT = 5
OUT_DEGREE = 3
"""Output channels per process: a random directed cycle (1) plus 2 * n random extra channels."""
AIM = 0.10
"""The issue's aim: snapshots cost under 10% of simulator throughput on the 1,000-process graph."""

DEFINITIONS = {
    "payment_events_per_s": (
        "payment deliveries / CPU seconds of simulate() alone (time.process_time: this shared "
        "machine's steal time does not count; script "
        "generation excluded; keep_log=False). Every payment sent is delivered, so this equals "
        "payments / seconds. The script is identical with and without snapshots."
    ),
    "total_events_per_s": (
        "all deliveries (payments + markers) / CPU seconds of simulate(); without snapshots "
        "it equals payment_events_per_s."
    ),
    "overhead": (
        "1 - payment_events_per_s(with) / payment_events_per_s(without), computed for each "
        "side-by-side pair of runs (same repeat, interleaved order); median, min and max over "
        "the pairs. 'overhead_of_medians' uses the median throughputs instead."
    ),
    "slowdown": "CPU seconds with snapshots / CPU seconds without, per pair (median, min, max).",
    "markers_per_snapshot": (
        "stats['markers'] / snapshots taken; the Chandy-Lamport bound is exactly one marker "
        "per channel, so it must equal the channel count."
    ),
    "peak_overhead_bytes": (
        "tracemalloc peak of simulate() with snapshots minus the peak without (same script, "
        "keep_log=False, tracing started just before simulate()). It includes the recorded "
        "snapshot data kept in the result plus the protocol's transient state (markers in "
        "flight, recorders' open channels)."
    ),
    "memory_per_snapshot_bytes": "peak_overhead_bytes / snapshots taken.",
    "transient_overhead_bytes": (
        "peak_overhead_bytes - retained_overhead_bytes: the part of the extra peak that is not "
        "the recorded snapshots kept in the result (markers in flight, the recorders' "
        "open-channel sets and per-channel recording lists). An estimate: the recorded data "
        "held at the moment of the peak may be less than at the end."
    ),
    "transient_per_snapshot_in_flight_bytes": (
        "transient_overhead_bytes / max_snapshots_in_flight, where a snapshot is in flight "
        "from its initiation to the last process's local completion (event-log order of a "
        "keep_log=True run of the same script and seed)."
    ),
    "recorded_bytes_per_snapshot": (
        "deep size (sys.getsizeof, recursively) of one RecordedSnapshot as returned in "
        "SimRun.snapshots: states, channel states, recorded messages (the Payment objects "
        "included), completion lists; process names and channel tuples are shared with the "
        "topology and not counted. Mean, min and max over the snapshots of the run."
    ),
    "retained_overhead_bytes": (
        "tracemalloc memory still allocated after simulate() returned (the SimRun) with "
        "snapshots minus without: the recorded snapshots as the process really holds them."
    ),
    "verified": (
        "true only if every timed run passed its own checks (all payments delivered, final "
        "balances as the script implies, deliveries = payments + markers; with snapshots: "
        "every snapshot complete, markers = channels x snapshots, every snapshot recorded all "
        "states and conserves the total tokens) and check_run(run, baseline) of an extra "
        "keep_log=True run is ok (all six properties, non-interference included)."
    ),
}


# ----------------------------------------------------------------- workload


@dataclass(frozen=True)
class Config:
    """One graph and load."""

    label: str
    processes: int
    steps: int
    snapshot_every: int
    verify_steps: int | None = None
    """Steps of the script prefix that check_run verifies; None = the whole script."""
    measure_memory: bool = True
    payments_per_process: float = 0.5
    """Payments per process per step: the load."""

    @property
    def payments_per_step(self) -> int:
        return max(1, round(self.processes * self.payments_per_process))


FULL_CONFIGS = (
    Config("n10", 10, steps=12_000, snapshot_every=10),
    Config("n100", 100, steps=1_200, snapshot_every=10),
    Config("n1000", 1_000, steps=120, snapshot_every=10, verify_steps=30),
    # Same graph size, snapshots 10x rarer: markers are ~6% of the payments instead of ~60%.
    Config("n1000-sparse", 1_000, steps=300, snapshot_every=100, verify_steps=30),
    # Same graph, snapshots every 10 steps as in "n1000", but a 10x heavier load (5 payments
    # per process per step): again ~6 markers per 100 payments.
    Config(
        "n1000-busy",
        1_000,
        steps=30,
        snapshot_every=10,
        verify_steps=6,
        payments_per_process=5.0,
    ),
)
QUICK_CONFIGS = (
    Config("n10", 10, steps=300, snapshot_every=10),
    Config("n100", 100, steps=60, snapshot_every=10),
    Config("n1000", 1_000, steps=20, snapshot_every=10),
)


@dataclass
class Workload:
    config: Config
    topology: Topology
    scenario: Scenario
    payments: int
    snapshots: int
    final_balances: dict[str, int]

    @property
    def channels(self) -> int:
        return len(self.topology.channels)


def build_workload(config: Config, seed: int, steps: int | None = None) -> Workload:
    """The graph and the steady script: each step maybe a snapshot, then n/2 payments, a tick."""
    rng = random.Random(f"b5:{config.label}:{seed}")
    n = config.processes
    topology = strongly_connected_topology(rng, n, extra_edges=(OUT_DEGREE - 1) * n, tokens=TOKENS)
    outputs: dict[str, list[tuple[str, str]]] = {}
    for channel in topology.channels:
        outputs.setdefault(channel[0], []).append(channel)
    names = list(topology.processes)
    balances = dict(topology.balances)
    debited = dict.fromkeys(names, 0)
    events: list[Event] = []
    snapshot_id = 0
    payments = 0
    for step in range(config.steps):
        if step % config.snapshot_every == 0:
            events.append(Initiate(rng.choice(names), snapshot_id))
            snapshot_id += 1
        for _ in range(config.payments_per_step):
            src = rng.choice(names)
            channel = rng.choice(outputs[src])
            amount = rng.randint(1, MAX_AMOUNT)
            debited[src] += amount
            if debited[src] > TOKENS:  # never happens with these sizes; guards the figures
                raise RuntimeError(f"{src} would overdraw: raise TOKENS")
            balances[channel[0]] -= amount
            balances[channel[1]] += amount
            events.append(Send(channel[0], channel[1], amount))
            payments += 1
        events.append(Tick(1))
    workload = Workload(
        config, topology, Scenario(topology, tuple(events)), payments, snapshot_id, balances
    )
    if steps is not None and steps < config.steps:
        return prefix(workload, steps)
    return workload


def prefix(workload: Workload, steps: int) -> Workload:
    """The first ``steps`` steps of the workload's script (for a cheaper check_run)."""
    events: list[Event] = []
    balances = dict(workload.topology.balances)
    payments = snapshots = ticks = 0
    for event in workload.scenario.events:
        if ticks == steps:
            break
        events.append(event)
        if isinstance(event, Send):
            payments += 1
            balances[event.src] -= event.amount
            balances[event.dst] += event.amount
        elif isinstance(event, Initiate):
            snapshots += 1
        else:
            ticks += event.steps
    scenario = Scenario(workload.topology, tuple(events))
    return Workload(workload.config, workload.topology, scenario, payments, snapshots, balances)


# ----------------------------------------------------------------- checks


def check_timed_run(run: SimRun, workload: Workload, snapshots: bool) -> list[str]:
    """Cheap checks of a run's own output (it kept no log, so check_run cannot see it)."""
    problems: list[str] = []
    stats = run.stats
    if stats["payments"] != workload.payments:
        problems.append(f"{stats['payments']} payments, script has {workload.payments}")
    if stats["deliveries"] != stats["payments"] + stats["markers"]:
        problems.append(f"deliveries {stats['deliveries']} != payments + markers")
    if run.final_balances != workload.final_balances:
        problems.append("final balances differ from what the script implies")
    if not snapshots:
        if stats["markers"] or run.snapshots:
            problems.append("markers or snapshots in a run with snapshots disabled")
        return problems
    if len(run.snapshots) != workload.snapshots:
        problems.append(f"{len(run.snapshots)} snapshots, script starts {workload.snapshots}")
    if stats["markers"] != workload.channels * workload.snapshots:
        problems.append(
            f"{stats['markers']} markers, expected {workload.channels} x {workload.snapshots}"
        )
    total = workload.topology.total_tokens
    n = len(workload.topology.processes)
    for sid, snap in run.snapshots.items():
        if not snap.complete:
            problems.append(f"snapshot {sid} incomplete")
        elif len(snap.states) != n or snap.recorded_tokens != total:
            problems.append(f"snapshot {sid} recorded {snap.recorded_tokens} tokens of {total}")
    return problems


# ----------------------------------------------------------------- measuring


def spread(values: Sequence[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "runs": list(values),
    }


def timed(workload: Workload, seed: int, snapshots: bool) -> tuple[float, SimRun]:
    config = SimConfig(seed=seed, snapshots=snapshots, keep_log=False)
    gc.collect()
    start = time.process_time()
    run = simulate(workload.scenario, config)
    return time.process_time() - start, run


def traced(workload: Workload, seed: int, snapshots: bool) -> tuple[int, int, SimRun]:
    """(peak bytes, bytes still held after simulate() returned, run) under tracemalloc."""
    config = SimConfig(seed=seed, snapshots=snapshots, keep_log=False)
    gc.collect()
    tracemalloc.start()
    try:
        run = simulate(workload.scenario, config)
        gc.collect()
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, current, run


def deep_size(obj: object, shared: set[int]) -> int:
    """sys.getsizeof of ``obj`` and everything it references, except the ids in ``shared``."""
    seen = set(shared)
    total = 0
    stack = [obj]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            stack.extend(item)
        elif hasattr(item, "__dict__"):
            stack.append(vars(item))
        elif hasattr(item, "__slots__"):
            stack.extend(getattr(item, slot) for slot in item.__slots__)
    return total


def topology_objects(topology: Topology) -> set[int]:
    ids = {id(topology.processes)}
    ids.update(id(p) for p in topology.processes)
    ids.update(id(c) for c in topology.channels)
    return ids


def snapshot_timing(run: SimRun) -> dict[str, Any]:
    """Max snapshots in flight at once and snapshot duration in steps, from a run's log."""
    started: dict[int, tuple[int, int]] = {}
    done: dict[int, tuple[int, int]] = {}
    for index, event in enumerate(run.log):
        if event.kind is EventKind.INITIATE and event.snapshot is not None:
            started.setdefault(event.snapshot, (index, event.time))
        elif event.kind is EventKind.COMPLETE and event.snapshot is not None:
            done[event.snapshot] = (index, event.time)
    edges = sorted(
        [(started[s][0], 1) for s in started if s in done] + [(done[s][0], -1) for s in done]
    )
    in_flight = peak = 0
    for _, delta in edges:
        in_flight += delta
        peak = max(peak, in_flight)
    durations = [done[s][1] - started[s][1] for s in started if s in done]
    return {
        "max_in_flight": peak,
        "duration_steps": spread(durations) if durations else None,
    }


@dataclass
class Measured:
    config: Config
    workload: Workload
    seconds_without: list[float]
    seconds_with: list[float]
    markers: int
    deliveries_with: int
    timed_problems: list[str]
    verdict: dict[str, Any]
    verify_script: str
    timing: dict[str, Any]
    memory: dict[str, Any] | None
    phases: dict[str, float]


def measure(config: Config, seed: int, repeats: int, progress: Callable[[str], None]) -> Measured:
    phase = time.perf_counter()
    phases: dict[str, float] = {}
    workload = build_workload(config, seed)
    phases["build_script"] = time.perf_counter() - phase
    progress(
        f"{config.label}: {config.processes} processes, {workload.channels} channels, "
        f"{workload.payments} payments, {workload.snapshots} snapshots"
    )
    seconds: dict[bool, list[float]] = {False: [], True: []}
    problems: list[str] = []
    markers = deliveries = 0
    for repeat in range(repeats):
        order = (False, True) if repeat % 2 == 0 else (True, False)
        for snapshots in order:
            elapsed, run = timed(workload, seed, snapshots)
            seconds[snapshots].append(elapsed)
            problems += [
                f"repeat {repeat} ({'with' if snapshots else 'without'}): {p}"
                for p in check_timed_run(run, workload, snapshots)
            ]
            if snapshots:
                markers, deliveries = run.stats["markers"], run.stats["deliveries"]
            del run
        progress(
            f"  repeat {repeat + 1}/{repeats}: without {seconds[False][-1]:.3f}s, "
            f"with {seconds[True][-1]:.3f}s"
        )

    phases["timed_runs"] = time.perf_counter() - phase - sum(phases.values())

    # Verification: an extra keep_log=True run (of a prefix on the big graph) and its baseline.
    checked = workload if config.verify_steps is None else prefix(workload, config.verify_steps)
    run = simulate(checked.scenario, SimConfig(seed=seed, snapshots=True, keep_log=True))
    baseline = simulate(checked.scenario, SimConfig(seed=seed, snapshots=False, keep_log=True))
    verdict = check_run(run, baseline)
    problems += [f"check run: {p}" for p in check_timed_run(run, checked, True)]
    problems += [f"check baseline: {p}" for p in check_timed_run(baseline, checked, False)]
    verify_script = (
        "full script"
        if checked is workload
        else f"prefix: first {config.verify_steps} of {config.steps} steps "
        f"({checked.payments} payments, {checked.snapshots} snapshots); check_run on the full "
        "script is too slow and too big (vector clocks of 1,000 entries per payment)"
    )
    progress(f"  check_run ({verify_script.split(';')[0]}): {verdict.summary()}")
    if checked is workload:
        logged = run
    else:  # a full keep_log run, for the snapshots in flight and their duration only
        del run, baseline
        logged = simulate(workload.scenario, SimConfig(seed=seed, snapshots=True, keep_log=True))
        problems += [f"log run: {p}" for p in check_timed_run(logged, workload, True)]
    timing = snapshot_timing(logged)
    del logged
    run = baseline = None
    phases["verification"] = time.perf_counter() - phase - sum(phases.values())

    memory = None
    if config.measure_memory:
        peak_without, held_without, run = traced(workload, seed, False)
        del run
        peak_with, held_with, run = traced(workload, seed, True)
        problems += [f"memory run: {p}" for p in check_timed_run(run, workload, True)]
        shared = topology_objects(workload.topology)
        sizes = [deep_size(snap, shared) for snap in run.snapshots.values()]
        messages = [len(snap.messages) for snap in run.snapshots.values()]
        del run
        overhead = peak_with - peak_without
        memory = {
            "peak_bytes_without": peak_without,
            "peak_bytes_with": peak_with,
            "peak_overhead_bytes": overhead,
            "memory_per_snapshot_bytes": overhead / workload.snapshots,
            "max_snapshots_in_flight": timing["max_in_flight"],
            "retained_overhead_bytes": held_with - held_without,
            "transient_overhead_bytes": overhead - (held_with - held_without),
            "transient_per_snapshot_in_flight_bytes": (
                (overhead - (held_with - held_without)) / timing["max_in_flight"]
                if timing["max_in_flight"]
                else None
            ),
            "recorded_bytes_per_snapshot": {
                "mean": statistics.fmean(sizes),
                "min": min(sizes),
                "max": max(sizes),
            },
            "recorded_bytes_total": sum(sizes),
            "recorded_messages_per_snapshot": {
                "mean": statistics.fmean(messages),
                "min": min(messages),
                "max": max(messages),
            },
        }
        progress(
            f"  memory: peak +{overhead / 1e6:.2f} MB, "
            f"{overhead / workload.snapshots / 1e3:.1f} kB per snapshot taken"
        )
        phases["memory"] = time.perf_counter() - phase - sum(phases.values())
    return Measured(
        config,
        workload,
        seconds[False],
        seconds[True],
        markers,
        deliveries,
        problems,
        verdict.to_dict(),
        verify_script,
        timing,
        memory,
        phases,
    )


# ----------------------------------------------------------------- output


def system_info() -> dict[str, Any]:
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
    return {
        "name": "cutline simulator (cutline.sim.simulator, Chandy-Lamport recorder)",
        "cutline_version": cutline.__version__,
        "git_commit": commit,
        "src_has_uncommitted_changes": dirty,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average_at_start": list(os.getloadavg()),
    }


def records(m: Measured, seed: int, repeats: int, system: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON objects of one configuration: one per measurement."""
    w, c = m.workload, m.config
    verified = m.verdict["ok"] and not m.timed_problems
    parameters = {
        "config": c.label,
        "processes": c.processes,
        "channels": w.channels,
        "channels_per_process": w.channels / c.processes,
        "steps": c.steps,
        "payments_per_step": c.payments_per_step,
        "payments": w.payments,
        "payment_amounts": [1, MAX_AMOUNT],
        "tokens_per_process": TOKENS,
        "snapshot_every_steps": c.snapshot_every,
        "snapshots": w.snapshots,
        "markers_per_payment": w.channels * w.snapshots / w.payments,
        "delays_steps": [SimConfig().min_delay, SimConfig().max_delay],
        "seed": seed,
        "repeats": repeats,
        "keep_log": False,
    }
    verification = {
        "verified": verified,
        "check_run": m.verdict["summary"],
        "check_run_ok": m.verdict["ok"],
        "check_run_script": m.verify_script,
        "check_run_violations": m.verdict["violations"][:10],
        "timed_runs_checked": 2 * repeats,
        "problems": m.timed_problems[:20],
    }
    pay_without = [w.payments / s for s in m.seconds_without]
    pay_with = [w.payments / s for s in m.seconds_with]
    total_with = [m.deliveries_with / s for s in m.seconds_with]
    pairs = list(zip(m.seconds_without, m.seconds_with, strict=True))
    overheads = [1 - without / with_ for without, with_ in pairs]
    slowdowns = [with_ / without for without, with_ in pairs]
    base = {
        "system": system,
        "verified": verified,
        "verification": verification,
        "harness_phase_seconds": m.phases,
    }
    out = [
        {
            "name": "b5.throughput",
            **base,
            "parameters": {**parameters, "snapshots_enabled": False},
            "figures": {
                "payment_events_per_s": spread(pay_without),
                "total_events_per_s": spread(pay_without),
                "seconds": spread(m.seconds_without),
            },
        },
        {
            "name": "b5.throughput",
            **base,
            "parameters": {**parameters, "snapshots_enabled": True},
            "figures": {
                "payment_events_per_s": spread(pay_with),
                "total_events_per_s": spread(total_with),
                "seconds": spread(m.seconds_with),
                "markers": m.markers,
                "deliveries": m.deliveries_with,
            },
        },
        {
            "name": "b5.overhead",
            **base,
            "parameters": parameters,
            "figures": {
                "overhead": spread(overheads),
                "overhead_of_medians": 1
                - statistics.median(pay_with) / statistics.median(pay_without),
                "slowdown": spread(slowdowns),
                "aim": AIM,
                "aim_met": statistics.median(overheads) < AIM,
            },
        },
        {
            "name": "b5.markers_per_snapshot",
            **base,
            "parameters": parameters,
            "figures": {
                "markers_per_snapshot": m.markers / w.snapshots,
                "channels": w.channels,
                "equals_channels": m.markers == w.channels * w.snapshots,
                "snapshots_complete": verified,
                "max_snapshots_in_flight": m.timing["max_in_flight"],
                "snapshot_duration_steps": m.timing["duration_steps"],
            },
        },
    ]
    if m.memory is not None:
        out.append(
            {
                "name": "b5.memory_per_snapshot",
                **base,
                "parameters": parameters,
                "figures": m.memory,
            }
        )
    return out


def fmt_rate(values: Sequence[float]) -> str:
    low, high = min(values) / 1e3, max(values) / 1e3
    return f"{statistics.median(values) / 1e3:,.1f}k ({low:,.1f}-{high:,.1f})"


def fmt_pct(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.1%} ({min(values):.1%}-{max(values):.1%})"


def fmt_bytes(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e3:,.1f} kB"


def new_table(title: str, columns: Sequence[str]) -> Table:
    t = Table(title=title, title_justify="left")
    for column in columns:
        t.add_column(column, justify="left" if column == "graph" else "right")
    return t


def tables(results: Sequence[Measured], repeats: int) -> tuple[Table, Table]:
    speed = new_table(
        f"B5 throughput: median (min-max) of {repeats} interleaved runs each",
        (
            "graph",
            "channels",
            "snapshot every",
            "snapshots",
            "payment ev/s without",
            "payment ev/s with",
            "total ev/s with",
            "overhead",
            "verified",
        ),
    )
    cost = new_table(
        "B5 protocol cost per snapshot",
        (
            "graph",
            "markers/snapshot",
            "= channels",
            "max in flight",
            "duration (steps)",
            "mem/snapshot",
            "transient/in flight",
            "recorded/snapshot",
            "recorded msgs",
            "verified",
        ),
    )
    for m in results:
        w = m.workload
        verified = "[green]yes[/]" if m.verdict["ok"] and not m.timed_problems else "[red]NO[/]"
        graph = f"{m.config.label} ({m.config.processes:,} proc)"
        overheads = [1 - a / b for a, b in zip(m.seconds_without, m.seconds_with, strict=True)]
        speed.add_row(
            graph,
            f"{w.channels:,}",
            f"{m.config.snapshot_every} steps",
            f"{w.snapshots:,}",
            fmt_rate([w.payments / s for s in m.seconds_without]),
            fmt_rate([w.payments / s for s in m.seconds_with]),
            fmt_rate([m.deliveries_with / s for s in m.seconds_with]),
            fmt_pct(overheads),
            verified,
        )
        mem = m.memory or {}
        duration = m.timing["duration_steps"]
        recorded = mem.get("recorded_messages_per_snapshot")
        cost.add_row(
            graph,
            f"{m.markers / w.snapshots:,.0f}",
            "yes" if m.markers == w.channels * w.snapshots else "[red]NO[/]",
            str(m.timing["max_in_flight"]),
            f"{duration['median']:g} ({duration['min']}-{duration['max']})" if duration else "-",
            fmt_bytes(mem.get("memory_per_snapshot_bytes")),
            fmt_bytes(mem.get("transient_per_snapshot_in_flight_bytes")),
            fmt_bytes(mem["recorded_bytes_per_snapshot"]["mean"] if mem else None),
            f"{recorded['mean']:,.0f}" if recorded else "-",
            verified,
        )
    return speed, cost


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small scripts: a smoke run")
    parser.add_argument("--repeats", type=int, default=None, help="runs per configuration")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON output (default bench/results/b5.json, or b5-quick.json with --quick)",
    )
    args = parser.parse_args(argv)
    repeats = args.repeats or (2 if args.quick else 5)
    if repeats < 1:
        parser.error("--repeats must be at least 1")
    out = args.out or BENCH_DIR / "results" / ("b5-quick.json" if args.quick else "b5.json")
    configs = QUICK_CONFIGS if args.quick else FULL_CONFIGS

    console = Console(width=None if sys.stdout.isatty() else 150)
    err = Console(stderr=True)
    system = system_info()
    started = time.perf_counter()
    results = [
        measure(c, args.seed, repeats, lambda s: err.print(s, style="dim", highlight=False))
        for c in configs
    ]
    elapsed = time.perf_counter() - started

    for t in tables(results, repeats):
        console.print(t)
    for m in results:
        if m.timed_problems or not m.verdict["ok"]:
            console.print(f"[red]{m.config.label} NOT verified:[/] {m.verdict['summary']}")
            for problem in m.timed_problems[:10]:
                console.print(f"  {problem}")
    for m in results:
        if m.config.processes == 1_000:
            overhead = statistics.median(
                1 - a / b for a, b in zip(m.seconds_without, m.seconds_with, strict=True)
            )
            met = "met" if overhead < AIM else "NOT met"
            console.print(
                f"aim (< {AIM:.0%} overhead at 1,000 processes), {m.config.label}, snapshot every "
                f"{m.config.snapshot_every} steps: overhead {overhead:.1%}, aim {met}"
            )

    document = {
        "benchmark": "B5",
        "title": "protocol cost in the simulator",
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "bench/b5_sim.py", *(argv or sys.argv[1:])]),
        "quick": args.quick,
        "wall_seconds": elapsed,
        "definitions": DEFINITIONS,
        "measurements": [r for m in results for r in records(m, args.seed, repeats, system)],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    console.print(f"wrote {out} ({elapsed:.0f} s)")
    verified = all(m.verdict["ok"] and not m.timed_problems for m in results)
    return 0 if verified else 1


if __name__ == "__main__":
    raise SystemExit(main())
