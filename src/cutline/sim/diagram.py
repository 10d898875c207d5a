"""Space-time diagrams of simulated Chandy-Lamport runs.

One horizontal line per process (topology order, top to bottom), time in
steps along the x axis. Payments are solid dark arrows from their ``SEND``
entry to their ``DELIVER`` entry; markers are thin dashed arrows in the colour
of their snapshot; each snapshot's cut is a polyline through the points where
the processes recorded their state, in the snapshot's colour (a star marks the
initiators). Payments a snapshot recorded as channel state get a halo in that
snapshot's colour.

Step ``t`` covers ``[t, t + 1)`` on the x axis. The drawn log entries of one
process at one step are spread over that width in log order: the ``k``-th of
``m`` of them sits at ``t + (k + 1) / (m + 1)``.

Every drawn element carries a ``gid`` (the ``id`` of its group in an SVG), so
tests and tools can find it:

- ``process-<p>`` (label) and ``process-line-<p>`` (line) for each process;
- ``payment-<id>`` for each payment arrow, ``payment-label-<id>`` for its label;
- ``marker-<s>-<src>-<dst>`` for the marker of snapshot ``s`` on channel
  ``src -> dst`` (``-<k>`` appended for the ``k``-th extra one, ``k >= 1``,
  should a faulty run send several);
- ``cut-<s>`` for the cut of snapshot ``s``, ``initiator-<s>-<p>`` for an
  initiator's star, ``state-<s>-<p>`` for a recorded balance;
- ``recorded-<s>-<id>`` for the halo of payment ``id`` in the channel state of ``s``.

The lanes, arrows, cuts, stars, colours and the saving are :mod:`cutline.drawing`'s,
shared with the report's diagram of a checkpoint's barriers. Figures are built on
:class:`matplotlib.figure.Figure` directly, never through ``pyplot``, so they need no
display and can be drawn from several threads. The output is deterministic: the same run
gives byte-identical files.
"""

from __future__ import annotations

import pathlib
from collections import defaultdict, deque
from dataclasses import dataclass, field

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from cutline import drawing
from cutline.sim.log import EventKind, LogEvent, SimRun
from cutline.sim.scenario import Channel

__all__ = ["FORMATS", "diagram_figure", "draw_diagram"]

FORMATS = drawing.FORMATS
"""The suffixes a diagram can be written to, and the format of each (``drawing``'s)."""

_DRAWN = frozenset(
    {
        EventKind.SEND,
        EventKind.DELIVER,
        EventKind.MARKER_SEND,
        EventKind.MARKER_DELIVER,
        EventKind.RECORD,
    }
)
"""Log entries that get a place on their process's line."""

_SALT = "cutline-diagram"
"""Seeds the ids in the diagram's SVG (see :func:`cutline.drawing.style`)."""

_PAYMENT_COLOUR = "0.15"
_MAX_WIDTH = 40.0
_MAX_HEIGHT = 16.0
_LABEL_PAYMENTS_UP_TO = 40
_LABEL_STATES_UP_TO = 60


@dataclass
class _Layout:
    """Where every drawn log entry sits, and which entries belong together."""

    x: dict[int, float] = field(default_factory=dict)
    y: dict[str, float] = field(default_factory=dict)
    payments: list[tuple[int, int, int, int]] = field(default_factory=list)
    """``(payment id, amount, send index, deliver index)``, in order of sending."""
    markers: list[tuple[str, int, int, int]] = field(default_factory=list)
    """``(gid, snapshot, send index, deliver index)``, in order of delivery."""
    records: dict[int, dict[str, int]] = field(default_factory=dict)
    """Snapshot -> process -> index of its ``RECORD`` entry."""
    initiators: dict[int, list[str]] = field(default_factory=dict)
    """Snapshot -> processes whose ``initiate`` made them record (not a late, ignored one)."""
    end: float = 1.0
    """Right edge of the time axis."""


def _layout(run: SimRun) -> _Layout:
    log = run.log
    processes = run.scenario.topology.processes
    lay = _Layout()
    lay.y = drawing.lane_heights(processes)

    # x: spread the drawn entries of each (process, step) over the step.
    groups: dict[tuple[str, int], list[int]] = defaultdict(list)
    for i, e in enumerate(log):
        if e.kind in _DRAWN and e.process in lay.y:  # (an unknown process has no line)
            groups[e.process, e.time].append(i)
    for (_, time), members in groups.items():
        m = len(members)
        for k, i in enumerate(members):
            lay.x[i] = time + (k + 1) / (m + 1)
    last = max((e.time for e in log), default=0)
    lay.end = float(max(run.end_time, last) + 1)

    # payments: matched by id
    sent: dict[int, int] = {}
    delivered: dict[int, int] = {}
    for i, e in enumerate(log):
        if e.message is None:
            continue
        if e.kind is EventKind.SEND:
            sent.setdefault(e.message, i)
        elif e.kind is EventKind.DELIVER:
            delivered.setdefault(e.message, i)
    for message, s in sorted(sent.items(), key=lambda item: item[1]):
        d = delivered.get(message)
        if d is not None and s in lay.x and d in lay.x:
            lay.payments.append((message, log[s].amount or 0, s, d))

    # markers: FIFO per (channel, snapshot); undelivered ones and stray deliveries are skipped
    pending: dict[tuple[Channel, int], deque[int]] = defaultdict(deque)
    paired: dict[tuple[Channel, int], int] = defaultdict(int)
    for i, e in enumerate(log):
        if e.channel is None or e.snapshot is None:
            continue
        key = (e.channel, e.snapshot)
        if e.kind is EventKind.MARKER_SEND and i in lay.x:
            pending[key].append(i)
        elif e.kind is EventKind.MARKER_DELIVER and pending[key] and i in lay.x:
            s = pending[key].popleft()
            k = paired[key]
            paired[key] += 1
            src, dst = e.channel
            gid = f"marker-{e.snapshot}-{src}-{dst}" + (f"-{k}" if k else "")
            lay.markers.append((gid, e.snapshot, s, i))

    # cuts and initiators
    initiated: list[tuple[int, LogEvent]] = []
    for i, e in enumerate(log):
        if e.snapshot is None:
            continue
        if e.kind is EventKind.RECORD and i in lay.x:
            lay.records.setdefault(e.snapshot, {}).setdefault(e.process, i)
        elif e.kind is EventKind.INITIATE:
            initiated.append((i, e))
    for i, e in initiated:
        assert e.snapshot is not None
        r = lay.records.get(e.snapshot, {}).get(e.process)
        if r is not None and r > i:
            names = lay.initiators.setdefault(e.snapshot, [])
            if e.process not in names:
                names.append(e.process)
    return lay


def _snapshot_ids(run: SimRun) -> list[int]:
    ids = set(run.snapshots)
    ids.update(e.snapshot for e in run.log if e.snapshot is not None)
    return sorted(ids)


def _figure_size(processes: int, span: float) -> tuple[float, float]:
    width = min(_MAX_WIDTH, max(7.0, 3.0 + 0.55 * span))
    height = min(_MAX_HEIGHT, max(3.5, 1.8 + 1.0 * processes))
    return width, height


def _default_title(run: SimRun, snapshots: int) -> str:
    topo = run.scenario.topology
    payments = sum(1 for e in run.log if e.kind is EventKind.SEND)
    name = run.scenario.events_path
    if name is None or name == "<events>":
        about = ""
    elif name.startswith("<"):
        about = f" ({name.strip('<>')})"
    else:  # a file: its name only, so the picture does not depend on where it lives
        about = f" ({pathlib.PurePath(name).name})"
    return (
        f"Chandy-Lamport run{about}: {len(topo.processes)} processes, {payments} payments, "
        f"{snapshots} snapshot{'s' if snapshots != 1 else ''}, seed {run.seed}"
    )


def _tick_stride(span: float, width: float) -> int:
    """Label every step while that leaves about 0.3 inch per label."""
    room = max(1, int((width - 2.0) / 0.3))
    for stride in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000):
        if span / stride <= room:
            return stride
    return 1000 * (int(span / (1000 * room)) + 1)


_ALONG = (0.5, 0.38, 0.62, 0.27, 0.73, 0.17, 0.83)
"""Where along its arrow a payment's label may go, in order of preference."""

_STATE_OFFSETS = ((0.0, -6.0), (0.0, 6.0), (-8.0, -6.0), (8.0, -6.0), (-8.0, 6.0), (8.0, 6.0))
"""Offsets (points) of a recorded balance from its dot, in order of preference."""


class _Placer:
    """Greedy placement of small text labels in approximate points, avoiding overlaps.

    Positions are estimated from the figure size before layout, which is close
    enough to keep labels apart; it is deterministic, which is what matters.
    """

    def __init__(self, points_per_step: float, points_per_process: float) -> None:
        self.sx = points_per_step
        self.sy = points_per_process
        self.boxes: list[tuple[float, float, float, float]] = []

    def _box(
        self, text: str, size: float, x: float, y: float, dx: float, dy: float
    ) -> tuple[float, float, float, float]:
        w = 0.7 * size * len(text) + 4.0
        h = 1.25 * size
        px, py = x * self.sx + dx, y * self.sy + dy
        left = px - w / 2 if dx == 0 else (px if dx > 0 else px - w)
        bottom = py if dy >= 0 else py - h
        return left, bottom, left + w, bottom + h

    def _overlap(self, box: tuple[float, float, float, float]) -> float:
        total = 0.0
        for left, bottom, right, top in self.boxes:
            w = min(box[2], right) - max(box[0], left)
            h = min(box[3], top) - max(box[1], bottom)
            if w > 0 and h > 0:
                total += w * h
        return total

    def block(self, x: float, y: float, w: float, h: float) -> None:
        """Keep labels off a ``w`` x ``h`` points box centred on data point ``(x, y)``."""
        px, py = x * self.sx, y * self.sy
        self.boxes.append((px - w / 2, py - h / 2, px + w / 2, py + h / 2))

    def place_index(
        self, text: str, size: float, candidates: list[tuple[float, float, float, float]]
    ) -> int:
        """The first candidate ``(x, y, dx, dy)`` free of overlaps, else the least overlapped."""
        best, best_overlap = 0, float("inf")
        for n, (x, y, dx, dy) in enumerate(candidates):
            overlap = self._overlap(self._box(text, size, x, y, dx, dy))
            if overlap < best_overlap:
                best, best_overlap = n, overlap
            if overlap == 0:
                break
        x, y, dx, dy = candidates[best]
        self.boxes.append(self._box(text, size, x, y, dx, dy))
        return best

    def place(
        self, text: str, size: float, candidates: list[tuple[float, float, float, float]]
    ) -> tuple[float, float, str, str]:
        """Like :meth:`place_index`; returns the chosen offset and its alignment."""
        _, _, dx, dy = candidates[self.place_index(text, size, candidates)]
        ha = "center" if dx == 0 else ("left" if dx > 0 else "right")
        return dx, dy, ha, ("bottom" if dy >= 0 else "top")


def _build(run: SimRun, title: str | None) -> Figure:
    log = run.log
    processes = run.scenario.topology.processes
    lay = _layout(run)
    snapshot_ids = _snapshot_ids(run)
    width, height = _figure_size(len(processes), lay.end)
    fig = drawing.figure(width, height)
    ax = fig.add_subplot()
    ax.set_title(_default_title(run, len(snapshot_ids)) if title is None else title)

    def point(i: int) -> tuple[float, float]:
        return lay.x[i], lay.y[log[i].process]

    # axes: one lane per process, step numbers centred under their steps, faint step boundaries
    drawing.lane_axes(ax, len(processes), 0.0, lay.end)
    stride = _tick_stride(lay.end, width)
    steps = range(0, int(lay.end), stride)
    ax.set_xticks([t + 0.5 for t in steps], [str(t) for t in steps])
    ax.tick_params(axis="x", length=0)
    ax.set_xlabel("time (steps)")
    # one boundary per labelled step: a run with a long tick must not draw millions of lines
    boundaries = ax.vlines(
        range(0, int(lay.end) + 1, stride),
        -0.6,
        len(processes) - 0.4,
        colors="0.92",
        linewidths=0.6,
    )
    boundaries.set_zorder(0)
    boundaries.set_gid("steps")

    for p in processes:
        drawing.lane(ax, lay.y[p], p, gid=f"process-line-{p}", label_gid=f"process-{p}")

    # channel-state halos under the payment arrows
    recorded_in: dict[int, list[int]] = defaultdict(list)
    for s in snapshot_ids:
        snap = run.snapshots.get(s)
        if snap is None:
            continue
        for _, payment in snap.messages:
            if s not in recorded_in[payment.id]:
                recorded_in[payment.id].append(s)

    for message, _, s_i, d_i in lay.payments:
        (x0, y0), (x1, y1) = point(s_i), point(d_i)
        halos = recorded_in.get(message, [])
        for rank, s in enumerate(halos):
            thickness = 8.0 - 2.5 * rank if rank < 2 else 3.0
            ax.add_line(
                drawing.halo(
                    [x0, x1],
                    [y0, y1],
                    drawing.colour(s),
                    width=thickness,
                    gid=f"recorded-{s}-{message}",
                )
            )
        ax.add_patch(
            drawing.arrow(
                (x0, y0),
                (x1, y1),
                _PAYMENT_COLOUR,
                linewidth=1.6 if halos else 1.1,
                zorder=4,
                gid=f"payment-{message}",
                head=10.0,
            )
        )

    for gid, s, s_i, d_i in lay.markers:
        ax.add_patch(
            drawing.arrow(
                point(s_i),
                point(d_i),
                drawing.colour(s),
                linewidth=0.9,
                zorder=3,
                gid=gid,
                dashed=True,
            )
        )

    # cuts: a legend entry for every snapshot, even one that recorded nowhere
    for s in snapshot_ids:
        ink = drawing.colour(s)
        records = lay.records.get(s, {})
        order = [p for p in processes if p in records]
        snap = run.snapshots.get(s)
        label = f"snapshot {s}"
        if snap is not None and not snap.complete:
            label += " (incomplete)"
        ax.add_line(
            drawing.cut_line(
                [lay.x[records[p]] for p in order],
                [lay.y[p] for p in order],
                ink,
                label,
                f"cut-{s}",
            )
        )
        for p in lay.initiators.get(s, []):
            ax.add_line(drawing.star(lay.x[records[p]], lay.y[p], ink, f"initiator-{s}-{p}"))

    # text labels, placed so that they avoid each other and the recorded states' dots
    placer = _Placer(
        points_per_step=72.0 * (width - 2.4) / lay.end,
        points_per_process=72.0 * (height - 1.1) / (len(processes) + 0.2),
    )
    for s, records in lay.records.items():
        starred = lay.initiators.get(s, [])
        for p, i in records.items():
            size = 15.0 if p in starred else 9.0
            placer.block(lay.x[i], lay.y[p], size, size)
    if sum(len(r) for r in lay.records.values()) <= _LABEL_STATES_UP_TO:
        for s in snapshot_ids:
            for p, i in sorted(lay.records.get(s, {}).items(), key=lambda item: item[1]):
                text = str(log[i].amount)
                dx, dy, ha, va = placer.place(
                    text, 7.0, [(lay.x[i], lay.y[p], dx, dy) for dx, dy in _STATE_OFFSETS]
                )
                ax.annotate(
                    text,
                    (lay.x[i], lay.y[p]),
                    xytext=(dx, dy),
                    textcoords="offset points",
                    ha=ha,
                    va=va,
                    fontsize=7,
                    fontweight="bold",
                    color=drawing.colour(s),
                    zorder=6,
                    gid=f"state-{s}-{p}",
                )
    if len(lay.payments) <= _LABEL_PAYMENTS_UP_TO:
        for message, amount, s_i, d_i in lay.payments:
            (x0, y0), (x1, y1) = point(s_i), point(d_i)
            text = f"token({amount})"
            candidates = [(x0 + (x1 - x0) * f, y0 + (y1 - y0) * f, 0.0, 3.0) for f in _ALONG]
            best = placer.place_index(text, 7.0, candidates)
            x, y, _, _ = candidates[best]
            ax.annotate(
                text,
                (x, y),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=7,
                color=_PAYMENT_COLOUR,
                bbox={
                    "boxstyle": "round,pad=0.1",
                    "facecolor": "white",
                    "edgecolor": "none",
                    "alpha": 0.75,
                },
                zorder=6,
                gid=f"payment-label-{message}",
            )

    # legend outside the axes, on the right: what the line styles mean, then the snapshots
    key = [
        Line2D(
            [], [], color=_PAYMENT_COLOUR, linewidth=1.1, marker=">", markersize=5, label="payment"
        ),
        drawing.dashed_key("0.4", "marker"),
        Line2D([], [], color="0.4", linewidth=7.0, alpha=0.35, label="in channel state"),
        drawing.star_key("0.4", "initiator"),
    ]
    drawing.legend(fig, ax, key)
    return fig


def diagram_figure(run: SimRun, *, title: str | None = None) -> Figure:
    """The space-time diagram of ``run`` as a (pyplot-free) matplotlib figure.

    ``title`` replaces the default title, which names the scenario and counts
    its processes, payments and snapshots.
    """
    with drawing.style(_SALT):
        return _build(run, title)


def draw_diagram(run: SimRun, path: str | pathlib.Path, *, title: str | None = None) -> None:
    """Write the diagram of ``run`` to ``path``; the format comes from the suffix: .png or .svg.

    Any other suffix raises :class:`ValueError`. The same run always gives
    byte-identical files.
    """
    path = pathlib.Path(path)
    suffix = path.suffix.lower()
    fmt = FORMATS.get(suffix)
    if fmt is None:
        what = f"{path.suffix!r} files" if path.suffix else "a path without a suffix"
        raise ValueError(
            f"cannot draw a diagram to {what} ({str(path)!r}): "
            f"the supported suffixes are {', '.join(FORMATS)}"
        )
    with drawing.style(_SALT):
        data = drawing.save(_build(run, title), fmt)
    path.write_bytes(data)
