"""Pure, I/O-free protocol state machines: events in, actions out.

Nothing in this package opens a socket, starts a thread, reads a clock or
draws a random number. The simulator (:mod:`cutline.sim`) and the runtime
drive the very same objects.
"""

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
from cutline.protocol.errors import (
    DuplicateMarkerError,
    InvalidSnapshotIdError,
    ProtocolError,
    UnknownChannelError,
)

__all__ = [
    "Action",
    "ChandyLamportRecorder",
    "ChannelRecorded",
    "DuplicateMarkerError",
    "InvalidSnapshotIdError",
    "ProtocolError",
    "RecordMessage",
    "RecordState",
    "SendMarker",
    "SnapshotComplete",
    "SnapshotStatus",
    "UnknownChannelError",
]
