"""Which chains of segments later checkpoints may build on: the books that keyed state
(:mod:`~cutline.runtime.state.backend`) and an operator's columns
(:mod:`~cutline.runtime.state.columns`) keep alike.

A checkpoint writes a full segment, or an incremental one that builds on the chain of the
newest checkpoint the coordinator declared complete when it triggered it (its ``base``): only
if that chain is known here (written by this subtask, or restored whole), the checkpoint is not
a savepoint, incremental checkpoints are on, and the chain is shorter than ``full_every``.
"""

from __future__ import annotations

from cutline.runtime.state.config import StateConfig
from cutline.runtime.state.segments import SegmentRef


class ChainBooks:
    """Per checkpoint, the chain of segments written for it and the number of its snapshot.

    The processing thread notes each snapshot (:meth:`taken`); the snapshot thread writes them
    in order, reads the books and forgets what no later checkpoint can build on (over copies
    of the keys: the other thread adds meanwhile)."""

    def __init__(self, config: StateConfig) -> None:
        self.config = config
        self._chains: dict[int, list[SegmentRef]] = {}
        self._numbers: dict[int, int] = {}

    def taken(self, checkpoint_id: int | None, number: int) -> None:
        """Snapshot ``number`` was taken for ``checkpoint_id``."""
        if checkpoint_id is not None:
            self._numbers[checkpoint_id] = number

    def adopt(self, checkpoint_id: int, chain: list[SegmentRef]) -> None:
        """The restored checkpoint's chain, of exactly this subtask's key groups: later
        incremental segments may build on it (everything after it is newer: number 0)."""
        self._chains[checkpoint_id] = chain
        self._numbers[checkpoint_id] = 0

    def number_of(self, checkpoint_id: int | None) -> int | None:
        """The number of the snapshot of ``checkpoint_id`` (``None``: not one of these books):
        no later snapshot needs the changes made before it (its base is that checkpoint or a
        newer one)."""
        return None if checkpoint_id is None else self._numbers.get(checkpoint_id)

    def builds_on(self, base: int | None, savepoint: bool) -> list[SegmentRef] | None:
        """The chain a checkpoint with ``base`` writes its next segment of (incremental), or
        ``None``: it writes a full one."""
        config = self.config
        if base is None or savepoint or not config.incremental:
            return None
        chain = self._chains.get(base)
        if chain is None or base not in self._numbers or len(chain) >= config.full_every:
            return None
        return chain

    def written(self, checkpoint_id: int | None, savepoint: bool, chain: list[SegmentRef]) -> None:
        """``chain`` was written for ``checkpoint_id``: a later checkpoint may build on it
        (not on a savepoint's, which it owns, nor without incremental checkpoints)."""
        if not savepoint and checkpoint_id is not None and self.config.incremental:
            self._chains[checkpoint_id] = chain

    def forget_before(self, base: int) -> None:
        """Nothing builds on a checkpoint older than ``base`` any more."""
        for old in [c for c in list(self._chains) if c < base]:
            self._chains.pop(old, None)
        for old in [c for c in list(self._numbers) if c < base]:
            self._numbers.pop(old, None)
