"""The look of cutline's pictures: space-time lanes, arrows, cuts, colours and saving.

Two pictures tell the same story: the simulator's space-time diagram of a Chandy-Lamport
run (:mod:`cutline.sim.diagram`) and the report's diagram of one checkpoint's barriers
(:mod:`cutline.report`). Both put one horizontal *lane* per process (or subtask) with time
along x, draw a marker (or barrier) as a thin dashed arrow in its snapshot's colour, join
the points where the lanes recorded their state into the snapshot's *cut*, star where it
began, and keep the key outside the axes on the right. This module is that shared
vocabulary, so that the two pictures look alike by construction, not by copying.

It is a leaf: it imports matplotlib and nothing of cutline, so both the simulator and the
report (and anything else) may draw with it without importing each other.

Figures are built on :class:`matplotlib.figure.Figure` directly, never through ``pyplot``,
so they need no display and can be drawn from several threads. Built and saved inside
:func:`style`, they are deterministic: the same input gives byte-identical files.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import matplotlib as mpl
from matplotlib import style as mpl_style
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch

__all__ = [
    "DASHES",
    "FORMATS",
    "LANE_COLOUR",
    "arrow",
    "colour",
    "cut_line",
    "dashed_key",
    "figure",
    "halo",
    "lane",
    "lane_axes",
    "lane_heights",
    "legend",
    "save",
    "star",
    "star_key",
    "style",
]

FORMATS: dict[str, str] = {".png": "png", ".svg": "svg"}
"""Supported file suffixes and the matplotlib format each one is written in."""

DASHES = (0, (4.0, 2.5))
"""The dash pattern of a marker or barrier: what travels along a channel but is no data."""

LANE_COLOUR = "0.55"
"""The grey of a lane's line."""

_DPI = 100
"""Dots per inch of every figure (and so of every PNG)."""

_METADATA: dict[str, dict[str, str | None]] = {
    "svg": {"Date": None, "Creator": "cutline"},
    "png": {"Software": "cutline"},
}
"""File metadata without dates or versions, so that output is byte-identical."""

_STYLE: dict[str, Any] = {
    "svg.fonttype": "none",  # real <text> elements: smaller, searchable SVG
    "svg.image_inline": True,
    "font.size": 9.0,
    "axes.titlesize": 11.0,
    "legend.fontsize": 8.5,
}
"""Applied on top of matplotlib's defaults (the user's matplotlibrc is ignored)."""

_LOCK = threading.RLock()
"""rcParams are global: figures are built and saved one at a time."""


@contextmanager
def style(salt: str = "cutline") -> Iterator[None]:
    """Matplotlib's defaults with cutline's settings on top, for building and saving figures.

    ``salt`` seeds the ids of an SVG's clip paths and markers: two figures that share a
    page need different salts. rcParams are global, so the settings hold a lock: inside,
    this thread is the only one drawing.
    """
    with _LOCK, mpl_style.context(["default", {**_STYLE, "svg.hashsalt": salt}]):
        yield


def figure(width: float, height: float) -> Figure:
    """An empty figure of ``width`` x ``height`` inches, laid out by matplotlib's
    constrained layout (so that titles, labels and an outside legend all fit)."""
    return Figure(figsize=(width, height), dpi=_DPI, layout="constrained")


def save(fig: Figure, fmt: str) -> bytes:
    """``fig`` as the bytes of a ``fmt`` file (a value of :data:`FORMATS`), without dates or
    versions in it. Call it inside :func:`style`, like the building of the figure."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt, metadata=_METADATA[fmt])
    return buffer.getvalue()


def colour(snapshot: int) -> tuple[float, float, float, float]:
    """The colour of snapshot (or checkpoint) ``snapshot`` in every picture: tab10, cycled."""
    cmap = mpl.colormaps["tab10"]
    rgba = cmap(snapshot % cmap.N)
    return (float(rgba[0]), float(rgba[1]), float(rgba[2]), float(rgba[3]))


# --------------------------------------------------------------------------------- lanes


def lane_heights(names: Sequence[str]) -> dict[str, float]:
    """Where each lane goes on the y axis: the first of ``names`` on top, the last at 0."""
    return {name: float(len(names) - 1 - i) for i, name in enumerate(names)}


def lane_axes(ax: Axes, lanes: int, left: float, right: float) -> None:
    """Make ``ax`` hold ``lanes`` lanes from time ``left`` to ``right``: no y axis and no
    frame but the time axis at the bottom (the lanes are labelled one by one)."""
    ax.set_xlim(left, right)
    ax.set_ylim(-0.6, lanes - 0.4)
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)


def lane(
    ax: Axes,
    y: float,
    label: str,
    *,
    gid: str,
    label_gid: str,
    fontsize: float = 10.0,
    muted: bool = False,
) -> None:
    """One lane at height ``y``: a grey line across the axes and ``label`` left of it, in
    bold (``muted``: in grey, for a lane that has less to show). ``gid`` and ``label_gid``
    name the line and the label in an SVG."""
    left, right = ax.get_xlim()
    ax.add_line(Line2D([left, right], [y, y], color=LANE_COLOUR, linewidth=1.0, zorder=1, gid=gid))
    ax.text(
        -0.008,
        y,
        label,
        transform=ax.get_yaxis_transform(),
        ha="right",
        va="center",
        fontsize=fontsize,
        fontweight="normal" if muted else "bold",
        color="0.5" if muted else "black",
        gid=label_gid,
    )


# ---------------------------------------------------------------------- what is drawn on them


def arrow(
    start: tuple[float, float],
    end: tuple[float, float],
    colour: Any,
    *,
    linewidth: float,
    zorder: float,
    gid: str,
    dashed: bool = False,
    head: float = 8.0,
) -> FancyArrowPatch:
    """A message from one lane to another: solid for data, ``dashed`` for a marker or
    barrier; ``head`` is the size of its arrowhead."""
    return FancyArrowPatch(
        start,
        end,
        arrowstyle="-|>",
        mutation_scale=head,
        color=colour,
        linewidth=linewidth,
        linestyle=DASHES if dashed else "solid",
        shrinkA=1.5,
        shrinkB=1.5,
        zorder=zorder,
        gid=gid,
    )


def halo(
    xs: Sequence[float],
    ys: Sequence[float],
    colour: Any,
    *,
    width: float,
    gid: str,
    capstyle: Literal["butt", "round"] = "round",
) -> Line2D:
    """A wide, pale band under what it marks: a payment a snapshot recorded in a channel's
    state, or how long a subtask spent aligning its barriers."""
    return Line2D(
        xs,
        ys,
        color=colour,
        alpha=0.35,
        linewidth=width,
        solid_capstyle=capstyle,
        zorder=2,
        gid=gid,
    )


def cut_line(xs: list[float], ys: list[float], colour: Any, label: str, gid: str) -> Line2D:
    """The cut of a snapshot: a line through the points where the lanes recorded."""
    return Line2D(
        xs,
        ys,
        color=colour,
        linewidth=2.0,
        marker="o",
        markersize=7,
        markeredgecolor="white",
        markeredgewidth=0.8,
        zorder=5,
        label=label,
        gid=gid,
    )


_STAR: dict[str, Any] = {
    "marker": "*",
    "markeredgecolor": "black",
    "markeredgewidth": 0.6,
    "linestyle": "none",
}
"""How a star is drawn, on the plot and in the key."""


def star(x: float, y: float, colour: Any, gid: str) -> Line2D:
    """The star that marks where a snapshot began (an initiator, a source subtask)."""
    return Line2D([x], [y], color=colour, markersize=15, zorder=6, gid=gid, **_STAR)


# ------------------------------------------------------------------------------------ key


def star_key(colour: Any, label: str) -> Line2D:
    """The key's entry for :func:`star`."""
    return Line2D([], [], color=colour, markersize=11, label=label, **_STAR)


def dashed_key(colour: Any, label: str) -> Line2D:
    """The key's entry for a dashed :func:`arrow`."""
    return Line2D([], [], color=colour, linewidth=0.9, linestyle=DASHES, label=label)


def legend(fig: Figure, ax: Axes, key: Sequence[Artist]) -> None:
    """The legend outside ``ax``, on the right: ``key`` (what the drawing's marks mean),
    then every cut drawn on ``ax`` (a line whose ``gid`` starts with ``cut-``)."""
    cuts = [line for line in ax.get_lines() if str(line.get_gid()).startswith("cut-")]
    fig.legend(handles=[*key, *cuts], loc="outside right upper", frameon=False)
