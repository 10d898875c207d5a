"""What the Kafka source does with a position its partition can no longer honour.

A partition holds the offsets ``low`` (its log start) up to ``high`` (its end: the offset the
next record will get). A position ``at`` (the offset of the next record to read: restored
from a checkpoint, given as ``start=``, or reached while reading) is honoured while
``low <= at <= high``. Two things break it:

* ``at < low``: the records from ``at`` to ``low`` were deleted (the broker's retention, a
  ``DeleteRecords``): they are lost to the job;
* ``at > high``: the partition ends before the position (the topic was deleted and made
  again, the partition truncated by an unclean leader election, or a broker that lost its
  data): the records the position counted are not there, and the partition's offsets now
  name other records.

Either way the job cannot read on from ``at`` exactly once. What it does is the user's choice,
made before (``on_offset_out_of_range=``), never a silent jump:

* ``"fail"`` (the default): the job fails, naming the topic, the partition and both offsets;
* ``"earliest"``: it reads on from ``low``; the records skipped, ``low - at`` when they were
  deleted (none when the partition ends before the position), are counted and reported;
* ``"latest"``: it reads on from ``high``; every record before it that it did not read is
  counted as skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from cutline.connectors.kafka.names import OffsetPolicy
from cutline.connectors.source import SourceError

OFFSET_POLICIES: tuple[OffsetPolicy, ...] = get_args(OffsetPolicy)


@dataclass(frozen=True)
class Reposition:
    """Read ``split`` on from ``offset``: ``skipped`` records it held or once held are never
    read (``why`` says which and why)."""

    split: str
    offset: int
    skipped: int
    why: str


def honoured(at: int, low: int, high: int) -> bool:
    """Whether a partition holding offsets ``low`` to ``high`` can read on from ``at``."""
    return low <= at <= high


def reposition(source: str, split: str, at: int, low: int, high: int, policy: str) -> Reposition:
    """Where partition ``split`` (of source ``source``) reads on from, its position ``at``
    out of its range ``low..high``, as ``policy`` says; ``"fail"`` raises the
    :class:`~cutline.connectors.SourceError` that names it all."""
    topic, _, partition = split.rpartition("/")
    where = f"topic {topic!r} partition {partition}"
    if at < low:
        what = (
            f"{where} starts at offset {low} now, after the position {at} the job "
            f"reads on from: the {low - at:,} records at offsets {at} to {low - 1} were "
            "deleted (the broker's retention, or a DeleteRecords)"
        )
    else:
        what = (
            f"{where} ends at offset {high} now, before the position {at} the job "
            "reads on from: the records the position counted are not there (the topic was "
            "deleted and made again, the partition truncated, or the broker lost its data), "
            "and its offsets now name other records"
        )
    match policy:
        case "earliest":
            skipped = max(0, low - at)
            return Reposition(
                split, low, skipped, f"{what}; read on from its earliest offset {low}"
            )
        case "latest":
            skipped = high - min(at, low)
            return Reposition(
                split, high, skipped, f"{what}; read on from its latest offset {high}"
            )
        case _:
            raise SourceError(
                f"source {source}: {what}. To read on anyway, choose where: "
                "read_kafka(on_offset_out_of_range='earliest') reads the partition from its "
                "earliest offset, 'latest' from its end (the records skipped are counted and "
                "reported)"
            )
