"""Where a subtask sends what its chain makes: :class:`SubtaskOutputs`.

A subtask has an output channel to every subtask of each chain downstream of it (a forward
edge: one). They are opened once every slot said where its gates listen, each with the
records a restored unaligned checkpoint recorded on it first (its output channel state: sent
again before anything new). Then

* records go on every edge that carries them (the main output, or a side output such as a
  window's late records): whole on a forward edge, split by key group on a keyed one (a key
  that cannot be taken goes to the key function's ``on_error``), counted per channel for the
  consistent-cut check of every checkpoint;
* a checkpoint's barrier goes on every channel, in line, or (unaligned) ahead of the queued
  records, which become the output side of the checkpoint's channel state;
* watermarks, idleness and the end of input go on every channel, in line.

A subtask takes in a batch only when every channel has room for what it makes, so that it
never blocks in a send and always sees barriers, timeouts and the driver's messages.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeAlias

from cutline.runtime.graph import Chain, Partitioning
from cutline.runtime.network.output_channel import OutputChannel
from cutline.runtime.network.wire import (
    Barrier,
    EndOfInput,
    Records,
    Watermark,
    WatermarkStatus,
    recorded_records,
    replayed,
)
from cutline.runtime.operators import (
    Batch,
    OperatorContext,
    Partitioner,
    RecordError,
    function_name,
)
from cutline.runtime.task.checkpoints import SubtaskCheckpoint
from cutline.runtime.task.launch import SlotSetup

Output: TypeAlias = tuple[str, list[OutputChannel], Partitioner | None, str | None]
"""An output edge of a subtask: the downstream chain, its channels, how records are split
between them, and the side output it carries (``"late"``; ``None``: the main output)."""


class SubtaskOutputs:
    """The output edges of one subtask and what was sent on them.

    :param working_on: told the name of the work a keyed edge's split does on behalf of the
        keyed operator (its key function), so that a failure there names it.
    """

    def __init__(self, working_on: Callable[[str], None]) -> None:
        self.edges: list[Output] = []
        """Per output edge: the downstream chain, its channels, how records are split between
        them, and the side output it carries (``"late"``; ``None``: the main output)."""
        self.sides: tuple[str, ...] = ()
        """The side outputs of the chain's tail that an edge carries."""
        self.sent: dict[str, int] = {}
        """Records sent per output channel in this generation (the channel state it sends
        again after a restore included)."""
        self.records_sent = 0
        """Records sent on every channel (counted before they are sent), the restored output
        channel state included."""
        self._key_contexts: dict[str, OperatorContext] = {}
        """Downstream chain -> the context of the key function of the keyed edge to it."""
        self._working_on = working_on

    def open(
        self,
        setup: SlotSetup,
        chain: Chain,
        index: int,
        addresses: dict[tuple[int, str], tuple[str, int]],
        restored: dict[str, list[Any]],
        context: Callable[[str, str], OperatorContext],
    ) -> None:
        """Open the output channels of subtask ``index`` of ``chain`` to every downstream
        subtask, the output channel state ``restored`` on each first; ``context(name, uid)``
        makes the context of a keyed edge's key function."""
        plan = setup.plan
        for out in chain.outputs:
            channels = [
                OutputChannel(
                    addresses[(target, out.downstream)],
                    channel,
                    token=setup.token,
                    generation=setup.generation,
                    capacity=setup.buffer_capacity,
                )
                for channel, target in plan.output_channels(out, index)
            ]
            for channel in channels:  # the restored channel state goes first
                items = restored.get(channel.channel, [])
                self.records_sent += recorded_records(items)
                self.sent[channel.channel] = recorded_records(items)
                channel.preload([replayed(item) for item in items])
            partitioner = None
            if out.partitioning is Partitioning.HASH:
                assert out.key is not None
                head = plan.chain(out.downstream).operators[0]
                partitioner = Partitioner(
                    out.key,
                    plan.parallelism,
                    plan.max_parallelism,
                    nulls=getattr(head.logic, "null_keys", False),
                )
                key = out.key if isinstance(out.key, str) else function_name(out.key)
                # the key function belongs to the keyed operator: its on_error applies
                self._key_contexts[out.downstream] = context(
                    f"key_by({key}) of {head.name}", head.uid
                )
            assert out.partitioning is not Partitioning.FORWARD or len(channels) == 1
            self.edges.append((out.downstream, channels, partitioner, out.side))
        self.sides = tuple(sorted({side for *_, side in self.edges if side is not None}))

    def channels(self) -> list[OutputChannel]:
        """Every output channel of this subtask, of every output edge."""
        return [channel for _, channels, _, _ in self.edges for channel in channels]

    def has_room(self) -> bool:
        """Whether every output channel can take a batch without blocking."""
        return all(channel.has_room for channel in self.channels())

    def wait_for_room(self, timeout: float) -> None:
        for channel in self.channels():
            if not channel.has_room:
                channel.wait_for_room(timeout)
                return

    def emit(self, batch: Batch, side: str | None = None) -> None:
        """Send ``batch`` on every edge that carries ``side`` (``None``: the main output)."""
        for downstream, channels, partitioner, carries in self.edges:
            if carries != side:
                continue
            if partitioner is None:  # forward (one channel), or broadcast (the batch on each)
                records = Records(batch)
                for channel in channels:
                    self.records_sent += len(records)
                    self.sent[channel.channel] = self.sent.get(channel.channel, 0) + len(records)
                    channel.send(records)
                continue
            context = self._key_contexts[downstream]
            self._working_on(context.name)
            try:
                parts = partitioner.split(batch, context.fail)
            except RecordError as exc:
                context.fail(exc.record, exc)
                continue  # the whole batch went to the dead letters
            for channel, part in zip(channels, parts, strict=True):
                if len(part):
                    self.records_sent += len(part)
                    self.sent[channel.channel] = self.sent.get(channel.channel, 0) + len(part)
                    channel.send(Records(part))

    def broadcast(self, frame: Watermark | WatermarkStatus) -> None:
        """Send ``frame`` (event time's progress) on every output channel, in line."""
        for channel in self.channels():
            channel.send(frame)

    def end(self) -> None:
        """Send the end of input on every output channel."""
        frame = EndOfInput()
        for channel in self.channels():
            channel.send(frame)

    def forward(
        self, checkpoint: SubtaskCheckpoint, unaligned: bool, forced_aligned: bool = False
    ) -> None:
        """Emit the checkpoint's barrier on every output: in line, or (unaligned) ahead of
        the queued records, which become the output side of the checkpoint's channel state."""
        checkpoint_id = checkpoint.checkpoint_id
        base, savepoint = checkpoint.base, checkpoint.savepoint
        forwarding = checkpoint.pending
        if forwarding is not None and self.edges:
            forwarding.forwarded_at = time.time()
        if not unaligned:
            frame = Barrier(
                checkpoint_id, forced_aligned=forced_aligned, savepoint=savepoint, base=base
            )
            for channel in self.channels():
                if forwarding is not None:  # what the barrier waits behind (statistics)
                    forwarding.queued_ahead[channel.channel] = channel.records_ahead()
                channel.send(frame)
            return
        assert forwarding is not None  # an unaligned barrier is forwarded after the snapshot
        forwarding.unaligned = True
        frame = Barrier(checkpoint_id, unaligned=True, savepoint=savepoint, base=base)
        for channel in self.channels():
            forwarding.keep_output(channel.channel, channel.send_priority(frame))
