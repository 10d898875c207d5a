"""A checkpoint's metadata, as the driver writes it once every subtask acknowledged: the
subtasks' state handles, what the job was (its operators, parallelism, checkpointing mode),
what it had counted, and the check that its channels form a consistent cut."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from cutline.protocol.coordinator import WriteMetadata
from cutline.protocol.cut import channel_cuts, check_cut
from cutline.runtime.checkpoint.layout import CheckpointMetadata, StateHandle
from cutline.runtime.driver.stats_tracker import CheckpointStatsTracker
from cutline.runtime.graph import Operator
from cutline.runtime.sink_operator import SinkLogic
from cutline.runtime.task.launch import Checkpointing

if TYPE_CHECKING:
    from cutline.runtime.driver.run import JobRun


def checkpoint_metadata(
    run: JobRun,
    generation: int,
    stats: CheckpointStatsTracker,
    action: WriteMetadata[str, dict[str, Any]],
    savepoint: bool,
) -> CheckpointMetadata:
    """The checkpoint's metadata; ``ValueError`` if its channels do not form a consistent
    cut (``protocol/cut.py``): such a checkpoint is never completed."""
    plan, mode = run.plan, run.config.barriers.mode
    operators = [op for chain in plan.chains for op in chain.operators]
    metadata = CheckpointMetadata(
        checkpoint_id=action.checkpoint_id,
        generation=generation,
        handles={s: StateHandle.from_dict(h) for s, h in action.handles},
        extra={
            "savepoint": savepoint,
            "run": run.run_id,
            "parallelism": plan.parallelism,
            "max_parallelism": plan.max_parallelism,
            "operators": [op.uid for op in operators],
            "operator_names": {op.uid: op.name for op in operators},
            "operator_kinds": {op.uid: operator_kind(op) for op in operators},
            "checkpointing": mode,
            "time": time.time(),
        },
    )
    counts = stats.counted(action.checkpoint_id, plan.subtasks())
    if counts is not None:  # (a restore of it goes on counting from them)
        metadata.extra.update(counts.to_extra())
    violations = check_cut(
        channel_cuts(
            {s: h.channels for s, h in metadata.handles.items() if h.channels is not None}
        ),
        at_least_once=mode is Checkpointing.AT_LEAST_ONCE,
    )
    if violations:
        raise ValueError(
            f"it is not a consistent cut: {violations[0]}"
            + (f" (and {len(violations) - 1} more channels)" if len(violations) > 1 else "")
        )
    return metadata


def operator_kind(op: Operator) -> str:
    """What kind of state operator ``op`` has (``CheckpointReader.operators`` says it)."""
    if op.is_source:
        return "source"
    if isinstance(op.logic, SinkLogic):
        return "sink"
    return "keyed" if getattr(op.logic, "keyed", False) else "operator"
