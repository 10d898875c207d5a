"""The report's figures, in matplotlib: the checkpoint history
(:mod:`~cutline.report.history_figure`) and one checkpoint's barriers
(:mod:`~cutline.report.barrier_figure`), built from what :mod:`cutline.report.data` read,
with the lanes, arrows, cuts and colours of :mod:`cutline.drawing` (so the barrier diagram
looks like the simulator's space-time diagrams). This module holds what they share, and
:func:`inline_svg`, which makes any of them (the event-time figure too) inline SVG for the
page.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from cutline import drawing

ABORTED_COLOUR = "#d62728"
"""The colour of what was aborted, in both figures."""


def inline_svg(build: Callable[[], Figure], salt: str) -> str:
    """The figure ``build`` makes, as an ``<svg>`` element to put inside an HTML page.

    Built and saved in :func:`cutline.drawing.style` (deterministic hashing, real
    ``<text>``). The ids matplotlib makes up (``figure_1``, clip paths, markers) get
    ``salt`` in front, so that two figures on one page never share an id; the ``gid`` s
    stay as they are.
    """
    with drawing.style(f"cutline-report-{salt}"):
        fig = build()
        data = drawing.save(fig, "svg")
    gids = {str(a.get_gid()) for a in fig.findobj() if a.get_gid() is not None}
    text = data.decode("utf-8")
    text = text[text.index("<svg") :]
    renamed = {
        found: f"{salt}-{found}"
        for found in re.findall(r'\bid="([^"]+)"', text)
        if html.unescape(found) not in gids
    }

    def rename(match: re.Match[str]) -> str:
        new = renamed.get(match.group(2))
        return match.group(0) if new is None else match.group(1) + new

    return re.sub(r'(\bid="|#)([^"()\s#]+)(?=[")])', rename, text)


def time_scale(span: float) -> tuple[float, str]:
    """Milliseconds for short times, seconds for long ones: the factor and the unit."""
    return (1000.0, "ms") if span < 2.0 else (1.0, "s")


def above(ax: Axes, x: float, text: str, colour_: Any, gid: str, **extra: Any) -> None:
    """A small label just above the plot, starting at time ``x``."""
    ax.text(
        x,
        1.0,
        text,
        transform=ax.get_xaxis_transform(),
        ha="left",
        va="bottom",
        fontsize=7,
        color=colour_,
        gid=gid,
        **extra,
    )
