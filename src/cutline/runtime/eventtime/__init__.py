"""Event time, in one house: where a record's time is, how watermarks are made, which windows a
record belongs to, what a window computes, when it fires and when it is past, and what it
keeps.

* ``timestamps.py``: :class:`EventTime` (a column of Arrow timestamps or epoch
  milliseconds, read as int64 ms), ``duration_ms``, :class:`EventTimeError`;
* ``watermarks.py``: :class:`WatermarkStrategy` (what a source or ``assign_timestamps``
  makes watermarks from);
* ``assigners.py``: :class:`Tumbling`, :class:`Sliding`, :class:`Session` (Flink's window
  assigners), and the :class:`Window` a ``process`` function is given;
* ``aggregations.py``: :class:`Aggregation` (the built-ins, a user's
  :class:`AggregateFunction`, ``reduce``, ``process``) and the vectorized kernels;
* ``lateness.py``: the lateness rule (when a window is past, which records are late);
* ``timers.py``: :class:`TimerService`, the timers of a keyed operator;
* ``layouts.py``: the two layouts of what a window operator keeps, each read as the other;
* ``keyed.py``, ``columnar_windows.py``, ``columnar_sessions.py``: the window operator in
  the keyed layout, and in the columnar layouts of a built-in (tumbling and sliding windows;
  sessions) on the memory backend; ``spec.py``: :class:`WindowSpec`, what they are asked to
  do; ``logic.py``: :class:`WindowLogic`, which opens the one that fits;
* ``output.py``: what firing windows emit, and the side output ``late``.

Nothing here imports this package's ``__init__``: import the module that holds a name.
"""
