"""The wire format of the channels between subtasks, as a sans-IO encoder and decoder.

A connection carries one channel, from one upstream subtask to one downstream
subtask. It opens with a :class:`Hello` that names the channel, the job's
**generation** (the restart attempt), so that a receiver refuses a stale
attempt's connection, and the job's secret **token**, so that a receiver
refuses anyone else before it reads (and unpickles) a single record. Then come frames, each a 9-byte header (kind, flags,
payload length) and a payload:

===================  ==========================================================
frame                payload
===================  ==========================================================
``Hello``            generation (8 bytes), token length (2 bytes), token, then
                     the channel id as UTF-8
``Records``          a batch of records: an Arrow IPC stream of one record batch
                     (columnar records), or a pickled list (any Python objects)
``Barrier``          checkpoint id (8 bytes), then its base plus one (8 bytes; 0:
                     none): the newest complete checkpoint when it was triggered,
                     which incremental state may build on; flag ``unaligned``: it
                     was sent ahead of the records queued before it (an unaligned
                     checkpoint); flag ``forced aligned``: align it whatever the
                     mode; flag ``savepoint``: the state goes in full, owned by it
``EndOfInput``       nothing: the upstream subtask has no more records
``Watermark``        a timestamp (8 bytes, signed, epoch ms): no record at or below it
                     follows on this channel (event time's progress)
``WatermarkStatus``  nothing; flag ``idle``: the upstream subtask holds no watermark
                     back (until it says it is active again)
``Credit``           (receiver to sender) how many more ``Records`` frames the
                     receiver has room for (4 bytes)
===================  ==========================================================

The receiver answers on the same connection with :class:`Credit` frames (no
hello: the sender knows whom it connected to); :class:`CreditDecoder` reads them.

:class:`FrameDecoder` turns bytes, however they were split by the network,
back into frames; it never reads a socket itself.
"""

from __future__ import annotations

import hmac
import pickle
import struct
from collections.abc import Collection
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import pyarrow as pa

MAGIC = b"CUTL"
VERSION = 1
_HEADER = struct.Struct(">BBI")  # kind, flags, payload length
_U64 = struct.Struct(">Q")
_U16 = struct.Struct(">H")
MAX_PAYLOAD = 256 * 1024 * 1024
"""A frame larger than this is refused: a corrupt stream, not a huge batch."""
MAX_HELLO = 8 + 2 + 0xFFFF + 1024
"""Before the hello is checked, a peer may make the receiver buffer no more than this."""


class WireError(Exception):
    """Bytes that are not a valid cutline channel stream."""


class RefusedConnectionError(WireError):
    """A hello from another job (wrong token) or from a stale generation of this one."""


class FrameKind(IntEnum):
    HELLO = 1
    RECORDS = 2
    BARRIER = 3
    END_OF_INPUT = 4
    CREDIT = 5
    WATERMARK = 6
    WATERMARK_STATUS = 7


_ARROW = 1  # flag: the Records payload is an Arrow IPC stream
_UNALIGNED = 1  # flag: the barrier overtook the records queued before it
_FORCED_ALIGNED = 2  # flag: the barrier must be aligned whatever the mode
_SAVEPOINT = 4  # flag: the checkpoint is a savepoint
_IDLE = 1  # flag: the watermark status is idle
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class Hello:
    """Opens a connection: which channel, and which generation of the job sends on it."""

    channel: str
    generation: int
    token: bytes = b""


@dataclass(frozen=True, slots=True)
class Records:
    """A batch of records: a ``pyarrow.RecordBatch`` or a list of Python objects."""

    batch: pa.RecordBatch | list[Any]

    def __len__(self) -> int:
        return self.batch.num_rows if isinstance(self.batch, pa.RecordBatch) else len(self.batch)


@dataclass(frozen=True, slots=True)
class Barrier:
    checkpoint_id: int
    unaligned: bool = False
    """It overtook the records queued before it (an unaligned checkpoint)."""
    forced_aligned: bool = False
    """Aligned whatever the job's mode (the final checkpoint, a savepoint: nothing may be left
    in flight)."""
    savepoint: bool = False
    """The checkpoint is a savepoint: every subtask writes its state in full, in files the
    savepoint owns."""
    base: int | None = None
    """The newest complete checkpoint when this one was triggered: incremental state may
    build on the files written for it."""


@dataclass(frozen=True, slots=True)
class EndOfInput:
    pass


@dataclass(frozen=True, slots=True)
class Watermark:
    """Event time's progress: no record with a timestamp at or below ``timestamp`` (epoch
    milliseconds) follows on this channel."""

    timestamp: int


@dataclass(frozen=True, slots=True)
class WatermarkStatus:
    """The upstream subtask is idle (it holds no watermark back), or active again."""

    idle: bool


@dataclass(frozen=True, slots=True)
class Credit:
    """From the receiver: room for ``count`` more ``Records`` frames."""

    count: int


Frame = Hello | Records | Barrier | EndOfInput | Watermark | WatermarkStatus

InBand = Records | Watermark | WatermarkStatus
"""What a channel carries between its barriers, in order: what an unaligned checkpoint records
as channel state."""


def recorded(frame: InBand) -> Any:
    """How channel state keeps ``frame``: a records frame as its batch, a watermark (or its
    status) as it is."""
    return frame.batch if isinstance(frame, Records) else frame


def replayed(item: Any) -> InBand:
    """The frame an item of channel state was (:func:`recorded`)."""
    return item if isinstance(item, Watermark | WatermarkStatus) else Records(item)


def recorded_records(items: list[Any]) -> int:
    """How many records items of channel state hold (watermarks are none)."""
    return sum(len(Records(i)) for i in items if not isinstance(i, Watermark | WatermarkStatus))


def encode(frame: Frame) -> bytes:
    """The bytes of one frame (a :class:`Hello` also gets the stream's magic and version)."""
    if isinstance(frame, Records):
        if isinstance(frame.batch, pa.RecordBatch):
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, frame.batch.schema) as writer:
                writer.write_batch(frame.batch)
            return _frame(FrameKind.RECORDS, sink.getvalue().to_pybytes(), _ARROW)
        return _frame(
            FrameKind.RECORDS, pickle.dumps(frame.batch, protocol=pickle.HIGHEST_PROTOCOL)
        )
    if isinstance(frame, Barrier):
        flags = (
            (_UNALIGNED if frame.unaligned else 0)
            | (_FORCED_ALIGNED if frame.forced_aligned else 0)
            | (_SAVEPOINT if frame.savepoint else 0)
        )
        base = 0 if frame.base is None else frame.base + 1
        return _frame(FrameKind.BARRIER, _U64.pack(frame.checkpoint_id) + _U64.pack(base), flags)
    if isinstance(frame, EndOfInput):
        return _frame(FrameKind.END_OF_INPUT, b"")
    if isinstance(frame, Watermark):
        return _frame(FrameKind.WATERMARK, _I64.pack(frame.timestamp))
    if isinstance(frame, WatermarkStatus):
        return _frame(FrameKind.WATERMARK_STATUS, b"", _IDLE if frame.idle else 0)
    if isinstance(frame, Hello):
        if len(frame.token) > 0xFFFF:
            raise WireError("a channel token is limited to 65535 bytes")
        payload = (
            _U64.pack(frame.generation)
            + _U16.pack(len(frame.token))
            + frame.token
            + frame.channel.encode("utf-8")
        )
        return MAGIC + bytes([VERSION]) + _frame(FrameKind.HELLO, payload)
    raise TypeError(f"not a frame: {frame!r}")


def encode_credit(count: int) -> bytes:
    """The bytes of one :class:`Credit` frame."""
    if not 0 < count <= 0xFFFFFFFF:
        raise WireError(f"a credit must be 1 to {0xFFFFFFFF}, not {count}")
    return _frame(FrameKind.CREDIT, _U32.pack(count))


class CreditDecoder:
    """Bytes from a receiver in, credits out (the sender's side of the flow control)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[int]:
        self._buffer += data
        credits: list[int] = []
        size = _HEADER.size + _U32.size
        while len(self._buffer) >= _HEADER.size:
            kind, _, length = _HEADER.unpack_from(self._buffer)
            if kind != FrameKind.CREDIT or length != _U32.size:
                raise WireError(f"the receiver sent a frame of kind {kind}, not a credit")
            if len(self._buffer) < size:
                break
            credits.append(_U32.unpack_from(self._buffer, _HEADER.size)[0])
            del self._buffer[:size]
        return credits


def _frame(kind: FrameKind, payload: bytes, flags: int = 0) -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise WireError(f"a frame of {len(payload)} bytes is larger than {MAX_PAYLOAD}")
    return _HEADER.pack(kind, flags, len(payload)) + payload


class FrameDecoder:
    """Bytes in, frames out. The first frame of a stream must be a :class:`Hello`.

    With ``token`` (and ``generation``) given, a hello with another token (or
    generation) raises :class:`RefusedConnectionError` before any later frame
    is decoded.
    """

    def __init__(
        self,
        *,
        token: bytes | None = None,
        generation: int | None = None,
        channels: Collection[str] | None = None,
    ) -> None:
        self._buffer = bytearray()
        self._greeted = False
        self._token = token
        self._generation = generation
        self._channels = channels
        self.hello: Hello | None = None
        """The stream's hello, once it is decoded."""

    def feed(self, data: bytes) -> list[Frame]:
        """Add received bytes; return every frame they complete.

        A refused hello raises before any later frame in the same bytes is decoded.
        """
        self._buffer += data  # before the hello, its header's length is capped at MAX_HELLO
        frames: list[Frame] = []
        while True:
            if not self._greeted:
                if len(self._buffer) < len(MAGIC) + 1:
                    return frames
                if bytes(self._buffer[: len(MAGIC)]) != MAGIC:
                    raise WireError("the stream does not start like a cutline channel")
                if self._buffer[len(MAGIC)] != VERSION:
                    raise WireError(
                        f"the peer speaks channel protocol version {self._buffer[len(MAGIC)]}, "
                        f"this side {VERSION}"
                    )
            offset = 0 if self._greeted else len(MAGIC) + 1
            if len(self._buffer) < offset + _HEADER.size:
                return frames
            kind, flags, length = _HEADER.unpack_from(self._buffer, offset)
            limit = MAX_PAYLOAD if self._greeted else MAX_HELLO
            if length > limit:
                raise WireError(f"a frame announces {length} bytes, more than {limit}")
            end = offset + _HEADER.size + length
            if len(self._buffer) < end:
                return frames
            payload = bytes(self._buffer[offset + _HEADER.size : end])
            del self._buffer[:end]
            frames.append(self._decode(kind, flags, payload))

    @property
    def pending_bytes(self) -> int:
        """Bytes received that do not yet make a whole frame."""
        return len(self._buffer)

    def _decode(self, kind: int, flags: int, payload: bytes) -> Frame:
        if not self._greeted:
            if kind != FrameKind.HELLO:
                raise WireError("the first frame of a channel must be its hello")
            fixed = _U64.size + _U16.size
            if len(payload) < fixed:
                raise WireError("a hello frame is too short")
            (token_length,) = _U16.unpack_from(payload, _U64.size)
            if len(payload) < fixed + token_length:
                raise WireError("a hello frame is too short for its token")
            self._greeted = True
            token = payload[fixed : fixed + token_length]
            try:
                channel = payload[fixed + token_length :].decode("utf-8")
            except UnicodeDecodeError:
                raise WireError("a hello frame names its channel in invalid UTF-8") from None
            hello = Hello(channel, _U64.unpack_from(payload)[0], token)
            if self._token is not None and not hmac.compare_digest(token, self._token):
                raise RefusedConnectionError(
                    f"channel {channel!r}: the peer's token is not this job's"
                )
            if self._generation is not None and hello.generation != self._generation:
                raise RefusedConnectionError(
                    f"channel {channel!r}: the peer belongs to generation {hello.generation} "
                    f"of the job, this is generation {self._generation}"
                )
            if self._channels is not None and channel not in self._channels:
                raise RefusedConnectionError(f"channel {channel!r} is not an input here")
            self.hello = hello
            return hello
        if kind == FrameKind.RECORDS:
            try:
                if flags & _ARROW:
                    with pa.ipc.open_stream(payload) as reader:
                        return Records(reader.read_next_batch())
                batch = pickle.loads(payload)
            except Exception as exc:
                raise WireError(f"a records frame cannot be read: {exc}") from exc
            if not isinstance(batch, list):
                raise WireError("a records frame does not hold a list of records")
            return Records(batch)
        if kind == FrameKind.BARRIER:
            if len(payload) != 2 * _U64.size:
                raise WireError("a barrier frame must hold a checkpoint id and its base")
            checkpoint_id, base = _U64.unpack_from(payload)[0], _U64.unpack_from(payload, 8)[0]
            return Barrier(
                checkpoint_id,
                bool(flags & _UNALIGNED),
                bool(flags & _FORCED_ALIGNED),
                bool(flags & _SAVEPOINT),
                base - 1 if base else None,
            )
        if kind == FrameKind.END_OF_INPUT:
            return EndOfInput()
        if kind == FrameKind.WATERMARK:
            if len(payload) != _I64.size:
                raise WireError("a watermark frame must hold one timestamp")
            return Watermark(_I64.unpack(payload)[0])
        if kind == FrameKind.WATERMARK_STATUS:
            return WatermarkStatus(bool(flags & _IDLE))
        if kind == FrameKind.HELLO:
            raise WireError("a second hello on one connection")
        raise WireError(f"unknown frame kind {kind}")
