"""The global committers of a job's sinks, on the driver (Flink's post-commit topology).

A sink whose commit must cover every subtask at once (a table format) has a
:class:`~cutline.connectors.GlobalCommitter`. :class:`GlobalCommits` holds those of a job's
sinks for the whole run and calls each with every subtask's committables of a checkpoint:
once the checkpoint's metadata is written (it is complete) and before its subtasks hear of
it, and, after a failure, again for the checkpoint the job restores, before its slots start
(the committer is idempotent: it may have committed it already). The committables are read
from the checkpoint's state files, where the subtasks put them.
"""

from __future__ import annotations

from typing import Any

from cutline.connectors.sink import GlobalCommitter
from cutline.runtime.checkpoint.location import CheckpointLocation
from cutline.runtime.checkpoint.reader import CheckpointReader
from cutline.runtime.graph import ExecutionPlan
from cutline.runtime.sink_operator import SinkLogic


class GlobalCommitError(Exception):
    """A global commit failed (the message names the sink and the checkpoint)."""


class GlobalCommits:
    """The global committers of the sinks of ``plan`` (none for most jobs)."""

    def __init__(self, plan: ExecutionPlan) -> None:
        self.committers: dict[str, tuple[str, GlobalCommitter]] = {}
        for chain in plan.chains:
            for op in chain.operators:
                if isinstance(op.logic, SinkLogic):
                    committer = op.logic.sink.global_committer()
                    if committer is not None:
                        self.committers[op.uid] = (op.name, committer)

    def commit(self, checkpoint_id: int, location: CheckpointLocation) -> None:
        """Commit checkpoint ``checkpoint_id`` (complete, at ``location``) for every sink with a
        global committer; :class:`GlobalCommitError` if one fails."""
        if not self.committers:
            return
        reader = CheckpointReader(location, checkpoint_id)
        for uid, (name, committer) in self.committers.items():
            committables: list[Any] = [
                reader.state_file(subtask).operators[uid]
                for subtask, handle in sorted(reader.handles.items())
                if uid in handle.operators
            ]
            try:
                committer.commit(checkpoint_id, committables)
            except Exception as exc:
                raise GlobalCommitError(
                    f"sink {name}: the global commit of checkpoint {checkpoint_id} failed: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
