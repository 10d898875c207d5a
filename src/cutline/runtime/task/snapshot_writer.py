"""The asynchronous part of a subtask's checkpoints: :class:`SnapshotWriter`.

A checkpoint's synchronous part runs in the subtask's loop
(:class:`~cutline.runtime.task.subtask.SubtaskRunner`), and leaves a
:class:`~cutline.runtime.task.checkpoints.PendingSnapshot`; once the checkpoint is whole here
(its channel state recorded) the writer takes that over:

* with an alignment timeout it holds the snapshot while the checkpoint's barrier still waits
  in an output queue: until the barrier left, the timeout can still take it ahead of the
  queue (unaligned), and the records it then overtakes belong to this snapshot;
* then it writes the snapshot on the subtask's snapshot thread, one at a time and in order,
  while records keep flowing: the keyed state segments, the sinks' committables (their part
  files written now), the state file (:mod:`cutline.runtime.checkpoint.state_file`);
* and acknowledges the checkpoint to the driver with its handle and figures, or declines it.
  A sink that cannot write its part fails the subtask instead (it cannot go on).
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor

from cutline.connectors.sink import PendingCommit
from cutline.runtime.checkpoint.state_file import DEAD_LETTERS, SubtaskState
from cutline.runtime.checkpoint.storage import CheckpointStorage
from cutline.runtime.graph import Chain
from cutline.runtime.network.control import ControlClient
from cutline.runtime.network.messages import Ack, ControlError, Decline
from cutline.runtime.network.output_channel import OutputChannel
from cutline.runtime.state.backend import KeyedSnapshot
from cutline.runtime.state.columns import handle_segments
from cutline.runtime.state.segments import SegmentRef
from cutline.runtime.task.checkpoints import PendingSnapshot, SubtaskCheckpoints
from cutline.runtime.task.failures import failed_message, shorten


class SnapshotWriter:
    """Writes the checkpoints of one subtask (named ``name``, of ``chain``) once they are
    whole here; ``outputs`` are its output channels, ``failed`` is told of a sink that broke
    on the snapshot thread."""

    def __init__(
        self,
        name: str,
        chain: Chain,
        generation: int,
        storage: CheckpointStorage,
        control: ControlClient,
        checkpoints: SubtaskCheckpoints,
        timeout: float | None,
        outputs: Callable[[], list[OutputChannel]],
        failed: Callable[[BaseException], None],
    ) -> None:
        self.name, self.chain, self.generation = name, chain, generation
        self.storage, self.control = storage, control
        self.checkpoints = checkpoints
        """The subtask's checkpoints in flight (shared with its loop)."""
        self._timeout = timeout
        """The alignment timeout (``None``: none)."""
        self._outputs, self._failed = outputs, failed
        self._snapshotter = ThreadPoolExecutor(1, thread_name_prefix=f"cutline-snap-{name}")
        self._writes: list[futures.Future[None]] = []

    def complete(self, checkpoint_id: int) -> None:
        """The checkpoint is whole here (its channel state recorded): write it and ack; with
        an alignment timeout, once its barrier has left every output queue (until then, the
        timeout can still turn it unaligned, and what it overtakes belongs to this state)."""
        checkpoint = self.checkpoints.get(checkpoint_id)
        if checkpoint is None or checkpoint.pending is None:
            return
        taking, checkpoint.pending = checkpoint.pending, None
        taking.arrivals, checkpoint.arrivals = checkpoint.arrivals, {}
        for older in self.checkpoints.older(checkpoint_id):
            if older.pending is None:
                older.arrivals = {}
        if self._timeout is not None and (
            self.checkpoints.unflushed() or self._barrier_queued(checkpoint_id)
        ):
            checkpoint.unflushed = taking  # (behind an earlier one: written in order)
            return
        self.checkpoints.forget_empty()
        self._submit(checkpoint_id, taking)

    def flush(self, now: float) -> None:
        """Write the checkpoints held (whole here), oldest first, whose barrier left the output
        queues; one whose barrier still waits that long after its trigger goes unaligned: its
        barrier is taken ahead of the queue, and the records it overtakes join the snapshot."""
        assert self._timeout is not None
        for checkpoint in self.checkpoints.unflushed():  # in order: a backend writes its
            n, taking = checkpoint.checkpoint_id, checkpoint.unflushed  # snapshots so
            assert taking is not None
            if self._barrier_queued(n):
                triggered = checkpoint.triggered
                if triggered is None or now < triggered + self._timeout:
                    break  # not yet (the later ones wait); or forced aligned: never
                for channel in self._outputs():
                    overtaken = channel.promote(n)
                    if overtaken is not None:
                        taking.unaligned = True
                        taking.keep_output(channel.channel, overtaken)
            checkpoint.unflushed = None
            self._submit(n, taking)

    def _barrier_queued(self, checkpoint_id: int) -> bool:
        return any(channel.holds_barrier(checkpoint_id) for channel in self._outputs())

    def _submit(self, checkpoint_id: int, taking: PendingSnapshot) -> None:
        """Write checkpoint ``checkpoint_id`` on the snapshot thread (in order)."""
        self._writes = [w for w in self._writes if not w.done()]
        self._writes.append(self._snapshotter.submit(self._write, checkpoint_id, taking))

    def wait(self, timeout: float) -> None:
        """Wait (up to ``timeout`` s) for the snapshot thread's write in progress: once a slot
        ends, nothing of its generation may still write (a sink's part file landing after the
        next generation cleaned up would stay forever). Writes the thread's shutdown cancelled
        never run: not waited for (``futures.wait`` never counts them done)."""
        running = [w for w in self._writes if not w.cancelled()]
        futures.wait(running, timeout=max(0.0, timeout))

    def shutdown(self, *, cancel: bool = False) -> None:
        """Stop the snapshot thread: after the writes submitted, or (``cancel``) at once,
        cancelling those that have not started."""
        self._snapshotter.shutdown(wait=not cancel, cancel_futures=cancel)

    def _write(self, checkpoint_id: int, taking: PendingSnapshot) -> None:
        """The asynchronous part: serialize, store, acknowledge (or decline)."""
        segments: list[SegmentRef] = []
        try:
            state = {}
            store = self.storage.segment_store(checkpoint_id)
            for number, (uid, part) in enumerate(taking.parts.items()):
                if isinstance(part, KeyedSnapshot):
                    name = (
                        f"g{self.generation}-{self.name}-{number}-c{checkpoint_id}-"
                        f"{secrets.token_hex(4)}"
                    )
                    part = part.write(store, name)
                    segments += handle_segments(part)
                elif isinstance(part, PendingCommit):  # a sink's committable, made now
                    try:
                        part = part.complete()
                    except Exception as exc:  # the sink is broken: the subtask fails
                        self._fail(uid, exc)
                        return
                state[uid] = part
            written = SubtaskState(state, taking.inputs, taking.outputs)
            channel_bytes = written.channel_state_bytes()
            data = written.encode()
            counts = taking.channel_counts()
            handle = self.storage.write_state(checkpoint_id, self.name, self.generation, data)
            handle = dataclasses.replace(
                handle,
                segments=tuple(segments),
                operators=tuple(uid for uid, part in state.items() if part is not None),
                channel_state=bool(taking.inputs or taking.outputs),
                channels=counts,
            )
        except Exception as exc:  # (segments written meanwhile are removed with the run's
            # unneeded files when the job ends)
            with contextlib.suppress(ControlError):
                reason = shorten(f"{type(exc).__name__}: {exc}")
                self.control.send(Decline(self.name, checkpoint_id, reason))
            return
        with contextlib.suppress(ControlError):
            self.control.send(
                Ack(
                    self.name,
                    checkpoint_id,
                    handle.to_dict(),
                    alignment=taking.alignment,
                    asynchronous=time.monotonic() - taking.sync_end,
                    unaligned=taking.unaligned,
                    stats=taking.statistics(store.written, channel_bytes),
                )
            )

    def _fail(self, uid: str, exc: BaseException) -> None:
        """A sink could not write its part: report the failure naming the sink (not a declined
        checkpoint: the sink cannot go on), and let the slot end the subtask."""
        name = "dead letters" if uid == DEAD_LETTERS else uid
        for op in self.chain.operators:
            if op.uid == uid:
                name = op.name
        with contextlib.suppress(ControlError):
            self.control.send(failed_message(self.name, exc, name))
        self._failed(exc)
