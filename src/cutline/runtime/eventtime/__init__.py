"""Event time, in one house: where a record's time is, how watermarks are made, which windows a
record belongs to, what a window computes, when it fires and when it is past, and what it
keeps.

* ``timestamps.py``: :class:`TimeColumn` (a column of Arrow timestamps or epoch
  milliseconds, read as int64 ms), :class:`EventTimeError` (durations are read by
  :mod:`cutline.runtime.durations`, in whole milliseconds here);
* ``watermarks.py``: :class:`WatermarkStrategy` (what a source or ``assign_timestamps``
  makes watermarks from);
* ``assigners.py``: :class:`Tumbling`, :class:`Sliding`, :class:`Session` (Flink's window
  assigners), and the :class:`Window` a ``process`` function is given;
* ``aggregations.py``: :class:`Aggregation` (the built-ins, a user's
  :class:`AggregateFunction`, ``reduce``, ``process``) and the vectorized kernels;
* ``lateness.py``: the lateness rule (when a window is past, which records are late);
* ``timers.py``: the timer services: :class:`TimerService` (a process function's),
  :class:`WindowTimers` (the window operator's);
* ``operator.py``: the one :class:`WindowOperator` (times, lateness, the side output, early
  results, firing as its timers come due) and the :class:`WindowStore` its windows are kept
  in, in one of six layouts: ``keyed.py`` (:class:`KeyedWindows`, every window and
  backend); for a built-in on the memory backend ``columnar_windows.py`` (tumbling),
  ``sliced_windows.py`` (sliding, by ``slicing.py``), ``columnar_sessions.py``; and on the
  disk backend ``run_windows.py`` (tumbling, as runs: larger than memory) and
  ``sliced_runs.py`` (sliding, slices as runs); both sliced layouts mix in ``sliding.py``
  (:class:`SlidingBySlices`: what sliding windows kept as slices do alike);
* ``layouts.py``: the two layouts of what a window operator checkpoints, each read as the
  other; ``spec.py``: :class:`WindowSpec`, what a window operator is asked to do;
  ``logic.py``: :class:`WindowLogic`, which opens it with the layout that fits;
* ``output.py``: what firing windows emit, and the side output ``late``.

Nothing here imports this package's ``__init__``: import the module that holds a name.
"""
