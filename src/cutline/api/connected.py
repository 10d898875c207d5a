"""Two streams that meet in one operator's state: :class:`ConnectedStreams` (``connect``) and
the broadcast side of it (:class:`BroadcastStream`, ``broadcast()``)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from cutline.api.event_time import common_time
from cutline.runtime.co_operators import (
    BroadcastProcessFunction,
    BroadcastProcessLogic,
    CoProcessLogic,
    KeyedCoProcessFunction,
)
from cutline.runtime.graph import Edge, Partitioning
from cutline.runtime.operators import Logic, OnError

if TYPE_CHECKING:
    from cutline.api.keyed import KeyedStream
    from cutline.api.streams import DataStream


class BroadcastStream:
    """A stream whose every record goes to every subtask of the operator that reads it
    (:meth:`DataStream.broadcast`): the side of a :meth:`DataStream.connect` that writes
    the broadcast state."""

    def __init__(self, stream: DataStream) -> None:
        self.stream = stream


class ConnectedStreams:
    """Two streams read by one operator, which tells their records apart: the ``connect`` of
    two keyed streams (a :class:`~cutline.KeyedCoProcessFunction`: one key space and its
    state and timers, shared by both) or of a stream with a broadcast one (a
    :class:`~cutline.BroadcastProcessFunction`: the broadcast state every subtask holds)."""

    def __init__(self, first: KeyedStream | DataStream, second: KeyedStream | BroadcastStream):
        self.first = first
        self.second = second

    def process(
        self,
        function: KeyedCoProcessFunction | BroadcastProcessFunction,
        *,
        name: str | None = None,
        on_error: OnError = "fail",
    ) -> DataStream:
        """Run ``function`` on the records of both streams: ``process_left`` /
        ``process_right`` (keyed) or ``process`` / ``process_broadcast`` (broadcast), in the
        order they arrive; returns the stream of what it emits.

        :param name: the operator's stable id in checkpoints, and its name in messages.
        :param on_error: what a record whose function raises does: ``"fail"`` the job, or go
            to the ``"dead_letter"`` output."""
        from cutline.api.keyed import KeyedStream  # (it builds on the streams)

        first, second = self.first, self.second
        label = f"process({type(function).__name__})"
        logic: Logic
        if isinstance(second, BroadcastStream):
            if not isinstance(function, BroadcastProcessFunction):
                raise TypeError(
                    f"{label}: the connect of a stream with a broadcast one takes an instance "
                    "of a BroadcastProcessFunction subclass, not "
                    f"{type(function).__name__}"
                )
            assert not isinstance(first, KeyedStream)
            left = Edge(first.operator.uid, Partitioning.FORWARD)
            right = Edge(second.stream.operator.uid, Partitioning.BROADCAST, port=1)
            logic = BroadcastProcessLogic(function)
            streams = (first, second.stream)
        else:
            if not isinstance(function, KeyedCoProcessFunction):
                raise TypeError(
                    f"{label}: the connect of two keyed streams takes an instance of a "
                    f"KeyedCoProcessFunction subclass, not {type(function).__name__}"
                )
            assert isinstance(first, KeyedStream)
            left = Edge(first.stream.operator.uid, Partitioning.HASH, first.key)
            right = Edge(second.stream.operator.uid, Partitioning.HASH, second.key, port=1)
            logic = CoProcessLogic(function, first.key, second.key)
            streams = (first.stream, second.stream)
        env = streams[0].env
        operator = env._add(label, logic, [left, right], name, on_error)
        from cutline.api.streams import DataStream

        return DataStream(env, operator, common_time([s.event_time for s in streams]))


def connect_keyed(first: KeyedStream, second: Any) -> ConnectedStreams:
    """``first.connect(second)`` of a keyed stream, checked."""
    from cutline.api.keyed import KeyedStream

    if isinstance(second, BroadcastStream):
        raise TypeError(
            "connect: a keyed stream with a broadcast one is not supported (yet): connect the "
            "stream before key_by, as stream.connect(rules.broadcast())"
        )
    if not isinstance(second, KeyedStream):
        raise TypeError(
            "connect: a keyed stream connects to another keyed stream (key_by it first: both "
            f"sides' keys meet in one key space), not a {type(second).__name__}"
        )
    _same_env(first.stream, second.stream)
    check_key_types(first.stream.schema, first.key, second.stream.schema, second.key, "connect")
    return ConnectedStreams(first, second)


def connect_broadcast(first: DataStream, second: Any) -> ConnectedStreams:
    """``first.connect(second)`` of a stream that is not keyed, checked."""
    from cutline.api.keyed import KeyedStream

    if isinstance(second, KeyedStream):
        raise TypeError(
            "connect: a stream that is not keyed connects to a broadcast stream "
            "(other.broadcast()); to connect two keyed streams, key_by this one too"
        )
    if not isinstance(second, BroadcastStream):
        raise TypeError(
            "connect takes a broadcast stream (other.broadcast()) here, not a "
            f"{type(second).__name__}; to connect two streams by key, key_by both"
        )
    _same_env(first, second.stream)
    return ConnectedStreams(first, second)


def _same_env(first: DataStream, second: DataStream) -> None:
    if first.env is not second.env:
        raise ValueError("connect of streams from different StreamEnvironments")


def check_key_types(
    left: pa.Schema | None,
    left_key: str | Callable[[Any], Hashable],
    right: pa.Schema | None,
    right_key: str | Callable[[Any], Hashable],
    what: str,
) -> None:
    """Refuse keys known (columns of known types) to be of types that never compare equal:
    equal keys of both sides must be one key (integers of any width are one kind, strings of
    any size another)."""
    if left is None or right is None or not isinstance(left_key, str):
        return
    if not isinstance(right_key, str):
        return
    if left.get_field_index(left_key) < 0 or right.get_field_index(right_key) < 0:
        return
    one, other = left.field(left_key).type, right.field(right_key).type
    if _kind(one) != _kind(other):
        raise TypeError(
            f"{what}: the keys are of different types: the left's {left_key!r} is {one}, the "
            f"right's {right_key!r} is {other}; equal keys would never meet (cast one side "
            "first)"
        )


def _kind(kind: pa.DataType) -> str:
    if pa.types.is_integer(kind):
        return "integer"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "string"
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return "binary"
    return str(kind)
