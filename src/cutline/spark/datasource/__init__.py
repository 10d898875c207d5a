"""Checkpoint state as Spark DataFrames: the ``cutline`` Python data source.

What a checkpoint or savepoint holds becomes a DataFrame, read by Spark's executors one
subtask at a time (one input partition per subtask holding state; the driver only reads the
metadata and a bounded sample to infer the column types)::

    from cutline.spark.datasource import read_state, read_channel_state

    counts = read_state(spark, "ck/", "sum")          # ck/'s newest complete checkpoint
    counts.createOrReplaceTempView("state")
    spark.sql("select key, value from state where value > 100 order by value desc").show()

    in_flight = read_channel_state(spark, "ck/", checkpoint_id=7)

or, once the source is registered (:func:`register`, or any call of the functions above)::

    spark.read.format("cutline").option("operator", "sum").load("ck/chk-7")
    spark.read.format("cutline").option("channelState", "true").load("ck/")

**Keyed state** (one row per key of every keyed state of one operator):

==============  ==========  ==================================================================
``subtask``     string      the subtask whose part of the checkpoint holds the entry
``key_group``   int         the key's key group
``key``         (inferred)  the key
``state``       string      the state's name (``ValueState`` / ``ListState`` / ``MapState``;
                            a rolling aggregation's is ``sum``, ``count``, ...)
``value``       (inferred)  the value (a list for list state, a dict for map state)
==============  ==========  ==================================================================

The types of ``key`` and ``value`` are inferred from a bounded sample (the first
``sampleSize`` entries of every subtask, 2,000 by default), value by value:

* ``bool`` -> boolean; ``int`` -> long (when every one fits in 64 bits); ``float``, or ints
  and floats together -> double; ``str`` -> string; ``bytes`` -> binary; NumPy scalars count as
  the Python value they hold (``numpy.int64`` is an int);
* a ``list`` whose elements all have one such type -> array of it; a ``dict`` whose keys
  have one type and whose values have one type -> map;
* ``None`` is null in any column;
* anything else (tuples, objects, ...), and types that differ within a column (say ints and
  strings, or lists and dicts) -> string, holding ``repr(value)`` of every value.

Option ``types="string"`` makes both columns such strings, without sampling. When an entry
beyond the sample does not fit the inferred type, the read fails with a
:class:`StateTypeError` that names the key and the value and points to ``types="string"``.
Option ``state`` keeps one state of the operator: its values usually have one type, whereas
an operator with value, list and map state has a ``value`` column of strings.

**Channel state** (option ``channelState``; one row per record in flight that an unaligned
checkpoint, or a loop, recorded):

==============  ==========  ==================================================================
``subtask``     string      the subtask that recorded it
``side``        string      ``input`` (recorded by the receiver) or ``output`` (overtaken at
                            the sender)
``channel``     string      the channel
``position``    long        its place among the records recorded on that side of the channel
``record``      string      a record that is a dict (every row of a columnar batch is one) as
                            JSON (values JSON cannot hold, such as timestamps or bytes, as
                            their ``str``); any other record as its ``repr``
==============  ==========  ==================================================================

**Options** of ``spark.read.format("cutline")`` (names are case-insensitive):

* ``path`` (the argument of ``load``): a checkpoint or savepoint folder (with ``_metadata``),
  or a checkpoint directory (its newest complete checkpoint, or ``chk-ID`` with
  ``checkpoint``); a local path or any fsspec URL;
* ``checkpoint``: a checkpoint id of the directory ``path``;
* ``operator``: the keyed operator (its name, as given with ``name=``, or its uid); without
  it, the checkpoint's only keyed operator;
* ``state``: only this state of the operator;
* ``types``: ``infer`` (the default) or ``string``;
* ``sampleSize``: entries per subtask to infer the types from;
* ``channelState``: ``true`` for the channel state instead of keyed state;
* ``storageOptions``: a JSON object of fsspec storage options (credentials, endpoints...).

**Errors**: whatever stops a read (a missing directory, a folder that is not a checkpoint, a
damaged file, an unknown operator or state, a checkpoint without keyed state) is an
:class:`~cutline.runtime.checkpoint.reader.InspectError` whose message names the problem.
:func:`read_state` and :func:`read_channel_state` check the checkpoint, and infer the types,
in the calling process before Spark plans anything, so that is what they raise. Through
``spark.read.format("cutline")`` the same error comes wrapped by Spark (an
``AnalysisException`` whose message holds it); an error in an executor (a file damaged
after the DataFrame was made, a :class:`StateTypeError`) comes as Spark's
``PythonException`` with the message in it.

Every executor reads the checkpoint the DataFrame was made from (pinned when it is made),
even if a newer one completes meanwhile; a checkpoint discarded in between fails the read.

**How this package is cut.** Each module is one step of a read, and imports only the
modules listed before it:

* :mod:`~cutline.spark.datasource.pinned`: the checkpoint a read is about, pinned on the
  driver and found again by each executor; a storage error becomes an ``InspectError``;
* :mod:`~cutline.spark.datasource.options`: the options, parsed and checked (an error names
  the option), and the Python arguments of :func:`read_state` turned into the same options;
* :mod:`~cutline.spark.datasource.schema`: the columns' types, inferred on the driver from a
  sample; :mod:`~cutline.spark.datasource.convert`: each value made to fit its column in an
  executor. These are the two halves of one question, but they run in different processes
  and change for different reasons (a new kind of value vs. a new way to fail);
* :mod:`~cutline.spark.datasource.readers`: the plan of a read and the readers Spark pickles
  to the executors, one input partition per subtask;
* :mod:`~cutline.spark.datasource.source`: :class:`CutlineDataSource`, :func:`register`,
  :func:`read_state` and :func:`read_channel_state`.

Spark pickles the data source and its readers by reference to the module that defines their
class, so an executor imports ``cutline.spark.datasource.readers`` to run one: each module
imports without side effects. This package re-exports every name the single module
``datasource.py`` had, so ``from cutline.spark.datasource import read_state`` works as before.
"""

from cutline.runtime.checkpoint.reader import InspectError
from cutline.spark.datasource.convert import StateTypeError, converter, record_text
from cutline.spark.datasource.options import SAMPLE_SIZE, TYPES, ReadOptions
from cutline.spark.datasource.readers import ChannelStateReader, KeyedStateReader
from cutline.spark.datasource.schema import (
    ANY,
    BINARY,
    BOOLEAN,
    CHANNEL_COLUMNS,
    CHANNEL_SCHEMA,
    DOUBLE,
    KEYED_COLUMNS,
    LONG,
    REPR,
    STRING,
    TEXT,
    UNKNOWN,
    KeyedShapes,
    Shape,
    finish,
    infer_shapes,
    shape_of,
    shape_of_type,
    unify,
)
from cutline.spark.datasource.source import (
    FORMAT,
    CutlineDataSource,
    read_channel_state,
    read_state,
    register,
)

__all__ = [
    "ANY",
    "BINARY",
    "BOOLEAN",
    "CHANNEL_COLUMNS",
    "CHANNEL_SCHEMA",
    "DOUBLE",
    "FORMAT",
    "KEYED_COLUMNS",
    "LONG",
    "REPR",
    "SAMPLE_SIZE",
    "STRING",
    "TEXT",
    "TYPES",
    "UNKNOWN",
    "ChannelStateReader",
    "CutlineDataSource",
    "InspectError",
    "KeyedShapes",
    "KeyedStateReader",
    "ReadOptions",
    "Shape",
    "StateTypeError",
    "converter",
    "finish",
    "infer_shapes",
    "read_channel_state",
    "read_state",
    "record_text",
    "register",
    "shape_of",
    "shape_of_type",
    "unify",
]
