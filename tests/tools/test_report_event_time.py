"""The report's event time (``cutline.report.event_time``): for input replayed from long ago,
the watermark with its date, how fast event time went (a lag of days says only how old the
data is), a figure of the watermarks over the run, and the table taken before the end of the
input (after it every watermark is the end, not a time)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from cutline import drawing
from cutline.protocol.watermarks import MAX_WATERMARK
from cutline.report.event_time import (
    event_rates,
    human_rate,
    shown_checkpoint,
    timed,
    watermark_figure,
)
from cutline.report.figures import inline_svg
from cutline.report.html import _event_time_section
from cutline.runtime.checkpoint.stats import CheckpointStats, History, SubtaskStats

DAY = 86_400_000
START = 1_700_000_000.0  # the wall clock of the first checkpoint (seconds)
EVENTS = 1_500_000_000_000  # the input's first event time (2017: replayed data)


def checkpoint(
    n: int, seconds: float, watermarks: dict[str, int], late: int = 0
) -> CheckpointStats:
    subtasks = {
        f"{chain}-0": SubtaskStats(
            f"{chain}-0",
            0.1,
            0.0,
            0.0,
            0.0,
            0.0,
            10,
            watermark=watermark,
            event_time={"window": {"late": late, "windows": 3, "timers": 3}}
            if chain == "window"
            else {},
        )
        for chain, watermark in watermarks.items()
    }
    return CheckpointStats(
        n, 1, 0.1, run="r1", trigger_time=START + seconds, triggered_at=seconds, subtasks=subtasks
    )


def history() -> History:
    """Two chains reading two days of event time per second of wall clock, then the end."""
    return History(
        checkpoints=[
            checkpoint(1, 0.0, {"source": EVENTS, "window": EVENTS - 1000}),
            checkpoint(2, 1.0, {"source": EVENTS + 2 * DAY, "window": EVENTS + DAY}, late=4),
            checkpoint(3, 3.0, {"source": EVENTS + 6 * DAY, "window": EVENTS + 5 * DAY}, late=9),
            checkpoint(4, 3.5, {"source": MAX_WATERMARK, "window": MAX_WATERMARK}, late=9),
        ]
    )


def test_the_rate_of_event_time_and_the_checkpoint_shown_before_the_end() -> None:
    checkpoints = timed(history())
    assert [c.checkpoint_id for c in checkpoints] == [1, 2, 3, 4]
    assert shown_checkpoint(checkpoints).checkpoint_id == 3
    rates = event_rates(checkpoints)
    assert rates[2] == {"source": 2 * DAY, "window": DAY + 1000}
    assert rates[3] == {"source": 2 * DAY, "window": 2 * DAY}
    assert 4 not in rates  # (the end is no time)
    assert human_rate(2 * DAY) == "2.0 d/s"
    assert human_rate(41.3 * 3_600_000) == "41.3 h/s"
    assert human_rate(5 * 60_000) == "5.0 min/s"
    assert human_rate(980) == "0.98 s/s"


def test_the_section_shows_dates_rates_and_late_records_and_a_figure_of_the_watermarks() -> None:
    page = _event_time_section(history())
    assert "At checkpoint 3 (the input ended after it)" in page
    assert "2017-07-" in page  # (the watermark's date: EVENTS + 6 days, in UTC)
    assert "2.0 d/s" in page
    assert "end of input" in page  # (the lag of the last checkpoint)
    assert "window 9" in page and "window 4" in page  # (late records per operator)
    svg = inline_svg(lambda: watermark_figure(history()), "test")
    ids = {e.get("id") for e in ET.fromstring(svg).iter() if e.get("id")}
    assert {"watermark-source", "watermark-window", "end-source", "end-window"} <= ids
    with drawing.style():
        figure = watermark_figure(History())
    assert [t.get_gid() for t in figure.axes[0].texts] == ["no-watermarks"]
