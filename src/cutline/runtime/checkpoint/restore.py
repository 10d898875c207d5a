"""Restoring a checkpoint or savepoint: into the same job, or one that changed, at the same or
another parallelism.

The driver checks the checkpoint against the job (:func:`plan_restore`) before any subtask
starts; every subtask then gathers its operators' state from the files of the previous run's
subtasks (:func:`gather`). State is matched by **operator uid** (the ``name=`` given to an
operator; give stateful operators names, so that changing other parts of a job keeps them),
and redistributed when the parallelism changed:

==================  ==========================================================================
operator            what a subtask ``i`` of ``p`` gets
==================  ==========================================================================
keyed               the keyed state handles of every old subtask whose key groups overlap its
                    own; it keeps only its key groups (``runtime/state.py``)
source              the union of every old subtask's per-split offsets; it reads its splits
                    from there (``runtime/sources.py``)
sink, dead letters  the states of the old subtasks ``j`` with ``j % p == i``: it publishes
                    their pre-committed output (``runtime/sinks.py``)
broadcast state     its own; at another parallelism, every old subtask's copy (the operator
                    checks that they are the same and keeps one)
channel state       only at the same parallelism (records in flight belong to channels that
                    do not exist at another one)
==================  ==========================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cutline.runtime.checkpoint.layout import CheckpointMetadata, StateHandle
from cutline.runtime.checkpoint.location import CheckpointLocation
from cutline.runtime.checkpoint.state_file import DEAD_LETTERS, SubtaskState
from cutline.runtime.checkpoint.stats import RecordCounts
from cutline.runtime.graph import Chain, ExecutionPlan, subtask_name
from cutline.runtime.io.formats import SourceError
from cutline.runtime.operators import STATELESS, RecordError
from cutline.runtime.sink_operator import RescaledStates, SinkLogic
from cutline.runtime.source_operator import merge_source_states
from cutline.runtime.state.keygroups import key_group_range


class RestoreError(ValueError):
    """The checkpoint does not fit the job: the message says why and what to do."""


@dataclass(frozen=True)
class RestoreSpec:
    """Which checkpoint the subtasks restore, sent with their set-up."""

    url: str
    """The checkpoint's (or savepoint's) folder."""
    checkpoint_id: int
    parallelism: int
    """The parallelism of the job that took it."""
    handles: dict[str, dict[str, Any]]
    """Old subtask name -> its state handle."""
    own: bool = False
    """The checkpoint is one of this job's checkpoint directory (not a savepoint): incremental
    checkpoints may build on its shared files."""
    skipped: tuple[str, ...] = field(default=())
    """Operators with state in the checkpoint that the job does not have (allowed)."""
    counts: RecordCounts | None = None
    """What the job had counted at it, since it started (its metadata says; ``None``: a
    checkpoint of a version that did not count). The driver goes on counting from them."""


def plan_restore(
    metadata: CheckpointMetadata,
    url: str,
    plan: ExecutionPlan,
    *,
    own: bool,
    allow_non_restored_state: bool = False,
) -> RestoreSpec:
    """Check that checkpoint ``metadata`` (in folder ``url``) can be restored into ``plan``."""
    what = "savepoint" if metadata.extra.get("savepoint") else "checkpoint"
    name = f"{what} {metadata.checkpoint_id} ({url})"
    old_max = metadata.extra.get("max_parallelism", plan.max_parallelism)
    if old_max != plan.max_parallelism:
        raise RestoreError(
            f"{name} was taken with max_parallelism {old_max}, this job has "
            f"{plan.max_parallelism}: keyed state is split into that many key groups, so "
            "the number must stay the same for the life of a job"
        )
    old_parallelism = int(metadata.extra.get("parallelism", plan.parallelism))
    uids = {op.uid for chain in plan.chains for op in chain.operators}
    stateful = {
        uid
        for handle in metadata.handles.values()
        for uid in handle.operators
        if uid != DEAD_LETTERS
    }
    unknown = sorted(stateful - uids)
    if unknown and not allow_non_restored_state:
        # most often the same operators under other ids (renamed; or unnamed, and their
        # derived ids changed): say which of the job's operators found no state
        empty = [
            f"{op.uid!r} ({op.name})" if op.name != op.uid else repr(op.uid)
            for chain in plan.chains
            for op in chain.operators
            if op.uid not in stateful and not isinstance(op.logic, STATELESS)
        ]
        without = (
            f"the operators of this job without state in it are {', '.join(empty)}"
            if empty
            else "every operator of this job that keeps state has state in it"
        )
        raise RestoreError(
            f"{name} holds state of operator(s) {', '.join(map(repr, unknown))}, which this "
            f"job does not have; {without}. State is matched by operator id: an operator's "
            "name=..., or for an unnamed one an id derived from its kind, function and inputs "
            "(which changes when they do; earlier versions of cutline gave unnamed operators "
            "ids by position, like '3-sum_value_'). Give each stateful operator name=... with "
            "the id the checkpoint knows it by (e.g. .sum('value', name='3-sum_value_')), or "
            "pass allow_non_restored_state=True to start without that state"
        )
    if old_parallelism != plan.parallelism:
        with_channels = sorted(s for s, h in metadata.handles.items() if h.channel_state)
        if with_channels:
            raise RestoreError(
                f"{name} holds records in flight (subtask {with_channels[0]}: an unaligned "
                f"checkpoint, or records going round a loop), which restore only at its "
                f"parallelism {old_parallelism}, not {plan.parallelism}: keep the parallelism, "
                "or take a savepoint that stops the job (`cutline savepoint DIR --cancel`: "
                "aligned, and a loop is drained first) and restore that"
            )
    return RestoreSpec(
        url=url,
        checkpoint_id=metadata.checkpoint_id,
        parallelism=old_parallelism,
        handles={s: h.to_dict() for s, h in metadata.handles.items()},
        own=own,
        skipped=tuple(unknown),
        counts=RecordCounts.in_extra(metadata.extra),
    )


@dataclass
class Gathered:
    """What one subtask restores."""

    parts: dict[str, Any] = field(default_factory=dict)
    """Operator uid (or DEAD_LETTERS) -> what its ``open`` gets."""
    inputs: dict[str, list[Any]] = field(default_factory=dict)
    outputs: dict[str, list[Any]] = field(default_factory=dict)


def _index(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


def gather(
    spec: RestoreSpec,
    location: CheckpointLocation,
    plan: ExecutionPlan,
    chain: Chain,
    index: int,
) -> Gathered:
    """Read what subtask ``index`` of ``chain`` restores from the previous run's files."""
    handles = {name: StateHandle.from_dict(h) for name, h in spec.handles.items()}
    files: dict[str, SubtaskState] = {}

    def state_of(name: str) -> SubtaskState:
        if name not in files:
            files[name] = SubtaskState.decode(location.read_state(handles[name]), name)
        return files[name]

    same = spec.parallelism == plan.parallelism
    mine = key_group_range(index, plan.parallelism, plan.max_parallelism)
    gathered = Gathered()

    def holders(uid: str, accept: Callable[[str], bool] | None = None) -> list[str]:
        return sorted(
            (n for n, h in handles.items() if uid in h.operators and (accept is None or accept(n))),
            key=_index,
        )

    for op in chain.operators:
        uid = op.uid
        if op.is_source:
            if same:
                names = holders(uid, lambda n: _index(n) == index)
                offsets = [state_of(n).operators[uid] for n in names]
                if offsets:
                    gathered.parts[uid] = offsets[0]
            else:
                offsets = [state_of(n).operators[uid] for n in holders(uid)]
                if offsets:
                    try:
                        gathered.parts[uid] = merge_source_states(offsets, op.name)
                    except SourceError as exc:
                        raise RecordError(str(exc)) from None
        elif getattr(op.logic, "keyed", False):
            overlapping = holders(
                uid,
                lambda n: _overlaps(
                    key_group_range(_index(n), spec.parallelism, plan.max_parallelism), mine
                ),
            )
            parts = [state_of(n).operators[uid] for n in overlapping]
            if any(not (isinstance(p, dict) and "keyed" in p) for p in parts):
                raise RecordError(
                    f"operator {op.name} is keyed in this job, but its state in the checkpoint "
                    "is not keyed state: was another kind of operator given its name?"
                )
            if parts:
                gathered.parts[uid] = parts
        elif isinstance(op.logic, SinkLogic):
            _adopt(gathered, uid, holders(uid), state_of, same, index, plan.parallelism)
        elif getattr(op.logic, "restores_every_copy", False):  # broadcast state: every copy
            names = holders(uid, lambda n: _index(n) == index) if same else holders(uid)
            if names:
                gathered.parts[uid] = [state_of(n).operators[uid] for n in names]
        else:
            names = holders(uid, lambda n: _index(n) == index) if same else holders(uid)
            if names and not same:
                raise RecordError(
                    f"operator {op.name} has state that cannot be redistributed to another "
                    "parallelism"
                )
            if names:
                part = state_of(names[0]).operators[uid]
                if isinstance(part, dict) and "keyed" in part:
                    raise RecordError(
                        f"operator {op.name} has keyed state in the checkpoint but is not keyed "
                        "in this job: was another kind of operator given its name?"
                    )
                gathered.parts[uid] = part
    dead = holders(DEAD_LETTERS, lambda n: n.rsplit("-", 1)[0] == chain.uid)
    _adopt(gathered, DEAD_LETTERS, dead, state_of, same, index, plan.parallelism)
    own = subtask_name(chain.uid, index)
    if same and own in handles and handles[own].channel_state:
        gathered.inputs = state_of(own).inputs
        gathered.outputs = state_of(own).outputs
    return gathered


def _overlaps(a: range, b: range) -> bool:
    return a.start < b.stop and b.start < a.stop


def _adopt(
    gathered: Gathered,
    uid: str,
    names: list[str],
    state_of: Callable[[str], SubtaskState],
    same: bool,
    index: int,
    parallelism: int,
) -> None:
    """A sink's state: its own at the same parallelism; else the old subtasks it stands in for."""
    if same:
        for name in names:
            if _index(name) == index:
                gathered.parts[uid] = state_of(name).operators[uid]
        return
    adopted = {
        _index(n): state_of(n).operators[uid] for n in names if _index(n) % parallelism == index
    }
    if adopted:
        gathered.parts[uid] = RescaledStates(adopted)
