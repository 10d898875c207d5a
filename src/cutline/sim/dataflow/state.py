"""What the dataflow model (:mod:`cutline.sim.dataflow.model`) is made of while it runs, and
what a run leaves for the checker (:mod:`cutline.sim.dataflow.check`).

**Channels** (:class:`Channel`). A record on a channel is in one of three places, in FIFO
order: the sender's *output buffer* (at most ``buffer_capacity`` records; unbounded on back
edges, as a loop with bounded buffers all round can deadlock), the *wire* (unbounded, FIFO
like TCP), or the receiver's *input buffer* (at most ``input_capacity`` records). Barriers
and end-of-input markers do not count against the bounds.

**Subtasks** (:class:`Task`). A source emits its records in order (its offset is how many);
an operator subtask's state is the multiset of the records it processed, and its barrier
handler is the real one. Each keeps what it consumed and emitted per channel, its counts for
the census of a loop, and a :class:`TaskSnapshot` per checkpoint it took: its state, the
records it had consumed and emitted per channel, and the channel state it recorded.

**A run** (:class:`DataflowRun`) is all of that at its end, with the checkpoints triggered,
completed and aborted, and the problems met.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from enum import Enum

from cutline.sim.dataflow.config import DataflowConfig, Handler
from cutline.sim.dataflow.graph import ChannelId, DataflowGraph, Item, Record


class Step(Enum):
    """What the model can do next (a step is ``(Step, *what it is done to)``)."""

    EMIT = "emit"
    """A source emits its next record (``task``)."""
    END = "end"
    """A source ends its outputs (``task``)."""
    SEND = "send"
    """A channel's output buffer puts its first item on the wire (``channel``)."""
    ARRIVE = "arrive"
    """The wire's first item reaches the channel's input buffer (``channel``)."""
    CONSUME = "consume"
    """The receiver takes the input buffer's first item (``channel``)."""
    TRIGGER = "trigger"
    """The coordinator triggers a checkpoint."""
    TIMEOUT = "timeout"
    """A subtask's alignment timer fires (``task``, ``checkpoint``)."""
    NOTICE = "notice"
    """A subtask hears a checkpoint was aborted (``task``, ``checkpoint``)."""
    ABORT = "abort"
    """The coordinator aborts the oldest checkpoint in flight."""
    CENSUS = "census"
    """The loop's termination detector starts a wave."""
    COUNT = "count"
    """A subtask answers a wave with its counts (``task``, ``wave``)."""
    LOOP_END = "loop_end"
    """The loop is over: its heads end their outputs."""


@dataclass
class TaskSnapshot:
    """What one subtask took for one checkpoint."""

    checkpoint_id: int
    state: Counter[Record]
    """The operator's state (empty for a source)."""
    offset: int
    """For a source, the records emitted so far (its read position)."""
    consumed: dict[ChannelId, int]
    """Per input, how many records the subtask had consumed from it."""
    emitted: dict[ChannelId, int]
    """Per output, how many records the subtask had emitted on it."""
    input_state: dict[ChannelId, list[Record]] = field(default_factory=dict)
    """The recorded input side of the channel state (``RecordMessage``)."""
    output_state: dict[ChannelId, list[Record]] = field(default_factory=dict)
    """The records an unaligned barrier overtook in the output buffers."""
    ended: frozenset[ChannelId] = frozenset()
    """The inputs whose end of input the subtask had consumed."""
    finished: bool = False
    """The subtask had ended without hearing of the checkpoint: the cut is at its end."""
    forwarded: bool = False
    complete: bool = False
    declined: bool = False


@dataclass
class DataflowRun:
    """Everything a run did, for the checker (:mod:`cutline.sim.dataflow.check`)."""

    topology: DataflowGraph
    config: DataflowConfig
    consumed: dict[str, dict[ChannelId, list[Record]]]
    """Per subtask and input, every record consumed, in order."""
    emitted: dict[str, dict[ChannelId, list[Record]]]
    """Per subtask and output, every record emitted, in order."""
    snapshots: dict[str, dict[int, TaskSnapshot]]
    triggered: list[int]
    completed: list[int]
    """The checkpoints every subtask completed and the coordinator did not abort."""
    aborted: set[int]
    final_states: dict[str, Counter[Record]]
    problems: list[str]
    """What went wrong while running (handler errors, out-of-order actions, deadlock)."""
    stats: Counter[str]
    steps: int
    trace: list[str]


class Channel:
    __slots__ = (
        "arrive_step",
        "back_edge",
        "cid",
        "consume_step",
        "in_buf",
        "in_capacity",
        "in_loop",
        "in_records",
        "out_buf",
        "out_capacity",
        "out_records",
        "receiver",
        "send_step",
        "sender",
        "wire",
    )

    def __init__(
        self, cid: ChannelId, back_edge: bool, in_loop: bool, out_capacity: int, in_capacity: int
    ):
        self.cid = cid
        self.sender, self.receiver = cid
        self.back_edge = back_edge
        self.in_loop = in_loop
        """Both ends are in the loop: what moves on it is counted for the census."""
        self.out_capacity: int | None = None if back_edge else out_capacity
        self.in_capacity = in_capacity
        self.out_buf: deque[Item] = deque()
        self.wire: deque[Item] = deque()
        self.in_buf: deque[Item] = deque()
        self.out_records = 0
        self.in_records = 0
        self.send_step = (Step.SEND, cid)
        self.arrive_step = (Step.ARRIVE, cid)
        self.consume_step = (Step.CONSUME, cid)

    def has_room(self) -> bool:
        return self.out_capacity is None or self.out_records < self.out_capacity

    def empty(self) -> bool:
        return not (self.out_buf or self.wire or self.in_buf)

    def __str__(self) -> str:
        def show(q: deque[Item]) -> str:
            return " ".join(map(str, q))

        return (
            f"{self.sender}->{self.receiver} [{show(self.out_buf)} | {show(self.wire)} | "
            f"{show(self.in_buf)}]"
        )


def after_last_control(buf: deque[Item]) -> int:
    """The index just after the last barrier or end of input in ``buf`` (0 if none)."""
    for i in range(len(buf) - 1, -1, -1):
        if not isinstance(buf[i], Record):
            return i + 1
    return 0


class Task:
    def __init__(
        self,
        name: str,
        index: int,
        inputs: tuple[ChannelId, ...],
        outputs: tuple[ChannelId, ...],
        handler: Handler | None,
    ) -> None:
        self.name = name
        self.index = index
        """The source number (sources only)."""
        self.inputs = inputs
        self.outputs = outputs
        self.handler = handler
        self.state: Counter[Record] = Counter()
        self.offset = 0
        self.ended: set[ChannelId] = set()
        self.finished = False
        """It sent its end of input on."""
        self.consumed: dict[ChannelId, list[Record]] = {c: [] for c in inputs}
        self.emitted: dict[ChannelId, list[Record]] = {c: [] for c in outputs}
        self.snapshots: dict[int, TaskSnapshot] = {}
        self.heard: set[int] = set()
        """Checkpoints it received a barrier, an abort notice or an action of."""
        self.blocked: list[ChannelId] = []
        """The channels blocked by ``BlockChannel`` and not unblocked since."""
        self.loop_sent = 0
        """Records and barriers it put on a channel of the loop (its count for the census)."""
        self.loop_processed = 0
        """Records and barriers it consumed from a channel of the loop."""

    @property
    def is_source(self) -> bool:
        return self.handler is None

    def take(self, checkpoint_id: int, finished: bool) -> TaskSnapshot:
        snap = TaskSnapshot(
            checkpoint_id,
            Counter(self.state),
            self.offset,
            {c: len(v) for c, v in self.consumed.items()},
            {c: len(v) for c, v in self.emitted.items()},
            ended=frozenset(self.ended),
            finished=finished,
        )
        self.snapshots[checkpoint_id] = snap
        return snap
