"""A subtask's **state file**: what one subtask wrote for one checkpoint, one owner of its format.

The subtask writes it on its snapshot thread (``runtime/task/snapshot_writer.py``); a restore gathers
from it (``restore.py``) and the reader shows it (``reader.py``). All three go through
:class:`SubtaskState`, so the format has one definition:

==============  ==========================================================================
field           what it holds
==============  ==========================================================================
``format``      :data:`STATE_FORMAT`: a file of another version is refused, never guessed at
``operators``   per operator uid (and :data:`DEAD_LETTERS`) what its snapshot returned: a
                keyed state handle (a chain of segments), a source's offsets, a sink's
                pre-committed part
``channels``    only when there is channel state: per input channel the records recorded
                on it (consumed again first after a restore), per output channel the
                records an unaligned barrier overtook (sent again first)
==============  ==========================================================================

The file is a pickle: the operators' parts and the recorded records are Python objects.
The checkpoint's metadata (``layout.py``) names the file, its size and its SHA-256, which a
reader checks before it decodes.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

from cutline.runtime.checkpoint.layout import CorruptCheckpointError

STATE_FORMAT = 1
DEAD_LETTERS = "_dead_letters"
"""The name the dead-letter output's state goes under in a subtask's state file."""

ChannelRecords = dict[str, list[Any]]
"""Channel id -> the batches recorded on it, in order."""


@dataclass(frozen=True)
class SubtaskState:
    """One subtask's state in one checkpoint (see the module's table)."""

    operators: dict[str, Any]
    inputs: ChannelRecords = field(default_factory=dict)
    outputs: ChannelRecords = field(default_factory=dict)

    @property
    def has_channel_state(self) -> bool:
        return bool(self.inputs or self.outputs)

    def channel_state_bytes(self) -> int:
        """The size of the channel state as the file holds it (0 when there is none)."""
        if not self.has_channel_state:
            return 0
        return len(pickle.dumps(self._channels(), protocol=pickle.HIGHEST_PROTOCOL))

    def encode(self) -> bytes:
        data: dict[str, Any] = {"format": STATE_FORMAT, "operators": self.operators}
        if self.has_channel_state:
            data["channels"] = self._channels()
        return pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def decode(cls, data: bytes, subtask: str) -> SubtaskState:
        """The state file of ``subtask``; :class:`CorruptCheckpointError` naming the subtask if
        it cannot be read or was written by another version of cutline."""
        try:
            value = pickle.loads(data)
        except Exception as exc:
            raise CorruptCheckpointError(
                f"the state file of {subtask} cannot be read: {type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(value, dict) or value.get("format") != STATE_FORMAT:
            raise CorruptCheckpointError(
                f"the state file of {subtask} was not written by this version of cutline"
            )
        operators = value.get("operators")
        channels = value.get("channels") or {}
        if not isinstance(operators, dict) or not isinstance(channels, dict):
            raise CorruptCheckpointError(f"the state file of {subtask} is not a state file")
        return cls(operators, channels.get("inputs") or {}, channels.get("outputs") or {})

    def _channels(self) -> dict[str, ChannelRecords]:
        return {"inputs": self.inputs, "outputs": self.outputs}
