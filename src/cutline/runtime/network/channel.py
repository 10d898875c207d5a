"""Channels between subtasks over TCP, with credit-based flow control and barriers that can
overtake the records queued before them.

A subtask's :class:`InputGate` listens on one port for all its input channels.
Every accepted connection gets a reader thread that decodes frames
(:mod:`cutline.runtime.network.wire`) into that channel's queue. The queue has room for
``capacity`` records frames, and the sender may send only as many as it holds
**credits** for: the gate grants ``capacity`` when the channel connects and one
more each time the subtask consumes a frame. A sender without credit keeps its
frames in its own output queue (:class:`OutputChannel`), and when that is full
too, ``send`` blocks: that is the backpressure. A slow subtask slows its inputs,
memory stays bounded by ``capacity`` frames per channel on each side, and the
sockets never hold records the receiver has no room for, so a barrier can
always reach the receiver at once.

That is what **unaligned** barriers need (SEMANTICS §3): ``send_priority`` writes
a barrier ahead of the sender's queued frames (they stay queued; they are returned,
to be kept as the output side of the checkpoint's channel state), and the gate hands
such a barrier to the subtask ahead of the frames queued before it on its channel,
together with those frames (:class:`PriorityBarrier`), which are still consumed later.

The subtask's loop calls :meth:`InputGate.poll` with the channels it must not
consume now (those blocked by barrier alignment); their frames stay queued.
**Back edges** (the feedback channel of a loop) get unbounded credit, so that a
loop can never deadlock on its own backpressure. Channels are read round robin
(back edges too: reading them first would starve the loop's input, and its barriers).

A connection whose hello carries another job's token or a stale generation is
refused and closed, and the gate goes on waiting for the right one. A channel
whose connection ends before its end of input is an error: the upstream
subtask failed, and :meth:`InputGate.poll` raises :class:`ChannelError`.

This module holds what both ends share; the receiving end, :class:`InputGate`, is in
``input_gate.py``, the sending end, :class:`OutputChannel`, in ``output_channel.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from cutline.runtime.network.wire import Barrier, InBand, Records, Watermark, WatermarkStatus

READ_SIZE = 256 * 1024
"""Bytes read from a socket at a time."""

UNBOUNDED_CREDIT = 0x7FFFFFFF
"""The credit a back edge gets: a loop must not wait for itself."""

IN_BAND = (Records, Watermark, WatermarkStatus)
"""The frames a barrier overtakes when it goes unaligned (kept as channel state, in order)."""


@dataclass(frozen=True, slots=True)
class PriorityBarrier:
    """An unaligned barrier, handed to the subtask ahead of ``overtaken``: the records frames
    (and watermarks, in order) of its channel that were queued before it (still queued,
    consumed later)."""

    barrier: Barrier
    overtaken: tuple[InBand, ...]


class ChannelError(Exception):
    """A channel broke: its upstream disconnected early, or sent bytes that are not frames."""
