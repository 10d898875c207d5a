"""Event time, in one house: where a record's time is, how watermarks are made, which windows a
record belongs to, what a window computes, when it fires and when it is past, and what it
keeps.

* ``timestamps.py``: :class:`TimeColumn` (a column of Arrow timestamps or epoch
  milliseconds, read as int64 ms), :class:`EventTimeError` (durations are read by
  :mod:`cutline.runtime.durations`, in whole milliseconds here);
* ``watermarks.py``: :class:`WatermarkStrategy` (what a source or ``assign_timestamps``
  makes watermarks from);
* ``assign.py``: ``assign_timestamps``;
* ``assigners.py``: :class:`Tumbling`, :class:`Sliding`, :class:`Session` (Flink's window
  assigners, with ``zones.py`` for windows of a time zone), and the :class:`Window` a
  ``process`` function is given;
* ``aggregations.py``: :class:`Aggregation` (the built-ins, a user's
  :class:`AggregateFunction`, ``reduce``, ``process``) and the vectorized kernels;
  ``slicing.py``: what a slice of sliding windows is and how parts of windows merge;
* ``layouts.py``: the two layouts of what a window operator checkpoints, each read as the
  other; ``spec.py``: :class:`WindowSpec`, what a window operator is asked to do;
* ``lateness.py``: the lateness rule (when a window is past, which records are late) and
  :class:`Lateness`, what a store asks of it;
* ``timers.py``: the timer services: :class:`TimerService` (a process function's),
  :class:`WindowTimers` (the window operator's);
* ``output.py``: what firing windows emit (:class:`WindowOutput`), and the side output
  ``late`` (:class:`LateRecords`); ``records.py``: how a store reads records' keys and
  values; ``early.py``: the counts of ``early_records``;
* ``store.py``: what a window store is (:class:`WindowStore`) and what it is given
  (:class:`StoreContext`: the lateness rule, the late records, the output; never the
  operator);
* the stores, each one *bucketing* kept in one *storage*: ``bucketing.py`` (:class:`OneSlice`:
  a tumbling window is its one slice; :class:`SharedSlices`: sliding windows share slices)
  under ``by_start.py`` (:class:`WindowsByStart`, given a storage: ``columnar_windows.py``,
  columns in memory, with ``sliced_windows.py``; ``run_windows.py``, runs on disk, with
  ``sliced_runs.py``); ``columnar_sessions.py`` (sessions as columns); ``keyed.py``
  (:class:`KeyedWindows`: keyed state, under ``keyed_by_start.py``, with ``chunks.py`` for
  ``process``, or ``keyed_sessions.py``);
* ``operator.py``: the one :class:`WindowOperator`, which decides (times, lateness, the side
  output, early results, firing as its timers come due) while its store keeps;
  ``logic.py``: :class:`WindowLogic`, which opens it with the layout that fits (a bucketing
  by the assigner, kept in a :class:`Storage` by the backend).

Each module imports only those before it in this list (the stores never ``operator.py``).

Nothing here imports this package's ``__init__``: import the module that holds a name.
"""
