"""The ways in: the data source Spark calls, and the functions that call Spark.

:class:`CutlineDataSource` is what ``spark.read.format("cutline")`` finds once
:func:`register` has told the session about it. Spark calls it on the driver for the schema
(:meth:`CutlineDataSource.schema`, which plans the read) and for a reader
(:meth:`CutlineDataSource.reader`), then pickles that reader to the executors.

:func:`read_state` and :func:`read_channel_state` are the Python way to the same place: they
check the checkpoint, and infer the types, in the calling process, so that a wrong argument
fails there with a plain :class:`~cutline.runtime.checkpoint.reader.InspectError`; then they
load the data source with the checkpoint pinned and the inferred types handed on as an
option.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Mapping
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader
from pyspark.sql.types import StringType, StructType

from cutline.spark.datasource.options import (
    SAMPLE_SIZE,
    SHAPES_OPTION,
    ReadOptions,
    text_options,
)
from cutline.spark.datasource.pinned import channel_subtasks, readable
from cutline.spark.datasource.readers import (
    ChannelStateReader,
    KeyedStateReader,
    Plan,
    plan_channels,
    plan_keyed,
)
from cutline.spark.datasource.schema import ANY, CHANNEL_SCHEMA, KeyedShapes, shape_of_type

FORMAT = "cutline"
"""The data source's name: ``spark.read.format("cutline")``."""


class CutlineDataSource(DataSource):
    """``spark.read.format("cutline")``: the keyed state or the channel state of a checkpoint
    (the docstring of :mod:`cutline.spark.datasource` lists the options and columns)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def _read_options(self) -> ReadOptions:
        return ReadOptions.parse(self.options)

    def schema(self) -> StructType:
        options = self._read_options()
        if options.channel_state:
            self._pinned = plan_channels(options)
            return CHANNEL_SCHEMA
        given = self.options.get(SHAPES_OPTION)
        plan = plan_keyed(options, KeyedShapes.from_json(given) if given else None)
        self._plan = plan
        return plan.shapes.schema()

    def reader(self, schema: StructType) -> DataSourceReader:
        options = self._read_options()
        if options.channel_state:
            pinned = getattr(self, "_pinned", None)
            if pinned is None:  # the user gave the schema: schema() was not called
                pinned = plan_channels(options)
            return ChannelStateReader(pinned[0], pinned[1], schema)
        plan: Plan | None = getattr(self, "_plan", None)
        if plan is None:  # the user gave the schema: its types rule
            plan = plan_keyed(options, KeyedShapes(ANY, ANY))
            fields = {field.name: field.dataType for field in schema.fields}
            shapes = KeyedShapes(
                shape_of_type(fields.get("key", StringType())),
                shape_of_type(fields.get("value", StringType())),
            )
            return KeyedStateReader(plan, schema, shapes)
        return KeyedStateReader(plan, schema, plan.shapes)


_REGISTERED: weakref.WeakSet[SparkSession] = weakref.WeakSet()


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("cutline")`` available in the session ``spark`` (once; again
    is a no-op)."""
    if spark in _REGISTERED:
        return
    spark.dataSource.register(CutlineDataSource)
    _REGISTERED.add(spark)


def read_state(
    spark: SparkSession,
    checkpoint: str | os.PathLike[str],
    operator: str | None = None,
    *,
    checkpoint_id: int | None = None,
    state: str | None = None,
    types: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    sample_size: int = SAMPLE_SIZE,
) -> DataFrame:
    """The keyed state of one operator in a checkpoint, as a DataFrame with the columns
    ``subtask``, ``key_group``, ``key``, ``state``, ``value`` (the docstring of
    :mod:`cutline.spark.datasource` has the types).

    :param checkpoint: a checkpoint or savepoint folder, or a checkpoint directory (its newest
        complete checkpoint, or ``checkpoint_id``); a local path or an fsspec URL.
    :param operator: the keyed operator's name (``name=``) or uid; by default the only one.
    :param state: only the entries of this state (say ``"count"`` of a process function).
    :param types: ``"string"``: ``key`` and ``value`` as ``repr`` strings, not inferred.
    :param storage_options: fsspec options of the checkpoint's storage.
    :param sample_size: entries per subtask the types are inferred from.
    :raises InspectError: the checkpoint, the operator or the state cannot be read (the
        message says why); raised here, before Spark plans the read.
    """
    options = ReadOptions.of(
        checkpoint,
        checkpoint_id,
        storage_options,
        operator=operator,
        state=state,
        types=types,
        sampleSize=sample_size,
    )
    plan = plan_keyed(options)  # every error is raised here, cleanly, not inside Spark
    register(spark)
    pinned = text_options(
        operator=plan.uid,
        state=state,
        types=options.types,
        sampleSize=sample_size,
        storageOptions=storage_options,
    )
    pinned[SHAPES_OPTION] = plan.shapes.to_json()
    return spark.read.format(FORMAT).options(**pinned).load(plan.checkpoint.folder)


def read_channel_state(
    spark: SparkSession,
    checkpoint: str | os.PathLike[str],
    *,
    checkpoint_id: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> DataFrame:
    """The records in flight that a checkpoint recorded (unaligned checkpoints, loops), as a
    DataFrame with the columns ``subtask``, ``side``, ``channel``, ``position``, ``record``
    (empty for a checkpoint without channel state).

    :raises InspectError: the checkpoint cannot be read (the message says why)."""
    options = ReadOptions.of(checkpoint, checkpoint_id, storage_options, channelState=True)
    reader = options.open()
    for subtask in channel_subtasks(reader):  # read them here: a damaged one fails cleanly
        with readable(f"{reader.location.url} ({subtask})"):
            reader.state_file(subtask)
    register(spark)
    return (
        spark.read.format(FORMAT)
        .options(**text_options(channelState=True, storageOptions=storage_options))
        .load(reader.location.url)
    )
