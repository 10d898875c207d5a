"""The user's API: build a dataflow on a :class:`StreamEnvironment` and ``execute()`` it."""

from cutline.api.environment import DataStream, KeyedStream, StreamEnvironment
from cutline.runtime.checkpoint.restore import RestoreError
from cutline.runtime.driver.client import JobClient, JobClientError
from cutline.runtime.driver.result import CheckpointWarning, JobFailedError, JobResult
from cutline.runtime.io.sources import InputWarning, SourceError
from cutline.runtime.operators import KeyedProcessFunction, ProcessContext
from cutline.runtime.task.launch import SourceHold
from cutline.spark.launcher import SparkSetupError

__all__ = [
    "CheckpointWarning",
    "DataStream",
    "InputWarning",
    "JobClient",
    "JobClientError",
    "JobFailedError",
    "JobResult",
    "KeyedProcessFunction",
    "KeyedStream",
    "ProcessContext",
    "RestoreError",
    "SourceError",
    "SourceHold",
    "SparkSetupError",
    "StreamEnvironment",
]
