"""Opening a subtask: what it restores and what its operators know.

Before its loop runs, a subtask (:class:`~cutline.runtime.task.subtask.SubtaskRunner`)

* gathers its part of the checkpoint the driver chose (:func:`restored`): its operators'
  state and, for an unaligned checkpoint or a loop, the channel state recorded on its input
  and output channels, which must be channels of this job;
* opens its dead letters (:func:`dead_letter_output`): a file sink of its own, restored like
  any sink;
* gives each operator, and each key function of an edge it sends on, what it knows of where
  it runs (:func:`operator_context`).

Its output channels are opened, the restored output channel state first, by
:class:`~cutline.runtime.task.outputs.SubtaskOutputs`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cutline.connectors.sink import SinkContext
from cutline.protocol.watermarks import EventClock
from cutline.runtime.checkpoint.location import CheckpointLocation
from cutline.runtime.checkpoint.restore import Gathered, gather
from cutline.runtime.checkpoint.state_file import DEAD_LETTERS
from cutline.runtime.graph import Chain, ExecutionPlan
from cutline.runtime.io.file_formats import JSONL
from cutline.runtime.io.sinks import FileSink
from cutline.runtime.operators import DeadLetterOutput, OperatorContext, RecordError
from cutline.runtime.sink_operator import RescaledStates
from cutline.runtime.task.launch import SlotSetup


def restored(
    setup: SlotSetup, chain: Chain, index: int, name: str
) -> tuple[CheckpointLocation | None, Gathered]:
    """Subtask ``index`` of ``chain`` (named ``name``): the folder of the checkpoint it
    restores and what it gathered from it (``None`` and nothing when it starts afresh)."""
    spec = setup.restore
    if spec is None:
        return None, Gathered()
    location = CheckpointLocation.open(spec.url, storage_options=setup.storage_options)
    gathered = gather(spec, location, setup.plan, chain, index)
    _check_channel_state(setup.plan, chain, index, name, spec.checkpoint_id, gathered)
    return location, gathered


def _check_channel_state(
    plan: ExecutionPlan, chain: Chain, index: int, name: str, checkpoint_id: int, gathered: Gathered
) -> None:
    """The recorded channels of the restored checkpoint must be channels of this job."""
    inputs = set(plan.input_channels(chain, index)) if not chain.is_source else set()
    outputs = {channel for out in chain.outputs for channel, _ in plan.output_channels(out, index)}
    for kind, recorded, known in (
        ("input", gathered.inputs, inputs),
        ("output", gathered.outputs, outputs),
    ):
        unknown = sorted(c for c, batches in recorded.items() if batches and c not in known)
        if unknown:
            raise RecordError(
                f"checkpoint {checkpoint_id} holds records in flight on {kind} channel "
                f"{unknown[0]!r} of {name}, which this job does not have: a checkpoint "
                "with channel state (unaligned, or of a loop) restores only into the same "
                "job graph at the same parallelism"
            )


def dead_letter_output(
    setup: SlotSetup, chain: Chain, index: int, restored: dict[str, Any]
) -> DeadLetterOutput | None:
    """The subtask's dead letters (``None`` when the job keeps none): JSON lines in a folder
    of ``dead_letter_dir`` per chain, restored with the parts of the old subtasks it adopts."""
    if setup.dead_letter_dir is None:
        return None
    sink = FileSink(
        f"{setup.dead_letter_dir.rstrip('/')}/{chain.uid}",
        JSONL,
        setup.storage_options,
    )
    adopted = RescaledStates.of(restored.get(DEAD_LETTERS), index)
    context = SinkContext(
        "dead letters",
        index,
        setup.plan.parallelism,
        setup.generation,
        setup.run,
        job=setup.job,
    )
    return DeadLetterOutput(sink.writer(context, adopted))


def operator_context(
    setup: SlotSetup,
    chain: Chain,
    index: int,
    name: str,
    uid: str,
    *,
    dead_letters: DeadLetterOutput | None,
    restore_location: CheckpointLocation | None,
    warn: Callable[[str], None],
    skipped: Callable[[str, int, str], None] | None = None,
    clock: EventClock,
    position: int,
) -> OperatorContext:
    """What the operator ``uid`` of subtask ``index`` of ``chain`` (or work done on its
    behalf, named ``name``) knows; ``clock`` is the subtask's event time, the operator's at
    ``position`` (its place among the chain's operators after the source)."""
    plan = setup.plan
    return OperatorContext(
        name=name,
        subtask=index,
        parallelism=plan.parallelism,
        max_parallelism=plan.max_parallelism,
        generation=setup.generation,
        on_error=setup.on_error.get(uid, "fail"),
        dead_letters=dead_letters,
        run=setup.run,
        job=setup.job,
        uid=uid,
        state=setup.state,
        restore_store=restore_location,
        restore_checkpoint=(
            setup.restore.checkpoint_id if setup.restore is not None and setup.restore.own else None
        ),
        checkpoint_dir=setup.checkpoint_dir,
        storage_options=setup.storage_options,
        side_outputs=frozenset(
            out.side
            for out in chain.outputs
            if out.side is not None and uid == chain.operators[-1].uid
        ),
        warn=warn,
        skipped=skipped,
        clock=clock,
        position=position,
    )
