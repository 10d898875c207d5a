"""cutline: fault-tolerant stateful stream processing built on consistent distributed snapshots.

The API lives in :mod:`cutline.api`; its names are also here (imported on first use, so that
``import cutline.protocol`` stays light)::

    from cutline import StreamEnvironment, EventTime, KeyedProcessFunction

its settings groups (``cutline.Checkpoints``, ``cutline.State``, ``cutline.Timeouts``); the
tools that look into checkpoints: ``cutline.read_state``, ``cutline.read_channel_state``
(Spark DataFrames), ``cutline.open_checkpoint``, ``cutline.verify_checkpoint``; and the test
seams, in :mod:`cutline.testing`.
"""

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_API = (
    "AggregateFunction",
    "BoundedOutOfOrderness",
    "BroadcastContext",
    "BroadcastProcessFunction",
    "BroadcastStream",
    "CheckpointAborted",
    "CheckpointCompleted",
    "CheckpointSlow",
    "CheckpointWarning",
    "Checkpoints",
    "ConnectedStreams",
    "DataStream",
    "DurationWarning",
    "EventTime",
    "EventTimeError",
    "ExponentialDelay",
    "FailureRate",
    "FixedDelay",
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
    "KeyedCoProcessFunction",
    "KeyedProcessFunction",
    "KeyedStream",
    "Logic",
    "Monotonous",
    "NoRestart",
    "OnError",
    "OperatorContext",
    "ProcessContext",
    "RecordsSkipped",
    "Restarting",
    "RestoreError",
    "ResumableCheckpointError",
    "RunningOperator",
    "SavepointCompleted",
    "Session",
    "Sliding",
    "SourceError",
    "SourceHold",
    "SparkSetupError",
    "State",
    "StreamEnvironment",
    "TimeDomain",
    "Timeouts",
    "Tumbling",
    "WaitingForSlots",
    "WatermarkGenerator",
    "Window",
    "WindowedResult",
    "WindowedStream",
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


if TYPE_CHECKING:  # (what a type checker sees: the API's own types, not __getattr__'s Any)
    from cutline.api import AggregateFunction as AggregateFunction
    from cutline.api import BoundedOutOfOrderness as BoundedOutOfOrderness
    from cutline.api import BroadcastContext as BroadcastContext
    from cutline.api import BroadcastProcessFunction as BroadcastProcessFunction
    from cutline.api import BroadcastStream as BroadcastStream
    from cutline.api import CheckpointAborted as CheckpointAborted
    from cutline.api import CheckpointCompleted as CheckpointCompleted
    from cutline.api import Checkpoints as Checkpoints
    from cutline.api import CheckpointSlow as CheckpointSlow
    from cutline.api import CheckpointWarning as CheckpointWarning
    from cutline.api import ConnectedStreams as ConnectedStreams
    from cutline.api import DataStream as DataStream
    from cutline.api import DurationWarning as DurationWarning
    from cutline.api import EventTime as EventTime
    from cutline.api import EventTimeError as EventTimeError
    from cutline.api import ExponentialDelay as ExponentialDelay
    from cutline.api import FailureRate as FailureRate
    from cutline.api import FixedDelay as FixedDelay
    from cutline.api import GenerationRunning as GenerationRunning
    from cutline.api import InputWarning as InputWarning
    from cutline.api import JobClient as JobClient
    from cutline.api import JobClientError as JobClientError
    from cutline.api import JobEvent as JobEvent
    from cutline.api import JobFailedError as JobFailedError
    from cutline.api import JobFailure as JobFailure
    from cutline.api import JobListener as JobListener
    from cutline.api import JobResult as JobResult
    from cutline.api import JobWarning as JobWarning
    from cutline.api import KeyedCoProcessFunction as KeyedCoProcessFunction
    from cutline.api import KeyedProcessFunction as KeyedProcessFunction
    from cutline.api import KeyedStream as KeyedStream
    from cutline.api import Logic as Logic
    from cutline.api import Monotonous as Monotonous
    from cutline.api import NoRestart as NoRestart
    from cutline.api import OnError as OnError
    from cutline.api import OperatorContext as OperatorContext
    from cutline.api import ProcessContext as ProcessContext
    from cutline.api import RecordsSkipped as RecordsSkipped
    from cutline.api import Restarting as Restarting
    from cutline.api import RestoreError as RestoreError
    from cutline.api import ResumableCheckpointError as ResumableCheckpointError
    from cutline.api import RunningOperator as RunningOperator
    from cutline.api import SavepointCompleted as SavepointCompleted
    from cutline.api import Session as Session
    from cutline.api import Sliding as Sliding
    from cutline.api import SourceError as SourceError
    from cutline.api import SourceHold as SourceHold
    from cutline.api import SparkSetupError as SparkSetupError
    from cutline.api import State as State
    from cutline.api import StreamEnvironment as StreamEnvironment
    from cutline.api import TimeDomain as TimeDomain
    from cutline.api import Timeouts as Timeouts
    from cutline.api import Tumbling as Tumbling
    from cutline.api import WaitingForSlots as WaitingForSlots
    from cutline.api import WatermarkGenerator as WatermarkGenerator
    from cutline.api import Window as Window
    from cutline.api import WindowedResult as WindowedResult
    from cutline.api import WindowedStream as WindowedStream


def __getattr__(name: str) -> Any:
    if name in _API:
        import cutline.api

        return getattr(cutline.api, name)
    if name in _ELSEWHERE:
        import importlib

        return getattr(importlib.import_module(_ELSEWHERE[name]), name)
    raise AttributeError(f"module 'cutline' has no attribute {name!r}")
