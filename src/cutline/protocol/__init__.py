"""Pure, I/O-free protocol state machines: events in, actions out.

Nothing in this package opens a socket, starts a thread, reads a clock or
draws a random number. The simulator (:mod:`cutline.sim`) and the runtime
drive the very same objects.

* :mod:`cutline.protocol.chandy_lamport` — the Chandy-Lamport recorder of one process;
* :mod:`cutline.protocol.alignment` — barrier handling of one subtask (aligned, unaligned,
  at-least-once, loops);
* :mod:`cutline.protocol.coordinator` — the checkpoint coordinator of one job;
* :mod:`cutline.protocol.registry` — the shared files of incremental checkpoints;
* :mod:`cutline.protocol.cut` — is a checkpoint a consistent cut?;
* :mod:`cutline.protocol.termination` — the end of a loop (termination detection in waves);
* :mod:`cutline.protocol.watermarks` — event time's progress: watermarks per source split and
  per subtask, idleness, and the event time each operator of a subtask reached
  (:class:`~cutline.protocol.watermarks.EventClock`);
* :mod:`cutline.protocol.inputs` — the watermark of a subtask with several logical inputs (a
  two-input operator's left and right): a valve per input, the least over the active inputs;
* :mod:`cutline.protocol.splits` — which subtask reads each split of a source, and where each
  split stands in a checkpoint.
"""

from cutline.protocol.alignment import (
    BarrierAction,
    BarrierAligner,
    BarrierOrderError,
    BarrierTracker,
    BlockChannel,
    DeclineCheckpoint,
    ForwardBarrier,
    SnapshotState,
    UnblockChannels,
)
from cutline.protocol.chandy_lamport import (
    Action,
    ChandyLamportRecorder,
    ChannelRecorded,
    RecordMessage,
    RecordState,
    SendMarker,
    SnapshotComplete,
    SnapshotStatus,
)
from cutline.protocol.coordinator import (
    AbortCheckpoint,
    CheckpointCoordinator,
    CheckpointSettings,
    CheckpointStatus,
    CoordinatorAction,
    DiscardCheckpoint,
    DiscardState,
    DuplicateAcknowledgementError,
    FailJob,
    NotifyCheckpointComplete,
    TriggerCheckpoint,
    UnknownCheckpointError,
    UnknownTaskError,
    WriteMetadata,
)
from cutline.protocol.errors import (
    DuplicateMarkerError,
    InvalidCheckpointIdError,
    InvalidSnapshotIdError,
    ProtocolError,
    UnknownChannelError,
)
from cutline.protocol.inputs import MultiInputValve, UnknownInputError
from cutline.protocol.registry import SharedStateRegistry
from cutline.protocol.termination import (
    AskCounts,
    NextWave,
    Terminated,
    TerminationAction,
    TerminationDetector,
    UnknownParticipantError,
)
from cutline.protocol.watermarks import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    EmitStatus,
    EmitWatermark,
    EventClock,
    SplitWatermarks,
    WatermarkAction,
    WatermarkError,
    WatermarkValve,
)

__all__ = [
    "MAX_WATERMARK",
    "MIN_WATERMARK",
    "AbortCheckpoint",
    "Action",
    "AskCounts",
    "BarrierAction",
    "BarrierAligner",
    "BarrierOrderError",
    "BarrierTracker",
    "BlockChannel",
    "ChandyLamportRecorder",
    "ChannelRecorded",
    "CheckpointCoordinator",
    "CheckpointSettings",
    "CheckpointStatus",
    "CoordinatorAction",
    "DeclineCheckpoint",
    "DiscardCheckpoint",
    "DiscardState",
    "DuplicateAcknowledgementError",
    "DuplicateMarkerError",
    "EmitStatus",
    "EmitWatermark",
    "EventClock",
    "FailJob",
    "ForwardBarrier",
    "InvalidCheckpointIdError",
    "InvalidSnapshotIdError",
    "MultiInputValve",
    "NextWave",
    "NotifyCheckpointComplete",
    "ProtocolError",
    "RecordMessage",
    "RecordState",
    "SendMarker",
    "SharedStateRegistry",
    "SnapshotComplete",
    "SnapshotState",
    "SnapshotStatus",
    "SplitWatermarks",
    "Terminated",
    "TerminationAction",
    "TerminationDetector",
    "TriggerCheckpoint",
    "UnblockChannels",
    "UnknownChannelError",
    "UnknownCheckpointError",
    "UnknownInputError",
    "UnknownParticipantError",
    "UnknownTaskError",
    "WatermarkAction",
    "WatermarkError",
    "WatermarkValve",
    "WriteMetadata",
]
