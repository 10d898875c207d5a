"""The checker of the dataflow model (:mod:`cutline.sim.dataflow.model`): what a run must
show, independently of how the model ran it.

:func:`check_checkpoints` checks every checkpoint at every channel ``S -> R`` where both
``S`` and ``R`` completed it: the records ``S`` emitted on the channel before its snapshot
must be exactly, in order, the records ``R`` consumed from it before its snapshot, then
``R``'s recorded input state of the channel, then ``S``'s recorded output state
(exactly-once modes). In ``at_least_once`` mode they must be a prefix of the records ``R``
consumed before its snapshot and recorded (nothing lost, duplicates allowed).

:func:`check_replay` restores every subtask from a globally completed checkpoint (the
states, the sources' offsets, the subtasks that had ended), puts on every channel first
the receiver's recorded input state then the sender's recorded output state, runs to the
end without checkpoints, and compares the final states with those of a failure-free run
(:func:`reference_states`): equal in exactly-once modes, covering them with duplicates
allowed in ``at_least_once``. :func:`check_dataflow_run` does all of this at once, and also checks
that the run itself ends with the failure-free states.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Literal

from cutline.sim.dataflow.graph import END, ChannelId, DataflowGraph, Item, Record
from cutline.sim.dataflow.model import DataflowModel
from cutline.sim.dataflow.state import DataflowRun, TaskSnapshot


def reference_states(topology: DataflowGraph) -> dict[str, Counter[Record]]:
    """The final state of every operator in a failure-free run.

    A record's path is a fixed function of the record, and a state is the multiset of
    records processed, so every failure-free schedule ends in these states.
    """
    states: dict[str, Counter[Record]] = {name: Counter() for name in topology.operators}
    for i, source in enumerate(topology.sources):
        for seq in range(topology.records):
            hop = topology.route(source, topology.first_record(i, seq))
            while hop is not None:
                (_, receiver), record = hop
                states[receiver][record] += 1
                hop = topology.route(receiver, record)
    return states


def _show(records: Sequence[Record]) -> str:
    return "[" + " ".join(map(str, records)) + "]"


def check_checkpoints(run: DataflowRun) -> list[str]:
    """The channel-state identity for every checkpoint at every channel whose two ends
    completed it (see the module docstring), plus: a checkpoint counted as completed is
    complete at every subtask. Returns the problems found, as sentences."""
    problems: list[str] = []
    exactly_once = run.config.exactly_once
    topo = run.topology
    for n in run.triggered:
        if n in run.completed:
            missing = [s for s in topo.subtasks if not _complete(run, s, n)]
            if missing:
                problems.append(f"checkpoint {n} counted complete but not at {missing}")
        for cid in topo.channels:
            sender, receiver = cid
            ss = run.snapshots[sender].get(n)
            rs = run.snapshots[receiver].get(n)
            if ss is None or rs is None or not _complete(run, sender, n):
                continue
            if not _complete(run, receiver, n):
                continue
            sent = run.emitted[sender][cid][: ss.emitted[cid]]
            consumed = run.consumed[receiver][cid][: rs.consumed[cid]]
            recorded_in = rs.input_state.get(cid, [])
            recorded_out = ss.output_state.get(cid, [])
            cut = consumed + recorded_in + recorded_out
            ok = cut == sent if exactly_once else cut[: len(sent)] == sent and not recorded_out
            if not ok:
                problems.append(
                    f"checkpoint {n}, channel {sender}->{receiver}: {sender} sent "
                    f"{_show(sent)} before its snapshot, but the cut holds {_show(cut)} "
                    f"(consumed by {receiver} before its snapshot {_show(consumed)}, recorded "
                    f"by {receiver} {_show(recorded_in)}, recorded by {sender} "
                    f"{_show(recorded_out)})"
                )
        for name in topo.subtasks:
            snap = run.snapshots[name].get(n)
            if snap is not None and snap.complete:
                extra = set(snap.input_state) - set(topo.inputs(name))
                if extra:
                    problems.append(f"checkpoint {n}: {name} recorded channels {extra}")
    return problems


def _complete(run: DataflowRun, name: str, n: int) -> bool:
    snap = run.snapshots[name].get(n)
    return snap is not None and snap.complete and not snap.declined


def restore_point(
    run: DataflowRun, checkpoint_id: int
) -> tuple[dict[str, TaskSnapshot], dict[ChannelId, list[Item]]]:
    """The snapshots of checkpoint ``checkpoint_id`` (completed at every subtask) and the
    content of each channel to restore: the receiver's recorded input state, then the
    sender's recorded output state, then the end of input if the sender had ended. A
    channel into a subtask that had ended is left empty."""
    snaps = {name: run.snapshots[name][checkpoint_id] for name in run.topology.subtasks}
    contents: dict[ChannelId, list[Item]] = {}
    for cid in run.topology.channels:
        sender, receiver = cid
        if snaps[receiver].finished:
            continue
        items: list[Item] = [*snaps[receiver].input_state.get(cid, [])]
        items += snaps[sender].output_state.get(cid, [])
        if snaps[sender].finished:
            items.append(END)
        contents[cid] = items
    return snaps, contents


def replay(run: DataflowRun, checkpoint_id: int, *, seed: int | None = None) -> DataflowRun:
    """Restore every subtask from ``checkpoint_id`` and run to the end without
    checkpoints (with another schedule: ``seed``, by default derived from the run's)."""
    if checkpoint_id not in run.completed:
        raise ValueError(f"checkpoint {checkpoint_id} did not complete")
    cfg = run.config
    config = replace(
        cfg,
        seed=cfg.seed * 1009 + checkpoint_id if seed is None else seed,
        max_checkpoints=0,
        abort_weight=0.0,
    )
    return DataflowModel(run.topology, config, restore=restore_point(run, checkpoint_id)).run()


def compare_states(
    got: Mapping[str, Counter[Record]],
    want: Mapping[str, Counter[Record]],
    *,
    exactly_once: bool,
    what: str,
) -> list[str]:
    """Problems where the final states ``got`` differ from the failure-free ``want``:
    any difference (exactly-once), or a record missing or foreign (at-least-once)."""
    problems: list[str] = []
    for name, ref in want.items():
        state = got.get(name, Counter())
        missing = sorted(r for r in ref if state[r] < ref[r])
        foreign = sorted(r for r in state if r not in ref)
        dup = sorted(r for r in ref if state[r] > ref[r]) if exactly_once else []
        for label, records in (("missing", missing), ("duplicated", dup), ("foreign", foreign)):
            if records:
                problems.append(f"{what}: {name} has {label} records {_show(records[:8])}")
    return problems


def check_replay(run: DataflowRun, checkpoint_id: int, *, seed: int | None = None) -> list[str]:
    """Replay from ``checkpoint_id`` and compare the final states with the failure-free
    ones."""
    again = replay(run, checkpoint_id, seed=seed)
    what = f"replay from checkpoint {checkpoint_id}"
    problems = [f"{what}: {p}" for p in again.problems]
    return problems + compare_states(
        again.final_states,
        reference_states(run.topology),
        exactly_once=run.config.exactly_once,
        what=what,
    )


def check_dataflow_run(
    run: DataflowRun, *, replays: Literal["all", "last", "none"] = "all"
) -> list[str]:
    """Every check at once: the run's own problems, its final states against the
    failure-free ones (every mode processes each record exactly once without failures),
    :func:`check_checkpoints`, and :func:`check_replay` from every completed checkpoint
    (or the last one, or none)."""
    problems = list(run.problems)
    if problems:
        return problems
    problems += compare_states(
        run.final_states, reference_states(run.topology), exactly_once=True, what="the run"
    )
    problems += check_checkpoints(run)
    chosen = run.completed if replays == "all" else run.completed[-1:] if replays == "last" else []
    for n in chosen:
        problems += check_replay(run, n)
    return problems
