"""What every benchmark reports of a figure over its runs: the median, least and greatest of
the verified runs that have it (a figure of an unverified run does not count)."""

from __future__ import annotations

import statistics
from typing import Any


def summary(runs: list[dict], key: str) -> dict[str, Any]:
    """``key``'s median, min and max over the verified runs that have it, and how many."""
    values = [r[key] for r in runs if r.get("verified") and r.get(key) is not None]
    if not values:
        return {"median": None, "min": None, "max": None, "runs": 0}
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "runs": len(values),
    }
