"""Splits of a source: which subtask reads each one, and where each one stands.

A source's input is cut into **splits**: a sequence's slices, the files of a directory, the
partitions of a Kafka topic. A split has an id that never changes (a file's path, ``topic/3``)
and, where the source has one, an **ordinal** (a slice's or a partition's number).

**Who reads a split** is a pure function of the split and the parallelism (:func:`owner`): its
ordinal modulo the parallelism (round-robin, as Flink's Kafka source deals partitions), else a
stable hash of its id (CRC-32, the same in every process and run). So the subtasks of a source
agree on every split without talking to each other or to the driver; a split found while the
job runs never moves one found before; and a restore at another parallelism deals every
split again. There is no assignment to checkpoint, only each split's position.

**A subtask's splits** are a :class:`SplitBook`: events in (``restored``, ``discovered``,
``finished``, ``snapshot``), actions out (:class:`AddSplit`: give this split to the reader,
from this position). Its snapshot holds a :class:`SplitState` per split it owns, finished ones
included (so that a finished split costs nothing after a restore, and a discovery does not
add it again). A restore, at any parallelism, merges the snapshots of every old subtask
(:func:`merge_split_states`) and each new subtask's book keeps what it owns.

Why no enumerator on the driver, as Flink's FLIP-27 has: cutline's sources know their splits
(a listing, a topic's metadata) wherever they run, and a deterministic owner makes the
assignment as exact as an enumerator's without a driver round trip, a control message or
checkpointed coordinator state. What it gives up is balancing by demand: splits dealt by hash
(files found while the job runs) may fall unevenly on few subtasks.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


class SplitError(Exception):
    """A split event that breaks the rules (a split that is not this subtask's, one read after
    it finished, two splits of one id with different ordinals)."""


@dataclass(frozen=True)
class Split:
    """One split of a source: ``id`` unique within the source and stable across runs;
    ``ordinal`` its number where the source numbers its splits (dealt round-robin), else
    ``None`` (dealt by a hash of ``id``); ``version`` what it looked like when listed (a
    file's size and modification time), if the source says: a split listed again with
    another version changed (``SplitChanged``)."""

    id: str
    ordinal: int | None = None
    version: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise SplitError(f"a split's id must be a non-empty string, not {self.id!r}")
        if self.ordinal is not None and (type(self.ordinal) is not int or self.ordinal < 0):
            raise SplitError(
                f"split {self.id!r}: an ordinal must be an integer of 0 or more, not "
                f"{self.ordinal!r}"
            )


def owner(split: Split, parallelism: int) -> int:
    """The subtask (``0 .. parallelism - 1``) that reads ``split``."""
    if parallelism < 1:
        raise SplitError(f"parallelism must be 1 or more, not {parallelism}")
    if split.ordinal is not None:
        return split.ordinal % parallelism
    return zlib.crc32(split.id.encode()) % parallelism


@dataclass(frozen=True)
class SplitState:
    """Where one split stands in a checkpoint: its ordinal, and its reader's ``position``
    (picklable, the reader's own) or ``finished``; and its version when it was found."""

    ordinal: int | None
    position: Any = None
    finished: bool = False
    version: str | None = None


@dataclass(frozen=True)
class AddSplit:
    """Give ``split`` to the reader, to read from ``position`` (``None``: its beginning)."""

    split: Split
    position: Any = None


@dataclass(frozen=True)
class SplitChanged:
    """A split this subtask has (read, or being read) was listed with another version than
    when it was found: it is not read again; say so (once per version)."""

    split: Split
    before: str | None
    finished: bool


SplitAction = AddSplit | SplitChanged


def merge_split_states(
    snapshots: Iterable[Mapping[str, SplitState]],
) -> dict[str, SplitState]:
    """The split states of several old subtasks as one (a restore at another parallelism):
    each split is in one of them; one found in two (a source whose owner changed between
    runs) keeps the state that read furthest: a finished one, else the later snapshot's."""
    merged: dict[str, SplitState] = {}
    for snapshot in snapshots:
        for split_id, state in snapshot.items():
            found = merged.get(split_id)
            if found is None or not found.finished:
                merged[split_id] = state
    return merged


class SplitBook:
    """The splits one subtask of a source reads: see the module's docstring.

    :param subtask: this subtask's index.
    :param parallelism: the source's parallelism.
    """

    def __init__(self, subtask: int, parallelism: int) -> None:
        if not 0 <= subtask < parallelism:
            raise SplitError(f"subtask {subtask} is not one of 0 .. {parallelism - 1}")
        self.subtask = subtask
        self.parallelism = parallelism
        self._splits: dict[str, Split] = {}
        """Every split this subtask owns and knows of (finished ones too), as first found."""
        self._finished: set[str] = set()
        self._versions: dict[str, str | None] = {}
        """The version of each split last listed (changes are said once)."""

    # ------------------------------------------------------------------ events

    def restored(
        self, states: Mapping[str, SplitState], listing: Iterable[Split] = ()
    ) -> list[AddSplit]:
        """A restore: the merged split states of the checkpoint. This subtask's unfinished ones
        go to the reader from their positions; its finished ones are remembered, never read.

        ``listing``: the splits the source numbers in this attempt (a listing made once for
        every subtask: files found when the job started). Their ordinals are this attempt's,
        whatever the checkpoint's were; a split the listing does not have keeps the
        checkpoint's ordinal."""
        if self._splits:
            raise SplitError("splits are restored once, before any is discovered")
        ordinals = {split.id: split.ordinal for split in listing}
        actions = []
        for split_id, state in sorted(states.items()):
            split = Split(split_id, ordinals.get(split_id, state.ordinal), state.version)
            if not self.owns(split):
                continue
            self._splits[split_id] = split
            self._versions[split_id] = state.version
            if state.finished:
                self._finished.add(split_id)
            else:
                actions.append(AddSplit(split, state.position))
        return actions

    def discovered(self, splits: Iterable[Split]) -> list[SplitAction]:
        """The source listed these splits (all of them, or the new ones): those this subtask
        owns and did not know go to the reader from their beginning; one it knows listed
        with another version is said to have changed (and is not read again)."""
        actions: list[SplitAction] = []
        for split in splits:
            known = self._splits.get(split.id)
            if known is not None:
                if known.ordinal != split.ordinal:
                    raise SplitError(
                        f"split {split.id!r} was listed with ordinal {split.ordinal}, and "
                        f"before with {known.ordinal}: a split's ordinal never changes"
                    )
                before = self._versions.get(split.id)
                if split.version is not None and before is not None and split.version != before:
                    self._versions[split.id] = split.version
                    actions.append(SplitChanged(split, before, split.id in self._finished))
                continue
            if self.owns(split):
                self._splits[split.id] = split
                self._versions[split.id] = split.version
                actions.append(AddSplit(split))
        return actions

    def finished(self, split_id: str) -> None:
        """The reader read every record of ``split_id``."""
        if split_id not in self._splits:
            raise SplitError(f"split {split_id!r} finished, but this subtask does not read it")
        self._finished.add(split_id)

    def snapshot(self, positions: Mapping[str, Any]) -> dict[str, SplitState]:
        """The state of every split this subtask owns, for a checkpoint: ``positions`` are the
        reader's (of its unfinished splits); finished splits need none."""
        missing = [s for s in self._splits if s not in self._finished and s not in positions]
        if missing:
            raise SplitError(f"the reader gave no position for split(s) {', '.join(missing)}")
        return {
            split_id: SplitState(
                split.ordinal,
                None if split_id in self._finished else positions[split_id],
                split_id in self._finished,
                self._versions.get(split_id),
            )
            for split_id, split in self._splits.items()
        }

    # ----------------------------------------------------------------- queries

    def owns(self, split: Split) -> bool:
        return owner(split, self.parallelism) == self.subtask

    def reads(self, split_id: str) -> bool:
        """Whether it reads ``split_id`` now (it owns it, and it did not finish)."""
        return split_id in self._splits and split_id not in self._finished

    @property
    def unfinished(self) -> list[str]:
        """The ids of the splits it reads and has not finished."""
        return [s for s in self._splits if s not in self._finished]

    @property
    def done(self) -> bool:
        """Every split it knows of is finished (a bounded source whose listing is complete
        is then exhausted here)."""
        return len(self._finished) == len(self._splits)
