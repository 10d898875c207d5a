"""Writing recorded snapshots out: the text format of the simulator page's "Snapshot output", and
JSON.

Text, one block per snapshot, blocks separated by a blank line::

    0               # the snapshot id
    N1 9            # ID TOKENS: each process's recorded balance, in topology order
    N2 10
    N1 N2 token(1)  # SRC DST token(K): each recorded in-flight message,
                    # in the order its destination received it

A snapshot that could not complete (a process unreachable from every
initiator) is still printed with what was recorded, after a comment line
``# incomplete: ...``.
"""

from __future__ import annotations

from typing import Any

from cutline.sim.checker import Verdict
from cutline.sim.log import RecordedSnapshot, SimRun
from cutline.sim.scenario import Topology


def incomplete_reason(snapshot: RecordedSnapshot, topology: Topology) -> str:
    """Why ``snapshot`` did not complete: who never recorded, who waits for which marker."""
    parts = []
    never = [p for p in topology.processes if p not in snapshot.states]
    if never:
        parts.append(
            f"{', '.join(never)} never recorded (no marker reached "
            f"{'it' if len(never) == 1 else 'them'}: not reachable from any initiator)"
        )
    parts += [
        f"{dst} still waits for a marker on {src}->{dst}"
        for src, dst in topology.channels
        if dst in snapshot.states and (src, dst) not in snapshot.closed
    ]
    return "; ".join(parts)


def format_snapshot(snapshot: RecordedSnapshot, topology: Topology) -> str:
    """One snapshot as a block of the text format."""
    lines = [str(snapshot.snapshot_id)]
    if not snapshot.complete:
        lines.append(f"# incomplete: {incomplete_reason(snapshot, topology)}")
    lines += [f"{p} {snapshot.states[p]}" for p in topology.processes if p in snapshot.states]
    lines += [f"{src} {dst} {payment}" for (src, dst), payment in snapshot.messages]
    return "\n".join(lines) + "\n"


def format_snapshots(run: SimRun) -> str:
    """Every snapshot of ``run`` in the text format."""
    topology = run.scenario.topology
    return "\n".join(format_snapshot(s, topology) for s in run.snapshots.values())


def snapshot_to_dict(snapshot: RecordedSnapshot, topology: Topology) -> dict[str, Any]:
    processes = topology.processes
    return {
        "id": snapshot.snapshot_id,
        "complete": snapshot.complete,
        "incomplete_reason": None if snapshot.complete else incomplete_reason(snapshot, topology),
        "initiators": list(snapshot.initiators),
        "states": {p: snapshot.states[p] for p in processes if p in snapshot.states},
        "messages": [
            {"src": src, "dst": dst, "tokens": payment.amount, "payment": payment.id}
            for (src, dst), payment in snapshot.messages
        ],
        "recorded_tokens": snapshot.recorded_tokens,
    }


def run_to_dict(run: SimRun, verdict: Verdict | None = None) -> dict[str, Any]:
    """The run's snapshots, statistics and (optionally) the checker's verdict, as plain data."""
    topo = run.scenario.topology
    out: dict[str, Any] = {
        "seed": run.seed,
        "processes": list(topo.processes),
        "channels": [list(c) for c in topo.channels],
        "total_tokens": topo.total_tokens,
        "end_time": run.end_time,
        "stats": dict(run.stats),
        "final_balances": dict(run.final_balances),
        "snapshots": [snapshot_to_dict(s, topo) for s in run.snapshots.values()],
    }
    if verdict is not None:
        out["verdict"] = verdict.to_dict()
    return out
