"""The checkpoint report: one self-contained HTML page about a checkpoint directory.

``cutline report DIR -o report.html`` reads the statistics the driver keeps in
``DIR/_stats`` (``runtime/checkpoint/stats.py``) and writes a page that opens in any browser,
offline: no server, no scripts, no external stylesheets or fonts; the figures are
inline SVG. It shows

- the directory, its runs (start, parallelism, checkpointing mode, outcome) and totals
  (completed and aborted checkpoints, savepoints, restarts, folders on disk);
- the history over time: every checkpoint's end-to-end duration, its size (bytes it
  wrote, and the full size of its state), its longest alignment; aborted checkpoints
  as red crosses, restarts as vertical lines; each run named and every other one shaded,
  and the line of a series broken between runs (it never joins the last checkpoint of
  one run to the first of the next);
- a table of the checkpoints (the newest :data:`TABLE_ROWS`): status and why an aborted
  one was, duration, size, channel state, alignment, the slowest subtask and the
  critical path that made it the slowest (:func:`~cutline.runtime.checkpoint.stats.critical_path`),
  the savepoint folder;
- the restarts: which generation failed, when, why (the cause, traceback included), and
  what the next generation restored;
- the space-time diagram of one checkpoint's barriers (by default the slowest completed
  one), drawn from the recorded times with the simulator's look (``drawing.py``);
- the statistics files that could not be read.

The same directory always gives the same page, byte for byte: it shows the times the runs
recorded, never the time it was made. Every text that comes from the files is escaped.

The package follows the way the page is made, each module using only those above it here:

- :mod:`cutline.report.data` reads the directory (:class:`ReportError` when it cannot)
  and turns its statistics into what the page says;
- :mod:`cutline.report.figures` (what the figures share, and their inline SVG),
  :mod:`cutline.report.history_figure` and :mod:`cutline.report.barrier_figure` draw the
  history and the barrier diagram with :mod:`cutline.drawing` (their ``gid`` s are listed
  in each);
- :mod:`cutline.report.html` writes the page around them.

It reads what the runtime wrote and draws it: it sits at the top, beside the ``cli``, and
imports neither the simulator nor Spark.
"""

from cutline.report.barrier_figure import checkpoint_figure
from cutline.report.data import ReportError
from cutline.report.history_figure import history_figure
from cutline.report.html import TABLE_ROWS, build_report, write_report

__all__ = [
    "TABLE_ROWS",
    "ReportError",
    "build_report",
    "checkpoint_figure",
    "history_figure",
    "write_report",
]
