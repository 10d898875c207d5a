"""A subtask's failure as the driver reports it: the operator, the exception and the user's part of
its traceback, cut to a size a message carries.
"""

from __future__ import annotations

import traceback
from typing import Any

from cutline.runtime.network.channel import ChannelError
from cutline.runtime.operators import (
    UserFunctionError,
)


def failure_report(exc: BaseException, operator: str) -> dict[str, Any]:
    """The body of a ``failed`` message: the operator, the record, the error, the traceback
    (the user's own frames for a user function's error), each cut to a size a control message
    can carry."""
    if isinstance(exc, UserFunctionError):
        return {
            "operator": shorten(exc.operator),
            "record": shorten(exc.record),
            "error": shorten(exc.error),
            "traceback": shorten(exc.user_traceback),
            "cause": "task",
        }
    return {
        "operator": shorten(operator),
        "record": None,
        "error": shorten(f"{type(exc).__name__}: {exc}"),
        "traceback": shorten("".join(traceback.format_exception(exc))),
        "cause": "channel" if isinstance(exc, ChannelError) else "task",
    }


MESSAGE_MOST = 16 * 1024


def shorten(text: str) -> str:
    """``text``, or its first and last 8 KiB with how much was left out between them."""
    if len(text) <= MESSAGE_MOST:
        return text
    half = MESSAGE_MOST // 2
    return (
        f"{text[:half]}\n... ({len(text) - MESSAGE_MOST} characters left out) ...\n{text[-half:]}"
    )
