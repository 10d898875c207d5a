"""cutline: fault-tolerant stateful stream processing built on consistent distributed snapshots.

The API lives in :mod:`cutline.api`; its names are also here (imported on first use, so that
``import cutline.protocol`` stays light)::

    from cutline import StreamEnvironment, KeyedProcessFunction
"""

from typing import Any

__version__ = "0.1.0"

_API = (
    "CheckpointWarning",
    "DataStream",
    "JobClient",
    "JobClientError",
    "JobFailedError",
    "JobResult",
    "KeyedProcessFunction",
    "KeyedStream",
    "ProcessContext",
    "RestoreError",
    "SparkSetupError",
    "StreamEnvironment",
)
__all__ = [*_API, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _API:
        import cutline.api

        return getattr(cutline.api, name)
    raise AttributeError(f"module 'cutline' has no attribute {name!r}")
