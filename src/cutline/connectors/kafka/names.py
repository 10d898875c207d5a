"""The names ``read_kafka`` and ``write_kafka`` take for their closed sets of choices, as
``Literal`` types a type checker holds a job to (inside, they are made enums:
:class:`~cutline.connectors.kafka.values.Values`, :class:`~cutline.connectors.kafka.values.Keys`).
This module imports no client library: the API names these types when it is imported, and
the connector's libraries are imported when it is first used."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Literal, TypeAlias

ValueFormatName: TypeAlias = Literal["json", "avro", "raw", "string"]
"""``value_format=``: a value is a JSON object, an Avro record, its bytes, or UTF-8 text."""

KeyFormat: TypeAlias = Literal["string", "raw"]
"""``key_format=``: a key is read as UTF-8 text, or as its bytes."""

OffsetPolicy: TypeAlias = Literal["fail", "earliest", "latest"]
"""``on_offset_out_of_range=``: what a reader does with a position its partition no longer
holds (:mod:`~cutline.connectors.kafka.ranges` says each)."""

Start: TypeAlias = Literal["earliest", "latest"] | int | dt.datetime | Mapping[int | str, int]
"""``start=``: ``"earliest"``, ``"latest"``, a time (a ``datetime`` or epoch milliseconds) or
offsets (``{partition: offset}``, ``{"topic/partition": offset}``)."""
