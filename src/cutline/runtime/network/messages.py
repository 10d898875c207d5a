"""The messages of the control connection between the driver and its slots, typed.

Each message is a frozen dataclass; on the wire it is one JSON object per line, its ``kind``
beside its fields (:func:`encode`, :func:`decode`). A message that is not one of its side's,
lacks a field or has a field of the wrong type is a :class:`ControlError` naming it: the
connection ends and the driver treats the slot as lost, never a ``KeyError`` deep inside.
The receivers dispatch with ``match`` and ``assert_never``, so a new message that is not
handled everywhere is a type error.

================  ======================================================================
slot → driver     meaning
================  ======================================================================
``Phase``         the slot entered a phase of its start (``rendezvous`` with its process id
                  and host, then ``restore``)
``Gates``         the rendezvous: the slot's input gates are open, at these ports of its host
``Ready``         every subtask of the slot is set up and connected
``Heartbeat``     four times a second from a thread of its own, in every phase; records
                  in per subtask and live figures once the subtasks run
``Exhausted``     a source subtask read all its input
``Ack``           a subtask's state for a checkpoint is written (its handle and statistics)
``Decline``       a subtask cannot take a checkpoint (why)
``Failed``        a subtask failed (operator, record, error, traceback, and whether only
                  because a channel from another slot broke)
``Finished``      every subtask of the slot ended
``CensusCount``   the answer to a census: records the slot's subtasks sent and processed
``Warn``          something the user must hear of that is not a failure (a file changed
                  after it was read), for the job's listener
``Skipped``       a source's reader skipped records it will never read (a position its
                  split no longer held, and the user's policy said read on elsewhere)
================  ======================================================================

================  ======================================================================
driver → slot     meaning
================  ======================================================================
``Peers``         the rendezvous is over: every slot's host and gate ports, in slot order
``Trigger``       take checkpoint ``checkpoint`` (``final``: the last one; ``savepoint``;
                  ``base``: the newest complete checkpoint, for incremental state)
``Complete``      checkpoint ``checkpoint`` is complete: publish what it pre-committed
``Abort``         checkpoint ``checkpoint`` is dropped
``Stop``          stop now (the attempt ends)
``Drain``         sources stop reading (a stop with a final checkpoint, for unbounded input)
``Census``        count records sent and processed (termination detection for loops)
``Release``       a checkpoint completed and the listener was told: held sources read on
================  ======================================================================

``Lost`` is never sent: the driver's end of the connection reports it when a slot's
connection ends before ``Finished`` (or carried something that is not a message).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

from cutline.runtime.fields import conforms, field_types


class ControlError(Exception):
    """The control connection failed or carried something that is not a control message."""


MAX_LINE = 1024 * 1024
"""The longest message line, in bytes, either way."""


# ------------------------------------------------------------------------------ slot -> driver


@dataclass(frozen=True)
class Phase:
    kind: ClassVar[str] = "phase"
    phase: str
    pid: int | None = None
    host: str | None = None


@dataclass(frozen=True)
class Gates:
    """The slot's input gates are open: the upstream subtasks of its chains connect to
    ``host`` at ``ports`` (chain uid -> port)."""

    kind: ClassVar[str] = "gates"
    host: str
    ports: dict[str, int]


@dataclass(frozen=True)
class Ready:
    kind: ClassVar[str] = "ready"
    pid: int
    host: str


@dataclass(frozen=True)
class Heartbeat:
    kind: ClassVar[str] = "heartbeat"
    records_in: dict[str, int]
    metrics: dict[str, Any]


@dataclass(frozen=True)
class Exhausted:
    kind: ClassVar[str] = "exhausted"
    subtask: str


@dataclass(frozen=True)
class Ack:
    kind: ClassVar[str] = "ack"
    subtask: str
    checkpoint: int
    handle: dict[str, Any]
    """The subtask's :class:`~cutline.runtime.checkpoint.layout.StateHandle`, as a dict."""
    alignment: float = 0.0
    asynchronous: float = 0.0
    unaligned: bool = False
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The figures of the checkpoint's statistics (``runtime/checkpoint/stats.py``)."""


@dataclass(frozen=True)
class Decline:
    kind: ClassVar[str] = "decline"
    subtask: str
    checkpoint: int
    reason: str


@dataclass(frozen=True)
class Failed:
    kind: ClassVar[str] = "failed"
    subtask: str
    error: str
    operator: str | None = None
    record: str | None = None
    traceback: str | None = None
    cause: str = "task"
    """``task``: the subtask's own failure; ``channel``: only because a channel from another
    slot broke (a consequence: that slot's report is the cause)."""


@dataclass(frozen=True)
class Finished:
    kind: ClassVar[str] = "finished"
    records_in: dict[str, int]
    metrics: dict[str, Any]


@dataclass(frozen=True)
class CensusCount:
    kind: ClassVar[str] = "census"
    wave: int
    sent: int
    done: int


@dataclass(frozen=True)
class Warn:
    kind: ClassVar[str] = "warn"
    subtask: str
    message: str


@dataclass(frozen=True)
class Skipped:
    """Records source ``source`` will never read of split ``split``: ``records`` of them,
    ``why`` (which names the split and both positions: one skip, however often a restore
    repeats it, has one ``why``)."""

    kind: ClassVar[str] = "skipped"
    subtask: str
    source: str
    split: str
    records: int
    why: str


@dataclass(frozen=True)
class Lost:
    """Not a message on the wire: the slot's connection ended early (``reason``)."""

    kind: ClassVar[str] = "lost"
    reason: str


SlotMessage: TypeAlias = (
    Phase
    | Gates
    | Ready
    | Heartbeat
    | Exhausted
    | Ack
    | Decline
    | Failed
    | Finished
    | CensusCount
    | Warn
    | Skipped
)
"""What a slot sends to the driver."""


# ------------------------------------------------------------------------------ driver -> slot


@dataclass(frozen=True)
class Peers:
    """Every slot's gates (:class:`Gates`), in slot order: each slot connects its output
    channels to them. Sent once all slots of the generation said theirs."""

    kind: ClassVar[str] = "peers"
    hosts: list[str]
    ports: list[dict[str, int]]


@dataclass(frozen=True)
class Trigger:
    kind: ClassVar[str] = "trigger"
    checkpoint: int
    final: bool = False
    savepoint: bool = False
    base: int | None = None


@dataclass(frozen=True)
class Complete:
    kind: ClassVar[str] = "complete"
    checkpoint: int


@dataclass(frozen=True)
class Abort:
    kind: ClassVar[str] = "abort"
    checkpoint: int


@dataclass(frozen=True)
class Stop:
    kind: ClassVar[str] = "stop"


@dataclass(frozen=True)
class Drain:
    kind: ClassVar[str] = "drain"


@dataclass(frozen=True)
class Census:
    kind: ClassVar[str] = "census"
    wave: int


@dataclass(frozen=True)
class Release:
    kind: ClassVar[str] = "release"
    checkpoint: int


DriverMessage: TypeAlias = Peers | Trigger | Complete | Abort | Stop | Drain | Census | Release
"""What the driver sends to a slot."""

Message: TypeAlias = SlotMessage | DriverMessage

SLOT_MESSAGES: dict[str, type[Any]] = {
    cls.kind: cls
    for cls in (
        Phase,
        Gates,
        Ready,
        Heartbeat,
        Exhausted,
        Ack,
        Decline,
        Failed,
        Finished,
        CensusCount,
        Warn,
        Skipped,
    )
}
DRIVER_MESSAGES: dict[str, type[Any]] = {
    cls.kind: cls for cls in (Peers, Trigger, Complete, Abort, Stop, Drain, Census, Release)
}


def encode(message: Message) -> bytes:
    """One JSON line: ``{"kind": ..., field: value, ...}``."""
    body = {f.name: getattr(message, f.name) for f in dataclasses.fields(message)}
    return encode_line(message.kind, body)


def encode_line(kind: str, body: dict[str, Any]) -> bytes:
    line = json.dumps({"kind": kind, **body}, separators=(",", ":")).encode() + b"\n"
    if len(line) > MAX_LINE:
        raise ControlError(f"a {kind!r} message of {len(line)} bytes is larger than {MAX_LINE}")
    return line


def decode(data: dict[str, Any], side: dict[str, type[Any]], sender: str) -> Any:
    """The message ``data`` holds, of the kinds in ``side`` (:data:`SLOT_MESSAGES` or
    :data:`DRIVER_MESSAGES`); a :class:`ControlError` naming ``sender`` and the problem if it
    is none of them or its fields do not fit."""
    kind = data.get("kind")
    cls = side.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ControlError(f"{sender} sent an unknown message {kind!r}")
    kind = str(kind)
    hints = field_types(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ControlError(f"{sender} sent {_a(kind)} message without {f.name!r}")
            continue
        value = data[f.name]
        if not conforms(value, hints[f.name]):
            raise ControlError(
                f"{sender} sent {_a(kind)} message whose {f.name!r} is {value!r}, "
                f"not {_name(hints[f.name])}"
            )
        values[f.name] = value
    return cls(**values)


def _a(kind: str) -> str:
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind!r}"


def _name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint)
