"""The built-in joins of two streams (:class:`Joins`, methods of every
:class:`~cutline.DataStream`): ``window_join``, ``interval_join``, ``asof_join`` and ``join``,
each checked when the job is built, run by the runtime's join operator on Arrow columns.

Every join's results: the join key once (named as the left names it), then the left's other
columns, then the right's (a right column whose name is taken gets ``suffix``); an outer
join's row without a partner has nulls on the other side. A result's event time: the larger
of the pair's (interval, regular; the one there is for an outer row), the window's last
millisecond (window: ``window_end - 1``), the left's (as-of). Records late when they arrive
(at or before the watermark; for a window join, when every window they would be in has
fired) go to ``.late("left")`` / ``.late("right")`` and are counted.

Every join takes ``name=`` (its stable id in checkpoints, and its name in messages) and
``on_error=``: what a record without event time or without a key column does (``"fail"`` the
job, or go to the ``"dead_letter"`` output).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import pyarrow as pa

from cutline.api.columns import has_column
from cutline.api.connected import check_key_types
from cutline.runtime.durations import Duration, milliseconds, offset_milliseconds
from cutline.runtime.eventtime.assigners import Session, Sliding, Tumbling
from cutline.runtime.eventtime.timestamps import TimeColumn
from cutline.runtime.graph import Edge, Partitioning
from cutline.runtime.joins.operator import LATE_SIDES, JoinLogic, edge_key
from cutline.runtime.joins.output import JoinLayout, Side
from cutline.runtime.operators import OnError, PassLogic

if TYPE_CHECKING:
    from cutline.api.streams import DataStream

How: TypeAlias = Literal["inner", "left", "right", "full"]
"""Which rows a join emits: ``"inner"`` the pairs; ``"left"`` / ``"right"`` also every row of
that side that found no partner (the other side's columns null); ``"full"`` both sides'."""
AsofHow: TypeAlias = Literal["inner", "left"]
"""An as-of join's: ``"inner"`` the left rows that found a right one; ``"left"`` every left
row (the right's columns null where none was found)."""
Keys: TypeAlias = str | Sequence[str]
"""A join's key: one column's name, or a list of them (compared in order, all equal)."""


class JoinedStream:
    """Mixed into the stream a join returns: :meth:`late`, its late records."""

    def late(self, side: Literal["left", "right"], *, name: str | None = None) -> DataStream:
        """The records of input ``side`` (``"left"`` or ``"right"``) that came late (their
        event time at or before the join's watermark when they arrived; for a window join,
        every window they would be in had fired), as they came: they paired with nothing.
        They are counted in the job's statistics either way."""
        from cutline.api.streams import DataStream

        stream = self
        assert isinstance(stream, DataStream)
        if side not in ("left", "right"):
            raise ValueError(f"late: side is 'left' or 'right', not {side!r}")
        which = Side.LEFT if side == "left" else Side.RIGHT
        edge = Edge(stream.operator.uid, side=LATE_SIDES[which])
        late = stream._through(edge, f"late({side})", PassLogic(), name, "fail")
        late.event_time = stream.operator.logic.times[which]
        late.schema = self.input_schemas[which]
        return late

    input_schemas: tuple[pa.Schema | None, pa.Schema | None] = (None, None)


class Joins:
    """The joins of a stream (the left) with another (the right)."""

    def window_join(
        self,
        other: DataStream,
        *,
        window: Tumbling | Sliding | Session,
        on: Keys | None = None,
        left_on: Keys | None = None,
        right_on: Keys | None = None,
        how: How = "inner",
        suffix: str = "_right",
        name: str | None = None,
        on_error: OnError = "fail",
    ) -> DataStream:
        """The pairs of a left and a right record with equal keys in the same window of
        ``window`` (tumbling, sliding: a pair in two windows is emitted once for each;
        sessions: the sessions of both sides' records of a key together), emitted when the
        window fires (the watermark reaches its last millisecond), with ``window_start`` and
        ``window_end`` after the key; the window's records are then dropped. ``how="left"``,
        ``"right"``, ``"full"``: a window's records of that side without a partner in it are
        emitted then too, the other side's columns null. Both streams need event time."""
        if not isinstance(window, Tumbling | Sliding | Session):
            raise TypeError(
                f"window_join: window= is Tumbling(...), Sliding(...) or Session(...), not "
                f"{window!r}"
            )
        from cutline.runtime.joins.window import WindowJoin

        plan = _Plan(self, other, "window_join", on, left_on, right_on, suffix, windows=True)
        checked = _how(how, ("inner", "left", "right", "full"), "window_join")
        times = plan.times(needed=True)
        left_time = times[0]
        result_time = TimeColumn("window_end", -1, left_time.type, left_time.unit)
        schemas = plan.pair_schemas()
        make = functools.partial(WindowJoin, plan.layout, window, checked, schemas=schemas)
        restore = functools.partial(
            WindowJoin.restore, plan.layout, window, checked, schemas=schemas
        )
        window_time = TimeColumn(left_time.column, 0, left_time.type, left_time.unit)
        logic = JoinLogic(make, restore, plan.keys, times, window_time)
        return plan.add(f"window_join({window})", logic, name, on_error, result_time, window_time)

    def interval_join(
        self,
        other: DataStream,
        *,
        between: tuple[Duration, Duration],
        on: Keys | None = None,
        left_on: Keys | None = None,
        right_on: Keys | None = None,
        how: How = "inner",
        suffix: str = "_right",
        name: str | None = None,
        on_error: OnError = "fail",
    ) -> DataStream:
        """Each pair of a left record ``L`` and a right record ``R`` with equal keys and
        ``lower <= R.time - L.time <= upper`` (``between=(lower, upper)``, both inclusive,
        durations that may be negative: ``("-10 min", "0s")``), emitted as soon as its second
        record arrives. ``how="left"``: a left record that paired with nothing is emitted
        (right columns null) once the watermark reaches ``L.time + upper``, when no right
        record can pair with it any more; ``"right"``: a right record once it reaches
        ``R.time - lower``; ``"full"``: both. A record's state is dropped at that same
        watermark. An outer join holds the watermark it passes on back by as much as its
        unmatched rows come behind (``max(upper, 0)`` for left ones, ``max(-lower, 0)`` for
        right ones), so that they are not late downstream. Both streams need event time."""
        from cutline.runtime.joins.interval import IntervalJoin

        if not isinstance(between, tuple | list) or len(between) != 2:
            raise TypeError(
                f"interval_join: between=(lower, upper), two durations, not {between!r}"
            )
        lower = offset_milliseconds(between[0], "interval_join: between[0]")
        upper = offset_milliseconds(between[1], "interval_join: between[1]")
        if lower > upper:
            raise ValueError(
                f"interval_join: between={tuple(between)!r}: the lower bound ({lower} ms) is "
                f"above the upper bound ({upper} ms): no pair could ever match"
            )
        plan = _Plan(self, other, "interval_join", on, left_on, right_on, suffix)
        checked = _how(how, ("inner", "left", "right", "full"), "interval_join")
        times = plan.times(needed=True)
        schemas = plan.pair_schemas()
        make = functools.partial(IntervalJoin, plan.layout, checked, lower, upper, schemas=schemas)
        restore = functools.partial(
            IntervalJoin.restore, plan.layout, checked, lower, upper, schemas=schemas
        )
        # an unmatched row comes out when its last chance passed: a left one ``upper`` behind
        # the watermark, a right one ``-lower``; the watermark passed on waits for them
        held = max(
            upper if checked in ("left", "full") else 0,
            -lower if checked in ("right", "full") else 0,
            0,
        )
        logic = JoinLogic(make, restore, plan.keys, times, holds_back=held)
        label = f"interval_join({between[0]}, {between[1]})"
        return plan.add(label, logic, name, on_error, plan.larger_time(times))

    def asof_join(
        self,
        other: DataStream,
        *,
        on: Keys | None = None,
        left_on: Keys | None = None,
        right_on: Keys | None = None,
        how: AsofHow = "inner",
        suffix: str = "_right",
        name: str | None = None,
        on_error: OnError = "fail",
    ) -> DataStream:
        """Each left record ``L`` with the right record of the same key whose time is the
        greatest at or before ``L.time`` (the version valid at ``L``'s time; of equal times,
        the one that arrived last), emitted once the watermark (of both inputs) reaches
        ``L.time`` (no record at or before it is to come), so that a right record that
        arrives later than ``L`` but before then still counts and nothing emitted changes. ``how="left"``: a left record without one is emitted
        too, the right's columns null. Right versions that no pending or future left record
        can pick are dropped. Both streams need event time; the result's is the left's."""
        from cutline.runtime.joins.asof import AsofJoin

        plan = _Plan(self, other, "asof_join", on, left_on, right_on, suffix)
        checked = _how(how, ("inner", "left"), "asof_join")
        times = plan.times(needed=True)
        schemas = plan.pair_schemas()
        make = functools.partial(AsofJoin, plan.layout, checked, schemas=schemas)
        restore = functools.partial(AsofJoin.restore, plan.layout, checked, schemas=schemas)
        logic = JoinLogic(make, restore, plan.keys, times)
        return plan.add("asof_join", logic, name, on_error, times[0])

    def join(
        self,
        other: DataStream,
        *,
        on: Keys | None = None,
        left_on: Keys | None = None,
        right_on: Keys | None = None,
        ttl: Duration | None = None,
        suffix: str = "_right",
        name: str | None = None,
        on_error: OnError = "fail",
    ) -> DataStream:
        """The regular inner join: each record, as it arrives, with every record of the
        other side with an equal key kept so far (append only: a pair is emitted once, when
        its second record arrives). Every record is kept **for ever** (the state grows with
        the input: the statistics count it) unless ``ttl`` is given: a record is then
        dropped once the watermark reaches its time + ``ttl`` (records that arrive later no
        longer pair with it; both streams then need event time)."""
        from cutline.runtime.joins.regular import RegularJoin

        plan = _Plan(self, other, "join", on, left_on, right_on, suffix)
        ttl_ms = None if ttl is None else milliseconds(ttl, "join: ttl")
        times = plan.times(needed=ttl is not None)
        make = functools.partial(RegularJoin, plan.layout, ttl_ms)
        restore = functools.partial(RegularJoin.restore, plan.layout, ttl_ms)
        logic = JoinLogic(make, restore, plan.keys, times)
        left, right = times
        result_time = None if left is None or right is None else plan.larger_time((left, right))
        return plan.add("join", logic, name, on_error, result_time)


def _how(how: str, allowed: tuple[str, ...], what: str) -> str:
    if how not in allowed:
        raise ValueError(
            f"{what}: how={how!r} is not supported: it is one of "
            f"{', '.join(repr(h) for h in allowed)}"
        )
    return how


def _names(keys: Keys, what: str) -> tuple[str, ...]:
    names = (keys,) if isinstance(keys, str) else tuple(keys)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise TypeError(f"{what} is a column's name or a list of them, not {keys!r}")
    return names


class _Plan:
    """A join being added: its two streams, keys and layout, checked."""

    def __init__(
        self,
        left: Any,
        right: Any,
        what: str,
        on: Keys | None,
        left_on: Keys | None,
        right_on: Keys | None,
        suffix: str,
        *,
        windows: bool = False,
    ) -> None:
        from cutline.api.keyed import KeyedStream
        from cutline.api.streams import DataStream

        if isinstance(right, KeyedStream):
            raise TypeError(
                f"{what}: join the stream itself, not a keyed one (on= says the key): "
                "stream.join(other, on=...)"
            )
        if not isinstance(right, DataStream):
            raise TypeError(f"{what} takes another stream, not {type(right).__name__}")
        if right.env is not left.env:
            raise ValueError(f"{what} of streams from different StreamEnvironments")
        if on is not None and (left_on is not None or right_on is not None):
            raise TypeError(f"{what}: give on= (both sides) or left_on= and right_on=, not both")
        if on is None and (left_on is None or right_on is None):
            raise TypeError(
                f"{what}: say the key: on='column' (both sides), or left_on= and right_on="
            )
        lefts = _names(on if on is not None else left_on, f"{what}: on")  # type: ignore[arg-type]
        rights = _names(on if on is not None else right_on, f"{what}: on")  # type: ignore[arg-type]
        if len(lefts) != len(rights):
            raise ValueError(
                f"{what}: left_on={list(lefts)} and right_on={list(rights)} must name as many "
                "columns"
            )
        if not isinstance(suffix, str) or not suffix:
            raise ValueError(f"{what}: suffix= is a non-empty string, not {suffix!r}")
        self.left, self.right, self.what = left, right, what
        for stream, names, side in ((left, lefts, "left"), (right, rights, "right")):
            for name in names:
                has_column(stream.schema, name, f"{what} ({side} input)")
        for one, other in zip(lefts, rights, strict=True):
            check_key_types(left.schema, one, right.schema, other, what)
        self.keys = (lefts, rights)
        self.layout = JoinLayout(lefts, rights, suffix, windows)

    def times(self, *, needed: bool) -> tuple[Any, Any]:
        """Each side's event time; a side without it is refused when ``needed`` (else it is
        ``None``: a regular join without ``ttl``)."""
        found: list[Any] = []
        for stream, side in ((self.left, "left"), (self.right, "right")):
            if stream.event_time is None:
                if needed:
                    raise ValueError(
                        f"{self.what}: the {side} stream has no event time: give its source "
                        "event_time=EventTime('column') (or assign_timestamps after a map); "
                        f"{self.what} pairs records by their times"
                    )
                found.append(None)
            else:
                found.append(stream.event_time)
        return found[0], found[1]

    def pair_schemas(self) -> tuple[pa.Schema | None, pa.Schema | None]:
        return self.left.schema, self.right.schema

    def larger_time(self, times: tuple[TimeColumn, TimeColumn]) -> TimeColumn:
        """A pair's event time: the larger of both sides' (their columns in the results)."""
        left, right = times
        left_schema = self.left.schema
        taken = (
            pa.schema([pa.field(n, pa.null()) for n in {left.column, *self.keys[0]}])
            if left_schema is None
            else left_schema
        )
        right_name = self.layout.right_name(right.column, taken)
        return TimeColumn(
            left.column,
            left.offset,
            left.type,
            left.unit,
            also=TimeColumn(right_name, right.offset, right.type, right.unit),
        )

    def add(
        self,
        label: str,
        logic: JoinLogic,
        name: str | None,
        on_error: OnError,
        result_time: TimeColumn | None,
        window_time: TimeColumn | None = None,
    ) -> DataStream:
        from cutline.api.streams import JoinResult

        left, right = self.left, self.right
        edges = [
            Edge(left.operator.uid, Partitioning.HASH, edge_key(self.keys[0])),
            Edge(right.operator.uid, Partitioning.HASH, edge_key(self.keys[1]), port=1),
        ]
        operator = left.env._add(label, logic, edges, name, on_error)
        schema = None
        if left.schema is not None and right.schema is not None:
            window_type = None
            if window_time is not None:
                window_type = window_time.to_column([]).type
            schema = self.layout.schema(left.schema, right.schema, window_type)
        result = JoinResult(left.env, operator, result_time, schema)
        result.input_schemas = (left.schema, right.schema)
        return result
