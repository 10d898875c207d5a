"""The built-in joins of two streams: each one's state and the rule that pairs its rows
(a *kernel*), on Arrow columns, and the layout of what every join emits (``output.py``)."""
