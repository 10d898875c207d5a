"""The user's API: build a dataflow on a :class:`StreamEnvironment` and ``execute()`` it.

A job tells what happens to a listener: ``(kind, message)``, or a :class:`JobListener` that
gets the events typed (:class:`CheckpointCompleted`, :class:`Restarting`, ...).

An operator of one's own is a :class:`Logic` (opened in every subtask into a
:class:`RunningOperator`) added with ``stream.transform(label, logic)``.
"""

from cutline.api.connected import BroadcastStream, ConnectedStreams
from cutline.api.environment import DataStream, KeyedStream, StreamEnvironment
from cutline.api.event_time import EventTime
from cutline.api.setting_groups import Checkpoints, State, Timeouts
from cutline.api.windowed import WindowedResult, WindowedStream
from cutline.runtime.checkpoint.lineage import ResumableCheckpointError
from cutline.runtime.checkpoint.restore import RestoreError
from cutline.runtime.co_operators import (
    BroadcastContext,
    BroadcastProcessFunction,
    KeyedCoProcessFunction,
)
from cutline.runtime.driver.client import JobClient, JobClientError
from cutline.runtime.driver.events import (
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointSlow,
    GenerationRunning,
    JobEvent,
    JobFailure,
    JobListener,
    JobWarning,
    RecordsSkipped,
    Restarting,
    SavepointCompleted,
    WaitingForSlots,
)
from cutline.runtime.driver.restart import ExponentialDelay, FailureRate, FixedDelay, NoRestart
from cutline.runtime.driver.result import CheckpointWarning, JobFailedError, JobResult
from cutline.runtime.durations import DurationWarning
from cutline.runtime.eventtime.aggregations import AggregateFunction
from cutline.runtime.eventtime.assigners import Session, Sliding, Tumbling, Window
from cutline.runtime.eventtime.timers import TimeDomain
from cutline.runtime.eventtime.timestamps import EventTimeError
from cutline.runtime.eventtime.watermarks import (
    BoundedOutOfOrderness,
    Monotonous,
    WatermarkGenerator,
)
from cutline.runtime.io.formats import InputWarning, SourceError
from cutline.runtime.keyed_operators import KeyedProcessFunction, ProcessContext
from cutline.runtime.operators import Logic, OnError, OperatorContext, RunningOperator
from cutline.runtime.task.launch import SourceHold
from cutline.spark.launcher import SparkSetupError

__all__ = [
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
]
