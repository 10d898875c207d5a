"""A subtask's failure as the driver reports it: the operator, the exception and the user's part of
its traceback, cut to a size a message carries.
"""

from __future__ import annotations

import reprlib
import traceback

from cutline.connectors.source import SourceError
from cutline.runtime.network.channel import ChannelError
from cutline.runtime.network.messages import Failed
from cutline.runtime.operators import (
    UserFunctionError,
)


def failed_message(subtask: str, exc: BaseException, operator: str) -> Failed:
    """The ``Failed`` message for ``exc``: the operator, the record, the error, the traceback
    (the user's own frames for a user function's error), each cut to a size a control message
    can carry."""
    if isinstance(exc, UserFunctionError):
        return Failed(
            subtask,
            shorten(exc.error),
            operator=shorten(exc.operator),
            record=shorten(exc.record),
            traceback=shorten(exc.user_traceback),
            passing=exc.passing,
        )
    record = exc.record if isinstance(exc, SourceError) else None
    return Failed(
        subtask,
        shorten(f"{type(exc).__name__}: {exc}"),
        operator=shorten(operator),
        record=shorten(_repr.repr(record)) if record is not None else None,
        traceback=shorten("".join(traceback.format_exception(exc))),
        cause="channel" if isinstance(exc, ChannelError) else "task",
    )


MESSAGE_MOST = 16 * 1024

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 200


def shorten(text: str) -> str:
    """``text``, or its first and last 8 KiB with how much was left out between them."""
    if len(text) <= MESSAGE_MOST:
        return text
    half = MESSAGE_MOST // 2
    return (
        f"{text[:half]}\n... ({len(text) - MESSAGE_MOST} characters left out) ...\n{text[-half:]}"
    )
