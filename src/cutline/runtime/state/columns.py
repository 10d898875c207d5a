"""State an operator keeps as columns beside its keyed state (a window operator's windows as
Arrow and NumPy arrays), checkpointed as a chain of segments of its own, by the keyed state's
rules (:mod:`~cutline.runtime.state.backend`):

* a checkpoint writes a **full** segment (everything), or, building on the chain of the
  newest checkpoint the coordinator declared complete (``base``), an **incremental** one:
  only what changed since that checkpoint's snapshot was taken;
* a chain is at most ``full_every`` segments long; a savepoint, or a backend configured
  ``incremental=False``, always writes a full one, which the checkpoint owns;
* a restore reads the segments of the chain in order.

:class:`ColumnChain` keeps the books (which snapshot a change goes into, which chains later
checkpoints may build on); the operator says what its segments hold: it is handed
``since``, the number of the snapshot whose changes are already in the chain (``None``: write
everything), and numbers every change with :attr:`ColumnChain.generation`, the snapshot it
goes into."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cutline.runtime.state.chains import ChainBooks
from cutline.runtime.state.config import StateConfig
from cutline.runtime.state.segments import SegmentRef, SegmentSource, SegmentStore

COLUMNS = "columns"
"""The field of a keyed state handle that names the chain of an operator's columns."""


@dataclass(frozen=True)
class ColumnTicket:
    """The synchronous part of a checkpoint of the columns: the snapshot's number."""

    number: int
    checkpoint_id: int | None
    base: int | None
    savepoint: bool


class ColumnChain:
    """The books of an operator's columns: snapshot numbers and the chains written.
    :meth:`snapshot` runs on the processing thread, :meth:`write` on the snapshot thread, in
    the order the snapshots were taken."""

    def __init__(self, config: StateConfig) -> None:
        self.config = config
        self.generation = 1
        """The number of the snapshot that the changes made now go into (restored state is
        generation 0: every chain restored holds it)."""
        self._books = ChainBooks(config)
        self._settled = 0

    @property
    def settled(self) -> int:
        """The number of the newest snapshot whose changes no later incremental segment needs
        apart from older ones: the snapshot of the newest checkpoint a segment was built on
        (later ones build on it or on a newer one). Without incremental checkpoints, the
        current one (every segment is full)."""
        return self._settled if self.config.incremental else self.generation

    def adopt(self, checkpoint_id: int, chain: Sequence[Mapping[str, Any]]) -> None:
        """The restored checkpoint's chain, of exactly this subtask's key groups: later
        incremental segments may build on it."""
        self._books.adopt(checkpoint_id, [SegmentRef.from_dict(r) for r in chain])

    def snapshot(
        self, checkpoint_id: int | None, base: int | None, savepoint: bool
    ) -> ColumnTicket:
        """The synchronous part: the changes made from now on go into the next snapshot."""
        number = self.generation
        self.generation += 1
        self._books.taken(checkpoint_id, number)
        return ColumnTicket(number, checkpoint_id, base, savepoint)

    def number_of(self, checkpoint_id: int | None) -> int | None:
        """The number of the snapshot of ``checkpoint_id`` (``None``: not one this chain
        can build on): no later snapshot needs the changes made before it (its base is that
        checkpoint or a newer one)."""
        return self._books.number_of(checkpoint_id)

    def write(
        self,
        ticket: ColumnTicket,
        store: SegmentStore,
        name: str,
        encode: Callable[[int | None], bytes],
    ) -> dict[str, Any]:
        """The asynchronous part: ``encode(since)`` (the changes after snapshot ``since``, or
        everything for ``None``) written as the next segment of the base's chain, or as a new
        chain; the handle's fields naming it."""
        books, base = self._books, ticket.base
        chain = books.builds_on(base, ticket.savepoint)
        since = books.number_of(base)
        data = encode(None if chain is None else since)
        ref = store.write_segment(
            f"{name}-columns.seg", data, shared=self.config.incremental and not ticket.savepoint
        )
        ref = SegmentRef(ref.path, ref.size, ref.sha256, chain is None)
        new_chain = [ref] if chain is None else [*chain, ref]
        books.written(ticket.checkpoint_id, ticket.savepoint, new_chain)
        if base is not None and since is not None:
            books.forget_before(base)
            self._settled = max(self._settled, since)
        return {COLUMNS: [r.to_dict() for r in new_chain]}


def read_chain(handle: Mapping[str, Any], store: SegmentSource) -> Iterator[bytes]:
    """The segments of the columns a keyed state handle names, oldest first (none: it names
    none)."""
    for data in handle.get(COLUMNS) or ():
        yield store.read_segment(SegmentRef.from_dict(data))


def handle_segments(handle: Mapping[str, Any]) -> list[SegmentRef]:
    """Every segment a keyed state handle names: its keyed state's and its columns'."""
    return [SegmentRef.from_dict(r) for r in [*handle["chain"], *(handle.get(COLUMNS) or ())]]
