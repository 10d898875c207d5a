"""A sink subtask's connector at work: :class:`SinkLogic` runs any
:class:`~cutline.connectors.Sink` (the file sinks and ``collect`` are sinks of the API), its
writer writing each batch, preparing a committable at each barrier and committing when the
checkpoint is complete; :class:`RescaledStates`, the states a sink subtask takes over on a
restore at another parallelism. A record the destination refuses goes to the job's error
policy (the dead letters, or the job fails), the rest written."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cutline.connectors.sink import RecordError, Sink, SinkContext, SinkWriter
from cutline.runtime.operators import Batch, Logic, OperatorContext, RunningOperator, to_arrow


@dataclass(frozen=True)
class RescaledStates:
    """The state a sink subtask takes over on a restore at another parallelism: the states
    of the previous run's subtasks it stands in for (old subtask index -> state)."""

    states: dict[int, Any]

    @staticmethod
    def of(state: Any, subtask: int) -> dict[int, Any]:
        """A sink's restored state as its writer takes it: old subtask index -> state (its
        own at the same parallelism, those it adopts at another; none on a fresh start)."""
        if isinstance(state, RescaledStates):
            return dict(state.states)
        return {} if state is None else {subtask: state}


@dataclass(frozen=True)
class SinkLogic(Logic):
    """A sink operator: any connector's :class:`~cutline.connectors.Sink` (the file sinks and
    ``collect`` are sinks of the API), its writer committing at every checkpoint."""

    sink: Sink

    def open(self, ctx: OperatorContext, state: Any) -> RunningOperator:
        restored = RescaledStates.of(state, ctx.subtask)
        context = SinkContext(
            ctx.name,
            ctx.subtask,
            ctx.parallelism,
            ctx.generation,
            ctx.run,
            ctx.checkpoint_dir,
            ctx.storage_options,
            ctx.job,
            ctx.uid,
        )
        return _Sink(self.sink.writer(context, restored), self.sink.columnar, ctx)


class _Sink(RunningOperator):
    def __init__(self, writer: SinkWriter, columnar: bool, ctx: OperatorContext) -> None:
        self.writer, self.columnar, self.ctx = writer, columnar, ctx

    def process(self, batch: Batch) -> Batch | None:
        if self.columnar:
            try:
                batch = to_arrow(batch, f"{self.ctx.name}")
            except RecordError as exc:
                self.ctx.fail(exc.record, exc)
                return None
        try:
            self.writer.write(batch)
        except RecordError as exc:  # a record the destination refused (the writer took the
            self.ctx.fail(exc.record, exc)  # rest): to the dead letters, or the job fails
        return None  # (anything else: the writer cannot go on, the subtask fails)

    def snapshot(
        self, checkpoint_id: int, *, base: int | None = None, savepoint: bool = False
    ) -> Any:
        while True:
            try:
                return self.writer.prepare_commit(checkpoint_id)
            except RecordError as exc:  # refused while sending what it held: put aside, and
                self.ctx.fail(exc.record, exc)  # asked again (the dead letters are written
                # before the sink's committable is taken: ``SubtaskRunner._snapshot``)

    def notify_complete(self, checkpoint_id: int) -> None:
        self.writer.commit(checkpoint_id)

    def abort(self) -> None:
        self.writer.abort()

    def close(self) -> None:
        self.writer.close()
