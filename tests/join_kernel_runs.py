"""Runs of a join kernel over scenarios, for the kernels' property tests: random rows of both
sides (a few keys, some null; times out of order but never at or before the watermark), the
watermark advancing in random steps, and restores at random points into 1 to 3 subtasks'
key groups (the rows then go to the subtask owning their key group, the watermark to all,
and their results are merged).

A run records each result row with the step (the index of the call) that emitted it, so that
a test compares the multiset of ``(step, row)`` with a plain-Python reference: which rows,
and exactly which call emitted each.

The left side's columns are ``k`` (the key), ``t`` (the time) and ``lid`` (the row's id); the
right's ``k``, ``t`` and ``rid``. A result row is ``(k, t, lid, t_right, rid)``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
from hypothesis import strategies as st

from cutline.protocol.watermarks import MAX_WATERMARK
from cutline.runtime.joins.output import JoinLayout, Side
from cutline.runtime.state.keygroups import key_group, key_group_range

MAX_PARALLELISM = 8
LAYOUT = JoinLayout(("k",), ("k",))


@dataclass(frozen=True)
class Row:
    side: Side
    key: Hashable
    time: int
    id: int


@dataclass(frozen=True)
class Add:
    side: Side
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class Advance:
    watermark: int


@dataclass(frozen=True)
class Restore:
    parallelism: int


Op = Add | Advance | Restore


@dataclass
class Scenario:
    ops: list[Op]
    key_type: pa.DataType = field(default_factory=pa.int64)

    def schema(self, side: Side) -> pa.Schema:
        ident = "lid" if side is Side.LEFT else "rid"
        return pa.schema([("k", self.key_type), ("t", pa.int64()), (ident, pa.int64())])

    def batch(self, side: Side, rows: tuple[Row, ...] | list[Row]) -> pa.RecordBatch:
        keys = [r.key for r in rows]
        if pa.types.is_string(self.key_type):
            keys = [None if k is None else f"key{k}" for k in keys]
        return pa.record_batch(
            [
                pa.array(keys, self.key_type),
                pa.array([r.time for r in rows], pa.int64()),
                pa.array([r.id for r in rows], pa.int64()),
            ],
            schema=self.schema(side),
        )

    def key(self, key: Hashable) -> Hashable:
        """A row's key as the result shows it."""
        if key is not None and pa.types.is_string(self.key_type):
            return f"key{key}"
        return key


def group_of(scenario: Scenario, row: Row) -> int:
    return key_group(scenario.key(row.key), MAX_PARALLELISM)


class Kernel(Protocol):
    def add(
        self, side: Side, batch: pa.RecordBatch, times: np.ndarray, key_groups: np.ndarray
    ) -> pa.RecordBatch | None: ...
    def advance(self, watermark: int) -> pa.RecordBatch | None: ...
    def snapshot(self) -> dict[str, pa.Table]: ...
    def kept(self) -> dict[str, int]: ...


Results = Counter[tuple[int, tuple[Any, ...]]]


def rows_of(batch: pa.RecordBatch | None) -> list[tuple[Any, ...]]:
    if batch is None:
        return []
    assert batch.schema.names == ["k", "t", "lid", "t_right", "rid"], batch.schema
    return [tuple(r.values()) for r in batch.to_pylist()]


def run(
    scenario: Scenario,
    make: Callable[[], Any],
    restore: Callable[[list[dict[str, pa.Table]], range], Any],
    restores: bool = True,
) -> tuple[Results, list[dict[str, int]]]:
    """The results of a run of the scenario (``restores``: with its restores, else without),
    and the rows kept (summed over the subtasks) after each step."""
    subtasks: list[tuple[range, Kernel]] = [(range(MAX_PARALLELISM), make())]
    results: Results = Counter()
    kept: list[dict[str, int]] = []
    for step, op in enumerate(scenario.ops):
        if isinstance(op, Restore):
            if restores:
                snapshots = [kernel.snapshot() for _, kernel in subtasks]
                # the old subtasks go on (as if the job had not failed): the snapshots must
                # not change with them
                for groups, kernel in subtasks:
                    for later in scenario.ops[step + 1 :]:
                        _apply(scenario, later, groups, kernel)
                subtasks = [
                    (groups, restore(snapshots, groups))
                    for i in range(op.parallelism)
                    for groups in [key_group_range(i, op.parallelism, MAX_PARALLELISM)]
                ]
        else:
            for groups, kernel in subtasks:
                for row in rows_of(_apply(scenario, op, groups, kernel)):
                    results[(step, row)] += 1
        kept.append(
            {side: sum(kernel.kept()[side] for _, kernel in subtasks) for side in ("left", "right")}
        )
    return results, kept


def _apply(scenario: Scenario, op: Op, groups: range, kernel: Kernel) -> pa.RecordBatch | None:
    match op:
        case Add(side, rows):
            mine = [r for r in rows if group_of(scenario, r) in groups]
            if rows and not mine:
                return None
            batch = scenario.batch(side, mine)
            times = np.array([r.time for r in mine], np.int64)
            return kernel.add(
                side, batch, times, np.array([group_of(scenario, r) for r in mine], np.int64)
            )
        case Advance(watermark):
            return kernel.advance(watermark)
        case Restore():
            return None


# ---------------------------------------------------------------------- the reference's tools


def arrivals(scenario: Scenario) -> list[tuple[int, Row]]:
    """Every row with the step that brought it."""
    return [
        (step, row)
        for step, op in enumerate(scenario.ops)
        if isinstance(op, Add)
        for row in op.rows
    ]


def watermark_before(scenario: Scenario, step: int) -> int | None:
    """The watermark when step ``step`` begins (``None``: none yet)."""
    marks = [op.watermark for op in scenario.ops[:step] if isinstance(op, Advance)]
    return max(marks, default=None)


def first_advance_reaching(scenario: Scenario, after: int, time: int) -> int | None:
    """The step of the first advance after step ``after`` to a watermark at or past
    ``time``."""
    for step, op in enumerate(scenario.ops):
        if step > after and isinstance(op, Advance) and op.watermark >= time:
            return step
    return None


def result(scenario: Scenario, left: Row | None, right: Row | None) -> tuple[Any, ...]:
    """The result row of a pair (``None``: that side missing)."""
    key = scenario.key((left or right).key)  # type: ignore[union-attr]
    return (
        key,
        left.time if left else None,
        left.id if left else None,
        right.time if right else None,
        right.id if right else None,
    )


# ---------------------------------------------------------------------- scenarios


@st.composite
def scenarios(
    draw: st.DrawFn, max_ops: int = 24, keys: int = 4, spread: int = 30, step: int = 15
) -> Scenario:
    """Random scenarios: up to ``max_ops`` batches (0 to 6 rows, keys among ``keys`` and
    nulls, times up to ``spread`` past the watermark), advances (by up to ``step``, sometimes
    not at all) and restores (at most two), ending with ``advance(MAX_WATERMARK)``."""
    key_type = draw(st.sampled_from([pa.int64(), pa.string()]))
    ops: list[Op] = []
    watermark = 0
    ids = 0
    restores = 0
    for _ in range(draw(st.integers(1, max_ops))):
        kind = draw(st.sampled_from(["left", "right", "left", "right", "advance", "restore"]))
        if kind == "advance":
            watermark += draw(st.integers(0, step))
            ops.append(Advance(watermark))
        elif kind == "restore":
            if restores < 2:
                restores += 1
                ops.append(Restore(draw(st.integers(1, 3))))
        else:
            side = Side.LEFT if kind == "left" else Side.RIGHT
            rows = []
            for _ in range(draw(st.integers(0, 6))):
                key = draw(st.sampled_from([*range(keys), None]))
                time = watermark + 1 + draw(st.integers(0, spread))
                rows.append(Row(side, key, time, ids))
                ids += 1
            ops.append(Add(side, tuple(rows)))
    ops.append(Advance(MAX_WATERMARK))
    return Scenario(ops, key_type)
