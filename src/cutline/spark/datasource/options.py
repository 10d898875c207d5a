"""The reader's options: what ``spark.read.format("cutline").option(...)`` says, checked.

Spark hands a Python data source its options as text, with the names as the user spelled
them. :meth:`ReadOptions.parse` is the only place they are read: names case-insensitively,
values checked one by one, so that a wrong one fails with an :class:`InspectError` naming the
option (``option sampleSize: 'many' is not a positive integer``) instead of something deep in
an executor.

:func:`read_state` and :func:`read_channel_state` take Python values; :meth:`ReadOptions.of`
turns them into that same text with :func:`text_options` and parses it, so both ways in are
checked by one piece of code, and what the functions hand on to Spark is text that parses to
what they checked.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cutline.runtime.checkpoint.reader import CheckpointReader, InspectError, open_checkpoint
from cutline.spark.datasource.pinned import readable

SAMPLE_SIZE = 2000
"""Entries per subtask the types of ``key`` and ``value`` are inferred from (by default)."""

TYPES = ("infer", "string")
"""The values of the option ``types``."""

SHAPES_OPTION = "cutline.shapes"
"""Internal: the types :func:`read_state` inferred, so that Spark does not sample again."""


@dataclass(frozen=True)
class ReadOptions:
    """The options of one read, checked."""

    path: str
    checkpoint_id: int | None = None
    operator: str | None = None
    state: str | None = None
    channel_state: bool = False
    types: str = "infer"
    sample_size: int = SAMPLE_SIZE
    storage_options: dict[str, Any] | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        """The options of ``spark.read.format("cutline").option(...)`` (case-insensitive keys,
        text values); :class:`InspectError` if one is wrong."""
        lowered = {str(k).lower(): v for k, v in options.items()}
        path = lowered.get("path")
        if not path:
            raise InspectError(
                'name the checkpoint to read: spark.read.format("cutline").load(PATH), with a '
                "checkpoint or savepoint folder, or a checkpoint directory"
            )
        checkpoint_id = None
        if lowered.get("checkpoint") not in (None, ""):
            text = str(lowered["checkpoint"]).strip()
            if not text.isdigit():
                raise InspectError(f"option checkpoint: {text!r} is not a checkpoint id")
            checkpoint_id = int(text)
        channel = str(lowered.get("channelstate") or "false").strip().lower()
        if channel not in ("true", "false"):
            raise InspectError(f"option channelState: {channel!r} is neither true nor false")
        types = str(lowered.get("types") or "infer").strip().lower()
        if types not in TYPES:
            raise InspectError(
                f"option types: {types!r} is not one of {', '.join(map(repr, TYPES))}"
            )
        sample = str(lowered.get("samplesize") or SAMPLE_SIZE).strip()
        if not sample.isdigit() or int(sample) < 1:
            raise InspectError(f"option sampleSize: {sample!r} is not a positive integer")
        storage_options = None
        if lowered.get("storageoptions"):
            try:
                storage_options = json.loads(lowered["storageoptions"])
            except ValueError as exc:
                raise InspectError(f"option storageOptions is not JSON: {exc}") from None
            if not isinstance(storage_options, dict):
                raise InspectError("option storageOptions must be a JSON object")
        result = cls(
            path=str(path),
            checkpoint_id=checkpoint_id,
            operator=lowered.get("operator") or None,
            state=lowered.get("state") or None,
            channel_state=channel == "true",
            types=types,
            sample_size=int(sample),
            storage_options=storage_options,
        )
        if result.channel_state and (result.operator or result.state):
            raise InspectError(
                "the channel state is every subtask's, not an operator's: drop the option "
                f"{'operator' if result.operator else 'state'} (or channelState)"
            )
        return result

    @classmethod
    def of(
        cls,
        checkpoint: str | os.PathLike[str],
        checkpoint_id: int | None,
        storage_options: Mapping[str, Any] | None,
        **others: Any,
    ) -> ReadOptions:
        """The options of a Python call (``read_state(spark, "ck/", checkpoint_id=7)``), given
        as Python values: the checkpoint, and ``others`` by their option names
        (``sampleSize=500``). Checked as :meth:`parse` checks Spark's, by way of the same text.
        """
        return cls.parse(
            text_options(
                path=os.fspath(checkpoint),
                checkpoint=checkpoint_id,
                storageOptions=storage_options,
                **others,
            )
        )

    def open(self) -> CheckpointReader:
        """The checkpoint these options name."""
        with readable(self.path):
            return open_checkpoint(
                self.path, self.checkpoint_id, storage_options=self.storage_options
            )


def text_options(**options: Any) -> dict[str, str]:
    """Options as the data source gets them (text; ``None`` left out): a bool as ``true`` or
    ``false``, a mapping as JSON, anything else as its ``str``. :class:`InspectError` if a
    mapping cannot be JSON (the executors could not get it)."""
    text = {}
    for name, value in options.items():
        if value is None:
            continue
        if isinstance(value, bool):
            text[name] = "true" if value else "false"
        elif isinstance(value, Mapping):
            try:
                text[name] = json.dumps(dict(value))
            except (TypeError, ValueError) as exc:
                raise InspectError(
                    f"{name}: the options reach Spark's executors as JSON, and these cannot "
                    f"be: {exc}"
                ) from None
        else:
            text[name] = str(value)
    return text
