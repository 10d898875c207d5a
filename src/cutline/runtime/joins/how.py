"""Which rows a join emits (:class:`How`): the pairs only, or also the rows of one side or both
that found no partner, with nulls on the other side."""

from __future__ import annotations

from enum import Enum
from typing import assert_never

from cutline.runtime.joins.output import Side


class How(Enum):
    """``inner``: the pairs only; ``left`` / ``right``: also every row of that side that
    found no partner (the other side's columns null); ``full``: also both sides' such rows."""

    INNER = "inner"
    LEFT = "left"
    RIGHT = "right"
    FULL = "full"

    @classmethod
    def of(
        cls, how: str | How, allowed: tuple[How, ...] | None = None, what: str = "a join"
    ) -> How:
        """``how`` as a :class:`How`, refused unless one of ``allowed`` (default: all)."""
        allowed = allowed or tuple(cls)
        try:
            found = how if isinstance(how, How) else cls(how)
        except ValueError:
            found = None
        if found not in allowed:
            raise ValueError(
                f"{what} has no how={how!r}: it is one of "
                f"{', '.join(repr(h.value) for h in allowed)}"
            )
        assert found is not None
        return found

    def outer(self, side: Side) -> bool:
        """Whether rows of ``side`` that found no partner are emitted."""
        match self:
            case How.INNER:
                return False
            case How.LEFT:
                return side is Side.LEFT
            case How.RIGHT:
                return side is Side.RIGHT
            case How.FULL:
                return True
            case _:
                assert_never(self)
