"""The lateness rule, in one place.

A window whose last millisecond is ``end - 1`` **fires** when the watermark reaches it, and is
kept for records up to ``allowed_lateness`` after that: it is **past** (dropped; a record of
it only late) once ``end - 1 + allowed_lateness`` is at or below the watermark. A record is
late when every window it belongs to is past; for a session: when the session it alone would
open (``[t, t + gap)``) is.
"""

from __future__ import annotations

import numpy as np

from cutline.protocol.watermarks import MAX_WATERMARK


def cleanup_time(end: int, lateness: int) -> int:
    """When a window ending at ``end`` (exclusive) is past: ``end - 1 + lateness``, within the
    watermarks' range."""
    return min(MAX_WATERMARK, end - 1 + lateness)


def is_past(end: int, lateness: int, watermark: int) -> bool:
    """Whether a window ending at ``end`` is past at ``watermark``."""
    return cleanup_time(end, lateness) <= watermark


def in_time(ends: np.ndarray, lateness: int, watermark: int) -> np.ndarray:
    """Of windows ending at ``ends``, which are not past at ``watermark`` (a mask)."""
    return (ends - 1 + lateness if lateness else ends - 1) > watermark
