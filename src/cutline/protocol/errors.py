"""Errors raised by the protocol state machines.

A :class:`ProtocolError` means an event that cannot happen in a correct
execution was fed to a state machine: the caller (a simulator or a runtime)
has a bug, or the channel under it broke its FIFO / exactly-once promise.
The state machine is left unchanged by the event that raised.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """An event that is impossible in the state the protocol object is in."""


class UnknownChannelError(ProtocolError):
    """A marker or message arrived on a channel that is not an input of this process."""


class DuplicateMarkerError(ProtocolError):
    """A second marker for the same snapshot arrived on the same channel."""


class InvalidSnapshotIdError(ProtocolError):
    """A snapshot id that is not a non-negative integer."""


class InvalidCheckpointIdError(ProtocolError):
    """A checkpoint id that is not a non-negative integer."""
