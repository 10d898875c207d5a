"""The readers: what Spark's executors run, one input partition per subtask.

Planning happens on the driver: :func:`plan_keyed` and :func:`plan_channels` open the
checkpoint once, pin it (:class:`~cutline.spark.datasource.pinned.Pinned`) and list the
subtasks that hold something to read. A reader carries that plan and nothing heavier; Spark
pickles it to the executors, where :meth:`KeyedStateReader.read` and
:meth:`ChannelStateReader.read` open the pinned checkpoint again and stream one subtask's
part of it as rows, in the order of the schema's fields (:func:`order`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from cutline.runtime.checkpoint.reader import InspectError
from cutline.spark.datasource.convert import Misfit, converter, misfit, record_text
from cutline.spark.datasource.options import ReadOptions
from cutline.spark.datasource.pinned import Pinned, channel_subtasks, keyed_subtasks, readable
from cutline.spark.datasource.schema import (
    CHANNEL_COLUMNS,
    KEYED_COLUMNS,
    KeyedShapes,
    infer_shapes,
)

# ------------------------------------------------------------------------------ keyed state


@dataclass(frozen=True)
class Plan:
    """What the executors read: the checkpoint, the operator, and the columns' types."""

    checkpoint: Pinned
    uid: str
    state: str | None
    subtasks: tuple[str, ...]
    shapes: KeyedShapes


def plan_keyed(options: ReadOptions, shapes: KeyedShapes | None = None) -> Plan:
    """Open the checkpoint, find the operator, infer the types (unless given)."""
    reader = options.open()
    with readable(reader.location.url):
        uid = reader.resolve_operator(options.operator)
    if shapes is None:
        shapes = infer_shapes(reader, uid, options)
    return Plan(
        Pinned.of(reader, options.storage_options),
        uid,
        options.state,
        tuple(keyed_subtasks(reader, uid)),
        shapes,
    )


class KeyedStateReader(DataSourceReader):
    """Reads one operator's keyed state: one partition per subtask holding part of it."""

    def __init__(self, plan: Plan, schema: StructType, shapes: KeyedShapes) -> None:
        self.plan = plan
        self.columns = order(schema, KEYED_COLUMNS)
        self.shapes = shapes

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(subtask) for subtask in self.plan.subtasks]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        subtask = partition.value
        if subtask is None:
            return  # Spark's single partition of a source without any
        plan = self.plan
        reader = plan.checkpoint.open()
        to_key, to_value = converter(self.shapes.key), converter(self.shapes.value)
        columns = self.columns
        with readable(f"{plan.checkpoint.folder} ({subtask})"):
            for entry in reader.keyed_entries_of(subtask, plan.uid):
                if plan.state is not None and entry.state != plan.state:
                    continue
                try:
                    key = to_key(entry.key)
                except Misfit:
                    raise misfit(entry, "key", entry.key, self.shapes.key, plan.state) from None
                try:
                    value = to_value(entry.value)
                except Misfit:
                    raise misfit(
                        entry, "value", entry.value, self.shapes.value, plan.state
                    ) from None
                row = (entry.subtask, entry.key_group, key, entry.state, value)
                yield tuple(row[i] for i in columns)


def order(schema: StructType, columns: tuple[str, ...]) -> tuple[int, ...]:
    """For every field of ``schema``, the index of its column in ``columns``: a schema the
    user gave may name the columns in any order, but must name each one."""
    names = list(schema.fieldNames())
    if sorted(names) != sorted(columns):
        raise InspectError(
            f"the schema's columns ({', '.join(names)}) are not the source's: {', '.join(columns)}"
        )
    return tuple(columns.index(name) for name in names)


# ---------------------------------------------------------------------------- channel state


def plan_channels(options: ReadOptions) -> tuple[Pinned, tuple[str, ...]]:
    """Open the checkpoint: it, pinned, and the subtasks that recorded channel state."""
    reader = options.open()
    return Pinned.of(reader, options.storage_options), channel_subtasks(reader)


class ChannelStateReader(DataSourceReader):
    """Reads the recorded channel state: one partition per subtask that recorded some."""

    def __init__(self, checkpoint: Pinned, subtasks: tuple[str, ...], schema: StructType) -> None:
        self.checkpoint = checkpoint
        self.subtasks = subtasks
        self.columns = order(schema, CHANNEL_COLUMNS)

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(subtask) for subtask in self.subtasks]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        subtask = partition.value
        if subtask is None:
            return
        reader = self.checkpoint.open()
        columns = self.columns
        with readable(f"{self.checkpoint.folder} ({subtask})"):
            for found in reader.channel_state(subtask):
                row = (
                    found.subtask,
                    found.side,
                    found.channel,
                    found.position,
                    record_text(found.record),
                )
                yield tuple(row[i] for i in columns)
