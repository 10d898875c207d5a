"""The streaming runtime: it runs a job's plan on slots that a launcher starts, driving the
same :mod:`cutline.protocol` objects the simulator checks.

Grouped by role, each folder importing only those below it (docs/ARCHITECTURE.md draws them):
``driver/`` (the driver's process: the job, its attempts, restarts), ``task/`` (an executor's
slot and its subtasks), ``checkpoint/`` (storage, the state file, restore, statistics, the
lock, the reader, the verifier), ``operators.py`` (what operators do), and at the bottom
``network/``, ``state/``, ``io/`` and ``graph.py``.
"""
