"""Operators of two inputs that a user's function drives (``connect``):

* :class:`KeyedCoProcessFunction`, for two keyed streams: ``process_left`` and
  ``process_right`` see the state and the timers of the current key, one key space shared by
  both inputs (a key of the left and the equal key of the right are one key), exactly as a
  :class:`~cutline.runtime.keyed_operators.KeyedProcessFunction` has them: value, list and map
  state and event- and processing-time timers, on either state backend, checkpointed and
  rescaled by key group.
* :class:`BroadcastProcessFunction`, for a stream and a broadcast one: every subtask sees
  every record of the broadcast input (``process_broadcast``, which writes the broadcast
  state) and its own part of the other (``process``, which reads it).

Which input a batch came on is the port the runtime gives :meth:`RunningOperator.process_from`
(0: the left or first, 1: the right or second).
"""

from __future__ import annotations

import copy
import types
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cutline.runtime.keyed_operators import ProcessContext, _Process
from cutline.runtime.operators import (
    Batch,
    Logic,
    OperatorContext,
    RecordError,
    RunningOperator,
    _flat_map,
    _repr,
    key_getter,
)

# ------------------------------------------------------------------ keyed, two inputs


class KeyedCoProcessFunction:
    """Subclass it and pass an instance to ``ConnectedStreams.process`` (the ``connect`` of two
    keyed streams).

    ``open(ctx)`` runs once per subtask before any record; ``process_left(record, ctx)`` runs
    for every record of the first (left) stream and ``process_right(record, ctx)`` for every
    record of the second, each with ``ctx.key`` set to the record's key; ``on_timer(timestamp,
    ctx)`` when a timer of a key comes due. All of them read and write the same state of the
    same key: a left record and a right record with equal keys meet there. The records of
    the two inputs come in the order they arrive, which across the inputs is not defined
    (per input, a channel's records keep their order): use timers and event time to wait
    for the other side.
    """

    def open(self, ctx: ProcessContext) -> None:
        """Called once per subtask, before its first record (and again in every attempt after
        a restart, with the state restored): get the state handles here."""

    def process_left(self, record: Any, ctx: ProcessContext) -> Iterable[Any] | None:
        """Called for every record of the first stream; returns (or yields) the records to
        emit, or ``None``."""
        raise NotImplementedError

    def process_right(self, record: Any, ctx: ProcessContext) -> Iterable[Any] | None:
        """Called for every record of the second stream; returns (or yields) the records to
        emit, or ``None``."""
        raise NotImplementedError

    def on_timer(self, timestamp: int, ctx: ProcessContext) -> Iterable[Any] | None:
        """Called when a timer this function registered fires (see
        :meth:`~cutline.runtime.keyed_operators.KeyedProcessFunction.on_timer`)."""
        return None


@dataclass(frozen=True)
class CoProcessLogic(Logic):
    """``connect(...).process(function)`` of two keyed streams: keys ``left_key`` and
    ``right_key`` (each a column name or a function of a record)."""

    function: KeyedCoProcessFunction
    left_key: str | Callable[[Any], Hashable]
    right_key: str | Callable[[Any], Hashable]
    keyed = True
    two_inputs = True

    def open(self, ctx: OperatorContext, state: Any) -> RunningOperator:
        # every subtask gets its own copy: open() binds state handles to this subtask's backend
        return _CoProcess(copy.deepcopy(self.function), ctx, state, self.left_key, self.right_key)


class _CoProcess(_Process):
    def __init__(
        self,
        function: KeyedCoProcessFunction,
        ctx: OperatorContext,
        state: Any,
        left_key: Any,
        right_key: Any,
    ) -> None:
        super().__init__(function, ctx, state, left_key)  # type: ignore[arg-type]
        self.inputs = (
            (self.get_key, function.process_left),
            (key_getter(right_key), function.process_right),
        )

    def process(self, batch: Batch) -> Batch | None:
        raise AssertionError("a two-input operator is given its batches with their port")

    def process_from(self, port: int, batch: Batch) -> Batch | None:
        get_key, fn = self.inputs[port]
        return self.each(batch, get_key, fn)


# ------------------------------------------------------------------ broadcast state


class BroadcastProcessFunction:
    """Subclass it and pass an instance to ``ConnectedStreams.process`` (the ``connect`` of a
    stream with a ``broadcast()`` one).

    Every subtask gets every record of the broadcast stream, in ``process_broadcast(value,
    ctx)``, which may change ``ctx.broadcast_state`` (a dict); ``process(record, ctx)`` gets
    the records of the other stream that come to its subtask and may only read
    ``ctx.broadcast_state`` (a read-only view: writing it raises ``TypeError``).

    The broadcast state is checkpointed by every subtask and must be the same in all of them:
    ``process_broadcast`` must change it only from the broadcast records, the same way in
    every subtask, whatever the order they come in from several upstream subtasks (that
    order may differ from one subtask to another). A restore at another parallelism gives
    every new subtask the same copy; if the old copies differ, the restore fails naming the
    subtasks and a key where they differ (the function broke the rule above: nothing else
    can make them differ).
    """

    def open(self, ctx: BroadcastContext) -> None:
        """Called once per subtask, before its first record (and again in every attempt
        after a restart, with the broadcast state restored)."""

    def process(self, record: Any, ctx: BroadcastContext) -> Iterable[Any] | None:
        """Called for every record of the non-broadcast stream; returns (or yields) the
        records to emit, or ``None``. ``ctx.broadcast_state`` is read only here."""
        raise NotImplementedError

    def process_broadcast(self, value: Any, ctx: BroadcastContext) -> Iterable[Any] | None:
        """Called for every record of the broadcast stream, in every subtask; may change
        ``ctx.broadcast_state`` (store new values: never change a stored value in place)
        and returns (or yields) the records to emit, or ``None``."""
        raise NotImplementedError


class BroadcastContext:
    """What a broadcast process function sees: the broadcast state and its subtask."""

    def __init__(self, state: dict[Any, Any], subtask: int, parallelism: int) -> None:
        self._state = state
        self._read_only = types.MappingProxyType(state)
        self._writable = False
        self.subtask = subtask
        """This subtask's index (0 .. parallelism - 1)."""
        self.parallelism = parallelism

    @property
    def broadcast_state(self) -> Mapping[Any, Any]:
        """The broadcast state: a dict in ``process_broadcast``, a read-only view of it in
        ``process`` and ``open``."""
        return self._state if self._writable else self._read_only


@dataclass(frozen=True)
class BroadcastProcessLogic(Logic):
    """``connect(broadcast_stream).process(function)``: port 0 the stream, port 1 the
    broadcast one."""

    function: BroadcastProcessFunction
    two_inputs = True
    restores_every_copy = True

    def open(self, ctx: OperatorContext, state: Any) -> RunningOperator:
        return _BroadcastProcess(copy.deepcopy(self.function), ctx, restored_copy(state, ctx))


def restored_copy(copies: list[dict[Any, Any]] | None, ctx: OperatorContext) -> dict[Any, Any]:
    """The broadcast state to start from: the one copy (or every old subtask's, which must be
    equal); empty on a fresh start."""
    if not copies:
        return {}
    first = copies[0]
    for index, other in enumerate(copies[1:], start=1):
        if other != first:
            differing = sorted(
                (k for k in first.keys() | other.keys() if first.get(k) != other.get(k)),
                key=repr,
            )
            raise RecordError(
                f"{ctx.name}: the checkpoint holds broadcast states that differ between its "
                f"subtasks (copy 0 and copy {index}, at key {_repr.repr(differing[0])}: "
                f"{_repr.repr(first.get(differing[0]))} and {_repr.repr(other.get(differing[0]))}"
                "): process_broadcast must change the state the same way in every subtask, "
                "from the broadcast records alone, in any order"
            )
    return dict(first)


class _BroadcastProcess(RunningOperator):
    def __init__(
        self, function: BroadcastProcessFunction, ctx: OperatorContext, state: dict[Any, Any]
    ) -> None:
        self.function = function
        self.ctx = ctx
        self.state = state
        self.bctx = BroadcastContext(state, ctx.subtask, ctx.parallelism)
        try:
            function.open(self.bctx)
        except Exception as exc:
            ctx.fail("(none: in open())", exc)

    def process(self, batch: Batch) -> Batch | None:
        raise AssertionError("a two-input operator is given its batches with their port")

    def process_from(self, port: int, batch: Batch) -> Batch | None:
        bctx = self.bctx
        fn = self.function.process_broadcast if port else self.function.process
        bctx._writable = bool(port)
        try:
            return _flat_map(batch, lambda record: fn(record, bctx), self.ctx)
        finally:
            bctx._writable = False

    def snapshot(
        self, checkpoint_id: int, *, base: int | None = None, savepoint: bool = False
    ) -> dict[Any, Any]:
        return dict(self.state)  # (a copy: the values are never changed in place)
