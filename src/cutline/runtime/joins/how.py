"""Which rows a join emits besides its pairs (:class:`How`), and the error a kernel raises when
it is driven against its rules (:class:`JoinError`)."""

from __future__ import annotations

from enum import Enum
from typing import assert_never


class JoinError(ValueError):
    """A join given what it cannot take: a ``how=`` it does not offer, a batch whose columns
    differ from the side's, rows that are late, snapshots of another join."""


class How(Enum):
    """Which rows a join emits: ``inner`` its pairs only; ``left`` also each left row that
    found no partner, with nulls on the right; ``right`` the same of the right's rows;
    ``full`` both."""

    INNER = "inner"
    LEFT = "left"
    RIGHT = "right"
    FULL = "full"

    @property
    def keeps_left(self) -> bool:
        """Whether a left row without a partner is emitted (with nulls on the right)."""
        match self:
            case How.LEFT | How.FULL:
                return True
            case How.INNER | How.RIGHT:
                return False
            case _:
                assert_never(self)

    @property
    def keeps_right(self) -> bool:
        """Whether a right row without a partner is emitted (with nulls on the left)."""
        match self:
            case How.RIGHT | How.FULL:
                return True
            case How.INNER | How.LEFT:
                return False
            case _:
                assert_never(self)


def how_of(how: str | How, offered: tuple[How, ...], join: str) -> How:
    """``how`` as a :class:`How`, refused (naming ``join`` and what it offers) unless it is one
    of ``offered``."""
    try:
        found = how if isinstance(how, How) else How(how)
    except ValueError:
        found = None
    if found not in offered:
        names = ", ".join(repr(h.value) for h in offered)
        raise JoinError(f"{join}: how={how!r} is not one of {names}")
    assert found is not None
    return found
