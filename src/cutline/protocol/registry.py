"""Reference counting of the files that incremental checkpoints share, as a sans-IO state
machine.

An incremental checkpoint stores only what changed since an earlier complete checkpoint (its
**base**) and names the files of the base it still needs. A file is therefore shared by every
checkpoint whose chain passes through it, and may be deleted only when none of them needs it
any more. The :class:`SharedStateRegistry` decides when: it hears what the coordinator decides
(triggered with a base, completed with the files it names, aborted, discarded beyond
retention) and answers with the files that became unneeded, for the driver to delete.

A file is **needed** while

* a retained complete checkpoint names it, or
* it belongs to the base of a checkpoint still in flight: a subtask may be writing an
  increment on top of that base right now, even if the base itself was discarded meanwhile.

Every other file the registry heard of is unneeded, and is answered once (among the last
100,000 answered). A file written for a checkpoint that never completed (aborted, or
acknowledged too late) is unneeded as soon as the registry hears of it, unless a complete
checkpoint names it.

The registry never reads a clock or touches a file; the driver lists the files the checkpoint
directory holds when it starts, so that files left by a crashed run can be removed too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from cutline.protocol.errors import ProtocolError

REMEMBERED = 100_000
"""Files answered as unneeded that the registry remembers (see ``_answered``)."""


class SharedStateRegistry:
    """Which shared files the retained and in-flight checkpoints need.

    :param completed: the complete checkpoints already in the checkpoint directory (on
        restart), each with the shared files it names; all of them count as retained.
    """

    def __init__(self, completed: Mapping[int, Iterable[str]] | None = None) -> None:
        self._refs: dict[int, frozenset[str]] = {
            checkpoint: frozenset(files) for checkpoint, files in (completed or {}).items()
        }
        """Complete checkpoints that are retained, or the base of one in flight."""
        self._retained: set[int] = set(self._refs)
        self._pending: dict[int, int | None] = {}
        """In-flight checkpoint -> its base (``None``: it builds on nothing)."""
        self._known: set[str] = set().union(*self._refs.values()) if self._refs else set()
        """Files some complete checkpoint named, not yet answered as unneeded."""
        self._answered: dict[str, None] = {}
        """The latest files answered as unneeded, oldest first (a late acknowledgement may name
        them again; names are never reused). Bounded: a file answered longer ago than the
        last ``REMEMBERED`` may be answered again, which costs a deletion of nothing."""

    # ------------------------------------------------------------------ queries

    @property
    def needed(self) -> frozenset[str]:
        """The files that must stay."""
        bases = {b for b in self._pending.values() if b is not None}
        return frozenset().union(
            *(files for c, files in self._refs.items() if c in self._retained or c in bases)
        )

    @property
    def retained(self) -> frozenset[int]:
        return frozenset(self._retained)

    @property
    def pending(self) -> Mapping[int, int | None]:
        return dict(self._pending)

    # ------------------------------------------------------------------- events

    def triggered(self, checkpoint_id: int, base: int | None) -> None:
        """Checkpoint ``checkpoint_id`` is in flight, and may build on ``base``'s files.

        A base the registry does not hold (a savepoint, a checkpoint of a run that did not
        write shared files) gives nothing to build on."""
        if checkpoint_id in self._pending or checkpoint_id in self._refs:
            raise ProtocolError(f"checkpoint {checkpoint_id} was triggered twice")
        self._pending[checkpoint_id] = base if base in self._refs else None

    def completed(self, checkpoint_id: int, files: Iterable[str]) -> list[str]:
        """Checkpoint ``checkpoint_id`` is complete (its metadata is written) and names
        ``files``; it is retained until :meth:`discarded`. Returns the files now unneeded."""
        if checkpoint_id in self._refs:
            raise ProtocolError(f"checkpoint {checkpoint_id} completed twice")
        self._pending.pop(checkpoint_id, None)
        named = frozenset(files)
        self._refs[checkpoint_id] = named
        self._retained.add(checkpoint_id)
        self._known |= named
        return self._collect(())

    def settled(self, checkpoint_id: int) -> list[str]:
        """Checkpoint ``checkpoint_id`` is no longer in flight and names no shared file (a
        savepoint, which owns all its files). Returns the files now unneeded."""
        self._pending.pop(checkpoint_id, None)
        return self._collect(())

    def aborted(self, checkpoint_id: int, files: Iterable[str] = ()) -> list[str]:
        """Checkpoint ``checkpoint_id`` will never complete; ``files`` are the shared files its
        acknowledgements named. Returns the files now unneeded."""
        self._pending.pop(checkpoint_id, None)
        return self._collect(files)

    def orphaned(self, files: Iterable[str]) -> list[str]:
        """Files named by an acknowledgement that came after its checkpoint was aborted, or
        found in the directory: those no checkpoint needs are returned."""
        return self._collect(files)

    def discarded(self, checkpoint_id: int) -> list[str]:
        """Checkpoint ``checkpoint_id`` is no longer retained. Returns the files now unneeded."""
        if checkpoint_id not in self._retained:
            raise ProtocolError(f"checkpoint {checkpoint_id} is not retained")
        self._retained.discard(checkpoint_id)
        return self._collect(())

    def restarted(self) -> list[str]:
        """The job restarts: nothing is in flight any more. Returns the files now unneeded."""
        self._pending.clear()
        return self._collect(())

    # ---------------------------------------------------------------- internals

    def _collect(self, extra: Iterable[str]) -> list[str]:
        bases = {b for b in self._pending.values() if b is not None}
        for checkpoint in [c for c in self._refs if c not in self._retained and c not in bases]:
            del self._refs[checkpoint]
        needed = self.needed
        unneeded = (self._known | set(extra)) - needed - self._answered.keys()
        self._known -= unneeded
        self._answered.update(dict.fromkeys(sorted(unneeded)))
        while len(self._answered) > REMEMBERED:
            del self._answered[next(iter(self._answered))]
        return sorted(unneeded)
