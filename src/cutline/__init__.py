"""cutline: fault-tolerant stateful stream processing built on consistent distributed snapshots.

The API lives in :mod:`cutline.api`; its names are also here (imported on first use, so that
``import cutline.protocol`` stays light)::

    from cutline import StreamEnvironment, EventTime, KeyedProcessFunction

its settings groups (``cutline.Checkpoints``, ``cutline.State``, ``cutline.Timeouts``); the
tools that look into checkpoints: ``cutline.read_state``, ``cutline.read_channel_state``
(Spark DataFrames), ``cutline.open_checkpoint``, ``cutline.verify_checkpoint``; and the test
seams, in :mod:`cutline.testing`.
"""

from typing import Any

__version__ = "0.1.0"

_API = (
    "WindowedStream",
    "WindowedResult",
    "Window",
    "Tumbling",
    "Sliding",
    "Session",
    "EventTime",
    "EventTimeError",
    "DurationWarning",
    "ExponentialDelay",
    "FailureRate",
    "FixedDelay",
    "NoRestart",
    "WatermarkGenerator",
    "BoundedOutOfOrderness",
    "Monotonous",
    "AggregateFunction",
    "CheckpointAborted",
    "CheckpointCompleted",
    "CheckpointSlow",
    "CheckpointWarning",
    "Checkpoints",
    "DataStream",
    "GenerationRunning",
    "InputWarning",
    "JobClient",
    "JobClientError",
    "JobEvent",
    "JobFailedError",
    "JobFailure",
    "JobListener",
    "JobResult",
    "JobWarning",
    "KeyedProcessFunction",
    "KeyedStream",
    "Logic",
    "OperatorContext",
    "ProcessContext",
    "RecordsSkipped",
    "Restarting",
    "RestoreError",
    "ResumableCheckpointError",
    "RunningOperator",
    "SavepointCompleted",
    "SourceError",
    "SourceHold",
    "SparkSetupError",
    "StreamEnvironment",
    "State",
    "Timeouts",
    "WaitingForSlots",
)
_ELSEWHERE = {
    "read_state": "cutline.spark.datasource",
    "read_channel_state": "cutline.spark.datasource",
    "open_checkpoint": "cutline.runtime.checkpoint.reader",
    "verify_checkpoint": "cutline.runtime.checkpoint.verify",
    "CheckpointStats": "cutline.runtime.checkpoint.stats",
    "JobMetrics": "cutline.runtime.driver.metrics",
    "JobSummary": "cutline.runtime.driver.summary",
}
"""Names of other modules, imported on first use (``read_state`` imports PySpark)."""
__all__ = [*_API, *_ELSEWHERE, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _API:
        import cutline.api

        return getattr(cutline.api, name)
    if name in _ELSEWHERE:
        import importlib

        return getattr(importlib.import_module(_ELSEWHERE[name]), name)
    raise AttributeError(f"module 'cutline' has no attribute {name!r}")
